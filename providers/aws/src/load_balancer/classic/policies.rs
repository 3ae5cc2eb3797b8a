//! A Classic ELB's policies: the TLS negotiation policy on its TLS listeners and the PROXY protocol
//! on its backends, made under upstream's names and set only where they differ.

use super::*;

impl LoadBalancers {
    /// `ssl-negotiation-policy`: upstream's policy `k8s-SSLNegotiationPolicy-<value>` (type
    /// `SSLNegotiationPolicyType`, `Reference-Security-Policy=<value>`), made once, on every `SSL` and
    /// `HTTPS` listener, set only where it is missing (upstream sets it on every sync). Without the
    /// annotation, a `k8s-SSLNegotiationPolicy-*` policy is taken off the listeners again, so they fall
    /// back to AWS's default (upstream leaves it on); other listener policies are kept.
    pub(super) async fn sync_classic_tls_policy(
        &self,
        lb: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> Result<()> {
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
            let elb = &self.calls.clients.elb;
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
    pub(super) async fn sync_classic_proxy_protocol(
        &self,
        lb: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> Result<()> {
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
            let elb = &self.calls.clients.elb;
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
    pub(super) async fn ensure_classic_policy(
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
    pub(super) async fn classic_policy_exists(&self, name: &str, policy: &str) -> Result<bool> {
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
}
