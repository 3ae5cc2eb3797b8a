//! The CIDR ingress rules a load balancer keeps in a security group: ours (by description, or the whole
//! group of one load balancer's own) made exactly the wanted ones, by difference.

use aws_sdk_ec2::types::SecurityGroup;

use super::*;

/// One CIDR rule: protocol, first and last port, and an IPv4 or IPv6 CIDR.
pub(in crate::load_balancer) type Rule = (String, i32, i32, String);

/// What a sync of a group's CIDR rules writes.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Rules to authorize.
    missing: Vec<IpPermission>,
    /// Rules of ours to revoke.
    extra: Vec<IpPermission>,
}

/// The writes that make the CIDR rules of ours in the group as `read` exactly `desired`: ours are those
/// carrying `description`, or every rule with [`RuleScope::WholeGroup`]; a desired rule the group has
/// already, whatever its description, is left as it is.
fn plan(read: &[SecurityGroup], description: &str, scope: RuleScope, desired: &[Rule]) -> Plan {
    let (mut present, mut ours) = (Vec::new(), Vec::new());
    for p in read.iter().flat_map(SecurityGroup::ip_permissions) {
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
                ours.push(rule.clone());
            }
            present.push(rule);
        }
    }
    // A group of one load balancer's own carries its rules undescribed, as upstream authorizes them (so
    // a hand-over either way finds the group exactly as its manager would make it).
    let described = (scope == RuleScope::Described).then_some(description);
    Plan {
        missing: desired
            .iter()
            .filter(|d| !present.contains(d))
            .map(|rule| permission(rule, described))
            .collect(),
        extra: ours
            .iter()
            .filter(|e| !desired.contains(e))
            .map(|rule| permission(rule, described))
            .collect(),
    }
}

/// `rule` as EC2's permission, carrying `description` when given.
fn permission((proto, from, to, cidr): &Rule, description: Option<&str>) -> IpPermission {
    let rule = IpPermission::builder()
        .ip_protocol(proto)
        .from_port(*from)
        .to_port(*to);
    let description = description.map(str::to_owned);
    if cidr.contains(':') {
        rule.ipv6_ranges(
            Ipv6Range::builder()
                .cidr_ipv6(cidr)
                .set_description(description)
                .build(),
        )
    } else {
        rule.ip_ranges(
            IpRange::builder()
                .cidr_ip(cidr)
                .set_description(description)
                .build(),
        )
    }
    .build()
}

/// Whether `group` has an IPv4 range carrying `description`.
pub(super) fn has_described_range(group: &SecurityGroup, description: &str) -> bool {
    group.ip_permissions().iter().any(|p| {
        p.ip_ranges()
            .iter()
            .any(|r| r.description() == Some(description))
    })
}

