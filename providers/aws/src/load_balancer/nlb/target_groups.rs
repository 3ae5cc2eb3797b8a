//! An NLB's target groups: found (by its listeners, by name, in the region's listing), made, their
//! attributes and health check kept as the Service asks, their targets synced by difference, deleted.

use aws_sdk_elasticloadbalancingv2::operation::describe_target_groups::builders::DescribeTargetGroupsFluentBuilder as Describe;

use super::*;

impl LoadBalancers {
    /// The target groups one `DescribeTargetGroups` answers, narrowed by `ask`; none when AWS answers
    /// `TargetGroupNotFound` (for a name no group has; moto also for a load balancer without target
    /// groups, where AWS answers an empty list).
    async fn target_groups_where(
        &self,
        ask: impl FnOnce(Describe) -> Describe,
    ) -> Result<Vec<TargetGroup>> {
        let elbv2 = &self.calls.clients.elbv2;
        let request = ask(elbv2.describe_target_groups());
        match self
            .calls
            .call("DescribeTargetGroups", || request.clone().send())
            .await
        {
            Ok(out) => Ok(out.target_groups().to_vec()),
            Err(e) if e.code() == Some("TargetGroupNotFound") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The target groups of the load balancer `lb_arn`.
    pub(in crate::load_balancer) async fn target_groups_of(
        &self,
        lb_arn: &str,
    ) -> Result<Vec<TargetGroup>> {
        self.target_groups_where(|r| r.load_balancer_arn(lb_arn))
            .await
    }

    /// The target groups `listeners` forward to (the ones AWS lists as their NLB's), looked up by ARN
    /// with the other syncs' and checks' under way.
    pub(super) async fn target_groups_behind(
        &self,
        listeners: &[Listener],
    ) -> Result<Vec<TargetGroup>> {
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

    /// The target group named `name`, if any.
    pub(super) async fn target_group_named(&self, name: &str) -> Result<Option<TargetGroup>> {
        let found = self.target_groups_where(|r| r.names(name)).await?;
        Ok(found.into_iter().next())
    }

    /// The target group's `preserve_client_ip.enabled` and `proxy_protocol_v2.enabled` as the Service
    /// asks ([`LbSpec::target_group_attributes`]: the annotation, else AWS's defaults, so removing the
    /// annotation puts them back; upstream leaves its last values); a key AWS does not report counts
    /// as its default. Written only where they differ.
    pub(super) async fn sync_target_group_attributes(
        &self,
        group_arn: &str,
        spec: &LbSpec,
    ) -> Result<()> {
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

    pub(super) async fn create_target_group(
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
        let group = created(out.target_groups(), "CreateTargetGroup", "target group")?;
        if let Some(arn) = group.target_group_arn() {
            self.target_group_created(arn, spec_tags(spec)).await;
        }
        Ok(group)
    }

    /// Changes the health check of `group` only where it differs from the Service's.
    pub(super) async fn sync_health_check(&self, group: &TargetGroup, spec: &LbSpec) -> Result<()> {
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
    pub(in crate::load_balancer) async fn sync_targets(
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

    pub(super) async fn delete_target_group(&self, arn: &str) -> Result<()> {
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
    pub(in crate::load_balancer) async fn all_target_group_arns(&self) -> Result<Vec<String>> {
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
}
