//! The old host's batch ([`quiet_neighbour_answers_batch`]): the `arp` and `ip6` tables that stop
//! it answering neighbour solicitations for the VIPs it gives away, and make it ask its own
//! questions from an address that is not a VIP.

use std::net::{IpAddr, Ipv6Addr};

use super::{
    Batch, Family, NftError,
    encode::{Builder, Hook, check_name},
    expr::Expr,
    uapi::*,
};

/// The chain of the tables that quiet neighbour answers.
const INPUT_CHAIN: &str = "input";
/// The chain of the `arp` table that rewrites this host's own ARP requests.
const OUTPUT_CHAIN: &str = "output";
/// The priority of the quieting chains (`filter`).
const INPUT_PRIORITY: i32 = 0;

/// The batch that makes this host, which gives `vips` away but keeps them on its interfaces, stop
/// answering neighbour solicitations for them: replaces the `arp` table `table` with one dropping
/// the ARP requests for its IPv4 VIPs, and the `ip6` table `table` with one dropping the neighbour
/// solicitations for its IPv6 VIPs; a family without VIPs only has its table removed (so `&[]`
/// removes both). This host's own questions for a neighbour's address go out from 0.0.0.0 instead of
/// an IPv4 VIP, and from `link_local` (this host's link-local address on the VIPs' interface) instead
/// of an IPv6 VIP, when it is given: asked from a VIP, the neighbour would take this host for the
/// VIP's holder again.
pub(crate) fn quiet_neighbour_answers_batch(
    table: &str,
    vips: &[IpAddr],
    link_local: Option<Ipv6Addr>,
) -> Result<Batch, NftError> {
    check_name("table", table, NFT_NAME_MAX)?;
    let mut batch = Builder::new();
    for family in [Family::Arp, Family::Ipv6] {
        let mine: Vec<IpAddr> = vips
            .iter()
            .copied()
            .filter(|vip| match family {
                Family::Arp => vip.is_ipv4(),
                _ => vip.is_ipv6(),
            })
            .collect();
        batch.replace_table(family, table, !mine.is_empty());
        if mine.is_empty() {
            continue;
        }
        drop_answers(&mut batch, family, table, &mine);
        ask_anonymously(&mut batch, family, table, &mine, link_local);
    }
    batch.finish()
}

/// The input chain of `family`'s `table`: a rule per VIP of `mine` dropping the ARP requests (IPv4) or
/// neighbour solicitations (IPv6) for it.
fn drop_answers(batch: &mut Builder, family: Family, table: &str, mine: &[IpAddr]) {
    let number = match family {
        Family::Arp => NF_ARP_IN,
        _ => NF_INET_LOCAL_IN,
    };
    batch.chain(
        family,
        table,
        INPUT_CHAIN,
        Hook {
            name: "input",
            number,
            priority: INPUT_PRIORITY,
            device: None,
        },
    );
    for (n, vip) in mine.iter().enumerate() {
        let (what, expressions) = match vip {
            IpAddr::V4(vip) => ("ARP requests", arp_requests_for(&vip.octets())),
            IpAddr::V6(vip) => (
                "neighbour solicitations",
                neighbour_solicitations_for(&vip.octets()),
            ),
        };
        batch.rule(
            family,
            table,
            INPUT_CHAIN,
            format!(
                "adding rule {} to chain {INPUT_CHAIN} of table {family} {table} (drop {what} for {vip})",
                n + 1
            ),
            &expressions,
        );
    }
}

/// The output chain of `family`'s `table`: this host's own neighbour questions asked from a VIP of
/// `mine` go out from 0.0.0.0 (ARP) or from `link_local` (IPv6; none without it). This host still
/// talks from the VIPs (the open connections): when it asks for a client's MAC address from one, the
/// client would take the question's sender as the VIP's holder and turn back here. Asked from 0.0.0.0
/// (an ARP probe) or from the link-local address (the ICMPv6 checksum follows the new source), the
/// client answers all the same and learns nothing (what `arp_announce` 2 does for a host's other
/// addresses).
fn ask_anonymously(
    batch: &mut Builder,
    family: Family,
    table: &str,
    mine: &[IpAddr],
    link_local: Option<Ipv6Addr>,
) {
    let (hook, rewrite): (u32, Option<(String, Vec<u8>)>) = match family {
        Family::Arp => (NF_ARP_OUT, Some(("0.0.0.0".to_owned(), vec![0; 4]))),
        _ => (
            NF_INET_LOCAL_OUT,
            link_local.map(|ll| (ll.to_string(), ll.octets().to_vec())),
        ),
    };
    let Some((source, source_bytes)) = rewrite else {
        return;
    };
    batch.chain(
        family,
        table,
        OUTPUT_CHAIN,
        Hook {
            name: "output",
            number: hook,
            priority: INPUT_PRIORITY,
            device: None,
        },
    );
    for (n, vip) in mine.iter().enumerate() {
        let expressions = match vip {
            IpAddr::V4(vip) => arp_requests_from_anonymous(&vip.octets()),
            IpAddr::V6(vip) => solicitations_from_link_local(&vip.octets(), &source_bytes),
        };
        batch.rule(
            family,
            table,
            OUTPUT_CHAIN,
            format!(
                "adding rule {} to chain {OUTPUT_CHAIN} of table {family} {table} (ask from {source} instead of {vip})",
                n + 1
            ),
            &expressions,
        );
    }
}

