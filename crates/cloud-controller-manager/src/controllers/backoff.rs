//! Per-object exponential back-off, shared by the controllers that retry one object without delaying the
//! others (upstream's per-item exponential rate limiter, without its bucket): each object counts its own
//! consecutive failures, the delay doubles from `base` with each one up to `max`, and a success forgets
//! the object so its next failure starts again from `base`.

use parking_lot::{Mutex, MutexGuard};
use std::{collections::HashMap, time::Duration};

/// Consecutive failures per object key and the delay they earn: `base` after the first, doubling with
/// each further one, never more than `max`.
#[derive(Debug)]
pub(crate) struct PerObjectBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl PerObjectBackoff {
    /// A back-off starting at `base` and capped at `max`, with no object failing yet.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// The delay after `attempt` consecutive failures: `base × 2^(attempt − 1)`, at most `max` (the
    /// first failure, and a count of 0, wait `base`).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Counts one more consecutive failure of `key`: the failure's number (1 for the first) and the delay
    /// before retrying it.
    pub(crate) fn failed(&self, key: &str) -> (u32, Duration) {
        let attempt = {
            let mut failures = self.failures();
            let count = failures.entry(key.to_owned()).or_default();
            *count = count.saturating_add(1);
            *count
        };
        (attempt, self.delay(attempt))
    }

    /// `key` succeeded: its next failure waits `base` again.
    pub(crate) fn succeeded(&self, key: &str) {
        self.failures().remove(key);
    }

    fn failures(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_from_base_to_max() {
        let backoff = PerObjectBackoff::new(Duration::from_secs(5), Duration::from_secs(300));
        assert_eq!(backoff.delay(0), Duration::from_secs(5));
        assert_eq!(backoff.delay(1), Duration::from_secs(5));
        assert_eq!(backoff.delay(2), Duration::from_secs(10));
        assert_eq!(backoff.delay(6), Duration::from_secs(160));
        assert_eq!(backoff.delay(7), Duration::from_secs(300));
        assert_eq!(backoff.delay(40), Duration::from_secs(300));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn the_node_controllers_values() {
        let backoff = PerObjectBackoff::new(Duration::from_millis(5), Duration::from_secs(1000));
        assert_eq!(backoff.delay(1), Duration::from_millis(5));
        assert_eq!(backoff.delay(2), Duration::from_millis(10));
        assert_eq!(backoff.delay(11), Duration::from_millis(5 * 1024));
        assert_eq!(backoff.delay(18), Duration::from_millis(5 << 17));
        assert_eq!(backoff.delay(19), Duration::from_secs(1000));
        assert_eq!(backoff.delay(40), Duration::from_secs(1000));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1000));
    }

    #[test]
    fn each_object_counts_its_own_failures_until_it_succeeds() {
        let backoff = PerObjectBackoff::new(Duration::from_secs(5), Duration::from_secs(300));
        assert_eq!(backoff.failed("a"), (1, Duration::from_secs(5)));
        assert_eq!(backoff.failed("a"), (2, Duration::from_secs(10)));
        assert_eq!(backoff.failed("a"), (3, Duration::from_secs(20)));
        // Another object is not delayed by the first one's failures.
        assert_eq!(backoff.failed("b"), (1, Duration::from_secs(5)));
        backoff.succeeded("a");
        assert_eq!(backoff.failed("a"), (1, Duration::from_secs(5)));
        assert_eq!(backoff.failed("b"), (2, Duration::from_secs(10)));
        // Forgetting an object that never failed is harmless.
        backoff.succeeded("never-failed");
        assert_eq!(backoff.failed("never-failed"), (1, Duration::from_secs(5)));
    }

    #[test]
    fn the_count_keeps_growing_past_the_cap() {
        let backoff = PerObjectBackoff::new(Duration::from_millis(5), Duration::from_secs(1000));
        for expected in 1..=40 {
            let (attempt, delay) = backoff.failed("n");
            assert_eq!(attempt, expected);
            assert!(delay <= Duration::from_secs(1000));
        }
    }
}
