//! `local`: a cloud for machines you own (bare metal, VMs, a laptop), so `type: LoadBalancer` Services
//! work with nothing else installed.
//!
//! - **Instances** come from an inventory in the cloud-config (name, addresses, instance type, zone,
//!   region, labels, `running` or `shutdown`); nodes it never listed are adopted (by default) or
//!   ignored. See [`instances`] for how "removed" differs from "never listed".
//! - **Load balancers** get VIPs from address pools (IPv4 and IPv6; by default 127.240.0.0/16, which
//!   needs no privileges) and their traffic is carried by an in-process data plane
//!   ([`local_data_plane`]): one listener per (VIP, port, protocol), forwarding to the eligible
//!   nodes' InternalIP:NodePort, with health checks, session affinity, source ranges and PROXY v2.
//!
//! The cloud-config is re-read within a second of a change; a malformed edit is logged and the last
//! good config kept. `docs/local-provider.md` describes every key and annotation.
//!
//! Linking this crate registers the provider under the name `local`.

mod addresses;
pub mod agent;
mod announce;
mod bgp_config;
mod config;
mod conflict;
mod heard;
pub mod instances;
mod leader_handoff;
pub mod load_balancer;
pub mod metallb;
mod os_error;
pub mod pool_metrics;
pub mod pool_objects;
pub mod pool_usage;
pub mod retained;
mod selector;
mod watcher;

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, RwLock},
};

use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, InitializeContext, InstancesV2,
    LoadBalancer, ProviderResult, async_trait, clap, prometheus_client, register_provider,
};
use local_data_plane::DataPlane;

pub use config::{
    AddressConfig, AddressPool, AddressRange, AddressType, Announce, BfdProfile, BgpConfig,
    BgpPassword, BgpPeer, Community, Config, Count, DEFAULT_POOL, GoDuration, HealthCheckTiming,
    KubeletProbe, LabelSelector, LoadBalancerConfig, LoadBalancerMode, Machine, MachineDefaults,
    MachineState, MetallbConfig, MetallbObjects, NodeSelector, PoolBgp, UnlistedNodes,
};

use crate::instances::{ProbeFailures, lock};

/// Where the event about a refused cloud-config edit is recorded (it concerns no object).
pub const EVENT_NAMESPACE: &str = "kube-system";

/// The reason of the Warning event on a Service whose VIP was put on `vipInterface` but not announced
/// to the link's neighbours (gratuitous ARP or unsolicited neighbour advertisement; usually for want
/// of `CAP_NET_RAW`). The load balancer is served all the same.
pub const EVENT_VIP_NOT_ANNOUNCED: &str = "VIPNotAnnounced";

/// The reason of the Warning event on a Service whose VIPs were assigned in `loadBalancer.mode: agents`
/// while no live node agent serves its `loadBalancerClass` (none runs, or none of that class): nothing
/// announces or serves them until one does. Recorded once per Service until an agent serves it.
pub const EVENT_NO_NODE_AGENT: &str = "NoNodeAgent";

/// The name the provider registers under, and the scheme of its provider IDs.
pub const PROVIDER_NAME: &str = "local";

/// The local cloud's flags: per-replica settings, which one cloud-config shared by every replica (a
/// ConfigMap) cannot carry.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LocalFlags {
    /// The host interface this replica puts non-loopback VIPs on while it leads (needs CAP_NET_ADMIN),
    /// and announces them on (gratuitous ARP, unsolicited neighbour advertisement: needs CAP_NET_RAW).
    /// Overrides the cloud-config's `loadBalancer.vipInterface`: interface names differ from host to
    /// host.
    #[arg(long, value_name = "INTERFACE")]
    pub local_vip_interface: Option<String>,
}

// When the manager hosts the data plane (no node agents), its runtime relays the traffic: it runs with
// the data plane's event interval (`local-agent` builds its own runtime with it too).
register_provider!(
    PROVIDER_NAME,
    new_provider,
    flags = LocalFlags,
    runtime_event_interval = RUNTIME_EVENT_INTERVAL,
);

/// The event interval of the runtime the data plane runs on (see
/// [`local_data_plane::RUNTIME_EVENT_INTERVAL`]).
pub use local_data_plane::RUNTIME_EVENT_INTERVAL;

/// The registry factory: builds the cloud from the `--cloud-config` (its defaults without one) and the
/// provider's flags.
pub fn new_provider(config: &CloudConfig) -> ProviderResult {
    let flags: LocalFlags = config.flags()?;
    Ok(Arc::new(LocalCloud::from_cloud_config_and_flags(
        config, &flags,
    )?))
}

