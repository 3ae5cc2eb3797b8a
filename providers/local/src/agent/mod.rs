//! The node agent (`local-agent`, a DaemonSet from the manager's image) of `loadBalancer.mode:
//! agents`: the manager assigns each Service its VIPs and writes its status; on every node an agent
//! watches those Services, the Nodes, the EndpointSlices and the other agents' heartbeats, elects one
//! node per VIP (module `plan`), and, on the node elected, puts the VIP on the node's interface, announces
//! it to the link (gratuitous ARP, unsolicited neighbour advertisement) and serves it: with the `local`
//! data plane (health checks, source ranges, PROXY protocol, per-listener metrics; `ipMode: Proxy`),
//! or, for `local.ccm.rs/data-path: kube-proxy`, by leaving the traffic to kube-proxy (`ipMode: VIP`).
//!
//! A node whose agent stops renewing its heartbeat (module `heartbeat`: 3 s by default) loses its VIPs to
//! the next node of each VIP's order; every other VIP stays where it is, with its connections. An
//! agent that stops cleanly takes its VIPs off and deletes its heartbeat, so they move at once; one
//! that was killed finds its VIPs still on the interface when it starts again, takes them over, and
//! removes those it no longer announces.
//!
//! The announcer is one part (the trait `announcer::Announcer`): layer 2 (the VIP on the interface and
//! its announcements) for the pools with `announce: l2`, BGP (module `bgp`: the VIP on the loopback
//! interface and a host route to it advertised to the node's peers) for those with `announce: bgp`,
//! which every fit node announces rather than one; the serving does not depend on it.

mod announcer;
mod bgp;
mod handover;
mod health;
pub(crate) mod heartbeat;
mod judge;
mod membership;
mod metrics;
pub(crate) mod plan;
pub(crate) mod presence;
mod wake;

pub use bgp::{BgpMetrics, EVENT_SESSION_ESTABLISHED, EVENT_SESSION_FAILED};
pub use health::AgentHealth;
pub use metrics::AgentMetrics;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cloud_provider::clap;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use local_data_plane::LoadBalancerSpec;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::{
    Announce, CloudEvent, Config, Error, LoadBalancerMode, LocalCloud,
    addresses::AddressManager,
    agent::announcer::Announcer,
    instances::lock,
    load_balancer::{
        DataPath, build_spec, key_of, listener_differences, published_ips, read_service,
    },
};

use self::{
    bgp::{BgpAnnouncer, Speaker},
    heartbeat::{Heartbeat, LEASE_LABEL, LeaseView},
    judge::{Judge, Signals},
    membership::{Membership, MembershipSettings},
    plan::{Served, node_unfit, nodes_with_ready_endpoints},
};

/// The reason of the Normal event on a Service whose VIP a node starts announcing.
pub const EVENT_VIP_ANNOUNCED: &str = "VIPAnnounced";

/// How long a Service whose load balancer could not be served (a listener that cannot bind, the VIP
/// refused by the interface) waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// How often an agent asks the peers whose Leases name a membership address, and that are no members
/// of its view, to let it in.
const JOIN_EVERY: Duration = Duration::from_secs(1);

/// How long after its start the membership protocol is left to find the others before its view counts
/// (until then, the Leases decide).
const MEMBERSHIP_GRACE: Duration = Duration::from_secs(2);

/// How often the agent looks again when nothing changed (a heartbeat that expires is also looked at
/// when it expires).
const IDLE_LOOK: Duration = Duration::from_secs(10);

/// The longest pause before a look that a change asks for. A look at thousands of Services takes a
/// while, and during a burst of changes (thousands of Services created) looks back to back would keep
/// a core busy on every node: after a look that took `t`, a change waits `t` more (at most this), so
/// that the burst's changes gather into the next look and the agent takes at most about half a core.
/// With a few Services a look takes a millisecond, and so does the pause.
const PACE_AT_MOST: Duration = Duration::from_millis(500);

/// The `local-agent` command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "local-agent",
    about = "The node agent of the `local` cloud's loadBalancer.mode: agents: elects one node per VIP, \
             puts it on the node's interface, announces it and serves it (docs/local-provider.md)."
)]
pub struct AgentFlags {
    /// The node this agent runs on (the DaemonSet sets it from spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    /// The node's interface the VIPs go on (CAP_NET_ADMIN) and are announced on (CAP_NET_RAW); without
    /// it, the interface that has the node's InternalIP (the first one of the Node's status).
    #[arg(long, value_name = "INTERFACE")]
    pub interface: Option<String>,
    /// The cloud-config the manager reads (the same ConfigMap): its pools, inventory and data-plane
    /// settings. It must say loadBalancer.mode: agents.
    #[arg(long, value_name = "PATH")]
    pub cloud_config: Option<std::path::PathBuf>,
    /// A kubeconfig; without one, the pod's service account (or $KUBECONFIG).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The namespace of the agents' heartbeat Leases.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "kube-system",
        value_name = "NAMESPACE"
    )]
    pub namespace: String,
    /// A node whose agent has not renewed its heartbeat for this long loses its VIPs (whole seconds).
    #[arg(long, default_value = "3s", value_parser = parse_duration, value_name = "DURATION")]
    pub heartbeat: Duration,
    /// How often the agent renews its heartbeat (at most half of --heartbeat).
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub renew_interval: Duration,
    /// Serve only Services of this loadBalancerClass (the manager's --load-balancer-class); without it,
    /// the Services without a class.
    #[arg(long, value_name = "CLASS")]
    pub load_balancer_class: Option<String>,
    /// The key of the membership protocol between the agents (a file of at least 16 bytes: the
    /// DaemonSet mounts it from the Secret local-agent-membership). With it, the agents judge each
    /// other's liveness over the node network too, and keep announcing while the API server is away;
    /// without it, a node whose heartbeat cannot be renewed stops announcing.
    #[arg(long, value_name = "PATH")]
    pub membership_key_file: Option<std::path::PathBuf>,
    /// The UDP port of the membership protocol, on the node's InternalIP.
    #[arg(
        long,
        default_value_t = 10265,
        value_name = "PORT",
        requires = "membership_key_file"
    )]
    pub membership_port: u16,
    /// How often each agent probes another one over the membership protocol.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION", requires = "membership_key_file")]
    pub membership_probe_interval: Duration,
    /// How long an agent that answers no probe is suspected before it is declared down (and its
    /// VIPs move).
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION", requires = "membership_key_file")]
    pub membership_suspicion_timeout: Duration,
    /// A Unix socket through which an agent hands its VIPs, listening sockets and membership over to
    /// the agent that replaces it on the same node (a rolling update with maxSurge), so that the
    /// connections open at that moment are not cut: the old agent stops accepting, lets them finish
    /// (the data plane's drainTimeout) and exits, leaving the VIPs on the interface. Both pods mount
    /// its directory (a hostPath only root can write). Without it, an agent that stops takes its
    /// VIPs off and they move to another node.
    #[arg(long, value_name = "PATH")]
    pub handover_socket: Option<std::path::PathBuf>,
    /// Where /metrics (the data plane's, per listener), /healthz and /readyz are served, over plain
    /// HTTP: the node's loopback by default (the agents run on the host network: only the node's own
    /// processes reach it); an address others reach exposes every Service's names and traffic to them
    /// unauthenticated. "0" turns it off.
    #[arg(long, default_value = "127.0.0.1:10264", value_name = "ADDRESS")]
    pub metrics_bind_address: String,
}

