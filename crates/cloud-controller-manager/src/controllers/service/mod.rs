//! The service-lb controller (`service-lb-controller`, alias `service`): a cloud load balancer for every
//! `type: LoadBalancer` Service without a `loadBalancerClass`, kept in step with the Service and the
//! cluster's nodes, and deleted before the Service goes (the `service.kubernetes.io/load-balancer-cleanup`
//! finalizer).
//!
//! Beyond upstream: a Service whose last sync succeeded and that has not changed in a way that matters is
//! not synced again (no cloud call, no event, no write); node changes update the affected load balancers
//! in parallel (up to `--concurrent-service-syncs`); a failing Service retries on its own back-off without
//! delaying others; and `service_controller_load_balancers` reports how many load balancers the
//! controller believes exist.

pub mod node_set;
pub mod plan;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cloud_provider::{CloudError, CloudProvider, LoadBalancer};
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api, ResourceExt,
    runtime::{
        Controller,
        controller::{Action, Config as RuntimeConfig},
        events::EventType,
        reflector::{ObjectRef, Store},
    },
};
use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::{
    node_set::{BackendFacts, BackendSet, backend_set, is_backend},
    plan::{
        current_status, finalizers_patch, has_finalizer, ingress_equal, needs_cleanup,
        needs_update, status_patch, wants_load_balancer, with_finalizer, without_finalizer,
    },
};
use super::{
    ControllerContext, ControllerTask,
    patch::{Target, patch_with_retry},
};
use crate::{events::EventRecorder, informers::Change};

/// The event source, as upstream names it.
pub const COMPONENT: &str = "service-controller";

const MIN_RETRY: Duration = Duration::from_secs(5);
/// How long a node sync waits for more node changes after the first one.
const NODE_SYNC_SETTLE: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// The safety net: a node sync pass this often even without node changes (upstream's
/// `nodeSyncPeriod`). A pass that finds every load balancer's backends current calls nothing.
const NODE_SYNC_PERIOD: Duration = Duration::from_secs(100);

/// The controller's metrics: upstream's names, plus the load balancers it believes exist.
#[derive(Clone)]
pub struct ServiceMetrics {
    sync_total: Counter,
    nodesync_errors: Counter,
    nodesync_latency: Histogram,
    host_update_latency: Histogram,
    load_balancers: Gauge,
}

impl ServiceMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let buckets = || {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1.0, 2.0, 15,
            ))
        };
        let metrics = Self {
            sync_total: Counter::default(),
            nodesync_errors: Counter::default(),
            nodesync_latency: buckets(),
            host_update_latency: buckets(),
            load_balancers: Gauge::default(),
        };
        let sub = registry.sub_registry_with_prefix("service_controller");
        sub.register(
            "loadbalancer_sync",
            "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            metrics.sync_total.clone(),
        );
        sub.register(
            "nodesync_error",
            "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            metrics.nodesync_errors.clone(),
        );
        sub.register(
            "nodesync_latency_seconds",
            "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
            metrics.nodesync_latency.clone(),
        );
        sub.register(
            "update_loadbalancer_host_latency_seconds",
            "A metric measuring the latency for updating each load balancer hosts.",
            metrics.host_update_latency.clone(),
        );
        sub.register(
            "load_balancers",
            "The number of load balancers this controller believes exist.",
            metrics.load_balancers.clone(),
        );
        metrics
    }
}

/// Why a Service could not be synced (it is retried on its own back-off).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A cloud call failed.
    #[error("{what}: {source}")]
    Cloud {
        /// What was being done.
        what: &'static str,
        /// The cloud's error.
        #[source]
        source: CloudError,
    },
    /// The API server refused a write.
    #[error("{what}: {source}")]
    Write {
        /// What was being written.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The cloud stopped offering load balancers.
    #[error("the cloud provider does not support external load balancers")]
    Unsupported,
    /// The cloud returned no status.
    #[error("service status returned by EnsureLoadBalancer is nil")]
    NoStatus,
}

impl ServiceError {
    /// The delay a `RetryAfter` from the cloud asks for.
    fn retry_delay(&self) -> Option<Duration> {
        match self {
            Self::Cloud { source, .. } => source.retry_delay(),
            _ => None,
        }
    }
}

