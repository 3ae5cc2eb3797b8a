//! What a Service asks of its AWS load balancer, read with upstream's annotations and defaults.

use std::{collections::BTreeMap, sync::Arc};

use cloud_provider::{annotations::service_annotation, service_helpers};
use k8s_openapi::api::core::v1::{Node, Service, ServiceSpec};

use crate::{ClusterHealthProbe, Error, Global};

mod addresses;
mod attributes;
mod health_check;
mod ports;
mod tls;

use addresses::{fixed_addresses, ip_address_type};
pub use attributes::ClassicAttributes;
use attributes::{classic_attributes, cross_zone_of, proxy_protocol_of, target_group_attributes};
pub use health_check::HealthCheck;
use health_check::health_check;
use ports::{ServicePorts, ports_of};
use tls::tls;
pub use tls::{ClassicListener, Tls};

/// `service.beta.kubernetes.io/aws-load-balancer-type`: `nlb` for a Network Load Balancer.
pub const ANNOTATION_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// `…-internal`: any value but `false` makes the load balancer internal.
pub const ANNOTATION_INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
/// `…-scheme`: `internal` or `internet-facing` (the AWS Load Balancer Controller's name for it).
pub const ANNOTATION_SCHEME: &str = "service.beta.kubernetes.io/aws-load-balancer-scheme";
/// `…-subnets`: subnet IDs or `Name` tags, comma-separated.
pub const ANNOTATION_SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
/// `…-additional-resource-tags`: `k1=v1,k2=v2` added to every resource made for the Service.
pub const ANNOTATION_ADDITIONAL_TAGS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
/// `…-target-node-labels`: `k1=v1,k2=v2`; only nodes with all these labels are targets.
pub const ANNOTATION_TARGET_NODE_LABELS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
/// `…-cross-zone-load-balancing-enabled`: `true` or `false`.
pub const ANNOTATION_CROSS_ZONE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
/// `…-healthcheck-protocol`: `TCP`, `HTTP` or `HTTPS` (NLB; Classic: `TCP`, `HTTP`, `HTTPS`, `SSL`).
pub const ANNOTATION_HC_PROTOCOL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
/// `…-healthcheck-port`: a port number or `traffic-port`.
pub const ANNOTATION_HC_PORT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
/// `…-healthcheck-path`: the HTTP(S) path.
pub const ANNOTATION_HC_PATH: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
/// `…-healthcheck-interval`: seconds.
pub const ANNOTATION_HC_INTERVAL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
/// `…-healthcheck-timeout`: seconds.
pub const ANNOTATION_HC_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
/// `…-healthcheck-healthy-threshold`.
pub const ANNOTATION_HC_HEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
/// `…-healthcheck-unhealthy-threshold`.
pub const ANNOTATION_HC_UNHEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
/// `…-security-groups`: use these groups instead of creating one (Classic ELB).
pub const ANNOTATION_SECURITY_GROUPS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-security-groups";
/// `…-extra-security-groups`: groups added to the created one (Classic ELB).
pub const ANNOTATION_EXTRA_SECURITY_GROUPS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";

/// `…-ssl-cert`: the ACM or IAM certificate ARN of TLS listeners.
pub const ANNOTATION_SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
/// `…-ssl-ports`: which ports (numbers or names, comma-separated; `*` or unset: all) terminate TLS.
pub const ANNOTATION_SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
/// `…-ssl-negotiation-policy`: the TLS policy of the TLS listeners (AWS's default when unset).
pub const ANNOTATION_SSL_POLICY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
/// `…-backend-protocol`: `http`, `https`, `ssl` or `tcp`, the protocol to the nodes.
pub const ANNOTATION_BACKEND_PROTOCOL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";
/// `…-eip-allocations`: Elastic IP allocation IDs, one per subnet, for an internet-facing NLB.
pub const ANNOTATION_EIP_ALLOCATIONS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
/// `…-private-ipv4-addresses`: private IPv4 addresses, one per subnet, for an internal NLB.
pub const ANNOTATION_PRIVATE_IPV4_ADDRESSES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses";
/// `…-ip-address-type`: `ipv4` or `dualstack` (NLB; the AWS Load Balancer Controller's annotation,
/// which cloud-provider-aws has an open request for, kubernetes/cloud-provider-aws#1219).
pub const ANNOTATION_IP_ADDRESS_TYPE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";
/// The values `backend-protocol` takes, with the listener protocol each gives a TLS port of a Classic
/// ELB (upstream's `backendProtocolMapping`).
const BACKEND_PROTOCOLS: [(&str, &str); 4] = [
    ("https", "https"),
    ("http", "https"),
    ("ssl", "ssl"),
    ("tcp", "ssl"),
];

/// `…-access-log-enabled`: `true`/`false` (Classic ELB).
pub const ANNOTATION_ACCESS_LOG_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
/// `…-access-log-emit-interval`: minutes, 5 or 60 (Classic ELB).
pub const ANNOTATION_ACCESS_LOG_INTERVAL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval";
/// `…-access-log-s3-bucket-name` (Classic ELB).
pub const ANNOTATION_ACCESS_LOG_BUCKET: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name";
/// `…-access-log-s3-bucket-prefix` (Classic ELB).
pub const ANNOTATION_ACCESS_LOG_PREFIX: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix";
/// `…-connection-draining-enabled`: `true`/`false` (Classic ELB).
pub const ANNOTATION_DRAINING_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled";
/// `…-connection-draining-timeout`: seconds (Classic ELB).
pub const ANNOTATION_DRAINING_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout";
/// `…-connection-idle-timeout`: seconds (Classic ELB).
pub const ANNOTATION_IDLE_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";