impl AgentFlags {
    /// The settings of [`run`].
    pub fn settings(&self) -> AgentSettings {
        AgentSettings {
            node_name: self.node_name.clone(),
            interface: self.interface.clone(),
            namespace: self.namespace.clone(),
            heartbeat: self.heartbeat,
            renew_interval: self.renew_interval,
            load_balancer_class: self.load_balancer_class.clone(),
            handover_socket: self.handover_socket.clone(),
            membership: self
                .membership_key_file
                .as_ref()
                .map(|key_file| MembershipFlags {
                    key_file: key_file.clone(),
                    port: self.membership_port,
                    probe_interval: self.membership_probe_interval,
                    suspicion_timeout: self.membership_suspicion_timeout,
                }),
        }
    }

    /// The `local` cloud of `--cloud-config` (its defaults without one, which `run` refuses: they say
    /// `mode: leader`).
    pub fn cloud(&self) -> Result<LocalCloud, Error> {
        let config = match &self.cloud_config {
            Some(path) => cloud_provider::CloudConfig::read(path).map_err(|err| Error::Config {
                path: Some(path.display().to_string()),
                message: format!("cannot read it: {err}"),
            })?,
            None => cloud_provider::CloudConfig::none(),
        };
        LocalCloud::from_cloud_config(&config)
    }
}

/// A Go-style duration (`3s`, `500ms`), as the manager's flags take them.
fn parse_duration(text: &str) -> Result<Duration, String> {
    cloud_provider::parse_go_duration(text)
}

/// A node agent's settings.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The node this agent runs on (the Node's name).
    pub node_name: String,
    /// The node's interface the VIPs go on and are announced on; `None`: the one that has the node's
    /// InternalIP.
    pub interface: Option<String>,
    /// The namespace of the agents' heartbeat Leases.
    pub namespace: String,
    /// A heartbeat older than this is a node gone (the Lease's `leaseDurationSeconds`, whole seconds).
    pub heartbeat: Duration,
    /// How often the agent renews its heartbeat.
    pub renew_interval: Duration,
    /// The `loadBalancerClass` of the Services served (the manager's `--load-balancer-class`); `None`:
    /// the classless ones.
    pub load_balancer_class: Option<String>,
    /// The membership protocol between the agents; `None`: off (the Leases alone decide).
    pub membership: Option<MembershipFlags>,
    /// The Unix socket of the hand-over to a successor on this node; `None`: no hand-over (an agent
    /// that stops takes its VIPs off).
    pub handover_socket: Option<std::path::PathBuf>,
}

/// The membership protocol's settings, as given.
#[derive(Debug, Clone)]
pub struct MembershipFlags {
    /// The file with the shared key.
    pub key_file: std::path::PathBuf,
    /// The UDP port, on the node's InternalIP (0: any free port, for tests).
    pub port: u16,
    /// How often each agent probes another one.
    pub probe_interval: Duration,
    /// How long an agent that answers no probe is suspected before it is declared down.
    pub suspicion_timeout: Duration,
}

impl MembershipFlags {
    /// The key, read from its file (a trailing newline is not part of it).
    fn key(&self) -> Result<Vec<u8>, Error> {
        let path = self.key_file.display();
        let mut key = std::fs::read(&self.key_file).map_err(|err| {
            Error::Flag(format!(
                "--membership-key-file {path}: cannot read it: {err} (the DaemonSet mounts it from \
                 the Secret local-agent-membership: create it as docs/local-provider.md says)"
            ))
        })?;
        while key.last().is_some_and(u8::is_ascii_whitespace) {
            key.pop();
        }
        if key.len() < membership::MIN_KEY_LEN {
            return Err(Error::Flag(format!(
                "--membership-key-file {path}: the key has {} bytes; at least {} are needed \
                 (openssl rand -hex 32 makes one)",
                key.len(),
                membership::MIN_KEY_LEN
            )));
        }
        Ok(key)
    }
}

