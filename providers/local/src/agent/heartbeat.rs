//! The agents' heartbeats: each agent renews a Lease of its own (`local-agent-<node>`, in the agents'
//! namespace) every renew interval, and every agent watches all of them. A node whose Lease has not
//! changed for its `leaseDurationSeconds` is taken as gone, and its VIPs move.
//!
//! Liveness is judged by when *this* agent saw a Lease change (as client-go's leader election does),
//! not by comparing its `renewTime` with this machine's clock: the nodes' clocks may disagree by more
//! than the heartbeat. Only a Lease seen for the first time is aged by its `renewTime`, so that an
//! agent starting next to a dead node's Lease does not take it for alive.
//!
//! An agent also fences itself: when its own renewals have failed for the heartbeat's duration (it
//! cannot reach the API server, so the others take its node for gone and announce its VIPs), it stops
//! announcing until a renewal succeeds again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams},
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::AgentMetrics;
use crate::instances::lock;

/// The label every agent's Lease carries (what the agents watch).
pub(crate) const LEASE_LABEL: (&str, &str) = ("app.kubernetes.io/name", "local-agent");

/// The annotation of an agent's Lease naming the `loadBalancerClass` it serves (none: the Services
/// without a class), so that the manager can tell whether any live agent serves a Service.
pub(crate) const CLASS_ANNOTATION: &str = "local.ccm.rs/load-balancer-class";

/// The annotation of an agent's Lease naming the address its membership protocol listens on (absent:
/// membership is off there, and its Lease alone says whether it is alive).
pub(crate) const MEMBERSHIP_ANNOTATION: &str = "local.ccm.rs/membership";

/// The annotation of an agent's Lease saying how many other agents its membership protocol hears now.
pub(crate) const MEMBERS_HEARD_ANNOTATION: &str = "local.ccm.rs/membership-peers";

/// What an agent's Lease says of its membership protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Advertised {
    /// Where it listens.
    pub address: std::net::SocketAddr,
    /// How many other agents it hears.
    pub hears: usize,
}

/// What each agent's Lease says of its membership protocol, by node (those that speak it; a value
/// that does not parse counts as not speaking it).
pub(crate) fn advertised(leases: &[Arc<Lease>]) -> BTreeMap<String, Advertised> {
    leases
        .iter()
        .filter_map(|lease| {
            let node = lease.spec.as_ref()?.holder_identity.clone()?;
            let annotations = lease.metadata.annotations.as_ref()?;
            let address = annotations.get(MEMBERSHIP_ANNOTATION)?.parse().ok()?;
            let hears = annotations
                .get(MEMBERS_HEARD_ANNOTATION)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            Some((node, Advertised { address, hears }))
        })
        .collect()
}

/// The field manager of the agents' writes.
pub(crate) const FIELD_MANAGER: &str = "local-agent";

/// The name of the Lease of the agent of `node`.
pub(crate) fn lease_name(node: &str) -> String {
    format!("local-agent-{node}")
}

/// What was seen of one agent's Lease.
#[derive(Debug, Clone)]
struct Seen {
    renew_time: Option<Timestamp>,
    /// When this agent saw `renew_time` take its value (or, first seen, when it was renewed by it).
    changed: Instant,
    duration: Duration,
}

/// The agents this agent takes as alive, from the Leases it watches.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    by_node: BTreeMap<String, Seen>,
}

impl Liveness {
    /// Takes in the Leases as they are now (`now` on this process's monotonic clock, `wall` its wall
    /// clock): a Lease whose renew time changed is fresh from `now`; one seen the first time is as old
    /// as its renew time says (by `wall`); one gone is forgotten (its node is not alive).
    pub(crate) fn observe(&mut self, leases: &[Arc<Lease>], now: Instant, wall: Timestamp) {
        let mut present = BTreeSet::new();
        for lease in leases {
            let Some(spec) = lease.spec.as_ref() else {
                continue;
            };
            let Some(node) = spec.holder_identity.clone().filter(|h| !h.is_empty()) else {
                continue; // released
            };
            let renew_time = spec.renew_time.as_ref().map(|t| t.0);
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            present.insert(node.clone());
            match self.by_node.get_mut(&node) {
                Some(seen) if seen.renew_time == renew_time => seen.duration = duration,
                Some(seen) => {
                    seen.renew_time = renew_time;
                    seen.changed = now;
                    seen.duration = duration;
                }
                None => {
                    let age = renew_time
                        .and_then(|t| Duration::try_from(wall.duration_since(t)).ok())
                        .unwrap_or(Duration::MAX);
                    let changed = now.checked_sub(age.min(duration)).unwrap_or(now);
                    self.by_node.insert(
                        node,
                        Seen {
                            renew_time,
                            changed,
                            duration,
                        },
                    );
                }
            }
        }
        self.by_node.retain(|node, _| present.contains(node));
    }

