//! The agent's own metrics (beside the data plane's, on the agent's `/metrics`).

use cloud_provider::prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// Counters and gauges of one agent; clones share the values.
#[derive(Debug, Clone, Default)]
pub struct AgentMetrics {
    /// VIPs this node announces now.
    pub(crate) announced: Gauge,
    /// VIPs this node started announcing (elected, or back after a failure).
    pub(crate) taken: Counter,
    /// VIPs this node stopped announcing (another node elected, the Service gone).
    pub(crate) given_up: Counter,
    /// Heartbeat renewals that failed.
    pub(crate) heartbeat_failures: Counter,
}

impl AgentMetrics {
    /// Registers them under `local_agent_*`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "local_agent_vips_announced",
            "VIPs this node announces now",
            self.announced.clone(),
        );
        registry.register(
            "local_agent_vips_taken",
            "VIPs this node started announcing",
            self.taken.clone(),
        );
        registry.register(
            "local_agent_vips_given_up",
            "VIPs this node stopped announcing",
            self.given_up.clone(),
        );
        registry.register(
            "local_agent_heartbeat_failures",
            "Renewals of this node's heartbeat Lease that failed",
            self.heartbeat_failures.clone(),
        );
    }
}
