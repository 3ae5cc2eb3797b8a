//! The CIDR ingress rules a load balancer keeps in a security group: ours (by description, or the whole
//! group of one load balancer's own) made exactly the wanted ones, by difference.

use super::*;

impl LoadBalancers {
    /// Makes the CIDR ingress rules of `group` that are ours exactly `desired` (each a protocol, a port
    /// range and an IPv4 or IPv6 CIDR): authorizes the missing, revokes the extra, writes nothing when equal. Ours are
    /// those that carry `description`, or, with [`RuleScope::WholeGroup`] (a group made for one load
    /// balancer), all of them. A desired rule the group has already, whatever its description (one
    /// cloud-provider-aws authorized without any), is kept as it is: EC2 tells rules apart by protocol,
    /// ports and source alone, and answers a second one `InvalidPermission.Duplicate`.
    pub(super) async fn sync_cidr_rules(
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
    pub(super) async fn sync_read_cidr_rules(
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
    pub(super) async fn revoke_described_rules(&self, description: &str) -> Result<Vec<String>> {
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
