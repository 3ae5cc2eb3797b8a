//! An NLB's ports: per Service port one target group and one listener forwarding to it (TCP, UDP, TLS
//! with its certificates and policy), and the listeners and groups of ports the Service no longer has
//! removed.

use super::*;

/// What a Service port's NLB listener should be.
struct WantedListener {
    protocol: ProtocolEnum,
    /// A TLS listener's certificate.
    certificate: Option<Certificate>,
    /// A TLS listener's policy when the annotation names one (else AWS's default, which is then left
    /// as it is: upstream would set it again on every sync).
    policy: Option<String>,
}

impl WantedListener {
    fn of(spec: &LbSpec, service_port: &Port) -> Self {
        let tls = spec.tls.on(service_port);
        Self {
            protocol: ProtocolEnum::from(spec.tls.nlb_listener_protocol(service_port)),
            certificate: tls
                .then(|| spec.tls.cert.clone())
                .flatten()
                .map(|arn| Certificate::builder().certificate_arn(arn).build()),
            policy: spec.tls.policy.clone().filter(|p| tls && !p.is_empty()),
        }
    }

    /// Whether `listener` is this one, forwarding to `group_arn`.
    fn is(&self, listener: &Listener, group_arn: &str) -> bool {
        let forwards_here = listener
            .default_actions()
            .iter()
            .any(|a| a.target_group_arn() == Some(group_arn));
        let certificate_kept = listener
            .certificates()
            .first()
            .and_then(|c| c.certificate_arn())
            == self.certificate.as_ref().and_then(|c| c.certificate_arn());
        listener.protocol() == Some(&self.protocol)
            && forwards_here
            && certificate_kept
            && (self.policy.is_none() || listener.ssl_policy() == self.policy.as_deref())
    }
}

impl LoadBalancers {
    /// The NLB's listeners.
    pub(super) async fn listeners_of(&self, lb_arn: &str) -> Result<Vec<Listener>> {
        let elbv2 = &self.calls.clients.elbv2;
        let out = self
            .calls
            .call("DescribeListeners", || {
                elbv2.describe_listeners().load_balancer_arn(lb_arn).send()
            })
            .await?;
        Ok(out.listeners().to_vec())
    }

    /// One Service port's target group (found, or created), its targets and attributes, and the listener
    /// forwarding to it (created, changed or kept; taken out of `listeners`, the NLB's listeners no port
    /// has claimed yet); the group's ARN, or `None` in a preview that would create the group.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn sync_nlb_port(
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
        let legacy_name = legacy_target_group_name(&name, &spec.service_name);
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
    pub(super) async fn sync_nlb_listener(
        &self,
        spec: &LbSpec,
        service_port: &Port,
        port: &Port,
        group_arn: &str,
        arn: &str,
        listeners: &mut Vec<Listener>,
    ) -> Result<()> {
        let elbv2 = &self.calls.clients.elbv2;
        let wanted = WantedListener::of(spec, service_port);
        let WantedListener {
            protocol,
            certificate,
            policy,
        } = &wanted;
        let forward = Action::builder()
            .r#type(ActionTypeEnum::Forward)
            .target_group_arn(group_arn)
            .build();
        let Some(at) = listeners.iter().position(|l| l.port() == Some(port.port)) else {
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
            return Ok(());
        };
        let l = listeners.remove(at);
        if wanted.is(&l, group_arn)
            || self.previewed(|| {
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
            })
        {
            return Ok(());
        }
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
        Ok(())
    }

    /// Deletes the listeners no port claimed, then the NLB's target groups no listener uses.
    pub(super) async fn remove_unwanted_nlb_parts(
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(protocol: ProtocolEnum, cert: Option<&str>, policy: Option<&str>) -> WantedListener {
        WantedListener {
            protocol,
            certificate: cert.map(|c| Certificate::builder().certificate_arn(c).build()),
            policy: policy.map(str::to_owned),
        }
    }

    fn listener(
        protocol: ProtocolEnum,
        group: &str,
        cert: Option<&str>,
        policy: Option<&str>,
    ) -> Listener {
        let mut l = Listener::builder()
            .protocol(protocol)
            .default_actions(
                Action::builder()
                    .r#type(ActionTypeEnum::Forward)
                    .target_group_arn(group)
                    .build(),
            )
            .set_ssl_policy(policy.map(str::to_owned));
        if let Some(c) = cert {
            l = l.certificates(Certificate::builder().certificate_arn(c).build());
        }
        l.build()
    }

    #[test]
    fn a_listener_is_changed_only_where_it_differs() {
        let (tg, cert) = ("arn:tg/a", "arn:cert/a");
        for (name, have, want, same) in [
            (
                "TCP as wanted",
                listener(ProtocolEnum::Tcp, tg, None, None),
                wanted(ProtocolEnum::Tcp, None, None),
                true,
            ),
            (
                "another target group",
                listener(ProtocolEnum::Tcp, "arn:tg/b", None, None),
                wanted(ProtocolEnum::Tcp, None, None),
                false,
            ),
            (
                "TLS now",
                listener(ProtocolEnum::Tcp, tg, None, None),
                wanted(ProtocolEnum::Tls, Some(cert), None),
                false,
            ),
            (
                "AWS's default policy kept when none is named",
                listener(
                    ProtocolEnum::Tls,
                    tg,
                    Some(cert),
                    Some("ELBSecurityPolicy-2016-08"),
                ),
                wanted(ProtocolEnum::Tls, Some(cert), None),
                true,
            ),
            (
                "a named policy",
                listener(
                    ProtocolEnum::Tls,
                    tg,
                    Some(cert),
                    Some("ELBSecurityPolicy-2016-08"),
                ),
                wanted(
                    ProtocolEnum::Tls,
                    Some(cert),
                    Some("ELBSecurityPolicy-TLS13-1-2-2021-06"),
                ),
                false,
            ),
            (
                "another certificate",
                listener(ProtocolEnum::Tls, tg, Some("arn:cert/b"), None),
                wanted(ProtocolEnum::Tls, Some(cert), None),
                false,
            ),
        ] {
            assert_eq!(want.is(&have, tg), same, "{name}");
        }
    }
}
