//! Service load balancers: Classic ELB by default, NLB with `aws-load-balancer-type: nlb`, named and
//! tagged as cloud-provider-aws names and tags them, so a cluster that switches adopts what it has.
//!
//! Every step looks before it writes, so a sync that finds everything in place makes no AWS write, and a
//! sync that failed half-way is finished by the next one (the load balancer and target groups are found
//! by their deterministic names). Deletion finds what is left by name and by tag, so it also removes
//! what a failed creation left behind.

pub mod annotations;
mod cidr_rules;
mod classic;
mod deletion_index;
mod inventory;
mod lookups;
mod network;
mod nlb;
mod nlb_security_group;
mod plan;
mod retained;
mod security_groups;
pub mod spec;

pub use nlb::target_group_name;
pub use nlb_security_group::own_group_name as nlb_security_group_name;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, Ipv6Range};
use cloud_provider::{
    CloudResult, ClusterLoadBalancer, LoadBalancer, LoadBalancerPreview,
    default_load_balancer_name, service_helpers::service_key,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::{
    Config, Error,
    error::Result,
    instances::{Describer, InstanceInfo, Key},
    sdk::Calls,
};
use plan::Plan;
use spec::{Kind, LbSpec, TAG_CLUSTER_PREFIX};

/// How long a backend's instance, once looked up, is taken as it was: a burst of node syncs over many
/// load balancers looks each node's instance up once in this time, not once per load balancer. A node
/// whose instance stopped meanwhile is registered for at most this long (AWS refuses a terminated
/// instance, and the sync is tried again); upstream's instance cache keeps its answers 10 minutes.
const BACKENDS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// The load balancers of one provider.
pub struct LoadBalancers {
    calls: Calls,
    describer: Arc<Describer>,
    config: Arc<Config>,
    /// Set in a preview: writes are recorded here instead of made.
    plan: Option<Arc<Mutex<Plan>>>,
    /// The region's load balancers (both kinds) and tagged target groups, for deletions.
    deletion_index: Arc<deletion_index::DeletionIndex>,
    /// The load balancers kept for a Service that went, or adopted by a later one
    /// (`ccm.rs/load-balancer-retain`).
    kept: Arc<retained::KeptIndex>,
    /// The look-ups by name of this call path (a sync's, or a preview's).
    lookups: Arc<lookups::Lookups>,
    /// The previews' look-ups (kept apart so a sync never waits on a preview's budget).
    preview_lookups: Arc<lookups::Lookups>,
    /// The previews' instance describer (read-only: each batch takes one token of their budget).
    preview_describer: Arc<Describer>,
}

impl LoadBalancers {
    /// Load balancers through `calls`, finding instances with `describer`.
    pub fn new(calls: Calls, describer: Arc<Describer>, config: Arc<Config>) -> Self {
        Self {
            calls,
            config,
            plan: None,
            deletion_index: Arc::default(),
            kept: Arc::default(),
            lookups: Arc::default(),
            preview_lookups: Arc::default(),
            preview_describer: Arc::new(describer.read_only()),
            describer,
        }
    }

    /// The same load balancers recording into a fresh plan what a sync would write (with a call path
    /// that refuses writes, should a write site forget to ask [`Self::previewed`]).
    fn previewing(&self) -> (Self, Arc<Mutex<Plan>>) {
        let plan = Arc::new(Mutex::new(Plan::default()));
        let this = Self {
            calls: self.calls.read_only(),
            describer: self.preview_describer.clone(),
            config: self.config.clone(),
            plan: Some(plan.clone()),
            deletion_index: self.deletion_index.clone(),
            kept: self.kept.clone(),
            lookups: self.preview_lookups.clone(),
            preview_lookups: self.preview_lookups.clone(),
            preview_describer: self.preview_describer.clone(),
        };
        (this, plan)
    }

    /// In a preview, records `change` and answers true: the caller skips its write. Otherwise false.
    fn previewed(&self, change: impl FnOnce() -> String) -> bool {
        match &self.plan {
            Some(plan) => {
                plan.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .change(change());
                true
            }
            None => false,
        }
    }

    /// In a preview, records that the load balancer would be created (`change` says which) and answers
    /// true: the caller skips the creation and everything after it. Otherwise false.
    fn previewed_creation(&self, change: impl FnOnce() -> String) -> bool {
        match &self.plan {
            Some(plan) => {
                let mut plan = plan.lock().unwrap_or_else(|e| e.into_inner());
                plan.creates = true;
                plan.change(change());
                true
            }
            None => false,
        }
    }

    /// In a preview, records backends (instance IDs) to register and deregister and answers true.
    fn previewed_backends<'a>(
        &self,
        added: impl IntoIterator<Item = &'a str>,
        removed: impl IntoIterator<Item = &'a str>,
    ) -> bool {
        match &self.plan {
            Some(plan) => {
                plan.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .backends(added, removed);
                true
            }
            None => false,
        }
    }

    /// Node names for instance IDs: the node of `nodes` behind each, else the instance's private DNS
    /// name (upstream's node name), else the ID itself.
    async fn node_names(
        &self,
        ids: &std::collections::BTreeSet<String>,
        nodes: &[(String, String)],
    ) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for id in ids {
            if let Some((_, node)) = nodes.iter().find(|(i, _)| i == id) {
                names.push(node.clone());
                continue;
            }
            let found = self
                .describer
                .find_recent(&Key::Id(id.clone()), BACKENDS_MAX_AGE)
                .await?;
            names.push(
                found
                    .map(|i| i.private_dns)
                    .filter(|d| !d.is_empty())
                    .unwrap_or_else(|| id.clone()),
            );
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The instances behind `nodes` (terminated ones and nodes without one left out), each with the
    /// name of its node: looked up at once, so the describer batches them into one call.
    async fn node_instances(&self, nodes: &[&Node]) -> Result<Vec<(InstanceInfo, String)>> {
        let lookups = nodes.iter().map(|n| async move {
            let key = Key::of(n)?;
            let found = self.describer.find_recent(&key, BACKENDS_MAX_AGE).await?;
            Ok::<_, Error>(found.map(|i| (i, n.metadata.name.clone().unwrap_or_default())))
        });
        Ok(futures::future::try_join_all(lookups)
            .await?
            .into_iter()
            .flatten()
            .filter(|(i, _)| !i.is_terminated())
            .collect())
    }

    /// The cluster ID in tags: the cloud-config's, else the manager's `--cluster-name`.
    fn cluster_id<'a>(&'a self, cluster_name: &'a str) -> &'a str {
        self.config.cluster_id().unwrap_or(cluster_name)
    }

    fn spec(&self, cluster_name: &str, service: &Service) -> Result<LbSpec> {
        let mut spec = LbSpec::from_service(
            service,
            self.cluster_id(cluster_name),
            default_load_balancer_name(service),
            &self.config.global,
        )?;
        spec.own_group_name = own_group_of(cluster_name, service);
        Ok(spec)
    }

    /// The instances behind `nodes` (nodes whose instance is not found are left out).
    async fn instances(&self, nodes: &[&Node]) -> Result<Vec<InstanceInfo>> {
        let lookups = nodes.iter().map(|n| async move {
            let key = Key::of(n)?;
            self.describer.find_recent(&key, BACKENDS_MAX_AGE).await
        });
        let mut out: Vec<InstanceInfo> = futures::future::try_join_all(lookups)
            .await?
            .into_iter()
            .flatten()
            .filter(|i| !i.is_terminated())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.dedup_by(|a, b| a.id == b.id);
        Ok(out)
    }
}

/// Which CIDR rules of a group [`LoadBalancers::sync_cidr_rules`] manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RuleScope {
    /// Those carrying the given description (a group shared with others: the nodes').
    Described,
    /// All of them (a group made for one load balancer: a Classic ELB's `k8s-elb-<name>`).
    WholeGroup,
}

