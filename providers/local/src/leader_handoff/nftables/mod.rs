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

mod decode;
mod delete_table;
mod encode;
mod error;
mod expr;
mod forward_old_flows;
mod interface;
mod kernel;
mod quiet_neighbour_answers;
mod socket;
#[cfg(test)]
mod tests;
mod uapi;

pub(crate) use delete_table::delete_table_batch;
pub(crate) use encode::{Batch, Family};
pub(crate) use error::NftError;
pub(crate) use forward_old_flows::forward_old_flows_batch;
pub(crate) use interface::{Link, Mac, link, link_local, mac_text};
pub(crate) use kernel::apply;
pub(crate) use quiet_neighbour_answers::quiet_neighbour_answers_batch;