impl AgentSettings {
    /// What is wrong with these settings, if anything.
    pub fn check(&self) -> Result<(), Error> {
        let flag = |m: String| Err(Error::Flag(m));
        if self.node_name.trim().is_empty() {
            return flag("--node-name is empty (the DaemonSet sets it from spec.nodeName)".into());
        }
        if let Err(why) =
            cloud_provider::labels::check_dns_subdomain(&heartbeat::lease_name(&self.node_name))
        {
            return flag(format!(
                "--node-name {:?}: its heartbeat Lease's name is not valid: {why}",
                self.node_name
            ));
        }
        if self.interface.as_ref().is_some_and(|i| i.trim().is_empty()) {
            return flag(
                "--interface is empty (leave it out to use the interface of the node's InternalIP)"
                    .into(),
            );
        }
        if self.heartbeat < Duration::from_secs(1) || self.heartbeat.subsec_nanos() != 0 {
            return flag(format!(
                "--heartbeat {:?}: whole seconds, at least 1s (a Lease's duration is in seconds)",
                self.heartbeat
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval * 2 > self.heartbeat {
            return flag(format!(
                "--renew-interval {:?} must be above 0 and at most half of --heartbeat {:?} (one lost \
                 renewal must not make the node look gone)",
                self.renew_interval, self.heartbeat
            ));
        }
        if let Some(m) = &self.membership {
            if m.probe_interval < Duration::from_millis(30) {
                return flag(format!(
                    "--membership-probe-interval {:?}: at least 30ms (a probe waits a third of it \
                     for its answer)",
                    m.probe_interval
                ));
            }
            if m.suspicion_timeout < m.probe_interval {
                return flag(format!(
                    "--membership-suspicion-timeout {:?} must be at least \
                     --membership-probe-interval {:?} (a suspected agent needs that long to say it \
                     is alive)",
                    m.suspicion_timeout, m.probe_interval
                ));
            }
        }
        Ok(())
    }
}

/// Runs the agent until `shutdown`; then takes the VIPs off, deletes the heartbeat and drains the
/// data plane. `cloud` is the `local` cloud of the cloud-config the manager reads (its pools, its
/// inventory, the data plane's settings), which must say `loadBalancer.mode: agents`.
pub async fn run(
    cloud: LocalCloud,
    client: Client,
    settings: AgentSettings,
    metrics: AgentMetrics,
    health: AgentHealth,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    settings.check()?;
    if cloud.config().load_balancer.mode != LoadBalancerMode::Agents {
        return Err(Error::Config {
            path: None,
            message: "loadBalancer.mode is leader: the leading manager announces and serves every \
                      VIP, and an agent would announce them a second time; set loadBalancer.mode: \
                      agents (and restart the manager) to run the node agents"
                .to_owned(),
        });
    }
    let expected = cloud.config().load_balancer.agent_namespace().to_owned();
    if settings.namespace != expected {
        return Err(Error::Config {
            path: None,
            message: format!(
                "this agent's heartbeats would go to namespace {:?} (--namespace, or the pod's \
                 namespace), where the manager does not look for them: the cloud-config's \
                 loadBalancer.agentNamespace is {expected:?}; run the agents there or set \
                 agentNamespace: {:?} (and restart the manager)",
                settings.namespace, settings.namespace
            ),
        });
    }
    // First of all, before the kubelet's first probe can make this pod ready: is an agent running on
    // this node, which this one replaces (a rolling update)?
    let mut replacing = None;
    let mut point = None;
    if let Some(path) = &settings.handover_socket {
        match handover::open(path)? {
            handover::Opened::Alone(bound) => point = Some(bound),
            handover::Opened::Replacing(predecessor) => {
                tracing::info!(socket = %path.display(), "an agent runs on this node: this one replaces it when it stops (it hands its VIPs, listeners and membership over)");
                replacing = Some(predecessor);
            }
        }
    }
    *lock(&cloud.inner.reporter) = Some((client.clone(), tokio::runtime::Handle::current()));
    let changed = Arc::new(Notify::new());
    let kube_error = |what: &str| {
        let what = what.to_owned();
        move |source| Error::Kube { what, source }
    };
    // MetalLB's pools and peers, when read, before the VIPs an earlier run left are looked at. The
    // manager reports the objects refused; the agents only read them.
    crate::metallb::watch::start(
        &cloud,
        client.clone(),
        shutdown.clone(),
        false,
        Some(changed.clone()),
    )
    .await?;

    // Each watch asks for a look only for what concerns this agent's Services (module `wake`).
    let class = settings.load_balancer_class.clone();
    let mut service_changes = wake::ServiceChanges::new(class.as_deref());
    let services = mirror::<Service>(
        Api::all(client.clone()),
        watcher::Config::default(),
        &changed,
        &health,
        move |touched, _| service_changes.concerns(touched),
    );
    let nodes = mirror::<Node>(
        Api::all(client.clone()),
        watcher::Config::default(),
        &changed,
        &health,
        |_, _| true,
    );
    let slices = {
        let services = services.clone();
        mirror::<EndpointSlice>(
            Api::all(client.clone()),
            watcher::Config::default(),
            &changed,
            &health,
            move |touched, _| wake::slice_concerns(touched, &services, class.as_deref()),
        )
    };
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    // Each Lease change is observed as it arrives: liveness is judged by when a change was seen.
    let lease_view = Arc::new(Mutex::new(LeaseView::default()));
    let leases = {
        let lease_view = lease_view.clone();
        mirror::<Lease>(
            lease_api.clone(),
            watcher::Config::default().labels(&format!("{}={}", LEASE_LABEL.0, LEASE_LABEL.1)),
            &changed,
            &health,
            move |_, store| {
                lock(&lease_view).observe(
                    &store.state(),
                    Instant::now(),
                    k8s_openapi::jiff::Timestamp::now(),
                )
            },
        )
    };
    let membership_settings = match &settings.membership {
        None => {
            tracing::warn!(
                "membership is off (no --membership-key-file): this node stops announcing when its \
                 heartbeat cannot be renewed, as while the API server is unreachable"
            );
            None
        }
        Some(flags) => Some(membership_settings(&client, &settings.node_name, flags).await?),
    };
    let interface = match &settings.interface {
        Some(interface) => interface.clone(),
        None => node_interface(&client, &settings.node_name).await?,
    };
    let mirrors_ready = || async {
        let _ = services.wait_until_ready().await;
        let _ = nodes.wait_until_ready().await;
        let _ = slices.wait_until_ready().await;
        let _ = leases.wait_until_ready().await;
    };
    let mut handed = handover::Handed::default();
    let mut took_over = false;
    if let Some(predecessor) = replacing {
        // Everything that needs the API server is done first, so that once the old agent hands
        // over, this one answers its peers and accepts connections at once.
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = mirrors_ready() => {}
        }
        tracing::info!("local-agent: ready; waiting for the agent this one replaces to hand over");
        match predecessor.wait(&shutdown).await {
            Ok(Some(received)) => {
                // Even if this agent is told to stop right now, the node's VIPs are its own from here:
                // it goes on and stops as any agent does (VIPs off, heartbeat deleted, membership
                // left), rather than leave them on the interface with nobody serving them.
                tracing::info!(
                    listeners = received.listeners.len(),
                    membership = received.membership.is_some(),
                    "local-agent: the agent this one replaces handed over"
                );
                metrics.handovers_received.inc();
                handed = received;
                took_over = true;
            }
            // Stopped before any hand-over: nothing of the node's was touched.
            _ if shutdown.is_cancelled() => return Ok(()),
            Ok(None) => tracing::info!(
                "local-agent: the agent this one replaces stopped without handing over: starting afresh"
            ),
            Err(err) => {
                tracing::warn!(error = %err, "local-agent: the hand-over failed: starting afresh")
            }
        }
        if let Some(path) = &settings.handover_socket {
            point = Some(handover::Point::bind(path)?);
        }
    }
    cloud
        .inner
        .data_plane
        .inherit(std::mem::take(&mut handed.listeners));
    let membership = match membership_settings {
        None => None,
        Some(membership_settings) => {
            let port = membership_settings.bind;
            let membership = Membership::start(
                &settings.node_name,
                membership_settings,
                metrics.clone(),
                changed.clone(),
                handed.membership.take(),
            )
            .await
            .map_err(|err| {
                Error::Flag(format!(
                    "--membership-port {}: cannot listen on {} (the node's InternalIP): {err}",
                    port.port(),
                    port.ip()
                ))
            })?;
            tracing::info!(address = %membership.address(), "membership: listening");
            Some(membership)
        }
    };
    let mut heartbeat = Heartbeat::new(
        lease_api,
        &settings.node_name,
        settings.heartbeat,
        settings.load_balancer_class.as_deref(),
    );
    if let Some(membership) = &membership {
        heartbeat = heartbeat.with_membership(membership.address(), membership.shared_view());
    }
    heartbeat
        .renew()
        .await
        .map_err(kube_error("local-agent: creating its heartbeat Lease"))?;
    let renewed = Arc::new(Mutex::new(Instant::now()));
    let beating = tokio::spawn(beat(
        heartbeat,
        settings.renew_interval,
        renewed.clone(),
        changed.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));

    let announcer: Box<dyn Announcer> = Box::new(AddressManager::new(interface.clone()));
    let ranges = |announce: Announce| -> Vec<_> {
        cloud
            .config()
            .address_pools
            .iter()
            .filter(|p| p.announce == announce)
            .flat_map(|p| p.addresses.iter().cloned())
            .collect()
    };
    let mut adopted: BTreeSet<IpAddr> = match announcer.adopt(ranges(Announce::L2)).await {
        Ok(found) => found.into_iter().collect(),
        Err(err) => return Err(Error::Flag(format!("--interface: {err}"))),
    };
    // BGP: sessions with the peers of loadBalancer.bgp.peers that select this node, from its address
    // (MetalLB's BGPPeers, read as they come, may add peers later).
    let metallb_peers = crate::metallb::watch::may_add_peers(&cloud.file_config());
    let (bgp, speaker) = if cloud.config().load_balancer.bgp.peers.is_empty() && !metallb_peers {
        (None, None)
    } else {
        let node_ipv4 = match node_internal_ip(&client, &settings.node_name).await? {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        };
        let (speaker, peers) = Speaker::new(
            node_ipv4,
            took_over,
            metrics.bgp.clone(),
            std::mem::take(&mut handed.bfd),
        );
        let (bgp, vips) = BgpAnnouncer::new(peers);
        match bgp.adopt(ranges(Announce::Bgp)).await {
            Ok(found) => adopted.extend(found),
            Err(err) => return Err(Error::Flag(format!("the loopback interface: {err}"))),
        }
        (Some(bgp), Some((speaker, vips)))
    };
    if !adopted.is_empty() {
        tracing::info!(vips = ?adopted, "VIPs an earlier run left on the interface are taken over: kept where this node is elected, removed elsewhere");
    }

    tokio::select! {
        () = shutdown.cancelled() => {}
        () = mirrors_ready() => tracing::info!(node = %settings.node_name, %interface, "local-agent: watching; announcing the VIPs this node is elected for"),
    }

    let mirrors = Mirrors {
        services,
        nodes,
        slices,
        leases,
    };
    let mut agent = Agent {
        cloud: cloud.clone(),
        settings: settings.clone(),
        announcer,
        bgp,
        speaker,
        metrics,
        health: health.clone(),
        membership,
        judge: Judge::default(),
        joined_at: None,
        fenced: None,
        refused_members: BTreeSet::new(),
        announced: BTreeMap::new(),
        adopted,
        applied: BTreeMap::new(),
        retry_at: HashMap::new(),
        failing: HashMap::new(),
        leaving: BTreeMap::new(),
    };
    let mut failure = None;
    while !shutdown.is_cancelled() {
        // The membership protocol's task ends only with `shutdown`: one that ended otherwise (a
        // panic) stops the agent, loudly, rather than leave it judging by a view that no longer moves.
        if agent.membership.as_ref().is_some_and(Membership::ended) {
            failure = Some(Error::Flag(
                "the membership protocol's task ended unexpectedly (see the log above); the agent \
                 stops so that its pod restarts"
                    .to_owned(),
            ));
            // The heartbeat's task and the data plane stop with it, as on a signal.
            shutdown.cancel();
            break;
        }
        let now = Instant::now();
        let self_fresh = now.saturating_duration_since(*lock(&renewed)) < settings.heartbeat;
        let alive = lock(&lease_view).alive(now);
        let next = agent.step(&mirrors, &alive, self_fresh, now).await;
        let took = now.elapsed();
        // The sockets handed over that the first look's listeners did not take: Services this node
        // no longer serves.
        let unused = cloud.inner.data_plane.close_inherited();
        if unused > 0 {
            tracing::info!(
                unused,
                "closed the listening sockets handed over that no listener took"
            );
        }
        if let Some(point) = &mut point {
            point.look();
        }
        let looked = Instant::now();
        health.looked(looked, agent.fenced.clone());
        let due = next.map_or(looked + IDLE_LOOK, |at| at.min(looked + IDLE_LOOK));
        let pace = took.min(PACE_AT_MOST);
        match wake::next_look(&changed, &shutdown, &lease_view, &alive, due, pace).await {
            wake::Woken::Look => {}
            wake::Woken::Stop => break,
        }
    }

    // A successor waits on this node (a rolling update): it gets the listening sockets and the
    // membership socket, and this agent leaves the VIPs, the heartbeat and the membership to it.
    let successors = match (&mut point, &failure) {
        (Some(point), None) => point.successors(),
        _ => Vec::new(),
    };
    if let Some(point) = point.as_ref().filter(|_| !successors.is_empty()) {
        let heartbeat = beating.await.ok();
        let membership = match agent.membership.take() {
            Some(membership) => membership.hand_over().await,
            None => None,
        };
        let handed = handover::Handed {
            listeners: cloud.inner.data_plane.hand_over().unwrap_or_else(|err| {
                tracing::error!(error = %err, "cannot copy the listening sockets to hand them over");
                Vec::new()
            }),
            membership,
            bfd: agent
                .speaker
                .as_ref()
                .map(|(speaker, _)| speaker.bfd_handover())
                .unwrap_or_default(),
        };
        match point.hand_over(successors, &handed).await {
            Ok(()) => {
                tracing::info!(
                    listeners = handed.listeners.len(),
                    "local-agent: handed over to the agent that replaces this one (its VIPs stay on the interface); draining this process's connections"
                );
                agent.metrics.set_announced([].iter());
                agent.metrics.handovers_given.inc();
                // The BGP sessions are the process's own: closed without a NOTIFICATION, so that
                // routers doing graceful restart keep this node's routes until the successor's
                // sessions send them again (others send its share elsewhere meanwhile); the VIPs
                // stay on.
                agent.stop_bgp_sessions(true).await;
                drop(handed);
                cloud.inner.data_plane.shutdown().await;
                return Ok(());
            }
            Err(err) => {
                // The heartbeat and the membership are stopped already: the others see this node
                // go within the failover time, as if it had been killed.
                tracing::warn!(error = %err, "local-agent: the hand-over failed; withdrawing the VIPs");
                agent.stop_bgp_sessions(false).await;
                agent.withdraw_all_now();
                agent.metrics.set_announced([].iter());
                if let Some(heartbeat) = heartbeat {
                    heartbeat.release().await;
                }
                cloud.inner.data_plane.shutdown().await;
                return Ok(());
            }
        }
    }
    tracing::info!(from = %agent.announcer.describe(), "local-agent: stopping; withdrawing the VIPs");
    // The routes first (each router drops this node's at once), then the addresses.
    agent.stop_bgp_sessions(false).await;
    agent.withdraw_all_now();
    agent.metrics.set_announced([].iter());
    let heartbeat = beating.await.ok();
    if let Some(heartbeat) = heartbeat {
        heartbeat.release().await;
    }
    if let Some(membership) = agent.membership.take() {
        membership.stopped().await;
    }
    cloud.inner.data_plane.shutdown().await;
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// The membership protocol's settings: its address on the node's InternalIP, and its size.
async fn membership_settings(
    client: &Client,
    node: &str,
    flags: &MembershipFlags,
) -> Result<MembershipSettings, Error> {
    let key = flags.key()?;
    let ip = node_internal_ip(client, node).await?;
    let expected_members = Api::<Node>::all(client.clone())
        .list_metadata(&Default::default())
        .await
        .map_err(|source| Error::Kube {
            what: "local-agent: listing the Nodes (to size the membership protocol)".to_owned(),
            source,
        })?
        .items
        .len();
    tracing::info!(probe_interval = ?flags.probe_interval, suspicion_timeout = ?flags.suspicion_timeout, "membership settings");
    Ok(MembershipSettings {
        key,
        bind: std::net::SocketAddr::new(ip, flags.port),
        probe_interval: flags.probe_interval,
        suspicion_timeout: flags.suspicion_timeout,
        expected_members,
    })
}

/// The InternalIP of Node `name` (the first one its status lists).
async fn node_internal_ip(client: &Client, name: &str) -> Result<IpAddr, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await.map_err(|source| Error::Kube {
        what: format!("local-agent: reading Node {name}"),
        source,
    })?;
    crate::instances::first_internal_ip(&node).ok_or_else(|| {
        Error::Flag(format!(
            "Node {name} has no InternalIP yet (the membership protocol listens on it)"
        ))
    })
}

/// The interface that has the InternalIP of Node `name` (the first one its status lists).
async fn node_interface(client: &Client, name: &str) -> Result<String, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await.map_err(|source| Error::Kube {
        what: format!(
            "local-agent: reading Node {name} (to find its interface; or give --interface)"
        ),
        source,
    })?;
    let Some(ip) = crate::instances::first_internal_ip(&node) else {
        return Err(Error::Flag(format!(
            "Node {name} has no InternalIP yet to find its interface by: give --interface"
        )));
    };
    match crate::addresses::interface_with(ip).await {
        Ok(Some(interface)) => {
            tracing::info!(%ip, %interface, "the VIPs go on the interface of the node's InternalIP");
            Ok(interface)
        }
        Ok(None) => Err(Error::Flag(format!(
            "no interface of this host has the node's InternalIP {ip} (is the agent on the host network?): give --interface"
        ))),
        Err(err) => Err(Error::Flag(format!(
            "finding the interface of the node's InternalIP {ip}: {err}; give --interface"
        ))),
    }
}

/// Renews the heartbeat every `interval` until `shutdown`, recording each success in `renewed`;
/// returns the heartbeat (for its release).
async fn beat(
    heartbeat: Heartbeat,
    interval: Duration,
    renewed: Arc<Mutex<Instant>>,
    changed: Arc<Notify>,
    metrics: AgentMetrics,
    shutdown: CancellationToken,
) -> Heartbeat {
    let mut failing = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return heartbeat,
            () = tokio::time::sleep(interval) => {}
        }
        match heartbeat.renew().await {
            Ok(()) => {
                *lock(&renewed) = Instant::now();
                if failing {
                    tracing::info!("heartbeat renewed again");
                    failing = false;
                    changed.notify_one();
                }
            }
            Err(err) => {
                metrics.heartbeat_failures.inc();
                if !failing {
                    tracing::warn!(error = %err, "cannot renew the heartbeat Lease; this node stops announcing if it cannot for the heartbeat's duration");
                }
                failing = true;
                changed.notify_one();
            }
        }
    }
}

