//! The kernel's constants that the other files use, copied from the headers named above each group
//! (netlink, nfnetlink, netfilter, nf_tables, rtnetlink, and those of links, Ethernet, IP, TCP and
//! ICMPv6).

// --- linux/netlink.h ---

/// The size of `struct nlmsghdr`.
pub(super) const NLMSG_HDRLEN: usize = 16;
/// The size of `struct nlattr`.
pub(super) const NLA_HDRLEN: usize = 4;
/// Netlink's alignment of messages and attributes (`NLMSG_ALIGNTO`, `NLA_ALIGNTO`).
pub(super) const NLA_ALIGNTO: usize = 4;
/// The message type of an error or acknowledgement (`struct nlmsgerr`).
pub(super) const NLMSG_ERROR: u16 = 2;
/// A request (every message to the kernel).
pub(super) const NLM_F_REQUEST: u16 = 0x1;
/// Asks for an acknowledgement, also of a message that succeeded.
pub(super) const NLM_F_ACK: u16 = 0x4;
/// Creates the object when it is not there (a `NEW` message).
pub(super) const NLM_F_CREATE: u16 = 0x400;
/// Adds the rule at the end of the chain.
pub(super) const NLM_F_APPEND: u16 = 0x800;
/// The attribute holds attributes.
pub(super) const NLA_F_NESTED: u16 = 0x8000;
/// The bits of `nla_type` that are flags, not the type (`NLA_F_NESTED | NLA_F_NET_BYTEORDER`).
pub(super) const NLA_TYPE_FLAGS: u16 = 0xc000;

// --- linux/netfilter/nfnetlink.h ---

/// Begins a batch (a transaction); `NLMSG_MIN_TYPE`.
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
/// Ends (commits) a batch.
pub(super) const NFNL_MSG_BATCH_END: u16 = 0x11;
/// nf_tables' subsystem: the high byte of its message types, and the `res_id` of its batches.
pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The version of `struct nfgenmsg`.
pub(super) const NFNETLINK_V0: u8 = 0;

// --- linux/netfilter.h ---

pub(super) const NFPROTO_UNSPEC: u8 = 0;
pub(super) const NFPROTO_ARP: u8 = 3;
pub(super) const NFPROTO_NETDEV: u8 = 5;
pub(super) const NFPROTO_IPV6: u8 = 10;
pub(super) const NF_DROP: u32 = 0;
pub(super) const NF_ACCEPT: u32 = 1;
/// `enum nf_inet_hooks`: packets for this host.
pub(super) const NF_INET_LOCAL_IN: u32 = 1;
/// `enum nf_inet_hooks`: packets this host sends.
pub(super) const NF_INET_LOCAL_OUT: u32 = 3;
/// `enum nf_dev_hooks`: packets as the interface receives them.
pub(super) const NF_NETDEV_INGRESS: u32 = 0;

// --- linux/netfilter_arp.h ---

/// ARP packets for this host.
pub(super) const NF_ARP_IN: u32 = 0;
/// `NF_ARP_OUT`, from `linux/netfilter_arp.h`.
pub(super) const NF_ARP_OUT: u32 = 1;

// --- linux/netfilter/nf_tables.h ---

pub(super) const NFT_MSG_NEWTABLE: u16 = 0;
pub(super) const NFT_MSG_DELTABLE: u16 = 2;
pub(super) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(super) const NFT_MSG_NEWRULE: u16 = 6;
pub(super) const NFT_MSG_NEWSET: u16 = 9;

/// `enum nft_registers`: the verdict register.
pub(super) const NFT_REG_VERDICT: u32 = 0;
/// The first 16-byte data register.
pub(super) const NFT_REG_1: u32 = 1;
/// The first 32-bit data register (the first word of `NFT_REG_1`).
pub(super) const NFT_REG32_00: u32 = 8;

pub(super) const NFTA_TABLE_NAME: u16 = 1;
pub(super) const NFTA_TABLE_FLAGS: u16 = 2;

pub(super) const NFTA_CHAIN_TABLE: u16 = 1;
pub(super) const NFTA_CHAIN_NAME: u16 = 3;
pub(super) const NFTA_CHAIN_HOOK: u16 = 4;
pub(super) const NFTA_CHAIN_POLICY: u16 = 5;
pub(super) const NFTA_CHAIN_TYPE: u16 = 7;

pub(super) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(super) const NFTA_HOOK_PRIORITY: u16 = 2;
pub(super) const NFTA_HOOK_DEV: u16 = 3;

pub(super) const NFTA_RULE_TABLE: u16 = 1;
pub(super) const NFTA_RULE_CHAIN: u16 = 2;
pub(super) const NFTA_RULE_EXPRESSIONS: u16 = 4;

pub(super) const NFTA_SET_TABLE: u16 = 1;
pub(super) const NFTA_SET_NAME: u16 = 2;
pub(super) const NFTA_SET_FLAGS: u16 = 3;
pub(super) const NFTA_SET_KEY_TYPE: u16 = 4;
pub(super) const NFTA_SET_KEY_LEN: u16 = 5;
pub(super) const NFTA_SET_DESC: u16 = 9;
pub(super) const NFTA_SET_ID: u16 = 10;
pub(super) const NFTA_SET_TIMEOUT: u16 = 11;
pub(super) const NFTA_SET_DESC_SIZE: u16 = 1;
/// `enum nft_set_flags`: elements expire.
pub(super) const NFT_SET_TIMEOUT: u32 = 0x10;
/// Elements are added from the packet path (`dynamic`).
pub(super) const NFT_SET_EVAL: u32 = 0x20;