    /// The nodes whose agent renewed its Lease within its duration, as of `now`.
    pub(crate) fn alive(&self, now: Instant) -> BTreeSet<String> {
        self.by_node
            .iter()
            .filter(|(_, seen)| now.saturating_duration_since(seen.changed) < seen.duration)
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// The next instant some Lease's time runs out (when to look again without any change).
    pub(crate) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.by_node
            .values()
            .map(|seen| seen.changed + seen.duration)
            .filter(|at| *at > now)
            .min()
    }
}

/// What the agent's looks judge by in one Lease, beside its liveness: who holds it, for how long, and
/// what its annotations say (the class served, the membership address, how many it hears).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Judged {
    holder: Option<String>,
    duration: Option<i32>,
    annotations: Option<BTreeMap<String, String>>,
}

/// The Leases as the agent's Lease watch sees them: each change is observed as it arrives (liveness is
/// judged by when a change was seen), and only a change to what the looks judge by asks for a look.
/// A live agent renewing its Lease (several times a second in all) asks for none: a look goes over
/// every Service, and at thousands of them looks at that rate kept a tenth of a core busy on every
/// node for nothing. The looks wake by themselves when a Lease runs out ([`Liveness::next_expiry`]).
#[derive(Debug, Default)]
pub(crate) struct LeaseView {
    liveness: Liveness,
    judged: BTreeMap<String, Judged>,
}

impl LeaseView {
    /// Takes in the Leases as they are after a change (as [`Liveness::observe`]); returns whether the
    /// looks must see it: an agent became alive or is gone, or a Lease's holder, duration or
    /// annotations changed.
    pub(crate) fn observe(&mut self, leases: &[Arc<Lease>], now: Instant, wall: Timestamp) -> bool {
        let alive_before = self.liveness.alive(now);
        self.liveness.observe(leases, now, wall);
        let judged: BTreeMap<String, Judged> = leases
            .iter()
            .map(|lease| {
                let spec = lease.spec.as_ref();
                (
                    lease.metadata.name.clone().unwrap_or_default(),
                    Judged {
                        holder: spec.and_then(|s| s.holder_identity.clone()),
                        duration: spec.and_then(|s| s.lease_duration_seconds),
                        annotations: lease.metadata.annotations.clone(),
                    },
                )
            })
            .collect();
        let changed = judged != self.judged || self.liveness.alive(now) != alive_before;
        self.judged = judged;
        changed
    }

    /// The nodes whose agent is alive as of `now` (see [`Liveness::alive`]).
    pub(crate) fn alive(&self, now: Instant) -> BTreeSet<String> {
        self.liveness.alive(now)
    }

    /// The next instant some Lease runs out (see [`Liveness::next_expiry`]).
    pub(crate) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.liveness.next_expiry(now)
    }
}

/// This agent's own Lease.
pub(crate) struct Heartbeat {
    api: Api<Lease>,
    node: String,
    duration: Duration,
    class: Option<String>,
    /// This agent's membership protocol: its address, and the view whose size the Lease reports.
    membership: Option<(
        std::net::SocketAddr,
        Arc<std::sync::Mutex<super::membership::View>>,
    )>,
}

impl Heartbeat {
    pub(crate) fn new(
        api: Api<Lease>,
        node: &str,
        duration: Duration,
        class: Option<&str>,
    ) -> Self {
        Self {
            api,
            node: node.to_owned(),
            duration,
            class: class.map(str::to_owned),
            membership: None,
        }
    }

