//! Liveness between the agents themselves, over the node network rather than through the API server:
//! SWIM (the protocol of HashiCorp's memberlist, which MetalLB's speakers run), from the `foca` crate,
//! over UDP on each node's InternalIP, every packet sealed with the key of a Secret ([`envelope`]).
//!
//! Why `foca`: it is SWIM with memberlist's extensions (suspicion, indirect probes, periodic gossip,
//! rejoin after a false "down"), sans-IO (no runtime, no sockets of its own: it runs in one task of
//! ours, on our socket, with our envelope), and small. The `memberlist` crate brings its own runtime
//! abstraction, transports (TCP, QUIC) and encryption, which we would have to switch off or wrap.
//!
//! The agent reads a [`View`] of it: which other agents are members now (alive or suspected, not yet
//! declared down), and whether any has been heard since this process started. What the agent makes of
//! it is [`super::judge`]'s: the rules that decide who announces while the API server is away.

mod envelope;
mod peer;

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    net::SocketAddr,
    num::{NonZeroU32, NonZeroUsize},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use foca::{AccumulatingRuntime, Foca, PostcardCodec, Timer};
use rand::rngs::StdRng;
use tokio::{
    net::UdpSocket,
    sync::{Notify, oneshot},
    task::JoinHandle,
};

pub(crate) use self::envelope::{Dropped, MIN_KEY_LEN};
use self::{envelope::Envelope, peer::Peer};
use super::{AgentHealth, AgentMetrics};
use crate::instances::lock;

/// The membership protocol's settings.
#[derive(Debug, Clone)]
pub(crate) struct MembershipSettings {
    /// The shared key (the membership Secret's), at least [`MIN_KEY_LEN`] bytes.
    pub key: Vec<u8>,
    /// Where this agent listens (the node's InternalIP and the membership port).
    pub bind: SocketAddr,
    /// How often each agent probes one other (round robin over the members).
    pub probe_interval: Duration,
    /// How long a member that did not answer a probe (directly, or through others) stays suspected
    /// before it is declared down.
    pub suspicion_timeout: Duration,
    /// How many nodes the cluster has (sizes how often a change is gossiped).
    pub expected_members: usize,
}

/// What the membership protocol says now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct View {
    /// The other agents that are members now (alive or suspected), by node, with their address.
    pub members: BTreeMap<String, SocketAddr>,
    /// Whether any other agent has been a member since this process started.
    pub heard_any: bool,
}

/// A running membership protocol: its task, and the view it keeps.
pub(crate) struct Membership {
    view: Arc<Mutex<View>>,
    address: SocketAddr,
    started: Instant,
    join: tokio::sync::mpsc::UnboundedSender<Vec<(String, SocketAddr)>>,
    stop: Option<oneshot::Sender<Stop>>,
    task: JoinHandle<Option<UdpSocket>>,
}

/// How the protocol's task stops.
#[derive(Debug)]
enum Stop {
    /// Tells the others it leaves (the agent stops for good).
    Leave,
    /// Stops without a word and hands its socket back, for the agent that replaces this one on the
    /// same node: the others keep this node as a member, and meet the successor as its newer self.
    HandOver,
}

/// Runs the membership protocol in a task of its own, which answers the socket to hand over. Should it
/// panic (a bug: the view would stay as it was), the agent's liveness fails for good (`part_died`).
fn spawn_watched<T: Send + 'static>(
    protocol: impl Future<Output = Option<T>> + Send + 'static,
    health: AgentHealth,
) -> tokio::task::JoinHandle<Option<T>> {
    let protocol = std::panic::AssertUnwindSafe(protocol);
    // Watched: catches the protocol's panic and fails `/healthz` (`part_died`); the handle is awaited
    // when the agent stops.
    tokio::spawn(async move {
        match futures::FutureExt::catch_unwind(protocol).await {
            Ok(socket) => socket,
            Err(panic) => {
                let why = format!(
                    "panicked: {}",
                    cloud_provider::panic_message(panic.as_ref())
                );
                tracing::error!(
                    "local-agent: the membership protocol {why}; the agent's health check fails from \
                     now on"
                );
                health.part_died("the membership protocol", &why);
                None
            }
        }
    })
}

