//! What the node controllers ask the cloud, through InstancesV2 or the legacy Instances + Zones APIs.

use std::{collections::BTreeMap, future::Future};

use cloud_provider::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, get_instance_provider_id,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

/// Why the cloud could not describe a node.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// A cloud call failed.
    #[error("{call} failed for node {node}: {source}")]
    Cloud {
        /// The call.
        call: &'static str,
        /// The node.
        node: String,
        /// The cloud's error.
        #[source]
        source: CloudError,
    },
    /// InstancesV2 gave no provider ID and the node has none (upstream keeps the taint and retries).
    #[error("cloud provider does not set node provider ID for node {0}")]
    NoProviderId(String),
    /// The provider offers neither Instances nor InstancesV2.
    #[error("cloud provider does not support instances")]
    Unsupported,
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn provider_id(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|id| !id.is_empty())
}

fn cloud_error<'a>(
    call: &'static str,
    node: &'a Node,
) -> impl FnOnce(CloudError) -> LookupError + 'a {
    move |source| LookupError::Cloud {
        call,
        node: name(node),
        source,
    }
}

/// Everything needed to initialize `node`. `Ok(None)`: InstancesV2 returned no metadata (skip silently).
pub async fn instance_metadata(
    cloud: &dyn CloudProvider,
    node: &Node,
) -> Result<Option<InstanceMetadata>, LookupError> {
    if let Some(instances) = cloud.instances_v2() {
        let Some(mut metadata) = instances
            .instance_metadata(node)
            .await
            .map_err(cloud_error("instance_metadata", node))?
        else {
            return Ok(None);
        };
        if metadata.provider_id.is_empty() {
            metadata.provider_id = provider_id(node)
                .ok_or_else(|| LookupError::NoProviderId(name(node)))?
                .to_owned();
        }
        return Ok(Some(metadata));
    }
    let Some(instances) = cloud.instances() else {
        return Err(LookupError::Unsupported);
    };
    let node_name = name(node);
    let provider_id = match provider_id(node) {
        Some(id) => id.to_owned(),
        None => match get_instance_provider_id(cloud, &node_name).await {
            Ok(id) => id,
            Err(CloudError::NotImplemented) => {
                tracing::warn!(node = %node_name, "the cloud does not implement instance_id; initializing without a provider ID");
                String::new()
            }
            Err(source) => return Err(cloud_error("instance_id", node)(source)),
        },
    };
    let node_addresses = legacy_addresses(cloud, node, &provider_id).await?;
    let instance_type = by_provider_id_or_name(
        &provider_id,
        || instances.instance_type_by_provider_id(&provider_id),
        || instances.instance_type(&node_name),
    )
    .await
    .map_err(cloud_error("instance_type", node))?;
    let mut metadata = InstanceMetadata {
        provider_id,
        instance_type,
        node_addresses,
        ..Default::default()
    };
    if let Some(zones) = cloud.zones() {
        let zone = by_provider_id_or_name(
            &metadata.provider_id,
            || zones.get_zone_by_provider_id(&metadata.provider_id),
            || zones.get_zone_by_node_name(&node_name),
        )
        .await
        .map_err(cloud_error("get_zone_by_node_name", node))?;
        metadata.zone = zone.failure_domain;
        metadata.region = zone.region;
    }
    Ok(Some(metadata))
}

/// Legacy addresses: by provider ID, falling back to the node name.
async fn legacy_addresses(
    cloud: &dyn CloudProvider,
    node: &Node,
    provider_id: &str,
) -> Result<Vec<NodeAddress>, LookupError> {
    let instances = cloud.instances().ok_or(LookupError::Unsupported)?;
    let node_name = name(node);
    by_provider_id_or_name(
        provider_id,
        || instances.node_addresses_by_provider_id(provider_id),
        || instances.node_addresses(&node_name),
    )
    .await
    .map_err(cloud_error("node_addresses", node))
}

/// A legacy lookup: the cloud's answer by the node's provider ID when it has one and that answer is no
/// error, else its answer by the node's name.
async fn by_provider_id_or_name<T, ById, ByName>(
    provider_id: &str,
    by_id: impl FnOnce() -> ById,
    by_name: impl FnOnce() -> ByName,
) -> CloudResult<T>
where
    ById: Future<Output = CloudResult<T>>,
    ByName: Future<Output = CloudResult<T>>,
{
    if !provider_id.is_empty()
        && let Ok(found) = by_id().await
    {
        return Ok(found);
    }
    by_name().await
}

/// What the periodic node status update reads from the cloud (upstream's `getInstanceNodeAddresses`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatusLookup {
    /// The node's addresses.
    pub addresses: Vec<NodeAddress>,
    /// The cloud's additional labels (InstancesV2 only; the legacy API has none).
    pub additional_labels: BTreeMap<String, String>,
}

/// The node's addresses and additional labels, with one cloud lookup (the periodic status update).
pub async fn status_lookup(
    cloud: &dyn CloudProvider,
    node: &Node,
) -> Result<StatusLookup, LookupError> {
    if let Some(instances) = cloud.instances_v2() {
        return Ok(instances
            .instance_metadata(node)
            .await
            .map_err(cloud_error("instance_metadata", node))?
            .map(|m| StatusLookup {
                addresses: m.node_addresses,
                additional_labels: m.additional_labels,
            })
            .unwrap_or_default());
    }
    Ok(StatusLookup {
        addresses: legacy_addresses(cloud, node, provider_id(node).unwrap_or_default()).await?,
        additional_labels: BTreeMap::new(),
    })
}

/// Whether the node's instance exists (for the lifecycle controller). With the legacy API, an
/// `InstanceNotFound` while computing the provider ID means "does not exist".
pub async fn instance_exists(cloud: &dyn CloudProvider, node: &Node) -> Result<bool, LookupError> {
    if let Some(instances) = cloud.instances_v2() {
        return instances
            .instance_exists(node)
            .await
            .map_err(cloud_error("instance_exists", node));
    }
    let instances = cloud.instances().ok_or(LookupError::Unsupported)?;
    let provider_id = match legacy_provider_id(cloud, node).await {
        Ok(id) => id,
        Err(CloudError::InstanceNotFound) => return Ok(false),
        Err(source) => return Err(cloud_error("instance_id", node)(source)),
    };
    instances
        .instance_exists_by_provider_id(&provider_id)
        .await
        .map_err(cloud_error("instance_exists_by_provider_id", node))
}

/// Whether the node's instance is shut down. `NotImplemented`, and with the legacy API an
/// `InstanceNotFound` while computing the provider ID, mean "not shut down".
pub async fn instance_shutdown(
    cloud: &dyn CloudProvider,
    node: &Node,
) -> Result<bool, LookupError> {
    let result = if let Some(instances) = cloud.instances_v2() {
        instances.instance_shutdown(node).await
    } else {
        let instances = cloud.instances().ok_or(LookupError::Unsupported)?;
        match legacy_provider_id(cloud, node).await {
            Ok(id) => instances.instance_shutdown_by_provider_id(&id).await,
            Err(CloudError::InstanceNotFound) => Ok(false),
            Err(err) => Err(err),
        }
    };
    match result {
        Err(CloudError::NotImplemented) => Ok(false),
        other => other.map_err(cloud_error("instance_shutdown", node)),
    }
}

async fn legacy_provider_id(cloud: &dyn CloudProvider, node: &Node) -> Result<String, CloudError> {
    match provider_id(node) {
        Some(id) => Ok(id.to_owned()),
        None => get_instance_provider_id(cloud, &name(node)).await,
    }
}
