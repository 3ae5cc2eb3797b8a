//! The periodic runner, for controllers that work in passes over every object rather than per key
//! (the node-lifecycle and route controllers, as upstream's run `wait.Until` loops): a pass every
//! period, start to start, the first at once; optionally also a pass when asked between periods
//! ([`PassRequests`]: watch-based routes), at most one per minimum interval; and a pass that panics is
//! reported and counted in the controller's health, and the next pass runs as planned.
//!
//! Metrics, labelled `name` (the controller): `periodic_passes_total{name,outcome}` (`done`,
//! `ask_again`, `panicked`) and `periodic_pass_duration_seconds{name}`.

use std::{future::Future, sync::Arc, time::Duration};

use futures::FutureExt;
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use super::controller_health::ControllerHealth;
use crate::metrics::PeriodicMetrics;

/// What started a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// The period (the first pass, too).
    Periodic,
    /// A [`PassRequests::ask`].
    Asked,
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    /// Done; the next pass comes with the period (or when asked).
    Done,
    /// Not done (e.g. the cloud could not be read): asked again at once, within the minimum interval,
    /// when the controller takes requests; otherwise the period retries it.
    AskAgain,
}

/// Requests for passes between periods, at most one pass per `min_interval` (start to start); asks
/// made while a pass waits or runs collapse into one.
#[derive(Clone, Debug)]
pub struct PassRequests {
    wanted: Arc<Notify>,
    min_interval: Duration,
}

impl PassRequests {
    /// Requests rate-limited to one pass per `min_interval`.
    pub fn new(min_interval: Duration) -> Self {
        Self {
            wanted: Arc::new(Notify::new()),
            min_interval,
        }
    }

    /// Asks for a pass.
    pub fn ask(&self) {
        self.wanted.notify_one();
    }
}

/// Where a periodic controller runs: its name (the metrics' label), its health check, the metrics,
/// and the stop token.
#[derive(Clone)]
pub struct Runner {
    /// The controller's name.
    pub(crate) name: &'static str,
    /// Fails when its passes keep panicking.
    pub(crate) health: ControllerHealth,
    /// The manager's periodic-runner metrics.
    pub(crate) metrics: PeriodicMetrics,
    /// Stops the runner between passes (a pass in flight finishes: the controller's passes are
    /// bounded).
    pub(crate) shutdown: CancellationToken,
    /// Where the controller's background loops report ([`Runner::spawn_loop`]).
    pub(crate) loops: super::background_loop::LoopReporting,
}