/// Everything that can go wrong in the `local` cloud.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud-config is malformed or a value is wrong; the message names the line and column.
    #[error("malformed cloud-config{}: {message}", .path.as_ref().map(|p| format!(" {p}")).unwrap_or_default())]
    Config {
        /// The file, when known.
        path: Option<String>,
        /// What is wrong, and where.
        message: String,
    },
    /// A flag of the provider's is wrong; the message names it.
    #[error("{0}")]
    Flag(String),
    /// Something about a Service cannot be served as asked (an annotation, a field, an address).
    #[error("Service {service}: {message}")]
    Service {
        /// `namespace/name`.
        service: String,
        /// What is wrong.
        message: String,
    },
    /// The data plane could not run (all of) a Service's load balancer.
    #[error("Service {service}: {source}")]
    DataPlane {
        /// `namespace/name`.
        service: String,
        /// What the data plane said.
        #[source]
        source: local_data_plane::ApplyError,
    },
    /// A call to the Kubernetes API failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A socket operation of the hand-over between a node agent and its successor failed.
    #[error("--handover-socket {path}: {what}: {source}")]
    HandoverIo {
        /// The hand-over socket's path.
        path: String,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The other end of a hand-over broke its protocol.
    #[error("--handover-socket {path}: {why}")]
    Handover {
        /// The hand-over socket's path.
        path: String,
        /// What was wrong.
        why: String,
    },
}

impl From<Error> for CloudError {
    fn from(err: Error) -> Self {
        match err {
            service @ Error::Service { .. } => CloudError::refused(service.to_string()),
            other => CloudError::other(other.to_string()),
        }
    }
}

/// What an event of the provider's is about.
struct CloudEvent<'a> {
    /// Where it is recorded (the namespace of what it regards).
    namespace: &'a str,
    /// The start of its name (the API server adds a random end).
    name_prefix: String,
    /// The object it regards, if any.
    regarding: Option<k8s_openapi::api::core::v1::ObjectReference>,
    reason: &'static str,
    action: &'static str,
}

impl<'a> CloudEvent<'a> {
    /// An event about a VIP of `service`, recorded in its namespace and regarding it.
    fn about_vip(
        service: &'a k8s_openapi::api::core::v1::Service,
        reason: &'static str,
        action: &'static str,
    ) -> Self {
        use kube::Resource;
        CloudEvent {
            namespace: service.metadata.namespace.as_deref().unwrap_or("default"),
            name_prefix: format!(
                "{}.vip-",
                service.metadata.name.as_deref().unwrap_or("service")
            ),
            regarding: Some(service.object_ref(&())),
            reason,
            action,
        }
    }

    /// An event about the Node `node` (recorded in `default`, where events about cluster-scoped
    /// objects go).
    fn about_node(node: &str, reason: &'static str, action: &'static str) -> Self {
        CloudEvent {
            namespace: "default",
            name_prefix: format!("{node}.bgp-"),
            regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node.to_owned()),
                ..Default::default()
            }),
            reason,
            action,
        }
    }
}

/// The `local` cloud. Cheap to clone; clones share one cloud.
#[derive(Clone)]
pub struct LocalCloud {
    inner: Arc<Inner>,
}

struct Inner {
    /// The config in force: the cloud-config's, with what MetalLB's objects make out.
    config: RwLock<Arc<Config>>,
    /// The cloud-config as last read (its `loadBalancer` section the one in force).
    file_config: Mutex<Config>,
    /// What MetalLB's objects make out, once read ([`metallb`]).
    metallb: Mutex<Option<metallb::Translation>>,
    /// Every machine name a config read by this process listed.
    ever_listed: Mutex<BTreeSet<String>>,
    probe_failures: ProbeFailures,
    load_balancers: Mutex<load_balancer::Allocations>,
    /// One lock per load balancer (by Service key) around its ensure, update and delete.
    serial: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    data_plane: DataPlane,
    /// How many times a load balancer was handed to the data plane.
    applies: std::sync::atomic::AtomicU64,
    /// With `loadBalancer.vipInterface`: puts non-loopback VIPs on that interface.
    addresses: Option<addresses::AddressManager>,
    /// The `loadBalancer` section in force: the one the cloud started with (read at start; a reload
    /// that changes it is reported and waits for a restart).
    load_balancer_in_force: LoadBalancerConfig,
    /// The `loadBalancer` section as the cloud-config said at start (before the provider's flags), which
    /// a reload is compared with.
    load_balancer_in_file: Mutex<LoadBalancerConfig>,
    /// From `initialize` (the leader): where a rejected cloud-config edit is reported as an event.
    reporter: Mutex<Option<(kube::Client, tokio::runtime::Handle)>>,
    /// With node agents: the Services told [`EVENT_NO_NODE_AGENT`] since an agent last served them.
    told_unserved: Mutex<BTreeSet<String>>,
    /// The leader hand-offs given and received ([`leader_handoff`]).
    handoffs: leader_handoff::Metrics,
    /// Bumped each time the pools in force change (`LoadBalancer::settings_changes`).
    pools_changed: tokio::sync::watch::Sender<u64>,
}

