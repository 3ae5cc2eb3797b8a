//! Network Load Balancers: one target group per port (instance targets on the node port), one listener
//! per port, the health check on the target group, and client rules in the nodes' security groups.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, Listener,
    LoadBalancer as Elbv2LoadBalancer, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping, Tag, TargetDescription, TargetGroup,
    TargetGroupAttribute, TargetTypeEnum,
};
use k8s_openapi::api::core::v1::LoadBalancerStatus;

use super::{
    LoadBalancers, RuleScope, all_pages, created, deleted_once_released, hostname_status,
    nlb_security_group::NlbGroups,
    not_found,
    spec::{self, LbSpec, PRESERVE_CLIENT_IP, Port},
};
use crate::{Error, error::Result, instances::InstanceInfo};

mod addressing;
mod listing;
mod node_rules;
mod ports;
mod target_groups;

use addressing::{check_fixed_addresses, ip_address_type};

/// AWS's limit of resources per `DescribeTags` call.
const TAGS_PER_CALL: usize = 20;

/// The target group name, upstream's (`buildTargetGroupName`): `k8s-<namespace>-<name>-<hash>`, the
/// namespace and name with every character but letters and digits taken out and cut to 8, the hash the
/// first 10 hex digits of the SHA-1 over the cluster ID, namespace, name, port, node port, target
/// protocol, target type, health-check protocol and interval. A group upstream made is adopted by it.
pub fn target_group_name(
    cluster_id: &str,
    service_name: &str,
    port: &Port,
    hc_protocol: &str,
    hc_interval: i32,
) -> String {
    let (namespace, name) = service_name.split_once('/').unwrap_or(("", service_name));
    let mut hasher = sha1_smol::Sha1::new();
    for part in [
        cluster_id,
        namespace,
        name,
        &port.port.to_string(),
        &port.node_port.to_string(),
        &port.protocol,
        "instance",
        hc_protocol,
        &hc_interval.to_string(),
    ] {
        hasher.update(part.as_bytes());
    }
    let hash = &hasher.digest().to_string()[..HASH_DIGITS];
    named_target_group(service_name, hash, |c| c.is_ascii_alphanumeric())
}

/// The name this provider gave target groups before 2026-11-26 (hyphens kept in the namespace and name,
/// runs of hyphens made one), with the hash of upstream's `name` for the same port: matched too, so a
/// load balancer it made then keeps its groups.
pub fn legacy_target_group_name(name: &str, service_name: &str) -> String {
    let hash = &name[name.len().saturating_sub(HASH_DIGITS)..];
    named_target_group(service_name, hash, |c| {
        c.is_ascii_alphanumeric() || c == '-'
    })
    .split('-')
    .filter(|part| !part.is_empty())
    .collect::<Vec<_>>()
    .join("-")
}

/// How many hex digits of the SHA-1 end a target group's name.
const HASH_DIGITS: usize = 10;

/// `k8s-<namespace>-<name>-<hash>`, the namespace and name of `service_name` each cut to their first 8
/// characters that `keep` keeps.
fn named_target_group(service_name: &str, hash: &str, keep: impl Fn(char) -> bool) -> String {
    let (namespace, name) = service_name.split_once('/').unwrap_or(("", service_name));
    let clean = |s: &str| -> String { s.chars().filter(|c| keep(*c)).take(8).collect() };
    format!("k8s-{}-{}-{hash}", clean(namespace), clean(name))
}

/// Upstream's description of the path-MTU-discovery rules (ICMP type 3, code 4) an NLB's clients need:
/// one rule per client CIDR of any NLB in the group, shared by them (no load balancer's name).
const MTU_DESCRIPTION: &str = "kubernetes.io/rule/nlb/mtu";
/// What every NLB client rule's description starts with.
const CLIENT_DESCRIPTION_PREFIX: &str = "kubernetes.io/rule/nlb/client=";

fn rule_description(kind: &str, lb_name: &str) -> String {
    format!("kubernetes.io/rule/nlb/{kind}={lb_name}")
}

/// The Service's tags as key-value pairs (what the index of target groups reads).
fn spec_tags(spec: &LbSpec) -> impl Iterator<Item = (&str, &str)> {
    spec.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))
}

