//! The cluster's load balancers as AWS holds them, for the manager's sweep of load balancers whose
//! Service is gone: every Classic ELB and every NLB that carries the cluster's tag
//! (`kubernetes.io/cluster/<id>`), with the Service its `kubernetes.io/service-name` tag names, and
//! whether it is kept for that Service or adopted by a later one (`retained`).

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum;
use cloud_provider::{ClusterLoadBalancer, ServiceRef};

use super::{
    LoadBalancers, retained,
    spec::{Kind, TAG_CLUSTER_PREFIX, TAG_SERVICE_NAME},
};
use crate::error::Result;

/// At most this many names or ARNs per DescribeTags call (both ELB APIs' limit).
const TAGS_PER_CALL: usize = 20;

/// The handle of a Classic ELB in [`ClusterLoadBalancer::handle`].
pub(super) const CLASSIC: &str = "classic";
/// The handle of an NLB.
pub(super) const NLB: &str = "nlb";

/// A load balancer of the cluster with its tags, as listed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tagged {
    /// Its name.
    pub(super) name: String,
    /// Classic ELB or NLB.
    pub(super) kind: Kind,
    /// Its ARN (an NLB's; a Classic ELB has none).
    pub(super) arn: Option<String>,
    /// Every tag it carries.
    pub(super) tags: BTreeMap<String, String>,
}

impl Tagged {
    /// As the manager's sweep sees it: the Service it was made for, whether it is kept for that
    /// Service, and the UID of the Service that adopted it (`retained`).
    fn listed(&self) -> ClusterLoadBalancer {
        let kept = retained::Kept::from_tags(self);
        let mut service = self
            .tags
            .get(TAG_SERVICE_NAME)
            .and_then(|value| ServiceRef::parse(value));
        if let (Some(service), Some(uid)) = (
            service.as_mut(),
            kept.as_ref().and_then(|k| k.adopted_by.clone()),
        ) {
            *service = service.clone().with_uid(uid);
        }
        let handle = match self.kind {
            Kind::Classic => CLASSIC,
            Kind::Nlb => NLB,
        };
        let listed = ClusterLoadBalancer::new(&self.name, service).with_handle(handle);
        if kept.is_some_and(|k| k.adopted_by.is_none()) {
            listed.retained()
        } else {
            listed
        }
    }
}

/// The listed load balancers as the manager's sweep sees them.
pub(super) fn listed(tagged: &[Tagged]) -> Vec<ClusterLoadBalancer> {
    tagged.iter().map(Tagged::listed).collect()
}

/// `tags` as a map, when they mark a load balancer as the cluster's (`cluster_tag`).
fn owned(tags: BTreeMap<String, String>, cluster_tag: &str) -> Option<BTreeMap<String, String>> {
    tags.contains_key(cluster_tag).then_some(tags)
}

impl LoadBalancers {
    /// Every Classic ELB and NLB tagged for the cluster `cluster_id`, with its tags.
    pub(super) async fn tagged_load_balancers(&self, cluster_id: &str) -> Result<Vec<Tagged>> {
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let mut found = self.classic_inventory(&cluster_tag).await?;
        found.extend(self.nlb_inventory(&cluster_tag).await?);
        Ok(found)
    }

    async fn classic_inventory(&self, cluster_tag: &str) -> Result<Vec<Tagged>> {
        let elb = &self.calls.clients.elb;
        let names: Vec<String> = self
            .all_classic_load_balancers()
            .await?
            .iter()
            .filter_map(|d| d.load_balancer_name().map(str::to_owned))
            .collect();
        let mut found = Vec::new();
        for chunk in names.chunks(TAGS_PER_CALL) {
            let out = self
                .calls
                .call("elb:DescribeTags", || {
                    elb.describe_tags()
                        .set_load_balancer_names(Some(chunk.to_vec()))
                        .send()
                })
                .await?;
            for d in out.tag_descriptions() {
                let tags: BTreeMap<String, String> = d
                    .tags()
                    .iter()
                    .map(|t| (t.key().to_owned(), t.value().unwrap_or_default().to_owned()))
                    .collect();
                if let Some(name) = d.load_balancer_name()
                    && let Some(tags) = owned(tags, cluster_tag)
                {
                    found.push(Tagged {
                        name: name.to_owned(),
                        kind: Kind::Classic,
                        arn: None,
                        tags,
                    });
                }
            }
        }
        Ok(found)
    }

    async fn nlb_inventory(&self, cluster_tag: &str) -> Result<Vec<Tagged>> {
        let mut by_arn = BTreeMap::new();
        for lb in self.all_elbv2_load_balancers().await? {
            if lb.r#type() == Some(&LoadBalancerTypeEnum::Network)
                && let (Some(arn), Some(name)) = (lb.load_balancer_arn(), lb.load_balancer_name())
            {
                by_arn.insert(arn.to_owned(), name.to_owned());
            }
        }
        let arns: Vec<String> = by_arn.keys().cloned().collect();
        Ok(self
            .elbv2_tags(&arns)
            .await?
            .into_iter()
            .filter_map(|(arn, tags)| {
                Some(Tagged {
                    name: by_arn.get(&arn)?.clone(),
                    kind: Kind::Nlb,
                    tags: owned(tags, cluster_tag)?,
                    arn: Some(arn),
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retained::{TAG_ADOPTED_BY, TAG_NAMED_FOR_UID, TAG_RETAINED_FOR};

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn tagged(name: &str, kind: Kind, tags: &[(&str, &str)]) -> Tagged {
        Tagged {
            name: name.to_owned(),
            kind,
            arn: None,
            tags: map(tags),
        }
    }

    #[test]
    fn only_load_balancers_tagged_for_the_cluster_are_listed() {
        let tag = "kubernetes.io/cluster/k";
        assert!(owned(map(&[(tag, "owned")]), tag).is_some());
        assert!(owned(map(&[(tag, "shared")]), tag).is_some());
        assert!(owned(map(&[("kubernetes.io/cluster/other", "owned")]), tag).is_none());
        assert!(owned(BTreeMap::new(), tag).is_none());
    }

    #[test]
    fn the_sweep_sees_the_service_and_whether_it_is_kept_or_adopted() {
        let lb = tagged("a1", Kind::Nlb, &[(TAG_SERVICE_NAME, "shop/web")]).listed();
        assert_eq!(lb.name, "a1");
        assert_eq!(lb.handle, NLB);
        assert_eq!(lb.service, Some(ServiceRef::new("shop", "web")));
        assert!(!lb.retained);

        assert_eq!(tagged("a2", Kind::Classic, &[]).listed().service, None);
        assert_eq!(tagged("a2", Kind::Classic, &[]).listed().handle, CLASSIC);

        let kept = tagged(
            "a3",
            Kind::Classic,
            &[
                (TAG_SERVICE_NAME, "shop/web"),
                (TAG_RETAINED_FOR, "shop/web"),
                (TAG_NAMED_FOR_UID, "u0"),
            ],
        )
        .listed();
        assert!(kept.retained);
        assert_eq!(kept.service, Some(ServiceRef::new("shop", "web")));

        let adopted = tagged(
            "a4",
            Kind::Nlb,
            &[
                (TAG_SERVICE_NAME, "shop/web"),
                (TAG_NAMED_FOR_UID, "u0"),
                (TAG_ADOPTED_BY, "u1"),
            ],
        )
        .listed();
        assert!(
            !adopted.retained,
            "an adopted one is its adopter's, not kept"
        );
        assert_eq!(
            adopted.service,
            Some(ServiceRef::new("shop", "web").with_uid("u1"))
        );
    }
}
