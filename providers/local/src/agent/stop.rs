//! The agent's stop: a successor on this node (a rolling update) gets the listening sockets, the
//! membership and the BFD port, and the VIPs stay; otherwise the routes and the VIPs are withdrawn,
//! the heartbeat deleted and the membership left. Either way the data plane drains.

use tokio::task::JoinHandle;

use super::{handover, heartbeat::Heartbeat, look::Agent};
use crate::{Error, LocalCloud};

/// Stops `agent` (its loop ended, with `failure` if it failed).
pub(super) async fn finish(
    mut agent: Agent,
    cloud: &LocalCloud,
    mut point: Option<handover::Point>,
    failure: Option<Error>,
    beating: JoinHandle<Heartbeat>,
) -> Result<(), Error> {
    // The removals under way go on beside the data plane's shutdown, which drains them too.
    agent.draining.detach_all();
    // A successor waits on this node (a rolling update): it gets the listening sockets and the
    // membership socket, and this agent leaves the VIPs, the heartbeat and the membership to it.
    let successors = match (&mut point, &failure) {
        (Some(point), None) => point.successors(),
        _ => Vec::new(),
    };
    if let Some(point) = point.as_ref().filter(|_| !successors.is_empty()) {
        hand_over(agent, cloud, point, successors, beating).await;
        return Ok(());
    }
    tracing::info!(from = %agent.announcer.describe(), "local-agent: stopping; withdrawing the VIPs");
    // The routes first (each router drops this node's at once), then the addresses.
    agent.stop_bgp_sessions(false).await;
    agent.withdraw_all_now();
    agent.metrics.set_announced([].iter());
    let heartbeat = beating.await.ok();
    if let Some(heartbeat) = heartbeat {
        heartbeat.release().await;
    }
    if let Some(membership) = agent.membership.take() {
        membership.stopped().await;
    }
    cloud.inner.data_plane.shutdown().await;
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Hands the listening sockets, the membership and the BFD port over to the `successors` waiting at
/// `point`; the VIPs stay on the interface and the BGP sessions close without a NOTIFICATION. When the
/// hand-over fails, the VIPs and routes are withdrawn and the heartbeat released, as if this agent had
/// been killed. Either way the data plane drains.
async fn hand_over(
    mut agent: Agent,
    cloud: &LocalCloud,
    point: &handover::Point,
    successors: Vec<std::os::fd::OwnedFd>,
    beating: JoinHandle<Heartbeat>,
) {
    let heartbeat = beating.await.ok();
    let membership = match agent.membership.take() {
        Some(membership) => membership.hand_over().await,
        None => None,
    };
    let handed = handover::Handed {
        listeners: cloud.inner.data_plane.hand_over().unwrap_or_else(|err| {
            tracing::error!(error = %err, "cannot copy the listening sockets to hand them over");
            Vec::new()
        }),
        membership,
        bfd: agent
            .speaker
            .as_ref()
            .map(|(speaker, _)| speaker.bfd_handover())
            .unwrap_or_default(),
    };
    match point.hand_over(successors, &handed).await {
        Ok(()) => {
            tracing::info!(
                listeners = handed.listeners.len(),
                "local-agent: handed over to the agent that replaces this one (its VIPs stay on the interface); draining this process's connections"
            );
            agent.metrics.set_announced([].iter());
            agent.metrics.handovers_given.inc();
            // The BGP sessions are the process's own: closed without a NOTIFICATION, so that routers
            // doing graceful restart keep this node's routes until the successor's sessions send them
            // again (others send its share elsewhere meanwhile); the VIPs stay on.
            agent.stop_bgp_sessions(true).await;
            drop(handed);
        }
        Err(err) => {
            // The heartbeat and the membership are stopped already: the others see this node go
            // within the failover time, as if it had been killed.
            tracing::warn!(error = %err, "local-agent: the hand-over failed; withdrawing the VIPs");
            agent.stop_bgp_sessions(false).await;
            agent.withdraw_all_now();
            agent.metrics.set_announced([].iter());
            if let Some(heartbeat) = heartbeat {
                heartbeat.release().await;
            }
        }
    }
    cloud.inner.data_plane.shutdown().await;
}