/// What the controller remembers of a Service it handled.
#[derive(Clone)]
struct Tracked {
    service: Arc<Service>,
    /// The last sync completed: nothing to do until the Service changes in a way that matters.
    synced: bool,
    /// The backends the load balancer was last given (shared by every Service synced with them).
    backends: Arc<BackendSet>,
}

/// The backend nodes and their set, computed once per node-set change and shared by every sync: with
/// thousands of nodes, a copy per Service would cost more than the sync.
#[derive(Clone)]
struct Backends {
    nodes: Arc<Vec<Node>>,
    set: Arc<BackendSet>,
}

struct Context {
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    cluster_name: String,
    nodes: Store<Node>,
    events: EventRecorder,
    metrics: ServiceMetrics,
    tracked: Mutex<HashMap<String, Tracked>>,
    failures: Mutex<HashMap<String, u32>>,
    retry: mpsc::UnboundedSender<ObjectRef<Service>>,
    workers: usize,
    backends: Mutex<Option<Backends>>,
    /// Asks the node-sync loop for a pass (a sync finished with backends that changed meanwhile).
    node_sync_wanted: tokio::sync::Notify,
}

fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.namespace().unwrap_or_default(),
        service.name_any()
    )
}

impl Context {
    /// The Services API of `service`'s namespace.
    fn api(&self, service: &Service) -> Api<Service> {
        Api::namespaced(
            self.client.clone(),
            &service.namespace().unwrap_or_default(),
        )
    }

    fn load_balancer(&self) -> Result<&dyn LoadBalancer, ServiceError> {
        self.cloud.load_balancer().ok_or(ServiceError::Unsupported)
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update_gauge(&self) {
        let count = self
            .tracked()
            .values()
            .filter(|t| t.synced && wants_load_balancer(&t.service))
            .count();
        self.metrics.load_balancers.set(count as i64);
    }

    /// The nodes that back load balancers now (cached until the node sync sees them change).
    fn backends(&self) -> Backends {
        let mut cache = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(backends) = cache.as_ref() {
            return backends.clone();
        }
        let nodes: Vec<Node> = self
            .nodes
            .state()
            .iter()
            .filter(|n| is_backend(n))
            .map(|n| (**n).clone())
            .collect();
        let backends = Backends {
            set: Arc::new(backend_set(&nodes)),
            nodes: Arc::new(nodes),
        };
        *cache = Some(backends.clone());
        backends
    }

    fn forget_backends(&self) {
        *self.backends.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The service-lb controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `--cluster-name` passed to the cloud's load-balancer calls.
    pub cluster_name: String,
    /// Services synced at once, and load balancers updated at once after a node change
    /// (`--concurrent-service-syncs`).
    pub workers: usize,
}

/// Starts the controller: `None` (with a warning) when the cloud offers no load balancers.
pub fn start(ctx: ControllerContext, config: Config) -> Option<ControllerTask> {
    if ctx.cloud.load_balancer().is_none() {
        tracing::warn!(
            controller = COMPONENT,
            "the cloud provider does not support external load balancers; not starting"
        );
        return None;
    }
    let service_changes = ctx.services.subscribe_changes();
    let node_changes = ctx.nodes.subscribe_changes();
    let services = ctx.services.store();
    let nodes = ctx.nodes.clone();
    let shared_services = ctx.services.clone();
    let (retry, retries) = mpsc::unbounded_channel();
    let Config {
        cluster_name,
        workers,
    } = config;
    let context = Arc::new(Context {
        client: ctx.client.clone(),
        cloud: ctx.cloud.clone(),
        cluster_name,
        nodes: nodes.store(),
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        metrics: ctx.metrics.service.clone(),
        tracked: Mutex::default(),
        failures: Mutex::default(),
        retry,
        workers,
        backends: Mutex::default(),
        node_sync_wanted: tokio::sync::Notify::new(),
    });
    let shutdown = ctx.shutdown.clone();
    Some(Box::pin(async move {
        // Load balancers are given the cluster's nodes: wait until both caches hold them.
        tokio::select! {
            () = async { nodes.wait_until_synced().await; shared_services.wait_until_synced().await } => {}
            () = shutdown.cancelled() => return Ok(()),
        }
        let (triggers, deletions) = split_changes(service_changes);
        let deleted = tokio::spawn(handle_deletions(
            context.clone(),
            deletions,
            shutdown.clone(),
        ));
        let node_sync = tokio::spawn(node_sync_loop(
            context.clone(),
            node_changes,
            shutdown.clone(),
        ));
        let retries =
            futures::stream::unfold(
                retries,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        Controller::for_shared_stream(triggers, services)
            .reconcile_on(retries)
            .with_config(RuntimeConfig::default().concurrency(workers as u16))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(reconcile, error_policy, context)
            .for_each(|result| {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "service reconcile did not finish");
                }
                std::future::ready(())
            })
            .await;
        let _ = deleted.await;
        let _ = node_sync.await;
        Ok(())
    }))
}

/// Splits a change stream into applied objects (the controller's triggers) and deletions.
fn split_changes(
    changes: impl Stream<Item = Change<Service>> + Send + 'static,
) -> (
    impl Stream<Item = Arc<Service>> + Send + 'static,
    mpsc::UnboundedReceiver<Arc<Service>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let applied = changes.filter_map(move |change| {
        std::future::ready(match change {
            Change::Applied(service) => Some(service),
            Change::Deleted(service) => {
                let _ = tx.send(service);
                None
            }
        })
    });
    (applied, rx)
}

fn backoff(failures: u32) -> Duration {
    MIN_RETRY
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}

fn error_policy(service: Arc<Service>, err: &ServiceError, ctx: Arc<Context>) -> Action {
    let key = key(&service);
    // A RetryAfter from the cloud is a fixed delay; it does not grow the back-off.
    let delay = err.retry_delay().unwrap_or_else(|| {
        let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(key.clone()).or_default();
        *count += 1;
        let write_error = match err {
            ServiceError::Write { source, .. } => Some(source),
            _ => None,
        };
        super::outage::retry_delay(backoff(*count), write_error)
    });
    tracing::warn!(service = %key, error = %err, retry_in = ?delay, "failed to sync load balancer");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(service = %key(&service)))]
