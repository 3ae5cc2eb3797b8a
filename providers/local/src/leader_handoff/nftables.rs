//! nf_tables programmed through netlink (`NETLINK_NETFILTER`) for a hand-over of VIPs between two
//! hosts on one L2 segment in which the connections already open through the old host keep going. No
//! `nft` binary and no C library: the product ships in a distroless image.
//!
//! **On the new host** (it takes the VIPs over), [`forward_old_flows_batch`]: a `netdev` table on the
//! VIP interface, its chain on the ingress hook (priority -500, policy accept). For each VIP and the
//! MAC of the old host that still serves its open connections, in `nft`'s words (IPv6 alike, with
//! `ip6` and the set `seen6`):
//!
//! ```text
//! ip daddr VIP tcp flags & (syn|ack) == syn add @seen4 { ip saddr . tcp sport . ip daddr . tcp dport } accept
//! ip daddr VIP ip saddr . tcp sport . ip daddr . tcp dport @seen4 update @seen4 { ...the same key... } accept
//! ip daddr VIP meta l4proto tcp ether saddr set OUR_MAC ether daddr set OLD_MAC fwd to "IFACE"
//! ```
//!
//! A connection that begins here (a SYN without ACK) is remembered in a dynamic set with a timeout
//! and accepted, and so is every later packet of it; every other TCP packet to the VIP belongs to a
//! connection opened on the old host and is sent back out of the interface to the old host's MAC
//! (from ours, so that the switch does not learn the client's MAC on our port). Traffic that is not
//! TCP is untouched. A packet of a remembered flow refreshes its timeout (the `update` in the second
//! rule), so a connection opened here stays here as long as it is never idle for longer than the
//! timeout; one idle for longer is sent to the old host from then on, which resets it.
//!
//! **On the old host** (it gives the VIPs away but keeps the addresses, so that it still takes the
//! packets forwarded to it), [`quiet_neighbour_answers_batch`]: it stops answering neighbour
//! solicitations for the VIPs, so that its neighbours learn the new host's MAC only. An `arp` table
//! drops ARP requests for the IPv4 VIPs (`arp operation request arp daddr ip VIP drop`), an `ip6`
//! table drops ICMPv6 neighbour solicitations whose target is an IPv6 VIP.
//!
//! **Removing** a table: [`delete_table_batch`]; a table that is not there is no error.
//!
//! The batches are built by pure functions into a [`Batch`] (its bytes, and what each of its messages
//! does), and sent by [`apply`], which asks the kernel to acknowledge every message and names the
//! message it refused. A batch is one transaction: it applies whole or not at all. An install
//! replaces the table of the same name in the same transaction, as `nft` does (`NEWTABLE`, `DELTABLE`,
//! `NEWTABLE`...: the first creates the table when it is not there, so that deleting it cannot fail),
//! so there is no moment without the table. Replacing the forwarding table empties its flow sets:
//! install it once per hand-over.
//!
//! Everything here needs `CAP_NET_ADMIN` in the network namespace of the calling thread, and works in
//! that namespace (the netlink sockets are opened by the calling thread).

use std::{
    fmt, io,
    net::{IpAddr, Ipv6Addr},
    os::fd::OwnedFd,
    time::Duration,
};

use rustix::{
    io::Errno,
    net::{
        AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType,
        netlink::{self, SocketAddrNetlink},
        sockopt::{self, Timeout},
    },
};

// --- linux/netlink.h ---

/// The size of `struct nlmsghdr`.
const NLMSG_HDRLEN: usize = 16;
/// The size of `struct nlattr`.
const NLA_HDRLEN: usize = 4;
/// Netlink's alignment of messages and attributes (`NLMSG_ALIGNTO`, `NLA_ALIGNTO`).
const NLA_ALIGNTO: usize = 4;
/// The message type of an error or acknowledgement (`struct nlmsgerr`).
const NLMSG_ERROR: u16 = 2;
/// A request (every message to the kernel).
const NLM_F_REQUEST: u16 = 0x1;
/// Asks for an acknowledgement, also of a message that succeeded.
const NLM_F_ACK: u16 = 0x4;
/// Creates the object when it is not there (a `NEW` message).
const NLM_F_CREATE: u16 = 0x400;
/// Adds the rule at the end of the chain.
const NLM_F_APPEND: u16 = 0x800;
/// The attribute holds attributes.
const NLA_F_NESTED: u16 = 0x8000;
/// The bits of `nla_type` that are flags, not the type (`NLA_F_NESTED | NLA_F_NET_BYTEORDER`).
const NLA_TYPE_FLAGS: u16 = 0xc000;

// --- linux/netfilter/nfnetlink.h ---

/// Begins a batch (a transaction); `NLMSG_MIN_TYPE`.
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
/// Ends (commits) a batch.
const NFNL_MSG_BATCH_END: u16 = 0x11;
/// nf_tables' subsystem: the high byte of its message types, and the `res_id` of its batches.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The version of `struct nfgenmsg`.
const NFNETLINK_V0: u8 = 0;

// --- linux/netfilter.h ---

const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_ARP: u8 = 3;
const NFPROTO_NETDEV: u8 = 5;
const NFPROTO_IPV6: u8 = 10;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// `enum nf_inet_hooks`: packets for this host.
const NF_INET_LOCAL_IN: u32 = 1;
/// `enum nf_inet_hooks`: packets this host sends.
const NF_INET_LOCAL_OUT: u32 = 3;
/// `enum nf_dev_hooks`: packets as the interface receives them.
const NF_NETDEV_INGRESS: u32 = 0;

// --- linux/netfilter_arp.h ---

/// ARP packets for this host.
const NF_ARP_IN: u32 = 0;
/// `NF_ARP_OUT`, from `linux/netfilter_arp.h`.
const NF_ARP_OUT: u32 = 1;

// --- linux/netfilter/nf_tables.h ---

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWSET: u16 = 9;

/// `enum nft_registers`: the verdict register.
const NFT_REG_VERDICT: u32 = 0;
/// The first 16-byte data register.
const NFT_REG_1: u32 = 1;
/// The first 32-bit data register (the first word of `NFT_REG_1`).
const NFT_REG32_00: u32 = 8;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;

const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_HOOK_DEV: u16 = 3;

const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;

const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_DESC_SIZE: u16 = 1;
/// `enum nft_set_flags`: elements expire.
const NFT_SET_TIMEOUT: u32 = 0x10;
/// Elements are added from the packet path (`dynamic`).
const NFT_SET_EVAL: u32 = 0x20;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;

