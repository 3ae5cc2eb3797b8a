//! Writing nf_tables batches in netlink: the [`Batch`], the [`Builder`] of its messages (tables,
//! chains, rules), the [`Attrs`] writer of their attributes, and the check of the names they take.

use std::fmt;

use super::{NftError, expr::Expr, uapi::*};

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

/// A netlink batch for nf_tables: `NFNL_MSG_BATCH_BEGIN`, the messages, `NFNL_MSG_BATCH_END`, each
/// with `NLM_F_ACK` and its index as sequence number; and what each message does, for the errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(super) bytes: Vec<u8>,
    messages: Vec<String>,
}

impl Batch {
    /// The bytes to send, in one datagram (for the tests; [`apply`] reads the field).
    ///
    /// [`apply`]: super::apply
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
    pub(super) fn name(&self, seq: u32) -> String {
        self.describe(seq)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("message {seq}, which the batch does not have"))
    }
}

pub(super) fn check_name(what: &str, name: &str, max: usize) -> Result<(), NftError> {
    if name.is_empty() || name.len() > max || name.contains('\0') {
        return Err(NftError::Invalid(format!(
            "the {what} name {name:?} (it must have 1 to {max} bytes, none of them NUL)"
        )));
    }
    Ok(())
}

/// Where a base chain hooks in.
pub(super) struct Hook<'a> {
    /// The hook's name in `nft`'s syntax (for the messages).
    pub(super) name: &'static str,
    /// Its number in its family (`NF_*`).
    pub(super) number: u32,
    pub(super) priority: i32,
    /// The interface, for the `netdev` family.
    pub(super) device: Option<&'a str>,
}

/// Writes a batch: every message gets `NLM_F_ACK` and its index as sequence number.
pub(super) struct Builder {
    bytes: Vec<u8>,
    messages: Vec<String>,
    /// An attribute or message outgrew its length field (cannot happen with checked names; checked
    /// all the same, rather than sending a wrong length).
    too_large: bool,
}

impl Builder {
    pub(super) fn new() -> Self {
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

    pub(super) fn finish(mut self) -> Result<Batch, NftError> {
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
    pub(super) fn nft(
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
    pub(super) fn replace_table(&mut self, family: Family, table: &str, create: bool) {
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

    /// A base chain of type `filter`, policy accept.
    pub(super) fn chain(&mut self, family: Family, table: &str, chain: &str, hook: Hook<'_>) {
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

    pub(super) fn rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        what: String,
        rule: &[Expr],
    ) {
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
pub(super) struct Attrs<'a> {
    pub(super) out: &'a mut Vec<u8>,
    pub(super) too_large: &'a mut bool,
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

    pub(super) fn bytes(&mut self, kind: u16, payload: &[u8]) {
        let start = self.open();
        self.out.extend_from_slice(payload);
        self.close(start, kind);
    }

    pub(super) fn string(&mut self, kind: u16, value: &str) {
        let start = self.open();
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(0);
        self.close(start, kind);
    }

    pub(super) fn u32(&mut self, kind: u16, value: u32) {
        self.bytes(kind, &value.to_be_bytes());
    }

    pub(super) fn u64(&mut self, kind: u16, value: u64) {
        self.bytes(kind, &value.to_be_bytes());
    }

    pub(super) fn nested(&mut self, kind: u16, body: impl FnOnce(&mut Self)) {
        let start = self.open();
        body(self);
        self.close(start, kind | NLA_F_NESTED);
    }

    /// `struct nft_data` holding `value`.
    pub(super) fn data(&mut self, kind: u16, value: &[u8]) {
        self.nested(kind, |attrs| attrs.bytes(NFTA_DATA_VALUE, value));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        forward_old_flows_batch,
        tests::{OLD, TIMEOUT, VIP4, VIP6, eth0, read},
    };
    use super::*;

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
}