/// The protocol's socket: `inherited`, the one the agent this one replaces handed over, when it is bound
/// to the address asked for (or any port was asked for); else one bound anew.
async fn socket_for(
    settings: &MembershipSettings,
    inherited: Option<std::os::fd::OwnedFd>,
) -> Result<UdpSocket, std::io::Error> {
    Ok(match inherited.map(take_socket) {
        Some(Ok(socket)) if socket.local_addr()? == settings.bind || settings.bind.port() == 0 => {
            tracing::info!(address = %settings.bind, "membership: on the socket handed over");
            socket
        }
        Some(Ok(socket)) => {
            tracing::warn!(handed = %socket.local_addr()?, bind = %settings.bind, "membership: the socket handed over is bound elsewhere: binding anew");
            drop(socket);
            bind_when_free(settings.bind).await?
        }
        Some(Err(err)) => {
            tracing::warn!(error = %err, "membership: the socket handed over is unusable: binding anew");
            bind_when_free(settings.bind).await?
        }
        None => bind_when_free(settings.bind).await?,
    })
}

impl Membership {
    /// Binds the socket (or takes `inherited`, the socket the agent this one replaces handed over,
    /// when it is bound to the same address) and starts the protocol as `node`; every change of the
    /// view wakes `changed`. The task runs until [`Membership::stopped`] or
    /// [`Membership::hand_over`]; should it panic (a bug: the view would stay as it was), `health`'s
    /// liveness fails for good.
    pub(crate) async fn start(
        node: &str,
        settings: MembershipSettings,
        metrics: AgentMetrics,
        health: AgentHealth,
        changed: Arc<Notify>,
        inherited: Option<std::os::fd::OwnedFd>,
    ) -> Result<Self, std::io::Error> {
        let socket = socket_for(&settings, inherited).await?;
        let address = socket.local_addr()?;
        let started_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        let me = Peer {
            node: node.to_owned(),
            addr: address,
            bump: started_ms,
        };
        let view = Arc::new(Mutex::new(View::default()));
        let (join, joins) = tokio::sync::mpsc::unbounded_channel();
        let (stop, stopping) = oneshot::channel();
        let envelope = Envelope::new(&settings.key, rand::random());
        let config = config(&settings);
        let protocol = Protocol {
            foca: Foca::new(me, config, rand::make_rng::<StdRng>(), PostcardCodec),
            socket,
            envelope,
            timers: BinaryHeap::new(),
            sequence: 0,
            view: view.clone(),
            metrics,
            changed,
        }
        .run(joins, stopping);
        let task = spawn_watched(protocol, health);
        Ok(Self {
            view,
            address,
            started: Instant::now(),
            join,
            stop: Some(stop),
            task,
        })
    }

    /// The address the others reach this agent at.
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// When the protocol started.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The view, shared (the heartbeat reports its size).
    pub(crate) fn shared_view(&self) -> Arc<Mutex<View>> {
        self.view.clone()
    }

    /// The view as it is now.
    pub(crate) fn view(&self) -> View {
        lock(&self.view).clone()
    }

    /// Asks `peers` (node, address) to let this agent in; those already members are left alone.
    pub(crate) fn join(&self, peers: Vec<(String, SocketAddr)>) {
        let _ = self.join.send(peers);
    }

    /// Whether the protocol's task has ended (it ends only with `shutdown`, or by a panic).
    pub(crate) fn ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the protocol after telling the others that this agent leaves, and waits for its task;
    /// says so if it had ended on its own.
    pub(crate) async fn stopped(self) {
        self.stop_with(Stop::Leave).await;
    }

    /// Stops the protocol without a word (the others keep this node as a member) and returns its
    /// socket, for the agent that replaces this one on this node.
    pub(crate) async fn hand_over(self) -> Option<std::os::fd::OwnedFd> {
        let socket = self.stop_with(Stop::HandOver).await?;
        match socket.into_std() {
            Ok(socket) => Some(socket.into()),
            Err(err) => {
                tracing::error!(error = %err, "membership: cannot hand the socket over");
                None
            }
        }
    }

    async fn stop_with(mut self, how: Stop) -> Option<UdpSocket> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(how);
        }
        match self.task.await {
            Ok(socket) => socket,
            Err(err) => {
                tracing::error!(error = %err, "the membership protocol's task failed");
                None
            }
        }
    }
}

