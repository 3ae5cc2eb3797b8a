//! When routes are reconciled: every `--route-reconciliation-period` (upstream's default), or, with the
//! `CloudControllerManagerWatchBasedRoutesReconciliation` gate (KEP-5237), as soon as a node that
//! matters to routes changes (added, deleted, or its `spec.podCIDRs` or `status.addresses` changed), at
//! most one pass per [`MIN_INTERVAL`] as upstream's rate limiter allows, with the period kept as a
//! safety net.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::informers::Change;

/// Upstream's `minRouteResyncInterval`: node changes start at most one pass per 10 s.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// What started a pass (the `trigger` label of `route_controller_route_sync_total`; upstream's work-queue
/// keys `routesSyncKey` and `routeCorrectionsKey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The period.
    Periodic,
    /// A node change (watch-based mode only).
    NodeChange,
}

impl Trigger {
    /// Every trigger.
    #[cfg(test)]
    pub const ALL: [Self; 2] = [Self::Periodic, Self::NodeChange];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Periodic => "periodic",
            Self::NodeChange => "node_change",
        }
    }
}

/// The part of a node routes depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RouteView {
    pod_cidrs: Vec<String>,
    addresses: Vec<(String, String)>,
}

fn view(node: &Node) -> RouteView {
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|list| {
            list.iter()
                .map(|NodeAddress { type_, address }| (type_.clone(), address.clone()))
                .collect()
        })
        .unwrap_or_default();
    RouteView {
        pod_cidrs: node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default(),
        addresses,
    }
}

/// The nodes as routes last saw them, to tell the changes that matter from the rest (a heartbeat,
/// a label).
#[derive(Debug, Default)]
pub struct NodeViews {
    views: HashMap<String, RouteView>,
}

impl NodeViews {
    /// Whether `change` matters to routes (and remembers the node's view).
    pub fn matters(&mut self, change: &Change<impl AsRef<Node>>) -> bool {
        match change {
            Change::Applied(node) => {
                let node = node.as_ref().as_ref();
                let name = node.metadata.name.clone().unwrap_or_default();
                let now = view(node);
                self.views.insert(name, now.clone()) != Some(now)
            }
            Change::Deleted(node) => {
                let name = node
                    .as_ref()
                    .as_ref()
                    .metadata
                    .name
                    .clone()
                    .unwrap_or_default();
                self.views.remove(&name);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cached_node::CachedNode;

    fn node(name: &str, cidrs: &[&str], address: &str, label: &str) -> Arc<CachedNode> {
        Arc::new(CachedNode::from(
            serde_json::from_value::<Node>(serde_json::json!({
                "metadata": {"name": name, "labels": {"l": label}},
                "spec": {"podCIDRs": cidrs},
                "status": {"addresses": [{"type": "InternalIP", "address": address}]}
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn only_changes_routes_depend_on_matter() {
        let mut views = NodeViews::default();
        let steps: [(Change<CachedNode>, bool, &str); 7] = [
            (
                Change::Applied(node("a", &[], "10.0.0.1", "x")),
                true,
                "a new node",
            ),
            (
                Change::Applied(node("a", &[], "10.0.0.1", "y")),
                false,
                "a label",
            ),
            (
                Change::Applied(node("a", &["10.244.1.0/24"], "10.0.0.1", "y")),
                true,
                "its pod CIDR",
            ),
            (
                Change::Applied(node("a", &["10.244.1.0/24"], "10.0.0.1", "y")),
                false,
                "the same again",
            ),
            (
                Change::Applied(node("a", &["10.244.1.0/24"], "10.0.0.2", "y")),
                true,
                "its address",
            ),
            (
                Change::Deleted(node("a", &["10.244.1.0/24"], "10.0.0.2", "y")),
                true,
                "deleted",
            ),
            (
                Change::Applied(node("a", &["10.244.1.0/24"], "10.0.0.2", "y")),
                true,
                "back again",
            ),
        ];
        for (change, expected, what) in steps {
            assert_eq!(views.matters(&change), expected, "{what}");
        }
        assert_eq!(Trigger::NodeChange.label(), "node_change");
    }
}
