//! `aws`: the AWS provider, on aws-sdk-rust.
//!
//! It reads cloud-provider-aws's INI cloud-config ([`Config`]), finds nodes' EC2 instances (InstancesV2
//! and Zones, provider IDs `aws:///<zone>/<instance-id>`), and counts every AWS call, throttle and
//! failure on `/metrics`. Linking this crate registers the provider under the name `aws`.
//!
//! The SDK is configured the standard way (environment, including `AWS_ENDPOINT_URL`, profiles and the
//! default credential chain), with the cloud-config's region and `[ServiceOverride]` endpoints on top;
//! `RoleARN` is assumed through STS. See `docs/aws-provider.md`.

mod coalesce;
mod config;
mod error;
mod instances;
mod load_balancer;
mod routes;
mod sdk;
mod topology;
mod zone_ids;

use std::{sync::Arc, time::Duration};

use aws_config::SdkConfig;
use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2,
    LoadBalancer, LoadBalancerPreview, ProviderResult, Route, Routes, Zone, Zones,
    register_provider,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use tokio::sync::OnceCell;

pub use config::{
    ClusterHealthProbe, Config, Global, KUBE_PROXY_HEALTH_PATH, KUBE_PROXY_HEALTH_PORT,
    NlbSecurityGroupMode, NodeIpFamily, OverriddenService, ServiceOverride, zone_to_region,
};
pub use error::{Error, Result};
pub use instances::{
    InstanceInfo, instance_id_from_provider_id, instance_id_from_resource_name, is_instance_id,
};
pub use sdk::{ApiMetrics, Clients, RetryPolicy, https_client, is_throttling, load_sdk_config};
pub use topology::{DEFAULT_TOPOLOGY_INSTANCE_TYPES, NETWORK_NODE_LABEL_PREFIX};
pub use zone_ids::ZONE_ID_LABEL;

use instances::{Describer, Instances, Key};
use load_balancer::LoadBalancers;
pub use load_balancer::{nlb_security_group_name, spec, target_group_name};
use routes::RouteTables;
use sdk::Calls;
use topology::Topology;
use zone_ids::ZoneIds;

/// The name the provider registers under, and the scheme of its provider IDs.
pub const PROVIDER_NAME: &str = "aws";

register_provider!(PROVIDER_NAME, new_provider);

/// The registry factory: parses the `--cloud-config` (upstream's INI format); the SDK is loaded on first
/// use, the standard way.
pub fn new_provider(config: &CloudConfig) -> ProviderResult {
    let source = config.source_name();
    let text = config.text().map_err(|e| Error::ConfigFile {
        source_name: source.clone(),
        message: format!("not UTF-8: {e}"),
    })?;
    let parsed = Config::parse(text.unwrap_or_default(), &source)?;
    Ok(Arc::new(AwsCloud::new(parsed, Options::default())))
}

/// How an [`AwsCloud`] is built beyond its cloud-config.
#[derive(Clone, Debug)]
pub struct Options {
    /// Use this SDK configuration instead of loading the standard one (tests give static credentials,
    /// a region and an endpoint here). The cloud-config's `[ServiceOverride]`s still apply.
    pub sdk_config: Option<SdkConfig>,
    /// Retries of throttled and transient calls.
    pub retry: RetryPolicy,
    /// How long concurrent instance look-ups are gathered into one `DescribeInstances`.
    pub batch_window: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sdk_config: None,
            retry: RetryPolicy::default(),
            batch_window: Duration::from_millis(50),
        }
    }
}

/// What exists once the SDK is loaded.
struct Parts {
    calls: Calls,
    instances: Instances,
    describer: Arc<Describer>,
    load_balancers: LoadBalancers,
    routes: RouteTables,
}

/// The AWS cloud.
pub struct AwsCloud {
    config: Arc<Config>,
    options: Options,
    metrics: ApiMetrics,
    parts: OnceCell<Arc<Parts>>,
}

impl AwsCloud {
    /// The provider for `config`; nothing is called until it is used.
    pub fn new(config: Config, options: Options) -> Self {
        Self {
            config: Arc::new(config),
            options,
            metrics: ApiMetrics::default(),
            parts: OnceCell::new(),
        }
    }

    /// The parsed cloud-config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The AWS calls made so far (requests, throttles), for tests and benchmarks.
    pub fn api_metrics(&self) -> &ApiMetrics {
        &self.metrics
    }

    async fn parts(&self) -> Result<Arc<Parts>> {
        self.parts
            .get_or_try_init(|| async {
                let sdk = match &self.options.sdk_config {
                    Some(sdk) => sdk.clone(),
                    None => load_sdk_config(&self.config).await?,
                };
                let clients = Clients::new(&sdk, &self.config)?;
                let region = clients.region.clone();
                let calls = Calls::new(clients, self.options.retry, self.metrics.clone())
                    .with_preview_budget(sdk::PreviewBudget::new(
                        self.config.global.drift_check_calls_per_second,
                    ));
                let describer = Arc::new(Describer::new(calls.clone(), self.options.batch_window));
                let expected = regex_lite::Regex::new(
                    self.config
                        .global
                        .supported_topology_instance_type_pattern
                        .as_deref()
                        .unwrap_or(DEFAULT_TOPOLOGY_INSTANCE_TYPES),
                )
                .map_err(|e| Error::Setup(format!("SupportedTopologyInstanceTypePattern: {e}")))?;
                let instances = Instances::new(
                    describer.clone(),
                    Arc::new(ZoneIds::new(calls.clone())),
                    Arc::new(Topology::new(calls.clone(), expected)),
                    self.config.global.node_ip_families.clone(),
                    region,
                );
                let load_balancers =
                    LoadBalancers::new(calls.clone(), describer.clone(), self.config.clone());
                let routes =
                    RouteTables::new(calls.clone(), describer.clone(), self.config.clone());
                Ok(Arc::new(Parts {
                    calls,
                    instances,
                    describer,
                    load_balancers,
                    routes,
                }))
            })
            .await
            .cloned()
    }

