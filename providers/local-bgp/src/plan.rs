//! What to send a router: the routes we want it to have, against the routes it has from us, as
//! UPDATE messages. Pure: no I/O, so every case is a table test.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::wire::{AsSegment, Attribute, Context, Family, MAX_BODY, Update};

/// The routes a speaker announces: prefix to what goes with it.
pub type Routes = BTreeMap<IpNet, Path>;

/// What a route carries besides its prefix and next hop.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path {
    /// RFC 1997 communities, each `asn << 16 | value`.
    pub communities: Vec<u32>,
    /// RFC 8092 large communities.
    pub large_communities: Vec<[u32; 3]>,
    /// LOCAL_PREF, sent to iBGP peers only (100 when unset, the usual default); an eBGP peer never
    /// receives it (RFC 4271 §5.1.5).
    pub local_preference: Option<u32>,
}

/// What the session decided that changes what and how we announce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Our AS number.
    pub local_asn: u32,
    /// The peer is in another AS: our AS goes in the path, LOCAL_PREF does not.
    pub external: bool,
    /// How AS numbers are encoded.
    pub context: Context,
    /// The families both sides announced.
    pub families: Vec<Family>,
    /// The next hop of our IPv4 routes.
    pub next_hop_v4: Option<Ipv4Addr>,
    /// The next hop of our IPv6 routes.
    pub next_hop_v6: Option<Ipv6Addr>,
}

/// A route the session cannot carry, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unannounced {
    /// The prefix.
    pub prefix: IpNet,
    /// Why it is not announced.
    pub reason: &'static str,
}

impl Session {
    /// Splits `wanted` into the routes this session can carry and those it cannot (a family the
    /// router did not announce, no next hop of the family).
    pub fn announceable(&self, wanted: &Routes) -> (Routes, Vec<Unannounced>) {
        let mut routes = Routes::new();
        let mut refused = Vec::new();
        for (prefix, path) in wanted {
            let family = Family::of(prefix);
            let reason = if !self.families.contains(&family) {
                Some(match family {
                    Family::IPV6_UNICAST => "the router did not announce IPv6 unicast",
                    _ => "the router did not announce IPv4 unicast",
                })
            } else if family == Family::IPV4_UNICAST && self.next_hop_v4.is_none() {
                Some("no IPv4 next hop (the session is over IPv6: set the peer's IPv4 next hop)")
            } else if family == Family::IPV6_UNICAST && self.next_hop_v6.is_none() {
                Some("no IPv6 next hop (the session is over IPv4: set the peer's IPv6 next hop)")
            } else {
                None
            };
            match reason {
                Some(reason) => refused.push(Unannounced {
                    prefix: *prefix,
                    reason,
                }),
                None => {
                    routes.insert(*prefix, path.clone());
                }
            }
        }
        (routes, refused)
    }

    /// The UPDATEs that take the router from `sent` to `wanted` (both announceable): withdrawals
    /// first, then announcements grouped by family and path, each message within 4096 bytes.
    /// Nothing when the two are equal.
    pub fn plan(&self, sent: &Routes, wanted: &Routes) -> Vec<Update> {
        let mut updates = Vec::new();
        let gone: Vec<IpNet> = sent
            .keys()
            .filter(|p| !wanted.contains_key(p))
            .copied()
            .collect();
        for family in [Family::IPV4_UNICAST, Family::IPV6_UNICAST] {
            let withdrawn: Vec<IpNet> = gone
                .iter()
                .filter(|p| Family::of(p) == family)
                .copied()
                .collect();
            for chunk in chunks(&withdrawn, |prefixes| self.withdrawal(family, prefixes)) {
                updates.push(chunk);
            }
        }
        let mut groups: BTreeMap<(Family, &Path), Vec<IpNet>> = BTreeMap::new();
        for (prefix, path) in wanted {
            if sent.get(prefix) != Some(path) {
                groups
                    .entry((Family::of(prefix), path))
                    .or_default()
                    .push(*prefix);
            }
        }
        for ((family, path), prefixes) in groups {
            for chunk in chunks(&prefixes, |prefixes| {
                self.announcement(family, path, prefixes)
            }) {
                updates.push(chunk);
            }
        }
        updates
    }

    fn withdrawal(&self, family: Family, prefixes: Vec<IpNet>) -> Update {
        if family == Family::IPV4_UNICAST {
            Update {
                withdrawn: prefixes,
                ..Update::default()
            }
        } else {
            Update {
                attributes: vec![Attribute::MpUnreach {
                    family,
                    withdrawn: prefixes,
                }],
                ..Update::default()
            }
        }
    }