/// A store kept by a watch of `api`; a change wakes `changed` when `concerns` says so (given the change
/// and the store as it is after it). Its watch retries for ever; if its task panics or ends anyway, the
/// store would go stale unseen: that fails `health` for good (the kubelet restarts the agent), as a
/// store's writer cannot be had again to restart it in place.
fn mirror<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: &Arc<Notify>,
    health: &AgentHealth,
    concerns: impl FnMut(wake::Touched<'_, K>, &Store<K>) -> bool + Send + 'static,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    let (store, writer) = reflector::store();
    let changed = changed.clone();
    let stream = reflector::reflector(
        writer,
        // Retried within 5 s, not kube-runtime's default 30 s: after a long API-server outage the
        // agents see the changes made since within seconds of its end.
        watcher(api, config).backoff(cloud_provider::watch_retry_backoff()),
    );
    let health = health.clone();
    let reader = store.clone();
    tokio::spawn(async move {
        let why = match AssertUnwindSafe(drive(stream, reader, concerns, changed))
            .catch_unwind()
            .await
        {
            Ok(()) => "ended".to_owned(),
            Err(panic) => format!(
                "panicked: {}",
                cloud_provider::panic_message(panic.as_ref())
            ),
        };
        let what = format!("the watch of {}", K::plural(&()));
        tracing::error!("local-agent: {what} {why}; the agent's health check fails from now on");
        health.part_died(&what, &why);
    });
    store
}

