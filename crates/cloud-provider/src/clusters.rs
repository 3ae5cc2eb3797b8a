//! Clusters (upstream `cloudprovider.Clusters`; no generic controller uses it).

use async_trait::async_trait;

use crate::CloudResult;

/// The clusters a cloud knows about.
#[async_trait]
pub trait Clusters: Send + Sync {
    /// The names of all clusters.
    async fn list_clusters(&self) -> CloudResult<Vec<String>>;

    /// The address of the control plane of `cluster_name`.
    async fn master(&self, cluster_name: &str) -> CloudResult<String>;
}
