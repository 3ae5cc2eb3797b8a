//! What a Service's deletion must know of the region's load balancers, without asking AWS at every
//! deletion: the names of its Classic ELBs (with their VPCs) and of its ELBv2 load balancers, and the
//! target groups tagged for a Service.
//!
//! A deletion looks for the Service's load balancer of both kinds, whatever its type annotation says
//! now (it may have changed since the load balancer was made), and for every target group tagged for the
//! Service even when no NLB holds it (a creation that failed half-way leaves them). Asked of AWS each
//! time, that is a `DescribeLoadBalancers` of each kind per deletion, and a `DescribeTargetGroups` over
//! the whole region followed by a `DescribeTags` per 20 groups; upstream describes only the kind the
//! annotation names (and leaks such groups). The index lists all of it once, at the first deletion of
//! this process (one call per page of each listing), and from then on is kept by this process's own
//! writes and reads: while it leads, it is the only writer of the cluster's load balancers (a replica
//! that loses its Lease exits, and the next leader lists afresh). What someone else deletes meanwhile is
//! found gone when the deletion asks AWS to delete it (a missing load balancer or target group is no
//! error); what someone else creates under the cluster's names is not seen until this process syncs it
//! or the next process lists. Nothing else reads it: syncs, previews and the orphan sweep ask AWS.
//!
//! Written here rather than taken from a cache crate: it is not a cache of answers that expire but a
//! set kept exact by the writes that change it, loaded once.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::{
    LoadBalancers,
    spec::{TAG_CLUSTER_PREFIX, TAG_SERVICE_NAME},
};
use crate::error::Result;

/// The index; empty until the first deletion loads it.
#[derive(Default)]
pub(super) struct DeletionIndex {
    known: tokio::sync::Mutex<Option<Known>>,
}

/// What the index holds once loaded.
#[derive(Default, Debug, PartialEq)]
struct Known {
    /// Every Classic ELB in the region, by name, with its VPC (`None`: not known; described when
    /// deleted).
    classic: HashMap<String, Option<String>>,
    /// The names of every ELBv2 load balancer in the region (names are unique across its kinds).
    load_balancers: HashSet<String>,
    /// Target groups tagged with a Service, by ARN.
    target_groups: HashMap<String, TaggedGroup>,
}

/// The tags of a target group that matter to a deletion.
#[derive(Debug, PartialEq)]
struct TaggedGroup {
    /// `kubernetes.io/service-name` (`namespace/name`).
    service: String,
    /// The `kubernetes.io/cluster/<id>` keys it carries.
    clusters: BTreeSet<String>,
}

impl TaggedGroup {
    /// The group's tags, if they name a Service.
    fn from_tags<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let mut service = None;
        let mut clusters = BTreeSet::new();
        for (key, value) in tags {
            if key == TAG_SERVICE_NAME {
                service = Some(value.to_owned());
            } else if key.starts_with(TAG_CLUSTER_PREFIX) {
                clusters.insert(key.to_owned());
            }
        }
        Some(Self {
            service: service?,
            clusters,
        })
    }
}

impl Known {
    /// The target groups tagged for `service_name` in the cluster `cluster_id`, sorted.
    fn target_groups_of(&self, service_name: &str, cluster_id: &str) -> Vec<String> {
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let mut arns: Vec<String> = self
            .target_groups
            .iter()
            .filter(|(_, g)| g.service == service_name && g.clusters.contains(&cluster_tag))
            .map(|(arn, _)| arn.clone())
            .collect();
        arns.sort();
        arns
    }
}

impl LoadBalancers {
    /// Runs `read` on the index, loading it first if this process has not yet.
    async fn read_index<T>(&self, read: impl FnOnce(&Known) -> T) -> Result<T> {
        let mut known = self.deletion_index.known.lock().await;
        if known.is_none() {
            *known = Some(self.load_index().await?);
        }
        Ok(read(known.as_ref().expect("loaded above")))
    }

    /// Records a write in the index, if it is loaded (a later load lists the write anyway). Waits for a
    /// load under way, which may have listed before the write.
    async fn note_in_index(&self, write: impl FnOnce(&mut Known)) {
        if let Some(known) = self.deletion_index.known.lock().await.as_mut() {
            write(known);
        }
    }