impl LocalCloud {
    /// A cloud on `config`; `path` is only used in log lines. Its data plane's settings come from this
    /// config and stay for the life of the cloud. Nothing is watched.
    pub fn new(config: Config, path: Option<&std::path::Path>) -> Self {
        let lb = &config.load_balancer;
        let settings = local_data_plane::Settings {
            health_check: local_data_plane::HealthCheckTiming {
                interval: lb.health_check.interval.0,
                timeout: lb.health_check.timeout.0,
                healthy_threshold: lb.health_check.healthy_threshold.0,
                unhealthy_threshold: lb.health_check.unhealthy_threshold.0,
            },
            drain_timeout: lb.drain_timeout.0,
            udp_idle_timeout: lb.udp_idle_timeout.0,
            connect_timeout: lb.connect_timeout.0,
            tcp_idle_timeout: Some(lb.tcp_idle_timeout.0).filter(|idle| !idle.is_zero()),
            // The process's own limit: the descriptors are shared out from it.
            open_files_limit: None,
            relay_threads: lb.relay_threads,
        };
        if let Some(path) = path {
            tracing::info!(path = %path.display(), machines = config.machines.len(), pools = config.address_pools.len(), "local cloud: cloud-config read");
        }
        let cloud = Self {
            inner: Arc::new(Inner {
                config: RwLock::new(Arc::new(Config::default())),
                file_config: Mutex::new(Config::default()),
                metallb: Mutex::new(None),
                ever_listed: Mutex::new(BTreeSet::new()),
                probe_failures: Mutex::new(HashMap::new()),
                load_balancers: Mutex::new(load_balancer::Allocations::default()),
                serial: Mutex::new(HashMap::new()),
                data_plane: DataPlane::new(settings),
                applies: std::sync::atomic::AtomicU64::new(0),
                reporter: Mutex::new(None),
                told_unserved: Mutex::new(BTreeSet::new()),
                handoffs: leader_handoff::Metrics::default(),
                pools_changed: tokio::sync::watch::Sender::new(0),
                addresses: lb.vip_interface.clone().map(addresses::AddressManager::new),
                load_balancer_in_force: lb.clone(),
                load_balancer_in_file: Mutex::new(lb.clone()),
            }),
        };
        cloud.set_config(config);
        cloud
    }

    /// A cloud from the manager's `--cloud-config`: malformed contents fail with the file and line.
    /// When the config came from a file, the file is watched and re-read within a second of a change.
    pub fn from_cloud_config(config: &CloudConfig) -> Result<Self, Error> {
        Self::from_cloud_config_and_flags(config, &LocalFlags::default())
    }

    /// [`LocalCloud::from_cloud_config`], with the provider's flags applied over the cloud-config.
    pub fn from_cloud_config_and_flags(
        config: &CloudConfig,
        flags: &LocalFlags,
    ) -> Result<Self, Error> {
        let path = config.path().map(ToOwned::to_owned);
        let text = config.text().map_err(|err| Error::Config {
            path: path.as_ref().map(|p| p.display().to_string()),
            message: format!("not UTF-8 text: {err}"),
        })?;
        let mut parsed = Config::parse(text.unwrap_or_default(), path.as_deref())?;
        let in_file = parsed.load_balancer.clone();
        if let Some(interface) = &flags.local_vip_interface {
            if interface.trim().is_empty() {
                return Err(Error::Flag(
                    "--local-vip-interface cannot be empty (leave it out to keep the cloud-config's loadBalancer.vipInterface)".to_owned(),
                ));
            }
            if parsed.load_balancer.mode == LoadBalancerMode::Agents {
                return Err(Error::Flag(
                    "--local-vip-interface is the leader mode's: with loadBalancer.mode: agents the manager puts no VIP on any interface (each node agent takes its own: local-agent --interface)".to_owned(),
                ));
            }
            parsed.load_balancer.vip_interface = Some(interface.clone());
        }
        let cloud = Self::new(parsed, path.as_deref());
        *lock(&cloud.inner.load_balancer_in_file) = in_file;
        watcher::spawn(Arc::downgrade(&cloud.inner), config);
        Ok(cloud)
    }

    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        self.inner
            .config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `config` in force, as a reload of the file does. Its `loadBalancer` section does not: the
    /// one the cloud started with stays (the data plane's settings, the mode, the interface are read at
    /// start), and a reload that changes it is logged and recorded as a Warning event
    /// `CloudConfigRestartNeeded`. VIPs already given out stay.
    pub fn set_config(&self, mut config: Config) {
        if config.load_balancer != *lock(&self.inner.load_balancer_in_file) {
            let message = "the cloud-config's loadBalancer section changed; loadBalancer settings \
                           are read at start, so the ones in force stay until the manager (and, with \
                           mode: agents, each local-agent) restarts; the rest of the edit is applied";
            tracing::warn!("local cloud: {message}");
            self.record_warning(
                CloudEvent {
                    namespace: EVENT_NAMESPACE,
                    name_prefix: "local-cloud-config-".to_owned(),
                    regarding: None,
                    reason: "CloudConfigRestartNeeded",
                    action: "ReloadCloudConfig",
                },
                message,
            );
        }
        config.load_balancer = self.inner.load_balancer_in_force.clone();
        lock(&self.inner.ever_listed).extend(config.machines.keys().cloned());
        *lock(&self.inner.file_config) = config;
        self.put_in_force();
    }

