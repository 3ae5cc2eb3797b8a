//! The crate's errors: each names the peer and says what went wrong in the words an operator can act on.

use std::net::SocketAddr;
use std::time::Duration;

use crate::wire::{Malformed, Notification};

/// What can go wrong with a peer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A peer's settings are invalid; nothing is attempted.
    #[error("BGP peer {peer}: {what}")]
    Config {
        /// The peer, as configured.
        peer: String,
        /// What is wrong.
        what: String,
    },
    /// The socket a passive peer waits on could not be opened or set up.
    #[error("BGP: cannot listen on {listen} for passive peers: {source}")]
    Listen {
        /// The local address and port.
        listen: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TCP connection could not be made.
    #[error("BGP peer {peer}: cannot connect: {source}")]
    Connect {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The TCP connection failed after it was made.
    #[error("BGP peer {peer}: connection failed: {source}")]
    Io {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The peer closed the connection without a NOTIFICATION.
    #[error("BGP peer {peer}: closed the connection without a NOTIFICATION")]
    Closed {
        /// The peer.
        peer: SocketAddr,
    },
    /// The peer sent a NOTIFICATION and closed the session.
    #[error("BGP peer {peer} sent a NOTIFICATION: {notification}")]
    Notified {
        /// The peer.
        peer: SocketAddr,
        /// What it said.
        notification: Notification,
    },
    /// The peer sent a message we could not accept; we sent it a NOTIFICATION.
    #[error("BGP peer {peer} sent {malformed}")]
    Malformed {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong, and the NOTIFICATION we sent.
        malformed: Malformed,
    },
    /// The peer's OPEN said another AS than the one configured for it.
    #[error(
        "BGP peer {peer} announces AS {announced}, configured as AS {configured} (we sent it a NOTIFICATION: bad peer AS)"
    )]
    BadPeerAs {
        /// The peer.
        peer: SocketAddr,
        /// The AS in its OPEN.
        announced: u32,
        /// The AS configured for it.
        configured: u32,
    },
    /// The peer's OPEN carried our own BGP identifier on an iBGP session.
    #[error(
        "BGP peer {peer} has our BGP identifier {router_id} (we sent it a NOTIFICATION: bad BGP identifier)"
    )]
    SameRouterId {
        /// The peer.
        peer: SocketAddr,
        /// The identifier both have.
        router_id: std::net::Ipv4Addr,
    },
    /// Nothing came from the peer for the negotiated hold time.
    #[error(
        "BGP peer {peer}: nothing heard for the hold time ({hold:?}; we sent it a NOTIFICATION: hold timer expired)"
    )]
    HoldTimerExpired {
        /// The peer.
        peer: SocketAddr,
        /// The hold time.
        hold: Duration,
    },
    /// The peer sent a message the session's state does not allow.
    #[error(
        "BGP peer {peer} sent {message} in state {state} (we sent it a NOTIFICATION: finite state machine error)"
    )]
    Unexpected {
        /// The peer.
        peer: SocketAddr,
        /// The message's kind.
        message: &'static str,
        /// The state.
        state: &'static str,
    },
    /// A peer's task panicked (a bug): its session is gone.
    #[error("BGP peer {peer}: its task failed: {what}")]
    Panicked {
        /// The peer.
        peer: SocketAddr,
        /// The panic.
        what: String,
    },
    /// The BFD endpoint could not bind its port (another BFD daemon, such as FRR's bfdd, may run on
    /// the node).
    #[error(
        "BFD: cannot receive on {address}: {source} (does another BFD daemon, such as FRR's bfdd, run on this node?)"
    )]
    BfdBind {
        /// The address and port.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A BFD session's socket could not be made.
    #[error("BFD peer {peer}: cannot open a socket to it: {source}")]
    BfdSocket {
        /// The peer.
        peer: std::net::IpAddr,
        /// Why.
        source: std::io::Error,
    },
    /// BFD found the router gone: the BGP session ended at once.
    #[error(
        "BGP peer {peer}: BFD session down ({diagnostic}); the BGP session is ended (we sent it a NOTIFICATION: BFD down)"
    )]
    BfdDown {
        /// The peer.
        peer: SocketAddr,
        /// Why BFD went down.
        diagnostic: crate::bfd::Diagnostic,
    },
}
