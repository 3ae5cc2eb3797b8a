//! Pure rules of the service-lb controller: which Services it owns, when one needs a cloud sync, and the
//! patches it writes.

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service, ServicePort};
use serde_json::{Value, json};

/// The finalizer that keeps a Service until its load balancer is gone.
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// `type: LoadBalancer` without a `loadBalancerClass` (a class means another implementation owns it).
pub fn wants_load_balancer(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none()
    })
}

/// Whether the Service carries our finalizer.
pub fn has_finalizer(service: &Service) -> bool {
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
pub fn needs_cleanup(service: &Service) -> bool {
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
/// balancer. Labels, status and other spec fields do not.
pub fn needs_update(old: &Service, new: &Service) -> bool {
    if !wants_load_balancer(old) && !wants_load_balancer(new) {
        return false;
    }
    if wants_load_balancer(old) != wants_load_balancer(new) {
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
}

/// The current `status.loadBalancer`.
pub fn current_status(service: &Service) -> LoadBalancerStatus {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone())
        .unwrap_or_default()
}

/// Upstream compares only `ingress` (an absent and an empty list are equal).
pub fn ingress_equal(a: &LoadBalancerStatus, b: &LoadBalancerStatus) -> bool {
    a.ingress.as_deref().unwrap_or_default() == b.ingress.as_deref().unwrap_or_default()
}

/// The finalizers with ours added, or `None` when it is there.
pub fn with_finalizer(service: &Service) -> Option<Vec<String>> {
    if has_finalizer(service) {
        return None;
    }
    let mut finalizers = service.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(FINALIZER.to_owned());
    Some(finalizers)
}

/// The finalizers without ours, or `None` when it is not there.
pub fn without_finalizer(service: &Service) -> Option<Vec<String>> {
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
pub fn finalizers_patch(finalizers: &[String], resource_version: &str) -> Value {
    json!({ "metadata": { "resourceVersion": resource_version, "finalizers": finalizers } })
}

/// The status patch that publishes the load balancer.
pub fn status_patch(status: &LoadBalancerStatus) -> Value {
    json!({ "status": { "loadBalancer": { "ingress": status.ingress.clone().unwrap_or_default() } } })
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
        assert!(wants_load_balancer(&lb()));
        assert!(!wants_load_balancer(&with(lb(), |s| s
            .spec
            .as_mut()
            .unwrap()
            .load_balancer_class =
            Some("example.com/other".into()))));
        assert!(!wants_load_balancer(&with(lb(), |s| s
            .spec
            .as_mut()
            .unwrap()
            .type_ =
            Some("ClusterIP".into()))));
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
            status_patch(&ip("1.2.3.4"))["status"]["loadBalancer"]["ingress"][0]["ip"],
            "1.2.3.4"
        );
        assert_eq!(
            status_patch(&LoadBalancerStatus::default())["status"]["loadBalancer"]["ingress"],
            json!([])
        );
    }
}
