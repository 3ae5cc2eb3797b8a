//! An NLB's own security groups, with `NLBSecurityGroupMode = Managed` in the cloud-config (upstream
//! v1.37's `ensureNLBSecurityGroup`, `ensureNLBSecurityGroupRules` and their clean-up):
//! - a new NLB gets a group of its own, `k8s-<namespace>-<name>-<hash>` (upstream's name, so a group
//!   upstream made is adopted), tagged for the cluster as `owned`, whose ingress rules are exactly the
//!   listeners' ports from the source ranges and ICMP "fragmentation needed" (path MTU) from them;
//! - with `aws-load-balancer-security-groups`, the NLB gets those groups instead, left as they are;
//! - a group of ours the NLB no longer uses, and the NLB's group when the NLB is deleted, are deleted
//!   with every rule elsewhere that refers to them;
//! - an NLB AWS made without security groups cannot have any added (AWS's rule): it keeps none, as
//!   upstream keeps it, and asking for groups by annotation on it is an error that says so.
//!
//! The nodes' rules stay as without the mode (client and health rules by CIDR, `nlb.rs`), as upstream
//! keeps them.

use aws_sdk_ec2::types::SecurityGroup;
use aws_sdk_elasticloadbalancingv2::types::LoadBalancer as Elbv2LoadBalancer;
use sha2::{Digest, Sha256};

use super::{
    LoadBalancers, RuleScope, deleted_once_released,
    spec::{self, LbSpec, TAG_CLUSTER_PREFIX},
};
use crate::{Error, NlbSecurityGroupMode, error::Result};

/// Upstream's description of an NLB's own group.
const DESCRIPTION: &str = "[k8s] Managed SecurityGroup for LoadBalancer";

/// Upstream's name of an NLB's own group (`GetSecurityGroupNameForNLB`): `k8s-<namespace>-<name>-`
/// and the first 10 hex digits of the SHA-256 over the cluster name, the Service's name, namespace
/// and UID; namespace and name with everything but ASCII letters and digits taken out and cut to 8.
pub fn own_group_name(cluster_name: &str, namespace: &str, name: &str, uid: &str) -> String {
    let mut hash = Sha256::new();
    for part in [cluster_name, name, namespace, uid] {
        hash.update(part.as_bytes());
    }
    let hex: String = hash.finalize()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let clean = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect()
    };
    format!("k8s-{}-{}-{hex}", clean(namespace), clean(name))
}

/// The rules of an NLB's own group: each listener's port from each source range (a TLS listener's is
/// TCP to EC2), and path-MTU ICMP (type 3, code 4) from each; a dual-stack NLB whose ranges are the
/// default also from anywhere over IPv6, with ICMPv6 "packet too big" (type 2).
pub fn own_group_rules(spec: &LbSpec) -> Vec<(String, i32, i32, String)> {
    let mut ranges = spec.source_ranges.clone();
    if spec.dual_stack && ranges == ["0.0.0.0/0"] {
        ranges.push("::/0".to_owned());
    }
    let mut rules = Vec::new();
    for cidr in &ranges {
        for p in &spec.ports {
            rules.push((
                p.protocol.to_ascii_lowercase(),
                p.port,
                p.port,
                cidr.clone(),
            ));
        }
        if cidr.contains(':') {
            rules.push(("icmpv6".to_owned(), 2, 0, cidr.clone()));
        } else {
            rules.push(("icmp".to_owned(), 3, 4, cidr.clone()));
        }
    }
    rules.sort();
    rules.dedup();
    rules
}

/// Whether the group carries the cluster's tag with the value `owned` (upstream's
/// `hasClusterTagOwned`): a group this provider, or upstream, made for a load balancer.
fn owned(group: &SecurityGroup, cluster_id: &str) -> bool {
    let key = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
    group
        .tags()
        .iter()
        .any(|t| t.key() == Some(key.as_str()) && t.value() == Some("owned"))
}

/// The security groups an NLB should have.
pub(super) struct NlbGroups {
    /// The groups, in the order given.
    pub ids: Vec<String>,
    /// The one of them that is the NLB's own (its rules are ours), or `None` with the annotation's
    /// groups (or in a preview that would create it).
    pub own: Option<String>,
}

impl LoadBalancers {
    fn managed_nlb_groups(&self) -> bool {
        self.config.global.nlb_security_group_mode == NlbSecurityGroupMode::Managed
    }

