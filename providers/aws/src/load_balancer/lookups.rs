//! The load balancers' look-ups, coalesced ([`crate::coalesce`]): the syncs, deletions and drift checks
//! under way at once find their Classic ELBs in one `elb:DescribeLoadBalancers`, their NLBs in one
//! `elbv2:DescribeLoadBalancers` and their NLBs' target groups in one `DescribeTargetGroups`, 20 names
//! or ARNs per call.
//!
//! AWS fails a whole call naming one that does not exist (`LoadBalancerNotFound`,
//! `TargetGroupNotFound`), so a batch that meets one is asked again key by key (at once, side by
//! side): a burst of creations, whose first look-ups all miss, costs one call more than it did without
//! batching; the updates, deletions and drift checks of load balancers that exist share their calls.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription;
use aws_sdk_elasticloadbalancingv2::types::{
    LoadBalancer as Elbv2LoadBalancer, LoadBalancerTypeEnum, TargetGroup,
};
use futures::future::join_all;

use crate::{coalesce::Coalescer, error::Result, sdk::Calls};

/// The most names in one `DescribeLoadBalancers` (the API's limit for ELBv2's ARNs; kept for both).
pub const NAMES_PER_CALL: usize = 20;

/// The most look-up calls of one kind under way at once. One keeps the calls fewest; measured at 1,000
/// Services on moto, 4 followed a node churn 11 % faster for 2.7 times the `DescribeLoadBalancers`
/// (`bench/results/aws-1000-services-4-in-flight-2026-11-30.json`).
pub const CALLS_IN_FLIGHT: usize = 1;

/// The code AWS answers a look-up naming a load balancer that does not exist with.
const NOT_FOUND: &str = "LoadBalancerNotFound";

/// The code AWS answers a look-up naming a target group that does not exist with.
const GROUP_NOT_FOUND: &str = "TargetGroupNotFound";

/// One call path's coalesced look-ups (syncs and previews each have their own, so a sync never waits
/// on a preview's budget).
pub struct Lookups {
    classic: Coalescer<String, LoadBalancerDescription>,
    nlb: Coalescer<String, Elbv2LoadBalancer>,
    target_groups: Coalescer<String, TargetGroup>,
}

impl Default for Lookups {
    fn default() -> Self {
        Self {
            classic: Coalescer::new(NAMES_PER_CALL, CALLS_IN_FLIGHT),
            nlb: Coalescer::new(NAMES_PER_CALL, CALLS_IN_FLIGHT),
            target_groups: Coalescer::new(NAMES_PER_CALL, CALLS_IN_FLIGHT),
        }
    }
}

impl Lookups {
    /// The Classic ELB named `name`, if any, through `calls`: in a shared call when `shared`, else
    /// alone and at once.
    pub async fn classic(
        &self,
        calls: &Calls,
        name: &str,
        shared: bool,
    ) -> Result<Option<LoadBalancerDescription>> {
        let call = |names| classic_call(calls, names);
        look_up(&self.classic, name, shared, NOT_FOUND, call).await
    }

    /// The NLB named `name`, if any, through `calls` (an ELBv2 load balancer of another type by that
    /// name is not one): in a shared call when `shared`, else alone and at once.
    pub async fn nlb(
        &self,
        calls: &Calls,
        name: &str,
        shared: bool,
    ) -> Result<Option<Elbv2LoadBalancer>> {
        let call = |names| nlb_call(calls, names);
        look_up(&self.nlb, name, shared, NOT_FOUND, call).await
    }

    /// The target group with ARN `arn`, if any, through `calls`, in a shared call.
    pub async fn target_group(&self, calls: &Calls, arn: &str) -> Result<Option<TargetGroup>> {
        let call = |arns| target_group_call(calls, arns);
        look_up(&self.target_groups, arn, true, GROUP_NOT_FOUND, call).await
    }
}

/// `key` looked up with `call`: in a call `shared` through `coalescer` with the look-ups under way,
/// else alone and at once (`not_found`: AWS's code for a key that does not exist).
async fn look_up<V: Clone, F, Fut>(
    coalescer: &Coalescer<String, V>,
    key: &str,
    shared: bool,
    not_found: &str,
    call: F,
) -> Result<Option<V>>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = Found<V>>,
{
    if !shared {
        return alone(key, not_found, call).await;
    }
    coalescer
        .get(key.to_owned(), |keys| by_name(keys, not_found, call))
        .await
}

/// `call` for `key` alone (`not_found`: AWS's code for a key that does not exist).
async fn alone<V, F, Fut>(key: &str, not_found: &str, call: F) -> Result<Option<V>>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = Result<BTreeMap<String, V>>>,
{
    Ok(by_name(vec![key.to_owned()], not_found, call)
        .await?
        .remove(key))
}

