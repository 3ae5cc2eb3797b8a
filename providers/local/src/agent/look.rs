//! One look of the agent: who is alive (the Leases, the membership protocol), which node announces
//! each VIP (module `plan`), and the convergence of this node's interface, announcements and data
//! plane to that.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use local_data_plane::LoadBalancerSpec;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::{
    AgentHealth, AgentMetrics, AgentSettings, EVENT_VIP_ANNOUNCED,
    announcer::Announcer,
    bgp::{BgpAnnouncer, Speaker},
    heartbeat,
    judge::{Judge, Judgement, Signals},
    membership::Membership,
    plan::{self, Served, node_unfit, nodes_with_ready_endpoints},
    wake,
    watches::Mirrors,
};
use crate::{
    Announce, CloudEvent, Config, LocalCloud,
    instances::lock,
    load_balancer::{
        DataPath, Wanted, build_spec, listener_differences, published_ips, read_service,
        service_key,
    },
};

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

/// The agent's state between two looks.
pub(super) struct Agent {
    pub(super) cloud: LocalCloud,
    pub(super) settings: AgentSettings,
    /// Tells the network which VIPs of layer-2 pools this node holds.
    pub(super) announcer: Box<dyn Announcer>,
    /// The same for BGP pools, when BGP peers are configured.
    pub(super) bgp: Option<BgpAnnouncer>,
    /// The BGP sessions, and the VIPs the BGP announcer holds.
    pub(super) speaker: Option<(Speaker, watch::Receiver<BTreeSet<IpAddr>>)>,
    pub(super) metrics: AgentMetrics,
    /// What `/healthz` says: each step of a long look (a Service served, a VIP withdrawn) counts.
    pub(super) health: AgentHealth,
    /// The membership protocol, when on.
    pub(super) membership: Option<Membership>,
    /// Who is alive, and whether this node may announce.
    pub(super) judge: Judge,
    /// When this agent last asked its peers to let it in.
    pub(super) joined_at: Option<Instant>,
    /// Why this node may not announce, while it may not (logged when it changes).
    pub(super) fenced: Option<String>,
    /// Members refused (not a Node, or not at one of its Node's addresses), logged once each.
    pub(super) refused_members: BTreeSet<String>,
    /// The VIPs on the interface.
    /// (with whether by BGP, so that a pool whose `announce` changed is announced again its new way).
    pub(super) announced: BTreeMap<IpAddr, bool>,
    /// The VIPs put on since their `VIPAnnounced` event, with what announces them: the event is recorded
    /// once the VIP is served and the network told, not when it goes on.
    pub(super) unreported: BTreeMap<IpAddr, String>,
    /// The VIPs an earlier run left on the interface that this run has not announced (yet).
    pub(super) adopted: BTreeSet<IpAddr>,
    /// What the data plane runs, by Service.
    pub(super) applied: BTreeMap<String, LoadBalancerSpec>,
    /// Services not to try again before then.
    pub(super) retry_at: HashMap<String, Instant>,
    /// Services this node cannot serve, with the last reason logged.
    pub(super) failing: HashMap<String, String>,
    /// VIPs this node gives up on purpose (its Node excluded, or being removed by the cluster
    /// autoscaler) while it still runs, each served until then: the next announcer's announcement
    /// reaches the clients first, so none meets a node that no longer has the VIP.
    pub(super) leaving: BTreeMap<IpAddr, Instant>,
    /// The data plane's load balancers being removed (each drains its connections first): owned here,
    /// so that a panic is seen ([`Agent::reap_drains`]) rather than lost with a detached task.
    pub(super) draining: tokio::task::JoinSet<()>,
}

/// How long a VIP this node gives up on purpose stays served here after the next announcer took it
/// ([`Agent::leaving`]). Two nodes then answer for it for at most this long, both serving it.
const LEAVING_GRACE: Duration = Duration::from_secs(1);