    /// Puts what MetalLB's objects make out in force beside the cloud-config ([`metallb::translate`]).
    pub(crate) fn set_metallb(&self, translation: metallb::Translation) {
        *lock(&self.inner.metallb) = Some(translation);
        self.put_in_force();
    }

    /// The cloud-config as last read, without what MetalLB's objects make out.
    pub(crate) fn file_config(&self) -> Config {
        lock(&self.inner.file_config).clone()
    }

    /// Puts in force the cloud-config with MetalLB's pools (when it has none of its own), peers and
    /// BFD profiles. Should the two together fail the cloud-config's checks (which the translation
    /// guards against), the last good config stays in force and the reason is logged and reported.
    fn put_in_force(&self) {
        let file = lock(&self.inner.file_config).clone();
        let translation = lock(&self.inner.metallb).clone();
        let config = match translation {
            Some(metallb) => {
                let mut merged = file.clone();
                if !metallb.pools.is_empty() {
                    merged.address_pools = metallb.pools;
                    merged.metallb_pools = true;
                }
                let bgp = &mut merged.load_balancer.bgp;
                bgp.peers.extend(metallb.peers);
                bgp.bfd_profiles.extend(metallb.bfd_profiles);
                match merged.validate() {
                    Ok(()) => merged,
                    Err(why) => {
                        // The last good config stays: dropping MetalLB's pools would take their
                        // Services' addresses out of every pool, and the next sync would move them.
                        let message = format!(
                            "MetalLB's objects and the cloud-config together are refused; the last \
                             good configuration stays in force: {why}"
                        );
                        tracing::error!("local cloud: {message}");
                        self.report_rejected_config(&message);
                        return;
                    }
                }
            }
            None => file,
        };
        let mut in_force = self.inner.config.write().unwrap_or_else(|p| p.into_inner());
        let pools_changed = in_force.address_pools != config.address_pools;
        *in_force = Arc::new(config);
        drop(in_force);
        if pools_changed {
            self.inner.pools_changed.send_modify(|n| *n += 1);
        }
    }

