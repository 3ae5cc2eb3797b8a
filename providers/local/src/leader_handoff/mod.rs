//! The hand-off of the VIPs from a leader that stops gracefully to the next one (leader mode with
//! `vipInterface`), so that a rolling update of the manager cuts no connection open through it.
//!
//! The two leaders are on different hosts of one L2 segment, and each VIP moves from one to the other.
//! What was open through the old one has its sockets there, and a client's packets of it now reach the
//! new one (the VIP moved), whose kernel would answer them with a reset. So, for the old one's drain
//! time:
//!
//! 1. **The old leader** ([`giving`]), after its controllers stopped and its Lease was released, keeps
//!    serving its VIPs until another host claims one (the next leader announces it, or answers a probe
//!    for it), at most [`SUCCESSOR_WAIT`]. Then it stops announcing them and answering ARP requests and
//!    neighbour solicitations for them (and asks for its clients' MAC addresses from 0.0.0.0 and its
//!    link-local address, not from a VIP) but keeps them on its interface, accepts for
//!    [`ACCEPT_AFTER_CLAIM`] more, closes its listeners, lets its connections finish within
//!    `loadBalancer.drainTimeout`, and takes the VIPs off. Nobody claimed them in time: they come off
//!    at once and the connections drain as before.
//! 2. **The new leader** ([`taking`]), before its controllers put any VIP on its interface, asks who
//!    has each VIP it takes over (a probe, as duplicate address detection asks). For each VIP another
//!    host answers for, it forwards to that host's MAC address the TCP packets of every connection that
//!    did not begin here (a `netdev` ingress table: a SYN to the VIP marks its flow as this host's;
//!    any other TCP packet to the VIP of a flow not marked goes back out to the old holder), for the
//!    old holder's whole hand-off. It binds its listeners before it announces each VIP, so no client is
//!    sent to it before it accepts.
//!
//! Both sides program the kernel's packet filter through netlink ([`nftables`]; `CAP_NET_ADMIN`,
//! which `vipInterface` needs already), and remove their tables when done, when the process stops,
//! and (what a process killed in the middle left) when a manager starts on that host. UDP is not
//! forwarded: a UDP flow of the old leader continues on the new one as a new flow.

mod giving;
mod metrics;
pub(crate) mod nftables;
mod tables;
mod taking;

use std::time::Duration;

pub(crate) use giving::{ACCEPT_AFTER_CLAIM, SUCCESSOR_WAIT, give_away};
pub(crate) use metrics::Metrics;
pub(crate) use taking::take_over;

/// Runs `work` (a netlink or `AF_PACKET` exchange, which blocks) off the runtime's threads; its
/// error, or the task's failure, as words.
async fn blocking<T, E>(work: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, String>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(|err| err.to_string()),
        Err(err) => Err(format!("the task failed: {err}")),
    }
}

/// How long the new leader forwards the old one's connections: the old one's longest hand-off after
/// the claim ([`SUCCESSOR_WAIT`] bounds when the claim comes), with the drain time of this leader's
/// configuration (the replicas share one).
pub(crate) fn forwarding_lifetime(drain_timeout: Duration) -> Duration {
    SUCCESSOR_WAIT + ACCEPT_AFTER_CLAIM + drain_timeout
}
