//! UPDATE (RFC 4271 §4.3) and the path attributes a speaker announcing host routes sends: ORIGIN,
//! AS_PATH (2- or 4-octet, with AS4_PATH, RFC 6793), NEXT_HOP, MULTI_EXIT_DISC, LOCAL_PREF,
//! COMMUNITIES (RFC 1997), MP_REACH_NLRI / MP_UNREACH_NLRI (RFC 4760) and LARGE_COMMUNITY
//! (RFC 8092). Other attributes a router sends are kept as they came.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::{Context, Family, Malformed, codes, prefixes, put_prefix};

/// The most an UPDATE's body (after the header) may take.
pub const MAX_BODY: usize = super::MAX_LEN - super::HEADER_LEN;

/// Attribute flags (RFC 4271 §4.3).
pub(crate) mod flags {
    pub const OPTIONAL: u8 = 0x80;
    pub const TRANSITIVE: u8 = 0x40;
    pub const EXTENDED_LENGTH: u8 = 0x10;
}

const ORIGIN: u8 = 1;
const AS_PATH: u8 = 2;
const NEXT_HOP: u8 = 3;
const MED: u8 = 4;
const LOCAL_PREF: u8 = 5;
const COMMUNITIES: u8 = 8;
const MP_REACH_NLRI: u8 = 14;
const MP_UNREACH_NLRI: u8 = 15;
const AS4_PATH: u8 = 17;
const LARGE_COMMUNITY: u8 = 32;

/// An UPDATE: IPv4 routes withdrawn, path attributes, IPv4 routes announced. Other families ride in
/// the [`Attribute::MpReach`] and [`Attribute::MpUnreach`] attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    /// IPv4 prefixes withdrawn.
    pub withdrawn: Vec<IpNet>,
    /// The path attributes of the routes announced (and the multiprotocol ones).
    pub attributes: Vec<Attribute>,
    /// IPv4 prefixes announced.
    pub nlri: Vec<IpNet>,
}

/// An AS_PATH segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsSegment {
    /// 1 AS_SET, 2 AS_SEQUENCE (3 and 4 the confederation ones).
    pub kind: u8,
    /// The AS numbers.
    pub asns: Vec<u32>,
}

impl AsSegment {
    /// An AS_SEQUENCE.
    pub fn sequence(asns: Vec<u32>) -> AsSegment {
        AsSegment { kind: 2, asns }
    }
}

/// A path attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attribute {
    /// 0 IGP, 1 EGP, 2 INCOMPLETE.
    Origin(u8),
    /// The ASes the route went through, in the session's AS number width.
    AsPath(Vec<AsSegment>),
    /// The IPv4 next hop of the IPv4 routes in the classic NLRI.
    NextHop(Ipv4Addr),
    /// MULTI_EXIT_DISC.
    Med(u32),
    /// LOCAL_PREF (iBGP only).
    LocalPref(u32),
    /// RFC 1997 communities, each `asn << 16 | value`.
    Communities(Vec<u32>),
    /// Routes of `family` announced through `next_hops` (an IPv6 next hop may be followed by its
    /// link-local address).
    MpReach {
        /// The routes' family.
        family: Family,
        /// The next hop (and for IPv6 optionally a link-local one).
        next_hops: Vec<IpAddr>,
        /// The routes.
        nlri: Vec<IpNet>,
    },
    /// Routes of `family` withdrawn; none is the family's End-of-RIB marker (RFC 4724 §2).
    MpUnreach {
        /// The routes' family.
        family: Family,
        /// The routes.
        withdrawn: Vec<IpNet>,
    },
    /// The 4-octet AS_PATH beside a 2-octet one (RFC 6793).
    As4Path(Vec<AsSegment>),
    /// RFC 8092 large communities (global administrator, two local data parts).
    LargeCommunities(Vec<[u32; 3]>),
    /// Any other, kept as it came.
    Other {
        /// The flags.
        flags: u8,
        /// The type code.
        code: u8,
        /// The value.
        value: Vec<u8>,
    },
}

