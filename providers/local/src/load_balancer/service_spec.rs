//! What a Service asks of its load balancer: the annotations (ours and MetalLB's), read and checked
//! once into a [`Wanted`] before anything changes ([`read_service`]), every refusal named.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use cloud_provider::annotations::service_annotation as annotation;
pub(crate) use cloud_provider::service_helpers::service_key;
use cloud_provider::service_helpers::{
    IpFamily, IpMode, health_check_path_port, ip_families, is_allow_all,
    load_balancer_source_ranges, port_groups, requests_only_local_traffic,
};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use local_data_plane::{HealthCheck, Protocol};

use crate::{Config, LoadBalancerMode};

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
    pub(super) fn ip_mode(self) -> IpMode {
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
    pub(super) namespace: String,
    /// The annotation's value.
    pub(super) key: String,
    /// The Service's (port, protocol) pairs: two sharing Services must have none in common.
    pub(super) ports: BTreeSet<(u16, Protocol)>,
    /// With `externalTrafficPolicy: Local`, the Service's selector (sharers must select alike).
    pub(super) local_selector: Option<BTreeMap<String, String>>,
}

/// How a refusal names `holder` (`namespace/name`) to a Service of `namespace`: by name in its own
/// namespace, never in another (a tenant learns nothing of another namespace's Services).
pub(super) fn holder_text(namespace: &str, holder: &str) -> String {
    if holder.split('/').next() == Some(namespace) {
        format!("Service {holder}")
    } else {
        "a Service of another namespace".to_owned()
    }
}

impl Sharing {
    /// Why a Service of `self` may not share an address with one of `other` (`other_name`), if it may
    /// not. `cross_namespace`: the address's pool lets Services of different namespaces share.
    pub(super) fn conflict(
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

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub(super) const DEFAULT_AFFINITY_SECONDS: i32 = 10_800;

/// What a Service asks of its load balancer, read and checked before anything changes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Wanted {
    /// IP families in order, each with whether it must be served.
    pub(super) families: Vec<(IpFamily, bool)>,
    /// Addresses asked for, by family.
    pub(super) requested: BTreeMap<IpFamily, IpAddr>,
    pub(super) pool: Option<String>,
    /// The Service's namespace and labels, which a pool may be limited to.
    pub(super) namespace: String,
    /// The labels of the Service's namespace, read only when a pool selects namespaces by label
    /// ([`LocalCloud::namespace_labels`]); else none.
    pub(super) namespace_labels: BTreeMap<String, String>,
    pub(super) labels: BTreeMap<String, String>,
    /// (port, protocol, node port), sorted.
    pub(super) ports: Vec<(u16, Protocol, u16)>,
    pub(super) health_check: Option<HealthCheck>,
    pub(super) session_affinity: Option<Duration>,
    pub(super) source_ranges: Vec<ipnet::IpNet>,
    pub(super) proxy_protocol: bool,
    pub(crate) data_path: DataPath,
    pub(super) sharing: Option<Sharing>,
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
pub(super) const METALLB_OUTPUT_ANNOTATION: &str = "ip-allocated-from-pool";

/// The reason of the Normal event on a Service taken over from MetalLB at the manager's start: it
/// keeps its addresses.
pub const EVENT_TAKEN_OVER: &str = "TakenOverFromMetalLB";

/// The value of `ours` or of one of MetalLB's spellings of it (with the key it was found under); two
/// spellings with different values are refused, naming both. A MetalLB annotation that is no
/// spelling of ours is refused by name.
pub(super) fn annotation_or_metallb<'a>(
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
pub(super) fn unread_metallb_annotation(service: &Service) -> Option<&str> {
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
    let families = families_of(service, &spec)?;
    refuse_unread_metallb_annotations(service)?;
    let requested = requested_addresses(service, &spec, &families)?;
    let pool = pool_of(service, config)?;
    let proxy_protocol = proxy_protocol_of(service)?;
    let data_path = data_path_of(service, config, proxy_protocol)?;
    let ports = ports_of(service, data_path)?;
    let health_check = health_check_of(service, config)?;
    let session_affinity = session_affinity_of(&spec);
    let source_ranges = source_ranges_of(service)?;
    let sharing = sharing_of(service, &spec, &ports)?;
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

/// The Service's IP families in order, each with whether it must be served (`ipFamilyPolicy`).
fn families_of(service: &Service, spec: &ServiceSpec) -> Result<Vec<(IpFamily, bool)>, String> {
    let mut families = ip_families(service).map_err(|e| e.to_string())?;
    if families.is_empty() {
        families.push(IpFamily::V4);
    }
    let policy = spec.ip_family_policy.as_deref().unwrap_or("SingleStack");
    if policy == "SingleStack" {
        families.truncate(1);
    }
    Ok(families
        .iter()
        .enumerate()
        .map(|(i, f)| (*f, i == 0 || policy == "RequireDualStack"))
        .collect())
}

/// Refuses a MetalLB annotation this provider does not read, naming those it reads.
fn refuse_unread_metallb_annotations(service: &Service) -> Result<(), String> {
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
    Ok(())
}

/// The addresses asked for (`local.ccm.rs/load-balancer-ips`, MetalLB's, or `spec.loadBalancerIP`), at
/// most one per family and each of a family the Service has.
fn requested_addresses(
    service: &Service,
    spec: &ServiceSpec,
    families: &[(IpFamily, bool)],
) -> Result<BTreeMap<IpFamily, IpAddr>, String> {
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
    Ok(requested)
}

/// The address pool asked for, which must exist.
fn pool_of(service: &Service, config: &Config) -> Result<Option<String>, String> {
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
    Ok(pool)
}

/// (port, protocol, node port) of every Service port, sorted; TCP and UDP only. The `proxy` data path
/// forwards to the node ports, so each must have one; with `kube-proxy` none is needed
/// (`allocateLoadBalancerNodePorts: false`, as MetalLB's users set it at scale) and a missing one is 0.
fn ports_of(service: &Service, data_path: DataPath) -> Result<Vec<(u16, Protocol, u16)>, String> {
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
            let node_port = match u16::try_from(*node_port).ok().filter(|p| *p != 0) {
                Some(node_port) => node_port,
                None if data_path == DataPath::KubeProxy => 0,
                None => {
                    return Err(format!(
                        "spec.ports: port {port}/{protocol} has no node port (the local data plane \
                         forwards to node ports; is allocateLoadBalancerNodePorts false? With the \
                         node agents, {ANNOTATION_DATA_PATH}: kube-proxy needs none)"
                    ));
                }
            };
            ports.push((port, proto, node_port));
        }
    }
    ports.sort();
    Ok(ports)
}

/// The backends' health check: the Service's own with `externalTrafficPolicy: Local`, else kube-proxy's
/// (unless turned off).
fn health_check_of(service: &Service, config: &Config) -> Result<Option<HealthCheck>, String> {
    Ok(if requests_only_local_traffic(service) {
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
    })
}

/// The `ClientIP` session affinity's timeout, if asked for.
fn session_affinity_of(spec: &ServiceSpec) -> Option<Duration> {
    (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        let seconds = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(DEFAULT_AFFINITY_SECONDS);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    })
}

