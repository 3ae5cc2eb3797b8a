//! Network Load Balancers: one target group per port (instance targets on the node port), one listener
//! per port, the health check on the target group, and client rules in the nodes' security groups.

use std::{collections::BTreeMap, time::Duration};

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, Listener,
    LoadBalancer as Elbv2LoadBalancer, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping, Tag, TargetDescription, TargetGroup,
    TargetGroupAttribute, TargetTypeEnum,
};
use k8s_openapi::api::core::v1::LoadBalancerStatus;

use super::{
    LoadBalancers, RuleScope, all_pages, hostname_status,
    nlb_security_group::NlbGroups,
    spec::{self, LbSpec, PRESERVE_CLIENT_IP, Port},
};
use crate::{Error, error::Result, instances::InstanceInfo};

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
    let clean = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect()
    };
    format!(
        "k8s-{}-{}-{}",
        clean(namespace),
        clean(name),
        target_group_hash(cluster_id, service_name, port, hc_protocol, hc_interval)
    )
}

/// The name this provider gave target groups before 2026-11-26 (hyphens kept in the namespace and name,
/// runs of hyphens made one): matched too, so a load balancer it made then keeps its groups.
pub fn legacy_target_group_name(
    cluster_id: &str,
    service_name: &str,
    port: &Port,
    hc_protocol: &str,
    hc_interval: i32,
) -> String {
    let (namespace, name) = service_name.split_once('/').unwrap_or(("", service_name));
    let clean = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(8)
            .collect()
    };
    format!(
        "k8s-{}-{}-{}",
        clean(namespace),
        clean(name),
        target_group_hash(cluster_id, service_name, port, hc_protocol, hc_interval)
    )
    .split('-')
    .filter(|part| !part.is_empty())
    .collect::<Vec<_>>()
    .join("-")
}

