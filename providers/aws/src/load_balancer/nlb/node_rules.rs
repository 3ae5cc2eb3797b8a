//! The rules an NLB needs in the nodes' security groups (without a group of its own): its clients' and
//! its health checks' CIDRs on the node ports, and path-MTU discovery, each described as upstream
//! describes them.

use super::*;
use crate::load_balancer::{
    cidr_rules::{Rule, has_described_range},
    security_groups::filter,
};

/// The client rules: each source range on each node port, in the port's protocol.
fn client_rules(ports: &[Port], source_ranges: &[String]) -> Vec<Rule> {
    let mut rules: Vec<Rule> = ports
        .iter()
        .flat_map(|p| {
            source_ranges.iter().map(|cidr| {
                (
                    p.protocol.to_ascii_lowercase(),
                    p.node_port,
                    p.node_port,
                    cidr.clone(),
                )
            })
        })
        .collect();
    rules.sort();
    rules.dedup();
    rules
}

/// Upstream's health-check ports: the port the check names, else every port's node port (UDP ones
/// too); none when the client rules already let the checks in (TCP from everywhere to the same
/// ports).
fn health_check_ports(health_port: &str, ports: &[Port], source_ranges: &[String]) -> Vec<i32> {
    let mut checked: Vec<i32> = match health_port.parse::<i32>() {
        Ok(port) => vec![port],
        Err(_) => ports.iter().map(|p| p.node_port).collect(),
    };
    checked.sort();
    checked.dedup();
    let mut served: Vec<i32> = ports.iter().map(|p| p.node_port).collect();
    served.sort();
    served.dedup();
    let covered = source_ranges == ["0.0.0.0/0"]
        && ports.iter().all(|p| p.protocol == "TCP")
        && checked == served;
    if covered { Vec::new() } else { checked }
}

/// The health rules: TCP from each of the NLB's subnets (where its checks come from) to each port.
fn health_rules(ports: &[i32], subnet_cidrs: &[String]) -> Vec<Rule> {
    let mut rules: Vec<Rule> = subnet_cidrs
        .iter()
        .flat_map(|cidr| {
            ports
                .iter()
                .map(|p| ("tcp".to_owned(), *p, *p, cidr.clone()))
        })
        .collect();
    rules.sort();
    rules.dedup();
    rules
}

impl LoadBalancers {
    /// Client rules (the source ranges on each node port) and health-check rules (the CIDRs of the
    /// NLB's subnets on the health-check port, as upstream: the addresses its health checks come from)
    /// in the backends' security groups, described as upstream describes them; the same rules are
    /// removed from groups no backend uses any more.
    pub(super) async fn sync_nlb_rules(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
        lb: &Elbv2LoadBalancer,
    ) -> Result<()> {
        let groups = self.node_security_groups(instances, cluster_id).await?;
        let client = rule_description("client", &spec.name);
        let health = rule_description("health", &spec.name);
        let client_rules = client_rules(&spec.ports, &spec.source_ranges);
        let checked = health_check_ports(&spec.health_check.port, &spec.ports, &spec.source_ranges);
        let health_rules = if checked.is_empty() {
            Vec::new()
        } else {
            health_rules(&checked, &self.subnet_cidrs(lb).await?)
        };
        for g in &groups {
            let clients_changed = self
                .sync_cidr_rules(g, &client, RuleScope::Described, &client_rules)
                .await?;
            self.sync_cidr_rules(g, &health, RuleScope::Described, &health_rules)
                .await?;
            if clients_changed {
                self.sync_mtu_rules(g).await?;
            }
        }
        self.revoke_from_former_backends(
            lb.vpc_id().unwrap_or_default(),
            &groups,
            [&client, &health],
        )
        .await
    }

    /// Takes the rules described `client` or `health` out of the groups in `vpc_id` that are not the
    /// backends' `groups` (those of former backends), and their path-MTU rules with the client rules.
    async fn revoke_from_former_backends(
        &self,
        vpc_id: &str,
        groups: &[String],
        [client, health]: [&String; 2],
    ) -> Result<()> {
        let in_vpc = self
            .security_groups_where(|r| r.filters(filter("vpc-id", vpc_id)))
            .await?;
        for g in &in_vpc {
            let Some(id) = g.group_id() else { continue };
            if groups.iter().any(|w| w == id) {
                continue;
            }
            let mut clients_changed = false;
            for description in [client, health] {
                if has_described_range(g, description)
                    && self
                        .sync_cidr_rules(id, description, RuleScope::Described, &[])
                        .await?
                    && description == client
                {
                    clients_changed = true;
                }
            }
            if clients_changed {
                self.sync_mtu_rules(id).await?;
            }
        }
        Ok(())
    }

