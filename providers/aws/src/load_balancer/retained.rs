//! `ccm.rs/load-balancer-retain` on AWS: a Service that asks keeps its Classic ELB or NLB (its DNS
//! name, listeners, security groups and target groups) when it goes, and a later Service of the same
//! namespace and name adopts it.
//!
//! AWS cannot rename a load balancer, and the names this provider gives (the load balancer's, a Classic
//! ELB's group `k8s-elb-<name>`, an NLB's own group) derive from the Service's UID, which a later Service
//! does not share. So a kept load balancer records in its tags the UID its names derive from
//! (`ccm.rs/named-for-uid`) and whom it is kept for (`ccm.rs/retained-for: <namespace>/<name>`). The
//! next Service of that name adopts it at its first ensure (`ccm.rs/adopted-by: <its UID>`, the
//! retained tag removed), and from then on every name of that Service is computed from the recorded UID.
//! Target groups are named from the namespace, name and ports, so they follow on their own.
//!
//! A kept load balancer serves nothing: its targets (NLB) or instances (Classic ELB) are deregistered
//! when it is kept, and registered again by the adopter's ensure. The rules that let it reach the nodes
//! stay, for the adopter.
//!
//! What is kept and adopted is read from the cluster's load balancers' tags once per process, at its
//! first load-balancer call (one `DescribeLoadBalancers` per page of each kind, one `DescribeTags` per 20
//! load balancers), and from then on kept by this process's own writes, as the deletion index is: while
//! it leads, it is the only writer of the cluster's load balancers. An operator releases a kept one by
//! removing its `ccm.rs/retained-for` tag: the orphan sweep then deletes it, as it deletes any load
//! balancer no Service claims.

use std::{borrow::Cow, collections::BTreeMap};

use aws_sdk_elasticloadbalancing::types::{Tag as ClassicTag, TagKeyOnly};
use aws_sdk_elasticloadbalancingv2::types::Tag as Elbv2Tag;
use cloud_provider::{default_load_balancer_name, service_helpers::service_key};
use k8s_openapi::api::core::v1::Service;
use parking_lot::Mutex;

use super::{
    LoadBalancers,
    inventory::Tagged,
    spec::{Kind, TAG_SERVICE_NAME},
};
use crate::{Error, error::Result};

/// The tag on a kept load balancer naming the Service (`namespace/name`) it is kept for.
pub(super) const TAG_RETAINED_FOR: &str = "ccm.rs/retained-for";
/// The tag holding the UID the load balancer's names derive from (its first Service's).
pub(super) const TAG_NAMED_FOR_UID: &str = "ccm.rs/named-for-uid";
/// The tag holding the UID of the later Service that adopted it.
pub(super) const TAG_ADOPTED_BY: &str = "ccm.rs/adopted-by";

/// A load balancer kept for a Service that went, or adopted by a later one, as its tags say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Kept {
    /// Its name.
    pub(super) name: String,
    /// Classic ELB or NLB.
    pub(super) kind: Kind,
    /// Its ARN (an NLB's).
    pub(super) arn: Option<String>,
    /// `namespace/name` of the Service it was made and kept for.
    pub(super) service: String,
    /// The UID its names derive from.
    pub(super) named_for_uid: String,
    /// The UID of the Service that adopted it; `None` while it is kept for nobody in particular.
    pub(super) adopted_by: Option<String>,
}

impl Kept {
    /// What the tags of a listed load balancer say, when it is kept or adopted.
    pub(super) fn from_tags(lb: &Tagged) -> Option<Self> {
        let named_for_uid = lb.tags.get(TAG_NAMED_FOR_UID)?.clone();
        let retained_for = lb.tags.get(TAG_RETAINED_FOR);
        let adopted_by = lb
            .tags
            .get(TAG_ADOPTED_BY)
            .filter(|_| retained_for.is_none());
        let service = retained_for.or_else(|| lb.tags.get(TAG_SERVICE_NAME))?;
        if retained_for.is_none() && adopted_by.is_none() {
            return None;
        }
        Some(Self {
            name: lb.name.clone(),
            kind: lb.kind,
            arn: lb.arn.clone(),
            service: service.clone(),
            named_for_uid,
            adopted_by: adopted_by.cloned(),
        })
    }