/// `…-proxy-protocol`: `*` puts PROXY protocol on every backend of a Classic ELB.
pub const ANNOTATION_PROXY_PROTOCOL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
/// `…-target-group-attributes`: `preserve_client_ip.enabled=…,proxy_protocol_v2.enabled=…` (NLB).
pub const ANNOTATION_TARGET_GROUP_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
/// The NLB target-group attributes the annotation may set (upstream's).
pub const PRESERVE_CLIENT_IP: &str = "preserve_client_ip.enabled";
/// See [`PRESERVE_CLIENT_IP`].
pub const PROXY_PROTOCOL_V2: &str = "proxy_protocol_v2.enabled";

/// The tag key prefix that marks a resource as the cluster's: `kubernetes.io/cluster/<id>`.
pub const TAG_CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";
/// The tag holding the Service's `namespace/name`.
pub const TAG_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// Classic ELB or NLB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A Classic Load Balancer (the default).
    Classic,
    /// A Network Load Balancer (`aws-load-balancer-type: nlb`).
    Nlb,
}

/// One Service port with its node port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Port {
    /// The Service (listener) port.
    pub port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The node port traffic goes to.
    pub node_port: i32,
}

/// Everything read from the Service.
#[derive(Debug, Clone)]
pub struct LbSpec {
    /// `namespace/name`.
    pub service_name: String,
    /// The load balancer's name (`a` + the UID without dashes, 32 characters).
    pub name: String,
    /// Classic or NLB.
    pub kind: Kind,
    /// Internal (else internet-facing).
    pub internal: bool,
    /// The ports, by port number.
    pub ports: Vec<Port>,
    /// The health check.
    pub health_check: HealthCheck,
    /// The client CIDRs allowed.
    pub source_ranges: Vec<String>,
    /// Tags for every resource: the cluster's, the Service's name and the additional ones.
    pub tags: BTreeMap<String, String>,
    /// Only nodes with all these labels are targets.
    pub target_node_labels: BTreeMap<String, String>,
    /// Cross-zone load balancing, when the annotation sets it.
    pub cross_zone: Option<bool>,
    /// Subnet IDs or `Name` tags from the annotation.
    pub subnets: Vec<String>,
    /// Security groups to use instead of creating one (Classic; NLB with `NLBSecurityGroupMode =
    /// Managed`).
    pub security_groups: Vec<String>,
    /// Security groups added to ours (Classic).
    pub extra_security_groups: Vec<String>,
    /// TLS termination (`ssl-cert`, `ssl-ports`, `ssl-negotiation-policy`, `backend-protocol`).
    pub tls: Tls,
    /// A Classic ELB's attributes (access log, connection draining, idle timeout, cross-zone).
    pub classic_attributes: ClassicAttributes,
    /// PROXY protocol on every backend of a Classic ELB (`proxy-protocol: "*"`).
    pub proxy_protocol: bool,
    /// The NLB target groups' `preserve_client_ip.enabled` and `proxy_protocol_v2.enabled`: the
    /// annotation's values, else AWS's defaults for instance targets (`true`, `false`).
    pub target_group_attributes: BTreeMap<String, bool>,
    /// A dual-stack NLB (`ip-address-type: dualstack`): IPv4 and IPv6 addresses under its name, in
    /// subnets with an IPv6 CIDR. Its targets stay the nodes' IPv4 addresses: the NLB translates IPv6
    /// clients (their source becomes its own address, as AWS documents).
    pub dual_stack: bool,
    /// The NLB's Elastic IPs (`eip-allocations`), one per subnet, in subnet order; fixed at creation.
    pub eip_allocations: Vec<String>,
    /// The NLB's private addresses (`private-ipv4-addresses`), one per subnet (each in its subnet's
    /// CIDR); fixed at creation.
    pub private_ipv4_addresses: Vec<std::net::Ipv4Addr>,
    /// The name of the NLB's own security group with `NLBSecurityGroupMode = Managed`, upstream's
    /// (which hashes the manager's `--cluster-name`, not the cluster ID): empty here, set by
    /// `LoadBalancers::spec`, which knows the cluster name.
    pub own_group_name: String,
    /// The Service's status names its load balancer already: a sync's first look-up of it is shared
    /// with the others under way. One without is looked up alone, as its look-up most likely misses,
    /// and a miss fails a shared call for all in it.
    pub provisioned: bool,
}

