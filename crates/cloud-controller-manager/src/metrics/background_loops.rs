//! `controller_background_loop_failures_total{name,loop}`: the controllers' background loops that died.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// The labels of `controller_background_loop_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoopLabels {
    /// The controller.
    name: String,
    /// The loop.
    r#loop: String,
}

/// `controller_background_loop_failures_total{name,loop}`.
#[derive(Clone, Default)]
pub struct BackgroundLoopMetrics {
    failures: Family<LoopLabels, Counter>,
}

impl BackgroundLoopMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "controller_background_loop_failures",
            "Background loops of a controller that panicked or ended while the manager was not stopping \
             (the controller's health check fails from then on)",
            metrics.failures.clone(),
        );
        metrics
    }

    /// The failure counter of the loop `loop_name` of `controller`.
    pub(crate) fn failures_of(&self, controller: &str, loop_name: &str) -> Counter {
        self.failures
            .get_or_create(&Self::labels(controller, loop_name))
            .clone()
    }

    fn labels(controller: &str, loop_name: &str) -> LoopLabels {
        LoopLabels {
            name: controller.to_owned(),
            r#loop: loop_name.to_owned(),
        }
    }
}
