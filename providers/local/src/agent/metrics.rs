//! The agent's own metrics (beside the data plane's, on the agent's `/metrics`).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use cloud_provider::prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::Gauge,
    },
    registry::Registry,
};

/// Counters and gauges of one agent; clones share the values.
#[derive(Debug, Clone, Default)]
pub struct AgentMetrics {
    /// VIPs this node announces now.
    pub(crate) announced: Gauge,
    vip_announced: Family<Vec<(String, String)>, Gauge>,
    /// The VIPs `vip_announced` has a series for.
    vip_series: Arc<Mutex<BTreeSet<IpAddr>>>,
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
    /// The supervised tasks' panics and failures.
    pub(crate) supervisor: cloud_provider::SupervisorMetrics,
}

impl AgentMetrics {
    /// Counts a membership packet dropped for `reason`.
    /// Reports the VIPs this node announces now: their count, and one series each (a VIP no longer
    /// announced loses its series; the others keep theirs, so no scrape misses one).
    pub(crate) fn set_announced<'a>(&self, vips: impl ExactSizeIterator<Item = &'a IpAddr>) {
        self.announced
            .set(i64::try_from(vips.len()).unwrap_or(i64::MAX));
        let now: BTreeSet<IpAddr> = vips.copied().collect();
        let label = |ip: &IpAddr| vec![("address".to_owned(), ip.to_string())];
        let mut series = crate::instances::lock(&self.vip_series);
        for gone in series.difference(&now) {
            self.vip_announced.remove(&label(gone));
        }
        for ip in &now {
            self.vip_announced.get_or_create(&label(ip)).set(1);
        }
        *series = now;
    }

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
            "local_agent_vip_announced",
            "1 for each VIP this node announces now (label address)",
            self.vip_announced.clone(),
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
        // Zero for every reason from the start (the label values the counter can take).
        let reasons = super::membership::Dropped::ALL.map(|why| why.label());
        for reason in reasons.into_iter().chain(["refused"]) {
            self.membership_dropped
                .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
                .inc_by(0);
        }
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
        registry.register_collector(Box::new(BgpAcceptLoopRestarts));
        self.supervisor.register(registry);
    }
}

/// `local-bgp`'s accept loop, started again in place after a panic (that crate has no supervisor at
/// hand), read at scrape time: `local_agent_bgp_accept_loop_restarts_total`.
#[derive(Debug)]
struct BgpAcceptLoopRestarts;

impl Collector for BgpAcceptLoopRestarts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        ConstCounter::new(local_bgp::accept_loop_restarts()).encode(encoder.encode_descriptor(
            "local_agent_bgp_accept_loop_restarts",
            "Times the BGP listener's accept loop was started again after a panic (a bug)",
            None,
            MetricType::Counter,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use cloud_provider::prometheus_client::{encoding::text::encode, registry::Registry};

    use super::AgentMetrics;

    fn scrape(metrics: &AgentMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn each_announced_vip_is_a_series_and_every_drop_reason_starts_at_zero() {
        let metrics = AgentMetrics::default();
        let vips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        metrics.set_announced(vips.iter());
        let text = scrape(&metrics);
        for line in [
            "local_agent_vips_announced 2",
            r#"local_agent_vip_announced{address="10.0.0.1"} 1"#,
            r#"local_agent_vip_announced{address="fd00::1"} 1"#,
            r#"local_agent_membership_packets_dropped_total{reason="bad_mac"} 0"#,
            r#"local_agent_membership_packets_dropped_total{reason="refused"} 0"#,
            "local_agent_bgp_accept_loop_restarts_total 0",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
        metrics.set_announced(vips[1..].iter());
        let text = scrape(&metrics);
        assert!(!text.contains(r#"address="10.0.0.1""#), "{text}");
        assert!(text.contains("local_agent_vips_announced 1"), "{text}");
    }
}
