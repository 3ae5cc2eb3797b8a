//! Telling the neighbours on a link that this host holds an address now, so that they stop sending its
//! traffic to the host that held it before: a gratuitous ARP for IPv4, an unsolicited neighbour
//! advertisement for IPv6. One job, and nothing of Kubernetes in it: [`announce`] sends one round for
//! one address on one interface, [`repeat`] the rounds after it.
//!
//! **Why.** A neighbour keeps the link-layer address it learnt for an IP until its cache entry
//! expires, and a VIP that moved to another host (leadership moved, or a released address went to a
//! new Service) keeps being sent to the previous holder. Between Kubernetes nodes that is worse than
//! a delay: the previous holder forwards the client's SYN (nodes forward IP) to the new holder, whose
//! SYN-ACK goes straight back to the client; every SYN-ACK confirms the client's stale entry, while
//! the previous holder's conntrack sees one direction only and kube-proxy's
//! `--ctstate INVALID -j DROP` drops the rest. Connections hang for as long as the client tries.
//!
//! **What one round sends**, each frame from the interface's MAC address:
//! - IPv4: an ARP request and an ARP reply, both to the Ethernet broadcast address, with sender IP =
//!   target IP = the address and sender MAC = the interface's MAC, as MetalLB does on a leadership
//!   change (and `arping -U` / `arping -A`). The request's target MAC is the broadcast address (as
//!   MetalLB's and `arping -U`'s); the reply's is the sender's MAC (as `arping -A`'s; MetalLB puts the
//!   broadcast address there), because Linux takes an ARP reply for gratuitous, and lets it replace a
//!   neighbour entry updated less than `locktime` ago, only when its target MAC is its sender MAC.
//! - IPv6: a neighbour advertisement to all nodes (`ff02::1`, Ethernet `33:33:00:00:00:01`) with the
//!   override flag (and neither the router nor the solicited flag), the address as target, the target
//!   link-layer address option, hop limit 255. Its source is the address itself, as in the kernel's
//!   own unsolicited advertisements (`ndisc_notify`): it is on the interface, without duplicate
//!   address detection, so it is valid at once, where the link-local address may still be tentative.
//!
//! Frames are built by pure functions ([`gratuitous_arp`], [`unsolicited_neighbour_advertisement`])
//! and sent through an `AF_PACKET` socket (`pnet_datalink`), which needs `CAP_NET_RAW`. Sending is a
//! few system calls on the calling thread, well under a millisecond; it does not wait for anything.

use std::{
    fmt, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use crate::os_error;

/// How many rounds announce an address: one when it is taken, the others [`INTERVAL`] apart (as
/// MetalLB, which repeats its announcements on a leadership change; a frame lost on a busy link, or a
/// neighbour that ignores one form, is covered by the next).
pub(crate) const ROUNDS: u32 = 3;

/// Between two rounds.
pub(crate) const INTERVAL: Duration = Duration::from_millis(500);

/// How long sending one frame may wait for room in the socket's buffer.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// An Ethernet (MAC) address.
pub(crate) type Mac = [u8; 6];

/// The Ethernet broadcast address.
const BROADCAST: Mac = [0xff; 6];

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;

/// ICMPv6's number as an IPv6 next header.
const NEXT_HEADER_ICMPV6: u8 = 58;

/// ICMPv6 type of a neighbour advertisement.
const NEIGHBOR_ADVERTISEMENT: u8 = 136;

/// The override flag of a neighbour advertisement (the first byte of its flags word).
const FLAG_OVERRIDE: u8 = 0x20;

/// The neighbour discovery option type "target link-layer address".
const OPTION_TARGET_LINK_LAYER_ADDRESS: u8 = 2;

/// Length of a gratuitous ARP frame: Ethernet header (14) and ARP for IPv4 over Ethernet (28). The
/// interface's driver pads it to Ethernet's 60-byte minimum, as it does the kernel's own ARP frames.
pub(crate) const ARP_FRAME_LEN: usize = 42;

/// Length of an unsolicited neighbour advertisement frame: Ethernet header (14), IPv6 header (40),
/// the advertisement (24) and its target link-layer address option (8).
pub(crate) const ADVERTISEMENT_FRAME_LEN: usize = 86;

/// The ARP operation of a gratuitous ARP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArpOperation {
    /// `1`: "who has the address? tell it" (`arping -U`).
    Request = 1,
    /// `2`: "the address is at" (`arping -A`).
    Reply = 2,
}