fn target_group_hash(
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
    hasher.digest().to_string()[..10].to_owned()
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

    pub(super) async fn target_groups_of(&self, lb_arn: &str) -> Result<Vec<TargetGroup>> {
        let elbv2 = &self.calls.clients.elbv2;
        match self
            .calls
            .call("DescribeTargetGroups", || {
                elbv2
                    .describe_target_groups()
                    .load_balancer_arn(lb_arn)
                    .send()
            })
            .await
        {
            Ok(out) => Ok(out.target_groups().to_vec()),
            // moto answers so for a load balancer without target groups (AWS answers an empty list).
            Err(e) if e.code() == Some("TargetGroupNotFound") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The target groups `listeners` forward to (the ones AWS lists as their NLB's), looked up by ARN
    /// with the other syncs' and checks' under way.
    async fn target_groups_behind(&self, listeners: &[Listener]) -> Result<Vec<TargetGroup>> {
        let mut arns: Vec<&str> = listeners
            .iter()
            .flat_map(Listener::default_actions)
            .flat_map(|action| {
                let forwarded = action
                    .forward_config()
                    .into_iter()
                    .flat_map(|f| f.target_groups())
                    .filter_map(|g| g.target_group_arn());
                action.target_group_arn().into_iter().chain(forwarded)
            })
            .collect();
        arns.sort_unstable();
        arns.dedup();
        let found = futures::future::try_join_all(
            arns.iter()
                .map(|arn| self.lookups.target_group(&self.calls, arn)),
        )
        .await?;
        Ok(found.into_iter().flatten().collect())
    }

    async fn target_group_named(&self, name: &str) -> Result<Option<TargetGroup>> {
        let elbv2 = &self.calls.clients.elbv2;
        match self
            .calls
            .call("DescribeTargetGroups", || {
                elbv2.describe_target_groups().names(name).send()
            })
            .await
        {
            Ok(out) => Ok(out.target_groups().first().cloned()),
            Err(e) if e.code() == Some("TargetGroupNotFound") => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn listeners_of(&self, lb_arn: &str) -> Result<Vec<Listener>> {
        let elbv2 = &self.calls.clients.elbv2;
        let out = self
            .calls
            .call("DescribeListeners", || {
                elbv2.describe_listeners().load_balancer_arn(lb_arn).send()
            })
            .await?;
        Ok(out.listeners().to_vec())
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
                    let lb = out
                        .load_balancers()
                        .first()
                        .cloned()
                        .ok_or(Error::Response {
                            operation: "elbv2:CreateLoadBalancer",
                            missing: "load balancer",
                        })?;
                    self.elbv2_load_balancer_created(&spec.name).await;
                    (lb, groups)
                }
            },
        ))
    }

    /// One Service port's target group (found, or created), its targets and attributes, and the listener
    /// forwarding to it (created, changed or kept; taken out of `listeners`, the NLB's listeners no port
    /// has claimed yet); the group's ARN, or `None` in a preview that would create the group.
    #[allow(clippy::too_many_arguments)]
    async fn sync_nlb_port(
        &self,
        spec: &LbSpec,
        service_port: &Port,
        cluster_id: &str,
        nlb: (&str, &str),
        attached: &[TargetGroup],
        listeners: &mut Vec<Listener>,
        instances: &[InstanceInfo],
    ) -> Result<Option<String>> {
        let (arn, vpc_id) = nlb;
        // The port as its target group sees it: TLS to the nodes with `backend-protocol: ssl`.
        let port = &Port {
            protocol: spec.tls.nlb_target_protocol(service_port).to_owned(),
            ..service_port.clone()
        };
        let hc = &spec.health_check;
        let name = target_group_name(
            cluster_id,
            &spec.service_name,
            port,
            &hc.protocol,
            hc.interval,
        );
        let legacy_name = legacy_target_group_name(
            cluster_id,
            &spec.service_name,
            port,
            &hc.protocol,
            hc.interval,
        );
        let existing = match attached.iter().find(|g| {
            g.target_group_name()
                .is_some_and(|n| n == name || n == legacy_name)
        }) {
            Some(g) => Some(g.clone()),
            None => self.target_group_named(&name).await?,
        };
        let group = match existing {
            Some(g) => {
                // Found by its name, which only this Service's group has: a creation whose answer
                // was lost made it.
                if let Some(arn) = g.target_group_arn() {
                    self.target_group_created(arn, spec_tags(spec)).await;
                }
                self.sync_health_check(&g, spec).await?;
                g
            }
            None => {
                if self.previewed(|| {
                    format!(
                        "target group {name} would be created for port {} (node port {}, {}) and the listener on port {} would forward to it",
                        port.port, port.node_port, port.protocol, port.port
                    )
                }) {
                    // Its listener is accounted for; the group's targets would all be new.
                    listeners.retain(|l| l.port() != Some(port.port));
                    return Ok(None);
                }
                self.create_target_group(&name, port, vpc_id, spec).await?
            }
        };
        let group_arn = group.target_group_arn().unwrap_or_default().to_owned();
        self.sync_targets(&group_arn, port.node_port, instances)
            .await?;
        self.sync_target_group_attributes(&group_arn, spec).await?;
        self.sync_nlb_listener(spec, service_port, port, &group_arn, arn, listeners)
            .await?;
        Ok(Some(group_arn))
    }

    /// The listener of `port` forwarding to the target group `group_arn`: kept, changed (protocol,
    /// target, certificate, policy) or created; taken out of `listeners` (those no port claimed yet).
    async fn sync_nlb_listener(
        &self,
        spec: &LbSpec,
        service_port: &Port,
        port: &Port,
        group_arn: &str,
        arn: &str,
        listeners: &mut Vec<Listener>,
    ) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        let protocol = ProtocolEnum::from(spec.tls.nlb_listener_protocol(service_port));
        let tls = spec.tls.on(service_port);
        // A TLS listener's certificate, and its policy when the annotation names one (else AWS's
        // default, which is then left as it is: upstream would set it again on every sync).
        let certificate = tls
            .then(|| spec.tls.cert.clone())
            .flatten()
            .map(|arn| Certificate::builder().certificate_arn(arn).build());
        let policy = spec.tls.policy.clone().filter(|p| tls && !p.is_empty());
        let forward = Action::builder()
            .r#type(ActionTypeEnum::Forward)
            .target_group_arn(group_arn)
            .build();
        match listeners.iter().position(|l| l.port() == Some(port.port)) {
            Some(at) => {
                let l = listeners.remove(at);
                let forwards_here = l
                    .default_actions()
                    .iter()
                    .any(|a| a.target_group_arn() == Some(group_arn));
                let certificate_kept = l.certificates().first().and_then(|c| c.certificate_arn())
                    == certificate.as_ref().and_then(|c| c.certificate_arn());
                let policy_kept = policy.is_none() || l.ssl_policy() == policy.as_deref();
                if (l.protocol() != Some(&protocol)
                    || !forwards_here
                    || !certificate_kept
                    || !policy_kept) && !self.previewed(|| {
                    format!(
                        "the listener on port {} would change to {}{} forwarding to {group_arn}",
                        port.port,
                        protocol.as_str(),
                        certificate
                            .as_ref()
                            .and_then(|c| c.certificate_arn())
                            .map(|arn| format!(" with certificate {arn}"))
                            .unwrap_or_default()
                    )
                }) {
                    self.calls
                        .call("ModifyListener", || {
                            elbv2
                                .modify_listener()
                                .listener_arn(l.listener_arn().unwrap_or_default())
                                .protocol(protocol.clone())
                                .set_certificates(certificate.clone().map(|c| vec![c]))
                                .set_ssl_policy(policy.clone())
                                .default_actions(forward.clone())
                                .send()
                        })
                        .await?;
                }
            }
            None => {
                if self.previewed(|| {
                    format!(
                        "a {} listener on port {} would be created",
                        protocol.as_str(),
                        port.port
                    )
                }) {
                    return Ok(());
                }
                self.calls
                    .call("CreateListener", || {
                        elbv2
                            .create_listener()
                            .load_balancer_arn(arn)
                            .port(port.port)
                            .protocol(protocol.clone())
                            .set_certificates(certificate.clone().map(|c| vec![c]))
                            .set_ssl_policy(policy.clone())
                            .default_actions(forward.clone())
                            .set_tags(Some(tags(spec)))
                            .send()
                    })
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes the listeners no port claimed, then the NLB's target groups no listener uses.
    async fn remove_unwanted_nlb_parts(
        &self,
        listeners: Vec<Listener>,
        attached: Vec<TargetGroup>,
        wanted_groups: &[String],
    ) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        for l in listeners {
            if self.previewed(|| {
                format!(
                    "the listener on port {} would be deleted",
                    l.port().unwrap_or_default()
                )
            }) {
                continue;
            }
            self.calls
                .call("DeleteListener", || {
                    elbv2
                        .delete_listener()
                        .listener_arn(l.listener_arn().unwrap_or_default())
                        .send()
                })
                .await?;
        }
        for g in attached {
            let g_arn = g.target_group_arn().unwrap_or_default();
            if !wanted_groups.iter().any(|w| w == g_arn)
                && !self.previewed(|| {
                    format!(
                        "target group {} would be deleted",
                        g.target_group_name().unwrap_or(g_arn)
                    )
                })
            {
                self.delete_target_group(g_arn).await?;
            }
        }
        Ok(())
    }

    /// The target group's `preserve_client_ip.enabled` and `proxy_protocol_v2.enabled` as the Service
    /// asks ([`LbSpec::target_group_attributes`]: the annotation, else AWS's defaults, so removing the
    /// annotation puts them back; upstream leaves its last values); a key AWS does not report counts
    /// as its default. Written only where they differ.
    async fn sync_target_group_attributes(&self, group_arn: &str, spec: &LbSpec) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        let out = self
            .calls
            .call("DescribeTargetGroupAttributes", || {
                elbv2
                    .describe_target_group_attributes()
                    .target_group_arn(group_arn)
                    .send()
            })
            .await?;
        let changes: Vec<TargetGroupAttribute> = spec
            .target_group_attributes
            .iter()
            .filter(|(key, wanted)| {
                let current = out
                    .attributes()
                    .iter()
                    .find(|a| a.key() == Some(key.as_str()))
                    .and_then(|a| a.value())
                    .map(|v| v == "true")
                    .unwrap_or(key.as_str() == PRESERVE_CLIENT_IP);
                current != **wanted
            })
            .map(|(key, wanted)| {
                TargetGroupAttribute::builder()
                    .key(key)
                    .value(wanted.to_string())
                    .build()
            })
            .collect();
        if changes.is_empty()
            || self.previewed(|| {
                let said: Vec<String> = changes
                    .iter()
                    .map(|a| {
                        format!(
                            "{}={}",
                            a.key().unwrap_or_default(),
                            a.value().unwrap_or_default()
                        )
                    })
                    .collect();
                format!("target group {group_arn} would get {}", said.join(","))
            })
        {
            return Ok(());
        }
        self.calls
            .call("ModifyTargetGroupAttributes", || {
                elbv2
                    .modify_target_group_attributes()
                    .target_group_arn(group_arn)
                    .set_attributes(Some(changes.clone()))
                    .send()
            })
            .await?;
        Ok(())
    }

    async fn create_target_group(
        &self,
        name: &str,
        port: &Port,
        vpc_id: &str,
        spec: &LbSpec,
    ) -> Result<TargetGroup> {
        let elbv2 = &self.calls.clients.elbv2;
        let hc = &spec.health_check;
        tracing::info!(name, service = spec.service_name, "creating target group");
        let out = self
            .calls
            .call("CreateTargetGroup", || {
                elbv2
                    .create_target_group()
                    .name(name)
                    .vpc_id(vpc_id)
                    .port(port.node_port)
                    .protocol(ProtocolEnum::from(port.protocol.as_str()))
                    .target_type(TargetTypeEnum::Instance)
                    .health_check_protocol(ProtocolEnum::from(hc.protocol.as_str()))
                    .health_check_port(&hc.port)
                    .set_health_check_path((!hc.path.is_empty()).then(|| hc.path.clone()))
                    .health_check_interval_seconds(hc.interval)
                    .health_check_timeout_seconds(hc.timeout)
                    .healthy_threshold_count(hc.healthy_threshold)
                    .unhealthy_threshold_count(hc.unhealthy_threshold)
                    .set_tags(Some(tags(spec)))
                    .send()
            })
            .await?;
        let group = out
            .target_groups()
            .first()
            .cloned()
            .ok_or(Error::Response {
                operation: "CreateTargetGroup",
                missing: "target group",
            })?;
        if let Some(arn) = group.target_group_arn() {
            self.target_group_created(arn, spec_tags(spec)).await;
        }
        Ok(group)
    }

    /// Changes the health check of `group` only where it differs from the Service's.
    async fn sync_health_check(&self, group: &TargetGroup, spec: &LbSpec) -> Result<()> {
        let hc = &spec.health_check;
        let same = group.health_check_port() == Some(hc.port.as_str())
            && group.health_check_protocol().map(|p| p.as_str()) == Some(hc.protocol.as_str())
            && (hc.path.is_empty() || group.health_check_path() == Some(hc.path.as_str()))
            && group.healthy_threshold_count() == Some(hc.healthy_threshold)
            && group.unhealthy_threshold_count() == Some(hc.unhealthy_threshold)
            && group.health_check_timeout_seconds() == Some(hc.timeout);
        if same {
            return Ok(());
        }
        if self.previewed(|| {
            format!(
                "the health check of target group {} would change to {}:{}{} (timeout {}s, thresholds {}/{})",
                group.target_group_name().unwrap_or_default(),
                hc.protocol,
                hc.port,
                hc.path,
                hc.timeout,
                hc.healthy_threshold,
                hc.unhealthy_threshold
            )
        }) {
            return Ok(());
        }
        let elbv2 = &self.calls.clients.elbv2;
        self.calls
            .call("ModifyTargetGroup", || {
                elbv2
                    .modify_target_group()
                    .target_group_arn(group.target_group_arn().unwrap_or_default())
                    .health_check_protocol(ProtocolEnum::from(hc.protocol.as_str()))
                    .health_check_port(&hc.port)
                    .set_health_check_path((!hc.path.is_empty()).then(|| hc.path.clone()))
                    .health_check_timeout_seconds(hc.timeout)
                    .healthy_threshold_count(hc.healthy_threshold)
                    .unhealthy_threshold_count(hc.unhealthy_threshold)
                    .send()
            })
            .await?;
        Ok(())
    }

    /// Registers the instances not yet targets and deregisters those no longer wanted; nothing else.
    pub(super) async fn sync_targets(
        &self,
        group_arn: &str,
        node_port: i32,
        instances: &[InstanceInfo],
    ) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        let health = self
            .calls
            .call("DescribeTargetHealth", || {
                elbv2
                    .describe_target_health()
                    .target_group_arn(group_arn)
                    .send()
            })
            .await?;
        let current: Vec<(String, i32)> = health
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target())
            .filter_map(|t| Some((t.id()?.to_owned(), t.port().unwrap_or(node_port))))
            .collect();
        let wanted: Vec<(String, i32)> = instances
            .iter()
            .map(|i| (i.id.clone(), node_port))
            .collect();
        let target =
            |(id, port): &(String, i32)| TargetDescription::builder().id(id).port(*port).build();
        let add: Vec<TargetDescription> = wanted
            .iter()
            .filter(|w| !current.contains(w))
            .map(target)
            .collect();
        let remove: Vec<TargetDescription> = current
            .iter()
            .filter(|c| !wanted.contains(c))
            .map(target)
            .collect();
        if self.previewed_backends(
            add.iter().filter_map(|t| t.id()),
            remove.iter().filter_map(|t| t.id()),
        ) {
            return Ok(());
        }
        if !add.is_empty() {
            self.calls
                .call("RegisterTargets", || {
                    elbv2
                        .register_targets()
                        .target_group_arn(group_arn)
                        .set_targets(Some(add.clone()))
                        .send()
                })
                .await?;
        }
        if !remove.is_empty() {
            self.calls
                .call("DeregisterTargets", || {
                    elbv2
                        .deregister_targets()
                        .target_group_arn(group_arn)
                        .set_targets(Some(remove.clone()))
                        .send()
                })
                .await?;
        }
        Ok(())
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

    /// Client rules (the source ranges on each node port) and health-check rules (the CIDRs of the
    /// NLB's subnets on the health-check port, as upstream: the addresses its health checks come from)
    /// in the backends' security groups, described as upstream describes them; the same rules are
    /// removed from groups no backend uses any more.
    async fn sync_nlb_rules(
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
    async fn sync_mtu_rules(&self, group: &str) -> Result<()> {
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

    /// The subnet mappings of a new NLB with fixed addresses (none without `eip-allocations` and
    /// `private-ipv4-addresses`): one address per subnet, as upstream requires. Elastic IPs go to the
    /// subnets in order (zones by name, or the `subnets` annotation's IDs sorted); each private address
    /// to the subnet whose CIDR holds it, so their order does not matter (upstream pairs them by order,
    /// and AWS refuses an address outside its subnet).
    async fn subnet_mappings(
        &self,
        spec: &LbSpec,
        subnets: &[String],
    ) -> Result<Vec<SubnetMapping>> {
        if spec.eip_allocations.is_empty() && spec.private_ipv4_addresses.is_empty() {
            return Ok(Vec::new());
        }
        let bad = |field: &str, message: String| Error::Service {
            service: spec.service_name.clone(),
            field: field.to_owned(),
            message,
        };
        for (field, count) in [
            (spec::ANNOTATION_EIP_ALLOCATIONS, spec.eip_allocations.len()),
            (
                spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                spec.private_ipv4_addresses.len(),
            ),
        ] {
            if count != 0 && count != subnets.len() {
                return Err(bad(
                    field,
                    format!(
                        "{count} given for {} subnets ({}); the NLB needs exactly one per subnet",
                        subnets.len(),
                        subnets.join(", ")
                    ),
                ));
            }
        }
        let mut private: Vec<Option<std::net::Ipv4Addr>> = vec![None; subnets.len()];
        if !spec.private_ipv4_addresses.is_empty() {
            let blocks = self.subnet_cidr_blocks(subnets).await?;
            let cidr_of = |id: &str| -> Option<ipnet::Ipv4Net> {
                blocks
                    .iter()
                    .find(|(subnet, _)| subnet == id)
                    .and_then(|(_, cidr)| cidr.parse().ok())
            };
            for address in &spec.private_ipv4_addresses {
                let Some(index) = subnets
                    .iter()
                    .position(|id| cidr_of(id).is_some_and(|net| net.contains(address)))
                else {
                    return Err(bad(
                        spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                        format!(
                            "{address} is in none of the NLB's subnets ({})",
                            subnets.join(", ")
                        ),
                    ));
                };
                if let Some(other) = private[index] {
                    return Err(bad(
                        spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                        format!(
                            "{other} and {address} are both in subnet {}; the NLB takes one address per subnet",
                            subnets[index]
                        ),
                    ));
                }
                private[index] = Some(*address);
            }
        }
        Ok(subnets
            .iter()
            .enumerate()
            .map(|(i, id)| {
                SubnetMapping::builder()
                    .subnet_id(id)
                    .set_allocation_id(spec.eip_allocations.get(i).cloned())
                    .set_private_ipv4_address(private[i].map(|a| a.to_string()))
                    .build()
            })
            .collect())
    }

    /// An existing NLB's IP address type follows `ip-address-type` (`SetIpAddressType`; AWS refuses
    /// `dualstack` when a subnet of the NLB has no IPv6 CIDR, and the sync fails with its message).
    async fn sync_ip_address_type(&self, lb: &Elbv2LoadBalancer, spec: &LbSpec) -> Result<()> {
        let wanted = ip_address_type(spec);
        // AWS reports `ipv4` for an NLB created without a type; moto may report none.
        let current = lb.ip_address_type().cloned().unwrap_or(IpAddressType::Ipv4);
        if current == wanted
            || self.previewed(|| {
                format!(
                    "the IP address type would change from {} to {}",
                    current.as_str(),
                    wanted.as_str()
                )
            })
        {
            return Ok(());
        }
        let elbv2 = &self.calls.clients.elbv2;
        let arn = lb.load_balancer_arn().unwrap_or_default();
        self.calls
            .call("elbv2:SetIpAddressType", || {
                elbv2
                    .set_ip_address_type()
                    .load_balancer_arn(arn)
                    .ip_address_type(wanted.clone())
                    .send()
            })
            .await?;
        Ok(())
    }

    /// The CIDR blocks of the NLB's subnets (upstream's `getSubnetCidrs` over the subnets of its
    /// availability zones).
    async fn subnet_cidrs(&self, lb: &Elbv2LoadBalancer) -> Result<Vec<String>> {
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
    async fn subnet_cidr_blocks(&self, ids: &[String]) -> Result<Vec<(String, String)>> {
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

    /// Backends of an existing NLB follow `instances`: targets and security-group rules.
    pub(super) async fn update_nlb_targets(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<()> {
        let Some(lb) = self.describe_nlb(&spec.name).await? else {
            return Err(Error::Setup(format!(
                "load balancer {} of {} not found",
                spec.name, spec.service_name
            )));
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

    async fn delete_target_group(&self, arn: &str) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        match self
            .calls
            .call("DeleteTargetGroup", || {
                elbv2.delete_target_group().target_group_arn(arn).send()
            })
            .await
        {
            Ok(_) => {
                self.target_group_deleted(arn).await;
                Ok(())
            }
            Err(e) if e.code() == Some("TargetGroupNotFound") => {
                self.target_group_deleted(arn).await;
                Ok(())
            }
            // AWS may still see the group in use just after its load balancer went: come back shortly.
            Err(e) if e.code() == Some("ResourceInUse") => Err(Error::StillInUse(e.to_string())),
            Err(e) => Err(e),
        }
    }

    /// The ARN of every target group in the region.
    pub(super) async fn all_target_group_arns(&self) -> Result<Vec<String>> {
        let elbv2 = &self.calls.clients.elbv2;
        all_pages(|marker| async move {
            let out = self
                .calls
                .call("DescribeTargetGroups", || {
                    elbv2
                        .describe_target_groups()
                        .set_marker(marker.clone())
                        .send()
                })
                .await?;
            let arns = out
                .target_groups()
                .iter()
                .filter_map(|g| g.target_group_arn().map(str::to_owned))
                .collect();
            Ok((arns, out.next_marker().map(str::to_owned)))
        })
        .await
    }

    /// Every ELBv2 load balancer in the region (every kind).
    pub(super) async fn all_elbv2_load_balancers(&self) -> Result<Vec<Elbv2LoadBalancer>> {
        let elbv2 = &self.calls.clients.elbv2;
        all_pages(|marker| async move {
            let out = self
                .calls
                .call("elbv2:DescribeLoadBalancers", || {
                    elbv2
                        .describe_load_balancers()
                        .set_marker(marker.clone())
                        .send()
                })
                .await?;
            Ok((
                out.load_balancers().to_vec(),
                out.next_marker().map(str::to_owned),
            ))
        })
        .await
    }

    /// The tags of ELBv2 resources (load balancers, target groups) by ARN, 20 ARNs per DescribeTags.
    pub(super) async fn elbv2_tags(
        &self,
        arns: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, String>)>> {
        let elbv2 = &self.calls.clients.elbv2;
        let mut tagged = Vec::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            let out = self
                .calls
                .call("elbv2:DescribeTags", || {
                    elbv2
                        .describe_tags()
                        .set_resource_arns(Some(chunk.to_vec()))
                        .send()
                })
                .await?;
            for d in out.tag_descriptions() {
                let tags = d
                    .tags()
                    .iter()
                    .filter_map(|t| {
                        Some((
                            t.key()?.to_owned(),
                            t.value().unwrap_or_default().to_owned(),
                        ))
                    })
                    .collect();
                tagged.extend(d.resource_arn().map(|arn| (arn.to_owned(), tags)));
            }
        }
        Ok(tagged)
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
            let mut attempt = 0;
            loop {
                match self.delete_target_group(g).await {
                    Err(Error::StillInUse(_)) if attempt < 5 => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    other => break other?,
                }
            }
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

/// An existing NLB's fixed addresses against the annotations: AWS sets them at creation only, so an
/// NLB without the Elastic IPs or private addresses the Service asks for is an error that says so (upstream
/// ignores the annotations after creation). Without the annotations, whatever the NLB has is kept.
fn check_fixed_addresses(lb: &Elbv2LoadBalancer, spec: &LbSpec) -> Result<()> {
    let addresses = || {
        lb.availability_zones()
            .iter()
            .flat_map(|z| z.load_balancer_addresses().iter())
    };
    let mut eips: Vec<String> = addresses()
        .filter_map(|a| a.allocation_id().map(str::to_owned))
        .collect();
    let mut private: Vec<String> = addresses()
        .filter_map(|a| a.private_ipv4_address().map(str::to_owned))
        .collect();
    eips.sort();
    private.sort();
    let mut wanted_eips = spec.eip_allocations.clone();
    wanted_eips.sort();
    let mut wanted_private: Vec<String> = spec
        .private_ipv4_addresses
        .iter()
        .map(|a| a.to_string())
        .collect();
    wanted_private.sort();
    for (field, wanted, has) in [
        (spec::ANNOTATION_EIP_ALLOCATIONS, wanted_eips, eips),
        (
            spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
            wanted_private,
            private,
        ),
    ] {
        if !wanted.is_empty() && wanted != has {
            return Err(Error::Service {
                service: spec.service_name.clone(),
                field: field.to_owned(),
                message: format!(
                    "NLB {} has [{}], and AWS fixes an NLB's addresses when it is created: delete and re-create the Service to get [{}], or set the annotation to what the NLB has",
                    spec.name,
                    has.join(", "),
                    wanted.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// The NLB's IP address type: `dualstack` or `ipv4`.
fn ip_address_type(spec: &LbSpec) -> IpAddressType {
    if spec.dual_stack {
        IpAddressType::Dualstack
    } else {
        IpAddressType::Ipv4
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
        let legacy = legacy_target_group_name("prod", "default/web-nlb", &port, "TCP", 30);
        assert!(legacy.starts_with("k8s-default-web-nlb-"), "{legacy}");
        assert_eq!(web[web.len() - 10..], legacy[legacy.len() - 10..]);
        // A name cut to end in a hyphen: never two in a row, upstream's or the legacy one.
        let local = target_group_name("prod", "default/aws-nlb-local", &port, "HTTP", 10);
        assert!(local.starts_with("k8s-default-awsnlblo-"), "{local}");
        let legacy = legacy_target_group_name("prod", "default/aws-nlb-local", &port, "HTTP", 10);
        assert!(
            legacy.starts_with("k8s-default-aws-nlb-") && !legacy.contains("--"),
            "{legacy}"
        );
    }
}
