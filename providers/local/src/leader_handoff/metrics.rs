//! The hand-offs' metrics, on the manager's `/metrics`.

use cloud_provider::prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::giving::Given;

/// Hand-offs given (by how they ended) and received.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    given: Family<Vec<(String, String)>, Counter>,
    received: Counter,
}

impl Metrics {
    /// Counts a hand-off this leader gave as it stopped (nothing when it had nothing to give).
    pub(crate) fn given(&self, given: Given) {
        let outcome = match given {
            Given::Claimed => "claimed",
            Given::Unclaimed => "unclaimed",
            Given::Nothing => return,
        };
        self.given
            .get_or_create(&vec![("outcome".to_owned(), outcome.to_owned())])
            .inc();
    }

    /// Counts a takeover in which the previous leader still served VIPs and its open connections
    /// were forwarded to it.
    pub(crate) fn received(&self) {
        self.received.inc();
    }

    /// Registers them under `local_leader_handoffs_*`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "local_leader_handoffs_given",
            "Hand-offs of the VIPs this leader gave as it stopped: outcome=claimed when the next leader claimed them (the open connections finished here), unclaimed when nobody did in time (they came off)",
            self.given.clone(),
        );
        registry.register(
            "local_leader_handoffs_received",
            "Takeovers in which the previous leader still served the VIPs and this leader forwarded their open connections to it",
            self.received.clone(),
        );
    }
}