/// The gratuitous ARP frame `operation` for `ip` from `mac`: Ethernet broadcast, sender = `mac` and
/// `ip`, target IP = `ip`; the target MAC is the broadcast address in a request and `mac` in a reply.
pub(crate) fn gratuitous_arp(
    operation: ArpOperation,
    mac: Mac,
    ip: Ipv4Addr,
) -> [u8; ARP_FRAME_LEN] {
    let target_mac = match operation {
        ArpOperation::Request => BROADCAST,
        ArpOperation::Reply => mac,
    };
    let mut frame = [0; ARP_FRAME_LEN];
    let mut out = Writer::new(&mut frame);
    // Ethernet: destination, source, type.
    out.put(&BROADCAST);
    out.put(&mac);
    out.put(&ETHERTYPE_ARP.to_be_bytes());
    // ARP: hardware type Ethernet, protocol IPv4, their address lengths, the operation.
    out.put(&1u16.to_be_bytes());
    out.put(&ETHERTYPE_IPV4.to_be_bytes());
    out.put(&[6, 4]);
    out.put(&(operation as u16).to_be_bytes());
    // Sender MAC and IP, target MAC and IP.
    out.put(&mac);
    out.put(&ip.octets());
    out.put(&target_mac);
    out.put(&ip.octets());
    out.done();
    frame
}

/// The unsolicited neighbour advertisement frame for `ip` from `mac`: to all nodes (`ff02::1`), from
/// `ip`, hop limit 255, override flag set, with the target link-layer address option (`mac`).
pub(crate) fn unsolicited_neighbour_advertisement(
    mac: Mac,
    ip: Ipv6Addr,
) -> [u8; ADVERTISEMENT_FRAME_LEN] {
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    // The advertisement: type, code, checksum (below), flags and reserved bits, target, then the
    // option: type, length in units of 8 bytes, the MAC.
    let mut message = [0; 32];
    let mut out = Writer::new(&mut message);
    out.put(&[NEIGHBOR_ADVERTISEMENT, 0, 0, 0]);
    out.put(&[FLAG_OVERRIDE, 0, 0, 0]);
    out.put(&ip.octets());
    out.put(&[OPTION_TARGET_LINK_LAYER_ADDRESS, 1]);
    out.put(&mac);
    out.done();
    let checksum = icmpv6_checksum(ip, all_nodes, &message);
    message[2..4].copy_from_slice(&checksum.to_be_bytes());

    let mut frame = [0; ADVERTISEMENT_FRAME_LEN];
    let mut out = Writer::new(&mut frame);
    // Ethernet: to the all-nodes group's MAC (33:33 and the group's last 32 bits), from `mac`.
    out.put(&[0x33, 0x33, 0, 0, 0, 1]);
    out.put(&mac);
    out.put(&ETHERTYPE_IPV6.to_be_bytes());
    // IPv6: version 6 (no traffic class, no flow label), payload length, next header, hop limit
    // 255 (a neighbour drops an advertisement with any other), source, destination.
    out.put(&[0x60, 0, 0, 0]);
    out.put(&(message.len() as u16).to_be_bytes());
    out.put(&[NEXT_HEADER_ICMPV6, 255]);
    out.put(&ip.octets());
    out.put(&all_nodes.octets());
    out.put(&message);
    out.done();
    frame
}

