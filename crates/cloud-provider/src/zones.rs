//! Zones (upstream `cloudprovider.Zones`, deprecated in favor of [`InstancesV2`](crate::InstancesV2)).

use async_trait::async_trait;

use crate::CloudResult;

/// A failure domain and the region it belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Zone {
    /// The zone, e.g. `us-east-1a`.
    pub failure_domain: String,
    /// The region, e.g. `us-east-1`.
    pub region: String,
}

/// Zone lookups, used by the node controllers only when [`InstancesV2`](crate::InstancesV2) is not supported.
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of the machine the caller runs on (a kubelet-era call; external managers don't use it).
    async fn get_zone(&self) -> CloudResult<Zone>;

    /// The zone of the instance with this provider ID.
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone>;

    /// The zone of the instance behind this node name.
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone>;
}