/// How long [`bind_when_free`] waits for the address.
const FREE_WITHIN: Duration = Duration::from_secs(30);

/// Binds `address`, waiting up to [`FREE_WITHIN`] while it is in use: an agent of this node that
/// stops without handing over (its pod deleted while the DaemonSet creates the next) holds it until it
/// has taken its VIPs off and left the membership, which takes it a moment.
async fn bind_when_free(address: SocketAddr) -> std::io::Result<UdpSocket> {
    let deadline = tokio::time::Instant::now() + FREE_WITHIN;
    let mut said = false;
    loop {
        match UdpSocket::bind(address).await {
            Err(err)
                if err.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                if !said {
                    tracing::info!(%address, "membership: the address is in use (by the agent this one follows, stopping?): binding it once free");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// A UDP socket from a descriptor handed over; refused unless it is one.
fn take_socket(fd: std::os::fd::OwnedFd) -> std::io::Result<UdpSocket> {
    let socket = std::net::UdpSocket::from(fd);
    socket.set_nonblocking(true)?;
    let socket = UdpSocket::from_std(socket)?;
    // A descriptor of another kind fails here (no UDP socket has no local address).
    socket.local_addr()?;
    Ok(socket)
}

/// `foca`'s settings from ours: memberlist's LAN profile, with our probe interval and suspicion.
fn config(settings: &MembershipSettings) -> foca::Config {
    let size = u32::try_from(settings.expected_members.max(1)).unwrap_or(u32::MAX);
    let mut config = foca::Config::new_lan(NonZeroU32::new(size).unwrap_or(NonZeroU32::MIN));
    config.probe_period = settings.probe_interval;
    // A probe's direct answer is awaited a third of the interval, then others are asked to relay it.
    config.probe_rtt = settings.probe_interval / 3;
    config.suspect_to_down_after = settings.suspicion_timeout;
    // A partition that heals is noticed within seconds: ask two members known as down each 2 s.
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(2),
        num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
    });
    config.periodic_announce = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(10),
        num_members: NonZeroUsize::MIN,
    });
    config
}

/// The protocol's task: one socket, one `foca`, its timers.
struct Protocol {
    foca: Foca<Peer, PostcardCodec, StdRng, foca::NoCustomBroadcast>,
    socket: UdpSocket,
    envelope: Envelope,
    /// `foca`'s timers, earliest first (the sequence keeps those due at one instant in order).
    timers: BinaryHeap<Reverse<(Instant, u64, Timer<Peer>)>>,
    sequence: u64,
    view: Arc<Mutex<View>>,
    metrics: AgentMetrics,
    changed: Arc<Notify>,
}

impl Protocol {
    async fn run(
        mut self,
        mut joins: tokio::sync::mpsc::UnboundedReceiver<Vec<(String, SocketAddr)>>,
        mut stop: oneshot::Receiver<Stop>,
    ) -> Option<UdpSocket> {
        let mut runtime = AccumulatingRuntime::new();
        let mut buffer = vec![0u8; 65_536];
        loop {
            let next_timer = self.timers.peek().map(|Reverse((at, _, _))| *at);
            tokio::select! {
                how = &mut stop => {
                    // A dropped sender (the agent gone without a word) leaves too.
                    if let Ok(Stop::HandOver) = how {
                        tracing::info!("membership: stopped for the successor, without leaving");
                        return Some(self.socket);
                    }
                    if let Err(err) = self.foca.leave_cluster(&mut runtime) {
                        tracing::debug!(error = %err, "membership: leaving");
                    }
                    self.flush(&mut runtime).await;
                    return None;
                }
                received = self.socket.recv_from(&mut buffer) => match received {
                    Ok((length, from)) => self.receive(&buffer[..length], from, &mut runtime),
                    Err(err) => tracing::debug!(error = %err, "membership: receiving"),
                },
                Some(peers) = joins.recv() => {
                    let members = lock(&self.view).members.clone();
                    for (node, addr) in peers {
                        if members.get(&node) == Some(&addr) || addr == self.foca.identity().addr {
                            continue;
                        }
                        if let Err(err) = self.foca.announce(Peer { node, addr, bump: 0 }, &mut runtime) {
                            tracing::debug!(error = %err, "membership: announcing");
                        }
                    }
                }
                () = sleep_until(next_timer) => {
                    let now = Instant::now();
                    while let Some(Reverse((at, _, _))) = self.timers.peek() && *at <= now {
                        let Some(Reverse((_, _, timer))) = self.timers.pop() else { break };
                        if let Err(err) = self.foca.handle_timer(timer, &mut runtime) {
                            tracing::debug!(error = %err, "membership: a timer");
                        }
                    }
                }
            }
            self.flush(&mut runtime).await;
        }
    }

