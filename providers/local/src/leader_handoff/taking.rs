//! The side of the leader that starts: before it puts the VIPs on its interface, it asks who has them;
//! a host that answers is the leader before it, handing them off, and the packets of the connections
//! open through that host are forwarded to it until they have drained.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use tokio_util::sync::CancellationToken;

use super::tables::{self, ForwardTable};
use crate::conflict;

/// How long the new leader waits for the answers to its probes (hosts on one L2 segment answer within
/// a millisecond or two).
pub(crate) const PROBE_WAIT: Duration = Duration::from_millis(300);

/// Takes the VIPs `vips` over on `interface`: removes what a process of this host left behind (tables
/// of an earlier hand-off that was cut short), asks who has each VIP, and forwards the open TCP
/// connections of the hosts that answer to them for `lifetime` (then, or when `shutdown` is cancelled,
/// the forwarding table goes). Returns how many VIPs another host served. Anything that fails is
/// logged: the takeover goes on, and the connections open through the old leader end with it, as they
/// did before hand-offs.
pub(crate) async fn take_over(
    interface: &str,
    vips: BTreeSet<IpAddr>,
    lifetime: Duration,
    shutdown: CancellationToken,
) -> usize {
    let removed = super::blocking(tables::remove_leftovers).await;
    let why = "cannot remove the tables an earlier run left";
    warned(removed, interface, why);
    if vips.is_empty() {
        return 0;
    }
    let probed = {
        let interface = interface.to_owned();
        super::blocking(move || conflict::holders(&interface, &vips, PROBE_WAIT)).await
    };
    let why = "cannot ask who serves the VIPs now; connections open through the previous leader end with it";
    let Some(holders) = warned(probed, interface, why) else {
        return 0;
    };
    if holders.is_empty() {
        tracing::debug!(%interface, "leader hand-off: no other host serves the VIPs");
        return 0;
    }
    let installed = {
        let (interface, holders) = (interface.to_owned(), holders.clone());
        super::blocking(move || ForwardTable::install(&interface, &holders, lifetime)).await
    };
    let why = "cannot forward the previous leader's open connections to it; they end with it";
    let Some(table) = warned(installed, interface, why) else {
        return 0;
    };
    let described: Vec<String> = holders
        .iter()
        .map(|(ip, mac)| format!("{ip} at {}", tables::mac_text(mac)))
        .collect();
    tracing::info!(%interface, ?lifetime, "leader hand-off: the previous leader still serves {}; forwarding the packets of its open TCP connections to it", described.join(", "));
    // The table goes after `lifetime`, at shutdown, or when the runtime drops this task: the guard's
    // drop removes it in every case.
    // Unsupervised: the task only waits (nothing in it can panic).
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(lifetime) => {
                tracing::info!("leader hand-off: the previous leader's connections had their drain time; forwarding ends");
            }
            () = shutdown.cancelled() => {}
        }
        drop(table);
    });
    holders.len()
}

/// What `result` holds, or `None` once its error is logged as a warning: the hand-off `cannot …`.
fn warned<T, E: std::fmt::Display>(
    result: Result<T, E>,
    interface: &str,
    cannot: &str,
) -> Option<T> {
    result
        .inspect_err(|err| tracing::warn!(%interface, error = %err, "leader hand-off: {cannot}"))
        .ok()
}
