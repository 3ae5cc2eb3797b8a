//! `kubevirt`: the cloud of clusters whose machines are KubeVirt VirtualMachineInstances of another
//! ("infra") cluster, as `kubevirt/cloud-provider-kubevirt` runs it, with its cloud-config, names and
//! labels (`docs/kubevirt-provider.md` says key by key where we differ).
//!
//! - [`instances`]: a tenant node is a VMI in the infra namespace: provider ID `kubevirt://<vmi>`, the
//!   addresses of its `default` interface, its instance type, the infra node's region and zone.
//! - [`load_balancer`]: a tenant LoadBalancer Service is a LoadBalancer Service in the infra namespace
//!   whose address it reports.
//! - [`eps`]: the endpoint-mirroring controller for Services whose infra Service has no selector.
//! - [`infra`]: every call to the infra cluster, with its own request budget and metrics.

pub mod config;
pub mod eps;
mod error;
pub mod infra;
pub mod instances;
pub mod load_balancer;
pub mod vmi;

use std::sync::{Arc, OnceLock};

use cloud_provider::{
    CloudConfig, CloudProvider, CloudResult, ClusterLoadBalancer, InitializeContext,
    InstanceMetadata, InstancesV2, LoadBalancer, LoadBalancerPreview, ProviderResult,
    register_provider,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use config::Config;
pub use error::Error;
use infra::{Infra, InfraMetrics};

/// How long one call to the infra API server may take before it fails (and is retried).
pub const INFRA_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The name the provider registers under, and the scheme of its provider IDs.
pub const PROVIDER_NAME: &str = "kubevirt";

register_provider!(PROVIDER_NAME, new_provider);

/// The registry factory: parses the `--cloud-config` and reads the infra kubeconfig it names (a
/// missing or malformed one stops the manager at start, naming it); the client is built at
/// [`CloudProvider::initialize`].
pub fn new_provider(config: &CloudConfig) -> ProviderResult {
    let source = config.source_name();
    let text = config.text().map_err(|e| Error::Config {
        source_name: source.clone(),
        message: format!("not UTF-8: {e}"),
    })?;
    let parsed = Config::parse(text.unwrap_or_default(), &source)?;
    Ok(Arc::new(KubevirtCloud::new(parsed)?))
}

/// The KubeVirt cloud.
pub struct KubevirtCloud {
    config: Config,
    kubeconfig: Option<Kubeconfig>,
    infra: OnceLock<Arc<Infra>>,
    metrics: InfraMetrics,
}

impl KubevirtCloud {
    /// The provider for `config`; the infra kubeconfig (when named) is read now.
    pub fn new(config: Config) -> Result<Self, Error> {
        let kubeconfig = config
            .kubeconfig
            .as_ref()
            .map(|path| {
                Kubeconfig::read_from(path).map_err(|err| Error::Kubeconfig {
                    path: path.display().to_string(),
                    message: format!("{err} (the cloud-config's `kubeconfig` key names it)"),
                })
            })
            .transpose()?;
        Ok(Self {
            config,
            kubeconfig,
            infra: OnceLock::new(),
            metrics: InfraMetrics::default(),
        })
    }

    /// The cloud-config in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn infra(&self) -> Result<&Infra, Error> {
        self.infra
            .get()
            .map(Arc::as_ref)
            .ok_or(Error::NotInitialized)
    }

    /// Connects to the infra cluster: its kubeconfig (or the pod's service account) and namespace.
    async fn connect(&self) -> Result<Arc<Infra>, Error> {
        let (client_config, origin) = match (&self.kubeconfig, &self.config.kubeconfig) {
            (Some(kubeconfig), Some(path)) => (
                kube::Config::from_custom_kubeconfig(
                    kubeconfig.clone(),
                    &KubeConfigOptions::default(),
                )
                .await
                .map_err(|err| Error::Kubeconfig {
                    path: path.display().to_string(),
                    message: err.to_string(),
                })?,
                path.display().to_string(),
            ),
            _ => (
                kube::Config::incluster().map_err(|err| Error::Kubeconfig {
                    path: "(in-cluster: no `kubeconfig` in the cloud-config)".into(),
                    message: err.to_string(),
                })?,
                "in-cluster".to_owned(),
            ),
        };
        let namespace = self
            .config
            .namespace
            .clone()
            .unwrap_or_else(|| client_config.default_namespace.clone());
        // Calls get a bounded wait, so an infra API server that hangs (as one that is away behind a
        // silent network does) fails them and the controllers retry, instead of waiting out the
        // client's default of nearly five minutes per call. Watches keep the default: they are long
        // polls by design.
        let mut calls_config = client_config.clone();
        calls_config.read_timeout = Some(INFRA_CALL_TIMEOUT);
        calls_config.write_timeout = Some(INFRA_CALL_TIMEOUT);
        calls_config.connect_timeout = Some(INFRA_CALL_TIMEOUT);
        let build = |config: kube::Config| {
            kube::Client::try_from(config).map_err(|err| Error::Kubeconfig {
                path: origin.clone(),
                message: err.to_string(),
            })
        };
        let client = build(calls_config)?;
        let watch_client = build(client_config)?;
        tracing::info!(kubeconfig = %origin, namespace = %namespace, "kubevirt: the infra cluster");
        Ok(Infra::new(
            client,
            watch_client,
            namespace,
            self.config.infra_qps,
            self.config.infra_burst,
            self.metrics.clone(),
        ))
    }
}