    /// A receiver whose value changes each time the pools in force change (a reloaded cloud-config,
    /// MetalLB's pools): `LoadBalancer::settings_changes`.
    pub(crate) fn pools_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.pools_changed.subscribe()
    }

    /// The interface VIPs outside 127.0.0.0/8 go on, if any (`--local-vip-interface` or
    /// `loadBalancer.vipInterface`).
    pub fn vip_interface(&self) -> Option<&str> {
        self.inner.addresses.as_ref().map(|a| a.interface())
    }

    /// Whether a config this process read listed `name`.
    fn was_listed(&self, name: &str) -> bool {
        lock(&self.inner.ever_listed).contains(name)
    }

    /// How many times a load balancer was handed to the data plane (`apply`) since the cloud started:
    /// an ensure that finds nothing to change does not count.
    pub fn data_plane_applies(&self) -> u64 {
        self.inner
            .applies
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reports a cloud-config edit that was refused (and is not in force) as a Warning event
    /// `CloudConfigRejected` in `kube-system`, once `initialize` has given the cloud a client (so only
    /// the leader reports). Best effort: a failed write is logged.
    fn report_rejected_config(&self, message: &str) {
        self.record_warning(
            CloudEvent {
                namespace: EVENT_NAMESPACE,
                name_prefix: "local-cloud-config-".to_owned(),
                regarding: None,
                reason: "CloudConfigRejected",
                action: "ReloadCloudConfig",
            },
            message,
        );
    }

    /// Reports a VIP put on `vipInterface` for `service` but not announced to the link's neighbours
    /// (`warning` says what was not sent, why, and what follows) as a Warning event
    /// [`EVENT_VIP_NOT_ANNOUNCED`] on the Service. The load balancer is served all the same, so the
    /// ensure does not fail for it (which would retry it and record `SyncLoadBalancerFailed`).
    pub(crate) fn report_unannounced_vip(
        &self,
        service: &k8s_openapi::api::core::v1::Service,
        warning: &str,
    ) {
        self.record_warning(
            CloudEvent::about_vip(service, EVENT_VIP_NOT_ANNOUNCED, "AnnounceVIP"),
            warning,
        );
    }

    /// With node agents: tells `service` (a Warning event [`EVENT_NO_NODE_AGENT`], once until an agent
    /// serves it again) when no live agent serves its class, so its `vips` go unannounced. Needs the
    /// client `initialize` gives (the leader's); a failed look at the agents' Leases is logged.
    pub(crate) async fn tell_if_unserved(
        &self,
        service: &k8s_openapi::api::core::v1::Service,
        key: &str,
        vips: &[std::net::IpAddr],
    ) {
        let Some((client, _)) = lock(&self.inner.reporter).clone() else {
            return;
        };
        let config = self.config();
        let namespace = config.load_balancer.agent_namespace();
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(client, namespace);
        let (label, value) = agent::heartbeat::LEASE_LABEL;
        let listed = leases
            .list(&kube::api::ListParams::default().labels(&format!("{label}={value}")))
            .await;
        let leases = match listed {
            Ok(list) => list.items,
            Err(err) => {
                tracing::warn!(namespace, error = %err, "cannot list the node agents' heartbeat Leases (the manager needs `list` on leases there: deploy/components/local-agents/manager-rbac.yaml); not checking that an agent serves this Service");
                return;
            }
        };
        let class = service
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref());
        let why = agent::presence::why_unserved(
            &leases,
            class,
            namespace,
            k8s_openapi::jiff::Timestamp::now(),
        );
        let Some(why) = why else {
            lock(&self.inner.told_unserved).remove(key);
            return;
        };
        if !lock(&self.inner.told_unserved).insert(key.to_owned()) {
            return;
        }
        let vips: Vec<String> = vips.iter().map(ToString::to_string).collect();
        let message = format!("{} assigned, but {why}", vips.join(", "));
        tracing::warn!(service = key, "{message}");
        self.record_warning(
            CloudEvent::about_vip(service, EVENT_NO_NODE_AGENT, "AssignVIP"),
            &message,
        );
    }

    /// Forgets what [`Self::tell_if_unserved`] told the deleted Service `key`.
    pub(crate) fn forget_unserved(&self, key: &str) {
        lock(&self.inner.told_unserved).remove(key);
    }

    /// Records a Warning event, once `initialize` has given the cloud a client (so only the leader
    /// reports). Best effort: a failed write is logged.
    /// Whether events can be recorded (a client is known: after `initialize`, or in a node agent).
    fn can_report(&self) -> bool {
        lock(&self.inner.reporter).is_some()
    }

    fn record_warning(&self, what: CloudEvent<'_>, message: &str) {
        self.record_event("Warning", what, message);
    }

    /// Records an event of `type_` (`Normal` or `Warning`), once a client is known (after `initialize`,
    /// or in a node agent from its start); failures are logged.
    fn record_event(&self, type_: &'static str, what: CloudEvent<'_>, message: &str) {
        let Some((client, runtime)) = lock(&self.inner.reporter).clone() else {
            return;
        };
        let note: String = message.chars().take(1000).collect();
        let instance = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| format!("pid-{}", std::process::id()));
        let reason = what.reason;
        let event = k8s_openapi::api::events::v1::Event {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(what.name_prefix),
                namespace: Some(what.namespace.to_owned()),
                ..Default::default()
            },
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            type_: Some(type_.to_owned()),
            reason: Some(reason.to_owned()),
            action: Some(what.action.to_owned()),
            note: Some(note),
            regarding: what.regarding,
            reporting_controller: Some("cloud-provider-local".to_owned()),
            reporting_instance: Some(instance.chars().take(128).collect()),
            ..Default::default()
        };
        let namespace = what.namespace.to_owned();
        runtime.spawn(async move {
            let events: kube::Api<k8s_openapi::api::events::v1::Event> =
                kube::Api::namespaced(client, &namespace);
            if let Err(err) = events.create(&Default::default(), &event).await {
                tracing::warn!(error = %err, "local cloud: cannot record the {reason} event");
            }
        });
    }

    /// The data plane (for its state in tests and tools).
    pub fn data_plane(&self) -> &DataPlane {
        &self.inner.data_plane
    }

    /// Stops serving when `shutdown` is cancelled: the VIPs come off `vipInterface`, then the data plane
    /// shuts down.
    ///
    /// The VIPs come off before the process can exit, also after a lost lease: a VIP left on this host
    /// would answer beside the next leader's. Then the manager returns at once and shuts its runtime
    /// down, which drops every task (waiting up to 500 ms for its worker threads to do so) and lets the
    /// process exit. So the removal is not awaited in the task, where the runtime could drop it before
    /// or during the removal, but done synchronously by a guard the task owns: when the task goes on
    /// after the cancellation, or when the shutting-down runtime drops the task, whichever comes first.
    /// It takes one netlink round trip per VIP, well under a millisecond each.
    fn stop_serving_on(&self, shutdown: tokio_util::sync::CancellationToken) {
        /// Takes the VIPs off the interface, synchronously, when dropped.
        struct VipsOff(Arc<Inner>);
        impl Drop for VipsOff {
            fn drop(&mut self) {
                if let Some(addresses) = &self.0.addresses {
                    addresses.remove_all_now();
                }
            }
        }

        if let Some(addresses) = &self.inner.addresses {
            addresses.resume();
        }
        let vips_off = VipsOff(self.inner.clone());
        let cloud = self.clone();
        // Unsupervised: waits for the shutdown, then stops serving as the process exits (a supervisor
        // would drop it at that moment); the VIPs come off by the guard's drop, also on a panic.
        tokio::spawn(async move {
            shutdown.cancelled().await;
            drop(vips_off);
            tracing::info!("local cloud: shutting the data plane down");
            cloud.inner.data_plane.shutdown().await;
        });
    }
}

