//! The periodic controllers' metrics (`periodic_*`), one series per controller.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::{NameLabel, registered};

/// The `name` and `outcome` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    name: String,
    outcome: &'static str,
}

/// The periodic runners' metrics (one series per controller).
#[derive(Clone)]
pub struct PeriodicMetrics {
    passes: Family<PassLabels, Counter>,
    duration: Family<NameLabel, Histogram>,
}

/// 1 ms to about 16 min, ×4: a pass is one cloud call per object at most, or a list and a few writes.
fn pass_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 4.0, 11,
    ))
}

impl PeriodicMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let sub = registry.sub_registry_with_prefix("periodic");
        Self {
            passes: registered(
                sub,
                "passes",
                "Passes of a periodic controller, by how they ended (done, ask_again, panicked)",
                Family::default(),
            ),
            duration: registered(
                sub,
                "pass_duration_seconds",
                "How long in seconds a pass of a periodic controller takes",
                Family::new_with_constructor(pass_histogram),
            ),
        }
    }

    /// Counts a pass of the runner `name` that ended with `outcome` after `took`.
    pub(crate) fn passed(&self, name: &str, outcome: &'static str, took: Duration) {
        self.passes
            .get_or_create(&PassLabels {
                name: name.to_owned(),
                outcome,
            })
            .inc();
        self.duration
            .get_or_create(&NameLabel::new(name))
            .observe(took.as_secs_f64());
    }
}