impl Update {
    /// The End-of-RIB marker of a family (RFC 4724 §2): what a router waits for, after a restart,
    /// before it drops the routes it kept.
    pub fn end_of_rib(family: Family) -> Update {
        if family == Family::IPV4_UNICAST {
            Update::default()
        } else {
            Update {
                attributes: vec![Attribute::MpUnreach {
                    family,
                    withdrawn: Vec::new(),
                }],
                ..Update::default()
            }
        }
    }

    /// The bytes this update's body takes on the wire.
    pub fn encoded_len(&self, context: Context) -> usize {
        let mut out = Vec::new();
        self.encode(&mut out, context);
        out.len()
    }

    pub(super) fn encode(&self, out: &mut Vec<u8>, context: Context) {
        let start = out.len();
        out.extend_from_slice(&[0, 0]);
        for prefix in &self.withdrawn {
            put_prefix(out, prefix);
        }
        let withdrawn = (out.len() - start - 2) as u16;
        out[start..start + 2].copy_from_slice(&withdrawn.to_be_bytes());
        let start = out.len();
        out.extend_from_slice(&[0, 0]);
        for attribute in &self.attributes {
            attribute.encode(out, context);
        }
        let attributes = (out.len() - start - 2) as u16;
        out[start..start + 2].copy_from_slice(&attributes.to_be_bytes());
        for prefix in &self.nlri {
            put_prefix(out, prefix);
        }
    }

    pub(super) fn decode(body: &[u8], context: Context) -> Result<Update, Malformed> {
        let withdrawn_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let Some(withdrawn) = body.get(2..2 + withdrawn_len) else {
            return Err(malformed_attribute_list(format!(
                "an UPDATE says {withdrawn_len} bytes of withdrawn routes and has {}",
                body.len() - 2
            )));
        };
        let rest = &body[2 + withdrawn_len..];
        if rest.len() < 2 {
            return Err(malformed_attribute_list(
                "an UPDATE without its path attributes' length".into(),
            ));
        }
        let attributes_len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let Some(mut data) = rest.get(2..2 + attributes_len) else {
            return Err(malformed_attribute_list(format!(
                "an UPDATE says {attributes_len} bytes of path attributes and has {}",
                rest.len() - 2
            )));
        };
        let nlri = &rest[2 + attributes_len..];
        let mut attributes = Vec::new();
        while !data.is_empty() {
            let (attribute, used) = Attribute::decode(data, context)?;
            attributes.push(attribute);
            data = &data[used..];
        }
        Ok(Update {
            withdrawn: prefixes(withdrawn, 1, "withdrawn routes")?,
            attributes,
            nlri: prefixes(nlri, 1, "NLRI")?,
        })
    }
}

impl Attribute {
    fn encode(&self, out: &mut Vec<u8>, context: Context) {
        let (flags, code) = self.flags_and_code();
        let value = self.value(context);
        if value.len() > 255 {
            out.push(flags | flags::EXTENDED_LENGTH);
            out.push(code);
            out.extend_from_slice(&(value.len() as u16).to_be_bytes());
        } else {
            out.push(flags);
            out.push(code);
            out.push(value.len() as u8);
        }
        out.extend_from_slice(&value);
    }

    /// The attribute's flags (without the extended length, which its value's length decides) and
    /// type code.
    fn flags_and_code(&self) -> (u8, u8) {
        match self {
            Attribute::Origin(_) => (flags::TRANSITIVE, ORIGIN),
            Attribute::AsPath(_) => (flags::TRANSITIVE, AS_PATH),
            Attribute::NextHop(_) => (flags::TRANSITIVE, NEXT_HOP),
            Attribute::Med(_) => (flags::OPTIONAL, MED),
            Attribute::LocalPref(_) => (flags::TRANSITIVE, LOCAL_PREF),
            Attribute::Communities(_) => (flags::OPTIONAL | flags::TRANSITIVE, COMMUNITIES),
            Attribute::MpReach { .. } => (flags::OPTIONAL, MP_REACH_NLRI),
            Attribute::MpUnreach { .. } => (flags::OPTIONAL, MP_UNREACH_NLRI),
            Attribute::As4Path(_) => (flags::OPTIONAL | flags::TRANSITIVE, AS4_PATH),
            Attribute::LargeCommunities(_) => {
                (flags::OPTIONAL | flags::TRANSITIVE, LARGE_COMMUNITY)
            }
            Attribute::Other { flags, code, .. } => (*flags & !flags::EXTENDED_LENGTH, *code),
        }
    }

