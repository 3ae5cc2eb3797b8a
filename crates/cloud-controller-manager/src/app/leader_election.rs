//! Leader election on a coordination.k8s.io Lease, with client-go's semantics and flags.
//!
//! Our own rather than `kube-lease-manager`: that crate counts durations in whole seconds, renews at
//! "expiry minus grace" instead of every `--leader-elect-retry-period`, has no renew deadline (a leader
//! that cannot renew keeps believing it leads) and does not expose when it last renewed, which the
//! `/healthz` leader-election watchdog needs. client-go's algorithm is short; this is it:
//!
//! - **acquire**: every retry period (with jitter), read the Lease; take it when it is free, released, or
//!   its holder has not renewed for its lease duration *as observed locally* (no clock-skew trust). A
//!   replica that dies without releasing is replaced within the lease duration plus at most two retry
//!   periods (the time to notice its last renewal, and to notice the expiry);
//! - **renew**: every retry period; if no renewal succeeds for the renew deadline, leadership is lost
//!   and the manager exits (as upstream does). Each attempt is bounded by the time left until that
//!   deadline, so a request that hangs (a frozen API server, a black-holed connection) cannot keep a
//!   leader that lost contact believing it leads; upstream bounds its renewals by the renew deadline
//!   too. Meanwhile the [`WriteFence`] stops the controllers' writes at the deadline itself;
//! - **release** on graceful shutdown: the holder is cleared, so another replica takes over at once
//!   (upstream's manager waits out the lease instead);
//! - **riding out** (ours; only for a provider that
//!   [rides out API outages](cloud_provider::CloudProvider::rides_out_api_outages)): a leader whose last
//!   renewals failed because the API server could not be *reached* (no answer, refused, reset, a 5xx)
//!   does not exit at its renew deadline. Its writes stop there all the same; it keeps trying every
//!   retry period, tells the provider ([`cloud_provider::ApiOutage`]), and when the API server answers
//!   it renews if the Lease is still its own, or exits if another replica holds it. Nobody can have
//!   taken the Lease without reaching the API server, and the resourceVersion of the renewal makes any
//!   write in between a conflict, so a renewal after riding out never overlaps another leader's term.
//!   An answer that turns the renewal away (401, 403, 429: a restarted API server's first answers, before
//!   its authorizer's caches are filled) keeps it riding out, since it says nothing of who holds the Lease.
//!   Another replica that could reach the API server takes the Lease once it expires and starts serving;
//!   the provider hears that and steps down ([`cloud_provider::ApiOutage::step_down`]). A candidate
//!   counts a holder's silence only over time it could watch: an attempt that fails (no answer, an
//!   error) forgets what it observed, so after an outage the holder has a whole lease duration from
//!   the candidate's next successful read to renew, and a leader that rode the outage out is not
//!   overtaken by a standby that merely saw the Lease unchanged across it.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{PostParams, ResourceExt},
};
use tokio_util::sync::CancellationToken;

use cloud_provider::ApiOutageReport;

use super::options::LeaderElectionOptions;
use crate::jitter::jittered;
use crate::metrics::LeaderElectionMetrics;
use crate::write_fence::WriteFence;

/// How long past the lease duration the watchdog tolerates a leader that has not renewed (upstream's
/// `leaderElection` health check).
const WATCHDOG_SLACK: Duration = Duration::from_secs(20);

/// The leader lost its lease.
#[derive(Debug, thiserror::Error)]
pub enum LeadershipLost {
    /// No renewal succeeded within the renew deadline (and the API server answered, or the provider
    /// does not ride outages out).
    #[error(
        "leaderelection lost: lease {namespace}/{name} was not renewed within the renew deadline of {deadline:?} (last renewed {:.1}s ago)",
        since_renewal.as_secs_f64()
    )]
    NotRenewed {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// Since the start of the last successful renewal.
        since_renewal: Duration,
        /// `--leader-elect-renew-deadline`.
        deadline: Duration,
    },
    /// The API server answered after the leader rode out an outage, and the Lease is another's.
    #[error(
        "leaderelection lost: lease {namespace}/{name} was taken over while the API server could not be reached (riding out for {:.1}s)",
        riding_out_for.as_secs_f64()
    )]
    TakenOver {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// How long the leader had ridden the outage out.
        riding_out_for: Duration,
    },
    /// The provider stepped down while the leader rode out an outage (another replica serves).
    #[error("leaderelection lost: stepped down while riding out the API server's outage: {reason}")]
    SteppedDown {
        /// What the provider said.
        reason: String,
    },
}