    fn kind_name(&self) -> &'static str {
        kind_name(self.kind)
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Classic => "Classic ELB",
        Kind::Nlb => "NLB",
    }
}

/// How a Service's names are found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Naming<'a> {
    /// From its own UID.
    Own,
    /// From the UID of the kept load balancer it adopted.
    Adopted(&'a Kept),
    /// A load balancer is kept for its namespace and name, not adopted yet: its ensure adopts it.
    Adoptable(&'a Kept),
}

/// How the Service with `uid` is named, given what is kept for its namespace and name.
pub(super) fn naming<'a>(kept: Option<&'a Kept>, uid: &str) -> Naming<'a> {
    match kept {
        Some(k) if k.adopted_by.as_deref() == Some(uid) => Naming::Adopted(k),
        Some(k) if k.adopted_by.is_none() => Naming::Adoptable(k),
        // Adopted by another Service of this name, gone without this process seeing it go: the sweep
        // deletes it (no Service claims it).
        _ => Naming::Own,
    }
}

/// Why a kept load balancer cannot be adopted by a Service that asks for the other kind.
pub(super) fn kind_conflict(kept: &Kept, wanted: Kind, service: &str) -> Option<Error> {
    (kept.kind != wanted).then(|| Error::Service {
        service: service.to_owned(),
        field: "service.beta.kubernetes.io/aws-load-balancer-type".to_owned(),
        message: format!(
            "the {} {} is kept for this Service's name (ccm.rs/load-balancer-retain) and this Service \
             asks for an {}: ask for the kept kind to adopt it, or release it first (remove its tag {})",
            kept.kind_name(),
            kept.name,
            kind_name(wanted),
            TAG_RETAINED_FOR
        ),
    })
}

/// The Service as this provider names it: with `uid` in place of its own.
fn with_uid<'s>(service: &'s Service, uid: &str) -> Cow<'s, Service> {
    if service.metadata.uid.as_deref() == Some(uid) {
        return Cow::Borrowed(service);
    }
    let mut named = service.clone();
    named.metadata.uid = Some(uid.to_owned());
    Cow::Owned(named)
}

/// The kept and adopted load balancers by `namespace/name`; empty until the first load-balancer call.
#[derive(Default)]
pub(super) struct KeptIndex {
    by_service: tokio::sync::OnceCell<Mutex<BTreeMap<String, Kept>>>,
}

/// The index from a listing (when two are kept for one name, the first by name is taken, with a log
/// line: only one can be adopted).
fn index_of(listed: &[Tagged]) -> BTreeMap<String, Kept> {
    let mut by_service = BTreeMap::new();
    let mut kept: Vec<Kept> = listed.iter().filter_map(Kept::from_tags).collect();
    kept.sort_by(|a, b| a.name.cmp(&b.name));
    for k in kept {
        if let Some(first) = by_service.get(&k.service) {
            let first: &Kept = first;
            tracing::warn!(
                service = k.service,
                taken = first.name,
                left = k.name,
                "two load balancers are kept for one Service; the first by name is the one adopted"
            );
            continue;
        }
        by_service.insert(k.service.clone(), k);
    }
    by_service
}

impl KeptIndex {
    /// The UID the Service's names derive from when it adopted a kept load balancer, if the index is
    /// loaded (for `get_load_balancer_name`, which cannot ask AWS).
    pub(super) fn adopted_uid(&self, service: &Service) -> Option<String> {
        let uid = service.metadata.uid.as_deref()?;
        let index = self.by_service.get()?.lock();
        match naming(index.get(&service_key(service)), uid) {
            Naming::Adopted(k) => Some(k.named_for_uid.clone()),
            _ => None,
        }
    }

    /// Loads the index from a listing the sweep made, if nothing loaded it yet.
    pub(super) fn prime(&self, listed: &[Tagged]) {
        let _ = self.by_service.set(Mutex::new(index_of(listed)));
    }
}