    /// Says in the Lease where this agent's membership protocol listens and how many it hears.
    pub(crate) fn with_membership(
        mut self,
        address: std::net::SocketAddr,
        view: Arc<std::sync::Mutex<super::membership::View>>,
    ) -> Self {
        self.membership = Some((address, view));
        self
    }

    /// Renews the Lease (server-side apply: creates it the first time).
    pub(crate) async fn renew(&self) -> Result<(), kube::Error> {
        let name = lease_name(&self.node);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(LEASE_LABEL.0.to_owned(), LEASE_LABEL.1.to_owned())].into()),
                annotations: Some(self.annotations()).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX),
                ),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        // k8s-openapi writes `apiVersion` and `kind`, which an apply needs.
        self.api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
            .map(drop)
    }

    fn annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::new();
        if let Some(class) = &self.class {
            annotations.insert(CLASS_ANNOTATION.to_owned(), class.clone());
        }
        if let Some((address, view)) = &self.membership {
            let hears = crate::instances::lock(view).members.len();
            annotations.insert(MEMBERSHIP_ANNOTATION.to_owned(), address.to_string());
            annotations.insert(MEMBERS_HEARD_ANNOTATION.to_owned(), hears.to_string());
        }
        annotations
    }

    /// Deletes the Lease: the other agents take this node's VIPs at once rather than after the
    /// heartbeat's duration.
    pub(crate) async fn release(&self) {
        let name = lease_name(&self.node);
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(lease = %name, "heartbeat Lease deleted"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                tracing::warn!(lease = %name, error = %err, "cannot delete the heartbeat Lease; the other agents take this node's VIPs when it expires");
            }
        }
    }
}