/// Why the last renewal attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No attempt failed yet within this renewal.
    None,
    /// The API server answered: another candidate holds the Lease, or a conflicting write.
    HeldByAnother,
    /// The API server answered with an error that waiting will not change (401, 403, ...).
    Refused,
    /// No answer, refused or reset connections, a 5xx: the API server could not be reached.
    Unreachable,
}

/// How riding out an outage ended.
enum RideOut {
    /// The Lease was renewed: lead on.
    Renewed,
    /// `stop` was cancelled.
    Stopped,
}

/// What was last seen of the Lease, and when (local time).
struct Observed {
    holder: String,
    renew_time: Option<Timestamp>,
    transitions: i32,
    duration: Duration,
    at: Instant,
}

/// One candidate for the Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    observed: Mutex<Option<Observed>>,
    /// When the last successful acquire or renew attempt started (what the fence counts from).
    last_renewal: Mutex<Option<Instant>>,
    fence: WriteFence,
    /// For a provider that rides out API outages: what it is told, and the gauge that shows it.
    outage: Option<(ApiOutageReport, LeaderElectionMetrics)>,
    /// While riding out: when it started, and when the last attempt to renew ended (the watchdog's
    /// sign that renewing goes on).
    riding_out: Mutex<Option<(Instant, Instant)>>,
}

fn whole_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs_f64().ceil() as i64).unwrap_or(i32::MAX)
}

