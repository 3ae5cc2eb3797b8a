//! Bounds on the secure endpoint's connections: how many may be open (in all, and from one address),
//! and how long one may sit without a byte moving.
//!
//! Upstream's endpoint is Go's `http.Server` with `ReadHeaderTimeout: 32s` and `IdleTimeout: 90s`.
//! Here hyper's own header-read timeout gives the first (see `serving`; for HTTP/1 it also runs between
//! two requests of a kept-alive connection, so an idle HTTP/1 connection is closed after 32 s, sooner
//! than upstream), and this module the rest, as an acceptor in front of the TLS one:
//!
//! - a connection on which no byte is read or written for [`IDLE_TIMEOUT`] is closed (an idle HTTP/2
//!   connection, a client that stopped mid-handshake or mid-request);
//! - at most [`MAX_CONNECTIONS`] connections are open, and at most [`MAX_CONNECTIONS_PER_ADDRESS`] from
//!   one address, so a client that holds as many as it can (a slowloris) leaves room for the kubelet's
//!   probes and for Prometheus; past either cap a new connection is closed at once. Each open
//!   connection costs a file descriptor that the manager's API and cloud connections (and the `local`
//!   provider's data plane) need too.
//!
//! axum-server has the TLS handshake's timeout (10 s) but none of these, and hyper has no idle timeout,
//! hence this small wrapper.

use parking_lot::Mutex;
use std::{
    collections::HashMap,
    future::{Future, Ready},
    io,
    net::IpAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum_server::accept::Accept;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};

/// How long a connection may go without a byte read or written (Go's `IdleTimeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a request's headers may take (Go's `ReadHeaderTimeout`, "just shy of" the API server's
/// request timeout bound).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// The most connections open at once from one address.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 128;

/// The limits on an endpoint's connections (the secure endpoint's, [`serve_plain_http`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A connection on which no byte moves for this long is closed.
    pub idle_timeout: Duration,
    /// The most connections open at once; past it a new one is closed at once.
    pub max_connections: usize,
    /// The most connections open at once from one address.
    pub max_per_address: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            max_per_address: MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
}

/// The open connections, in all and by address.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// Admits a connection if the caps allow, and wraps it so that it closes when idle.
#[derive(Debug, Clone)]
pub struct GuardedAcceptor {
    limits: ConnectionLimits,
    open: Arc<Mutex<Open>>,
}

impl GuardedAcceptor {
    /// An acceptor that enforces `limits`.
    pub fn new(limits: ConnectionLimits) -> Self {
        Self {
            limits,
            open: Arc::default(),
        }
    }

    /// A place for a connection from `address`, or `None` when a cap is reached.
    fn admit(&self, address: IpAddr) -> Option<Admission> {
        let mut open = self.open.lock();
        let from_address = open.by_address.get(&address).copied().unwrap_or(0);
        if open.total >= self.limits.max_connections || from_address >= self.limits.max_per_address
        {
            return None;
        }
        open.total += 1;
        *open.by_address.entry(address).or_default() += 1;
        Some(Admission {
            open: self.open.clone(),
            address,
        })
    }

    /// How many connections are open.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.open.lock().total
    }
}

/// A connection's place, given back when it closes.
#[derive(Debug)]
struct Admission {
    open: Arc<Mutex<Open>>,
    address: IpAddr,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.by_address.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.by_address.remove(&self.address);
            }
        }
    }
}

impl<S> Accept<TcpStream, S> for GuardedAcceptor {
    type Stream = GuardedStream;
    type Service = S;
    type Future = Ready<io::Result<(GuardedStream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let address = match stream.peer_addr() {
            Ok(peer) => peer.ip(),
            Err(err) => return std::future::ready(Err(err)),
        };
        let Some(admission) = self.admit(address) else {
            tracing::debug!(%address, "secure endpoint full: closing a new connection");
            return std::future::ready(Err(io::Error::other("too many connections")));
        };
        std::future::ready(Ok((
            GuardedStream {
                inner: stream,
                idle_timeout: self.limits.idle_timeout,
                idle: Box::pin(tokio::time::sleep(self.limits.idle_timeout)),
                _admission: admission,
            },
            service,
        )))
    }
}

/// A connection that fails its next read or write once no byte has moved for the idle timeout.
pub struct GuardedStream {
    inner: TcpStream,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
    _admission: Admission,
}

