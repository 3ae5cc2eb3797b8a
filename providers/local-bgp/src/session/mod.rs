//! One peer's session (RFC 4271 §8): connect, exchange OPENs, keep the router's table equal to the
//! routes we are given, and start again with back-off when the session ends.
//!
//! We connect (the active side) and do not listen, as MetalLB's and kube-vip's speakers do: a router
//! configured with us as a neighbour connects to us too, finds nobody listening, and uses our
//! connection, so no collision (RFC 4271 §6.8) arises. A passive peer ([`PeerConfig::passive`]) is
//! the other way round: it never connects, and takes the router's connection ([`crate::listen`]). Routes the router sends are not used (a node
//! announces, it does not route by BGP), so an UPDATE we cannot parse is logged and skipped (RFC 7606's
//! treat-as-withdraw, for a table we do not keep) rather than resetting the session.

mod connection;
mod established;
mod notify;
mod open;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bfd::BfdStatus;
use crate::plan::{Routes, Session, Unannounced};
use crate::wire::{Context, Family};
use crate::{Error, PeerConfig};

use connection::Connection;
use established::Established;
use notify::stopping;
use open::open_exchange;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The session's state (RFC 4271 §8.2.2), as far as an active speaker goes through it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum State {
    /// Waiting before the next attempt, or stopped.
    #[default]
    Idle,
    /// Connecting.
    Connect,
    /// Waiting for the router's connection (a passive peer).
    Active,
    /// Our OPEN is sent; waiting for the router's.
    OpenSent,
    /// OPENs exchanged; waiting for the router's KEEPALIVE.
    OpenConfirm,
    /// Routes are exchanged.
    Established,
}

impl State {
    /// The state's name in RFC 4271.
    pub fn name(self) -> &'static str {
        match self {
            State::Idle => "Idle",
            State::Connect => "Connect",
            State::Active => "Active",
            State::OpenSent => "OpenSent",
            State::OpenConfirm => "OpenConfirm",
            State::Established => "Established",
        }
    }
}

/// Counts of what went each way, since the peer was started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Sessions that reached Established.
    pub established: u64,
    /// UPDATEs sent.
    pub updates_sent: u64,
    /// UPDATEs received (and not used).
    pub updates_received: u64,
    /// UPDATEs received that could not be parsed (skipped).
    pub updates_malformed: u64,
    /// NOTIFICATIONs sent.
    pub notifications_sent: u64,
    /// NOTIFICATIONs received.
    pub notifications_received: u64,
    /// ROUTE-REFRESH requests answered.
    pub route_refreshes: u64,
}

/// What a peer's session is doing, for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerStatus {
    /// The state now.
    pub state: State,
    /// Since when the session is established.
    pub established_since: Option<Instant>,
    /// The router's BGP identifier, once its OPEN came.
    pub router_id: Option<Ipv4Addr>,
    /// The hold time in force.
    pub hold_time: Option<Duration>,
    /// The families both sides announced.
    pub families: Vec<Family>,
    /// How many routes the router has from us.
    pub announced: usize,
    /// Routes we were given that this session cannot carry, with why.
    pub unannounced: Vec<Unannounced>,
    /// Why the last session ended or the last attempt failed.
    pub last_error: Option<String>,
    /// Counts.
    pub counters: Counters,
}

/// How a session ended without an error.
enum Ended {
    Stopped,
}

/// Tells a peer's task to stop, and how.
#[derive(Debug, Default)]
pub(crate) struct Stop {
    token: CancellationToken,
    for_restart: AtomicBool,
}

impl Stop {
    /// Stops the session with a NOTIFICATION Cease (the router drops our routes at once), or, for a
    /// restart, by closing the connection without one: a router that negotiated graceful restart
    /// keeps our routes (stale) until we are back or the restart time runs out (RFC 4724).
    pub(crate) fn stop(&self, for_restart: bool) {
        self.for_restart.store(for_restart, Ordering::SeqCst);
        self.token.cancel();
    }

    async fn cancelled(&self) {
        self.token.cancelled().await;
    }
}

