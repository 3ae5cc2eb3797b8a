//! The data plane's long-running tasks (the listeners' accept loops, the backends' health checks),
//! started again in place should one panic (a bug): a listener whose loop died would stop accepting
//! until its load balancer is removed, a probe that died would freeze its backend's health. This crate
//! depends on no framework crate (the manager's supervisor is not at hand), so it restarts its own.

use std::{
    future::Future,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tracing::Instrument;

/// A kind of task started again here, and how many times one was after a panic, in this process (a
/// process runs one data plane): `local_lb_task_restarts_total{task}` reads it.
#[derive(Debug)]
pub(crate) struct Task {
    /// The `task` label.
    pub(crate) label: &'static str,
    restarts: AtomicU64,
}

impl Task {
    const fn new(label: &'static str) -> Self {
        Task {
            label,
            restarts: AtomicU64::new(0),
        }
    }

    /// Restarts after a panic so far.
    pub(crate) fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }
}

/// The listeners' accept loops (TCP) and receive loops (UDP).
pub(crate) static ACCEPT_LOOP: Task = Task::new("accept_loop");
/// The backends' health checks.
pub(crate) static HEALTH_CHECKS: Task = Task::new("health_checks");
/// Every kind, in the order the metric lists them.
pub(crate) static TASKS: [&Task; 2] = [&ACCEPT_LOOP, &HEALTH_CHECKS];

/// Runs the task `make` builds until it returns, and returns its output; after a panic, counts it
/// in `kind`, waits `wait` and asks `make` again, which says `None` once the task is no longer wanted
/// (the default output then).
pub(crate) async fn restarting<T, Fut>(
    kind: &'static Task,
    what: &str,
    wait: Duration,
    mut make: impl FnMut() -> Option<Fut>,
) -> T
where
    T: Default + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    loop {
        let Some(task) = make() else {
            return T::default();
        };
        // Watched: awaited here; a panic is logged and the task started again.
        match tokio::spawn(task.in_current_span()).await {
            Ok(output) => return output,
            Err(err) if err.is_panic() => {
                kind.restarts.fetch_add(1, Ordering::Relaxed);
                tracing::error!("{what} panicked (a bug); starting it again in {wait:?}");
                tokio::time::sleep(wait).await;
            }
            // Cancelled: the runtime is shutting down.
            Err(_) => return T::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_started_again_until_it_returns_or_is_unwanted() {
        static RESTARTED: Task = Task::new("test");
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let output = restarting(
            &RESTARTED,
            "the test task",
            Duration::from_millis(1),
            move || {
                let runs = counted.clone();
                Some(async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst);
                    assert!(run >= 2, "a bug in run {run}");
                    run
                })
            },
        )
        .await;
        assert_eq!(output, 2, "two panics, then the third run's output");
        assert_eq!(RESTARTED.restarts(), 2, "each restart counted");

        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let output: u32 = restarting(
            &RESTARTED,
            "the test task",
            Duration::from_millis(1),
            move || {
                // Wanted for one run only.
                (counted.fetch_add(1, Ordering::SeqCst) == 0).then_some(async { panic!("a bug") })
            },
        )
        .await;
        assert_eq!((output, runs.load(Ordering::SeqCst)), (0, 2));
        assert_eq!(
            RESTARTED.restarts(),
            3,
            "the panic before it was unwanted counted too"
        );
    }
}
