//! The data plane of the `local` provider: Service load balancers that really carry traffic on
//! machines you own.
//!
//! A [`DataPlane`] runs any number of load balancers. Each has listeners (one per VIP, port and
//! protocol, TCP or UDP) that relay to the nodes' `address:NodePort`:
//!
//! - **TCP**: every accepted connection is relayed to one healthy backend (tried in turn, up to three,
//!   each within [`Settings::connect_timeout`]), both ways with half-close, optionally behind a PROXY
//!   protocol v2 header. `TCP_NODELAY` on both sides; a 64 KiB buffer per direction, allocated with
//!   the first bytes (an idle connection costs about 3 KB in all) and never zeroed. Connections are
//!   accepted and relayed on the data plane's own relay threads (one current-thread runtime per core,
//!   [`Settings::relay_threads`]), each on the least loaded thread, where it stays. What the client
//!   sent by the time its connection is taken (one read, up to 1 KiB) goes to the backend with the
//!   PROXY header as soon as the backend's handshake is done, without a turn of the event loop in
//!   between (haproxy's order).
//! - **UDP**: every client address gets its own upstream socket, relayed both ways and closed after
//!   [`Settings::udp_idle_timeout`], on the runtime that calls [`DataPlane::apply`] (as are the
//!   health checks).
//! - Backends are picked round robin over the healthy ones; `sessionAffinity: ClientIP` keeps a client
//!   IP on one backend (a map with expiry). Health checks are HTTP `GET`s, shared by every load
//!   balancer that checks the same (address, port, path).
//! - With no healthy backend a TCP connection is reset at once (never left hanging) and a UDP datagram
//!   dropped. A change of backends never cuts an established connection.
//!
//! - Metrics ([`DataPlane::register_metrics`], names in [`metrics::names`]) are read from atomics at
//!   scrape time; the data path takes no lock per byte or datagram (one uncontended read lock per new
//!   connection or UDP flow, plus the affinity map's lock when affinity is on).
//!
//! The crate has no Kubernetes types, so it can also run as a per-node agent. How it compares with
//! haproxy: `bench/data-plane` and `bench/results/data-plane-*.md` in the repository.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

mod apply;
mod budget;
mod error;
mod handover;
mod health;
pub mod metrics;
mod pool;
mod relay_threads;
mod restart;
mod sockets;
mod spec;
mod tcp;
mod udp;

pub use error::{ApplyError, BindFailure, ListenerFailure};
pub use handover::HandedSocket;
pub use spec::{
    Backend, BackendState, HealthCheck, HealthCheckTiming, ListenerSpec, ListenerState,
    LoadBalancerSpec, LoadBalancerState, Protocol, Settings,
};

pub use relay_threads::{DEFAULT_MAX_RELAY_THREADS, RUNTIME_EVENT_INTERVAL};

use handover::ListeningSocket;
use health::ProbeRegistry;
use pool::ListenerShared;
use spec::ListenerKey;

/// How long a listener's loop that panicked (a bug) waits before it is started again.
const ACCEPT_LOOP_RESTART: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs load balancers. Cheap to clone (the clones share everything). TCP listeners run on the data
/// plane's relay threads, started with the first one and stopped (with every connection still on
/// them) when the last clone is dropped; UDP listeners and health checks run on the tokio runtime that
/// calls [`DataPlane::apply`].
#[derive(Debug, Clone)]
pub struct DataPlane {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    settings: Settings,
    /// The descriptors the listeners share (see `budget`).
    budget: Arc<budget::Budget>,
    probes: ProbeRegistry,
    load_balancers: Mutex<HashMap<String, Arc<LoadBalancer>>>,
    /// Listening sockets handed over by the process this one replaces, taken by the listeners that
    /// bind their address (see [`DataPlane::inherit`]).
    inherited: Mutex<HashMap<ListenerKey, std::os::fd::OwnedFd>>,
    /// The threads TCP connections are relayed on, started with the first TCP listener.
    relay_threads: std::sync::OnceLock<relay_threads::RelayThreads>,
    /// Held while the relay threads start, so that they start once.
    starting_relay_threads: Mutex<()>,
}

/// One load balancer. `op` serializes `apply` and `remove` of this name; `run` is only held for
/// short, non-awaiting sections.
#[derive(Debug)]
struct LoadBalancer {
    name: Arc<str>,
    op: Arc<tokio::sync::Mutex<()>>,
    run: Mutex<Running>,
}

#[derive(Debug, Default)]
struct Running {
    spec: Option<LoadBalancerSpec>,
    listeners: BTreeMap<ListenerKey, RunningListener>,
    failed: Vec<(ListenerSpec, String)>,
    removed: bool,
}