/// The ICMPv6 checksum of `message` (its checksum field zero) from `source` to `destination`: the
/// ones' complement of the ones' complement sum of the 16-bit words of the pseudo-header (source,
/// destination, upper-layer length, next header) and the message (RFC 8200 §8.1, RFC 4443 §2.3).
pub(crate) fn icmpv6_checksum(source: Ipv6Addr, destination: Ipv6Addr, message: &[u8]) -> u16 {
    let length = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let pseudo_header = [
        &source.octets()[..],
        &destination.octets()[..],
        &length.to_be_bytes()[..],
        &[0, 0, 0, NEXT_HEADER_ICMPV6][..],
    ];
    let mut sum: u32 = 0;
    for part in pseudo_header.into_iter().chain([message]) {
        for word in part.chunks(2) {
            let high = u32::from(word[0]) << 8;
            let low = word.get(1).copied().map_or(0, u32::from);
            sum += high | low;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Fills a buffer front to back; every frame above is written whole, which [`Writer::done`] checks.
struct Writer<'a> {
    buffer: &'a mut [u8],
    at: usize,
}

impl<'a> Writer<'a> {
    fn new(buffer: &'a mut [u8]) -> Self {
        Self { buffer, at: 0 }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buffer[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    fn done(self) {
        debug_assert_eq!(self.at, self.buffer.len(), "a frame was not written whole");
    }
}

/// The frames of one round announcing `ip` from `mac`.
pub(crate) fn round(mac: Mac, ip: IpAddr) -> Vec<Vec<u8>> {
    match ip {
        IpAddr::V4(ip) => [ArpOperation::Request, ArpOperation::Reply]
            .into_iter()
            .map(|operation| gratuitous_arp(operation, mac, ip).to_vec())
            .collect(),
        IpAddr::V6(ip) => vec![unsolicited_neighbour_advertisement(mac, ip).to_vec()],
    }
}

/// What the announcement of an address is called, in messages.
fn announcement_of(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "gratuitous ARP",
        IpAddr::V6(_) => "unsolicited neighbour advertisement",
    }
}

/// How a round ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Every frame of the round was sent.
    Announced,
    /// The interface has no Ethernet address (loopback, a tunnel, WireGuard): its neighbours do not
    /// resolve IPs to link-layer addresses, so there is nothing to announce.
    NoLinkLayer,
}

/// A round that was not sent, and why: `gratuitous ARP for 10.89.0.65 on eth0 not sent: Operation
/// not permitted (CAP_NET_RAW is needed)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotSent {
    ip: IpAddr,
    interface: String,
    cause: String,
}

impl NotSent {
    /// The round for `ip` on `interface` failed with `error`.
    pub(crate) fn new(ip: IpAddr, interface: &str, error: &io::Error) -> Self {
        Self::because(ip, interface, describe(error))
    }

    fn because(ip: IpAddr, interface: &str, cause: String) -> Self {
        Self {
            ip,
            interface: interface.to_owned(),
            cause,
        }
    }

    /// The message for a warning: what was not sent, why, and what follows from it.
    pub(crate) fn warning(&self) -> String {
        format!("{self}; neighbours keep the previous holder's MAC until their caches expire")
    }
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} for {} on {} not sent: {}",
            announcement_of(self.ip),
            self.ip,
            self.interface,
            self.cause
        )
    }
}

impl std::error::Error for NotSent {}

/// What went wrong, in words ([`os_error::describe`]); sending needs CAP_NET_RAW.
fn describe(error: &io::Error) -> String {
    os_error::describe(error, "CAP_NET_RAW")
}

/// Sends a round: what [`announce`] is, and what tests put in its place.
pub(crate) type Announce = fn(&str, IpAddr) -> Result<Sent, NotSent>;