/// `call` for all of `names`; when AWS refuses it for a missing one (`not_found`), for each name alone.
async fn by_name<V, F, Fut>(
    names: Vec<String>,
    not_found: &str,
    call: F,
) -> Result<BTreeMap<String, V>>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = Result<BTreeMap<String, V>>>,
{
    let several = names.len() > 1;
    match call(names.clone()).await {
        Err(e) if e.code() == Some(not_found) && several => {
            let mut found = BTreeMap::new();
            for alone in join_all(names.into_iter().map(|n| call(vec![n]))).await {
                match alone {
                    Ok(one) => found.extend(one),
                    Err(e) if e.code() == Some(not_found) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(found)
        }
        Err(e) if e.code() == Some(not_found) => Ok(BTreeMap::new()),
        other => other,
    }
}

/// What one look-up call found, by name or ARN.
type Found<T> = Result<BTreeMap<String, T>>;

/// `items` by the name or ARN `key` reads (those without one left out).
fn keyed<'a, T: Clone + 'a>(
    items: impl IntoIterator<Item = &'a T>,
    key: impl Fn(&T) -> Option<&str>,
) -> BTreeMap<String, T> {
    items
        .into_iter()
        .filter_map(|item| Some((key(item)?.to_owned(), item.clone())))
        .collect()
}

async fn target_group_call(calls: &Calls, arns: Vec<String>) -> Found<TargetGroup> {
    let elbv2 = &calls.clients.elbv2;
    let request = elbv2
        .describe_target_groups()
        .set_target_group_arns(Some(arns));
    let out = calls
        .call("DescribeTargetGroups", || request.clone().send())
        .await?;
    Ok(keyed(out.target_groups(), TargetGroup::target_group_arn))
}

async fn classic_call(calls: &Calls, names: Vec<String>) -> Found<LoadBalancerDescription> {
    let elb = &calls.clients.elb;
    let request = elb
        .describe_load_balancers()
        .set_load_balancer_names(Some(names));
    let out = calls
        .call("elb:DescribeLoadBalancers", || request.clone().send())
        .await?;
    let descriptions = out.load_balancer_descriptions();
    Ok(keyed(
        descriptions,
        LoadBalancerDescription::load_balancer_name,
    ))
}

/// The NLBs among the ELBv2 load balancers named `names` (one of an unknown type counts as one).
async fn nlb_call(calls: &Calls, names: Vec<String>) -> Found<Elbv2LoadBalancer> {
    let elbv2 = &calls.clients.elbv2;
    let request = elbv2.describe_load_balancers().set_names(Some(names));
    let out = calls
        .call("elbv2:DescribeLoadBalancers", || request.clone().send())
        .await?;
    let nlbs = out.load_balancers().iter().filter(|lb| {
        lb.r#type()
            .is_none_or(|t| *t == LoadBalancerTypeEnum::Network)
    });
    Ok(keyed(nlbs, Elbv2LoadBalancer::load_balancer_name))
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;
    use crate::Error;

    /// A region holding `existing`, answering as AWS does: a call naming a missing load balancer fails
    /// whole; a throttled name fails every call naming it.
    struct Region {
        existing: &'static [&'static str],
        calls: Mutex<Vec<Vec<String>>>,
    }

    impl Region {
        async fn describe(&self, names: Vec<String>) -> Result<BTreeMap<String, usize>> {
            self.calls.lock().push(names.clone());
            let code = |code: &str| Error::Api {
                operation: "elb:DescribeLoadBalancers",
                code: Some(code.to_owned()),
                detail: code.to_owned(),
            };
            if names.iter().any(|n| n == "throttled") {
                return Err(code("Throttling"));
            }
            if names.iter().any(|n| !self.existing.contains(&n.as_str())) {
                return Err(code(NOT_FOUND));
            }
            Ok(names.into_iter().map(|n| (n, 1)).collect())
        }
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[tokio::test]
    async fn a_batch_meeting_a_missing_name_is_asked_again_name_by_name() {
        for (asked, existing, found, calls) in [
            // All there: one call.
            (
                &["a", "b", "c"][..],
                &["a", "b", "c"][..],
                &["a", "b", "c"][..],
                1,
            ),
            // One missing: the batch, then each alone.
            (&["a", "b", "c"], &["a", "c"], &["a", "c"], 4),
            // A lone name missing: not found, no second call.
            (&["a"], &[], &[], 1),
        ] {
            let region = Region {
                existing,
                calls: Mutex::default(),
            };
            let answer = by_name(names(asked), NOT_FOUND, |n| region.describe(n))
                .await
                .unwrap();
            assert_eq!(
                answer.keys().cloned().collect::<Vec<_>>(),
                names(found),
                "{asked:?}"
            );
            assert_eq!(region.calls.lock().len(), calls, "{asked:?}");
        }
    }

    #[tokio::test]
    async fn any_other_failure_fails_the_batch() {
        let region = Region {
            existing: &["a"],
            calls: Mutex::default(),
        };
        let err = by_name(names(&["a", "throttled"]), NOT_FOUND, |n| {
            region.describe(n)
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), Some("Throttling"));
        // A missing name beside a throttled one: the throttle is what is said.
        let err = by_name(names(&["missing", "throttled"]), NOT_FOUND, |n| {
            region.describe(n)
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), Some("Throttling"));
    }
}
