//! TCP listeners: accept, pick a backend, connect, relay with `copy_bidirectional`.

use std::io;
use std::io::Read;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use socket2::{SockRef, Type};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::pool::{ActiveGuard, ListenerShared};
use crate::relay_threads::RelayPool;
use crate::sockets;

/// Relay buffer per direction. Allocated only once a connection has data (see `relay`), so idle
/// connections do not hold them, and never zeroed, so a connection touches only what it uses.
const RELAY_BUFFER: usize = 64 * 1024;
/// Backends tried per connection before the client is closed.
const CONNECT_ATTEMPTS: usize = 3;

/// Binds `addr` for listening (IPv6 sockets are IPv6-only, so `[::]` and `0.0.0.0` can coexist); the
/// socket is non-blocking, registered with no runtime yet.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = sockets::for_address(addr, Type::STREAM, socket2::Protocol::TCP)?;
    // Lets a listener come back on its port while old connections sit in TIME_WAIT; on Linux it does
    // not let two sockets listen on one port.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    set_connection_options(&socket)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Where the connections a listener accepts get their options (no delay, keepalive, the
/// unacknowledged-data timeout; see [`set_connection_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionOptions {
    /// From the listening socket: Linux copies a listener's socket options into every connection it
    /// accepts, so a connection costs no `setsockopt` of its own on the client's side (six before).
    FromTheListener,
    /// Set on each connection: a socket handed over by a process that did not set them on it; the
    /// connections already in its queue were made without them.
    OnEachConnection,
}

/// The options of the connections `listener` will accept, for a listening socket handed over by the
/// process before: if it set them on the socket (as [`bind`] does), they come from it; otherwise
/// they are set on it now for the connections to come, and on each connection (those queued already
/// were made without them; a rolling update from a version before 2026-12-02 is the one case).
pub(crate) fn adopt_connection_options(
    listener: &std::net::TcpListener,
) -> io::Result<ConnectionOptions> {
    let socket = SockRef::from(listener);
    if socket.keepalive()? && socket.tcp_user_timeout()? == Some(UNACKNOWLEDGED_TIMEOUT) {
        return Ok(ConnectionOptions::FromTheListener);
    }
    set_connection_options(&socket)?;
    Ok(ConnectionOptions::OnEachConnection)
}

/// The accept loop of one listener; ends when `stop` is cancelled (dropping its share of the socket,
/// which closes with the last share, so new connections are refused) and hands back the connections that are still open, to be drained.
///
/// Connections are tasks in a `JoinSet` owned by this loop: nothing on a connection's path polls a
/// shared token or lock, and the drain cuts them by aborting the set. The loop runs on one relay
/// thread (`on`); each connection is relayed on the least loaded one (`RelayPool::pick`).
pub(crate) async fn serve(
    listener: Arc<AsyncFd<Arc<std::net::TcpListener>>>,
    shared: Arc<ListenerShared>,
    stop: CancellationToken,
    timeouts: Timeouts,
    options: ConnectionOptions,
    on: AcceptingThread,
) -> JoinSet<()> {
    let AcceptingThread { pool, index: here } = on;
    let mut connections = JoinSet::new();
    loop {
        let (client, peer) = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            accepted = accept(&listener) => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE/ENFILE and friends: back off a little instead of spinning.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        // Reap the connections that ended, without registering a waker: a finished connection
        // does not wake this loop.
        while let Some(ended) = connections.try_join_next() {
            if let Err(error) = ended
                && error.is_panic()
            {
                warn!(%error, "connection task panicked");
            }
        }
        let config = shared.config();
        if !config.allows(peer.ip()) {
            shared.stats.refused_source.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, "source not in the load balancer's source ranges: refused");
            reset(client);
            continue;
        }
        // Two descriptors (this one and the backend's) from the client's, the listener's and the data
        // plane's share, held until the connection ends.
        let Some(claim) = shared.budget.claim(peer.ip(), 2) else {
            shared.stats.refused_budget.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, "no descriptors left in this client's or listener's share: refused");
            reset(client);
            continue;
        };
        let span = tracing::debug_span!("connection", %peer);
        let shared = shared.clone();
        let worker = pool.pick(here);
        let runtime = worker.runtime().clone();
        connections.spawn_on(
            async move {
                if options == ConnectionOptions::OnEachConnection {
                    set_connection_options(&SockRef::from(&client)).unwrap_or_else(
                        |error| debug!(%error, "cannot set the connection's options"),
                    );
                }
                handle(client, peer, shared, timeouts).await;
                drop((claim, worker));
            }
            .instrument(span),
            &runtime,
        );
    }
    connections
}