/// Upstream's name of the Service's NLB's own security group ([`nlb_security_group::own_group_name`]).
fn own_group_of(cluster_name: &str, service: &Service) -> String {
    nlb_security_group::own_group_name(
        cluster_name,
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default(),
        service.metadata.uid.as_deref().unwrap_or_default(),
    )
}

fn hostname_status(dns_name: Option<&str>) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: dns_name.filter(|d| !d.is_empty()).map(|d| {
            vec![LoadBalancerIngress {
                hostname: Some(d.to_owned()),
                ..Default::default()
            }]
        }),
    }
}

#[cloud_provider::async_trait]
impl LoadBalancer for LoadBalancers {
    #[tracing::instrument(skip_all, fields(service = service.metadata.name.as_deref().unwrap_or("")))]
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let service = &*self.named(self.cluster_id(cluster_name), service).await?;
        let name = default_load_balancer_name(service);
        // The type annotation may be malformed; look for both kinds then.
        let kind = self.spec(cluster_name, service).map(|s| s.kind).ok();
        // What is found is noted in the deletion index (if loaded): the service controller asks this
        // before each deletion, so a load balancer made by someone else after the listing is deleted too.
        if kind != Some(Kind::Classic)
            && let Some(lb) = self.describe_nlb(&name).await?
        {
            self.elbv2_load_balancer_created(&name).await;
            return Ok(Some(hostname_status(lb.dns_name())));
        }
        if kind != Some(Kind::Nlb)
            && let Some(lb) = self.describe_classic(&name).await?
        {
            self.classic_load_balancer_seen(&name, lb.vpc_id()).await;
            return Ok(Some(hostname_status(lb.dns_name())));
        }
        Ok(None)
    }

    #[tracing::instrument(skip_all, fields(service = service.metadata.name.as_deref().unwrap_or("")))]
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let kind = self.spec(cluster_name, service)?.kind;
        let service = &*self
            .adopting(self.cluster_id(cluster_name), service, kind)
            .await?;
        let spec = self.spec(cluster_name, service)?;
        let instances = self.instances(&spec.target_nodes(nodes)).await?;
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        Ok(match spec.kind {
            Kind::Nlb => self.ensure_nlb(&spec, &instances, &cluster_id).await?,
            Kind::Classic => self.ensure_classic(&spec, &instances, &cluster_id).await?,
        })
    }

    #[tracing::instrument(skip_all, fields(service = service.metadata.name.as_deref().unwrap_or("")))]
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let service = &*self.named(self.cluster_id(cluster_name), service).await?;
        let spec = self.spec(cluster_name, service)?;
        let instances = self.instances(&spec.target_nodes(nodes)).await?;
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        match spec.kind {
            Kind::Nlb => {
                self.update_nlb_targets(&spec, &instances, &cluster_id)
                    .await?
            }
            Kind::Classic => {
                self.update_classic_instances(&spec, &instances, &cluster_id)
                    .await?
            }
        }
        Ok(())
    }

    /// Runs the sync of [`LoadBalancer::ensure_load_balancer`] with every write recorded instead of made.
    #[tracing::instrument(skip_all, fields(service = service.metadata.name.as_deref().unwrap_or("")))]
    async fn preview_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        let kind = self.spec(cluster_name, service)?.kind;
        let (preview, plan) = self.previewing();
        let service = &*preview
            .adopting(self.cluster_id(cluster_name), service, kind)
            .await?;
        let spec = self.spec(cluster_name, service)?;
        let targets = spec.target_nodes(nodes);
        // The look-up goes through the previews' describer (one DescribeInstances for every node, batched
        // with the other previews under way), whose batch takes one token of their budget.
        let found = preview.node_instances(&targets).await?;
        let named: Vec<(String, String)> = found
            .iter()
            .map(|(i, name)| (i.id.clone(), name.clone()))
            .collect();
        // The same instances `instances` would find (sorted, one each), from the lookup above.
        let mut instances: Vec<InstanceInfo> = found.into_iter().map(|(i, _)| i).collect();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        instances.dedup_by(|a, b| a.id == b.id);
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        match spec.kind {
            Kind::Nlb => preview.ensure_nlb(&spec, &instances, &cluster_id).await?,
            Kind::Classic => {
                preview
                    .ensure_classic(&spec, &instances, &cluster_id)
                    .await?
            }
        };
        let plan = std::mem::take(&mut *plan.lock().unwrap_or_else(|e| e.into_inner()));
        // No load balancer (the sync stopped where it would create one): its backends would be new.
        if plan.creates {
            let mut backends: Vec<String> = named.into_iter().map(|(_, n)| n).collect();
            backends.sort();
            backends.dedup();
            return Ok(LoadBalancerPreview::Create { backends });
        }
        if plan.added.is_empty() && plan.removed.is_empty() && plan.changes.is_empty() {
            return Ok(LoadBalancerPreview::UpToDate);
        }
        Ok(LoadBalancerPreview::Change {
            backends_added: preview.node_names(&plan.added, &named).await?,
            backends_removed: preview.node_names(&plan.removed, &named).await?,
            detail: plan.changes.join("; "),
        })
    }

    #[tracing::instrument(skip_all, fields(service = service.metadata.name.as_deref().unwrap_or("")))]
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let service = &*self.named(self.cluster_id(cluster_name), service).await?;
        let name = default_load_balancer_name(service);
        let service_name = service_key(service);
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        // Both kinds: the Service's type annotation may have changed since its load balancer was made.
        let own_group = own_group_of(cluster_name, service);
        self.delete_nlb(&name, &service_name, Some(&own_group), &cluster_id)
            .await?;
        self.delete_classic(&name, &cluster_id).await?;
        self.kept_deleted(&name).await;
        Ok(())
    }

    fn get_load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        match self.kept.adopted_uid(service) {
            Some(uid) => {
                let mut named = service.clone();
                named.metadata.uid = Some(uid);
                default_load_balancer_name(&named)
            }
            None => default_load_balancer_name(service),
        }
    }

    /// Keeps its Classic ELB or NLB, tagged, without backends (see `retained`).
    fn retains_load_balancers(&self) -> bool {
        true
    }

    #[tracing::instrument(skip_all, fields(service = service.metadata.name.as_deref().unwrap_or("")))]
    async fn retain_load_balancer(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        Ok(self.retain(self.cluster_id(cluster_name), service).await?)
    }

    /// Every Classic ELB and NLB tagged for the cluster (`kubernetes.io/cluster/<id>`).
    async fn list_load_balancers(
        &self,
        cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        let tagged = self.tagged_load_balancers(&cluster_id).await?;
        self.kept.prime(&tagged);
        Ok(inventory::listed(&tagged))
    }

    #[tracing::instrument(skip_all, fields(load_balancer = load_balancer.name))]
    async fn delete_orphaned_load_balancer(
        &self,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        let service_name = load_balancer
            .service
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        if load_balancer.handle == inventory::NLB {
            // Listed just now: whatever the index knew, it exists.
            self.elbv2_load_balancer_created(&load_balancer.name).await;
            // The Service is gone, and its UID with it: the NLB's groups are found on the NLB.
            self.delete_nlb(&load_balancer.name, &service_name, None, &cluster_id)
                .await?;
        } else {
            // Listed just now, its VPC not with it: described when deleted.
            self.classic_load_balancer_seen(&load_balancer.name, None)
                .await;
            self.delete_classic(&load_balancer.name, &cluster_id)
                .await?;
        }
        self.kept_deleted(&load_balancer.name).await;
        Ok(())
    }
}
/// The one thing `operation` made, the first of `items` it answered, else [`Error::Response`] saying
/// the `missing` thing.
fn created<T: Clone>(items: &[T], operation: &'static str, missing: &'static str) -> Result<T> {
    items
        .first()
        .cloned()
        .ok_or(Error::Response { operation, missing })
}

/// The error of a backend update that finds no load balancer of the Service's.
fn not_found(spec: &LbSpec) -> Error {
    Error::Setup(format!(
        "load balancer {} of {} not found",
        spec.name, spec.service_name
    ))
}

/// `delete` tried again, up to 5 times a second apart, while AWS answers that what it deletes is
/// still in use ([`Error::StillInUse`]: a load balancer's parts, for a moment after it went).
async fn deleted_once_released<F, Fut>(mut delete: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut attempt = 0;
    loop {
        match delete().await {
            Err(Error::StillInUse(_)) if attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

/// Every item of a listing AWS pages with a marker (ELB, ELBv2): `page` fetches the page after `marker`
/// (`None`: the first) and answers its items and the next marker (`None` or empty: the last page).
async fn all_pages<T, F, Fut>(mut page: F) -> Result<Vec<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, Option<String>)>>,
{
    let mut all = Vec::new();
    let mut marker = None;
    loop {
        let (items, next) = page(marker.take()).await?;
        all.extend(items);
        match next.filter(|m| !m.is_empty()) {
            Some(next) => marker = Some(next),
            None => return Ok(all),
        }
    }
}
