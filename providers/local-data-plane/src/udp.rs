//! UDP listeners: one upstream socket per client address, relayed both ways, forgotten after the idle
//! timeout. Replies leave through the listener's socket, so clients see them come from the VIP.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::Type;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::budget::Claim;
use crate::pool::{ActiveGuard, BackendEntry, ListenerConfig, ListenerShared};
use crate::sockets;

const MAX_DATAGRAM: usize = 64 * 1024;

thread_local! {
    /// The buffer every flow's replies are received into, one per runtime thread: a reply is received
    /// and sent on within one poll, so no flow holds a buffer between datagrams. (A buffer per flow
    /// held 64 KiB for each of thousands of flows, and the allocator kept that memory after they
    /// ended: 24,000 new senders took the process from 32 MB to about 400 MB for good.)
    static REPLY_BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_DATAGRAM]);
}

/// The most flows one listener keeps. Each holds a socket (a file descriptor) until it is idle for
/// `udpIdleTimeout`; clients that use a new source port per request (DNS) or spoofed sources would
/// otherwise take every descriptor of the process. At the cap, the least recently active flow goes.
pub(crate) const MAX_FLOWS_PER_LISTENER: usize = 8192;

/// Binds `addr` (no `SO_REUSEADDR`: for UDP it would let two sockets share the port).
pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = sockets::for_address(addr, Type::DGRAM, socket2::Protocol::UDP)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

/// One client address's flow.
struct Flow {
    upstream: Arc<UdpSocket>,
    /// Milliseconds since `epoch` of the last datagram either way.
    last_active: AtomicU64,
    closed: AtomicBool,
    /// Ends the flow's reply task at once (eviction, or a backend or source range that no longer
    /// holds).
    cancel: CancellationToken,
    /// Its upstream socket's descriptor, from the budget.
    _claim: Claim,
}

/// A flow as the receive loop tracks it: with the listener config and the backend it was last checked
/// against, so a datagram costs one pointer comparison while nothing changed.
struct FlowEntry {
    flow: Arc<Flow>,
    config: Arc<ListenerConfig>,
    backend: Arc<BackendEntry>,
}

impl FlowEntry {
    /// Whether the flow may go on: its source is still allowed and its backend is still one of the
    /// listener's and healthy. A config that changed elsewhere (another backend added) keeps it.
    fn still_valid(&mut self, current: &Arc<ListenerConfig>, peer: SocketAddr) -> bool {
        if !self.backend.is_healthy() {
            return false;
        }
        if Arc::ptr_eq(&self.config, current) {
            return true;
        }
        let valid = current.allows(peer.ip())
            && current
                .backends
                .iter()
                .any(|b| Arc::ptr_eq(b, &self.backend));
        if valid {
            self.config = current.clone();
        }
        valid
    }

    fn close(&self) {
        self.flow.closed.store(true, Ordering::Relaxed);
        self.flow.cancel.cancel();
    }
}

/// The receive loop of one listener; ends when `stop` is cancelled, and so do its flows (a UDP flow
/// has no connection to drain): it returns an empty set.
pub(crate) async fn serve(
    socket: Arc<UdpSocket>,
    shared: Arc<ListenerShared>,
    stop: CancellationToken,
    idle_timeout: Duration,
) -> JoinSet<()> {
    let mut relay = Relay {
        socket: socket.clone(),
        config: (0, shared.config()),
        shared,
        stop: stop.clone(),
        idle_timeout,
        epoch: Instant::now(),
        flows: HashMap::new(),
        tasks: JoinSet::new(),
    };
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut sweep = tokio::time::interval(
        idle_timeout.clamp(Duration::from_millis(100), Duration::from_secs(10)),
    );
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (len, peer) = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = sweep.tick() => {
                relay.sweep();
                continue;
            }
            received = socket.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(error) => {
                    debug!(%error, "receive failed");
                    continue;
                }
            },
        };
        if let Some(flow) = relay.flow_for(peer).await {
            relay.forward(&flow, &buf[..len]).await;
        }
    }
    relay.tasks.shutdown().await;
    relay.tasks
}

