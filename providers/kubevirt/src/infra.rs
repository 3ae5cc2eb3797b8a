//! The infra cluster's API: every call the provider makes to it, behind its own request budget and
//! counted in its own metrics (`kubevirt_infra_requests_total`, `kubevirt_infra_request_duration_seconds`),
//! apart from the manager's client to the tenant cluster.

use std::{fmt::Debug, num::NonZeroU32, sync::Arc, time::Instant};

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
use serde::{Serialize, de::DeserializeOwned};

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

    fn vmis(&self) -> Objects<'_, Vmi> {
        let api = Api::namespaced_with(self.client.clone(), &self.namespace, &vmi::api_resource());
        Objects::new(
            self,
            api,
            "virtualmachineinstances",
            "virtualmachineinstance",
        )
    }

    fn services(&self) -> Objects<'_, Service> {
        let api = Api::namespaced(self.client.clone(), &self.namespace);
        Objects::new(self, api, "services", "service")
    }

    fn slices(&self) -> Objects<'_, EndpointSlice> {
        let api = Api::namespaced(self.client.clone(), &self.namespace);
        Objects::new(self, api, "endpointslices", "endpointslice")
    }

    fn named(&self, kind: &str, name: &str) -> String {
        format!("{kind} {}/{name}", self.namespace)
    }

    /// The VMI `name`, or `None` when there is none.
    pub async fn vmi(&self, name: &str) -> Result<Option<Vmi>, Error> {
        self.vmis().get(name).await
    }

    /// Whether the provider may list VMIs in its namespace (one item asked for).
    pub async fn probe(&self) -> Result<(), Error> {
        let vmis = self.vmis();
        self.call(
            "list",
            vmis.plural,
            || format!("virtualmachineinstances in {}", self.namespace),
            vmis.api.list_metadata(&ListParams::default().limit(1)),
        )
        .await
        .map(|_| ())
    }

    /// The VMIs whose `spec.hostname` is `hostname` (a field selector: the CRD must declare the field
    /// selectable, as KubeVirt's does).
    pub async fn vmis_by_hostname(&self, hostname: &str) -> Result<Vec<Vmi>, Error> {
        let vmis = self.vmis();
        let params = ListParams::default().fields(&format!("spec.hostname={hostname}"));
        let list = self
            .call(
                "list",
                vmis.plural,
                || {
                    format!(
                        "virtualmachineinstances in {} with spec.hostname={hostname}",
                        self.namespace
                    )
                },
                vmis.api.list(&params),
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
        self.services().get(name).await
    }

    /// The infra Services with these labels (`key=value,...`).
    pub async fn services_labelled(&self, selector: &str) -> Result<Vec<Service>, Error> {
        self.services().labelled(selector).await
    }

    /// Creates `service`.
    pub async fn create_service(&self, service: &Service) -> Result<Service, Error> {
        let name = service.metadata.name.clone().unwrap_or_default();
        self.services().create(&name, service).await
    }

    /// Applies a JSON merge patch to the Service `name`.
    pub async fn patch_service(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Service, Error> {
        let services = self.services();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        self.call(
            "patch",
            services.plural,
            || services.named(name),
            services.api.patch(name, &params, &Patch::Merge(patch)),
        )
        .await
    }

    /// Deletes the Service `name`; `Ok(false)` when it was not there.
    pub async fn delete_service(&self, name: &str) -> Result<bool, Error> {
        self.services().delete(name).await
    }

    /// The infra EndpointSlices with these labels.
    pub async fn slices_labelled(&self, selector: &str) -> Result<Vec<EndpointSlice>, Error> {
        self.slices().labelled(selector).await
    }

    /// Creates `slice` (named by `generateName`).
    pub async fn create_slice(&self, slice: &EndpointSlice) -> Result<EndpointSlice, Error> {
        let name = slice.metadata.generate_name.clone().unwrap_or_default();
        self.slices().create(&format!("{name}*"), slice).await
    }

    /// Replaces the slice `slice` names (with its resourceVersion: a conflict is an error, and the
    /// controller looks again).
    pub async fn replace_slice(&self, slice: &EndpointSlice) -> Result<EndpointSlice, Error> {
        let slices = self.slices();
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.call(
            "update",
            slices.plural,
            || slices.named(&name),
            slices.api.replace(&name, &ours(), slice),
        )
        .await
    }

    /// Deletes the slice `name` (already gone is fine).
    pub async fn delete_slice(&self, name: &str) -> Result<(), Error> {
        self.slices().delete(name).await.map(|_| ())
    }
}

/// What the provider reads and writes in the infra namespace.
trait Object: Clone + DeserializeOwned + Serialize + Debug {}

impl<K: Clone + DeserializeOwned + Serialize + Debug> Object for K {}

/// The objects of one kind in the infra namespace, each call made through [`Infra::call`].
struct Objects<'a, K> {
    infra: &'a Infra,
    api: Api<K>,
    /// The kind's plural: the metrics' `resource`.
    plural: &'static str,
    /// Its name in errors.
    singular: &'static str,
}

impl<'a, K: Object> Objects<'a, K> {
    fn new(infra: &'a Infra, api: Api<K>, plural: &'static str, singular: &'static str) -> Self {
        Self {
            infra,
            api,
            plural,
            singular,
        }
    }

    /// How errors name the object `name`.
    fn named(&self, name: &str) -> String {
        self.infra.named(self.singular, name)
    }

    /// The object `name`, or `None` when there is none.
    async fn get(&self, name: &str) -> Result<Option<K>, Error> {
        let found = self.api.get_opt(name);
        self.infra
            .call("get", self.plural, || self.named(name), found)
            .await
    }

    /// The objects with these labels (`key=value,...`).
    async fn labelled(&self, selector: &str) -> Result<Vec<K>, Error> {
        let namespace = &self.infra.namespace;
        let what = || format!("{} in {namespace} with labels {selector}", self.plural);
        let params = ListParams::default().labels(selector);
        let listed = self
            .infra
            .call("list", self.plural, what, self.api.list(&params));
        Ok(listed.await?.items)
    }

    /// Creates `object` (`shown` as its name in errors).
    async fn create(&self, shown: &str, object: &K) -> Result<K, Error> {
        let params = ours();
        let created = self.api.create(&params, object);
        self.infra
            .call("create", self.plural, || self.named(shown), created)
            .await
    }

    /// Deletes the object `name`; `Ok(false)` when it was not there.
    async fn delete(&self, name: &str) -> Result<bool, Error> {
        let params = DeleteParams::default();
        let deleted = self.api.delete(name, &params);
        match self
            .infra
            .call("delete", self.plural, || self.named(name), deleted)
            .await
        {
            Ok(_) => Ok(true),
            Err(err) if err.is_not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }
}

/// A create or replace by this provider's field manager.
fn ours() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    }
}
