//! Classic ELBs: a security group `k8s-elb-<name>` with the source ranges (unless given one),
//! listeners to the node ports (TCP, or TLS-terminating SSL/HTTPS ones with `ssl-cert`, and their
//! negotiation policy), the health check, registered instances, and the nodes' security groups
//! opened to the load balancer's group.

use aws_sdk_ec2::types::{Filter, IpPermission, SecurityGroup, UserIdGroupPair};
use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing,
    HealthCheck as ElbHealthCheck, Instance, Listener, LoadBalancerAttributes,
    LoadBalancerDescription, PolicyAttribute, Tag,
};
use k8s_openapi::api::core::v1::LoadBalancerStatus;

use super::{
    LoadBalancers, RuleScope, all_pages, hostname_status,
    spec::{ClassicAttributes, LbSpec, TAG_CLUSTER_PREFIX},
};
use crate::{Error, error::Result, instances::InstanceInfo};

/// Upstream's PROXY protocol policy on a Classic ELB's backends.
pub const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// The prefix of upstream's TLS negotiation policies (`k8s-SSLNegotiationPolicy-<value>`).
pub const SSL_POLICY_PREFIX: &str = "k8s-SSLNegotiationPolicy-";

/// The name of the security group upstream creates for a Classic ELB.
pub fn security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

fn health_target(spec: &LbSpec) -> String {
    let hc = &spec.health_check;
    if hc.protocol.starts_with("HTTP") {
        format!("{}:{}{}", hc.protocol, hc.port, hc.path)
    } else {
        format!("{}:{}", hc.protocol, hc.port)
    }
}

