//! Hearing another host claim an address this host serves: how a leader riding out an API-server outage
//! (see `cloud_provider::api_outage`) learns that another replica took its Lease and serves its VIPs,
//! without the API server. The replica that took over puts the VIPs on its own interface and announces
//! them; this host hears either that announcement or, if it came before this host listened, the new
//! holder's answer to a probe.
//!
//! **Listening.** Every ARP frame and neighbour advertisement on the VIP interface is parsed
//! ([`crate::heard`]); one whose sender is another MAC address and whose address is one of this host's
//! VIPs is a claim ([`claim_of`]). An `AF_PACKET` socket on the interface sees every frame, so it is open
//! only while the leader rides an outage out (no cost otherwise).
//!
//! **Probing.** Every [`PROBE_INTERVAL`], each VIP is asked for as duplicate address detection asks, so
//! that no neighbour learns anything from the question ([`probe`]): an ARP probe (RFC 5227: sender IP
//! `0.0.0.0`) for IPv4, a neighbour solicitation from `::` to the address's solicited-node group
//! (RFC 4862 §5.4.2) for IPv6. A host that has the address answers (Linux does for both), and its answer
//! is a claim.
//!
//! Both need `CAP_NET_RAW`, which leader mode's announcements need already.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    announce::{self, Mac},
    heard::{self, Heard},
};

/// Between two rounds of probes.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How many times [`holders`] asks for an address no host has answered for yet.
const PROBE_ROUNDS: u32 = 3;

/// How long one read waits, so that a stopped watch ends within it.
const READ_TIMEOUT: Duration = Duration::from_millis(50);

/// Another host claims an address: it announced it, or answered for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) ip: IpAddr,
    pub(crate) mac: Mac,
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.mac;
        write!(
            f,
            "{} is claimed by the host with MAC address {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            self.ip, m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// The claim `heard` makes, if it is one made by a host other than the one whose MAC address is `ours`:
/// an ARP request or reply says its sender has its sender address (unless that is `0.0.0.0`, a probe);
/// a neighbour advertisement says its sender has its target.
pub(crate) fn claim_of(heard: &Heard, ours: Mac) -> Option<Claim> {
    let (ip, mac, ethernet_source) = match *heard {
        Heard::Arp {
            operation: 1 | 2,
            sender_ip,
            sender_mac,
            ethernet_source,
            ..
        } if !sender_ip.is_unspecified() => (IpAddr::V4(sender_ip), sender_mac, ethernet_source),
        Heard::NeighbourAdvertisement {
            target,
            target_link_layer_address,
            ethernet_source,
            ..
        } => (
            IpAddr::V6(target),
            target_link_layer_address.unwrap_or(ethernet_source),
            ethernet_source,
        ),
        Heard::Arp { .. } => return None,
    };
    (mac != ours && ethernet_source != ours).then_some(Claim { ip, mac })
}

/// Length of an IPv6 probe: Ethernet header (14), IPv6 header (40), neighbour solicitation (24).
const SOLICITATION_FRAME_LEN: usize = 78;

/// The frame asking who has `ip`, from `mac`, that no neighbour learns from.
pub(crate) fn probe(mac: Mac, ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(ip) => arp_probe(mac, ip).to_vec(),
        IpAddr::V6(ip) => duplicate_address_solicitation(mac, ip).to_vec(),
    }
}