const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;

const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;

const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
/// `enum nft_cmp_ops`: equal.
const NFT_CMP_EQ: u32 = 0;

const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
/// `enum nft_meta_keys`: `skb->protocol` (the EtherType), 2 bytes, network byte order.
const NFT_META_PROTOCOL: u32 = 1;
/// The input interface's `ARPHRD_*` type, 2 bytes, host byte order.
const NFT_META_IIFTYPE: u32 = 8;
/// The transport protocol, 1 byte.
const NFT_META_L4PROTO: u32 = 16;

const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_PAYLOAD_SREG: u16 = 5;
const NFTA_PAYLOAD_CSUM_FLAGS: u16 = 8;
/// `NFT_PAYLOAD_L4CSUM_PSEUDOHDR`: a write to an address updates the transport checksum's
/// pseudo-header sum.
const NFT_PAYLOAD_L4CSUM_PSEUDOHDR: u32 = 1;
/// `enum nft_payload_bases`.
const NFT_PAYLOAD_LL_HEADER: u32 = 0;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_BITWISE_OP: u16 = 6;
/// `enum nft_bitwise_ops`: `(reg & mask) ^ xor`.
const NFT_BITWISE_BOOL: u32 = 0;

const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_SET_ID: u16 = 4;

const NFTA_DYNSET_SET_NAME: u16 = 1;
const NFTA_DYNSET_SET_ID: u16 = 2;
const NFTA_DYNSET_OP: u16 = 3;
const NFTA_DYNSET_SREG_KEY: u16 = 4;
/// `enum nft_dynset_ops`: adds the element when it is not there (an existing one keeps its expiry).
const NFT_DYNSET_OP_ADD: u32 = 0;
/// Adds the element, or refreshes the expiry of the existing one.
const NFT_DYNSET_OP_UPDATE: u32 = 1;

const NFTA_FWD_SREG_DEV: u16 = 1;

// --- linux/if_arp.h, linux/if_ether.h, linux/in.h, linux/in6.h, linux/tcp.h, netinet/icmp6.h ---

/// Ethernet, as a link type.
const ARPHRD_ETHER: u16 = 1;
/// ARP's "who has" operation.
const ARPOP_REQUEST: u16 = 1;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
/// The length of an Ethernet address.
const ETH_ALEN: usize = 6;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6's neighbour solicitation (`ND_NEIGHBOR_SOLICIT`).
const ND_NEIGHBOR_SOLICIT: u8 = 135;
/// The TCP header's flags byte: its offset, and the SYN and ACK bits.
const TCP_FLAGS_OFFSET: u32 = 13;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;

// --- linux/rtnetlink.h, linux/if_link.h, linux/if.h ---

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
/// The size of `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
/// The longest interface name, without its terminating NUL (`IFNAMSIZ - 1`).
const IFNAME_MAX: usize = 15;
/// The longest nf_tables name, without its terminating NUL (`NFT_NAME_MAXLEN - 1`).
const NFT_NAME_MAX: usize = 255;

/// How long [`apply`] and [`link`] wait for the kernel's answers (which it writes while it reads the
/// request, so they are there at once; this only bounds a kernel that behaves otherwise).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Room in the socket's receive buffer for the answer to one message (an acknowledgement takes a few
/// hundred bytes of the buffer; an error repeats the message).
const ANSWER_ROOM: usize = 2048;

/// Room beyond the batch (send) or the answers (receive) in a socket's buffer.
const SOCKET_BUFFER_SLACK: usize = 64 * 1024;

/// The largest datagram the kernel sends us here (an error repeats the refused message: a few
/// kilobytes at most; a link's description is a few kilobytes too).
const RECEIVE_BUFFER: usize = 64 * 1024;

/// The chain of the forwarding table.
const INGRESS_CHAIN: &str = "ingress";
/// The chain of the tables that quiet neighbour answers.
const INPUT_CHAIN: &str = "input";
/// The chain of the `arp` table that rewrites this host's own ARP requests.
const OUTPUT_CHAIN: &str = "output";
/// The priority of the forwarding chain: before any other ingress chain of the usual priorities.
const INGRESS_PRIORITY: i32 = -500;
/// The priority of the quieting chains (`filter`).
const INPUT_PRIORITY: i32 = 0;

/// An Ethernet (MAC) address.
pub(crate) type Mac = [u8; ETH_ALEN];

/// An nf_tables address family, the namespace of a table's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// `arp`: ARP packets, on the hooks of ARP's input and output.
    Arp,
    /// `ip6`: IPv6 packets, on the hooks of the IP stack.
    Ipv6,
    /// `netdev`: every packet of one interface, as it comes in (ingress) or goes out (egress).
    Netdev,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Arp => NFPROTO_ARP,
            Family::Ipv6 => NFPROTO_IPV6,
            Family::Netdev => NFPROTO_NETDEV,
        }
    }

    /// The family's name in `nft`'s syntax.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Arp => "arp",
            Family::Ipv6 => "ip6",
            Family::Netdev => "netdev",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An Ethernet interface of the calling thread's network namespace, as [`link`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    /// Its name.
    pub(crate) name: String,
    /// Its index.
    pub(crate) index: u32,
    /// Its MAC address.
    pub(crate) mac: Mac,
}

/// A netlink batch for nf_tables: `NFNL_MSG_BATCH_BEGIN`, the messages, `NFNL_MSG_BATCH_END`, each
/// with `NLM_F_ACK` and its index as sequence number; and what each message does, for the errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    bytes: Vec<u8>,
    messages: Vec<String>,
}

impl Batch {
    /// The bytes to send, in one datagram (for the tests; [`apply`] reads the field).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// What the message with sequence number `seq` does ("adding chain ingress ..."); `None` past the
    /// end. Sequence number 0 is the batch's begin, which stands for the batch as a whole.
    pub(crate) fn describe(&self, seq: u32) -> Option<&str> {
        let index = usize::try_from(seq).ok()?;
        self.messages.get(index).map(String::as_str)
    }

    /// How many messages the batch has, its begin and end included.
    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    /// The description of `seq`, or a description of a number that is not ours.
    fn name(&self, seq: u32) -> String {
        self.describe(seq)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("message {seq}, which the batch does not have"))
    }
}