/// Runs a peer until `stop`: sessions one after another, waiting between failed ones
/// (`connect_retry`, doubling up to `max_connect_retry`, back to the start after an established one).
/// A passive peer waits for the router's next connection instead (the router backs off).
pub(crate) async fn run(
    config: PeerConfig,
    mut routes: watch::Receiver<Routes>,
    status: watch::Sender<PeerStatus>,
    stop: std::sync::Arc<Stop>,
    bfd: Option<watch::Receiver<BfdStatus>>,
) {
    let peer = config.socket_address();
    let mut wait = config.connect_retry;
    let mut registration = None;
    loop {
        status.send_modify(|s| {
            s.state = if config.passive.is_some() {
                State::Active
            } else {
                State::Connect
            }
        });
        let result = tokio::select! {
            _ = stop.cancelled() => break,
            result = establish(&config, &mut registration) => result,
        };
        let result = match result {
            Ok(stream) => session(&config, stream, &mut routes, &status, &stop, bfd.clone()).await,
            Err(error) => Err(error),
        };
        // A session that held for a while starts the back-off afresh; one that fails right after
        // it is established (a router refusing our routes) keeps backing off.
        let held = status
            .borrow()
            .established_since
            .is_some_and(|since| since.elapsed() >= config.max_connect_retry);
        status.send_modify(|s| {
            s.state = State::Idle;
            s.established_since = None;
            s.announced = 0;
            if let Err(error) = &result {
                s.last_error = Some(error.to_string());
            }
        });
        match result {
            Ok(Ended::Stopped) => break,
            Err(error) => {
                if held {
                    wait = config.connect_retry;
                }
                warn!(%peer, retry_in = ?wait, "{error}");
            }
        }
        if config.passive.is_some() && registration.is_some() {
            continue; // the router connects again when it will
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = sleep(wait) => {}
        }
        wait = (wait * 2).min(config.max_connect_retry);
    }
    status.send_modify(|s| s.state = State::Idle);
}

/// The next connection with the router: ours (active), or the router's (passive: the first call
/// starts waiting on the listening socket, and an error there is retried like a failed connection).
async fn establish(
    config: &PeerConfig,
    registration: &mut Option<crate::listen::Registration>,
) -> Result<TcpStream, Error> {
    let Some(listen) = config.passive else {
        return connect(config).await;
    };
    if registration.is_none() {
        *registration = Some(crate::listen::register(
            listen,
            config.address,
            config.password.as_ref(),
        )?);
    }
    let Some(waiting) = registration.as_mut() else {
        unreachable!("registered above");
    };
    let stream = waiting.next().await.ok_or_else(|| Error::Listen {
        listen,
        source: std::io::Error::other("the listening socket closed"),
    })?;
    stream.set_nodelay(true).map_err(|source| Error::Io {
        peer: config.socket_address(),
        source,
    })?;
    // Single-hop eBGP answers with TTL 1, as routers send it; multihop with the TTL asked for.
    if let Some(ttl) = ttl_of(config) {
        let socket = socket2::SockRef::from(&stream);
        match config.address {
            IpAddr::V4(_) => socket.set_ttl_v4(ttl),
            IpAddr::V6(_) => socket.set_unicast_hops_v6(ttl),
        }
        .map_err(|source| Error::Io {
            peer: config.socket_address(),
            source,
        })?;
    }
    Ok(stream)
}

/// The TTL of our packets to the router: 1 for single-hop eBGP, as routers send it; the multihop
/// TTL asked for; the system's default for iBGP.
fn ttl_of(config: &PeerConfig) -> Option<u32> {
    match config.ebgp_multihop {
        Some(ttl) => Some(u32::from(ttl)),
        None if config.is_external() => Some(1),
        None => None,
    }
}

