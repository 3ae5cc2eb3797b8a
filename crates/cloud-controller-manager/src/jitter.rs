//! Jitter for periodic waits, so that loops started together do not run in lockstep.

use std::time::Duration;

/// `period` plus up to 20 % of jitter (from the clock's nanoseconds: no random generator needed for
/// this).
pub(crate) fn jittered(period: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    period + period.mul_f64(0.2 * f64::from(nanos % 1000) / 1000.0)
}