impl Runner {
    /// Runs `task` as a background loop of this controller beside its passes
    /// ([`super::ControllerContext::spawn_loop`]).
    pub fn spawn_loop(
        &self,
        loop_name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> super::background_loop::BackgroundLoop {
        super::background_loop::spawn(
            &self.loops,
            loop_name,
            super::background_loop::Ends::AtShutdown,
            task,
        )
    }

    /// Runs `pass` every `period` (start to start; a pass longer than the period delays the next, none
    /// is skipped or doubled), and, with `requests`, also when asked, until shutdown.
    pub async fn run<F, Fut>(self, period: Duration, requests: Option<PassRequests>, mut pass: F)
    where
        F: FnMut(Started) -> Fut,
        Fut: Future<Output = PassOutcome>,
    {
        let Runner {
            name,
            health,
            metrics,
            shutdown,
            loops: _,
        } = self;
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_pass: Option<Instant> = None;
        loop {
            let started = tokio::select! {
                _ = ticks.tick() => Started::Periodic,
                () = asked(requests.as_ref()) => Started::Asked,
                () = shutdown.cancelled() => return,
            };
            if started == Started::Asked
                && let (Some(last), Some(requests)) = (last_pass, requests.as_ref())
            {
                tokio::select! {
                    () = tokio::time::sleep_until(last + requests.min_interval) => {}
                    () = shutdown.cancelled() => return,
                }
            }
            let began = Instant::now();
            last_pass = Some(began);
            // A panic is caught here, so the controller keeps its schedule and reports it.
            let outcome = std::panic::AssertUnwindSafe(pass(started))
                .catch_unwind()
                .await;
            let label = match outcome {
                Ok(PassOutcome::Done) => "done",
                Ok(PassOutcome::AskAgain) => {
                    if let Some(requests) = &requests {
                        requests.ask();
                    }
                    "ask_again"
                }
                Err(panic) => {
                    health.panicked();
                    tracing::error!(
                        controller = name,
                        "a pass panicked: {}; the next pass runs as planned",
                        cloud_provider::panic_message(panic.as_ref())
                    );
                    "panicked"
                }
            };
            metrics.passed(name, label, began.elapsed());
        }
    }
}

/// Resolves when a pass is asked for; never without requests.
async fn asked(requests: Option<&PassRequests>) {
    match requests {
        Some(requests) => requests.wanted.notified().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use parking_lot::Mutex;

    fn runner(shutdown: &CancellationToken) -> (Runner, Registry) {
        let mut registry = Registry::default();
        let metrics = PeriodicMetrics::register(&mut registry);
        (
            Runner {
                name: "test",
                health: ControllerHealth::default(),
                metrics,
                shutdown: shutdown.clone(),
                loops: crate::controllers::background_loop::LoopReporting {
                    controller: "test",
                    health: ControllerHealth::default(),
                    metrics: Default::default(),
                    shutdown: shutdown.clone(),
                },
            },
            registry,
        )
    }

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[tokio::test(start_paused = true)]
    async fn passes_come_every_period_the_first_at_once_and_a_panic_does_not_stop_them() {
        let shutdown = CancellationToken::new();
        let (runner, registry) = runner(&shutdown);
        let health = runner.health.clone();
        let passes = Arc::new(Mutex::new(Vec::new()));
        let seen = passes.clone();
        let start = Instant::now();
        let task = tokio::spawn(runner.run(Duration::from_secs(10), None, move |started| {
            let seen = seen.clone();
            async move {
                let n = {
                    let mut seen = seen.lock();
                    seen.push((start.elapsed().as_secs(), started));
                    seen.len()
                };
                assert!(n != 2, "the second pass panics");
                PassOutcome::Done
            }
        }));
        tokio::time::sleep(Duration::from_secs(35)).await;
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(
            *passes.lock(),
            [
                (0, Started::Periodic),
                (10, Started::Periodic),
                (20, Started::Periodic),
                (30, Started::Periodic)
            ]
        );
        let text = encoded(&registry);
        assert!(
            text.contains(r#"periodic_passes_total{name="test",outcome="panicked"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"periodic_passes_total{name="test",outcome="done"} 3"#),
            "{text}"
        );
        assert!(
            health.check().is_ok(),
            "one panic is not a failing controller"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn asked_passes_are_rate_limited_and_a_failed_pass_is_asked_again() {
        let shutdown = CancellationToken::new();
        let (runner, _registry) = runner(&shutdown);
        let requests = PassRequests::new(Duration::from_secs(10));
        let passes = Arc::new(Mutex::new(Vec::new()));
        let seen = passes.clone();
        let start = Instant::now();
        let task = tokio::spawn(runner.run(
            Duration::from_secs(100),
            Some(requests.clone()),
            move |started| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen.lock();
                    seen.push((start.elapsed().as_secs(), started));
                    // The pass at 20 s fails once.
                    if seen.len() == 3 {
                        PassOutcome::AskAgain
                    } else {
                        PassOutcome::Done
                    }
                }
            },
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Three asks 1 s after the first pass: one pass, at 10 s (the minimum interval).
        requests.ask();
        requests.ask();
        requests.ask();
        tokio::time::sleep(Duration::from_secs(19)).await;
        // Asked at 20 s: at once (10 s since the last); it fails and asks again: at 30 s.
        requests.ask();
        tokio::time::sleep(Duration::from_secs(20)).await;
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(
            *passes.lock(),
            [
                (0, Started::Periodic),
                (10, Started::Asked),
                (20, Started::Asked),
                (30, Started::Asked)
            ]
        );
    }
}