/// What can go wrong programming nf_tables.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NftError {
    /// The input cannot make a batch (an empty or too long name, a zero timeout); nothing was sent.
    #[error("cannot build the nf_tables batch: {0}")]
    Invalid(String),
    /// A netlink socket could not be opened, set up, written or read.
    #[error("netlink socket: {what}: {source}")]
    Socket {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A file of `/proc` that says what the kernel has could not be read.
    #[error("reading {path}: {source}")]
    Proc {
        /// The file.
        path: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a message of the batch, and so the whole batch: nothing of it applies.
    #[error("the kernel refused the nf_tables batch at {message}: {}", errno_text(*.errno))]
    Refused {
        /// What the refused message does ("adding chain ingress ... to table netdev ccm_ho_fwd").
        message: String,
        /// The (positive) errno of the kernel's answer.
        errno: i32,
    },
    /// The kernel did not answer a message (within [`ANSWER_TIMEOUT`]): whether the batch applied
    /// is not known.
    #[error("the kernel did not answer {message} of the nf_tables batch")]
    Unanswered {
        /// What the unanswered message does.
        message: String,
    },
    /// The kernel's answer is not netlink as it writes it.
    #[error("a malformed netlink answer: {0}")]
    Malformed(String),
    /// An interface could not be looked up, or is not an Ethernet interface.
    #[error("interface {interface}: {why}")]
    Interface {
        /// Its name.
        interface: String,
        /// What is wrong.
        why: String,
    },
}

/// The text of a (positive) errno, with what is needed when it is a missing privilege.
fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    if errno == Errno::PERM.raw_os_error() || errno == Errno::ACCESS.raw_os_error() {
        format!("{text} (CAP_NET_ADMIN is needed)")
    } else {
        text
    }
}

// ------------------------------------------------------------------------------------------------
// The batches.

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
    let rule = |n: usize, what: String| {
        format!(
            "adding rule {n} to chain {INGRESS_CHAIN} of table {} {table} ({what})",
            Family::Netdev
        )
    };
    let mut n = 0;
    for (vip, old_mac) in old_holders {
        let (ip, address) = ip_of(*vip);
        n += 1;
        batch.rule(
            Family::Netdev,
            table,
            INGRESS_CHAIN,
            rule(
                n,
                format!("accept TCP to {vip} that begins here, and remember its flow"),
            ),
            &begins_here(ip, &address),
        );
        n += 1;
        batch.rule(
            Family::Netdev,
            table,
            INGRESS_CHAIN,
            rule(n, format!("accept TCP to {vip} of a flow that began here")),
            &began_here(ip, &address),
        );
        n += 1;
        batch.rule(
            Family::Netdev,
            table,
            INGRESS_CHAIN,
            rule(
                n,
                format!(
                    "send other TCP to {vip} to the old holder {} out of {}",
                    mac_text(old_mac),
                    link.name
                ),
            ),
            &to_old_holder(ip, &address, link, *old_mac),
        );
    }
    batch.finish()
}

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
        // This host still talks from the VIPs (the open connections): when it asks for a client's
        // MAC address from one, the client would take the question's sender as the VIP's holder and
        // turn back here. Asked from 0.0.0.0 (an ARP probe) or from the link-local address (the
        // ICMPv6 checksum follows the new source), the client answers all the same and learns
        // nothing (what `arp_announce` 2 does for a host's other addresses).
        let (hook, rewrite): (u32, Option<(String, Vec<u8>)>) = match family {
            Family::Arp => (NF_ARP_OUT, Some(("0.0.0.0".to_owned(), vec![0; 4]))),
            _ => (
                NF_INET_LOCAL_OUT,
                link_local.map(|ll| (ll.to_string(), ll.octets().to_vec())),
            ),
        };
        let Some((source, source_bytes)) = rewrite else {
            continue;
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
    batch.finish()
}

/// The link-local IPv6 address `interface` has, if any, as the calling thread's network namespace
/// sees it (`/proc/thread-self/net/if_inet6`: one line per address, its 32 hex digits first, its
/// scope fifth, the interface last).
pub(crate) fn link_local(interface: &str) -> Result<Option<Ipv6Addr>, NftError> {
    const PATH: &str = "/proc/thread-self/net/if_inet6";
    /// `IFA_RT_SCOPE_LINK` as the file shows it.
    const SCOPE_LINK: &str = "20";
    let text = match std::fs::read_to_string(PATH) {
        Ok(text) => text,
        // No IPv6 on this host.
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(NftError::Proc { path: PATH, source }),
    };
    Ok(text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 6 || fields[5] != interface || fields[3] != SCOPE_LINK {
            return None;
        }
        u128::from_str_radix(fields[0], 16).ok().map(Ipv6Addr::from)
    }))
}

/// The batch that removes the table `table` of `family`, whether or not it is there.
pub(crate) fn delete_table_batch(family: Family, table: &str) -> Result<Batch, NftError> {
    check_name("table", table, NFT_NAME_MAX)?;
    let mut batch = Builder::new();
    batch.replace_table(family, table, false);
    batch.finish()
}

fn check_name(what: &str, name: &str, max: usize) -> Result<(), NftError> {
    if name.is_empty() || name.len() > max || name.contains('\0') {
        return Err(NftError::Invalid(format!(
            "the {what} name {name:?} (it must have 1 to {max} bytes, none of them NUL)"
        )));
    }
    Ok(())
}

