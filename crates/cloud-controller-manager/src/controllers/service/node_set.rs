//! Which nodes back a load balancer (upstream's stable node-set predicates), and when a node change
//! matters.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

/// Nodes with this label are not load-balancer backends unless its value parses as boolean false.
pub const LABEL_EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The cluster autoscaler's taint on nodes it is removing.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

/// Go's `strconv.ParseBool` false values.
fn parses_as_false(value: &str) -> bool {
    matches!(value, "0" | "f" | "F" | "false" | "FALSE" | "False")
}

/// Whether the exclusion label leaves the node in (absent, or a boolean false; an empty or unparseable
/// value excludes).
pub fn is_included(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_EXCLUDE))
        .is_none_or(|value| parses_as_false(value))
}

/// All predicates: not being deleted, not excluded, not being scaled down. Readiness does not matter.
pub fn is_backend(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none() && is_included(node) && !being_scaled_down(node)
}

fn provider_id(node: &Node) -> String {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .unwrap_or_default()
}

/// A backend set as upstream compares them ("sufficiently equal"): node name → provider ID.
pub type BackendSet = BTreeMap<String, String>;

/// The backend set of these nodes.
pub fn backend_set<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> BackendSet {
    nodes
        .into_iter()
        .filter(|n| is_backend(n))
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), provider_id(n)))
        .collect()
}

/// Whether the cluster autoscaler is removing the node.
fn being_scaled_down(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == TAINT_TO_BE_DELETED))
}

/// What a node change can matter for: whether it is a backend candidate (the exclusion label), whether
/// the cluster autoscaler is removing it (its taint), and its provider ID. A node update triggers a node
/// sync only when this changes; heartbeats, conditions and other labels do not. Upstream's
/// `shouldSyncUpdatedNode` passes on the exclusion label and the provider ID only, so the autoscaler's
/// taint is acted on at the next node event that qualifies, in practice the node's deletion once its
/// pods are drained: the load balancers send new connections to a node on its way out until then
/// (autoscaler#1907, #5532; bench/results/autoscaler-drain-2026-11-30.md). Here the taint takes the node out of
/// every load balancer at once, with the provider's connection draining (aws: the target group's
/// deregistration delay; `local`: open connections finish, new ones go elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    included: bool,
    scaled_down: bool,
    provider_id: String,
}

impl NodeFacts {
    /// The facts of a node.
    pub fn of(node: &Node) -> Self {
        Self {
            included: is_included(node),
            scaled_down: being_scaled_down(node),
            provider_id: provider_id(node),
        }
    }
}

/// Everything the node predicates and the providers read: when any of it changes, a cached backend list
/// is stale (even when, as for a deletion or a label, no node sync is triggered for it). Labels count because providers choose backends by them (aws's
/// `target-node-labels`): a Service created after a node was labelled must see the label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BackendFacts {
    facts: NodeFacts,
    backend: bool,
    /// A hash of the node's labels (the map itself would cost every cached node its labels twice).
    labels: u64,
}

impl BackendFacts {
    /// The facts of a node.
    pub(crate) fn of(node: &Node) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        node.metadata.labels.hash(&mut hasher);
        Self {
            facts: NodeFacts::of(node),
            backend: is_backend(node),
            labels: hasher.finish(),
        }
    }

    /// What decides whether a change triggers a node sync.
    pub(crate) fn sync_facts(&self) -> &NodeFacts {
        &self.facts
    }

    /// A digest of the node's labels.
    pub(crate) fn labels(&self) -> u64 {
        self.labels
    }
}

/// The node labels a load balancer's backend selection depends on (the provider's
/// `LoadBalancer::backend_label_keys` for its Service), and a digest of their values on the backends it
/// was last given: when the digest over the current backends differs, the load balancer is updated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BackendLabels {
    keys: std::sync::Arc<[String]>,
    digest: u64,
}

impl BackendLabels {
    /// `keys` as they are on `nodes` (no key: nothing to watch, and no work).
    pub(crate) fn of(keys: Vec<String>, nodes: &[std::sync::Arc<Node>]) -> Self {
        let keys: std::sync::Arc<[String]> = keys.into();
        let digest = label_digest(&keys, nodes);
        Self { keys, digest }
    }

    /// The same keys as they are on `nodes` now.
    pub(crate) fn now(&self, nodes: &[std::sync::Arc<Node>]) -> Self {
        Self {
            keys: self.keys.clone(),
            digest: label_digest(&self.keys, nodes),
        }
    }

