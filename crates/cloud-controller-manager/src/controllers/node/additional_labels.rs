//! `CloudNodeAdditionalLabelsReconciliation` (1.38, alpha, off by default): with the gate on, the
//! periodic node status update also adds or updates the labels the cloud returns in
//! `InstanceMetadata::additional_labels`, as upstream's `reconcileAdditionalLabels`
//! (k8s.io/cloud-provider v0.38.0-beta.0, `controllers/node/node_controller.go`):
//!
//! - a label the node lacks, or holds with another value, is set to the cloud's value (the cloud wins
//!   over whoever changed it);
//! - a label is never deleted, not even one the cloud no longer returns;
//! - keys in a Kubernetes-reserved namespace ([`is_kubernetes_namespaced`], upstream's
//!   `k8sNamespaceRegex`) are dropped, and said in the log;
//! - labels already right: nothing is written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::plan::is_kubernetes_namespaced;

/// What one pass does to a node's labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelsPlan {
    /// Labels to add or change (key → the cloud's value).
    pub set: BTreeMap<String, String>,
    /// The cloud's keys dropped for lying in a Kubernetes-reserved namespace.
    pub dropped: Vec<String>,
}

/// Plans the labels to add or update on `node` from the cloud's `additional` labels.
pub fn plan(node: &Node, additional: &BTreeMap<String, String>) -> LabelsPlan {
    let current = node.metadata.labels.as_ref();
    let mut plan = LabelsPlan::default();
    for (key, value) in additional {
        if is_kubernetes_namespaced(key) {
            plan.dropped.push(key.clone());
            continue;
        }
        if current.and_then(|labels| labels.get(key)) != Some(value) {
            plan.set.insert(key.clone(), value.clone());
        }
    }
    plan
}

/// The merge patch that sets `labels` (and touches no other label).
pub fn patch(labels: &BTreeMap<String, String>) -> Value {
    json!({ "metadata": { "labels": labels } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        if !labels.is_empty() {
            node.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        node
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn adds_and_updates_never_deletes_and_drops_reserved_namespaces() {
        type Case<'a> = (
            &'a str,
            &'a [(&'a str, &'a str)],
            &'a [(&'a str, &'a str)],
            &'a [(&'a str, &'a str)],
            &'a [&'a str],
        );
        // (what, node's labels, cloud's labels, set, dropped)
        let cases: &[Case] = &[
            ("nothing from the cloud", &[("a", "1")], &[], &[], &[]),
            (
                "a node without labels",
                &[],
                &[("example.com/rack", "r1")],
                &[("example.com/rack", "r1")],
                &[],
            ),
            (
                "already right: quiet",
                &[("example.com/rack", "r1")],
                &[("example.com/rack", "r1")],
                &[],
                &[],
            ),
            (
                "a changed value is set back",
                &[("example.com/rack", "mine")],
                &[("example.com/rack", "r1")],
                &[("example.com/rack", "r1")],
                &[],
            ),
            (
                "an empty value is a value",
                &[("example.com/flag", "x")],
                &[("example.com/flag", "")],
                &[("example.com/flag", "")],
                &[],
            ),
            (
                "labels the cloud no longer returns stay",
                &[("example.com/old", "1"), ("example.com/rack", "r1")],
                &[("example.com/rack", "r1")],
                &[],
                &[],
            ),
            (
                "reserved namespaces dropped, the rest applied",
                &[],
                &[
                    ("kubernetes.io/role", "x"),
                    ("k8s.io/x", "x"),
                    ("topology.kubernetes.io/extra", "x"),
                    ("node.k8s.io/extra", "x"),
                    ("k8snio/kept", "yes"),
                    ("mykubernetes.io/kept", "yes"),
                    ("plain", "yes"),
                ],
                &[
                    ("k8snio/kept", "yes"),
                    ("mykubernetes.io/kept", "yes"),
                    ("plain", "yes"),
                ],
                &[
                    "k8s.io/x",
                    "kubernetes.io/role",
                    "node.k8s.io/extra",
                    "topology.kubernetes.io/extra",
                ],
            ),
            (
                "a reserved key the node holds with another value is left alone",
                &[("node.kubernetes.io/instance-type", "big")],
                &[("node.kubernetes.io/instance-type", "small")],
                &[],
                &["node.kubernetes.io/instance-type"],
            ),
        ];
        for (what, labels, cloud, set, dropped) in cases {
            let got = plan(&node(labels), &map(cloud));
            assert_eq!(got.set, map(set), "{what}");
            assert_eq!(got.dropped, *dropped, "{what}");
        }
    }

    /// Our reserved-namespace test against upstream's own regex, read from upstream's source (the
    /// pinned v0.37.1, whose initialization uses it, and v0.38.0-beta.0, whose label reconciliation
    /// does) in the Go module cache.
    #[test]
    fn reserved_namespaces_are_upstream_s_regex() {
        let keys = [
            "kubernetes.io/role",
            "k8s.io/x",
            "topology.kubernetes.io/zone",
            "node.k8s.io/x",
            "a.b.kubernetes.io/x",
            "k8snio/x",
            "k8s-io/x",
            "mykubernetes.io/x",
            "kubernetes.io",
            "kubernetes.iox/y",
            "example.com/kubernetes.io",
            "example.com/a.k8s.io/b",
            "x/k8s.io/y",
            "example.com/rack",
            "plain",
            "",
            ".k8s.io/x",
            "k8s.io.example.com/x",
        ];
        for version in ["v0.37.1", "v0.38.0-beta.0"] {
            let Some(source) = crate::upstream_source::read(
                "k8s.io/cloud-provider",
                version,
                "controllers/node/node_controller.go",
            ) else {
                return;
            };
            // v0.37.1 declares it in a function (`:=`), v0.38.0-beta.0 at package level (`=`).
            let pattern = source
                .split("k8sNamespaceRegex")
                .find_map(|rest| {
                    rest.trim_start_matches([' ', ':', '='])
                        .strip_prefix("regexp.MustCompile(`")
                })
                .and_then(|rest| rest.split('`').next())
                .expect("k8sNamespaceRegex");
            let upstream = regex_lite::Regex::new(pattern).expect(pattern);
            for key in keys {
                assert_eq!(
                    is_kubernetes_namespaced(key),
                    upstream.is_match(key),
                    "{version}: {pattern} on {key:?}"
                );
            }
        }
    }

    #[test]
    fn the_patch_names_only_the_labels_to_set() {
        assert_eq!(
            patch(&map(&[("example.com/rack", "r1")])),
            json!({"metadata": {"labels": {"example.com/rack": "r1"}}})
        );
    }
}
