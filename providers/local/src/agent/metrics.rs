//! The agent's own metrics (beside the data plane's, on the agent's `/metrics`).

use cloud_provider::prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
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
    /// Other agents the membership protocol hears now.
    pub(crate) membership_members: Gauge,
    /// Membership packets dropped, by reason.
    membership_dropped: Family<Vec<(String, String)>, Counter>,
    /// 1 while this node may not announce (fenced: cut off from its peers, or from the API server
    /// without membership).
    pub(crate) fenced: Gauge,
    /// Hand-overs this agent received from the one it replaced on its node.
    pub(crate) handovers_received: Counter,
    /// Hand-overs this agent gave to the one that replaced it on its node.
    pub(crate) handovers_given: Counter,
    /// The BGP sessions' metrics (MetalLB's names).
    pub(crate) bgp: super::BgpMetrics,
}

impl AgentMetrics {
    /// Counts a membership packet dropped for `reason`.
    pub(crate) fn membership_dropped(&self, reason: &str) {
        self.membership_dropped
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    /// The membership packets dropped for `reason` so far.
    pub fn membership_dropped_total(&self, reason: &str) -> u64 {
        self.membership_dropped
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .get()
    }

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
        registry.register(
            "local_agent_membership_members",
            "Other agents this node's membership protocol hears now",
            self.membership_members.clone(),
        );
        registry.register(
            "local_agent_membership_packets_dropped",
            "Membership packets dropped, by reason (malformed, bad_mac, stale, replayed, refused)",
            self.membership_dropped.clone(),
        );
        registry.register(
            "local_agent_fenced",
            "1 while this node may not announce: cut off from its peers (or, without membership, from \
             the API server)",
            self.fenced.clone(),
        );
        registry.register(
            "local_agent_handovers_received",
            "Hand-overs (VIPs, listening sockets, membership) this agent received from the one it \
             replaced on its node",
            self.handovers_received.clone(),
        );
        registry.register(
            "local_agent_handovers_given",
            "Hand-overs this agent gave to the one that replaced it on its node",
            self.handovers_given.clone(),
        );
        self.bgp.register(registry);
    }
}
