//! The service-lb controller's metrics: upstream's names, plus the load balancers it believes exist.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::metrics::registered;

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
        let sub = registry.sub_registry_with_prefix("service_controller");
        Self {
            sync_total: registered(
                sub,
                "loadbalancer_sync",
                "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
                Counter::default(),
            ),
            nodesync_errors: registered(
                sub,
                "nodesync_error",
                "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
                Counter::default(),
            ),
            nodesync_latency: registered(
                sub,
                "nodesync_latency_seconds",
                "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
                buckets(),
            ),
            host_update_latency: registered(
                sub,
                "update_loadbalancer_host_latency_seconds",
                "A metric measuring the latency for updating each load balancer hosts.",
                buckets(),
            ),
            load_balancers: registered(
                sub,
                "load_balancers",
                "The number of load balancers this controller believes exist.",
                Gauge::default(),
            ),
            orphans_deleted: registered(
                sub,
                "orphaned_load_balancers_deleted",
                "Load balancers the sweep deleted because their Service no longer existed.",
                Counter::default(),
            ),
            drift_checks: registered(
                sub,
                "load_balancer_drift_checks",
                "Load balancers checked for drift (a read-only preview of what an ensure would change).",
                Counter::default(),
            ),
            drift_checks_failed: registered(
                sub,
                "load_balancer_drift_check_errors",
                "Drift checks whose preview failed.",
                Counter::default(),
            ),
            drifts: registered(
                sub,
                "load_balancer_drifts",
                "Load balancers found differing from what their Service asks (a LoadBalancerDrift event each).",
                Counter::default(),
            ),
        }
    }
}