    /// The attribute's value as it goes on the wire.
    fn value(&self, context: Context) -> Vec<u8> {
        let mut value = Vec::new();
        match self {
            Attribute::Origin(origin) => value.push(*origin),
            Attribute::AsPath(segments) => {
                put_segments(&mut value, segments, context.four_octet_as);
            }
            Attribute::NextHop(address) => value.extend_from_slice(&address.octets()),
            Attribute::Med(med) => value.extend_from_slice(&med.to_be_bytes()),
            Attribute::LocalPref(preference) => value.extend_from_slice(&preference.to_be_bytes()),
            Attribute::Communities(communities) => {
                for community in communities {
                    value.extend_from_slice(&community.to_be_bytes());
                }
            }
            Attribute::MpReach {
                family,
                next_hops,
                nlri,
            } => put_mp_reach(&mut value, *family, next_hops, nlri),
            Attribute::MpUnreach { family, withdrawn } => {
                put_family(&mut value, *family);
                for prefix in withdrawn {
                    put_prefix(&mut value, prefix);
                }
            }
            Attribute::As4Path(segments) => put_segments(&mut value, segments, true),
            Attribute::LargeCommunities(communities) => {
                for part in communities.iter().flatten() {
                    value.extend_from_slice(&part.to_be_bytes());
                }
            }
            Attribute::Other { value: raw, .. } => value.extend_from_slice(raw),
        }
        value
    }

    /// Decodes the attribute at the start of `data`, and how many bytes it took.
    fn decode(data: &[u8], context: Context) -> Result<(Attribute, usize), Malformed> {
        let (flags, code, header, length) = attribute_header(data)?;
        let Some(value) = data.get(header..header + length) else {
            return Err(malformed_attribute_list(format!(
                "path attribute {code} says {length} bytes and has {}",
                data.len() - header
            )));
        };
        let wrong_length = || {
            Malformed::new(
                codes::UPDATE,
                codes::update::ATTRIBUTE_LENGTH,
                data[..header + length].to_vec(),
                format!("path attribute {code} of {length} bytes"),
            )
        };
        let attribute = match code {
            ORIGIN if length == 1 => Attribute::Origin(value[0]),
            AS_PATH => {
                Attribute::AsPath(segments(value, context.four_octet_as).ok_or_else(wrong_length)?)
            }
            AS4_PATH => Attribute::As4Path(segments(value, true).ok_or_else(wrong_length)?),
            NEXT_HOP if length == 4 => {
                Attribute::NextHop(Ipv4Addr::new(value[0], value[1], value[2], value[3]))
            }
            MED if length == 4 => Attribute::Med(u32_at(value, 0)),
            LOCAL_PREF if length == 4 => Attribute::LocalPref(u32_at(value, 0)),
            COMMUNITIES if length % 4 == 0 => {
                Attribute::Communities((0..length / 4).map(|i| u32_at(value, i * 4)).collect())
            }
            LARGE_COMMUNITY if length % 12 == 0 => Attribute::LargeCommunities(
                (0..length / 12)
                    .map(|i| [0, 4, 8].map(|part| u32_at(value, i * 12 + part)))
                    .collect(),
            ),
            MP_REACH_NLRI if length >= 5 && is_unicast(value) => mp_reach(value, wrong_length)?,
            MP_UNREACH_NLRI if length >= 3 && is_unicast(value) => {
                let family = family_at(value);
                Attribute::MpUnreach {
                    family,
                    withdrawn: prefixes(&value[3..], family.afi, "MP_UNREACH_NLRI")?,
                }
            }
            ORIGIN | NEXT_HOP | MED | LOCAL_PREF | COMMUNITIES | LARGE_COMMUNITY => {
                return Err(wrong_length());
            }
            _ => Attribute::Other {
                flags,
                code,
                value: value.to_vec(),
            },
        };
        Ok((attribute, header + length))
    }
}

