//! Instances: the legacy per-node API ([`Instances`]) and the node-object API ([`InstancesV2`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::{CloudError, CloudResult};

/// The legacy instances API, keyed by node name or provider ID (upstream `cloudprovider.Instances`).
///
/// Prefer [`InstancesV2`]: when a provider offers it, the node controllers never call this trait nor
/// [`Zones`](crate::Zones).
#[async_trait]
pub trait Instances: Send + Sync {
    /// The addresses of the instance behind `node_name`.
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>>;

    /// The addresses of the instance with this provider ID.
    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>>;

    /// The cloud's instance ID (without the `<provider>://` prefix) of `node_name`.
    ///
    /// Return [`CloudError::InstanceNotFound`] when the instance does not exist, but never for a stopped
    /// instance; [`CloudError::NotImplemented`] lets the node controller go on without a provider ID.
    async fn instance_id(&self, node_name: &str) -> CloudResult<String>;

    /// The machine type of `node_name`.
    async fn instance_type(&self, node_name: &str) -> CloudResult<String>;

    /// The machine type of the instance with this provider ID.
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String>;

    /// Legacy; no generic controller calls it.
    async fn add_ssh_key_to_all_instances(&self, user: &str, key: &[u8]) -> CloudResult<()> {
        let _ = (user, key);
        Err(CloudError::NotImplemented)
    }

    /// Legacy: the node name of the machine with this hostname. Most clouds return the hostname.
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        Ok(hostname.to_owned())
    }

    /// Whether the instance exists. `Ok(false)` makes the lifecycle controller delete the Node at once,
    /// so a stopped instance must still report `true`.
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;

    /// Whether the instance is shut down. [`CloudError::NotImplemented`] counts as "not shut down".
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
}

/// The instances API for external providers (upstream `cloudprovider.InstancesV2`): each call gets the
/// whole Node, so a provider can look at `spec.providerID` first and fall back to the name, labels or
/// annotations.
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the node's instance exists (same contract as
    /// [`Instances::instance_exists_by_provider_id`]).
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;

    /// Whether the node's instance is shut down (same contract as
    /// [`Instances::instance_shutdown_by_provider_id`]).
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;

    /// Everything needed to initialize the node, in one call. `Ok(None)` makes the cloud-node
    /// controller skip the node silently.
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;
}

/// What the cloud knows about a node's instance (upstream `cloudprovider.InstanceMetadata`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// Lands in `spec.providerID` when the node has none. Conventionally `<provider-name>://<instance-id>`;
    /// it must stay stable for the life of the instance.
    pub provider_id: String,
    /// The labels `node.kubernetes.io/instance-type` and `beta.kubernetes.io/instance-type` (when not empty).
    pub instance_type: String,
    /// The node's `status.addresses` (after the provided-node-ip filter).
    pub node_addresses: Vec<NodeAddress>,
    /// The labels `topology.kubernetes.io/zone` and `failure-domain.beta.kubernetes.io/zone` (when not empty).
    pub zone: String,
    /// The labels `topology.kubernetes.io/region` and `failure-domain.beta.kubernetes.io/region` (when not empty).
    pub region: String,
    /// Further labels for the node, applied at initialization. Labels in Kubernetes' own namespaces are
    /// dropped, and at initialization existing labels are never overwritten. With the
    /// `CloudNodeAdditionalLabelsReconciliation` gate (1.38, alpha, off by default), missing labels and
    /// changed values are also set again at every node status update
    /// (`--node-status-update-frequency`): the cloud's value then overwrites another writer's; a label
    /// no longer returned is never removed.
    pub additional_labels: BTreeMap<String, String>,
}

/// A [`NodeAddress`] of the given type (`InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`).
pub fn node_address(type_: &str, address: impl Into<String>) -> NodeAddress {
    NodeAddress {
        type_: type_.to_owned(),
        address: address.into(),
    }
}
