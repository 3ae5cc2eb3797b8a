//! The Node as the shared cache holds it: decoded without the fields no controller reads, and with a
//! note of any field this build's k8s-openapi types do not know.
//!
//! - **Slim.** A kubelet's Node is mostly its container image list (`status.images`), and its managed
//!   fields are the next largest part. Both are skipped *while decoding* (never allocated), not pruned
//!   after: with thousands of Nodes in a list page or a burst of watch events, what is decoded and then
//!   dropped still sets the process's high-water mark.
//! - **Safe to write back.** The cloud-node controller initializes a node with a PUT of its metadata and
//!   spec, as upstream's `Update` does (cheaper for the API server than a merge patch, which makes it
//!   encode the stored Node to JSON and decode it again). A PUT replaces what it does not carry, so it
//!   would erase a field that the API server has and our types lack (a newer server's). Decoding
//!   records the first such field in `metadata` or `spec` (at any depth); a node that has one is
//!   written with a merge patch instead, which carries only what changes. The status is never in the
//!   PUT: the API server keeps a Node's status on a PUT of the Node, and its managed fields when the PUT
//!   has none, so the skipped images and managed fields are safe as well.
//!
//! The skipping is a thin [`serde::Deserializer`] wrapper of our own ([`SkipKeys`]): serde has no
//! attribute to skip a field of a foreign type, and `serde_ignored` (which finds the unknown fields)
//! only reports keys, it cannot drop them.

use std::{borrow::Cow, fmt, marker::PhantomData, ops::Deref, sync::Arc};

use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, NodeStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::Resource;
use serde::{
    Deserialize, Deserializer,
    de::{self, DeserializeSeed, IgnoredAny, IntoDeserializer, MapAccess, Visitor},
};

/// Keys of a Node's `metadata` that the cache does not keep.
const SKIPPED_METADATA: &[&str] = &["managedFields"];
/// Keys of a Node's `status` that the cache does not keep.
const SKIPPED_STATUS: &[&str] = &["images"];

/// A Node from the shared cache (see the module docs): derefs to the [`Node`], without its
/// `metadata.managedFields` and `status.images`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedNode {
    /// Shared, so the load balancers' backend lists hand the provider the cached nodes themselves
    /// (upstream passes the lister's `*v1.Node` pointers): a list of thousands of backends copies no
    /// Node.
    node: Arc<Node>,
    /// The first field of the object, its metadata or its spec that k8s-openapi does not know, as a
    /// path (`spec.taints.0.newField`).
    unknown_field: Option<Box<str>>,
}

impl CachedNode {
    /// The node (without the skipped fields).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The node, shared with the cache (no copy).
    pub fn shared(&self) -> Arc<Node> {
        Arc::clone(&self.node)
    }

    /// The node, owned (copied only when the cache still shares it).
    pub fn into_node(self) -> Node {
        Arc::unwrap_or_clone(self.node)
    }

    /// The first field of the object, its metadata or its spec that this build's types do not know:
    /// a write of the whole object would erase it.
    pub fn unknown_field(&self) -> Option<&str> {
        self.unknown_field.as_deref()
    }

    /// A node decoded from the API server's protobuf (`crate::protobuf`), already without the fields
    /// the cache skips, and the note of a field there that the decoder's types lack.
    pub(crate) fn decoded(node: Node, unknown_field: Option<Box<str>>) -> Self {
        Self {
            node: Arc::new(node),
            unknown_field,
        }
    }
}

impl From<Node> for CachedNode {
    /// A cached copy of `node`, with the fields the cache skips removed.
    fn from(mut node: Node) -> Self {
        node.metadata.managed_fields = None;
        if let Some(status) = node.status.as_mut() {
            status.images = None;
        }
        Self {
            node: Arc::new(node),
            unknown_field: None,
        }
    }
}

impl Deref for CachedNode {
    type Target = Node;

    fn deref(&self) -> &Node {
        &self.node
    }
}

impl AsRef<Node> for CachedNode {
    fn as_ref(&self) -> &Node {
        &self.node
    }
}

impl Resource for CachedNode {
    type DynamicType = ();
    type Scope = <Node as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Node::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Node::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Node::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Node::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.node.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut Arc::make_mut(&mut self.node).metadata
    }
}

impl<'de> Deserialize<'de> for CachedNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = CachedNode;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CachedNode, A::Error> {
        let mut node = Node::default();
        let mut unknown: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" => {
                    node.metadata = map.next_value_seed(Checked::new(
                        "metadata",
                        SKIPPED_METADATA,
                        &mut unknown,
                    ))?;
                }
                "spec" => {
                    node.spec = Some(map.next_value_seed(Checked::<NodeSpec>::new(
                        "spec",
                        &[],
                        &mut unknown,
                    ))?);
                }
                "status" => {
                    node.status =
                        Some(map.next_value_seed(Skipping::<NodeStatus>::new(SKIPPED_STATUS))?);
                }
                "apiVersion" | "kind" => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    unknown.get_or_insert(key);
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(CachedNode {
            node: Arc::new(node),
            unknown_field: unknown.map(String::into_boxed_str),
        })
    }
}

/// Decodes a `T` without the keys `skip` (at its top level), noting the first field `T` does not know.
struct Checked<'a, T> {
    prefix: &'static str,
    skip: &'static [&'static str],
    unknown: &'a mut Option<String>,
    _t: PhantomData<T>,
}