fn arp_probe(mac: Mac, ip: Ipv4Addr) -> [u8; announce::ARP_FRAME_LEN] {
    let mut frame = [0; announce::ARP_FRAME_LEN];
    frame[0..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    // Ethernet, IPv4, 6-byte and 4-byte addresses, a request.
    frame[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    frame[22..28].copy_from_slice(&mac);
    // Sender IP 0.0.0.0 (bytes 28..32), target MAC unknown (32..38): left zero.
    frame[38..42].copy_from_slice(&ip.octets());
    frame
}

fn duplicate_address_solicitation(mac: Mac, ip: Ipv6Addr) -> [u8; SOLICITATION_FRAME_LEN] {
    let target = ip.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(target[13]),
        u16::from_be_bytes([target[14], target[15]]),
    );
    let mut message = [0u8; 24];
    message[0] = 135; // neighbour solicitation; code, checksum and reserved are zero
    message[8..24].copy_from_slice(&target);
    let checksum = announce::icmpv6_checksum(Ipv6Addr::UNSPECIFIED, group, &message);
    message[2..4].copy_from_slice(&checksum.to_be_bytes());

    let mut frame = [0u8; SOLICITATION_FRAME_LEN];
    frame[0..6].copy_from_slice(&[0x33, 0x33, 0xff, target[13], target[14], target[15]]);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    frame[14] = 0x60; // version 6, no traffic class or flow label
    frame[18..20].copy_from_slice(&24u16.to_be_bytes());
    frame[20] = 58; // ICMPv6
    frame[21] = 255; // hop limit, as neighbour discovery requires
    // Source :: (bytes 22..38): left zero.
    frame[38..54].copy_from_slice(&group.octets());
    frame[54..78].copy_from_slice(&message);
    frame
}

/// Whether a read of the channel ended only because [`READ_TIMEOUT`] passed (no frame came).
fn read_timed_out(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// An interface's MAC address and a channel that sends and receives its Ethernet frames.
struct Link {
    mac: Mac,
    sender: Box<dyn pnet_datalink::DataLinkSender>,
    receiver: Box<dyn pnet_datalink::DataLinkReceiver>,
}

impl Link {
    fn open(interface: &str) -> io::Result<Self> {
        let link = pnet_datalink::interfaces()
            .into_iter()
            .find(|link| link.name == interface)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no interface named {interface}"),
                )
            })?;
        let mac = link
            .mac
            .map(|mac| mac.octets())
            .filter(|mac| *mac != [0; 6])
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{interface} has no link-layer address: no other host can claim an address on it"),
                )
            })?;
        let config = pnet_datalink::Config {
            read_timeout: Some(READ_TIMEOUT),
            write_timeout: Some(Duration::from_secs(1)),
            promiscuous: false,
            ..Default::default()
        };
        match pnet_datalink::channel(&link, config)? {
            pnet_datalink::Channel::Ethernet(sender, receiver) => Ok(Self {
                mac,
                sender,
                receiver,
            }),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "not an Ethernet channel",
            )),
        }
    }
}

/// Which other hosts on `interface` have which of `ips` now: each is probed ([`probe`]) in up to
/// [`PROBE_ROUNDS`] rounds spread over `wait`, until it is answered, and the answers heard within `wait`
/// are collected (the first host to claim an address is kept). Blocks the
/// calling thread for `wait`. How a new leader learns that the previous one still serves the VIPs it
/// takes over, and where to forward their open connections
/// ([`crate::leader_handoff`]).
pub(crate) fn holders(
    interface: &str,
    ips: &BTreeSet<IpAddr>,
    wait: Duration,
) -> io::Result<BTreeMap<IpAddr, Mac>> {
    let Link {
        mac,
        mut sender,
        mut receiver,
    } = Link::open(interface)?;
    let mut found = BTreeMap::new();
    let start = Instant::now();
    let deadline = start + wait;
    let mut rounds_sent = 0;
    while found.len() < ips.len() {
        let now = Instant::now();
        // Another round for the addresses not answered yet once its share of `wait` has begun: a
        // frame lost (a link whose carrier just came up drops what is sent on it) costs one round,
        // not the answer.
        if rounds_sent < PROBE_ROUNDS
            && now >= start + wait.mul_f64(f64::from(rounds_sent) / f64::from(PROBE_ROUNDS))
        {
            for ip in ips.iter().filter(|ip| !found.contains_key(*ip)) {
                if let Some(Err(err)) = sender.send_to(&probe(mac, *ip), None) {
                    return Err(io::Error::new(
                        err.kind(),
                        format!("probing {interface} for {ip}: {err}"),
                    ));
                }
            }
            rounds_sent += 1;
        }
        if now >= deadline {
            break;
        }
        match receiver.next() {
            Ok(frame) => {
                if let Some(claim) = heard::parse(frame).and_then(|h| claim_of(&h, mac))
                    && ips.contains(&claim.ip)
                {
                    found.entry(claim.ip).or_insert(claim.mac);
                }
            }
            Err(err) if read_timed_out(&err) => {}
            Err(err) => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("reading frames on {interface}: {err}"),
                ));
            }
        }
    }
    Ok(found)
}