    /// The groups the NLB `existing` (or a new one, when `None`) should have, the NLB's own group found
    /// or created in `vpc_id`; `None` when its groups are left as they are (without the managed mode,
    /// or on an NLB AWS made without groups).
    pub(super) async fn nlb_security_groups(
        &self,
        spec: &LbSpec,
        existing: Option<&Elbv2LoadBalancer>,
        vpc_id: &str,
    ) -> Result<Option<NlbGroups>> {
        if !self.managed_nlb_groups() {
            return Ok(None);
        }
        if let Some(lb) = existing
            && lb.security_groups().is_empty()
        {
            if !spec.security_groups.is_empty() {
                return Err(Error::Service {
                    service: spec.service_name.clone(),
                    field: spec::ANNOTATION_SECURITY_GROUPS.to_owned(),
                    message: format!(
                        "NLB {} was created without security groups, and AWS adds none to such an NLB; delete the Service and create it again to give its NLB security groups",
                        spec.name
                    ),
                });
            }
            // Upstream's rule too: the mode applies to NLBs created after it was set.
            tracing::debug!(
                name = spec.name,
                "NLB has no security groups and cannot be given any; keeping its rules in the nodes' groups"
            );
            return Ok(None);
        }
        if !spec.security_groups.is_empty() {
            return Ok(Some(NlbGroups {
                ids: spec.security_groups.clone(),
                own: None,
            }));
        }
        Ok(Some(
            match self
                .ensure_security_group(&spec.own_group_name, DESCRIPTION, spec, vpc_id)
                .await?
                .and_then(|g| g.group_id)
            {
                Some(id) => NlbGroups {
                    ids: vec![id.clone()],
                    own: Some(id),
                },
                None => NlbGroups {
                    ids: vec![spec.own_group_name.clone()],
                    own: None,
                },
            },
        ))
    }

    /// Gives the existing NLB `lb` the groups `wanted` when its groups differ, then deletes the groups
    /// of ours it no longer has, and the NLB's own group when the annotation's groups replaced it (a
    /// former deletion of it may have found it still in use).
    pub(super) async fn sync_nlb_security_groups(
        &self,
        lb: &Elbv2LoadBalancer,
        spec: &LbSpec,
        wanted: &NlbGroups,
        cluster_id: &str,
    ) -> Result<()> {
        let mut current: Vec<&str> = lb.security_groups().iter().map(String::as_str).collect();
        current.sort();
        let mut sorted: Vec<&str> = wanted.ids.iter().map(String::as_str).collect();
        sorted.sort();
        let mut detached: Vec<String> = Vec::new();
        if current != sorted && !wanted.ids.is_empty() {
            if self.previewed(|| {
                format!("security groups would change from {current:?} to {sorted:?}")
            }) {
                return Ok(());
            }
            let elbv2 = &self.calls.clients.elbv2;
            self.calls
                .call("SetSecurityGroups", || {
                    elbv2
                        .set_security_groups()
                        .load_balancer_arn(lb.load_balancer_arn().unwrap_or_default())
                        .set_security_groups(Some(wanted.ids.clone()))
                        .send()
                })
                .await?;
            detached.extend(
                current
                    .iter()
                    .filter(|g| !sorted.contains(g))
                    .map(|g| g.to_string()),
            );
        }
        let vpc_id = lb.vpc_id().unwrap_or_default();
        let mut ours: Vec<String> = Vec::new();
        if !detached.is_empty() {
            let read = self
                .security_groups_where(|r| r.set_group_ids(Some(detached)))
                .await?;
            ours.extend(
                read.iter()
                    .filter(|g| owned(g, cluster_id))
                    .filter_map(|g| g.group_id().map(str::to_owned)),
            );
        }
        if wanted.own.is_none()
            && !spec.security_groups.is_empty()
            && let Some(g) = self
                .security_group_named(&spec.own_group_name, vpc_id)
                .await?
            && owned(&g, cluster_id)
            && let Some(id) = g.group_id()
            && !wanted.ids.iter().any(|w| w == id)
            && !ours.iter().any(|o| o == id)
        {
            ours.push(id.to_owned());
        }
        for sg in &ours {
            if self.previewed(|| format!("security group {sg} would be deleted")) {
                continue;
            }
            tracing::info!(
                name = spec.name,
                group = sg,
                "deleting the NLB's former security group"
            );
            self.delete_security_group(sg, &spec.name).await?;
        }
        Ok(())
    }

    /// Makes the rules of the NLB's own group `group` exactly [`own_group_rules`].
    pub(super) async fn sync_own_group_rules(&self, group: &str, spec: &LbSpec) -> Result<()> {
        self.sync_cidr_rules(
            group,
            &format!("kubernetes.io/rule/nlb/own={}", spec.name),
            RuleScope::WholeGroup,
            &own_group_rules(spec),
        )
        .await?;
        Ok(())
    }

