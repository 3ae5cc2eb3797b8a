//! Long-running tasks, supervised: the one way the manager, a node agent and a provider start work that
//! runs beside their controllers, so that nothing they spawn panics or ends unseen.
//!
//! A [`Supervisor`] names each task, counts its panics and failures
//! (`supervised_task_panics_total{task}`, `supervised_task_failures_total{task}`), and answers a health
//! check ([`Supervisor::check`]) that fails for good once a task has failed:
//! - a task that can be started again ([`Supervisor::spawn`]) is restarted after a panic, with a
//!   back-off (1 s doubling to 60 s); it has failed after [`PANICS_BEFORE_FAILING`] panics in a row
//!   (a run that lasted [`HEALTHY_RUN`] starts the count again);
//! - a task that cannot ([`Supervisor::spawn_once`]: what it consumed cannot be had again) has failed at
//!   its first panic;
//! - either has failed when it ends before its shutdown token is cancelled, if it was to run until then
//!   ([`Ends::AtShutdown`]).
//!
//! A failed health check is what restarts the process (the kubelet's liveness probe on `/healthz`): a
//! process whose watch or refresher died looks healthy and no longer does that work otherwise.

use std::{
    borrow::Cow, collections::BTreeMap, future::Future, panic::AssertUnwindSafe, sync::Arc,
    time::Duration,
};

use futures::FutureExt;
use parking_lot::Mutex;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Panics in a row after which a restarted task has failed (and the health check fails).
pub const PANICS_BEFORE_FAILING: u32 = 5;
/// A run that lasts this long was healthy: the panics counted before it are forgotten.
pub const HEALTHY_RUN: Duration = Duration::from_secs(600);
/// The first wait before a task that panicked starts again; it doubles up to [`LONGEST_RESTART_WAIT`].
const FIRST_RESTART_WAIT: Duration = Duration::from_secs(1);
const LONGEST_RESTART_WAIT: Duration = Duration::from_secs(60);

/// When a supervised task may end before its shutdown token is cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ends {
    /// Never: an end before shutdown is a failure (its input ended, or it returned by mistake).
    AtShutdown,
    /// Also when its work is done, by design (it says why itself). Only a panic counts.
    WhenDone,
}

/// The labels of the supervisor's metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: String,
}

/// The supervisor's metrics; made once per process and registered with its registry. Clones share the
/// values.
#[derive(Clone, Debug, Default)]
pub struct SupervisorMetrics {
    running: Family<TaskLabels, Gauge>,
    panics: Family<TaskLabels, Counter>,
    failures: Family<TaskLabels, Counter>,
}

impl SupervisorMetrics {
    /// Registers `supervised_tasks{task}`, `supervised_task_panics_total{task}` and
    /// `supervised_task_failures_total{task}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "supervised_tasks",
            "Supervised background tasks running now, by name (a task that failed or is done is at 0)",
            self.running.clone(),
        );
        registry.register(
            "supervised_task_panics",
            "Panics of a supervised background task (a bug); one that can be is started again",
            self.panics.clone(),
        );
        registry.register(
            "supervised_task_failures",
            "Supervised background tasks that failed for good (panicked too often, or ended while the \
             process was not stopping): the health check fails from then on",
            self.failures.clone(),
        );
    }

    fn labels(task: &str) -> TaskLabels {
        TaskLabels {
            task: task.to_owned(),
        }
    }
}

/// What the tasks of one process share: the first failure and the metrics.
#[derive(Default)]
struct Shared {
    failed: Mutex<Option<String>>,
    /// The tasks running now, by name (several may share one).
    running: Mutex<BTreeMap<String, u32>>,
    metrics: SupervisorMetrics,
}

/// A task counted as running while it lives (also when it is dropped: aborted, or its runtime gone).
struct Running {
    shared: Arc<Shared>,
    name: String,
}

impl Running {
    fn new(shared: &Arc<Shared>, name: &str) -> Self {
        *shared.running.lock().entry(name.to_owned()).or_default() += 1;
        let labels = SupervisorMetrics::labels(name);
        shared.metrics.running.get_or_create(&labels).inc();
        // Each task's counters are served from its start, at 0: an alert's `increase()` then sees
        // its first panic or failure, and a scrape shows which tasks are watched.
        shared.metrics.panics.get_or_create(&labels).inc_by(0);
        shared.metrics.failures.get_or_create(&labels).inc_by(0);
        Self {
            shared: shared.clone(),
            name: name.to_owned(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.shared.running.lock();
        if let Some(count) = running.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.name);
            }
        }
        self.shared
            .metrics
            .running
            .get_or_create(&SupervisorMetrics::labels(&self.name))
            .dec();
    }
}

