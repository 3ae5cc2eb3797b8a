//! Passive peers (RFC 4271 §8.1.1, [`crate::PeerConfig::passive`]): the router connects to us.
//!
//! One listening socket per local address and port, shared by every passive peer on it: the peers of
//! one node all wait on the node's port 179. A [`Registration`] adds a peer to the socket of its
//! address (opening it with the first), and its drop takes the peer off (closing the socket with the
//! last). Each connection accepted goes to the peer whose address it comes from, if that peer waits
//! for one; a second connection while the peer's session runs is closed, as RFC 4271 §6.8 has it for
//! a session that is established, and one from an address that is no passive peer's is closed at once.
//!
//! The sockets are in a table of the process (a registry, not a value a caller keeps): passive peers
//! are started and stopped one by one, as their configuration comes and goes, and must meet on one
//! socket without knowing of each other.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::{Error, Password};

/// How long the accept loop waits after a failed accept (out of descriptors, as a rule).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The listening sockets, by local address.
/// How many times an accept loop was started again after a panic, in this process.
static ACCEPT_LOOP_RESTARTS: AtomicU64 = AtomicU64::new(0);

/// How many times a BGP listener's accept loop was started again after a panic (a bug), in this
/// process: the node agent exposes it as a counter, so that an alert can tell.
pub fn accept_loop_restarts() -> u64 {
    ACCEPT_LOOP_RESTARTS.load(Ordering::Relaxed)
}

static LISTENERS: LazyLock<Mutex<HashMap<SocketAddr, Listening>>> = LazyLock::new(Default::default);

/// One listening socket and the peers that wait on it.
struct Listening {
    /// Each peer, by its address, with where its next connection goes while it waits for one.
    peers: HashMap<IpAddr, Option<oneshot::Sender<TcpStream>>>,
    /// The socket, for the peers' TCP MD5 keys.
    socket: std::sync::Arc<TcpListener>,
    /// Ends the accept loop.
    stop: CancellationToken,
}

/// A passive peer on a listening socket; dropping it takes the peer off.
pub(crate) struct Registration {
    listen: SocketAddr,
    peer: IpAddr,
}

impl Registration {
    /// The router's next connection: one that comes while nobody waits (the session runs) is closed.
    pub(crate) async fn next(&mut self) -> Option<TcpStream> {
        let (sender, receiver) = oneshot::channel();
        {
            let mut listeners = LISTENERS.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = listeners
                .get_mut(&self.listen)
                .and_then(|listening| listening.peers.get_mut(&self.peer))?;
            *slot = Some(sender);
        }
        receiver.await.ok()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut listeners = LISTENERS.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(listening) = listeners.get_mut(&self.listen) else {
            return;
        };
        listening.peers.remove(&self.peer);
        // A key left on the socket would make it drop the unsigned segments of a later peer there.
        let _ = crate::md5::remove(&*listening.socket, self.peer);
        if listening.peers.is_empty() {
            listening.stop.cancel();
            listeners.remove(&self.listen);
        }
    }
}

/// The address a connection comes from, as the peer is configured: an IPv4 peer's connection to a
/// dual-stack socket comes from `::ffff:a.b.c.d`.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Waits for `peer`'s connections on `listen` (with its TCP MD5 key, if any); must be called within
/// a tokio runtime (the first registration on an address starts its accept loop there).
pub(crate) fn register(
    listen: SocketAddr,
    peer: IpAddr,
    password: Option<&Password>,
) -> Result<Registration, Error> {
    let failed = |source| Error::Listen { listen, source };
    let mut listeners = LISTENERS.lock().unwrap_or_else(PoisonError::into_inner);
    let listening = match listeners.entry(listen) {
        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::hash_map::Entry::Vacant(entry) => {
            let socket = std::sync::Arc::new(bind(listen).map_err(failed)?);
            let stop = CancellationToken::new();
            let span = tracing::info_span!("bgp_listener", %listen);
            // Watched: `accepting` starts its accept loop again after a panic, and ends with
            // `stop`.
            tokio::spawn(accepting(listen, socket.clone(), stop.clone()).instrument(span));
            entry.insert(Listening {
                peers: HashMap::new(),
                socket,
                stop,
            })
        }
    };
    let peer = canonical(peer);
    if listening.peers.contains_key(&peer) {
        return Err(Error::Config {
            peer: peer.to_string(),
            what: format!("a second passive peer with this address on {listen}"),
        });
    }
    if let Some(Password(key)) = password {
        crate::md5::set(&*listening.socket, peer, key).map_err(failed)?;
    }
    listening.peers.insert(peer, None);
    info!(%listen, %peer, "waiting for the router's BGP connections (passive)");
    Ok(Registration { listen, peer })
}

