//! The manager's metrics: one `prometheus-client` registry that every part registers into, with
//! upstream's metric names where upstream has them.

mod background_loops;
mod periodic;

pub use background_loops::BackgroundLoopMetrics;
pub use periodic::PeriodicMetrics;

use parking_lot::Mutex;
use std::sync::Arc;

use cloud_provider::CloudProvider;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{family::Family, gauge::Gauge},
    registry::{Metric, Registry},
};

use crate::{
    cloud_metrics::CloudMetrics,
    controllers::{
        node::NodeMetrics, queue_metrics::WorkQueueMetrics, route::RouteMetrics,
        service::ServiceMetrics,
    },
    request_metrics::RequestMetrics,
    shadow::DryRunMetrics,
};

/// Registers `metric` as `name` with `help` and answers it: the caller keeps the handle to the series it
/// registered.
pub(crate) fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Every metric the manager exports. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    /// API requests (`rest_client_requests_total`, `rest_client_request_duration_seconds`).
    pub(crate) requests: RequestMetrics,
    /// The cloud-node controller's delay histograms.
    pub(crate) node: NodeMetrics,
    /// The service-lb controller's metrics.
    pub(crate) service: ServiceMetrics,
    /// The node-route controller's metric.
    pub(crate) route: RouteMetrics,
    /// Per-method cloud API latency and errors.
    pub(crate) cloud: CloudMetrics,
    /// Shadow mode's would-be writes (`--dry-run`).
    pub(crate) dry_run: DryRunMetrics,
    /// The controllers' work queues (client-go's `workqueue_*`).
    pub(crate) work_queues: WorkQueueMetrics,
    /// `leader_election_master_status{name}`: 1 while this replica leads, else 0 (client-go's).
    pub(crate) leader_election: LeaderElectionMetrics,
    /// The periodic controllers' passes (`periodic_*`).
    pub(crate) periodic: PeriodicMetrics,
    /// The controllers' background loops that died (`controller_background_loop_failures_total`).
    pub(crate) background_loops: BackgroundLoopMetrics,
    /// The supervised tasks' panics and failures (`supervised_task_*`): the caches, the provider's own.
    pub(crate) supervisor: cloud_provider::SupervisorMetrics,
}

/// A `name` label alone: a Lease's (`leader_election_*`), a work queue's (`workqueue_*`), a periodic
/// controller's (`periodic_pass_duration_seconds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NameLabel {
    name: String,
}

impl NameLabel {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }
}

/// client-go's leader-election metric.
#[derive(Clone)]
pub(crate) struct LeaderElectionMetrics {
    status: Family<NameLabel, Gauge>,
    riding_out: Family<NameLabel, Gauge>,
}

impl LeaderElectionMetrics {
    fn register(registry: &mut Registry) -> Self {
        let status = Family::<NameLabel, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name",
            status.clone(),
        );
        let riding_out = Family::<NameLabel, Gauge>::default();
        registry.register(
            "leader_election_riding_out",
            "1 while the leader rides out an API server it cannot reach (its writes stopped, its provider still serving), else 0. 'name' is the lease",
            riding_out.clone(),
        );
        Self { status, riding_out }
    }

    /// Reports whether the leader of the Lease `name` rides out an unreachable API server.
    pub fn set_riding_out(&self, name: &str, riding_out: bool) {
        self.riding_out
            .get_or_create(&NameLabel::new(name))
            .set(i64::from(riding_out));
    }

    /// Reports whether this replica leads the Lease `name`.
    pub fn set_leading(&self, name: &str, leading: bool) {
        self.status
            .get_or_create(&NameLabel::new(name))
            .set(i64::from(leading));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = RequestMetrics::register(&mut registry);
        let node = NodeMetrics::register(&mut registry);
        let service = ServiceMetrics::register(&mut registry);
        let route = RouteMetrics::register(&mut registry);
        let cloud = CloudMetrics::register(&mut registry);
        let dry_run = DryRunMetrics::register(&mut registry);
        let work_queues = WorkQueueMetrics::register(&mut registry);
        let leader_election = LeaderElectionMetrics::register(&mut registry);
        let periodic = PeriodicMetrics::register(&mut registry);
        let background_loops = BackgroundLoopMetrics::register(&mut registry);
        let supervisor = cloud_provider::SupervisorMetrics::default();
        supervisor.register(&mut registry);
        Self {
            registry: Arc::new(Mutex::new(registry)),
            requests,
            node,
            service,
            route,
            cloud,
            dry_run,
            work_queues,
            leader_election,
            periodic,
            background_loops,
            supervisor,
        }
    }

    /// How many writes (POST, PUT, PATCH, DELETE) the manager has sent to the API server since it started.
    pub fn api_writes(&self) -> u64 {
        self.requests.writes()
    }

    /// Registers metrics of a controller of the provider's own (`register` gets the manager's registry,
    /// so they are served on `/metrics` with the manager's).
    pub fn register_with(&self, register: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry.lock();
        register(&mut registry);
    }

    /// Adds the provider's own metrics ([`CloudProvider::register_metrics`]).
    pub fn register_provider(&self, cloud: &dyn CloudProvider) {
        let mut registry = self.registry.lock();
        cloud.register_metrics(&mut registry);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    struct Counting(Counter);

    impl CloudProvider for Counting {
        fn provider_name(&self) -> &str {
            "counting"
        }
        fn register_metrics(&self, registry: &mut Registry) {
            registry.register("counting_calls", "Calls.", self.0.clone());
        }
    }

    #[test]
    fn a_providers_metrics_are_served_with_the_managers() {
        let metrics = Metrics::new();
        let counter = Counter::default();
        counter.inc_by(3);
        metrics.register_provider(&Counting(counter));
        let text = metrics.encode();
        assert!(text.contains("counting_calls_total 3"), "{text}");
        assert!(
            text.contains("node_controller_cloud_provider_taint_removal_delay_seconds"),
            "{text}"
        );
    }
}
