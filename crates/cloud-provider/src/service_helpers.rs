//! What almost every load-balancer provider reads from a Service, with upstream's semantics
//! (`k8s.io/cloud-provider/service/helpers`): the allowed source ranges, whether traffic stays on the
//! node (`externalTrafficPolicy: Local`) and so needs a health check, the health-check path and port,
//! the IP families in order, ingress entries with an `ipMode`, and the ports grouped by number.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service, ServiceSpec};

/// The Service's `namespace/name`, its key in logs and reports (the namespace `default` when the
/// Service names none).
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The annotation upstream reads when `spec.loadBalancerSourceRanges` is empty.
pub const ANNOTATION_LOAD_BALANCER_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// The path upstream's kube-proxy health check serves on the health-check node port.
pub const HEALTH_CHECK_PATH: &str = "/healthz";

/// Why the source ranges of a Service cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceRangesError {
    /// An entry of `spec.loadBalancerSourceRanges` is not a CIDR.
    #[error(
        "service.Spec.LoadBalancerSourceRanges: {ranges:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24. Error msg: invalid CIDR address: {bad}"
    )]
    Spec {
        /// The field's entries.
        ranges: Vec<String>,
        /// The first entry that is not a CIDR.
        bad: String,
    },
    /// The annotation is not a comma-separated list of CIDRs.
    #[error(
        "{ANNOTATION_LOAD_BALANCER_SOURCE_RANGES}: {value} is not valid. Expecting a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24"
    )]
    Annotation {
        /// The annotation's value (trimmed).
        value: String,
    },
}

fn spec(service: &Service) -> Option<&ServiceSpec> {
    service.spec.as_ref()
}

/// Parses CIDRs as upstream's `ParseIPNets`: each trimmed, the network address kept (`10.0.0.1/24` is
/// `10.0.0.0/24`), duplicates dropped, sorted. `Err` carries the first entry that is not a CIDR.
fn parse_cidrs<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Vec<IpNet>, String> {
    let mut set = BTreeSet::new();
    for entry in entries {
        let trimmed = entry.trim();
        let net: IpNet = trimmed.parse().map_err(|_| trimmed.to_owned())?;
        set.insert(net.trunc());
    }
    Ok(set.into_iter().collect())
}

/// The source ranges the load balancer must allow: `spec.loadBalancerSourceRanges` if set, else the
/// `service.beta.kubernetes.io/load-balancer-source-ranges` annotation (comma-separated), else
/// `0.0.0.0/0` (upstream's default, IPv4 only). Upstream's error texts.
pub fn load_balancer_source_ranges(service: &Service) -> Result<Vec<IpNet>, SourceRangesError> {
    let ranges = spec(service)
        .and_then(|s| s.load_balancer_source_ranges.clone())
        .unwrap_or_default();
    if !ranges.is_empty() {
        return parse_cidrs(ranges.iter().map(String::as_str))
            .map_err(|bad| SourceRangesError::Spec { ranges, bad });
    }
    let value = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .unwrap_or("0.0.0.0/0");
    parse_cidrs(value.split(',')).map_err(|_| SourceRangesError::Annotation {
        value: value.to_owned(),
    })
}

/// Whether `ranges` allow every IPv4 source (contain `0.0.0.0/0`), as upstream's `IsAllowAll`.
pub fn is_allow_all(ranges: &[IpNet]) -> bool {
    ranges
        .iter()
        .any(|r| r.prefix_len() == 0 && r.addr().is_ipv4())
}

/// Whether the Service keeps external traffic on the node that received it
/// (`externalTrafficPolicy: Local` on a LoadBalancer or NodePort Service), so only nodes with a ready
/// endpoint may get it.
pub fn requests_only_local_traffic(service: &Service) -> bool {
    let Some(spec) = spec(service) else {
        return false;
    };
    matches!(spec.type_.as_deref(), Some("LoadBalancer" | "NodePort"))
        && spec.external_traffic_policy.as_deref() == Some("Local")
}

/// Whether the load balancer needs a health check to find the nodes with endpoints: a LoadBalancer
/// Service that requests only local traffic.
pub fn needs_health_check(service: &Service) -> bool {
    spec(service).and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && requests_only_local_traffic(service)
}

/// The health check the load balancer should run against each node: `("/healthz", healthCheckNodePort)`
/// when the Service [needs one](needs_health_check) and the API server allocated the port; `None`
/// otherwise (upstream returns `"", 0`).
pub fn health_check_path_port(service: &Service) -> Option<(&'static str, i32)> {
    if !needs_health_check(service) {
        return None;
    }
    spec(service)
        .and_then(|s| s.health_check_node_port)
        .filter(|port| *port != 0)
        .map(|port| (HEALTH_CHECK_PATH, port))
}

/// An IP family of a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