impl LocalCloud {
    /// A new leader with `vipInterface`, before its controllers put any VIP on: the leader before it may
    /// still serve the VIPs it takes over (a graceful stop hands them off), and the connections open
    /// through it are forwarded to it until they have drained ([`leader_handoff`]).
    async fn take_over_from_previous_leader(&self, shutdown: tokio_util::sync::CancellationToken) {
        let Some(addresses) = &self.inner.addresses else {
            return;
        };
        let vips: BTreeSet<std::net::IpAddr> = self
            .reserved_addresses()
            .into_iter()
            .filter(|ip| addresses::AddressManager::manages(*ip))
            .collect();
        let lifetime =
            leader_handoff::forwarding_lifetime(self.inner.load_balancer_in_force.drain_timeout.0);
        let forwarded =
            leader_handoff::take_over(addresses.interface(), vips, lifetime, shutdown).await;
        if forwarded > 0 {
            self.inner.handoffs.received();
        }
    }

    /// While the leader rides out an outage of the API server, watches the VIP interface for another
    /// host claiming one of its VIPs ([`conflict`]): a replica that took the Lease over serves them
    /// now, and this one steps down (the manager exits, its VIPs come off). Loopback VIPs only (no
    /// `vipInterface`): no other host can serve them, nothing to watch.
    ///
    /// A leader that cannot watch (no `CAP_NET_RAW`, the interface gone) steps down at once rather than
    /// risk serving beside the next leader.
    fn step_down_on_claims(
        &self,
        outage: cloud_provider::ApiOutage,
        supervisor: &cloud_provider::Supervisor,
    ) {
        let Some(addresses) = &self.inner.addresses else {
            return;
        };
        let interface = addresses.interface().to_owned();
        let inner = self.inner.clone();
        // Ends with the supervisor's shutdown, or when it stepped down (which shuts the manager down).
        // Started again after a panic (a second later): riding out an outage unwatched must not last.
        let ends = cloud_provider::supervise::Ends::WhenDone;
        supervisor.spawn(
            "watch for another replica serving the VIPs",
            ends,
            move || watch_for_claims(outage.clone(), inner.clone(), interface.clone()),
        );
    }
}

/// While the leader rides out an outage, watches `interface` for another replica claiming one of its
/// VIPs, and steps down when one does (or when it cannot watch); returns then.
async fn watch_for_claims(
    mut outage: cloud_provider::ApiOutage,
    inner: Arc<Inner>,
    interface: String,
) {
    loop {
        outage.wait_until(true).await;
        let defended = inner.clone();
        let watch = conflict::ConflictWatch::start(&interface, move || {
            defended
                .addresses
                .as_ref()
                .map(|a| a.held())
                .unwrap_or_default()
        });
        let mut watch = match watch {
            Ok(watch) => watch,
            Err(err) => {
                outage.step_down(format!(
                    "cannot watch {interface} for another replica serving the VIPs ({err}): stepping down rather than risk serving beside it"
                ));
                return;
            }
        };
        tracing::warn!(%interface, "local cloud: riding out the API server's outage with the last configuration; probing {interface} every {:?} for another replica serving the VIPs", conflict::PROBE_INTERVAL);
        tokio::select! {
            claim = watch.claim() => {
                outage.step_down(match claim {
                    Ok(claim) => format!("another replica serves the VIPs now: {claim} on {interface}"),
                    Err(why) => format!("the watch for another replica serving the VIPs stopped ({why}): stepping down rather than risk serving beside it"),
                });
                return;
            }
            () = outage.wait_until(false) => {
                tracing::info!(%interface, "local cloud: the lease is renewed; no longer probing for another replica");
            }
        }
    }
}

