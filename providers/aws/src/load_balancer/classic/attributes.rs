//! A Classic ELB's attributes (access log, connection draining, idle timeout, cross-zone), written
//! only where they differ from what the Service asks: a pure [`plan`] from what AWS has, and the one
//! write it leads to.

use super::*;

/// What a sync of the attributes writes: the changes in words, and the attributes to set (only those
/// that differ).
#[derive(Debug)]
struct Plan {
    changes: Vec<String>,
    attributes: LoadBalancerAttributes,
}

/// The attributes of `current` that differ from `wanted`, or `None` when all are as wanted. An
/// access-log or draining setting the Service leaves unset (interval, bucket, prefix, timeout) is not
/// compared; cross-zone load balancing AWS does not report is off.
fn plan(
    current: Option<&LoadBalancerAttributes>,
    wanted: &ClassicAttributes,
) -> Result<Option<Plan>> {
    let log = current.and_then(|a| a.access_log());
    let draining = current.and_then(|a| a.connection_draining());
    let mut changes = Vec::new();
    let mut attributes = LoadBalancerAttributes::builder();
    let on_off = |on: bool| if on { "on" } else { "off" };
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
        changes.push(format!("access log {}", on_off(wanted.access_log)));
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
        changes.push(format!("connection draining {}", on_off(wanted.draining)));
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
        .is_some_and(|c| c.enabled());
    if cross_zone != wanted.cross_zone {
        changes.push(format!("cross-zone load balancing {}", wanted.cross_zone));
        attributes = attributes.cross_zone_load_balancing(
            CrossZoneLoadBalancing::builder()
                .enabled(wanted.cross_zone)
                .build(),
        );
    }
    Ok((!changes.is_empty()).then(|| Plan {
        changes,
        attributes: attributes.build(),
    }))
}

impl LoadBalancers {
    /// The ELB's attributes as upstream sets them on every sync (see [`ClassicAttributes`]): read, then
    /// written only where they differ from what the annotations ask (upstream compares whole
    /// structures, and rewrites them when AWS reports a field it did not set).
    pub(super) async fn sync_classic_attributes(
        &self,
        name: &str,
        wanted: &ClassicAttributes,
    ) -> Result<()> {
        let elb = &self.calls.clients.elb;
        let out = self
            .calls
            .call("elb:DescribeLoadBalancerAttributes", || {
                elb.describe_load_balancer_attributes()
                    .load_balancer_name(name)
                    .send()
            })
            .await?;
        let Some(Plan {
            changes,
            attributes,
        }) = plan(out.load_balancer_attributes(), wanted)?
        else {
            return Ok(());
        };
        if self.previewed(|| format!("attributes would change: {}", changes.join(", "))) {
            return Ok(());
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's defaults: access log and draining off, 60 s idle timeout, cross-zone off.
    fn defaults() -> ClassicAttributes {
        ClassicAttributes {
            access_log: false,
            access_log_interval: None,
            access_log_bucket: None,
            access_log_prefix: None,
            draining: false,
            draining_timeout: None,
            idle_timeout: 60,
            cross_zone: false,
        }
    }

    /// What AWS reports for a new Classic ELB (moto's too).
    fn new_elb() -> LoadBalancerAttributes {
        LoadBalancerAttributes::builder()
            .access_log(AccessLog::builder().enabled(false).build())
            .connection_draining(
                ConnectionDraining::builder()
                    .enabled(false)
                    .timeout(300)
                    .build(),
            )
            .connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(60)
                    .build()
                    .unwrap(),
            )
            .cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(false).build())
            .build()
    }

    fn changes(
        current: Option<&LoadBalancerAttributes>,
        wanted: &ClassicAttributes,
    ) -> Vec<String> {
        plan(current, wanted)
            .unwrap()
            .map(|p| p.changes)
            .unwrap_or_default()
    }

    #[test]
    fn only_what_differs_is_written() {
        let new = new_elb();
        for (name, wanted, want) in [
            ("defaults on a new ELB: nothing", defaults(), vec![]),
            (
                "draining on, its timeout left unset: AWS's 300 s is not compared",
                ClassicAttributes {
                    draining: true,
                    ..defaults()
                },
                vec!["connection draining on"],
            ),
            (
                "an access log to a bucket, a longer idle timeout, cross-zone on",
                ClassicAttributes {
                    access_log: true,
                    access_log_bucket: Some("logs".into()),
                    idle_timeout: 120,
                    cross_zone: true,
                    ..defaults()
                },
                vec![
                    "access log on",
                    "idle timeout 120 s",
                    "cross-zone load balancing true",
                ],
            ),
        ] {
            assert_eq!(changes(Some(&new), &wanted), want, "{name}");
        }
    }

    #[test]
    fn what_aws_does_not_report_is_written_except_cross_zone_off() {
        // No attributes read at all: each but cross-zone (off unless reported) is set.
        assert_eq!(
            changes(None, &defaults()),
            vec![
                "access log off",
                "connection draining off",
                "idle timeout 60 s"
            ]
        );
        // The plan's attributes hold only what changes.
        let wanted = ClassicAttributes {
            idle_timeout: 30,
            ..defaults()
        };
        let plan = plan(Some(&new_elb()), &wanted).unwrap().unwrap();
        assert!(plan.attributes.access_log().is_none());
        assert_eq!(
            plan.attributes
                .connection_settings()
                .map(|c| c.idle_timeout()),
            Some(30)
        );
    }
}