#[derive(Debug)]
struct RunningListener {
    shared: Arc<ListenerShared>,
    local_addr: SocketAddr,
    /// This listener's share of its socket, to be handed over ([`DataPlane::hand_over`]); dropped
    /// when it stops accepting.
    socket: Option<ListeningSocket>,
    /// Stops accepting (the socket closes when the accept loop ends).
    stop: CancellationToken,
    /// The accept loop; it returns the connections still open when it stops.
    accept_loop: Option<JoinHandle<JoinSet<()>>>,
    /// The open connections, once the accept loop has stopped.
    connections: JoinSet<()>,
}

impl RunningListener {
    /// Stops accepting and waits until the socket is closed.
    async fn stop_accepting(&mut self) {
        self.socket = None;
        self.stop.cancel();
        if let Some(accept_loop) = self.accept_loop.take() {
            match accept_loop.await {
                Ok(connections) => self.connections = connections,
                Err(error) => warn!(%error, "accept loop ended abnormally"),
            }
        }
    }
}

/// Closes `listeners` at once, lets their connections finish for at most `drain`, then cuts them.
async fn close_listeners(mut listeners: Vec<RunningListener>, drain: Duration) {
    for listener in &mut listeners {
        listener.stop_accepting().await;
    }
    drain_listeners(listeners, drain).await;
}

/// Lets the connections of stopped listeners finish for at most `drain`, then cuts them.
async fn drain_listeners(mut listeners: Vec<RunningListener>, drain: Duration) {
    let deadline = tokio::time::Instant::now() + drain;
    for listener in &mut listeners {
        let connections = &mut listener.connections;
        let finished = tokio::time::timeout_at(deadline, async {
            while connections.join_next().await.is_some() {}
        });
        if finished.await.is_err() {
            break;
        }
    }
    let open: usize = listeners.iter().map(|l| l.connections.len()).sum();
    if open > 0 {
        info!(open, "drain time over: cutting the remaining connections");
        for listener in &mut listeners {
            listener.connections.shutdown().await;
        }
    }
}

