//! Service load balancers: Classic ELB by default, NLB with `aws-load-balancer-type: nlb`, named and
//! tagged as cloud-provider-aws names and tags them, so a cluster that switches adopts what it has.
//!
//! Every step looks before it writes, so a sync that finds everything in place makes no AWS write, and a
//! sync that failed half-way is finished by the next one (the load balancer and target groups are found
//! by their deterministic names). Deletion finds what is left by name and by tag, so it also removes
//! what a failed creation left behind.

pub mod annotations;
mod classic;
mod deletion_index;
mod inventory;
mod lookups;
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
    CloudResult, ClusterLoadBalancer, LoadBalancer, LoadBalancerPreview, default_load_balancer_name,
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
            let found = self.describer.find(&Key::Id(id.clone())).await?;
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
            let found = self.describer.find(&key).await?;
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
        spec.own_group_name = nlb_security_group::own_group_name(
            cluster_name,
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default(),
            service.metadata.uid.as_deref().unwrap_or_default(),
        );
        Ok(spec)
    }

    /// The instances behind `nodes` (nodes whose instance is not found are left out).
    async fn instances(&self, nodes: &[&Node]) -> Result<Vec<InstanceInfo>> {
        let lookups = nodes.iter().map(|n| async move {
            let key = Key::of(n)?;
            self.describer.find(&key).await
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

    /// The VPC: `VPC` from the cloud-config, else the backends' VPC.
    async fn vpc_id(&self, instances: &[InstanceInfo]) -> Result<String> {
        if let Some(vpc) = &self.config.global.vpc {
            return Ok(vpc.clone());
        }
        if let Some(subnet) = &self.config.global.subnet_id {
            let ec2 = &self.calls.clients.ec2;
            let out = self
                .calls
                .call("DescribeSubnets", || {
                    ec2.describe_subnets().subnet_ids(subnet).send()
                })
                .await?;
            if let Some(vpc) = out.subnets().first().and_then(|s| s.vpc_id()) {
                return Ok(vpc.to_owned());
            }
        }
        instances
            .iter()
            .map(|i| i.vpc_id.clone())
            .find(|v| !v.is_empty())
            .ok_or_else(|| {
                Error::Setup(
                    "cannot tell the cluster's VPC: set VPC in [Global] of the cloud-config, or give the Service backend nodes".into(),
                )
            })
    }

    /// The subnets: the annotation's (IDs, or `Name` tags), else one per zone among the VPC's subnets
    /// tagged for the cluster, preferring the role tag (`kubernetes.io/role/elb`, or
    /// `kubernetes.io/role/internal-elb` for internal load balancers), then the lowest ID.
    async fn subnets(&self, spec: &LbSpec, vpc_id: &str, cluster_id: &str) -> Result<Vec<String>> {
        let ec2 = &self.calls.clients.ec2;
        let vpc_filter = Filter::builder().name("vpc-id").values(vpc_id).build();
        if !spec.subnets.is_empty() {
            let (ids, names): (Vec<String>, Vec<String>) = spec
                .subnets
                .iter()
                .cloned()
                .partition(|s| s.starts_with("subnet-"));
            let mut found = Vec::new();
            for (filter, values) in [("subnet-id", ids), ("tag:Name", names)] {
                if values.is_empty() {
                    continue;
                }
                let f = Filter::builder()
                    .name(filter)
                    .set_values(Some(values.clone()))
                    .build();
                let out = self
                    .calls
                    .call("DescribeSubnets", || {
                        ec2.describe_subnets()
                            .filters(vpc_filter.clone())
                            .filters(f.clone())
                            .send()
                    })
                    .await?;
                if spec.dual_stack
                    && let Some(s) = out.subnets().iter().find(|s| !has_ipv6_cidr(s))
                {
                    return Err(Error::Service {
                        service: spec.service_name.clone(),
                        field: spec::ANNOTATION_SUBNETS.to_owned(),
                        message: format!(
                            "subnet {} has no IPv6 CIDR, and a dual-stack NLB (ip-address-type: dualstack) needs one in each of its subnets",
                            s.subnet_id().unwrap_or_default()
                        ),
                    });
                }
                found.extend(
                    out.subnets()
                        .iter()
                        .filter_map(|s| s.subnet_id().map(str::to_owned)),
                );
            }
            if found.len() != spec.subnets.len() {
                return Err(Error::Service {
                    service: spec.service_name.clone(),
                    field: spec::ANNOTATION_SUBNETS.to_owned(),
                    message: format!(
                        "{:?} match {} subnets in {vpc_id}, expected one each",
                        spec.subnets,
                        found.len()
                    ),
                });
            }
            found.sort();
            return Ok(found);
        }
        let out = self
            .calls
            .call("DescribeSubnets", || {
                ec2.describe_subnets().filters(vpc_filter.clone()).send()
            })
            .await?;
        let role = if spec.internal {
            "kubernetes.io/role/internal-elb"
        } else {
            "kubernetes.io/role/elb"
        };
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let mut best: BTreeMap<String, (bool, String)> = BTreeMap::new();
        for s in out.subnets() {
            let tags: BTreeMap<&str, &str> = s
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default())))
                .collect();
            if !tags.contains_key(cluster_tag.as_str()) || (spec.dual_stack && !has_ipv6_cidr(s)) {
                continue;
            }
            let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) else {
                continue;
            };
            let has_role = tags.get(role).is_some_and(|v| v.is_empty() || *v == "1");
            let candidate = (!has_role, id.to_owned());
            let entry = best.entry(zone.to_owned()).or_insert(candidate.clone());
            if candidate < *entry {
                *entry = candidate;
            }
        }
        if best.is_empty() && spec.dual_stack {
            return Err(Error::Service {
                service: spec.service_name.clone(),
                field: spec::ANNOTATION_IP_ADDRESS_TYPE.to_owned(),
                message: format!(
                    "a dual-stack NLB needs subnets with an IPv6 CIDR, and none in {vpc_id} tagged {cluster_tag} has one"
                ),
            });
        }
        if best.is_empty() {
            return Err(Error::Setup(format!(
                "could not find any suitable subnets for creating the ELB: none in {vpc_id} carries the tag {cluster_tag}"
            )));
        }
        Ok(best.into_values().map(|(_, id)| id).collect())
    }

    /// The security group of each backend that load-balancer traffic is opened in: the instance's group
    /// tagged for the cluster, else its first.
    async fn node_security_groups(
        &self,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<Vec<String>> {
        let mut all: Vec<String> = instances
            .iter()
            .flat_map(|i| i.security_groups.clone())
            .collect();
        all.sort();
        all.dedup();
        if all.is_empty() {
            return Ok(Vec::new());
        }
        let ec2 = &self.calls.clients.ec2;
        let out = self
            .calls
            .call("DescribeSecurityGroups", || {
                ec2.describe_security_groups()
                    .set_group_ids(Some(all.clone()))
                    .send()
            })
            .await?;
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let tagged: Vec<&str> = out
            .security_groups()
            .iter()
            .filter(|g| {
                g.tags()
                    .iter()
                    .any(|t| t.key() == Some(cluster_tag.as_str()))
            })
            .filter_map(|g| g.group_id())
            .collect();
        let mut groups: Vec<String> = instances
            .iter()
            .filter_map(|i| {
                i.security_groups
                    .iter()
                    .find(|g| tagged.contains(&g.as_str()))
                    .or(i.security_groups.first())
                    .cloned()
            })
            .collect();
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    /// Makes the CIDR ingress rules of `group` that are ours exactly `desired` (each a protocol, a port
    /// range and an IPv4 or IPv6 CIDR): authorizes the missing, revokes the extra, writes nothing when equal. Ours are
    /// those that carry `description`, or, with [`RuleScope::WholeGroup`] (a group made for one load
    /// balancer), all of them. A desired rule the group has already, whatever its description (one
    /// cloud-provider-aws authorized without any), is kept as it is: EC2 tells rules apart by protocol,
    /// ports and source alone, and answers a second one `InvalidPermission.Duplicate`.
    async fn sync_cidr_rules(
        &self,
        group: &str,
        description: &str,
        scope: RuleScope,
        desired: &[(String, i32, i32, String)],
    ) -> Result<bool> {
        let ec2 = &self.calls.clients.ec2;
        let out = self
            .calls
            .call("DescribeSecurityGroups", || {
                ec2.describe_security_groups().group_ids(group).send()
            })
            .await?;
        self.sync_read_cidr_rules(group, out.security_groups(), description, scope, desired)
            .await
    }

    /// [`Self::sync_cidr_rules`] for the group `group` as `read` moments ago (by the caller that found
    /// it, which spares a second read of it).
    async fn sync_read_cidr_rules(
        &self,
        group: &str,
        read: &[aws_sdk_ec2::types::SecurityGroup],
        description: &str,
        scope: RuleScope,
        desired: &[(String, i32, i32, String)],
    ) -> Result<bool> {
        let ec2 = &self.calls.clients.ec2;
        // Every CIDR rule of the group, and which of them are ours.
        let (mut present, mut existing) = (Vec::new(), Vec::new());
        for g in read {
            for p in g.ip_permissions() {
                let v4 = p.ip_ranges().iter().map(|r| (r.cidr_ip(), r.description()));
                let v6 = p
                    .ipv6_ranges()
                    .iter()
                    .map(|r| (r.cidr_ipv6(), r.description()));
                for (cidr, rule_description) in v4.chain(v6) {
                    let rule = (
                        p.ip_protocol().unwrap_or_default().to_owned(),
                        p.from_port().unwrap_or(0),
                        p.to_port().unwrap_or(0),
                        cidr.unwrap_or_default().to_owned(),
                    );
                    if scope == RuleScope::WholeGroup || rule_description == Some(description) {
                        existing.push(rule.clone());
                    }
                    present.push(rule);
                }
            }
        }
        // A group of one load balancer's own carries its rules undescribed, as upstream authorizes them
        // (so a hand-over either way finds the group exactly as its manager would make it).
        let described = (scope == RuleScope::Described).then_some(description);
        let perm = |(proto, from, to, cidr): &(String, i32, i32, String)| {
            let rule = IpPermission::builder()
                .ip_protocol(proto)
                .from_port(*from)
                .to_port(*to);
            let described = described.map(str::to_owned);
            if cidr.contains(':') {
                rule.ipv6_ranges(
                    Ipv6Range::builder()
                        .cidr_ipv6(cidr)
                        .set_description(described)
                        .build(),
                )
            } else {
                rule.ip_ranges(
                    IpRange::builder()
                        .cidr_ip(cidr)
                        .set_description(described)
                        .build(),
                )
            }
            .build()
        };
        let missing: Vec<IpPermission> = desired
            .iter()
            .filter(|d| !present.contains(d))
            .map(perm)
            .collect();
        let extra: Vec<IpPermission> = existing
            .iter()
            .filter(|e| !desired.contains(e))
            .map(perm)
            .collect();
        let words = |rules: &[IpPermission]| -> String {
            rules
                .iter()
                .map(|p| {
                    let cidrs: Vec<&str> = p
                        .ip_ranges()
                        .iter()
                        .filter_map(|r| r.cidr_ip())
                        .chain(p.ipv6_ranges().iter().filter_map(|r| r.cidr_ipv6()))
                        .collect();
                    format!(
                        "{} {}-{} from {}",
                        p.ip_protocol().unwrap_or_default(),
                        p.from_port().unwrap_or(0),
                        p.to_port().unwrap_or(0),
                        cidrs.join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut changed = false;
        if !missing.is_empty()
            && !self.previewed(|| {
                format!(
                    "security group {group} would allow {} ({description})",
                    words(&missing)
                )
            })
        {
            changed = true;
            self.calls
                .call("AuthorizeSecurityGroupIngress", || {
                    ec2.authorize_security_group_ingress()
                        .group_id(group)
                        .set_ip_permissions(Some(missing.clone()))
                        .send()
                })
                .await?;
        }
        if !extra.is_empty()
            && !self.previewed(|| {
                format!(
                    "security group {group} would no longer allow {} ({description})",
                    words(&extra)
                )
            })
        {
            changed = true;
            self.calls
                .call("RevokeSecurityGroupIngress", || {
                    ec2.revoke_security_group_ingress()
                        .group_id(group)
                        .set_ip_permissions(Some(extra.clone()))
                        .send()
                })
                .await?;
        }
        Ok(changed)
    }

    /// Revokes every ingress rule carrying `description` in every group of the VPCs the provider sees;
    /// the groups it changed.
    async fn revoke_described_rules(&self, description: &str) -> Result<Vec<String>> {
        let ec2 = &self.calls.clients.ec2;
        let out = self
            .calls
            .call("DescribeSecurityGroups", || {
                ec2.describe_security_groups().send()
            })
            .await?;
        let mut changed = Vec::new();
        for g in out.security_groups() {
            let has = g.ip_permissions().iter().any(|p| {
                p.ip_ranges()
                    .iter()
                    .any(|r| r.description() == Some(description))
            });
            if has
                && let Some(id) = g.group_id()
                && self
                    .sync_cidr_rules(id, description, RuleScope::Described, &[])
                    .await?
            {
                changed.push(id.to_owned());
            }
        }
        Ok(changed)
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
        let service_name = format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default()
        );
        let cluster_id = self.cluster_id(cluster_name).to_owned();
        // Both kinds: the Service's type annotation may have changed since its load balancer was made.
        let own_group = nlb_security_group::own_group_name(
            cluster_name,
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default(),
            service.metadata.uid.as_deref().unwrap_or_default(),
        );
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

/// Whether the subnet has an IPv6 CIDR (as a dual-stack NLB's subnets must).
fn has_ipv6_cidr(subnet: &aws_sdk_ec2::types::Subnet) -> bool {
    subnet
        .ipv6_cidr_block_association_set()
        .iter()
        .any(|a| a.ipv6_cidr_block().is_some_and(|c| !c.is_empty()))
}
