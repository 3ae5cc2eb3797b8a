//! Which nodes this manager owns (not in upstream): a cluster with nodes of two clouds, or cloud and
//! bare-metal nodes, can run a manager per cloud, each acting on its own nodes only.
//!
//! A node is owned when it matches `--node-selector` (default: every node) and either its provider ID
//! is this provider's (`aws://…`, `local://…`; [`CloudProvider::owns_provider_id`]) or,
//! before it has one, the provider recognizes it ([`CloudProvider::recognizes_node`]; default: every
//! node, upstream's assumption). The controllers act on owned nodes only: the cloud-node controller
//! initializes and refreshes them, the lifecycle controller deletes or taints them, the route controller
//! routes them and node IPAM allocates their CIDRs (seeing every node's, so no range is given twice);
//! load-balancer backends are owned nodes unless the provider reaches others
//! ([`LoadBalancer::backends_beyond_owned_nodes`](cloud_provider::LoadBalancer::backends_beyond_owned_nodes)).

use std::sync::Arc;

use cloud_provider::CloudProvider;
use k8s_openapi::api::core::v1::Node;

use crate::node_selector::NodeSelector;

/// The rule that says which nodes are this manager's.
#[derive(Clone)]
pub struct NodeOwnership {
    /// `None`: every node (a controller run outside a manager, in tests).
    rule: Option<Arc<Rule>>,
}

struct Rule {
    selector: NodeSelector,
    cloud: Arc<dyn CloudProvider>,
}

impl std::fmt::Debug for NodeOwnership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.rule {
            None => f.write_str("NodeOwnership(every node)"),
            Some(rule) => f
                .debug_struct("NodeOwnership")
                .field("selector", &rule.selector.as_str())
                .field("provider", &rule.cloud.provider_name())
                .finish(),
        }
    }
}

impl NodeOwnership {
    /// The nodes matching `selector` that are `cloud`'s.
    pub fn new(selector: NodeSelector, cloud: Arc<dyn CloudProvider>) -> Self {
        Self {
            rule: Some(Arc::new(Rule { selector, cloud })),
        }
    }

    /// Every node, whatever its provider ID (for controllers run on their own, in tests).
    pub fn every_node() -> Self {
        Self { rule: None }
    }

    /// Whether `node` is this manager's.
    pub fn owns(&self, node: &Node) -> bool {
        let Some(rule) = &self.rule else {
            return true;
        };
        if !rule.selector.matches(node.metadata.labels.as_ref()) {
            return false;
        }
        match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(id) if !id.is_empty() => rule.cloud.owns_provider_id(id),
            _ => rule.cloud.recognizes_node(node),
        }
    }

    /// The nodes of `nodes` that are this manager's.
    pub fn owned<N: std::ops::Deref<Target = Node>>(&self, nodes: Vec<Arc<N>>) -> Vec<Arc<N>> {
        nodes.into_iter().filter(|n| self.owns(n)).collect()
    }

    /// Whether no `--node-selector` narrows the nodes.
    pub fn selects_everything(&self) -> bool {
        self.rule
            .as_ref()
            .is_none_or(|rule| rule.selector.is_everything())
    }
}