/// `rules` in words, for a preview: `tcp 80-80 from 10.0.0.0/8, ...`.
fn in_words(rules: &[IpPermission]) -> String {
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
}

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
        desired: &[Rule],
    ) -> Result<bool> {
        let read = self.security_groups_where(|r| r.group_ids(group)).await?;
        self.sync_read_cidr_rules(group, &read, description, scope, desired)
            .await
    }

    /// [`Self::sync_cidr_rules`] for the group `group` as `read` moments ago (by the caller that found
    /// it, which spares a second read of it): the [`plan`]'s writes, each said in a preview instead.
    pub(super) async fn sync_read_cidr_rules(
        &self,
        group: &str,
        read: &[SecurityGroup],
        description: &str,
        scope: RuleScope,
        desired: &[Rule],
    ) -> Result<bool> {
        let Plan { missing, extra } = plan(read, description, scope, desired);
        let authorized = self
            .write_cidr_rules(group, description, true, missing)
            .await?;
        let revoked = self
            .write_cidr_rules(group, description, false, extra)
            .await?;
        Ok(authorized || revoked)
    }

    /// Authorizes (`allow`) or revokes `rules` in `group` (said in a preview instead); whether it
    /// wrote.
    async fn write_cidr_rules(
        &self,
        group: &str,
        description: &str,
        allow: bool,
        rules: Vec<IpPermission>,
    ) -> Result<bool> {
        let change = if allow {
            "would allow"
        } else {
            "would no longer allow"
        };
        if rules.is_empty()
            || self.previewed(|| {
                let said = in_words(&rules);
                format!("security group {group} {change} {said} ({description})")
            })
        {
            return Ok(false);
        }
        let ec2 = &self.calls.clients.ec2;
        if allow {
            let request = ec2.authorize_security_group_ingress();
            let request = request.group_id(group).set_ip_permissions(Some(rules));
            self.calls
                .call("AuthorizeSecurityGroupIngress", || request.clone().send())
                .await?;
        } else {
            let request = ec2.revoke_security_group_ingress();
            let request = request.group_id(group).set_ip_permissions(Some(rules));
            self.calls
                .call("RevokeSecurityGroupIngress", || request.clone().send())
                .await?;
        }
        Ok(true)
    }

    /// Revokes every ingress rule carrying `description` in every group of the VPCs the provider sees;
    /// the groups it changed.
    pub(super) async fn revoke_described_rules(&self, description: &str) -> Result<Vec<String>> {
        let mut changed = Vec::new();
        for g in self.security_groups_where(|every| every).await? {
            if has_described_range(&g, description)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(proto: &str, port: i32, cidr: &str) -> Rule {
        (proto.to_owned(), port, port, cidr.to_owned())
    }

    /// A group holding `rules`, each with its description.
    fn group(rules: &[(Rule, Option<&str>)]) -> Vec<SecurityGroup> {
        let mut g = SecurityGroup::builder();
        for (r, description) in rules {
            g = g.ip_permissions(permission(r, *description));
        }
        vec![g.build()]
    }

    fn words(plan: &Plan) -> (String, String) {
        (in_words(&plan.missing), in_words(&plan.extra))
    }

    #[test]
    fn the_plan_writes_only_the_difference_of_ours() {
        let description = "kubernetes.io/rule/nlb/client=a1";
        let ours = Some(description);
        let web = rule("tcp", 80, "10.0.0.0/8");
        let v6 = rule("tcp", 80, "2001:db8::/32");
        let old = rule("tcp", 81, "10.0.0.0/8");
        for (name, read, scope, desired, want) in [
            (
                "as wanted: nothing",
                group(&[(web.clone(), ours)]),
                RuleScope::Described,
                vec![web.clone()],
                ("", ""),
            ),
            (
                "a wanted rule present without our description is kept, not authorized twice",
                group(&[(web.clone(), None)]),
                RuleScope::Described,
                vec![web.clone()],
                ("", ""),
            ),
            (
                "missing and extra, IPv6 beside IPv4",
                group(&[(old.clone(), ours)]),
                RuleScope::Described,
                vec![web.clone(), v6.clone()],
                (
                    "tcp 80-80 from 10.0.0.0/8, tcp 80-80 from 2001:db8::/32",
                    "tcp 81-81 from 10.0.0.0/8",
                ),
            ),
            (
                "someone else's rule is not ours to revoke",
                group(&[(old.clone(), Some("a colleague's"))]),
                RuleScope::Described,
                vec![],
                ("", ""),
            ),
            (
                "in a group of its own every rule is ours",
                group(&[(old.clone(), None)]),
                RuleScope::WholeGroup,
                vec![web.clone()],
                ("tcp 80-80 from 10.0.0.0/8", "tcp 81-81 from 10.0.0.0/8"),
            ),
        ] {
            let plan = plan(&read, description, scope, &desired);
            assert_eq!(
                words(&plan),
                (want.0.to_owned(), want.1.to_owned()),
                "{name}"
            );
        }
    }

    #[test]
    fn rules_carry_our_description_only_outside_a_group_of_their_own() {
        let web = rule("tcp", 80, "10.0.0.0/8");
        let described = plan(
            &[],
            "ours",
            RuleScope::Described,
            std::slice::from_ref(&web),
        );
        assert_eq!(
            described.missing[0].ip_ranges()[0].description(),
            Some("ours")
        );
        let own = plan(&[], "ours", RuleScope::WholeGroup, &[web]);
        assert_eq!(own.missing[0].ip_ranges()[0].description(), None);
    }
}