    /// Opens a datagram and hands its payload to `foca`; counts what is dropped.
    fn receive(
        &mut self,
        packet: &[u8],
        from: SocketAddr,
        runtime: &mut AccumulatingRuntime<Peer>,
    ) {
        match self.envelope.open(packet, SystemTime::now()) {
            Ok(payload) => {
                if let Err(err) = self.foca.handle_data(payload, runtime) {
                    // Sealed with our key, yet not a message `foca` takes (another version, or an
                    // agent of ours declared down and not told yet): counted as malformed.
                    tracing::debug!(%from, error = %err, "membership: a packet foca refused");
                    self.metrics.membership_dropped("refused");
                }
            }
            Err(why) => {
                tracing::debug!(%from, reason = why.label(), "membership: a packet dropped");
                self.metrics.membership_dropped(why.label());
            }
        }
    }

    /// Sends what `foca` queued, arms its timers, and publishes the view when it changed.
    async fn flush(&mut self, runtime: &mut AccumulatingRuntime<Peer>) {
        while let Some((to, data)) = runtime.to_send() {
            let packet = self.envelope.seal(&data, SystemTime::now());
            if let Err(err) = self.socket.send_to(&packet, to.addr).await {
                tracing::debug!(to = %to.addr, error = %err, "membership: sending");
            }
        }
        let now = Instant::now();
        while let Some((after, timer)) = runtime.to_schedule() {
            self.sequence += 1;
            self.timers
                .push(Reverse((now + after, self.sequence, timer)));
        }
        let mut notified = false;
        while let Some(notification) = runtime.to_notify() {
            tracing::debug!(?notification, "membership");
            notified = true;
        }
        if notified {
            self.publish();
        }
    }