impl DataPlane {
    /// A data plane with nothing running.
    pub fn new(settings: Settings) -> Self {
        DataPlane {
            inner: Arc::new(Inner {
                budget: budget::Budget::for_limit(settings.open_files_limit),
                probes: ProbeRegistry::new(settings.health_check.clone()),
                settings,
                load_balancers: Mutex::new(HashMap::new()),
                inherited: Mutex::new(HashMap::new()),
                relay_threads: std::sync::OnceLock::new(),
                starting_relay_threads: Mutex::new(()),
            }),
        }
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Registers per-load-balancer metrics (see [`metrics::names`]): connections total and active,
    /// bytes in and out, refusals, backend connect errors (labelled `load_balancer`, `listener`) and
    /// backend health 0/1 (also labelled `backend` and `node`). Values are read at scrape time.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(metrics::DataPlaneCollector {
            inner: Arc::downgrade(&self.inner),
        }));
    }

    /// Creates or updates one load balancer. Idempotent: an unchanged spec whose listeners all run
    /// does nothing (one whose listeners failed to bind retries them).
    ///
    /// New listeners are bound; the backends, health check, affinity, source ranges and PROXY setting
    /// of running listeners are updated in place (established connections are never cut, they keep
    /// their backend); listeners that left the spec stop accepting at once and their connections are
    /// drained in the background for at most [`Settings::drain_timeout`]. New health checks get their
    /// first result (bounded by the health-check timeout) before any listener uses them, so a backend
    /// that fails its first check never gets traffic.
    ///
    /// A listener that cannot be bound is named in [`ApplyError::Listeners`] while every other
    /// listener of this and other load balancers keeps serving.
    pub async fn apply(&self, spec: LoadBalancerSpec) -> Result<(), ApplyError> {
        let span = info_span!("load_balancer", name = %spec.name);
        self.apply_inner(spec).instrument(span).await
    }

    fn start_listener(&self, shared: Arc<ListenerShared>) -> std::io::Result<RunningListener> {
        let stop = CancellationToken::new();
        let span = info_span!("listener", listener = %shared.label);
        // The relay threads start before a socket handed over is taken, so that failing to start them
        // leaves it there.
        if shared.spec.protocol == Protocol::Tcp {
            self.relay_threads()?;
        }
        let key = shared.spec.key();
        let inherited = lock(&self.inner.inherited).remove(&key);
        let handed_over = inherited.is_some();
        if handed_over {
            info!(listener = %shared.label, "taking over the socket handed over");
        }
        let socket = sockets::open(shared.spec.protocol, inherited, shared.spec.socket_addr())?;
        let local_addr = socket.local_addr()?;
        let parts = (&shared, &stop);
        let accept_loop = match &socket {
            ListeningSocket::Tcp(listener) => {
                let timeouts = tcp::Timeouts {
                    connect: self.inner.settings.connect_timeout,
                    idle: self.inner.settings.tcp_idle_timeout,
                };
                let pool = self.relay_threads()?.pool().clone();
                let index = pool.next_acceptor();
                let runtime = pool.runtime(index).clone();
                let options = if handed_over {
                    tcp::adopt_connection_options(listener)
                } else {
                    Ok(tcp::ConnectionOptions::FromTheListener)
                };
                let prepared = options.and_then(|options| {
                    Ok((options, sockets::tcp_listener_on(&runtime, listener)?))
                });
                let (options, listener) = match prepared {
                    Ok((options, listener)) => (options, Arc::new(listener)),
                    Err(error) => {
                        // A socket handed over goes back for the next try: binding a new one would
                        // fail while the process that handed it over still listens.
                        if handed_over && let Ok(fd) = socket.duplicate() {
                            lock(&self.inner.inherited).insert(key, fd);
                        }
                        return Err(error);
                    }
                };
                let on = tcp::AcceptingThread { pool, index };
                let serve = move |listener, shared, stop| {
                    tcp::serve(listener, shared, stop, timeouts, options, on.clone())
                };
                let what = "a TCP listener's accept loop";
                spawn_serving(&runtime, what, &listener, parts, span, serve)
            }
            ListeningSocket::Udp(socket) => {
                let idle = self.inner.settings.udp_idle_timeout;
                let serve = move |socket, shared, stop| udp::serve(socket, shared, stop, idle);
                let here = tokio::runtime::Handle::current();
                let what = "a UDP listener's receive loop";
                spawn_serving(&here, what, socket, parts, span, serve)
            }
        };
        Ok(RunningListener {
            shared,
            local_addr,
            socket: Some(socket),
            stop,
            accept_loop: Some(accept_loop),
            connections: JoinSet::new(),
        })
    }

    /// The relay threads, started on first use.
    fn relay_threads(&self) -> std::io::Result<&relay_threads::RelayThreads> {
        if let Some(threads) = self.inner.relay_threads.get() {
            return Ok(threads);
        }
        let _starting = lock(&self.inner.starting_relay_threads);
        if let Some(threads) = self.inner.relay_threads.get() {
            return Ok(threads);
        }
        let started = relay_threads::RelayThreads::start(self.inner.settings.relay_threads)
            .map_err(|error| {
                std::io::Error::new(
                    error.kind(),
                    format!("cannot start the relay threads: {error}"),
                )
            })?;
        info!(threads = started.pool().len(), "relay threads started");
        Ok(self.inner.relay_threads.get_or_init(|| started))
    }

    /// Closes every listener of the named load balancer at once (new connections refused), lets
    /// established connections finish for at most [`Settings::drain_timeout`], then cuts them. Returns
    /// when all are gone. Unknown names are fine (nothing to do).
    pub async fn remove(&self, name: &str) {
        let span = info_span!("load_balancer", name = %name);
        self.remove_inner(name).instrument(span).await
    }

    async fn remove_inner(&self, name: &str) {
        let Some(lb) = lock(&self.inner.load_balancers).remove(name) else {
            return;
        };
        let _op = lb.op.clone().lock_owned().await;
        let listeners: Vec<RunningListener> = {
            let mut run = lock(&lb.run);
            run.removed = true;
            run.spec = None;
            run.failed.clear();
            std::mem::take(&mut run.listeners).into_values().collect()
        };
        info!(listeners = listeners.len(), "removing");
        close_listeners(listeners, self.inner.settings.drain_timeout).await;
    }

    /// What is running for `name`: bound listeners, each backend's current health, and the listeners
    /// that failed to bind. `None` if the name is unknown.
    pub fn state(&self, name: &str) -> Option<LoadBalancerState> {
        let lb = lock(&self.inner.load_balancers).get(name)?.clone();
        let run = lock(&lb.run);
        let listeners = run
            .listeners
            .values()
            .map(|l| ListenerState {
                // The node port can change in place (only the backends' addresses change).
                spec: ListenerSpec {
                    node_port: l.shared.config().node_port,
                    ..l.shared.spec
                },
                local_addr: l.local_addr,
                backends: l
                    .shared
                    .config()
                    .backends
                    .iter()
                    .map(|b| BackendState {
                        node: b.node.clone(),
                        address: b.addr,
                        healthy: b.is_healthy(),
                        active_connections: b.active.load(std::sync::atomic::Ordering::Relaxed),
                    })
                    .collect(),
                active_connections: l
                    .shared
                    .stats
                    .active
                    .load(std::sync::atomic::Ordering::Relaxed),
            })
            .collect();
        Some(LoadBalancerState {
            name: lb.name.to_string(),
            listeners,
            failed_listeners: run.failed.clone(),
        })
    }

    /// Names of the load balancers it runs.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.inner.load_balancers).keys().cloned().collect();
        names.sort();
        names
    }

    /// A copy of every listening socket, to hand over to the process that replaces this one (a rolling
    /// update of the node agents): that process takes them with [`DataPlane::inherit`] and accepts
    /// from the same sockets, so no connection waiting to be accepted is refused. This one goes on
    /// accepting until its [`DataPlane::shutdown`], whose drain then lets its own connections finish.
    pub fn hand_over(&self) -> std::io::Result<Vec<HandedSocket>> {
        let lbs: Vec<Arc<LoadBalancer>> =
            lock(&self.inner.load_balancers).values().cloned().collect();
        let mut handed = Vec::new();
        for lb in lbs {
            for (key, listener) in &lock(&lb.run).listeners {
                if let Some(socket) = &listener.socket {
                    handed.push(HandedSocket {
                        protocol: key.protocol,
                        addr: key.addr,
                        fd: socket.duplicate()?,
                    });
                }
            }
        }
        handed.sort_by_key(|h| (h.addr, h.protocol));
        Ok(handed)
    }

    /// Takes the listening sockets the process this one replaces handed over ([`DataPlane::hand_over`]):
    /// a listener of the same address and protocol started by a later [`DataPlane::apply`] accepts
    /// from its socket instead of binding a new one. Those no listener takes are closed by
    /// [`DataPlane::close_inherited`].
    pub fn inherit(&self, sockets: Vec<HandedSocket>) {
        let mut inherited = lock(&self.inner.inherited);
        for socket in sockets {
            inherited.insert(
                ListenerKey {
                    addr: socket.addr,
                    protocol: socket.protocol,
                },
                socket.fd,
            );
        }
    }

    /// Closes the inherited sockets no listener took (their Services are no longer served here);
    /// returns how many.
    pub fn close_inherited(&self) -> usize {
        let mut inherited = lock(&self.inner.inherited);
        let left = inherited.len();
        for key in inherited.keys() {
            info!(listener = %format!("{}/{}", key.addr, key.protocol), "closing a socket handed over that no listener took");
        }
        inherited.clear();
        left
    }

    /// Closes everything (manager shutdown, leadership lost): every load balancer is removed as by
    /// [`DataPlane::remove`], all at once, so this takes at most one drain time. The data plane stays
    /// usable: a later `apply` starts afresh.
    pub async fn shutdown(&self) {
        let mut removals = tokio::task::JoinSet::new();
        for name in self.names() {
            let this = self.clone();
            removals.spawn(async move { this.remove(&name).await });
        }
        while removals.join_next().await.is_some() {}
    }
}

