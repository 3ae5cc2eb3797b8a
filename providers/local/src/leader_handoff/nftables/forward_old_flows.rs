//! The new host's batch ([`forward_old_flows_batch`]): the `netdev` table that sends the TCP
//! packets of the connections opened on each VIP's old holder back to it, with its rules and its
//! sets of flows.

use std::{net::IpAddr, time::Duration};

use super::{
    Batch, Family, Link, Mac, NftError,
    encode::{Builder, Hook, check_name},
    expr::Expr,
    mac_text,
    uapi::*,
};

/// The chain of the forwarding table.
const INGRESS_CHAIN: &str = "ingress";
/// The priority of the forwarding chain: before any other ingress chain of the usual priorities.
const INGRESS_PRIORITY: i32 = -500;

/// The batch that makes this host, which takes `old_holders`' VIPs over on `link`, keep sending the
/// TCP packets of the connections opened on each VIP's old holder to that holder's MAC (see the
/// module's documentation): replaces the `netdev` table `table` with one whose chain `ingress` has
/// three rules per VIP, in the order of `old_holders`, and one set of flows per IP family of them
/// (`seen4`, `seen6`; of at most `max_flows` flows each, a flow forgotten `flow_timeout` after its
/// last packet). No VIPs: only removes the table.
///
/// A connection that begins here while the set is full is not remembered and goes to the old
/// holder (which still has the VIP and takes it).
pub(crate) fn forward_old_flows_batch(
    table: &str,
    link: &Link,
    old_holders: &[(IpAddr, Mac)],
    flow_timeout: Duration,
    max_flows: u32,
) -> Result<Batch, NftError> {
    check_name("table", table, NFT_NAME_MAX)?;
    check_name("interface", &link.name, IFNAME_MAX)?;
    let timeout_ms = flow_timeout_ms(flow_timeout, max_flows)?;
    let mut batch = Builder::new();
    batch.replace_table(Family::Netdev, table, !old_holders.is_empty());
    if old_holders.is_empty() {
        return batch.finish();
    }
    for (ip, ipv4) in [(&IPV4, true), (&IPV6, false)] {
        if old_holders.iter().any(|(vip, _)| vip.is_ipv4() == ipv4) {
            batch.flow_set(table, ip, timeout_ms, max_flows);
        }
    }
    batch.chain(
        Family::Netdev,
        table,
        INGRESS_CHAIN,
        Hook {
            name: "ingress",
            number: NF_NETDEV_INGRESS,
            priority: INGRESS_PRIORITY,
            device: Some(&link.name),
        },
    );
    for (n, (vip, old_mac)) in old_holders.iter().enumerate() {
        forward_vip(&mut batch, table, link, 3 * n, *vip, *old_mac);
    }
    batch.finish()
}

/// The flows' timeout in milliseconds (1 or more), once `max_flows` is checked to leave room for one.
fn flow_timeout_ms(flow_timeout: Duration, max_flows: u32) -> Result<u64, NftError> {
    let timeout_ms = u64::try_from(flow_timeout.as_millis())
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            NftError::Invalid(format!(
                "a flow timeout of {flow_timeout:?} (it must be 1 ms or more, in milliseconds)"
            ))
        })?;
    if max_flows == 0 {
        return Err(NftError::Invalid(
            "room for no flow (max_flows is 0)".to_owned(),
        ));
    }
    Ok(timeout_ms)
}

/// The three rules of `vip` (numbered after the `before` rules of the chain): TCP that begins here is
/// accepted and its flow remembered, TCP of a flow that began here is accepted, and the rest goes to
/// the old holder's MAC out of `link`.
fn forward_vip(
    batch: &mut Builder,
    table: &str,
    link: &Link,
    before: usize,
    vip: IpAddr,
    old_mac: Mac,
) {
    let rule = |n: usize, what: String| {
        format!(
            "adding rule {} to chain {INGRESS_CHAIN} of table {} {table} ({what})",
            before + n,
            Family::Netdev
        )
    };
    let (ip, address) = ip_of(vip);
    batch.rule(
        Family::Netdev,
        table,
        INGRESS_CHAIN,
        rule(
            1,
            format!("accept TCP to {vip} that begins here, and remember its flow"),
        ),
        &begins_here(ip, &address),
    );
    batch.rule(
        Family::Netdev,
        table,
        INGRESS_CHAIN,
        rule(2, format!("accept TCP to {vip} of a flow that began here")),
        &began_here(ip, &address),
    );
    batch.rule(
        Family::Netdev,
        table,
        INGRESS_CHAIN,
        rule(
            3,
            format!(
                "send other TCP to {vip} to the old holder {} out of {}",
                mac_text(&old_mac),
                link.name
            ),
        ),
        &to_old_holder(ip, &address, link, old_mac),
    );
}