fn tags(spec: &LbSpec) -> Vec<Tag> {
    spec.tags
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

impl LoadBalancers {
    /// The NLB named `name`, if any (looked up with the other syncs' and checks' under way).
    pub(super) async fn describe_nlb(&self, name: &str) -> Result<Option<Elbv2LoadBalancer>> {
        self.described_nlb(name, true).await
    }

    /// [`Self::describe_nlb`], in a shared call only when `shared`.
    async fn described_nlb(&self, name: &str, shared: bool) -> Result<Option<Elbv2LoadBalancer>> {
        let found = self.lookups.nlb(&self.calls, name, shared).await?;
        match found {
            Some(_) => self.elbv2_load_balancer_created(name).await,
            None => self.elbv2_load_balancer_deleted(name).await,
        }
        Ok(found)
    }

    /// Creates or updates the Service's NLB.
    pub(super) async fn ensure_nlb(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<LoadBalancerStatus> {
        let Some((lb, groups)) = self
            .found_or_created_nlb(spec, instances, cluster_id)
            .await?
        else {
            return Ok(LoadBalancerStatus::default());
        };
        let arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        let vpc_id = lb.vpc_id().unwrap_or_default().to_owned();
        self.sync_ip_address_type(&lb, spec).await?;
        check_fixed_addresses(&lb, spec)?;
        let mut listeners = self.listeners_of(&arn).await?;
        let attached = self.target_groups_behind(&listeners).await?;
        let mut wanted_groups = Vec::new();
        for service_port in &spec.ports {
            if let Some(group) = self
                .sync_nlb_port(
                    spec,
                    service_port,
                    cluster_id,
                    (&arn, &vpc_id),
                    &attached,
                    &mut listeners,
                    instances,
                )
                .await?
            {
                wanted_groups.push(group);
            }
        }
        // Listeners of ports the Service no longer has, then target groups no listener uses.
        self.remove_unwanted_nlb_parts(listeners, attached, &wanted_groups)
            .await?;
        if let Some(enabled) = spec.cross_zone {
            self.sync_cross_zone(&arn, enabled).await?;
        }
        // The NLB's own group's rules, once the NLB is as the Service asks (upstream's order).
        if let Some(own) = groups.as_ref().and_then(|g| g.own.as_deref()) {
            self.sync_own_group_rules(own, spec).await?;
        }
        if !self.config.global.disable_security_group_ingress {
            self.sync_nlb_rules(spec, instances, cluster_id, &lb)
                .await?;
        }
        Ok(hostname_status(lb.dns_name()))
    }

    /// The Service's NLB, its security groups synced, or created (with its groups) when there is none;
    /// `None` in a preview that would create it.
    async fn found_or_created_nlb(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<Option<(Elbv2LoadBalancer, Option<NlbGroups>)>> {
        let elbv2 = &self.calls.clients.elbv2;
        Ok(Some(
            match self.described_nlb(&spec.name, spec.provisioned).await? {
                Some(lb) => {
                    let vpc = lb.vpc_id().unwrap_or_default().to_owned();
                    let groups = self.nlb_security_groups(spec, Some(&lb), &vpc).await?;
                    if let Some(groups) = &groups {
                        self.sync_nlb_security_groups(&lb, spec, groups, cluster_id)
                            .await?;
                    }
                    (lb, groups)
                }
                None => {
                    if self.previewed_creation(|| format!("NLB {} would be created", spec.name)) {
                        return Ok(None);
                    }
                    let vpc = self.vpc_id(instances).await?;
                    let subnets = self.subnets(spec, &vpc, cluster_id).await?;
                    let mappings = self.subnet_mappings(spec, &subnets).await?;
                    let groups = self.nlb_security_groups(spec, None, &vpc).await?;
                    let group_ids = groups.as_ref().map(|g| g.ids.clone());
                    tracing::info!(
                        name = spec.name,
                        service = spec.service_name,
                        "creating NLB"
                    );
                    let scheme = if spec.internal {
                        LoadBalancerSchemeEnum::Internal
                    } else {
                        LoadBalancerSchemeEnum::InternetFacing
                    };
                    let out = self
                        .calls
                        .call("elbv2:CreateLoadBalancer", || {
                            elbv2
                                .create_load_balancer()
                                .name(&spec.name)
                                .r#type(LoadBalancerTypeEnum::Network)
                                .scheme(scheme.clone())
                                .ip_address_type(ip_address_type(spec))
                                .set_subnets((mappings.is_empty()).then(|| subnets.clone()))
                                .set_subnet_mappings(
                                    (!mappings.is_empty()).then(|| mappings.clone()),
                                )
                                .set_security_groups(group_ids.clone())
                                .set_tags(Some(tags(spec)))
                                .send()
                        })
                        .await?;
                    let lb = created(
                        out.load_balancers(),
                        "elbv2:CreateLoadBalancer",
                        "load balancer",
                    )?;
                    self.elbv2_load_balancer_created(&spec.name).await;
                    (lb, groups)
                }
            },
        ))
    }

    async fn sync_cross_zone(&self, lb_arn: &str, enabled: bool) -> Result<()> {
        const KEY: &str = "load_balancing.cross_zone.enabled";
        let elbv2 = &self.calls.clients.elbv2;
        let out = self
            .calls
            .call("elbv2:DescribeLoadBalancerAttributes", || {
                elbv2
                    .describe_load_balancer_attributes()
                    .load_balancer_arn(lb_arn)
                    .send()
            })
            .await?;
        let current = out
            .attributes()
            .iter()
            .find(|a| a.key() == Some(KEY))
            .and_then(|a| a.value())
            .map(|v| v == "true")
            .unwrap_or(false);
        if current == enabled {
            return Ok(());
        }
        if self.previewed(|| format!("cross-zone load balancing would be set to {enabled}")) {
            return Ok(());
        }
        let attribute = LoadBalancerAttribute::builder()
            .key(KEY)
            .value(enabled.to_string())
            .build();
        self.calls
            .call("elbv2:ModifyLoadBalancerAttributes", || {
                elbv2
                    .modify_load_balancer_attributes()
                    .load_balancer_arn(lb_arn)
                    .attributes(attribute.clone())
                    .send()
            })
            .await?;
        Ok(())
    }

    /// Backends of an existing NLB follow `instances`: targets and security-group rules.
    pub(super) async fn update_nlb_targets(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<()> {
        let Some(lb) = self.describe_nlb(&spec.name).await? else {
            return Err(not_found(spec));
        };
        let arn = lb.load_balancer_arn().unwrap_or_default();
        for g in self.target_groups_of(arn).await? {
            let port = g.port().unwrap_or_default();
            self.sync_targets(g.target_group_arn().unwrap_or_default(), port, instances)
                .await?;
        }
        if !self.config.global.disable_security_group_ingress {
            self.sync_nlb_rules(spec, instances, cluster_id, &lb)
                .await?;
        }
        Ok(())
    }

    /// Deletes the NLB named `name` with its listeners and target groups, every target group tagged for
    /// the Service, and the rules it added to security groups.
    pub(super) async fn delete_nlb(
        &self,
        name: &str,
        service_name: &str,
        own_group_name: Option<&str>,
        cluster_id: &str,
    ) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        let mut groups = Vec::new();
        let described = if self.elbv2_load_balancer_may_exist(name).await? {
            self.describe_nlb(name).await?
        } else {
            None
        };
        let security_groups = described.as_ref().map(|lb| lb.security_groups().to_vec());
        if let Some(lb) = described {
            let arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
            // Its listeners go with it (AWS: "deleting a load balancer also deletes its listeners"), as
            // upstream relies on; its target groups are deleted after it.
            groups.extend(
                self.target_groups_of(&arn)
                    .await?
                    .iter()
                    .filter_map(|g| g.target_group_arn().map(str::to_owned)),
            );
            tracing::info!(name, service = service_name, "deleting NLB");
            self.calls
                .call("elbv2:DeleteLoadBalancer", || {
                    elbv2.delete_load_balancer().load_balancer_arn(&arn).send()
                })
                .await?;
            self.elbv2_load_balancer_deleted(name).await;
        }
        for g in self.tagged_target_groups(service_name, cluster_id).await? {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        for g in &groups {
            deleted_once_released(|| self.delete_target_group(g)).await?;
        }
        if !self.config.global.disable_security_group_ingress {
            let changed = self
                .revoke_described_rules(&rule_description("client", name))
                .await?;
            self.revoke_described_rules(&rule_description("health", name))
                .await?;
            for group in changed {
                self.sync_mtu_rules(&group).await?;
            }
        }
        self.delete_nlb_security_groups(
            name,
            security_groups.as_deref(),
            own_group_name,
            cluster_id,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_group_names_are_upstream_s() {
        let port = Port {
            port: 80,
            protocol: "TCP".into(),
            node_port: 30080,
        };
        // Upstream strips every character but letters and digits, then cuts to 8.
        let name = target_group_name("prod", "very-long-namespace/web.frontend", &port, "TCP", 30);
        assert!(name.starts_with("k8s-verylong-webfront-"), "{name}");
        assert_eq!(name.len(), 4 + 8 + 1 + 8 + 1 + 10);
        // The hash of the concatenated fields, as upstream writes them into sha1.
        let digest =
            sha1_smol::Sha1::from("prodvery-long-namespaceweb.frontend8030080TCPinstanceTCP30")
                .digest()
                .to_string();
        assert!(name.ends_with(&digest[..10]), "{name} vs {digest}");
        assert_ne!(
            name,
            target_group_name(
                "prod",
                "very-long-namespace/web.frontend",
                &port,
                "HTTP",
                10
            )
        );
        // Issue #29: `web-nlb` is `webnlb`, where this provider used to keep the hyphen.
        let web = target_group_name("prod", "default/web-nlb", &port, "TCP", 30);
        assert!(web.starts_with("k8s-default-webnlb-"), "{web}");
        let legacy = legacy_target_group_name(&web, "default/web-nlb");
        assert!(legacy.starts_with("k8s-default-web-nlb-"), "{legacy}");
        assert_eq!(web[web.len() - 10..], legacy[legacy.len() - 10..]);
        // A name cut to end in a hyphen: never two in a row, upstream's or the legacy one.
        let local = target_group_name("prod", "default/aws-nlb-local", &port, "HTTP", 10);
        assert!(local.starts_with("k8s-default-awsnlblo-"), "{local}");
        let legacy = legacy_target_group_name(&local, "default/aws-nlb-local");
        assert!(
            legacy.starts_with("k8s-default-aws-nlb-") && !legacy.contains("--"),
            "{legacy}"
        );
    }
}