impl Inner {
    /// Every running listener (for the metrics).
    pub(crate) fn all_listeners(&self) -> Vec<Arc<ListenerShared>> {
        let lbs: Vec<Arc<LoadBalancer>> = lock(&self.load_balancers).values().cloned().collect();
        let mut listeners = Vec::new();
        for lb in lbs {
            listeners.extend(lock(&lb.run).listeners.values().map(|l| l.shared.clone()));
        }
        listeners.sort_by(|a, b| (&a.load_balancer, &a.label).cmp(&(&b.load_balancer, &b.label)));
        listeners
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spawns a listener's loop, `serve` over its socket, on `runtime`, in `span`. Watched: started again
/// after a panic (`restart::restarting`) until `stop` is cancelled; the handle is kept (`accept_loop`)
/// and awaited when the listener stops accepting.
fn spawn_serving<S, Fut>(
    runtime: &tokio::runtime::Handle,
    what: &'static str,
    socket: &Arc<S>,
    (shared, stop): (&Arc<ListenerShared>, &CancellationToken),
    span: tracing::Span,
    serve: impl Fn(Arc<S>, Arc<ListenerShared>, CancellationToken) -> Fut + Send + 'static,
) -> JoinHandle<JoinSet<()>>
where
    S: Send + Sync + 'static,
    Fut: Future<Output = JoinSet<()>> + Send + 'static,
{
    let (socket, shared, stop) = (socket.clone(), shared.clone(), stop.clone());
    let task = restart::restarting(
        &restart::ACCEPT_LOOP,
        what,
        ACCEPT_LOOP_RESTART,
        move || (!stop.is_cancelled()).then(|| serve(socket.clone(), shared.clone(), stop.clone())),
    );
    // Watched: `restarting` starts the loop again after a panic; the caller keeps the handle.
    runtime.spawn(task.instrument(span))
}
