//! Where a load balancer goes in the VPC: the nodes' VPC, the subnets (the annotation's, else one per
//! zone tagged for the cluster and the load balancer's role, as upstream picks them), and the nodes'
//! security groups its rules go in.

use aws_sdk_ec2::{
    operation::describe_subnets::builders::DescribeSubnetsFluentBuilder as Describe, types::Subnet,
};

use super::{security_groups::filter, *};

/// Whether the subnet has an IPv6 CIDR (as a dual-stack NLB's subnets must).
fn has_ipv6_cidr(subnet: &aws_sdk_ec2::types::Subnet) -> bool {
    subnet
        .ipv6_cidr_block_association_set()
        .iter()
        .any(|a| a.ipv6_cidr_block().is_some_and(|c| !c.is_empty()))
}

/// Upstream's pick among a VPC's subnets: those tagged `cluster_tag` (with an IPv6 CIDR for a
/// dual-stack NLB), one per zone, preferring the role tag (`kubernetes.io/role/elb`, or
/// `kubernetes.io/role/internal-elb` for an internal load balancer), then the lowest ID; by zone.
fn one_per_zone(
    subnets: &[Subnet],
    cluster_tag: &str,
    internal: bool,
    dual_stack: bool,
) -> Vec<String> {
    let role = if internal {
        "kubernetes.io/role/internal-elb"
    } else {
        "kubernetes.io/role/elb"
    };
    let mut best: BTreeMap<String, (bool, String)> = BTreeMap::new();
    for s in subnets {
        let tags: BTreeMap<&str, &str> = s
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default())))
            .collect();
        if !tags.contains_key(cluster_tag) || (dual_stack && !has_ipv6_cidr(s)) {
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
    best.into_values().map(|(_, id)| id).collect()
}

impl LoadBalancers {
    /// The subnets one `DescribeSubnets` answers, narrowed by `ask` (to IDs, by filters).
    pub(super) async fn subnets_where(
        &self,
        ask: impl FnOnce(Describe) -> Describe,
    ) -> Result<Vec<Subnet>> {
        let ec2 = &self.calls.clients.ec2;
        let request = ask(ec2.describe_subnets());
        let out = self
            .calls
            .call("DescribeSubnets", || request.clone().send())
            .await?;
        Ok(out.subnets().to_vec())
    }

