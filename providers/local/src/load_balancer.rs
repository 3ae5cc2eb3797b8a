//! Load balancers of the `local` cloud: VIPs from the address pools, traffic through the in-process
//! data plane.
//!
//! **Addresses.** Each Service gets one VIP per IP family it asks for (`spec.ipFamilies` in order;
//! with `ipFamilyPolicy: PreferDualStack` the second family is given only when a pool of it has a free
//! address). `spec.loadBalancerIP` or the [`ANNOTATION_LOAD_BALANCER_IPS`] annotation asks for specific
//! addresses, which must lie in a pool; [`ANNOTATION_ADDRESS_POOL`] picks the pool. The allocation is
//! recorded on the Service itself, in the `status.loadBalancer.ingress` the service controller writes:
//! at start ([`CloudProvider::initialize`](cloud_provider::CloudProvider::initialize)) every address a
//! Service's status carries is reserved for it, and a Service keeps the addresses its status shows
//! when they are still free, so a restart re-assigns nothing.
//!
//! **Errors** (a malformed annotation, an exhausted pool, a requested address another Service holds, a
//! port that cannot be bound) are returned from `ensure_load_balancer`, which the service controller
//! turns into a `SyncLoadBalancerFailed` Warning event on that Service; no other Service is touched. A
//! VIP put on `vipInterface` but not announced to the link's neighbours (no `CAP_NET_RAW`) is no error:
//! the load balancer serves, and the provider records a Warning event
//! [`EVENT_VIP_NOT_ANNOUNCED`](crate::EVENT_VIP_NOT_ANNOUNCED) on the Service itself.
//!
//! **Idempotence.** An ensure that finds the data plane already running the same load balancer makes no
//! data-plane call.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use cloud_provider::{
    CloudResult, ClusterLoadBalancer, LoadBalancer, LoadBalancerPreview, ServiceRef, async_trait,
    service_helpers::{
        IpFamily, IpMode, health_check_path_port, ingress_for_ip, ip_families, is_allow_all,
        load_balancer_source_ranges, port_groups, requests_only_local_traffic,
    },
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::{Api, api::ListParams};
use local_data_plane::{Backend, HealthCheck, ListenerSpec, LoadBalancerSpec, Protocol};
use tracing::Instrument;

use crate::{Config, Error, LoadBalancerMode, LocalCloud, config::AddressPool, instances::lock};

/// Requests specific VIPs: a comma-separated list with at most one address per IP family, each in an
/// address pool (`spec.loadBalancerIP` is read when the annotation is absent).
pub const ANNOTATION_LOAD_BALANCER_IPS: &str = "local.ccm.rs/load-balancer-ips";

/// Takes the VIPs from the named address pool (also one with `autoAssign: false`).
pub const ANNOTATION_ADDRESS_POOL: &str = "local.ccm.rs/address-pool";

/// `v2`: the data plane sends a PROXY protocol v2 header to the backends before the client's bytes
/// (TCP ports).
pub const ANNOTATION_PROXY_PROTOCOL: &str = "local.ccm.rs/proxy-protocol";

/// Who carries a Service's traffic from the announcing node: `proxy` (the default), the `local` data
/// plane, which terminates the client's connection and opens its own to a node (health checks,
/// source ranges, PROXY protocol, metrics; `ipMode: Proxy`); or `kube-proxy`, which needs
/// `loadBalancer.mode: agents`: the announcing node's agent only puts the VIP on its interface and
/// announces it, and kube-proxy carries the traffic to the endpoints (`ipMode: VIP`; with
/// `externalTrafficPolicy: Local` the pods see the client's own address).
pub const ANNOTATION_DATA_PATH: &str = "local.ccm.rs/data-path";

/// Who carries a Service's traffic ([`ANNOTATION_DATA_PATH`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum DataPath {
    /// The `local` data plane (of the leader, or of the announcing node's agent).
    #[default]
    Proxy,
    /// kube-proxy, on the node that announces the VIP.
    KubeProxy,
}

impl DataPath {
    /// The `ipMode` the Service's status reports: `Proxy` tells kube-proxy to leave the VIP alone (the
    /// data plane terminates the connection; see `Record::status`), `VIP` that kube-proxy carries it.
    fn ip_mode(self) -> IpMode {
        match self {
            DataPath::Proxy => IpMode::Proxy,
            DataPath::KubeProxy => IpMode::Vip,
        }
    }
}

/// Lets Services share a VIP (MetalLB's `allow-shared-ip`): Services with the same value, ports that
/// differ (port and protocol) and the same `externalTrafficPolicy` (for `Local`, the same selector, so
/// one node has the endpoints of all) get the same address; one asked for by address is shared too.
pub const ANNOTATION_ALLOW_SHARED_IP: &str = "local.ccm.rs/allow-shared-ip";

/// How a Service may share its VIPs ([`ANNOTATION_ALLOW_SHARED_IP`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sharing {
    /// The Service's namespace: a sharing key spans one namespace only, unless the address's pool
    /// says `crossNamespaceSharing: true`.
    namespace: String,
    /// The annotation's value.
    key: String,
    /// The Service's (port, protocol) pairs: two sharing Services must have none in common.
    ports: BTreeSet<(u16, Protocol)>,
    /// With `externalTrafficPolicy: Local`, the Service's selector (sharers must select alike).
    local_selector: Option<BTreeMap<String, String>>,
}

/// How a refusal names `holder` (`namespace/name`) to a Service of `namespace`: by name in its own
/// namespace, never in another (a tenant learns nothing of another namespace's Services).
fn holder_text(namespace: &str, holder: &str) -> String {
    if holder.split('/').next() == Some(namespace) {
        format!("Service {holder}")
    } else {
        "a Service of another namespace".to_owned()
    }
}

impl Sharing {
    /// Why a Service of `self` may not share an address with one of `other` (`other_name`), if it may
    /// not. `cross_namespace`: the address's pool lets Services of different namespaces share.
    fn conflict(
        &self,
        other: Option<&Sharing>,
        other_name: &str,
        cross_namespace: bool,
    ) -> Option<String> {
        let other_name = &holder_text(&self.namespace, other_name);
        let Some(other) = other else {
            return Some(format!(
                "{other_name} holds it and allows no sharing ({ANNOTATION_ALLOW_SHARED_IP})"
            ));
        };
        if other.namespace != self.namespace && !cross_namespace {
            return Some(format!(
                "{other_name} holds it, and its pool shares addresses within one namespace only \
                 (crossNamespaceSharing)"
            ));
        }
        if other.key != self.key {
            // Their key is never shown: it is what lets a Service in.
            return Some(format!(
                "{other_name} holds it with another {ANNOTATION_ALLOW_SHARED_IP} key"
            ));
        }
        if let Some((port, protocol)) = self.ports.intersection(&other.ports).next() {
            return Some(format!(
                "{other_name} shares it and uses port {port}/{protocol} too"
            ));
        }
        if self.local_selector != other.local_selector {
            return Some(format!(
                "{other_name} shares it with another externalTrafficPolicy or, for Local, another \
                 selector (the node that announces it must have the endpoints of both)"
            ));
        }
        None
    }
}

/// The finalizer of the service controller: a Service that carries it may still own a load balancer.
const CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// How often `initialize` tries to list the Services.
const LIST_ATTEMPTS: u32 = 5;

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
const DEFAULT_AFFINITY_SECONDS: i32 = 10_800;

/// Who holds which VIP.
#[derive(Debug, Default)]
pub(crate) struct Allocations {
    /// By `namespace/name`.
    services: BTreeMap<String, Record>,
    /// VIP → the Services (`namespace/name`) that hold it: one, or several that share it.
    owners: BTreeMap<IpAddr, BTreeSet<String>>,
}

/// One Service's load balancer.
#[derive(Debug, Clone)]
struct Record {
    uid: Option<String>,
    /// The VIPs, primary family first.
    ips: Vec<IpAddr>,
    /// What the data plane runs for it; `None` for a Service whose addresses were only reserved (at
    /// start) or whose load balancer the data plane could not run yet, and with `mode: agents`.
    applied: Option<LoadBalancerSpec>,
    /// Who carries its traffic, which decides the status's `ipMode`.
    data_path: DataPath,
    /// How it may share its VIPs; `None`: it may not.
    sharing: Option<Sharing>,
    /// Kept for a later Service of its namespace and name after its own went
    /// (`ccm.rs/load-balancer-retain`; [`crate::retained`]): reserved, not served, and adopted by the
    /// next Service of that key.
    retained: bool,
}

impl Record {
    /// A VIP the data plane serves is reported with `ipMode: Proxy`: the data plane terminates the client's connection on
    /// the VIP and opens its own to a node's `InternalIP:NodePort`, which is what `Proxy` tells
    /// kube-proxy. With `VIP`, kube-proxy would install the VIP on every node it runs on and DNAT
    /// traffic to it straight to the endpoints: the data plane (health checks, source ranges, PROXY
    /// protocol, metrics) would be bypassed for in-cluster clients and clients on a node, and a 127.x
    /// VIP would stop working altogether (a connection from 127.0.0.1 DNAT'ed to a pod is dropped:
    /// the kernel does not route a loopback source off `lo`), as a real kubelet and kube-proxy showed.
    /// A VIP kube-proxy carries (`local.ccm.rs/data-path: kube-proxy`, node agents only) is reported
    /// with `ipMode: VIP`, for exactly that.
    fn status(&self) -> LoadBalancerStatus {
        let mode = self.data_path.ip_mode();
        LoadBalancerStatus {
            ingress: Some(
                self.ips
                    .iter()
                    .map(|ip| ingress_for_ip(*ip, mode))
                    .collect(),
            ),
        }
    }

    fn same_service(&self, uid: Option<&str>) -> bool {
        match (self.uid.as_deref(), uid) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

/// What a Service asks of its load balancer, read and checked before anything changes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Wanted {
    /// IP families in order, each with whether it must be served.
    families: Vec<(IpFamily, bool)>,
    /// Addresses asked for, by family.
    requested: BTreeMap<IpFamily, IpAddr>,
    pool: Option<String>,
    /// The Service's namespace and labels, which a pool may be limited to.
    namespace: String,
    /// The labels of the Service's namespace, read only when a pool selects namespaces by label
    /// ([`LocalCloud::namespace_labels`]); else none.
    namespace_labels: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    /// (port, protocol, node port), sorted.
    ports: Vec<(u16, Protocol, u16)>,
    health_check: Option<HealthCheck>,
    session_affinity: Option<Duration>,
    source_ranges: Vec<ipnet::IpNet>,
    proxy_protocol: bool,
    pub(crate) data_path: DataPath,
    sharing: Option<Sharing>,
}

pub(crate) fn key_of(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|v| v.trim())
}

/// MetalLB's spellings of [`ANNOTATION_LOAD_BALANCER_IPS`], [`ANNOTATION_ADDRESS_POOL`] and
/// [`ANNOTATION_ALLOW_SHARED_IP`], read as ours (its older `metallb.universe.tf/` prefix too), so that a
/// Service MetalLB served keeps its addresses and pool.
pub const METALLB_ANNOTATIONS: [(&str, [&str; 2]); 3] = [
    (
        ANNOTATION_LOAD_BALANCER_IPS,
        [
            "metallb.io/loadBalancerIPs",
            "metallb.universe.tf/loadBalancerIPs",
        ],
    ),
    (
        ANNOTATION_ADDRESS_POOL,
        [
            "metallb.io/address-pool",
            "metallb.universe.tf/address-pool",
        ],
    ),
    (
        ANNOTATION_ALLOW_SHARED_IP,
        [
            "metallb.io/allow-shared-ip",
            "metallb.universe.tf/allow-shared-ip",
        ],
    ),
];

/// MetalLB's annotation that says which pool it took a Service's address from: MetalLB's own
/// output, not a request, so neither read nor refused.
const METALLB_OUTPUT_ANNOTATION: &str = "ip-allocated-from-pool";

/// The reason of the Normal event on a Service taken over from MetalLB at the manager's start: it
/// keeps its addresses.
pub const EVENT_TAKEN_OVER: &str = "TakenOverFromMetalLB";

/// The value of `ours` or of one of MetalLB's spellings of it (with the key it was found under); two
/// spellings with different values are refused, naming both. A MetalLB annotation that is no
/// spelling of ours is refused by name.
fn annotation_or_metallb<'a>(
    service: &'a Service,
    ours: &'static str,
) -> Result<Option<(&'a str, &'a str)>, String> {
    let Some(annotations) = service.metadata.annotations.as_ref() else {
        return Ok(None);
    };
    let spellings = METALLB_ANNOTATIONS
        .iter()
        .find(|(key, _)| *key == ours)
        .map(|(_, theirs)| theirs.as_slice())
        .unwrap_or_default();
    let mut found: Option<(&str, &str)> = None;
    for key in std::iter::once(&ours).chain(spellings) {
        let Some((key, value)) = annotations.get_key_value(*key) else {
            continue;
        };
        let value = value.trim();
        match found {
            Some((first, seen)) if seen != value => {
                return Err(format!(
                    "{first} says {seen:?} and {key} says {value:?}: keep one (they are the same \
                     setting)"
                ));
            }
            Some(_) => {}
            None => found = Some((key.as_str(), value)),
        }
    }
    Ok(found)
}