/// The Classic ELB's listeners: each Service port to its node port, TLS as the Service asks.
fn classic_listeners(spec: &LbSpec) -> Result<Vec<Listener>> {
    spec.ports
        .iter()
        .map(|p| {
            let wanted = spec.tls.classic_listener(p);
            Listener::builder()
                .protocol(wanted.protocol)
                .load_balancer_port(p.port)
                .instance_protocol(wanted.instance_protocol)
                .instance_port(p.node_port)
                .set_ssl_certificate_id(wanted.cert)
                .build()
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Setup(format!("listener: {e}")))
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

    /// The group `k8s-elb-<name>` in the VPC, created (tagged for the cluster) when missing; `None` in a
    /// preview that would create it.
    async fn ensure_elb_security_group(
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

    /// The Classic ELB's security groups: the annotation's, else `ElbSecurityGroup`, else its own
    /// `k8s-elb-<name>` (made when missing, its rules the listener ports from the source ranges and
    /// path-MTU ICMP), then the extra ones; with the own group's ID when it is ours.
    async fn classic_security_groups(
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

    /// Makes the listeners `wanted`; `true` when it changed any (outside a preview).
    async fn sync_classic_listeners(
        &self,
        lb: &LoadBalancerDescription,
        wanted: &[Listener],
    ) -> Result<bool> {
        let elb = &self.calls.clients.elb;
        let name = lb.load_balancer_name().unwrap_or_default();
        let current: Vec<Listener> = lb
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener().cloned())
            .collect();
        // Upstream's `elbListenersAreEqual`: ports, both protocols and the certificate (ARNs compared
        // without case); a listener that differs is deleted and created again.
        let same = |a: &Listener, b: &Listener| {
            a.load_balancer_port() == b.load_balancer_port()
                && a.instance_port() == b.instance_port()
                && a.protocol().eq_ignore_ascii_case(b.protocol())
                && a.instance_protocol()
                    .unwrap_or(a.protocol())
                    .eq_ignore_ascii_case(b.instance_protocol().unwrap_or(b.protocol()))
                && match (
                    a.ssl_certificate_id().filter(|c| !c.is_empty()),
                    b.ssl_certificate_id().filter(|c| !c.is_empty()),
                ) {
                    (None, None) => true,
                    (Some(x), Some(y)) => x.eq_ignore_ascii_case(y),
                    _ => false,
                }
        };
        let remove: Vec<i32> = current
            .iter()
            .filter(|c| !wanted.iter().any(|w| same(c, w)))
            .map(|c| c.load_balancer_port())
            .collect();
        let add: Vec<Listener> = wanted
            .iter()
            .filter(|w| !current.iter().any(|c| same(c, w)))
            .cloned()
            .collect();
        let mut changed = false;
        if !remove.is_empty()
            && !self.previewed(|| format!("listeners on ports {remove:?} would be deleted"))
        {
            changed = true;
            self.calls
                .call("DeleteLoadBalancerListeners", || {
                    elb.delete_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_load_balancer_ports(Some(remove.clone()))
                        .send()
                })
                .await?;
        }
        if !add.is_empty()
            && !self.previewed(|| {
                let ports: Vec<String> = add
                    .iter()
                    .map(|l| {
                        format!(
                            "{} {}->{} {}",
                            l.protocol(),
                            l.load_balancer_port(),
                            l.instance_protocol().unwrap_or_default(),
                            l.instance_port()
                        )
                    })
                    .collect();
                format!("listeners {} would be created", ports.join(", "))
            })
        {
            changed = true;
            self.calls
                .call("CreateLoadBalancerListeners", || {
                    elb.create_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_listeners(Some(add.clone()))
                        .send()
                })
                .await?;
        }
        Ok(changed)
    }

    /// `ssl-negotiation-policy`: upstream's policy `k8s-SSLNegotiationPolicy-<value>` (type
    /// `SSLNegotiationPolicyType`, `Reference-Security-Policy=<value>`), made once, on every `SSL` and
    /// `HTTPS` listener, set only where it is missing (upstream sets it on every sync). Without the
    /// annotation, a `k8s-SSLNegotiationPolicy-*` policy is taken off the listeners again, so they fall
    /// back to AWS's default (upstream leaves it on); other listener policies are kept.
    async fn sync_classic_tls_policy(
        &self,
        lb: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> Result<()> {
        let elb = &self.calls.clients.elb;
        let name = lb.load_balancer_name().unwrap_or_default();
        let wanted = spec
            .tls
            .policy
            .as_ref()
            .map(|p| format!("{SSL_POLICY_PREFIX}{p}"));
        if let Some(policy) = &wanted {
            let reference = spec.tls.policy.clone().unwrap_or_default();
            self.ensure_classic_policy(
                lb,
                policy,
                "SSLNegotiationPolicyType",
                ("Reference-Security-Policy", &reference),
            )
            .await?;
        }
        for described in lb.listener_descriptions() {
            let Some(listener) = described.listener() else {
                continue;
            };
            let tls = ["SSL", "HTTPS"]
                .iter()
                .any(|p| listener.protocol().eq_ignore_ascii_case(p));
            let current: Vec<String> = described.policy_names().to_vec();
            let mut policies: Vec<String> = current
                .iter()
                .filter(|p| !p.starts_with(SSL_POLICY_PREFIX))
                .cloned()
                .collect();
            if tls && let Some(policy) = &wanted {
                policies.push(policy.clone());
            }
            let (mut before, mut after) = (current.clone(), policies.clone());
            before.sort();
            after.sort();
            let port = listener.load_balancer_port();
            if before == after
                || self.previewed(|| {
                    format!("the policies of the listener on port {port} would change from {current:?} to {policies:?}")
                })
            {
                continue;
            }
            self.calls
                .call("SetLoadBalancerPoliciesOfListener", || {
                    elb.set_load_balancer_policies_of_listener()
                        .load_balancer_name(name)
                        .load_balancer_port(port)
                        .set_policy_names(Some(policies.clone()))
                        .send()
                })
                .await?;
        }
        Ok(())
    }

    /// `proxy-protocol: "*"`: upstream's policy `k8s-proxyprotocol-enabled` (type
    /// `ProxyProtocolPolicyType`, `ProxyProtocol=true`), made once, on the backend of every node port;
    /// taken off the backends that should not have it (no annotation, or a port gone). Written only where
    /// a backend differs (upstream makes the policy again on every sync).
    async fn sync_classic_proxy_protocol(
        &self,
        lb: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> Result<()> {
        let elb = &self.calls.clients.elb;
        let name = lb.load_balancer_name().unwrap_or_default();
        let current: Vec<(i32, bool)> = lb
            .backend_server_descriptions()
            .iter()
            .map(|b| {
                (
                    b.instance_port().unwrap_or_default(),
                    b.policy_names().iter().any(|p| p == PROXY_PROTOCOL_POLICY),
                )
            })
            .collect();
        let mut changes: Vec<(i32, bool)> = Vec::new();
        for port in &spec.ports {
            let has = current.iter().any(|(p, on)| *p == port.node_port && *on);
            if has != spec.proxy_protocol {
                changes.push((port.node_port, spec.proxy_protocol));
            }
        }
        for (port, on) in &current {
            if *on && !spec.ports.iter().any(|p| p.node_port == *port) {
                changes.push((*port, false));
            }
        }
        changes.sort();
        changes.dedup();
        if changes.is_empty() {
            return Ok(());
        }
        if spec.proxy_protocol {
            self.ensure_classic_policy(
                lb,
                PROXY_PROTOCOL_POLICY,
                "ProxyProtocolPolicyType",
                ("ProxyProtocol", "true"),
            )
            .await?;
        }
        for (port, on) in changes {
            if self.previewed(|| {
                format!(
                    "PROXY protocol would be turned {} on node port {port}",
                    if on { "on" } else { "off" }
                )
            }) {
                continue;
            }
            let policies = if on {
                vec![PROXY_PROTOCOL_POLICY.to_owned()]
            } else {
                Vec::new()
            };
            self.calls
                .call("SetLoadBalancerPoliciesForBackendServer", || {
                    elb.set_load_balancer_policies_for_backend_server()
                        .load_balancer_name(name)
                        .instance_port(port)
                        .set_policy_names(Some(policies.clone()))
                        .send()
                })
                .await?;
        }
        Ok(())
    }

    /// Makes the policy `policy` (of `policy_type`, with one attribute) on the ELB unless it has one by
    /// that name (upstream's TLS and PROXY protocol policies are fixed by their names).
    async fn ensure_classic_policy(
        &self,
        lb: &LoadBalancerDescription,
        policy: &str,
        policy_type: &str,
        (attribute, value): (&str, &str),
    ) -> Result<()> {
        let name = lb.load_balancer_name().unwrap_or_default();
        if lb
            .policies()
            .is_some_and(|p| p.other_policies().iter().any(|o| o == policy))
            || self.classic_policy_exists(name, policy).await?
            || self.previewed(|| format!("policy {policy} would be created"))
        {
            return Ok(());
        }
        let elb = &self.calls.clients.elb;
        self.calls
            .call("CreateLoadBalancerPolicy", || {
                elb.create_load_balancer_policy()
                    .load_balancer_name(name)
                    .policy_name(policy)
                    .policy_type_name(policy_type)
                    .policy_attributes(
                        PolicyAttribute::builder()
                            .attribute_name(attribute)
                            .attribute_value(value)
                            .build(),
                    )
                    .send()
            })
            .await?;
        Ok(())
    }

    /// Whether the Classic ELB `name` has the policy `policy`.
    async fn classic_policy_exists(&self, name: &str, policy: &str) -> Result<bool> {
        let elb = &self.calls.clients.elb;
        match self
            .calls
            .call("elb:DescribeLoadBalancerPolicies", || {
                elb.describe_load_balancer_policies()
                    .load_balancer_name(name)
                    .policy_names(policy)
                    .send()
            })
            .await
        {
            Ok(out) => Ok(!out.policy_descriptions().is_empty()),
            Err(e) if e.code() == Some("PolicyNotFound") => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn sync_classic_health_check(
        &self,
        lb: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> Result<()> {
        let hc = &spec.health_check;
        let target = health_target(spec);
        let current = lb.health_check();
        let same = current.is_some_and(|c| {
            c.target() == target
                && c.interval() == hc.interval
                && c.timeout() == hc.timeout
                && c.healthy_threshold() == hc.healthy_threshold
                && c.unhealthy_threshold() == hc.unhealthy_threshold
        });
        if same {
            return Ok(());
        }
        if self.previewed(|| {
            format!(
                "health check would change from {:?} to {target} (interval {}s, timeout {}s, thresholds {}/{})",
                current.map(|c| c.target()).unwrap_or("none"),
                hc.interval,
                hc.timeout,
                hc.healthy_threshold,
                hc.unhealthy_threshold
            )
        }) {
            return Ok(());
        }
        let check = ElbHealthCheck::builder()
            .target(&target)
            .interval(hc.interval)
            .timeout(hc.timeout)
            .healthy_threshold(hc.healthy_threshold)
            .unhealthy_threshold(hc.unhealthy_threshold)
            .build()
            .map_err(|e| Error::Setup(format!("health check: {e}")))?;
        let elb = &self.calls.clients.elb;
        self.calls
            .call("ConfigureHealthCheck", || {
                elb.configure_health_check()
                    .load_balancer_name(&spec.name)
                    .health_check(check.clone())
                    .send()
            })
            .await?;
        Ok(())
    }

    /// The ELB's attributes as upstream sets them on every sync (see [`ClassicAttributes`]): read, then
    /// written only where they differ from what the annotations ask (upstream compares whole
    /// structures, and rewrites them when AWS reports a field it did not set).
    async fn sync_classic_attributes(&self, name: &str, wanted: &ClassicAttributes) -> Result<()> {
        let elb = &self.calls.clients.elb;
        let out = self
            .calls
            .call("elb:DescribeLoadBalancerAttributes", || {
                elb.describe_load_balancer_attributes()
                    .load_balancer_name(name)
                    .send()
            })
            .await?;
        let current = out.load_balancer_attributes();
        let log = current.and_then(|a| a.access_log());
        let draining = current.and_then(|a| a.connection_draining());
        let mut changes = Vec::new();
        let mut attributes = LoadBalancerAttributes::builder();
        let log_same = log.map(|l| l.enabled()) == Some(wanted.access_log)
            && (!wanted.access_log
                || (wanted
                    .access_log_interval
                    .is_none_or(|i| log.and_then(|l| l.emit_interval()) == Some(i))
                    && wanted
                        .access_log_bucket
                        .as_deref()
                        .is_none_or(|b| log.and_then(|l| l.s3_bucket_name()) == Some(b))
                    && wanted
                        .access_log_prefix
                        .as_deref()
                        .is_none_or(|p| log.and_then(|l| l.s3_bucket_prefix()) == Some(p))));
        if !log_same {
            changes.push(format!(
                "access log {}",
                if wanted.access_log { "on" } else { "off" }
            ));
            attributes = attributes.access_log(
                AccessLog::builder()
                    .enabled(wanted.access_log)
                    .set_emit_interval(wanted.access_log_interval)
                    .set_s3_bucket_name(wanted.access_log_bucket.clone())
                    .set_s3_bucket_prefix(wanted.access_log_prefix.clone())
                    .build(),
            );
        }
        let draining_same = draining.map(|d| d.enabled()) == Some(wanted.draining)
            && wanted
                .draining_timeout
                .is_none_or(|t| draining.and_then(|d| d.timeout()) == Some(t));
        if !draining_same {
            changes.push(format!(
                "connection draining {}",
                if wanted.draining { "on" } else { "off" }
            ));
            attributes = attributes.connection_draining(
                ConnectionDraining::builder()
                    .enabled(wanted.draining)
                    .set_timeout(wanted.draining_timeout)
                    .build(),
            );
        }
        let idle = current
            .and_then(|a| a.connection_settings())
            .map(|c| c.idle_timeout());
        if idle != Some(wanted.idle_timeout) {
            changes.push(format!("idle timeout {} s", wanted.idle_timeout));
            attributes = attributes.connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(wanted.idle_timeout)
                    .build()
                    .map_err(|e| Error::Setup(format!("connection settings: {e}")))?,
            );
        }
        let cross_zone = current
            .and_then(|a| a.cross_zone_load_balancing())
            .map(|c| c.enabled())
            .unwrap_or(false);
        if cross_zone != wanted.cross_zone {
            changes.push(format!("cross-zone load balancing {}", wanted.cross_zone));
            attributes = attributes.cross_zone_load_balancing(
                CrossZoneLoadBalancing::builder()
                    .enabled(wanted.cross_zone)
                    .build(),
            );
        }
        if changes.is_empty()
            || self.previewed(|| format!("attributes would change: {}", changes.join(", ")))
        {
            return Ok(());
        }
        let attributes = attributes.build();
        self.calls
            .call("elb:ModifyLoadBalancerAttributes", || {
                elb.modify_load_balancer_attributes()
                    .load_balancer_name(name)
                    .load_balancer_attributes(attributes.clone())
                    .send()
            })
            .await?;
        Ok(())
    }

    /// Registers the instances not yet behind the ELB and deregisters the others; nothing else. (The
    /// register and deregister responses are not read: moto's are empty.)
    pub(super) async fn sync_classic_instances(
        &self,
        lb: &LoadBalancerDescription,
        instances: &[InstanceInfo],
    ) -> Result<()> {
        let elb = &self.calls.clients.elb;
        let name = lb.load_balancer_name().unwrap_or_default();
        let current: Vec<&str> = lb
            .instances()
            .iter()
            .filter_map(|i| i.instance_id())
            .collect();
        let add: Vec<Instance> = instances
            .iter()
            .filter(|i| !current.contains(&i.id.as_str()))
            .map(|i| Instance::builder().instance_id(&i.id).build())
            .collect();
        let remove: Vec<Instance> = current
            .iter()
            .filter(|c| !instances.iter().any(|i| i.id == **c))
            .map(|c| Instance::builder().instance_id(*c).build())
            .collect();
        if self.previewed_backends(
            add.iter().filter_map(|i| i.instance_id()),
            remove.iter().filter_map(|i| i.instance_id()),
        ) {
            return Ok(());
        }
        if !add.is_empty() {
            self.calls
                .call("RegisterInstancesWithLoadBalancer", || {
                    elb.register_instances_with_load_balancer()
                        .load_balancer_name(name)
                        .set_instances(Some(add.clone()))
                        .send()
                })
                .await?;
        }
        if !remove.is_empty() {
            self.calls
                .call("DeregisterInstancesFromLoadBalancer", || {
                    elb.deregister_instances_from_load_balancer()
                        .load_balancer_name(name)
                        .set_instances(Some(remove.clone()))
                        .send()
                })
                .await?;
        }
        Ok(())
    }

    /// Opens the backends' security groups to the ELB's group (all traffic from that group), and closes
    /// the groups of former backends, as upstream does.
    async fn sync_node_ingress(
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

    /// Backends of an existing Classic ELB follow `instances`: registration and node ingress.
    pub(super) async fn update_classic_instances(
        &self,
        spec: &LbSpec,
        instances: &[InstanceInfo],
        cluster_id: &str,
    ) -> Result<()> {
        let Some(lb) = self.describe_classic(&spec.name).await? else {
            return Err(Error::Setup(format!(
                "load balancer {} of {} not found",
                spec.name, spec.service_name
            )));
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
        let ec2 = &self.calls.clients.ec2;
        let cluster_tag = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let out = self
            .calls
            .call("DescribeSecurityGroups", || {
                ec2.describe_security_groups()
                    .filters(
                        Filter::builder()
                            .name("group-name")
                            .values(security_group_name(name))
                            .build(),
                    )
                    .filters(
                        Filter::builder()
                            .name("tag-key")
                            .values(&cluster_tag)
                            .build(),
                    )
                    .send()
            })
            .await?;
        for g in out.security_groups() {
            let Some(sg) = g.group_id() else { continue };
            if !vpc_id.is_empty() && g.vpc_id() != Some(vpc_id.as_str()) {
                continue;
            }
            self.delete_security_group(sg, name).await?;
        }
        Ok(())
    }
}