/// The source ranges allowed; empty for all.
fn source_ranges_of(service: &Service) -> Result<Vec<ipnet::IpNet>, String> {
    let ranges = load_balancer_source_ranges(service).map_err(|e| e.to_string())?;
    Ok(if is_allow_all(&ranges) {
        Vec::new()
    } else {
        ranges
    })
}

/// Whether a PROXY protocol v2 header is asked for.
fn proxy_protocol_of(service: &Service) -> Result<bool, String> {
    match annotation(service, ANNOTATION_PROXY_PROTOCOL) {
        None => Ok(false),
        Some("v2") => Ok(true),
        Some(other) => Err(format!(
            "{ANNOTATION_PROXY_PROTOCOL}: {other:?} is not valid; the only value is \"v2\" \
                 (remove the annotation to send no PROXY header)"
        )),
    }
}

/// Who carries the traffic (`local.ccm.rs/data-path`), and what that rules out.
fn data_path_of(
    service: &Service,
    config: &Config,
    proxy_protocol: bool,
) -> Result<DataPath, String> {
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
    Ok(data_path)
}

/// How the Service may share its addresses (`local.ccm.rs/allow-shared-ip` or MetalLB's).
fn sharing_of(
    service: &Service,
    spec: &ServiceSpec,
    ports: &[(u16, Protocol, u16)],
) -> Result<Option<Sharing>, String> {
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
    Ok(sharing)
}

/// The data path a Service's status says carries its traffic: `ipMode: VIP` (kube-proxy's, as
/// MetalLB's Services and ours with `local.ccm.rs/data-path: kube-proxy` say), else the data plane's.
pub(super) fn published_data_path(service: &Service) -> DataPath {
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
