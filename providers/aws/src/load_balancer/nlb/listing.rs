//! The region's ELBv2 load balancers and their tags, for the deletion index and the cluster's
//! inventory.

use super::*;
use crate::sdk::tag_pair;

impl LoadBalancers {
    /// Every ELBv2 load balancer in the region (every kind).
    pub(in crate::load_balancer) async fn all_elbv2_load_balancers(
        &self,
    ) -> Result<Vec<Elbv2LoadBalancer>> {
        let elbv2 = &self.calls.clients.elbv2;
        all_pages(|marker| async move {
            let out = self
                .calls
                .call("elbv2:DescribeLoadBalancers", || {
                    elbv2
                        .describe_load_balancers()
                        .set_marker(marker.clone())
                        .send()
                })
                .await?;
            Ok((
                out.load_balancers().to_vec(),
                out.next_marker().map(str::to_owned),
            ))
        })
        .await
    }

    /// The tags of ELBv2 resources (load balancers, target groups) by ARN, 20 ARNs per DescribeTags.
    pub(in crate::load_balancer) async fn elbv2_tags(
        &self,
        arns: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, String>)>> {
        let elbv2 = &self.calls.clients.elbv2;
        let mut tagged = Vec::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            let out = self
                .calls
                .call("elbv2:DescribeTags", || {
                    elbv2
                        .describe_tags()
                        .set_resource_arns(Some(chunk.to_vec()))
                        .send()
                })
                .await?;
            for d in out.tag_descriptions() {
                let tags = d
                    .tags()
                    .iter()
                    .filter_map(|t| tag_pair(t.key(), t.value()))
                    .collect();
                tagged.extend(d.resource_arn().map(|arn| (arn.to_owned(), tags)));
            }
        }
        Ok(tagged)
    }
}
