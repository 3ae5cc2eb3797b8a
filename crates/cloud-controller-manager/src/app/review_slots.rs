//! The bound on reviews in flight: each TokenReview or SubjectAccessReview the cache cannot answer takes
//! one of a few slots for at most the review timeout. A request that finds no slot free waits briefly
//! for one, then is refused (the endpoint answers 429 Too Many Requests), so a flood of requests with new
//! tokens is answered at the rate the API server can review them and the rest is turned away: nothing
//! queues without bound, and the manager's other API clients never wait behind it.

use std::{future::Future, time::Duration};

use tokio::sync::Semaphore;

/// Reviews in flight at once. With the reviewing client's 200 QPS (upstream's), 16 slots keep that rate
/// while each review takes up to 80 ms.
pub const REVIEW_SLOTS: usize = 16;
/// How long a request waits for a free slot before it is refused.
pub const SLOT_WAIT: Duration = Duration::from_millis(250);
/// How long one review may take (upstream's delegated authn/authz client timeout).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a review was not made, or not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Every slot stayed busy for the whole wait.
    #[error("too many reviews in flight: no slot free within {0:?}")]
    Busy(Duration),
    /// The API server did not answer in time.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// A few slots for reviews in flight.
pub struct ReviewSlots {
    slots: Semaphore,
    wait: Duration,
    timeout: Duration,
}

impl Default for ReviewSlots {
    fn default() -> Self {
        Self::new(REVIEW_SLOTS, SLOT_WAIT, REVIEW_TIMEOUT)
    }
}

impl ReviewSlots {
    /// `slots` reviews at once; a request waits `wait` for a slot; a review may take `timeout`.
    pub fn new(slots: usize, wait: Duration, timeout: Duration) -> Self {
        Self {
            slots: Semaphore::new(slots.max(1)),
            wait,
            timeout,
        }
    }

    /// Runs `review` in a slot, or says why not.
    pub async fn run<T>(&self, review: impl Future<Output = T>) -> Result<T, SlotError> {
        let _slot = match tokio::time::timeout(self.wait, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            // The semaphore is never closed; a closed one would mean no review can be made either.
            Ok(Err(_)) | Err(_) => return Err(SlotError::Busy(self.wait)),
        };
        tokio::time::timeout(self.timeout, review)
            .await
            .map_err(|_| SlotError::TimedOut(self.timeout))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_most_the_slots_run_at_once_and_the_rest_are_refused_after_the_wait() {
        let slots = Arc::new(ReviewSlots::new(
            2,
            Duration::from_millis(250),
            Duration::from_secs(10),
        ));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (slots, running, most) = (slots.clone(), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                slots
                    .run(async {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 2);
        assert!(
            results
                .iter()
                .filter(|r| r.is_err())
                .all(|r| *r == Err(SlotError::Busy(Duration::from_millis(250))))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_a_slot_freed_within_the_wait() {
        let slots = Arc::new(ReviewSlots::new(
            1,
            Duration::from_millis(250),
            Duration::from_secs(10),
        ));
        let first = {
            let slots = slots.clone();
            tokio::spawn(async move {
                slots
                    .run(tokio::time::sleep(Duration::from_millis(100)))
                    .await
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(slots.run(async { 7 }).await, Ok(7));
        assert!(first.await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_that_hangs_gives_its_slot_back_at_the_timeout() {
        let slots = ReviewSlots::new(1, Duration::from_millis(250), Duration::from_secs(10));
        assert_eq!(
            slots.run(std::future::pending::<()>()).await,
            Err(SlotError::TimedOut(Duration::from_secs(10)))
        );
        assert_eq!(slots.run(async { 1 }).await, Ok(1));
    }
}