async fn reconcile(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ServiceError> {
    let result = sync(&service, &ctx).await;
    if let Err(err) = &result {
        ctx.events
            .record(
                service.as_ref(),
                EventType::Warning,
                "SyncLoadBalancerFailed",
                "SyncLoadBalancer",
                format!("Error syncing load balancer: {err}"),
            )
            .await;
    } else {
        ctx.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(&service));
    }
    ctx.update_gauge();
    result.map(|()| Action::await_change())
}

async fn sync(service: &Arc<Service>, ctx: &Context) -> Result<(), ServiceError> {
    let key = key(service);
    let previous = ctx.tracked().get(&key).cloned();
    // Deleted and re-created under the same name (without our finalizer): clean up the old one first.
    if let Some(previous) = &previous
        && previous.service.metadata.uid != service.metadata.uid
    {
        if wants_load_balancer(&previous.service) {
            delete_load_balancer(&previous.service, ctx).await?;
        }
        ctx.tracked().remove(&key);
    }
    let same = previous
        .as_ref()
        .filter(|p| p.service.metadata.uid == service.metadata.uid);
    let being_deleted = service.metadata.deletion_timestamp.is_some();

    if !wants_load_balancer(service) || needs_cleanup(service) || being_deleted {
        let ours = has_finalizer(service) || same.is_some_and(|p| wants_load_balancer(&p.service));
        if !ours {
            ctx.tracked().remove(&key);
            return Ok(()); // never had a load balancer from us: no cloud call
        }
        return cleanup(service, ctx).await;
    }

    if let Some(previous) = same
        && previous.synced
        && has_finalizer(service)
        && !needs_update(&previous.service, service)
    {
        // Nothing that matters changed since the last good sync (e.g. our own status write).
        if let Some(tracked) = ctx.tracked().get_mut(&key) {
            tracked.service = service.clone();
        }
        return Ok(());
    }
    ensure(service, ctx).await
}

