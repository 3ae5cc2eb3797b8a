//! Frames heard on a link that say who holds an address: ARP requests and replies, and IPv6
//! neighbour advertisements, parsed from whole Ethernet frames. Pure functions; the sockets that hear
//! them are [`crate::conflict`]'s (and, in tests, `announce::capture`'s).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::announce::Mac;

/// An announcement heard, as parsed from its frame.
// Every field is what a test checks of an announcement; the data plane reads who claims an address.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heard {
    Arp {
        operation: u16,
        ethernet_source: Mac,
        ethernet_destination: Mac,
        sender_mac: Mac,
        sender_ip: Ipv4Addr,
        target_mac: Mac,
        target_ip: Ipv4Addr,
    },
    NeighbourAdvertisement {
        ethernet_source: Mac,
        ethernet_destination: Mac,
        source: Ipv6Addr,
        destination: Ipv6Addr,
        hop_limit: u8,
        router: bool,
        solicited: bool,
        override_: bool,
        target: Ipv6Addr,
        target_link_layer_address: Option<Mac>,
    },
}

impl Heard {
    /// The address announced.
    #[cfg(test)]
    pub(crate) fn ip(&self) -> std::net::IpAddr {
        match self {
            Heard::Arp { sender_ip, .. } => std::net::IpAddr::V4(*sender_ip),
            Heard::NeighbourAdvertisement { target, .. } => std::net::IpAddr::V6(*target),
        }
    }
}

fn mac(bytes: &[u8]) -> Mac {
    bytes.try_into().unwrap()
}

fn v4(bytes: &[u8]) -> Ipv4Addr {
    <[u8; 4]>::try_from(bytes).unwrap().into()
}

fn v6(bytes: &[u8]) -> Ipv6Addr {
    <[u8; 16]>::try_from(bytes).unwrap().into()
}

/// Reads an ARP frame for IPv4 over Ethernet, or an IPv6 frame carrying a neighbour
/// advertisement without extension headers; anything else is `None`.
pub(crate) fn parse(frame: &[u8]) -> Option<Heard> {
    let ethernet_destination = mac(frame.get(0..6)?);
    let ethernet_source = mac(frame.get(6..12)?);
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        0x0806 => {
            let arp = frame.get(14..42)?;
            (arp[0..6] == [0, 1, 8, 0, 6, 4]).then(|| Heard::Arp {
                operation: u16::from_be_bytes([arp[6], arp[7]]),
                ethernet_source,
                ethernet_destination,
                sender_mac: mac(&arp[8..14]),
                sender_ip: v4(&arp[14..18]),
                target_mac: mac(&arp[18..24]),
                target_ip: v4(&arp[24..28]),
            })
        }
        0x86dd => {
            let ip = frame.get(14..54)?;
            let icmp = frame.get(54..)?;
            if ip[6] != 58 || icmp.len() < 24 || icmp[0] != 136 {
                return None;
            }
            // Options: (type, length in 8-byte units, data).
            let mut options = &icmp[24..];
            let mut target_link_layer_address = None;
            while options.len() >= 8 && options[1] > 0 {
                let length = usize::from(options[1]) * 8;
                if options[0] == 2 {
                    target_link_layer_address = Some(mac(&options[2..8]));
                }
                options = options.get(length..)?;
            }
            Some(Heard::NeighbourAdvertisement {
                ethernet_source,
                ethernet_destination,
                source: v6(&ip[8..24]),
                destination: v6(&ip[24..40]),
                hop_limit: ip[7],
                router: icmp[4] & 0x80 != 0,
                solicited: icmp[4] & 0x40 != 0,
                override_: icmp[4] & 0x20 != 0,
                target: v6(&icmp[8..24]),
                target_link_layer_address,
            })
        }
        _ => None,
    }
}