#[cloud_provider::async_trait]
impl CloudProvider for KubevirtCloud {
    /// Connects to the infra cluster, says at once (without stopping) when it refuses the provider,
    /// and starts the endpoint-mirroring controller when `enableEPSController` is set.
    async fn initialize(&self, ctx: InitializeContext) -> CloudResult<()> {
        let infra = match self.infra.get() {
            Some(infra) => infra.clone(),
            None => {
                let infra = self.connect().await?;
                self.infra.get_or_init(|| infra).clone()
            }
        };
        if let Err(err) = infra.probe().await {
            tracing::warn!(error = %err, "kubevirt: cannot list VirtualMachineInstances in the infra cluster yet (refused or unreachable: the error says which); nodes and load balancers wait until it can");
        }
        if self
            .config
            .load_balancer
            .as_ref()
            .is_some_and(|lb| lb.eps_controller)
        {
            let tenant = ctx.client.clone();
            let cluster = ctx.cluster_name.clone();
            let stop = ctx.shutdown.clone();
            let ends = cloud_provider::supervise::Ends::AtShutdown;
            ctx.supervisor.spawn("kubevirt-eps", ends, move || {
                eps::run(tenant.clone(), infra.clone(), cluster.clone(), stop.clone())
            });
        }
        Ok(())
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.config.load_balancer.is_some().then_some(self as _)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.config.instances.is_some().then_some(self as _)
    }

    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }
}

impl KubevirtCloud {
    fn instances(&self) -> CloudResult<instances::Instances<'_>> {
        Ok(instances::Instances {
            infra: self.infra()?,
            zone_and_region: self
                .config
                .instances
                .as_ref()
                .is_some_and(|i| i.zone_and_region),
        })
    }

    fn load_balancers(&self) -> CloudResult<load_balancer::LoadBalancers<'_>> {
        let config = self
            .config
            .load_balancer
            .as_ref()
            .ok_or(cloud_provider::CloudError::NotImplemented)?;
        Ok(load_balancer::LoadBalancers {
            infra: self.infra()?,
            config,
        })
    }
}

#[cloud_provider::async_trait]
impl InstancesV2 for KubevirtCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.instances()?.exists(node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.instances()?.shutdown(node).await
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.instances()?.metadata(node).await
    }
}

#[cloud_provider::async_trait]
impl LoadBalancer for KubevirtCloud {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.load_balancers()?.get(service).await
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.load_balancers()?.ensure(cluster_name, service).await
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.load_balancers()?.update(cluster_name, service).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.load_balancers()?.delete(service).await
    }

    async fn preview_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        self.load_balancers()?.preview(cluster_name, service).await
    }

    async fn list_load_balancers(
        &self,
        cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        self.load_balancers()?.list(cluster_name).await
    }

    async fn delete_orphaned_load_balancer(
        &self,
        _cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        self.load_balancers()?.delete_orphan(load_balancer).await
    }
}