/// A MetalLB annotation on the Service that `local` does not read (no spelling of one of ours), if
/// any: refused by name rather than ignored.
fn unread_metallb_annotation(service: &Service) -> Option<&str> {
    let annotations = service.metadata.annotations.as_ref()?;
    annotations.keys().map(String::as_str).find(|key| {
        let metallb = key.starts_with("metallb.io/") || key.starts_with("metallb.universe.tf/");
        metallb
            && !key.ends_with(METALLB_OUTPUT_ANNOTATION)
            && !METALLB_ANNOTATIONS
                .iter()
                .any(|(_, theirs)| theirs.contains(key))
    })
}

/// Reads everything the load balancer needs from the Service; `Err` says what is wrong, naming the
/// field or annotation.
pub(crate) fn read_service(service: &Service, config: &Config) -> Result<Wanted, String> {
    let spec = service.spec.clone().unwrap_or_default();
    let mut families = ip_families(service).map_err(|e| e.to_string())?;
    if families.is_empty() {
        families.push(IpFamily::V4);
    }
    let policy = spec.ip_family_policy.as_deref().unwrap_or("SingleStack");
    if policy == "SingleStack" {
        families.truncate(1);
    }
    let families: Vec<(IpFamily, bool)> = families
        .iter()
        .enumerate()
        .map(|(i, f)| (*f, i == 0 || policy == "RequireDualStack"))
        .collect();

    if let Some(key) = unread_metallb_annotation(service) {
        return Err(format!(
            "{key}: a MetalLB annotation local does not read (it reads {}); remove it",
            METALLB_ANNOTATIONS
                .iter()
                .flat_map(|(_, theirs)| theirs.iter().take(1))
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let (source, requested_text) =
        match annotation_or_metallb(service, ANNOTATION_LOAD_BALANCER_IPS)? {
            Some((key, value)) => (key, value.to_owned()),
            None => (
                "spec.loadBalancerIP",
                spec.load_balancer_ip.clone().unwrap_or_default(),
            ),
        };
    let mut requested = BTreeMap::new();
    for entry in requested_text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let ip: IpAddr = entry.parse().map_err(|_| {
            format!("{source}: {entry:?} is not an IP address (expected e.g. 127.240.0.9 or 127.240.0.9,fd00:240::9)")
        })?;
        let family = IpFamily::of(ip);
        if requested.insert(family, ip).is_some() {
            return Err(format!(
                "{source}: {requested_text:?} asks for two {} addresses; give at most one per IP family",
                family.as_str()
            ));
        }
        if !families.iter().any(|(f, _)| *f == family) {
            return Err(format!(
                "{source}: {ip} is an {} address but the Service's IP families are [{}]",
                family.as_str(),
                families
                    .iter()
                    .map(|(f, _)| f.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }

    let pool = annotation_or_metallb(service, ANNOTATION_ADDRESS_POOL)?
        .map(|(_, value)| value)
        .filter(|p| !p.is_empty())
        .map(str::to_owned);
    if let Some(name) = &pool
        && !config.address_pools.iter().any(|p| &p.name == name)
    {
        return Err(format!(
            "{ANNOTATION_ADDRESS_POOL}: there is no address pool {name:?} (pools: {})",
            config
                .address_pools
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }

    let mut ports = Vec::new();
    for group in port_groups(service) {
        let port = u16::try_from(group.port)
            .map_err(|_| format!("spec.ports: port {} is out of range", group.port))?;
        for (protocol, node_port) in &group.protocols {
            let proto = match protocol.as_str() {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                other => {
                    return Err(format!(
                        "spec.ports: port {port}/{other}: the local load balancer carries TCP and UDP only"
                    ));
                }
            };
            let node_port = u16::try_from(*node_port)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| {
                    format!(
                        "spec.ports: port {port}/{protocol} has no node port (the local load balancer \
                         forwards to node ports; is allocateLoadBalancerNodePorts false?)"
                    )
                })?;
            ports.push((port, proto, node_port));
        }
    }
    ports.sort();

    let health_check = if requests_only_local_traffic(service) {
        let (path, port) = health_check_path_port(service).ok_or_else(|| {
            "externalTrafficPolicy: Local, but spec.healthCheckNodePort is not set".to_owned()
        })?;
        let port = u16::try_from(port)
            .map_err(|_| format!("spec.healthCheckNodePort {port} is out of range"))?;
        Some(HealthCheck {
            port,
            path: path.to_owned(),
        })
    } else {
        match config.load_balancer.kube_proxy_health_port {
            0 => None,
            port => Some(HealthCheck {
                port,
                path: "/healthz".to_owned(),
            }),
        }
    };

    let session_affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        let seconds = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(DEFAULT_AFFINITY_SECONDS);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    });

    let ranges = load_balancer_source_ranges(service).map_err(|e| e.to_string())?;
    let source_ranges = if is_allow_all(&ranges) {
        Vec::new()
    } else {
        ranges
    };

    let proxy_protocol = match annotation(service, ANNOTATION_PROXY_PROTOCOL) {
        None => false,
        Some("v2") => true,
        Some(other) => {
            return Err(format!(
                "{ANNOTATION_PROXY_PROTOCOL}: {other:?} is not valid; the only value is \"v2\" \
                 (remove the annotation to send no PROXY header)"
            ));
        }
    };

    let data_path = match annotation(service, ANNOTATION_DATA_PATH) {
        // MetalLB's pools: kube-proxy carries the traffic, as under MetalLB (unless PROXY protocol is
        // asked for, which only the data plane sends).
        None if config.metallb_pools && !proxy_protocol => DataPath::KubeProxy,
        None | Some("proxy") => DataPath::Proxy,
        Some("kube-proxy") => DataPath::KubeProxy,
        Some(other) => {
            return Err(format!(
                "{ANNOTATION_DATA_PATH}: {other:?} is not valid; it is \"proxy\" (the default: the \
                 local data plane) or \"kube-proxy\""
            ));
        }
    };
    if data_path == DataPath::KubeProxy {
        if config.load_balancer.mode != LoadBalancerMode::Agents {
            return Err(format!(
                "{ANNOTATION_DATA_PATH}: kube-proxy needs loadBalancer.mode: agents in the \
                 cloud-config (with mode: leader the manager's data plane carries every VIP); remove \
                 the annotation or run the node agents"
            ));
        }
        if proxy_protocol {
            return Err(format!(
                "{ANNOTATION_PROXY_PROTOCOL}: kube-proxy sends no PROXY header; it needs \
                 {ANNOTATION_DATA_PATH}: proxy (the default)"
            ));
        }
    }

    let sharing = match annotation_or_metallb(service, ANNOTATION_ALLOW_SHARED_IP)? {
        None => None,
        Some((_, key)) => {
            if key.is_empty() {
                return Err(format!(
                    "{ANNOTATION_ALLOW_SHARED_IP}: the sharing key is empty (Services with the same \
                     key share their addresses; remove the annotation to share none)"
                ));
            }
            let local = spec.external_traffic_policy.as_deref() == Some("Local");
            Some(Sharing {
                namespace: service
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".to_owned()),
                key: key.to_owned(),
                ports: ports
                    .iter()
                    .map(|(port, protocol, _)| (*port, *protocol))
                    .collect(),
                local_selector: local.then(|| spec.selector.clone().unwrap_or_default()),
            })
        }
    };

    Ok(Wanted {
        families,
        requested,
        pool,
        namespace: service
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        namespace_labels: BTreeMap::new(),
        labels: service.metadata.labels.clone().unwrap_or_default(),
        ports,
        health_check,
        session_affinity,
        source_ranges,
        proxy_protocol,
        data_path,
        sharing,
    })
}

/// `, labels a=b,c=d` (`, no labels` without), for messages about a pool's scope.
fn labels_text(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return ", no labels".to_owned();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(", labels {}", pairs.join(","))
}

/// The IPs a Service's status carries.
pub(crate) fn published_ips(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

impl Allocations {
    /// The VIPs of `key` for `wanted`: the addresses it holds, else those its status carries, else
    /// free ones from the pools. Changes nothing unless every required family gets an address.
    fn allocate(
        &mut self,
        config: &Config,
        key: &str,
        uid: Option<&str>,
        wanted: &Wanted,
        published: &[IpAddr],
    ) -> Result<Vec<IpAddr>, String> {
        // A record of an earlier Service of the same name (deleted and re-created) is released.
        if self.services.get(key).is_some_and(|r| !r.same_service(uid)) {
            self.release(key);
        }
        let current: Vec<IpAddr> = self
            .services
            .get(key)
            .map(|r| r.ips.clone())
            .unwrap_or_default();
        let free_for_us = |ip: &IpAddr| self.sharing_refused(config, ip, key, wanted).is_none();
        let refusal = |pool: &AddressPool| {
            pool.refuses(&wanted.namespace, &wanted.namespace_labels, &wanted.labels)
        };
        if let Some(name) = &wanted.pool
            && let Some(why) = config
                .address_pools
                .iter()
                .find(|p| &p.name == name)
                .and_then(refusal)
        {
            return Err(format!(
                "{ANNOTATION_ADDRESS_POOL}: {why}, and this Service is in namespace {:?}{}",
                wanted.namespace,
                labels_text(&wanted.labels)
            ));
        }
        let pool_ok = |ip: &IpAddr| match (config.pool_of(*ip), &wanted.pool) {
            (Some(pool), _) if !pool.gives_out(*ip) => false,
            (Some(pool), Some(name)) => &pool.name == name && refusal(pool).is_none(),
            (Some(pool), None) => refusal(pool).is_none(),
            (None, _) => false,
        };
        // A dual-stack Service new to addresses takes both from one pool when a pool can give both
        // (MetalLB's rule), else each from the most preferred pool of its family.
        let one_pool = (wanted.families.len() == 2
            && wanted.requested.is_empty()
            && current.is_empty()
            && published.is_empty())
        .then(|| self.pool_for_both(config, wanted))
        .flatten();
        let mut ips = Vec::new();
        for (family, required) in &wanted.families {
            let of_family = |ip: &&IpAddr| IpFamily::of(**ip) == *family;
            let chosen = if let Some(ip) = wanted.requested.get(family) {
                let Some(pool) = config.pool_of(*ip) else {
                    return Err(format!(
                        "the requested address {ip} is in no address pool ({})",
                        pool_list(config)
                    ));
                };
                if let Some(name) = &wanted.pool
                    && &pool.name != name
                {
                    return Err(format!(
                        "the requested address {ip} is in pool {:?}, not in {name:?} ({ANNOTATION_ADDRESS_POOL})",
                        pool.name
                    ));
                }
                if let Some(why) = refusal(pool) {
                    return Err(format!(
                        "the requested address {ip} is in pool {:?}, which this Service may not use: {why}",
                        pool.name
                    ));
                }
                if !pool.gives_out(*ip) {
                    return Err(format!(
                        "the requested address {ip} is in pool {:?}, which gives out no IPv4 \
                         address ending in .0 or .255 (avoidBuggyIPs)",
                        pool.name
                    ));
                }
                if let Some(why) = self.sharing_refused(config, ip, key, wanted) {
                    return Err(format!("the requested address {ip} is taken: {why}"));
                }
                Some(*ip)
            } else if let Some(ip) = current.iter().filter(of_family).find(|ip| pool_ok(ip)) {
                Some(*ip)
            } else if let Some(ip) = published
                .iter()
                .filter(of_family)
                .find(|ip| pool_ok(ip) && free_for_us(ip))
            {
                Some(*ip)
            } else {
                self.first_free(config, *family, wanted, one_pool.as_deref())
            };
            match chosen {
                Some(ip) => ips.push(ip),
                None if *required => {
                    let candidates: Vec<&AddressPool> = config
                        .address_pools
                        .iter()
                        .filter(|p| wanted.pool.as_ref().is_none_or(|n| &p.name == n))
                        .filter(|p| wanted.pool.is_some() || p.auto_assign)
                        .filter(|p| {
                            p.addresses
                                .iter()
                                .any(|r| IpFamily::of(r.first()) == *family)
                        })
                        .collect();
                    let pools: Vec<&str> = candidates
                        .iter()
                        .filter(|p| refusal(p).is_none())
                        .map(|p| p.name.as_str())
                        .collect();
                    if pools.is_empty() && !candidates.is_empty() {
                        let reasons: Vec<String> =
                            candidates.iter().filter_map(|p| refusal(p)).collect();
                        return Err(format!(
                            "no address pool with {} addresses serves this Service (namespace {:?}{}): {}",
                            family.as_str(),
                            wanted.namespace,
                            labels_text(&wanted.labels),
                            reasons.join("; ")
                        ));
                    }
                    return Err(if pools.is_empty() {
                        format!(
                            "no address pool has {} addresses{}",
                            family.as_str(),
                            wanted
                                .pool
                                .as_ref()
                                .map(|n| format!(
                                    " (pool {n:?} asked by {ANNOTATION_ADDRESS_POOL})"
                                ))
                                .unwrap_or_default()
                        )
                    } else {
                        format!(
                            "no free {} address: pool(s) {} are exhausted",
                            family.as_str(),
                            pools.join(", ")
                        )
                    });
                }
                None => {
                    tracing::info!(
                        service = key,
                        family = family.as_str(),
                        "no free address of the second IP family (PreferDualStack): serving one family"
                    );
                }
            }
        }
        for ip in &current {
            if !ips.contains(ip) {
                self.disown(*ip, key);
            }
        }
        for ip in &ips {
            self.owners.entry(*ip).or_default().insert(key.to_owned());
        }
        let record = self
            .services
            .entry(key.to_owned())
            .or_insert_with(|| Record {
                uid: uid.map(str::to_owned),
                ips: Vec::new(),
                applied: None,
                data_path: wanted.data_path,
                sharing: None,
                retained: false,
            });
        record.retained = false;
        record.ips = ips.clone();
        record.data_path = wanted.data_path;
        record.sharing = wanted.sharing.clone();
        record.uid = uid.map(str::to_owned).or(record.uid.take());
        Ok(ips)
    }

    /// The address of `family` for `wanted` from the pool it names, else from the auto-assign pools by
    /// preference (priority, then the file's order; only pools that serve the Service's namespace and
    /// labels): for a Service that allows sharing, the first address a compatible Service holds
    /// (sharers meet on one address, as MetalLB's do), else the lowest free one.
    /// `only`: from that pool alone.
    fn first_free(
        &self,
        config: &Config,
        family: IpFamily,
        wanted: &Wanted,
        only: Option<&str>,
    ) -> Option<IpAddr> {
        let pools: Vec<&AddressPool> = config
            .pools_by_preference()
            .into_iter()
            .filter(|p| match &wanted.pool {
                Some(name) => &p.name == name,
                None => p.auto_assign,
            })
            .filter(|p| only.is_none_or(|name| p.name == name))
            .filter(|p| {
                p.refuses(&wanted.namespace, &wanted.namespace_labels, &wanted.labels)
                    .is_none()
            })
            .collect();
        if let Some(sharing) = &wanted.sharing {
            let compatible = |pool: &AddressPool, holders: &BTreeSet<String>| {
                holders.iter().all(|holder| {
                    let theirs = self.services.get(holder).and_then(|r| r.sharing.as_ref());
                    sharing
                        .conflict(theirs, holder, pool.cross_namespace_sharing)
                        .is_none()
                })
            };
            let shared = pools.iter().find_map(|pool| {
                self.owners.iter().find_map(|(ip, holders)| {
                    (IpFamily::of(*ip) == family
                        && pool.addresses.iter().any(|r| r.contains(*ip))
                        && compatible(pool, holders))
                    .then_some(*ip)
                })
            });
            if shared.is_some() {
                return shared;
            }
        }
        pools
            .iter()
            .flat_map(|p| p.addresses.iter().map(move |r| (*p, r)))
            .filter(|(_, r)| IpFamily::of(r.first()) == family)
            .find_map(|(p, r)| {
                r.addresses()
                    .find(|ip| p.gives_out(*ip) && !self.owners.contains_key(ip))
            })
    }

    /// The most preferred pool that can give `wanted` an address of both families, if any.
    fn pool_for_both(&self, config: &Config, wanted: &Wanted) -> Option<String> {
        config
            .pools_by_preference()
            .into_iter()
            .map(|p| p.name.as_str())
            .find(|name| {
                wanted.families.iter().all(|(family, _)| {
                    self.first_free(config, *family, wanted, Some(name))
                        .is_some()
                })
            })
            .map(str::to_owned)
    }

    /// Why `key` (asking `wanted`) may not hold `ip` beside the Services that hold it, if it may not.
    fn sharing_refused(
        &self,
        config: &Config,
        ip: &IpAddr,
        key: &str,
        wanted: &Wanted,
    ) -> Option<String> {
        let holders = self.owners.get(ip)?;
        let cross = config
            .pool_of(*ip)
            .is_some_and(|p| p.cross_namespace_sharing);
        holders.iter().filter(|h| *h != key).find_map(|holder| {
            let theirs = self.services.get(holder).and_then(|r| r.sharing.as_ref());
            match &wanted.sharing {
                Some(mine) => mine.conflict(theirs, holder, cross),
                None => Some(format!(
                    "{} holds it (Services share an address only with the same {ANNOTATION_ALLOW_SHARED_IP})",
                    holder_text(&wanted.namespace, holder)
                )),
            }
        })
    }

    /// `key` no longer holds `ip`.
    fn disown(&mut self, ip: IpAddr, key: &str) {
        if let Some(holders) = self.owners.get_mut(&ip) {
            holders.remove(key);
            if holders.is_empty() {
                self.owners.remove(&ip);
            }
        }
    }

    /// Whether a Service other than `key` holds `ip` (a shared address stays on the interface).
    pub(crate) fn held_by_another(&self, ip: IpAddr, key: &str) -> bool {
        self.owners
            .get(&ip)
            .is_some_and(|holders| holders.iter().any(|h| h != key))
    }

    fn release(&mut self, key: &str) -> Option<Record> {
        let record = self.services.remove(key)?;
        for ip in &record.ips {
            self.disown(*ip, key);
        }
        Some(record)
    }

    /// Reserves the addresses a Service's status carries (at start). An address another Service
    /// already holds is not taken (and logged), unless both may share it (`sharing`: how this one may,
    /// read from the Service as it is). `data_path`: the one its status's `ipMode` says.
    fn reserve(
        &mut self,
        config: &Config,
        key: &str,
        uid: Option<&str>,
        ips: &[IpAddr],
        sharing: Option<Sharing>,
        data_path: DataPath,
    ) {
        let mut mine = Vec::new();
        for ip in ips {
            let cross = config
                .pool_of(*ip)
                .is_some_and(|p| p.cross_namespace_sharing);
            let refused = self.owners.get(ip).and_then(|holders| {
                holders.iter().filter(|h| *h != key).find_map(|holder| {
                    let theirs = self.services.get(holder).and_then(|r| r.sharing.as_ref());
                    match &sharing {
                        Some(mine) => mine.conflict(theirs, holder, cross),
                        None => Some(format!("Service {holder} holds it")),
                    }
                })
            });
            match refused {
                Some(why) => {
                    tracing::warn!(service = key, %ip, %why, "two Services' statuses carry one address; it stays with the first");
                }
                None => {
                    self.owners.entry(*ip).or_default().insert(key.to_owned());
                    mine.push(*ip);
                }
            }
        }
        if !mine.is_empty() {
            self.services.insert(
                key.to_owned(),
                Record {
                    uid: uid.map(str::to_owned),
                    ips: mine,
                    applied: None,
                    data_path,
                    sharing,
                    retained: false,
                },
            );
        }
    }

    /// Reserves `ips` for `key`, kept after its Service went, as [`Allocations::reserve`] reserves
    /// the addresses a Service's status carries: each address another Service holds now is left to it
    /// (said in the log).
    fn keep(&mut self, config: &Config, key: &str, ips: &[IpAddr]) {
        self.reserve(config, key, None, ips, None, DataPath::default());
        if let Some(record) = self.services.get_mut(key) {
            record.retained = true;
        }
    }

    /// Makes the kept records those of `kept`: a kept record no longer listed is released (an
    /// operator's release), a listed key with no record is kept (another leader's, or from before a
    /// restart); a key a live Service holds is that Service's (it adopted the addresses).
    fn keep_only(
        &mut self,
        config: &Config,
        kept: &BTreeMap<String, Vec<IpAddr>>,
    ) -> (Vec<String>, Vec<String>) {
        let released: Vec<String> = self
            .services
            .iter()
            .filter(|(key, record)| record.retained && !kept.contains_key(*key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &released {
            self.release(key);
        }
        let mut added = Vec::new();
        for (key, ips) in kept {
            if !self.services.contains_key(key) {
                self.keep(config, key, ips);
                added.push(key.clone());
            }
        }
        (released, added)
    }
}

/// The data path a Service's status says carries its traffic: `ipMode: VIP` (kube-proxy's, as
/// MetalLB's Services and ours with `local.ccm.rs/data-path: kube-proxy` say), else the data plane's.
fn published_data_path(service: &Service) -> DataPath {
    let vip_mode = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|ingress| ingress.first())
        .and_then(|i| i.ip_mode.as_deref())
        == Some("VIP");
    if vip_mode {
        DataPath::KubeProxy
    } else {
        DataPath::Proxy
    }
}

fn pool_list(config: &Config) -> String {
    config
        .address_pools
        .iter()
        .map(|p| {
            let ranges: Vec<String> = p.addresses.iter().map(ToString::to_string).collect();
            format!("{}: {}", p.name, ranges.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The data plane's spec for `name` with `vips`.
pub(crate) fn build_spec(
    name: &str,
    vips: &[IpAddr],
    wanted: &Wanted,
    nodes: &[(String, Vec<IpAddr>)],
) -> LoadBalancerSpec {
    let mut listeners: Vec<ListenerSpec> = vips
        .iter()
        .flat_map(|vip| {
            wanted
                .ports
                .iter()
                .map(move |(port, protocol, node_port)| ListenerSpec {
                    vip: *vip,
                    port: *port,
                    protocol: *protocol,
                    node_port: *node_port,
                })
        })
        .collect();
    listeners.sort();
    LoadBalancerSpec {
        name: name.to_owned(),
        listeners,
        backends: backend_list(nodes),
        health_check: wanted.health_check.clone(),
        session_affinity: wanted.session_affinity,
        source_ranges: wanted.source_ranges.clone(),
        proxy_protocol: wanted.proxy_protocol,
    }
}

/// The backends of the nodes' addresses, sorted (so equal sets compare equal).
fn backend_list(nodes: &[(String, Vec<IpAddr>)]) -> Vec<Backend> {
    let backends: BTreeSet<(String, IpAddr)> = nodes
        .iter()
        .flat_map(|(name, ips)| ips.iter().map(move |ip| (name.clone(), *ip)))
        .collect();
    backends
        .into_iter()
        .map(|(node, address)| Backend { node, address })
        .collect()
}

/// The addresses a Service's status holds that must not be handed to another Service after a
/// restart: all of them for a classless `type: LoadBalancer` Service or one with the cleanup finalizer
/// (the service controller's by default); for a Service with a `loadBalancerClass` (this manager's when
/// it runs with `--load-balancer-class`, else another implementation's, which the provider cannot tell
/// apart) those in this cloud's pools, so neither loses its address to the other.
fn addresses_to_reserve(service: &Service, config: &Config) -> Vec<IpAddr> {
    let spec = service.spec.as_ref();
    let load_balancer = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    let classed = spec.and_then(|s| s.load_balancer_class.as_ref()).is_some();
    let finalized = service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER));
    let mut ips = if load_balancer || finalized {
        published_ips(service)
    } else {
        Vec::new()
    };
    if classed && !finalized {
        ips.retain(|ip| config.pool_of(*ip).is_some());
    }
    ips
}

impl LocalCloud {
    /// Reserves the VIPs every LoadBalancer Service's status carries.
    /// Returns the Services taken over from MetalLB: those MetalLB gave their addresses to (its
    /// annotation `metallb.io/ip-allocated-from-pool`), which this cloud never served (no cleanup
    /// finalizer), whose addresses are now reserved in MetalLB's pools read as this cloud's.
    pub(crate) async fn reserve_published_addresses(
        &self,
        client: &kube::Client,
    ) -> Result<Vec<(Service, Vec<IpAddr>)>, Error> {
        let services: Api<Service> = Api::all(client.clone());
        // A new leader may meet a passing API hiccup: a few tries, 1 s apart, before start-up fails
        // (no controller may run before the published addresses are reserved).
        let mut attempt = 1;
        let list = loop {
            match services.list(&ListParams::default()).await {
                Ok(list) => break list,
                Err(err) if attempt < LIST_ATTEMPTS => {
                    tracing::warn!(error = %err, attempt, "local cloud: listing Services failed; retrying");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(source) => {
                    return Err(Error::Kube {
                        what: format!(
                            "local cloud: listing Services to reserve their load-balancer addresses ({LIST_ATTEMPTS} tries)"
                        ),
                        source,
                    });
                }
            }
        };
        let config = self.config();
        let mut allocations = lock(&self.inner.load_balancers);
        let mut reserved = 0;
        let mut taken_over = Vec::new();
        for service in &list.items {
            let ips = addresses_to_reserve(service, &config);
            if ips.is_empty() {
                continue;
            }
            let from_metallb = config.metallb_pools
                && service.metadata.annotations.as_ref().is_some_and(|a| {
                    a.keys()
                        .any(|k| k.ends_with(&format!("/{METALLB_OUTPUT_ANNOTATION}")))
                })
                && !service
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == "service.kubernetes.io/load-balancer-cleanup");
            if from_metallb {
                taken_over.push((service.clone(), ips.clone()));
            }
            let sharing = read_service(service, &config).ok().and_then(|w| w.sharing);
            allocations.reserve(
                &config,
                &key_of(service),
                service.metadata.uid.as_deref(),
                &ips,
                sharing,
                published_data_path(service),
            );
            reserved += ips.len();
        }
        tracing::info!(
            addresses = reserved,
            taken_over_from_metallb = taken_over.len(),
            "local cloud: reserved the load-balancer addresses Services carry"
        );
        Ok(taken_over)
    }

    /// Tells each Service taken over from MetalLB (a Normal event [`EVENT_TAKEN_OVER`]) that it keeps
    /// its addresses, now served by this cloud.
    pub(crate) fn tell_taken_over(&self, taken_over: &[(Service, Vec<IpAddr>)]) {
        for (service, ips) in taken_over {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            self.record_event(
                "Normal",
                crate::CloudEvent::about_vip(service, EVENT_TAKEN_OVER, "TakeOver"),
                &format!(
                    "keeps {} from MetalLB's pools, now served by the local cloud (MetalLB's objects \
                     read as its configuration)",
                    ips.join(", ")
                ),
            );
        }
    }

    /// How full each pool in force is ([`crate::pool_usage`]).
    pub fn pool_usage(&self) -> Vec<crate::pool_usage::PoolUsage> {
        let config = self.config();
        let owners = lock(&self.inner.load_balancers).owners.clone();
        crate::pool_usage::usage(&config, &owners)
    }

    /// Every address a pool of `config` has given out, with its pool ([`crate::pool_metrics`]).
    pub(crate) fn assigned_addresses<'c>(
        &self,
        config: &'c crate::config::Config,
    ) -> Vec<(IpAddr, &'c crate::config::AddressPool)> {
        let owners = lock(&self.inner.load_balancers).owners.clone();
        owners
            .keys()
            .filter_map(|ip| {
                let pool = config
                    .address_pools
                    .iter()
                    .find(|p| p.addresses.iter().any(|r| r.contains(*ip)))?;
                Some((*ip, pool))
            })
            .collect()
    }

    /// The labels of namespace `namespace`, read from the API server only when a pool of `config`
    /// selects namespaces by label (`namespaceSelectors`); else none. Without a client (before
    /// `initialize`), none.
    pub(crate) async fn namespace_labels(
        &self,
        config: &Config,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, Error> {
        if config
            .address_pools
            .iter()
            .all(|p| p.namespace_selectors.is_empty())
        {
            return Ok(BTreeMap::new());
        }
        let Some((client, _)) = lock(&self.inner.reporter).clone() else {
            return Ok(BTreeMap::new());
        };
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let found = namespaces
            .get_opt(namespace)
            .await
            .map_err(|source| Error::Kube {
                what: format!(
                    "local cloud: reading the labels of namespace {namespace} (a pool selects namespaces by label)"
                ),
                source,
            })?;
        Ok(found.and_then(|n| n.metadata.labels).unwrap_or_default())
    }

    /// Keeps the addresses of `service`'s load balancer for a later Service of its namespace and name
    /// (`ccm.rs/load-balancer-retain`): recorded first in the ConfigMap of [`crate::retained`], then
    /// no longer served (its listeners closed, its addresses off the interface), and still reserved.
    async fn retain(&self, service: &Service) -> Result<(), Error> {
        let key = key_of(service);
        let _serial = self.serialize(&key).await;
        let ips = lock(&self.inner.load_balancers)
            .services
            .get(&key)
            .filter(|r| !r.retained && r.same_service(service.metadata.uid.as_deref()))
            .map(|r| r.ips.clone());
        let Some(ips) = ips else {
            return Ok(()); // nothing held, or kept already
        };
        let client = lock(&self.inner.reporter).clone().map(|(client, _)| client);
        let Some(client) = client else {
            return Err(Error::Service {
                service: key,
                message: "ccm.rs/load-balancer-retain: the cloud has no API client yet".to_owned(),
            });
        };
        crate::retained::write(client, &key, Some(&ips)).await?;
        tracing::info!(vips = ?ips, "keeping the load balancer's addresses for a later Service of this name");
        self.forget_unserved(&key);
        self.stop_serving(&key, &ips).await;
        if let Some(record) = lock(&self.inner.load_balancers).services.get_mut(&key) {
            record.uid = None;
            record.applied = None;
            record.retained = true;
        }
        Ok(())
    }

    /// Closes the listeners of `key`'s load balancer and takes its addresses `ips` off the interface
    /// (with `vipInterface`); a shared address stays on the interface for the Services still on it.
    async fn stop_serving(&self, key: &str, ips: &[IpAddr]) {
        self.inner.data_plane.remove(key).await;
        if let Some(addresses) = &self.inner.addresses {
            let sole: Vec<IpAddr> = {
                let allocations = lock(&self.inner.load_balancers);
                ips.iter()
                    .copied()
                    .filter(|ip| !allocations.held_by_another(*ip, key))
                    .collect()
            };
            for ip in sole {
                addresses.remove(ip).await;
            }
        }
    }

    /// Makes the kept addresses those `kept` lists ([`crate::retained`]).
    pub(crate) fn keep_only(&self, kept: &BTreeMap<String, Vec<IpAddr>>) {
        let config = self.config();
        let (released, added) = lock(&self.inner.load_balancers).keep_only(&config, kept);
        for key in released {
            tracing::info!(service = %key, "kept addresses released (their entry left {})", crate::retained::CONFIG_MAP);
        }
        for key in added {
            tracing::info!(service = %key, "addresses kept for a Service that went are reserved");
        }
    }

    async fn ensure(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, Error> {
        let key = key_of(service);
        let _serial = self.serialize(&key).await;
        let config = self.config();
        let bad = |message: String| Error::Service {
            service: key.clone(),
            message,
        };
        let mut wanted = read_service(service, &config).map_err(bad)?;
        wanted.namespace_labels = self.namespace_labels(&config, &wanted.namespace).await?;
        let uid = service.metadata.uid.as_deref();
        // Backends: the nodes this cloud knows (listed or adopted) at their InternalIPs; nodes it
        // ignores (another cloud's, or unlisted ones with `unlistedNodes: ignore`) and removed machines
        // get no traffic.
        let backends: Vec<(String, Vec<IpAddr>)> = nodes
            .iter()
            .filter_map(|node| self.backend_addresses(&config, node))
            .collect();
        // The serial lock keeps this Service's record as this ensure leaves it between the lock's turns.
        let (previous, vips, adopting) = {
            let mut allocations = lock(&self.inner.load_balancers);
            let previous: Vec<IpAddr> = allocations
                .services
                .get(&key)
                .map(|r| r.ips.clone())
                .unwrap_or_default();
            let adopting = allocations.services.get(&key).is_some_and(|r| r.retained);
            let vips = allocations
                .allocate(&config, &key, uid, &wanted, &published_ips(service))
                .map_err(bad)?;
            (previous, vips, adopting)
        };
        if adopting {
            tracing::info!(vips = ?vips, "adopting the addresses kept for this Service's name");
            let client = lock(&self.inner.reporter).clone().map(|(client, _)| client);
            if let Some(client) = client
                && let Err(err) = crate::retained::write(client, &key, None).await
            {
                // The record stays in the ConfigMap; the Service holds the addresses all the same.
                tracing::warn!(error = %err, "could not forget the kept addresses in their ConfigMap");
            }
        }
        if config.load_balancer.mode == LoadBalancerMode::Agents {
            // The node agents announce and serve the VIPs; the manager only assigns them.
            tracing::debug!(vips = ?vips, "addresses assigned; the node agents serve them");
            self.tell_if_unserved(service, &key, &vips).await;
            return Ok(lock(&self.inner.load_balancers)
                .services
                .get(&key)
                .map(Record::status)
                .unwrap_or_default());
        }
        let (unchanged, spec) = {
            let allocations = lock(&self.inner.load_balancers);
            let spec = build_spec(&key, &vips, &wanted, &backends);
            // Applied as asked, and the data plane still runs every listener of it (one lost out of
            // band, or that failed to bind, is applied again).
            let unchanged = allocations
                .services
                .get(&key)
                .is_some_and(|r| r.applied.as_ref() == Some(&spec))
                && self.running_differences(&spec).is_empty();
            (unchanged, spec)
        };
        if !unchanged {
            if let Some(addresses) = &self.inner.addresses {
                for vip in &vips {
                    // A VIP on but not announced is served all the same: reported, not failed.
                    if let Some(warning) = addresses.add(*vip).await.map_err(bad)? {
                        self.report_unannounced_vip(service, &warning);
                    }
                }
            }
            tracing::info!(vips = ?vips, listeners = spec.listeners.len(), backends = spec.backends.len(), "applying the load balancer");
            self.inner
                .applies
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let result = self.inner.data_plane.apply(spec.clone()).await;
            if let Some(record) = lock(&self.inner.load_balancers).services.get_mut(&key) {
                record.applied = result.is_ok().then(|| spec.clone());
            }
            result.map_err(|source| Error::DataPlane {
                service: key.clone(),
                source,
            })?;
            if let Some(addresses) = &self.inner.addresses {
                let shared: Vec<IpAddr> = {
                    let allocations = lock(&self.inner.load_balancers);
                    previous
                        .iter()
                        .copied()
                        .filter(|ip| allocations.held_by_another(*ip, &key))
                        .collect()
                };
                for old in previous
                    .iter()
                    .filter(|ip| !vips.contains(ip) && !shared.contains(ip))
                {
                    addresses.remove(*old).await;
                }
            }
        }
        let allocations = lock(&self.inner.load_balancers);
        Ok(allocations
            .services
            .get(&key)
            .map(Record::status)
            .unwrap_or_default())
    }
}

/// What differs between `spec` and what the data plane runs for it (listeners not running or failed,
/// listeners it should not run), in words; empty when it runs exactly `spec`'s listeners.
pub(crate) fn listener_differences(
    spec: &LoadBalancerSpec,
    running: Option<&local_data_plane::LoadBalancerState>,
) -> Vec<String> {
    let Some(running) = running else {
        return vec!["the data plane runs no load balancer for it".into()];
    };
    let words = |l: &ListenerSpec| format!("{:?} {}", l.protocol, l.socket_addr());
    let bound: BTreeSet<&ListenerSpec> = running.listeners.iter().map(|l| &l.spec).collect();
    let mut out = Vec::new();
    for (listener, why) in &running.failed_listeners {
        out.push(format!("the listener {} failed: {why}", words(listener)));
    }
    for listener in &spec.listeners {
        if !bound.contains(listener) && !running.failed_listeners.iter().any(|(f, _)| f == listener)
        {
            out.push(format!("the listener {} is not running", words(listener)));
        }
    }
    for listener in bound {
        if !spec.listeners.contains(listener) {
            out.push(format!("the listener {} should not run", words(listener)));
        }
    }
    out
}

impl LocalCloud {
    /// [`listener_differences`] against the data plane now.
    fn running_differences(&self, spec: &LoadBalancerSpec) -> Vec<String> {
        listener_differences(spec, self.inner.data_plane.state(&spec.name).as_ref())
    }

    /// What [`LoadBalancer::ensure_load_balancer`] would change, without changing anything: the load
    /// balancer missing (no addresses held for the Service), listeners the data plane does not run as
    /// asked (lost, failed, left over), backends that differ, and any other setting (health check,
    /// affinity, source ranges, PROXY protocol, addresses asked for) that differs from what was applied.
    async fn preview(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerPreview, Error> {
        let key = key_of(service);
        let config = self.config();
        let mut wanted = read_service(service, &config).map_err(|message| Error::Service {
            service: key.clone(),
            message,
        })?;
        wanted.namespace_labels = self.namespace_labels(&config, &wanted.namespace).await?;
        let backends: Vec<(String, Vec<IpAddr>)> = nodes
            .iter()
            .filter_map(|node| self.backend_addresses(&config, node))
            .collect();
        let names =
            |b: &[Backend]| -> BTreeSet<String> { b.iter().map(|b| b.node.clone()).collect() };
        let record = lock(&self.inner.load_balancers)
            .services
            .get(&key)
            .filter(|r| r.same_service(service.metadata.uid.as_deref()))
            .cloned();
        let Some(record) = record else {
            let backends = names(&backend_list(&backends)).into_iter().collect();
            return Ok(LoadBalancerPreview::Create { backends });
        };
        let spec = build_spec(&key, &record.ips, &wanted, &backends);
        let agents = config.load_balancer.mode == LoadBalancerMode::Agents;
        // With node agents, this process runs no data plane: only the addresses are checked.
        let mut detail = if agents {
            Vec::new()
        } else {
            self.running_differences(&spec)
        };
        if record.data_path != wanted.data_path {
            detail.push(format!(
                "the data path would change to {:?} (ipMode {:?})",
                wanted.data_path,
                wanted.data_path.ip_mode()
            ));
        }
        for (family, ip) in &wanted.requested {
            if !record.ips.contains(ip) {
                detail.push(format!("the {family:?} address would change to {ip}"));
            }
        }
        // An address its pool no longer gives this Service (the pools or their limits changed, or the
        // Service names another pool): an ensure takes another, so the drift check moves it.
        for ip in &record.ips {
            let why = match config.pool_of(*ip) {
                None => Some("it is in no address pool now".to_owned()),
                Some(pool) if wanted.pool.as_ref().is_some_and(|n| n != &pool.name) => {
                    Some(format!(
                        "it is in pool {:?}, not in the one the Service names",
                        pool.name
                    ))
                }
                Some(pool) => {
                    pool.refuses(&wanted.namespace, &wanted.namespace_labels, &wanted.labels)
                }
            };
            if let Some(why) = why {
                detail.push(format!("the address {ip} would change: {why}"));
            }
        }
        let (added, removed) = match &record.applied {
            _ if agents => (Vec::new(), Vec::new()),
            Some(applied) => {
                let (was, will) = (names(&applied.backends), names(&spec.backends));
                if applied.health_check != spec.health_check {
                    detail.push("the health check would change".into());
                }
                if applied.session_affinity != spec.session_affinity {
                    detail.push("the session affinity would change".into());
                }
                if applied.source_ranges != spec.source_ranges {
                    detail.push("the source ranges would change".into());
                }
                if applied.proxy_protocol != spec.proxy_protocol {
                    detail.push("PROXY protocol would change".into());
                }
                (
                    will.difference(&was).cloned().collect::<Vec<_>>(),
                    was.difference(&will).cloned().collect::<Vec<_>>(),
                )
            }
            None => (names(&spec.backends).into_iter().collect(), Vec::new()),
        };
        if detail.is_empty() && added.is_empty() && removed.is_empty() {
            return Ok(LoadBalancerPreview::UpToDate);
        }
        Ok(LoadBalancerPreview::Change {
            backends_added: added,
            backends_removed: removed,
            detail: detail.join("; "),
        })
    }

    /// Holds off every other ensure, update and delete of the load balancer `key` until the guard is
    /// dropped: the service sync and the node sync may call for the same Service at once, and the
    /// data plane must end up running the newer spec, not whichever apply finished last.
    async fn serialize(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let mutex = lock(&self.inner.serial)
            .entry(key.to_owned())
            .or_default()
            .clone();
        mutex.lock_owned().await
    }

    /// Changes only the backends of the load balancer the data plane runs for this Service (upstream's
    /// `UpdateLoadBalancer`). The node sync calls this with the copy of the Service it last synced,
    /// which may be older than what the last ensure applied (or than the Service's deletion): so nothing
    /// else of the spec is taken from it, and a load balancer that is not running is left alone.
    async fn update_backends(&self, service: &Service, nodes: &[Arc<Node>]) -> Result<(), Error> {
        let key = key_of(service);
        let _serial = self.serialize(&key).await;
        let config = self.config();
        if config.load_balancer.mode == LoadBalancerMode::Agents {
            return Ok(()); // the node agents choose their backends themselves
        }
        let backends: Vec<(String, Vec<IpAddr>)> = nodes
            .iter()
            .filter_map(|node| self.backend_addresses(&config, node))
            .collect();
        let spec = {
            let allocations = lock(&self.inner.load_balancers);
            let Some(applied) = allocations
                .services
                .get(&key)
                .filter(|r| r.same_service(service.metadata.uid.as_deref()))
                .and_then(|r| r.applied.clone())
            else {
                tracing::debug!("no load balancer running for this Service; nothing to update");
                return Ok(());
            };
            let mut spec = applied.clone();
            spec.backends = backend_list(&backends);
            if spec == applied {
                return Ok(());
            }
            spec
        };
        tracing::info!(
            backends = spec.backends.len(),
            "updating the load balancer's backends"
        );
        self.inner
            .applies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = self.inner.data_plane.apply(spec.clone()).await;
        if let Some(record) = lock(&self.inner.load_balancers).services.get_mut(&key) {
            record.applied = result.is_ok().then(|| spec.clone());
        }
        result.map_err(|source| Error::DataPlane {
            service: key,
            source,
        })
    }
}

#[async_trait]
impl LoadBalancer for LocalCloud {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let allocations = lock(&self.inner.load_balancers);
        Ok(allocations
            .services
            .get(&key_of(service))
            .filter(|r| r.same_service(service.metadata.uid.as_deref()))
            .map(Record::status))
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        cloud_provider::leadership::check()?;
        let span = tracing::info_span!("ensure_load_balancer", service = %key_of(service));
        Ok(self.ensure(service, nodes).instrument(span).await?)
    }

    /// The data plane forwards to a node's `InternalIP:NodePort`, which any node on the network has: the
    /// backends are every eligible node this cloud does not ignore, owned by this manager or not.
    fn backends_beyond_owned_nodes(&self) -> bool {
        true
    }

    /// The label keys of every pool's `serviceSelector`: a Service relabelled into or out of a pool's
    /// scope is synced at once.
    fn service_label_keys(&self) -> Vec<String> {
        let keys: BTreeSet<String> = self
            .config()
            .address_pools
            .iter()
            .flat_map(|p| p.service_label_keys().map(str::to_owned))
            .collect();
        keys.into_iter().collect()
    }

    /// Read-only: the Service's addresses, what was applied and what the data plane runs (see
    /// `LocalCloud::preview`).
    async fn preview_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        Ok(self.preview(service, nodes).await?)
    }

    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        cloud_provider::leadership::check()?;
        let span = tracing::info_span!("update_load_balancer", service = %key_of(service));
        self.update_backends(service, nodes)
            .instrument(span)
            .await?;
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let key = key_of(service);
        let span = tracing::info_span!("ensure_load_balancer_deleted", service = %key);
        async {
            let _serial = self.serialize(&key).await;
            self.forget_unserved(&key);
            let ips = lock(&self.inner.load_balancers)
                .services
                .get(&key)
                .filter(|r| r.same_service(service.metadata.uid.as_deref()))
                .map(|r| r.ips.clone());
            if let Some(ips) = ips {
                tracing::info!(vips = ?ips, "deleting the load balancer");
                self.stop_serving(&key, &ips).await;
                // Only now may another Service get these addresses: not while this load balancer's
                // connections drain on them (nor, with `vipInterface`, before they left the interface).
                lock(&self.inner.load_balancers).release(&key);
            }
        }
        .instrument(span)
        .await;
        Ok(())
    }

    fn retains_load_balancers(&self) -> bool {
        true
    }

    async fn retain_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let span = tracing::info_span!("retain_load_balancer", service = %key_of(service));
        self.retain(service).instrument(span).await?;
        Ok(())
    }

    /// Every load balancer this process holds addresses for, by the UID of its Service, and those kept
    /// for a Service that went (marked retained: the sweep leaves them).
    async fn list_load_balancers(
        &self,
        _cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let allocations = lock(&self.inner.load_balancers);
        Ok(allocations
            .services
            .iter()
            .filter_map(|(key, record)| {
                if record.retained {
                    let (namespace, name) = key.split_once('/')?;
                    return Some(
                        ClusterLoadBalancer::new(
                            format!("kept:{key}"),
                            Some(ServiceRef::new(namespace, name)),
                        )
                        .retained(),
                    );
                }
                let uid = record.uid.as_deref()?;
                let (namespace, name) = key.split_once('/')?;
                let mut service = Service::default();
                service.metadata.uid = Some(uid.to_owned());
                Some(ClusterLoadBalancer::new(
                    cloud_provider::default_load_balancer_name(&service),
                    Some(ServiceRef::new(namespace, name).with_uid(uid)),
                ))
            })
            .collect())
    }

    async fn delete_orphaned_load_balancer(
        &self,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        let Some(reference) = &load_balancer.service else {
            return Ok(()); // `list_load_balancers` names the Service of every load balancer it lists
        };
        let mut service = Service::default();
        service.metadata.namespace = Some(reference.namespace.clone());
        service.metadata.name = Some(reference.name.clone());
        service.metadata.uid = reference.uid.clone();
        self.ensure_load_balancer_deleted(cluster_name, &service)
            .await
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
        SessionAffinityConfig,
    };
    use serde_json::json;

    use super::*;

    fn svc(value: serde_json::Value) -> Service {
        let mut base = json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 8080, "nodePort": 30080, "protocol": "TCP"}]}
        });
        merge(&mut base, value);
        serde_json::from_value(base).unwrap()
    }

    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, p) => *b = p,
        }
    }

    fn config(yaml: &str) -> Config {
        Config::parse(yaml, None).unwrap()
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn a_plain_service_reads_as_one_tcp_port_checked_on_kube_proxy() {
        let wanted = read_service(&svc(json!({})), &Config::default()).unwrap();
        assert_eq!(wanted.families, vec![(IpFamily::V4, true)]);
        assert_eq!(wanted.ports, vec![(8080, Protocol::Tcp, 30080)]);
        assert_eq!(
            wanted.health_check,
            Some(HealthCheck {
                port: 10256,
                path: "/healthz".into()
            })
        );
        assert!(wanted.source_ranges.is_empty(), "allow-all is no filter");
        assert!(!wanted.proxy_protocol && wanted.session_affinity.is_none());
    }

    #[test]
    fn metallb_s_annotations_are_read_as_ours() {
        let config = Config::parse(
            "addressPools: [{name: gold, addresses: [127.52.0.0/24]}]\n",
            None,
        )
        .unwrap();
        for prefix in ["metallb.io", "metallb.universe.tf"] {
            let service = svc(json!({"metadata": {"annotations": {
                format!("{prefix}/loadBalancerIPs"): "127.52.0.7",
                format!("{prefix}/address-pool"): "gold",
                format!("{prefix}/allow-shared-ip"): "k",
                // MetalLB's own output: neither read nor refused.
                format!("{prefix}/ip-allocated-from-pool"): "gold",
            }}}));
            let wanted = read_service(&service, &config).unwrap();
            assert_eq!(
                wanted.requested.values().copied().collect::<Vec<_>>(),
                ["127.52.0.7".parse::<IpAddr>().unwrap()],
                "{prefix}"
            );
            assert_eq!(wanted.pool.as_deref(), Some("gold"), "{prefix}");
            assert_eq!(
                wanted.sharing.map(|s| s.key).as_deref(),
                Some("k"),
                "{prefix}"
            );
        }
        for (annotations, wanted) in [
            (
                json!({ANNOTATION_ADDRESS_POOL: "gold", "metallb.io/address-pool": "silver"}),
                "local.ccm.rs/address-pool says \"gold\" and metallb.io/address-pool says \"silver\"",
            ),
            (
                json!({"metallb.io/loadBalancerIPs": "x"}),
                "metallb.io/loadBalancerIPs: \"x\" is not an IP address",
            ),
            (
                json!({"metallb.universe.tf/address-pool": "lead"}),
                "there is no address pool \"lead\"",
            ),
            (
                json!({"metallb.io/bgp-communities": "a"}),
                "metallb.io/bgp-communities: a MetalLB annotation local does not read",
            ),
        ] {
            let service = svc(json!({"metadata": {"annotations": annotations}}));
            let err = read_service(&service, &config).unwrap_err();
            assert!(err.contains(wanted), "{err}\n  lacks {wanted}");
        }
        // The same value under two spellings is one setting.
        let service = svc(json!({"metadata": {"annotations": {
            ANNOTATION_ADDRESS_POOL: "gold", "metallb.io/address-pool": "gold"}}}));
        assert_eq!(
            read_service(&service, &config).unwrap().pool.as_deref(),
            Some("gold")
        );
    }

    #[test]
    fn metallb_s_pools_leave_the_traffic_to_kube_proxy_by_default() {
        let mut config = Config::parse("loadBalancer: {mode: agents}\n", None).unwrap();
        config.metallb_pools = true;
        let plain = svc(json!({}));
        assert_eq!(
            read_service(&plain, &config).unwrap().data_path,
            DataPath::KubeProxy
        );
        for (annotations, wanted) in [
            (json!({ANNOTATION_DATA_PATH: "proxy"}), DataPath::Proxy),
            // PROXY protocol, which only the data plane sends.
            (json!({ANNOTATION_PROXY_PROTOCOL: "v2"}), DataPath::Proxy),
        ] {
            let service = svc(json!({"metadata": {"annotations": annotations}}));
            assert_eq!(read_service(&service, &config).unwrap().data_path, wanted);
        }
        config.metallb_pools = false;
        assert_eq!(
            read_service(&plain, &config).unwrap().data_path,
            DataPath::Proxy
        );
    }

    #[test]
    fn local_traffic_affinity_ranges_and_proxy() {
        let mut service = svc(json!({
            "metadata": {"annotations": {ANNOTATION_PROXY_PROTOCOL: "v2"}},
            "spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                     "sessionAffinity": "ClientIP", "loadBalancerSourceRanges": ["127.0.0.0/24"],
                     "ports": [{"port": 53, "nodePort": 30053, "protocol": "UDP"}, {"port": 53, "nodePort": 30054, "protocol": "TCP"}]}
        }));
        let wanted = read_service(&service, &Config::default()).unwrap();
        assert_eq!(
            wanted.health_check,
            Some(HealthCheck {
                port: 31000,
                path: "/healthz".into()
            })
        );
        assert_eq!(wanted.session_affinity, Some(Duration::from_secs(10_800)));
        assert_eq!(wanted.source_ranges, vec!["127.0.0.0/24".parse().unwrap()]);
        assert!(wanted.proxy_protocol);
        assert_eq!(
            wanted.ports,
            vec![(53, Protocol::Tcp, 30054), (53, Protocol::Udp, 30053)]
        );
        service.spec.as_mut().unwrap().session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(60),
            }),
        });
        assert_eq!(
            read_service(&service, &Config::default())
                .unwrap()
                .session_affinity,
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn bad_input_is_named() {
        let cases = [
            (
                json!({"metadata": {"annotations": {ANNOTATION_PROXY_PROTOCOL: "v1"}}}),
                "local.ccm.rs/proxy-protocol: \"v1\" is not valid",
            ),
            (
                json!({"metadata": {"annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.240.0.300"}}}),
                "local.ccm.rs/load-balancer-ips: \"127.240.0.300\" is not an IP address",
            ),
            (
                json!({"metadata": {"annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.240.0.3,127.240.0.4"}}}),
                "two IPv4 addresses",
            ),
            (
                json!({"spec": {"loadBalancerIP": "fd00::1"}}),
                "spec.loadBalancerIP: fd00::1 is an IPv6 address but the Service's IP families are [IPv4]",
            ),
            (
                json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "gold"}}}),
                "there is no address pool \"gold\" (pools: default)",
            ),
            (
                json!({"metadata": {"annotations": {"service.beta.kubernetes.io/load-balancer-source-ranges": "nope"}}}),
                "load-balancer-source-ranges: nope is not valid",
            ),
            (
                json!({"spec": {"ports": [{"port": 9, "protocol": "SCTP", "nodePort": 30009}]}}),
                "TCP and UDP only",
            ),
            (
                json!({"spec": {"ports": [{"port": 9, "protocol": "TCP"}]}}),
                "has no node port",
            ),
        ];
        for (patch, expected) in cases {
            let err = read_service(&svc(patch), &Config::default()).unwrap_err();
            assert!(err.contains(expected), "{err} lacks {expected}");
        }
    }

    fn dual(policy: &str, families: &[&str]) -> Service {
        svc(json!({"spec": {"ipFamilyPolicy": policy, "ipFamilies": families}}))
    }

    /// What an ensure allocates for `service` (under `key`) with `config`.
    fn allocate_for(
        allocations: &mut Allocations,
        config: &Config,
        key: &str,
        service: &Service,
    ) -> Result<Vec<IpAddr>, String> {
        let wanted = read_service(service, config)?;
        allocations.allocate(
            config,
            key,
            service.metadata.uid.as_deref(),
            &wanted,
            &published_ips(service),
        )
    }

    /// A sharing key spans one namespace: a Service of another namespace with the same key gets an
    /// address of its own, and asking for the holder's address is refused with a reason that names
    /// neither the holder nor its key; a pool with `crossNamespaceSharing: true` lets it in.
    #[test]
    fn a_sharing_key_spans_one_namespace_unless_the_pool_says_otherwise() {
        let in_ns = |namespace: &str, port: u16, ask: bool| {
            let mut annotations = json!({ANNOTATION_ALLOW_SHARED_IP: "k"});
            if ask {
                annotations[ANNOTATION_LOAD_BALANCER_IPS] = json!("127.52.0.1");
            }
            svc(json!({
                "metadata": {"namespace": namespace, "annotations": annotations},
                "spec": {"ports": [{"port": port, "nodePort": 30000 + port, "protocol": "TCP"}]}
            }))
        };
        for (cross, want) in [(false, None), (true, Some("127.52.0.1"))] {
            let config = config(&format!(
                "addressPools:\n  - {{name: a, addresses: [127.52.0.1-127.52.0.3], crossNamespaceSharing: {cross}}}\n"
            ));
            let mut allocations = Allocations::default();
            let victim = allocate_for(
                &mut allocations,
                &config,
                "victim/web",
                &in_ns("victim", 443, false),
            );
            assert_eq!(victim.unwrap(), ips(&["127.52.0.1"]));
            // The same key from another namespace, picking: its own address unless the pool shares.
            let picked = allocate_for(
                &mut allocations,
                &config,
                "tenant/x",
                &in_ns("tenant", 80, false),
            );
            assert_eq!(
                picked.unwrap(),
                ips(&[want.unwrap_or("127.52.0.2")]),
                "crossNamespaceSharing: {cross}"
            );
            allocations.release("tenant/x");
            // Asking for the victim's address.
            let asked = allocate_for(
                &mut allocations,
                &config,
                "tenant/x",
                &in_ns("tenant", 80, true),
            );
            match want {
                Some(ip) => assert_eq!(asked.unwrap(), ips(&[ip])),
                None => {
                    let err = asked.unwrap_err();
                    assert_eq!(
                        err,
                        "the requested address 127.52.0.1 is taken: a Service of another namespace \
                         holds it, and its pool shares addresses within one namespace only \
                         (crossNamespaceSharing)"
                    );
                    assert!(!err.contains("victim") && !err.contains("\"k\""), "{err}");
                }
            }
        }
        // Another namespace's holder without the key is not named either.
        let config = config("addressPools:\n  - {name: a, addresses: [127.52.0.1-127.52.0.3]}\n");
        let mut allocations = Allocations::default();
        let plain = svc(json!({"metadata": {"namespace": "victim"}}));
        allocate_for(&mut allocations, &config, "victim/web", &plain).unwrap();
        let ask = svc(
            json!({"metadata": {"namespace": "tenant", "annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.52.0.1"}}}),
        );
        let err = allocate_for(&mut allocations, &config, "tenant/x", &ask).unwrap_err();
        assert!(
            err.contains(": a Service of another namespace holds it"),
            "{err}"
        );
    }

    /// Services with one `allow-shared-ip` key, distinct ports and the same traffic policy share an
    /// address, picked or asked for; any other pair does not, and the refusal says why; a shared
    /// address is free again only when its last Service goes.
    #[test]
    fn services_with_one_sharing_key_and_distinct_ports_share_an_address() {
        let config = config("addressPools:\n  - {name: a, addresses: [127.52.0.1-127.52.0.3]}\n");
        let mut allocations = Allocations::default();
        let shared = |key: &str, port: u16, extra: serde_json::Value| {
            let mut service = json!({
                "metadata": {"annotations": {ANNOTATION_ALLOW_SHARED_IP: key}},
                "spec": {"ports": [{"port": port, "nodePort": 30000 + port, "protocol": "TCP"}]}
            });
            merge(&mut service, extra);
            svc(service)
        };
        let none = json!({});
        let web = allocate_for(
            &mut allocations,
            &config,
            "ns/web",
            &shared("k", 80, none.clone()),
        );
        assert_eq!(web.unwrap(), ips(&["127.52.0.1"]));
        // Same key, another port: the same address.
        let tls = allocate_for(
            &mut allocations,
            &config,
            "ns/tls",
            &shared("k", 443, none.clone()),
        );
        assert_eq!(tls.unwrap(), ips(&["127.52.0.1"]));
        // Same port, another key, no key: other addresses.
        let clash = allocate_for(
            &mut allocations,
            &config,
            "ns/clash",
            &shared("k", 80, none.clone()),
        );
        assert_eq!(clash.unwrap(), ips(&["127.52.0.2"]));
        let other = allocate_for(
            &mut allocations,
            &config,
            "ns/other",
            &shared("j", 8080, none.clone()),
        );
        assert_eq!(other.unwrap(), ips(&["127.52.0.3"]));
        // Asked for by address: refused with the reason.
        let ask = |extra: serde_json::Value| {
            let mut service =
                json!({"metadata": {"annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.52.0.1"}}});
            merge(&mut service, extra);
            service
        };
        for (service, why) in [
            (
                svc(ask(json!({}))),
                "Service ns/tls holds it (Services share an address only with the same local.ccm.rs/allow-shared-ip)",
            ),
            (
                shared("j", 8081, ask(json!({}))),
                "Service ns/tls holds it with another local.ccm.rs/allow-shared-ip key",
            ),
            (shared("k", 443, ask(json!({}))), "uses port 443/TCP too"),
            (
                shared(
                    "k",
                    8443,
                    ask(
                        json!({"spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000, "selector": {"app": "x"}}}),
                    ),
                ),
                "another externalTrafficPolicy",
            ),
        ] {
            let err = allocate_for(&mut allocations, &config, "ns/asker", &service).unwrap_err();
            assert!(
                err.starts_with("the requested address 127.52.0.1 is taken: "),
                "{err}"
            );
            assert!(err.contains(why), "{err}");
        }
        let joined = allocate_for(
            &mut allocations,
            &config,
            "ns/asker",
            &shared("k", 8443, ask(json!({}))),
        );
        assert_eq!(joined.unwrap(), ips(&["127.52.0.1"]));
        // The address stays held while one of its Services does.
        allocations.release("ns/web");
        allocations.release("ns/tls");
        assert!(allocations.held_by_another("127.52.0.1".parse().unwrap(), "ns/web"));
        allocations.release("ns/asker");
        assert!(
            !allocations
                .owners
                .contains_key(&"127.52.0.1".parse().unwrap())
        );
        // An empty key is refused, naming the annotation.
        let err = read_service(&shared("", 80, none), &config).unwrap_err();
        assert!(
            err.contains("local.ccm.rs/allow-shared-ip: the sharing key is empty"),
            "{err}"
        );
    }

    const DUAL_POOLS: &str = "addressPools:\n  - {name: a, addresses: [127.50.0.1-127.50.0.2, 'fd00:50::/126']}\n  - {name: b, addresses: [127.51.0.0/30], autoAssign: false}\n";

    #[test]
    fn a_dual_stack_service_takes_both_addresses_from_one_pool_when_one_can() {
        // `v4` is preferred for IPv4 but has no IPv6; `both` has both: MetalLB's rule takes both from
        // `both`. Once `both` has no IPv4 left, each family comes from its own most preferred pool.
        let config = config(
            "addressPools:\n  - {name: v4, addresses: [127.52.0.1-127.52.0.2], priority: 1}\n  - {name: both, addresses: [127.53.0.1-127.53.0.1, 'fd00:53::/126']}\n",
        );
        let mut allocations = Allocations::default();
        let require = dual("RequireDualStack", &["IPv4", "IPv6"]);
        assert_eq!(
            allocate_for(&mut allocations, &config, "ns/a", &require).unwrap(),
            ips(&["127.53.0.1", "fd00:53::1"])
        );
        assert_eq!(
            allocate_for(&mut allocations, &config, "ns/b", &require).unwrap(),
            ips(&["127.52.0.1", "fd00:53::2"])
        );
        // A single-stack Service still takes the most preferred pool of its family.
        assert_eq!(
            allocate_for(
                &mut allocations,
                &config,
                "ns/c",
                &dual("SingleStack", &["IPv4"])
            )
            .unwrap(),
            ips(&["127.52.0.2"])
        );
    }

    #[test]
    fn families_pools_and_requests() {
        let config = config(DUAL_POOLS);
        let mut allocations = Allocations::default();
        let allocate = |allocations: &mut Allocations, key: &str, service: &Service| {
            allocate_for(allocations, &config, key, service)
        };
        // IPv6 first when the Service says so; both families when it requires dual-stack.
        assert_eq!(
            allocate(
                &mut allocations,
                "ns/a",
                &dual("RequireDualStack", &["IPv6", "IPv4"])
            )
            .unwrap(),
            ips(&["fd00:50::1", "127.50.0.1"])
        );
        // Idempotent.
        assert_eq!(
            allocate(
                &mut allocations,
                "ns/a",
                &dual("RequireDualStack", &["IPv6", "IPv4"])
            )
            .unwrap(),
            ips(&["fd00:50::1", "127.50.0.1"])
        );
        assert_eq!(
            allocate(&mut allocations, "ns/b", &dual("SingleStack", &["IPv4"])).unwrap(),
            ips(&["127.50.0.2"])
        );
        // IPv4 is exhausted: a PreferDualStack Service gets IPv6 alone, a SingleStack one an error
        // that names the pool, and nothing changes for it.
        assert_eq!(
            allocate(
                &mut allocations,
                "ns/c",
                &dual("PreferDualStack", &["IPv6", "IPv4"])
            )
            .unwrap(),
            ips(&["fd00:50::2"])
        );
        let err = allocate(&mut allocations, "ns/d", &dual("SingleStack", &["IPv4"])).unwrap_err();
        assert_eq!(err, "no free IPv4 address: pool(s) a are exhausted");
        assert!(!allocations.services.contains_key("ns/d"));
        // A pool kept out of auto-assignment serves those who name it.
        let named = svc(json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "b"}}}));
        assert_eq!(
            allocate(&mut allocations, "ns/d", &named).unwrap(),
            ips(&["127.51.0.1"])
        );
        // A requested address: taken, outside the pools, free.
        let asks = |ip: &str| svc(json!({"spec": {"loadBalancerIP": ip}}));
        assert_eq!(
            allocate(&mut allocations, "ns/e", &asks("127.50.0.2")).unwrap_err(),
            "the requested address 127.50.0.2 is taken: Service ns/b holds it (Services share an address only with the same local.ccm.rs/allow-shared-ip)"
        );
        assert!(
            allocate(&mut allocations, "ns/e", &asks("127.9.9.9"))
                .unwrap_err()
                .starts_with("the requested address 127.9.9.9 is in no address pool (a: ")
        );
        assert_eq!(
            allocate(&mut allocations, "ns/e", &asks("127.51.0.2")).unwrap(),
            ips(&["127.51.0.2"])
        );
        // Moving to another requested address frees the first.
        assert_eq!(
            allocate(&mut allocations, "ns/e", &asks("127.51.0.1")).unwrap_err(),
            "the requested address 127.51.0.1 is taken: Service ns/d holds it (Services share an address only with the same local.ccm.rs/allow-shared-ip)"
        );
        allocations.release("ns/d");
        assert_eq!(
            allocate(&mut allocations, "ns/e", &asks("127.51.0.1")).unwrap(),
            ips(&["127.51.0.1"])
        );
        assert!(
            !allocations
                .owners
                .contains_key(&"127.51.0.2".parse().unwrap())
        );
    }

    /// Issue #30: pools limited to namespaces and Service labels serve only those Services, whether
    /// they are picked, named by annotation or asked for by address; another Service gets an error that
    /// says why (a Warning event on it), and a Service whose labels leave a pool's scope moves out of it.
    #[test]
    fn pools_serve_only_the_namespaces_and_labels_they_are_limited_to() {
        let config = config(
            "addressPools:\n  - {name: shop, addresses: [127.60.0.1/32], namespaces: [ns], serviceSelector: {matchLabels: {tier: edge}}}\n  - {name: rest, addresses: [127.61.0.1-127.61.0.2], namespaces: [ns, other]}\n",
        );
        let mut allocations = Allocations::default();
        let allocate = |allocations: &mut Allocations, key: &str, service: &Service| {
            allocate_for(allocations, &config, key, service)
        };
        let edge = |namespace: &str, extra: serde_json::Value| {
            let mut patch =
                json!({"metadata": {"namespace": namespace, "labels": {"tier": "edge"}}});
            merge(&mut patch, extra);
            svc(patch)
        };
        // The first pool serves labelled Services of ns; an unlabelled one gets the next pool.
        assert_eq!(
            allocate(&mut allocations, "ns/a", &edge("ns", json!({}))).unwrap(),
            ips(&["127.60.0.1"])
        );
        assert_eq!(
            allocate(&mut allocations, "ns/b", &svc(json!({}))).unwrap(),
            ips(&["127.61.0.1"])
        );
        // Another namespace: not the first pool even by name or address, and no pool at all from a
        // namespace neither serves.
        assert_eq!(
            allocate(
                &mut allocations,
                "other/c",
                &edge(
                    "other",
                    json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "shop"}}})
                )
            )
            .unwrap_err(),
            "local.ccm.rs/address-pool: pool \"shop\" serves the namespaces ns only, and this Service is in namespace \"other\", labels tier=edge"
        );
        assert_eq!(
            allocate(
                &mut allocations,
                "other/c",
                &edge("other", json!({"spec": {"loadBalancerIP": "127.60.0.1"}}))
            )
            .unwrap_err(),
            "the requested address 127.60.0.1 is in pool \"shop\", which this Service may not use: pool \"shop\" serves the namespaces ns only"
        );
        assert_eq!(
            allocate(&mut allocations, "far/d", &edge("far", json!({}))).unwrap_err(),
            "no address pool with IPv4 addresses serves this Service (namespace \"far\", labels tier=edge): pool \"shop\" serves the namespaces ns only; pool \"rest\" serves the namespaces ns, other only"
        );
        assert!(!allocations.services.contains_key("far/d"));
        // A Service whose labels no longer match leaves the pool for one that serves it.
        assert_eq!(
            allocate(
                &mut allocations,
                "ns/a",
                &svc(json!({"metadata": {"namespace": "ns"}}))
            )
            .unwrap(),
            ips(&["127.61.0.2"])
        );
        assert!(
            !allocations
                .owners
                .contains_key(&"127.60.0.1".parse().unwrap())
        );
    }

    /// Issue #30: a Service that names no pool takes the pool with the lowest priority number that
    /// serves it and has a free address, then the next; the pools without a priority come last, in the
    /// file's order; sharers meet in the preferred pool; a named pool is taken whatever its priority.
    #[test]
    fn pools_are_tried_by_priority_then_in_the_files_order() {
        let config = config(
            "addressPools:\n  - {name: plain, addresses: [127.62.0.1/32]}\n  - {name: second, addresses: [127.63.0.1/32], priority: 20}\n  - {name: first, addresses: [127.64.0.1/32], priority: 10, namespaces: [ns]}\n  - {name: last, addresses: [127.65.0.1/32]}\n",
        );
        assert_eq!(
            config
                .pools_by_preference()
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["first", "second", "plain", "last"]
        );
        let mut allocations = Allocations::default();
        let in_ns = |extra: serde_json::Value| {
            let mut patch = json!({"metadata": {"namespace": "ns"}});
            merge(&mut patch, extra);
            svc(patch)
        };
        let cases = [
            // The first pool serves ns only: another namespace starts at the second.
            (
                "other/a",
                svc(json!({"metadata": {"namespace": "other"}})),
                "127.63.0.1",
            ),
            ("ns/b", in_ns(json!({})), "127.64.0.1"),
            // Both prioritized pools are full: the file's order.
            ("ns/c", in_ns(json!({})), "127.62.0.1"),
            ("ns/d", in_ns(json!({})), "127.65.0.1"),
        ];
        for (key, service, want) in &cases {
            assert_eq!(
                allocate_for(&mut allocations, &config, key, service).unwrap(),
                ips(&[want]),
                "{key}"
            );
        }
        // A Service that names a pool gets that pool only, whatever its rank (here: full).
        let named = in_ns(json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "plain"}}}));
        assert!(allocate_for(&mut allocations, &config, "ns/e", &named).is_err());
        // 0, which MetalLB reads as "none", is refused rather than taken as the first.
        let err = Config::parse(
            "addressPools: [{name: zero, addresses: [127.66.0.1/32], priority: 0}]\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("pool \"zero\": priority 0 is ambiguous"),
            "{err}"
        );
        let mut sharers = Allocations::default();
        let shared = |port: u16| {
            in_ns(json!({
                "metadata": {"annotations": {ANNOTATION_ALLOW_SHARED_IP: "k"}},
                "spec": {"ports": [{"port": port, "protocol": "TCP", "nodePort": 30000 + port}]}
            }))
        };
        assert_eq!(
            allocate_for(
                &mut sharers,
                &config,
                "ns/x",
                &svc(json!({"metadata": {"namespace": "ns"}}))
            )
            .unwrap(),
            ips(&["127.64.0.1"]),
            "an unshared Service takes the first pool"
        );
        assert_eq!(
            allocate_for(&mut sharers, &config, "ns/f", &shared(81)).unwrap(),
            ips(&["127.63.0.1"]),
            "a sharer cannot join an unshared Service: the next pool"
        );
        assert_eq!(
            allocate_for(&mut sharers, &config, "ns/g", &shared(82)).unwrap(),
            ips(&["127.63.0.1"]),
            "the second sharer meets the first"
        );
    }

    /// Issue #28: a manager serving `--load-balancer-class` keeps its classed Services' addresses over
    /// a restart, and addresses another implementation's Services hold in this cloud's pools are not
    /// handed out; what such a Service holds elsewhere is none of this cloud's business.
    #[test]
    fn the_addresses_reserved_at_start() {
        let config = config(DUAL_POOLS);
        let with = |patch: serde_json::Value, ips_: &[&str]| {
            let mut s = svc(patch);
            s.status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        ips_.iter()
                            .map(|ip| LoadBalancerIngress {
                                ip: Some(ip.to_string()),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            });
            s
        };
        let classed = json!({"spec": {"loadBalancerClass": "example.com/other"}});
        for (service, expected) in [
            (with(json!({}), &["127.50.0.2"][..]), &["127.50.0.2"][..]),
            (
                with(classed.clone(), &["127.51.0.1", "10.9.9.9"]),
                &["127.51.0.1"],
            ),
            (
                with(
                    json!({"metadata": {"finalizers": [CLEANUP_FINALIZER]}, "spec": {"loadBalancerClass": "x"}}),
                    &["10.9.9.9"],
                ),
                &["10.9.9.9"],
            ),
            (
                with(json!({"spec": {"type": "ClusterIP"}}), &["127.50.0.4"]),
                &[],
            ),
        ] {
            assert_eq!(
                addresses_to_reserve(&service, &config),
                ips(expected),
                "{:?}",
                service.spec
            );
        }
    }

    #[test]
    fn a_restart_keeps_published_and_reserved_addresses() {
        let config = config(DUAL_POOLS);
        let mut allocations = Allocations::default();
        let mut published = svc(json!({}));
        published.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("127.50.0.2".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        // Reserved at start: another Service cannot get it.
        allocations.reserve(
            &config,
            "ns/web",
            Some("u1"),
            &ips(&["127.50.0.2"]),
            None,
            DataPath::Proxy,
        );
        let other = svc(json!({"metadata": {"name": "other", "uid": "u2"}}));
        let wanted = read_service(&other, &config).unwrap();
        assert_eq!(
            allocations
                .allocate(&config, "ns/other", Some("u2"), &wanted, &[])
                .unwrap(),
            ips(&["127.50.0.1"])
        );
        let wanted = read_service(&published, &config).unwrap();
        assert_eq!(
            allocations
                .allocate(
                    &config,
                    "ns/web",
                    Some("u1"),
                    &wanted,
                    &published_ips(&published)
                )
                .unwrap(),
            ips(&["127.50.0.2"])
        );
        // Without the reservation (initialize not run), the status alone keeps the address.
        let mut fresh = Allocations::default();
        assert_eq!(
            fresh
                .allocate(
                    &config,
                    "ns/web",
                    Some("u1"),
                    &wanted,
                    &published_ips(&published)
                )
                .unwrap(),
            ips(&["127.50.0.2"])
        );
    }

    #[test]
    fn the_spec_has_a_listener_per_vip_and_port_and_the_nodes_internal_ips() {
        let service = dual("RequireDualStack", &["IPv4", "IPv6"]);
        let wanted = read_service(&service, &config(DUAL_POOLS)).unwrap();
        let node = |name: &str, ips: &[&str]| -> (String, Vec<IpAddr>) {
            (name.to_owned(), self::ips(ips))
        };
        let spec = build_spec(
            "ns/web",
            &ips(&["127.50.0.1", "fd00:50::1"]),
            &wanted,
            &[
                node("n2", &["127.0.2.1", "fd00::2"]),
                node("n1", &["127.0.1.1"]),
                node("n3", &[]),
            ],
        );
        assert_eq!(spec.listeners.len(), 2);
        assert_eq!(spec.listeners[0].to_string(), "127.50.0.1:8080/TCP");
        assert_eq!(spec.listeners[1].to_string(), "[fd00:50::1]:8080/TCP");
        let backends: Vec<String> = spec
            .backends
            .iter()
            .map(|b| format!("{}={}", b.node, b.address))
            .collect();
        assert_eq!(backends, ["n1=127.0.1.1", "n2=127.0.2.1", "n2=fd00::2"]);
    }

    fn adopted_node(name: &str, ip: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
            }))
            .unwrap(),
        )
    }

    fn applied(cloud: &LocalCloud) -> Option<LoadBalancerSpec> {
        lock(&cloud.inner.load_balancers)
            .services
            .get("ns/web")
            .and_then(|r| r.applied.clone())
    }

    /// The node sync hands `update_load_balancer` the copy of the Service it last synced: it may be
    /// older than the last ensure, or than the Service's deletion.
    #[tokio::test]
    async fn load_balancers_are_listed_by_their_service_s_uid_and_an_orphan_deleted() {
        let cloud = LocalCloud::new(Config::default(), None);
        let web = svc(
            json!({"spec": {"ports": [{"port": 18778, "nodePort": 30778, "protocol": "TCP"}]}}),
        );
        cloud
            .ensure_load_balancer("c", &web, &[adopted_node("n1", "127.0.9.1")])
            .await
            .unwrap();
        let listed = cloud.list_load_balancers("c").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, cloud.get_load_balancer_name("c", &web));
        let reference = listed[0].service.clone().unwrap();
        assert_eq!(
            (reference.namespace.as_str(), reference.name.as_str()),
            (
                web.metadata.namespace.as_deref().unwrap_or("default"),
                web.metadata.name.as_deref().unwrap()
            )
        );
        cloud
            .delete_orphaned_load_balancer("c", &listed[0])
            .await
            .unwrap();
        assert!(cloud.list_load_balancers("c").await.unwrap().is_empty());
        assert!(
            applied(&cloud).is_none(),
            "the data plane no longer runs it"
        );
    }

    #[tokio::test]
    async fn with_node_agents_the_manager_only_assigns_addresses_and_reports_the_data_path() {
        let agents = config("loadBalancer: {mode: agents}\n");
        let cloud = LocalCloud::new(agents.clone(), None);
        let proxied = svc(
            json!({"spec": {"ports": [{"port": 18778, "nodePort": 30778, "protocol": "TCP"}]}}),
        );
        let direct = svc(json!({
            "metadata": {"name": "direct", "annotations": {ANNOTATION_DATA_PATH: "kube-proxy"}},
            "spec": {"ports": [{"port": 18779, "nodePort": 30779, "protocol": "TCP"}]}
        }));
        let node = adopted_node("n1", "127.0.9.1");
        let mode = |status: &LoadBalancerStatus| {
            status.ingress.as_ref().unwrap()[0].ip_mode.clone().unwrap()
        };
        let status = cloud
            .ensure_load_balancer("c", &proxied, std::slice::from_ref(&node))
            .await
            .unwrap();
        assert_eq!(mode(&status), "Proxy");
        let status = cloud
            .ensure_load_balancer("c", &direct, std::slice::from_ref(&node))
            .await
            .unwrap();
        assert_eq!(mode(&status), "VIP");
        // Nothing bound here: the agents serve.
        assert_eq!(cloud.data_plane_applies(), 0);
        assert!(cloud.data_plane().names().is_empty());
        cloud
            .update_load_balancer("c", &proxied, std::slice::from_ref(&node))
            .await
            .unwrap();
        assert_eq!(cloud.data_plane_applies(), 0);
        assert!(matches!(
            cloud
                .preview_load_balancer("c", &proxied, &[node])
                .await
                .unwrap(),
            LoadBalancerPreview::UpToDate
        ));

        // What is refused, and where.
        let leader = Config::default();
        let err = read_service(&direct, &leader).unwrap_err();
        assert!(
            err.contains("kube-proxy needs loadBalancer.mode: agents"),
            "{err}"
        );
        let both = svc(json!({"metadata": {"annotations": {
            ANNOTATION_DATA_PATH: "kube-proxy", ANNOTATION_PROXY_PROTOCOL: "v2"}}}));
        let err = read_service(&both, &agents).unwrap_err();
        assert!(err.contains("kube-proxy sends no PROXY header"), "{err}");
        let bogus = svc(json!({"metadata": {"annotations": {ANNOTATION_DATA_PATH: "ebpf"}}}));
        let err = read_service(&bogus, &agents).unwrap_err();
        assert!(
            err.contains("local.ccm.rs/data-path: \"ebpf\" is not valid"),
            "{err}"
        );
        // The leader mode's interface cannot go with the agents.
        let err = Config::parse("loadBalancer: {mode: agents, vipInterface: eth0}\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("vipInterface is the leader mode's"), "{err}");
        // Where the agents' heartbeats are: kube-system unless said; said, only with the agents.
        assert_eq!(agents.load_balancer.agent_namespace(), "kube-system");
        let elsewhere = Config::parse(
            "loadBalancer: {mode: agents, agentNamespace: lb-system}\n",
            None,
        )
        .unwrap();
        assert_eq!(elsewhere.load_balancer.agent_namespace(), "lb-system");
        for (yaml, why) in [
            (
                "loadBalancer: {agentNamespace: lb-system}\n",
                "loadBalancer.agentNamespace is the agents mode's",
            ),
            (
                "loadBalancer: {mode: agents, agentNamespace: LB}\n",
                "loadBalancer.agentNamespace: \"LB\" is not a namespace's name",
            ),
        ] {
            let err = Config::parse(yaml, None).unwrap_err().to_string();
            assert!(err.contains(why), "{yaml}: {err}");
        }
    }

    #[tokio::test]
    async fn an_update_changes_only_backends_and_never_revives_a_deleted_load_balancer() {
        let cloud = LocalCloud::new(Config::default(), None);
        let old = svc(
            json!({"spec": {"ports": [{"port": 18777, "nodePort": 30777, "protocol": "TCP"}]}}),
        );
        let new = svc(json!({"spec": {
            "ports": [{"port": 18777, "nodePort": 30777, "protocol": "TCP"}],
            "loadBalancerSourceRanges": ["10.0.0.0/8"]
        }}));
        let n1 = adopted_node("n1", "127.0.9.1");
        let n2 = adopted_node("n2", "127.0.9.2");
        cloud
            .ensure_load_balancer("c", &new, std::slice::from_ref(&n1))
            .await
            .unwrap();
        let ranges = applied(&cloud).unwrap().source_ranges;
        assert_eq!(ranges, vec!["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]);

        // A stale copy without source ranges: the backends change, the ranges stay.
        cloud
            .update_load_balancer("c", &old, &[n1.clone(), n2.clone()])
            .await
            .unwrap();
        let spec = applied(&cloud).unwrap();
        assert_eq!(
            spec.source_ranges, ranges,
            "a stale update loosened the source ranges"
        );
        assert_eq!(spec.backends.len(), 2);
        // The same backends again: no data-plane call.
        let applies = cloud
            .inner
            .applies
            .load(std::sync::atomic::Ordering::Relaxed);
        cloud
            .update_load_balancer("c", &old, &[n2.clone(), n1.clone()])
            .await
            .unwrap();
        assert_eq!(
            cloud
                .inner
                .applies
                .load(std::sync::atomic::Ordering::Relaxed),
            applies
        );

        // After the delete, an update still in flight creates nothing.
        cloud.ensure_load_balancer_deleted("c", &new).await.unwrap();
        cloud.update_load_balancer("c", &old, &[n1]).await.unwrap();
        assert!(cloud.get_load_balancer("c", &new).await.unwrap().is_none());
        assert!(cloud.data_plane().state("ns/web").is_none());
        assert!(applied(&cloud).is_none());
    }

    /// Issue #28, drift: the preview says what an ensure would change (nothing; a listener the data
    /// plane lost; backends; a setting), and an ensure puts a lost listener back.
    #[tokio::test]
    async fn a_listener_lost_out_of_band_is_previewed_and_put_back() {
        let cloud = LocalCloud::new(Config::default(), None);
        let web = svc(
            json!({"spec": {"ports": [{"port": 18779, "nodePort": 30779, "protocol": "TCP"}]}}),
        );
        let n1 = adopted_node("n1", "127.0.9.1");
        let n2 = adopted_node("n2", "127.0.9.2");
        let preview = |nodes: Vec<Arc<Node>>| {
            let cloud = &cloud;
            let web = &web;
            async move { cloud.preview_load_balancer("c", web, &nodes).await.unwrap() }
        };
        assert_eq!(
            preview(vec![n1.clone()]).await,
            LoadBalancerPreview::Create {
                backends: vec!["n1".into()]
            }
        );
        cloud
            .ensure_load_balancer("c", &web, std::slice::from_ref(&n1))
            .await
            .unwrap();
        assert_eq!(
            preview(vec![n1.clone()]).await,
            LoadBalancerPreview::UpToDate
        );
        match preview(vec![n1.clone(), n2.clone()]).await {
            LoadBalancerPreview::Change {
                backends_added,
                backends_removed,
                detail,
            } => {
                assert_eq!(backends_added, ["n2"]);
                assert!(backends_removed.is_empty());
                assert!(detail.is_empty(), "{detail}");
            }
            other => panic!("{other:?}"),
        }

        // The data plane loses the load balancer (as a crash of its listeners would).
        cloud.data_plane().remove("ns/web").await;
        match preview(vec![n1.clone()]).await {
            LoadBalancerPreview::Change { detail, .. } => assert_eq!(
                detail, "the data plane runs no load balancer for it",
                "{detail}"
            ),
            other => panic!("{other:?}"),
        }
        cloud
            .ensure_load_balancer("c", &web, std::slice::from_ref(&n1))
            .await
            .unwrap();
        let running = cloud.data_plane().state("ns/web").expect("running again");
        assert_eq!(running.listeners.len(), 1);
        assert_eq!(
            preview(vec![n1.clone()]).await,
            LoadBalancerPreview::UpToDate
        );

        // A setting of the Service that differs from what runs.
        let ranged = svc(json!({"spec": {
            "ports": [{"port": 18779, "nodePort": 30779, "protocol": "TCP"}],
            "loadBalancerSourceRanges": ["10.0.0.0/8"]
        }}));
        match cloud
            .preview_load_balancer("c", &ranged, std::slice::from_ref(&n1))
            .await
            .unwrap()
        {
            LoadBalancerPreview::Change { detail, .. } => {
                assert_eq!(detail, "the source ranges would change")
            }
            other => panic!("{other:?}"),
        }

        // Issue #30: its pool limited to another namespace: its address would change.
        let vip = cloud.get_load_balancer("c", &web).await.unwrap().unwrap();
        let vip = vip.ingress.unwrap()[0].ip.clone().unwrap();
        cloud.set_config(config(
            "addressPools: [{name: default, addresses: [127.240.0.0/16], namespaces: [elsewhere]}]\n",
        ));
        match preview(vec![n1.clone()]).await {
            LoadBalancerPreview::Change { detail, .. } => assert_eq!(
                detail,
                format!(
                    "the address {vip} would change: pool \"default\" serves the namespaces elsewhere only"
                )
            ),
            other => panic!("{other:?}"),
        }
        cloud.ensure_load_balancer_deleted("c", &web).await.unwrap();
    }

    /// On a real interface (so this needs root, as CI runs). The pool is in TEST-NET-2: 192.0.2.0/24 is
    /// the network of CI's own machine.
    #[tokio::test]
    async fn with_a_vip_interface_vips_go_on_it_and_come_off_with_their_load_balancer() {
        use crate::addresses::test_interface::TestInterface;
        let interface = TestInterface::create("l");
        let cloud = LocalCloud::new(
            config(&format!(
                "addressPools: [{{name: lan, addresses: [198.51.100.0/29]}}]\nloadBalancer: {{vipInterface: {}}}\n",
                interface.name()
            )),
            None,
        );
        let service = svc(
            json!({"spec": {"ports": [{"port": 18443, "nodePort": 30443, "protocol": "TCP"}]}}),
        );
        let vip: IpAddr = "198.51.100.1".parse().unwrap();
        // The VIP goes on before the listener binds it (which would fail without it).
        cloud
            .ensure_load_balancer("c", &service, &[])
            .await
            .unwrap();
        assert!(interface.has(vip));
        assert!(cloud.data_plane().state("ns/web").is_some());
        cloud
            .ensure_load_balancer_deleted("c", &service)
            .await
            .unwrap();
        assert!(!interface.has(vip));
        // Loopback VIPs are never touched.
        let loopback = LocalCloud::new(
            config(&format!(
                "loadBalancer: {{vipInterface: {}}}\n",
                interface.name()
            )),
            None,
        );
        loopback
            .ensure_load_balancer("c", &service, &[])
            .await
            .unwrap();
        assert_eq!(interface.addresses(), []);
        loopback
            .ensure_load_balancer_deleted("c", &service)
            .await
            .unwrap();
    }

    /// A VIP put on `vipInterface` but not announced (a stand-in announcer fails as without
    /// `CAP_NET_RAW`) is served all the same: the ensure succeeds, and the warning is a Warning event
    /// `VIPNotAnnounced` on the Service, written with the manager's own (RBAC-limited) identity. Needs
    /// root (a real interface) and the test control plane.
    #[tokio::test]
    async fn a_vip_not_announced_is_served_and_a_warning_event_on_its_service() {
        use crate::addresses::{
            AddressManager, announce_without_cap_net_raw, test_interface::TestInterface,
        };
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
        let interface = TestInterface::create("e");
        let mut cloud = LocalCloud::new(
            config(&format!(
                "addressPools: [{{name: lan, addresses: [198.51.100.210/32]}}]\nloadBalancer: {{vipInterface: {}}}\n",
                interface.name()
            )),
            None,
        );
        std::sync::Arc::get_mut(&mut cloud.inner)
            .expect("no other handle yet")
            .addresses = Some(
            AddressManager::new(interface.name().to_owned())
                .with_announcer(announce_without_cap_net_raw),
        );
        test_control_plane::apply_shipped_rbac().await;
        let client = test_control_plane::control_plane().ccm_client().await;
        *lock(&cloud.inner.reporter) = Some((client, tokio::runtime::Handle::current()));

        let name = test_control_plane::unique_name("unannounced");
        let service = svc(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"ports": [{"port": 18445, "nodePort": 30445, "protocol": "TCP"}]}
        }));
        let vip: IpAddr = "198.51.100.210".parse().unwrap();
        let status = cloud
            .ensure_load_balancer("c", &service, &[])
            .await
            .unwrap();
        assert_eq!(
            status.ingress.unwrap()[0].ip.as_deref(),
            Some("198.51.100.210")
        );
        assert!(interface.has(vip));
        assert!(
            cloud
                .data_plane()
                .state(&format!("default/{name}"))
                .is_some()
        );

        let admin = test_control_plane::control_plane().admin_client().await;
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin, "default");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let event = loop {
            let found = events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(crate::EVENT_VIP_NOT_ANNOUNCED)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(name.as_str())
                });
            if let Some(event) = found {
                break event;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no VIPNotAnnounced event on Service default/{name}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.action.as_deref(), Some("AnnounceVIP"));
        let regarding = event.regarding.unwrap();
        assert_eq!(
            (regarding.kind.as_deref(), regarding.namespace.as_deref()),
            (Some("Service"), Some("default"))
        );
        assert_eq!(
            event.note.unwrap(),
            format!(
                "gratuitous ARP for 198.51.100.210 on {} not sent: Operation not permitted (CAP_NET_RAW is needed); neighbours keep the previous holder's MAC until their caches expire",
                interface.name()
            )
        );

        cloud
            .ensure_load_balancer_deleted("c", &service)
            .await
            .unwrap();
        assert!(!interface.has(vip));
    }

    #[test]
    fn spec_helpers_are_the_contracts() {
        // The Service spec default: no families → IPv4.
        let service = Service {
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let wanted = read_service(&service, &Config::default()).unwrap();
        assert_eq!(wanted.families, vec![(IpFamily::V4, true)]);
        assert!(wanted.ports.is_empty());
    }
}
