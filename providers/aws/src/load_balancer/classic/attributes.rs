//! A Classic ELB's attributes (access log, connection draining, idle timeout, cross-zone), written
//! only where they differ from what the Service asks.

use super::*;

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
}