/// Sends one round announcing `ip` on `interface` (which should have `ip` already): looks the
/// interface up, opens an `AF_PACKET` socket on it (`CAP_NET_RAW`), sends the frames, closes it.
pub(crate) fn announce(interface: &str, ip: IpAddr) -> Result<Sent, NotSent> {
    let fail = |error: io::Error| NotSent::new(ip, interface, &error);
    let Some(link) = pnet_datalink::interfaces()
        .into_iter()
        .find(|link| link.name == interface)
    else {
        return Err(NotSent::because(
            ip,
            interface,
            format!("no interface named {interface}"),
        ));
    };
    let Some(mac) = link
        .mac
        .map(|mac| mac.octets())
        .filter(|mac| *mac != [0; 6])
    else {
        return Ok(Sent::NoLinkLayer);
    };
    let config = pnet_datalink::Config {
        write_timeout: Some(SEND_TIMEOUT),
        // Only sent on: the interface's mode stays as it is, and the (unread) receive side small.
        promiscuous: false,
        read_buffer_size: 64,
        ..Default::default()
    };
    let mut sender = match pnet_datalink::channel(&link, config).map_err(fail)? {
        pnet_datalink::Channel::Ethernet(sender, _) => sender,
        _ => {
            return Err(NotSent::because(
                ip,
                interface,
                "not an Ethernet channel".to_owned(),
            ));
        }
    };
    for frame in round(mac, ip) {
        match sender.send_to(&frame, None) {
            Some(Ok(())) => {}
            Some(Err(error)) => return Err(fail(error)),
            None => {
                return Err(NotSent::because(
                    ip,
                    interface,
                    "the frame did not fit the send buffer".to_owned(),
                ));
            }
        }
    }
    Ok(Sent::Announced)
}

/// The rounds after the first, [`INTERVAL`] apart, with `announce`: spawn it after a first round was
/// sent, and abort it when `ip` leaves the interface (a later round would point the neighbours back
/// at this host). A round not sent is logged at debug level: the first one's outcome was reported.
pub(crate) async fn repeat(announce: Announce, interface: String, ip: IpAddr) {
    for round in 2..=ROUNDS {
        tokio::time::sleep(INTERVAL).await;
        match announce(&interface, ip) {
            Ok(_) => tracing::debug!(%ip, %interface, round, "VIP announced again"),
            Err(err) => {
                tracing::debug!(%ip, %interface, round, error = %err, "VIP not announced again")
            }
        }
    }
}

/// Frames heard on an interface, for tests that check what was announced.
#[cfg(test)]
pub(crate) mod capture {
    use std::{
        net::IpAddr,
        sync::{
            Arc, Mutex,
            atomic::{AtomicBool, Ordering},
        },
        time::{Duration, Instant},
    };

    use super::Mac;

    pub(crate) use crate::heard::{Heard, parse};

