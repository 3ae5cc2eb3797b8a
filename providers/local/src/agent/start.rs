//! The agent's start, phase by phase: its settings checked against the cloud-config, the hand-over
//! from an agent it replaces on this node, the membership protocol, the heartbeat, and the announcers
//! (with the VIPs an earlier run left on the interface).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Instant,
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::{sync::Notify, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::{
    AgentHealth, AgentMetrics, AgentSettings,
    announcer::Announcer,
    bgp::{BgpAnnouncer, Speaker},
    handover,
    heartbeat::{Heartbeat, LeaseView, beat},
    membership::{Membership, MembershipSettings},
    own_node::{self, node_internal_ip},
    watches::{self, Mirrors},
};
use crate::{
    Announce, Error, LoadBalancerMode, LocalCloud, addresses::AddressManager, instances::lock,
};

/// Refuses a cloud-config the agents do not serve (leader mode), and heartbeats where the manager does
/// not look for them.
pub(super) fn check_cloud(cloud: &LocalCloud, settings: &AgentSettings) -> Result<(), Error> {
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
    Ok(())
}

/// What [`start`] started, for the agent to run with.
pub(super) struct Started {
    pub(super) mirrors: Mirrors,
    pub(super) lease_view: Arc<Mutex<LeaseView>>,
    pub(super) membership: Option<Membership>,
    pub(super) beating: JoinHandle<Heartbeat>,
    pub(super) renewed: Arc<Mutex<Instant>>,
    pub(super) announcers: Announcers,
    /// The interface the VIPs go on.
    pub(super) interface: String,
    /// The hand-over point, for the agent that will replace this one.
    pub(super) point: Option<handover::Point>,
}

/// Starts the agent's parts, phase by phase: the hand-over point, the watches (MetalLB's objects
/// first), the hand-over from an agent this one replaces, the membership protocol, the heartbeat and
/// the announcers. `None`: told to stop before any hand-over.
pub(super) async fn start(
    cloud: &LocalCloud,
    client: &Client,
    settings: &AgentSettings,
    metrics: &AgentMetrics,
    health: &AgentHealth,
    changed: &Arc<Notify>,
    shutdown: &CancellationToken,
) -> Result<Option<Started>, Error> {
    // First of all, before the kubelet's first probe can make this pod ready: is an agent running on
    // this node, which this one replaces (a rolling update)?
    let (mut point, replacing) = open_handover(settings)?;
    *lock(&cloud.inner.reporter) = Some((client.clone(), tokio::runtime::Handle::current()));
    let supervisor = cloud_provider::Supervisor::new(metrics.supervisor.clone(), shutdown.clone());
    health.watch_tasks(supervisor.clone());
    // MetalLB's pools and peers, when read, before the VIPs an earlier run left are looked at. The
    // manager reports the objects refused; the agents only read them.
    crate::metallb::watch::start(
        cloud,
        client.clone(),
        &supervisor,
        false,
        Some(changed.clone()),
    )
    .await?;
    let (mirrors, lease_view) = watches::start(client, settings, changed, health);
    let membership_settings = membership_settings(client, settings).await?;
    let interface = match &settings.interface {
        Some(interface) => interface.clone(),
        None => own_node::node_interface(client, &settings.node_name).await?,
    };
    let Some((mut handed, took_over)) =
        succeed(replacing, &mirrors, metrics, settings, shutdown, &mut point).await?
    else {
        return Ok(None);
    };
    cloud
        .inner
        .data_plane
        .inherit(std::mem::take(&mut handed.listeners));
    let membership = start_membership(
        settings,
        membership_settings,
        metrics,
        health,
        changed,
        handed.membership.take(),
    )
    .await?;
    let (beating, renewed) = start_heartbeat(
        client,
        settings,
        membership.as_ref(),
        changed,
        metrics,
        shutdown,
    )
    .await?;
    let announcers = announcers(
        cloud,
        client,
        settings,
        &interface,
        took_over,
        metrics,
        std::mem::take(&mut handed.bfd),
    )
    .await?;
    Ok(Some(Started {
        mirrors,
        lease_view,
        membership,
        beating,
        renewed,
        announcers,
        interface,
        point,
    }))
}

/// The hand-over point on this node (`--handover-socket`): bound when no agent runs here, else the
/// agent this one replaces (a rolling update).
pub(super) fn open_handover(
    settings: &AgentSettings,
) -> Result<(Option<handover::Point>, Option<handover::Predecessor>), Error> {
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
    Ok((point, replacing))
}

/// What came of waiting for the agent this one replaces.
pub(super) enum Succession {
    /// This agent was told to stop before any hand-over: nothing of the node's was touched.
    Stopped,
    /// It handed over its listening sockets, membership and BFD port.
    Received(handover::Handed),
    /// It stopped without handing over, or the hand-over failed: this agent starts afresh.
    Afresh,
}

/// Waits for `predecessor` to hand over, once every watch has its first list (everything that needs
/// the API server is done first, so that once the old agent hands over, this one answers its peers
/// and accepts connections at once).
pub(super) async fn take_over(
    predecessor: handover::Predecessor,
    mirrors: &Mirrors,
    metrics: &AgentMetrics,
    shutdown: &CancellationToken,
) -> Succession {
    tokio::select! {
        () = shutdown.cancelled() => return Succession::Stopped,
        () = mirrors.ready() => {}
    }
    tracing::info!("local-agent: ready; waiting for the agent this one replaces to hand over");
    match predecessor.wait(shutdown).await {
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
            Succession::Received(received)
        }
        _ if shutdown.is_cancelled() => Succession::Stopped,
        Ok(None) => {
            tracing::info!(
                "local-agent: the agent this one replaces stopped without handing over: starting afresh"
            );
            Succession::Afresh
        }
        Err(err) => {
            tracing::warn!(error = %err, "local-agent: the hand-over failed: starting afresh");
            Succession::Afresh
        }
    }
}

