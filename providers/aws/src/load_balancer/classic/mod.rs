//! Classic ELBs: a security group `k8s-elb-<name>` with the source ranges (unless given one),
//! listeners to the node ports (TCP, or TLS-terminating SSL/HTTPS ones with `ssl-cert`, and their
//! negotiation policy), the health check, registered instances, and the nodes' security groups
//! opened to the load balancer's group.

use aws_sdk_ec2::types::{IpPermission, SecurityGroup, UserIdGroupPair};
use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing,
    HealthCheck as ElbHealthCheck, Instance, Listener, LoadBalancerAttributes,
    LoadBalancerDescription, PolicyAttribute, Tag,
};
use k8s_openapi::api::core::v1::LoadBalancerStatus;

use super::{
    LoadBalancers, RuleScope, all_pages, hostname_status, not_found,
    security_groups::filter,
    spec::{ClassicAttributes, LbSpec, TAG_CLUSTER_PREFIX},
};
use crate::{Error, error::Result, instances::InstanceInfo};

mod attributes;
mod groups;
mod instances;
mod listeners;
mod policies;

use listeners::classic_listeners;

/// Upstream's PROXY protocol policy on a Classic ELB's backends.
pub const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// The prefix of upstream's TLS negotiation policies (`k8s-SSLNegotiationPolicy-<value>`).
pub const SSL_POLICY_PREFIX: &str = "k8s-SSLNegotiationPolicy-";

/// The name of the security group upstream creates for a Classic ELB.
pub fn security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

impl LoadBalancers {
    /// The Classic ELB named `name`, if any (looked up with the other syncs' and checks' under way).
    pub(super) async fn describe_classic(
        &self,
        name: &str,
    ) -> Result<Option<LoadBalancerDescription>> {
        self.lookups.classic(&self.calls, name, true).await
    }

    /// Every Classic ELB in the region (one call per page of 400).
    pub(super) async fn all_classic_load_balancers(&self) -> Result<Vec<LoadBalancerDescription>> {
        let elb = &self.calls.clients.elb;
        all_pages(|marker| async move {
            let out = self
                .calls
                .call("elb:DescribeLoadBalancers", || {
                    elb.describe_load_balancers()
                        .set_marker(marker.clone())
                        .send()
                })
                .await?;
            Ok((
                out.load_balancer_descriptions().to_vec(),
                out.next_marker().map(str::to_owned),
            ))
        })
        .await
    }

    /// Creates or updates the Service's Classic ELB.
    pub(super) async fn ensure_classic(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<LoadBalancerStatus> {
        let existing = self
            .lookups
            .classic(&self.calls, &spec.name, spec.provisioned)
            .await?;
        // A preview of a load balancer that does not exist: all of it would be new.
        if existing.is_none()
            && self.previewed_creation(|| format!("Classic ELB {} would be created", spec.name))
        {
            return Ok(LoadBalancerStatus::default());
        }
        let vpc_id = match existing.as_ref().and_then(|lb| lb.vpc_id()) {
            Some(vpc) => vpc.to_owned(),
            None => self.vpc_id(instances).await?,
        };
        let (groups, owned) = self.classic_security_groups(spec, &vpc_id).await?;
        let listeners = classic_listeners(spec)?;
        let lb = match existing {
            Some(lb) => self.synced_classic(lb, spec, &listeners, &groups).await?,
            None => match self
                .created_classic(spec, &vpc_id, cluster_id, &listeners, &groups)
                .await?
            {
                Some(lb) => lb,
                None => return Ok(LoadBalancerStatus::default()),
            },
        };
        self.classic_load_balancer_seen(&spec.name, lb.vpc_id())
            .await;
        self.sync_classic_tls_policy(&lb, spec).await?;
        self.sync_classic_proxy_protocol(&lb, spec).await?;
        self.sync_classic_health_check(&lb, spec).await?;
        self.sync_classic_attributes(&spec.name, &spec.classic_attributes)
            .await?;
        self.sync_classic_instances(&lb, instances).await?;
        if let (Some(sg), false) = (&owned, self.config.global.disable_security_group_ingress) {
            self.sync_node_ingress(sg, instances, cluster_id, &vpc_id)
                .await?;
        }
        Ok(hostname_status(lb.dns_name()))
    }

    /// The existing Classic ELB with its listeners and security groups as `spec` asks (described again
    /// when listeners were made anew: they carry no policies).
    async fn synced_classic(
        &self,
        lb: LoadBalancerDescription,
        spec: &LbSpec,
        listeners: &[Listener],
        groups: &[String],
    ) -> Result<LoadBalancerDescription> {
        let elb = &self.calls.clients.elb;
        let lb = if self.sync_classic_listeners(&lb, listeners).await? {
            // Listeners made again carry no policies: read them as they are now.
            self.describe_classic(&spec.name).await?.unwrap_or(lb)
        } else {
            lb
        };
        let mut current: Vec<&str> = lb.security_groups().iter().map(String::as_str).collect();
        current.sort();
        let mut wanted: Vec<&str> = groups.iter().map(String::as_str).collect();
        wanted.sort();
        if current != wanted
            && !self.previewed(|| {
                format!("security groups would change from {current:?} to {wanted:?}")
            })
        {
            self.calls
                .call("ApplySecurityGroupsToLoadBalancer", || {
                    elb.apply_security_groups_to_load_balancer()
                        .load_balancer_name(&spec.name)
                        .set_security_groups(Some(groups.to_vec()))
                        .send()
                })
                .await?;
        }
        Ok(lb)
    }

    /// Creates the Classic ELB in the cluster's subnets; `None` in a preview.
    async fn created_classic(
        &self,
        spec: &LbSpec,
        vpc_id: &str,
        cluster_id: &str,
        listeners: &[Listener],
        groups: &[String],
    ) -> Result<Option<LoadBalancerDescription>> {
        let elb = &self.calls.clients.elb;
        if self.previewed_creation(|| format!("Classic ELB {} would be created", spec.name)) {
            return Ok(None);
        }
        let subnets = self.subnets(spec, vpc_id, cluster_id).await?;
        let tags: Vec<Tag> = spec
            .tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Setup(format!("tag: {e}")))?;
        tracing::info!(
            name = spec.name,
            service = spec.service_name,
            "creating Classic ELB"
        );
        self.calls
            .call("elb:CreateLoadBalancer", || {
                elb.create_load_balancer()
                    .load_balancer_name(&spec.name)
                    .set_listeners(Some(listeners.to_vec()))
                    .set_subnets(Some(subnets.clone()))
                    .set_security_groups(Some(groups.to_vec()))
                    .set_scheme(spec.internal.then(|| "internal".to_owned()))
                    .set_tags(Some(tags.clone()))
                    .send()
            })
            .await?;
        let created = self
            .describe_classic(&spec.name)
            .await?
            .ok_or(Error::Response {
                operation: "elb:DescribeLoadBalancers",
                missing: "load balancer just created",
            })?;
        Ok(Some(created))
    }

