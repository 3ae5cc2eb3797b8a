//! The `local` cloud's configuration: the YAML `--cloud-config` file. Every key is shown in
//! `cloud-config.example.yaml` beside this crate and described in `docs/local-provider.md`.
//!
//! Values are checked while they are read, so a bad value is reported with its file, line and column.
//! An empty file (or none at all) is a valid config: every node is adopted and load balancers get VIPs
//! from the default pool in 127.0.0.0/8.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr},
    path::Path,
    str::FromStr,
    time::Duration,
};

pub use crate::bgp_config::{
    Announce, BfdProfile, BgpConfig, BgpPassword, BgpPeer, Community, NodeSelector, PoolBgp,
};
pub use cloud_provider::config_values::{AddressConfig, AddressType, GoDuration};
use serde::{Deserialize, Deserializer, de};

use crate::Error;
pub use crate::selector::{LabelSelector, any_selects};

/// The default pool's only range: 127.240.0.0/16, loopback addresses any process can bind.
pub const DEFAULT_POOL: &str = "127.240.0.0/16";

/// The parsed cloud-config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// What happens to nodes the inventory never listed: `adopt` (default) or `ignore`.
    #[serde(default)]
    pub unlisted_nodes: UnlistedNodes,
    /// The fields of adopted nodes, and of machines that leave them out.
    #[serde(default)]
    pub defaults: MachineDefaults,
    /// The inventory: machines by node name.
    #[serde(default)]
    pub machines: BTreeMap<String, Machine>,
    /// Where load-balancer VIPs come from, in order of preference. Default: one pool `default` with
    /// [`DEFAULT_POOL`].
    #[serde(default = "default_pools")]
    pub address_pools: Vec<AddressPool>,
    /// The load balancers' data plane.
    #[serde(default)]
    pub load_balancer: LoadBalancerConfig,
    /// The optional kubelet probe (off by default).
    #[serde(default)]
    pub kubelet_probe: KubeletProbe,
    /// Set by the cloud, never read from the file: the pools in force are MetalLB's (`metallb`), whose
    /// Services' traffic kube-proxy carries by default, as under MetalLB.
    #[serde(skip)]
    pub(crate) metallb_pools: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            unlisted_nodes: UnlistedNodes::default(),
            defaults: MachineDefaults::default(),
            machines: BTreeMap::new(),
            address_pools: default_pools(),
            load_balancer: LoadBalancerConfig::default(),
            kubelet_probe: KubeletProbe::default(),
            metallb_pools: false,
        }
    }
}

fn default_pools() -> Vec<AddressPool> {
    vec![AddressPool {
        name: "default".to_owned(),
        addresses: vec![DEFAULT_POOL.parse().expect("the default pool is a CIDR")],
        auto_assign: true,
        namespaces: Vec::new(),
        service_selector: None,
        service_selectors: Vec::new(),
        namespace_selectors: Vec::new(),
        node_selectors: Vec::new(),
        avoid_buggy_ips: false,
        priority: None,
        cross_namespace_sharing: false,
        announce: Announce::L2,
        bgp: None,
        metallb_election: false,
    }]
}

/// What happens to a node the inventory has never listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnlistedNodes {
    /// The node is a machine of this cloud: its provider ID is `local://<name>`, its addresses its own
    /// (or its `alpha.kubernetes.io/provided-node-ip`), its other fields the `defaults`.
    #[default]
    Adopt,
    /// The node is left alone: the cloud-node controller skips it (it keeps the uninitialized taint) and
    /// the lifecycle controller never deletes or taints it.
    Ignore,
}

/// The fields of adopted nodes and the defaults of listed machines.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineDefaults {
    /// Default `local`.
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
    /// Default empty (no zone label).
    #[serde(default)]
    pub zone: String,
    /// Default empty (no region label).
    #[serde(default)]
    pub region: String,
}

fn default_instance_type() -> String {
    "local".to_owned()
}

impl Default for MachineDefaults {
    fn default() -> Self {
        Self {
            instance_type: default_instance_type(),
            zone: String::new(),
            region: String::new(),
        }
    }
}

/// A machine of the inventory. Unset fields come from `defaults`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    /// The machine's addresses. Empty (default): the node's own addresses, as for an adopted node.
    #[serde(default)]
    pub addresses: Vec<AddressConfig>,
    /// Instance type.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// Zone.
    #[serde(default)]
    pub zone: Option<String>,
    /// Region.
    #[serde(default)]
    pub region: Option<String>,
    /// Extra labels for the node (keys in Kubernetes' own namespaces are dropped by the node controller).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `running` (default) or `shutdown`.
    #[serde(default)]
    pub state: MachineState,
}

/// The power state of a machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineState {
    /// Runs.
    #[default]
    Running,
    /// Exists but is shut down: its node gets the shutdown taint once NotReady.
    Shutdown,
}

