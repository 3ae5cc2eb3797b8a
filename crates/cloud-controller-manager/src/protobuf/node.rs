//! A Node's protobuf bytes as the [`CachedNode`] the JSON decoder makes: the same k8s-openapi
//! [`Node`], without its managed fields and images, and with a note when its metadata or spec holds a
//! field this build's protobuf types (k8s-pb) lack.
//!
//! - **The same object as from JSON.** Go's protobuf encoding writes every field that is not a pointer,
//!   empty or not, where its JSON leaves out the empty ones (`omitempty`): an empty string, list or map,
//!   a `false` or a `0` of an `omitempty` field becomes `None` here as it is absent from the JSON. The
//!   test against the API server decodes one node both ways and compares.
//! - **Fields newer than the types.** prost drops the fields a message's type does not declare. A
//!   Node's metadata and spec are written back whole by the cloud-node controller's PUT, so a field
//!   dropped there would be erased: each is re-encoded and its length compared with the bytes it came
//!   from (protobuf's encoding of the same fields has the same length), and a difference is recorded as
//!   [`CachedNode::unknown_field`], which makes that node's writes merge patches. A status field newer
//!   than the types (none that a controller reads) is not in the cached node.

use std::collections::BTreeMap;

use bytes::Bytes;
use k8s_openapi::{api::core::v1 as api, apimachinery::pkg::api::resource::Quantity};
use k8s_pb::{
    api::core::v1 as pb, apimachinery::pkg::api::resource::Quantity as PbQuantity,
    apimachinery::pkg::apis::meta::v1 as pb_meta,
};
use prost::Message;

use super::{
    DecodeError, ProtobufObject,
    meta::{self, list, object_meta, text, time},
};
use crate::cached_node::CachedNode;

/// A Node's three parts, each still encoded.
#[derive(Clone, PartialEq, Message)]
struct NodeParts {
    #[prost(bytes = "bytes", optional, tag = "1")]
    metadata: Option<Bytes>,
    #[prost(bytes = "bytes", optional, tag = "2")]
    spec: Option<Bytes>,
    #[prost(bytes = "bytes", optional, tag = "3")]
    status: Option<Bytes>,
}

/// The protobuf types' Kubernetes version, for the note on a field they lack.
const TYPES: &str = "k8s-pb 0.9, Kubernetes 1.35";

impl ProtobufObject for CachedNode {
    const KIND: &'static str = "Node";

    fn from_protobuf(raw: Bytes) -> Result<Self, DecodeError> {
        let parts = NodeParts::decode(raw).map_err(|source| DecodeError::Protobuf {
            what: "a Node",
            source,
        })?;
        let mut unknown_field = None;
        let metadata = checked::<pb_meta::ObjectMeta>(
            parts.metadata,
            "metadata",
            &mut unknown_field,
            meta::go_map_shortfall,
        )?;
        // No maps in a NodeSpec (nor in its taints or config source).
        let spec = checked::<pb::NodeSpec>(parts.spec, "spec", &mut unknown_field, |_| 0)?;
        let status = match parts.status {
            Some(bytes) => {
                Some(
                    pb::NodeStatus::decode(bytes).map_err(|source| DecodeError::Protobuf {
                        what: "a Node's status",
                        source,
                    })?,
                )
            }
            None => None,
        };
        let node = api::Node {
            metadata: metadata.map(object_meta).unwrap_or_default(),
            spec: spec.map(node_spec),
            status: status.map(node_status),
        };
        Ok(CachedNode::decoded(node, unknown_field))
    }
}

/// The message in `bytes`, and in `unknown` (when it holds nothing yet) a note that `part` holds a
/// field the type lacks: re-encoded, the message is shorter than the bytes it came from. prost leaves
/// out a map entry's empty key or value, which Go writes: `shortfall` says by how many bytes the
/// message's maps come out shorter for that alone.
fn checked<M: Message + Default>(
    bytes: Option<Bytes>,
    part: &'static str,
    unknown: &mut Option<Box<str>>,
    shortfall: fn(&M) -> usize,
) -> Result<Option<M>, DecodeError> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let length = bytes.len();
    let message =
        M::decode(bytes).map_err(|source| DecodeError::Protobuf { what: part, source })?;
    if message.encoded_len() + shortfall(&message) != length && unknown.is_none() {
        *unknown = Some(
            format!("{part} (a field newer than this build's protobuf types, {TYPES})").into(),
        );
    }
    Ok(Some(message))
}

fn quantities(items: BTreeMap<String, PbQuantity>) -> Option<BTreeMap<String, Quantity>> {
    (!items.is_empty()).then(|| {
        items
            .into_iter()
            .map(|(name, q)| (name, Quantity(q.string.unwrap_or_default())))
            .collect()
    })
}