/// Runs a reflector's `stream`, waking `changed` for each change that `concerns` the agent.
async fn drive<K, S>(
    stream: S,
    store: Store<K>,
    mut concerns: impl FnMut(wake::Touched<'_, K>, &Store<K>) -> bool,
    changed: Arc<Notify>,
) where
    K: Resource<DynamicType = ()> + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let asks = match &item {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                concerns(wake::Touched::Applied(object), &store)
            }
            Ok(watcher::Event::Delete(object)) => concerns(wake::Touched::Deleted(object), &store),
            Ok(watcher::Event::InitDone) => concerns(wake::Touched::Relisted, &store),
            Ok(watcher::Event::Init) => false,
            Err(err) => {
                tracing::warn!(error = %err, "watch failed; retrying");
                false
            }
        };
        if asks {
            changed.notify_one();
        }
    }
}

/// What the agent's watches keep.
struct Mirrors {
    services: Store<Service>,
    nodes: Store<Node>,
    slices: Store<EndpointSlice>,
    leases: Store<Lease>,
}

/// The agent's state between two looks.
struct Agent {
    cloud: LocalCloud,
    settings: AgentSettings,
    /// Tells the network which VIPs of layer-2 pools this node holds.
    announcer: Box<dyn Announcer>,
    /// The same for BGP pools, when BGP peers are configured.
    bgp: Option<BgpAnnouncer>,
    /// The BGP sessions, and the VIPs the BGP announcer holds.
    speaker: Option<(Speaker, watch::Receiver<BTreeSet<IpAddr>>)>,
    metrics: AgentMetrics,
    /// What `/healthz` says: each step of a long look (a Service served, a VIP withdrawn) counts.
    health: AgentHealth,
    /// The membership protocol, when on.
    membership: Option<Membership>,
    /// Who is alive, and whether this node may announce.
    judge: Judge,
    /// When this agent last asked its peers to let it in.
    joined_at: Option<Instant>,
    /// Why this node may not announce, while it may not (logged when it changes).
    fenced: Option<String>,
    /// Members refused (not a Node, or not at one of its Node's addresses), logged once each.
    refused_members: BTreeSet<String>,
    /// The VIPs on the interface.
    /// (with whether by BGP, so that a pool whose `announce` changed is announced again its new way).
    announced: BTreeMap<IpAddr, bool>,
    /// The VIPs an earlier run left on the interface that this run has not announced (yet).
    adopted: BTreeSet<IpAddr>,
    /// What the data plane runs, by Service.
    applied: BTreeMap<String, LoadBalancerSpec>,
    /// Services not to try again before then.
    retry_at: HashMap<String, Instant>,
    /// Services this node cannot serve, with the last reason logged.
    failing: HashMap<String, String>,
    /// VIPs this node gives up on purpose (its Node excluded, or being removed by the cluster
    /// autoscaler) while it still runs, each served until then: the next announcer's announcement
    /// reaches the clients first, so none meets a node that no longer has the VIP.
    leaving: BTreeMap<IpAddr, Instant>,
}

/// How long a VIP this node gives up on purpose stays served here after the next announcer took it
/// ([`Agent::leaving`]). Two nodes then answer for it for at most this long, both serving it.
const LEAVING_GRACE: Duration = Duration::from_secs(1);