/// A named pool of VIPs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressPool {
    /// The pool's name, for the `local.ccm.rs/address-pool` annotation.
    pub name: String,
    /// CIDRs (`127.240.0.0/16`, `fd00:10::/120`) or ranges (`127.0.10.1-127.0.10.50`), IPv4 or IPv6.
    pub addresses: Vec<AddressRange>,
    /// Whether Services that name no pool get addresses from it (default `true`); `false` keeps it for
    /// Services that name it or request one of its addresses.
    #[serde(default = "yes")]
    pub auto_assign: bool,
    /// The namespaces whose Services may take addresses from the pool; empty (the default): every
    /// namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// The labels a Service must carry to take addresses from the pool; none (the default): every
    /// Service. A Kubernetes label selector (`matchLabels`, `matchExpressions`).
    #[serde(default)]
    pub service_selector: Option<LabelSelector>,
    /// More selectors of Services, any one of which suffices (MetalLB's `serviceSelectors`); with
    /// `serviceSelector` too, a Service must match it and one of these.
    #[serde(default)]
    pub service_selectors: Vec<LabelSelector>,
    /// Selectors of namespaces by their labels: a Service in a namespace one of them selects may take
    /// addresses from the pool as if the namespace were listed in `namespaces` (MetalLB's
    /// `namespaceSelectors`).
    #[serde(default)]
    pub namespace_selectors: Vec<LabelSelector>,
    /// The nodes that may announce the pool's VIPs (layer 2: be elected; BGP: advertise them): those
    /// any one of these selects; none (the default): every node. MetalLB's `L2Advertisement` and
    /// `BGPAdvertisement` `nodeSelectors`.
    #[serde(default)]
    pub node_selectors: Vec<LabelSelector>,
    /// Never gives out an IPv4 address ending in `.0` or `.255`, which some old routers drop (MetalLB's
    /// `avoidBuggyIPs`, default `false`).
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Where the pool ranks when a Service that names no pool is given an address: pools with a
    /// priority (1 or more; 0 is refused) first, the lowest number first, then the pools without one; in
    /// the file's order among equals (MetalLB's `serviceAllocation.priority`, with the file's order where
    /// MetalLB breaks ties by its own rules).
    #[serde(default)]
    pub priority: Option<u32>,
    /// Whether Services of different namespaces may share one of its addresses with the same
    /// `local.ccm.rs/allow-shared-ip` key (default `false`: a key spans one namespace, so a tenant
    /// cannot join another tenant's address by guessing or learning its key).
    #[serde(default)]
    pub cross_namespace_sharing: bool,
    /// How the pool's VIPs reach the network: `l2` (the default) or `bgp` (node agents only).
    #[serde(default)]
    pub announce: Announce,
    /// With `announce: bgp`: which peers the VIPs go to, and their communities and local preference.
    #[serde(default)]
    pub bgp: Option<PoolBgp>,
    /// Set for the pools read from MetalLB's objects, never from the file: layer 2 elects the node
    /// that announces a VIP as MetalLB's speakers do (`agent::plan::metallb_announcer`).
    #[serde(skip)]
    pub(crate) metallb_election: bool,
}

impl AddressPool {
    /// Why the pool does not serve a Service in `namespace` (labelled `namespace_labels`) with
    /// `labels` (`None`: it does).
    pub fn refuses(
        &self,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> Option<String> {
        let scoped = !self.namespaces.is_empty() || !self.namespace_selectors.is_empty();
        if scoped
            && !self.namespaces.iter().any(|n| n == namespace)
            && !self
                .namespace_selectors
                .iter()
                .any(|s| s.matches(namespace_labels))
        {
            let mut scope: Vec<String> = self.namespaces.clone();
            scope.extend(
                self.namespace_selectors
                    .iter()
                    .map(|s| format!("namespaces labelled {s}")),
            );
            return Some(format!(
                "pool {:?} serves the namespaces {} only",
                self.name,
                scope.join(", ")
            ));
        }
        if let Some(selector) = &self.service_selector
            && !selector.matches(labels)
        {
            return Some(format!(
                "pool {:?} serves Services labelled {selector} only",
                self.name
            ));
        }
        if !any_selects(&self.service_selectors, labels) {
            let wanted: Vec<String> = self
                .service_selectors
                .iter()
                .map(|s| format!("({s})"))
                .collect();
            return Some(format!(
                "pool {:?} serves Services labelled {} only",
                self.name,
                wanted.join(" or ")
            ));
        }
        None
    }

    /// Whether the pool may give out `ip` (`avoidBuggyIPs` keeps IPv4 `.0` and `.255` back).
    pub fn gives_out(&self, ip: IpAddr) -> bool {
        !(self.avoid_buggy_ips && matches!(ip, IpAddr::V4(v4) if matches!(v4.octets()[3], 0 | 255)))
    }

    /// Whether a node labelled `labels` may announce the pool's VIPs (`nodeSelectors`).
    pub fn announced_by(&self, labels: &BTreeMap<String, String>) -> bool {
        any_selects(&self.node_selectors, labels)
    }

    /// Every label key the pool's Service selectors read.
    pub fn service_label_keys(&self) -> impl Iterator<Item = &str> {
        self.service_selector
            .iter()
            .chain(&self.service_selectors)
            .flat_map(LabelSelector::keys)
    }
}

fn yes() -> bool {
    true
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    first: IpAddr,
    last: IpAddr,
}

impl AddressRange {
    /// The addresses from `first` to `last` (inclusive); `None` if their families differ or
    /// `first > last`.
    pub fn new(first: IpAddr, last: IpAddr) -> Option<Self> {
        (first.is_ipv4() == last.is_ipv4() && first <= last).then_some(Self { first, last })
    }

    /// The lowest address.
    pub fn first(&self) -> IpAddr {
        self.first
    }

    /// The highest address.
    pub fn last(&self) -> IpAddr {
        self.last
    }

    /// The block the range covers as a CIDR would (with the network and broadcast addresses a CIDR
    /// pool does not hand out, and the IPv6 subnet-router anycast address), or the range itself
    /// when it is no such block.
    pub fn span(&self) -> (IpAddr, IpAddr) {
        let v4 = self.first.is_ipv4();
        let (first, last) = (to_u128(self.first), to_u128(self.last));
        let widened = if v4 {
            first.checked_sub(1).zip(last.checked_add(1))
        } else {
            first.checked_sub(1).map(|f| (f, last))
        };
        if let Some((low, high)) = widened {
            let size = high - low + 1;
            let aligned = size.is_power_of_two() && low % size == 0;
            let in_family = !v4 || high <= u128::from(u32::MAX);
            if aligned && in_family && size >= 4 {
                return (from_u128(low, v4), from_u128(high, v4));
            }
        }
        (self.first, self.last)
    }

    /// Whether `ip` lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.first.is_ipv4() && self.first <= ip && ip <= self.last
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.first.is_ipv4() == other.first.is_ipv4()
            && self.first <= other.last
            && other.first <= self.last
    }

