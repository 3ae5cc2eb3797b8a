//! Pure rules of the service-lb controller: which Services it owns, when one needs a cloud sync, what a
//! sync does ([`plan_sync`], executed by the I/O code in `sync.rs`), and the patches it writes.

use k8s_openapi::{
    api::core::v1::{LoadBalancerStatus, Service, ServicePort},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use serde_json::{Value, json};

use super::classes::ServedClasses;

/// The finalizer that keeps a Service until its load balancer is gone.
pub(crate) const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// `type: LoadBalancer` of a class this manager serves (upstream: without a `loadBalancerClass`; a class
/// this manager does not serve means another implementation owns it).
pub(crate) fn wants_load_balancer(service: &Service, served: &ServedClasses) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer")
            && served.serves(spec.load_balancer_class.as_deref())
    })
}

/// `type: LoadBalancer` of a class this manager does not serve: another implementation's, never touched.
pub(crate) fn served_elsewhere(service: &Service, served: &ServedClasses) -> bool {
    is_load_balancer_type(service) && !wants_load_balancer(service, served)
}

/// Whether the Service carries our finalizer.
pub(crate) fn has_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

fn is_load_balancer_type(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// Has the finalizer and is being deleted or no longer of type LoadBalancer. (Upstream quirk kept: a
/// Service that stays a LoadBalancer but gained a class keeps its finalizer.)
pub(crate) fn needs_cleanup(service: &Service) -> bool {
    has_finalizer(service)
        && (service.metadata.deletion_timestamp.is_some() || !is_load_balancer_type(service))
}

fn ports_differ(old: &[ServicePort], new: &[ServicePort]) -> bool {
    old.len() != new.len()
        || old.iter().zip(new).any(|(a, b)| {
            a.name != b.name
                || a.protocol != b.protocol
                || a.port != b.port
                || a.node_port != b.node_port
                || a.target_port != b.target_port
                || a.app_protocol != b.app_protocol
        })
}

/// Upstream's `needsUpdate`: whether a change between two versions of a Service matters to its load
/// balancer. Status and other spec fields do not, nor labels, except those of `label_keys` (the
/// provider's [`cloud_provider::LoadBalancer::service_label_keys`]; upstream looks at no label).
pub(crate) fn needs_update(
    old: &Service,
    new: &Service,
    served: &ServedClasses,
    label_keys: &[String],
) -> bool {
    let (was, is) = (
        wants_load_balancer(old, served),
        wants_load_balancer(new, served),
    );
    if !was && !is {
        return false;
    }
    if was != is {
        return true;
    }
    let (Some(o), Some(n)) = (old.spec.as_ref(), new.spec.as_ref()) else {
        return true;
    };
    let ip_families =
        |s: &k8s_openapi::api::core::v1::ServiceSpec| s.ip_families.as_ref().map_or(0, Vec::len);
    o.load_balancer_source_ranges != n.load_balancer_source_ranges
        || ports_differ(
            o.ports.as_deref().unwrap_or_default(),
            n.ports.as_deref().unwrap_or_default(),
        )
        || o.session_affinity != n.session_affinity
        || o.session_affinity_config != n.session_affinity_config
        || o.load_balancer_ip != n.load_balancer_ip
        || o.external_ips.as_deref().unwrap_or_default()
            != n.external_ips.as_deref().unwrap_or_default()
        || old.metadata.annotations != new.metadata.annotations
        || old.metadata.uid != new.metadata.uid
        || o.external_traffic_policy != n.external_traffic_policy
        || o.health_check_node_port != n.health_check_node_port
        || ip_families(o) != ip_families(n)
        || label_keys.iter().any(|key| {
            let label = |s: &Service| s.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned();
            label(old) != label(new)
        })
}

/// Whether `new` is `old` as far as its load balancer goes: the same Service (UID), as much being
/// deleted, and no change [`needs_update`] sees (status, other labels and other metadata aside).
pub(crate) fn changes_nothing_that_matters(
    old: &Service,
    new: &Service,
    served: &ServedClasses,
    label_keys: &[String],
) -> bool {
    old.metadata.uid == new.metadata.uid
        && old.metadata.deletion_timestamp.is_some() == new.metadata.deletion_timestamp.is_some()
        && has_finalizer(old) == has_finalizer(new)
        && !needs_update(old, new, served, label_keys)
}

/// The current `status.loadBalancer`.
pub(crate) fn current_status(service: &Service) -> LoadBalancerStatus {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone())
        .unwrap_or_default()
}

