//! A controller's background loops (beside its work queue or its passes: the service controller's node
//! sync, deletions, orphan sweep and drift check; the node controller's status refresh; the route
//! controller's node watch), each a task of its own that is never forgotten: a loop that panics, or
//! ends while the manager is not stopping (unless it is one that ends by design when the cloud cannot
//! do its work: [`Ends::WhenNothingToDo`]), is logged at error level, counted
//! (`controller_background_loop_failures_total{name,loop}`), and fails its controller's health check for
//! good ([`ControllerHealth::background_loop_failed`]), so that `/healthz` fails and the kubelet's
//! liveness probe restarts the manager, instead of a manager that looks healthy and no longer does that
//! work. A loop is not restarted in place: its inputs (a stream of changes it consumed) cannot be had
//! again, and a restarted process starts every loop from its caches.

use std::{future::Future, panic::AssertUnwindSafe};

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::controller_health::ControllerHealth;
use crate::metrics::BackgroundLoopMetrics;

/// Where a controller's loops report: its name, health check, the metric and the stop token.
#[derive(Clone)]
pub(crate) struct LoopReporting {
    pub(crate) controller: &'static str,
    pub(crate) health: ControllerHealth,
    pub(crate) metrics: BackgroundLoopMetrics,
    pub(crate) shutdown: CancellationToken,
}

/// A running background loop; [`BackgroundLoop::finished`] waits for it when the controller stops.
#[must_use = "a background loop is waited for when its controller stops"]
pub struct BackgroundLoop {
    handle: JoinHandle<()>,
}

impl BackgroundLoop {
    /// Waits until the loop has ended (what it did then is already reported).
    pub async fn finished(self) {
        // The task catches the loop's panic itself: the join cannot fail but by cancellation (the
        // runtime shutting down), which leaves nothing to report.
        let _ = self.handle.await;
    }

    /// Stops the loop now (for a loop that only ends when told).
    pub fn abort(&self) {
        self.handle.abort();
    }
}

/// When a loop may end before the manager stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ends {
    /// Never: an end before shutdown is a failure (the loop's input ended, or it returned by mistake).
    AtShutdown,
    /// Also when it has nothing to do, by design: the orphan sweep when the provider does not list its
    /// load balancers, the drift check when it cannot preview them (each logs why). Only a panic is a
    /// failure.
    WhenNothingToDo,
}

/// Runs `task` as the loop `loop_name` of the controller `reporting.controller`.
pub(crate) fn spawn(
    reporting: &LoopReporting,
    loop_name: &'static str,
    ends: Ends,
    task: impl Future<Output = ()> + Send + 'static,
) -> BackgroundLoop {
    let LoopReporting {
        controller,
        health,
        metrics,
        shutdown,
    } = reporting.clone();
    let failures = metrics.failures_of(controller, loop_name);
    let span = tracing::info_span!("background_loop", controller, loop_name);
    // Watched: this is the background-loop machinery: the task catches the loop's panic, and its early
    // end, and fails the controller's health check.
    let handle = tokio::spawn(
        async move {
            let why = match AssertUnwindSafe(task).catch_unwind().await {
                Ok(()) if shutdown.is_cancelled() || ends == Ends::WhenNothingToDo => return,
                Ok(()) => "ended while the manager was not stopping".to_owned(),
                Err(panic) => format!(
                    "panicked: {}",
                    cloud_provider::panic_message(panic.as_ref())
                ),
            };
            tracing::error!(
                "the {loop_name} loop of {controller} {why}; the controller's health check fails from \
                 now on, so that the manager is restarted"
            );
            failures.inc();
            health.background_loop_failed(loop_name, &why);
        }
        .instrument(span),
    );
    BackgroundLoop { handle }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use prometheus_client::encoding::text::encode;

    use super::*;

    fn new_reporting() -> (LoopReporting, Registry) {
        let mut registry = Registry::default();
        let metrics = BackgroundLoopMetrics::register(&mut registry);
        (
            LoopReporting {
                controller: "service-lb-controller",
                health: ControllerHealth::default(),
                metrics,
                shutdown: CancellationToken::new(),
            },
            registry,
        )
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    #[tokio::test]
    async fn a_loop_that_panics_fails_the_health_check_for_good_and_is_counted() {
        let (reporting, registry) = new_reporting();
        // Counted from zero as soon as it runs.
        let running = spawn(
            &reporting,
            "node-sync",
            Ends::AtShutdown,
            std::future::pending(),
        );
        assert!(scrape(&registry).contains(
            r#"controller_background_loop_failures_total{name="service-lb-controller",loop="node-sync"} 0"#
        ));
        running.abort();
        spawn(&reporting, "drift", Ends::WhenNothingToDo, async {
            panic!("a bug")
        })
        .finished()
        .await;
        let err = reporting.health.check().unwrap_err();
        assert_eq!(
            err,
            "its drift loop panicked: a bug; the controller no longer does that work until the manager \
             restarts"
        );
        assert!(scrape(&registry).contains(
            r#"controller_background_loop_failures_total{name="service-lb-controller",loop="drift"} 1"#
        ));
    }

    #[tokio::test]
    async fn a_loop_that_ends_early_fails_the_check_and_one_that_ends_at_shutdown_does_not() {
        let (reporting, _registry) = new_reporting();
        spawn(&reporting, "sweep", Ends::AtShutdown, async {})
            .finished()
            .await;
        assert!(
            reporting
                .health
                .check()
                .unwrap_err()
                .contains("its sweep loop ended while the manager was not stopping")
        );

        let (stopping, registry) = new_reporting();
        let shutdown = stopping.shutdown.clone();
        let waiting = spawn(&stopping, "deletions", Ends::AtShutdown, async move {
            shutdown.cancelled().await;
        });
        stopping.shutdown.cancel();
        waiting.finished().await;
        assert_eq!(stopping.health.check(), Ok(()));
        // One that ends by design when it has nothing to do (the cloud cannot sweep) is not a failure.
        spawn(&stopping, "orphan-sweep", Ends::WhenNothingToDo, async {})
            .finished()
            .await;
        assert_eq!(stopping.health.check(), Ok(()));
        assert!(scrape(&registry).contains(r#"loop="deletions"} 0"#));
    }
}
