//! The endpoint-mirroring controller (upstream's `kubevirt-eps`): for the infra Services of this
//! cluster that have no selector (`externalTrafficPolicy: Local` with `enableEPSController`, or
//! `selectorless`), infra EndpointSlices that send to the VMIs of the tenant nodes that have an
//! endpoint, so the infra load balancer sends only to nodes that serve.
//!
//! Four caches (infra Services, the infra slices it manages, VMIs, tenant slices) are kept by watches;
//! any change wakes one loop that plans every mirrored Service ([`plan::plan`], pure) and writes only
//! what differs, so a quiet resync writes nothing. Upstream watches no VMIs; we do, so a VMI that fails
//! marks its endpoint terminating at once.

pub mod plan;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{
    NamespaceResourceScope,
    api::{core::v1::Service, discovery::v1::EndpointSlice},
};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    infra::Infra,
    load_balancer::{
        TENANT_CLUSTER_NAME_LABEL, TENANT_SERVICE_NAME_LABEL, TENANT_SERVICE_NAMESPACE_LABEL,
    },
    vmi::{self, Vmi},
};
use plan::Change;

/// How often every mirrored Service is looked at even without a change (a missed event, a failed write).
const RESYNC: Duration = Duration::from_secs(30);
/// After a failed write, the next look.
const RETRY: Duration = Duration::from_secs(2);
/// Changes arriving within this window are planned together.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The caches the loop plans from.
struct Caches {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    vmis: Store<Vmi>,
    tenant_slices: Store<EndpointSlice>,
}

/// Runs the controller until `shutdown`: the tenant cluster through `tenant`, the infra cluster through
/// `infra`, for the infra Services of `cluster`. Its watches retry on their own; should the whole of it
/// end anyway, that is said as an error and it starts again (a panic is its supervisor's to see).
pub async fn run(tenant: Client, infra: Arc<Infra>, cluster: String, shutdown: CancellationToken) {
    loop {
        run_once(
            tenant.clone(),
            infra.clone(),
            cluster.clone(),
            shutdown.clone(),
        )
        .await;
        if shutdown.is_cancelled() {
            return;
        }
        tracing::error!(
            "kubevirt-eps: the controller ended without being asked to (a bug); starting it again"
        );
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

async fn run_once(tenant: Client, infra: Arc<Infra>, cluster: String, shutdown: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let namespace = infra.namespace().to_owned();
    let infra_client = infra.watch_client().clone();
    let watches = Watches {
        wake: &wake,
        infra: &infra_client,
        namespace: &namespace,
    };
    let ours = format!("{TENANT_CLUSTER_NAME_LABEL}={cluster}");
    let managed = format!("{}={},{ours}", plan::MANAGED_BY_LABEL, plan::MANAGED_BY);
    let (services, services_watch) = watches.infra("infra services", &ours);
    let (slices, slices_watch) = watches.infra("infra endpointslices", &managed);
    let resource = vmi::api_resource();
    let (vmis, vmis_watch) = watches.cache(
        "infra virtualmachineinstances",
        reflector::store::Writer::<Vmi>::new(resource.clone()),
        Api::namespaced_with(infra_client.clone(), &namespace, &resource),
        watcher::Config::default(),
    );
    let (tenant_slices, tenant_watch) = watches.cache(
        "tenant endpointslices",
        reflector::store::Writer::default(),
        Api::<EndpointSlice>::all(tenant),
        watcher::Config::default(),
    );
    let caches = Caches {
        services,
        slices,
        vmis,
        tenant_slices,
    };
    let reconciling = reconcile_loop(&caches, &infra, &wake);
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = services_watch => {}
        () = slices_watch => {}
        () = vmis_watch => {}
        () = tenant_watch => {}
        () = reconciling => {}
    }
}

/// Where a run's watches send their wake-ups, and the infra namespace they watch.
struct Watches<'a> {
    wake: &'a Arc<Notify>,
    infra: &'a Client,
    namespace: &'a str,
}

impl Watches<'_> {
    /// A cache (`writer`'s) of what `api` lists with `config`, and the watch that keeps it ([`watch`]).
    fn cache<K>(
        &self,
        what: &'static str,
        writer: reflector::store::Writer<K>,
        api: Api<K>,
        config: watcher::Config,
    ) -> (Store<K>, impl Future<Output = ()> + use<K>)
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        let store = writer.as_reader();
        let stream = reflector(writer, watcher(api, config));
        (store, watch(what, stream, self.wake.clone()))
    }

    /// [`Watches::cache`] of the infra namespace's objects with these labels (`key=value,...`).
    fn infra<K>(
        &self,
        what: &'static str,
        labels: &str,
    ) -> (Store<K>, impl Future<Output = ()> + use<K>)
    where
        K: Resource<Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let api = Api::namespaced(self.infra.clone(), self.namespace);
        let config = watcher::Config::default().labels(labels);
        self.cache(what, reflector::store::Writer::default(), api, config)
    }
}

