//! `route_controller_route_sync_total{outcome, trigger}`: upstream's metric (k8s.io/cloud-provider
//! v0.37.1 and v0.38.0-beta.0, `controllers/route/metrics.go`), with upstream's name, label names,
//! values and help text. One count per pass: `trigger` is what started it (`periodic` or
//! `node_change`), `outcome` how it ended (`error` if the pass failed, `changed` if it created or
//! deleted at least one route, otherwise `noop`).
//!
//! Upstream has no `route_controller_route_corrections_total` (KEP-5237's draft name): it counts the
//! periodic passes as `trigger="periodic"`, and so do we.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::triggers::Trigger;

/// The name as registered (the exposition adds `_total`, as upstream's counter is named).
pub(crate) const NAME: &str = "route_controller_route_sync";

/// Upstream's help text.
pub(crate) const HELP: &str = "A metric counting the number of route reconciles with the cloud provider, labeled by the trigger (periodic or node_change) and the outcome (error if the reconcile failed, changed if at least one route was created or deleted, otherwise noop).";

/// How a pass ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// At least one route was created or deleted.
    Changed,
    /// Nothing was created or deleted.
    Noop,
    /// The pass failed (the routes could not be listed).
    Error,
}

impl Outcome {
    /// Every outcome.
    #[cfg(test)]
    pub const ALL: [Self; 3] = [Self::Changed, Self::Noop, Self::Error];

    /// Upstream's outcome of a pass: an error wins, then any route created or deleted.
    pub fn of(result: Result<bool, ()>) -> Self {
        match result {
            Err(()) => Self::Error,
            Ok(true) => Self::Changed,
            Ok(false) => Self::Noop,
        }
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Changed => "changed",
            Self::Noop => "noop",
            Self::Error => "error",
        }
    }
}

/// The labels, in upstream's order.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    outcome: &'static str,
    trigger: &'static str,
}

/// The controller's metric.
#[derive(Clone)]
pub struct RouteMetrics {
    syncs: Family<SyncLabels, Counter>,
}

impl RouteMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            syncs: Family::default(),
        };
        registry.register(NAME, HELP, metrics.syncs.clone());
        metrics
    }

    /// Counts one pass.
    pub(crate) fn synced(&self, trigger: Trigger, outcome: Outcome) {
        self.syncs
            .get_or_create(&SyncLabels {
                outcome: outcome.label(),
                trigger: trigger.label(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prometheus_client::encoding::text::encode;

    use super::*;
    use crate::upstream_source::{read, string_constant};

    const MODULE: &str = "k8s.io/cloud-provider";

    fn exposition() -> String {
        let mut registry = Registry::default();
        let metrics = RouteMetrics::register(&mut registry);
        for trigger in Trigger::ALL {
            for outcome in Outcome::ALL {
                metrics.synced(trigger, outcome);
            }
        }
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn an_error_wins_then_any_change() {
        assert_eq!(Outcome::of(Err(())), Outcome::Error);
        assert_eq!(Outcome::of(Ok(true)), Outcome::Changed);
        assert_eq!(Outcome::of(Ok(false)), Outcome::Noop);
    }

    /// Our name, label names, label values and help against the constants in upstream's source (the
    /// pinned v0.37.1 and the next, v0.38.0-beta.0), read from the Go module cache.
    #[test]
    fn name_labels_and_values_are_upstream_s() {
        let text = exposition();
        for version in ["v0.37.1", "v0.38.0-beta.0"] {
            let Some(metrics_go) = read(MODULE, version, "controllers/route/metrics.go") else {
                return;
            };
            let Some(controller_go) =
                read(MODULE, version, "controllers/route/route_controller.go")
            else {
                return;
            };
            let subsystem = string_constant(&metrics_go, "subsystem").expect("subsystem");
            let name = string_constant(&metrics_go, "Name").expect("Name");
            let help = string_constant(&metrics_go, "Help").expect("Help");
            assert_eq!(
                format!("{NAME}_total"),
                format!("{subsystem}_{name}"),
                "{version}"
            );
            assert_eq!(help, HELP, "{version}");
            assert!(
                !metrics_go.contains("corrections_total"),
                "{version} has a corrections metric now"
            );

            // The label names, in upstream's order: `}, []string{"outcome", "trigger"})`.
            let labels = metrics_go
                .split("[]string{")
                .nth(1)
                .and_then(|rest| rest.split('}').next())
                .expect("the label names");
            let labels: Vec<&str> = labels
                .split(',')
                .map(|l| l.trim().trim_matches('"'))
                .collect();
            assert_eq!(labels, ["outcome", "trigger"], "{version}");
            let sample = format!(
                "{NAME}_total{{{}=\"{}\",{}=\"{}\"}} 1",
                labels[0],
                Outcome::Noop.label(),
                labels[1],
                Trigger::Periodic.label()
            );
            assert!(text.contains(&sample), "{version}: {sample} in\n{text}");

            // Outcomes: every `outcomeX = "..."` constant.
            let upstream: BTreeSet<&str> = ["outcomeChanged", "outcomeNoop", "outcomeError"]
                .iter()
                .map(|c| string_constant(&metrics_go, c).expect(c))
                .collect();
            let ours: BTreeSet<&str> = Outcome::ALL.iter().map(|o| o.label()).collect();
            assert_eq!(ours, upstream, "{version}");
            let declared = metrics_go
                .lines()
                .map(str::trim)
                .filter(|l| {
                    l.strip_prefix("outcome")
                        .is_some_and(|r| r.starts_with(char::is_uppercase) && r.contains("= \""))
                })
                .count();
            assert_eq!(declared, 3, "{version}: upstream has another outcome");

            // Triggers: the work-queue keys, which are the label values.
            let upstream: BTreeSet<&str> = ["routesSyncKey", "routeCorrectionsKey"]
                .iter()
                .map(|c| string_constant(&controller_go, c).expect(c))
                .collect();
            let ours: BTreeSet<&str> = Trigger::ALL.iter().map(|t| t.label()).collect();
            assert_eq!(ours, upstream, "{version}");
            assert!(
                controller_go.contains(r#"recordRouteSync(routesChanged, err, "periodic")"#),
                "{version}: the timer-driven pass is no longer counted as periodic"
            );
        }
    }
}
