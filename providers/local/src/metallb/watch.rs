//! Keeps what MetalLB's objects make out in force as they change: one reflector per kind in MetalLB's
//! namespace, and on every change (or every [`RECHECK`], which also catches a cloud-config edit) the
//! objects are translated again and the result put in force when it differs. The manager (`report`)
//! records a Warning event [`super::EVENT_REFUSED`] on each object refused, once per reason.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use cloud_provider::{Supervisor, supervise::Ends};
use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::Notify;

use super::{GROUP, Kind, Object, Refusal, Translation, translate, translate_keeping};
use crate::{
    CloudEvent, Config, LocalCloud, MetallbObjects, lock, pool_objects::EVENT_POOL_EXHAUSTED,
    pool_usage::PoolUsage,
};

/// How often the pools' usage is looked at (and written when it changed).
const USAGE_INTERVAL: Duration = Duration::from_secs(2);

/// How often the objects are translated again without a change (a cloud-config edit changes what
/// they make out), and how often a cluster without MetalLB's CRDs is looked at again.
const RECHECK: Duration = Duration::from_secs(30);

/// Whether `config` asks for MetalLB's objects (the CRDs aside), and from which namespace. Never in
/// leader mode, whose deployment has no permission to read them (the leading manager announces every
/// VIP itself; MetalLB's advertisements, peers and node selectors mean nothing there).
fn wanted(config: &Config) -> Option<String> {
    let settings = &config.load_balancer.metallb;
    let own_pools = config.address_pools != Config::default().address_pools;
    if config.load_balancer.mode != crate::LoadBalancerMode::Agents {
        return None;
    }
    match settings.objects {
        MetallbObjects::Ignore => None,
        MetallbObjects::Auto if own_pools => None,
        MetallbObjects::Auto | MetallbObjects::Read => Some(settings.namespace.clone()),
    }
}

/// Whether MetalLB's objects may bring BGP peers to a cloud-config `config` (they are read).
pub(crate) fn may_add_peers(config: &Config) -> bool {
    wanted(config).is_some()
}

/// Whether the API server serves `metallb.io` (MetalLB's CRDs are installed).
async fn served(client: &Client) -> Result<bool, kube::Error> {
    match kube::discovery::group(client, GROUP).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(kube::Error::Discovery(_)) => Ok(false),
        Err(err) => Err(err),
    }
}

fn resource(kind: Kind) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, kind.version(), kind.name()),
        kind.plural(),
    )
}

fn object(kind: Kind, found: &DynamicObject) -> Object {
    Object {
        kind,
        name: found.metadata.name.clone().unwrap_or_default(),
        labels: found.metadata.labels.clone().unwrap_or_default(),
        created: found
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        spec: found
            .data
            .get("spec")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({})),
    }
}

/// Reads MetalLB's objects once and puts what they make out in force (when the cloud-config asks for
/// them and the CRDs exist), then keeps it in force in the background (a task of `supervisor`), waking
/// `on_change` whenever it changes. A cluster without the CRDs is looked at again every [`RECHECK`].
/// Called before the cloud gives out or reserves addresses, so that the pools are MetalLB's from the
/// start.
pub(crate) async fn start(
    cloud: &LocalCloud,
    client: Client,
    supervisor: &Supervisor,
    report: bool,
    on_change: Option<Arc<Notify>>,
) -> Result<(), crate::Error> {
    let Some(namespace) = wanted(&cloud.file_config()) else {
        if report && matches!(served(&client).await, Ok(true)) {
            tracing::info!(
                "MetalLB's CRDs are installed, and its objects are not read: local reads them in \
                 loadBalancer.mode: agents, when the cloud-config defines no addressPools or sets \
                 loadBalancer.metallb.objects: read (docs/local-provider.md, \"Coming from MetalLB\")"
            );
        }
        return Ok(());
    };
    let kube_error = |what: &str| {
        let what = format!("local cloud: {what}");
        move |source| crate::Error::Kube { what, source }
    };
    if served(&client)
        .await
        .map_err(kube_error("looking for MetalLB's CRDs (metallb.io)"))?
    {
        let mut objects = Vec::new();
        for kind in Kind::ALL {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &resource(kind));
            let list = api
                .list(&Default::default())
                .await
                .map_err(kube_error(&format!(
                    "listing MetalLB's {} objects in {namespace}",
                    kind.name()
                )))?;
            objects.extend(list.items.iter().map(|o| object(kind, o)));
        }
        let translation = translate(&objects, &cloud.file_config());
        tracing::info!(
            namespace,
            objects = objects.len(),
            pools = translation.pools.len(),
            peers = translation.peers.len(),
            refused = translation.refusals.len(),
            "MetalLB's objects read"
        );
        cloud.set_metallb(translation);
    } else {
        tracing::info!(
            "MetalLB's CRDs (metallb.io) are not installed: looking again every {RECHECK:?}"
        );
    }
    let cloud = cloud.clone();
    supervisor.spawn("MetalLB's objects", Ends::AtShutdown, move || {
        let (cloud, client, namespace, on_change) = (
            cloud.clone(),
            client.clone(),
            namespace.clone(),
            on_change.clone(),
        );
        async move { keep(&cloud, client, &namespace, report, on_change).await }
    });
    Ok(())
}