/// Where an IP family's fields are, and its set of flows.
#[derive(Debug)]
struct IpLayout {
    /// `skb->protocol`, as it is in the packet.
    ethertype: [u8; 2],
    /// The offsets of the source and destination addresses in the network header.
    source: u32,
    destination: u32,
    /// The length of an address.
    address_len: u32,
    /// The set of flows that began here, and its ID in the batch.
    set: &'static str,
    set_id: u32,
    /// `nft`'s type of the set's key (only for listings): the concatenation's types, 6 bits each
    /// (`ipv4_addr` 7, `ipv6_addr` 8, `inet_service` 13; `TYPE_BITS` in nftables' datatype.h).
    key_type: u32,
}

const IPV4: IpLayout = IpLayout {
    ethertype: ETH_P_IP.to_be_bytes(),
    source: 12,
    destination: 16,
    address_len: 4,
    set: "seen4",
    set_id: 1,
    key_type: (((7 << 6 | 13) << 6 | 7) << 6) | 13,
};

const IPV6: IpLayout = IpLayout {
    ethertype: ETH_P_IPV6.to_be_bytes(),
    source: 8,
    destination: 24,
    address_len: 16,
    set: "seen6",
    set_id: 2,
    key_type: (((8 << 6 | 13) << 6 | 8) << 6) | 13,
};

fn ip_of(vip: IpAddr) -> (&'static IpLayout, Vec<u8>) {
    match vip {
        IpAddr::V4(vip) => (&IPV4, vip.octets().to_vec()),
        IpAddr::V6(vip) => (&IPV6, vip.octets().to_vec()),
    }
}

/// The fields of a flow's key, in order: base, offset, length.
fn flow_fields(ip: &IpLayout) -> [(u32, u32, u32); 4] {
    [
        (NFT_PAYLOAD_NETWORK_HEADER, ip.source, ip.address_len),
        (NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2),
        (NFT_PAYLOAD_NETWORK_HEADER, ip.destination, ip.address_len),
        (NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2),
    ]
}

/// The length of a flow's key: each field takes whole 32-bit registers.
fn flow_key_len(ip: &IpLayout) -> u32 {
    flow_fields(ip)
        .iter()
        .map(|(_, _, len)| len.div_ceil(4) * 4)
        .sum()
}

/// The register of the 32-bit word `word` of the data registers, as `nft` numbers it: the 16-byte
/// register where one begins, the 32-bit register elsewhere.
fn register_at(word: u32) -> u32 {
    if word.is_multiple_of(4) {
        NFT_REG_1 + word / 4
    } else {
        NFT_REG32_00 + word
    }
}

/// `ip daddr VIP meta l4proto tcp` (`meta protocol ip` first, as `nft` puts it in a `netdev` table).
fn tcp_to(ip: &IpLayout, vip: &[u8]) -> Vec<Expr> {
    vec![
        Expr::Meta {
            key: NFT_META_PROTOCOL,
            dreg: NFT_REG_1,
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: ip.ethertype.to_vec(),
        },
        Expr::Load {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset: ip.destination,
            len: ip.address_len,
            dreg: NFT_REG_1,
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: vip.to_vec(),
        },
        Expr::Meta {
            key: NFT_META_L4PROTO,
            dreg: NFT_REG_1,
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: vec![IPPROTO_TCP],
        },
    ]
}

/// Loads the flow's key (source address, source port, destination address, destination port) into
/// the registers from `NFT_REG_1` on.
fn flow_key(ip: &IpLayout) -> Vec<Expr> {
    let mut word = 0;
    flow_fields(ip)
        .into_iter()
        .map(|(base, offset, len)| {
            let dreg = register_at(word);
            word += len.div_ceil(4);
            Expr::Load {
                base,
                offset,
                len,
                dreg,
            }
        })
        .collect()
}