/// The next connection, not registered with any runtime yet: the relay thread it is handed to
/// registers it once (tokio's `accept` would register it with the accepting thread's driver, and a
/// hand-over would deregister and register it again: two `epoll_ctl`s for every connection moved).
async fn accept(
    listener: &AsyncFd<Arc<std::net::TcpListener>>,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    let (socket, peer) = listener
        .async_io(Interest::READABLE, |listener| {
            SockRef::from(listener.as_ref()).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        })
        .await?;
    let peer = peer.as_socket().ok_or_else(|| {
        io::Error::other(format!("a connection from a non-IP address ({peer:?})"))
    })?;
    Ok((socket.into(), peer))
}

/// The relay thread an accept loop runs on.
#[derive(Debug, Clone)]
pub(crate) struct AcceptingThread {
    /// Every relay thread.
    pub(crate) pool: RelayPool,
    /// This one's index in `pool`.
    pub(crate) index: usize,
}

/// How soon a relayed connection whose peer vanished (its machine gone without a FIN or a reset) is
/// found and closed, freeing its two descriptors: keepalive probes after 60 s without traffic, every
/// 10 s, until 2 minutes have passed without a byte or an answer from the peer; data left
/// unacknowledged for 2 minutes ends it too, where keepalive would not probe. Both limits are
/// `TCP_USER_TIMEOUT`, which with keepalive on decides when the probes give up (tcp(7)), so no probe
/// count is set.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const UNACKNOWLEDGED_TIMEOUT: Duration = Duration::from_secs(120);

/// The backend's side of a connection gets its dead-peer detection (keepalive and the
/// unacknowledged-data timeout) once it has lived this long: four `setsockopt`s that most short
/// connections (a request and its answer) end before needing. A backend that vanishes in a
/// connection's first second is found a second later than on the client's side, whose socket has
/// them from the listener at no cost.
const DEAD_PEER_DETECTION_AFTER: Duration = Duration::from_secs(1);

/// Turns on no delay, keepalive and the unacknowledged-data timeout (above) for a socket: the client's
/// side of a relayed connection, or a listening socket whose connections copy them.
fn set_connection_options(socket: &socket2::Socket) -> io::Result<()> {
    socket.set_tcp_nodelay(true)?;
    set_dead_peer_detection(socket)
}

/// Keepalive and the unacknowledged-data timeout (above).
fn set_dead_peer_detection(socket: &socket2::Socket) -> io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    socket.set_tcp_keepalive(&keepalive)?;
    socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_TIMEOUT))
}

/// Arms the backend connection's dead-peer detection after [`DEAD_PEER_DETECTION_AFTER`]; never
/// resolves.
async fn detect_a_dead_backend(upstream: &TcpStream) -> io::Result<()> {
    tokio::time::sleep(DEAD_PEER_DETECTION_AFTER).await;
    set_dead_peer_detection(&SockRef::from(upstream))
        .unwrap_or_else(|error| debug!(%error, "cannot set the backend connection's keepalive"));
    std::future::pending().await
}

