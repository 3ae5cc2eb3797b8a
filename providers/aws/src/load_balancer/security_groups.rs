//! Security groups a load balancer owns (a Classic ELB's `k8s-elb-<name>`, a managed NLB's
//! `k8s-<namespace>-<name>-<hash>`): found by name in the VPC, created tagged for the cluster, and
//! deleted with every rule of another group that refers to them.

use aws_sdk_ec2::{
    operation::describe_security_groups::builders::DescribeSecurityGroupsFluentBuilder as Describe,
    types::{Filter, IpPermission, ResourceType, SecurityGroup, TagSpecification, UserIdGroupPair},
};

use super::{LoadBalancers, spec::LbSpec};
use crate::{Error, error::Result};

/// The EC2 filter `name` with the one value `value`.
pub(super) fn filter(name: &str, value: impl Into<String>) -> Filter {
    Filter::builder().name(name).values(value).build()
}

impl LoadBalancers {
    /// The groups one `DescribeSecurityGroups` answers, narrowed by `ask` (to IDs, by filters; left as
    /// it is: every group the provider sees).
    pub(super) async fn security_groups_where(
        &self,
        ask: impl FnOnce(Describe) -> Describe,
    ) -> Result<Vec<SecurityGroup>> {
        let ec2 = &self.calls.clients.ec2;
        let request = ask(ec2.describe_security_groups());
        let out = self
            .calls
            .call("DescribeSecurityGroups", || request.clone().send())
            .await?;
        Ok(out.security_groups().to_vec())
    }

    /// The group named `name` in `vpc_id` (any VPC when empty), if any.
    pub(super) async fn security_group_named(
        &self,
        name: &str,
        vpc_id: &str,
    ) -> Result<Option<SecurityGroup>> {
        let groups = self
            .security_groups_where(|request| {
                let request = request.filters(filter("group-name", name));
                match vpc_id {
                    "" => request,
                    vpc => request.filters(filter("vpc-id", vpc)),
                }
            })
            .await?;
        Ok(groups.into_iter().next())
    }

    /// The group `name` in `vpc_id`, created with `description` and the Service's tags (the cluster's
    /// among them) when missing, as upstream's `ensureSecurityGroup` finds and makes it (group name and
    /// VPC are EC2's key for a group); `None` in a preview that would create it. The group as found (its
    /// rules with it), or as made (no ingress rule yet).
    pub(super) async fn ensure_security_group(
        &self,
        name: &str,
        description: &str,
        spec: &LbSpec,
        vpc_id: &str,
    ) -> Result<Option<SecurityGroup>> {
        if let Some(group) = self
            .security_group_named(name, vpc_id)
            .await?
            .filter(|g| g.group_id().is_some())
        {
            return Ok(Some(group));
        }
        if self.previewed(|| format!("security group {name} would be created in {vpc_id}")) {
            return Ok(None);
        }
        let ec2 = &self.calls.clients.ec2;
        let mut tags = TagSpecification::builder().resource_type(ResourceType::SecurityGroup);
        for (k, v) in &spec.tags {
            tags = tags.tags(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build());
        }
        let tags = tags.build();
        let out = self
            .calls
            .call("CreateSecurityGroup", || {
                ec2.create_security_group()
                    .group_name(name)
                    .description(description)
                    .vpc_id(vpc_id)
                    .tag_specifications(tags.clone())
                    .send()
            })
            .await?;
        out.group_id()
            .map(|g| Some(SecurityGroup::builder().group_id(g).build()))
            .ok_or(Error::Response {
                operation: "CreateSecurityGroup",
                missing: "group ID",
            })
    }

    /// Revokes `group`'s rule that lets `source_group` in (all protocols), if it has one.
    pub(super) async fn revoke_group_reference(
        &self,
        group: &str,
        source_group: &str,
    ) -> Result<()> {
        let permission = IpPermission::builder()
            .ip_protocol("-1")
            .user_id_group_pairs(UserIdGroupPair::builder().group_id(source_group).build())
            .build();
        let ec2 = &self.calls.clients.ec2;
        match self
            .calls
            .call("RevokeSecurityGroupIngress", || {
                ec2.revoke_security_group_ingress()
                    .group_id(group)
                    .ip_permissions(permission.clone())
                    .send()
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("InvalidPermission.NotFound") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The groups with a rule that lets `sg` in, in `vpc_id` (any VPC when `None`).
    pub(super) async fn groups_referencing(
        &self,
        sg: &str,
        vpc_id: Option<&str>,
    ) -> Result<Vec<SecurityGroup>> {
        self.security_groups_where(|request| {
            let request = request.filters(filter("ip-permission.group-id", sg));
            match vpc_id {
                Some(vpc) => request.filters(filter("vpc-id", vpc)),
                None => request,
            }
        })
        .await
    }

    /// Deletes the group `sg` of the load balancer `lb_name` after revoking every rule of another
    /// group that refers to it. A group still held by the load balancer's network interfaces (for a
    /// while after the load balancer is gone) is [`Error::StillInUse`], so the deletion is tried again.
    ///
    /// With `DisableSecurityGroupIngress` no rule of ours refers to `sg` (the nodes' groups got none),
    /// so the deletion is tried first, and the referring rules are looked for only if AWS refuses it
    /// (someone else's rule, or one of ours from before the setting): one call fewer per deletion.
    pub(super) async fn delete_security_group(&self, sg: &str, lb_name: &str) -> Result<()> {
        let tried_first = self.config.global.disable_security_group_ingress;
        if tried_first {
            match self.try_delete_security_group(sg, lb_name).await {
                Err(Error::StillInUse(_)) => {}
                done => return done,
            }
        }
        let referring = self.groups_referencing(sg, None).await?;
        for r in &referring {
            if let Some(id) = r.group_id() {
                self.revoke_group_reference(id, sg).await?;
            }
        }
        if tried_first && referring.is_empty() {
            // Refused, and not for a rule: its network interfaces still hold it.
            return Err(Error::StillInUse(format!(
                "security group {sg} of {lb_name} is still in use"
            )));
        }
        self.try_delete_security_group(sg, lb_name).await
    }

    /// One `DeleteSecurityGroup` of `sg`: gone already is done; a group something still holds is
    /// [`Error::StillInUse`].
    async fn try_delete_security_group(&self, sg: &str, lb_name: &str) -> Result<()> {
        let ec2 = &self.calls.clients.ec2;
        match self
            .calls
            .call("DeleteSecurityGroup", || {
                ec2.delete_security_group().group_id(sg).send()
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("InvalidGroup.NotFound") => Ok(()),
            Err(e) if e.code() == Some("DependencyViolation") => Err(Error::StillInUse(format!(
                "security group {sg} of {lb_name} is still in use ({e})"
            ))),
            Err(e) => Err(e),
        }
    }
}
