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
//!   (upstream's manager waits out the lease instead).

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

use super::{options::LeaderElectionOptions, write_fence::WriteFence};

/// How long past the lease duration the watchdog tolerates a leader that has not renewed (upstream's
/// `leaderElection` health check).
const WATCHDOG_SLACK: Duration = Duration::from_secs(20);

/// The leader lost its lease.
#[derive(Debug, thiserror::Error)]
#[error(
    "leaderelection lost: lease {namespace}/{name} was not renewed within the renew deadline of {deadline:?} (last renewed {:.1}s ago)",
    since_renewal.as_secs_f64()
)]
pub struct LeadershipLost {
    namespace: String,
    name: String,
    since_renewal: Duration,
    deadline: Duration,
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
}

fn whole_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs_f64().ceil() as i64).unwrap_or(i32::MAX)
}

/// `period` plus up to 20 % of jitter, so candidates started together do not poll in lockstep.
/// (client-go jitters by up to 120 %, which only delays noticing an expired leader.)
fn jittered(period: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    period + period.mul_f64(0.2 * f64::from(nanos % 1000) / 1000.0)
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
                Err(err) => tracing::warn!(error = %err, "error retrieving resource lock"),
            }
            // Poll every retry period, but never sleep past the moment the holder's lease runs out.
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
    /// lost (`Err`): no renewal succeeded within the renew deadline of the last one. The write fence
    /// is closed before this returns an error.
    pub async fn keep_renewing(&self, stop: &CancellationToken) -> Result<(), LeadershipLost> {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.retry_period) => {}
                () = stop.cancelled() => return Ok(()),
            }
            loop {
                let Some(deadline) = self
                    .fence
                    .valid_until()
                    .filter(|deadline| *deadline > Instant::now())
                else {
                    return Err(self.lost());
                };
                match self.attempt(deadline - Instant::now()).await {
                    Ok(true) => break,
                    // Held by another candidate, or a conflicting write: as upstream, keep trying
                    // until the deadline (the fence closes then in any case).
                    Ok(false) => tracing::warn!("failed to renew lease: held by another candidate"),
                    Err(err) => tracing::warn!(error = %err, "failed to renew lease"),
                }
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    () = tokio::time::sleep(self.retry_period.min(left)) => {}
                    () = stop.cancelled() => return Ok(()),
                }
            }
        }
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
        LeadershipLost {
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
    /// longer than the lease duration plus 20 s.
    pub fn check(&self) -> Result<(), String> {
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