/// What the receive loop of one listener works with: the listener, its flows by client address and
/// the flows' reply tasks.
struct Relay {
    /// The listener's socket; replies leave through it.
    socket: Arc<UdpSocket>,
    shared: Arc<ListenerShared>,
    /// The listener's configuration as last read, and its version
    /// ([`ListenerShared::config_since`]): read again only when it changed.
    config: (u64, Arc<ListenerConfig>),
    /// Cancelled when the listener stops; each flow's `cancel` is a child of it.
    stop: CancellationToken,
    idle_timeout: Duration,
    /// What the flows' `last_active` counts from.
    epoch: Instant,
    flows: HashMap<SocketAddr, FlowEntry>,
    tasks: JoinSet<()>,
}

impl Relay {
    /// Forgets the closed flows, gives back the table's room after a burst and reaps the reply tasks
    /// that ended.
    fn sweep(&mut self) {
        self.flows
            .retain(|_, entry| !entry.flow.closed.load(Ordering::Relaxed));
        // A burst of flows leaves a table sized for it: give the room back once it is mostly empty.
        if self.flows.capacity() > 4 * self.flows.len() + 64 {
            self.flows.shrink_to_fit();
        }
        while self.tasks.try_join_next().is_some() {}
    }

    /// The flow a datagram from `peer` goes to: its flow if it may go on, else a new one. `None` if
    /// the datagram is dropped (refused, or no upstream socket could be opened).
    async fn flow_for(&mut self, peer: SocketAddr) -> Option<Arc<Flow>> {
        if let Some(changed) = self.shared.config_since(self.config.0) {
            self.config = changed;
        }
        let current = self.config.1.clone();
        if let Some(flow) = self.existing_flow(peer, &current) {
            return Some(flow);
        }
        self.new_flow(peer, current).await
    }

    /// The open flow of `peer`, if it may go on. One whose backend went (or turned unhealthy) or whose
    /// source is no longer allowed ends here, and the datagram is judged as a new flow's.
    #[inline]
    fn existing_flow(
        &mut self,
        peer: SocketAddr,
        current: &Arc<ListenerConfig>,
    ) -> Option<Arc<Flow>> {
        let entry = self.flows.get_mut(&peer)?;
        if entry.flow.closed.load(Ordering::Relaxed) {
            return None;
        }
        if entry.still_valid(current, peer) {
            return Some(entry.flow.clone());
        }
        entry.close();
        self.flows.remove(&peer);
        None
    }

    /// Starts a flow for `peer` under `config`: a backend, room in the table, a descriptor from the
    /// budget, an upstream socket, and the task that relays the replies. `None` (counted) if any is
    /// refused.
    async fn new_flow(
        &mut self,
        peer: SocketAddr,
        config: Arc<ListenerConfig>,
    ) -> Option<Arc<Flow>> {
        let backend = self.admit(peer, &config)?;
        if self.flows.len() >= MAX_FLOWS_PER_LISTENER {
            evict_one(&mut self.flows);
        }
        let stats = &self.shared.stats;
        let Some(claim) = self.shared.budget.claim(peer.ip(), 1) else {
            stats.refused_budget.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let upstream = match connect_upstream(backend.addr).await {
            Ok(upstream) => Arc::new(upstream),
            Err(error) => {
                stats.backend_connect_errors.fetch_add(1, Ordering::Relaxed);
                warn!(backend = %backend.addr, %error, "cannot open a UDP socket to the backend");
                return None;
            }
        };
        let flow = Arc::new(Flow {
            upstream,
            last_active: AtomicU64::new(millis_since(self.epoch)),
            closed: AtomicBool::new(false),
            cancel: self.stop.child_token(),
            _claim: claim,
        });
        self.flows.insert(
            peer,
            FlowEntry {
                flow: flow.clone(),
                config,
                backend: backend.clone(),
            },
        );
        self.spawn_replies(flow.clone(), peer, backend);
        Some(flow)
    }

    /// The backend for a new flow from `peer`, if its source is allowed and a backend is healthy;
    /// else the refusal is counted.
    fn admit(&self, peer: SocketAddr, config: &ListenerConfig) -> Option<Arc<BackendEntry>> {
        let stats = &self.shared.stats;
        if !config.allows(peer.ip()) {
            stats.refused_source.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let backend = self.shared.pick(config, peer.ip(), &[]);
        if backend.is_none() {
            stats.refused_no_backend.fetch_add(1, Ordering::Relaxed);
        }
        backend
    }

    /// Starts the task that relays `backend`'s replies on `flow` back to `peer`.
    fn spawn_replies(&mut self, flow: Arc<Flow>, peer: SocketAddr, backend: Arc<BackendEntry>) {
        let span = tracing::debug_span!("flow", %peer, backend = %backend.addr);
        self.tasks.spawn(
            replies(
                flow,
                peer,
                self.socket.clone(),
                self.shared.clone(),
                backend,
                self.epoch,
                self.idle_timeout,
            )
            .instrument(span),
        );
    }

    /// Sends a client's datagram on to the flow's backend, and notes the flow active and the bytes.
    async fn forward(&self, flow: &Flow, datagram: &[u8]) {
        flow.last_active
            .store(millis_since(self.epoch), Ordering::Relaxed);
        self.shared
            .stats
            .bytes_in
            .fetch_add(datagram.len() as u64, Ordering::Relaxed);
        // Usually the datagram goes out at once. A socket that is new (its readiness not yet seen by
        // the reactor) or whose send buffer is full waits for writability: that is back-pressure on
        // this listener, bounded because UDP sends to a connected socket drain in microseconds.
        let sent = match flow.upstream.try_send(datagram) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                flow.upstream.send(datagram).await
            }
            other => other,
        };
        if let Err(error) = sent {
            debug!(%error, "send to backend failed");
        }
    }
}