impl Agent {
    /// Whether `ip` is announced by BGP: its pool says so (and BGP peers are configured).
    fn is_routed(&self, ip: IpAddr, config: &Config) -> bool {
        self.bgp.is_some()
            && config
                .pool_of(ip)
                .is_some_and(|p| p.announce == Announce::Bgp)
    }

    /// The announcer of `ip`: BGP's for a VIP of a pool that announces by BGP, layer 2's otherwise.
    fn announcer_of(&self, ip: IpAddr, config: &Config) -> &dyn Announcer {
        match &self.bgp {
            Some(bgp) if self.is_routed(ip, config) => bgp,
            _ => self.announcer.as_ref(),
        }
    }

    /// Stops announcing `ip`, whichever announcer holds it (a pool may have changed its way).
    async fn withdraw(&self, ip: IpAddr) {
        if let Some(bgp) = &self.bgp {
            bgp.withdraw(ip).await;
        }
        self.announcer.withdraw(ip).await;
    }

    /// Stops announcing every VIP, before the process exits.
    fn withdraw_all_now(&self) {
        if let Some(bgp) = &self.bgp {
            bgp.withdraw_all_now();
        }
        self.announcer.withdraw_all_now();
    }

    /// Ends the BGP sessions: with a NOTIFICATION Cease to each router, which drops this node's
    /// routes, or, `for_restart`, without one (see [`Speaker::stop`]).
    async fn stop_bgp_sessions(&mut self, for_restart: bool) {
        if let Some((speaker, _)) = self.speaker.take() {
            speaker.stop(for_restart).await;
        }
    }

