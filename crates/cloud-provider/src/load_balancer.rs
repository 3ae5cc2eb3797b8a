//! Service load balancers (upstream `cloudprovider.LoadBalancer`).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::{CloudResult, helpers::default_load_balancer_name};

/// Creates, updates and deletes the cloud load balancer of a `type: LoadBalancer` Service.
///
/// Every method receives the `--cluster-name` value and the Service; treat both the Service and the
/// Nodes as read-only. The backend Nodes are the manager's cached objects themselves, shared (as
/// upstream passes its lister's `*v1.Node` pointers): a load balancer's thousands of backends cost no
/// copy; clone one only to change it. All methods must be idempotent: the service controller retries freely.
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
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus>;

    /// The node label keys this Service's load balancer selects its backends by (say, a provider
    /// annotation that keeps only nodes with some labels): when one of these labels changes on a
    /// backend node, the service controller calls [`LoadBalancer::update_load_balancer`] for this
    /// Service, as it does when nodes come and go. The default, none, means a label change never
    /// matters to this load balancer (upstream's framework never passes one on, kubernetes#133165).
    fn backend_label_keys(&self, service: &Service) -> Vec<String> {
        let _ = service;
        Vec::new()
    }

    /// The Service label keys this cloud's load balancers depend on (say, address pools limited to
    /// Services with some labels): when one of these labels changes on a Service, the service
    /// controller ensures its load balancer again. The default, none, is upstream's: a Service's labels
    /// never matter to its load balancer.
    fn service_label_keys(&self) -> Vec<String> {
        Vec::new()
    }

    /// When the provider's own settings change in a way that can change what
    /// [`LoadBalancer::ensure_load_balancer`] does for Services that did not change (say, an address
    /// pool edited in a reloaded cloud-config), no Service or Node event shows it. A provider whose
    /// settings can change while it runs returns a receiver here and bumps its value on each such
    /// change. The service controller then previews every synced load balancer
    /// ([`LoadBalancer::preview_load_balancer`]) at once and ensures again those it would change (every
    /// one, when the provider cannot preview), without waiting for the drift check's next round. The
    /// default, `None`, is upstream's: settings never change behind the Services' back.
    fn settings_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Whether this cloud's load balancers can send traffic to nodes this manager does not own
    /// (another cloud's, or bare-metal ones: see `--node-selector`). By default they cannot, and their
    /// backends are the owned nodes only; a provider whose data path reaches any node's address (as
    /// `local`'s does) answers `true` to get every eligible node.
    fn backends_beyond_owned_nodes(&self) -> bool {
        false
    }

    /// Changes only the set of backend nodes of an existing load balancer.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
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

    /// Whether this provider keeps a load balancer when its Service goes, for a Service that asks
    /// (`ccm.rs/load-balancer-retain: "true"`): see [`LoadBalancer::retain_load_balancer`]. The
    /// default is `false`, and the manager then refuses such a Service out loud (its condition says
    /// `Refused`) rather than delete what the user asked to keep.
    fn retains_load_balancers(&self) -> bool {
        false
    }

    /// Instead of deleting it, keeps the load balancer of a Service that is going (deleted, or no
    /// longer a LoadBalancer) and asked for it (`ccm.rs/load-balancer-retain: "true"`), with its
    /// address, for a later Service of the same namespace and name: that Service's
    /// [`LoadBalancer::ensure_load_balancer`] adopts it (the same address). Stop serving its traffic
    /// (its Service is gone), record that it is retained and for whom where it outlives the manager,
    /// and report it from [`LoadBalancer::list_load_balancers`] with
    /// [`ClusterLoadBalancer::retained`] set, so the sweep leaves it;
    /// [`LoadBalancer::delete_orphaned_load_balancer`] of it releases it (an operator's release).
    /// Succeed when it is gone already. The default answers
    /// [`CloudError::NotImplemented`](crate::CloudError::NotImplemented), with
    /// [`LoadBalancer::retains_load_balancers`] `false`.
    async fn retain_load_balancer(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        let _ = (cluster_name, service);
        Err(crate::CloudError::NotImplemented)
    }

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
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        let _ = (cluster_name, service, nodes);
        Ok(LoadBalancerPreview::Unknown)
    }

    /// Every load balancer this provider made for Services of the cluster `cluster_name`, for the
    /// service controller's sweep of load balancers whose Service is gone
    /// (`--orphaned-load-balancer-sweep-period`).
    ///
    /// List only what [`LoadBalancer::ensure_load_balancer`] created for this cluster (by its tags, or
    /// whatever marks ownership in the cloud), never a load balancer made by hand or by another cluster:
    /// the sweep deletes every listed one whose [`ClusterLoadBalancer::name`] is not
    /// [`LoadBalancer::get_load_balancer_name`] of a Service that exists, unless its
    /// [`ClusterLoadBalancer::service`] names the UID of one that does, or it is
    /// [`ClusterLoadBalancer::retained`]. The default answers
    /// [`CloudError::NotImplemented`](crate::CloudError::NotImplemented): no sweep.
    async fn list_load_balancers(
        &self,
        cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let _ = cluster_name;
        Err(crate::CloudError::NotImplemented)
    }

    /// Deletes a load balancer [`LoadBalancer::list_load_balancers`] reported, whose Service no
    /// longer exists; succeeds when it is already gone. The Service itself is gone, so everything the
    /// deletion needs must come from the cloud (the load balancer's name, tags and kind).
    async fn delete_orphaned_load_balancer(
        &self,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        let _ = (cluster_name, load_balancer);
        Err(crate::CloudError::NotImplemented)
    }
}

/// A load balancer a provider made for a Service of the cluster
/// ([`LoadBalancer::list_load_balancers`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLoadBalancer {
    /// Its cloud-side name: [`LoadBalancer::get_load_balancer_name`] of the Service it was made for.
    pub name: String,
    /// The Service it was made for, when the cloud records it (a tag, say): named in the sweep's log
    /// and event. A recorded [`ServiceRef::uid`] is a claim: the sweep leaves a load balancer whose UID
    /// is of a Service that exists (the later Service that adopted a kept one, whose name does not
    /// follow from its own UID).
    pub service: Option<ServiceRef>,
    /// Anything else the provider needs to delete it (an ARN, a kind), opaque to the manager.
    pub handle: String,
    /// Kept for [`ClusterLoadBalancer::service`] after that Service went
    /// ([`LoadBalancer::retain_load_balancer`]): the sweep never deletes it.
    pub retained: bool,
}

impl ClusterLoadBalancer {
    /// The load balancer named `name`, made for `service` when known.
    pub fn new(name: impl Into<String>, service: Option<ServiceRef>) -> Self {
        Self {
            name: name.into(),
            service,
            handle: String::new(),
            retained: false,
        }
    }

    /// Marked as retained for its Service ([`ClusterLoadBalancer::retained`]).
    pub fn retained(mut self) -> Self {
        self.retained = true;
        self
    }

    /// With the provider's own `handle` (see [`ClusterLoadBalancer::handle`]).
    pub fn with_handle(mut self, handle: impl Into<String>) -> Self {
        self.handle = handle.into();
        self
    }
}

/// A Service by namespace and name (and UID when known).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, when known.
    pub uid: Option<String>,
}

impl ServiceRef {
    /// The Service `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: None,
        }
    }

    /// With its UID.
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// Parses `namespace/name` (as cloud tags often hold it); `None` for anything else.
    pub fn parse(namespaced_name: &str) -> Option<Self> {
        let (namespace, name) = namespaced_name.split_once('/')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
            .then(|| Self::new(namespace, name))
    }
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
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