/// Waits for the CRDs, then watches the objects and keeps their translation in force (forever: the
/// caller ends it; it returns only when one of its watches ended, a bug).
async fn keep(
    cloud: &LocalCloud,
    client: Client,
    namespace: &str,
    report: bool,
    on_change: Option<Arc<Notify>>,
) {
    wait_for_crds(&client).await;
    let changed = Arc::new(Notify::new());
    let mut drivers = tokio::task::JoinSet::new();
    let stores = watch_every_kind(&client, namespace, &changed, &mut drivers).await;
    let mut told: BTreeSet<Refusal> = BTreeSet::new();
    let mut last_good = BTreeMap::new();
    let mut written: BTreeMap<String, PoolUsage> = BTreeMap::new();
    let mut usage_tick = tokio::time::interval(USAGE_INTERVAL);
    loop {
        let objects: Vec<Object> = stores
            .iter()
            .flat_map(|(kind, store)| store.state().into_iter().map(|o| object(*kind, &o)))
            .collect();
        let translation = translate_keeping(&objects, &cloud.file_config(), &mut last_good);
        if report {
            tell(cloud, namespace, &translation, &mut told);
        }
        if lock(&cloud.inner.metallb).as_ref() != Some(&translation) {
            tracing::info!(
                pools = translation.pools.len(),
                peers = translation.peers.len(),
                refused = translation.refusals.len(),
                "MetalLB's objects changed: put in force"
            );
            cloud.set_metallb(translation);
            if let Some(notify) = &on_change {
                notify.notify_one();
            }
        }
        let recheck = tokio::time::sleep(RECHECK);
        tokio::pin!(recheck);
        loop {
            tokio::select! {
                () = changed.notified() => {
                    // The objects of one `kubectl apply` arrive together: read them together.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    break;
                }
                () = &mut recheck => break,
                // A watch never ends on its own (it retries): one that did, or panicked, would leave
                // its kind's objects frozen. Its panic goes on to this task's supervisor, which starts
                // every watch again; an end is a failure of this task.
                Some(ended) = drivers.join_next() => {
                    if let Err(err) = ended && err.is_panic() {
                        std::panic::resume_unwind(err.into_panic());
                    }
                    tracing::error!("a watch of MetalLB's objects ended (a bug)");
                    return;
                }
                _ = usage_tick.tick(), if report => {
                    write_usage(cloud, &client, namespace, &stores, &mut written).await;
                }
            }
        }
    }
}

/// Waits until MetalLB's CRDs are served, looking again every [`RECHECK`].
async fn wait_for_crds(client: &Client) {
    loop {
        match served(client).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(err) => tracing::warn!(error = %err, "looking for MetalLB's CRDs failed; retrying"),
        }
        tokio::time::sleep(RECHECK).await;
    }
}