    async fn load_index(&self) -> Result<Known> {
        let classic = self
            .all_classic_load_balancers()
            .await?
            .iter()
            .filter_map(|lb| {
                let name = lb.load_balancer_name()?.to_owned();
                Some((name, lb.vpc_id().map(str::to_owned)))
            })
            .collect();
        let load_balancers = self
            .all_elbv2_load_balancers()
            .await?
            .iter()
            .filter_map(|lb| lb.load_balancer_name().map(str::to_owned))
            .collect();
        let arns = self.all_target_group_arns().await?;
        let target_groups = self
            .elbv2_tags(&arns)
            .await?
            .into_iter()
            .filter_map(|(arn, tags)| {
                let group =
                    TaggedGroup::from_tags(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
                Some((arn, group))
            })
            .collect();
        let known = Known {
            classic,
            load_balancers,
            target_groups,
        };
        tracing::debug!(
            classic = known.classic.len(),
            load_balancers = known.load_balancers.len(),
            target_groups = known.target_groups.len(),
            "listed the region's load balancers and tagged target groups for deletions"
        );
        Ok(known)
    }

    /// What this process knows of the Classic ELB named `name`: `None` when it knows there is none,
    /// else its VPC if known.
    pub(super) async fn classic_load_balancer_known(
        &self,
        name: &str,
    ) -> Result<Option<Option<String>>> {
        self.read_index(|k| k.classic.get(name).cloned()).await
    }

    /// Records that the Classic ELB `name` exists (made, synced or listed by this process), in the VPC
    /// `vpc_id` if known.
    pub(super) async fn classic_load_balancer_seen(&self, name: &str, vpc_id: Option<&str>) {
        self.note_in_index(|k| {
            let known = k.classic.entry(name.to_owned()).or_default();
            if let Some(vpc) = vpc_id {
                *known = Some(vpc.to_owned());
            }
        })
        .await;
    }

    /// Records that the Classic ELB `name` is gone.
    pub(super) async fn classic_load_balancer_deleted(&self, name: &str) {
        self.note_in_index(|k| {
            k.classic.remove(name);
        })
        .await;
    }

    /// Whether an ELBv2 load balancer named `name` may exist (false only when this process knows it
    /// does not).
    pub(super) async fn elbv2_load_balancer_may_exist(&self, name: &str) -> Result<bool> {
        self.read_index(|k| k.load_balancers.contains(name)).await
    }

    /// Every target group tagged for `service_name` in the cluster `cluster_id` (found even when no
    /// load balancer uses it).
    pub(super) async fn tagged_target_groups(
        &self,
        service_name: &str,
        cluster_id: &str,
    ) -> Result<Vec<String>> {
        self.read_index(|k| k.target_groups_of(service_name, cluster_id))
            .await
    }

    /// Records that this process made the ELBv2 load balancer `name`.
    pub(super) async fn elbv2_load_balancer_created(&self, name: &str) {
        self.note_in_index(|k| {
            k.load_balancers.insert(name.to_owned());
        })
        .await;
    }

    /// Records that the ELBv2 load balancer `name` is gone.
    pub(super) async fn elbv2_load_balancer_deleted(&self, name: &str) {
        self.note_in_index(|k| {
            k.load_balancers.remove(name);
        })
        .await;
    }

    /// Records that this process made the target group `arn` with `tags`.
    pub(super) async fn target_group_created<'a>(
        &self,
        arn: &str,
        tags: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        if let Some(group) = TaggedGroup::from_tags(tags) {
            self.note_in_index(|k| {
                k.target_groups.insert(arn.to_owned(), group);
            })
            .await;
        }
    }

    /// Records that the target group `arn` is gone.
    pub(super) async fn target_group_deleted(&self, arn: &str) {
        self.note_in_index(|k| {
            k.target_groups.remove(arn);
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(service: &str, clusters: &[&str]) -> TaggedGroup {
        TaggedGroup {
            service: service.to_owned(),
            clusters: clusters
                .iter()
                .map(|c| format!("{TAG_CLUSTER_PREFIX}{c}"))
                .collect(),
        }
    }

    #[test]
    fn a_group_is_indexed_by_its_service_tag_and_cluster_tags_only() {
        let tags = [
            (TAG_SERVICE_NAME, "shop/web"),
            ("kubernetes.io/cluster/one", "owned"),
            ("kubernetes.io/cluster/two", "shared"),
            ("team", "payments"),
        ];
        assert_eq!(
            TaggedGroup::from_tags(tags),
            Some(group("shop/web", &["one", "two"]))
        );
        assert_eq!(
            TaggedGroup::from_tags([("kubernetes.io/cluster/one", "owned")]),
            None,
            "a group that names no Service is no Service's"
        );
    }

    #[test]
    fn a_services_groups_are_those_of_its_name_in_its_cluster() {
        let known = Known {
            classic: HashMap::new(),
            load_balancers: HashSet::new(),
            target_groups: [
                ("arn:b".to_owned(), group("shop/web", &["one"])),
                ("arn:a".to_owned(), group("shop/web", &["one", "two"])),
                ("arn:c".to_owned(), group("shop/web", &["two"])),
                ("arn:d".to_owned(), group("shop/api", &["one"])),
            ]
            .into(),
        };
        assert_eq!(
            known.target_groups_of("shop/web", "one"),
            ["arn:a", "arn:b"]
        );
        assert_eq!(
            known.target_groups_of("shop/web", "two"),
            ["arn:a", "arn:c"]
        );
        assert!(known.target_groups_of("shop/db", "one").is_empty());
    }
}