    /// The addresses, lowest first (lazily: an IPv6 /64 is fine).
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + use<> {
        let (first, last, v4) = (
            to_u128(self.first),
            to_u128(self.last),
            self.first.is_ipv4(),
        );
        (first..=last).map(move |n| from_u128(n, v4))
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 {
        // In range by construction: both ends are IPv4.
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    } else {
        IpAddr::V6(n.into())
    }
}

impl FromStr for AddressRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let bad = |why: &str| {
            format!(
                "invalid address range {text:?}: {why} (expected a CIDR such as 127.240.0.0/16 or \
                 fd00::/120, or a range such as 127.0.10.1-127.0.10.50)"
            )
        };
        if let Some((first, last)) = text.split_once('-') {
            let first: IpAddr = first
                .trim()
                .parse()
                .map_err(|_| bad("the start is not an IP address"))?;
            let last: IpAddr = last
                .trim()
                .parse()
                .map_err(|_| bad("the end is not an IP address"))?;
            return Self::new(first, last).ok_or_else(|| {
                bad("the two ends must be of one family, the start not above the end")
            });
        }
        let net: ipnet::IpNet = text.parse().map_err(|_| bad("not a CIDR or range"))?;
        let (mut first, mut last) = (to_u128(net.network()), to_u128(net.broadcast()));
        // The network and broadcast addresses of an IPv4 subnet, and the subnet-router anycast
        // address of an IPv6 one, are not handed out.
        match net {
            ipnet::IpNet::V4(v4) if v4.prefix_len() < 31 => {
                first += 1;
                last -= 1;
            }
            ipnet::IpNet::V6(v6) if v6.prefix_len() < 127 => first += 1,
            _ => {}
        }
        let v4 = net.addr().is_ipv4();
        Ok(Self {
            first: from_u128(first, v4),
            last: from_u128(last, v4),
        })
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl<'de> Deserialize<'de> for AddressRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

/// The data plane's settings. Read at start: a change needs a restart (the pools and the inventory
/// are re-read at once).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerConfig {
    /// kube-proxy's health port, checked for `externalTrafficPolicy: Cluster` (default 10256; 0 turns
    /// that check off, every node is then taken as healthy).
    #[serde(default = "default_kube_proxy_port")]
    pub kube_proxy_health_port: u16,
    /// The active health checks.
    #[serde(default)]
    pub health_check: HealthCheckTiming,
    /// How long a deleted listener's connections may go on before they are closed (default 30s).
    #[serde(default = "default_drain")]
    pub drain_timeout: GoDuration,
    /// How long a UDP flow without packets is kept (default 60s).
    #[serde(default = "default_udp_idle")]
    pub udp_idle_timeout: GoDuration,
    /// How long a connection to a backend may take to open (default 5s).
    #[serde(default = "default_connect")]
    pub connect_timeout: GoDuration,
    /// A relayed TCP connection with no byte either way for this long is closed (default `0s`: never;
    /// keepalive still closes one whose peer vanished).
    #[serde(default)]
    pub tcp_idle_timeout: GoDuration,
    /// Off by default. When set, VIPs outside the loopback range are put on this interface as host
    /// addresses (`<vip>/32` or `/128`, through netlink, which needs `CAP_NET_ADMIN` and no `ip`
    /// command) while their load balancer runs, and taken off when it is deleted or the leader steps
    /// down. Each VIP put on is announced to the link's neighbours (gratuitous ARP, unsolicited
    /// neighbour advertisement), which needs `CAP_NET_RAW`.
    #[serde(default)]
    pub vip_interface: Option<String>,
    /// Who announces and serves the VIPs (default `leader`): see [`LoadBalancerMode`].
    #[serde(default)]
    pub mode: LoadBalancerMode,
    /// With `mode: agents`, the namespace of the node agents' heartbeat Leases (their DaemonSet's,
    /// default `kube-system`): the manager looks there for a live agent of each Service's class, and an
    /// agent whose heartbeats would go elsewhere refuses to start. Refused in leader mode.
    #[serde(default)]
    pub agent_namespace: Option<String>,
    /// The routers the node agents peer with, for pools with `announce: bgp` (`mode: agents`). Read
    /// by each agent at start: a change needs the agents restarted.
    #[serde(default)]
    pub bgp: BgpConfig,
    /// Whether MetalLB's objects (`metallb.io`) are read as configuration, and from where.
    #[serde(default)]
    pub metallb: MetallbConfig,
    /// `ipCommand`, which named the `ip` command `vipInterface` ran before VIPs went on through netlink:
    /// a config that still sets it is refused, naming the key, rather than read as if it did something.
    #[serde(default, deserialize_with = "refuse_ip_command")]
    ip_command: Removed,
}

/// `loadBalancer.metallb`: MetalLB's objects as configuration (`docs/local-provider.md`, "Coming
/// from MetalLB").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetallbConfig {
    /// When they are read (default `auto`).
    #[serde(default)]
    pub objects: MetallbObjects,
    /// The namespace they are read from (default `metallb-system`, MetalLB's).
    #[serde(default = "default_metallb_namespace")]
    pub namespace: String,
}

impl Default for MetallbConfig {
    fn default() -> Self {
        MetallbConfig {
            objects: MetallbObjects::default(),
            namespace: default_metallb_namespace(),
        }
    }
}

fn default_metallb_namespace() -> String {
    crate::metallb::DEFAULT_NAMESPACE.to_owned()
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
struct Removed;

/// What a config that sets `loadBalancer.ipCommand` is told.
pub(crate) const IP_COMMAND_REMOVED: &str = "loadBalancer.ipCommand is no longer supported: VIPs are put \
     on loadBalancer.vipInterface through netlink now (no `ip` command is run; CAP_NET_ADMIN puts them \
     on, CAP_NET_RAW announces them); remove the ipCommand key";

fn refuse_ip_command<'de, D: Deserializer<'de>>(_: D) -> Result<Removed, D::Error> {
    Err(de::Error::custom(IP_COMMAND_REMOVED))
}

fn default_kube_proxy_port() -> u16 {
    10256
}
fn default_drain() -> GoDuration {
    GoDuration(Duration::from_secs(30))
}
fn default_udp_idle() -> GoDuration {
    GoDuration(Duration::from_secs(60))
}
fn default_connect() -> GoDuration {
    GoDuration(Duration::from_secs(5))
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
            kube_proxy_health_port: default_kube_proxy_port(),
            health_check: HealthCheckTiming::default(),
            drain_timeout: default_drain(),
            udp_idle_timeout: default_udp_idle(),
            connect_timeout: default_connect(),
            tcp_idle_timeout: GoDuration(Duration::ZERO),
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheckTiming {
    /// Between two checks of one backend (default 2s).
    #[serde(default = "default_interval")]
    pub interval: GoDuration,
    /// For one check's answer (default 1s).
    #[serde(default = "default_timeout")]
    pub timeout: GoDuration,
    /// Passed checks in a row that make a backend healthy (default 2).
    #[serde(default = "two")]
    pub healthy_threshold: Count,
    /// Failed checks in a row that make a backend unhealthy (default 2).
    #[serde(default = "two")]
    pub unhealthy_threshold: Count,
}

fn default_interval() -> GoDuration {
    GoDuration(Duration::from_secs(2))
}
fn default_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(1))
}
fn two() -> Count {
    Count(2)
}