/// The Classic ELB attributes the annotations ask for (upstream's parsing and messages).
/// The load balancer's kind (`aws-load-balancer-type`).
fn kind_of(service: &Service, bad: &dyn Fn(&str, String) -> Error) -> Result<Kind, Error> {
    Ok(match service_annotation(service, ANNOTATION_TYPE) {
        None | Some("") | Some("classic") | Some("elb") => Kind::Classic,
        Some(t) if t.eq_ignore_ascii_case("nlb") => Kind::Nlb,
        Some("external") | Some("nlb-ip") => {
            return Err(bad(
                ANNOTATION_TYPE,
                "\"external\" and \"nlb-ip\" load balancers are implemented by the AWS Load Balancer Controller".into(),
            ));
        }
        Some(other) => {
            return Err(bad(
                ANNOTATION_TYPE,
                format!("{other:?} is not a load balancer type (nlb, or unset for Classic ELB)"),
            ));
        }
    })
}

/// Whether the load balancer is internal (`aws-load-balancer-internal`, else `aws-load-balancer-scheme`).
fn internal_of(service: &Service, bad: &dyn Fn(&str, String) -> Error) -> Result<bool, Error> {
    Ok(
        match (
            service_annotation(service, ANNOTATION_INTERNAL),
            service_annotation(service, ANNOTATION_SCHEME),
        ) {
            (Some(v), _) if !v.is_empty() => v != "false",
            (_, Some("internal")) => true,
            (_, Some("internet-facing") | None | Some("")) => false,
            (_, Some(other)) => {
                return Err(bad(
                    ANNOTATION_SCHEME,
                    format!("{other:?} is neither internal nor internet-facing"),
                ));
            }
        },
    )
}

/// Parses `k1=v1,k2=v2` as upstream's `getKeyValuePropertiesFromAnnotation` (a key alone has an empty
/// value; blanks are skipped).
pub fn key_values(value: &str) -> BTreeMap<String, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.trim().to_owned(), v.trim().to_owned()),
            None => (kv.to_owned(), String::new()),
        })
        .collect()
}

/// The label keys of `aws-load-balancer-target-node-labels`: the labels a node's place among the
/// load balancer's targets depends on.
pub fn target_node_label_keys(service: &Service) -> Vec<String> {
    target_node_labels_of(service).into_keys().collect()
}

/// The labels of `aws-load-balancer-target-node-labels` a node needs all of to be a target.
fn target_node_labels_of(service: &Service) -> BTreeMap<String, String> {
    service_annotation(service, ANNOTATION_TARGET_NODE_LABELS)
        .map(key_values)
        .unwrap_or_default()
}