/// `... tcp flags & (syn|ack) == syn add @seen { flow } accept`.
fn begins_here(ip: &IpLayout, vip: &[u8]) -> Vec<Expr> {
    let mut rule = tcp_to(ip, vip);
    rule.extend([
        Expr::Load {
            base: NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: TCP_FLAGS_OFFSET,
            len: 1,
            dreg: NFT_REG_1,
        },
        Expr::Bitwise {
            reg: NFT_REG_1,
            mask: vec![TCP_FLAG_SYN | TCP_FLAG_ACK],
            xor: vec![0],
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: vec![TCP_FLAG_SYN],
        },
    ]);
    rule.extend(flow_key(ip));
    rule.extend([
        Expr::Dynset {
            op: NFT_DYNSET_OP_ADD,
            set: ip.set,
            set_id: ip.set_id,
        },
        Expr::Verdict(NF_ACCEPT),
    ]);
    rule
}

/// `... flow @seen update @seen { flow } accept` (the key is still in the registers after the
/// lookup).
fn began_here(ip: &IpLayout, vip: &[u8]) -> Vec<Expr> {
    let mut rule = tcp_to(ip, vip);
    rule.extend(flow_key(ip));
    rule.extend([
        Expr::Lookup {
            set: ip.set,
            set_id: ip.set_id,
        },
        Expr::Dynset {
            op: NFT_DYNSET_OP_UPDATE,
            set: ip.set,
            set_id: ip.set_id,
        },
        Expr::Verdict(NF_ACCEPT),
    ]);
    rule
}

/// `... ether saddr set OURS ether daddr set OLD fwd to LINK` (`meta iiftype ether` first, as `nft`
/// puts it before touching the Ethernet header).
fn to_old_holder(ip: &IpLayout, vip: &[u8], link: &Link, old_mac: Mac) -> Vec<Expr> {
    let mut rule = tcp_to(ip, vip);
    rule.extend([
        Expr::Meta {
            key: NFT_META_IIFTYPE,
            dreg: NFT_REG_1,
        },
        Expr::Cmp {
            sreg: NFT_REG_1,
            data: ARPHRD_ETHER.to_ne_bytes().to_vec(),
        },
        Expr::Immediate {
            dreg: NFT_REG_1,
            data: link.mac.to_vec(),
        },
        Expr::Write {
            base: NFT_PAYLOAD_LL_HEADER,
            offset: 6,
            len: 6,
            sreg: NFT_REG_1,
            csum_flags: 0,
        },
        Expr::Immediate {
            dreg: NFT_REG_1,
            data: old_mac.to_vec(),
        },
        Expr::Write {
            base: NFT_PAYLOAD_LL_HEADER,
            offset: 0,
            len: 6,
            sreg: NFT_REG_1,
            csum_flags: 0,
        },
        Expr::Immediate {
            dreg: NFT_REG_1,
            data: link.index.to_ne_bytes().to_vec(),
        },
        Expr::Fwd {
            sreg_dev: NFT_REG_1,
        },
    ]);
    rule
}