    /// Upstream's path-MTU-discovery rules in `group`: ICMP type 3 code 4 from each client CIDR of any
    /// NLB there ([`MTU_DESCRIPTION`]), made again whenever client rules changed, so the last NLB's
    /// deletion takes them away too.
    pub(super) async fn sync_mtu_rules(&self, group: &str) -> Result<()> {
        let read = self.security_groups_where(|r| r.group_ids(group)).await?;
        let mut rules: Vec<(String, i32, i32, String)> = read
            .iter()
            .flat_map(|g| g.ip_permissions())
            .flat_map(|p| p.ip_ranges())
            .filter(|r| {
                r.description()
                    .is_some_and(|d| d.starts_with(CLIENT_DESCRIPTION_PREFIX))
            })
            .filter_map(|r| r.cidr_ip())
            .map(|cidr| ("icmp".to_owned(), 3, 4, cidr.to_owned()))
            .collect();
        rules.sort();
        rules.dedup();
        self.sync_cidr_rules(group, MTU_DESCRIPTION, RuleScope::Described, &rules)
            .await?;
        Ok(())
    }

    /// The CIDR blocks of the NLB's subnets (upstream's `getSubnetCidrs` over the subnets of its
    /// availability zones).
    pub(super) async fn subnet_cidrs(&self, lb: &Elbv2LoadBalancer) -> Result<Vec<String>> {
        let ids: Vec<String> = lb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_owned))
            .collect();
        if ids.is_empty() {
            return Err(Error::Setup(format!(
                "NLB {} has no subnets to allow health checks from",
                lb.load_balancer_name().unwrap_or_default()
            )));
        }
        let mut cidrs: Vec<String> = self
            .subnet_cidr_blocks(&ids)
            .await?
            .into_iter()
            .map(|(_, cidr)| cidr)
            .collect();
        cidrs.sort();
        cidrs.dedup();
        Ok(cidrs)
    }

    /// Each of `ids`' IPv4 CIDR block, as `(subnet ID, CIDR)`, from one `DescribeSubnets`.
    pub(super) async fn subnet_cidr_blocks(&self, ids: &[String]) -> Result<Vec<(String, String)>> {
        let read = self
            .subnets_where(|r| r.set_subnet_ids(Some(ids.to_vec())))
            .await?;
        Ok(read
            .iter()
            .filter_map(|s| Some((s.subnet_id()?.to_owned(), s.cidr_block()?.to_owned())))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(protocol: &str, node_port: i32) -> Port {
        Port {
            port: 80,
            protocol: protocol.to_owned(),
            node_port,
        }
    }

    fn ranges(cidrs: &[&str]) -> Vec<String> {
        cidrs.iter().map(|c| (*c).to_owned()).collect()
    }

    #[test]
    fn clients_get_each_range_on_each_node_port_in_its_protocol() {
        let rules = client_rules(
            &[port("TCP", 30080), port("UDP", 30053)],
            &ranges(&["10.0.0.0/8", "192.168.0.0/16"]),
        );
        assert_eq!(rules.len(), 4);
        assert!(rules.contains(&("udp".into(), 30053, 30053, "10.0.0.0/8".into())));
    }

    #[test]
    fn health_rules_are_left_out_only_where_the_client_rules_let_the_checks_in() {
        let everywhere = ranges(&["0.0.0.0/0"]);
        for (name, health_port, ports, source_ranges, want) in [
            (
                "TCP from everywhere on the checked ports: covered",
                "traffic-port",
                vec![port("TCP", 30080)],
                everywhere.clone(),
                vec![],
            ),
            (
                "narrower sources: the checks need their own",
                "traffic-port",
                vec![port("TCP", 30080)],
                ranges(&["10.0.0.0/8"]),
                vec![30080],
            ),
            (
                "a UDP port is checked over TCP",
                "traffic-port",
                vec![port("UDP", 30053)],
                everywhere.clone(),
                vec![30053],
            ),
            (
                "a named port (Local's health-check node port)",
                "32000",
                vec![port("TCP", 30080)],
                everywhere.clone(),
                vec![32000],
            ),
        ] {
            assert_eq!(
                health_check_ports(health_port, &ports, &source_ranges),
                want,
                "{name}"
            );
        }
        assert_eq!(
            health_rules(&[32000], &ranges(&["10.0.1.0/24", "10.0.2.0/24"])),
            vec![
                ("tcp".to_owned(), 32000, 32000, "10.0.1.0/24".to_owned()),
                ("tcp".to_owned(), 32000, 32000, "10.0.2.0/24".to_owned()),
            ]
        );
    }
}