/// Upstream compares only `ingress` (an absent and an empty list are equal).
pub(crate) fn ingress_equal(a: &LoadBalancerStatus, b: &LoadBalancerStatus) -> bool {
    a.ingress.as_deref().unwrap_or_default() == b.ingress.as_deref().unwrap_or_default()
}

/// The finalizers with ours added, or `None` when it is there.
pub(crate) fn with_finalizer(service: &Service) -> Option<Vec<String>> {
    if has_finalizer(service) {
        return None;
    }
    let mut finalizers = service.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(FINALIZER.to_owned());
    Some(finalizers)
}

/// The finalizers without ours, or `None` when it is not there.
pub(crate) fn without_finalizer(service: &Service) -> Option<Vec<String>> {
    if !has_finalizer(service) {
        return None;
    }
    Some(
        service
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect(),
    )
}

/// A merge patch of the finalizer list, guarded by the Service's `resourceVersion` so other finalizers
/// added meanwhile are never dropped (a conflict makes the caller re-read and retry).
pub(crate) fn finalizers_patch(finalizers: &[String], resource_version: &str) -> Value {
    json!({ "metadata": { "resourceVersion": resource_version, "finalizers": finalizers } })
}

/// The status patch that publishes the load balancer's address (`None`: not written) and the Service's
/// conditions (`None`: not written; the list is whole, as a merge patch replaces lists).
pub(crate) fn status_patch(
    ingress: Option<&LoadBalancerStatus>,
    conditions: Option<&[Condition]>,
) -> Value {
    let mut status = serde_json::Map::new();
    if let Some(ingress) = ingress {
        status.insert(
            "loadBalancer".to_owned(),
            json!({ "ingress": ingress.ingress.clone().unwrap_or_default() }),
        );
    }
    if let Some(conditions) = conditions {
        status.insert("conditions".to_owned(), json!(conditions));
    }
    json!({ "status": status })
}

/// What the controller remembers of the last Service of this name it handled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastSync<'a> {
    /// That Service, as it was last seen.
    pub(crate) service: &'a Service,
    /// Its last sync completed (a failed sync, or a failed host update after a node change, clears it).
    pub(crate) synced: bool,
}

/// What becomes of a remembered Service of the same name but another UID: it was deleted and re-created
/// without our finalizer, so the old one is cleaned up first, as upstream's deletion path does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replaced {
    /// It wanted a load balancer: delete that, then forget it.
    DeleteLoadBalancer,
    /// It wanted none: forget it.
    Forget,
}

/// What a sync does with the Service itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// It does not want a load balancer from us and never had one: forget it. No cloud call, no write.
    Forget,
    /// Nothing that matters changed since the last good sync (e.g. our own status write): remember this
    /// version. No cloud call, no event, no write.
    Nothing,
    /// Ensure its load balancer, adding the finalizer first when it is missing (no cloud load balancer
    /// may exist without it); then publish the status if it changed ([`status_after_ensure`]).
    Ensure {
        /// The finalizer is missing.
        add_finalizer: bool,
    },
    /// It had a load balancer from us and no longer wants one (type changed away from LoadBalancer, a
    /// `loadBalancerClass` set, being deleted): delete the load balancer if the cloud has one, forget
    /// the Service, remove the finalizer, and clear the published status.
    CleanUp {
        /// The finalizer is there to remove.
        remove_finalizer: bool,
        /// A load balancer status is published and must be cleared.
        clear_status: bool,
    },
}

