//! The rules an NLB needs in the nodes' security groups (without a group of its own): its clients' and
//! its health checks' CIDRs on the node ports, and path-MTU discovery, each described as upstream
//! describes them.

use super::*;

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
        let mut client_rules = Vec::new();
        for p in &spec.ports {
            for cidr in &spec.source_ranges {
                client_rules.push((
                    p.protocol.to_ascii_lowercase(),
                    p.node_port,
                    p.node_port,
                    cidr.clone(),
                ));
            }
        }
        // Upstream's health rules: TCP from the VPC to each port the health check probes (the traffic
        // port of every port, UDP ones too, unless the check names a port), left out when the client
        // rules already allow it (TCP from everywhere to the same ports).
        let mut health_rules = Vec::new();
        let mut hc_ports: Vec<i32> = match spec.health_check.port.parse::<i32>() {
            Ok(port) => vec![port],
            Err(_) => spec.ports.iter().map(|p| p.node_port).collect(),
        };
        hc_ports.sort();
        hc_ports.dedup();
        let mut client_ports: Vec<i32> = spec.ports.iter().map(|p| p.node_port).collect();
        client_ports.sort();
        client_ports.dedup();
        let covered = spec.source_ranges == ["0.0.0.0/0"]
            && spec.ports.iter().all(|p| p.protocol == "TCP")
            && hc_ports == client_ports;
        if !hc_ports.is_empty() && !covered {
            for cidr in self.subnet_cidrs(lb).await? {
                for port in &hc_ports {
                    health_rules.push(("tcp".to_owned(), *port, *port, cidr.clone()));
                }
            }
        }
        client_rules.sort();
        client_rules.dedup();
        health_rules.sort();
        health_rules.dedup();
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
        // Groups of former backends.
        let vpc_id = lb.vpc_id().unwrap_or_default();
        let ec2 = &self.calls.clients.ec2;
        let out = self
            .calls
            .call("DescribeSecurityGroups", || {
                ec2.describe_security_groups()
                    .filters(
                        aws_sdk_ec2::types::Filter::builder()
                            .name("vpc-id")
                            .values(vpc_id)
                            .build(),
                    )
                    .send()
            })
            .await?;
        for g in out.security_groups() {
            let Some(id) = g.group_id() else { continue };
            if groups.iter().any(|w| w == id) {
                continue;
            }
            let mut clients_changed = false;
            for description in [&client, &health] {
                let has = g.ip_permissions().iter().any(|p| {
                    p.ip_ranges()
                        .iter()
                        .any(|r| r.description() == Some(description.as_str()))
                });
                if has
                    && self
                        .sync_cidr_rules(id, description, RuleScope::Described, &[])
                        .await?
                    && description == &client
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
        let ec2 = &self.calls.clients.ec2;
        let out = self
            .calls
            .call("DescribeSecurityGroups", || {
                ec2.describe_security_groups().group_ids(group).send()
            })
            .await?;
        let mut rules: Vec<(String, i32, i32, String)> = out
            .security_groups()
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
        let ec2 = &self.calls.clients.ec2;
        let out = self
            .calls
            .call("DescribeSubnets", || {
                ec2.describe_subnets()
                    .set_subnet_ids(Some(ids.to_vec()))
                    .send()
            })
            .await?;
        Ok(out
            .subnets()
            .iter()
            .filter_map(|s| Some((s.subnet_id()?.to_owned(), s.cidr_block()?.to_owned())))
            .collect())
    }
}
