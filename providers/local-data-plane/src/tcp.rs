//! TCP listeners: accept, pick a backend, connect, relay with `copy_bidirectional`.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use socket2::{SockRef, Type};
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
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
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// The accept loop of one listener; ends when `stop` is cancelled (dropping its share of the socket,
/// which closes with the last share, so new connections are refused) and hands back the connections that are still open, to be drained.
///
/// Connections are tasks in a `JoinSet` owned by this loop: nothing on a connection's path polls a
/// shared token or lock, and the drain cuts them by aborting the set. The loop runs on one relay
/// thread (`on`); each connection is relayed on the least loaded one (`RelayPool::pick`).
pub(crate) async fn serve(
    listener: Arc<TcpListener>,
    shared: Arc<ListenerShared>,
    stop: CancellationToken,
    timeouts: Timeouts,
    on: AcceptingThread,
) -> JoinSet<()> {
    let AcceptingThread { pool, index: here } = on;
    let mut connections = JoinSet::new();
    loop {
        let (client, peer) = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
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
        let client = if worker.index() == here {
            Accepted::Here(client)
        } else {
            // Registered with the other thread's runtime by the task, there.
            match client.into_std() {
                Ok(client) => Accepted::Moved(client),
                Err(error) => {
                    warn!(%peer, %error, "cannot hand a connection to another relay thread");
                    continue;
                }
            }
        };
        let runtime = worker.runtime().clone();
        connections.spawn_on(
            async move {
                if let Some(client) = client.on_this_runtime() {
                    handle(client, peer, shared, timeouts).await;
                }
                drop((claim, worker));
            }
            .instrument(span),
            &runtime,
        );
    }
    connections
}

/// The relay thread an accept loop runs on.
#[derive(Debug, Clone)]
pub(crate) struct AcceptingThread {
    /// Every relay thread.
    pub(crate) pool: RelayPool,
    /// This one's index in `pool`.
    pub(crate) index: usize,
}

/// A connection just accepted, on the accepting thread's runtime or on its way to another's.
enum Accepted {
    Here(TcpStream),
    Moved(std::net::TcpStream),
}

impl Accepted {
    /// The connection, registered with the runtime this runs on; `None` (logged, the connection
    /// closed) if it cannot be.
    fn on_this_runtime(self) -> Option<TcpStream> {
        match self {
            Accepted::Here(stream) => Some(stream),
            Accepted::Moved(stream) => TcpStream::from_std(stream)
                .inspect_err(
                    |error| warn!(%error, "cannot relay a connection on this relay thread"),
                )
                .ok(),
        }
    }
}

/// How soon a relayed connection whose peer vanished (its machine gone without a FIN or a reset) is
/// found and closed, freeing its two descriptors: keepalive probes after 60 s without traffic, every
/// 10 s, 6 unanswered ones end it (2 minutes); data left unacknowledged for 2 minutes ends it too
/// (`TCP_USER_TIMEOUT`), where keepalive would not probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 6;
const UNACKNOWLEDGED_TIMEOUT: Duration = Duration::from_secs(120);

/// Turns on keepalive and the unacknowledged-data timeout (above) for one side of a connection.
fn keep_alive(stream: &TcpStream) {
    let socket = SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(error) = socket
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_TIMEOUT)))
    {
        debug!(%error, "cannot set TCP keepalive");
    }
}

/// Closes a connection with a reset, so the client learns at once that it is refused.
fn reset(stream: TcpStream) {
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

async fn handle(
    client: TcpStream,
    peer: SocketAddr,
    shared: Arc<ListenerShared>,
    timeouts: Timeouts,
) {
    let connect_timeout = timeouts.connect;
    let config = shared.config();
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
        match tokio::time::timeout(connect_timeout, TcpStream::connect(backend.addr)).await {
            Ok(Ok(upstream)) => break (backend, upstream),
            Ok(Err(error)) => {
                warn!(backend = %backend.addr, node = %backend.node, %error, "cannot connect to backend");
            }
            Err(_) => {
                warn!(backend = %backend.addr, node = %backend.node, "connecting to backend timed out");
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
    let proxy_protocol = config.proxy_protocol;
    drop(config);
    let _active = ActiveGuard::new(shared.clone(), backend.clone());
    for stream in [&client, &upstream] {
        let _ = stream.set_nodelay(true);
        keep_alive(stream);
    }
    if let Err(error) = relay(
        client,
        peer,
        upstream,
        &shared,
        proxy_protocol,
        timeouts.idle,
    )
    .await
    {
        if error.kind() == io::ErrorKind::TimedOut {
            shared.stats.idle_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        debug!(backend = %backend.addr, %error, "connection ended with an error");
    }
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

async fn relay(
    client: TcpStream,
    peer: SocketAddr,
    upstream: TcpStream,
    shared: &ListenerShared,
    proxy_protocol: bool,
    idle_timeout: Option<Duration>,
) -> io::Result<()> {
    if proxy_protocol {
        let local = client.local_addr()?;
        write_all(&upstream, &proxy_v2_header(peer, local)).await?;
    }
    let client_done = AtomicBool::new(false);
    let upstream_done = AtomicBool::new(false);
    let activity = Activity::new();
    let both_ways = async {
        tokio::try_join!(
            pump(
                &client,
                &upstream,
                &shared.stats.bytes_in,
                &client_done,
                &upstream_done,
                &activity,
            ),
            pump(
                &upstream,
                &client,
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
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    counter: &AtomicU64,
    done: &AtomicBool,
    other_done: &AtomicBool,
    activity: &Activity,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
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