/// What a sync does: the remembered Service it replaces (if any) first, then the Service itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyncPlan {
    /// A remembered Service of this name with another UID, to clean up first.
    pub(crate) replaced: Option<Replaced>,
    /// What to do with the Service.
    pub(crate) decision: Decision,
}

/// Decides what a sync of `service` does, given what the controller remembers of the last Service of
/// its name (`last`) and the classes it serves. Pure: the caller executes the plan.
pub(crate) fn plan_sync(
    service: &Service,
    last: Option<LastSync<'_>>,
    served: &ServedClasses,
    label_keys: &[String],
) -> SyncPlan {
    // Deleted and re-created under the same name (without our finalizer): clean up the old one first.
    let (replaced, same) = match last {
        Some(last) if last.service.metadata.uid != service.metadata.uid => {
            let replaced = if wants_load_balancer(last.service, served) {
                Replaced::DeleteLoadBalancer
            } else {
                Replaced::Forget
            };
            (Some(replaced), None)
        }
        last => (None, last),
    };
    let finalized = has_finalizer(service);
    let being_deleted = service.metadata.deletion_timestamp.is_some();
    let served_before = same.is_some_and(|p| wants_load_balancer(p.service, served));
    let decision = if served_elsewhere(service, served) {
        // Another implementation's: its finalizer (the same name as ours) and status are not ours to
        // touch. Only a load balancer of ours from before the Service became another class's (through a
        // type change we did not see) is deleted.
        if served_before {
            Decision::CleanUp {
                remove_finalizer: false,
                clear_status: false,
            }
        } else {
            Decision::Forget
        }
    } else if !wants_load_balancer(service, served) || needs_cleanup(service) || being_deleted {
        let ours = finalized || served_before;
        if ours {
            Decision::CleanUp {
                remove_finalizer: finalized,
                clear_status: !ingress_equal(
                    &current_status(service),
                    &LoadBalancerStatus::default(),
                ),
            }
        } else {
            Decision::Forget // never had a load balancer from us: no cloud call
        }
    } else if finalized
        && same.is_some_and(|p| p.synced && !needs_update(p.service, service, served, label_keys))
    {
        Decision::Nothing
    } else {
        Decision::Ensure {
            add_finalizer: !finalized,
        }
    };
    SyncPlan { replaced, decision }
}

/// What follows a successful `ensure_load_balancer`, given the status the cloud returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusAfterEnsure {
    /// The cloud returned no ingress list at all: an error (upstream's "status … is nil").
    Missing,
    /// The Service already shows this ingress: no write.
    Current,
    /// Publish it (upstream compares only `ingress`, against the Service as the sync began).
    Update,
}

