//! One peer's session (RFC 4271 §8): connect, exchange OPENs, keep the router's table equal to the
//! routes we are given, and start again with back-off when the session ends.
//!
//! We connect (the active side) and do not listen, as MetalLB's and kube-vip's speakers do: a router
//! configured with us as a neighbour connects to us too, finds nobody listening, and uses our
//! connection, so no collision (RFC 4271 §6.8) arises. A passive peer ([`PeerConfig::passive`]) is
//! the other way round: it never connects, and takes the router's connection ([`crate::listen`]). Routes the router sends are not used (a node
//! announces, it does not route by BGP), so an UPDATE we cannot parse is logged and skipped (RFC 7606's
//! treat-as-withdraw, for a table we do not keep) rather than resetting the session.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::bfd::BfdStatus;
use crate::plan::{Routes, Session, Unannounced};
use crate::wire::{
    self, Capability, Context, Family, GracefulRestart, Message, Notification, Open, Update, codes,
};
use crate::{Error, PeerConfig};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long we wait for the router's OPEN (RFC 4271 §8.2.2 suggests 4 minutes; a router answers at
/// once, and a dead one should not hold the retry back that long).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a write may block before the connection counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Ends a session we were told to stop: with a Cease, unless it stops for a restart.
async fn stopping(
    connection: &mut Connection,
    stop: &Stop,
    counters: &mut Counters,
) -> Result<Ended, Error> {
    if stop.for_restart.load(Ordering::SeqCst) {
        tracing::info!(peer = %connection.peer, "closing the BGP session for a restart (no NOTIFICATION: a router doing graceful restart keeps the routes)");
    } else {
        connection
            .notify(
                Notification::cease(codes::cease::ADMINISTRATIVE_SHUTDOWN),
                counters,
            )
            .await;
    }
    Ok(Ended::Stopped)
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

/// A connection: the stream, what was read of it and not yet decoded, and how to decode.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    buffer: Vec<u8>,
    context: Context,
}

impl Connection {
    /// The next message. Cancel-safe: bytes read stay in the buffer until a whole message is taken.
    async fn next(&mut self, counters: &mut Counters) -> Result<Message, Error> {
        loop {
            match wire::decode(&self.buffer, self.context) {
                Ok(Some((message, used))) => {
                    self.buffer.drain(..used);
                    return Ok(message);
                }
                Ok(None) => {}
                Err(malformed) => {
                    if let Some(length) = wire::update_length(&self.buffer) {
                        // We use no route of the router's: skip the UPDATE, keep the session.
                        warn!(peer = %self.peer, "skipped an UPDATE: {}", malformed.reason);
                        counters.updates_malformed += 1;
                        self.buffer.drain(..length);
                        continue;
                    }
                    let _ = self
                        .send(&Message::Notification(malformed.notification.clone()))
                        .await;
                    counters.notifications_sent += 1;
                    return Err(Error::Malformed {
                        peer: self.peer,
                        malformed,
                    });
                }
            }
            self.buffer.reserve(wire::MAX_LEN);
            match self.stream.read_buf(&mut self.buffer).await {
                Ok(0) => return Err(Error::Closed { peer: self.peer }),
                Ok(_) => {}
                Err(source) => {
                    return Err(Error::Io {
                        peer: self.peer,
                        source,
                    });
                }
            }
        }
    }

    async fn send(&mut self, message: &Message) -> Result<(), Error> {
        let bytes = wire::encode(message, self.context);
        let io = |source| Error::Io {
            peer: self.peer,
            source,
        };
        timeout(WRITE_TIMEOUT, self.stream.write_all(&bytes))
            .await
            .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
            .map_err(io)
    }

    /// Sends a NOTIFICATION (its failure does not matter: the session ends either way).
    async fn notify(&mut self, notification: Notification, counters: &mut Counters) {
        counters.notifications_sent += 1;
        let _ = self.send(&Message::Notification(notification)).await;
    }
}

