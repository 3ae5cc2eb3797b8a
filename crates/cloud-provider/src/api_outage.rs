//! Riding out an API-server outage, for a provider whose data plane runs in the manager's own process.
//!
//! Upstream's manager exits when its leader cannot renew the Lease within the renew deadline, and most
//! providers want exactly that: their data plane is the cloud's, which does not care whether the
//! manager runs. A provider that serves traffic from the manager's process (the `local` provider's
//! leader mode) would take that traffic down with it, for the whole of an outage of the control plane
//! that no other replica could have ridden out either. Such a provider answers `true` from
//! [`CloudProvider::rides_out_api_outages`](crate::CloudProvider::rides_out_api_outages), and then a
//! leader that cannot *reach* the API server at its renew deadline does not exit:
//!
//! - its writes stop at the deadline, as always (the API and cloud writes of the controllers are
//!   refused, [`crate::leadership::check`] fails);
//! - it keeps running and keeps trying to renew, and [`ApiOutage::riding_out`] says `true`;
//! - once the API server answers, it renews if the Lease is still its own (nobody could take it), and
//!   everything goes on; if another replica holds the Lease, it exits as upstream does;
//! - while it rides out, the provider watches for another replica serving (the `local` provider hears
//!   another host announce one of its addresses) and calls [`ApiOutage::step_down`]: the manager then
//!   exits at once, as it does when it finds another holder.
//!
//! An API server that answers but refuses (401, 403, a conflict) is no outage: the leader exits at its
//! deadline, as upstream's.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What a provider sees of the leader riding out an outage (cheap to clone).
#[derive(Clone, Debug)]
pub struct ApiOutage {
    riding_out: watch::Receiver<bool>,
    step_down: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

/// The manager's side of [`ApiOutage`]: says when riding out starts and ends, and hears a step-down.
#[derive(Debug)]
pub struct ApiOutageReport {
    riding_out: watch::Sender<bool>,
    step_down: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl ApiOutage {
    /// A pair for a manager that leads: the report it keeps, the view it hands the provider.
    pub fn channel() -> (ApiOutageReport, ApiOutage) {
        let (sender, receiver) = watch::channel(false);
        let step_down = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        (
            ApiOutageReport {
                riding_out: sender,
                step_down: step_down.clone(),
                reason: reason.clone(),
            },
            ApiOutage {
                riding_out: receiver,
                step_down,
                reason,
            },
        )
    }

    /// For a manager without leader election (or a test): never rides anything out.
    pub fn never() -> Self {
        Self::channel().1
    }

    /// Whether the leader is riding out an outage now: its Lease lapsed because the API server could
    /// not be reached, its writes are stopped, and no other holder has been seen.
    pub fn riding_out(&self) -> bool {
        *self.riding_out.borrow()
    }

    /// Waits until [`ApiOutage::riding_out`] is `riding_out`. Never returns when the manager stopped
    /// reporting (it is shutting down; `shutdown` is the provider's signal for that).
    pub async fn wait_until(&mut self, riding_out: bool) {
        if self
            .riding_out
            .wait_for(|now| *now == riding_out)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Another replica is serving: the manager exits at once (taking this provider's data plane down
    /// with it, as on any lost leadership), saying `why`. The first reason given is kept.
    pub fn step_down(&self, why: impl Into<String>) {
        let mut reason = self.reason.lock();
        if reason.is_none() {
            *reason = Some(why.into());
        }
        self.step_down.cancel();
    }
}

impl ApiOutageReport {
    /// Riding out started (`true`) or ended (`false`).
    pub fn set_riding_out(&self, riding_out: bool) {
        self.riding_out.send_if_modified(|now| {
            let changed = *now != riding_out;
            *now = riding_out;
            changed
        });
    }

    /// Waits until the provider steps down, and says why.
    pub async fn stepped_down(&self) -> String {
        self.step_down.cancelled().await;
        self.reason.lock().clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_provider_sees_riding_out_begin_and_end_and_its_step_down_reaches_the_manager() {
        let (report, outage) = ApiOutage::channel();
        assert!(!outage.riding_out());
        let mut waiting = outage.clone();
        let began = tokio::spawn(async move { waiting.wait_until(true).await });
        report.set_riding_out(true);
        tokio::time::timeout(Duration::from_secs(5), began)
            .await
            .unwrap()
            .unwrap();
        assert!(outage.riding_out());
        report.set_riding_out(false);
        let mut waiting = outage.clone();
        tokio::time::timeout(Duration::from_secs(5), waiting.wait_until(false))
            .await
            .unwrap();

        outage.step_down("10.0.0.1 is announced by 02:00:00:00:00:01");
        outage.step_down("a later reason");
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), report.stepped_down())
                .await
                .unwrap(),
            "10.0.0.1 is announced by 02:00:00:00:00:01"
        );
    }

    #[tokio::test]
    async fn without_a_manager_reporting_nothing_is_ridden_out() {
        let mut outage = ApiOutage::never();
        assert!(!outage.riding_out());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), outage.wait_until(true))
                .await
                .is_err()
        );
    }
}