async fn cleanup(service: &Arc<Service>, ctx: &Context) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    let exists = lb
        .get_load_balancer(&ctx.cluster_name, service)
        .await
        .map_err(|source| ServiceError::Cloud {
            what: "failed to check if load balancer exists before cleanup",
            source,
        })?
        .is_some();
    if exists {
        ctx.events
            .record(
                service.as_ref(),
                EventType::Normal,
                "DeletingLoadBalancer",
                "DeleteLoadBalancer",
                "Deleting load balancer".to_owned(),
            )
            .await;
        match lb
            .ensure_load_balancer_deleted(&ctx.cluster_name, service)
            .await
        {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
            Err(source) => {
                return Err(ServiceError::Cloud {
                    what: "failed to delete load balancer",
                    source,
                });
            }
        }
    }
    ctx.metrics.sync_total.inc();
    // Forgotten before the finalizer goes: once it is gone the API server deletes the Service, and its
    // Deleted event must not find it tracked (the deletion handler would delete the load balancer a
    // second time). If the patch fails, the retry cleans up again; it needs no tracking.
    ctx.tracked().remove(&key(service));
    patch_with_retry(
        &ctx.api(service),
        service.as_ref(),
        Target::Status,
        |current, rv| {
            without_finalizer(current).map(|finalizers| finalizers_patch(&finalizers, rv))
        },
    )
    .await
    .map_err(|source| ServiceError::Write {
        what: "failed to remove load balancer cleanup finalizer",
        source,
    })?;
    ctx.events
        .record(
            service.as_ref(),
            EventType::Normal,
            "DeletedLoadBalancer",
            "DeleteLoadBalancer",
            "Deleted load balancer".to_owned(),
        )
        .await;
    if !ingress_equal(&current_status(service), &Default::default()) {
        write_status(ctx, service, &Default::default()).await?;
    }
    Ok(())
}

async fn ensure(service: &Arc<Service>, ctx: &Context) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    ctx.events
        .record(
            service.as_ref(),
            EventType::Normal,
            "EnsuringLoadBalancer",
            "EnsureLoadBalancer",
            "Ensuring load balancer".to_owned(),
        )
        .await;
    // The finalizer first: no cloud load balancer may exist without it.
    patch_with_retry(
        &ctx.api(service),
        service.as_ref(),
        Target::Status,
        |current, rv| with_finalizer(current).map(|finalizers| finalizers_patch(&finalizers, rv)),
    )
    .await
    .map_err(|source| ServiceError::Write {
        what: "failed to add load balancer cleanup finalizer",
        source,
    })?;

    let Backends { nodes, set } = ctx.backends();
    if nodes.is_empty() {
        ctx.events
            .record(
                service.as_ref(),
                EventType::Warning,
                "UnAvailableLoadBalancer",
                "EnsureLoadBalancer",
                "There are no available nodes for LoadBalancer".to_owned(),
            )
            .await;
    }
    ctx.tracked().insert(
        key(service),
        Tracked {
            service: service.clone(),
            synced: false,
            backends: set,
        },
    );
    ctx.metrics.sync_total.inc();
    let status = match lb
        .ensure_load_balancer(&ctx.cluster_name, service, &nodes)
        .await
    {
        Ok(status) => status,
        Err(CloudError::ImplementedElsewhere) => {
            mark_synced(ctx, service);
            return Ok(());
        }
        Err(source) => {
            return Err(ServiceError::Cloud {
                what: "failed to ensure load balancer",
                source,
            });
        }
    };
    if status.ingress.is_none() {
        return Err(ServiceError::NoStatus);
    }
    ctx.events
        .record(
            service.as_ref(),
            EventType::Normal,
            "EnsuredLoadBalancer",
            "EnsureLoadBalancer",
            "Ensured load balancer".to_owned(),
        )
        .await;
    if !ingress_equal(&current_status(service), &status) {
        write_status(ctx, service, &status).await?;
    }
    mark_synced(ctx, service);
    Ok(())
}

/// Marks the Service synced. Node changes during its sync were skipped by the node sync (it passes over
/// Services being synced), so if the backends it was given are no longer the wanted ones, a node sync
/// pass is asked for: it updates this load balancer like any other.
fn mark_synced(ctx: &Context, service: &Arc<Service>) {
    let stale = match ctx.tracked().get_mut(&key(service)) {
        Some(tracked) => {
            tracked.synced = true;
            tracked.backends.clone()
        }
        None => return,
    };
    let wanted = ctx.backends().set;
    if !Arc::ptr_eq(&stale, &wanted) && *stale != *wanted {
        tracing::info!(service = %key(service), "nodes changed during the sync; asking for a node sync");
        ctx.node_sync_wanted.notify_one();
    }
}