    /// Whether any key is watched.
    pub(crate) fn watched(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether the watched labels on `nodes` differ from those the load balancer was given.
    pub(crate) fn changed(&self, nodes: &[std::sync::Arc<Node>]) -> bool {
        self.watched() && label_digest(&self.keys, nodes) != self.digest
    }
}

/// A digest of each node's name and the values of `keys` on it (0 without keys).
fn label_digest(keys: &[String], nodes: &[std::sync::Arc<Node>]) -> u64 {
    use std::hash::{Hash, Hasher};
    if keys.is_empty() {
        return 0;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for node in nodes {
        node.metadata.name.hash(&mut hasher);
        let labels = node.metadata.labels.as_ref();
        for key in keys.iter() {
            labels.and_then(|l| l.get(key)).hash(&mut hasher);
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NodeSpec, Taint},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("fake://{name}")),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn excluded(value: &str) -> Node {
        let mut n = node("x");
        n.metadata.labels = Some([(LABEL_EXCLUDE.to_string(), value.to_string())].into());
        n
    }

    #[test]
    fn backend_labels_change_only_with_their_keys() {
        use std::sync::Arc;
        let labelled = |name: &str, labels: &[(&str, &str)]| {
            let mut n = node(name);
            n.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            Arc::new(n)
        };
        let nodes = vec![
            labelled("a", &[("pool", "lb"), ("x", "1")]),
            labelled("b", &[]),
        ];
        let watched = BackendLabels::of(vec!["pool".into()], &nodes);
        assert!(watched.watched());
        assert!(!watched.changed(&nodes));
        // Another label: no change.
        let other = vec![
            labelled("a", &[("pool", "lb"), ("x", "2")]),
            labelled("b", &[]),
        ];
        assert!(!watched.changed(&other));
        // The watched one, added, changed or removed: a change.
        for changed in [
            vec![
                labelled("a", &[("pool", "lb")]),
                labelled("b", &[("pool", "lb")]),
            ],
            vec![labelled("a", &[("pool", "web")]), labelled("b", &[])],
            vec![labelled("a", &[]), labelled("b", &[])],
        ] {
            assert!(watched.changed(&changed));
            assert!(!watched.now(&changed).changed(&changed));
        }
        // Nothing watched: never a change.
        let unwatched = BackendLabels::of(Vec::new(), &nodes);
        assert!(!unwatched.watched());
        assert!(!unwatched.changed(&other));
    }

    #[test]
    fn the_exclusion_label_uses_go_boolean_parsing() {
        assert!(is_included(&node("a")));
        for value in ["false", "0", "f", "F", "FALSE", "False"] {
            assert!(is_included(&excluded(value)), "{value:?} keeps the node");
        }
        for value in ["true", "1", "", "yes", "no", "nope", "fAlse"] {
            assert!(
                !is_included(&excluded(value)),
                "{value:?} excludes the node"
            );
        }
    }

    #[test]
    fn deleting_and_autoscaled_nodes_are_not_backends() {
        assert!(is_backend(&node("a")));
        let mut deleting = node("a");
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(!is_backend(&deleting));
        let mut scaling = node("a");
        scaling.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: TAINT_TO_BE_DELETED.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert!(!is_backend(&scaling));
        assert!(!is_backend(&excluded("")));
    }

    #[test]
    fn backend_sets_compare_names_and_provider_ids() {
        let set = backend_set(&[node("a"), node("b"), excluded("true")]);
        assert_eq!(set.len(), 2);
        assert_eq!(set["a"], "fake://a");
        let mut moved = node("b");
        moved.spec.as_mut().unwrap().provider_id = Some("fake://b2".into());
        assert_ne!(set, backend_set(&[node("a"), moved]));
    }

    #[test]
    fn only_exclusion_and_provider_id_changes_matter() {
        let base = node("a");
        let mut heartbeat = base.clone();
        heartbeat.metadata.labels = Some([("other".to_string(), "x".to_string())].into());
        heartbeat.metadata.resource_version = Some("99".into());
        assert_eq!(NodeFacts::of(&base), NodeFacts::of(&heartbeat));
        let mut moved = base.clone();
        moved.spec.as_mut().unwrap().provider_id = Some("fake://other".into());
        assert_ne!(NodeFacts::of(&base), NodeFacts::of(&moved));
        assert_ne!(NodeFacts::of(&base), NodeFacts::of(&excluded("true")));
    }

    #[test]
    fn the_autoscaler_taint_triggers_a_sync_and_a_new_label_only_invalidates_the_backends() {
        let base = node("a");
        let mut scaling = base.clone();
        scaling.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: TAINT_TO_BE_DELETED.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert_ne!(BackendFacts::of(&base), BackendFacts::of(&scaling));
        // The taint takes the node out of every load balancer at once (upstream waits for its periodic
        // pass).
        assert_ne!(
            BackendFacts::of(&base).sync_facts(),
            BackendFacts::of(&scaling).sync_facts()
        );
        // Other taints do not matter.
        let mut cordoned = base.clone();
        cordoned.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert_eq!(BackendFacts::of(&base), BackendFacts::of(&cordoned));
        // A new label makes the cached backends stale, without a node sync (as upstream).
        let mut labelled = base.clone();
        labelled.metadata.labels = Some([("pool".to_string(), "edge".to_string())].into());
        assert_ne!(BackendFacts::of(&base), BackendFacts::of(&labelled));
        assert_eq!(
            BackendFacts::of(&base).sync_facts(),
            BackendFacts::of(&labelled).sync_facts()
        );
    }
}