/// Closes a connection with a reset, so the client learns at once that it is refused.
fn reset(stream: impl AsFd) {
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// The timeouts of a listener's connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// For a connection to a backend.
    pub(crate) connect: Duration,
    /// Without a byte either way, a relayed connection is closed (`None`: never).
    pub(crate) idle: Option<Duration>,
}

/// Relays one connection, on the relay thread it was handed to. Until the backend has the client's
/// first bytes, nothing waits for the I/O driver unless it must (haproxy's order): the client's bytes
/// already there are read right away, the backend's connection is tried and, when its handshake is
/// done by then (loopback, a fast network), the bytes go out at once; only then are both sockets
/// registered. Waiting for a driver turn after the accept and after the connect would cost two trips
/// through the event loop per connection, and wake the backend for a connection with nothing on it yet.
async fn handle(
    client: std::net::TcpStream,
    peer: SocketAddr,
    shared: Arc<ListenerShared>,
    timeouts: Timeouts,
) {
    let config = shared.config();
    let mut opening = Vec::new();
    if config.proxy_protocol {
        match client.local_addr() {
            Ok(local) => opening = proxy_v2_header(peer, local),
            Err(error) => {
                debug!(%error, "cannot tell the address the client connected to: closed");
                return;
            }
        }
    }
    let first = match first_bytes(&client, &mut opening) {
        Ok(first) => first,
        Err(error) => {
            // Reset by the client before it was relayed: no backend is bothered with it.
            debug!(%error, "the client's connection failed before it was relayed: closed");
            return;
        }
    };
    shared
        .stats
        .bytes_in
        .fetch_add(first as u64, Ordering::Relaxed);
    let mut tried = Vec::new();
    let (backend, upstream) = loop {
        let Some(backend) = shared.pick(&config, peer.ip(), &tried) else {
            if tried.is_empty() {
                shared
                    .stats
                    .refused_no_backend
                    .fetch_add(1, Ordering::Relaxed);
                debug!("no healthy backend: refused");
            }
            reset(client);
            return;
        };
        match connect(backend.addr, timeouts.connect, &mut opening).await {
            Ok(upstream) => break (backend, upstream),
            Err(error) if error.kind() == io::ErrorKind::TimedOut => {
                warn!(backend = %backend.addr, node = %backend.node, "connecting to backend timed out");
            }
            Err(error) => {
                warn!(backend = %backend.addr, node = %backend.node, %error, "cannot connect to backend");
            }
        }
        shared
            .stats
            .backend_connect_errors
            .fetch_add(1, Ordering::Relaxed);
        tried.push(backend.addr);
        if tried.len() >= CONNECT_ATTEMPTS {
            reset(client);
            return;
        }
    };
    // The connection keeps its backend, not the whole (possibly since replaced) configuration.
    drop(config);
    let _active = ActiveGuard::new(shared.clone(), backend.clone());
    // Registered with the I/O driver of the thread that relays it, here.
    let client = match TcpStream::from_std(client) {
        Ok(client) => client,
        Err(error) => {
            warn!(%error, "cannot relay a connection on this relay thread");
            return;
        }
    };
    if let Err(error) = relay(client, upstream, &shared, opening, timeouts.idle).await {
        if error.kind() == io::ErrorKind::TimedOut {
            shared.stats.idle_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        debug!(backend = %backend.addr, %error, "connection ended with an error");
    }
}

/// Appends to `opening` what the client has sent so far (at most what one read gives), without
/// waiting: the bytes are read into the stack (not kept in the connection's future) and copied into
/// a relay buffer only if there are any. Returns how many; an error (a reset: the kernel reports it
/// once, so the relay's first read would take it for an end) is the client's connection failing.
fn first_bytes(client: &std::net::TcpStream, opening: &mut Vec<u8>) -> io::Result<usize> {
    let mut head = [0u8; 1024];
    match (&*client).read(&mut head) {
        Ok(n) => {
            if n > 0 {
                opening.reserve_exact(RELAY_BUFFER);
                opening.extend_from_slice(&head[..n]);
            }
            // 0 is the end already: the relay's first read finds it again.
            Ok(n)
        }
        // Nothing yet.
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            Ok(0)
        }
        Err(error) => Err(error),
    }
}

