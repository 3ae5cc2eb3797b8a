//! When the agent looks again. A look goes over every Service this agent serves, so it should happen
//! when something it judges by changed, not at every write in the cluster: at 5,000 Services, looks on
//! every heartbeat renewal (three a second with three agents) kept a tenth of a core busy on every node
//! at rest. Each watch therefore asks for a look only for what concerns this agent's Services
//! ([`ServiceChanges`], [`slice_concerns`]; the Leases through [`LeaseView`]), and a wait for a Lease to
//! run out ends in a look only when someone's liveness did change ([`next_look`]).

use std::{
    collections::{BTreeSet, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{heartbeat::LeaseView, plan::LABEL_SERVICE_NAME};
use crate::instances::lock;

/// A change a watch delivered.
#[derive(Debug, Clone, Copy)]
pub(super) enum Touched<'a, K> {
    /// Created or changed (or listed).
    Applied(&'a K),
    /// Deleted.
    Deleted(&'a K),
    /// A fresh list replaced the store (after a watch that broke off): objects deleted meanwhile
    /// are gone without a deletion of their own.
    Relisted,
}

/// Whether the agent of `class` serves `service` (its class, and a load balancer).
pub(super) fn serves(service: &Service, class: Option<&str>) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer")
            && spec.load_balancer_class.as_deref() == class
    })
}

/// Which Service changes concern the agent: those of the Services it serves, and of those it served
/// until this change (a type changed away from LoadBalancer). Services of another class (MetalLB's,
/// another agent set's) ask for no look.
#[derive(Debug)]
pub(super) struct ServiceChanges {
    class: Option<String>,
    served: HashSet<ObjectRef<Service>>,
}

impl ServiceChanges {
    pub(super) fn new(class: Option<&str>) -> Self {
        Self {
            class: class.map(str::to_owned),
            served: HashSet::new(),
        }
    }

    /// Whether this change asks for a look.
    pub(super) fn concerns(&mut self, touched: Touched<'_, Service>) -> bool {
        match touched {
            Touched::Applied(service) => {
                let key = ObjectRef::from_obj(service);
                if serves(service, self.class.as_deref()) {
                    self.served.insert(key);
                    true
                } else {
                    self.served.remove(&key)
                }
            }
            Touched::Deleted(service) => {
                let was = self.served.remove(&ObjectRef::from_obj(service));
                was || serves(service, self.class.as_deref())
            }
            Touched::Relisted => true,
        }
    }
}

/// Whether a change to `slice` asks for a look: it belongs to a Service the agent serves, or to one
/// `services` does not know (yet).
pub(super) fn slice_concerns(
    touched: Touched<'_, EndpointSlice>,
    services: &Store<Service>,
    class: Option<&str>,
) -> bool {
    let slice = match touched {
        Touched::Applied(slice) | Touched::Deleted(slice) => slice,
        Touched::Relisted => return true,
    };
    let owner = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_SERVICE_NAME));
    let (Some(owner), Some(namespace)) = (owner, slice.metadata.namespace.as_deref()) else {
        return true;
    };
    services
        .get(&ObjectRef::new(owner).within(namespace))
        .is_none_or(|service| serves(&service, class))
}

/// Why [`next_look`] returned.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Woken {
    /// Time for a look.
    Look,
    /// The agent is stopping.
    Stop,
}