#[async_trait]
impl CloudProvider for LocalCloud {
    /// Reserves every VIP that a LoadBalancer Service's status carries (so no restart hands a taken
    /// address to another Service), then, when `ctx.shutdown` is cancelled, takes the VIPs off
    /// `vipInterface` (before the process can exit) and shuts the data plane down.
    async fn initialize(&self, ctx: InitializeContext) -> CloudResult<()> {
        // MetalLB's pools first: the addresses Services carry are reserved in them.
        metallb::watch::start(self, ctx.client.clone(), &ctx.supervisor, true, None).await?;
        let taken_over = self.reserve_published_addresses(&ctx.client).await?;
        // The addresses kept for Services that went, after those Services hold: a live Service keeps
        // its address.
        match retained::read(ctx.client.clone()).await {
            Ok(kept) => self.keep_only(&kept),
            Err(err) => {
                tracing::warn!(error = %err, "the kept addresses could not be read; they are reserved once the watch reads them")
            }
        }
        retained::spawn(self.clone(), ctx.client.clone(), &ctx.supervisor);
        *lock(&self.inner.reporter) = Some((ctx.client.clone(), tokio::runtime::Handle::current()));
        self.tell_taken_over(&taken_over);
        self.take_over_from_previous_leader(ctx.shutdown.clone())
            .await;
        pool_objects::spawn(self.clone(), ctx.client.clone(), &ctx.supervisor);
        self.stop_serving_on(ctx.shutdown.clone());
        self.step_down_on_claims(ctx.api_outage.clone(), &ctx.supervisor);
        Ok(())
    }

    /// In leader mode the data plane runs in the manager's process: the leader keeps serving while it
    /// rides out an API server it cannot reach (and steps down as soon as another replica serves). In
    /// agents mode the agents serve without the manager, and riding out spares the end of an outage a
    /// new leader's wait for the old Lease to expire: the same leader renews at once and its caches
    /// catch up within seconds.
    fn rides_out_api_outages(&self) -> bool {
        true
    }

    /// With `vipInterface` (leader mode on a real network) and a drain time: a leader that stops hands
    /// its VIPs to the next one without cutting the connections open through it (the
    /// `leader_handoff` module; docs/local-provider.md, "Leader mode hands off too").
    fn hands_off_traffic(&self) -> bool {
        self.inner.addresses.is_some()
            && !self.inner.load_balancer_in_force.drain_timeout.0.is_zero()
    }

    async fn hand_off(&self) {
        let given = leader_handoff::give_away(&self.inner).await;
        self.inner.handoffs.given(given);
    }

    /// A node without a provider ID is this cloud's unless its inventory ignores it (no machine name,
    /// or an unlisted machine with `unlistedNodes: ignore`): such a node is left to another manager.
    fn recognizes_node(&self, node: &k8s_openapi::api::core::v1::Node) -> bool {
        !matches!(
            self.classify(&self.config(), node),
            instances::Known::Ignored
        )
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn has_cluster_id(&self) -> bool {
        true
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner.data_plane.register_metrics(registry);
        self.inner.handoffs.register(registry);
        registry.register_collector(Box::new(pool_metrics::PoolCollector {
            inner: Arc::downgrade(&self.inner),
        }));
    }
}

#[cfg(test)]
mod flag_tests {
    use cloud_provider::clap::{self, Args};

    use super::*;

    fn matches(args: &[&str]) -> clap::ArgMatches {
        LocalFlags::augment_args(clap::Command::new("ccm"))
            .try_get_matches_from(std::iter::once("ccm").chain(args.iter().copied()))
            .unwrap()
    }

    #[test]
    fn only_a_reload_that_changes_the_pools_tells_the_service_controller() {
        let pools = |range: &str| {
            Config::parse(
                &format!("addressPools: [{{name: x, addresses: [{range}]}}]\n"),
                None,
            )
            .unwrap()
        };
        let cloud = LocalCloud::new(pools("127.1.0.0/24"), None);
        let changes = cloud.pools_changes();
        // The same pools, and an edit elsewhere (the inventory): nothing to tell.
        cloud.set_config(pools("127.1.0.0/24"));
        let mut with_machine = pools("127.1.0.0/24");
        with_machine.machines = Config::parse("machines: {a: {}}\n", None).unwrap().machines;
        cloud.set_config(with_machine);
        assert!(!changes.has_changed().unwrap());
        cloud.set_config(pools("127.2.0.0/24"));
        assert!(changes.has_changed().unwrap());
    }

