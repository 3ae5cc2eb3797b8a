//! What the tests of the files beside share (fixtures, a batch read back as `nft --debug=netlink`
//! shows it, the kernel's answers), and the tests that take every kind of batch.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use super::{
    Batch, Family, Link, Mac, NftError,
    decode::{attributes, messages},
    delete_table_batch, forward_old_flows_batch, quiet_neighbour_answers_batch,
    uapi::*,
};

pub(super) const OURS: Mac = [0x02, 0, 0, 0, 0, 0x01];
pub(super) const OLD: Mac = [0x02, 0, 0, 0, 0, 0x02];
pub(super) const VIP4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 100));
pub(super) const VIP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x100));
pub(super) const TIMEOUT: Duration = Duration::from_secs(300);

pub(super) fn eth0() -> Link {
    Link {
        name: "eth0".to_owned(),
        index: 2,
        mac: OURS,
    }
}

/// A message of a batch, read back.
#[derive(Debug)]
pub(super) struct Read {
    /// `NEWTABLE`, `BEGIN`... and the family's name.
    pub(super) kind: String,
    pub(super) family: u8,
    pub(super) res_id: u16,
    pub(super) flags: u16,
    pub(super) seq: u32,
    /// Top-level attributes.
    pub(super) attrs: Vec<(u16, Vec<u8>)>,
}

impl Read {
    pub(super) fn attr(&self, kind: u16) -> &[u8] {
        self.attrs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.as_slice())
            .unwrap_or_else(|| panic!("{} has no attribute {kind}", self.kind))
    }

    pub(super) fn string(&self, kind: u16) -> String {
        string(self.attr(kind))
    }

    pub(super) fn be32(&self, kind: u16) -> u32 {
        be32(self.attr(kind))
    }

    /// The rule's expressions, as `nft --debug=netlink` shows them (data in bytes, in order).
    pub(super) fn expressions(&self) -> Vec<String> {
        attributes(self.attr(NFTA_RULE_EXPRESSIONS))
            .unwrap()
            .into_iter()
            .map(|(kind, elem)| {
                assert_eq!(kind, NFTA_LIST_ELEM);
                let elem = attributes(elem).unwrap();
                let name = string(find(&elem, NFTA_EXPR_NAME));
                show(&name, &attributes(find(&elem, NFTA_EXPR_DATA)).unwrap())
            })
            .collect()
    }
}

pub(super) fn string(bytes: &[u8]) -> String {
    let text = bytes.strip_suffix(&[0]).expect("NUL-terminated");
    String::from_utf8(text.to_vec()).unwrap()
}

pub(super) fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes.try_into().expect("4 bytes"))
}

pub(super) fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> &'a [u8] {
    attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no attribute {kind} in {attrs:?}"))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

/// `struct nft_data`'s value.
fn value(data: &[u8]) -> String {
    hex(find(&attributes(data).unwrap(), NFTA_DATA_VALUE))
}

fn reg(attrs: &[(u16, &[u8])], kind: u16) -> u32 {
    be32(find(attrs, kind))
}

fn base(attrs: &[(u16, &[u8])]) -> &'static str {
    match reg(attrs, NFTA_PAYLOAD_BASE) {
        NFT_PAYLOAD_LL_HEADER => "link",
        NFT_PAYLOAD_NETWORK_HEADER => "network",
        NFT_PAYLOAD_TRANSPORT_HEADER => "transport",
        other => panic!("payload base {other}"),
    }
}