    /// Backends of an existing Classic ELB follow `instances`: registration and node ingress.
    pub(super) async fn update_classic_instances(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<()> {
        let Some(lb) = self.describe_classic(&spec.name).await? else {
            return Err(not_found(spec));
        };
        self.sync_classic_instances(&lb, instances).await?;
        let vpc_id = lb.vpc_id().unwrap_or_default().to_owned();
        let owned =
            spec.security_groups.is_empty() && self.config.global.elb_security_group.is_none();
        if owned
            && !self.config.global.disable_security_group_ingress
            && let Some(sg) = self
                .security_group_named(&security_group_name(&spec.name), &vpc_id)
                .await?
                .and_then(|g| g.group_id().map(str::to_owned))
        {
            self.sync_node_ingress(&sg, instances, cluster_id, &vpc_id)
                .await?;
        }
        Ok(())
    }

    /// Deletes the Classic ELB named `name`, then our security group `k8s-elb-<name>` (when it carries
    /// the cluster's tag) and every rule that refers to it.
    pub(super) async fn delete_classic(&self, name: &str, cluster_id: &str) -> Result<()> {
        let elb = &self.calls.clients.elb;
        // The index knows whether it exists and in which VPC; a Classic ELB whose VPC it does not know
        // (found by the orphan sweep) is described.
        let vpc_id = match self.classic_load_balancer_known(name).await? {
            None => None,
            Some(Some(vpc)) => Some(vpc),
            Some(None) => self
                .describe_classic(name)
                .await?
                .map(|lb| lb.vpc_id().unwrap_or_default().to_owned()),
        };
        if vpc_id.is_some() {
            tracing::info!(name, "deleting Classic ELB");
            // AWS answers a deletion of a Classic ELB that is already gone with success.
            self.calls
                .call("elb:DeleteLoadBalancer", || {
                    elb.delete_load_balancer().load_balancer_name(name).send()
                })
                .await?;
            self.classic_load_balancer_deleted(name).await;
        }
        let vpc_id = vpc_id.unwrap_or_default();
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let ours = self
            .security_groups_where(|r| {
                r.filters(filter("group-name", security_group_name(name)))
                    .filters(filter("tag-key", &cluster_tag))
            })
            .await?;
        for g in &ours {
            let Some(sg) = g.group_id() else { continue };
            if !vpc_id.is_empty() && g.vpc_id() != Some(vpc_id.as_str()) {
                continue;
            }
            self.delete_security_group(sg, name).await?;
        }
        Ok(())
    }
}
