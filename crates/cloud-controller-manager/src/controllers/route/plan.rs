//! Pure planning for the route controller: which routes to keep, delete and create, and the
//! `NetworkUnavailable` condition each node should carry.

use crate::cached_node::CachedNode;
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use cloud_provider::Route;
use ipnet::IpNet;
use k8s_openapi::{
    api::core::v1::{Node, NodeAddress},
    jiff::Timestamp,
};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::cidrs::overlaps;

/// What a node's pod CIDR needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Its route exists and is right.
    Keep,
    /// Its route exists but the node's addresses changed (only for routes that carry them).
    Update,
    /// It has no route.
    Add,
}

/// One pass's work.
#[derive(Debug, Default)]
pub struct RoutePlan {
    /// Per (node, pod CIDR).
    pub actions: HashMap<(String, String), Action>,
    /// Routes to delete: inside a cluster CIDR and a blackhole, stale, or to be re-created.
    pub delete: Vec<Route>,
    /// Routes to create (node, pod CIDR).
    pub create: Vec<(Arc<CachedNode>, String)>,
    /// Nodes some existing route points at.
    pub route_targets: HashSet<String>,
}

fn pod_cidrs(node: &Node) -> &[String] {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_deref())
        .unwrap_or_default()
}

fn same_addresses(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    let key = |list: &[NodeAddress]| {
        let mut pairs: Vec<(String, String)> = list
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect();
        pairs.sort();
        pairs
    };
    key(a) == key(b)
}

/// Plans a pass (upstream's `reconcile`): every `spec.podCIDRs` entry of every node needs a route to the
/// node; only routes inside a cluster CIDR are ever deleted.
pub fn plan_routes(
    nodes: &[Arc<CachedNode>],
    existing: &[Route],
    cluster_cidrs: &[IpNet],
) -> RoutePlan {
    let mut by_node: HashMap<&str, Vec<&Route>> = HashMap::new();
    let mut plan = RoutePlan::default();
    for route in existing.iter().filter(|r| !r.target_node.is_empty()) {
        by_node
            .entry(route.target_node.as_str())
            .or_default()
            .push(route);
        plan.route_targets.insert(route.target_node.clone());
    }
    for node in nodes {
        let name = node.name_any();
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or_default();
        for cidr in pod_cidrs(node) {
            let route = by_node
                .get(name.as_str())
                .and_then(|routes| routes.iter().find(|r| &r.destination_cidr == cidr));
            let action = match route {
                Some(r)
                    if !r.enable_node_addresses
                        || same_addresses(&r.target_node_addresses, addresses) =>
                {
                    Action::Keep
                }
                Some(_) => Action::Update,
                None => Action::Add,
            };
            plan.actions.insert((name.clone(), cidr.clone()), action);
            if action != Action::Keep {
                plan.create.push((node.clone(), cidr.clone()));
            }
        }
    }
    for route in existing {
        let Ok(destination) = route.destination_cidr.parse::<IpNet>() else {
            continue; // not ours to judge
        };
        if !cluster_cidrs
            .iter()
            .any(|cluster| overlaps(cluster, &destination))
        {
            continue;
        }
        let action = plan
            .actions
            .get(&(route.target_node.clone(), route.destination_cidr.clone()));
        if route.blackhole || matches!(action, None | Some(Action::Update)) {
            plan.delete.push(route.clone());
        }
    }
    plan
}

/// The `NetworkUnavailable` condition a node should have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionWanted {
    /// `False` / `RouteCreated`: every pod CIDR has its route.
    Created,
    /// `True` / `NoRouteCreated`.
    NotCreated,
}

/// All routes kept (and at least one) → created; anything else → not created.
pub fn wanted_condition(actions: &[Action]) -> ConditionWanted {
    if !actions.is_empty() && actions.iter().all(|a| *a == Action::Keep) {
        ConditionWanted::Created
    } else {
        ConditionWanted::NotCreated
    }
}

