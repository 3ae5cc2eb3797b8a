//! The pools' metrics, read at scrape time from the addresses this process has given out (a
//! `Collector`, as the data plane's are): how full each pool is, and which address each holds, for the
//! dashboards and alerts of `deploy/monitoring/`. Only the replica that gives addresses out (the
//! leader) holds any: another replica reports its pools empty, so queries take the most assigned and
//! the fewest available across replicas.

use std::{net::IpAddr, sync::Weak};

use cloud_provider::prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};

use crate::{Inner, LocalCloud, bgp_config::Announce, pool_usage};

/// Metric names.
pub mod names {
    /// Gauge, labels `pool`, `family` (`IPv4`, `IPv6`): addresses the pool has given out.
    pub const ASSIGNED: &str = "local_pool_addresses_assigned";
    /// Gauge, labels `pool`, `family`: addresses the pool may still give out.
    pub const AVAILABLE: &str = "local_pool_addresses_available";
    /// Gauge, labels `pool`, `address`, `announce` (`l2`, `bgp`, `none`): 1 for each address given
    /// out, so that an alert can find one no node agent announces (`local_agent_vip_announced`).
    pub const ADDRESS: &str = "local_pool_address_assigned";
}

#[derive(Debug)]
pub(crate) struct PoolCollector {
    pub(crate) inner: Weak<Inner>,
}

fn family(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

fn announce_label(announce: Announce) -> &'static str {
    match announce {
        Announce::L2 => "l2",
        Announce::Bgp => "bgp",
        Announce::None => "none",
    }
}

fn gauge(value: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX))
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(());
        };
        let cloud = LocalCloud { inner };
        let config = cloud.config();
        let usage = cloud.pool_usage();
        // Only the families a pool has addresses of.
        let families = |name: &str| {
            let pool = config.address_pools.iter().find(|p| p.name == name);
            let has = |v4: bool| {
                pool.is_some_and(|p| p.addresses.iter().any(|r| r.first().is_ipv4() == v4))
            };
            [("IPv4", has(true)), ("IPv6", has(false))]
        };
        for (metric_name, help, value) in [
            (
                names::ASSIGNED,
                "Addresses the pool has given out (a shared one once).",
                (|u: &pool_usage::PoolUsage, v4: bool| {
                    if v4 { u.assigned_v4 } else { u.assigned_v6 }
                }) as fn(&pool_usage::PoolUsage, bool) -> u64,
            ),
            (
                names::AVAILABLE,
                "Addresses the pool may still give out.",
                |u, v4| if v4 { u.available_v4 } else { u.available_v6 },
            ),
        ] {
            let mut metric =
                encoder.encode_descriptor(metric_name, help, None, MetricType::Gauge)?;
            for pool in &usage {
                for (family, has) in families(&pool.name) {
                    if has {
                        let labels = [("pool", pool.name.as_str()), ("family", family)];
                        gauge(value(pool, family == "IPv4"))
                            .encode(metric.encode_family(&labels)?)?;
                    }
                }
            }
        }
        let mut metric = encoder.encode_descriptor(
            names::ADDRESS,
            "1 for each address a pool has given out.",
            None,
            MetricType::Gauge,
        )?;
        for (ip, pool) in cloud.assigned_addresses(&config) {
            let address = ip.to_string();
            let labels = [
                ("pool", pool.name.as_str()),
                ("address", address.as_str()),
                ("family", family(ip)),
                ("announce", announce_label(pool.announce)),
            ];
            gauge(1).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use cloud_provider::{
        LoadBalancer,
        conformance::{backend_node, load_balancer_service},
        prometheus_client::{encoding::text::encode, registry::Registry},
    };

    use crate::{CloudProvider, LocalCloud, config::Config};

    fn scrape(cloud: &LocalCloud) -> String {
        let mut registry = Registry::default();
        cloud.register_metrics(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    #[tokio::test]
    async fn pools_report_their_usage_and_each_address_given_out() {
        let config = Config::parse(
            "unlistedNodes: ignore\nloadBalancer: {mode: agents}\naddressPools:\n  - {name: web, addresses: [192.0.2.0/30, '2001:db8::/126']}\n  - {name: quiet, addresses: [198.51.100.0/31], announce: none, autoAssign: false}\n",
            None,
        )
        .unwrap();
        let cloud = LocalCloud::new(config, None);
        let before = scrape(&cloud);
        for line in [
            r#"local_pool_addresses_assigned{pool="web",family="IPv4"} 0"#,
            // A /30's two host addresses, a /126 without its subnet-router anycast address.
            r#"local_pool_addresses_available{pool="web",family="IPv4"} 2"#,
            r#"local_pool_addresses_available{pool="web",family="IPv6"} 3"#,
            r#"local_pool_addresses_available{pool="quiet",family="IPv4"} 2"#,
        ] {
            assert!(before.contains(line), "{line} not in:\n{before}");
        }
        // A pool has only the families it has addresses of.
        assert!(
            !before.contains(r#"pool="quiet",family="IPv6""#),
            "{before}"
        );
        assert!(!before.contains("local_pool_address_assigned{"), "{before}");

        let service = load_balancer_service("default", "a", "uid-a");
        cloud
            .ensure_load_balancer("kubernetes", &service, &[backend_node("n1")])
            .await
            .unwrap();
        let after = scrape(&cloud);
        for line in [
            r#"local_pool_addresses_assigned{pool="web",family="IPv4"} 1"#,
            r#"local_pool_addresses_available{pool="web",family="IPv4"} 1"#,
            r#"local_pool_address_assigned{pool="web",address="192.0.2.1",family="IPv4",announce="l2"} 1"#,
        ] {
            assert!(after.contains(line), "{line} not in:\n{after}");
        }
        cloud
            .ensure_load_balancer_deleted("kubernetes", &service)
            .await
            .unwrap();
        assert!(!scrape(&cloud).contains("local_pool_address_assigned{"));
    }
}
