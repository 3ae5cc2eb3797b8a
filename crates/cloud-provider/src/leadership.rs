//! Whether this replica may still change the cloud.
//!
//! With leader election, only the leader changes the cloud, and it stays the leader only while it renews
//! its Lease. A replica that froze (a stopped process, a long GC-like pause, a cut network) can resume in
//! the middle of a cloud call after a standby took over; if it then carried on creating a load balancer,
//! the load balancer of a Service the new leader already cleaned up would leak.
//!
//! The manager runs every provider call inside a leadership scope, and drops the call at the next await
//! once leadership lapsed. A call that changes the cloud in several steps, or that spawns work of its
//! own, also checks between its steps:
//!
//! ```
//! use cloud_provider::{CloudResult, leadership};
//!
//! async fn create_load_balancer_in_steps() -> CloudResult<()> {
//!     // ... describe what exists (reads are always fine) ...
//!     leadership::check()?; // before the first change
//!     // ... create the load balancer ...
//!     leadership::check()?; // before each further change
//!     // ... register its targets ...
//!     Ok(())
//! }
//! ```
//!
//! [`check`] answers `Ok` outside a scope (tests, a manager without leader election, a task the provider
//! spawned without carrying the scope along: use [`current`] and [`Leadership::scope`] for that).

use std::{future::Future, sync::Arc, time::Duration};

use crate::{CloudError, CloudResult};

/// What the manager's leader election tells a provider call.
pub trait LeadershipSource: Send + Sync + 'static {
    /// `None` while this replica may change the cloud; how long ago its leadership lapsed otherwise.
    fn lapsed(&self) -> Option<Duration>;
}

tokio::task_local! {
    static LEADERSHIP: Leadership;
}

/// The leadership a provider call runs under (cheap to clone).
#[derive(Clone)]
pub struct Leadership(Arc<dyn LeadershipSource>);

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("lapsed", &self.0.lapsed())
            .finish()
    }
}

impl Leadership {
    /// Leadership as `source` reports it.
    pub fn new(source: Arc<dyn LeadershipSource>) -> Self {
        Self(source)
    }

    /// `Ok` while this replica may change the cloud; [`CloudError::LeadershipLost`] once it lapsed.
    pub fn check(&self) -> CloudResult<()> {
        match self.0.lapsed() {
            None => Ok(()),
            Some(lapsed) => Err(CloudError::LeadershipLost { lapsed }),
        }
    }

    /// Runs `work` with this leadership as the one [`check`] consults (for work a provider spawns).
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        LEADERSHIP.scope(self, work).await
    }
}

/// The leadership of the provider call this task is running, if the manager set one.
pub fn current() -> Option<Leadership> {
    LEADERSHIP.try_with(Leadership::clone).ok()
}

/// `Ok` while this replica may change the cloud, [`CloudError::LeadershipLost`] once its leadership
/// lapsed. Call it before each step that changes the cloud; `Ok` outside a leadership scope.
pub fn check() -> CloudResult<()> {
    current().map_or(Ok(()), |leadership| leadership.check())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct Switch(AtomicBool);

    impl LeadershipSource for Switch {
        fn lapsed(&self) -> Option<Duration> {
            self.0
                .load(Ordering::Relaxed)
                .then_some(Duration::from_secs(3))
        }
    }

    #[tokio::test]
    async fn check_follows_the_scope_s_source_and_is_ok_outside_any_scope() {
        assert!(check().is_ok(), "no scope: ok");
        let switch = Arc::new(Switch(AtomicBool::new(false)));
        let leadership = Leadership::new(switch.clone());
        leadership
            .clone()
            .scope(async {
                assert!(check().is_ok());
                switch.0.store(true, Ordering::Relaxed);
                let err = check().unwrap_err();
                assert!(matches!(err, CloudError::LeadershipLost { .. }));
                assert_eq!(
                    err.to_string(),
                    "not changing the cloud: this replica's leadership lapsed 3s ago"
                );
                // Carried into spawned work explicitly.
                let carried = current().unwrap();
                let spawned = tokio::spawn(carried.scope(async { check().is_err() }));
                assert!(spawned.await.unwrap());
                assert!(tokio::spawn(async { check().is_ok() }).await.unwrap());
            })
            .await;
        assert!(check().is_ok(), "the scope ended");
    }
}