/// Starts and watches long-running tasks (see the [module](self)). Cheap to clone; the clones share the
/// health check and the metrics.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("failed", &*self.shared.failed.lock())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A supervisor whose tasks stop when `shutdown` is cancelled.
    pub fn new(metrics: SupervisorMetrics, shutdown: CancellationToken) -> Self {
        Self {
            shared: Arc::new(Shared {
                failed: Mutex::default(),
                running: Mutex::default(),
                metrics,
            }),
            shutdown,
        }
    }

    /// The same supervisor (same health check and metrics) for tasks that stop with `shutdown`.
    pub fn stopping_with(&self, shutdown: CancellationToken) -> Self {
        Self {
            shared: self.shared.clone(),
            shutdown,
        }
    }

    /// What its tasks stop with.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The health check: an error naming the first task that failed, for good.
    pub fn check(&self) -> Result<(), String> {
        match &*self.shared.failed.lock() {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// The names of the tasks running now (each once), in order.
    pub fn running(&self) -> Vec<String> {
        self.shared.running.lock().keys().cloned().collect()
    }

    /// Runs the task `make` builds until the shutdown token is cancelled (the run is dropped then),
    /// starting it again after a panic (see the [module](self)).
    pub fn spawn<F, Fut>(&self, name: impl Into<Cow<'static, str>>, ends: Ends, make: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.launch(name.into(), move |this, name| async move {
            let mut panics_in_a_row = 0;
            let mut wait = FIRST_RESTART_WAIT;
            loop {
                let started = Instant::now();
                let panic = match this.run(make()).await? {
                    Ok(()) => return this.ended(&name, ends),
                    Err(panic) => panic,
                };
                if started.elapsed() >= HEALTHY_RUN {
                    panics_in_a_row = 0;
                    wait = FIRST_RESTART_WAIT;
                }
                panics_in_a_row += 1;
                this.count_panic(&name);
                if panics_in_a_row >= PANICS_BEFORE_FAILING {
                    return Some(format!(
                        "panicked {panics_in_a_row} times in a row (a bug), the last time: {panic}"
                    ));
                }
                tracing::error!(task = %name, "the task panicked (a bug): {panic}; starting it again in {wait:?}");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = this.shutdown.cancelled() => return None,
                }
                wait = (wait * 2).min(LONGEST_RESTART_WAIT);
            }
        });
    }

    /// Runs `task` until the shutdown token is cancelled (it is dropped then); a panic, or an end before
    /// then unless it [`Ends::WhenDone`], is a failure at once: the task cannot be started again.
    pub fn spawn_once(
        &self,
        name: impl Into<Cow<'static, str>>,
        ends: Ends,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.launch(name.into(), move |this, name| async move {
            match this.run(task).await? {
                Ok(()) => this.ended(&name, ends),
                Err(panic) => {
                    this.count_panic(&name);
                    Some(format!("panicked (a bug): {panic}"))
                }
            }
        });
    }

    /// Spawns what `supervising` makes of this supervisor and the task's name, counted as running
    /// while it lives; the failure it returns, if any, is the task's.
    fn launch<Fut>(
        &self,
        name: Cow<'static, str>,
        supervising: impl FnOnce(Supervisor, Cow<'static, str>) -> Fut,
    ) where
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        let span = tracing::info_span!("supervised", task = %name);
        let running = Running::new(&self.shared, &name);
        let this = self.clone();
        let supervised = supervising(self.clone(), name.clone());
        // Watched: this is the supervisor itself: its task catches every panic of the one it runs, and
        // reports it.
        tokio::spawn(
            async move {
                let _running = running;
                if let Some(why) = supervised.await {
                    this.fail(&name, &why);
                }
            }
            .instrument(span),
        );
    }

    /// One run of a task: `None` when the shutdown token was cancelled first, its panic's message as
    /// the error when it panicked.
    async fn run(&self, task: impl Future<Output = ()>) -> Option<Result<(), String>> {
        tokio::select! {
            outcome = AssertUnwindSafe(task).catch_unwind() => {
                Some(outcome.map_err(|panic| crate::panic_message(panic.as_ref())))
            }
            () = self.shutdown.cancelled() => None,
        }
    }

    /// Why a task that returned has failed, if it has.
    fn ended(&self, name: &str, ends: Ends) -> Option<String> {
        if self.shutdown.is_cancelled() || ends == Ends::WhenDone {
            tracing::debug!(task = name, "the task is done");
            return None;
        }
        Some("ended while the process was not stopping".to_owned())
    }

    fn count_panic(&self, name: &str) {
        self.shared
            .metrics
            .panics
            .get_or_create(&SupervisorMetrics::labels(name))
            .inc();
    }

    fn fail(&self, name: &str, why: &str) {
        tracing::error!(
            task = name,
            "the task {why}; the health check fails from now on, so that the process is restarted"
        );
        self.shared
            .metrics
            .failures
            .get_or_create(&SupervisorMetrics::labels(name))
            .inc();
        let mut failed = self.shared.failed.lock();
        if failed.is_none() {
            *failed = Some(format!("the task {name:?} {why}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use prometheus_client::encoding::text::encode;

    use super::*;

    fn supervisor() -> (Supervisor, Registry) {
        let mut registry = Registry::default();
        let metrics = SupervisorMetrics::default();
        metrics.register(&mut registry);
        (Supervisor::new(metrics, CancellationToken::new()), registry)
    }

    fn metrics(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    /// A task that panics its first `panics` runs, then runs until stopped.
    fn panicking(
        runs: &Arc<AtomicU32>,
        panics: u32,
    ) -> impl Fn() -> futures::future::BoxFuture<'static, ()> + use<> {
        let runs = runs.clone();
        move || {
            let runs = runs.clone();
            Box::pin(async move {
                if runs.fetch_add(1, Ordering::SeqCst) < panics {
                    panic!("a bug");
                }
                std::future::pending::<()>().await;
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_started_again_counted_and_stops_with_shutdown() {
        let (supervisor, registry) = supervisor();
        let runs = Arc::new(AtomicU32::new(0));
        supervisor.spawn("test", Ends::AtShutdown, panicking(&runs, 2));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a run that lasts"
        );
        assert_eq!(supervisor.check(), Ok(()), "two panics are not a failure");
        assert_eq!(supervisor.running(), ["test"]);
        let text = metrics(&registry);
        assert!(text.contains("supervised_tasks{task=\"test\"} 1"), "{text}");
        assert!(
            text.contains("supervised_task_failures_total{task=\"test\"} 0"),
            "served at 0 from the start: {text}"
        );
        assert!(
            metrics(&registry).contains("supervised_task_panics_total{task=\"test\"} 2"),
            "{}",
            metrics(&registry)
        );
        supervisor.shutdown().cancel();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "nothing starts after shutdown"
        );
        assert_eq!(supervisor.check(), Ok(()));
        assert!(supervisor.running().is_empty());
        assert!(metrics(&registry).contains("supervised_tasks{task=\"test\"} 0"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_keeps_panicking_fails_the_health_check() {
        let (supervisor, registry) = supervisor();
        let runs = Arc::new(AtomicU32::new(0));
        supervisor.spawn("watch", Ends::AtShutdown, panicking(&runs, u32::MAX));
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            PANICS_BEFORE_FAILING,
            "not started again after failing"
        );
        let why = supervisor.check().unwrap_err();
        assert!(why.contains("\"watch\" panicked 5 times in a row"), "{why}");
        let text = metrics(&registry);
        assert!(
            text.contains("supervised_task_failures_total{task=\"watch\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("supervised_tasks{task=\"watch\"} 0"),
            "{text}"
        );
        // Another handle on the same supervisor sees it too.
        assert!(
            supervisor
                .stopping_with(CancellationToken::new())
                .check()
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_lasted_forgets_the_panics_before_it() {
        let (supervisor, _registry) = supervisor();
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        // Panics at once four times, then after a healthy run, then at once three times more: never
        // five in a row since a healthy run.
        supervisor.spawn("flaky", Ends::AtShutdown, move || {
            let runs = counted.clone();
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                if run == 4 {
                    tokio::time::sleep(HEALTHY_RUN).await;
                }
                if run < 8 {
                    panic!("a bug");
                }
                std::future::pending::<()>().await;
            }
        });
        tokio::time::sleep(HEALTHY_RUN * 2).await;
        assert_eq!(runs.load(Ordering::SeqCst), 9);
        assert_eq!(supervisor.check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_before_shutdown_fails_unless_the_task_may_be_done() {
        let (supervisor, _registry) = supervisor();
        supervisor.spawn("done", Ends::WhenDone, || async {});
        supervisor.spawn_once("done once", Ends::WhenDone, async {});
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(supervisor.check(), Ok(()));
        supervisor.spawn_once("feed", Ends::AtShutdown, async {});
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            supervisor.check(),
            Err("the task \"feed\" ended while the process was not stopping".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_cannot_start_again_fails_at_its_first_panic() {
        let (supervisor, _registry) = supervisor();
        supervisor.spawn_once("informer", Ends::AtShutdown, async { panic!("a bug") });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            supervisor.check(),
            Err("the task \"informer\" panicked (a bug): a bug".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_stopped_by_shutdown_are_no_failure() {
        let (supervisor, _registry) = supervisor();
        let stop = CancellationToken::new();
        let term = supervisor.stopping_with(stop.clone());
        term.spawn_once("term", Ends::AtShutdown, std::future::pending());
        stop.cancel();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(supervisor.check(), Ok(()));
    }
}