    fn announcement(&self, family: Family, path: &Path, prefixes: Vec<IpNet>) -> Update {
        let mut attributes = vec![Attribute::Origin(0)];
        let path_segments = if self.external {
            vec![AsSegment::sequence(vec![self.local_asn])]
        } else {
            Vec::new()
        };
        let as_trans = !self.context.four_octet_as && self.local_asn > u32::from(u16::MAX);
        attributes.push(Attribute::AsPath(path_segments.clone()));
        let mut nlri = Vec::new();
        match family {
            Family::IPV4_UNICAST => {
                attributes.push(Attribute::NextHop(
                    self.next_hop_v4.unwrap_or(Ipv4Addr::UNSPECIFIED),
                ));
                nlri = prefixes;
            }
            _ => attributes.push(Attribute::MpReach {
                family,
                next_hops: vec![IpAddr::V6(
                    self.next_hop_v6.unwrap_or(Ipv6Addr::UNSPECIFIED),
                )],
                nlri: prefixes,
            }),
        }
        if !self.external {
            attributes.push(Attribute::LocalPref(path.local_preference.unwrap_or(100)));
        }
        if !path.communities.is_empty() {
            attributes.push(Attribute::Communities(path.communities.clone()));
        }
        if as_trans && !path_segments.is_empty() {
            attributes.push(Attribute::As4Path(path_segments));
        }
        if !path.large_communities.is_empty() {
            attributes.push(Attribute::LargeCommunities(path.large_communities.clone()));
        }
        Update {
            attributes,
            nlri,
            ..Update::default()
        }
    }
}

