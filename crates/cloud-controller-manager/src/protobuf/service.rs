//! A Service's protobuf bytes as the k8s-openapi [`Service`] the JSON decoder makes (empty values
//! absent as from JSON, see `meta`). A field newer than the protobuf types (k8s-pb) is not in the
//! cached Service, as one newer than the k8s-openapi types is not from JSON: the service controller
//! writes Services with patches of the fields it owns, never whole.

use bytes::Bytes;
use k8s_openapi::{
    api::core::v1::{self as api, Service},
    apimachinery::pkg::{apis::meta::v1 as meta, util::intstr::IntOrString},
};
use k8s_pb::{api::core::v1 as pb, apimachinery::pkg::util::intstr::IntOrString as PbIntOrString};

use super::{
    DecodeError, ProtobufObject, decode,
    meta::{list, map, object_meta, text, time},
};

impl ProtobufObject for Service {
    const KIND: &'static str = "Service";

    fn from_protobuf(raw: Bytes) -> Result<Self, DecodeError> {
        let service: pb::Service = decode("a Service", raw)?;
        Ok(Service {
            metadata: service.metadata.map(object_meta).unwrap_or_default(),
            spec: service.spec.map(service_spec),
            status: service.status.map(service_status),
        })
    }
}

fn service_spec(s: pb::ServiceSpec) -> api::ServiceSpec {
    api::ServiceSpec {
        ports: list(s.ports, |p| api::ServicePort {
            name: text(p.name),
            protocol: text(p.protocol),
            // A pointer in Go: written only when set, and then as it is.
            app_protocol: p.app_protocol,
            port: p.port.unwrap_or_default(),
            target_port: p.target_port.map(int_or_string),
            node_port: p.node_port.filter(|n| *n != 0),
        }),
        selector: map(s.selector),
        cluster_ip: text(s.cluster_ip),
        cluster_ips: list(s.cluster_ips, |ip| ip),
        type_: text(s.r#type),
        external_ips: list(s.external_ips, |ip| ip),
        session_affinity: text(s.session_affinity),
        load_balancer_ip: text(s.load_balancer_ip),
        load_balancer_source_ranges: list(s.load_balancer_source_ranges, |r| r),
        external_name: text(s.external_name),
        external_traffic_policy: text(s.external_traffic_policy),
        health_check_node_port: s.health_check_node_port.filter(|p| *p != 0),
        publish_not_ready_addresses: s.publish_not_ready_addresses.filter(|p| *p),
        session_affinity_config: s
            .session_affinity_config
            .map(|c| api::SessionAffinityConfig {
                client_ip: c.client_ip.map(|c| api::ClientIPConfig {
                    timeout_seconds: c.timeout_seconds,
                }),
            }),
        ip_families: list(s.ip_families, |f| f),
        // Pointers in Go: written only when set, and then as they are.
        ip_family_policy: s.ip_family_policy,
        allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
        load_balancer_class: s.load_balancer_class,
        internal_traffic_policy: s.internal_traffic_policy,
        traffic_distribution: s.traffic_distribution,
    }
}

/// Go's `intstr.IntOrString`: type 0 is the number, 1 the string.
fn int_or_string(value: PbIntOrString) -> IntOrString {
    match value.r#type {
        Some(1) => IntOrString::String(value.str_val.unwrap_or_default()),
        _ => IntOrString::Int(value.int_val.unwrap_or_default()),
    }
}

fn service_status(s: pb::ServiceStatus) -> api::ServiceStatus {
    api::ServiceStatus {
        load_balancer: s.load_balancer.map(|lb| api::LoadBalancerStatus {
            ingress: list(lb.ingress, |i| api::LoadBalancerIngress {
                ip: text(i.ip),
                hostname: text(i.hostname),
                ip_mode: i.ip_mode,
                ports: list(i.ports, |p| api::PortStatus {
                    port: p.port.unwrap_or_default(),
                    protocol: p.protocol.unwrap_or_default(),
                    error: p.error,
                }),
            }),
        }),
        conditions: list(s.conditions, |c| meta::Condition {
            type_: c.r#type.unwrap_or_default(),
            status: c.status.unwrap_or_default(),
            observed_generation: c.observed_generation.filter(|g| *g != 0),
            // Required (the API server refuses a condition without it).
            last_transition_time: time(c.last_transition_time)
                .unwrap_or(meta::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            reason: c.reason.unwrap_or_default(),
            message: c.message.unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
    use prost::Message;

    use super::*;

    /// Go's encoding writes empty strings, zeros and `false`s: they come out absent, as from JSON; a
    /// pointer set to an empty value (`appProtocol`) stays, as in JSON.
    #[test]
    fn empty_values_come_out_absent_as_from_json() {
        let service = pb::Service {
            metadata: Some(pb_meta::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            spec: Some(pb::ServiceSpec {
                ports: vec![pb::ServicePort {
                    name: Some(String::new()),
                    protocol: Some("TCP".into()),
                    app_protocol: Some(String::new()),
                    port: Some(80),
                    target_port: Some(PbIntOrString {
                        r#type: Some(1),
                        int_val: Some(0),
                        str_val: Some("http".into()),
                    }),
                    node_port: Some(0),
                }],
                r#type: Some("LoadBalancer".into()),
                load_balancer_ip: Some(String::new()),
                health_check_node_port: Some(0),
                publish_not_ready_addresses: Some(false),
                allocate_load_balancer_node_ports: Some(false),
                ..Default::default()
            }),
            status: Some(pb::ServiceStatus {
                load_balancer: Some(pb::LoadBalancerStatus {
                    ingress: vec![pb::LoadBalancerIngress {
                        ip: Some("192.0.2.1".into()),
                        hostname: Some(String::new()),
                        ip_mode: Some("VIP".into()),
                        ports: Vec::new(),
                    }],
                }),
                conditions: Vec::new(),
            }),
        };
        let decoded = Service::from_protobuf(Bytes::from(service.encode_to_vec())).unwrap();
        let expected: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "ports": [{"protocol": "TCP", "appProtocol": "", "port": 80, "targetPort": "http"}],
                "type": "LoadBalancer",
                "allocateLoadBalancerNodePorts": false,
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]}},
        }))
        .unwrap();
        assert_eq!(decoded, expected);
    }
}