    /// Listens on an interface (an `AF_PACKET` socket, `CAP_NET_RAW`) from its creation until it is
    /// dropped, keeping every ARP frame and neighbour advertisement heard from one MAC address, with
    /// when it was heard.
    pub(crate) struct Capture {
        heard: Arc<Mutex<Vec<(Instant, Heard)>>>,
        stop: Arc<AtomicBool>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Capture {
        pub(crate) fn on(interface: &str, from: Mac) -> Self {
            let link = pnet_datalink::interfaces()
                .into_iter()
                .find(|link| link.name == interface)
                .unwrap_or_else(|| panic!("no interface {interface} to capture on"));
            let config = pnet_datalink::Config {
                read_timeout: Some(Duration::from_millis(50)),
                promiscuous: false,
                ..Default::default()
            };
            let mut receiver = match pnet_datalink::channel(&link, config) {
                Ok(pnet_datalink::Channel::Ethernet(_, receiver)) => receiver,
                Ok(_) => panic!("not an Ethernet channel"),
                Err(err) => panic!(
                    "cannot capture on {interface} (this test needs root: CAP_NET_RAW): {err}"
                ),
            };
            let heard = Arc::new(Mutex::new(Vec::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let thread = {
                let (heard, stop) = (heard.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(frame) = receiver.next()
                            && frame.get(6..12) == Some(&from[..])
                            && let Some(parsed) = parse(frame)
                        {
                            heard.lock().unwrap().push((Instant::now(), parsed));
                        }
                    }
                })
            };
            Self {
                heard,
                stop,
                thread: Some(thread),
            }
        }

        /// What was heard about `ip` so far.
        pub(crate) fn about(&self, ip: IpAddr) -> Vec<(Instant, Heard)> {
            let heard = self.heard.lock().unwrap();
            heard
                .iter()
                .filter(|(_, h)| h.ip() == ip)
                .cloned()
                .collect()
        }

        /// Waits (up to `timeout`) until `count` announcements of `ip` were heard, and returns them.
        pub(crate) fn wait_for(&self, ip: IpAddr, count: usize, timeout: Duration) -> Vec<Heard> {
            let deadline = Instant::now() + timeout;
            loop {
                let heard = self.about(ip);
                if heard.len() >= count || Instant::now() > deadline {
                    return heard.into_iter().map(|(_, h)| h).collect();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    impl Drop for Capture {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        capture::{Heard, parse},
        *,
    };

    const MAC: Mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

    /// Field by field, as on the wire (RFC 826; what `arping -U` sends).
    #[test]
    fn a_gratuitous_arp_request() {
        let frame = gratuitous_arp(ArpOperation::Request, MAC, "198.51.100.65".parse().unwrap());
        #[rustfmt::skip]
        let expected: [u8; 42] = [
            // Ethernet: destination broadcast, source the interface's MAC, type ARP.
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
            0x08, 0x06,
            // Hardware type Ethernet (1), protocol IPv4 (0x0800), lengths 6 and 4, operation request (1).
            0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01,
            // Sender MAC and IP.
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
            198, 51, 100, 65,
            // Target MAC (broadcast) and IP (the same address).
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            198, 51, 100, 65,
        ];
        assert_eq!(frame, expected);
    }

    /// As `arping -A` sends it: the target MAC is the sender's, which Linux needs to take a reply for
    /// gratuitous.
    #[test]
    fn a_gratuitous_arp_reply() {
        let frame = gratuitous_arp(ArpOperation::Reply, MAC, "198.51.100.65".parse().unwrap());
        #[rustfmt::skip]
        let expected: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
            0x08, 0x06,
            // ... operation reply (2).
            0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02,
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
            198, 51, 100, 65,
            // Target MAC: the sender's.
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
            198, 51, 100, 65,
        ];
        assert_eq!(frame, expected);
    }

    /// Field by field (RFC 8200, RFC 4861 §4.4 and §4.6.1). The checksum was computed apart from this
    /// code (the ones' complement sum over the pseudo-header and the message, in Python), and tcpdump
    /// (`-vv`) decodes this frame as `[icmp6 sum ok] ICMP6, neighbor advertisement, ... tgt is
    /// 2001:db8::65, Flags [override]` with the destination link-address option 52:54:00:12:34:56.
    #[test]
    fn an_unsolicited_neighbour_advertisement() {
        let frame = unsolicited_neighbour_advertisement(MAC, "2001:db8::65".parse().unwrap());
        #[rustfmt::skip]
        let expected: [u8; 86] = [
            // Ethernet: destination the all-nodes group's MAC, source the interface's MAC, type IPv6.
            0x33, 0x33, 0x00, 0x00, 0x00, 0x01,
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
            0x86, 0xdd,
            // IPv6: version 6, traffic class and flow label 0; payload length 32; next header ICMPv6
            // (58); hop limit 255.
            0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 58, 255,
            // Source: the address announced.
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x65,
            // Destination: all nodes, ff02::1.
            0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x01,
            // ICMPv6: type 136 (neighbour advertisement), code 0, checksum.
            136, 0, 0x73, 0xa7,
            // Flags: override only (not router, not solicited); reserved.
            0x20, 0x00, 0x00, 0x00,
            // Target: the address announced.
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x65,
            // Option: target link-layer address (2), length 1 (8 bytes), the MAC.
            0x02, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
        ];
        assert_eq!(frame, expected);
    }

    #[test]
    fn the_checksum_sums_to_all_ones_with_the_pseudo_header() {
        for (ip, mac) in [
            ("2001:db8::65", MAC),
            ("fd00:240::ffff", [0xff; 6]),
            ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", [0; 6]),
        ] {
            let ip: Ipv6Addr = ip.parse().unwrap();
            let frame = unsolicited_neighbour_advertisement(mac, ip);
            // With the checksum in place, the checksum of the message is 0 (its sum all ones).
            assert_eq!(
                icmpv6_checksum(ip, "ff02::1".parse().unwrap(), &frame[54..]),
                0,
                "{ip}"
            );
        }
        // An odd length is padded with a zero byte: from and to `::`, the sum is the length, the next
        // header (58) and the one word 0x0100.
        let unspecified = Ipv6Addr::UNSPECIFIED;
        assert_eq!(icmpv6_checksum(unspecified, unspecified, &[0x01]), !0x013b);
        assert_eq!(
            icmpv6_checksum(unspecified, unspecified, &[0x01, 0x00]),
            !0x013c
        );
    }

    #[test]
    fn a_round_is_a_request_and_a_reply_or_one_advertisement() {
        let round4 = round(MAC, "198.51.100.65".parse().unwrap());
        let parsed: Vec<Heard> = round4.iter().map(|f| parse(f).unwrap()).collect();
        let v4: Ipv4Addr = "198.51.100.65".parse().unwrap();
        assert_eq!(
            parsed,
            [
                Heard::Arp {
                    operation: 1,
                    ethernet_source: MAC,
                    ethernet_destination: BROADCAST,
                    sender_mac: MAC,
                    sender_ip: v4,
                    target_mac: BROADCAST,
                    target_ip: v4,
                },
                Heard::Arp {
                    operation: 2,
                    ethernet_source: MAC,
                    ethernet_destination: BROADCAST,
                    sender_mac: MAC,
                    sender_ip: v4,
                    target_mac: MAC,
                    target_ip: v4,
                },
            ]
        );
        let v6: Ipv6Addr = "2001:db8::65".parse().unwrap();
        let round6 = round(MAC, IpAddr::V6(v6));
        assert_eq!(round6.len(), 1);
        assert_eq!(
            parse(&round6[0]).unwrap(),
            Heard::NeighbourAdvertisement {
                ethernet_source: MAC,
                ethernet_destination: [0x33, 0x33, 0, 0, 0, 1],
                source: v6,
                destination: "ff02::1".parse().unwrap(),
                hop_limit: 255,
                router: false,
                solicited: false,
                override_: true,
                target: v6,
                target_link_layer_address: Some(MAC),
            }
        );
    }

    #[test]
    fn a_round_not_sent_says_what_is_missing_and_what_follows() {
        let eperm = io::Error::from_raw_os_error(1);
        let not_sent = NotSent::new("10.89.0.65".parse().unwrap(), "eth0", &eperm);
        assert_eq!(
            not_sent.to_string(),
            "gratuitous ARP for 10.89.0.65 on eth0 not sent: Operation not permitted (CAP_NET_RAW is needed)"
        );
        assert_eq!(
            not_sent.warning(),
            "gratuitous ARP for 10.89.0.65 on eth0 not sent: Operation not permitted (CAP_NET_RAW is needed); neighbours keep the previous holder's MAC until their caches expire"
        );
        let enetdown = io::Error::from_raw_os_error(100);
        assert_eq!(
            NotSent::new("2001:db8::65".parse().unwrap(), "bond0", &enetdown).to_string(),
            "unsolicited neighbour advertisement for 2001:db8::65 on bond0 not sent: Network is down (errno 100)"
        );
        assert_eq!(
            describe(&io::Error::other("no errno")),
            "no errno",
            "an error without an errno is kept as it is"
        );
    }

    #[test]
    fn an_unknown_interface_is_named() {
        let missing = format!("ccmt{}none", std::process::id() % 10_000);
        let err = announce(&missing, "198.51.100.65".parse().unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "gratuitous ARP for 198.51.100.65 on {missing} not sent: no interface named {missing}"
            )
        );
    }

    /// Loopback has no Ethernet address: nothing is sent, and that is no failure.
    #[test]
    fn nothing_is_announced_on_loopback() {
        assert_eq!(
            announce("lo", "198.51.100.65".parse().unwrap()),
            Ok(Sent::NoLinkLayer)
        );
    }
}