    #[test]
    fn a_reload_applies_everything_but_the_load_balancer_section_it_started_with() {
        let cloud = LocalCloud::new(
            Config::parse("loadBalancer: {mode: agents}\n", None).unwrap(),
            None,
        );
        cloud.set_config(
            Config::parse(
                "addressPools: [{name: x, addresses: [127.1.0.0/24]}]\n\
                 loadBalancer: {mode: leader, drainTimeout: 1s}\n",
                None,
            )
            .unwrap(),
        );
        let config = cloud.config();
        assert_eq!(config.address_pools[0].name, "x", "the pools are reloaded");
        assert_eq!(config.load_balancer.mode, LoadBalancerMode::Agents);
        assert_eq!(config.load_balancer.drain_timeout.0.as_secs(), 30);
        // The interface given by flag stays in force over the file's, reload after reload.
        let file = CloudConfig::from_bytes(None, "loadBalancer: {vipInterface: eth0}\n");
        let flagged = file.with_flags(matches(&["--local-vip-interface=bond0"]));
        let cloud = LocalCloud::from_cloud_config_and_flags(
            &flagged,
            &flagged.flags::<LocalFlags>().unwrap(),
        )
        .unwrap();
        cloud.set_config(Config::parse("loadBalancer: {vipInterface: eth0}\n", None).unwrap());
        assert_eq!(
            cloud.config().load_balancer.vip_interface.as_deref(),
            Some("bond0")
        );
    }

    #[tokio::test]
    async fn the_vip_interface_flag_overrides_the_cloud_config() {
        let config = CloudConfig::from_bytes(None, "loadBalancer: {vipInterface: eth0}\n");
        let cloud = LocalCloud::from_cloud_config(&config).unwrap();
        assert_eq!(cloud.vip_interface(), Some("eth0"));
        let flagged = config
            .clone()
            .with_flags(matches(&["--local-vip-interface=bond0"]));
        let cloud = new_provider(&flagged).unwrap();
        let local = LocalCloud::from_cloud_config_and_flags(
            &flagged,
            &flagged.flags::<LocalFlags>().unwrap(),
        )
        .unwrap();
        assert_eq!(local.vip_interface(), Some("bond0"));
        assert_eq!(cloud.provider_name(), "local");
        // Without the flag, without the key: no interface is touched.
        let plain = new_provider(&CloudConfig::none().with_flags(matches(&[]))).unwrap();
        assert_eq!(plain.provider_name(), "local");
        let err = new_provider(&config.with_flags(matches(&["--local-vip-interface="])))
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("--local-vip-interface cannot be empty"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod shutdown_tests {
    use std::{net::IpAddr, time::Duration};

    use cloud_provider::LoadBalancer;

    use super::*;
    use crate::addresses::test_interface::TestInterface;

    /// After a lost lease `Manager::main` cancels the provider's shutdown token, returns at once and
    /// shuts its runtime down with a 500 ms grace: every VIP must be off the interface by then, every
    /// time (taking them off in a task that awaited the removal lost that race about half the time).
    /// Needs root, as CI runs: the VIPs go on a real interface.
    #[test]
    fn after_a_lost_lease_the_vips_are_off_before_the_runtime_is_gone() {
        let interface = TestInterface::create("s");
        let vip: IpAddr = "198.51.100.129".parse().unwrap();
        let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 18444, "nodePort": 30444, "protocol": "TCP"}]}
        }))
        .unwrap();
        for round in 0..20 {
            let cloud = LocalCloud::new(
                Config::parse(
                    &format!(
                        "addressPools: [{{name: lan, addresses: [198.51.100.128/29]}}]\nloadBalancer: {{vipInterface: {}}}\n",
                        interface.name()
                    ),
                    None,
                )
                .unwrap(),
                None,
            );
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let stop = tokio_util::sync::CancellationToken::new();
            runtime.block_on(async {
                cloud.stop_serving_on(stop.clone());
                cloud
                    .ensure_load_balancer("c", &service, &[])
                    .await
                    .unwrap();
                assert!(interface.has(vip), "round {round}: the VIP is not on");
                stop.cancel();
            });
            runtime.shutdown_timeout(Duration::from_millis(500));
            assert!(
                !interface.has(vip),
                "round {round}: the VIP was left on the interface after the runtime shut down"
            );
        }
    }
}