impl IpFamily {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// The API's name: `IPv4` or `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// `spec.ipFamilies` names a family the API does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service.Spec.IPFamilies: unknown IP family {0:?} (expected IPv4 or IPv6)")]
pub struct UnknownIpFamily(pub String);

/// The Service's IP families, primary first (`spec.ipFamilies`, which the API server fills in for
/// every Service with a cluster IP). Empty when unset: the provider then decides (usually IPv4).
pub fn ip_families(service: &Service) -> Result<Vec<IpFamily>, UnknownIpFamily> {
    spec(service)
        .and_then(|s| s.ip_families.as_ref())
        .map(|families| {
            families
                .iter()
                .map(|f| match f.as_str() {
                    "IPv4" => Ok(IpFamily::V4),
                    "IPv6" => Ok(IpFamily::V6),
                    other => Err(UnknownIpFamily(other.to_owned())),
                })
                .collect()
        })
        .unwrap_or_else(|| Ok(Vec::new()))
}

/// How traffic to a load-balancer IP reaches the nodes (`status.loadBalancer.ingress[].ipMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpMode {
    /// The load balancer delivers packets with the destination IP unchanged (kube-proxy may then
    /// short-circuit in-cluster traffic to the IP). The API's default.
    Vip,
    /// The load balancer proxies: packets arrive with the node's IP as destination, so in-cluster
    /// traffic to the IP must go through the load balancer.
    Proxy,
}

impl IpMode {
    /// The API's name: `VIP` or `Proxy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vip => "VIP",
            Self::Proxy => "Proxy",
        }
    }
}

/// An ingress entry for `ip` with `mode`.
pub fn ingress_for_ip(ip: IpAddr, mode: IpMode) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: Some(ip.to_string()),
        ip_mode: Some(mode.as_str().to_owned()),
        ..Default::default()
    }
}

/// One port number of a Service with every protocol it is exposed on there (a Service may expose, say,
/// DNS on 53 over TCP and UDP), and the node port of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    /// The Service port.
    pub port: i32,
    /// Protocol (`TCP`, `UDP`, `SCTP`; `TCP` when unset, as the API defaults it) → node port (0 when
    /// the Service allocates none).
    pub protocols: BTreeMap<String, i32>,
}

