//! The service-lb controller (`service-lb-controller`, alias `service`): a cloud load balancer for every
//! `type: LoadBalancer` Service of a class it serves (upstream's: without a `loadBalancerClass`; see
//! [`classes`]), kept in step with the Service and the
//! cluster's nodes, and deleted before the Service goes (the `service.kubernetes.io/load-balancer-cleanup`
//! finalizer).
//!
//! Beyond upstream: a Service whose last sync succeeded and that has not changed in a way that matters is
//! not synced again (no cloud call, no event, no write); node changes update the affected load balancers
//! in parallel (up to `--concurrent-service-syncs`); a failing Service retries on its own back-off without
//! delaying others; and `service_controller_load_balancers` reports how many load balancers the
//! controller believes exist.
//!
//! The parts: [`classes`] says which Services are this manager's, `plan` decides what a sync does (pure,
//! table-tested), `sync` executes it, `node_sync` gives
//! load balancers the current nodes, `deletion` cleans up after Services that vanished without our
//! finalizer, `sweep` deletes load balancers whose Service no longer exists, `events` names every event
//! recorded, [`condition`] is the `ccm.rs/LoadBalancerReady` condition each sync leaves on the Service, [`node_set`] says which nodes are backends, and `metrics` holds the metrics.

pub mod classes;
pub mod condition;
mod deletion;
pub mod drift;
mod events;
mod loops;
mod metrics;
pub mod node_set;
mod node_sync;
pub(crate) mod plan;
pub mod retain;
mod settings;
mod sweep;
mod sync;

use crate::cached_node::CachedNode;
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};

use cloud_provider::{CloudError, CloudProvider, LoadBalancer};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api, ResourceExt,
    runtime::{reflector::ObjectRef, reflector::Store},
};
use tokio::sync::mpsc;

pub use self::{classes::ServedClasses, drift::DriftAction, metrics::ServiceMetrics};
use self::{
    node_set::{BackendLabels, BackendSet, backend_set, is_backend},
    plan::wants_load_balancer,
};
use futures::StreamExt;

use super::{ControllerContext, ControllerTask, backoff::PerObjectBackoff, work_queue};
use crate::{events::EventRecorder, informers::wait_for_cache_sync};

/// The event source, as upstream names it.
pub(crate) const COMPONENT: &str = "service-controller";

/// A failing Service's first retry; each further failure doubles it, up to [`MAX_RETRY`] (upstream's
/// service queue, 5 s to 300 s).
const MIN_RETRY: Duration = Duration::from_secs(5);
/// The longest wait before retrying a failing Service.
const MAX_RETRY: Duration = Duration::from_secs(300);

/// Why a Service could not be synced (it is retried on its own back-off).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// A cloud call failed.
    #[error("{what}: {source}")]
    Cloud {
        /// What was being done.
        what: &'static str,
        /// The cloud's error.
        #[source]
        source: CloudError,
    },
    /// A read from the API server failed.
    #[error("{what}: {source}")]
    Read {
        /// What was being read.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
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
    /// The node labels its backends are selected by, as they were on those backends.
    labels: BackendLabels,
    /// When its failed sync is retried (its back-off, or the cloud's `RetryAfter`): a change that does
    /// not matter to its load balancer (the echo of its own status write, say) waits for then.
    retry_at: Option<tokio::time::Instant>,
    /// The provider's settings changed while this sync ran (`settings::settings_loop`): the sync may
    /// have read them before, so it is done again once it completes.
    settings_changed_during_sync: bool,
}

/// The backend nodes and their set, computed once per node-set change and shared by every sync: with
/// thousands of nodes, a copy per Service would cost more than the sync.
#[derive(Clone)]
struct Backends {
    nodes: Arc<Vec<Arc<Node>>>,
    set: Arc<BackendSet>,
}

struct Context {
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    cluster_name: String,
    /// The classes of Services this manager serves (`--load-balancer-class`).
    served: ServedClasses,
    /// Which nodes are this manager's.
    ownership: crate::node_ownership::NodeOwnership,
    /// The provider's load balancers reach nodes this manager does not own.
    backends_beyond_owned: bool,
    nodes: Store<CachedNode>,
    events: EventRecorder,
    metrics: ServiceMetrics,
    tracked: Mutex<HashMap<String, Tracked>>,
    /// Consecutive failures per Service, for its back-off.
    backoff: PerObjectBackoff,
    retry: mpsc::UnboundedSender<ObjectRef<Service>>,
    workers: usize,
    backends: Mutex<Option<Backends>>,
    /// Asks the node-sync loop for a pass (a sync finished with backends that changed meanwhile).
    node_sync_wanted: tokio::sync::Notify,
    /// Whether the `ccm.rs/LoadBalancerReady` condition is written ([`Config::conditions`]).
    conditions: bool,
}

fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.namespace().unwrap_or_default(),
        service.name_any()
    )
}

impl Context {
    /// The controller's state, from the manager's `ctx` and the controller's settings; `retry` asks the
    /// work queue for a Service's sync.
    fn new(
        ctx: &ControllerContext,
        cluster_name: String,
        served: ServedClasses,
        workers: usize,
        conditions: bool,
        retry: mpsc::UnboundedSender<ObjectRef<Service>>,
    ) -> Self {
        Context {
            client: ctx.client.clone(),
            cloud: ctx.cloud.clone(),
            cluster_name,
            served,
            backends_beyond_owned: ctx
                .cloud
                .load_balancer()
                .is_some_and(|lb| lb.backends_beyond_owned_nodes()),
            ownership: ctx.ownership.clone(),
            nodes: ctx.informers.nodes().store(),
            events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
            metrics: ctx.metrics.service.clone(),
            tracked: Mutex::default(),
            backoff: backoff(),
            retry,
            workers,
            backends: Mutex::default(),
            node_sync_wanted: tokio::sync::Notify::new(),
            conditions,
        }
    }

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

