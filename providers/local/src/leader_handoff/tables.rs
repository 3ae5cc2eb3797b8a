//! The two sides' packet-filter tables ([`super::nftables`]), each removed when its guard is dropped
//! (also when the runtime drops the task that holds it, as a process stops).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use super::nftables::{self, Family, Mac, NftError};

pub(crate) use super::nftables::mac_text;

/// The new leader's `netdev` table: forwards the old holders' connections.
const FORWARD_TABLE: &str = "ccm_local_handoff_forward";

/// The old leader's `arp` and `ip6` tables: no answers for the VIPs it gave away.
const QUIET_TABLE: &str = "ccm_local_handoff_quiet";

/// The most connections opened on the new leader during one hand-off that its forwarding table
/// remembers (one more goes to the old leader, which still serves it).
const MAX_FLOWS: u32 = 1 << 20;

/// The new leader's forwarding of the connections open through the old holders of its VIPs.
#[derive(Debug)]
pub(crate) struct ForwardTable;

impl ForwardTable {
    /// Installs it on `interface`, for the VIPs of `holders` (each to its holder's MAC address), a
    /// connection begun here remembered for `lifetime` after its last packet. Blocks (netlink).
    pub(crate) fn install(
        interface: &str,
        holders: &BTreeMap<IpAddr, Mac>,
        lifetime: Duration,
    ) -> Result<Self, NftError> {
        let link = nftables::link(interface)?;
        let holders: Vec<(IpAddr, Mac)> = holders.iter().map(|(ip, mac)| (*ip, *mac)).collect();
        let batch =
            nftables::forward_old_flows_batch(FORWARD_TABLE, &link, &holders, lifetime, MAX_FLOWS)?;
        nftables::apply(&batch)?;
        Ok(Self)
    }
}

impl Drop for ForwardTable {
    fn drop(&mut self) {
        remove(Family::Netdev, FORWARD_TABLE);
    }
}

/// The old leader's silence about the VIPs it gave away.
#[derive(Debug)]
pub(crate) struct QuietTables;

impl QuietTables {
    /// Stops this host answering ARP requests and neighbour solicitations for `vips` on `interface`
    /// (and asking from them). Blocks (netlink).
    pub(crate) fn install(interface: &str, vips: &BTreeSet<IpAddr>) -> Result<Self, NftError> {
        let vips: Vec<IpAddr> = vips.iter().copied().collect();
        let link_local = if vips.iter().any(IpAddr::is_ipv6) {
            nftables::link_local(interface)?
        } else {
            None
        };
        if link_local.is_none() && vips.iter().any(IpAddr::is_ipv6) {
            tracing::warn!(%interface, "leader hand-off: the interface has no link-local address: this host's neighbour solicitations still come from the IPv6 VIPs it gives away");
        }
        nftables::apply(&nftables::quiet_neighbour_answers_batch(
            QUIET_TABLE,
            &vips,
            link_local,
        )?)?;
        Ok(Self)
    }
}

impl Drop for QuietTables {
    fn drop(&mut self) {
        remove(Family::Arp, QUIET_TABLE);
        remove(Family::Ipv6, QUIET_TABLE);
    }
}

/// Removes the tables a process of this host left (killed in the middle of a hand-off): a quiet
/// table left would keep this host from answering for a VIP it serves again. Blocks (netlink).
pub(crate) fn remove_leftovers() -> Result<(), NftError> {
    for (family, table) in [
        (Family::Netdev, FORWARD_TABLE),
        (Family::Arp, QUIET_TABLE),
        (Family::Ipv6, QUIET_TABLE),
    ] {
        nftables::apply(&nftables::delete_table_batch(family, table)?)?;
    }
    Ok(())
}

fn remove(family: Family, table: &str) {
    let removed = nftables::delete_table_batch(family, table).and_then(|b| nftables::apply(&b));
    if let Err(err) = removed {
        tracing::warn!(%family, table, error = %err, "leader hand-off: cannot remove the table");
    }
}