/// Builds one update of all `prefixes`, or as many updates as it takes for each to fit a message.
fn chunks(prefixes: &[IpNet], build: impl Fn(Vec<IpNet>) -> Update) -> Vec<Update> {
    if prefixes.is_empty() {
        return Vec::new();
    }
    // The attributes' size without prefixes, then each prefix's (length byte and its bytes).
    let empty = build(Vec::new()).encoded_len(Context {
        four_octet_as: true,
    });
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut size = empty;
    for prefix in prefixes {
        let cost = 1 + usize::from(prefix.prefix_len()).div_ceil(8);
        // A multiprotocol attribute past 255 bytes takes one more byte of length.
        if size + cost + 1 > MAX_BODY && !current.is_empty() {
            out.push(build(std::mem::take(&mut current)));
            size = empty;
        }
        size += cost;
        current.push(*prefix);
    }
    out.push(build(current));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Message, decode, encode};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn session(external: bool) -> Session {
        Session {
            local_asn: 64512,
            external,
            context: Context {
                four_octet_as: true,
            },
            families: vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST],
            next_hop_v4: Some(Ipv4Addr::new(192, 168, 0, 2)),
            next_hop_v6: Some("2001:db8::2".parse().unwrap()),
        }
    }

    fn routes(prefixes: &[(&str, Path)]) -> Routes {
        prefixes
            .iter()
            .map(|(p, path)| (net(p), path.clone()))
            .collect()
    }

    #[test]
    fn nothing_changed_sends_nothing() {
        let wanted = routes(&[
            ("10.0.0.1/32", Path::default()),
            ("2001:db8:1::1/128", Path::default()),
        ]);
        assert_eq!(session(true).plan(&wanted, &wanted), vec![]);
    }

    #[test]
    fn the_plan_for_each_change() {
        let tagged = Path {
            communities: vec![(64512 << 16) | 7],
            ..Path::default()
        };
        let s = session(true);
        let origin = Attribute::Origin(0);
        let ebgp_path = Attribute::AsPath(vec![AsSegment::sequence(vec![64512])]);
        let v4_hop = Attribute::NextHop(Ipv4Addr::new(192, 168, 0, 2));
        let cases: Vec<(&str, Routes, Routes, Vec<Update>)> = vec![
            (
                "a new IPv4 route",
                routes(&[]),
                routes(&[("10.0.0.1/32", Path::default())]),
                vec![Update {
                    attributes: vec![origin.clone(), ebgp_path.clone(), v4_hop.clone()],
                    nlri: vec![net("10.0.0.1/32")],
                    ..Update::default()
                }],
            ),
            (
                "an IPv4 route gone",
                routes(&[("10.0.0.1/32", Path::default())]),
                routes(&[]),
                vec![Update {
                    withdrawn: vec![net("10.0.0.1/32")],
                    ..Update::default()
                }],
            ),
            (
                "an IPv6 route gone and another new",
                routes(&[("2001:db8:1::1/128", Path::default())]),
                routes(&[("2001:db8:1::2/128", Path::default())]),
                vec![
                    Update {
                        attributes: vec![Attribute::MpUnreach {
                            family: Family::IPV6_UNICAST,
                            withdrawn: vec![net("2001:db8:1::1/128")],
                        }],
                        ..Update::default()
                    },
                    Update {
                        attributes: vec![
                            origin.clone(),
                            ebgp_path.clone(),
                            Attribute::MpReach {
                                family: Family::IPV6_UNICAST,
                                next_hops: vec!["2001:db8::2".parse().unwrap()],
                                nlri: vec![net("2001:db8:1::2/128")],
                            },
                        ],
                        ..Update::default()
                    },
                ],
            ),
            (
                "a route whose communities changed is announced again, the others are not",
                routes(&[
                    ("10.0.0.1/32", Path::default()),
                    ("10.0.0.2/32", Path::default()),
                ]),
                routes(&[
                    ("10.0.0.1/32", tagged.clone()),
                    ("10.0.0.2/32", Path::default()),
                ]),
                vec![Update {
                    attributes: vec![
                        origin.clone(),
                        ebgp_path.clone(),
                        v4_hop.clone(),
                        Attribute::Communities(vec![(64512 << 16) | 7]),
                    ],
                    nlri: vec![net("10.0.0.1/32")],
                    ..Update::default()
                }],
            ),
            (
                "routes with the same path share one message",
                routes(&[]),
                routes(&[
                    ("10.0.0.1/32", tagged.clone()),
                    ("10.0.0.2/32", tagged.clone()),
                ]),
                vec![Update {
                    attributes: vec![
                        origin.clone(),
                        ebgp_path.clone(),
                        v4_hop.clone(),
                        Attribute::Communities(vec![(64512 << 16) | 7]),
                    ],
                    nlri: vec![net("10.0.0.1/32"), net("10.0.0.2/32")],
                    ..Update::default()
                }],
            ),
        ];
        for (name, sent, wanted, expected) in cases {
            assert_eq!(s.plan(&sent, &wanted), expected, "{name}");
        }
    }

    #[test]
    fn ibgp_carries_local_preference_and_no_as_of_ours() {
        let s = session(false);
        let preferred = Path {
            local_preference: Some(200),
            ..Path::default()
        };
        let updates = s.plan(
            &routes(&[]),
            &routes(&[("10.0.0.1/32", Path::default()), ("10.0.0.2/32", preferred)]),
        );
        let attributes: Vec<_> = updates.iter().map(|u| u.attributes.clone()).collect();
        assert_eq!(attributes.len(), 2);
        assert!(attributes[0].contains(&Attribute::AsPath(vec![])));
        assert!(attributes[0].contains(&Attribute::LocalPref(100)));
        assert!(attributes[1].contains(&Attribute::LocalPref(200)));
        assert!(
            !session(true).plan(&routes(&[]), &routes(&[("10.0.0.1/32", Path::default())]))[0]
                .attributes
                .iter()
                .any(|a| matches!(a, Attribute::LocalPref(_)))
        );
    }

    #[test]
    fn a_4_octet_asn_to_a_2_octet_peer_goes_as_as_trans_with_as4_path() {
        let s = Session {
            local_asn: 4_200_000_001,
            context: Context {
                four_octet_as: false,
            },
            ..session(true)
        };
        let update = &s.plan(&routes(&[]), &routes(&[("10.0.0.1/32", Path::default())]))[0];
        assert!(
            update
                .attributes
                .contains(&Attribute::As4Path(vec![AsSegment::sequence(vec![
                    4_200_000_001
                ])]))
        );
    }

    #[test]
    fn thousands_of_routes_are_split_into_messages_that_fit() {
        let many: Routes = (0..3000u32)
            .flat_map(|i| {
                [
                    (
                        IpNet::from(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))),
                        Path::default(),
                    ),
                    (
                        IpNet::from(IpAddr::V6(Ipv6Addr::from(
                            0x2001_0db8_u128 << 96 | u128::from(i),
                        ))),
                        Path::default(),
                    ),
                ]
            })
            .collect();
        let s = session(true);
        for (sent, wanted) in [(&routes(&[]), &many), (&many, &routes(&[]))] {
            let updates = s.plan(sent, wanted);
            let mut seen = 0;
            for update in &updates {
                let bytes = encode(&Message::Update(update.clone()), s.context);
                assert!(bytes.len() <= 4096, "{} bytes", bytes.len());
                let Message::Update(decoded) = decode(&bytes, s.context).unwrap().unwrap().0 else {
                    panic!()
                };
                seen += decoded.nlri.len() + decoded.withdrawn.len();
                for attribute in decoded.attributes {
                    match attribute {
                        Attribute::MpReach { nlri, .. } => seen += nlri.len(),
                        Attribute::MpUnreach { withdrawn, .. } => seen += withdrawn.len(),
                        _ => {}
                    }
                }
            }
            assert_eq!(seen, 6000);
            assert!(updates.len() < 40, "{} messages", updates.len());
        }
    }

    #[test]
    fn routes_the_session_cannot_carry_are_named_with_the_reason() {
        let s = Session {
            families: vec![Family::IPV4_UNICAST],
            next_hop_v4: None,
            ..session(true)
        };
        let (ok, refused) = s.announceable(&routes(&[
            ("10.0.0.1/32", Path::default()),
            ("2001:db8::9/128", Path::default()),
        ]));
        assert!(ok.is_empty());
        assert_eq!(
            refused,
            vec![
                Unannounced {
                    prefix: net("10.0.0.1/32"),
                    reason: "no IPv4 next hop (the session is over IPv6: set the peer's IPv4 next hop)"
                },
                Unannounced {
                    prefix: net("2001:db8::9/128"),
                    reason: "the router did not announce IPv6 unicast"
                },
            ]
        );
    }
}