/// Connects to a backend (no delay; its dead-peer detection comes later, see
/// [`DEAD_PEER_DETECTION_AFTER`]) within
/// `timeout`, and sends it what it can of `opening` (the PROXY header and the client's first bytes),
/// removing what was sent. When the handshake is done by the time `connect` returns, sending proves
/// it (or `getpeername`, with nothing to send) and no timer or driver turn is needed; otherwise the
/// socket is waited on until writable, as tokio's `TcpStream::connect` does.
async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    opening: &mut Vec<u8>,
) -> io::Result<TcpStream> {
    // Not `sockets::for_address`: an IPv6 socket that connects stays dual-stack, as tokio's would, so
    // an IPv4-mapped backend address still works.
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_tcp_nodelay(true)?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(error) if error.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(error) => return Err(error),
    }
    // Registered before anything is sent: once part of `opening` is gone, nothing may fail and send
    // the rest to the next backend without it. The send goes past tokio's readiness (none yet).
    let upstream = TcpStream::from_std(socket.into())?;
    let established = if opening.is_empty() {
        upstream.peer_addr().is_ok()
    } else {
        match SockRef::from(&upstream).send(opening) {
            Ok(sent) => {
                opening.drain(..sent);
                true
            }
            // Still in the handshake.
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => false,
            Err(error) => return Err(error),
        }
    };
    if !established {
        match tokio::time::timeout(timeout, upstream.writable()).await {
            Ok(writable) => writable?,
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
        if let Some(error) = upstream.take_error()? {
            return Err(error);
        }
    }
    Ok(upstream)
}

/// When a relayed connection last moved a byte, in milliseconds since it started (one relaxed store per
/// read: no lock, no allocation).
struct Activity {
    started: tokio::time::Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            started: tokio::time::Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves (with `TimedOut`) once nothing moved for `idle`; never without an idle timeout.
    async fn idle_for(&self, idle: Option<Duration>) -> io::Result<()> {
        let Some(idle) = idle else {
            return std::future::pending().await;
        };
        loop {
            let last = self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if tokio::time::Instant::now() >= last + idle {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no byte either way for {idle:?}: closed"),
                ));
            }
            tokio::time::sleep_until(last + idle).await;
        }
    }
}

/// Relays both ways until both have ended; `unsent` (the PROXY header and the client's first bytes
/// that could not be sent while connecting) goes to the backend first.
async fn relay(
    client: TcpStream,
    upstream: TcpStream,
    shared: &ListenerShared,
    unsent: Vec<u8>,
    idle_timeout: Option<Duration>,
) -> io::Result<()> {
    let client_done = AtomicBool::new(false);
    let upstream_done = AtomicBool::new(false);
    let activity = Activity::new();
    let both_ways = async {
        tokio::try_join!(
            pump(
                &client,
                &upstream,
                unsent,
                &shared.stats.bytes_in,
                &client_done,
                &upstream_done,
                &activity,
            ),
            pump(
                &upstream,
                &client,
                Vec::new(),
                &shared.stats.bytes_out,
                &upstream_done,
                &client_done,
                &activity,
            ),
        )
        .map(|_| ())
    };
    tokio::select! {
        result = both_ways => result,
        timed_out = activity.idle_for(idle_timeout) => timed_out,
        never = detect_a_dead_backend(&upstream) => never,
    }
}

