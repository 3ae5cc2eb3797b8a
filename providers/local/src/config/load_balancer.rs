//! The `loadBalancer` section: the data plane's mode and timings, the node agents, the health checks
//! of backends and kubelets, and MetalLB's objects.

use super::*;

/// The data plane's settings. Read at start: a change needs a restart (the pools and the inventory
/// are re-read at once).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerConfig {
    /// kube-proxy's health port, checked for `externalTrafficPolicy: Cluster` (default 10256; 0 turns
    /// that check off, every node is then taken as healthy).
    pub kube_proxy_health_port: u16,
    /// The active health checks.
    pub health_check: HealthCheckTiming,
    /// How long a deleted listener's connections may go on before they are closed (default 30s).
    pub drain_timeout: GoDuration,
    /// How long a UDP flow without packets is kept (default 60s).
    pub udp_idle_timeout: GoDuration,
    /// How long a connection to a backend may take to open (default 5s).
    pub connect_timeout: GoDuration,
    /// A relayed TCP connection with no byte either way for this long is closed (default `0s`: never;
    /// keepalive still closes one whose peer vanished).
    pub tcp_idle_timeout: GoDuration,
    /// How many threads accept and relay TCP connections (default: one per core the process may use,
    /// its CPU affinity and cgroup quota, at most 16); each connection stays on one of them for its
    /// whole life.
    pub relay_threads: Option<std::num::NonZeroUsize>,
    /// Off by default. When set, VIPs outside the loopback range are put on this interface as host
    /// addresses (`<vip>/32` or `/128`, through netlink, which needs `CAP_NET_ADMIN` and no `ip`
    /// command) while their load balancer runs, and taken off when it is deleted or the leader steps
    /// down. Each VIP put on is announced to the link's neighbours (gratuitous ARP, unsolicited
    /// neighbour advertisement), which needs `CAP_NET_RAW`.
    pub vip_interface: Option<String>,
    /// Who announces and serves the VIPs (default `leader`): see [`LoadBalancerMode`].
    pub mode: LoadBalancerMode,
    /// With `mode: agents`, the namespace of the node agents' heartbeat Leases (their DaemonSet's,
    /// default `kube-system`): the manager looks there for a live agent of each Service's class, and an
    /// agent whose heartbeats would go elsewhere refuses to start. Refused in leader mode.
    pub agent_namespace: Option<String>,
    /// The routers the node agents peer with, for pools with `announce: bgp` (`mode: agents`). Read
    /// by each agent at start: a change needs the agents restarted.
    pub bgp: BgpConfig,
    /// Whether MetalLB's objects (`metallb.io`) are read as configuration, and from where.
    pub metallb: MetallbConfig,
    /// `ipCommand`, which named the `ip` command `vipInterface` ran before VIPs went on through netlink:
    /// a config that still sets it is refused, naming the key, rather than read as if it did something.
    #[serde(deserialize_with = "refuse_ip_command")]
    ip_command: Removed,
}

/// `loadBalancer.metallb`: MetalLB's objects as configuration (`docs/local-provider.md`, "Coming
/// from MetalLB").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct MetallbConfig {
    /// When they are read (default `auto`).
    pub objects: MetallbObjects,
    /// The namespace they are read from (default `metallb-system`, MetalLB's).
    pub namespace: String,
}

impl Default for MetallbConfig {
    fn default() -> Self {
        MetallbConfig {
            objects: MetallbObjects::default(),
            namespace: crate::metallb::DEFAULT_NAMESPACE.to_owned(),
        }
    }
}

/// When MetalLB's objects are read (`loadBalancer.metallb.objects`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MetallbObjects {
    /// When the `metallb.io` CRDs exist and the cloud-config defines no `addressPools` of its own:
    /// MetalLB's pools are then the pools (a cluster whose cloud-config has pools may run MetalLB
    /// beside `local` for another class, and its objects are MetalLB's alone).
    #[default]
    Auto,
    /// Whenever the CRDs exist; with the cloud-config's pools too, MetalLB's `IPAddressPool`s are
    /// then refused (an event on each) and its peers and BFD profiles read.
    Read,
    /// Never.
    Ignore,
}