/// The error of an UPDATE whose parts do not add up (Malformed Attribute List).
fn malformed_attribute_list(reason: String) -> Malformed {
    Malformed::new(
        codes::UPDATE,
        codes::update::MALFORMED_ATTRIBUTE_LIST,
        Vec::new(),
        reason,
    )
}

/// A path attribute's header at the start of `data`: its flags, its type code, the header's length
/// (3, or 4 with an extended length) and the value's length.
fn attribute_header(data: &[u8]) -> Result<(u8, u8, usize, usize), Malformed> {
    if data.len() < 3 {
        return Err(malformed_attribute_list(format!(
            "a path attribute cut short ({} bytes)",
            data.len()
        )));
    }
    let (flags, code) = (data[0], data[1]);
    if flags & flags::EXTENDED_LENGTH == 0 {
        return Ok((flags, code, 3, usize::from(data[2])));
    }
    if data.len() < 4 {
        return Err(malformed_attribute_list(
            "a path attribute's extended length cut short".into(),
        ));
    }
    Ok((
        flags,
        code,
        4,
        usize::from(u16::from_be_bytes([data[2], data[3]])),
    ))
}

/// The 4-octet number at `at` in `value`.
fn u32_at(value: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([value[at], value[at + 1], value[at + 2], value[at + 3]])
}

/// The family a multiprotocol attribute's value starts with (AFI, SAFI).
fn family_at(value: &[u8]) -> Family {
    Family {
        afi: u16::from_be_bytes([value[0], value[1]]),
        safi: value[2],
    }
}

/// Puts a family as multiprotocol attributes carry it (AFI, SAFI).
fn put_family(out: &mut Vec<u8>, family: Family) {
    out.extend_from_slice(&family.afi.to_be_bytes());
    out.push(family.safi);
}

/// Puts an MP_REACH_NLRI's value (RFC 4760 §3): the family, the next hops with their length, a
/// reserved byte, the routes.
fn put_mp_reach(out: &mut Vec<u8>, family: Family, next_hops: &[IpAddr], nlri: &[IpNet]) {
    put_family(out, family);
    let at = out.len();
    out.push(0);
    for hop in next_hops {
        match hop {
            IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
        }
    }
    out[at] = (out.len() - at - 1) as u8;
    out.push(0);
    for prefix in nlri {
        put_prefix(out, prefix);
    }
}

/// Decodes an MP_REACH_NLRI's value (of IPv4 or IPv6 unicast, at least 5 bytes); `wrong_length`
/// is the error when its next hops or routes do not fit.
fn mp_reach(value: &[u8], wrong_length: impl Fn() -> Malformed) -> Result<Attribute, Malformed> {
    let family = family_at(value);
    let hops_len = usize::from(value[3]);
    let hops = value.get(4..4 + hops_len).ok_or_else(&wrong_length)?;
    let next_hops = next_hops(hops).ok_or_else(&wrong_length)?;
    // One reserved byte after the next hops.
    let nlri = value.get(5 + hops_len..).ok_or_else(&wrong_length)?;
    Ok(Attribute::MpReach {
        family,
        next_hops,
        nlri: prefixes(nlri, family.afi, "MP_REACH_NLRI")?,
    })
}

/// The next hops of an MP_REACH_NLRI: one IPv4 address, or an IPv6 one and maybe its link-local
/// one; `None` for any other length.
fn next_hops(hops: &[u8]) -> Option<Vec<IpAddr>> {
    match hops.len() {
        4 => Some(vec![IpAddr::V4(Ipv4Addr::new(
            hops[0], hops[1], hops[2], hops[3],
        ))]),
        16 | 32 => Some(
            hops.chunks_exact(16)
                .map(|c| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(c).unwrap_or_default())))
                .collect(),
        ),
        _ => None,
    }
}

/// Whether a multiprotocol attribute's value starts with IPv4 or IPv6 unicast, the families we
/// decode; others are kept whole.
fn is_unicast(value: &[u8]) -> bool {
    matches!(u16::from_be_bytes([value[0], value[1]]), 1 | 2) && value[2] == 1
}