async fn connect(config: &PeerConfig) -> Result<TcpStream, Error> {
    let peer = config.socket_address();
    let failed = |source| Error::Connect { peer, source };
    let socket = match peer {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(failed)?;
    if let Some(source) = config.source {
        socket.bind(SocketAddr::new(source, 0)).map_err(failed)?;
    }
    if let Some(password) = &config.password {
        crate::md5::set(&socket, peer.ip(), &password.0).map_err(failed)?;
    }
    if let Some(ttl) = ttl_of(config) {
        let socket = socket2::SockRef::from(&socket);
        match peer {
            SocketAddr::V4(_) => socket.set_ttl_v4(ttl),
            SocketAddr::V6(_) => socket.set_unicast_hops_v6(ttl),
        }
        .map_err(failed)?;
    }
    let stream = timeout(CONNECT_TIMEOUT, socket.connect(peer))
        .await
        .map_err(|_| {
            // A router that does not share our MD5 key drops our segments without a word.
            let why = if config.password.is_some() {
                "timed out (with a TCP MD5 password: a router that does not have the same one drops \
                 our segments silently, which looks like this)"
            } else {
                "timed out"
            };
            failed(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
        })?
        .map_err(failed)?;
    stream.set_nodelay(true).map_err(failed)?;
    Ok(stream)
}

/// One session over a connected stream, until it fails or `stop`.
async fn session(
    config: &PeerConfig,
    stream: TcpStream,
    routes: &mut watch::Receiver<Routes>,
    status: &watch::Sender<PeerStatus>,
    stop: &Stop,
    bfd: Option<watch::Receiver<BfdStatus>>,
) -> Result<Ended, Error> {
    let peer = config.socket_address();
    let local = stream
        .local_addr()
        .map_err(|source| Error::Io { peer, source })?;
    let mut connection = Connection {
        stream,
        peer,
        buffer: Vec::new(),
        context: Context::default(),
    };
    let mut counters = status.borrow().counters.clone();
    let result = exchange(
        config,
        local.ip(),
        &mut connection,
        routes,
        status,
        stop,
        bfd,
        &mut counters,
    )
    .await;
    status.send_modify(|s| s.counters = counters);
    result
}

/// A session over a connection: the OPEN exchange, then routes until it fails or `stop`.
// Each argument is a distinct input or output of the session; a struct of them would only rename them.
#[allow(clippy::too_many_arguments)]
async fn exchange(
    config: &PeerConfig,
    local: IpAddr,
    connection: &mut Connection,
    routes: &mut watch::Receiver<Routes>,
    status: &watch::Sender<PeerStatus>,
    stop: &Stop,
    bfd: Option<watch::Receiver<BfdStatus>>,
    counters: &mut Counters,
) -> Result<Ended, Error> {
    let peer = connection.peer;
    // The R bit goes with the first session of a speaker that restarted only.
    let restarted = config.restarted && counters.established == 0;
    let Some(negotiated) =
        open_exchange(config, restarted, connection, status, stop, counters).await?
    else {
        return stopping(connection, stop, counters).await;
    };
    let hold = negotiated.hold;
    let mut established = Established {
        session: session_over(config, local, connection.context, negotiated.families),
        sent: Routes::new(),
        hold,
    };
    counters.established += 1;
    info!(%peer, router_id = %negotiated.router_id, ?hold, "BGP session established");
    status.send_modify(|s| {
        s.state = State::Established;
        s.established_since = Some(Instant::now());
        s.last_error = None;
        s.counters = counters.clone();
    });
    established
        .announce_whole_table(connection, routes, status, counters)
        .await?;
    established
        .keep_up(connection, routes, status, stop, bfd, counters)
        .await
}

/// What an established session carries and how: the families negotiated, the AS number width, and
/// the next hops (configured, or the connection's own address `local` for its family).
fn session_over(
    config: &PeerConfig,
    local: IpAddr,
    context: Context,
    families: Vec<Family>,
) -> Session {
    Session {
        local_asn: config.local_asn,
        external: config.is_external(),
        context,
        families,
        next_hop_v4: config.next_hop_v4.or(match local {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        }),
        next_hop_v6: config.next_hop_v6.or(match local {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        }),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A peer of the session modules' tests.
    pub(in crate::session) fn config() -> PeerConfig {
        PeerConfig::new(
            "192.0.2.1".parse().unwrap(),
            64512,
            64513,
            Ipv4Addr::new(192, 0, 2, 2),
        )
    }

    #[test]
    fn a_next_hop_is_the_connections_address_of_its_family_unless_configured() {
        let local: IpAddr = "192.0.2.2".parse().unwrap();
        let session = session_over(&config(), local, Context::default(), vec![]);
        assert_eq!(session.next_hop_v4, Some(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!(session.next_hop_v6, None);
        assert!(session.external);
        let v6: std::net::Ipv6Addr = "2001:db8::2".parse().unwrap();
        let configured = PeerConfig {
            next_hop_v4: Some(Ipv4Addr::new(192, 0, 2, 9)),
            next_hop_v6: Some(v6),
            ..config()
        };
        let session = session_over(&configured, local, Context::default(), vec![]);
        assert_eq!(session.next_hop_v4, Some(Ipv4Addr::new(192, 0, 2, 9)));
        assert_eq!(session.next_hop_v6, Some(v6));
    }
}