/// Who announces and serves the VIPs (`loadBalancer.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LoadBalancerMode {
    /// The leading manager announces every VIP (on `vipInterface`, or loopback) and its data plane
    /// serves them: one machine carries every load balancer, and they move with the Lease. For a
    /// one-machine cluster and for CI (127.x pools).
    #[default]
    Leader,
    /// The manager only assigns the VIPs and writes the Services' status; the node agents (`local-agent`,
    /// a DaemonSet) elect one node per VIP, which puts it on its interface, announces it (gratuitous
    /// ARP, unsolicited neighbour advertisement) and serves it with its own data plane, or leaves the
    /// traffic to kube-proxy (`local.ccm.rs/data-path: kube-proxy`). A node's loss moves only its VIPs,
    /// within the agents' heartbeat (3 s by default).
    Agents,
}

/// The value of a key that is refused when set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Removed;

pub(super) fn refuse_ip_command<'de, D: Deserializer<'de>>(_: D) -> Result<Removed, D::Error> {
    Err(de::Error::custom(IP_COMMAND_REMOVED))
}

impl LoadBalancerConfig {
    /// The namespace of the node agents' heartbeat Leases (`agentNamespace`, default `kube-system`).
    pub fn agent_namespace(&self) -> &str {
        self.agent_namespace.as_deref().unwrap_or("kube-system")
    }
}

impl Default for LoadBalancerConfig {
    fn default() -> Self {
        Self {
            kube_proxy_health_port: 10256,
            health_check: HealthCheckTiming::default(),
            drain_timeout: GoDuration(Duration::from_secs(30)),
            udp_idle_timeout: GoDuration(Duration::from_secs(60)),
            connect_timeout: GoDuration(Duration::from_secs(5)),
            tcp_idle_timeout: GoDuration(Duration::ZERO),
            relay_threads: None,
            vip_interface: None,
            mode: LoadBalancerMode::default(),
            agent_namespace: None,
            bgp: BgpConfig::default(),
            metallb: MetallbConfig::default(),
            ip_command: Removed,
        }
    }
}

/// Health-check timing (cloud-provider-kind's: every 2 s, 1 s timeout... see the defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheckTiming {
    /// Between two checks of one backend (default 2s).
    pub interval: GoDuration,
    /// For one check's answer (default 1s).
    pub timeout: GoDuration,
    /// Passed checks in a row that make a backend healthy (default 2).
    pub healthy_threshold: Count,
    /// Failed checks in a row that make a backend unhealthy (default 2).
    pub unhealthy_threshold: Count,
}

impl Default for HealthCheckTiming {
    fn default() -> Self {
        Self {
            interval: GoDuration(Duration::from_secs(2)),
            timeout: GoDuration(Duration::from_secs(1)),
            healthy_threshold: Count(2),
            unhealthy_threshold: Count(2),
        }
    }
}

/// The optional kubelet probe: a machine whose kubelet port stops accepting TCP connections is reported
/// shut down. Off by default: see its false-positive risk in `docs/local-provider.md`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletProbe {
    /// Default `false`.
    pub enabled: bool,
    /// The kubelet's port (default 10250).
    pub port: u16,
    /// For one connection attempt (default 2s).
    pub timeout: GoDuration,
    /// Failed probes in a row (one per lifecycle pass of a NotReady node) before the machine counts as
    /// shut down (default 3).
    pub failure_threshold: Count,
}

impl Default for KubeletProbe {
    fn default() -> Self {
        Self {
            enabled: false,
            port: 10250,
            timeout: GoDuration(Duration::from_secs(2)),
            failure_threshold: Count(3),
        }
    }
}

/// A count of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match u32::deserialize(d)? {
            0 => Err(de::Error::custom("must be at least 1")),
            n => Ok(Self(n)),
        }
    }
}