/// Our OPEN. `restarted`: this is the first session since the speaker (re)started, which the
/// graceful restart capability says with its R bit.
fn our_open(config: &PeerConfig, restarted: bool) -> Open {
    let mut capabilities = vec![
        Capability::Multiprotocol(Family::IPV4_UNICAST),
        Capability::Multiprotocol(Family::IPV6_UNICAST),
        Capability::RouteRefresh,
        Capability::FourOctetAs(config.local_asn),
    ];
    if let Some(restart_time) = config.graceful_restart {
        // The F bit: the node forwards (serves) its VIPs across the speaker's restart.
        capabilities.push(Capability::GracefulRestart(GracefulRestart {
            restarting: restarted,
            restart_time,
            families: vec![(Family::IPV4_UNICAST, true), (Family::IPV6_UNICAST, true)],
        }));
    }
    Open {
        asn: config.local_asn,
        hold_time: config.hold_time,
        router_id: config.router_id,
        capabilities,
    }
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

/// What the OPEN exchange settled with the router.
struct Negotiated {
    /// The router's BGP identifier.
    router_id: Ipv4Addr,
    /// The hold time in force: the smaller of ours and the router's.
    hold: Duration,
    /// The families both sides announced.
    families: Vec<Family>,
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

/// The OPEN exchange (RFC 4271 §8.2.2, OpenSent and OpenConfirm): our OPEN, the router's (checked),
/// then a KEEPALIVE each way. `None`: we were told to stop meanwhile.
async fn open_exchange(
    config: &PeerConfig,
    restarted: bool,
    connection: &mut Connection,
    status: &watch::Sender<PeerStatus>,
    stop: &Stop,
    counters: &mut Counters,
) -> Result<Option<Negotiated>, Error> {
    connection
        .send(&Message::Open(our_open(config, restarted)))
        .await?;
    status.send_modify(|s| s.state = State::OpenSent);
    let Some(theirs) = their_open(connection, stop, counters).await? else {
        return Ok(None);
    };
    check_their_open(config, &theirs, connection, counters).await?;
    connection.context.four_octet_as = theirs.has(|c| matches!(c, Capability::FourOctetAs(_)));
    let negotiated = Negotiated {
        router_id: theirs.router_id,
        hold: Duration::from_secs(u64::from(config.hold_time.min(theirs.hold_time))),
        families: common_families(&our_open(config, restarted), &theirs),
    };
    connection.send(&Message::Keepalive).await?;
    status.send_modify(|s| {
        s.state = State::OpenConfirm;
        s.router_id = Some(negotiated.router_id);
        s.hold_time = Some(negotiated.hold);
        s.families = negotiated.families.clone();
    });
    let Some(()) = their_keepalive(connection, stop, counters, negotiated.hold).await? else {
        return Ok(None);
    };
    Ok(Some(negotiated))
}

/// The router's OPEN, within [`OPEN_TIMEOUT`]; `None`: we were told to stop first. Silence, a
/// NOTIFICATION or another message end the session.
async fn their_open(
    connection: &mut Connection,
    stop: &Stop,
    counters: &mut Counters,
) -> Result<Option<Open>, Error> {
    let message = tokio::select! {
        _ = stop.cancelled() => return Ok(None),
        message = timeout(OPEN_TIMEOUT, connection.next(counters)) => message,
    };
    let Ok(message) = message else {
        return Err(hold_timer_expired(connection, counters, OPEN_TIMEOUT).await);
    };
    match message? {
        Message::Open(open) => Ok(Some(open)),
        Message::Notification(notification) => {
            Err(notified(connection.peer, notification, counters))
        }
        other => Err(unexpected(connection, counters, 1, other.kind(), State::OpenSent).await),
    }
}

/// Refuses the router's OPEN (with a NOTIFICATION) when its AS is not the one configured, or, on
/// iBGP, when it has our BGP identifier.
async fn check_their_open(
    config: &PeerConfig,
    theirs: &Open,
    connection: &mut Connection,
    counters: &mut Counters,
) -> Result<(), Error> {
    let peer = connection.peer;
    if theirs.asn != config.peer_asn {
        let data = u16::try_from(theirs.asn)
            .unwrap_or(wire::AS_TRANS)
            .to_be_bytes()
            .to_vec();
        connection
            .notify(
                Notification {
                    code: codes::OPEN,
                    subcode: codes::open::BAD_PEER_AS,
                    data,
                },
                counters,
            )
            .await;
        return Err(Error::BadPeerAs {
            peer,
            announced: theirs.asn,
            configured: config.peer_asn,
        });
    }
    if !config.is_external() && theirs.router_id == config.router_id {
        let notification = Notification {
            code: codes::OPEN,
            subcode: codes::open::BAD_BGP_IDENTIFIER,
            data: theirs.router_id.octets().to_vec(),
        };
        connection.notify(notification, counters).await;
        return Err(Error::SameRouterId {
            peer,
            router_id: theirs.router_id,
        });
    }
    Ok(())
}

/// The families of our OPEN that the router's announces too, in our order.
fn common_families(ours: &Open, theirs: &Open) -> Vec<Family> {
    let theirs = theirs.families();
    ours.families()
        .into_iter()
        .filter(|f| theirs.contains(f))
        .collect()
}

/// The router's KEEPALIVE that confirms the OPENs, within the hold time ([`OPEN_TIMEOUT`] when it
/// is 0); `None`: we were told to stop first. Silence, a NOTIFICATION or another message end the
/// session.
async fn their_keepalive(
    connection: &mut Connection,
    stop: &Stop,
    counters: &mut Counters,
    hold: Duration,
) -> Result<Option<()>, Error> {
    let deadline = Instant::now() + if hold.is_zero() { OPEN_TIMEOUT } else { hold };
    let message = tokio::select! {
        _ = stop.cancelled() => return Ok(None),
        _ = sleep_until(deadline) => {
            return Err(hold_timer_expired(connection, counters, hold).await);
        }
        message = connection.next(counters) => message?,
    };
    match message {
        Message::Keepalive => Ok(Some(())),
        Message::Notification(notification) => {
            Err(notified(connection.peer, notification, counters))
        }
        other => Err(unexpected(connection, counters, 2, other.kind(), State::OpenConfirm).await),
    }
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

/// Tells the router its hold timer expired; the error that ends the session.
async fn hold_timer_expired(
    connection: &mut Connection,
    counters: &mut Counters,
    hold: Duration,
) -> Error {
    let notification = Notification {
        code: codes::HOLD_TIMER_EXPIRED,
        subcode: 0,
        data: vec![],
    };
    connection.notify(notification, counters).await;
    Error::HoldTimerExpired {
        peer: connection.peer,
        hold,
    }
}

/// Tells the router its `message` does not belong in `state` (a finite state machine error with
/// `subcode`, RFC 6608); the error that ends the session.
async fn unexpected(
    connection: &mut Connection,
    counters: &mut Counters,
    subcode: u8,
    message: &'static str,
    state: State,
) -> Error {
    let notification = Notification {
        code: codes::FSM,
        subcode,
        data: vec![],
    };
    connection.notify(notification, counters).await;
    Error::Unexpected {
        peer: connection.peer,
        message,
        state: state.name(),
    }
}

/// Counts the router's NOTIFICATION; the error that ends the session.
fn notified(peer: SocketAddr, notification: Notification, counters: &mut Counters) -> Error {
    counters.notifications_received += 1;
    Error::Notified { peer, notification }
}

/// Puts the counters in the status when they changed (so that watchers wake only then).
fn publish_counters(status: &watch::Sender<PeerStatus>, counters: &Counters) {
    status.send_if_modified(|s| {
        let changed = s.counters != *counters;
        if changed {
            s.counters = counters.clone();
        }
        changed
    });
}

/// Sends the End-of-RIB marker of `family` (RFC 4724 §2).
async fn send_end_of_rib(
    connection: &mut Connection,
    family: Family,
    counters: &mut Counters,
) -> Result<(), Error> {
    connection
        .send(&Message::Update(Update::end_of_rib(family)))
        .await?;
    counters.updates_sent += 1;
    Ok(())
}

/// An established session: what it carries and how, the routes the router has from us, the hold
/// time in force.
struct Established {
    session: Session,
    sent: Routes,
    hold: Duration,
}

impl Established {
    /// Sends the whole table, then End-of-RIB for each family.
    async fn announce_whole_table(
        &mut self,
        connection: &mut Connection,
        routes: &mut watch::Receiver<Routes>,
        status: &watch::Sender<PeerStatus>,
        counters: &mut Counters,
    ) -> Result<(), Error> {
        announce(
            &self.session,
            &mut self.sent,
            routes,
            connection,
            status,
            counters,
        )
        .await?;
        for family in &self.session.families {
            send_end_of_rib(connection, *family, counters).await?;
        }
        Ok(())
    }

    /// Keeps the session until it fails or `stop`: announces the routes as they change, sends
    /// KEEPALIVEs, minds the hold timer and BFD, and answers the router's messages.
    async fn keep_up(
        &mut self,
        connection: &mut Connection,
        routes: &mut watch::Receiver<Routes>,
        status: &watch::Sender<PeerStatus>,
        stop: &Stop,
        mut bfd: Option<watch::Receiver<BfdStatus>>,
        counters: &mut Counters,
    ) -> Result<Ended, Error> {
        let peer = connection.peer;
        let hold = self.hold;
        let keepalive_every = if hold.is_zero() {
            Duration::MAX
        } else {
            hold / 3
        };
        let mut next_keepalive = Instant::now() + keepalive_every.min(Duration::from_secs(86400));
        let mut routes_open = true;
        let mut deadline = Instant::now() + hold;
        // BFD failures before this session do not end it; one while it runs does (RFC 5882 §3.2).
        let bfd_failures = bfd
            .as_mut()
            .map_or(0, |bfd| bfd.borrow_and_update().failures);
        loop {
            publish_counters(status, counters);
            tokio::select! {
                _ = stop.cancelled() => return stopping(connection, stop, counters).await,
                changed = routes.changed(), if routes_open => {
                    if changed.is_err() {
                        // Nobody will change the routes any more: keep announcing the last ones.
                        routes_open = false;
                        continue;
                    }
                    announce(&self.session, &mut self.sent, routes, connection, status, counters).await?;
                }
                _ = sleep_until(next_keepalive), if !hold.is_zero() => {
                    connection.send(&Message::Keepalive).await?;
                    next_keepalive = Instant::now() + keepalive_every;
                }
                _ = sleep_until(deadline), if !hold.is_zero() => {
                    return Err(hold_timer_expired(connection, counters, hold).await);
                }
                Some(bfd) = bfd_changed(&mut bfd) => {
                    if bfd.failures > bfd_failures {
                        connection.notify(Notification::cease(codes::cease::BFD_DOWN), counters).await;
                        return Err(Error::BfdDown { peer, diagnostic: bfd.diagnostic });
                    }
                }
                message = connection.next(counters) => {
                    deadline = Instant::now() + hold;
                    self.answer(message?, connection, counters).await?;
                }
            }
        }
    }

    /// Takes a message from the router: KEEPALIVEs only count for the hold timer, UPDATEs are
    /// counted and not used, a ROUTE-REFRESH is answered; a NOTIFICATION or an OPEN ends the session.
    async fn answer(
        &self,
        message: Message,
        connection: &mut Connection,
        counters: &mut Counters,
    ) -> Result<(), Error> {
        match message {
            Message::Keepalive => Ok(()),
            Message::Update(_) => {
                counters.updates_received += 1;
                Ok(())
            }
            Message::RouteRefresh(family) => self.refresh(family, connection, counters).await,
            Message::Notification(notification) => {
                Err(notified(connection.peer, notification, counters))
            }
            Message::Open(_) => {
                Err(unexpected(connection, counters, 3, "OPEN", State::Established).await)
            }
        }
    }

    /// Answers a ROUTE-REFRESH (RFC 2918): the routes of `family` the router has from us, again,
    /// then the family's End-of-RIB if the session carries it.
    async fn refresh(
        &self,
        family: Family,
        connection: &mut Connection,
        counters: &mut Counters,
    ) -> Result<(), Error> {
        debug!(peer = %connection.peer, %family, "route refresh");
        counters.route_refreshes += 1;
        let of_family: Routes = self
            .sent
            .iter()
            .filter(|(p, _)| Family::of(p) == family)
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        for update in self.session.plan(&Routes::new(), &of_family) {
            connection.send(&Message::Update(update)).await?;
            counters.updates_sent += 1;
        }
        if self.session.families.contains(&family) {
            send_end_of_rib(connection, family, counters).await?;
        }
        Ok(())
    }
}

/// The BFD session's status when it changes; never, without BFD or once it is gone.
async fn bfd_changed(bfd: &mut Option<watch::Receiver<BfdStatus>>) -> Option<BfdStatus> {
    let Some(receiver) = bfd else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        *bfd = None;
        return None;
    }
    Some(receiver.borrow_and_update().clone())
}

/// Brings the router from `sent` to the routes wanted now, and says so in the status.
async fn announce(
    session: &Session,
    sent: &mut Routes,
    routes: &mut watch::Receiver<Routes>,
    connection: &mut Connection,
    status: &watch::Sender<PeerStatus>,
    counters: &mut Counters,
) -> Result<(), Error> {
    let (wanted, unannounced) = session.announceable(&routes.borrow_and_update());
    for update in session.plan(sent, &wanted) {
        connection.send(&Message::Update(update)).await?;
        counters.updates_sent += 1;
    }
    for refused in &unannounced {
        warn!(peer = %connection.peer, prefix = %refused.prefix, "not announced: {}", refused.reason);
    }
    *sent = wanted;
    status.send_modify(|s| {
        s.announced = sent.len();
        s.unannounced = unannounced;
        s.counters = counters.clone();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PeerConfig {
        PeerConfig::new(
            "192.0.2.1".parse().unwrap(),
            64512,
            64513,
            Ipv4Addr::new(192, 0, 2, 2),
        )
    }

    #[test]
    fn the_families_are_those_both_sides_announced_in_our_order() {
        let ours = our_open(&config(), false);
        let mut theirs = our_open(&config(), false);
        theirs.capabilities = vec![
            Capability::Multiprotocol(Family::IPV6_UNICAST),
            Capability::Multiprotocol(Family::IPV4_UNICAST),
        ];
        assert_eq!(
            common_families(&ours, &theirs),
            vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST]
        );
        // No multiprotocol capability: IPv4 unicast only (RFC 4760 §8).
        theirs.capabilities.clear();
        assert_eq!(common_families(&ours, &theirs), vec![Family::IPV4_UNICAST]);
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