pub(crate) fn mac_text(mac: &Mac) -> String {
    mac.iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<Vec<_>>()
        .join(":")
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

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    /// `meta load KEY => reg`.
    Meta { key: u32, dreg: u32 },
    /// `cmp eq reg DATA`.
    Cmp { sreg: u32, data: Vec<u8> },
    /// `payload load LEN @ BASE + OFFSET => reg`.
    Load {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// `payload write reg => LEN @ BASE + OFFSET`, with `csum_flags` (0: no checksum to update;
    /// [`NFT_PAYLOAD_L4CSUM_PSEUDOHDR`]: the transport checksum follows an address written).
    Write {
        base: u32,
        offset: u32,
        len: u32,
        sreg: u32,
        csum_flags: u32,
    },
    /// `bitwise reg = (reg & MASK) ^ XOR`.
    Bitwise {
        reg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `lookup reg set SET`.
    Lookup { set: &'static str, set_id: u32 },
    /// `dynset OP reg_key 1 set SET`.
    Dynset {
        op: u32,
        set: &'static str,
        set_id: u32,
    },
    /// `immediate reg DATA`.
    Immediate { dreg: u32, data: Vec<u8> },
    /// `immediate reg 0 VERDICT`.
    Verdict(u32),
    /// `fwd sreg_dev reg`.
    Fwd { sreg_dev: u32 },
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Load { .. } | Expr::Write { .. } => "payload",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Dynset { .. } => "dynset",
            Expr::Immediate { .. } | Expr::Verdict(_) => "immediate",
            Expr::Fwd { .. } => "fwd",
        }
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

/// Where a base chain hooks in.
struct Hook<'a> {
    /// The hook's name in `nft`'s syntax (for the messages).
    name: &'static str,
    /// Its number in its family (`NF_*`).
    number: u32,
    priority: i32,
    /// The interface, for the `netdev` family.
    device: Option<&'a str>,
}

/// Writes a batch: every message gets `NLM_F_ACK` and its index as sequence number.
struct Builder {
    bytes: Vec<u8>,
    messages: Vec<String>,
    /// An attribute or message outgrew its length field (cannot happen with checked names; checked
    /// all the same, rather than sending a wrong length).
    too_large: bool,
}

impl Builder {
    fn new() -> Self {
        let mut builder = Builder {
            bytes: Vec::new(),
            messages: Vec::new(),
            too_large: false,
        };
        builder.message(
            NFNL_MSG_BATCH_BEGIN,
            0,
            NFPROTO_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
            "the batch as a whole (its begin, or its commit)".to_owned(),
            |_| {},
        );
        builder
    }

    fn finish(mut self) -> Result<Batch, NftError> {
        self.message(
            NFNL_MSG_BATCH_END,
            0,
            NFPROTO_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
            "the batch's end".to_owned(),
            |_| {},
        );
        if self.too_large {
            return Err(NftError::Invalid(
                "a message outgrew netlink's length fields".to_owned(),
            ));
        }
        Ok(Batch {
            bytes: self.bytes,
            messages: self.messages,
        })
    }

    /// A message: `struct nlmsghdr`, `struct nfgenmsg`, then what `body` writes.
    fn message(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        res_id: u16,
        what: String,
        body: impl FnOnce(&mut Attrs<'_>),
    ) {
        let start = self.bytes.len();
        let Ok(seq) = u32::try_from(self.messages.len()) else {
            self.too_large = true;
            return;
        };
        self.bytes.extend_from_slice(&[0; 4]); // The length, below.
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | flags).to_ne_bytes());
        self.bytes.extend_from_slice(&seq.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes()); // Port ID: the kernel's.
        self.bytes.extend_from_slice(&[family, NFNETLINK_V0]);
        self.bytes.extend_from_slice(&res_id.to_be_bytes());
        body(&mut Attrs {
            out: &mut self.bytes,
            too_large: &mut self.too_large,
        });
        match u32::try_from(self.bytes.len() - start) {
            Ok(len) => self.bytes[start..start + 4].copy_from_slice(&len.to_ne_bytes()),
            Err(_) => self.too_large = true,
        }
        self.messages.push(what);
    }

    /// An nf_tables message.
    fn nft(
        &mut self,
        message: u16,
        flags: u16,
        family: Family,
        what: String,
        body: impl FnOnce(&mut Attrs<'_>),
    ) {
        self.message(
            NFNL_SUBSYS_NFTABLES << 8 | message,
            flags,
            family.nfproto(),
            0,
            what,
            body,
        );
    }

    /// Adds the table (nothing when it is there), deletes it, and adds it anew when `create`.
    fn replace_table(&mut self, family: Family, table: &str, create: bool) {
        let table_attrs = |attrs: &mut Attrs<'_>| {
            attrs.string(NFTA_TABLE_NAME, table);
            attrs.u32(NFTA_TABLE_FLAGS, 0);
        };
        self.nft(
            NFT_MSG_NEWTABLE,
            0,
            family,
            format!("adding table {family} {table} if it is not there (to delete it)"),
            table_attrs,
        );
        self.nft(
            NFT_MSG_DELTABLE,
            0,
            family,
            format!("deleting table {family} {table}"),
            |attrs| attrs.string(NFTA_TABLE_NAME, table),
        );
        if create {
            self.nft(
                NFT_MSG_NEWTABLE,
                0,
                family,
                format!("adding table {family} {table}"),
                table_attrs,
            );
        }
    }

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

    /// A base chain of type `filter`, policy accept.
    fn chain(&mut self, family: Family, table: &str, chain: &str, hook: Hook<'_>) {
        let Hook {
            name,
            number,
            priority,
            device,
        } = hook;
        let on = device
            .map(|device| format!(" on {device}"))
            .unwrap_or_default();
        self.nft(
            NFT_MSG_NEWCHAIN,
            NLM_F_CREATE,
            family,
            format!(
                "adding chain {chain} (hook {name}{on}, priority {priority}) to table {family} {table}"
            ),
            |attrs| {
                attrs.string(NFTA_CHAIN_TABLE, table);
                attrs.string(NFTA_CHAIN_NAME, chain);
                attrs.string(NFTA_CHAIN_TYPE, "filter");
                attrs.u32(NFTA_CHAIN_POLICY, NF_ACCEPT);
                attrs.nested(NFTA_CHAIN_HOOK, |attrs| {
                    attrs.u32(NFTA_HOOK_HOOKNUM, number);
                    attrs.bytes(NFTA_HOOK_PRIORITY, &priority.to_be_bytes());
                    if let Some(device) = device {
                        attrs.string(NFTA_HOOK_DEV, device);
                    }
                });
            },
        );
    }

    fn rule(&mut self, family: Family, table: &str, chain: &str, what: String, rule: &[Expr]) {
        self.nft(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            family,
            what,
            |attrs| {
                attrs.string(NFTA_RULE_TABLE, table);
                attrs.string(NFTA_RULE_CHAIN, chain);
                attrs.nested(NFTA_RULE_EXPRESSIONS, |attrs| {
                    for expr in rule {
                        attrs.nested(NFTA_LIST_ELEM, |attrs| {
                            attrs.string(NFTA_EXPR_NAME, expr.name());
                            attrs.nested(NFTA_EXPR_DATA, |attrs| attrs.expr(expr));
                        });
                    }
                });
            },
        );
    }
}

/// Writes netlink attributes at the end of a message. nf_tables' numbers are big-endian
/// (`NLA_BE32`); its data (`NFTA_DATA_VALUE`) is as the registers hold it.
struct Attrs<'a> {
    out: &'a mut Vec<u8>,
    too_large: &'a mut bool,
}

