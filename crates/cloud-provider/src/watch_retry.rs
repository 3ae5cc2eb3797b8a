//! How a watch of the API server that failed is retried, for the manager's caches and a provider's own
//! watches alike (the `local` cloud's node agents): kube-runtime's exponential back-off (800 ms
//! doubling) with at most [`WATCH_RETRY_MAX`] between tries, back to the start after 2 minutes without
//! a failure, as its default is. Its default waits up to 30 s (and more with jitter) between tries, so
//! after a long API-server outage a watch could come back half a minute after the API server did.

use std::time::Duration;

use kube::runtime::{utils::ResetTimerBackoff, watcher};

/// The longest wait before a failed watch is retried.
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

/// The first wait before a failed watch is retried.
pub const WATCH_RETRY_FIRST: Duration = Duration::from_millis(800);

/// The retry delays. backon's jitter adds up to the delay itself, so the delay is capped at half the
/// maximum.
pub fn watch_retry_backoff() -> ResetTimerBackoff<watcher::ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(WATCH_RETRY_FIRST)
        .with_max_delay(WATCH_RETRY_MAX / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), Duration::from_secs(120))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_watches_are_retried_within_5_s() {
        let delays: Vec<Duration> = watch_retry_backoff().take(12).collect();
        assert!(delays[0] >= WATCH_RETRY_FIRST, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= WATCH_RETRY_MAX), "{delays:?}");
        assert!(
            delays[4..].iter().all(|d| *d >= WATCH_RETRY_MAX / 2),
            "{delays:?}"
        );
    }
}