impl LoadBalancers {
    /// The index, loaded from the cluster's load balancers at the first call.
    async fn kept_index(&self, cluster_id: &str) -> Result<&Mutex<BTreeMap<String, Kept>>> {
        self.kept
            .by_service
            // Boxed: the listing's future is deep, and every load-balancer call would hold it inline.
            .get_or_try_init(|| {
                Box::pin(async {
                    let listed = self.tagged_load_balancers(cluster_id).await?;
                    Ok::<_, Error>(Mutex::new(index_of(&listed)))
                })
            })
            .await
    }

    /// What is kept for the Service's namespace and name, and how the Service is named.
    async fn kept_for(&self, cluster_id: &str, service: &Service) -> Result<Option<Kept>> {
        let index = self.kept_index(cluster_id).await?;
        Ok(index.lock().get(&service_key(service)).cloned())
    }

    /// The Service as this provider names it: with the UID of the kept load balancer it adopted in
    /// place of its own, else as it is. Never adopts (see [`Self::adopting`]).
    pub(super) async fn named<'s>(
        &self,
        cluster_id: &str,
        service: &'s Service,
    ) -> Result<Cow<'s, Service>> {
        let uid = service.metadata.uid.as_deref().unwrap_or_default();
        let kept = self.kept_for(cluster_id, service).await?;
        Ok(match naming(kept.as_ref(), uid) {
            Naming::Adopted(k) => with_uid(service, &k.named_for_uid),
            Naming::Own | Naming::Adoptable(_) => Cow::Borrowed(service),
        })
    }

    /// As [`Self::named`], for an ensure of a Service that asks for a load balancer of `kind`: a load
    /// balancer kept for its namespace and name is adopted first (its tags say so), and refused when it
    /// is of the other kind. In a preview the adoption is recorded, not made.
    pub(super) async fn adopting<'s>(
        &self,
        cluster_id: &str,
        service: &'s Service,
        kind: Kind,
    ) -> Result<Cow<'s, Service>> {
        let uid = service.metadata.uid.as_deref().unwrap_or_default();
        let kept = self.kept_for(cluster_id, service).await?;
        let k = match naming(kept.as_ref(), uid) {
            Naming::Own => return Ok(Cow::Borrowed(service)),
            Naming::Adopted(k) => return Ok(with_uid(service, &k.named_for_uid)),
            Naming::Adoptable(k) => k,
        };
        if let Some(refused) = kind_conflict(k, kind, &service_key(service)) {
            return Err(refused);
        }
        if self.previewed(|| {
            format!(
                "the {} {} kept for this Service's name would be adopted",
                k.kind_name(),
                k.name
            )
        }) {
            return Ok(with_uid(service, &k.named_for_uid));
        }
        self.tag_kept(k, &[(TAG_ADOPTED_BY, uid)], &[TAG_RETAINED_FOR])
            .await?;
        tracing::info!(
            load_balancer = k.name,
            uid,
            "adopted the {} kept for this Service's name",
            k.kind_name()
        );
        let named_for_uid = k.named_for_uid.clone();
        if let Some(entry) = self
            .kept_index(cluster_id)
            .await?
            .lock()
            .get_mut(&service_key(service))
        {
            entry.adopted_by = Some(uid.to_owned());
        }
        Ok(with_uid(service, &named_for_uid))
    }

    /// Keeps the Service's load balancer for a later Service of its name: tagged as kept, its backends
    /// deregistered. Succeeds when there is none.
    pub(super) async fn retain(&self, cluster_id: &str, service: &Service) -> Result<()> {
        let named = self.named(cluster_id, service).await?;
        let name = default_load_balancer_name(&named);
        let named_for_uid = named.metadata.uid.clone().unwrap_or_default();
        let key = service_key(service);
        let mut classic = None;
        let kept = if let Some(lb) = self.describe_nlb(&name).await? {
            let arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
            Kept {
                name: name.clone(),
                kind: Kind::Nlb,
                arn: Some(arn),
                service: key.clone(),
                named_for_uid,
                adopted_by: None,
            }
        } else if let Some(lb) = self.describe_classic(&name).await? {
            classic = Some(lb);
            Kept {
                name: name.clone(),
                kind: Kind::Classic,
                arn: None,
                service: key.clone(),
                named_for_uid,
                adopted_by: None,
            }
        } else {
            tracing::info!(
                load_balancer = name,
                "no load balancer to keep: none exists"
            );
            return Ok(());
        };
        // Tagged first: a retry after a failure half-way finds it kept and deregisters what is left.
        self.tag_kept(
            &kept,
            &[
                (TAG_RETAINED_FOR, key.as_str()),
                (TAG_NAMED_FOR_UID, kept.named_for_uid.as_str()),
            ],
            &[TAG_ADOPTED_BY],
        )
        .await?;
        match kept.kind {
            Kind::Nlb => {
                for group in self
                    .target_groups_of(kept.arn.as_deref().unwrap_or_default())
                    .await?
                {
                    let port = group.port().unwrap_or_default();
                    self.sync_targets(group.target_group_arn().unwrap_or_default(), port, &[])
                        .await?;
                }
            }
            Kind::Classic => {
                if let Some(lb) = &classic {
                    self.sync_classic_instances(lb, &[]).await?;
                }
            }
        }
        tracing::info!(
            load_balancer = name,
            "kept the {} for a later Service of this name",
            kept.kind_name()
        );
        self.kept_index(cluster_id).await?.lock().insert(key, kept);
        Ok(())
    }

    /// Forgets what is kept under the load balancer `name` (deleted).
    pub(super) async fn kept_deleted(&self, name: &str) {
        if let Some(index) = self.kept.by_service.get() {
            index.lock().retain(|_, k| k.name != name);
        }
    }

    /// Adds `add` to the kept load balancer's tags and removes `remove`.
    async fn tag_kept(&self, kept: &Kept, add: &[(&str, &str)], remove: &[&str]) -> Result<()> {
        match (kept.kind, kept.arn.as_deref()) {
            (Kind::Nlb, Some(arn)) => {
                let elbv2 = &self.calls.clients.elbv2;
                let tags: Vec<Elbv2Tag> = add
                    .iter()
                    .map(|(k, v)| Elbv2Tag::builder().key(*k).value(*v).build())
                    .collect();
                self.calls
                    .call("elbv2:AddTags", || {
                        elbv2
                            .add_tags()
                            .resource_arns(arn)
                            .set_tags(Some(tags.clone()))
                            .send()
                    })
                    .await?;
                self.calls
                    .call("elbv2:RemoveTags", || {
                        elbv2
                            .remove_tags()
                            .resource_arns(arn)
                            .set_tag_keys(Some(remove.iter().map(|k| (*k).to_owned()).collect()))
                            .send()
                    })
                    .await?;
            }
            _ => {
                let elb = &self.calls.clients.elb;
                let tags: Vec<ClassicTag> = add
                    .iter()
                    .filter_map(|(k, v)| ClassicTag::builder().key(*k).value(*v).build().ok())
                    .collect();
                self.calls
                    .call("elb:AddTags", || {
                        elb.add_tags()
                            .load_balancer_names(&kept.name)
                            .set_tags(Some(tags.clone()))
                            .send()
                    })
                    .await?;
                let keys: Vec<TagKeyOnly> = remove
                    .iter()
                    .map(|k| TagKeyOnly::builder().key(*k).build())
                    .collect();
                self.calls
                    .call("elb:RemoveTags", || {
                        elb.remove_tags()
                            .load_balancer_names(&kept.name)
                            .set_tags(Some(keys.clone()))
                            .send()
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(name: &str, kind: Kind, tags: &[(&str, &str)]) -> Tagged {
        Tagged {
            name: name.to_owned(),
            kind,
            arn: None,
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn kept(name: &str, adopted_by: Option<&str>) -> Kept {
        Kept {
            name: name.to_owned(),
            kind: Kind::Nlb,
            arn: None,
            service: "shop/web".to_owned(),
            named_for_uid: "u0".to_owned(),
            adopted_by: adopted_by.map(str::to_owned),
        }
    }

    #[test]
    fn tags_say_what_is_kept_and_adopted() {
        // The tags, and what they say: kept for whom, adopted by whom.
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<(&'a str, Option<&'a str>)>);
        let cases: [Case; 5] = [
            // Made and never kept.
            (&[(TAG_SERVICE_NAME, "shop/web")], None),
            // Kept for its Service.
            (
                &[
                    (TAG_SERVICE_NAME, "shop/web"),
                    (TAG_RETAINED_FOR, "shop/web"),
                    (TAG_NAMED_FOR_UID, "u0"),
                ],
                Some(("shop/web", None)),
            ),
            // Adopted by a later one.
            (
                &[
                    (TAG_SERVICE_NAME, "shop/web"),
                    (TAG_NAMED_FOR_UID, "u0"),
                    (TAG_ADOPTED_BY, "u1"),
                ],
                Some(("shop/web", Some("u1"))),
            ),
            // Kept again after an adoption whose tag a failed write left: kept wins.
            (
                &[
                    (TAG_RETAINED_FOR, "shop/web"),
                    (TAG_NAMED_FOR_UID, "u0"),
                    (TAG_ADOPTED_BY, "u1"),
                ],
                Some(("shop/web", None)),
            ),
            // Without the UID its names derive from, nothing can adopt it.
            (&[(TAG_RETAINED_FOR, "shop/web")], None),
        ];
        for (tags, expected) in cases {
            let got = Kept::from_tags(&tagged("a1", Kind::Nlb, tags));
            assert_eq!(
                got.as_ref()
                    .map(|k| (k.service.as_str(), k.adopted_by.as_deref())),
                expected,
                "{tags:?}"
            );
            if let Some(k) = got {
                assert_eq!(k.named_for_uid, "u0");
                assert_eq!(k.name, "a1");
            }
        }
    }

    #[test]
    fn a_service_is_named_for_what_it_adopted() {
        let free = kept("a0", None);
        let adopted = kept("a0", Some("u1"));
        assert_eq!(naming(None, "u1"), Naming::Own);
        assert_eq!(naming(Some(&free), "u1"), Naming::Adoptable(&free));
        assert_eq!(naming(Some(&adopted), "u1"), Naming::Adopted(&adopted));
        assert_eq!(naming(Some(&adopted), "u2"), Naming::Own);
        // The Service that kept it, back as a LoadBalancer, adopts it again.
        assert_eq!(naming(Some(&free), "u0"), Naming::Adoptable(&free));
    }

    #[test]
    fn an_adopter_of_the_other_kind_is_refused_by_name() {
        let nlb = kept("a0", None);
        assert!(kind_conflict(&nlb, Kind::Nlb, "shop/web").is_none());
        let refused = kind_conflict(&nlb, Kind::Classic, "shop/web")
            .unwrap()
            .to_string();
        assert!(refused.contains("NLB a0 is kept"), "{refused}");
        assert!(refused.contains("Classic ELB"), "{refused}");
        assert!(refused.contains("shop/web"), "{refused}");
    }

    #[test]
    fn one_kept_load_balancer_per_name() {
        let tags = [(TAG_RETAINED_FOR, "shop/web"), (TAG_NAMED_FOR_UID, "u0")];
        let index = index_of(&[
            tagged("b", Kind::Nlb, &tags),
            tagged("a", Kind::Classic, &tags),
            tagged("c", Kind::Nlb, &[(TAG_SERVICE_NAME, "shop/other")]),
        ]);
        assert_eq!(index.len(), 1);
        assert_eq!(index["shop/web"].name, "a");
    }

    #[test]
    fn a_service_named_for_another_uid_keeps_everything_else() {
        let mut service = Service::default();
        service.metadata.name = Some("web".into());
        service.metadata.uid = Some("u1".into());
        assert!(matches!(with_uid(&service, "u1"), Cow::Borrowed(_)));
        let named = with_uid(&service, "u0");
        assert_eq!(named.metadata.uid.as_deref(), Some("u0"));
        assert_eq!(named.metadata.name.as_deref(), Some("web"));
    }
}