/// The strategic merge patch for `nodes/status` that sets the condition, or `None` when the node has it
/// already (same status and reason; a foreign reason such as a CNI's is overwritten).
pub fn condition_patch(node: &Node, wanted: ConditionWanted, now: Timestamp) -> Option<Value> {
    let (status, reason, message) = match wanted {
        ConditionWanted::Created => ("False", "RouteCreated", "RouteController created a route"),
        ConditionWanted::NotCreated => (
            "True",
            "NoRouteCreated",
            "RouteController failed to create a route",
        ),
    };
    let current = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"));
    if current.is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason)) {
        return None;
    }
    let now = now.to_string();
    Some(json!({ "status": { "conditions": [{
        "type": "NetworkUnavailable",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }]}}))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn node(name: &str, cidrs: &[&str]) -> Arc<CachedNode> {
        Arc::new(CachedNode::from(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
                ..Default::default()
            }),
            status: Some(NodeStatus::default()),
        }))
    }

    fn route(target: &str, cidr: &str, blackhole: bool) -> Route {
        Route {
            name: format!("r-{target}-{cidr}"),
            target_node: target.into(),
            destination_cidr: cidr.into(),
            blackhole,
            ..Default::default()
        }
    }

    fn cluster() -> Vec<IpNet> {
        vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/56".parse().unwrap(),
        ]
    }

    #[test]
    fn missing_routes_are_added_for_every_pod_cidr() {
        let nodes = [
            node("a", &["10.244.1.0/24", "fd00:10:244:1::/64"]),
            node("b", &["10.244.2.0/24"]),
        ];
        let existing = [route("b", "10.244.2.0/24", false)];
        let plan = plan_routes(&nodes, &existing, &cluster());
        let created: Vec<_> = plan
            .create
            .iter()
            .map(|(n, c)| (n.name_any(), c.clone()))
            .collect();
        assert_eq!(
            created,
            [
                ("a".to_string(), "10.244.1.0/24".to_string()),
                ("a".to_string(), "fd00:10:244:1::/64".to_string())
            ]
        );
        assert_eq!(
            plan.actions[&("b".to_string(), "10.244.2.0/24".to_string())],
            Action::Keep
        );
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn stale_and_blackhole_routes_inside_the_cluster_are_deleted_others_left_alone() {
        let nodes = [node("a", &["10.244.1.0/24"])];
        let existing = [
            route("a", "10.244.1.0/24", false),
            route("gone", "10.244.9.0/24", false),
            route("a", "10.244.1.0/24", true),
            route("", "10.244.7.0/24", true),
            route("elsewhere", "192.168.0.0/24", false),
            route("elsewhere", "192.168.1.0/24", true),
            route("weird", "not-a-cidr", true),
        ];
        let plan = plan_routes(&nodes, &existing, &cluster());
        let deleted: Vec<_> = plan
            .delete
            .iter()
            .map(|r| {
                (
                    r.target_node.as_str(),
                    r.destination_cidr.as_str(),
                    r.blackhole,
                )
            })
            .collect();
        assert_eq!(
            deleted,
            [
                ("gone", "10.244.9.0/24", false),
                ("a", "10.244.1.0/24", true),
                ("", "10.244.7.0/24", true)
            ]
        );
        assert!(plan.create.is_empty());
        assert!(plan.route_targets.contains("gone") && !plan.route_targets.contains(""));
    }

    #[test]
    fn address_changes_matter_only_for_routes_that_carry_addresses() {
        let mut with_addresses = route("a", "10.244.1.0/24", false);
        with_addresses.enable_node_addresses = true;
        with_addresses.target_node_addresses = vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        }];
        let plan = plan_routes(
            &[node("a", &["10.244.1.0/24"])],
            &[with_addresses.clone()],
            &cluster(),
        );
        assert_eq!(plan.actions.values().next(), Some(&Action::Update));
        assert_eq!(plan.delete.len(), 1, "re-created: deleted first");
        assert_eq!(plan.create.len(), 1);
        with_addresses.enable_node_addresses = false;
        let plan = plan_routes(
            &[node("a", &["10.244.1.0/24"])],
            &[with_addresses],
            &cluster(),
        );
        assert_eq!(plan.actions.values().next(), Some(&Action::Keep));
    }

    #[test]
    fn conditions() {
        assert_eq!(
            wanted_condition(&[Action::Keep, Action::Keep]),
            ConditionWanted::Created
        );
        assert_eq!(
            wanted_condition(&[Action::Keep, Action::Add]),
            ConditionWanted::NotCreated
        );
        assert_eq!(wanted_condition(&[]), ConditionWanted::NotCreated);
        let now = Timestamp::UNIX_EPOCH;
        let n = node("a", &[]);
        let patch = condition_patch(&n, ConditionWanted::Created, now).unwrap();
        assert_eq!(patch["status"]["conditions"][0]["reason"], "RouteCreated");
        assert_eq!(patch["status"]["conditions"][0]["status"], "False");
        let mut set = n.node().clone();
        set.status.as_mut().unwrap().conditions = Some(vec![NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("RouteCreated".into()),
            ..Default::default()
        }]);
        assert_eq!(
            condition_patch(&set, ConditionWanted::Created, now),
            None,
            "no write when set"
        );
        // A CNI's reason with the same status is overwritten.
        set.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some("CalicoIsUp".into());
        assert!(condition_patch(&set, ConditionWanted::Created, now).is_some());
        assert_eq!(
            condition_patch(&set, ConditionWanted::NotCreated, now).unwrap()["status"]["conditions"]
                [0]["reason"],
            "NoRouteCreated"
        );
    }
}