    /// After the NLB `name` is deleted: deletes its groups that are ours (tagged `owned` for the
    /// cluster) among `attached` (the groups it had), and, when it was already gone and the managed
    /// mode is on, its own group found by `own_group_name` (a former deletion found it still in use).
    pub(super) async fn delete_nlb_security_groups(
        &self,
        name: &str,
        attached: Option<&[String]>,
        own_group_name: Option<&str>,
        cluster_id: &str,
    ) -> Result<()> {
        let groups: Vec<SecurityGroup> = match (attached, own_group_name) {
            (Some([]), _) => return Ok(()),
            (Some(ids), _) => {
                match self
                    .security_groups_where(|r| r.set_group_ids(Some(ids.to_vec())))
                    .await
                {
                    Ok(read) => read,
                    Err(e) if e.code() == Some("InvalidGroup.NotFound") => Vec::new(),
                    Err(e) => return Err(e),
                }
            }
            (None, Some(own)) if self.managed_nlb_groups() => self
                .security_group_named(own, "")
                .await?
                .into_iter()
                .collect(),
            (None, _) => return Ok(()),
        };
        for g in groups.iter().filter(|g| owned(g, cluster_id)) {
            let Some(id) = g.group_id() else { continue };
            tracing::info!(name, group = id, "deleting the NLB's security group");
            // The NLB's network interfaces hold the group for a moment after it is gone; a Service's
            // deletion is retried after that (and finds the group by name), an orphan's is not.
            deleted_once_released(|| self.delete_security_group(id, name)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

    use super::*;
    use crate::Global;

    fn spec(
        annotations: &[(&str, &str)],
        protocol: &str,
        ranges: &[&str],
        families: &[&str],
    ) -> LbSpec {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.annotations = Some(
            [(spec::ANNOTATION_TYPE, "nlb")]
                .iter()
                .chain(annotations)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let port = |port: i32, protocol: &str| ServicePort {
            port,
            node_port: Some(30000 + port),
            protocol: Some(protocol.into()),
            ..Default::default()
        };
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![port(443, protocol), port(53, protocol)]),
            load_balancer_source_ranges: Some(ranges.iter().map(|r| r.to_string()).collect()),
            ip_families: Some(families.iter().map(|f| f.to_string()).collect()),
            ..Default::default()
        });
        let global = Global {
            nlb_security_group_mode: NlbSecurityGroupMode::Managed,
            ..Global::default()
        };
        LbSpec::from_service(&s, "prod", "a".into(), &global).unwrap()
    }

    fn rule(protocol: &str, from: i32, to: i32, cidr: &str) -> (String, i32, i32, String) {
        (protocol.into(), from, to, cidr.into())
    }

    /// Upstream's `ensureNLBSecurityGroupRules`: each listener's port and protocol from each source
    /// range and ICMP 3/4; a TLS listener is TCP to EC2 (upstream asks for protocol `tls`, which EC2
    /// does not know); a dual-stack NLB open to everyone is open over IPv6 too.
    #[test]
    fn own_group_rules_open_the_listeners_to_the_source_ranges() {
        let tls = [
            (
                spec::ANNOTATION_SSL_CERT,
                "arn:aws:acm:us-east-1:1:certificate/x",
            ),
            (spec::ANNOTATION_SSL_PORTS, "443"),
        ];
        assert_eq!(
            own_group_rules(&spec(&tls, "TCP", &[], &[])),
            [
                rule("icmp", 3, 4, "0.0.0.0/0"),
                rule("tcp", 53, 53, "0.0.0.0/0"),
                rule("tcp", 443, 443, "0.0.0.0/0"),
            ]
        );
        assert_eq!(
            own_group_rules(&spec(&[], "UDP", &["10.0.0.0/8", "192.168.0.0/16"], &[])),
            [
                rule("icmp", 3, 4, "10.0.0.0/8"),
                rule("icmp", 3, 4, "192.168.0.0/16"),
                rule("udp", 53, 53, "10.0.0.0/8"),
                rule("udp", 53, 53, "192.168.0.0/16"),
                rule("udp", 443, 443, "10.0.0.0/8"),
                rule("udp", 443, 443, "192.168.0.0/16"),
            ]
        );
        let dual = [(spec::ANNOTATION_IP_ADDRESS_TYPE, "dualstack")];
        assert_eq!(
            own_group_rules(&spec(&dual, "TCP", &[], &["IPv4", "IPv6"])),
            [
                rule("icmp", 3, 4, "0.0.0.0/0"),
                rule("icmpv6", 2, 0, "::/0"),
                rule("tcp", 53, 53, "0.0.0.0/0"),
                rule("tcp", 53, 53, "::/0"),
                rule("tcp", 443, 443, "0.0.0.0/0"),
                rule("tcp", 443, 443, "::/0"),
            ]
        );
    }

    /// Names computed with upstream's formula (Go's `sha256`, `[[:^alnum:]]` removed, `%.8s`).
    #[test]
    fn own_group_names_are_upstream_s() {
        for ((cluster, namespace, name, uid), expected) in [
            (
                (
                    "kubernetes",
                    "default",
                    "web-nlb",
                    "0f4b1e2a-1111-2222-3333-444455556666",
                ),
                "k8s-default-webnlb-505406eca4",
            ),
            (
                ("prod", "kube-system", "my.very-long-service", "uid"),
                "k8s-kubesyst-myverylo-eb5be257a1",
            ),
            (("", "", "", ""), "k8s---e3b0c44298"),
        ] {
            assert_eq!(own_group_name(cluster, namespace, name, uid), expected);
        }
    }
}