impl LeaderElector {
    /// A candidate named `identity` for the Lease the options name, which opens `fence` (a closed
    /// [`WriteFence::default`]) while it leads.
    pub fn new(
        client: Client,
        options: &LeaderElectionOptions,
        identity: String,
        fence: WriteFence,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &options.leader_elect_resource_namespace),
            name: options.leader_elect_resource_name.clone(),
            namespace: options.leader_elect_resource_namespace.clone(),
            identity,
            lease_duration: options.leader_elect_lease_duration,
            renew_deadline: options.leader_elect_renew_deadline,
            retry_period: options.leader_elect_retry_period,
            observed: Mutex::default(),
            last_renewal: Mutex::default(),
            fence,
            outage: None,
            riding_out: Mutex::default(),
        }
    }

    /// This candidate, which rides out an API server it cannot reach at its renew deadline instead of
    /// losing leadership, telling the provider through `report` (see the module's documentation).
    pub(crate) fn riding_out_outages(
        mut self,
        report: ApiOutageReport,
        metrics: LeaderElectionMetrics,
    ) -> Self {
        metrics.set_riding_out(&self.name, false);
        self.outage = Some((report, metrics));
        self
    }

    /// Tells the provider, and the metrics, that riding out started or ended.
    fn report_riding_out(&self, riding_out: bool) {
        if let Some((report, metrics)) = &self.outage {
            report.set_riding_out(riding_out);
            metrics.set_riding_out(&self.name, riding_out);
        }
    }

    /// The fence this candidate opens while it leads: give it to every client that writes on the
    /// leader's behalf.
    pub fn fence(&self) -> &WriteFence {
        &self.fence
    }

    /// Waits until this candidate holds the Lease: `true`, or `false` if `shutdown` came first.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), identity = %self.identity, "attempting to acquire leader lease");
        loop {
            match self.attempt(self.renew_deadline).await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, "successfully acquired lease");
                    return true;
                }
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "error retrieving resource lock");
                    // A holder's silence counts only over time this candidate could watch: after an
                    // outage of the API server, the holder (which may have ridden it out) gets a whole
                    // lease duration from the next successful read to renew.
                    *self.observed.lock() = None;
                }
            }
            // Poll every retry period, but never sleep past the moment the holder's lease runs out. The
            // period is jittered by up to 20 %, so candidates started together do not poll in lockstep
            // (client-go jitters by up to 120 %, which only delays noticing an expired leader).
            let mut wait = jittered(self.retry_period);
            if let Some(expiry) = self.observed_expiry() {
                wait = wait.min(
                    expiry.saturating_duration_since(Instant::now()) + Duration::from_millis(50),
                );
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return false,
            }
        }
    }

    /// When the lease last seen held by another candidate runs out, by local observation.
    fn observed_expiry(&self) -> Option<Instant> {
        let observed = self.observed.lock();
        observed
            .as_ref()
            .filter(|o| !o.holder.is_empty() && o.holder != self.identity)
            .map(|o| o.at + o.duration)
    }

    /// Renews the Lease every retry period until `stop` is cancelled (`Ok`), or until leadership is
    /// lost (`Err`): no renewal succeeded within the renew deadline of the last one (unless the API
    /// server could not be reached and this candidate rides outages out: then until the API server
    /// says another holds the Lease, or the provider steps down). The write fence is closed before
    /// this returns an error.
    pub async fn keep_renewing(&self, stop: &CancellationToken) -> Result<(), LeadershipLost> {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.retry_period) => {}
                () = stop.cancelled() => return Ok(()),
                reason = self.stepped_down() => return Err(self.stepped_down_lost(reason)),
            }
            let mut failure = Failure::None;
            loop {
                let Some(deadline) = self
                    .fence
                    .valid_until()
                    .filter(|deadline| *deadline > Instant::now())
                else {
                    // No failure seen means no attempt was made before the deadline passed (this
                    // process was frozen, or the last renewal's answer came late): riding out tries at
                    // once, and exits if another holds the Lease.
                    if matches!(failure, Failure::Unreachable | Failure::None)
                        && self.outage.is_some()
                    {
                        match self.ride_out(stop).await? {
                            RideOut::Renewed => break,
                            RideOut::Stopped => return Ok(()),
                        }
                    }
                    return Err(self.lost());
                };
                match self.attempt(deadline - Instant::now()).await {
                    Ok(true) => break,
                    // Held by another candidate, or a conflicting write: as upstream, keep trying
                    // until the deadline (the fence closes then in any case).
                    Ok(false) => {
                        failure = Failure::HeldByAnother;
                        tracing::warn!("failed to renew lease: held by another candidate");
                    }
                    Err(err) => {
                        failure = if err.unreachable() {
                            Failure::Unreachable
                        } else {
                            Failure::Refused
                        };
                        tracing::warn!(error = %err, "failed to renew lease");
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    () = tokio::time::sleep(self.retry_period.min(left)) => {}
                    () = stop.cancelled() => return Ok(()),
                    reason = self.stepped_down() => return Err(self.stepped_down_lost(reason)),
                }
            }
        }
    }

    /// Rides out an API server that could not be reached past the renew deadline: the fence is
    /// closed, the provider is told, and renewal is tried every retry period until it succeeds (the
    /// Lease was still this candidate's), the API server says another holds it, answers with an error
    /// waiting will not change, the provider steps down, or `stop` is cancelled.
    async fn ride_out(&self, stop: &CancellationToken) -> Result<RideOut, LeadershipLost> {
        self.fence.close();
        let started = Instant::now();
        *self.riding_out.lock() = Some((started, started));
        self.report_riding_out(true);
        tracing::warn!(
            lease = %format!("{}/{}", self.namespace, self.name),
            deadline = ?self.renew_deadline,
            "the lease was not renewed within the renew deadline (the API server could not be reached, or answered too late): writes stop, the provider keeps serving, and renewal goes on until the API server answers"
        );
        // The first attempt at once: a process that was itself frozen past its deadline (rather than
        // cut off) learns of a new holder now, not a retry period later.
        let mut wait = Duration::ZERO;
        let ended = loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => break Ok(RideOut::Stopped),
                reason = self.stepped_down() => break Err(self.stepped_down_lost(reason)),
            }
            wait = jittered(self.retry_period);
            // A step-down does not wait for an attempt that hangs on an API server that cannot be
            // reached: it ends leadership at once.
            let result = tokio::select! {
                result = self.attempt(self.renew_deadline) => result,
                () = stop.cancelled() => break Ok(RideOut::Stopped),
                reason = self.stepped_down() => break Err(self.stepped_down_lost(reason)),
            };
            if let Some((_, last)) = self.riding_out.lock().as_mut() {
                *last = Instant::now();
            }
            match result {
                // A renewal counts from when it was asked for: one that hung until the API server
                // came back may leave the fence open for a moment only. Renew again at once, until
                // the fence is open for a retry period at least.
                Ok(true)
                    if self
                        .fence
                        .valid_until()
                        .is_none_or(|until| until < Instant::now() + self.retry_period) =>
                {
                    wait = Duration::ZERO;
                    tracing::debug!("renewed by an answer that came late: renewing again");
                }
                Ok(true) => {
                    tracing::info!(
                        riding_out_for = ?started.elapsed(),
                        "the API server answers and the lease was still ours: renewed, writes resume"
                    );
                    break Ok(RideOut::Renewed);
                }
                Ok(false) => {
                    self.fence.close();
                    break Err(LeadershipLost::TakenOver {
                        namespace: self.namespace.clone(),
                        name: self.name.clone(),
                        riding_out_for: started.elapsed(),
                    });
                }
                Err(err) if err.unreachable() => {
                    tracing::debug!(error = %err, "still riding out: the API server cannot be reached");
                }
                // Another replica with the same rights is turned away as well: keep riding out (the
                // writes stay stopped) rather than hand a restarting API server's first answers the
                // traffic.
                Err(err) if err.turned_away() => {
                    tracing::warn!(error = %err, "still riding out: the API server turned the renewal away");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the API server answers but refused the renewal");
                    break Err(self.lost());
                }
            }
        };
        *self.riding_out.lock() = None;
        self.report_riding_out(false);
        ended
    }

    /// Waits until the provider steps down (never, for one that does not ride outages out).
    async fn stepped_down(&self) -> String {
        match &self.outage {
            Some((report, _)) => report.stepped_down().await,
            None => std::future::pending().await,
        }
    }

    /// Closes the fence for a provider that stepped down.
    fn stepped_down_lost(&self, reason: String) -> LeadershipLost {
        self.fence.close();
        LeadershipLost::SteppedDown { reason }
    }

    /// One acquire or renew attempt, given up after `within`. On success the fence opens for the renew
    /// deadline counted from the attempt's start.
    async fn attempt(&self, within: Duration) -> Result<bool, AttemptError> {
        let started = Instant::now();
        match tokio::time::timeout(within, self.try_acquire_or_renew()).await {
            Ok(Ok(true)) => {
                self.fence.allow_until(started + self.renew_deadline);
                // The renewal counts from when it was asked for, as the fence does: an answer that
                // came late (a slow API server, a wait for a rate-limit token) renewed nothing later.
                *self.last_renewal.lock() = Some(started);
                Ok(true)
            }
            Ok(Ok(false)) => Ok(false),
            Ok(Err(err)) => Err(AttemptError::Api(err)),
            Err(_) => Err(AttemptError::TimedOut(within)),
        }
    }

    /// Closes the fence and says why leadership is lost.
    fn lost(&self) -> LeadershipLost {
        self.fence.close();
        let last = *self.last_renewal.lock();
        LeadershipLost::NotRenewed {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            since_renewal: last.map(|at| at.elapsed()).unwrap_or_default(),
            deadline: self.renew_deadline,
        }
    }

    /// Gives the Lease up if this candidate holds it, so another replica can take over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(identity = %self.identity, "released the leader lease"),
            Err(err) => tracing::warn!(error = %err, "could not release the leader lease"),
        }
        *self.last_renewal.lock() = None;
    }

    /// The `leaderElection` health check: failing when this candidate leads but has not renewed for
    /// longer than the lease duration plus 20 s. While it rides out an outage, what counts is that it
    /// goes on trying: a restart would not bring the API server back, and would drop the provider's
    /// traffic.
    pub fn check(&self) -> Result<(), String> {
        if let Some((started, last_try)) = *self.riding_out.lock() {
            let since = last_try.elapsed();
            return if since > self.lease_duration + WATCHDOG_SLACK {
                Err(format!(
                    "riding out the API server's outage for {:?}, but no renewal was tried for {since:?}",
                    started.elapsed()
                ))
            } else {
                Ok(())
            };
        }
        let last = *self.last_renewal.lock();
        match last {
            Some(at) if at.elapsed() > self.lease_duration + WATCHDOG_SLACK => Err(format!(
                "failed election to renew leadership on lease {}/{}: last renewed {:?} ago",
                self.namespace,
                self.name,
                at.elapsed()
            )),
            _ => Ok(()),
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`: `Ok(true)` when this candidate now holds the Lease.
    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(whole_seconds(self.lease_duration)),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observe_lease(&lease);
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(err) => Err(err),
            };
        };

        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let observed_at = self.observe(&spec);
        let ours = holder == self.identity;
        if !holder.is_empty() && !ours {
            let duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
            if observed_at + duration > Instant::now() {
                return Ok(false); // held by another candidate, and renewed recently as far as we saw
            }
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(whole_seconds(self.lease_duration)),
            acquire_time: if ours {
                spec.acquire_time.clone()
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
            ..spec
        });
        // The resourceVersion in `lease` makes a concurrent change fail with a conflict.
        match self
            .api
            .replace(&lease.name_any(), &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observe_lease(&updated);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Records what the Lease says, returning when (locally) it last changed.
    fn observe(&self, spec: &LeaseSpec) -> Instant {
        let mut observed = self.observed.lock();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let renew_time = spec.renew_time.as_ref().map(|t| t.0);
        let transitions = spec.lease_transitions.unwrap_or(0);
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        match observed.as_ref() {
            Some(o)
                if o.holder == holder
                    && o.renew_time == renew_time
                    && o.transitions == transitions
                    && o.duration == duration =>
            {
                o.at
            }
            _ => {
                let at = Instant::now();
                *observed = Some(Observed {
                    holder,
                    renew_time,
                    transitions,
                    duration,
                    at,
                });
                at
            }
        }
    }

    fn observe_lease(&self, lease: &Lease) {
        if let Some(spec) = &lease.spec {
            self.observe(spec);
        }
    }
}

/// Why an acquire or renew attempt failed.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("no answer from the API server within {0:?}")]
    TimedOut(Duration),
}

impl AttemptError {
    /// Whether the API server could not be reached (rather than answered with an error).
    fn unreachable(&self) -> bool {
        match self {
            AttemptError::Api(err) => super::unreachable(err),
            AttemptError::TimedOut(_) => true,
        }
    }

    /// Whether the API server answered but turned the request away (401, 403, 429): what a restarted
    /// API server answers until its authorizer's caches are filled (seen on `hack/cluster`: 403 on the
    /// Lease for the first requests after a restart). It says nothing of who holds the Lease.
    fn turned_away(&self) -> bool {
        matches!(self, AttemptError::Api(kube::Error::Api(status)) if matches!(status.code, 401 | 403 | 429))
    }
}

/// `<hostname>_<random UUID>`, as upstream names candidates.
pub fn new_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_host_and_uuid() {
        let a = new_identity();
        let (host, id) = a.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        assert_eq!(id.len(), 36);
        assert_ne!(a, new_identity());
    }

    #[test]
    fn a_refusal_turns_the_renewal_away_and_says_nothing_of_the_holder() {
        let status = |code: u16| {
            AttemptError::Api(kube::Error::Api(Box::new(
                kube::core::Status::failure("refused", "Forbidden").with_code(code),
            )))
        };
        for code in [401, 403, 429] {
            assert!(status(code).turned_away(), "{code}");
            assert!(!status(code).unreachable(), "{code}");
        }
        for code in [404, 409, 422, 500] {
            assert!(!status(code).turned_away(), "{code}");
        }
        assert!(!AttemptError::TimedOut(Duration::from_secs(1)).turned_away());
    }

    #[test]
    fn jitter_stays_within_a_fifth_of_the_period() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(2));
            assert!(
                d >= Duration::from_secs(2) && d <= Duration::from_millis(2400),
                "{d:?}"
            );
        }
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(15)), 15);
    }
}
