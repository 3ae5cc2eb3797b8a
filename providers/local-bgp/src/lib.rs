//! A BGP speaker for the `local` provider's node agents: it announces load-balancer VIPs to routers
//! as host routes (`/32`, `/128`) with the node as next hop, so that the routers spread each VIP's
//! traffic over every node that serves it (ECMP) and route around a node that is gone.
//!
//! A [`Peer`] is one router: it connects (RFC 4271, active side), negotiates 4-octet AS numbers
//! (RFC 6793), IPv4 and IPv6 unicast (RFC 4760) and route refresh (RFC 2918), keeps the router's
//! table equal to the [`Routes`] it is given (withdrawals and announcements, each sent once: a change
//! that changes nothing sends nothing), answers ROUTE-REFRESH, and starts again with back-off when the
//! session ends. With graceful restart (RFC 4724, [`PeerConfig::graceful_restart`]) a speaker that
//! restarts ([`Peer::stop_for_restart`], then a new [`Peer`] with [`PeerConfig::restarted`]) keeps its
//! routes in the router meanwhile. Every NOTIFICATION either side sends is put in words ([`Notification`]'s `Display`).
//!
//! The crate has no Kubernetes types, like `local-data-plane`. Where its pieces are:
//! [`wire`] the messages, [`plan`] what to send (pure), `session` the state machine.

mod config;
mod error;
mod md5;
pub mod plan;
mod session;
pub mod wire;

pub use config::{BGP_PORT, Password, PeerConfig};
pub use error::Error;
pub use plan::{Path, Routes, Unannounced};
pub use session::{Counters, PeerStatus, State};
pub use wire::Notification;

use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use tracing::Instrument;

/// One router we announce routes to: its session runs in a task of the current runtime until
/// [`Peer::stop`] (or the `Peer` is dropped, which stops it without waiting).
pub struct Peer {
    config: PeerConfig,
    status: watch::Receiver<PeerStatus>,
    stop: Arc<session::Stop>,
    task: Option<JoinHandle<()>>,
}

impl Peer {
    /// Checks `config` and starts the peer's session on the current tokio runtime; it announces the
    /// routes `routes` holds, and follows them as they change.
    pub fn start(config: PeerConfig, routes: watch::Receiver<Routes>) -> Result<Peer, Error> {
        config.validate()?;
        let (status_tx, status) = watch::channel(PeerStatus::default());
        let stop = Arc::new(session::Stop::default());
        let span = tracing::info_span!("bgp_peer", peer = %config.socket_address());
        let task = tokio::spawn(
            session::run(config.clone(), routes, status_tx, stop.clone()).instrument(span),
        );
        Ok(Peer {
            config,
            status,
            stop,
            task: Some(task),
        })
    }

    /// Whether the session's task ended although the peer was not stopped (a bug: it panicked).
    /// [`Peer::stop`] then reports the panic.
    pub fn has_failed(&self) -> bool {
        self.task.as_ref().is_some_and(|task| task.is_finished())
    }

    /// The peer's settings.
    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// The session's status, now and as it changes.
    pub fn status(&self) -> watch::Receiver<PeerStatus> {
        self.status.clone()
    }

    /// Ends the session (a NOTIFICATION Cease, administrative shutdown: the router withdraws our
    /// routes at once) and waits for its task. A panic of the task is reported as an error.
    pub async fn stop(self) -> Result<(), Error> {
        self.end(false).await
    }

    /// Ends the session for a restart of the speaker: the connection is closed without a
    /// NOTIFICATION, so that a router that negotiated graceful restart
    /// ([`PeerConfig::graceful_restart`]) keeps our routes, marked stale, until a session of the
    /// restarted speaker ([`PeerConfig::restarted`]) sends them again and its End-of-RIB, or the
    /// restart time runs out. A router without it drops them as for any lost session.
    pub async fn stop_for_restart(self) -> Result<(), Error> {
        self.end(true).await
    }

    async fn end(mut self, for_restart: bool) -> Result<(), Error> {
        self.stop.stop(for_restart);
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        task.await.map_err(|error| Error::Panicked {
            peer: self.config.socket_address(),
            what: error.to_string(),
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A Peer dropped without a stop: its session ends as by `stop` (with a Cease), unless an
        // `end` already chose how.
        if self.task.is_some() {
            self.stop.stop(false);
        }
    }
}