impl Agent {
    /// The agent before its first look.
    pub(super) fn new(
        cloud: LocalCloud,
        settings: AgentSettings,
        announcers: super::start::Announcers,
        metrics: AgentMetrics,
        health: AgentHealth,
        membership: Option<Membership>,
    ) -> Self {
        let super::start::Announcers {
            announcer,
            bgp,
            speaker,
            adopted,
        } = announcers;
        Self {
            cloud,
            settings,
            announcer,
            bgp,
            speaker,
            metrics,
            health,
            membership,
            judge: Judge::default(),
            joined_at: None,
            fenced: None,
            refused_members: BTreeSet::new(),
            announced: BTreeMap::new(),
            unreported: BTreeMap::new(),
            adopted,
            applied: BTreeMap::new(),
            retry_at: HashMap::new(),
            failing: HashMap::new(),
            leaving: BTreeMap::new(),
            draining: tokio::task::JoinSet::new(),
        }
    }

    /// Removes the data plane's load balancer of the Service `key`, its connections draining meanwhile.
    fn drain(&mut self, key: String) {
        let cloud = self.cloud.clone();
        self.draining
            .spawn(async move { cloud.inner.data_plane.remove(&key).await });
    }

    /// Takes in the removals that ended ([`reap`]).
    fn reap_drains(&mut self) {
        reap(&mut self.draining, &self.health);
    }

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
    pub(super) fn withdraw_all_now(&self) {
        if let Some(bgp) = &self.bgp {
            bgp.withdraw_all_now();
        }
        self.announcer.withdraw_all_now();
    }

    /// Ends the BGP sessions: with a NOTIFICATION Cease to each router, which drops this node's
    /// routes, or, `for_restart`, without one (see [`Speaker::stop`]).
    pub(super) async fn stop_bgp_sessions(&mut self, for_restart: bool) {
        if let Some((speaker, _)) = self.speaker.take() {
            speaker.stop(for_restart).await;
        }
    }