/// Listens and probes on an interface, on a thread of its own, from [`ConflictWatch::start`] until it
/// is dropped; the first claim on one of the addresses it defends ends it.
pub(crate) struct ConflictWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The first claim heard, or why the watch stopped before one.
    claims: tokio::sync::oneshot::Receiver<Result<Claim, String>>,
}

impl ConflictWatch {
    /// Watches `interface` for claims on the addresses `defended` returns (asked at every round of
    /// probes and at every claim heard, so a VIP that came off is no longer defended).
    pub(crate) fn start(
        interface: &str,
        defended: impl Fn() -> BTreeSet<IpAddr> + Send + 'static,
    ) -> io::Result<Self> {
        let Link {
            mac,
            mut sender,
            mut receiver,
        } = Link::open(interface)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (found, claims) = tokio::sync::oneshot::channel();
        let thread = {
            let stop = stop.clone();
            let interface = interface.to_owned();
            std::thread::Builder::new()
                .name("vip-conflicts".to_owned())
                .spawn(move || {
                    let mut next_probe = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if Instant::now() >= next_probe {
                            for ip in defended() {
                                if let Some(Err(err)) = sender.send_to(&probe(mac, ip), None) {
                                    tracing::debug!(%ip, %interface, error = %err, "cannot probe for the VIP");
                                }
                            }
                            next_probe = Instant::now() + PROBE_INTERVAL;
                        }
                        let frame = match receiver.next() {
                            Ok(frame) => frame,
                            Err(err) if read_timed_out(&err) => continue,
                            // The interface went away, or the socket broke: the watch cannot go on,
                            // and says so (rather than spin on the error or end unseen).
                            Err(err) => {
                                let _ = found.send(Err(format!("reading frames on {interface}: {err}")));
                                return;
                            }
                        };
                        if let Some(claim) = heard::parse(frame).and_then(|h| claim_of(&h, mac))
                            && defended().contains(&claim.ip)
                        {
                            let _ = found.send(Ok(claim));
                            return;
                        }
                    }
                })?
        };
        Ok(Self {
            stop,
            thread: Some(thread),
            claims,
        })
    }

    /// The first claim heard on a defended address; `Err` with why when the watch stopped without one
    /// (its socket failed, or its thread panicked): the caller can no longer tell whether another host
    /// serves, and must act on that.
    pub(crate) async fn claim(&mut self) -> Result<Claim, String> {
        match (&mut self.claims).await {
            Ok(outcome) => outcome,
            Err(_) => Err("the watch's thread ended without a word (it panicked)".to_owned()),
        }
    }
}

impl Drop for ConflictWatch {
    /// Stops the thread: it ends within one read timeout (50 ms).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addresses::test_interface::TestInterface;

    const OURS: Mac = [0x02, 0, 0, 0, 0, 0x01];
    const THEIRS: Mac = [0x02, 0, 0, 0, 0, 0x02];

    fn arp(operation: u16, sender_mac: Mac, sender_ip: Ipv4Addr) -> Heard {
        Heard::Arp {
            operation,
            ethernet_source: sender_mac,
            ethernet_destination: [0xff; 6],
            sender_mac,
            sender_ip,
            target_mac: [0; 6],
            target_ip: Ipv4Addr::new(192, 0, 2, 10),
        }
    }

    fn advertisement(source: Mac, target_mac: Option<Mac>) -> Heard {
        Heard::NeighbourAdvertisement {
            ethernet_source: source,
            ethernet_destination: [0x33, 0x33, 0, 0, 0, 1],
            source: "fe80::2".parse().unwrap(),
            destination: "ff02::1".parse().unwrap(),
            hop_limit: 255,
            router: false,
            solicited: false,
            override_: true,
            target: "2001:db8::10".parse().unwrap(),
            target_link_layer_address: target_mac,
        }
    }