fn node_spec(s: pb::NodeSpec) -> api::NodeSpec {
    api::NodeSpec {
        pod_cidr: text(s.pod_cidr),
        pod_cidrs: list(s.pod_cid_rs, |c| c),
        provider_id: text(s.provider_id),
        unschedulable: s.unschedulable.filter(|u| *u),
        taints: list(s.taints, |t| api::Taint {
            key: t.key.unwrap_or_default(),
            value: text(t.value),
            effect: t.effect.unwrap_or_default(),
            time_added: time(t.time_added),
        }),
        config_source: s.config_source.map(config_source),
        external_id: text(s.external_id),
        // Not in the protobuf types: a node that has it is noted by `checked`.
        pod_preemption_policy: None,
    }
}

fn config_source(s: pb::NodeConfigSource) -> api::NodeConfigSource {
    api::NodeConfigSource {
        config_map: s.config_map.map(|c| api::ConfigMapNodeConfigSource {
            namespace: c.namespace.unwrap_or_default(),
            name: c.name.unwrap_or_default(),
            uid: text(c.uid),
            resource_version: text(c.resource_version),
            kubelet_config_key: c.kubelet_config_key.unwrap_or_default(),
        }),
    }
}

fn node_status(s: pb::NodeStatus) -> api::NodeStatus {
    api::NodeStatus {
        capacity: quantities(s.capacity),
        allocatable: quantities(s.allocatable),
        phase: text(s.phase),
        conditions: list(s.conditions, |c| api::NodeCondition {
            type_: c.r#type.unwrap_or_default(),
            status: c.status.unwrap_or_default(),
            last_heartbeat_time: time(c.last_heartbeat_time),
            last_transition_time: time(c.last_transition_time),
            reason: text(c.reason),
            message: text(c.message),
        }),
        addresses: list(s.addresses, |a| api::NodeAddress {
            type_: a.r#type.unwrap_or_default(),
            address: a.address.unwrap_or_default(),
        }),
        daemon_endpoints: s.daemon_endpoints.map(|d| api::NodeDaemonEndpoints {
            kubelet_endpoint: d.kubelet_endpoint.map(|e| api::DaemonEndpoint {
                port: e.port.unwrap_or_default(),
            }),
        }),
        node_info: s.node_info.map(node_info),
        // Not cached (see `cached_node`).
        images: None,
        volumes_in_use: list(s.volumes_in_use, |v| v),
        volumes_attached: list(s.volumes_attached, |v| api::AttachedVolume {
            name: v.name.unwrap_or_default(),
            device_path: v.device_path.unwrap_or_default(),
        }),
        config: s.config.map(|c| api::NodeConfigStatus {
            assigned: c.assigned.map(config_source),
            active: c.active.map(config_source),
            last_known_good: c.last_known_good.map(config_source),
            error: text(c.error),
        }),
        runtime_handlers: list(s.runtime_handlers, |h| api::NodeRuntimeHandler {
            name: h.name,
            features: h.features.map(|f| api::NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts: f.recursive_read_only_mounts,
                user_namespaces: f.user_namespaces,
            }),
        }),
        features: s.features.map(|f| api::NodeFeatures {
            supplemental_groups_policy: f.supplemental_groups_policy,
        }),
        declared_features: list(s.declared_features, |f| f),
    }
}