    /// One look: elect, then converge the interface and the data plane. Returns when to look again
    /// without a change (a retry that is due, the membership's timers; a heartbeat that expires is
    /// waited for by [`wake::next_look`]).
    pub(super) async fn step(
        &mut self,
        mirrors: &Mirrors,
        lease_alive: &BTreeSet<String>,
        self_fresh: bool,
        now: Instant,
    ) -> Option<Instant> {
        let config = self.cloud.config();
        let leases = mirrors.leases.state();
        let nodes = mirrors.nodes.state();
        let (signals, membership_wake) =
            self.signals(&leases, lease_alive, &nodes, self_fresh, now);
        let judgement = self.judge.judge(&signals);
        self.note_fencing(&judgement);
        let serving = self.serving_nodes(&nodes, &signals, &judgement, &config);
        let candidates: BTreeSet<String> = serving
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .filter(|n| judgement.alive.contains(n))
            .collect();
        let slices = mirrors.slices.state();
        let served: Vec<Served> = mirrors
            .services
            .state()
            .into_iter()
            .filter_map(|s| self.served(s, &config, &slices))
            .collect();
        let plan = self.plan(&served, &candidates, &nodes, &config);
        let backends: Vec<(String, Vec<IpAddr>)> = serving
            .iter()
            .filter_map(|n| self.cloud.backend_addresses(&config, n))
            .collect();
        let me = self.settings.node_name.as_str();
        let my_node = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(me));
        // The BGP sessions of the peers that select this node first, so that the announcements'
        // events name them; their routes after, once the data plane serves.
        if let Some((speaker, _)) = &mut self.speaker {
            let labels = my_node
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            speaker.select(&config, &labels).await;
        }
        // This node's own Node says it is to leave the load balancers (not a failure: it still runs and
        // hears its peers), so its VIPs are handed over make-before-break.
        let leaving_on_purpose =
            self.fenced.is_none() && my_node.and_then(|n| plan::leaving_on_purpose(n)).is_some();
        let round = Round {
            plan: &plan,
            served: &served,
            config: &config,
            backends: &backends,
            now,
        };
        self.converge(round, leaving_on_purpose).await;
        self.advertise_routes(&config);
        self.metrics.set_announced(self.announced.keys());
        let retry = self.retry_at.values().min().copied();
        let left = self.leaving.values().min().copied();
        [retry, membership_wake, left].into_iter().flatten().min()
    }

    /// Logs and counts a change of the judge's fencing of this node.
    fn note_fencing(&mut self, judgement: &Judgement) {
        if judgement.fenced_because == self.fenced {
            return;
        }
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

    /// The nodes that may serve: fit, with backend addresses, and not declared down by the membership
    /// protocol. A node whose agent speaks membership and was declared down is taken for unreachable: no
    /// candidate, and no backend either (a dead node's first health check would hold the new
    /// announcer's data plane for the check's whole timeout). A crashed agent takes its node out of
    /// the backends for as long as it is down.
    fn serving_nodes<'n>(
        &self,
        nodes: &'n [Arc<Node>],
        signals: &Signals,
        judgement: &Judgement,
        config: &Config,
    ) -> Vec<&'n Arc<Node>> {
        let me = self.settings.node_name.as_str();
        let no_one = BTreeSet::new();
        let heard = signals.members.as_ref().unwrap_or(&no_one);
        let declared_down = |name: &str| {
            judgement.by_membership
                && name != me
                && signals.speaks_membership.contains(name)
                && !heard.contains(name)
        };
        nodes
            .iter()
            .filter(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                // This node's own agent is heard too: it is the one judging (and it serves only
                // when the judge says so).
                let agent_heard = heard.contains(name) || (name == me && judgement.by_membership);
                !declared_down(name) && node_unfit(n, agent_heard).is_none()
            })
            .filter(|n| self.cloud.backend_addresses(config, n).is_some())
            .collect()
    }

    /// Which node announces each served VIP ([`plan::plan`]), among `candidates`, as the pools'
    /// announcing ways and node selectors allow.
    fn plan(
        &self,
        served: &[Served],
        candidates: &BTreeSet<String>,
        nodes: &[Arc<Node>],
        config: &Config,
    ) -> plan::Plan {
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
        plan::plan(
            self.settings.node_name.as_str(),
            served,
            candidates,
            |ip| self.is_routed(ip, config),
            may_announce,
            metallb_election,
        )
    }

    /// Advertises this node's routed VIPs to its BGP peers, recording the peers' events on the node.
    fn advertise_routes(&mut self, config: &Config) {
        if let Some((speaker, vips)) = &mut self.speaker {
            let vips = vips.borrow().clone();
            let (cloud, node) = (&self.cloud, self.settings.node_name.as_str());
            speaker.advertise(config, &vips, |type_, reason, note| {
                cloud.record_event(type_, CloudEvent::about_node(node, reason, "Peer"), note);
            });
        }
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
        if !wake::serves(&service, self.settings.load_balancer_class.as_deref())
            || service.metadata.deletion_timestamp.is_some()
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
            key: service_key(&service),
            service,
            vips,
            local_endpoints,
        })
    }

    /// Takes off the VIPs this node no longer announces (before their listeners drain), then puts on
    /// and announces the new ones and runs the data plane for each Service served here.
    async fn converge(&mut self, round: Round<'_>, leaving_on_purpose: bool) {
        let (plan, now) = (round.plan, round.now);
        let wanted: BTreeSet<IpAddr> = plan.mine.values().flatten().copied().collect();
        // A VIP handed over on purpose that is this node's again is no longer leaving; one whose grace
        // is over goes now (below, with the others given up).
        self.leaving.retain(|ip, _| !wanted.contains(ip));
        self.withdraw_adopted(&wanted).await;
        self.give_up(plan, &wanted, now, leaving_on_purpose).await;
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
            self.drain(key);
        }
        self.serve_mine(round).await;
    }

    /// Withdraws the VIPs an earlier run left on the interface that are not this node's (`wanted`).
    async fn withdraw_adopted(&mut self, wanted: &BTreeSet<IpAddr>) {
        for ip in self.adopted.difference(wanted).copied().collect::<Vec<_>>() {
            tracing::info!(%ip, "VIP left by an earlier run, not this node's: withdrawn");
            self.withdraw(ip).await;
            self.adopted.remove(&ip);
            self.health.progressed(Instant::now());
        }
    }

    /// Gives up the announced VIPs that are not this node's (`wanted`). When this node leaves on
    /// purpose, a VIP with a next announcer is served here for [`LEAVING_GRACE`] more, until the next
    /// announcer's announcement is out (make-before-break).
    async fn give_up(
        &mut self,
        plan: &plan::Plan,
        wanted: &BTreeSet<IpAddr>,
        now: Instant,
        leaving_on_purpose: bool,
    ) {
        let not_mine: Vec<IpAddr> = self
            .announced
            .keys()
            .filter(|ip| !wanted.contains(ip))
            .copied()
            .collect();
        for ip in not_mine {
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
            self.unreported.remove(&ip);
            self.leaving.remove(&ip);
            self.metrics.given_up.inc();
            self.health.progressed(Instant::now());
        }
    }

    /// Serves each load balancer the plan gives this node (but those whose retry is not due yet); one
    /// that cannot be served is logged when it starts failing, and retried after [`RETRY_AFTER`].
    async fn serve_mine(&mut self, round: Round<'_>) {
        let (plan, served, now) = (round.plan, round.served, round.now);
        let by_key: BTreeMap<&str, &Served> = served.iter().map(|s| (s.key.as_str(), s)).collect();
        self.retry_at.retain(|_, at| *at > now);
        for (key, vips) in &plan.mine {
            if self.retry_at.contains_key(key) {
                continue;
            }
            let Some(served) = by_key.get(key.as_str()) else {
                continue;
            };
            let outcome = self.serve(served, vips, round).await;
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
        round: Round<'_>,
    ) -> Result<(), String> {
        let (config, backends) = (round.config, round.backends);
        // The manager checked the Service before it gave it VIPs; one that turned bad since (its
        // SyncLoadBalancerFailed Warning event says how) keeps what this node already runs for it, and
        // a node that takes it over does not serve it until it is mended.
        let wanted = read_service(&served.service, config)?;
        self.announce_vips(served, vips, config).await?;
        self.run_data_plane(served, vips, &wanted, backends).await?;
        for ip in vips {
            if let Some(warning) = self.announcer_of(*ip, config).serving(*ip).await {
                self.cloud.report_unannounced_vip(&served.service, &warning);
            }
            if let Some(announced_by) = self.unreported.remove(ip) {
                let node = &self.settings.node_name;
                tracing::info!(%ip, service = %served.key, "VIP announced from this node");
                self.cloud.record_event(
                    "Normal",
                    CloudEvent::about_vip(&served.service, EVENT_VIP_ANNOUNCED, "AnnounceVIP"),
                    &format!("{ip} is announced from node {node} ({announced_by})"),
                );
            }
        }
        Ok(())
    }

    /// Puts on and announces those of `vips` not announced yet (again those whose pool announces them
    /// another way now).
    async fn announce_vips(
        &mut self,
        served: &Served,
        vips: &[IpAddr],
        config: &Config,
    ) -> Result<(), String> {
        let service = &served.service;
        for ip in vips {
            let routed = self.is_routed(*ip, config);
            match self.announced.get(ip) {
                Some(by_bgp) if *by_bgp == routed => continue,
                Some(_) => {
                    tracing::info!(%ip, by_bgp = routed, "the VIP's pool announces it another way now: announcing it again that way");
                    self.withdraw(*ip).await;
                    self.announced.remove(ip);
                    self.unreported.remove(ip);
                }
                None => {}
            }
            let announcer = self.announcer_of(*ip, config);
            let warning = announcer.announce(*ip).await?;
            self.unreported.insert(*ip, announcer.describe());
            self.announced.insert(*ip, routed);
            self.adopted.remove(ip);
            self.metrics.taken.inc();
            tracing::info!(%ip, service = %served.key, "VIP taken by this node: announced once served");
            if let Some(warning) = warning {
                self.cloud.report_unannounced_vip(service, &warning);
            }
        }
        Ok(())
    }

    /// Runs the data plane's load balancer of `served` on `vips`, unless kube-proxy carries its traffic.
    async fn run_data_plane(
        &mut self,
        served: &Served,
        vips: &[IpAddr],
        wanted: &Wanted,
        backends: &[(String, Vec<IpAddr>)],
    ) -> Result<(), String> {
        if wanted.data_path == DataPath::KubeProxy {
            if self.applied.remove(&served.key).is_some() {
                self.drain(served.key.clone());
            }
            return Ok(());
        }
        let spec = build_spec(&served.key, vips, wanted, backends);
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

/// What one look found, for the convergence it ends with.
#[derive(Clone, Copy)]
struct Round<'a> {
    plan: &'a plan::Plan,
    served: &'a [Served],
    config: &'a Config,
    /// The serving nodes' names with their addresses.
    backends: &'a [(String, Vec<IpAddr>)],
    now: Instant,
}

/// What a look reads, and what wakes the agent for the next one.
pub(super) struct Looking<'a> {
    pub(super) mirrors: &'a Mirrors,
    pub(super) lease_view: &'a Mutex<heartbeat::LeaseView>,
    /// When this agent's own heartbeat was last renewed.
    pub(super) renewed: &'a Mutex<Instant>,
    pub(super) changed: &'a Notify,
    pub(super) health: &'a AgentHealth,
    pub(super) shutdown: &'a CancellationToken,
    /// The heartbeat's renewals (they end only with `shutdown`).
    pub(super) beating: &'a tokio::task::JoinHandle<heartbeat::Heartbeat>,
}