/// One expression as `nft --debug=netlink` shows it.
fn show(name: &str, a: &[(u16, &[u8])]) -> String {
    match name {
        "meta" => {
            let key = match reg(a, NFTA_META_KEY) {
                NFT_META_PROTOCOL => "protocol",
                NFT_META_L4PROTO => "l4proto",
                NFT_META_IIFTYPE => "iiftype",
                other => panic!("meta key {other}"),
            };
            format!("meta load {key} => reg {}", reg(a, NFTA_META_DREG))
        }
        "cmp" => {
            assert_eq!(reg(a, NFTA_CMP_OP), NFT_CMP_EQ);
            format!(
                "cmp eq reg {} {}",
                reg(a, NFTA_CMP_SREG),
                value(find(a, NFTA_CMP_DATA))
            )
        }
        "payload" if a.iter().any(|(k, _)| *k == NFTA_PAYLOAD_SREG) => format!(
            "payload write reg {} => {}b @ {} header + {}{}",
            reg(a, NFTA_PAYLOAD_SREG),
            reg(a, NFTA_PAYLOAD_LEN),
            base(a),
            reg(a, NFTA_PAYLOAD_OFFSET),
            if a.iter().any(|(k, _)| *k == NFTA_PAYLOAD_CSUM_FLAGS) {
                format!(" csum_flags 0x{:x}", reg(a, NFTA_PAYLOAD_CSUM_FLAGS))
            } else {
                String::new()
            }
        ),
        "payload" => format!(
            "payload load {}b @ {} header + {} => reg {}",
            reg(a, NFTA_PAYLOAD_LEN),
            base(a),
            reg(a, NFTA_PAYLOAD_OFFSET),
            reg(a, NFTA_PAYLOAD_DREG)
        ),
        "bitwise" => {
            assert_eq!(reg(a, NFTA_BITWISE_OP), NFT_BITWISE_BOOL);
            let mask = find(&attributes(find(a, NFTA_BITWISE_MASK)).unwrap(), 1).len();
            assert_eq!(reg(a, NFTA_BITWISE_LEN) as usize, mask);
            format!(
                "bitwise reg {} = ( reg {} & {} ) ^ {}",
                reg(a, NFTA_BITWISE_DREG),
                reg(a, NFTA_BITWISE_SREG),
                value(find(a, NFTA_BITWISE_MASK)),
                value(find(a, NFTA_BITWISE_XOR))
            )
        }
        "lookup" => format!(
            "lookup reg {} set {} id {}",
            reg(a, NFTA_LOOKUP_SREG),
            string(find(a, NFTA_LOOKUP_SET)),
            reg(a, NFTA_LOOKUP_SET_ID)
        ),
        "dynset" => {
            let op = match reg(a, NFTA_DYNSET_OP) {
                NFT_DYNSET_OP_ADD => "add",
                NFT_DYNSET_OP_UPDATE => "update",
                other => panic!("dynset op {other}"),
            };
            format!(
                "dynset {op} reg_key {} set {} id {}",
                reg(a, NFTA_DYNSET_SREG_KEY),
                string(find(a, NFTA_DYNSET_SET_NAME)),
                reg(a, NFTA_DYNSET_SET_ID)
            )
        }
        "immediate" => {
            let data = attributes(find(a, NFTA_IMMEDIATE_DATA)).unwrap();
            let shown = match data.as_slice() {
                [(NFTA_DATA_VALUE, value)] => hex(value),
                [(NFTA_DATA_VERDICT, verdict)] => {
                    match be32(find(&attributes(verdict).unwrap(), NFTA_VERDICT_CODE)) {
                        NF_ACCEPT => "accept".to_owned(),
                        NF_DROP => "drop".to_owned(),
                        other => panic!("verdict {other}"),
                    }
                }
                other => panic!("immediate data {other:?}"),
            };
            format!("immediate reg {} {shown}", reg(a, NFTA_IMMEDIATE_DREG))
        }
        "fwd" => format!("fwd sreg_dev {}", reg(a, NFTA_FWD_SREG_DEV)),
        other => panic!("an expression {other}"),
    }
}

fn kind_name(kind: u16) -> &'static str {
    match kind {
        NFNL_MSG_BATCH_BEGIN => "BEGIN",
        NFNL_MSG_BATCH_END => "END",
        _ => match kind & 0xff {
            NFT_MSG_NEWTABLE => "NEWTABLE",
            NFT_MSG_DELTABLE => "DELTABLE",
            NFT_MSG_NEWCHAIN => "NEWCHAIN",
            NFT_MSG_NEWRULE => "NEWRULE",
            NFT_MSG_NEWSET => "NEWSET",
            _ => "?",
        },
    }
}

fn family_name(family: u8) -> &'static str {
    match family {
        NFPROTO_UNSPEC => "",
        NFPROTO_ARP => " arp",
        NFPROTO_IPV6 => " ip6",
        NFPROTO_NETDEV => " netdev",
        _ => " ?",
    }
}

