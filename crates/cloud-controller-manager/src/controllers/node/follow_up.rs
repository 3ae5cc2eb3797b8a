//! What follows a node's initialization (its address write, the `Synced` event, the initial-sync metric),
//! run beside the workers instead of on them.
//!
//! The address write first waits for the node cache to see the initialization ([`super::cache_catch_up`]).
//! On a worker that wait made no request: in a registration storm the informer lags the saturated API
//! server, and at 10,000 nodes unthrottled the wait (then bounded to 500 ms) reached its bound for 71–377
//! nodes per run, each time holding one of the 16 workers (`bench/results/2026-11-28-10k-pace-run.md`).
//! Here the worker is free once the node's own write has landed, and takes the next node
//! (`bench/results/2026-11-28-follow-ups.md`).
//!
//! Follow-ups are bounded ([`MAX_PENDING`]): when that many wait, a worker waits for a slot before it
//! takes another node, so a watch that falls behind slows the initializations down to what it delivers
//! instead of letting address writes pile up. They are tracked: a graceful stop waits for them after the
//! workers ([`FollowUps::finish`]); a lost leadership abandons them with the rest of the in-flight work
//! (their writes are fenced). A follow-up that panics is counted as a panicking reconcile is
//! (`workqueue_panics_total` and the controller's health check) and the others go on: the node is
//! already initialized, and the periodic address refresh writes its addresses again.

use std::{future::Future, panic::AssertUnwindSafe, sync::Arc};

use futures::FutureExt;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::controllers::controller_health::ControllerHealth;

/// How many follow-ups may be pending at once: at the measured peak of about 180 initializations a
/// second, the cache may lag about 1.4 s before the workers wait for a slot. Each holds one node and its
/// cloud addresses (a few kilobytes).
pub(super) const MAX_PENDING: usize = 256;

/// The node controller's pending follow-ups.
pub(super) struct FollowUps {
    tasks: TaskTracker,
    slots: Arc<Semaphore>,
    /// Where a panic is counted: the controller's `workqueue_panics_total` series and health check.
    panics: Counter,
    health: ControllerHealth,
}

impl FollowUps {
    pub(super) fn new(max_pending: usize, panics: Counter, health: ControllerHealth) -> Self {
        Self {
            tasks: TaskTracker::new(),
            slots: Arc::new(Semaphore::new(max_pending)),
            panics,
            health,
        }
    }

    /// Starts `work` in the current span once a slot is free (waiting for one if all are taken).
    pub(super) async fn start(&self, work: impl Future<Output = ()> + Send + 'static) {
        let Ok(slot) = self.slots.clone().acquire_owned().await else {
            return; // never closed: `finish` closes the tracker, not the slots
        };
        let (panics, health) = (self.panics.clone(), self.health.clone());
        self.tasks.spawn(
            async move {
                if let Err(panic) = AssertUnwindSafe(work).catch_unwind().await {
                    panics.inc();
                    health.panicked();
                    tracing::error!(
                        "the follow-up of a node's initialization panicked ({}); the periodic address refresh will write its addresses",
                        cloud_provider::panic_message(panic.as_ref())
                    );
                }
                drop(slot);
            }
            .in_current_span(),
        );
    }

    /// Waits for every follow-up started so far (call once the workers have stopped).
    pub(super) async fn finish(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follow_ups_run_beside_the_caller_bounded_and_are_waited_for() {
        let follow_ups = FollowUps::new(2, Counter::default(), ControllerHealth::default());
        let done = Arc::new(AtomicUsize::new(0));
        let slow = |done: Arc<AtomicUsize>| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            done.fetch_add(1, Ordering::SeqCst);
        };
        let started = tokio::time::Instant::now();
        follow_ups.start(slow(done.clone())).await;
        follow_ups.start(slow(done.clone())).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "the caller did not wait");
        // A third waits for a slot.
        follow_ups.start(slow(done.clone())).await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        follow_ups.finish().await;
        assert_eq!(done.load(Ordering::SeqCst), 3);
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_follow_up_that_panics_is_counted_frees_its_slot_and_does_not_stop_the_others() {
        let panics = Counter::default();
        let follow_ups = FollowUps::new(1, panics.clone(), ControllerHealth::default());
        let done = Arc::new(AtomicUsize::new(0));
        follow_ups.start(async { panic!("boom") }).await;
        let counted = done.clone();
        follow_ups
            .start(async move {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .await;
        follow_ups.finish().await;
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert_eq!(panics.get(), 1);
    }
}