/// Renews the heartbeat every `interval` until `shutdown`, recording each success in `renewed`;
/// returns the heartbeat (for its release).
pub(super) async fn beat(
    heartbeat: Heartbeat,
    interval: Duration,
    renewed: Arc<Mutex<Instant>>,
    changed: Arc<Notify>,
    metrics: AgentMetrics,
    shutdown: CancellationToken,
) -> Heartbeat {
    let mut failing = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return heartbeat,
            () = tokio::time::sleep(interval) => {}
        }
        match heartbeat.renew().await {
            Ok(()) => {
                *lock(&renewed) = Instant::now();
                if failing {
                    tracing::info!("heartbeat renewed again");
                    failing = false;
                    changed.notify_one();
                }
            }
            Err(err) => {
                metrics.heartbeat_failures.inc();
                if !failing {
                    tracing::warn!(error = %err, "cannot renew the heartbeat Lease; this node stops announcing if it cannot for the heartbeat's duration");
                }
                failing = true;
                changed.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(node: &str, renewed: Option<Timestamp>, seconds: i32) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(node)),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(node.to_owned()),
                lease_duration_seconds: Some(seconds),
                renew_time: renewed.map(MicroTime),
                ..Default::default()
            }),
        })
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_lease_is_alive_while_it_changes_and_for_its_duration_after() {
        let start = Instant::now();
        let wall = Timestamp::now();
        let mut liveness = Liveness::default();
        liveness.observe(&[lease("a", Some(wall), 3)], start, wall);
        assert_eq!(liveness.alive(start), names(&["a"]));
        assert_eq!(
            liveness.next_expiry(start),
            Some(start + Duration::from_secs(3))
        );
        // Unchanged for 3 s: gone.
        assert!(liveness.alive(start + Duration::from_secs(3)).is_empty());
        // Renewed at 2 s: alive until 5 s, whatever its clock says.
        let skewed = wall - Duration::from_secs(3600);
        liveness.observe(
            &[lease("a", Some(skewed), 3)],
            start + Duration::from_secs(2),
            wall,
        );
        assert_eq!(
            liveness.alive(start + Duration::from_millis(4900)),
            names(&["a"])
        );
        assert!(liveness.alive(start + Duration::from_secs(5)).is_empty());
    }

    #[test]
    fn a_lease_first_seen_is_aged_by_its_renew_time_and_a_gone_one_is_forgotten() {
        let now = Instant::now() + Duration::from_secs(60);
        let wall = Timestamp::now();
        let mut liveness = Liveness::default();
        liveness.observe(
            &[
                lease("fresh", Some(wall - Duration::from_secs(1)), 3),
                lease("stale", Some(wall - Duration::from_secs(30)), 3),
                lease("never", None, 3),
            ],
            now,
            wall,
        );
        assert_eq!(liveness.alive(now), names(&["fresh"]));
        assert_eq!(
            liveness.alive(now + Duration::from_millis(1900)),
            names(&["fresh"])
        );
        assert!(liveness.alive(now + Duration::from_secs(2)).is_empty());
        // Deleted (a graceful stop): not alive at once.
        liveness.observe(&[lease("fresh", Some(wall), 3)], now, wall);
        assert_eq!(liveness.alive(now), names(&["fresh"]));
        liveness.observe(&[], now, wall);
        assert!(liveness.alive(now).is_empty());
    }

    fn annotated(node: &str, renewed: Timestamp, key: &str, value: &str) -> Arc<Lease> {
        let mut lease = (*lease(node, Some(renewed), 3)).clone();
        lease.metadata.annotations = Some([(key.to_owned(), value.to_owned())].into());
        Arc::new(lease)
    }

    #[test]
    fn only_what_the_looks_judge_by_asks_for_a_look() {
        let start = Instant::now();
        let wall = Timestamp::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let renewed = |ms: i64| wall + k8s_openapi::jiff::SignedDuration::from_millis(ms);
        let mut view = LeaseView::default();
        // (what the Leases are, when, whether a look is asked for, who is alive then)
        type Step = (Vec<Arc<Lease>>, u64, bool, &'static [&'static str]);
        let steps: Vec<Step> = vec![
            // First seen: a new agent.
            (vec![lease("a", Some(renewed(0)), 3)], 0, true, &["a"]),
            // Renewed while alive: nothing the looks judge by changed, but it lives on.
            (
                vec![lease("a", Some(renewed(1000)), 3)],
                1000,
                false,
                &["a"],
            ),
            (
                vec![lease("a", Some(renewed(2000)), 3)],
                2000,
                false,
                &["a"],
            ),
            // A second agent.
            (
                vec![
                    lease("a", Some(renewed(2000)), 3),
                    lease("b", Some(renewed(2500)), 3),
                ],
                2500,
                true,
                &["a", "b"],
            ),
            // b renews, a ran out at 5 s: this change is observed at 5.4 s, after a's expiry, and
            // the looks woke for that expiry by themselves; a renewal of b alone asks for no look.
            (
                vec![
                    lease("a", Some(renewed(2000)), 3),
                    lease("b", Some(renewed(5400)), 3),
                ],
                5400,
                false,
                &["b"],
            ),
            // a comes back: alive again.
            (
                vec![
                    lease("a", Some(renewed(6000)), 3),
                    lease("b", Some(renewed(5400)), 3),
                ],
                6000,
                true,
                &["a", "b"],
            ),
            // An annotation changed (how many b's membership hears).
            (
                vec![
                    lease("a", Some(renewed(6000)), 3),
                    annotated("b", renewed(6500), MEMBERS_HEARD_ANNOTATION, "1"),
                ],
                6500,
                true,
                &["a", "b"],
            ),
            // Its duration changed.
            (
                vec![
                    lease("a", Some(renewed(7000)), 5),
                    annotated("b", renewed(6500), MEMBERS_HEARD_ANNOTATION, "1"),
                ],
                7000,
                true,
                &["a", "b"],
            ),
            // b deleted (a graceful stop).
            (vec![lease("a", Some(renewed(7500)), 5)], 7500, true, &["a"]),
        ];
        for (i, (leases, ms, asks, alive)) in steps.into_iter().enumerate() {
            let wall_then = renewed(i64::try_from(ms).unwrap());
            assert_eq!(view.observe(&leases, at(ms), wall_then), asks, "step {i}");
            assert_eq!(view.alive(at(ms)), names(alive), "step {i}");
        }
        assert_eq!(view.next_expiry(at(7500)), Some(at(12500)));
    }
}