/// Makes room for one flow: the closed ones go, else the least recently active one.
fn evict_one(flows: &mut HashMap<SocketAddr, FlowEntry>) {
    flows.retain(|_, entry| !entry.flow.closed.load(Ordering::Relaxed));
    if flows.len() < MAX_FLOWS_PER_LISTENER {
        return;
    }
    let oldest = flows
        .iter()
        .min_by_key(|(_, entry)| entry.flow.last_active.load(Ordering::Relaxed))
        .map(|(peer, _)| *peer);
    if let Some(peer) = oldest
        && let Some(entry) = flows.remove(&peer)
    {
        debug!(%peer, "too many UDP flows on this listener; the least recently active one ends");
        entry.close();
    }
}

async fn connect_upstream(backend: SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = if backend.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(backend).await?;
    Ok(socket)
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Relays the backend's datagrams back to the client until the flow is idle or the listener stops.
#[allow(clippy::too_many_arguments)]
async fn replies(
    flow: Arc<Flow>,
    client: SocketAddr,
    listener: Arc<UdpSocket>,
    shared: Arc<ListenerShared>,
    backend: Arc<BackendEntry>,
    epoch: Instant,
    idle_timeout: Duration,
) {
    let _active = ActiveGuard::new(shared.clone(), backend);
    // One timer per idle period, not one per datagram: when it fires, it is re-armed for what is
    // left if the flow was active meanwhile.
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            () = flow.cancel.cancelled() => break,
            () = &mut idle => {
                let idle_for = Duration::from_millis(
                    millis_since(epoch).saturating_sub(flow.last_active.load(Ordering::Relaxed)),
                );
                match idle_timeout.checked_sub(idle_for).filter(|left| !left.is_zero()) {
                    Some(left) => idle.as_mut().reset(tokio::time::Instant::now() + left),
                    None => break,
                }
            }
            ready = flow.upstream.readable() => {
                if ready.is_err() {
                    break;
                }
                let reply = REPLY_BUFFER.with_borrow_mut(|buf| match flow.upstream.try_recv(buf) {
                    Ok(len) => {
                        flow.last_active.store(millis_since(epoch), Ordering::Relaxed);
                        shared.stats.bytes_out.fetch_add(len as u64, Ordering::Relaxed);
                        match listener.try_send_to(&buf[..len], client) {
                            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                                Some(buf[..len].to_vec())
                            }
                            Err(error) => {
                                debug!(%error, "send to client failed");
                                None
                            }
                            Ok(_) => None,
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
                    // E.g. ECONNREFUSED from an ICMP port unreachable: the flow stays until idle.
                    Err(error) => {
                        debug!(%error, "receive from backend failed");
                        None
                    }
                });
                // The listener's send buffer was full: this datagram (its own length, not a
                // buffer's) waits for room.
                if let Some(datagram) = reply
                    && let Err(error) = listener.send_to(&datagram, client).await
                {
                    debug!(%error, "send to client failed");
                }
            }
        }
    }
    flow.closed.store(true, Ordering::Relaxed);
}