/// `payload load LEN @ BASE + OFFSET => reg 1; cmp eq reg 1 DATA` (LEN: DATA's).
fn payload_is(base: u32, offset: u32, data: &[u8]) -> [Expr; 2] {
    [
        Expr::Load {
            base,
            offset,
            len: u32::try_from(data.len()).unwrap_or(u32::MAX),
            dreg: NFT_REG_1,
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: data.to_vec(),
        },
    ]
}

/// `immediate reg 1 DATA; payload write reg 1 => LEN @ BASE + OFFSET` with `csum_flags`.
fn payload_set(base: u32, offset: u32, data: &[u8], csum_flags: u32) -> [Expr; 2] {
    [
        Expr::Immediate {
            dreg: NFT_REG_1,
            data: data.to_vec(),
        },
        Expr::Write {
            base,
            offset,
            len: u32::try_from(data.len()).unwrap_or(u32::MAX),
            sreg: NFT_REG_1,
            csum_flags,
        },
    ]
}

/// `arp operation request arp daddr ip VIP drop` (the operation at 6, the target IP at 24).
fn arp_requests_for(vip: &[u8]) -> Vec<Expr> {
    let mut rule = Vec::from(payload_is(
        NFT_PAYLOAD_NETWORK_HEADER,
        6,
        &ARPOP_REQUEST.to_be_bytes(),
    ));
    rule.extend(payload_is(NFT_PAYLOAD_NETWORK_HEADER, 24, vip));
    rule.push(Expr::Verdict(NF_DROP));
    rule
}

/// `arp operation request arp saddr ip VIP arp saddr ip set 0.0.0.0` (the sender IP at 14).
fn arp_requests_from_anonymous(vip: &[u8]) -> Vec<Expr> {
    let mut rule = Vec::from(payload_is(
        NFT_PAYLOAD_NETWORK_HEADER,
        6,
        &ARPOP_REQUEST.to_be_bytes(),
    ));
    rule.extend(payload_is(NFT_PAYLOAD_NETWORK_HEADER, 14, vip));
    rule.extend(payload_set(NFT_PAYLOAD_NETWORK_HEADER, 14, &[0; 4], 0));
    rule
}

/// `icmpv6 type nd-neighbor-solicit`.
fn neighbour_solicitation() -> Vec<Expr> {
    let mut rule = vec![
        Expr::Meta {
            key: NFT_META_L4PROTO,
            dreg: NFT_REG_1,
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: vec![IPPROTO_ICMPV6],
        },
    ];
    rule.extend(payload_is(
        NFT_PAYLOAD_TRANSPORT_HEADER,
        0,
        &[ND_NEIGHBOR_SOLICIT],
    ));
    rule
}

/// `icmpv6 type nd-neighbor-solicit ip6 saddr VIP ip6 saddr set LINK_LOCAL` (the ICMPv6 checksum
/// updated for the new source).
fn solicitations_from_link_local(vip: &[u8], link_local: &[u8]) -> Vec<Expr> {
    let mut rule = neighbour_solicitation();
    rule.extend(payload_is(NFT_PAYLOAD_NETWORK_HEADER, 8, vip));
    rule.extend(payload_set(
        NFT_PAYLOAD_NETWORK_HEADER,
        8,
        link_local,
        NFT_PAYLOAD_L4CSUM_PSEUDOHDR,
    ));
    rule
}