    /// The region the provider calls (loads the SDK configuration on first use).
    pub async fn region(&self) -> Result<String> {
        Ok(self.parts().await?.calls.clients.region.clone())
    }

    /// The instance a node maps to, if any (by provider ID, resource-based name or private DNS name).
    pub async fn instance_for(&self, node: &Node) -> Result<Option<InstanceInfo>> {
        let parts = self.parts().await?;
        parts.describer.find(&Key::of(node)?).await
    }
}

#[cloud_provider::async_trait]
impl CloudProvider for AwsCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    fn has_cluster_id(&self) -> bool {
        self.config.cluster_id().is_some()
    }

    fn register_metrics(
        &self,
        registry: &mut cloud_provider::prometheus_client::registry::Registry,
    ) {
        self.metrics.register(registry);
    }
}

/// An `impl` of a provider trait for [`AwsCloud`]: the methods written out in braces as they are, then
/// each listed signature handing its call to the [`Parts`] field named after `=>` (the SDK loaded first).
macro_rules! impl_through_part {
    (
        impl $trait:ident => $part:ident { $($own:tt)* }
        $(fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*
    ) => {
        #[cloud_provider::async_trait]
        impl $trait for AwsCloud {
            $($own)*
            $(
                async fn $name(&self $(, $arg: $ty)*) -> $ret {
                    self.parts().await?.$part.$name($($arg),*).await
                }
            )*
        }
    };
}

impl_through_part! {
    impl InstancesV2 => instances {}
    fn instance_exists(&self, node: &Node) -> CloudResult<bool>;
    fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;
    fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;
}

impl_through_part! {
    impl LoadBalancer => load_balancers {
        /// The keys of `aws-load-balancer-target-node-labels`: a node relabelled into or out of them
        /// joins or leaves the load balancer's targets.
        fn backend_label_keys(&self, service: &Service) -> Vec<String> {
            spec::target_node_label_keys(service)
        }

        /// Upstream's name, or the name of the kept load balancer the Service adopted (known once the
        /// provider made its first load-balancer call: see `load_balancer::retained`).
        fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
            match self.parts.get() {
                Some(parts) => parts
                    .load_balancers
                    .get_load_balancer_name(cluster_name, service),
                None => cloud_provider::default_load_balancer_name(service),
            }
        }

        fn retains_load_balancers(&self) -> bool {
            true
        }
    }
    fn retain_load_balancer(&self, cluster_name: &str, service: &Service) -> CloudResult<()>;
    fn get_load_balancer(&self, cluster_name: &str, service: &Service)
        -> CloudResult<Option<LoadBalancerStatus>>;
    fn ensure_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[Arc<Node>])
        -> CloudResult<LoadBalancerStatus>;
    fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[Arc<Node>])
        -> CloudResult<()>;
    fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()>;
    fn preview_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[Arc<Node>])
        -> CloudResult<LoadBalancerPreview>;
    fn list_load_balancers(&self, cluster_name: &str)
        -> CloudResult<Vec<cloud_provider::ClusterLoadBalancer>>;
    fn delete_orphaned_load_balancer(
        &self,
        cluster_name: &str,
        load_balancer: &cloud_provider::ClusterLoadBalancer,
    ) -> CloudResult<()>;
}

impl_through_part! {
    impl Routes => routes {}
    fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>>;
    fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()>;
    fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()>;
}

#[cloud_provider::async_trait]
impl Zones for AwsCloud {
    /// The `Zone` of the cloud-config (upstream reads it from the instance metadata service, which this
    /// provider never calls).
    async fn get_zone(&self) -> CloudResult<Zone> {
        let zone = self
            .config
            .global
            .zone
            .clone()
            .ok_or(CloudError::NotImplemented)?;
        Ok(Zone {
            region: self.region().await?,
            failure_domain: zone,
        })
    }

    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        let id = instance_id_from_provider_id(provider_id).ok_or_else(|| {
            CloudError::other(format!(
                "provider ID {provider_id:?} is not an AWS provider ID (aws:///<zone>/<instance-id>)"
            ))
        })?;
        self.zone_of(Key::Id(id)).await
    }

    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        let key = match instance_id_from_resource_name(node_name) {
            Some(id) => Key::Id(id),
            None => Key::PrivateDns(node_name.to_owned()),
        };
        self.zone_of(key).await
    }
}

impl AwsCloud {
    async fn zone_of(&self, key: Key) -> CloudResult<Zone> {
        let parts = self.parts().await?;
        let instance = parts
            .describer
            .find(&key)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        Ok(Zone {
            failure_domain: instance.zone,
            region: parts.calls.clients.region.clone(),
        })
    }
}