/// Looks, and waits for the next look (module `wake`), until `shutdown`; returns why it stopped
/// otherwise (the membership protocol's task ended: it cancels `shutdown` too).
pub(super) async fn until_stopped(
    agent: &mut Agent,
    looking: Looking<'_>,
    point: &mut Option<super::handover::Point>,
) -> Option<crate::Error> {
    let Looking {
        mirrors,
        lease_view,
        renewed,
        changed,
        health,
        shutdown,
        beating,
    } = looking;
    let cloud = agent.cloud.clone();
    let settings = agent.settings.clone();
    let mut failure = None;
    while !shutdown.is_cancelled() {
        // The membership protocol's task ends only with `shutdown`: one that ended otherwise (a
        // panic) stops the agent, loudly, rather than leave it judging by a view that no longer moves.
        if agent.membership.as_ref().is_some_and(Membership::ended) && !shutdown.is_cancelled() {
            failure = Some(crate::Error::Flag(
                "the membership protocol's task ended unexpectedly (see the log above); the agent \
                 stops so that its pod restarts"
                    .to_owned(),
            ));
            // The heartbeat's task and the data plane stop with it, as on a signal.
            shutdown.cancel();
            break;
        }
        // The heartbeat's task too: one that ended (a panic) would leave this agent fenced for good
        // (its own heartbeat stale) while it looks healthy.
        // (It ends with `shutdown` too, which may come between the loop's check and this one.)
        if beating.is_finished() && !shutdown.is_cancelled() {
            failure = Some(crate::Error::Flag(
                "the heartbeat's task ended unexpectedly (see the log above); the agent stops so \
                 that its pod restarts"
                    .to_owned(),
            ));
            shutdown.cancel();
            break;
        }
        agent.reap_drains();
        let now = Instant::now();
        let self_fresh = now.saturating_duration_since(*lock(renewed)) < settings.heartbeat;
        let alive = lock(lease_view).alive(now);
        let next = agent.step(mirrors, &alive, self_fresh, now).await;
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
        if let Some(point) = point.as_mut() {
            point.look();
        }
        let looked = Instant::now();
        health.looked(looked, agent.fenced.clone());
        let due = next.map_or(looked + IDLE_LOOK, |at| at.min(looked + IDLE_LOOK));
        let pace = took.min(PACE_AT_MOST);
        match wake::next_look(changed, shutdown, lease_view, &alive, due, pace).await {
            wake::Woken::Look => {}
            wake::Woken::Stop => break,
        }
    }

    failure
}