impl Attrs<'_> {
    fn open(&mut self) -> usize {
        let start = self.out.len();
        self.out.extend_from_slice(&[0; NLA_HDRLEN]);
        start
    }

    fn close(&mut self, start: usize, kind: u16) {
        let len = u16::try_from(self.out.len() - start).unwrap_or_else(|_| {
            *self.too_large = true;
            0
        });
        self.out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.out[start + 2..start + 4].copy_from_slice(&kind.to_ne_bytes());
        while !self.out.len().is_multiple_of(NLA_ALIGNTO) {
            self.out.push(0);
        }
    }

    fn bytes(&mut self, kind: u16, payload: &[u8]) {
        let start = self.open();
        self.out.extend_from_slice(payload);
        self.close(start, kind);
    }

    fn string(&mut self, kind: u16, value: &str) {
        let start = self.open();
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(0);
        self.close(start, kind);
    }

    /// A payload expression's place: its base, offset and length.
    fn payload_at(&mut self, base: u32, offset: u32, len: u32) {
        self.u32(NFTA_PAYLOAD_BASE, base);
        self.u32(NFTA_PAYLOAD_OFFSET, offset);
        self.u32(NFTA_PAYLOAD_LEN, len);
    }

    fn u32(&mut self, kind: u16, value: u32) {
        self.bytes(kind, &value.to_be_bytes());
    }

    fn u64(&mut self, kind: u16, value: u64) {
        self.bytes(kind, &value.to_be_bytes());
    }

    fn nested(&mut self, kind: u16, body: impl FnOnce(&mut Self)) {
        let start = self.open();
        body(self);
        self.close(start, kind | NLA_F_NESTED);
    }

    /// `struct nft_data` holding `value`.
    fn data(&mut self, kind: u16, value: &[u8]) {
        self.nested(kind, |attrs| attrs.bytes(NFTA_DATA_VALUE, value));
    }

    /// An expression's attributes (its `NFTA_EXPR_DATA`).
    fn expr(&mut self, expr: &Expr) {
        match expr {
            Expr::Meta { key, dreg } => {
                self.u32(NFTA_META_KEY, *key);
                self.u32(NFTA_META_DREG, *dreg);
            }
            Expr::Cmp { sreg, data } => {
                self.u32(NFTA_CMP_SREG, *sreg);
                self.u32(NFTA_CMP_OP, NFT_CMP_EQ);
                self.data(NFTA_CMP_DATA, data);
            }
            Expr::Load {
                base,
                offset,
                len,
                dreg,
            } => {
                self.u32(NFTA_PAYLOAD_DREG, *dreg);
                self.payload_at(*base, *offset, *len);
            }
            Expr::Write {
                base,
                offset,
                len,
                sreg,
                csum_flags,
            } => {
                self.u32(NFTA_PAYLOAD_SREG, *sreg);
                self.payload_at(*base, *offset, *len);
                if *csum_flags != 0 {
                    self.u32(NFTA_PAYLOAD_CSUM_FLAGS, *csum_flags);
                }
            }
            Expr::Bitwise { reg, mask, xor } => {
                self.u32(NFTA_BITWISE_SREG, *reg);
                self.u32(NFTA_BITWISE_DREG, *reg);
                self.u32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
                self.u32(
                    NFTA_BITWISE_LEN,
                    u32::try_from(mask.len()).unwrap_or(u32::MAX),
                );
                self.data(NFTA_BITWISE_MASK, mask);
                self.data(NFTA_BITWISE_XOR, xor);
            }
            Expr::Lookup { set, set_id } => {
                self.u32(NFTA_LOOKUP_SREG, NFT_REG_1);
                self.string(NFTA_LOOKUP_SET, set);
                self.u32(NFTA_LOOKUP_SET_ID, *set_id);
            }
            Expr::Dynset { op, set, set_id } => {
                self.u32(NFTA_DYNSET_SREG_KEY, NFT_REG_1);
                self.u32(NFTA_DYNSET_OP, *op);
                self.string(NFTA_DYNSET_SET_NAME, set);
                self.u32(NFTA_DYNSET_SET_ID, *set_id);
            }
            Expr::Immediate { dreg, data } => {
                self.u32(NFTA_IMMEDIATE_DREG, *dreg);
                self.data(NFTA_IMMEDIATE_DATA, data);
            }
            Expr::Verdict(code) => {
                self.u32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
                self.nested(NFTA_IMMEDIATE_DATA, |attrs| {
                    attrs.nested(NFTA_DATA_VERDICT, |attrs| {
                        attrs.u32(NFTA_VERDICT_CODE, *code);
                    });
                });
            }
            Expr::Fwd { sreg_dev } => self.u32(NFTA_FWD_SREG_DEV, *sreg_dev),
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Reading netlink.

/// One netlink message of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Message<'a> {
    kind: u16,
    flags: u16,
    seq: u32,
    /// What follows the header.
    payload: &'a [u8],
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The messages of a datagram.
fn messages(datagram: &[u8]) -> Result<Vec<Message<'_>>, NftError> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let malformed = || {
            NftError::Malformed(format!(
                "a message header that does not fit the {} bytes left",
                rest.len()
            ))
        };
        let len = u32_at(rest, 0)
            .and_then(|len| usize::try_from(len).ok())
            .filter(|len| (NLMSG_HDRLEN..=rest.len()).contains(len))
            .ok_or_else(malformed)?;
        let (Some(kind), Some(flags), Some(seq)) =
            (u16_at(rest, 4), u16_at(rest, 6), u32_at(rest, 8))
        else {
            return Err(malformed());
        };
        messages.push(Message {
            kind,
            flags,
            seq,
            payload: &rest[NLMSG_HDRLEN..len],
        });
        rest = rest.get(len.next_multiple_of(NLA_ALIGNTO)..).unwrap_or(&[]);
    }
    Ok(messages)
}