    fn publish(&self) {
        let members: BTreeMap<String, SocketAddr> = self
            .foca
            .iter_members()
            .map(|m| (m.id().node.clone(), m.id().addr))
            .filter(|(node, _)| *node != self.foca.identity().node)
            .collect();
        let mut view = lock(&self.view);
        if view.members != members {
            for node in members.keys().filter(|n| !view.members.contains_key(*n)) {
                tracing::info!(%node, "membership: agent up");
            }
            for node in view.members.keys().filter(|n| !members.contains_key(*n)) {
                tracing::info!(%node, "membership: agent down");
            }
            view.heard_any |= !members.is_empty();
            view.members = members;
            self.metrics
                .membership_members
                .set(i64::try_from(view.members.len()).unwrap_or(i64::MAX));
            drop(view);
            self.changed.notify_one();
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"a key of the tests, 32 bytes....";

    /// The protocol's task panicking (a bug) fails the agent's liveness for good, rather than leaving
    /// the view as it was with the agent looking healthy.
    #[tokio::test]
    async fn a_protocol_that_panics_fails_the_agents_liveness() {
        let health = AgentHealth::default();
        assert_eq!(health.live(), Ok(()));
        let panicking = futures::FutureExt::map(std::future::ready(()), |()| -> Option<()> {
            panic!("a bug in the protocol")
        });
        assert_eq!(
            spawn_watched(panicking, health.clone()).await.unwrap(),
            None
        );
        let dead = health.live().unwrap_err();
        assert!(dead.contains("membership protocol"), "{dead}");
    }

    struct Running {
        membership: Membership,
        metrics: AgentMetrics,
    }

    async fn start(node: &str, key: &[u8]) -> Running {
        start_on(node, key, "127.0.0.1:0".parse().unwrap(), None).await
    }

    async fn start_on(
        node: &str,
        key: &[u8],
        bind: SocketAddr,
        inherited: Option<std::os::fd::OwnedFd>,
    ) -> Running {
        let metrics = AgentMetrics::default();
        let settings = MembershipSettings {
            key: key.to_vec(),
            bind,
            probe_interval: Duration::from_millis(100),
            suspicion_timeout: Duration::from_millis(300),
            expected_members: 3,
        };
        let membership = Membership::start(
            node,
            settings,
            metrics.clone(),
            AgentHealth::default(),
            Arc::new(Notify::new()),
            inherited,
        )
        .await
        .unwrap();
        Running {
            membership,
            metrics,
        }
    }

    /// Waits until `check` holds of `running`'s view (10 s at most).
    async fn until(running: &Running, what: &str, check: impl Fn(&View) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check(&running.membership.view()) {
            assert!(
                Instant::now() < deadline,
                "{what}: {:?}",
                running.membership.view()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn names(view: &View) -> Vec<&str> {
        view.members.keys().map(String::as_str).collect()
    }

    /// Three agents on the loopback: they find each other from one address each, one that stops is
    /// declared down by the others within the suspicion, and one with another key is never let in
    /// (its packets are counted as dropped).
    #[tokio::test]
    async fn agents_find_each_other_and_see_one_go() {
        let a = start("a", KEY).await;
        let b = start("b", KEY).await;
        let c = start("c", KEY).await;
        let mallory = start("mallory", b"not the key of the tests, at all").await;
        // Each one knows only `a`'s address, as from its Lease.
        let at_a = vec![("a".to_owned(), a.membership.address())];
        for joining in [&b, &c, &mallory] {
            joining.membership.join(at_a.clone());
        }
        for (running, others) in [(&a, ["b", "c"]), (&b, ["a", "c"]), (&c, ["a", "b"])] {
            until(running, "all three members", |v| names(v) == others).await;
            assert!(running.membership.view().heard_any);
        }
        assert!(mallory.membership.view().members.is_empty());
        assert!(a.metrics.membership_dropped_total("bad_mac") > 0);
        // `c` stops for good (killed: no goodbye): declared down by the others.
        assert!(!c.membership.ended());
        c.membership.task.abort();
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(c.membership.ended(), "an aborted task is seen as ended");
        let killed = Instant::now();
        until(&a, "c declared down", |v| names(v) == ["b"]).await;
        until(&b, "c declared down", |v| names(v) == ["a"]).await;
        println!("c declared down after {:?}", killed.elapsed());
        for running in [a, b, mallory] {
            running.membership.stopped().await;
        }
    }

    /// An agent that starts while the one before it on its node still holds the membership address
    /// (stopping without a hand-over) binds it once free instead of failing.
    #[tokio::test]
    async fn an_address_still_held_is_bound_once_free() {
        let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let address = held.local_addr().unwrap();
        let releasing = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        });
        let running = start_on("b", KEY, address, None).await;
        assert_eq!(running.membership.address(), address);
        releasing.await.unwrap();
        running.membership.stopped().await;
    }

    /// An agent replaced on its node (a rolling update) hands its socket to its successor, which
    /// joins as the node's newer self: the others never see the node leave, and a stop for good
    /// after that is seen (the successor's goodbye).
    #[tokio::test]
    async fn a_successor_on_the_socket_handed_over_never_leaves_the_view_of_the_others() {
        let a = start("a", KEY).await;
        let b = start("b", KEY).await;
        b.membership
            .join(vec![("a".to_owned(), a.membership.address())]);
        until(&a, "b a member", |v| names(v) == ["b"]).await;
        let address = b.membership.address();
        let socket = b
            .membership
            .hand_over()
            .await
            .expect("the socket handed back");
        let watching = tokio::spawn({
            let view = a.membership.shared_view();
            async move {
                let mut gaps = 0;
                for _ in 0..150 {
                    if !lock(&view).members.contains_key("b") {
                        gaps += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                gaps
            }
        });
        // The successor comes up a little later, as a process does.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let successor = start_on("b", KEY, address, Some(socket)).await;
        assert_eq!(successor.membership.address(), address, "the same socket");
        successor
            .membership
            .join(vec![("a".to_owned(), a.membership.address())]);
        until(&successor, "a a member of the successor's view", |v| {
            names(v) == ["a"]
        })
        .await;
        assert_eq!(
            watching.await.unwrap(),
            0,
            "a saw b leave during the hand-over"
        );
        successor.membership.stopped().await;
        until(&a, "b gone after its goodbye", |v| v.members.is_empty()).await;
        a.membership.stopped().await;
    }
}