    /// One look: elect, then converge the interface and the data plane. Returns when to look again
    /// without a change (a retry that is due, the membership's timers; a heartbeat that expires is
    /// waited for by [`wake::next_look`]).
    async fn step(
        &mut self,
        mirrors: &Mirrors,
        lease_alive: &BTreeSet<String>,
        self_fresh: bool,
        now: Instant,
    ) -> Option<Instant> {
        let config = self.cloud.config();
        let leases = mirrors.leases.state();
        let nodes = mirrors.nodes.state();
        let (services, slices) = (&mirrors.services, &mirrors.slices);
        let (signals, membership_wake) =
            self.signals(&leases, lease_alive, &nodes, self_fresh, now);
        let judgement = self.judge.judge(&signals);
        if judgement.fenced_because != self.fenced {
            match &judgement.fenced_because {
                Some(why) => tracing::warn!(%why, "this node stops announcing"),
                None => tracing::info!(
                    by_membership = judgement.by_membership,
                    "this node may announce again"
                ),
            }
            self.fenced = judgement.fenced_because.clone();
            self.metrics.fenced.set(i64::from(self.fenced.is_some()));
        }
        let alive = &judgement.alive;
        let me = self.settings.node_name.as_str();
        let heard = signals.members.unwrap_or_default();
        // A node whose agent speaks membership and was declared down is taken for unreachable: no
        // candidate, and no backend either (a dead node's first health check would hold the new
        // announcer's data plane for the check's whole timeout). A crashed agent takes its node out of
        // the backends for as long as it is down.
        let declared_down = |name: &str| {
            judgement.by_membership
                && name != me
                && signals.speaks_membership.contains(name)
                && !heard.contains(name)
        };
        let serving: Vec<&Arc<Node>> = nodes
            .iter()
            .filter(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                // This node's own agent is heard too: it is the one judging (and it serves only
                // when the judge says so).
                let agent_heard = heard.contains(name) || (name == me && judgement.by_membership);
                !declared_down(name) && node_unfit(n, agent_heard).is_none()
            })
            .filter(|n| self.cloud.backend_addresses(&config, n).is_some())
            .collect();
        let candidates: BTreeSet<String> = serving
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .filter(|n| alive.contains(n))
            .collect();
        let slices = slices.state();
        let served: Vec<Served> = services
            .state()
            .into_iter()
            .filter_map(|s| self.served(s, &config, &slices))
            .collect();
        let routed = |ip: IpAddr| self.is_routed(ip, &config);
        let labels_of: BTreeMap<&str, &BTreeMap<String, String>> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref()?)))
            .collect();
        let no_labels = BTreeMap::new();
        let may_announce = |vip: IpAddr, node: &str| {
            config.pool_of(vip).is_none_or(|pool| {
                pool.announced_by(labels_of.get(node).copied().unwrap_or(&no_labels))
            })
        };
        let metallb_election = |vip: IpAddr| {
            config
                .pool_of(vip)
                .is_some_and(|pool| pool.metallb_election)
        };
        let plan = plan::plan(
            me,
            &served,
            &candidates,
            routed,
            may_announce,
            metallb_election,
        );
        let backends: Vec<(String, Vec<IpAddr>)> = serving
            .iter()
            .filter_map(|n| self.cloud.backend_addresses(&config, n))
            .collect();
        // The BGP sessions of the peers that select this node first, so that the announcements'
        // events name them; their routes after, once the data plane serves.
        if let Some((speaker, _)) = &mut self.speaker {
            let me = self.settings.node_name.as_str();
            let labels = nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(me))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            speaker.select(&config, &labels).await;
        }
        // This node's own Node says it is to leave the load balancers (not a failure: it still runs and
        // hears its peers), so its VIPs are handed over make-before-break.
        let leaving_on_purpose = self.fenced.is_none()
            && nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(me))
                .and_then(|n| plan::leaving_on_purpose(n))
                .is_some();
        self.converge(&plan, &served, &config, &backends, now, leaving_on_purpose)
            .await;
        if let Some((speaker, vips)) = &mut self.speaker {
            let vips = vips.borrow().clone();
            let (cloud, node) = (&self.cloud, self.settings.node_name.as_str());
            speaker.advertise(&config, &vips, |type_, reason, note| {
                cloud.record_event(type_, CloudEvent::about_node(node, reason, "Peer"), note);
            });
        }
        self.metrics.set_announced(self.announced.keys());
        let retry = self.retry_at.values().min().copied();
        let left = self.leaving.values().min().copied();
        [retry, membership_wake, left].into_iter().flatten().min()
    }

    /// What the Leases and the membership protocol say, for the [`Judge`]; asks the peers that speak
    /// membership and are no members to let this agent in. Also returns when to look again for the
    /// membership's sake (its grace ending, the next join).
    fn signals(
        &mut self,
        leases: &[Arc<Lease>],
        lease_alive: &BTreeSet<String>,
        nodes: &[Arc<Node>],
        self_fresh: bool,
        now: Instant,
    ) -> (Signals, Option<Instant>) {
        let me = self.settings.node_name.clone();
        let mut lease_alive = lease_alive.clone();
        lease_alive.remove(&me);
        let mut advertised = heartbeat::advertised(leases);
        advertised.remove(&me);
        let mut signals = Signals {
            me,
            self_fresh,
            lease_alive,
            speaks_membership: advertised.keys().cloned().collect(),
            hears_others: advertised
                .iter()
                .filter(|(_, a)| a.hears > 0)
                .map(|(node, _)| node.clone())
                .collect(),
            members: None,
            heard_any: false,
        };
        let Some(membership) = &self.membership else {
            return (signals, None);
        };
        let view = membership.view();
        let mut members = BTreeSet::new();
        for (node, address) in &view.members {
            let known = nodes
                .iter()
                .find(|n| n.metadata.name.as_ref() == Some(node));
            let at_its_address = known.is_some_and(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .is_some_and(|a| a.iter().any(|a| a.address == address.ip().to_string()))
            });
            if at_its_address {
                members.insert(node.clone());
            } else if self.refused_members.insert(node.clone()) {
                tracing::warn!(%node, %address, "membership: a member that is no Node of this cluster, or not at its Node's address, is not counted");
            }
        }
        self.refused_members
            .retain(|n| view.members.contains_key(n));
        let mut wake = Vec::new();
        let strangers: Vec<(String, std::net::SocketAddr)> = advertised
            .iter()
            .filter(|(node, a)| view.members.get(*node) != Some(&a.address))
            .map(|(node, a)| (node.clone(), a.address))
            .collect();
        if !strangers.is_empty() {
            let due = self.joined_at.is_none_or(|at| now >= at + JOIN_EVERY);
            if due {
                membership.join(strangers);
                self.joined_at = Some(now);
            }
            wake.push(self.joined_at.map_or(now, |at| at + JOIN_EVERY));
        }
        let counts_from = membership.started() + MEMBERSHIP_GRACE;
        if now >= counts_from {
            signals.members = Some(members);
            signals.heard_any = view.heard_any;
        } else {
            wake.push(counts_from);
        }
        (signals, wake.into_iter().min())
    }

    /// `service` as served by this cloud's agents, or `None` when it is not (another class, not a
    /// load balancer, being deleted, no VIP of this cloud's pools in its status).
    fn served(
        &self,
        service: Arc<Service>,
        config: &Config,
        slices: &[Arc<EndpointSlice>],
    ) -> Option<Served> {
        let spec = service.spec.as_ref()?;
        if spec.type_.as_deref() != Some("LoadBalancer")
            || service.metadata.deletion_timestamp.is_some()
            || spec.load_balancer_class != self.settings.load_balancer_class
        {
            return None;
        }
        // A pool that announces none (MetalLB's pool without an advertisement): its VIPs are left to
        // whatever routes them.
        let vips: Vec<IpAddr> = published_ips(&service)
            .into_iter()
            .filter(|ip| {
                config
                    .pool_of(*ip)
                    .is_some_and(|p| p.announce != Announce::None)
            })
            .collect();
        if vips.is_empty() {
            return None;
        }
        let local_endpoints =
            (spec.external_traffic_policy.as_deref() == Some("Local")).then(|| {
                nodes_with_ready_endpoints(
                    service.metadata.namespace.as_deref().unwrap_or("default"),
                    service.metadata.name.as_deref().unwrap_or_default(),
                    slices.iter().map(AsRef::as_ref),
                )
            });
        Some(Served {
            key: key_of(&service),
            service,
            vips,
            local_endpoints,
        })
    }

    /// Takes off the VIPs this node no longer announces (before their listeners drain), then puts on
    /// and announces the new ones and runs the data plane for each Service served here.
    async fn converge(
        &mut self,
        plan: &plan::Plan,
        served: &[Served],
        config: &Config,
        backends: &[(String, Vec<IpAddr>)],
        now: Instant,
        leaving_on_purpose: bool,
    ) {
        let wanted: BTreeSet<IpAddr> = plan.mine.values().flatten().copied().collect();
        // A VIP handed over on purpose that is this node's again is no longer leaving; one whose grace
        // is over goes now (below, with the others given up).
        self.leaving.retain(|ip, _| !wanted.contains(ip));
        for ip in self
            .adopted
            .difference(&wanted)
            .copied()
            .collect::<Vec<_>>()
        {
            tracing::info!(%ip, "VIP left by an earlier run, not this node's: withdrawn");
            self.withdraw(ip).await;
            self.adopted.remove(&ip);
            self.health.progressed(Instant::now());
        }
        for ip in self
            .announced
            .keys()
            .filter(|ip| !wanted.contains(ip))
            .copied()
            .collect::<Vec<_>>()
        {
            let to = plan.announcers.get(&ip).cloned().flatten();
            if leaving_on_purpose && to.is_some() {
                let until = *self.leaving.entry(ip).or_insert_with(|| {
                    tracing::info!(%ip, to = ?to, grace = ?LEAVING_GRACE, "VIP handed over; served here until the next announcer's announcement is out");
                    now + LEAVING_GRACE
                });
                if until > now {
                    continue;
                }
            }
            tracing::info!(%ip, to = ?to, "VIP given up");
            self.withdraw(ip).await;
            self.announced.remove(&ip);
            self.leaving.remove(&ip);
            self.metrics.given_up.inc();
            self.health.progressed(Instant::now());
        }
        let by_key: BTreeMap<&str, &Served> = served.iter().map(|s| (s.key.as_str(), s)).collect();
        // Load balancers this node no longer serves drain in the background, once none of their VIPs is
        // still being handed over.
        let gone: Vec<String> = self
            .applied
            .iter()
            .filter(|(key, spec)| {
                !plan.mine.contains_key(*key)
                    && !spec
                        .listeners
                        .iter()
                        .any(|l| self.leaving.contains_key(&l.vip))
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            self.applied.remove(&key);
            let cloud = self.cloud.clone();
            tokio::spawn(async move { cloud.inner.data_plane.remove(&key).await });
        }
        self.retry_at.retain(|_, at| *at > now);
        for (key, vips) in &plan.mine {
            if self.retry_at.contains_key(key) {
                continue;
            }
            let Some(served) = by_key.get(key.as_str()) else {
                continue;
            };
            let outcome = self.serve(served, vips, config, backends).await;
            self.health.progressed(Instant::now());
            match outcome {
                Ok(()) => {
                    self.failing.remove(key);
                }
                Err(err) => {
                    // Logged when it starts failing or fails otherwise, not at every retry.
                    if self.failing.get(key) != Some(&err) {
                        tracing::warn!(service = %key, error = %err, retry_every = ?RETRY_AFTER, "cannot serve the load balancer");
                        self.failing.insert(key.clone(), err);
                    }
                    self.retry_at.insert(key.clone(), now + RETRY_AFTER);
                }
            }
        }
        self.failing.retain(|key, _| plan.mine.contains_key(key));
    }

    /// Puts `vips` on the interface (announced), runs the data plane's load balancer of `served` on
    /// them when its traffic is the data plane's, then tells their announcers they are served.
    async fn serve(
        &mut self,
        served: &Served,
        vips: &[IpAddr],
        config: &Config,
        backends: &[(String, Vec<IpAddr>)],
    ) -> Result<(), String> {
        self.serve_vips(served, vips, config, backends).await?;
        for ip in vips {
            self.announcer_of(*ip, config).serving(*ip).await;
        }
        Ok(())
    }

    async fn serve_vips(
        &mut self,
        served: &Served,
        vips: &[IpAddr],
        config: &Config,
        backends: &[(String, Vec<IpAddr>)],
    ) -> Result<(), String> {
        let service = &served.service;
        // The manager checked the Service before it gave it VIPs; one that turned bad since (its
        // SyncLoadBalancerFailed Warning event says how) keeps what this node already runs for it, and
        // a node that takes it over does not serve it until it is mended.
        let wanted = read_service(service, config)?;
        for ip in vips {
            let routed = self.is_routed(*ip, config);
            match self.announced.get(ip) {
                Some(by_bgp) if *by_bgp == routed => continue,
                Some(_) => {
                    tracing::info!(%ip, by_bgp = routed, "the VIP's pool announces it another way now: announcing it again that way");
                    self.withdraw(*ip).await;
                    self.announced.remove(ip);
                }
                None => {}
            }
            let announcer = self.announcer_of(*ip, config);
            let warning = announcer.announce(*ip).await?;
            let announced_by = announcer.describe();
            self.announced.insert(*ip, routed);
            self.adopted.remove(ip);
            self.metrics.taken.inc();
            let node = &self.settings.node_name;
            tracing::info!(%ip, service = %served.key, "VIP announced from this node");
            self.cloud.record_event(
                "Normal",
                CloudEvent::about_vip(service, EVENT_VIP_ANNOUNCED, "AnnounceVIP"),
                &format!("{ip} is announced from node {node} ({announced_by})"),
            );
            if let Some(warning) = warning {
                self.cloud.report_unannounced_vip(service, &warning);
            }
        }
        if wanted.data_path == DataPath::KubeProxy {
            if self.applied.remove(&served.key).is_some() {
                let cloud = self.cloud.clone();
                let key = served.key.clone();
                tokio::spawn(async move { cloud.inner.data_plane.remove(&key).await });
            }
            return Ok(());
        }
        let spec = build_spec(&served.key, vips, &wanted, backends);
        let running = self.cloud.inner.data_plane.state(&served.key);
        if self.applied.get(&served.key) == Some(&spec)
            && listener_differences(&spec, running.as_ref()).is_empty()
        {
            return Ok(());
        }
        tracing::info!(service = %served.key, vips = ?vips, backends = spec.backends.len(), "serving the load balancer");
        self.applied.remove(&served.key);
        self.cloud
            .inner
            .data_plane
            .apply(spec.clone())
            .await
            .map_err(|err| err.to_string())?;
        let running = self.cloud.inner.data_plane.state(&served.key);
        let differences = listener_differences(&spec, running.as_ref());
        self.applied.insert(served.key.clone(), spec);
        if differences.is_empty() {
            Ok(())
        } else {
            Err(differences.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AgentSettings {
        AgentSettings {
            node_name: "node-1".into(),
            interface: None,
            namespace: "kube-system".into(),
            heartbeat: Duration::from_secs(3),
            renew_interval: Duration::from_secs(1),
            load_balancer_class: None,
            membership: None,
            handover_socket: None,
        }
    }

    /// An agent refuses to start where it would serve beside the leader, or beat where the manager
    /// does not look; it says so before any call to the API server (none answers here).
    #[tokio::test]
    async fn an_agent_the_cloud_config_does_not_expect_refuses_to_start() {
        let nowhere =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let start = |yaml: &str, namespace: &str| {
            let cloud = LocalCloud::new(crate::Config::parse(yaml, None).unwrap(), None);
            let settings = AgentSettings {
                namespace: namespace.into(),
                ..settings()
            };
            run(
                cloud,
                nowhere.clone(),
                settings,
                AgentMetrics::default(),
                AgentHealth::default(),
                CancellationToken::new(),
            )
        };
        let cases = [
            ("{}", "kube-system", "loadBalancer.mode is leader"),
            (
                "loadBalancer: {mode: agents}",
                "lb-system",
                "this agent's heartbeats would go to namespace \"lb-system\" (--namespace, or the pod's namespace), where the manager does not look for them: the cloud-config's loadBalancer.agentNamespace is \"kube-system\"",
            ),
            (
                "loadBalancer: {mode: agents, agentNamespace: lb-system}",
                "kube-system",
                "loadBalancer.agentNamespace is \"lb-system\"",
            ),
        ];
        for (yaml, namespace, why) in cases {
            let err = start(yaml, namespace).await.unwrap_err().to_string();
            assert!(err.contains(why), "{yaml}, {namespace}: {err}");
        }
    }

    #[test]
    fn bad_flags_are_named() {
        assert!(settings().check().is_ok());
        let cases: Vec<(AgentSettings, &str)> = vec![
            (
                AgentSettings {
                    node_name: " ".into(),
                    ..settings()
                },
                "--node-name is empty",
            ),
            (
                AgentSettings {
                    node_name: "Node_1".into(),
                    ..settings()
                },
                "--node-name \"Node_1\": its heartbeat Lease's name is not valid",
            ),
            (
                AgentSettings {
                    interface: Some(String::new()),
                    ..settings()
                },
                "--interface is empty",
            ),
            (
                AgentSettings {
                    heartbeat: Duration::from_millis(2500),
                    ..settings()
                },
                "whole seconds, at least 1s",
            ),
            (
                AgentSettings {
                    renew_interval: Duration::from_secs(2),
                    ..settings()
                },
                "at most half of --heartbeat",
            ),
        ];
        for (bad, expected) in cases {
            let err = bad.check().unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
    }

    /// A membership setting without the key is refused, not ignored; a key file that cannot be read or
    /// is too short is named with what to do.
    #[test]
    fn membership_settings_need_a_key_and_a_good_one() {
        use cloud_provider::clap::Parser;
        for flag in [
            "--membership-port=10266",
            "--membership-probe-interval=100ms",
            "--membership-suspicion-timeout=1s",
        ] {
            let err = AgentFlags::try_parse_from(["local-agent", "--node-name=n", flag])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--membership-key-file"), "{flag}: {err}");
        }
        let flags = AgentFlags::try_parse_from([
            "local-agent",
            "--node-name=n",
            "--membership-key-file=/nonexistent/key",
            "--membership-port=10266",
        ])
        .unwrap();
        let membership = flags.settings().membership.unwrap();
        assert_eq!(membership.port, 10266);
        let err = membership.key().unwrap_err().to_string();
        assert!(
            err.starts_with("--membership-key-file /nonexistent/key: cannot read it"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("key");
        std::fs::write(&short, "too short\n").unwrap();
        let err = MembershipFlags {
            key_file: short.clone(),
            ..membership.clone()
        }
        .key()
        .unwrap_err()
        .to_string();
        assert!(err.contains("the key has 9 bytes; at least 16"), "{err}");
        std::fs::write(&short, "0123456789abcdef0123456789abcdef\n").unwrap();
        let key = MembershipFlags {
            key_file: short,
            ..membership
        }
        .key()
        .unwrap();
        assert_eq!(key.len(), 32, "the trailing newline is not part of the key");
    }

    #[tokio::test]
    async fn the_interface_of_an_address_is_found_through_netlink() {
        let lo = crate::addresses::interface_with("127.0.0.1".parse().unwrap()).await;
        assert_eq!(lo, Ok(Some("lo".to_owned())));
        // TEST-NET-3: no interface has it.
        let none = crate::addresses::interface_with("203.0.113.77".parse().unwrap()).await;
        assert_eq!(none, Ok(None));
    }
}
