//! A BGP speaker for the `local` provider's node agents: it announces load-balancer VIPs to routers
//! as host routes (`/32`, `/128`) with the node as next hop, so that the routers spread each VIP's
//! traffic over every node that serves it (ECMP) and route around a node that is gone.
//!
//! A [`Peer`] is one router: it connects (RFC 4271, active side; or waits for the router's
//! connection, [`PeerConfig::passive`]), negotiates 4-octet AS numbers
//! (RFC 6793), IPv4 and IPv6 unicast (RFC 4760) and route refresh (RFC 2918), keeps the router's
//! table equal to the [`Routes`] it is given (withdrawals and announcements, each sent once: a change
//! that changes nothing sends nothing), answers ROUTE-REFRESH, and starts again with back-off when the
//! session ends. With graceful restart (RFC 4724, [`PeerConfig::graceful_restart`]) a speaker that
//! restarts ([`Peer::stop_for_restart`], then a new [`Peer`] with [`PeerConfig::restarted`]) keeps its
//! routes in the router meanwhile. Every NOTIFICATION either side sends is put in words ([`Notification`]'s `Display`).
//!
//! With a BFD profile ([`PeerConfig::bfd`], [`Peer::start_with_bfd`]) the peer also runs BFD
//! (RFC 5880/5881) with the router: the router withdraws our routes within the profile's detection
//! time of the node's death, and we end the session as soon as BFD finds the router gone.
//!
//! The crate has no Kubernetes types, like `local-data-plane`. Where its pieces are:
//! [`wire`] the messages, [`plan`] what to send (pure), `session` the state machine, [`bfd`] BFD.

pub mod bfd;
mod config;
mod error;
mod listen;
mod md5;
pub mod plan;
mod session;
pub mod wire;

pub use bfd::{Bfd, BfdProfile, BfdResume, BfdSession, BfdState, BfdStatus};
pub use config::{BGP_PORT, Password, PeerConfig};
pub use error::Error;
pub use listen::accept_loop_restarts;
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
    bfd: Option<bfd::BfdSession>,
}

impl Peer {
    /// Checks `config` and starts the peer's session on the current tokio runtime; it announces the
    /// routes `routes` holds, and follows them as they change.
    /// A peer with a BFD profile ([`PeerConfig::bfd`]) needs [`Peer::start_with_bfd`].
    pub fn start(config: PeerConfig, routes: watch::Receiver<Routes>) -> Result<Peer, Error> {
        if config.bfd.is_some() {
            return Err(Error::Config {
                peer: config.socket_address().to_string(),
                what: "a BFD profile needs the node's BFD endpoint (Peer::start_with_bfd)".into(),
            });
        }
        Peer::launch(config, routes, None)
    }

    /// As [`Peer::start_with_bfd`], with a BFD session already running: one taken over from a
    /// node agent's predecessor ([`Bfd::resume`]).
    pub fn start_with_bfd_session(
        config: PeerConfig,
        routes: watch::Receiver<Routes>,
        session: BfdSession,
    ) -> Result<Peer, Error> {
        config.validate()?;
        Peer::launch(config, routes, Some(session))
    }

    /// As [`Peer::start`], and with the BFD session [`PeerConfig::bfd`] asks for (if it does) on
    /// the node's BFD endpoint `bfd`: it runs as long as the peer, and ends the BGP session when
    /// it finds the router gone.
    pub fn start_with_bfd(
        config: PeerConfig,
        routes: watch::Receiver<Routes>,
        bfd: &Bfd,
    ) -> Result<Peer, Error> {
        config.validate()?;
        let session = match config.bfd {
            Some(profile) => Some(bfd.session(config.address, config.source, profile)?),
            None => None,
        };
        Peer::launch(config, routes, session)
    }

    fn launch(
        config: PeerConfig,
        routes: watch::Receiver<Routes>,
        bfd: Option<bfd::BfdSession>,
    ) -> Result<Peer, Error> {
        config.validate()?;
        let (status_tx, status) = watch::channel(PeerStatus::default());
        let stop = Arc::new(session::Stop::default());
        let span = tracing::info_span!("bgp_peer", peer = %config.socket_address());
        let bfd_status = bfd.as_ref().map(bfd::BfdSession::status);
        // Watched: `has_failed` sees its end (the agent then stops it, which logs the panic, and
        // starts it again); `stop` awaits it.
        let task = tokio::spawn(
            session::run(config.clone(), routes, status_tx, stop.clone(), bfd_status)
                .instrument(span),
        );
        Ok(Peer {
            config,
            status,
            stop,
            task: Some(task),
            bfd,
        })
    }

    /// The BFD session's status, now and as it changes, when the peer has one.
    pub fn bfd_status(&self) -> Option<watch::Receiver<BfdStatus>> {
        self.bfd.as_ref().map(bfd::BfdSession::status)
    }

    /// Whether the session's task, or its BFD session's or BFD endpoint's, ended although the peer
    /// was not stopped (a bug: it panicked). [`Peer::stop`] then reports the BGP task's panic; the
    /// BFD session's is reported when it is stopped.
    pub fn has_failed(&self) -> bool {
        self.task.as_ref().is_some_and(|task| task.is_finished())
            || self.bfd.as_ref().is_some_and(bfd::BfdSession::has_failed)
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
    /// NOTIFICATION, the BFD session stops without a packet (for the successor to take it over with
    /// [`Bfd::resume`], from [`BfdStatus::resume`]), so that a router that negotiated graceful restart
    /// ([`PeerConfig::graceful_restart`]) keeps our routes, marked stale, until a session of the
    /// restarted speaker ([`PeerConfig::restarted`]) sends them again and its End-of-RIB, or the
    /// restart time runs out. A router without it drops them as for any lost session.
    pub async fn stop_for_restart(self) -> Result<(), Error> {
        self.end(true).await
    }

    async fn end(mut self, for_restart: bool) -> Result<(), Error> {
        self.stop.stop(for_restart);
        let result = match self.task.take() {
            Some(task) => task.await.map_err(|error| Error::Panicked {
                peer: self.config.socket_address(),
                what: error.to_string(),
            }),
            None => Ok(()),
        };
        // After the BGP session. For a restart, the BFD session stops without a word: the
        // successor takes it over as it is ([`Bfd::resume`]), so the router's BFD sees no change
        // (a new session would first say Down, which a router takes for the path failing and ends
        // the BGP session, flushing the routes graceful restart keeps). Else it says AdminDown.
        if let Some(bfd) = self.bfd.take() {
            if for_restart {
                bfd.stop_for_handover().await;
            } else {
                bfd.stop().await;
            }
        }
        result
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