/// Whether the status `ensured` by the cloud must be written to `service` (as seen when the sync began).
pub(crate) fn status_after_ensure(
    service: &Service,
    ensured: &LoadBalancerStatus,
) -> StatusAfterEnsure {
    if ensured.ingress.is_none() {
        StatusAfterEnsure::Missing
    } else if ingress_equal(&current_status(service), ensured) {
        StatusAfterEnsure::Current
    } else {
        StatusAfterEnsure::Update
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{LoadBalancerIngress, ServiceSpec},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn lb() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    node_port: Some(30080),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn with(mut svc: Service, f: impl FnOnce(&mut Service)) -> Service {
        f(&mut svc);
        svc
    }

    #[test]
    fn ownership() {
        let upstream = ServedClasses::default();
        assert!(wants_load_balancer(&lb(), &upstream));
        assert!(!wants_load_balancer(
            &with(lb(), |s| s.spec.as_mut().unwrap().load_balancer_class =
                Some("example.com/other".into())),
            &upstream
        ));
        assert!(!wants_load_balancer(
            &with(lb(), |s| s.spec.as_mut().unwrap().type_ =
                Some("ClusterIP".into())),
            &upstream
        ));
    }

    #[test]
    fn cleanup_needs_the_finalizer_and_deletion_or_a_type_change() {
        let finalized = with(lb(), |s| {
            s.metadata.finalizers = Some(vec![FINALIZER.into()])
        });
        assert!(!needs_cleanup(&lb()));
        assert!(!needs_cleanup(&finalized));
        assert!(needs_cleanup(&with(finalized.clone(), |s| s
            .metadata
            .deletion_timestamp =
            Some(Time(Default::default())))));
        assert!(needs_cleanup(&with(finalized.clone(), |s| s
            .spec
            .as_mut()
            .unwrap()
            .type_ =
            Some("ClusterIP".into()))));
        // The upstream quirk: a class added to a LoadBalancer Service does not clean up.
        assert!(!needs_cleanup(&with(finalized, |s| s
            .spec
            .as_mut()
            .unwrap()
            .load_balancer_class =
            Some("x".into()))));
    }

    #[test]
    fn only_load_balancer_relevant_changes_need_an_update() {
        let needs_update =
            |a: &Service, b: &Service| needs_update(a, b, &ServedClasses::default(), &[]);
        let base = lb();
        assert!(!needs_update(&base, &base.clone()));
        assert!(!needs_update(
            &base,
            &with(base.clone(), |s| s.metadata.labels =
                Some([("a".into(), "b".into())].into()))
        ));
        assert!(!needs_update(
            &base,
            &with(base.clone(), |s| s.status = Some(Default::default()))
        ));
        for changed in [
            with(base.clone(), |s| {
                s.metadata.annotations = Some([("a".into(), "b".into())].into())
            }),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81
            }),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30081)
            }),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().load_balancer_source_ranges =
                    Some(vec!["10.0.0.0/8".into()])
            }),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into())
            }),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into())
            }),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into())
            }),
            with(base.clone(), |s| s.metadata.uid = Some("u2".into())),
            with(base.clone(), |s| {
                s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into()])
            }),
        ] {
            assert!(needs_update(&base, &changed), "{:?}", changed.spec);
        }
        let cluster_ip = with(base.clone(), |s| {
            s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into())
        });
        assert!(!needs_update(
            &cluster_ip,
            &with(cluster_ip.clone(), |s| s.metadata.annotations =
                Some([("a".into(), "b".into())].into()))
        ));
    }

    #[test]
    fn a_label_the_provider_names_needs_an_update_and_no_other() {
        let keys = ["tier".to_owned()];
        let base = with(lb(), |s| {
            s.metadata.labels = Some([("tier".into(), "edge".into())].into())
        });
        let relabelled = |pairs: &[(&str, &str)]| {
            with(base.clone(), |s| {
                s.metadata.labels = Some(
                    pairs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
        };
        let served = ServedClasses::default();
        assert!(needs_update(
            &base,
            &relabelled(&[("tier", "core")]),
            &served,
            &keys
        ));
        assert!(needs_update(&base, &relabelled(&[]), &served, &keys));
        assert!(!needs_update(
            &base,
            &relabelled(&[("tier", "edge"), ("team", "x")]),
            &served,
            &keys
        ));
        assert!(!needs_update(
            &base,
            &relabelled(&[("tier", "core")]),
            &served,
            &[]
        ));
    }

    #[test]
    fn finalizer_lists_keep_other_finalizers() {
        let other = with(lb(), |s| {
            s.metadata.finalizers = Some(vec!["example.com/keep".into()])
        });
        let added = with_finalizer(&other).unwrap();
        assert_eq!(
            added,
            vec!["example.com/keep".to_string(), FINALIZER.to_string()]
        );
        let finalized = with(lb(), |s| s.metadata.finalizers = Some(added));
        assert_eq!(with_finalizer(&finalized), None);
        assert_eq!(
            without_finalizer(&finalized),
            Some(vec!["example.com/keep".to_string()])
        );
        assert_eq!(without_finalizer(&other), None);
        assert_eq!(
            finalizers_patch(&[], "7")["metadata"]["resourceVersion"],
            "7"
        );
    }

    #[test]
    fn ingress_comparison() {
        let ip = |ip: &str| LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ip.into()),
                ..Default::default()
            }]),
        };
        assert!(ingress_equal(
            &LoadBalancerStatus::default(),
            &LoadBalancerStatus {
                ingress: Some(vec![])
            }
        ));
        assert!(ingress_equal(&ip("1.2.3.4"), &ip("1.2.3.4")));
        assert!(!ingress_equal(&ip("1.2.3.4"), &ip("1.2.3.5")));
        assert_eq!(
            status_patch(Some(&ip("1.2.3.4")), None)["status"]["loadBalancer"]["ingress"][0]["ip"],
            "1.2.3.4"
        );
        assert_eq!(
            status_patch(Some(&LoadBalancerStatus::default()), None),
            json!({ "status": { "loadBalancer": { "ingress": [] } } })
        );
        // Conditions alone leave the address alone; an empty list removes them all.
        assert_eq!(
            status_patch(None, Some(&[])),
            json!({ "status": { "conditions": [] } })
        );
    }

    #[test]
    fn a_status_change_matters_nothing_but_deletion_finalizer_and_spec_do() {
        let served = ServedClasses::default();
        let base = finalized(lb());
        let same = |new: &Service| changes_nothing_that_matters(&base, new, &served, &[]);
        assert!(same(
            &with(base.clone(), |s| s.status = Some(Default::default()))
        ));
        assert!(same(&with(base.clone(), |s| s.metadata.resource_version =
            Some("9".into()))));
        assert!(!same(&with(base.clone(), |s| s
            .metadata
            .deletion_timestamp =
            Some(Time(Default::default())))));
        assert!(!same(&with(base.clone(), |s| s.metadata.finalizers = None)));
        assert!(!same(
            &with(base.clone(), |s| s.metadata.uid = Some("u2".into()))
        ));
        assert!(!same(&with(base.clone(), |s| {
            s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81
        })));
    }

    fn finalized(s: Service) -> Service {
        with(s, |s| s.metadata.finalizers = Some(vec![FINALIZER.into()]))
    }

    fn published(s: Service) -> Service {
        with(s, |s| {
            s.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some("192.0.2.1".into()),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            })
        })
    }

    fn cluster_ip(s: Service) -> Service {
        with(s, |s| {
            s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into())
        })
    }

    fn classed(s: Service) -> Service {
        with(s, |s| {
            s.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other".into())
        })
    }

    fn deleting(s: Service) -> Service {
        with(s, |s| {
            s.metadata.deletion_timestamp = Some(Time(Default::default()))
        })
    }

    fn recreated(s: Service) -> Service {
        with(s, |s| s.metadata.uid = Some("u2".into()))
    }

    fn port(s: Service, port: i32) -> Service {
        with(s, |s| {
            s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = port
        })
    }

    /// Every branch of the decision.
    #[test]
    fn the_sync_decision() {
        use Decision::{CleanUp, Ensure, Forget, Nothing};
        let plan = |decision| SyncPlan {
            replaced: None,
            decision,
        };
        let replaced = |replaced, decision| SyncPlan {
            replaced: Some(replaced),
            decision,
        };
        let cleanup = |remove_finalizer, clear_status| CleanUp {
            remove_finalizer,
            clear_status,
        };
        let ours = published(finalized(lb()));
        /// (case, the Service now, the remembered Service and whether its last sync completed, plan)
        type Row = (&'static str, Service, Option<(Service, bool)>, SyncPlan);
        let table: Vec<Row> = vec![
            // Ensure.
            (
                "a new LoadBalancer Service",
                lb(),
                None,
                plan(Ensure {
                    add_finalizer: true,
                }),
            ),
            (
                "one with our finalizer not remembered (e.g. after a restart)",
                ours.clone(),
                None,
                plan(Ensure {
                    add_finalizer: false,
                }),
            ),
            (
                "a change that matters since the last good sync",
                port(ours.clone(), 81),
                Some((ours.clone(), true)),
                plan(Ensure {
                    add_finalizer: false,
                }),
            ),
            (
                "unchanged, but the last sync did not complete",
                ours.clone(),
                Some((ours.clone(), false)),
                plan(Ensure {
                    add_finalizer: false,
                }),
            ),
            (
                "unchanged, but the finalizer went missing",
                published(lb()),
                Some((ours.clone(), true)),
                plan(Ensure {
                    add_finalizer: true,
                }),
            ),
            (
                "a class removed: ours again",
                finalized(lb()),
                Some((classed(finalized(lb())), true)),
                plan(Ensure {
                    add_finalizer: false,
                }),
            ),
            // Nothing.
            (
                "unchanged since the last good sync",
                ours.clone(),
                Some((ours.clone(), true)),
                plan(Nothing),
            ),
            (
                "only our own status write (and a label) since the last good sync",
                with(ours.clone(), |s| {
                    s.metadata.labels = Some([("a".into(), "b".into())].into())
                }),
                Some((finalized(lb()), true)),
                plan(Nothing),
            ),
            // Clean up.
            (
                "type changed away from LoadBalancer",
                cluster_ip(ours.clone()),
                Some((ours.clone(), true)),
                plan(cleanup(true, true)),
            ),
            (
                "type changed away, nothing published, not remembered",
                cluster_ip(finalized(lb())),
                None,
                plan(cleanup(true, false)),
            ),
            (
                "type changed away after the finalizer was removed by hand",
                cluster_ip(published(lb())),
                Some((ours.clone(), true)),
                plan(cleanup(false, true)),
            ),
            // Another implementation's class (reached through a type change we did not see): our load
            // balancer goes, its finalizer and status are not ours (upstream removes and clears them).
            (
                "loadBalancerClass set",
                classed(ours.clone()),
                Some((ours.clone(), true)),
                plan(cleanup(false, false)),
            ),
            (
                "loadBalancerClass set, finalizer gone, remembered while its sync failed",
                classed(lb()),
                Some((lb(), false)),
                plan(cleanup(false, false)),
            ),
            (
                "another implementation's, with the shared finalizer and a status",
                classed(ours.clone()),
                None,
                plan(Forget),
            ),
            (
                "another implementation's, being deleted",
                deleting(classed(ours.clone())),
                None,
                plan(Forget),
            ),
            (
                "deletion timestamp",
                deleting(ours.clone()),
                Some((ours.clone(), true)),
                plan(cleanup(true, true)),
            ),
            (
                "deletion timestamp, not remembered",
                deleting(finalized(lb())),
                None,
                plan(cleanup(true, false)),
            ),
            (
                "deletion timestamp, finalizer gone, remembered",
                deleting(published(lb())),
                Some((ours.clone(), true)),
                plan(cleanup(false, true)),
            ),
            // Forget: never ours.
            ("a ClusterIP Service", cluster_ip(lb()), None, plan(Forget)),
            (
                "a ClusterIP Service remembered as one",
                port(cluster_ip(lb()), 81),
                Some((cluster_ip(lb()), true)),
                plan(Forget),
            ),
            (
                "a Service with a class from the start",
                classed(lb()),
                None,
                plan(Forget),
            ),
            (
                "being deleted without ever being ours",
                deleting(lb()),
                None,
                plan(Forget),
            ),
            // Re-created under the same name: the old one first.
            (
                "re-created, the old one had a load balancer",
                recreated(lb()),
                Some((ours.clone(), true)),
                replaced(
                    Replaced::DeleteLoadBalancer,
                    Ensure {
                        add_finalizer: true,
                    },
                ),
            ),
            (
                "re-created unchanged with our finalizer: the old sync does not count",
                recreated(ours.clone()),
                Some((ours.clone(), true)),
                replaced(
                    Replaced::DeleteLoadBalancer,
                    Ensure {
                        add_finalizer: false,
                    },
                ),
            ),
            (
                "re-created as a ClusterIP Service",
                recreated(cluster_ip(lb())),
                Some((ours.clone(), true)),
                replaced(Replaced::DeleteLoadBalancer, Forget),
            ),
            (
                "re-created, the old one wanted no load balancer",
                recreated(lb()),
                Some((cluster_ip(lb()), true)),
                replaced(
                    Replaced::Forget,
                    Ensure {
                        add_finalizer: true,
                    },
                ),
            ),
        ];
        for (case, service, last, expected) in table {
            let last = last.as_ref().map(|(service, synced)| LastSync {
                service,
                synced: *synced,
            });
            assert_eq!(
                plan_sync(&service, last, &ServedClasses::default(), &[]),
                expected,
                "{case}"
            );
        }
    }

    /// A manager serving `--load-balancer-class=example.com/other` (the class `classed` sets): its
    /// Services are ensured and cleaned up as classless ones are by default; classless ones are another
    /// implementation's, whatever finalizer they carry.
    #[test]
    fn a_manager_of_a_class_serves_that_class_only() {
        let served = ServedClasses::new(&["example.com/other".into()], None).unwrap();
        let plan = |decision| SyncPlan {
            replaced: None,
            decision,
        };
        let ours = published(finalized(classed(lb())));
        type Row = (&'static str, Service, Option<(Service, bool)>, SyncPlan);
        let table: Vec<Row> = vec![
            (
                "a Service of the class",
                classed(lb()),
                None,
                plan(Decision::Ensure {
                    add_finalizer: true,
                }),
            ),
            (
                "unchanged since the last good sync",
                ours.clone(),
                Some((ours.clone(), true)),
                plan(Decision::Nothing),
            ),
            (
                "being deleted",
                with(ours.clone(), |s| {
                    s.metadata.deletion_timestamp = Some(Time(Default::default()))
                }),
                Some((ours.clone(), true)),
                plan(Decision::CleanUp {
                    remove_finalizer: true,
                    clear_status: true,
                }),
            ),
            (
                "a classless Service with the shared finalizer and a status",
                published(finalized(lb())),
                None,
                plan(Decision::Forget),
            ),
            ("a classless Service", lb(), None, plan(Decision::Forget)),
        ];
        for (case, service, last, expected) in table {
            let last = last.as_ref().map(|(service, synced)| LastSync {
                service,
                synced: *synced,
            });
            assert_eq!(plan_sync(&service, last, &served, &[]), expected, "{case}");
        }
    }

    #[test]
    fn the_status_after_an_ensure() {
        let ip = |ip: &str| LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ip.into()),
                ..Default::default()
            }]),
        };
        let empty = LoadBalancerStatus {
            ingress: Some(vec![]),
        };
        let table = [
            (
                "no ingress list",
                lb(),
                LoadBalancerStatus::default(),
                StatusAfterEnsure::Missing,
            ),
            (
                "an empty list, none published",
                lb(),
                empty.clone(),
                StatusAfterEnsure::Current,
            ),
            (
                "the published address",
                published(lb()),
                ip("192.0.2.1"),
                StatusAfterEnsure::Current,
            ),
            (
                "a first address",
                lb(),
                ip("192.0.2.1"),
                StatusAfterEnsure::Update,
            ),
            (
                "another address",
                published(lb()),
                ip("192.0.2.2"),
                StatusAfterEnsure::Update,
            ),
            (
                "no address any more",
                published(lb()),
                empty,
                StatusAfterEnsure::Update,
            ),
        ];
        for (case, service, ensured, expected) in table {
            assert_eq!(status_after_ensure(&service, &ensured), expected, "{case}");
        }
    }
}