impl<'a, T> Checked<'a, T> {
    fn new(
        prefix: &'static str,
        skip: &'static [&'static str],
        unknown: &'a mut Option<String>,
    ) -> Self {
        Self {
            prefix,
            skip,
            unknown,
            _t: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Checked<'_, T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        let Self {
            prefix,
            skip,
            unknown,
            ..
        } = self;
        serde_ignored::deserialize(
            SkipKeys {
                inner: deserializer,
                skip,
            },
            |path| {
                if unknown.is_none() {
                    let mut dotted = prefix.to_owned();
                    push_path(&mut dotted, &path);
                    *unknown = Some(dotted);
                }
            },
        )
    }
}

/// Appends `path` to `dotted` as `.key` and `.index` steps (serde_ignored's own display marks each
/// `Option` on the way with a `?`).
fn push_path(dotted: &mut String, path: &serde_ignored::Path<'_>) {
    use serde_ignored::Path;
    match path {
        Path::Root => {}
        Path::Seq { parent, index } => {
            push_path(dotted, parent);
            dotted.push_str(&format!(".{index}"));
        }
        Path::Map { parent, key } => {
            push_path(dotted, parent);
            dotted.push('.');
            dotted.push_str(key);
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => push_path(dotted, parent),
    }
}

/// Decodes a `T` without the keys `skip` (at its top level).
struct Skipping<T> {
    skip: &'static [&'static str],
    _t: PhantomData<T>,
}

impl<T> Skipping<T> {
    fn new(skip: &'static [&'static str]) -> Self {
        Self {
            skip,
            _t: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Skipping<T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        T::deserialize(SkipKeys {
            inner: deserializer,
            skip: self.skip,
        })
    }
}

/// `inner` with the keys `skip` passed over unparsed, at each step of decoding a struct: as a deserializer
/// whose struct (the value it is asked for) never shows them, it hands the struct's visitor wrapped; the
/// visitor hands its map wrapped; the map skips the keys. Everything else is forwarded as it is.
struct SkipKeys<T> {
    inner: T,
    skip: &'static [&'static str],
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for SkipKeys<D> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_struct(
            name,
            fields,
            SkipKeys {
                inner: visitor,
                skip: self.skip,
            },
        )
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SkipKeys<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(SkipKeys {
            inner: map,
            skip: self.skip,
        })
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipKeys<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.inner.next_key::<String>()? {
            if self.skip.contains(&key.as_str()) {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            let key: de::value::StringDeserializer<A::Error> = key.into_deserializer();
            return seed.deserialize(key).map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kubelet_node() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "resourceVersion": "7",
                "labels": {"kubernetes.io/hostname": "n1"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]
            },
            "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                                 "value": "true", "effect": "NoSchedule"}]},
            "status": {
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320000}],
                "addresses": [{"type": "Hostname", "address": "n1"}],
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k",
                             "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v1.37.1",
                             "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}
            }
        })
    }

    #[test]
    fn decoding_skips_images_and_managed_fields_and_keeps_everything_else() {
        let value = kubelet_node();
        let cached: CachedNode = serde_json::from_value(value.clone()).unwrap();
        let full: Node = serde_json::from_value(value).unwrap();
        assert_eq!(cached.unknown_field(), None);
        assert_eq!(cached.metadata.managed_fields, None);
        let status = cached.status.as_ref().unwrap();
        assert_eq!(status.images, None);
        assert_eq!(
            status.addresses,
            full.status.as_ref().unwrap().addresses,
            "addresses kept"
        );
        assert_eq!(
            status.node_info,
            full.status.as_ref().unwrap().node_info,
            "node info kept"
        );
        // Equal to the full decode with the two skipped fields removed.
        assert_eq!(cached, CachedNode::from(full));
    }

    #[test]
    fn decoding_from_a_reader_matches_decoding_from_a_value() {
        let value = kubelet_node();
        let bytes = serde_json::to_vec(&value).unwrap();
        let from_slice: CachedNode = serde_json::from_slice(&bytes).unwrap();
        let from_reader: CachedNode = serde_json::from_reader(bytes.as_slice()).unwrap();
        let from_value: CachedNode = serde_json::from_value(value).unwrap();
        assert_eq!(from_slice, from_value);
        assert_eq!(from_reader, from_value);
    }

    #[test]
    fn a_field_unknown_to_our_types_in_metadata_or_spec_is_noted_at_any_depth() {
        for (place, expected) in [
            ("/spec", "spec.futureField"),
            ("/spec/taints/0", "spec.taints.0.futureField"),
            ("/metadata", "metadata.futureField"),
            ("", "futureField"),
        ] {
            let mut value = kubelet_node();
            value
                .pointer_mut(place)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .insert("futureField".into(), json!({"a": 1}));
            let cached: CachedNode = serde_json::from_value(value).unwrap();
            assert_eq!(cached.unknown_field(), Some(expected), "at {place:?}");
        }
    }

    #[test]
    fn an_unknown_status_field_is_not_noted_because_a_put_of_the_node_keeps_the_status() {
        let mut value = kubelet_node();
        value["status"]["futureField"] = json!(1);
        let cached: CachedNode = serde_json::from_value(value).unwrap();
        assert_eq!(cached.unknown_field(), None);
    }

    #[test]
    fn a_malformed_node_is_an_error_that_says_where() {
        let mut value = kubelet_node();
        value["spec"]["taints"] = json!("not a list");
        let err = serde_json::from_value::<CachedNode>(value).unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    #[test]
    fn it_is_a_node_to_kube() {
        assert_eq!(CachedNode::kind(&()), "Node");
        assert_eq!(CachedNode::api_version(&()), "v1");
        assert_eq!(CachedNode::url_path(&(), None), "/api/v1/nodes");
        let cached: CachedNode = serde_json::from_value(kubelet_node()).unwrap();
        assert_eq!(kube::ResourceExt::name_any(&cached), "n1");
    }
}
