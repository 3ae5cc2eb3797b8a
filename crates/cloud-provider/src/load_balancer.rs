//! Service load balancers (upstream `cloudprovider.LoadBalancer`).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::{CloudResult, helpers::default_load_balancer_name};

/// Creates, updates and deletes the cloud load balancer of a `type: LoadBalancer` Service.
///
/// Every method receives the `--cluster-name` value and the Service; treat both the Service and the
/// Nodes as read-only. All methods must be idempotent: the service controller retries freely.
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The load balancer of this Service, or `None` when none exists.
    ///
    /// If the provider lets another controller implement some load balancers
    /// ([`CloudError::ImplementedElsewhere`](crate::CloudError::ImplementedElsewhere)), it must still
    /// report one that the service controller created.
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>>;

    /// The deterministic cloud-side name of this Service's load balancer.
    ///
    /// Defaults to [`default_load_balancer_name`], which most providers keep for compatibility.
    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        let _ = cluster_name;
        default_load_balancer_name(service)
    }

    /// Creates or updates the load balancer so it matches the Service and sends traffic to `nodes`;
    /// returns the status to publish in the Service's `status.loadBalancer`.
    ///
    /// Return [`CloudError::RetryAfter`](crate::CloudError::RetryAfter) to be called again after a
    /// fixed delay (for example while the load balancer is still provisioning).
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Changes only the set of backend nodes of an existing load balancer.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<()>;

    /// Deletes the load balancer if it exists; succeeds when it did not.
    ///
    /// Must not return [`CloudError::ImplementedElsewhere`](crate::CloudError::ImplementedElsewhere):
    /// teardown has to happen even after the implementation moved elsewhere.
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()>;

    /// What [`LoadBalancer::ensure_load_balancer`] with these arguments would change, without changing
    /// anything: the manager's shadow mode (`--dry-run`) reports it instead of calling `ensure` or
    /// `update`.
    ///
    /// Read the cloud only. Compare what `ensure` would set (listeners, backends, and whatever else
    /// the provider derives from the Service) with what the load balancer has, and answer
    /// [`LoadBalancerPreview::UpToDate`] only when `ensure` would be a no-op. Name the backends that
    /// would be added or removed, and say in `detail` what else differs. The default answers
    /// [`LoadBalancerPreview::Unknown`], which the shadow reports as such, never as "up to date".
    async fn preview_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<LoadBalancerPreview> {
        let _ = (cluster_name, service, nodes);
        Ok(LoadBalancerPreview::Unknown)
    }
}

/// What ensuring a load balancer would change ([`LoadBalancer::preview_load_balancer`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LoadBalancerPreview {
    /// The load balancer exists and matches: ensuring it would change nothing.
    UpToDate,
    /// There is no load balancer: ensuring would create one.
    Create {
        /// The backends it would have (node names, sorted).
        backends: Vec<String>,
    },
    /// The load balancer exists and differs.
    #[serde(rename_all = "camelCase")]
    Change {
        /// Backends (node names) that would be added, sorted.
        backends_added: Vec<String>,
        /// Backends (node names) that would be removed, sorted.
        backends_removed: Vec<String>,
        /// Anything else that would change, in words (empty when only the backends differ).
        detail: String,
    },
    /// The provider cannot tell (it does not implement the preview).
    Unknown,
}