pub(super) const NFTA_LIST_ELEM: u16 = 1;
pub(super) const NFTA_EXPR_NAME: u16 = 1;
pub(super) const NFTA_EXPR_DATA: u16 = 2;

pub(super) const NFTA_DATA_VALUE: u16 = 1;
pub(super) const NFTA_DATA_VERDICT: u16 = 2;
pub(super) const NFTA_VERDICT_CODE: u16 = 1;

pub(super) const NFTA_IMMEDIATE_DREG: u16 = 1;
pub(super) const NFTA_IMMEDIATE_DATA: u16 = 2;

pub(super) const NFTA_CMP_SREG: u16 = 1;
pub(super) const NFTA_CMP_OP: u16 = 2;
pub(super) const NFTA_CMP_DATA: u16 = 3;
/// `enum nft_cmp_ops`: equal.
pub(super) const NFT_CMP_EQ: u32 = 0;

pub(super) const NFTA_META_DREG: u16 = 1;
pub(super) const NFTA_META_KEY: u16 = 2;
/// `enum nft_meta_keys`: `skb->protocol` (the EtherType), 2 bytes, network byte order.
pub(super) const NFT_META_PROTOCOL: u32 = 1;
/// The input interface's `ARPHRD_*` type, 2 bytes, host byte order.
pub(super) const NFT_META_IIFTYPE: u32 = 8;
/// The transport protocol, 1 byte.
pub(super) const NFT_META_L4PROTO: u32 = 16;

pub(super) const NFTA_PAYLOAD_DREG: u16 = 1;
pub(super) const NFTA_PAYLOAD_BASE: u16 = 2;
pub(super) const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub(super) const NFTA_PAYLOAD_LEN: u16 = 4;
pub(super) const NFTA_PAYLOAD_SREG: u16 = 5;
pub(super) const NFTA_PAYLOAD_CSUM_FLAGS: u16 = 8;
/// `NFT_PAYLOAD_L4CSUM_PSEUDOHDR`: a write to an address updates the transport checksum's
/// pseudo-header sum.
pub(super) const NFT_PAYLOAD_L4CSUM_PSEUDOHDR: u32 = 1;
/// `enum nft_payload_bases`.
pub(super) const NFT_PAYLOAD_LL_HEADER: u32 = 0;
pub(super) const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub(super) const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

pub(super) const NFTA_BITWISE_SREG: u16 = 1;
pub(super) const NFTA_BITWISE_DREG: u16 = 2;
pub(super) const NFTA_BITWISE_LEN: u16 = 3;
pub(super) const NFTA_BITWISE_MASK: u16 = 4;
pub(super) const NFTA_BITWISE_XOR: u16 = 5;
pub(super) const NFTA_BITWISE_OP: u16 = 6;
/// `enum nft_bitwise_ops`: `(reg & mask) ^ xor`.
pub(super) const NFT_BITWISE_BOOL: u32 = 0;

pub(super) const NFTA_LOOKUP_SET: u16 = 1;
pub(super) const NFTA_LOOKUP_SREG: u16 = 2;
pub(super) const NFTA_LOOKUP_SET_ID: u16 = 4;

pub(super) const NFTA_DYNSET_SET_NAME: u16 = 1;
pub(super) const NFTA_DYNSET_SET_ID: u16 = 2;
pub(super) const NFTA_DYNSET_OP: u16 = 3;
pub(super) const NFTA_DYNSET_SREG_KEY: u16 = 4;
/// `enum nft_dynset_ops`: adds the element when it is not there (an existing one keeps its expiry).
pub(super) const NFT_DYNSET_OP_ADD: u32 = 0;
/// Adds the element, or refreshes the expiry of the existing one.
pub(super) const NFT_DYNSET_OP_UPDATE: u32 = 1;

pub(super) const NFTA_FWD_SREG_DEV: u16 = 1;

// --- linux/if_arp.h, linux/if_ether.h, linux/in.h, linux/in6.h, linux/tcp.h, netinet/icmp6.h ---

/// Ethernet, as a link type.
pub(super) const ARPHRD_ETHER: u16 = 1;
/// ARP's "who has" operation.
pub(super) const ARPOP_REQUEST: u16 = 1;
pub(super) const ETH_P_IP: u16 = 0x0800;
pub(super) const ETH_P_IPV6: u16 = 0x86dd;
/// The length of an Ethernet address.
pub(super) const ETH_ALEN: usize = 6;
pub(super) const IPPROTO_TCP: u8 = 6;
pub(super) const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6's neighbour solicitation (`ND_NEIGHBOR_SOLICIT`).
pub(super) const ND_NEIGHBOR_SOLICIT: u8 = 135;
/// The TCP header's flags byte: its offset, and the SYN and ACK bits.
pub(super) const TCP_FLAGS_OFFSET: u32 = 13;
pub(super) const TCP_FLAG_SYN: u8 = 0x02;
pub(super) const TCP_FLAG_ACK: u8 = 0x10;

// --- linux/rtnetlink.h, linux/if_link.h, linux/if.h ---

pub(super) const RTM_NEWLINK: u16 = 16;
pub(super) const RTM_GETLINK: u16 = 18;
/// The size of `struct ifinfomsg`.
pub(super) const IFINFOMSG_LEN: usize = 16;
pub(super) const IFLA_ADDRESS: u16 = 1;
pub(super) const IFLA_IFNAME: u16 = 3;
/// The longest interface name, without its terminating NUL (`IFNAMSIZ - 1`).
pub(super) const IFNAME_MAX: usize = 15;
/// The longest nf_tables name, without its terminating NUL (`NFT_NAME_MAXLEN - 1`).
pub(super) const NFT_NAME_MAX: usize = 255;