impl Default for HealthCheckTiming {
    fn default() -> Self {
        Self {
            interval: default_interval(),
            timeout: default_timeout(),
            healthy_threshold: two(),
            unhealthy_threshold: two(),
        }
    }
}

/// The optional kubelet probe: a machine whose kubelet port stops accepting TCP connections is reported
/// shut down. Off by default: see its false-positive risk in `docs/local-provider.md`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletProbe {
    /// Default `false`.
    #[serde(default)]
    pub enabled: bool,
    /// The kubelet's port (default 10250).
    #[serde(default = "default_kubelet_port")]
    pub port: u16,
    /// For one connection attempt (default 2s).
    #[serde(default = "default_probe_timeout")]
    pub timeout: GoDuration,
    /// Failed probes in a row (one per lifecycle pass of a NotReady node) before the machine counts as
    /// shut down (default 3).
    #[serde(default = "three")]
    pub failure_threshold: Count,
}

fn default_kubelet_port() -> u16 {
    10250
}
fn default_probe_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(2))
}
fn three() -> Count {
    Count(3)
}

impl Default for KubeletProbe {
    fn default() -> Self {
        Self {
            enabled: false,
            port: default_kubelet_port(),
            timeout: default_probe_timeout(),
            failure_threshold: three(),
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

impl Config {
    /// Parses the YAML text of a cloud-config; `path` names the file in errors. Never panics.
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Self, Error> {
        let malformed = |message: String| Error::Config {
            path: path.map(|p| p.display().to_string()),
            message,
        };
        let config = std::panic::catch_unwind(|| serde_saphyr::from_str::<Option<Config>>(text))
            .map_err(|_| malformed("the YAML parser failed on it".to_owned()))?
            .map_err(|err| malformed(err.to_string()))?
            .unwrap_or_default();
        config.validate().map_err(malformed)?;
        Ok(config)
    }

    /// What the types alone cannot check: pool names are unique and pools do not overlap, timeouts fit
    /// their intervals, IP-typed addresses are IPs.
    pub fn validate(&self) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for pool in &self.address_pools {
            if pool.name.is_empty() {
                return Err("addressPools: a pool has an empty name".to_owned());
            }
            if !names.insert(pool.name.as_str()) {
                return Err(format!("addressPools: two pools are named {:?}", pool.name));
            }
            if !pool.node_selectors.is_empty()
                && self.load_balancer.mode != LoadBalancerMode::Agents
            {
                return Err(format!(
                    "addressPools: pool {:?}: nodeSelectors choose the node agents that announce \
                     its VIPs, and needs loadBalancer.mode: agents (in leader mode the leading \
                     manager announces every VIP)",
                    pool.name
                ));
            }
            if pool.priority == Some(0) {
                // MetalLB reads 0 as "no priority" (last); here it would be the first: refused rather
                // than read one way when the file's author meant the other.
                return Err(format!(
                    "addressPools: pool {:?}: priority 0 is ambiguous (MetalLB takes 0 for no \
                     priority, tried last): give 1 or more (1 is tried first), or leave it out",
                    pool.name
                ));
            }
            for namespace in &pool.namespaces {
                cloud_provider::labels::check_dns_label(namespace).map_err(|why| {
                    format!(
                        "addressPools: pool {:?}: {namespace:?} is not a namespace's name: {why}",
                        pool.name
                    )
                })?;
            }
        }
        self.validate_bgp()?;
        let ranges: Vec<(&str, &AddressRange)> = self
            .address_pools
            .iter()
            .flat_map(|p| p.addresses.iter().map(move |r| (p.name.as_str(), r)))
            .collect();
        for (i, (pool_a, a)) in ranges.iter().enumerate() {
            for (pool_b, b) in &ranges[i + 1..] {
                if a.overlaps(b) {
                    return Err(format!(
                        "addressPools: {a} (pool {pool_a:?}) overlaps {b} (pool {pool_b:?}); an \
                         address can belong to one pool only"
                    ));
                }
            }
        }
        let timing = &self.load_balancer.health_check;
        if timing.interval.0.is_zero() || timing.timeout.0.is_zero() {
            return Err(
                "loadBalancer.healthCheck: interval and timeout must be above 0".to_owned(),
            );
        }
        if self.load_balancer.connect_timeout.0.is_zero()
            || self.load_balancer.udp_idle_timeout.0.is_zero()
        {
            return Err(
                "loadBalancer: connectTimeout and udpIdleTimeout must be above 0".to_owned(),
            );
        }
        if self
            .load_balancer
            .vip_interface
            .as_ref()
            .is_some_and(|i| i.trim().is_empty())
        {
            return Err("loadBalancer.vipInterface cannot be empty".to_owned());
        }
        if self.load_balancer.mode == LoadBalancerMode::Agents
            && self.load_balancer.vip_interface.is_some()
        {
            return Err("loadBalancer.vipInterface is the leader mode's: with mode: agents, the \
                 manager puts no VIP on any interface and each node agent takes its own (local-agent \
                 --interface); remove vipInterface"
                .to_owned());
        }
        if self.load_balancer.metallb.objects == MetallbObjects::Read
            && self.load_balancer.mode != LoadBalancerMode::Agents
        {
            return Err(
                "loadBalancer.metallb.objects: read is the agents mode's (mode: agents): in \
                 leader mode the leading manager announces every VIP itself, and MetalLB's objects \
                 are not read"
                    .to_owned(),
            );
        }
        cloud_provider::labels::check_dns_label(&self.load_balancer.metallb.namespace).map_err(
            |why| {
                format!(
                    "loadBalancer.metallb.namespace {:?}: {why}",
                    self.load_balancer.metallb.namespace
                )
            },
        )?;
        if let Some(namespace) = &self.load_balancer.agent_namespace {
            if self.load_balancer.mode != LoadBalancerMode::Agents {
                return Err(
                    "loadBalancer.agentNamespace is the agents mode's (mode: agents): in \
                     leader mode no node agent runs; remove agentNamespace"
                        .to_owned(),
                );
            }
            cloud_provider::labels::check_dns_label(namespace).map_err(|why| {
                format!(
                    "loadBalancer.agentNamespace: {namespace:?} is not a namespace's name: {why}"
                )
            })?;
        }
        if self.kubelet_probe.enabled && self.kubelet_probe.timeout.0.is_zero() {
            return Err("kubeletProbe.timeout must be above 0".to_owned());
        }
        for (name, machine) in &self.machines {
            for address in &machine.addresses {
                let is_ip = matches!(
                    address.type_,
                    AddressType::InternalIp | AddressType::ExternalIp
                );
                if is_ip && address.address.parse::<IpAddr>().is_err() {
                    return Err(format!(
                        "machines.{name}.addresses: {:?} is not an IP address (type {})",
                        address.address,
                        address.type_.as_str()
                    ));
                }
                if address.address.is_empty() {
                    return Err(format!("machines.{name}.addresses: an address is empty"));
                }
            }
        }
        Ok(())
    }

    /// The BGP peers, and the pools that announce by BGP.
    fn validate_bgp(&self) -> Result<(), String> {
        let peers = &self.load_balancer.bgp.peers;
        let profiles = &self.load_balancer.bgp.bfd_profiles;
        let mut profile_names = BTreeSet::new();
        for profile in profiles {
            profile.validate()?;
            if !profile_names.insert(profile.name.as_str()) {
                return Err(format!(
                    "loadBalancer.bgp.bfdProfiles: two profiles are named {:?}",
                    profile.name
                ));
            }
        }
        let mut names = BTreeSet::new();
        for peer in peers {
            if let Some(profile) = &peer.bfd_profile
                && !profile_names.contains(profile.as_str())
            {
                return Err(format!(
                    "loadBalancer.bgp.peers {:?}: bfdProfile {profile:?} is no profile of \
                     loadBalancer.bgp.bfdProfiles ({})",
                    peer.name,
                    if profile_names.is_empty() {
                        "it has none".to_owned()
                    } else {
                        profile_names.iter().copied().collect::<Vec<_>>().join(", ")
                    }
                ));
            }
            peer.validate(self.load_balancer.bgp.bfd_of(peer))?;
            if !names.insert(peer.name.as_str()) {
                return Err(format!(
                    "loadBalancer.bgp.peers: two peers are named {:?}",
                    peer.name
                ));
            }
        }
        // A node's passive peers listen on one port 179: on every address, or on their own. The kernel
        // lets no socket have [::]:179 beside one on a single address (the second would never bind).
        let passive: Vec<&BgpPeer> = peers.iter().filter(|p| p.passive).collect();
        if let (Some(everywhere), Some(one)) = (
            passive.iter().find(|p| p.source_address.is_none()),
            passive.iter().find(|p| p.source_address.is_some()),
        ) {
            return Err(format!(
                "loadBalancer.bgp.peers {:?} and {:?}: both passive, one listening on every address \
                 (no sourceAddress) and one on {} (its sourceAddress): port 179 cannot be both; give \
                 every passive peer a sourceAddress, or none",
                everywhere.name,
                one.name,
                one.source_address
                    .map(|a| a.to_string())
                    .unwrap_or_default()
            ));
        }
        if !peers.is_empty() && self.load_balancer.mode != LoadBalancerMode::Agents {
            return Err(
                "loadBalancer.bgp is the agents mode's (mode: agents): the node agents \
                 speak BGP, the leading manager does not; remove bgp or set mode: agents"
                    .to_owned(),
            );
        }
        for pool in &self.address_pools {
            let name = &pool.name;
            match (pool.announce, &pool.bgp) {
                (Announce::L2, Some(_)) => {
                    return Err(format!(
                        "addressPools: pool {name:?} has a bgp block but announces by layer 2: set \
                         announce: bgp, or remove the block"
                    ));
                }
                (Announce::L2, None) => {}
                (Announce::None, Some(_)) => {
                    return Err(format!(
                        "addressPools: pool {name:?} has a bgp block but announces none: set \
                         announce: bgp, or remove the block"
                    ));
                }
                (Announce::None, None) if self.load_balancer.mode != LoadBalancerMode::Agents => {
                    return Err(format!(
                        "addressPools: pool {name:?}: announce: none needs loadBalancer.mode: \
                         agents (in leader mode the leading manager announces every VIP)"
                    ));
                }
                (Announce::None, None) => {}
                (Announce::Bgp, _) if self.load_balancer.mode != LoadBalancerMode::Agents => {
                    return Err(format!(
                        "addressPools: pool {name:?}: announce: bgp needs loadBalancer.mode: agents \
                         (the node agents speak BGP)"
                    ));
                }
                (Announce::Bgp, _) if peers.is_empty() => {
                    return Err(format!(
                        "addressPools: pool {name:?}: announce: bgp, but loadBalancer.bgp.peers is \
                         empty: nobody to announce to"
                    ));
                }
                (Announce::Bgp, bgp) => {
                    let bgp = bgp.clone().unwrap_or_default();
                    if let Some(problem) = bgp_pool_problem(pool, &bgp, peers) {
                        return Err(format!("addressPools: pool {name:?}: {problem}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// The pools in the order a Service that names none tries them ([`AddressPool::priority`]).
    pub fn pools_by_preference(&self) -> Vec<&AddressPool> {
        let mut pools: Vec<&AddressPool> = self.address_pools.iter().collect();
        // Stable: the file's order among equal priorities.
        pools.sort_by_key(|p| (p.priority.is_none(), p.priority));
        pools
    }

    /// The pool an address belongs to.
    pub fn pool_of(&self, ip: IpAddr) -> Option<&AddressPool> {
        self.address_pools
            .iter()
            .find(|p| p.addresses.iter().any(|r| r.contains(ip)))
    }
}

/// What is wrong with announcing `pool` by BGP as `bgp` says to `peers` (the routers in force), in
/// words, if anything: peers it names that are not there, a family of its addresses no peer of its
/// carries, an aggregate reaching outside it, a local preference no iBGP peer receives.
pub(crate) fn bgp_pool_problem(
    pool: &AddressPool,
    bgp: &PoolBgp,
    peers: &[BgpPeer],
) -> Option<String> {
    for peer in &bgp.peers {
        if !peers.iter().any(|p| &p.name == peer) {
            return Some(format!(
                "bgp.peers names {peer:?}, which is no peer of loadBalancer.bgp.peers ({})",
                peers
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    // A peer is told the VIPs of its own address's family: each family of the pool needs a peer of
    // that family, or its VIPs would go nowhere.
    let pool_peers: Vec<&BgpPeer> = peers
        .iter()
        .filter(|p| bgp.peers.is_empty() || bgp.peers.contains(&p.name))
        .collect();
    for (v4, family) in [(true, "IPv4"), (false, "IPv6")] {
        let has_family = pool.addresses.iter().any(|r| r.first().is_ipv4() == v4);
        if has_family && !pool_peers.iter().any(|p| p.peer_address.is_ipv4() == v4) {
            return Some(format!(
                "it has {family} addresses, but none of its BGP peers has an {family} address: a \
                 peer is told the VIPs of its own address's family (the session's address is their \
                 next hop); add an {family} peer or remove those addresses"
            ));
        }
    }
    if let Some(problem) = bgp.aggregation_problem(&pool.addresses) {
        return Some(problem);
    }
    let ibgp = pool_peers.iter().any(|p| p.peer_asn == p.my_asn);
    if bgp.local_pref.is_some() && !ibgp {
        return Some(
            "bgp.localPref goes to iBGP peers only (peerASN equal to myASN), and every peer of \
             the pool is eBGP: remove it"
                .to_owned(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_file_parses() {
        let config = Config::parse(include_str!("../cloud-config.example.yaml"), None).unwrap();
        assert_eq!(config.unlisted_nodes, UnlistedNodes::Adopt);
        assert_eq!(config.machines["node-b"].state, MachineState::Shutdown);
        assert_eq!(config.address_pools.len(), 3);
        assert!(!config.address_pools[1].auto_assign);
        assert_eq!(config.address_pools[2].namespaces, ["shop"]);
        assert_eq!(
            config.load_balancer.health_check.interval,
            GoDuration(Duration::from_secs(2))
        );
    }

    #[test]
    fn an_empty_config_adopts_every_node_and_has_a_loopback_pool() {
        for text in ["", "# nothing\n", "{}"] {
            let config = Config::parse(text, None).unwrap();
            assert_eq!(config, Config::default());
        }
        let config = Config::default();
        assert_eq!(config.unlisted_nodes, UnlistedNodes::Adopt);
        let pool = &config.address_pools[0];
        let first = pool.addresses[0].first();
        assert_eq!(first, "127.240.0.1".parse::<IpAddr>().unwrap());
        assert!(first.is_loopback());
        assert_eq!(config.load_balancer.kube_proxy_health_port, 10256);
        assert!(!config.kubelet_probe.enabled);
    }

    #[test]
    fn ranges_and_cidrs_of_both_families() {
        let r: AddressRange = "127.0.10.1 - 127.0.10.3".parse().unwrap();
        assert_eq!(r.addresses().count(), 3);
        let r: AddressRange = "10.0.0.0/30".parse().unwrap();
        assert_eq!(
            r.addresses().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["10.0.0.1", "10.0.0.2"]
        );
        let r: AddressRange = "10.0.0.7/32".parse().unwrap();
        assert_eq!(r.addresses().count(), 1);
        let r: AddressRange = "fd00::/126".parse().unwrap();
        assert_eq!(
            r.addresses().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["fd00::1", "fd00::2", "fd00::3"]
        );
        let huge: AddressRange = "fd00::/64".parse().unwrap();
        assert_eq!(
            huge.addresses().nth(1).unwrap().to_string(),
            "fd00::2",
            "lazy"
        );
        assert!(huge.contains("fd00::ffff".parse().unwrap()));
        assert!(!huge.contains("10.0.0.1".parse().unwrap()));
        for bad in [
            "10.0.0.0",
            "10.0.0.5-10.0.0.1",
            "10.0.0.1-fd00::1",
            "x-y",
            "10.0.0.0/33",
        ] {
            let err = bad.parse::<AddressRange>().unwrap_err();
            assert!(err.contains("invalid address range"), "{err}");
        }
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = Config::parse(
            "machines:\n  a:\n    state: off\n",
            Some(Path::new("/etc/local.yaml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("malformed cloud-config /etc/local.yaml:"),
            "{err}"
        );
        assert!(err.contains("line 3"), "{err}");
        let err = Config::parse(
            "addressPools:\n  - name: a\n    addresses: [127.1.0.0/33]\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 3") && err.contains("invalid address range"),
            "{err}"
        );
        let err = Config::parse("unlistedNodes: maybe\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
        let idle = Config::parse("loadBalancer:\n  tcpIdleTimeout: 5m\n", None).unwrap();
        assert_eq!(
            idle.load_balancer.tcp_idle_timeout.0,
            Duration::from_secs(300)
        );
        assert!(
            Config::default().load_balancer.tcp_idle_timeout.0.is_zero(),
            "off by default"
        );
        let err = Config::parse("loadBalancer:\n  drainTimeout: soon\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        let err = Config::parse(
            "loadBalancer:\n  healthCheck: {healthyThreshold: 0}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 2") && err.contains("at least 1"),
            "{err}"
        );
        let err = Config::parse("machine: {}\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `machine`"), "{err}");
    }

    #[test]
    fn a_pool_s_scope_is_checked_and_read() {
        let scoped = Config::parse(
            "addressPools:\n  - name: team\n    addresses: [127.1.0.0/30]\n    namespaces: [shop, web]\n    serviceSelector: {matchLabels: {tier: edge}}\n",
            None,
        )
        .unwrap();
        let pool = &scoped.address_pools[0];
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = labels(&[]);
        assert_eq!(
            pool.refuses("shop", &none, &labels(&[("tier", "edge")])),
            None
        );
        assert_eq!(
            pool.refuses("db", &none, &labels(&[("tier", "edge")]))
                .as_deref(),
            Some("pool \"team\" serves the namespaces shop, web only")
        );
        assert_eq!(
            pool.refuses("web", &none, &labels(&[("tier", "core")]))
                .as_deref(),
            Some("pool \"team\" serves Services labelled tier=edge only")
        );
        // Selectors of namespaces and of Services, MetalLB's: any one suffices.
        let selected = Config::parse(
            "addressPools:\n  - name: team\n    addresses: [127.1.0.0/30]\n    namespaces: [shop]\n    namespaceSelectors: [{matchLabels: {team: a}}]\n    serviceSelectors: [{matchLabels: {tier: edge}}, {matchExpressions: [{key: tier, operator: In, values: [core]}]}]\n",
            None,
        )
        .unwrap();
        let pool = &selected.address_pools[0];
        let core = labels(&[("tier", "core")]);
        assert_eq!(pool.refuses("shop", &none, &core), None);
        assert_eq!(pool.refuses("db", &labels(&[("team", "a")]), &core), None);
        assert_eq!(
            pool.refuses("db", &labels(&[("team", "b")]), &core)
                .as_deref(),
            Some("pool \"team\" serves the namespaces shop, namespaces labelled team=a only")
        );
        assert_eq!(
            pool.refuses("shop", &none, &labels(&[("tier", "web")]))
                .as_deref(),
            Some("pool \"team\" serves Services labelled (tier=edge) or (tier in (core)) only")
        );
        for (yaml, expected) in [
            (
                "namespaces: [Shop]",
                "pool \"team\": \"Shop\" is not a namespace's name",
            ),
            (
                "serviceSelector: {matchLabels: {-tier: edge}}",
                "line 4 column 22: matchLabels: label key \"-tier\"",
            ),
            (
                "serviceSelector: {matchExpressions: [{key: a, operator: Has}]}",
                "operator \"Has\" is not one of",
            ),
            (
                "nodeSelectors: [{matchFields: {}}]",
                "unknown field `matchFields`",
            ),
        ] {
            let err = Config::parse(
                &format!(
                    "addressPools:\n  - name: team\n    addresses: [127.1.0.0/30]\n    {yaml}\n"
                ),
                None,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(expected), "{err} lacks {expected}");
        }
    }

    const BGP_PEERS: &str = "loadBalancer:\n  mode: agents\n  bgp:\n    peers:\n      - {name: tor-a, peerAddress: 10.89.0.250, peerASN: 64512, myASN: 64513}\n      - {name: tor-b, peerAddress: 'fd00:89::250', peerASN: 64513, myASN: 64513, holdTime: 9s, nodeSelectors: [{matchLabels: {rack: b}}]}\n";

    #[test]
    fn bgp_peers_and_pools_are_read() {
        let config = Config::parse(
            &format!("{BGP_PEERS}addressPools:\n  - name: routed\n    addresses: [10.90.0.0/24]\n    announce: bgp\n    bgp: {{peers: [tor-a, tor-b], communities: ['64513:100', no-export, 'large:64513:1:2'], localPref: 200}}\n  - {{name: l2, addresses: [10.89.0.64/26]}}\n"),
            None,
        )
        .unwrap();
        let peers = &config.load_balancer.bgp.peers;
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[0].peer_port, 179);
        assert_eq!(peers[0].hold_time.0, Duration::from_secs(90));
        assert!(peers[0].selects(&BTreeMap::new()));
        assert!(!peers[1].selects(&BTreeMap::new()));
        assert!(peers[1].selects(&[("rack".to_owned(), "b".to_owned())].into()));
        let session = peers[1]
            .session(Some(Ipv4Addr::new(10, 89, 0, 11)), None)
            .unwrap();
        assert_eq!(
            (session.hold_time, session.router_id),
            (9, Ipv4Addr::new(10, 89, 0, 11))
        );
        assert_eq!(config.address_pools[0].announce, Announce::Bgp);
        assert_eq!(config.address_pools[1].announce, Announce::L2);
        let path = config.address_pools[0].bgp.as_ref().unwrap().path();
        assert_eq!(path.communities, vec![(64513 << 16) | 100, 0xFFFF_FF01]);
        assert_eq!(path.large_communities, vec![[64513, 1, 2]]);
        assert_eq!(path.local_preference, Some(200));
        assert!(
            peers[1]
                .session(None, None)
                .unwrap_err()
                .contains("set routerID")
        );
    }

    #[test]
    fn a_range_spans_the_block_its_cidr_was() {
        for (text, first, last) in [
            ("10.90.0.0/24", "10.90.0.0", "10.90.0.255"),
            ("10.90.0.0/30", "10.90.0.0", "10.90.0.3"),
            ("10.90.0.10-10.90.0.20", "10.90.0.10", "10.90.0.20"),
            ("10.0.0.5/32", "10.0.0.5", "10.0.0.5"),
            ("fd00:90::/120", "fd00:90::", "fd00:90::ff"),
        ] {
            let range: AddressRange = text.parse().unwrap();
            assert_eq!(
                range.span(),
                (first.parse().unwrap(), last.parse().unwrap()),
                "{text}"
            );
        }
    }

    #[test]
    fn bfd_profiles_are_read_as_metallb_writes_them() {
        let config = Config::parse(
            "loadBalancer:\n  mode: agents\n  bgp:\n    bfdProfiles:\n      - {name: fast, receiveInterval: 100, transmitInterval: 150, detectMultiplier: 5, passiveMode: true, echoMode: false}\n      - {name: defaults}\n    peers:\n      - {name: tor-a, peerAddress: 10.89.0.250, peerASN: 64512, myASN: 64513, bfdProfile: fast}\n      - {name: tor-b, peerAddress: 10.89.0.251, peerASN: 64512, myASN: 64513, bfdProfile: defaults}\n      - {name: tor-c, peerAddress: 10.89.0.252, peerASN: 64512, myASN: 64513}\n",
            None,
        )
        .unwrap();
        let bgp = &config.load_balancer.bgp;
        let fast = bgp.bfd_of(&bgp.peers[0]).unwrap();
        assert_eq!(
            fast,
            local_bgp::BfdProfile {
                receive_interval: Duration::from_millis(100),
                transmit_interval: Duration::from_millis(150),
                detect_multiplier: 5,
                passive: true,
            }
        );
        assert_eq!(
            bgp.bfd_of(&bgp.peers[1]),
            Some(local_bgp::BfdProfile::default())
        );
        assert_eq!(bgp.bfd_of(&bgp.peers[2]), None);
        let session = bgp.peers[0]
            .session(Some(Ipv4Addr::new(10, 89, 0, 11)), Some(fast))
            .unwrap();
        assert_eq!(session.bfd, Some(fast));
    }

    #[test]
    fn bad_bgp_settings_are_named() {
        let pool = |extra: &str| {
            format!("addressPools:\n  - name: routed\n    addresses: [10.90.0.0/24]\n{extra}")
        };
        for (text, expected) in [
            (format!("{BGP_PEERS}{}", pool("    bgp: {peers: [tor-a]}\n")), "pool \"routed\" has a bgp block but announces by layer 2"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {peers: [tor-c]}\n")), "bgp.peers names \"tor-c\", which is no peer of loadBalancer.bgp.peers (tor-a, tor-b)"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {peers: [tor-a], localPref: 10}\n")), "bgp.localPref goes to iBGP peers only"),
            (format!("{BGP_PEERS}addressPools:\n  - {{name: six, addresses: ['fd00:90::/120'], announce: bgp, bgp: {{peers: [tor-a]}}}}\n"), "pool \"six\": it has IPv6 addresses, but none of its BGP peers has an IPv6 address"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {communities: ['64513:x']}\n")), "community \"64513:x\": not two 16-bit numbers"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {aggregationLength: 20}\n")), "pool \"routed\": bgp.aggregationLength 20: 10.90.0.0/20 reaches outside the pool's addresses 10.90.0.0-10.90.0.255"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {aggregationLength: 33}\n")), "bgp.aggregationLength 33: at most 32"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {aggregationPrefix: 24}\n")), "unknown field `aggregationPrefix`"),
            (format!("loadBalancer: {{mode: agents}}\n{}", pool("    announce: bgp\n")), "announce: bgp, but loadBalancer.bgp.peers is empty"),
            (pool("    announce: bgp\n"), "announce: bgp needs loadBalancer.mode: agents"),
            (pool("    announce: ospf\n"), "unknown variant `ospf`"),
            ("loadBalancer: {bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}]}}".to_owned(), "loadBalancer.bgp is the agents mode's"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}, {name: a, peerAddress: 10.0.0.2, peerASN: 1, myASN: 2}]}}".to_owned(), "two peers are named \"a\""),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 0, myASN: 2}]}}".to_owned(), "peers \"a\": BGP peer 10.0.0.1:179: peer ASN 0 is reserved"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, holdTime: 2s}]}}".to_owned(), "hold time 2 s"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 1, ebgpMultiHop: true}]}}".to_owned(), "ebgpMultiHop is for eBGP"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passwordSecret: {name: x}}]}}".to_owned(), "mount the Secret into the agents' pods and name the file with passwordFile"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, password: x, passwordFile: /y}]}}".to_owned(), "password and passwordFile both set"),
            (format!("loadBalancer: {{mode: agents, bgp: {{peers: [{{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, password: {}}}]}}}}", "x".repeat(81)), "a TCP MD5 password of 81 bytes"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, nodeSelectors: [{matchLabels: {-x: y}}]}]}}".to_owned(), "matchLabels: label key \"-x\""),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, bfdProfile: fast}]}}".to_owned(), "peers \"a\": bfdProfile \"fast\" is no profile of loadBalancer.bgp.bfdProfiles (it has none)"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast}], peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, ebgpMultiHop: true, bfdProfile: fast}]}}".to_owned(), "multihop BFD (RFC 5883) is not implemented"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast}, {name: fast}]}}".to_owned(), "two profiles are named \"fast\""),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, detectMultiplier: 1}]}}".to_owned(), "bfdProfiles \"fast\": detectMultiplier 1: from 2 to 255"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, receiveInterval: 5}]}}".to_owned(), "bfdProfiles \"fast\": receiveInterval 5: milliseconds, from 10 to 60000"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, echoMode: true}]}}".to_owned(), "echoMode: echo mode is not implemented"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, echoInterval: 50}]}}".to_owned(), "echoInterval: echo mode is not implemented"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, minimumTtl: 254}]}}".to_owned(), "minimumTtl is for multihop BFD"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, echo: true}]}}".to_owned(), "unknown field `echo`"),
        ] {
            let err = Config::parse(&text, None).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}\n  lacks {expected}");
        }
    }

    #[test]
    fn ip_command_is_refused_with_what_to_do() {
        for text in [
            "loadBalancer:\n  vipInterface: eth0\n  ipCommand: ip\n",
            "loadBalancer: {ipCommand: /sbin/ip}\n",
        ] {
            let err = Config::parse(text, Some(Path::new("/etc/local.yaml")))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("malformed cloud-config /etc/local.yaml:")
                    && err.contains(IP_COMMAND_REMOVED),
                "{err}"
            );
            assert!(!err.contains("unknown field"), "{err}");
        }
        let err = Config::parse(
            "loadBalancer:\n  vipInterface: eth0\n  ipCommand: ip\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 3"), "{err}");
        let err = Config::parse("loadBalancer: {vipInterface: ' '}\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("loadBalancer.vipInterface cannot be empty"),
            "{err}"
        );
        let config = Config::parse("loadBalancer: {vipInterface: eth0}\n", None).unwrap();
        assert_eq!(config.load_balancer.vip_interface.as_deref(), Some("eth0"));
    }

    #[test]
    fn pools_must_not_overlap_nor_share_a_name() {
        let err = Config::parse(
            "addressPools:\n  - {name: a, addresses: [127.1.0.0/24]}\n  - {name: b, addresses: [127.1.0.9-127.1.1.3]}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("overlaps"), "{err}");
        let err = Config::parse(
            "addressPools:\n  - {name: a, addresses: [127.1.0.0/24]}\n  - {name: a, addresses: [127.2.0.0/24]}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("two pools are named \"a\""), "{err}");
        let err = Config::parse(
            "machines:\n  a: {addresses: [{type: InternalIP, address: nope}]}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("machines.a.addresses"), "{err}");
    }

    #[test]
    fn no_input_makes_the_parser_panic() {
        let deep = format!("machines: {}{}\n", "[".repeat(50_000), "]".repeat(50_000));
        for text in [
            deep.as_str(),
            "addressPools: [{name: x, addresses: ['255.255.255.255/0']}]",
            "addressPools: [{name: x, addresses: ['::/0']}]",
            "addressPools: [{name: x, addresses: ['0.0.0.0/0']}]",
            "loadBalancer: {drainTimeout: 18446744073709551616s}",
            "kubeletProbe: {port: 70000}",
            "*x",
        ] {
            let _ = Config::parse(text, None);
        }
        let all: AddressRange = "::/0".parse().unwrap();
        assert_eq!(all.addresses().next().unwrap().to_string(), "::1");
    }
}
