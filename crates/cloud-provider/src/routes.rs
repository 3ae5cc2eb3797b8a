//! Pod-CIDR routes in the cloud's network (upstream `cloudprovider.Routes`).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::NodeAddress;

use crate::CloudResult;

/// A route that sends a pod CIDR to a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    /// The cloud-side name; ignored on create (the cloud may derive it from the name hint).
    pub name: String,
    /// The node the traffic goes to; empty when the cloud cannot attribute the route.
    pub target_node: String,
    /// Opt-in: when `true`, `target_node_addresses` is meaningful and an address change makes the route
    /// controller delete and recreate the route.
    pub enable_node_addresses: bool,
    /// The node's addresses when the route was created.
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR, IPv4 or IPv6, in CIDR notation.
    pub destination_cidr: String,
    /// A blackhole route; such routes inside the cluster CIDR are always deleted.
    pub blackhole: bool,
}

/// Lists, creates and deletes the routes of a cluster.
#[async_trait]
pub trait Routes: Send + Sync {
    /// All routes this cluster manages.
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>>;

    /// Creates a route. `name_hint` is the Node's UID; a provider that supports dual-stack must derive a
    /// unique name per (node, CIDR).
    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()>;

    /// Deletes a route as [`Routes::list_routes`] returned it.
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()>;
}
