//! What the manager can tell of the node agents (`loadBalancer.mode: agents`) from their heartbeat
//! Leases: whether any live agent serves a Service's `loadBalancerClass`. Without one, the addresses
//! the manager assigns are announced and served by nobody, and the Service is told so (a Warning event
//! [`EVENT_NO_NODE_AGENT`](crate::EVENT_NO_NODE_AGENT)) rather than left with a dead VIP in silence.
//!
//! The manager looks once per ensure, so it cannot judge liveness by observed change as the agents do
//! ([`super::heartbeat`]): it compares the Leases' `renewTime` with its own clock, with
//! [`CLOCK_GRACE`] for clocks that disagree. An agent stopped cleanly deletes its Lease; one killed
//! leaves it, stale after its duration.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};

use super::heartbeat::CLASS_ANNOTATION;

/// How much the manager's clock and a node's may disagree before a live agent looks stale.
pub(crate) const CLOCK_GRACE: Duration = Duration::from_secs(30);

/// Why no live agent serves a Service of `class` (`None`: the Services without a class), from the
/// agents' Leases in `namespace` as of `now`; `None` when one does.
pub(crate) fn why_unserved(
    leases: &[Lease],
    class: Option<&str>,
    namespace: &str,
    now: Timestamp,
) -> Option<String> {
    let live: Vec<Option<&str>> = leases
        .iter()
        .filter(|lease| is_live(lease, now))
        .map(|lease| {
            lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CLASS_ANNOTATION))
                .map(String::as_str)
        })
        .collect();
    if live.contains(&class) {
        return None;
    }
    let wanted = describe(class);
    if live.is_empty() {
        return Some(format!(
            "no local-agent has renewed its heartbeat Lease in namespace {namespace:?} lately, so \
             nothing announces or serves it: run the local-agent DaemonSet \
             (deploy/components/local-agents), which serves {wanted}"
        ));
    }
    let served: BTreeSet<String> = live.iter().map(|c| describe(*c)).collect();
    Some(format!(
        "no live local-agent serves {wanted} (live agents in namespace {namespace:?}: {}, serving {}), \
         so nothing announces or serves it: start agents with {}",
        live.len(),
        served.into_iter().collect::<Vec<_>>().join(" and "),
        match class {
            Some(class) => format!("--load-balancer-class={class}"),
            None => "no --load-balancer-class".to_owned(),
        }
    ))
}

fn describe(class: Option<&str>) -> String {
    match class {
        Some(class) => format!("loadBalancerClass {class:?}"),
        None => "the Services without a loadBalancerClass".to_owned(),
    }
}

/// Whether `lease` is held and was renewed within its duration (and [`CLOCK_GRACE`]) before `now`.
fn is_live(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return false;
    }
    let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
        return false;
    };
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
    // A renewal "in the future" (a node's clock ahead of this one) is live.
    Duration::try_from(now.duration_since(renewed)).map_or(true, |age| age < duration + CLOCK_GRACE)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime,
    };
    use kube::api::ObjectMeta;

    use super::*;

    fn lease(holder: &str, age_secs: i64, class: Option<&str>, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: class.map(|c| [(CLASS_ANNOTATION.to_owned(), c.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(3),
                renew_time: Some(MicroTime(
                    now - k8s_openapi::jiff::SignedDuration::from_secs(age_secs),
                )),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_service_is_unserved_without_a_live_agent_of_its_class() {
        let now = Timestamp::now();
        let fresh = |class| lease("n1", 1, class, now);
        // Past 3 s + the grace: stale.
        let stale = lease("n2", 40, None, now);
        let released = Lease {
            spec: Some(LeaseSpec::default()),
            ..fresh(None)
        };
        // (what, the Leases, the Service's class, what the answer contains: None when served)
        type Case<'a> = (&'a str, Vec<Lease>, Option<&'a str>, Option<&'a str>);
        let cases: [Case; 7] = [
            (
                "a live agent without a class",
                vec![fresh(None)],
                None,
                None,
            ),
            (
                "a node's clock 20 s ahead or behind",
                vec![lease("n1", 20, None, now), lease("n3", -20, None, now)],
                None,
                None,
            ),
            (
                "a live agent of the class",
                vec![stale.clone(), fresh(Some("edge"))],
                Some("edge"),
                None,
            ),
            (
                "no Lease",
                vec![],
                None,
                Some("no local-agent has renewed its heartbeat Lease in namespace \"kube-system\""),
            ),
            (
                "a stale Lease only",
                vec![stale.clone()],
                None,
                Some("no local-agent has renewed"),
            ),
            (
                "a released Lease only",
                vec![released],
                None,
                Some("no local-agent has renewed"),
            ),
            (
                "live agents of the wrong class",
                vec![fresh(None), stale],
                Some("edge"),
                Some(
                    "no live local-agent serves loadBalancerClass \"edge\" (live agents in namespace \"kube-system\": 1, serving the Services without a loadBalancerClass), so nothing announces or serves it: start agents with --load-balancer-class=edge",
                ),
            ),
        ];
        for (what, leases, class, want) in cases {
            let got = why_unserved(&leases, class, "kube-system", now);
            match want {
                None => assert_eq!(got, None, "{what}"),
                Some(text) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(text)),
                    "{what}: {got:?}"
                ),
            }
        }
        let unclassed = why_unserved(&[fresh(Some("edge"))], None, "kube-system", now).unwrap();
        assert!(
            unclassed.ends_with("start agents with no --load-balancer-class"),
            "{unclassed}"
        );
    }
}