fn put_segments(out: &mut Vec<u8>, segments: &[AsSegment], four_octet: bool) {
    for segment in segments {
        out.push(segment.kind);
        out.push(segment.asns.len() as u8);
        for &asn in &segment.asns {
            if four_octet {
                out.extend_from_slice(&asn.to_be_bytes());
            } else {
                let two = u16::try_from(asn).unwrap_or(super::open::AS_TRANS);
                out.extend_from_slice(&two.to_be_bytes());
            }
        }
    }
}

fn segments(mut data: &[u8], four_octet: bool) -> Option<Vec<AsSegment>> {
    let width = if four_octet { 4 } else { 2 };
    let mut out = Vec::new();
    while !data.is_empty() {
        let (&kind, rest) = data.split_first()?;
        let (&count, rest) = rest.split_first()?;
        let bytes = rest.get(..usize::from(count) * width)?;
        let asns = bytes
            .chunks_exact(width)
            .map(|c| {
                if four_octet {
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]])
                } else {
                    u32::from(u16::from_be_bytes([c[0], c[1]]))
                }
            })
            .collect();
        out.push(AsSegment { kind, asns });
        data = &rest[bytes.len()..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::{Message, decode, encode};
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn round_trip(update: Update, context: Context) -> Vec<u8> {
        let bytes = encode(&Message::Update(update.clone()), context);
        let (decoded, used) = decode(&bytes, context).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(decoded, Message::Update(update));
        bytes
    }

    #[test]
    fn an_ipv4_announcement_round_trips_with_every_attribute_we_send() {
        let update = Update {
            withdrawn: vec![net("10.0.0.9/32")],
            attributes: vec![
                Attribute::Origin(0),
                Attribute::AsPath(vec![AsSegment::sequence(vec![4_200_000_001])]),
                Attribute::NextHop(Ipv4Addr::new(192, 168, 1, 2)),
                Attribute::Med(10),
                Attribute::LocalPref(200),
                Attribute::Communities(vec![(64512 << 16) | 100]),
                Attribute::LargeCommunities(vec![[4_200_000_001, 1, 2]]),
            ],
            nlri: vec![net("10.0.0.1/32"), net("10.0.1.0/24")],
        };
        round_trip(
            update,
            Context {
                four_octet_as: true,
            },
        );
    }

    #[test]
    fn a_2_octet_session_carries_a_4_octet_asn_as_as_trans() {
        let context = Context {
            four_octet_as: false,
        };
        let update = Update {
            attributes: vec![
                Attribute::Origin(0),
                Attribute::AsPath(vec![AsSegment::sequence(vec![u32::from(
                    super::super::open::AS_TRANS,
                )])]),
                Attribute::As4Path(vec![AsSegment::sequence(vec![4_200_000_001])]),
                Attribute::NextHop(Ipv4Addr::new(192, 168, 1, 2)),
            ],
            nlri: vec![net("10.0.0.1/32")],
            ..Update::default()
        };
        let bytes = round_trip(update, context);
        // AS_PATH: flags, type 2, length 4, segment type 2, one AS, 23456.
        let at = bytes.windows(3).position(|w| w == [0x40, 2, 4]).unwrap();
        assert_eq!(&bytes[at + 3..at + 7], &[2, 1, 0x5b, 0xa0]);
    }

    #[test]
    fn ipv6_rides_in_multiprotocol_attributes_and_end_of_rib_is_an_empty_unreach() {
        let update = Update {
            attributes: vec![
                Attribute::Origin(0),
                Attribute::AsPath(vec![]),
                Attribute::MpReach {
                    family: Family::IPV6_UNICAST,
                    next_hops: vec!["2001:db8::2".parse().unwrap(), "fe80::2".parse().unwrap()],
                    nlri: vec![net("2001:db8:1::1/128")],
                },
                Attribute::MpUnreach {
                    family: Family::IPV6_UNICAST,
                    withdrawn: vec![net("2001:db8:1::2/128")],
                },
            ],
            ..Update::default()
        };
        round_trip(
            update,
            Context {
                four_octet_as: true,
            },
        );
        let eor = round_trip(Update::end_of_rib(Family::IPV6_UNICAST), Context::default());
        assert_eq!(&eor[19..], &[0, 0, 0, 6, 0x80, 15, 3, 0, 2, 1]);
        assert_eq!(
            round_trip(Update::end_of_rib(Family::IPV4_UNICAST), Context::default()).len(),
            23
        );
    }

    #[test]
    fn long_attributes_use_the_extended_length() {
        let communities: Vec<u32> = (0..100).collect();
        let bytes = round_trip(
            Update {
                attributes: vec![Attribute::Communities(communities)],
                ..Update::default()
            },
            Context::default(),
        );
        assert_eq!(
            bytes[23],
            flags::OPTIONAL | flags::TRANSITIVE | flags::EXTENDED_LENGTH
        );
    }

    #[test]
    fn unknown_attributes_and_families_are_kept_as_they_came() {
        let update = Update {
            attributes: vec![
                Attribute::Other {
                    flags: flags::OPTIONAL | flags::TRANSITIVE,
                    code: 99,
                    value: vec![1, 2, 3],
                },
                // L2VPN EVPN: kept whole, not decoded.
                Attribute::Other {
                    flags: flags::OPTIONAL,
                    code: MP_REACH_NLRI,
                    value: vec![0, 25, 70, 4, 1, 1, 1, 1, 0],
                },
            ],
            ..Update::default()
        };
        round_trip(update, Context::default());
    }

    #[test]
    fn next_hops_are_one_ipv4_address_or_one_or_two_ipv6_ones() {
        assert_eq!(
            next_hops(&[192, 0, 2, 1]),
            Some(vec!["192.0.2.1".parse().unwrap()])
        );
        let global: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let link_local: Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(next_hops(&global.octets()), Some(vec![IpAddr::V6(global)]));
        let both = [global.octets(), link_local.octets()].concat();
        assert_eq!(
            next_hops(&both),
            Some(vec![IpAddr::V6(global), IpAddr::V6(link_local)])
        );
        for length in [0, 5, 8, 20, 48] {
            assert_eq!(next_hops(&vec![1; length]), None, "{length} bytes");
        }
    }

    #[test]
    fn an_attribute_header_has_a_1_or_2_octet_length() {
        assert_eq!(
            attribute_header(&[flags::TRANSITIVE, ORIGIN, 1, 0]).unwrap(),
            (flags::TRANSITIVE, ORIGIN, 3, 1)
        );
        let extended = flags::OPTIONAL | flags::EXTENDED_LENGTH;
        assert_eq!(
            attribute_header(&[extended, COMMUNITIES, 1, 4]).unwrap(),
            (extended, COMMUNITIES, 4, 260)
        );
        assert!(attribute_header(&[extended, COMMUNITIES, 1]).is_err());
        assert!(attribute_header(&[flags::TRANSITIVE, ORIGIN]).is_err());
    }

    #[test]
    fn bad_updates_name_what_is_wrong() {
        for (body, subcode) in [
            (vec![0, 9, 0, 0], codes::update::MALFORMED_ATTRIBUTE_LIST),
            (
                vec![0, 0, 0, 9, 0x40, 1, 1, 0],
                codes::update::MALFORMED_ATTRIBUTE_LIST,
            ),
            (
                vec![0, 0, 0, 4, 0x40, 1, 2, 0],
                codes::update::MALFORMED_ATTRIBUTE_LIST,
            ),
            (
                vec![0, 0, 0, 5, 0x40, 1, 2, 0, 0],
                codes::update::ATTRIBUTE_LENGTH,
            ),
            (
                vec![0, 0, 0, 6, 0x40, 3, 3, 1, 2, 3],
                codes::update::ATTRIBUTE_LENGTH,
            ),
            (
                vec![0, 0, 0, 0, 40, 10],
                codes::update::INVALID_NETWORK_FIELD,
            ),
        ] {
            let mut bytes = vec![0xff; 16];
            bytes.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
            bytes.push(2);
            bytes.extend_from_slice(&body);
            let error = decode(&bytes, Context::default()).unwrap_err();
            assert_eq!(
                (error.notification.code, error.notification.subcode),
                (codes::UPDATE, subcode),
                "{body:?}: {}",
                error.reason
            );
        }
    }
}