    /// The VPC: `VPC` from the cloud-config, else the backends' VPC.
    pub(super) async fn vpc_id(&self, instances: &[InstanceInfo]) -> Result<String> {
        if let Some(vpc) = &self.config.global.vpc {
            return Ok(vpc.clone());
        }
        if let Some(subnet) = &self.config.global.subnet_id {
            let read = self.subnets_where(|r| r.subnet_ids(subnet)).await?;
            if let Some(vpc) = read.first().and_then(|s| s.vpc_id()) {
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
    /// tagged for the cluster ([`one_per_zone`]).
    pub(super) async fn subnets(
        &self,
        spec: &LbSpec,
        vpc_id: &str,
        cluster_id: &str,
    ) -> Result<Vec<String>> {
        if !spec.subnets.is_empty() {
            return self.annotated_subnets(spec, vpc_id).await;
        }
        let in_vpc = self
            .subnets_where(|r| r.filters(filter("vpc-id", vpc_id)))
            .await?;
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let picked = one_per_zone(&in_vpc, &cluster_tag, spec.internal, spec.dual_stack);
        if picked.is_empty() && spec.dual_stack {
            return Err(Error::Service {
                service: spec.service_name.clone(),
                field: spec::ANNOTATION_IP_ADDRESS_TYPE.to_owned(),
                message: format!(
                    "a dual-stack NLB needs subnets with an IPv6 CIDR, and none in {vpc_id} tagged {cluster_tag} has one"
                ),
            });
        }
        if picked.is_empty() {
            return Err(Error::Setup(format!(
                "could not find any suitable subnets for creating the ELB: none in {vpc_id} carries the tag {cluster_tag}"
            )));
        }
        Ok(picked)
    }

    /// The subnets the annotation names (IDs, or `Name` tags) in `vpc_id`, each found exactly once (and
    /// with an IPv6 CIDR for a dual-stack NLB).
    async fn annotated_subnets(&self, spec: &LbSpec, vpc_id: &str) -> Result<Vec<String>> {
        let refused = |message: String| Error::Service {
            service: spec.service_name.clone(),
            field: spec::ANNOTATION_SUBNETS.to_owned(),
            message,
        };
        let (ids, names): (Vec<String>, Vec<String>) = spec
            .subnets
            .iter()
            .cloned()
            .partition(|s| s.starts_with("subnet-"));
        let mut found = Vec::new();
        for (key, values) in [("subnet-id", ids), ("tag:Name", names)] {
            if values.is_empty() {
                continue;
            }
            let named = Filter::builder().name(key).set_values(Some(values)).build();
            let read = self
                .subnets_where(|r| r.filters(filter("vpc-id", vpc_id)).filters(named))
                .await?;
            if spec.dual_stack
                && let Some(s) = read.iter().find(|s| !has_ipv6_cidr(s))
            {
                return Err(refused(format!(
                    "subnet {} has no IPv6 CIDR, and a dual-stack NLB (ip-address-type: dualstack) needs one in each of its subnets",
                    s.subnet_id().unwrap_or_default()
                )));
            }
            found.extend(read.iter().filter_map(|s| s.subnet_id().map(str::to_owned)));
        }
        if found.len() != spec.subnets.len() {
            return Err(refused(format!(
                "{:?} match {} subnets in {vpc_id}, expected one each",
                spec.subnets,
                found.len()
            )));
        }
        found.sort();
        Ok(found)
    }

    /// The security group of each backend that load-balancer traffic is opened in: the instance's group
    /// tagged for the cluster, else its first.
    pub(super) async fn node_security_groups(
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
        let read = self
            .security_groups_where(|r| r.set_group_ids(Some(all)))
            .await?;
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let tagged: Vec<&str> = read
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
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{SubnetIpv6CidrBlockAssociation, Tag};

    use super::*;

    const CLUSTER: &str = "kubernetes.io/cluster/one";

    fn subnet(id: &str, zone: &str, tags: &[(&str, &str)], ipv6: bool) -> Subnet {
        let mut s = Subnet::builder().subnet_id(id).availability_zone(zone);
        for (k, v) in tags {
            s = s.tags(Tag::builder().key(*k).value(*v).build());
        }
        if ipv6 {
            s = s.ipv6_cidr_block_association_set(
                SubnetIpv6CidrBlockAssociation::builder()
                    .ipv6_cidr_block("2001:db8::/64")
                    .build(),
            );
        }
        s.build()
    }

    #[test]
    fn one_subnet_per_zone_tagged_for_the_cluster_the_role_first_then_the_lowest_id() {
        let subnets = [
            subnet("subnet-b", "us-west-2a", &[(CLUSTER, "owned")], false),
            subnet(
                "subnet-c",
                "us-west-2a",
                &[(CLUSTER, "owned"), ("kubernetes.io/role/elb", "1")],
                false,
            ),
            subnet("subnet-a", "us-west-2a", &[(CLUSTER, "shared")], false),
            subnet("subnet-d", "us-west-2b", &[(CLUSTER, "owned")], true),
            subnet(
                "subnet-e",
                "us-west-2b",
                &[(CLUSTER, "owned"), ("kubernetes.io/role/internal-elb", "")],
                false,
            ),
            subnet(
                "subnet-0",
                "us-west-2c",
                &[("kubernetes.io/cluster/other", "owned")],
                true,
            ),
        ];
        for (name, internal, dual_stack, want) in [
            (
                "internet-facing: the elb role wins in 2a, the lowest ID in 2b",
                false,
                false,
                vec!["subnet-c", "subnet-d"],
            ),
            (
                "internal: the internal-elb role wins in 2b, the lowest ID in 2a",
                true,
                false,
                vec!["subnet-a", "subnet-e"],
            ),
            (
                "dual-stack: only subnets with an IPv6 CIDR",
                false,
                true,
                vec!["subnet-d"],
            ),
        ] {
            assert_eq!(
                one_per_zone(&subnets, CLUSTER, internal, dual_stack),
                want,
                "{name}"
            );
        }
        assert!(one_per_zone(&subnets, "kubernetes.io/cluster/none", false, false).is_empty());
    }
}
