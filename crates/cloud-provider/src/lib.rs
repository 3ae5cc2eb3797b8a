//! The contract a cloud implements to run under the Rust cloud-controller-manager.
//!
//! This is the Rust counterpart of Go's `k8s.io/cloud-provider`: a top-level [`CloudProvider`] trait
//! whose accessors hand out the parts a cloud supports ([`LoadBalancer`], [`Instances`],
//! [`InstancesV2`], [`Zones`], [`Clusters`], [`Routes`]), the [`CloudError`] they return, helpers
//! ([`default_load_balancer_name`], [`ProviderId`]) and the [`Registry`] a provider joins by name with
//! [`register_provider!`]. With the `conformance` feature, `conformance` is a test suite to run
//! against your provider.
//!
//! # A minimal provider
//!
//! A provider implements the parts its cloud offers and registers a factory. This one knows every node
//! as a running instance in one zone:
//!
//! ```
//! use std::sync::Arc;
//!
//! use async_trait::async_trait;
//! use cloud_provider::{
//!     CloudConfig, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, ProviderResult,
//!     node_address, register_provider,
//! };
//! use k8s_openapi::api::core::v1::Node;
//!
//! struct OneZone;
//!
//! #[async_trait]
//! impl InstancesV2 for OneZone {
//!     async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
//!         Ok(true)
//!     }
//!     async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
//!         Ok(false)
//!     }
//!     async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
//!         let name = node.metadata.name.clone().unwrap_or_default();
//!         Ok(Some(InstanceMetadata {
//!             provider_id: format!("one-zone://{name}"),
//!             instance_type: "small".into(),
//!             zone: "zone-1".into(),
//!             region: "region-1".into(),
//!             node_addresses: vec![node_address("Hostname", name)],
//!             ..Default::default()
//!         }))
//!     }
//! }
//!
//! impl CloudProvider for OneZone {
//!     fn provider_name(&self) -> &str {
//!         "one-zone"
//!     }
//!     fn instances_v2(&self) -> Option<&dyn InstancesV2> {
//!         Some(self)
//!     }
//! }
//!
//! // The factory receives the `--cloud-config` file (here ignored).
//! fn new_one_zone(_config: &CloudConfig) -> ProviderResult {
//!     Ok(Arc::new(OneZone))
//! }
//!
//! // Linking this crate into a manager binary makes `--cloud-provider=one-zone` work.
//! register_provider!("one-zone", new_one_zone);
//!
//! # let cloud = cloud_provider::Registry::linked().unwrap().init("one-zone", &CloudConfig::none()).unwrap();
//! # assert!(cloud.instances_v2().is_some() && cloud.load_balancer().is_none());
//! ```

pub mod annotations;
pub mod api_outage;
mod clusters;
pub mod config_values;
mod error;
pub mod flag_values;
mod helpers;
mod instances;
pub mod labels;
pub mod leadership;
mod load_balancer;
mod provider;
mod registry;
mod routes;
pub mod service_helpers;
pub mod supervise;
mod watch;
mod watch_retry;
mod zones;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use api_outage::{ApiOutage, ApiOutageReport};
pub use clusters::Clusters;
pub use error::{BoxError, CloudError, CloudResult};
pub use helpers::{
    ProviderId, ProviderIdError, default_load_balancer_name, get_instance_provider_id,
    parse_go_duration,
};
pub use instances::{InstanceMetadata, Instances, InstancesV2, node_address};
pub use load_balancer::{ClusterLoadBalancer, LoadBalancer, LoadBalancerPreview, ServiceRef};
pub use provider::{CloudProvider, InitializeContext};
pub use registry::{
    AddFlagsFn, CloudConfig, ProviderFactoryFn, ProviderResult, Registration, Registry,
    RegistryError, read_flags,
};
pub use routes::{Route, Routes};
pub use supervise::{Supervisor, SupervisorMetrics};
pub use watch::{panic_message, watch_cloud_config};
pub use watch_retry::{WATCH_RETRY_FIRST, WATCH_RETRY_MAX, watch_retry_backoff};
pub use zones::{Zone, Zones};

/// The `#[async_trait]` attribute the provider traits are written with, so a provider needs no
/// `async-trait` dependency of its own (and never one out of step with ours).
pub use async_trait::async_trait;
/// The command-line library providers declare their own flags with (see [`register_provider!`]).
pub use clap;
/// The Kubernetes API types of the contract (`Node`, `Service`, ...), at the version and API level the
/// contract is built with.
pub use k8s_openapi;
/// The metrics library of [`CloudProvider::register_metrics`], re-exported so providers need not pin it.
pub use prometheus_client;

/// Re-exports for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