/// The hand-over from the agent this one replaces, if any, and whether it took the node's VIPs over;
/// `None` when this agent was told to stop first. A successor binds the hand-over point once its
/// predecessor is gone, for the agent that will replace it in turn.
pub(super) async fn succeed(
    replacing: Option<handover::Predecessor>,
    mirrors: &Mirrors,
    metrics: &AgentMetrics,
    settings: &AgentSettings,
    shutdown: &CancellationToken,
    point: &mut Option<handover::Point>,
) -> Result<Option<(handover::Handed, bool)>, Error> {
    let Some(predecessor) = replacing else {
        return Ok(Some((handover::Handed::default(), false)));
    };
    let succession = match take_over(predecessor, mirrors, metrics, shutdown).await {
        Succession::Stopped => return Ok(None),
        Succession::Received(received) => (received, true),
        Succession::Afresh => (handover::Handed::default(), false),
    };
    if let Some(path) = &settings.handover_socket {
        *point = Some(handover::Point::bind(path)?);
    }
    Ok(Some(succession))
}

/// The membership protocol's settings (`--membership-key-file` and this node's InternalIP); `None`,
/// with a warning, when membership is off.
pub(super) async fn membership_settings(
    client: &Client,
    settings: &AgentSettings,
) -> Result<Option<MembershipSettings>, Error> {
    match &settings.membership {
        None => {
            tracing::warn!(
                "membership is off (no --membership-key-file): this node stops announcing when its \
                 heartbeat cannot be renewed, as while the API server is unreachable"
            );
            Ok(None)
        }
        Some(flags) => Ok(Some(
            own_node::membership_settings(client, &settings.node_name, flags).await?,
        )),
    }
}

/// Starts the membership protocol (`None`: off), on the socket handed over if there is one.
pub(super) async fn start_membership(
    settings: &AgentSettings,
    membership_settings: Option<MembershipSettings>,
    metrics: &AgentMetrics,
    health: &AgentHealth,
    changed: &Arc<Notify>,
    handed: Option<std::os::fd::OwnedFd>,
) -> Result<Option<Membership>, Error> {
    Ok(match membership_settings {
        None => None,
        Some(membership_settings) => {
            let port = membership_settings.bind;
            let membership = Membership::start(
                &settings.node_name,
                membership_settings,
                metrics.clone(),
                health.clone(),
                changed.clone(),
                handed,
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
    })
}

/// Creates this agent's heartbeat Lease and renews it every `--renew-interval` until `shutdown`:
/// the task (which returns the heartbeat, for its release) and when it last succeeded.
pub(super) async fn start_heartbeat(
    client: &Client,
    settings: &AgentSettings,
    membership: Option<&Membership>,
    changed: &Arc<Notify>,
    metrics: &AgentMetrics,
    shutdown: &CancellationToken,
) -> Result<(JoinHandle<Heartbeat>, Arc<Mutex<Instant>>), Error> {
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let mut heartbeat = Heartbeat::new(
        lease_api,
        &settings.node_name,
        settings.heartbeat,
        settings.load_balancer_class.as_deref(),
    );
    if let Some(membership) = membership {
        heartbeat = heartbeat.with_membership(membership.address(), membership.shared_view());
    }
    heartbeat.renew().await.map_err(|source| Error::Kube {
        what: "local-agent: creating its heartbeat Lease".to_owned(),
        source,
    })?;
    let renewed = Arc::new(Mutex::new(Instant::now()));
    // Watched: each look checks that it still runs (the agent stops, failing, when it ended);
    // `stop` awaits it.
    let beating = tokio::spawn(beat(
        heartbeat,
        settings.renew_interval,
        renewed.clone(),
        changed.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    Ok((beating, renewed))
}

/// The announcers: layer 2's on `interface`, and BGP's when peers are configured (or MetalLB's
/// BGPPeers may add some), with the VIPs an earlier run left on the interface.
pub(super) struct Announcers {
    pub(super) announcer: Box<dyn Announcer>,
    pub(super) bgp: Option<BgpAnnouncer>,
    pub(super) speaker: Option<(Speaker, tokio::sync::watch::Receiver<BTreeSet<IpAddr>>)>,
    pub(super) adopted: BTreeSet<IpAddr>,
}

pub(super) async fn announcers(
    cloud: &LocalCloud,
    client: &Client,
    settings: &AgentSettings,
    interface: &str,
    took_over: bool,
    metrics: &AgentMetrics,
    bfd: Vec<local_bgp::BfdResume>,
) -> Result<Announcers, Error> {
    let announcer: Box<dyn Announcer> = Box::new(AddressManager::new(interface.to_owned()));
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
        let node_ipv4 = match node_internal_ip(client, &settings.node_name).await? {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        };
        let (speaker, peers) = Speaker::new(node_ipv4, took_over, metrics.bgp.clone(), bfd);
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
    Ok(Announcers {
        announcer,
        bgp,
        speaker,
        adopted,
    })
}