impl GuardedStream {
    fn moved(&mut self) {
        self.idle.as_mut().reset(Instant::now() + self.idle_timeout);
    }

    /// `Pending` unless the connection has been idle too long (which also wakes the task then).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle past the idle timeout",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    this.moved();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A server handle that stops its server once `shutdown` is cancelled, giving the requests in flight
/// 5 s.
pub(crate) fn stopped_at(
    shutdown: &tokio_util::sync::CancellationToken,
) -> axum_server::Handle<std::net::SocketAddr> {
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    let stopping = shutdown.clone();
    // Unsupervised: waits for the shutdown, then tells the server to stop (nothing in it can fail).
    tokio::spawn(async move {
        stopping.cancelled().await;
        stopper.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    handle
}

/// Serves `app` over plain HTTP on `listener` with the secure endpoint's bounds but `limits` (the
/// caps, the idle timeout, hyper's header-read timeout), until `shutdown` (then open requests get 5 s).
/// For the node agents' loopback `/metrics` and `/healthz`: a process that carries traffic must not
/// let a client pile connections up in it.
pub fn serve_plain_http(
    listener: std::net::TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: tokio_util::sync::CancellationToken,
) -> io::Result<()> {
    let handle = stopped_at(&shutdown);
    let mut server = axum_server::from_tcp(listener)?
        .acceptor(GuardedAcceptor::new(limits))
        .handle(handle);
    server
        .http_builder()
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    // Watched: the task catches the server's panic and says it at error level, as its early end; either
    // closes the port, so the kubelet's probes of `/healthz` there fail and the process is restarted.
    tokio::spawn(async move {
        let serving = std::panic::AssertUnwindSafe(server.serve(app.into_make_service()));
        let why = match futures::FutureExt::catch_unwind(serving).await {
            Ok(Ok(())) if shutdown.is_cancelled() => return,
            Ok(Ok(())) => "ended while the process was not stopping".to_owned(),
            Ok(Err(err)) => format!("failed: {err}"),
            Err(panic) => format!(
                "panicked (a bug): {}",
                cloud_provider::panic_message(panic.as_ref())
            ),
        };
        tracing::error!(
            "the HTTP endpoint {why}; its port is closed, so the probes of /healthz fail and the \
             process is restarted"
        );
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn pair(acceptor: &GuardedAcceptor) -> (TcpStream, io::Result<GuardedStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: SocketAddr = listener.local_addr().unwrap();
        let client = TcpStream::connect(address).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let accepted = acceptor.accept(server, ()).await.map(|(stream, ())| stream);
        (client, accepted)
    }

    #[tokio::test]
    async fn past_a_cap_a_new_connection_is_refused_and_a_closed_one_frees_its_place() {
        let acceptor = GuardedAcceptor::new(ConnectionLimits {
            idle_timeout: IDLE_TIMEOUT,
            max_connections: 3,
            max_per_address: 2,
        });
        let (_c1, s1) = pair(&acceptor).await;
        let (_c2, s2) = pair(&acceptor).await;
        let (_c3, s3) = pair(&acceptor).await;
        assert!(s1.is_ok() && s2.is_ok());
        assert!(s3.is_err(), "a third connection from one address");
        assert_eq!(acceptor.open(), 2);
        drop(s1);
        assert_eq!(acceptor.open(), 1);
        let (_c4, s4) = pair(&acceptor).await;
        assert!(s4.is_ok(), "the closed connection's place is free again");
    }

    #[tokio::test]
    async fn a_connection_is_closed_after_the_idle_timeout_and_traffic_keeps_it_open() {
        let acceptor = GuardedAcceptor::new(ConnectionLimits {
            idle_timeout: Duration::from_millis(300),
            ..ConnectionLimits::default()
        });
        let (mut client, server) = pair(&acceptor).await;
        let mut server = server.unwrap();
        // Bytes every 100 ms for 600 ms: twice the timeout, never idle for it.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            client.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            server.read_exact(&mut byte).await.unwrap();
        }
        // Then nothing: the next read fails once the timeout has passed, not before.
        let started = Instant::now();
        let mut byte = [0u8; 1];
        let err = server.read(&mut byte).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(250));
        drop(server);
        assert_eq!(acceptor.open(), 0);
    }
}