/// The attributes in `bytes`: type (without the flag bits) and payload.
fn attributes(mut bytes: &[u8]) -> Result<Vec<(u16, &[u8])>, NftError> {
    let mut attributes = Vec::new();
    while bytes.len() >= NLA_HDRLEN {
        let (Some(len), Some(kind)) = (u16_at(bytes, 0), u16_at(bytes, 2)) else {
            break;
        };
        let len = usize::from(len);
        if len < NLA_HDRLEN || len > bytes.len() {
            return Err(NftError::Malformed(format!(
                "an attribute of {len} bytes where {} are left",
                bytes.len()
            )));
        }
        attributes.push((kind & !NLA_TYPE_FLAGS, &bytes[NLA_HDRLEN..len]));
        bytes = bytes
            .get(len.next_multiple_of(NLA_ALIGNTO)..)
            .unwrap_or(&[]);
    }
    Ok(attributes)
}

/// The kernel's answers in `datagram`: for each `NLMSG_ERROR`, the sequence number it answers and
/// its errno (positive; 0 is an acknowledgement). Other messages are skipped.
fn answers(datagram: &[u8]) -> Result<Vec<(u32, i32)>, NftError> {
    let mut answers = Vec::new();
    for message in messages(datagram)? {
        if message.kind != NLMSG_ERROR {
            continue;
        }
        let error = u32_at(message.payload, 0)
            .map(|error| i32::from_ne_bytes(error.to_ne_bytes()))
            .ok_or_else(|| {
                NftError::Malformed(format!(
                    "an error message of {} bytes",
                    message.payload.len()
                ))
            })?;
        answers.push((message.seq, error.saturating_neg()));
    }
    Ok(answers)
}

/// Whether the answers to `batch` are all in: each message between its begin and end answered, or
/// the begin or end refused (the batch as a whole: then the others may not be answered).
fn complete(batch: &Batch, answers: &[(u32, i32)]) -> bool {
    let last = u32::try_from(batch.len().saturating_sub(1)).unwrap_or(u32::MAX);
    if answers
        .iter()
        .any(|&(seq, errno)| errno != 0 && (seq == 0 || seq == last))
    {
        return true;
    }
    (1..last).all(|seq| answers.iter().any(|&(answered, _)| answered == seq))
}