fn list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Refuses `spec.loadBalancerIP`, which an AWS load balancer cannot take (upstream's message).
fn refuse_load_balancer_ip(
    spec: &ServiceSpec,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<(), Error> {
    if spec
        .load_balancer_ip
        .as_deref()
        .is_some_and(|ip| !ip.is_empty())
    {
        return Err(bad(
            "spec.loadBalancerIP",
            "LoadBalancerIP cannot be specified for AWS ELB".into(),
        ));
    }
    Ok(())
}

/// The client CIDRs allowed (`spec.loadBalancerSourceRanges`, else the annotation, else everyone).
fn source_ranges_of(
    service: &Service,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<Vec<String>, Error> {
    Ok(service_helpers::load_balancer_source_ranges(service)
        .map_err(|e| bad("spec.loadBalancerSourceRanges", e.to_string()))?
        .into_iter()
        .map(|n| n.to_string())
        .collect())
}

/// The tags of every resource made for the Service: the `additional-resource-tags`, then the
/// Service's name and the cluster's ownership over them.
fn tags_of(service: &Service, service_name: &str, cluster_id: &str) -> BTreeMap<String, String> {
    let mut tags = service_annotation(service, ANNOTATION_ADDITIONAL_TAGS)
        .map(key_values)
        .unwrap_or_default();
    tags.insert(TAG_SERVICE_NAME.to_owned(), service_name.to_owned());
    tags.insert(
        format!("{TAG_CLUSTER_PREFIX}{cluster_id}"),
        "owned".to_owned(),
    );
    tags
}

/// Whether the Service's status names a load balancer already (see [`LbSpec::provisioned`]).
fn provisioned(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|ingress| !ingress.is_empty())
}

impl LbSpec {
    /// Reads the Service; `cluster_id` names the cluster in tags, `global` is the cloud-config's
    /// `[Global]` (its health-probe mode for Services with `externalTrafficPolicy: Cluster`, its NLB
    /// security group mode).
    pub fn from_service(
        service: &Service,
        cluster_id: &str,
        name: String,
        global: &Global,
    ) -> Result<Self, Error> {
        let probe = &global.cluster_health_probe;
        let service_name = service_helpers::service_key(service);
        let bad = |field: &str, message: String| Error::Service {
            service: service_name.clone(),
            field: field.to_owned(),
            message,
        };
        let kind = kind_of(service, &bad)?;
        if let Some((annotation, message)) =
            super::annotations::refused(service, kind, global.nlb_security_group_mode)
        {
            return Err(bad(&annotation, message));
        }
        let dual_stack = ip_address_type(service, kind, &bad)?;
        let internal = internal_of(service, &bad)?;
        let spec = service.spec.clone().unwrap_or_default();
        refuse_load_balancer_ip(&spec, &bad)?;
        let ServicePorts {
            ports,
            named,
            first_listed,
        } = ports_of(&spec, kind, &bad)?;
        let source_ranges = source_ranges_of(service, &bad)?;
        let tags = tags_of(service, &service_name, cluster_id);
        let cross_zone = cross_zone_of(service, &bad)?;
        let tls = tls(service, kind, &named, &bad)?;
        let classic_attributes = classic_attributes(service, cross_zone, &bad)?;
        let proxy_protocol = proxy_protocol_of(service, &bad)?;
        let target_group_attributes = target_group_attributes(service, &ports, &bad)?;
        let (eip_allocations, private_ipv4_addresses) = fixed_addresses(service, internal, &bad)?;
        let health_check = health_check(service, kind, first_listed.as_ref(), &tls, probe, &bad)?;
        Ok(Self {
            service_name: service_name.clone(),
            name,
            kind,
            internal,
            ports,
            health_check,
            source_ranges,
            tags,
            target_node_labels: target_node_labels_of(service),
            cross_zone,
            subnets: list(service_annotation(service, ANNOTATION_SUBNETS)),
            security_groups: list(service_annotation(service, ANNOTATION_SECURITY_GROUPS)),
            extra_security_groups: list(service_annotation(
                service,
                ANNOTATION_EXTRA_SECURITY_GROUPS,
            )),
            tls,
            classic_attributes,
            proxy_protocol,
            target_group_attributes,
            dual_stack,
            eip_allocations,
            private_ipv4_addresses,
            own_group_name: String::new(),
            provisioned: provisioned(service),
        })
    }

    /// The nodes that are targets: those with every `target-node-labels` label.
    pub fn target_nodes<'a>(&self, nodes: &'a [Arc<Node>]) -> Vec<&'a Node> {
        nodes
            .iter()
            .map(|n| n.as_ref())
            .filter(|n| {
                let labels = n.metadata.labels.as_ref();
                self.target_node_labels
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            })
            .collect()
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    use super::*;

    fn service(annotations: &[(&str, &str)], local: bool) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.namespace = Some("shop".into());
        s.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            external_traffic_policy: Some(if local { "Local" } else { "Cluster" }.into()),
            health_check_node_port: local.then_some(32000),
            ports: Some(vec![
                ServicePort {
                    port: 443,
                    node_port: Some(30443),
                    ..Default::default()
                },
                ServicePort {
                    port: 80,
                    node_port: Some(30080),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        });
        s
    }

    fn spec(annotations: &[(&str, &str)], local: bool) -> Result<LbSpec, Error> {
        LbSpec::from_service(
            &service(annotations, local),
            "prod",
            "a123".into(),
            &Global::default(),
        )
    }

    #[test]
    fn defaults_are_a_public_classic_elb_with_upstreams_tags_and_tcp_check() {
        let s = spec(&[], false).unwrap();
        assert_eq!(s.kind, Kind::Classic);
        assert!(!s.internal);
        assert_eq!(
            s.ports
                .iter()
                .map(|p| (p.port, p.node_port))
                .collect::<Vec<_>>(),
            [(80, 30080), (443, 30443)]
        );
        assert_eq!(s.tags["kubernetes.io/cluster/prod"], "owned");
        assert_eq!(s.tags["kubernetes.io/service-name"], "shop/web");
        assert_eq!(s.source_ranges, ["0.0.0.0/0"]);
        assert_eq!(
            (
                s.health_check.protocol.as_str(),
                s.health_check.port.as_str()
            ),
            // The first port as listed (443), as upstream; not the lowest.
            ("TCP", "30443")
        );
        assert_eq!(
            (
                s.health_check.interval,
                s.health_check.timeout,
                s.health_check.healthy_threshold,
                s.health_check.unhealthy_threshold
            ),
            (10, 5, 2, 6)
        );
    }

    #[test]
    fn session_affinity_and_mixed_protocols_are_refused_as_upstream_refuses_them() {
        let mut s = service(&[], false);
        s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        let err = LbSpec::from_service(&s, "prod", "a".into(), &Global::default()).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("spec.sessionAffinity: unsupported load balancer affinity: ClientIP"),
            "{err}"
        );
        let mut s = service(&[(ANNOTATION_TYPE, "nlb")], false);
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("UDP".into());
        let err = LbSpec::from_service(&s, "prod", "a".into(), &Global::default()).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("mixed protocol is not supported for LoadBalancer"),
            "{err}"
        );
    }

    #[test]
    fn nlb_health_checks_follow_the_traffic_policy() {
        let s = spec(&[(ANNOTATION_TYPE, "nlb")], false).unwrap();
        assert_eq!(s.kind, Kind::Nlb);
        assert_eq!(
            s.health_check,
            HealthCheck {
                protocol: "TCP".into(),
                port: "traffic-port".into(),
                path: String::new(),
                interval: 30,
                timeout: 10,
                healthy_threshold: 3,
                unhealthy_threshold: 3
            }
        );
        let s = spec(&[(ANNOTATION_TYPE, "nlb")], true).unwrap();
        assert_eq!(
            s.health_check,
            HealthCheck {
                protocol: "HTTP".into(),
                port: "32000".into(),
                path: "/healthz".into(),
                interval: 10,
                timeout: 10,
                healthy_threshold: 2,
                unhealthy_threshold: 2
            }
        );
    }

    #[test]
    fn fixed_addresses_are_read_and_their_misuse_named() {
        let nlb = (ANNOTATION_TYPE, "nlb");
        let internal = (ANNOTATION_INTERNAL, "true");
        let s = spec(
            &[
                nlb,
                internal,
                (ANNOTATION_PRIVATE_IPV4_ADDRESSES, " 10.0.1.5, 10.0.2.5"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            s.private_ipv4_addresses,
            [
                "10.0.1.5".parse::<std::net::Ipv4Addr>().unwrap(),
                "10.0.2.5".parse().unwrap()
            ]
        );
        let s = spec(
            &[nlb, (ANNOTATION_EIP_ALLOCATIONS, "eipalloc-1,eipalloc-2")],
            false,
        )
        .unwrap();
        assert_eq!(s.eip_allocations, ["eipalloc-1", "eipalloc-2"]);
        for (annotations, expected) in [
            (
                vec![nlb, internal, (ANNOTATION_EIP_ALLOCATIONS, "eipalloc-1")],
                "eip-allocations: Elastic IPs are for an internet-facing NLB",
            ),
            (
                vec![nlb, (ANNOTATION_PRIVATE_IPV4_ADDRESSES, "10.0.1.5")],
                "private-ipv4-addresses: private IPv4 addresses are for an internal NLB",
            ),
            (
                vec![nlb, internal, (ANNOTATION_PRIVATE_IPV4_ADDRESSES, "10.0.1")],
                "\"10.0.1\" is not an IPv4 address",
            ),
            (
                vec![nlb, (ANNOTATION_EIP_ALLOCATIONS, "203.0.113.5")],
                "\"203.0.113.5\" is not an Elastic IP allocation ID",
            ),
            (
                vec![nlb, (ANNOTATION_EIP_ALLOCATIONS, "eipalloc-1,eipalloc-1")],
                "\"eipalloc-1\" is listed twice",
            ),
            (
                vec![nlb, (ANNOTATION_EIP_ALLOCATIONS, "eipalloc-1,")],
                "has an empty entry",
            ),
            (
                vec![(ANNOTATION_EIP_ALLOCATIONS, "eipalloc-1")],
                "not supported on a Classic ELB",
            ),
        ] {
            let err = spec(&annotations, false).unwrap_err().to_string();
            assert!(err.contains(expected), "{annotations:?}: {err}");
        }
    }

    #[test]
    fn ip_address_type_is_ipv4_unless_dualstack_is_asked_for() {
        let nlb = (ANNOTATION_TYPE, "nlb");
        assert!(!spec(&[nlb], false).unwrap().dual_stack);
        assert!(
            !spec(&[nlb, (ANNOTATION_IP_ADDRESS_TYPE, "ipv4")], false)
                .unwrap()
                .dual_stack
        );
        assert!(
            spec(&[nlb, (ANNOTATION_IP_ADDRESS_TYPE, "dualstack")], false)
                .unwrap()
                .dual_stack
        );
        let message = |annotations: &[(&str, &str)], families: &[&str]| {
            let mut s = service(annotations, false);
            s.spec.as_mut().unwrap().ip_families =
                Some(families.iter().map(|f| f.to_string()).collect());
            LbSpec::from_service(&s, "prod", "a".into(), &Global::default())
                .unwrap_err()
                .to_string()
        };
        for (annotations, families, expected) in [
            (
                vec![nlb, (ANNOTATION_IP_ADDRESS_TYPE, "DualStack")],
                vec!["IPv4", "IPv6"],
                "aws-load-balancer-ip-address-type: \"DualStack\" is neither ipv4 nor dualstack",
            ),
            (
                vec![(ANNOTATION_IP_ADDRESS_TYPE, "dualstack")],
                vec!["IPv4", "IPv6"],
                "not supported on a Classic ELB: a Classic ELB has IPv4 addresses only",
            ),
            (
                vec![nlb, (ANNOTATION_IP_ADDRESS_TYPE, "dualstack")],
                vec!["IPv6"],
                "spec.ipFamilies: a single-stack IPv6 Service cannot be served",
            ),
            (
                vec![],
                vec!["IPv6"],
                "a single-stack IPv6 Service cannot be served",
            ),
        ] {
            let got = message(&annotations, &families);
            assert!(
                got.contains(expected),
                "{annotations:?} {families:?}: {got}"
            );
        }
        // A dual-stack Service on an IPv4 NLB (upstream's), or dual-stack on both.
        let mut s = service(&[nlb], false);
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        assert!(
            !LbSpec::from_service(&s, "prod", "a".into(), &Global::default())
                .unwrap()
                .dual_stack
        );
    }

    /// Upstream's `buildNLBHealthCheckConfiguration` and `EnsureLoadBalancer` (Classic) with
    /// `ClusterServiceLoadBalancerHealthProbeMode = Shared`.
    #[test]
    fn the_shared_probe_checks_kube_proxy_in_upstreams_order() {
        let shared = ClusterHealthProbe::Shared {
            port: 10256,
            path: "/healthz".into(),
        };
        let global = Global {
            cluster_health_probe: shared,
            ..Global::default()
        };
        let check = |annotations: &[(&str, &str)], local: bool| {
            let hc =
                LbSpec::from_service(&service(annotations, local), "prod", "a123".into(), &global)
                    .unwrap()
                    .health_check;
            (hc.protocol, hc.port, hc.path, hc.interval)
        };
        let nlb = (ANNOTATION_TYPE, "nlb");
        let hc = |protocol: &str, port: &str, path: &str, interval: i32| {
            (protocol.into(), port.into(), path.into(), interval)
        };
        for (annotations, local, expected, why) in [
            (
                vec![nlb],
                false,
                hc("HTTP", "10256", "/healthz", 30),
                "NLB, Cluster: kube-proxy",
            ),
            (
                vec![
                    nlb,
                    (ANNOTATION_HC_PROTOCOL, "tcp"),
                    (ANNOTATION_HC_PORT, "8080"),
                    (ANNOTATION_HC_INTERVAL, "10"),
                ],
                false,
                hc("HTTP", "10256", "/healthz", 10),
                "NLB: the probe overrides protocol and port annotations, not the interval",
            ),
            (
                vec![nlb],
                true,
                hc("HTTP", "32000", "/healthz", 10),
                "NLB, Local: its own node port",
            ),
            (
                vec![],
                false,
                hc("HTTP", "10256", "/healthz", 10),
                "Classic, Cluster: kube-proxy",
            ),
            (
                vec![
                    (ANNOTATION_HC_PROTOCOL, "TCP"),
                    (ANNOTATION_HC_PORT, "8080"),
                ],
                false,
                hc("TCP", "8080", "", 10),
                "Classic: protocol and port annotations override the probe",
            ),
            (
                vec![
                    (ANNOTATION_HC_PATH, "/ready"),
                    (ANNOTATION_HC_PORT, "traffic-port"),
                ],
                false,
                hc("HTTP", "10256", "/ready", 10),
                "Classic: a path annotation overrides; traffic-port keeps the probe's port",
            ),
            (
                vec![(ANNOTATION_BACKEND_PROTOCOL, "ssl")],
                false,
                hc("HTTP", "10256", "/healthz", 10),
                "Classic: the probe wins over the SSL check of TLS backends",
            ),
            (
                vec![],
                true,
                hc("HTTP", "32000", "/healthz", 10),
                "Classic, Local: its own node port",
            ),
        ] {
            assert_eq!(check(&annotations, local), expected, "{why}");
        }
    }

    #[test]
    fn annotations_override_as_upstream() {
        let s = spec(
            &[
                (ANNOTATION_TYPE, "nlb"),
                (ANNOTATION_INTERNAL, "true"),
                (ANNOTATION_HC_PROTOCOL, "http"),
                (ANNOTATION_HC_PATH, "/ready"),
                (ANNOTATION_HC_PORT, "8080"),
                (ANNOTATION_HC_INTERVAL, "10"),
                (ANNOTATION_HC_HEALTHY, "5"),
                (ANNOTATION_ADDITIONAL_TAGS, "team=a, cost = b"),
                (ANNOTATION_TARGET_NODE_LABELS, "pool=lb"),
                (ANNOTATION_CROSS_ZONE, "true"),
                (ANNOTATION_SUBNETS, "subnet-1, public-a"),
            ],
            false,
        )
        .unwrap();
        assert!(s.internal);
        assert_eq!(
            (
                s.health_check.protocol.as_str(),
                s.health_check.path.as_str(),
                s.health_check.port.as_str()
            ),
            ("HTTP", "/ready", "8080")
        );
        assert_eq!(
            (s.health_check.interval, s.health_check.healthy_threshold),
            (10, 5)
        );
        assert_eq!(s.tags["team"], "a");
        assert_eq!(s.tags["cost"], "b");
        assert_eq!(s.target_node_labels["pool"], "lb");
        assert_eq!(s.cross_zone, Some(true));
        assert_eq!(s.subnets, ["subnet-1", "public-a"]);
        assert!(
            spec(&[(ANNOTATION_SCHEME, "internal")], false)
                .unwrap()
                .internal
        );
        assert!(
            !spec(&[(ANNOTATION_INTERNAL, "false")], false)
                .unwrap()
                .internal
        );
    }

    /// The Service with its ports named `https` (443) and `HTTP` (80), and a UDP port 53 when `udp`.
    fn named_ports(annotations: &[(&str, &str)]) -> Service {
        let mut s = service(annotations, false);
        let ports = s.spec.as_mut().unwrap().ports.as_mut().unwrap();
        ports[0].name = Some("https".into());
        ports[1].name = Some("HTTP".into());
        s
    }

    #[test]
    fn tls_ports_and_listeners_follow_upstream() {
        const CERT: &str = "arn:aws:acm:us-east-1:1:certificate/x";
        let listener = |protocol: &str, instance: &str, cert: bool| ClassicListener {
            protocol: protocol.into(),
            instance_protocol: instance.into(),
            cert: cert.then(|| CERT.to_owned()),
        };
        let port = |n: i32| Port {
            port: n,
            protocol: "TCP".into(),
            node_port: 30000 + n,
        };
        // (annotations, kind, Classic listeners of 80 and 443 / NLB protocols (listener, target) of them)
        let cases: &[(&[(&str, &str)], Kind)] = &[
            (&[], Kind::Classic),
            (&[(ANNOTATION_SSL_CERT, CERT)], Kind::Classic),
            (
                &[(ANNOTATION_SSL_CERT, CERT), (ANNOTATION_SSL_PORTS, "443")],
                Kind::Classic,
            ),
            // Classic matches the port's name lower-cased: "http" names port 80 (named HTTP).
            (
                &[(ANNOTATION_SSL_CERT, CERT), (ANNOTATION_SSL_PORTS, "http")],
                Kind::Classic,
            ),
            (
                &[
                    (ANNOTATION_SSL_CERT, CERT),
                    (ANNOTATION_BACKEND_PROTOCOL, "http"),
                ],
                Kind::Classic,
            ),
            (&[(ANNOTATION_BACKEND_PROTOCOL, "http")], Kind::Classic),
            (
                &[
                    (ANNOTATION_SSL_CERT, CERT),
                    (ANNOTATION_SSL_PORTS, "*"),
                    (ANNOTATION_BACKEND_PROTOCOL, "ssl"),
                ],
                Kind::Nlb,
            ),
            // An NLB matches names as written: "http" names nothing.
            (
                &[
                    (ANNOTATION_TYPE, "nlb"),
                    (ANNOTATION_SSL_CERT, CERT),
                    (ANNOTATION_SSL_PORTS, "http,https"),
                ],
                Kind::Nlb,
            ),
        ];
        let expected_classic = [
            [listener("TCP", "TCP", false), listener("TCP", "TCP", false)],
            [listener("SSL", "TCP", true), listener("SSL", "TCP", true)],
            [listener("TCP", "TCP", false), listener("SSL", "TCP", true)],
            [listener("SSL", "TCP", true), listener("TCP", "TCP", false)],
            [
                listener("HTTPS", "HTTP", true),
                listener("HTTPS", "HTTP", true),
            ],
            [
                listener("HTTP", "HTTP", false),
                listener("HTTP", "HTTP", false),
            ],
        ];
        let expected_nlb = [
            [("TLS", "TLS"), ("TLS", "TLS")],
            [("TCP", "TCP"), ("TLS", "TCP")],
        ];
        let (mut classic, mut nlb) = (expected_classic.iter(), expected_nlb.iter());
        for (annotations, kind) in cases {
            let mut annotations = annotations.to_vec();
            if *kind == Kind::Nlb && !annotations.iter().any(|(k, _)| *k == ANNOTATION_TYPE) {
                annotations.push((ANNOTATION_TYPE, "nlb"));
            }
            let s = LbSpec::from_service(
                &named_ports(&annotations),
                "prod",
                "a123".into(),
                &Global::default(),
            )
            .unwrap_or_else(|e| panic!("{annotations:?}: {e}"));
            match kind {
                Kind::Classic => assert_eq!(
                    [
                        s.tls.classic_listener(&port(80)),
                        s.tls.classic_listener(&port(443))
                    ],
                    *classic.next().unwrap(),
                    "{annotations:?}"
                ),
                Kind::Nlb => {
                    let got = [80, 443].map(|n| {
                        let p = port(n);
                        (
                            s.tls.nlb_listener_protocol(&p).to_owned(),
                            s.tls.nlb_target_protocol(&p).to_owned(),
                        )
                    });
                    let want = nlb
                        .next()
                        .unwrap()
                        .map(|(a, b)| (a.to_owned(), b.to_owned()));
                    assert_eq!(got, want, "{annotations:?}");
                }
            }
        }
    }

    #[test]
    fn the_classic_health_check_speaks_ssl_when_the_nodes_do() {
        for (backend, expected) in [
            ("http", "TCP"),
            ("tcp", "TCP"),
            ("https", "SSL"),
            ("ssl", "SSL"),
        ] {
            // As upstream: whether or not a listener terminates TLS.
            let s = spec(&[(ANNOTATION_BACKEND_PROTOCOL, backend)], false).unwrap();
            assert_eq!(s.health_check.protocol, expected, "{backend}");
            assert_eq!(s.health_check.port, "30443", "the first port listed");
        }
    }

    #[test]
    fn bad_annotations_name_the_service_and_annotation() {
        for (annotations, expected) in [
            (
                vec![(ANNOTATION_TYPE, "alb")],
                "Service shop/web: service.beta.kubernetes.io/aws-load-balancer-type: \"alb\" is not a load balancer type",
            ),
            (
                vec![(ANNOTATION_HC_INTERVAL, "often")],
                "aws-load-balancer-healthcheck-interval: \"often\" is not a whole number",
            ),
            (
                vec![(ANNOTATION_HC_TIMEOUT, "1")],
                "aws-load-balancer-healthcheck-timeout: 1 is outside 2..=120",
            ),
            (
                vec![(ANNOTATION_HC_PORT, "http")],
                "aws-load-balancer-healthcheck-port: \"http\" is neither a port number nor traffic-port",
            ),
            (
                vec![(ANNOTATION_HC_PROTOCOL, "UDP")],
                "Unsupported health check protocol UDP",
            ),
            (
                vec![(ANNOTATION_CROSS_ZONE, "yes")],
                "cross-zone-load-balancing-enabled: \"yes\" is not a boolean",
            ),
            (
                vec![(ANNOTATION_SCHEME, "public")],
                "\"public\" is neither internal nor internet-facing",
            ),
            (
                vec![(ANNOTATION_TYPE, "external")],
                "implemented by the AWS Load Balancer Controller",
            ),
            (
                vec![
                    (ANNOTATION_SSL_CERT, "arn:c"),
                    (ANNOTATION_BACKEND_PROTOCOL, "HTTPS"),
                ],
                "Invalid backend protocol HTTPS for arn:c in service.beta.kubernetes.io/aws-load-balancer-backend-protocol",
            ),
            (
                vec![
                    (ANNOTATION_TYPE, "nlb"),
                    (
                        ANNOTATION_TARGET_GROUP_ATTRIBUTES,
                        "stickiness.enabled=true",
                    ),
                ],
                "error validating target group attributes: the attribute \"stickiness.enabled\" is not supported by the controller or is invalid",
            ),
            (
                vec![(ANNOTATION_PROXY_PROTOCOL, "true")],
                "detected, but the only value supported currently is '*'",
            ),
            (
                vec![(ANNOTATION_IDLE_TIMEOUT, "a minute")],
                "error parsing service annotation: service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout=a minute",
            ),
            (
                vec![(ANNOTATION_SSL_PORTS, "443")],
                "aws-load-balancer-ssl-ports: has no effect without service.beta.kubernetes.io/aws-load-balancer-ssl-cert",
            ),
            (
                vec![(ANNOTATION_BACKEND_PROTOCOL, "h2")],
                "\"h2\" is not a backend protocol (http, https, ssl or tcp)",
            ),
            (
                vec![
                    (ANNOTATION_SSL_CERT, "arn:c"),
                    (ANNOTATION_SSL_PORTS, "443, 80"),
                ],
                "aws-load-balancer-ssl-ports: \" 80\" in \"443, 80\": write the ports without blanks",
            ),
        ] {
            let message = spec(&annotations, false).unwrap_err().to_string();
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
    }

    #[test]
    fn target_node_labels_select_nodes() {
        let s = spec(&[(ANNOTATION_TARGET_NODE_LABELS, "pool=lb,edge")], false).unwrap();
        let mut yes = Node::default();
        yes.metadata.labels = Some(
            [
                ("pool".to_owned(), "lb".to_owned()),
                ("edge".to_owned(), String::new()),
            ]
            .into(),
        );
        let mut no = Node::default();
        no.metadata.labels = Some([("pool".to_owned(), "lb".to_owned())].into());
        let nodes = [Arc::new(yes), Arc::new(no)];
        assert_eq!(s.target_nodes(&nodes).len(), 1);
    }

    #[test]
    fn service_names_default_the_namespace() {
        for (namespace, name, expected) in [
            (Some("shop"), Some("web"), "shop/web"),
            (None, Some("web"), "default/web"),
            (Some("shop"), None, "shop/"),
        ] {
            let mut s = Service::default();
            s.metadata.namespace = namespace.map(str::to_owned);
            s.metadata.name = name.map(str::to_owned);
            assert_eq!(
                service_helpers::service_key(&s),
                expected,
                "{namespace:?} {name:?}"
            );
        }
    }

    #[test]
    fn tags_put_the_services_name_and_the_clusters_over_the_additional_ones() {
        for (additional, expected) in [
            (
                None,
                vec![
                    ("kubernetes.io/cluster/prod", "owned"),
                    ("kubernetes.io/service-name", "shop/web"),
                ],
            ),
            (
                Some("team=a, kubernetes.io/service-name=other"),
                vec![
                    ("kubernetes.io/cluster/prod", "owned"),
                    ("kubernetes.io/service-name", "shop/web"),
                    ("team", "a"),
                ],
            ),
        ] {
            let annotations: Vec<_> = additional
                .map(|tags| (ANNOTATION_ADDITIONAL_TAGS, tags))
                .into_iter()
                .collect();
            let tags = tags_of(&service(&annotations, false), "shop/web", "prod");
            let tags: Vec<_> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            assert_eq!(tags, expected, "{additional:?}");
        }
    }

    #[test]
    fn a_service_is_provisioned_once_its_status_has_an_ingress() {
        use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
        for (ingress, expected) in [
            (None, false),
            (Some(vec![]), false),
            (Some(vec![LoadBalancerIngress::default()]), true),
        ] {
            let s = Service {
                status: Some(ServiceStatus {
                    load_balancer: Some(LoadBalancerStatus {
                        ingress: ingress.clone(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            assert_eq!(provisioned(&s), expected, "{ingress:?}");
        }
        assert!(!provisioned(&Service::default()));
    }

    #[test]
    fn a_load_balancer_ip_is_refused_unless_empty() {
        let bad = |field: &str, message: String| Error::Service {
            service: "shop/web".into(),
            field: field.to_owned(),
            message,
        };
        for (ip, refused) in [(None, false), (Some(""), false), (Some("10.0.0.1"), true)] {
            let spec = ServiceSpec {
                load_balancer_ip: ip.map(str::to_owned),
                ..Default::default()
            };
            let result = refuse_load_balancer_ip(&spec, &bad);
            assert_eq!(result.is_err(), refused, "{ip:?}");
            if let Err(e) = result {
                assert!(
                    e.to_string().ends_with(
                        "spec.loadBalancerIP: LoadBalancerIP cannot be specified for AWS ELB"
                    ),
                    "{e}"
                );
            }
        }
    }
}
