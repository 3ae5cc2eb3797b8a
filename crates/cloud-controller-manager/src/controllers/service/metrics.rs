//! The service-lb controller's metrics: upstream's names, plus the load balancers it believes exist.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The controller's metrics: upstream's names, plus the load balancers it believes exist.
#[derive(Clone)]
pub struct ServiceMetrics {
    /// Load balancers configured (ensured, hosts updated, or cleaned up).
    pub(super) sync_total: Counter,
    /// Host updates after a node change that failed.
    pub(super) nodesync_errors: Counter,
    /// How long a node sync pass took.
    pub(super) nodesync_latency: Histogram,
    /// How long one load balancer's host update took.
    pub(super) host_update_latency: Histogram,
    /// The load balancers the controller believes exist.
    pub(super) load_balancers: Gauge,
    /// Load balancers the sweep deleted because their Service no longer existed (not in upstream).
    pub(super) orphans_deleted: Counter,
    /// Drift checks made (not in upstream).
    pub(super) drift_checks: Counter,
    /// Drift checks whose preview failed.
    pub(super) drift_checks_failed: Counter,
    /// Drifts found.
    pub(super) drifts: Counter,
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
            orphans_deleted: Counter::default(),
            drift_checks: Counter::default(),
            drift_checks_failed: Counter::default(),
            drifts: Counter::default(),
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
        sub.register(
            "orphaned_load_balancers_deleted",
            "Load balancers the sweep deleted because their Service no longer existed.",
            metrics.orphans_deleted.clone(),
        );
        sub.register(
            "load_balancer_drift_checks",
            "Load balancers checked for drift (a read-only preview of what an ensure would change).",
            metrics.drift_checks.clone(),
        );
        sub.register(
            "load_balancer_drift_check_errors",
            "Drift checks whose preview failed.",
            metrics.drift_checks_failed.clone(),
        );
        sub.register(
            "load_balancer_drifts",
            "Load balancers found differing from what their Service asks (a LoadBalancerDrift event each).",
            metrics.drifts.clone(),
        );
        metrics
    }
}
