//! The side of the leader that stops: it serves its VIPs until the next leader claims them, then stops
//! answering for them and lets its open connections finish.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use super::tables::QuietTables;
use crate::{Inner, conflict::ConflictWatch};

/// How long a leader that stops serves its VIPs while it waits for the next leader to claim them: the
/// next one takes the released Lease at its next try (`--leader-elect-retry-period`, 2 s by default),
/// starts, and announces every VIP as it ensures its load balancer.
pub(crate) const SUCCESSOR_WAIT: Duration = Duration::from_secs(10);

/// How long the stopping leader still accepts new connections once the next leader has claimed the
/// VIPs: a neighbour that missed the claim's announcement still sends here for a moment.
pub(crate) const ACCEPT_AFTER_CLAIM: Duration = Duration::from_secs(1);

/// How the hand-off ended, for the log and the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Given {
    /// Another host claimed the VIPs; this one kept its open connections to the end of the drain.
    Claimed,
    /// Nobody claimed them in [`SUCCESSOR_WAIT`] (no other replica, or it is slow): they came off, and
    /// the open connections drained as on any stop.
    Unclaimed,
    /// There was nothing to hand over (no VIP on the interface).
    Nothing,
}

/// Hands the VIPs `inner` holds to the next leader: serves them until another host claims one (at
/// most [`SUCCESSOR_WAIT`]), then stops announcing and answering for them (the addresses stay, so the
/// packets of the open connections that the next leader forwards here still reach their sockets),
/// accepts for [`ACCEPT_AFTER_CLAIM`] more, and lets the connections finish within the drain time.
/// Then the VIPs come off. Whatever fails on the way ends the way a leader stopped before hand-offs:
/// VIPs off at once, then the drain.
pub(crate) async fn give_away(inner: &std::sync::Arc<Inner>) -> Given {
    let Some(addresses) = &inner.addresses else {
        return Given::Nothing;
    };
    let held: BTreeSet<IpAddr> = addresses.held();
    if held.is_empty() {
        return Given::Nothing;
    }
    let interface = addresses.interface().to_owned();
    let defended = held.clone();
    let claim = match ConflictWatch::start(&interface, move || defended.clone()) {
        Ok(mut watch) => {
            tracing::info!(%interface, vips = held.len(), wait = ?SUCCESSOR_WAIT, "leader hand-off: serving the VIPs until the next leader claims them");
            tokio::time::timeout(SUCCESSOR_WAIT, watch.claim()).await
        }
        Err(err) => {
            tracing::warn!(%interface, error = %err, "leader hand-off: cannot watch for the next leader's claim; taking the VIPs off now");
            return stop_as_before(inner).await;
        }
    };
    let claim = match claim {
        Ok(Ok(claim)) => claim,
        Ok(Err(why)) => {
            tracing::warn!(%interface, "leader hand-off: the watch for the next leader's claim stopped ({why}); taking the VIPs off now");
            return stop_as_before(inner).await;
        }
        Err(_) => {
            tracing::info!(%interface, wait = ?SUCCESSOR_WAIT, "leader hand-off: no other host claimed the VIPs; taking them off, then letting the open connections finish");
            return stop_as_before(inner).await;
        }
    };
    addresses.go_quiet().await;
    let quiet = {
        let (interface, held) = (interface.clone(), held.clone());
        super::blocking(move || QuietTables::install(&interface, &held)).await
    };
    let quiet = match quiet {
        Ok(quiet) => quiet,
        Err(err) => {
            tracing::warn!(%interface, error = %err, "leader hand-off: cannot stop answering for the VIPs; taking them off now rather than answer beside the next leader");
            return stop_as_before(inner).await;
        }
    };
    tracing::info!(%interface, drain = ?inner.load_balancer_in_force.drain_timeout.0, "leader hand-off: {claim}; no longer answering for the VIPs, letting the open connections finish (the next leader forwards their packets here)");
    tokio::time::sleep(ACCEPT_AFTER_CLAIM).await;
    inner.data_plane.shutdown().await;
    vips_off(inner).await;
    drop(quiet);
    Given::Claimed
}

/// The stop of a leader that hands nothing over: the VIPs come off, then the data plane drains.
async fn stop_as_before(inner: &std::sync::Arc<Inner>) -> Given {
    vips_off(inner).await;
    inner.data_plane.shutdown().await;
    Given::Unclaimed
}

/// Takes every VIP off the interface (a blocking netlink exchange, off the runtime's threads).
async fn vips_off(inner: &std::sync::Arc<Inner>) {
    let inner = inner.clone();
    let removed = super::blocking(move || {
        if let Some(addresses) = &inner.addresses {
            addresses.remove_all_now();
        }
        Ok::<(), std::convert::Infallible>(())
    })
    .await;
    if let Err(err) = removed {
        tracing::warn!(error = %err, "leader hand-off: taking the VIPs off: {err}");
    }
}