/// Waits for the next look: a change asked for one (which first waits `pace`, so that a burst's
/// changes gather into one look), `due` came (a retry, the membership's timers, the idle look), or a
/// Lease ran out and who is alive is no longer `alive` (what the last look saw). A Lease that ran out
/// after its agent renewed it meanwhile only moves the wait on.
pub(super) async fn next_look(
    changed: &Notify,
    shutdown: &CancellationToken,
    leases: &Mutex<LeaseView>,
    alive: &BTreeSet<String>,
    due: Instant,
    pace: Duration,
) -> Woken {
    loop {
        let now = Instant::now();
        if now >= due {
            return Woken::Look;
        }
        let until = lock(leases)
            .next_expiry(now)
            .map_or(due, |expiry| expiry.min(due));
        tokio::select! {
            () = shutdown.cancelled() => return Woken::Stop,
            () = changed.notified() => {
                return tokio::select! {
                    () = shutdown.cancelled() => Woken::Stop,
                    () = tokio::time::sleep(pace) => Woken::Look,
                };
            }
            () = tokio::time::sleep(until.saturating_duration_since(now)) => {
                if lock(leases).alive(Instant::now()) != *alive {
                    return Woken::Look;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use k8s_openapi::{
        api::{
            coordination::v1::{Lease, LeaseSpec},
            core::v1::ServiceSpec,
        },
        apimachinery::pkg::apis::meta::v1::MicroTime,
        jiff::Timestamp,
    };
    use kube::{api::ObjectMeta, runtime::reflector};

    use super::*;

    fn service(name: &str, type_: &str, class: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.to_owned()),
                load_balancer_class: class.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_services_the_agent_serves_ask_for_a_look() {
        let ours = service("web", "LoadBalancer", None);
        let metallb = service("other", "LoadBalancer", Some("metallb"));
        let cluster_ip = service("web", "ClusterIP", None);
        let mut changes = ServiceChanges::new(None);
        // (the change, whether it asks for a look)
        let steps = [
            (Touched::Applied(&metallb), false),
            (Touched::Deleted(&metallb), false),
            (Touched::Applied(&ours), true),
            // No longer a load balancer: the agent must withdraw it, once.
            (Touched::Applied(&cluster_ip), true),
            (Touched::Applied(&cluster_ip), false),
            (Touched::Deleted(&cluster_ip), false),
            (Touched::Applied(&ours), true),
            (Touched::Deleted(&ours), true),
            (Touched::Relisted, true),
        ];
        for (i, (touched, asks)) in steps.into_iter().enumerate() {
            assert_eq!(changes.concerns(touched), asks, "step {i}");
        }
        // An agent of class "metallb" sees it the other way round.
        let mut changes = ServiceChanges::new(Some("metallb"));
        assert!(changes.concerns(Touched::Applied(&metallb)));
        assert!(!changes.concerns(Touched::Applied(&ours)));
    }

    #[test]
    fn a_slice_asks_for_a_look_when_its_service_is_served_or_unknown() {
        let (store, mut writer) = reflector::store::<Service>();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(service(
            "web",
            "LoadBalancer",
            None,
        )));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(service(
            "other",
            "LoadBalancer",
            Some("metallb"),
        )));
        let slice = |owner: Option<&str>| EndpointSlice {
            metadata: ObjectMeta {
                name: Some("s".to_owned()),
                namespace: Some("default".to_owned()),
                labels: owner.map(|o| [(LABEL_SERVICE_NAME.to_owned(), o.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let (web, other, unknown, unowned) = (
            slice(Some("web")),
            slice(Some("other")),
            slice(Some("new")),
            slice(None),
        );
        assert!(slice_concerns(Touched::Applied(&web), &store, None));
        assert!(slice_concerns(Touched::Deleted(&web), &store, None));
        assert!(!slice_concerns(Touched::Applied(&other), &store, None));
        assert!(slice_concerns(
            Touched::Applied(&other),
            &store,
            Some("metallb")
        ));
        assert!(slice_concerns(Touched::Applied(&unknown), &store, None));
        assert!(slice_concerns(Touched::Applied(&unowned), &store, None));
        assert!(slice_concerns(Touched::Relisted, &store, None));
    }

    fn lease(node: &str, renewed: Timestamp) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta {
                name: Some(format!("local-agent-{node}")),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(node.to_owned()),
                lease_duration_seconds: Some(1),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
        })
    }

    /// A Lease renewed while the agent waits moves the wait on without a look; once its renewals stop
    /// and it runs out, the agent looks.
    #[tokio::test]
    async fn renewals_do_not_wake_the_agent_but_a_lease_that_runs_out_does() {
        let leases = Arc::new(Mutex::new(LeaseView::default()));
        lock(&leases).observe(
            &[lease("a", Timestamp::now())],
            Instant::now(),
            Timestamp::now(),
        );
        let alive = lock(&leases).alive(Instant::now());
        assert_eq!(alive, BTreeSet::from(["a".to_owned()]));
        let (changed, shutdown) = (Notify::new(), CancellationToken::new());
        let renewing = Arc::new(AtomicBool::new(true));
        // Renewed every 300 ms for 2.5 s (2.5 times its duration), then no more.
        let renewer = {
            let (leases, renewing) = (leases.clone(), renewing.clone());
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_millis(2500);
                while Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let asks = lock(&leases).observe(
                        &[lease("a", Timestamp::now())],
                        Instant::now(),
                        Timestamp::now(),
                    );
                    assert!(!asks, "a renewal of a live agent asks for no look");
                }
                renewing.store(false, Ordering::SeqCst);
            })
        };
        let due = Instant::now() + Duration::from_secs(30);
        let woken = next_look(&changed, &shutdown, &leases, &alive, due, Duration::ZERO).await;
        assert_eq!(woken, Woken::Look);
        assert!(
            !renewing.load(Ordering::SeqCst),
            "the agent looked while the Lease was still being renewed"
        );
        assert!(lock(&leases).alive(Instant::now()).is_empty());
        renewer.await.unwrap();

        // A change asks for a look at once (after the pace); a stop ends the wait.
        let nobody = BTreeSet::new();
        let wait = || next_look(&changed, &shutdown, &leases, &nobody, due, Duration::ZERO);
        changed.notify_one();
        assert_eq!(wait().await, Woken::Look);
        shutdown.cancel();
        let woken = wait().await;
        assert_eq!(woken, Woken::Stop);
    }
}