fn node_info(i: pb::NodeSystemInfo) -> api::NodeSystemInfo {
    api::NodeSystemInfo {
        machine_id: i.machine_id.unwrap_or_default(),
        system_uuid: i.system_uuid.unwrap_or_default(),
        boot_id: i.boot_id.unwrap_or_default(),
        kernel_version: i.kernel_version.unwrap_or_default(),
        os_image: i.os_image.unwrap_or_default(),
        container_runtime_version: i.container_runtime_version.unwrap_or_default(),
        kubelet_version: i.kubelet_version.unwrap_or_default(),
        kube_proxy_version: i.kube_proxy_version.unwrap_or_default(),
        operating_system: i.operating_system.unwrap_or_default(),
        architecture: i.architecture.unwrap_or_default(),
        swap: i.swap.map(|s| api::NodeSwapStatus {
            capacity: s.capacity,
        }),
        // Not in the protobuf types (a status field: see the module docs).
        running_in_user_namespace: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(node: &pb::Node) -> Bytes {
        Bytes::from(node.encode_to_vec())
    }

    /// Go's encoding writes empty strings, lists and `false`s: they come out absent, as from JSON.
    #[test]
    fn empty_values_come_out_absent_as_from_json() {
        let node = pb::Node {
            metadata: Some(pb_meta::ObjectMeta {
                name: Some("n1".into()),
                generate_name: Some(String::new()),
                namespace: Some(String::new()),
                generation: Some(0),
                creation_timestamp: Some(pb_meta::Time {
                    seconds: Some(1_700_000_000),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
            spec: Some(pb::NodeSpec {
                pod_cidr: Some(String::new()),
                provider_id: Some("fake://n1".into()),
                unschedulable: Some(false),
                ..Default::default()
            }),
            status: Some(pb::NodeStatus {
                phase: Some(String::new()),
                conditions: vec![pb::NodeCondition {
                    r#type: Some("Ready".into()),
                    status: Some("True".into()),
                    last_heartbeat_time: Some(pb_meta::Time::default()),
                    reason: Some(String::new()),
                    ..Default::default()
                }],
                images: vec![pb::ContainerImage {
                    names: vec!["registry.k8s.io/pause:3.10".into()],
                    size_bytes: Some(1),
                }],
                ..Default::default()
            }),
        };
        let cached = CachedNode::from_protobuf(encode(&node)).unwrap();
        let expected: api::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "creationTimestamp": "2023-11-14T22:13:20Z"},
            "spec": {"providerID": "fake://n1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        assert_eq!(cached.node(), &expected);
        assert_eq!(cached.unknown_field(), None);
    }

    /// A spec field the protobuf types lack (here tag 99) makes the node's writes merge patches; one in
    /// the status does not.
    #[test]
    fn a_field_newer_than_the_types_in_the_spec_is_noted() {
        let spec = pb::NodeSpec {
            provider_id: Some("fake://n1".into()),
            ..Default::default()
        };
        let mut newer_spec = spec.encode_to_vec();
        // Field 99, length-delimited, 1 byte.
        newer_spec.extend_from_slice(&[0x9a, 0x06, 0x01, b'x']);
        let mut raw = Vec::new();
        prost::encoding::bytes::encode(2, &newer_spec, &mut raw);
        let cached = CachedNode::from_protobuf(Bytes::from(raw)).unwrap();
        assert_eq!(
            cached.unknown_field(),
            Some(
                "spec (a field newer than this build's protobuf types, k8s-pb 0.9, Kubernetes 1.35)"
            )
        );
        assert_eq!(
            cached.node().spec.as_ref().unwrap().provider_id.as_deref(),
            Some("fake://n1")
        );

        let mut newer_status = pb::NodeStatus::default().encode_to_vec();
        newer_status.extend_from_slice(&[0x9a, 0x06, 0x01, b'x']);
        let mut raw = Vec::new();
        prost::encoding::bytes::encode(3, &newer_status, &mut raw);
        assert_eq!(
            CachedNode::from_protobuf(Bytes::from(raw))
                .unwrap()
                .unknown_field(),
            None
        );
    }

    /// Go writes a label's empty value (`node-role.kubernetes.io/control-plane: ""`), which prost
    /// leaves out when it re-encodes: that is no unknown field, and the label is kept.
    #[test]
    fn an_empty_label_value_is_no_unknown_field() {
        // metadata: name "n1", labels {"node-role.kubernetes.io/control-plane": "", "a": "b"}, as Go
        // writes them (each entry with its key and its value, empty or not).
        let mut metadata = Vec::new();
        prost::encoding::string::encode(1, &"n1".to_owned(), &mut metadata);
        for (key, value) in [("node-role.kubernetes.io/control-plane", ""), ("a", "b")] {
            let mut entry = Vec::new();
            prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut entry);
            prost::encoding::encode_varint(key.len() as u64, &mut entry);
            entry.extend_from_slice(key.as_bytes());
            prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut entry);
            prost::encoding::encode_varint(value.len() as u64, &mut entry);
            entry.extend_from_slice(value.as_bytes());
            prost::encoding::bytes::encode(11, &entry, &mut metadata);
        }
        let mut raw = Vec::new();
        prost::encoding::bytes::encode(1, &metadata, &mut raw);
        let cached = CachedNode::from_protobuf(Bytes::from(raw)).unwrap();
        assert_eq!(cached.unknown_field(), None);
        assert_eq!(
            cached.metadata.labels.as_ref().unwrap()["node-role.kubernetes.io/control-plane"],
            ""
        );
    }

    #[test]
    fn bytes_that_are_not_a_node_say_so() {
        let err = CachedNode::from_protobuf(Bytes::from_static(b"\x0a\x05ab")).unwrap_err();
        assert!(err.to_string().starts_with("a Node: "), "{err}");
    }
}
