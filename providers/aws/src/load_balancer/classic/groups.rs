//! A Classic ELB's security groups: the annotation's, `ElbSecurityGroup`, or its own `k8s-elb-<name>`
//! (made when missing, its rules the listener ports from the source ranges), and the nodes' groups
//! opened to it.

use super::*;

impl LoadBalancers {
    /// The group `k8s-elb-<name>` in the VPC, created (tagged for the cluster) when missing; `None` in a
    /// preview that would create it.
    pub(super) async fn ensure_elb_security_group(
        &self,
        spec: &LbSpec,
        vpc_id: &str,
    ) -> Result<Option<SecurityGroup>> {
        let description = format!(
            "Security group for Kubernetes ELB {} ({})",
            spec.name, spec.service_name
        );
        self.ensure_security_group(&security_group_name(&spec.name), &description, spec, vpc_id)
            .await
    }

    /// The Classic ELB's security groups: the annotation's, else `ElbSecurityGroup`, else its own
    /// `k8s-elb-<name>` (made when missing, its rules the listener ports from the source ranges and
    /// path-MTU ICMP), then the extra ones; with the own group's ID when it is ours.
    pub(super) async fn classic_security_groups(
        &self,
        spec: &LbSpec,
        vpc_id: &str,
    ) -> Result<(Vec<String>, Option<String>)> {
        // The security groups: the annotation's, else ElbSecurityGroup, else our own one.
        let (mut groups, owned) = if !spec.security_groups.is_empty() {
            (spec.security_groups.clone(), None)
        } else if let Some(sg) = &self.config.global.elb_security_group {
            (vec![sg.clone()], None)
        } else {
            match self.ensure_elb_security_group(spec, vpc_id).await? {
                Some(found) => {
                    let id = found.group_id().unwrap_or_default().to_owned();
                    (vec![id.clone()], Some((id, found)))
                }
                // A preview: the group, its rules and the nodes' rules would all be new.
                None => (vec![security_group_name(&spec.name)], None),
            }
        };
        groups.extend(spec.extra_security_groups.iter().cloned());
        let owned = owned.map(|(sg, read)| (sg, [read]));
        if let Some((sg, read)) = &owned {
            let description = format!("kubernetes.io/rule/elb={}", spec.name);
            let mut rules = Vec::new();
            for p in &spec.ports {
                for cidr in &spec.source_ranges {
                    rules.push(("tcp".to_owned(), p.port, p.port, cidr.clone()));
                }
            }
            // Path MTU discovery (ICMP type 3 code 4), as upstream allows.
            for cidr in &spec.source_ranges {
                rules.push(("icmp".to_owned(), 3, 4, cidr.clone()));
            }
            rules.sort();
            rules.dedup();
            self.sync_read_cidr_rules(sg, read, &description, RuleScope::WholeGroup, &rules)
                .await?;
        }
        Ok((groups, owned.map(|(sg, _)| sg)))
    }

    /// Opens the backends' security groups to the ELB's group (all traffic from that group), and closes
    /// the groups of former backends, as upstream does.
    pub(super) async fn sync_node_ingress(
        &self,
        lb_group: &str,
        instances: &[InstanceInfo],
        cluster_id: &str,
        vpc_id: &str,
    ) -> Result<()> {
        let ec2 = &self.calls.clients.ec2;
        let wanted = self.node_security_groups(instances, cluster_id).await?;
        let referencing = self.groups_referencing(lb_group, Some(vpc_id)).await?;
        let has: Vec<String> = referencing
            .iter()
            .filter(|g| {
                g.ip_permissions().iter().any(|p| {
                    p.ip_protocol() == Some("-1")
                        && p.user_id_group_pairs()
                            .iter()
                            .any(|u| u.group_id() == Some(lb_group))
                })
            })
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect();
        let permission = IpPermission::builder()
            .ip_protocol("-1")
            .user_id_group_pairs(UserIdGroupPair::builder().group_id(lb_group).build())
            .build();
        for g in wanted.iter().filter(|g| !has.contains(g)) {
            if self
                .previewed(|| format!("security group {g} would allow all traffic from {lb_group}"))
            {
                continue;
            }
            self.calls
                .call("AuthorizeSecurityGroupIngress", || {
                    ec2.authorize_security_group_ingress()
                        .group_id(g)
                        .ip_permissions(permission.clone())
                        .send()
                })
                .await?;
        }
        for g in has.iter().filter(|g| !wanted.contains(g)) {
            if self.previewed(|| {
                format!("security group {g} would no longer allow traffic from {lb_group}")
            }) {
                continue;
            }
            self.revoke_group_reference(g, lb_group).await?;
        }
        Ok(())
    }
}
