//! The infra cluster's API: every call the provider makes to it, behind its own request budget and
//! counted in its own metrics (`kubevirt_infra_requests_total`, `kubevirt_infra_request_duration_seconds`),
//! apart from the manager's client to the tenant cluster.

use std::{num::NonZeroU32, sync::Arc, time::Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use crate::{
    Error,
    vmi::{self, Vmi},
};

/// The field manager of the provider's writes to the infra cluster.
pub const FIELD_MANAGER: &str = "kubevirt-cloud-controller-manager";

/// Labels of `kubevirt_infra_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `get`, `list`, `create`, `patch`, `delete`.
    pub verb: &'static str,
    /// `virtualmachineinstances`, `nodes`, `services`, `endpointslices`.
    pub resource: &'static str,
    /// `2xx` for any success, the HTTP status of a failure (`404`, `403`, ...), or `error` when no
    /// answer came.
    pub code: String,
}

/// Labels of `kubevirt_infra_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    /// As [`RequestLabels::verb`].
    pub verb: &'static str,
    /// As [`RequestLabels::resource`].
    pub resource: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// The infra client's metrics (made with the provider, so they are registered before the client is).
#[derive(Clone)]
pub struct InfraMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Family<DurationLabels, Histogram, fn() -> Histogram>,
}

impl Default for InfraMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl InfraMetrics {
    /// Adds them to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubevirt_infra_requests",
            "Requests the kubevirt provider made to the infra cluster's API server, by verb, resource and HTTP status",
            self.requests.clone(),
        );
        registry.register(
            "kubevirt_infra_request_duration_seconds",
            "How long the kubevirt provider's requests to the infra cluster's API server took (its own rate limit's wait included)",
            self.durations.clone(),
        );
    }
}

/// The infra cluster, in the provider's namespace there.
pub struct Infra {
    client: Client,
    watch_client: Client,
    namespace: String,
    limiter: DefaultDirectRateLimiter,
    metrics: InfraMetrics,
}

impl Infra {
    /// The infra cluster reached by `client` (for calls: its timeouts bounded) and `watch_client` (for
    /// watches), in `namespace`, at `qps` requests a second with `burst`.
    pub fn new(
        client: Client,
        watch_client: Client,
        namespace: String,
        qps: f32,
        burst: u32,
        metrics: InfraMetrics,
    ) -> Arc<Self> {
        // governor's quota is whole cells per period: `qps` requests a second is one every 1/qps s.
        let period = std::time::Duration::from_secs_f64(1.0 / f64::from(qps));
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Arc::new(Self {
            client,
            watch_client,
            namespace,
            limiter: RateLimiter::direct(quota),
            metrics,
        })
    }

    /// The infra namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The client for watches (long polls: the client's default timeouts; not rate-limited per event).
    pub fn watch_client(&self) -> &Client {
        &self.watch_client
    }