async fn write_status(
    ctx: &Context,
    service: &Service,
    status: &k8s_openapi::api::core::v1::LoadBalancerStatus,
) -> Result<(), ServiceError> {
    let patch = status_patch(status);
    match ctx
        .api(service)
        .patch_status(
            &service.name_any(),
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // The Service went away once its finalizer was removed.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ServiceError::Write {
            what: "failed to update load balancer status",
            source,
        }),
    }
}

/// Deletes the load balancer of a Service that is gone (or was replaced), as upstream's cache path does.
async fn delete_load_balancer(service: &Service, ctx: &Context) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    ctx.events
        .record(
            service,
            EventType::Normal,
            "DeletingLoadBalancer",
            "DeleteLoadBalancer",
            "Deleting load balancer".to_owned(),
        )
        .await;
    match lb
        .ensure_load_balancer_deleted(&ctx.cluster_name, service)
        .await
    {
        Ok(()) | Err(CloudError::ImplementedElsewhere) => {
            ctx.events
                .record(
                    service,
                    EventType::Normal,
                    "DeletedLoadBalancer",
                    "DeleteLoadBalancer",
                    "Deleted load balancer".to_owned(),
                )
                .await;
            Ok(())
        }
        Err(source) => {
            ctx.events
                .record(
                    service,
                    EventType::Warning,
                    "DeleteLoadBalancerFailed",
                    "DeleteLoadBalancer",
                    format!("Error deleting load balancer: {source}"),
                )
                .await;
            Err(ServiceError::Cloud {
                what: "failed to delete load balancer",
                source,
            })
        }
    }
}

/// Services that vanished without our finalizer (it was removed by hand, or they predate us) still lose
/// their load balancer; failures retry on the same back-off as syncs.
async fn handle_deletions(
    ctx: Arc<Context>,
    mut deletions: mpsc::UnboundedReceiver<Arc<Service>>,
    shutdown: CancellationToken,
) {
    loop {
        let service = tokio::select! {
            service = deletions.recv() => match service { Some(s) => s, None => return },
            () = shutdown.cancelled() => return,
        };
        let key = key(&service);
        let tracked = ctx.tracked().get(&key).cloned();
        let Some(tracked) = tracked.filter(|t| t.service.metadata.uid == service.metadata.uid)
        else {
            continue; // cleaned up through the finalizer, or never ours
        };
        ctx.tracked().remove(&key);
        if !wants_load_balancer(&tracked.service) {
            continue;
        }
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut failures = 0;
            while let Err(err) = delete_load_balancer(&tracked.service, &ctx).await {
                failures += 1;
                let delay = err.retry_delay().unwrap_or_else(|| backoff(failures));
                tracing::warn!(service = %key, error = %err, retry_in = ?delay, "failed to delete the load balancer of a deleted service");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return,
                }
            }
            ctx.update_gauge();
        });
    }
}

/// Node sync: a node change that alters the backend set (added, deleted, exclusion flipped, provider ID
/// changed) updates the load balancers whose backends differ; other node updates (heartbeats, conditions,
/// labels) do nothing. One pass at a time, after the changes of a burst have settled (500 ms); changes
/// during a pass cause one more pass. A sync that ends with outdated backends asks for a pass, and one
/// runs every [`NODE_SYNC_PERIOD`] in any case, with the backend list recomputed from the node cache.
async fn node_sync_loop(
    ctx: Arc<Context>,
    changes: impl Stream<Item = Change<Node>> + Send + 'static,
    shutdown: CancellationToken,
) {
    let mut changes = Box::pin(changes);
    let mut facts: HashMap<String, BackendFacts> = HashMap::new();
    // Whether the change triggers a node sync; any change to what the predicates read also drops the
    // cached backend list.
    let mut observe = |change: Change<Node>| -> bool {
        let (before, after) = match change {
            Change::Applied(node) => {
                let now = BackendFacts::of(&node);
                (facts.insert(node.name_any(), now.clone()), Some(now))
            }
            Change::Deleted(node) => (facts.remove(&node.name_any()), None),
        };
        if before != after {
            ctx.forget_backends();
        }
        before.as_ref().map(BackendFacts::sync_facts)
            != after.as_ref().map(BackendFacts::sync_facts)
    };
    let mut period = tokio::time::interval(NODE_SYNC_PERIOD);
    period.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    period.reset(); // the first tick after a period, not at once
    loop {
        let mut pending = tokio::select! {
            change = changes.next() => match change { Some(change) => observe(change), None => return },
            () = ctx.node_sync_wanted.notified() => true,
            _ = period.tick() => {
                ctx.forget_backends();
                true
            }
            () = shutdown.cancelled() => return,
        };
        // Take every change already waiting, so a burst of node events makes one pass.
        while let Some(Some(change)) = changes.next().now_or_never() {
            pending |= observe(change);
        }
        if !pending {
            continue;
        }
        // Nodes come and go in bursts (a scale-up, a rolling replacement): gather what follows within a
        // short settle time, so each load balancer gets one update for the burst, not one per node.
        let settle = tokio::time::sleep(NODE_SYNC_SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(change) => { observe(change); }
                    None => return,
                },
                () = &mut settle => break,
                () = shutdown.cancelled() => return,
            }
        }
        sync_nodes(&ctx).await;
    }
}