/// Takes in the tasks of `draining` that ended: one that panicked (a bug) fails the agent's health
/// check for good (the kubelet restarts it), as the data plane may be left half-changed.
fn reap(draining: &mut tokio::task::JoinSet<()>, health: &AgentHealth) {
    while let Some(ended) = draining.try_join_next() {
        if let Err(err) = ended
            && err.is_panic()
        {
            let why = format!(
                "panicked: {}",
                cloud_provider::panic_message(err.into_panic().as_ref())
            );
            tracing::error!(
                "local-agent: a load balancer's removal {why}; the agent's health check fails from now on"
            );
            health.part_died("a load balancer's removal", &why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_removal_that_panics_fails_the_health_check() {
        let health = AgentHealth::default();
        let mut draining = tokio::task::JoinSet::new();
        draining.spawn(async {});
        reap_until_empty(&mut draining, &health).await;
        assert!(
            health.live().is_ok(),
            "a removal that ended well changes nothing"
        );
        draining.spawn(async { panic!("a bug") });
        reap_until_empty(&mut draining, &health).await;
        let why = health.live().unwrap_err();
        assert!(
            why.contains("a load balancer's removal panicked: a bug"),
            "{why}"
        );
    }

    async fn reap_until_empty(draining: &mut tokio::task::JoinSet<()>, health: &AgentHealth) {
        while !draining.is_empty() {
            tokio::task::yield_now().await;
            reap(draining, health);
        }
    }
}