/// Drives one watch (its cache with it), waking the loop on each change and logging each distinct
/// failure once (the watch retries on its own back-off).
async fn watch<K, S>(what: &'static str, stream: S, wake: Arc<Notify>)
where
    K: Resource + Clone + std::fmt::Debug + Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut last_error = String::new();
    let events = stream.default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            // `Init` starts a (re)list, which may fail yet: only what a list or watch gave counts.
            Ok(watcher::Event::Init) => {}
            Ok(_) => {
                if !last_error.is_empty() {
                    tracing::info!(watch = what, "kubevirt-eps: the watch works again");
                    last_error.clear();
                }
                wake.notify_one();
            }
            Err(err) => {
                let message = err.to_string();
                if message != last_error {
                    tracing::warn!(watch = what, error = %message, "kubevirt-eps: the watch fails; retrying");
                    last_error = message;
                }
            }
        }
    }
}

async fn reconcile_loop(caches: &Caches, infra: &Infra, wake: &Notify) {
    let mut next = RESYNC;
    loop {
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(next) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        let ready = async {
            caches.services.wait_until_ready().await?;
            caches.slices.wait_until_ready().await?;
            caches.vmis.wait_until_ready().await?;
            caches.tenant_slices.wait_until_ready().await
        };
        if ready.await.is_err() {
            return;
        }
        next = if reconcile_all(caches, infra).await {
            RESYNC
        } else {
            RETRY
        };
    }
}

/// Plans and applies every mirrored Service of the cluster (the watches select its own; and the slices whose Service is gone);
/// `false` when a write failed (the next look comes sooner).
async fn reconcile_all(caches: &Caches, infra: &Infra) -> bool {
    let vmis: BTreeMap<String, Vmi> = caches
        .vmis
        .state()
        .iter()
        .filter_map(|v| Some((v.metadata.name.clone()?, (**v).clone())))
        .collect();
    let mut slices_by_service: BTreeMap<String, Vec<EndpointSlice>> = BTreeMap::new();
    for slice in caches.slices.state() {
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(plan::SERVICE_NAME_LABEL))
            .cloned()
            .unwrap_or_default();
        slices_by_service
            .entry(service)
            .or_default()
            .push((*slice).clone());
    }
    let services: BTreeMap<String, Arc<Service>> = caches
        .services
        .state()
        .into_iter()
        .filter_map(|s| Some((s.metadata.name.clone()?, s)))
        .collect();
    let tenant_slices = caches.tenant_slices.state();
    let mut ok = true;
    let names: std::collections::BTreeSet<String> = services
        .keys()
        .filter(|name| plan::mirrored(&services[*name]))
        .chain(slices_by_service.keys())
        .cloned()
        .collect();
    for name in names {
        let service = services.get(&name).map(Arc::as_ref);
        let labels = service
            .and_then(|s| s.metadata.labels.clone())
            .unwrap_or_default();
        let tenant: Vec<EndpointSlice> = match (
            labels.get(TENANT_SERVICE_NAMESPACE_LABEL),
            labels.get(TENANT_SERVICE_NAME_LABEL),
        ) {
            (Some(namespace), Some(tenant_name)) => tenant_slices
                .iter()
                .filter(|s| {
                    s.metadata.namespace.as_ref() == Some(namespace)
                        && s.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(plan::SERVICE_NAME_LABEL))
                            == Some(tenant_name)
                })
                .map(|s| (**s).clone())
                .collect(),
            _ => Vec::new(),
        };
        let existing = slices_by_service.get(&name).cloned().unwrap_or_default();
        let changes = plan::plan(service, &tenant, &vmis, &existing);
        for change in changes {
            if let Err(err) = apply(infra, &change).await {
                tracing::warn!(infra_service = %name, error = %err, "kubevirt-eps: could not mirror the endpoints; trying again shortly");
                ok = false;
                break;
            }
        }
    }
    ok
}

/// Logs that the infra EndpointSlice `name` was `written` (created or updated) as `slice`.
fn log_written(written: &str, name: Option<&str>, slice: &EndpointSlice) {
    tracing::info!(
        endpointslice = name.unwrap_or_default(),
        endpoints = slice.endpoints.as_ref().map_or(0, Vec::len),
        "kubevirt-eps: {written} an infra EndpointSlice"
    );
}

async fn apply(infra: &Infra, change: &Change) -> Result<(), crate::Error> {
    match change {
        Change::Create(slice) => {
            let created = infra.create_slice(slice).await?;
            log_written("created", created.metadata.name.as_deref(), slice);
        }
        Change::Replace(slice) => {
            infra.replace_slice(slice).await?;
            log_written("updated", slice.metadata.name.as_deref(), slice);
        }
        Change::Delete(name) => {
            infra.delete_slice(name).await?;
            tracing::info!(endpointslice = %name, "kubevirt-eps: deleted an infra EndpointSlice");
        }
    }
    Ok(())
}