/// A listening socket on `listen`, non-blocking, with `SO_REUSEADDR` (a restarted agent binds at once
/// while the connections of the one before it linger in TIME_WAIT); a socket on `[::]` takes IPv4 too.
fn bind(listen: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(listen);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if listen.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&listen.into())?;
    socket.listen(16)?;
    TcpListener::from_std(socket.into())
}

/// Runs [`accept_loop`] until `stop`, started again [`ACCEPT_RETRY`] later should it panic (a bug): every
/// passive peer's connections come through it, and a loop that died would leave them waiting for good.
/// This crate depends on no framework (the manager's supervisor is not at hand), so the loop is
/// restarted here, in place; `stop` (the last peer gone) ends it.
async fn accepting(
    listen: SocketAddr,
    socket: std::sync::Arc<TcpListener>,
    stop: CancellationToken,
) {
    let run = || accept_loop(listen, socket.clone(), stop.clone()).in_current_span();
    restarted_after_panics(run, &stop, &ACCEPT_LOOP_RESTARTS).await;
}

/// Runs the task `run` makes until it returns or `stop`; one that panics is logged, counted in
/// `restarts` and made again [`ACCEPT_RETRY`] later.
async fn restarted_after_panics<F>(
    run: impl Fn() -> F,
    stop: &CancellationToken,
    restarts: &AtomicU64,
) where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        // Watched: awaited here; a panic is logged and the loop started again.
        match tokio::spawn(run()).await {
            Err(err) if err.is_panic() && !stop.is_cancelled() => {
                restarts.fetch_add(1, Ordering::Relaxed);
                let message = err
                    .into_panic()
                    .downcast::<String>()
                    .map(|s| *s)
                    .or_else(|panic| panic.downcast::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|_| "(no message)".to_owned());
                tracing::error!(
                    "the BGP listener's accept loop panicked (a bug): {message}; starting it again in {ACCEPT_RETRY:?}"
                );
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
            _ => return,
        }
    }
}

/// Accepts until `stop`, handing each connection to the peer it comes from.
async fn accept_loop(
    listen: SocketAddr,
    socket: std::sync::Arc<TcpListener>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = socket.accept() => accepted,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(error = %err, "cannot accept a BGP connection");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let from = canonical(remote.ip());
        let waiting = LISTENERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&listen)
            .and_then(|listening| listening.peers.get_mut(&from))
            .map(Option::take);
        match waiting {
            None => {
                info!(%remote, "a BGP connection from an address that is no passive peer's: closed");
            }
            Some(None) => {
                info!(%remote, "a second BGP connection from the router while its session runs: closed (RFC 4271 §6.8)");
            }
            Some(Some(sender)) => match sender.send(stream) {
                Ok(()) => debug!(%remote, "a BGP connection from the router"),
                Err(_) => debug!(%remote, "the peer stopped waiting: closed"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;

    /// A boxed run of the loop.
    type Run = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

    /// A run that panics on its `panics` first turns, counting its runs.
    fn panicking(panics: u32, runs: &Arc<AtomicU32>) -> impl Fn() -> Run {
        let runs = runs.clone();
        move || {
            let runs = runs.clone();
            Box::pin(async move {
                if runs.fetch_add(1, Ordering::SeqCst) < panics {
                    panic!("a bug in the accept loop");
                }
            })
        }
    }

    /// An accept loop that panics (a bug) is started again, not lost: every passive peer's connections
    /// come through it.
    #[tokio::test]
    async fn an_accept_loop_that_panics_is_started_again() {
        let runs = Arc::new(AtomicU32::new(0));
        let stop = CancellationToken::new();
        let restarts = AtomicU64::new(0);
        let ended = restarted_after_panics(panicking(2, &runs), &stop, &restarts);
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("ends once a run returns");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a run that returns"
        );
        assert_eq!(restarts.load(Ordering::SeqCst), 2, "each restart counted");
    }

    /// Once stopped (the last peer gone), a panic ends it: nothing is started again.
    #[tokio::test]
    async fn a_stopped_accept_loop_that_panics_is_not_started_again() {
        let runs = Arc::new(AtomicU32::new(0));
        let stop = CancellationToken::new();
        stop.cancel();
        let restarts = AtomicU64::new(0);
        restarted_after_panics(panicking(5, &runs), &stop, &restarts).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(
            restarts.load(Ordering::SeqCst),
            0,
            "not restarted, not counted"
        );
    }
}