    #[test]
    fn what_counts_as_another_hosts_claim() {
        let vip = Ipv4Addr::new(192, 0, 2, 10);
        let v6: IpAddr = "2001:db8::10".parse().unwrap();
        let cases: [(&str, Heard, Option<Claim>); 8] = [
            (
                "another host's gratuitous request",
                arp(1, THEIRS, vip),
                Some(Claim {
                    ip: vip.into(),
                    mac: THEIRS,
                }),
            ),
            (
                "another host's reply (to a probe, or gratuitous)",
                arp(2, THEIRS, vip),
                Some(Claim {
                    ip: vip.into(),
                    mac: THEIRS,
                }),
            ),
            ("our own announcement", arp(1, OURS, vip), None),
            (
                "a probe claims nothing",
                arp(1, THEIRS, Ipv4Addr::UNSPECIFIED),
                None,
            ),
            ("an operation that is neither", arp(3, THEIRS, vip), None),
            (
                "another host's advertisement",
                advertisement(THEIRS, Some(THEIRS)),
                Some(Claim {
                    ip: v6,
                    mac: THEIRS,
                }),
            ),
            (
                "an advertisement without the option is the frame's sender's",
                advertisement(THEIRS, None),
                Some(Claim {
                    ip: v6,
                    mac: THEIRS,
                }),
            ),
            (
                "our own advertisement",
                advertisement(OURS, Some(OURS)),
                None,
            ),
        ];
        for (case, heard, want) in cases {
            assert_eq!(claim_of(&heard, OURS), want, "{case}");
        }
    }

