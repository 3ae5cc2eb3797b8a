//! The cluster's load balancers as AWS holds them, for the manager's sweep of load balancers whose
//! Service is gone: every Classic ELB and every NLB that carries the cluster's tag
//! (`kubernetes.io/cluster/<id>`), with the Service its `kubernetes.io/service-name` tag names.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum;
use cloud_provider::{ClusterLoadBalancer, ServiceRef};

use super::{
    LoadBalancers,
    spec::{TAG_CLUSTER_PREFIX, TAG_SERVICE_NAME},
};
use crate::error::Result;

/// At most this many names or ARNs per DescribeTags call (both ELB APIs' limit).
const TAGS_PER_CALL: usize = 20;

/// The handle of a Classic ELB in [`ClusterLoadBalancer::handle`].
pub(super) const CLASSIC: &str = "classic";
/// The handle of an NLB.
pub(super) const NLB: &str = "nlb";

/// The load balancer named `name` with `tags`, when they mark it as the cluster's.
fn owned(
    name: &str,
    tags: &BTreeMap<String, String>,
    cluster_tag: &str,
    handle: &str,
) -> Option<ClusterLoadBalancer> {
    tags.contains_key(cluster_tag).then(|| {
        let service = tags
            .get(TAG_SERVICE_NAME)
            .and_then(|value| ServiceRef::parse(value));
        ClusterLoadBalancer::new(name, service).with_handle(handle)
    })
}

impl LoadBalancers {
    /// Every Classic ELB and NLB tagged for the cluster `cluster_id`.
    pub(super) async fn cluster_load_balancers(
        &self,
        cluster_id: &str,
    ) -> Result<Vec<ClusterLoadBalancer>> {
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let mut found = self.classic_inventory(&cluster_tag).await?;
        found.extend(self.nlb_inventory(&cluster_tag).await?);
        Ok(found)
    }

    async fn classic_inventory(&self, cluster_tag: &str) -> Result<Vec<ClusterLoadBalancer>> {
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
                    && let Some(lb) = owned(name, &tags, cluster_tag, CLASSIC)
                {
                    found.push(lb);
                }
            }
        }
        Ok(found)
    }

    async fn nlb_inventory(&self, cluster_tag: &str) -> Result<Vec<ClusterLoadBalancer>> {
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
            .filter_map(|(arn, tags)| owned(by_arn.get(&arn)?, &tags, cluster_tag, NLB))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_load_balancers_tagged_for_the_cluster_are_listed() {
        let tag = "kubernetes.io/cluster/k";
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ours = map(&[(tag, "owned"), (TAG_SERVICE_NAME, "shop/web")]);
        let lb = owned("a1", &ours, tag, NLB).unwrap();
        assert_eq!(lb.name, "a1");
        assert_eq!(lb.handle, NLB);
        assert_eq!(lb.service, Some(ServiceRef::new("shop", "web")));

        let untagged_service = map(&[(tag, "shared")]);
        assert_eq!(
            owned("a2", &untagged_service, tag, CLASSIC)
                .unwrap()
                .service,
            None
        );
        let other_cluster = map(&[
            ("kubernetes.io/cluster/other", "owned"),
            (TAG_SERVICE_NAME, "a/b"),
        ]);
        assert!(owned("a3", &other_cluster, tag, CLASSIC).is_none());
        assert!(owned("a4", &BTreeMap::new(), tag, CLASSIC).is_none());
    }
}