/// The batch's messages, read back with the walker above (which checks every length).
pub(super) fn read(batch: &Batch) -> Vec<Read> {
    let read: Vec<Read> = messages(batch.bytes())
        .unwrap()
        .into_iter()
        .map(|m| {
            assert!(m.kind <= NFNL_MSG_BATCH_END || m.kind >> 8 == NFNL_SUBSYS_NFTABLES);
            let (family, version) = (m.payload[0], m.payload[1]);
            assert_eq!(version, NFNETLINK_V0);
            Read {
                kind: format!("{}{}", kind_name(m.kind), family_name(family)),
                family,
                res_id: u16::from_be_bytes([m.payload[2], m.payload[3]]),
                flags: m.flags,
                seq: m.seq,
                attrs: attributes(&m.payload[4..])
                    .unwrap()
                    .into_iter()
                    .map(|(k, v)| (k, v.to_vec()))
                    .collect(),
            }
        })
        .collect();
    assert_eq!(read.len(), batch.len(), "one description per message");
    read
}

pub(super) fn kinds(batch: &Batch) -> Vec<String> {
    read(batch).into_iter().map(|m| m.kind).collect()
}

pub(super) fn rules(batch: &Batch) -> Vec<Vec<String>> {
    read(batch)
        .iter()
        .filter(|m| m.kind.starts_with("NEWRULE"))
        .map(Read::expressions)
        .collect()
}

pub(super) fn strings(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|line| line.to_string()).collect()
}

/// An answer of the kernel's, as it writes it: `NLMSG_ERROR`, the errno (negative), the header of
/// the message answered.
pub(super) fn answer(seq: u32, errno: i32) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&36u32.to_ne_bytes());
    bytes.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
    bytes.extend_from_slice(&0u16.to_ne_bytes());
    bytes.extend_from_slice(&seq.to_ne_bytes());
    bytes.extend_from_slice(&4242u32.to_ne_bytes());
    bytes.extend_from_slice(&(-errno).to_ne_bytes());
    bytes.extend_from_slice(&[0; 16]);
    bytes
}

#[test]
fn no_vips_only_removes() {
    let forward = forward_old_flows_batch("t", &eth0(), &[], TIMEOUT, 65_535).unwrap();
    assert_eq!(
        kinds(&forward),
        ["BEGIN", "NEWTABLE netdev", "DELTABLE netdev", "END"]
    );
    assert_eq!(forward, delete_table_batch(Family::Netdev, "t").unwrap());
    let quiet = quiet_neighbour_answers_batch("q", &[], None).unwrap();
    assert_eq!(
        kinds(&quiet),
        [
            "BEGIN",
            "NEWTABLE arp",
            "DELTABLE arp",
            "NEWTABLE ip6",
            "DELTABLE ip6",
            "END"
        ]
    );
}

#[test]
fn bad_input_is_refused_before_anything_is_sent() {
    let long = "x".repeat(256);
    let mut wide = eth0();
    wide.name = "sixteen-bytes-ab".to_owned();
    let refused = [
        forward_old_flows_batch("", &eth0(), &[(VIP4, OLD)], TIMEOUT, 1),
        forward_old_flows_batch(&long, &eth0(), &[(VIP4, OLD)], TIMEOUT, 1),
        forward_old_flows_batch("a\0b", &eth0(), &[(VIP4, OLD)], TIMEOUT, 1),
        forward_old_flows_batch("t", &wide, &[(VIP4, OLD)], TIMEOUT, 1),
        forward_old_flows_batch("t", &eth0(), &[(VIP4, OLD)], Duration::ZERO, 1),
        forward_old_flows_batch("t", &eth0(), &[(VIP4, OLD)], Duration::from_micros(999), 1),
        forward_old_flows_batch("t", &eth0(), &[(VIP4, OLD)], Duration::MAX, 1),
        forward_old_flows_batch("t", &eth0(), &[(VIP4, OLD)], TIMEOUT, 0),
        quiet_neighbour_answers_batch("", &[VIP4], None),
        delete_table_batch(Family::Arp, &long),
    ];
    for (n, result) in refused.into_iter().enumerate() {
        assert!(
            matches!(result, Err(NftError::Invalid(_))),
            "{n}: {result:?}"
        );
    }
    let longest = "x".repeat(255);
    assert!(delete_table_batch(Family::Arp, &longest).is_ok());
}