    #[test]
    fn an_arp_probe_asks_without_telling() {
        let frame = probe(OURS, "192.0.2.10".parse().unwrap());
        assert_eq!(frame.len(), announce::ARP_FRAME_LEN);
        match heard::parse(&frame).unwrap() {
            Heard::Arp {
                operation,
                ethernet_destination,
                sender_mac,
                sender_ip,
                target_mac,
                target_ip,
                ..
            } => {
                assert_eq!(operation, 1);
                assert_eq!(ethernet_destination, [0xff; 6]);
                assert_eq!(sender_mac, OURS);
                assert_eq!(
                    sender_ip,
                    Ipv4Addr::UNSPECIFIED,
                    "no neighbour learns from it"
                );
                assert_eq!(target_mac, [0; 6]);
                assert_eq!(target_ip, Ipv4Addr::new(192, 0, 2, 10));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            claim_of(&heard::parse(&frame).unwrap(), THEIRS),
            None,
            "a probe is no claim, from anyone"
        );
    }

    #[test]
    fn an_ipv6_probe_is_a_duplicate_address_solicitation() {
        let ip: Ipv6Addr = "2001:db8::ab:cdef".parse().unwrap();
        let frame = probe(OURS, IpAddr::V6(ip));
        assert_eq!(frame.len(), SOLICITATION_FRAME_LEN);
        assert_eq!(&frame[0..6], &[0x33, 0x33, 0xff, 0xab, 0xcd, 0xef]);
        assert_eq!(&frame[6..12], &OURS);
        assert_eq!(frame[20], 58);
        assert_eq!(frame[21], 255);
        assert_eq!(&frame[22..38], &[0; 16], "from the unspecified address");
        let group: Ipv6Addr = "ff02::1:ffab:cdef".parse().unwrap();
        assert_eq!(&frame[38..54], &group.octets());
        assert_eq!(frame[54], 135);
        assert_eq!(&frame[62..78], &ip.octets());
        // The checksum over the pseudo-header and the message sums to all ones.
        let mut message = frame[54..78].to_vec();
        let stored = u16::from_be_bytes([message[2], message[3]]);
        message[2..4].copy_from_slice(&[0, 0]);
        assert_eq!(
            announce::icmpv6_checksum(Ipv6Addr::UNSPECIFIED, group, &message),
            stored
        );
        assert_eq!(heard::parse(&frame), None, "a solicitation claims nothing");
    }

    fn mac_of(interface: &str) -> Mac {
        pnet_datalink::interfaces()
            .into_iter()
            .find(|link| link.name == interface)
            .and_then(|link| link.mac)
            .expect("the test interface's MAC")
            .octets()
    }

    /// On a veth pair (root, as CI runs), a watch on one end: an announcement from the other end of an
    /// address the watch does not defend is no claim; one of a defended address is. Then, with the
    /// addresses on the other end (where this host's kernel answers for them), the watch's own probes
    /// draw the claims: an ARP reply for IPv4, a neighbour advertisement for IPv6.
    #[tokio::test]
    async fn another_hosts_announcement_or_answer_to_a_probe_is_a_claim() {
        let link = TestInterface::create_veth("c");
        let theirs = mac_of(link.peer());
        let (v4, other): (IpAddr, IpAddr) = (
            "198.51.100.210".parse().unwrap(),
            "198.51.100.211".parse().unwrap(),
        );

        let mut watch = ConflictWatch::start(link.name(), move || BTreeSet::from([v4])).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await; // the socket is open before they speak
        announce::announce(link.peer(), other).unwrap();
        announce::announce(link.peer(), v4).unwrap();
        let claim = tokio::time::timeout(Duration::from_secs(5), watch.claim())
            .await
            .expect("the announcement is heard")
            .unwrap();
        assert_eq!(
            claim,
            Claim {
                ip: v4,
                mac: theirs
            }
        );
        assert!(
            claim
                .to_string()
                .starts_with("198.51.100.210 is claimed by the host with MAC address "),
            "{claim}"
        );
        drop(watch);

        // Nobody announces now: only an answer to a probe can tell.
        let (probed_v4, probed_v6): (IpAddr, IpAddr) = (
            "198.51.100.212".parse().unwrap(),
            "2001:db8::212".parse().unwrap(),
        );
        put_on_the_other_end(&link, &[probed_v4, probed_v6]);
        for ip in [probed_v4, probed_v6] {
            let mut watch =
                ConflictWatch::start(link.name(), move || BTreeSet::from([ip])).unwrap();
            let claim = tokio::time::timeout(3 * PROBE_INTERVAL, watch.claim())
                .await
                .unwrap_or_else(|_| panic!("nobody answered the probe for {ip}"))
                .unwrap();
            assert_eq!(claim, Claim { ip, mac: theirs });
        }
    }

    /// Puts `ips` on the other end of `link` (host addresses; IPv6 without duplicate address
    /// detection), where this host's kernel answers for them as another host would.
    fn put_on_the_other_end(link: &TestInterface, ips: &[IpAddr]) {
        for ip in ips {
            let (prefix, extra): (&str, &[&str]) = match ip {
                IpAddr::V4(_) => ("/32", &[]),
                IpAddr::V6(_) => ("/128", &["nodad"]),
            };
            let added = std::process::Command::new("ip")
                .args([
                    "address",
                    "add",
                    &format!("{ip}{prefix}"),
                    "dev",
                    link.peer(),
                ])
                .args(extra)
                .status()
                .unwrap();
            assert!(added.success(), "ip address add {ip} on {}", link.peer());
        }
    }

    /// A new leader's one look (root, on a veth pair): of the addresses asked for, those another host
    /// has (IPv4 and IPv6, put on the other end) are found with its MAC address; one nobody has is not.
    #[test]
    fn holders_are_the_hosts_that_answer_the_probes() {
        let link = TestInterface::create_veth("h");
        let theirs = mac_of(link.peer());
        let (v4, v6, nobodys): (IpAddr, IpAddr, IpAddr) = (
            "198.51.100.214".parse().unwrap(),
            "2001:db8::214".parse().unwrap(),
            "198.51.100.215".parse().unwrap(),
        );
        put_on_the_other_end(&link, &[v4, v6]);
        let found = holders(
            link.name(),
            &BTreeSet::from([v4, v6, nobodys]),
            Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(found, BTreeMap::from([(v4, theirs), (v6, theirs)]));
        let err = holders("ccm-no-such-link", &BTreeSet::from([v4]), Duration::ZERO).unwrap_err();
        assert!(
            err.to_string()
                .contains("no interface named ccm-no-such-link"),
            "{err}"
        );
    }

    /// A watch whose interface goes away says so (the leader then steps down) instead of spinning on
    /// the socket's errors or ending unseen.
    #[tokio::test]
    async fn a_watch_whose_interface_goes_away_says_why() {
        let link = TestInterface::create_veth("g");
        let ip: IpAddr = "198.51.100.213".parse().unwrap();
        let mut watch = ConflictWatch::start(link.name(), move || BTreeSet::from([ip])).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(link);
        let outcome = tokio::time::timeout(Duration::from_secs(5), watch.claim())
            .await
            .expect("the watch ends when its interface is gone");
        let why = outcome.expect_err("no claim was made");
        assert!(why.starts_with("reading frames on ccmt"), "{why}");
    }
}