    fn tracked(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked.lock()
    }

    fn update_gauge(&self) {
        let count = self
            .tracked()
            .values()
            .filter(|t| t.synced && wants_load_balancer(&t.service, &self.served))
            .count();
        self.metrics.load_balancers.set(count as i64);
    }

    /// The nodes that back load balancers now (cached until the node sync sees them change).
    fn backends(&self) -> Backends {
        let mut cache = self.backends.lock();
        if let Some(backends) = cache.as_ref() {
            return backends.clone();
        }
        let nodes: Vec<Arc<Node>> = self
            .nodes
            .state()
            .iter()
            .filter(|n| is_backend(n) && self.may_back(n))
            .map(|n| n.shared())
            .collect();
        let backends = Backends {
            set: Arc::new(backend_set(nodes.iter().map(|n| n.as_ref()))),
            nodes: Arc::new(nodes),
        };
        *cache = Some(backends.clone());
        backends
    }

    /// Whether `node` may be a backend as far as ownership goes: this manager's, or any node when the
    /// provider's load balancers reach nodes beyond its own.
    fn may_back(&self, node: &Node) -> bool {
        self.backends_beyond_owned || self.ownership.owns(node)
    }

    fn forget_backends(&self) {
        *self.backends.lock() = None;
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
    /// How often load balancers whose Service no longer exists are looked for and deleted
    /// (`--orphaned-load-balancer-sweep-period`; `None`: never).
    pub orphan_sweep_period: Option<Duration>,
    /// The classes of Services served (`--load-balancer-class`, `--serve-classless-load-balancers`).
    pub served: ServedClasses,
    /// How often each load balancer is checked for drift (`--load-balancer-drift-period`; `None`:
    /// never), and what a drift leads to (`--load-balancer-drift`).
    pub drift: Option<(Duration, DriftAction)>,
    /// Write the `ccm.rs/LoadBalancerReady` condition ([`condition`]). Off in shadow mode
    /// (`--dry-run`): the condition is ours, not the incumbent's, so it is no difference between the
    /// two, and it would say `Ensured` of load balancers the shadow never made.
    pub conditions: bool,
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
    let shared_services = ctx.informers.services();
    let nodes = ctx.informers.nodes();
    let service_changes = shared_services.subscribe_changes();
    let node_changes = nodes.subscribe_changes();
    let services = shared_services.store();
    let (retry, retries) = mpsc::unbounded_channel();
    let Config {
        cluster_name,
        workers,
        orphan_sweep_period,
        served,
        drift,
        conditions,
    } = config;
    if !served.is_default() {
        tracing::info!(
            controller = COMPONENT,
            serves = served.describe(),
            "serving the load balancers of these Services only"
        );
    }
    let context = Arc::new(Context::new(
        &ctx,
        cluster_name,
        served,
        workers,
        conditions,
        retry,
    ));
    let shutdown = ctx.shutdown.clone();
    let controller = ctx.clone();
    let reporting = work_queue::Reporting {
        metrics: ctx.metrics.work_queues.queue(ctx.name),
        health: ctx.health.clone(),
        events: context.events.clone(),
    };
    Some(Box::pin(async move {
        // Load balancers are given the cluster's nodes: wait until both caches hold them.
        if !wait_for_cache_sync(&shutdown, [nodes.synced(), shared_services.synced()]).await {
            return Ok(());
        }
        let (triggers, deletions) = deletion::split_changes(service_changes);
        let loops = loops::Loops::spawn(
            &controller,
            &context,
            deletions,
            node_changes,
            &services,
            orphan_sweep_period,
            drift,
        );
        // Syncs the node sync, the drift check and settings changes ask for (a load balancer whose backends changed
        // during its ensure, one that drifted) join the Services' own changes on the one work queue.
        let retries = retried(retries, services.clone());
        work_queue::run(
            futures::stream::select(triggers, retries),
            services,
            workers,
            sync::reconcile,
            sync::error_policy,
            context,
            reporting,
            shutdown.clone(),
        )
        .await;
        loops.finished().await;
        Ok(())
    }))
}

/// The Services whose syncs were asked for on `retries`, as the cache has them now (one deleted since
/// is left out).
fn retried(
    retries: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    services: Store<Service>,
) -> impl futures::Stream<Item = Arc<Service>> + Send + 'static {
    futures::stream::unfold(
        retries,
        |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
    )
    .filter_map(move |key: ObjectRef<Service>| std::future::ready(services.get(&key)))
}

/// Per-Service back-off: [`MIN_RETRY`] doubling up to [`MAX_RETRY`].
fn backoff() -> PerObjectBackoff {
    PerObjectBackoff::new(MIN_RETRY, MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5s_to_300s() {
        let backoff = backoff();
        assert_eq!(backoff.delay(1), Duration::from_secs(5));
        assert_eq!(backoff.delay(2), Duration::from_secs(10));
        assert_eq!(backoff.delay(6), Duration::from_secs(160));
        assert_eq!(backoff.delay(7), Duration::from_secs(300));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(300));
    }
}