/// `icmpv6 type nd-neighbor-solicit icmpv6 target VIP drop` (the target at 8 in the message).
fn neighbour_solicitations_for(vip: &[u8]) -> Vec<Expr> {
    let mut rule = neighbour_solicitation();
    rule.extend(payload_is(NFT_PAYLOAD_TRANSPORT_HEADER, 8, vip));
    rule.push(Expr::Verdict(NF_DROP));
    rule
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::{
        decode::attributes,
        tests::{VIP4, VIP6, be32, find, kinds, read, rules},
    };
    use super::*;

    #[test]
    fn quieting_makes_one_table_per_family_that_has_vips() {
        let vip4b = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 101));
        let cases: [(&[IpAddr], &[&str]); 3] = [
            (
                &[VIP4, VIP6, vip4b],
                &[
                    "BEGIN",
                    "NEWTABLE arp",
                    "DELTABLE arp",
                    "NEWTABLE arp",
                    "NEWCHAIN arp",
                    "NEWRULE arp",
                    "NEWRULE arp",
                    "NEWCHAIN arp",
                    "NEWRULE arp",
                    "NEWRULE arp",
                    "NEWTABLE ip6",
                    "DELTABLE ip6",
                    "NEWTABLE ip6",
                    "NEWCHAIN ip6",
                    "NEWRULE ip6",
                    "END",
                ],
            ),
            (
                &[VIP4],
                &[
                    "BEGIN",
                    "NEWTABLE arp",
                    "DELTABLE arp",
                    "NEWTABLE arp",
                    "NEWCHAIN arp",
                    "NEWRULE arp",
                    "NEWCHAIN arp",
                    "NEWRULE arp",
                    "NEWTABLE ip6",
                    "DELTABLE ip6",
                    "END",
                ],
            ),
            (
                &[VIP6],
                &[
                    "BEGIN",
                    "NEWTABLE arp",
                    "DELTABLE arp",
                    "NEWTABLE ip6",
                    "DELTABLE ip6",
                    "NEWTABLE ip6",
                    "NEWCHAIN ip6",
                    "NEWRULE ip6",
                    "END",
                ],
            ),
        ];
        for (vips, expected) in cases {
            let batch = quiet_neighbour_answers_batch("ccm_ho_quiet", vips, None).unwrap();
            assert_eq!(kinds(&batch), expected, "{vips:?}");
        }
    }

    #[test]
    fn the_quieting_rules_are_nfts() {
        let link_local = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);
        let batch = quiet_neighbour_answers_batch("q", &[VIP4, VIP6], Some(link_local)).unwrap();
        let rules = rules(&batch);
        assert_eq!(
            rules[0],
            [
                "payload load 2b @ network header + 6 => reg 1",
                "cmp eq reg 1 0x0001",
                "payload load 4b @ network header + 24 => reg 1",
                "cmp eq reg 1 0x0a4d0064",
                "immediate reg 0 drop",
            ]
        );
        assert_eq!(
            rules[1],
            [
                "payload load 2b @ network header + 6 => reg 1",
                "cmp eq reg 1 0x0001",
                "payload load 4b @ network header + 14 => reg 1",
                "cmp eq reg 1 0x0a4d0064",
                "immediate reg 1 0x00000000",
                "payload write reg 1 => 4b @ network header + 14",
            ]
        );
        assert_eq!(
            rules[2],
            [
                "meta load l4proto => reg 1",
                "cmp eq reg 1 0x3a",
                "payload load 1b @ transport header + 0 => reg 1",
                "cmp eq reg 1 0x87",
                "payload load 16b @ transport header + 8 => reg 1",
                "cmp eq reg 1 0xfd000000000000000000000000000100",
                "immediate reg 0 drop",
            ]
        );
        assert_eq!(
            rules[3],
            [
                "meta load l4proto => reg 1",
                "cmp eq reg 1 0x3a",
                "payload load 1b @ transport header + 0 => reg 1",
                "cmp eq reg 1 0x87",
                "payload load 16b @ network header + 8 => reg 1",
                "cmp eq reg 1 0xfd000000000000000000000000000100",
                "immediate reg 1 0xfe800000000000000000000000000002",
                "payload write reg 1 => 16b @ network header + 8 csum_flags 0x1",
            ]
        );
        let read = read(&batch);
        let chains: Vec<(String, u32, i32, bool)> = read
            .iter()
            .filter(|m| m.kind.starts_with("NEWCHAIN"))
            .map(|m| {
                let hook = attributes(m.attr(NFTA_CHAIN_HOOK)).unwrap();
                (
                    m.kind.clone(),
                    be32(find(&hook, NFTA_HOOK_HOOKNUM)),
                    be32(find(&hook, NFTA_HOOK_PRIORITY)) as i32,
                    hook.iter().any(|(k, _)| *k == NFTA_HOOK_DEV),
                )
            })
            .collect();
        assert_eq!(
            chains,
            [
                ("NEWCHAIN arp".to_owned(), NF_ARP_IN, 0, false),
                ("NEWCHAIN arp".to_owned(), NF_ARP_OUT, 0, false),
                ("NEWCHAIN ip6".to_owned(), NF_INET_LOCAL_IN, 0, false),
                ("NEWCHAIN ip6".to_owned(), NF_INET_LOCAL_OUT, 0, false),
            ]
        );
    }
}
