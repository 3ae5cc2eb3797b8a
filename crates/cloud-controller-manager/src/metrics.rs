//! The manager's metrics: one `prometheus-client` registry that every part registers into, with
//! upstream's metric names where upstream has them.

use std::sync::{Arc, Mutex};

use prometheus_client::{encoding::text::encode, registry::Registry};

use crate::{
    app::request_metrics::RequestMetrics,
    cloud_metrics::CloudMetrics,
    controllers::{node::NodeMetrics, route::RouteMetrics, service::ServiceMetrics},
};

/// Every metric the manager exports. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    /// API requests (`rest_client_requests_total`, `rest_client_request_duration_seconds`).
    pub requests: RequestMetrics,
    /// The cloud-node controller's delay histograms.
    pub node: NodeMetrics,
    /// The service-lb controller's metrics.
    pub service: ServiceMetrics,
    /// The node-route controller's metric.
    pub route: RouteMetrics,
    /// Per-method cloud API latency and errors.
    pub cloud: CloudMetrics,
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
        Self {
            registry: Arc::new(Mutex::new(registry)),
            requests,
            node,
            service,
            route,
            cloud,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}
