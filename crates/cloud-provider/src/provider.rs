//! The top-level provider trait (upstream `cloudprovider.Interface`).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use tokio_util::sync::CancellationToken;

use crate::{
    ApiOutage, CloudResult, Clusters, Instances, InstancesV2, LoadBalancer, Routes, Supervisor,
    Zones,
};

/// What the manager hands a provider in [`CloudProvider::initialize`].
#[derive(Clone)]
pub struct InitializeContext {
    /// A client for the cluster's API server, with the manager's identity and rate limits.
    pub client: kube::Client,
    /// Cancelled when the manager shuts down (or loses leadership); stop background work then. For a
    /// provider that [hands off its traffic](CloudProvider::hands_off_traffic), a graceful stop cancels
    /// it only after [`CloudProvider::hand_off`].
    pub shutdown: CancellationToken,
    /// Whether the leader is riding out an outage of the API server, for a provider that
    /// [rides them out](CloudProvider::rides_out_api_outages); never, for the others.
    pub api_outage: ApiOutage,
    /// The cluster's name (`--cluster-name`): the one the load-balancer calls get, for a provider whose
    /// background work must tell its own cluster's cloud objects from another's.
    pub cluster_name: String,
    /// Where the provider starts its background tasks ([`Supervisor::spawn`]), stopping with `shutdown`:
    /// a task that panics is started again, one that keeps panicking or ends unexpectedly fails the
    /// manager's health check. Nothing a provider spawns is to end unseen.
    pub supervisor: Supervisor,
}

/// A cloud: the entry point of a provider.
///
/// Each capability is an accessor returning `Option`: `None` means "this cloud does not offer it" (Go's
/// `(impl, false)`), and the controllers that need it do not start. Only [`CloudProvider::provider_name`]
/// is required; a provider implements the parts it supports.
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// Called once, by the leader, right before the controllers start. A provider may start background
    /// tasks here, with `ctx.supervisor`; they stop when `ctx.shutdown` is cancelled.
    async fn initialize(&self, ctx: InitializeContext) -> CloudResult<()> {
        let _ = ctx;
        Ok(())
    }

    /// Service load balancers.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        None
    }

    /// The legacy instances API (used only when [`CloudProvider::instances_v2`] is `None`).
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }

    /// The node-object instances API; when offered it replaces [`CloudProvider::instances`] and
    /// [`CloudProvider::zones`] in the node controllers.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        None
    }

    /// Zones (deprecated; consulted only without [`CloudProvider::instances_v2`]).
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }

    /// Clusters (no generic controller uses it).
    fn clusters(&self) -> Option<&dyn Clusters> {
        None
    }

    /// Pod-CIDR routes.
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }

    /// The provider's name: the prefix of its provider IDs (`<name>://...`) and the name in logs.
    fn provider_name(&self) -> &str;

    /// Whether a provider ID is one of this cloud's: a node whose provider ID is not is another
    /// manager's, and no controller of this one touches it. The default: the ID's scheme is
    /// [`CloudProvider::provider_name`] (`<name>://...`). Called often: no cloud call here.
    fn owns_provider_id(&self, provider_id: &str) -> bool {
        provider_id
            .strip_prefix(self.provider_name())
            .is_some_and(|rest| rest.starts_with("://"))
    }

    /// Whether a node that has no provider ID yet is one of this cloud's machines, so this manager
    /// initializes it. The default, every node, is upstream's assumption; a provider that can tell
    /// (an inventory, a naming rule) answers `false` for the others, so a manager of another cloud (or
    /// none, for bare-metal nodes) can have them. Called often: no cloud call here.
    fn recognizes_node(&self, node: &Node) -> bool {
        let _ = node;
        true
    }

    /// Whether the cloud knows the cluster's ID. The manager refuses to start without one unless
    /// `--allow-untagged-cloud` is set.
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// Whether the leader should ride out an API server it cannot reach instead of exiting at its renew
    /// deadline (see [`crate::api_outage`]). `false`, upstream's behaviour, suits a provider whose data
    /// plane is the cloud's; answer `true` when the manager's own process carries traffic, and watch
    /// [`InitializeContext::api_outage`] to step down when another replica serves. Asked once, before
    /// [`CloudProvider::initialize`].
    fn rides_out_api_outages(&self) -> bool {
        false
    }

    /// Whether this process carries traffic that it hands over to the next leader on a graceful stop
    /// ([`CloudProvider::hand_off`]). When `true`, [`InitializeContext::shutdown`] is cancelled on a
    /// graceful stop only after `hand_off` returns (so the data plane serves meanwhile), and at once when
    /// leadership is lost; when `false` (the default) it is cancelled with the controllers. Asked once,
    /// before [`CloudProvider::initialize`].
    fn hands_off_traffic(&self) -> bool {
        false
    }

    /// Hands the traffic this process carries over to the next leader, on a graceful stop (a shutdown
    /// signal; never after a lost lease, when another replica may serve already): called once the
    /// controllers have finished their in-flight work and the Lease is released (so the next leader can
    /// start); the manager exits when it returns. Called only when
    /// [`CloudProvider::hands_off_traffic`]. Keep it within the pod's termination grace period.
    async fn hand_off(&self) {}

    /// Adds the provider's own metrics to the manager's `/metrics` (for example its cloud API throttling
    /// or its data plane's traffic). Called once, before [`CloudProvider::initialize`]; the metrics are
    /// served by every replica, leader or not. Prefix the names with the provider's name.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}