// The sets of flows are the forwarding table's alone, so the method that adds one is here.
impl Builder {
    fn flow_set(&mut self, table: &str, ip: &IpLayout, timeout_ms: u64, max_flows: u32) {
        self.nft(
            NFT_MSG_NEWSET,
            NLM_F_CREATE,
            Family::Netdev,
            format!("adding set {} to table {} {table}", ip.set, Family::Netdev),
            |attrs| {
                attrs.string(NFTA_SET_TABLE, table);
                attrs.string(NFTA_SET_NAME, ip.set);
                attrs.u32(NFTA_SET_FLAGS, NFT_SET_TIMEOUT | NFT_SET_EVAL);
                attrs.u32(NFTA_SET_KEY_TYPE, ip.key_type);
                attrs.u32(NFTA_SET_KEY_LEN, flow_key_len(ip));
                attrs.nested(NFTA_SET_DESC, |attrs| {
                    attrs.u32(NFTA_SET_DESC_SIZE, max_flows);
                });
                attrs.u32(NFTA_SET_ID, ip.set_id);
                attrs.u64(NFTA_SET_TIMEOUT, timeout_ms);
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::{
        decode::attributes,
        tests::{
            OLD, TIMEOUT, VIP4, VIP6, be32, eth0, find, hex, kinds, read, rules, string, strings,
        },
    };
    use super::*;

    /// The first six expressions of each forwarding rule of 10.77.0.100.
    const TCP_TO_VIP4: [&str; 6] = [
        "meta load protocol => reg 1",
        "cmp eq reg 1 0x0800",
        "payload load 4b @ network header + 16 => reg 1",
        "cmp eq reg 1 0x0a4d0064",
        "meta load l4proto => reg 1",
        "cmp eq reg 1 0x06",
    ];

    const FLOW4: [&str; 4] = [
        "payload load 4b @ network header + 12 => reg 1",
        "payload load 2b @ transport header + 0 => reg 9",
        "payload load 4b @ network header + 16 => reg 10",
        "payload load 2b @ transport header + 2 => reg 11",
    ];

    #[test]
    fn the_forwarding_rules_of_an_ipv4_vip_are_nfts() {
        let batch = forward_old_flows_batch("ccm_ho_fwd", &eth0(), &[(VIP4, OLD)], TIMEOUT, 65_535)
            .unwrap();
        assert_eq!(
            kinds(&batch),
            [
                "BEGIN",
                "NEWTABLE netdev",
                "DELTABLE netdev",
                "NEWTABLE netdev",
                "NEWSET netdev",
                "NEWCHAIN netdev",
                "NEWRULE netdev",
                "NEWRULE netdev",
                "NEWRULE netdev",
                "END"
            ]
        );
        let rules = rules(&batch);
        let mut begins = strings(&TCP_TO_VIP4);
        begins.extend(strings(&[
            "payload load 1b @ transport header + 13 => reg 1",
            "bitwise reg 1 = ( reg 1 & 0x12 ) ^ 0x00",
            "cmp eq reg 1 0x02",
        ]));
        begins.extend(strings(&FLOW4));
        begins.extend(strings(&[
            "dynset add reg_key 1 set seen4 id 1",
            "immediate reg 0 accept",
        ]));
        assert_eq!(rules[0], begins);
        let mut began = strings(&TCP_TO_VIP4);
        began.extend(strings(&FLOW4));
        began.extend(strings(&[
            "lookup reg 1 set seen4 id 1",
            "dynset update reg_key 1 set seen4 id 1",
            "immediate reg 0 accept",
        ]));
        assert_eq!(rules[1], began);
        let mut forward = strings(&TCP_TO_VIP4);
        forward.extend([
            "meta load iiftype => reg 1".to_owned(),
            format!("cmp eq reg 1 {}", hex(&ARPHRD_ETHER.to_ne_bytes())),
            "immediate reg 1 0x020000000001".to_owned(),
            "payload write reg 1 => 6b @ link header + 6".to_owned(),
            "immediate reg 1 0x020000000002".to_owned(),
            "payload write reg 1 => 6b @ link header + 0".to_owned(),
            format!("immediate reg 1 {}", hex(&2u32.to_ne_bytes())),
            "fwd sreg_dev 1".to_owned(),
        ]);
        assert_eq!(rules[2], forward);
    }

    #[test]
    fn the_forwarding_rules_of_an_ipv6_vip_take_ten_registers_of_key() {
        let batch = forward_old_flows_batch("ccm_ho_fwd", &eth0(), &[(VIP6, OLD)], TIMEOUT, 65_535)
            .unwrap();
        let rules = rules(&batch);
        let tcp_to_vip6 = strings(&[
            "meta load protocol => reg 1",
            "cmp eq reg 1 0x86dd",
            "payload load 16b @ network header + 24 => reg 1",
            "cmp eq reg 1 0xfd000000000000000000000000000100",
            "meta load l4proto => reg 1",
            "cmp eq reg 1 0x06",
        ]);
        // As nft: source in reg 1 (words 0-3), source port in reg 2 (word 4), destination from
        // 32-bit reg 13 (words 5-8), destination port in 32-bit reg 17 (word 9).
        let flow6 = strings(&[
            "payload load 16b @ network header + 8 => reg 1",
            "payload load 2b @ transport header + 0 => reg 2",
            "payload load 16b @ network header + 24 => reg 13",
            "payload load 2b @ transport header + 2 => reg 17",
        ]);
        assert_eq!(rules[0][..6], tcp_to_vip6[..]);
        assert_eq!(rules[0][9..13], flow6[..]);
        assert_eq!(rules[0][13], "dynset add reg_key 1 set seen6 id 2");
        assert_eq!(rules[1][6..10], flow6[..]);
        assert_eq!(rules[1][10], "lookup reg 1 set seen6 id 2");
        assert_eq!(rules[2][..6], tcp_to_vip6[..]);
        let set = read(&batch)
            .into_iter()
            .find(|m| m.kind == "NEWSET netdev")
            .unwrap();
        assert_eq!(set.string(NFTA_SET_NAME), "seen6");
        assert_eq!(set.be32(NFTA_SET_KEY_LEN), 40);
        assert_eq!(set.be32(NFTA_SET_KEY_TYPE), 0x0020_d20d);
    }

    #[test]
    fn the_set_and_chain_are_as_nft_makes_them() {
        let batch = forward_old_flows_batch(
            "ccm_ho_fwd",
            &eth0(),
            &[(VIP4, OLD)],
            Duration::from_secs(300),
            1000,
        )
        .unwrap();
        let read = read(&batch);
        let set = &read[4];
        assert_eq!(set.string(NFTA_SET_TABLE), "ccm_ho_fwd");
        assert_eq!(set.string(NFTA_SET_NAME), "seen4");
        assert_eq!(set.be32(NFTA_SET_FLAGS), 0x30);
        assert_eq!(set.be32(NFTA_SET_KEY_TYPE), 0x001c_d1cd, "as nft sends it");
        assert_eq!(set.be32(NFTA_SET_KEY_LEN), 16);
        assert_eq!(set.be32(NFTA_SET_ID), 1);
        assert_eq!(
            u64::from_be_bytes(set.attr(NFTA_SET_TIMEOUT).try_into().unwrap()),
            300_000
        );
        let desc = attributes(set.attr(NFTA_SET_DESC)).unwrap();
        assert_eq!(be32(find(&desc, NFTA_SET_DESC_SIZE)), 1000);
        assert_eq!(set.flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE);

        let chain = &read[5];
        assert_eq!(chain.string(NFTA_CHAIN_TABLE), "ccm_ho_fwd");
        assert_eq!(chain.string(NFTA_CHAIN_NAME), "ingress");
        assert_eq!(chain.string(NFTA_CHAIN_TYPE), "filter");
        assert_eq!(chain.be32(NFTA_CHAIN_POLICY), NF_ACCEPT);
        let hook = attributes(chain.attr(NFTA_CHAIN_HOOK)).unwrap();
        assert_eq!(be32(find(&hook, NFTA_HOOK_HOOKNUM)), NF_NETDEV_INGRESS);
        assert_eq!(be32(find(&hook, NFTA_HOOK_PRIORITY)) as i32, -500);
        assert_eq!(string(find(&hook, NFTA_HOOK_DEV)), "eth0");

        let rule = &read[6];
        assert_eq!(rule.string(NFTA_RULE_TABLE), "ccm_ho_fwd");
        assert_eq!(rule.string(NFTA_RULE_CHAIN), "ingress");
        assert_eq!(
            rule.flags,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND
        );
    }

    #[test]
    fn vips_of_both_families_get_both_sets_and_three_rules_each() {
        let vip4b = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 101));
        let batch = forward_old_flows_batch(
            "t",
            &eth0(),
            &[(VIP4, OLD), (VIP6, OLD), (vip4b, [2, 0, 0, 0, 0, 3])],
            TIMEOUT,
            65_535,
        )
        .unwrap();
        let read = read(&batch);
        let sets: Vec<String> = read
            .iter()
            .filter(|m| m.kind.starts_with("NEWSET"))
            .map(|m| m.string(NFTA_SET_NAME))
            .collect();
        assert_eq!(sets, ["seen4", "seen6"]);
        let rules = rules(&batch);
        assert_eq!(rules.len(), 9);
        // In the order given: the third VIP's last rule sends to its own old holder.
        assert_eq!(rules[8][3], "cmp eq reg 1 0x0a4d0065");
        assert_eq!(rules[8][10], "immediate reg 1 0x020000000003");
        assert!(
            batch
                .describe(15)
                .unwrap()
                .contains("send other TCP to 10.77.0.101 to the old holder 02:00:00:00:00:03")
        );
    }
}