/// Copies one direction until its end, then half-closes the other side, like `copy_bidirectional`
/// but cheaper per connection:
/// - no buffer until the first bytes arrive (those are read into a small array on the stack, which
///   is not kept across an await), so an idle connection holds only its sockets and this future;
/// - the buffer is never zeroed (`try_read_buf` fills spare capacity), so a connection touches only
///   the pages its data needs;
/// - no half-close when the other direction has already ended (both sockets are closed right after);
/// - one relaxed atomic add per read counts the bytes.
///
/// `unsent` is written first; a relay buffer it came in is kept for the reads.
#[allow(clippy::too_many_arguments)] // each is one thing a direction of the relay needs
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    unsent: Vec<u8>,
    counter: &AtomicU64,
    done: &AtomicBool,
    other_done: &AtomicBool,
    activity: &Activity,
) -> io::Result<()> {
    let mut buf = unsent;
    if !buf.is_empty() {
        activity.touch();
        write_all(to, &buf).await?;
    }
    if buf.capacity() < RELAY_BUFFER {
        // A PROXY header alone: read into the stack until data comes, as from the start.
        buf = Vec::new();
    }
    loop {
        from.readable().await?;
        let read = if buf.capacity() == 0 {
            let mut head = [0u8; 1024];
            match read_once(from, || from.try_read(&mut head).map(|n| (n, head.len()))) {
                Ok(n) => {
                    if n > 0 {
                        buf.reserve_exact(RELAY_BUFFER);
                        buf.extend_from_slice(&head[..n]);
                    }
                    Ok(n)
                }
                Err(error) => Err(error),
            }
        } else {
            buf.clear();
            let asked = buf.capacity();
            read_once(from, || from.try_read_buf(&mut buf).map(|n| (n, asked)))
        };
        match read {
            Ok(0) => {
                done.store(true, Ordering::Relaxed);
                if !other_done.load(Ordering::Relaxed) {
                    // The peer may already be gone: a failed half-close ends nothing else.
                    let _ = SockRef::from(to).shutdown(std::net::Shutdown::Write);
                }
                return Ok(());
            }
            Ok(n) => {
                counter.fetch_add(n as u64, Ordering::Relaxed);
                activity.touch();
                write_all(to, &buf).await?;
            }
            // Spurious readiness (a newly accepted socket is reported readable at once).
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
}

/// One read (`read` returns what it got and what it asked for). A short read means the socket was
/// drained: its readiness is cleared at once, so the next read waits for the next event instead of
/// spending a syscall to learn `EAGAIN` (tokio only clears readiness on `WouldBlock`, and clears it
/// only if no newer event came in meanwhile, so no data is missed).
fn read_once(
    from: &TcpStream,
    read: impl FnOnce() -> io::Result<(usize, usize)>,
) -> io::Result<usize> {
    let mut got = None;
    let result = from.try_io(Interest::READABLE, || {
        let (n, asked) = read()?;
        got = Some(n);
        if n > 0 && n < asked {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match got {
        Some(n) => Ok(n),
        None => result,
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match to.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// PROXY protocol v2 header (command PROXY, TCP over IPv4 or IPv6) for a connection from `source` to
/// `destination` (the VIP and port the client connected to).
pub(crate) fn proxy_v2_header(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
    let mut header = Vec::with_capacity(16 + 36);
    header.extend_from_slice(&SIGNATURE);
    header.push(0x21); // version 2, command PROXY
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            header.push(0x11); // AF_INET, STREAM
            header.extend_from_slice(&12u16.to_be_bytes());
            header.extend_from_slice(&src.octets());
            header.extend_from_slice(&dst.octets());
        }
        (src, dst) => {
            let v6 = |ip: IpAddr| -> Ipv6Addr {
                match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                }
            };
            header.push(0x21); // AF_INET6, STREAM
            header.extend_from_slice(&36u16.to_be_bytes());
            header.extend_from_slice(&v6(src).octets());
            header.extend_from_slice(&v6(dst).octets());
        }
    }
    header.extend_from_slice(&source.port().to_be_bytes());
    header.extend_from_slice(&destination.port().to_be_bytes());
    header
}
