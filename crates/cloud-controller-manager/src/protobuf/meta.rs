//! What every object shares: its metadata, times, and how Go's protobuf encoding of an empty value
//! becomes what its JSON leaves out (`omitempty`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;

/// `None` for what JSON leaves out of an `omitempty` string.
pub(super) fn text(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// `None` for an empty list (left out of the JSON).
pub(super) fn list<T, U>(items: Vec<T>, convert: impl FnMut(T) -> U) -> Option<Vec<U>> {
    (!items.is_empty()).then(|| items.into_iter().map(convert).collect())
}

/// `None` for an empty map (left out of the JSON).
pub(super) fn map(items: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!items.is_empty()).then_some(items)
}

/// A time; the zero time (which Go writes as an empty message, and as `null` in JSON) is `None`.
pub(super) fn time(value: Option<pb_meta::Time>) -> Option<meta::Time> {
    let value = value?;
    if value.seconds.is_none() && value.nanos.is_none() {
        return None;
    }
    k8s_openapi::jiff::Timestamp::new(value.seconds.unwrap_or(0), value.nanos.unwrap_or(0))
        .ok()
        .map(meta::Time)
}

pub(super) fn object_meta(m: pb_meta::ObjectMeta) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: text(m.name),
        generate_name: text(m.generate_name),
        namespace: text(m.namespace),
        self_link: text(m.self_link),
        uid: text(m.uid),
        resource_version: text(m.resource_version),
        generation: m.generation.filter(|g| *g != 0),
        creation_timestamp: time(m.creation_timestamp),
        deletion_timestamp: time(m.deletion_timestamp),
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: map(m.labels),
        annotations: map(m.annotations),
        owner_references: list(m.owner_references, |o| meta::OwnerReference {
            api_version: o.api_version.unwrap_or_default(),
            kind: o.kind.unwrap_or_default(),
            name: o.name.unwrap_or_default(),
            uid: o.uid.unwrap_or_default(),
            controller: o.controller,
            block_owner_deletion: o.block_owner_deletion,
        }),
        finalizers: list(m.finalizers, |f| f),
        // Not cached (see `cached_node`).
        managed_fields: None,
    }
}

/// How many bytes shorter prost re-encodes `m`'s maps (labels, annotations) than Go wrote them: Go
/// writes each entry's key and value, prost leaves out an empty one (and the entry's length shrinks
/// with it).
pub(super) fn go_map_shortfall(m: &pb_meta::ObjectMeta) -> usize {
    [&m.labels, &m.annotations]
        .into_iter()
        .flat_map(|map| map.iter())
        .map(|(key, value)| {
            let go = field_len(key.len()) + field_len(value.len());
            let prost = [key.len(), value.len()]
                .into_iter()
                .filter(|len| *len > 0)
                .map(field_len)
                .sum();
            field_len(go) - field_len(prost)
        })
        .sum()
}

/// A length-delimited field of `len` bytes with a one-byte tag (field numbers below 16): tag, length,
/// bytes.
fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}
