//! A controller's own health check: a controller whose reconciles keep panicking fails it, and with it
//! `/healthz`, instead of running on silently degraded (a kubelet's liveness probe then restarts the
//! manager); so does, for good, one whose background loop died ([`super::background_loop`]).

use parking_lot::Mutex;
use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

/// Panics within [`WINDOW`] that make a controller unhealthy. A single key that panics on every retry
/// (its back-off: 5 s doubling) panics 7 times in 10 minutes, so one bad object alone does not fail the
/// check; a controller panicking across its objects does.
pub const PANICS_FOR_UNHEALTHY: usize = 10;
/// The window panics are counted in.
pub const WINDOW: Duration = Duration::from_secs(600);

/// The panics a controller's reconciles had lately (cheap to clone; the health endpoint reads it).
#[derive(Clone, Debug, Default)]
pub struct ControllerHealth {
    panics: Arc<Mutex<VecDeque<Instant>>>,
    /// Why a background loop of the controller died, if one did: the check fails from then on.
    dead_loop: Arc<Mutex<Option<String>>>,
}

impl ControllerHealth {
    /// Records a panic of one reconcile (the work-queue runner does so for its controllers).
    pub fn panicked(&self) {
        self.record(Instant::now());
    }

    /// Records that the controller's loop `loop_name` panicked or ended early (`why`): the check fails
    /// from now on (the first such loop is the one named).
    pub fn background_loop_failed(&self, loop_name: &str, why: &str) {
        self.dead_loop.lock().get_or_insert_with(|| {
            format!(
                "its {loop_name} loop {why}; the controller no longer does that work until the \
                 manager restarts"
            )
        });
    }

    fn record(&self, at: Instant) {
        let mut panics = self.panics.lock();
        panics.push_back(at);
        Self::forget_old(&mut panics, at);
    }

    fn forget_old(panics: &mut VecDeque<Instant>, now: Instant) {
        while panics
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) > WINDOW)
        {
            panics.pop_front();
        }
    }

    /// `Err` while [`PANICS_FOR_UNHEALTHY`] or more reconciles panicked within [`WINDOW`], and for good
    /// once a background loop died.
    pub fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), String> {
        if let Some(dead) = self.dead_loop.lock().as_ref() {
            return Err(dead.clone());
        }
        let mut panics = self.panics.lock();
        Self::forget_old(&mut panics, now);
        if panics.len() >= PANICS_FOR_UNHEALTHY {
            return Err(format!(
                "{} reconciles panicked in the last {WINDOW:?}",
                panics.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_panics_in_the_window_fail_the_check_until_they_age_out() {
        let health = ControllerHealth::default();
        let start = Instant::now();
        for i in 0..PANICS_FOR_UNHEALTHY - 1 {
            health.record(start + Duration::from_secs(i as u64));
        }
        assert!(health.check_at(start + Duration::from_secs(10)).is_ok());
        health.record(start + Duration::from_secs(20));
        let err = health
            .check_at(start + Duration::from_secs(21))
            .unwrap_err();
        assert_eq!(err, "10 reconciles panicked in the last 600s");
        // The oldest ages out of the window: healthy again.
        assert!(
            health
                .check_at(start + WINDOW + Duration::from_secs(1))
                .is_ok()
        );
    }
}