/// Watches each kind of MetalLB's objects in `namespace` into a store, its watch driven in `drivers`
/// and telling `changed` of every event; returns once each store has its first list (or after
/// [`RECHECK`], for a kind whose watch keeps failing: the others' objects are read meanwhile).
async fn watch_every_kind(
    client: &Client,
    namespace: &str,
    changed: &Arc<Notify>,
    drivers: &mut tokio::task::JoinSet<()>,
) -> Vec<(Kind, Store<DynamicObject>)> {
    let stores: Vec<(Kind, Store<DynamicObject>)> = Kind::ALL
        .iter()
        .map(|kind| {
            let resource = resource(*kind);
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            let writer = reflector::store::Writer::new(resource);
            let store = writer.as_reader();
            let stream = reflector::reflector(
                writer,
                watcher(api, watcher::Config::default())
                    .backoff(cloud_provider::watch_retry_backoff()),
            );
            let changed = changed.clone();
            let name = kind.name();
            drivers.spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(_) => changed.notify_one(),
                        Err(err) => {
                            tracing::warn!(kind = name, error = %err, "watching MetalLB's objects failed; retrying");
                        }
                    }
                }
            });
            (*kind, store)
        })
        .collect();
    for (_, store) in &stores {
        let _ = tokio::time::timeout(RECHECK, store.wait_until_ready()).await;
    }
    stores
}

/// Writes the usage of each pool read from an `IPAddressPool` into its status, in MetalLB's fields
/// (`assignedIPv4`, `assignedIPv6`, `availableIPv4`, `availableIPv6`; `kubectl -n metallb-system get
/// ipaddresspools -o yaml`), when it changed since last written; a pool that runs out of the addresses
/// of a family gets a Warning event [`EVENT_POOL_EXHAUSTED`]. A failed write is logged and tried again.
async fn write_usage(
    cloud: &LocalCloud,
    client: &Client,
    namespace: &str,
    stores: &[(Kind, Store<DynamicObject>)],
    written: &mut BTreeMap<String, PoolUsage>,
) {
    if !cloud.config().metallb_pools {
        return;
    }
    let Some((_, pools)) = stores.iter().find(|(k, _)| *k == Kind::IpAddressPool) else {
        return;
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource(Kind::IpAddressPool));
    for usage in cloud.pool_usage() {
        let Some(object) = pools
            .state()
            .into_iter()
            .find(|o| o.metadata.name.as_deref() == Some(usage.name.as_str()))
        else {
            continue;
        };
        let status = serde_json::json!({
            "assignedIPv4": usage.assigned_v4,
            "assignedIPv6": usage.assigned_v6,
            "availableIPv4": usage.available_v4,
            "availableIPv6": usage.available_v6,
        });
        let before = written.get(&usage.name);
        let was_exhausted = before.is_some_and(PoolUsage::exhausted);
        if object.data.get("status") != Some(&status) {
            let patch = serde_json::json!({"status": status});
            match api
                .patch_status(&usage.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(pool = %usage.name, error = %err, "writing the usage of MetalLB's IPAddressPool failed; trying again");
                    continue;
                }
            }
        }
        if usage.exhausted() && !was_exhausted {
            cloud.record_warning(
                CloudEvent {
                    namespace,
                    name_prefix: format!("{}.exhausted-", usage.name),
                    regarding: Some(reference(Kind::IpAddressPool, &usage.name, namespace)),
                    reason: EVENT_POOL_EXHAUSTED,
                    action: "AssignAddress",
                },
                &usage.exhausted_note(&format!("IPAddressPool {:?}", usage.name)),
            );
        }
        written.insert(usage.name.clone(), usage);
    }
}

/// A reference to a MetalLB object, for an event about it.
fn reference(
    kind: Kind,
    name: &str,
    namespace: &str,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(format!("{GROUP}/{}", kind.version())),
        kind: Some(kind.name().to_owned()),
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}

/// Records a Warning event on each object refused for a reason not yet told; a reason that went away
/// is forgotten (told again should it come back).
fn tell(
    cloud: &LocalCloud,
    namespace: &str,
    translation: &Translation,
    told: &mut BTreeSet<Refusal>,
) {
    if !cloud.can_report() {
        return;
    }
    let now: BTreeSet<Refusal> = translation.refusals.iter().cloned().collect();
    for refusal in now.difference(told) {
        tracing::warn!(kind = refusal.kind.name(), name = %refusal.name, "MetalLB object refused: {}", refusal.message);
        cloud.record_warning(
            CloudEvent {
                namespace,
                name_prefix: format!("{}.metallb-", refusal.name),
                regarding: Some(reference(refusal.kind, &refusal.name, namespace)),
                reason: super::EVENT_REFUSED,
                action: "ReadMetalLBObject",
            },
            &format!(
                "{} {:?} is refused: {}",
                refusal.kind.name(),
                refusal.name,
                refusal.message
            ),
        );
    }
    *told = now;
}