    async fn call<T>(
        &self,
        verb: &'static str,
        resource: &'static str,
        what: impl FnOnce() -> String,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        self.limiter.until_ready().await;
        let result = request.await;
        let code = match &result {
            Ok(_) => "2xx".to_owned(),
            Err(kube::Error::Api(status)) => status.code.to_string(),
            Err(_) => "error".to_owned(),
        };
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                verb,
                resource,
                code,
            })
            .inc();
        self.metrics
            .durations
            .get_or_create(&DurationLabels { verb, resource })
            .observe(started.elapsed().as_secs_f64());
        result.map_err(|err| Error::infra(verb, what(), err))
    }

    fn vmis(&self) -> Api<Vmi> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &vmi::api_resource())
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn named(&self, kind: &str, name: &str) -> String {
        format!("{kind} {}/{name}", self.namespace)
    }

    /// The VMI `name`, or `None` when there is none.
    pub async fn vmi(&self, name: &str) -> Result<Option<Vmi>, Error> {
        let api = self.vmis();
        self.call(
            "get",
            "virtualmachineinstances",
            || self.named("virtualmachineinstance", name),
            api.get_opt(name),
        )
        .await
    }

    /// Whether the provider may list VMIs in its namespace (one item asked for).
    pub async fn probe(&self) -> Result<(), Error> {
        let api = self.vmis();
        self.call(
            "list",
            "virtualmachineinstances",
            || format!("virtualmachineinstances in {}", self.namespace),
            api.list_metadata(&ListParams::default().limit(1)),
        )
        .await
        .map(|_| ())
    }

    /// The VMIs whose `spec.hostname` is `hostname` (a field selector: the CRD must declare the field
    /// selectable, as KubeVirt's does).
    pub async fn vmis_by_hostname(&self, hostname: &str) -> Result<Vec<Vmi>, Error> {
        let api = self.vmis();
        let params = ListParams::default().fields(&format!("spec.hostname={hostname}"));
        let list = self
            .call(
                "list",
                "virtualmachineinstances",
                || {
                    format!(
                        "virtualmachineinstances in {} with spec.hostname={hostname}",
                        self.namespace
                    )
                },
                api.list(&params),
            )
            .await?;
        Ok(list.items)
    }

    /// The infra node `name`, or `None`.
    pub async fn node(&self, name: &str) -> Result<Option<Node>, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.call("get", "nodes", || format!("node {name}"), api.get_opt(name))
            .await
    }

    /// The infra Service `name`, or `None`.
    pub async fn service(&self, name: &str) -> Result<Option<Service>, Error> {
        let api = self.services();
        self.call(
            "get",
            "services",
            || self.named("service", name),
            api.get_opt(name),
        )
        .await
    }

    /// The infra Services with these labels (`key=value,...`).
    pub async fn services_labelled(&self, selector: &str) -> Result<Vec<Service>, Error> {
        let api = self.services();
        let list = self
            .call(
                "list",
                "services",
                || format!("services in {} with labels {selector}", self.namespace),
                api.list(&ListParams::default().labels(selector)),
            )
            .await?;
        Ok(list.items)
    }

    /// Creates `service`.
    pub async fn create_service(&self, service: &Service) -> Result<Service, Error> {
        let api = self.services();
        let name = service.metadata.name.clone().unwrap_or_default();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        self.call(
            "create",
            "services",
            || self.named("service", &name),
            api.create(&params, service),
        )
        .await
    }

    /// Applies a JSON merge patch to the Service `name`.
    pub async fn patch_service(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Service, Error> {
        let api = self.services();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        self.call(
            "patch",
            "services",
            || self.named("service", name),
            api.patch(name, &params, &Patch::Merge(patch)),
        )
        .await
    }

    /// Deletes the Service `name`; `Ok(false)` when it was not there.
    pub async fn delete_service(&self, name: &str) -> Result<bool, Error> {
        let api = self.services();
        let deleted = self
            .call(
                "delete",
                "services",
                || self.named("service", name),
                api.delete(name, &DeleteParams::default()),
            )
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(err) if err.is_not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The infra EndpointSlices with these labels.
    pub async fn slices_labelled(&self, selector: &str) -> Result<Vec<EndpointSlice>, Error> {
        let api = self.slices();
        let list = self
            .call(
                "list",
                "endpointslices",
                || {
                    format!(
                        "endpointslices in {} with labels {selector}",
                        self.namespace
                    )
                },
                api.list(&ListParams::default().labels(selector)),
            )
            .await?;
        Ok(list.items)
    }

    /// Creates `slice` (named by `generateName`).
    pub async fn create_slice(&self, slice: &EndpointSlice) -> Result<EndpointSlice, Error> {
        let api = self.slices();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        let name = slice.metadata.generate_name.clone().unwrap_or_default();
        self.call(
            "create",
            "endpointslices",
            || self.named("endpointslice", &format!("{name}*")),
            api.create(&params, slice),
        )
        .await
    }

    /// Replaces the slice `slice` names (with its resourceVersion: a conflict is an error, and the
    /// controller looks again).
    pub async fn replace_slice(&self, slice: &EndpointSlice) -> Result<EndpointSlice, Error> {
        let api = self.slices();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        self.call(
            "update",
            "endpointslices",
            || self.named("endpointslice", &name),
            api.replace(&name, &params, slice),
        )
        .await
    }

    /// Deletes the slice `name` (already gone is fine).
    pub async fn delete_slice(&self, name: &str) -> Result<(), Error> {
        let api = self.slices();
        let deleted = self
            .call(
                "delete",
                "endpointslices",
                || self.named("endpointslice", name),
                api.delete(name, &DeleteParams::default()),
            )
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(err) if err.is_not_found() => Ok(()),
            Err(err) => Err(err),
        }
    }
}