async fn sync_nodes(ctx: &Arc<Context>) {
    let started = Instant::now();
    let Backends { nodes, set: wanted } = ctx.backends();
    let stale: Vec<Tracked> = ctx
        .tracked()
        .values()
        .filter(|t| {
            t.synced
                && wants_load_balancer(&t.service)
                && !Arc::ptr_eq(&t.backends, &wanted)
                && t.backends != wanted
        })
        .cloned()
        .collect();
    if stale.is_empty() {
        return;
    }
    tracing::info!(
        services = stale.len(),
        nodes = nodes.len(),
        "updating load balancer hosts"
    );
    futures::stream::iter(stale)
        .for_each_concurrent(ctx.workers.max(1), |tracked| {
            let nodes = &nodes;
            let wanted = &wanted;
            async move { update_hosts(ctx, tracked, nodes, wanted).await }
        })
        .await;
    ctx.metrics
        .nodesync_latency
        .observe(started.elapsed().as_secs_f64());
}

async fn update_hosts(ctx: &Context, tracked: Tracked, nodes: &[Node], wanted: &Arc<BackendSet>) {
    let service = tracked.service;
    let key = key(&service);
    // Recorded before the cloud call: a failure is retried through a full sync, not here.
    if let Some(entry) = ctx.tracked().get_mut(&key) {
        entry.backends = wanted.clone();
    }
    let Ok(lb) = ctx.load_balancer() else { return };
    let started = Instant::now();
    ctx.metrics.sync_total.inc();
    let result = lb
        .update_load_balancer(&ctx.cluster_name, &service, nodes)
        .await;
    ctx.metrics
        .host_update_latency
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(()) if nodes.is_empty() => {
            ctx.events
                .record(
                    service.as_ref(),
                    EventType::Warning,
                    "UnAvailableLoadBalancer",
                    "UpdateLoadBalancer",
                    "There are no available nodes for LoadBalancer".to_owned(),
                )
                .await;
        }
        Ok(()) => {
            ctx.events
                .record(
                    service.as_ref(),
                    EventType::Normal,
                    "UpdatedLoadBalancer",
                    "UpdateLoadBalancer",
                    "Updated load balancer with new hosts".to_owned(),
                )
                .await;
        }
        Err(CloudError::ImplementedElsewhere) => {}
        Err(err) => {
            // A load balancer that is gone needs no hosts.
            if let Ok(None) = lb.get_load_balancer(&ctx.cluster_name, &service).await {
                return;
            }
            ctx.metrics.nodesync_errors.inc();
            let names: Vec<&str> = nodes
                .iter()
                .take(20)
                .map(|n| n.metadata.name.as_deref().unwrap_or_default())
                .collect();
            ctx.events
                .record(
                    service.as_ref(),
                    EventType::Warning,
                    "UpdateLoadBalancerFailed",
                    "UpdateLoadBalancer",
                    format!("Error updating load balancer with new hosts {names:?} [node number: {}]: {err}", nodes.len()),
                )
                .await;
            tracing::warn!(service = %key, error = %err, "updating load balancer hosts failed; retrying with a full sync");
            if let Some(entry) = ctx.tracked().get_mut(&key) {
                entry.synced = false;
            }
            let _ = ctx.retry.send(ObjectRef::from_obj(service.as_ref()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5s_to_300s() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(6), Duration::from_secs(160));
        assert_eq!(backoff(7), Duration::from_secs(300));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
    }
}