/// The Service's ports grouped by number, in ascending order, for load balancers that configure one
/// listener per port (with several protocols) or need to reject a mix they cannot serve.
pub fn port_groups(service: &Service) -> Vec<PortGroup> {
    let mut groups: BTreeMap<i32, BTreeMap<String, i32>> = BTreeMap::new();
    for port in spec(service)
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
    {
        groups.entry(port.port).or_default().insert(
            port.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
            port.node_port.unwrap_or(0),
        );
    }
    groups
        .into_iter()
        .map(|(port, protocols)| PortGroup { port, protocols })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ServicePort;
    use kube::api::ObjectMeta;

    use super::*;

    fn service(spec: ServiceSpec, annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    fn lb(policy: Option<&str>, health_port: Option<i32>) -> Service {
        service(
            ServiceSpec {
                type_: Some("LoadBalancer".into()),
                external_traffic_policy: policy.map(Into::into),
                health_check_node_port: health_port,
                ..Default::default()
            },
            &[],
        )
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn source_ranges_come_from_the_field_then_the_annotation_then_allow_all() {
        let annotated = |value: &str| {
            service(
                ServiceSpec::default(),
                &[(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES, value)],
            )
        };
        assert_eq!(
            load_balancer_source_ranges(&Service::default()),
            Ok(nets(&["0.0.0.0/0"]))
        );
        assert_eq!(
            load_balancer_source_ranges(&annotated("  ")),
            Ok(nets(&["0.0.0.0/0"]))
        );
        assert_eq!(
            load_balancer_source_ranges(&annotated(" 192.168.2.0/24, 10.0.0.1/24,10.0.0.0/24 ")),
            Ok(nets(&["10.0.0.0/24", "192.168.2.0/24"])),
            "trimmed, masked to the network, duplicates dropped, sorted"
        );
        let both = service(
            ServiceSpec {
                load_balancer_source_ranges: Some(vec!["fd00::/64".into(), " 1.2.3.4/32".into()]),
                ..Default::default()
            },
            &[(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES, "garbage")],
        );
        assert_eq!(
            load_balancer_source_ranges(&both),
            Ok(nets(&["1.2.3.4/32", "fd00::/64"])),
            "the field wins over the annotation"
        );
    }

    #[test]
    fn bad_source_ranges_get_upstream_s_messages() {
        let err = load_balancer_source_ranges(&service(
            ServiceSpec::default(),
            &[(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES, "10.0.0.0/24,nope")],
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "service.beta.kubernetes.io/load-balancer-source-ranges: 10.0.0.0/24,nope is not valid. Expecting a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24"
        );
        let err = load_balancer_source_ranges(&service(
            ServiceSpec {
                load_balancer_source_ranges: Some(vec!["10.0.0.0/24".into(), "10.0.0.1".into()]),
                ..Default::default()
            },
            &[],
        ))
        .unwrap_err();
        assert_eq!(
            err,
            SourceRangesError::Spec {
                ranges: vec!["10.0.0.0/24".into(), "10.0.0.1".into()],
                bad: "10.0.0.1".into()
            }
        );
        assert!(err.to_string().starts_with(
            "service.Spec.LoadBalancerSourceRanges: [\"10.0.0.0/24\", \"10.0.0.1\"] is not valid"
        ));
    }

    #[test]
    fn allow_all_is_ipv4_zero_prefix_as_upstream() {
        assert!(is_allow_all(&nets(&["10.0.0.0/8", "0.0.0.0/0"])));
        assert!(!is_allow_all(&nets(&["10.0.0.0/8"])));
        assert!(
            !is_allow_all(&nets(&["::/0"])),
            "upstream checks 0.0.0.0/0 only"
        );
    }

    #[test]
    fn local_traffic_and_health_checks() {
        assert!(requests_only_local_traffic(&lb(Some("Local"), None)));
        assert!(!requests_only_local_traffic(&lb(Some("Cluster"), None)));
        assert!(!requests_only_local_traffic(&lb(None, None)));
        let node_port = service(
            ServiceSpec {
                type_: Some("NodePort".into()),
                external_traffic_policy: Some("Local".into()),
                ..Default::default()
            },
            &[],
        );
        assert!(requests_only_local_traffic(&node_port));
        assert!(!needs_health_check(&node_port), "only load balancers");
        let cluster_ip = service(
            ServiceSpec {
                type_: Some("ClusterIP".into()),
                external_traffic_policy: Some("Local".into()),
                ..Default::default()
            },
            &[],
        );
        assert!(!requests_only_local_traffic(&cluster_ip));

        assert_eq!(
            health_check_path_port(&lb(Some("Local"), Some(32000))),
            Some(("/healthz", 32000))
        );
        assert_eq!(health_check_path_port(&lb(Some("Local"), None)), None);
        assert_eq!(health_check_path_port(&lb(Some("Local"), Some(0))), None);
        assert_eq!(
            health_check_path_port(&lb(Some("Cluster"), Some(32000))),
            None
        );
    }

    #[test]
    fn ip_families_in_order_and_unknown_ones_refused() {
        let with = |families: &[&str]| {
            service(
                ServiceSpec {
                    ip_families: Some(families.iter().map(|f| f.to_string()).collect()),
                    ..Default::default()
                },
                &[],
            )
        };
        assert_eq!(
            ip_families(&with(&["IPv6", "IPv4"])),
            Ok(vec![IpFamily::V6, IpFamily::V4])
        );
        assert_eq!(ip_families(&Service::default()), Ok(vec![]));
        assert_eq!(
            ip_families(&with(&["IPv5"])).unwrap_err().to_string(),
            r#"service.Spec.IPFamilies: unknown IP family "IPv5" (expected IPv4 or IPv6)"#
        );
        assert_eq!(IpFamily::of("fd00::1".parse().unwrap()), IpFamily::V6);
        assert_eq!(IpFamily::V4.as_str(), "IPv4");
    }

    #[test]
    fn ingress_entries_carry_the_ip_mode() {
        let ingress = ingress_for_ip("203.0.113.7".parse().unwrap(), IpMode::Proxy);
        assert_eq!(ingress.ip.as_deref(), Some("203.0.113.7"));
        assert_eq!(ingress.ip_mode.as_deref(), Some("Proxy"));
        assert_eq!(
            ingress_for_ip("fd00::7".parse().unwrap(), IpMode::Vip)
                .ip_mode
                .as_deref(),
            Some("VIP")
        );
    }

    #[test]
    fn ports_are_grouped_by_number_with_their_protocols() {
        let port = |port: i32, protocol: Option<&str>, node_port: Option<i32>| ServicePort {
            port,
            protocol: protocol.map(Into::into),
            node_port,
            ..Default::default()
        };
        let svc = service(
            ServiceSpec {
                ports: Some(vec![
                    port(443, None, Some(30443)),
                    port(53, Some("UDP"), Some(30053)),
                    port(53, Some("TCP"), Some(30054)),
                ]),
                ..Default::default()
            },
            &[],
        );
        assert_eq!(
            port_groups(&svc),
            vec![
                PortGroup {
                    port: 53,
                    protocols: BTreeMap::from([("TCP".into(), 30054), ("UDP".into(), 30053)]),
                },
                PortGroup {
                    port: 443,
                    protocols: BTreeMap::from([("TCP".into(), 30443)]),
                },
            ]
        );
        assert!(port_groups(&Service::default()).is_empty());
    }
}