/// What the answers say of `batch`: the first message refused (in the batch's order), or the first
/// message not answered, or that it applied.
fn outcome(batch: &Batch, answers: &[(u32, i32)]) -> Result<(), NftError> {
    if let Some(&(seq, errno)) = answers
        .iter()
        .filter(|(_, errno)| *errno != 0)
        .min_by_key(|(seq, _)| *seq)
    {
        return Err(NftError::Refused {
            message: batch.name(seq),
            errno,
        });
    }
    let last = u32::try_from(batch.len().saturating_sub(1)).unwrap_or(u32::MAX);
    if let Some(seq) = (1..last).find(|seq| !answers.iter().any(|(answered, _)| answered == seq)) {
        return Err(NftError::Unanswered {
            message: batch.name(seq),
        });
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Talking to the kernel.

fn socket_error(what: &'static str) -> impl FnOnce(Errno) -> NftError {
    move |errno| NftError::Socket {
        what,
        source: errno.into(),
    }
}

/// A netlink socket of `protocol` (`None`: `NETLINK_ROUTE`) in the calling thread's network
/// namespace, bound to a port the kernel picks, whose reads wait at most [`ANSWER_TIMEOUT`].
fn netlink_socket(protocol: Option<rustix::net::Protocol>) -> Result<OwnedFd, NftError> {
    let socket = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        protocol,
    )
    .map_err(socket_error("opening it"))?;
    rustix::net::bind(&socket, &SocketAddrNetlink::new(0, 0))
        .map_err(socket_error("binding it"))?;
    sockopt::set_socket_timeout(&socket, Timeout::Recv, Some(ANSWER_TIMEOUT))
        .map_err(socket_error("setting its receive timeout"))?;
    Ok(socket)
}

/// Makes a socket buffer hold at least `size` bytes: beyond the system's limit where the caller may
/// (`CAP_NET_ADMIN`), else up to it. The kernel refuses a datagram larger than the send buffer, and
/// drops answers that do not fit the receive buffer (which [`apply`] then reports).
fn grow_buffer(socket: &OwnedFd, send: bool, size: usize) {
    let current = if send {
        sockopt::socket_send_buffer_size(socket)
    } else {
        sockopt::socket_recv_buffer_size(socket)
    };
    if current.is_ok_and(|current| current >= size) {
        return;
    }
    // The kernel doubles what it is given (for its bookkeeping), and reports the doubled size.
    let forced = if send {
        sockopt::set_socket_send_buffer_size_force(socket, size)
    } else {
        sockopt::set_socket_recv_buffer_size_force(socket, size)
    };
    if forced.is_err() {
        // Up to the system's limit; a send that still does not fit fails, and says so.
        let _ = if send {
            sockopt::set_socket_send_buffer_size(socket, size)
        } else {
            sockopt::set_socket_recv_buffer_size(socket, size)
        };
    }
}

fn send_all(socket: &OwnedFd, bytes: &[u8], what: &'static str) -> Result<(), NftError> {
    let sent = rustix::net::sendto(
        socket,
        bytes,
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )
    .map_err(socket_error(what))?;
    if sent != bytes.len() {
        return Err(NftError::Socket {
            what,
            source: std::io::Error::other(format!("{sent} of {} bytes sent", bytes.len())),
        });
    }
    Ok(())
}

/// Receives one datagram into `buffer`: its length, or `None` when none came (within the timeout,
/// or at once with `DONTWAIT`).
fn receive(
    socket: &OwnedFd,
    buffer: &mut [u8],
    flags: RecvFlags,
) -> Result<Option<usize>, NftError> {
    loop {
        match rustix::net::recv(socket, &mut *buffer, flags | RecvFlags::TRUNC) {
            Ok((_, full)) if full > buffer.len() => {
                return Err(NftError::Malformed(format!(
                    "an answer of {full} bytes, larger than the {} expected at most",
                    buffer.len()
                )));
            }
            Ok((received, _)) => return Ok(Some(received)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(None),
            Err(errno) => return Err(socket_error("receiving the kernel's answers")(errno)),
        }
    }
}

/// Sends `batch` to nf_tables in the calling thread's network namespace and reads the kernel's
/// answer to each of its messages: `Ok` when it applied (the kernel acknowledged every message), the
/// first message it refused otherwise (then nothing of the batch applied). A few system calls, well
/// under a millisecond; it blocks (only a kernel that does not answer makes it wait, up to
/// [`ANSWER_TIMEOUT`]). Needs `CAP_NET_ADMIN`.
pub(crate) fn apply(batch: &Batch) -> Result<(), NftError> {
    let socket = netlink_socket(Some(netlink::NETFILTER))?;
    grow_buffer(&socket, true, batch.bytes.len() + SOCKET_BUFFER_SLACK);
    grow_buffer(
        &socket,
        false,
        batch.len() * ANSWER_ROOM + SOCKET_BUFFER_SLACK,
    );
    send_all(&socket, &batch.bytes, "sending the nf_tables batch")?;
    let mut buffer = vec![0; RECEIVE_BUFFER];
    let mut answered = Vec::new();
    // Until every message is answered (the kernel writes the answers while it reads the batch, so
    // they are all there), then whatever else is there without waiting.
    let mut flags = RecvFlags::empty();
    loop {
        if flags.is_empty() && complete(batch, &answered) {
            flags = RecvFlags::DONTWAIT;
        }
        let Some(received) = receive(&socket, &mut buffer, flags)? else {
            break;
        };
        answered.extend(answers(&buffer[..received])?);
    }
    outcome(batch, &answered)
}

/// The `RTM_GETLINK` request for the interface `name`.
fn link_request(name: &str) -> Vec<u8> {
    let mut request = Vec::new();
    request.extend_from_slice(&[0; 4]); // The length, below.
    request.extend_from_slice(&RTM_GETLINK.to_ne_bytes());
    request.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    request.extend_from_slice(&1u32.to_ne_bytes()); // Sequence number.
    request.extend_from_slice(&0u32.to_ne_bytes()); // Port ID: the kernel's.
    request.extend_from_slice(&[0; IFINFOMSG_LEN]); // Any family, index 0: by name.
    let mut too_large = false;
    Attrs {
        out: &mut request,
        too_large: &mut too_large,
    }
    .string(IFLA_IFNAME, name);
    let len = u32::try_from(request.len()).unwrap_or(u32::MAX);
    request[..4].copy_from_slice(&len.to_ne_bytes());
    request
}

/// The link `interface` as the kernel's answer `datagram` describes it; `None` when the datagram
/// holds no answer.
fn parse_link(interface: &str, datagram: &[u8]) -> Result<Option<Link>, NftError> {
    let wrong = |why: String| NftError::Interface {
        interface: interface.to_owned(),
        why,
    };
    for message in messages(datagram)? {
        match message.kind {
            NLMSG_ERROR => {
                let errno = u32_at(message.payload, 0)
                    .map(|error| i32::from_ne_bytes(error.to_ne_bytes()).saturating_neg())
                    .ok_or_else(|| {
                        NftError::Malformed(format!(
                            "an error message of {} bytes",
                            message.payload.len()
                        ))
                    })?;
                if errno == 0 {
                    continue;
                }
                if errno == Errno::NODEV.raw_os_error() {
                    return Err(wrong("no such interface".to_owned()));
                }
                return Err(wrong(format!("looking it up: {}", errno_text(errno))));
            }
            RTM_NEWLINK => {
                let (Some(link_type), Some(index)) =
                    (u16_at(message.payload, 2), u32_at(message.payload, 4))
                else {
                    return Err(NftError::Malformed(format!(
                        "a link message of {} bytes",
                        message.payload.len()
                    )));
                };
                let attributes = attributes(message.payload.get(IFINFOMSG_LEN..).unwrap_or(&[]))?;
                let mac = attributes
                    .iter()
                    .find(|(kind, _)| *kind == IFLA_ADDRESS)
                    .and_then(|(_, address)| Mac::try_from(*address).ok());
                let Some(mac) = mac.filter(|_| link_type == ARPHRD_ETHER) else {
                    return Err(wrong(format!(
                        "not an Ethernet interface (link type {link_type})"
                    )));
                };
                return Ok(Some(Link {
                    name: interface.to_owned(),
                    index,
                    mac,
                }));
            }
            _ => {}
        }
    }
    Ok(None)
}

/// The interface `interface` of the calling thread's network namespace (through `RTM_GETLINK`, so
/// that it is the namespace's own also where `/sys` is another's): its index and MAC address; an
/// error when there is none of that name, or it is not an Ethernet interface.
pub(crate) fn link(interface: &str) -> Result<Link, NftError> {
    check_name("interface", interface, IFNAME_MAX)?;
    let socket = netlink_socket(None)?;
    send_all(
        &socket,
        &link_request(interface),
        "asking for the interface",
    )?;
    let mut buffer = vec![0; RECEIVE_BUFFER];
    loop {
        let Some(received) = receive(&socket, &mut buffer, RecvFlags::empty())? else {
            return Err(NftError::Interface {
                interface: interface.to_owned(),
                why: format!("the kernel did not answer within {ANSWER_TIMEOUT:?}"),
            });
        };
        if let Some(link) = parse_link(interface, &buffer[..received])? {
            return Ok(link);
        }
    }
}

// ------------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    const OURS: Mac = [0x02, 0, 0, 0, 0, 0x01];
    const OLD: Mac = [0x02, 0, 0, 0, 0, 0x02];
    const VIP4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 100));
    const VIP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x100));
    const TIMEOUT: Duration = Duration::from_secs(300);

    fn eth0() -> Link {
        Link {
            name: "eth0".to_owned(),
            index: 2,
            mac: OURS,
        }
    }

    /// A message of a batch, read back.
    #[derive(Debug)]
    struct Read {
        /// `NEWTABLE`, `BEGIN`... and the family's name.
        kind: String,
        family: u8,
        res_id: u16,
        flags: u16,
        seq: u32,
        /// Top-level attributes.
        attrs: Vec<(u16, Vec<u8>)>,
    }

    impl Read {
        fn attr(&self, kind: u16) -> &[u8] {
            self.attrs
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, v)| v.as_slice())
                .unwrap_or_else(|| panic!("{} has no attribute {kind}", self.kind))
        }

        fn string(&self, kind: u16) -> String {
            string(self.attr(kind))
        }

        fn be32(&self, kind: u16) -> u32 {
            be32(self.attr(kind))
        }

        /// The rule's expressions, as `nft --debug=netlink` shows them (data in bytes, in order).
        fn expressions(&self) -> Vec<String> {
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

    fn string(bytes: &[u8]) -> String {
        let text = bytes.strip_suffix(&[0]).expect("NUL-terminated");
        String::from_utf8(text.to_vec()).unwrap()
    }

    fn be32(bytes: &[u8]) -> u32 {
        u32::from_be_bytes(bytes.try_into().expect("4 bytes"))
    }

    fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> &'a [u8] {
        attrs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no attribute {kind} in {attrs:?}"))
    }

    fn hex(bytes: &[u8]) -> String {
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
    fn read(batch: &Batch) -> Vec<Read> {
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

    fn kinds(batch: &Batch) -> Vec<String> {
        read(batch).into_iter().map(|m| m.kind).collect()
    }

    fn rules(batch: &Batch) -> Vec<Vec<String>> {
        read(batch)
            .iter()
            .filter(|m| m.kind.starts_with("NEWRULE"))
            .map(Read::expressions)
            .collect()
    }

    fn strings(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|line| line.to_string()).collect()
    }

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
    fn every_message_asks_for_an_ack_and_is_numbered_in_order() {
        let batch =
            forward_old_flows_batch("t", &eth0(), &[(VIP4, OLD), (VIP6, OLD)], TIMEOUT, 65_535)
                .unwrap();
        let read = read(&batch);
        for (n, message) in read.iter().enumerate() {
            assert_eq!(message.seq as usize, n);
            assert_ne!(message.flags & NLM_F_ACK, 0, "{}", message.kind);
            assert_ne!(message.flags & NLM_F_REQUEST, 0, "{}", message.kind);
        }
        for control in [&read[0], &read[read.len() - 1]] {
            assert_eq!(control.res_id, NFNL_SUBSYS_NFTABLES);
            assert_eq!(control.family, NFPROTO_UNSPEC);
        }
        assert!(read[1..read.len() - 1].iter().all(|m| m.res_id == 0));
        assert_eq!(batch.bytes().len() % 4, 0);
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

    /// An answer of the kernel's, as it writes it: `NLMSG_ERROR`, the errno (negative), the header of
    /// the message answered.
    fn answer(seq: u32, errno: i32) -> Vec<u8> {
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
    fn the_answers_say_which_message_was_refused() {
        let batch = forward_old_flows_batch("ccm_ho_fwd", &eth0(), &[(VIP4, OLD)], TIMEOUT, 65_535)
            .unwrap();
        let all_acked: Vec<(u32, i32)> = (1..9).map(|seq| (seq, 0)).collect();
        assert!(complete(&batch, &all_acked));
        assert!(outcome(&batch, &all_acked).is_ok());

        // Two answers in one datagram: the chain refused (ENOENT, a missing device), then a rule.
        let mut datagram = answer(5, 2);
        datagram.extend(answer(6, 22));
        let mut answered = answers(&datagram).unwrap();
        assert_eq!(answered, [(5, 2), (6, 22)]);
        answered.extend((1..5).chain(7..9).map(|seq| (seq, 0)));
        assert!(complete(&batch, &answered));
        let err = outcome(&batch, &answered).unwrap_err();
        assert!(
            matches!(&err, NftError::Refused { message, errno: 2 } if message.contains("chain ingress (hook ingress on eth0, priority -500)")),
            "{err}"
        );
        assert!(
            err.to_string().contains("No such file or directory"),
            "{err}"
        );

        // The batch as a whole (no CAP_NET_ADMIN: the kernel answers its begin only).
        let answered = answers(&answer(0, 1)).unwrap();
        assert!(complete(&batch, &answered));
        let err = outcome(&batch, &answered).unwrap_err();
        assert!(
            err.to_string().contains("the batch as a whole")
                && err.to_string().contains("CAP_NET_ADMIN is needed"),
            "{err}"
        );

        // A message not answered.
        let some: Vec<(u32, i32)> = (1..8).map(|seq| (seq, 0)).collect();
        assert!(!complete(&batch, &some));
        let err = outcome(&batch, &some).unwrap_err();
        assert!(
            matches!(&err, NftError::Unanswered { message } if message.contains("rule 3")),
            "{err}"
        );
        // Acknowledgements of the begin and end (kernels since 6.10 send them) change nothing.
        let mut with_controls = all_acked.clone();
        with_controls.extend([(0, 0), (9, 0)]);
        assert!(outcome(&batch, &with_controls).is_ok());
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        for datagram in [
            &[1u8, 2, 3][..],
            &[8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &[200, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &answer(1, 0)[..20],
        ] {
            let result = answers(datagram);
            assert!(matches!(result, Err(NftError::Malformed(_))), "{result:?}");
        }
        // An answer that is not an error message is skipped.
        let mut done = answer(1, 0);
        done[4..6].copy_from_slice(&3u16.to_ne_bytes());
        assert_eq!(answers(&done).unwrap(), []);
    }

    /// The kernel's `RTM_NEWLINK` answer for an interface.
    fn newlink(link_type: u16, index: u32, address: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&[0, 0]);
        payload.extend_from_slice(&link_type.to_ne_bytes());
        payload.extend_from_slice(&index.to_ne_bytes());
        payload.extend_from_slice(&[0; 8]);
        let mut too_large = false;
        let mut attrs = Attrs {
            out: &mut payload,
            too_large: &mut too_large,
        };
        attrs.u32(13, 1500); // IFLA_MTU, whatever its byte order.
        attrs.bytes(IFLA_ADDRESS, address);
        attrs.string(IFLA_IFNAME, "eth0");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
        bytes.extend_from_slice(&[0; 10]);
        bytes.extend(payload);
        bytes
    }

    #[test]
    fn a_link_is_read_from_the_kernels_answer() {
        assert_eq!(
            parse_link("eth0", &newlink(ARPHRD_ETHER, 7, &OURS)).unwrap(),
            Some(Link {
                name: "eth0".to_owned(),
                index: 7,
                mac: OURS
            })
        );
        for (answer, expected) in [
            (
                newlink(772, 1, &[0; 6]),
                "not an Ethernet interface (link type 772)",
            ),
            (
                newlink(ARPHRD_ETHER, 1, &[1, 2]),
                "not an Ethernet interface",
            ),
            (answer(1, 19), "eth0: no such interface"),
            (answer(1, 1), "CAP_NET_ADMIN is needed"),
        ] {
            let err = parse_link("eth0", &answer).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
        assert_eq!(parse_link("eth0", &[]).unwrap(), None);
        let request = link_request("eth0");
        let read = messages(&request).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].kind, RTM_GETLINK);
        let attrs = attributes(&read[0].payload[IFINFOMSG_LEN..]).unwrap();
        assert_eq!(attrs, [(IFLA_IFNAME, &b"eth0\0"[..])]);
    }
}
