//! Per-load-balancer metrics, read from the running listeners at scrape time (a `Collector`), so a
//! removed load balancer's series disappear with it and the data path only bumps atomics.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::Inner;
use crate::pool::ListenerShared;

/// Metric names (without the `_total` that the encoder adds to counters).
pub mod names {
    /// Counter: connections (TCP) or flows (UDP) relayed to a backend.
    pub const CONNECTIONS: &str = "local_lb_connections";
    /// Gauge: connections (TCP) or flows (UDP) open now.
    pub const ACTIVE_CONNECTIONS: &str = "local_lb_active_connections";
    /// Counter: bytes received from clients (and relayed to backends).
    pub const BYTES_IN: &str = "local_lb_bytes_in";
    /// Counter: bytes received from backends (and relayed to clients).
    pub const BYTES_OUT: &str = "local_lb_bytes_out";
    /// Counter: connections or flows refused, labelled by `reason` (`source_range`,
    /// `no_healthy_backend`, `descriptor_budget`).
    pub const REFUSED: &str = "local_lb_refused_connections";
    /// Counter: failed connection attempts to backends.
    pub const BACKEND_CONNECT_ERRORS: &str = "local_lb_backend_connect_errors";
    /// Counter: TCP connections closed because no byte moved either way for the idle timeout.
    pub const IDLE_TIMEOUTS: &str = "local_lb_idle_timeouts";
    /// Gauge: 1 if the backend gets new connections, else 0.
    pub const BACKEND_HEALTHY: &str = "local_lb_backend_healthy";
    /// Gauge: file descriptors the data plane's connections and flows hold.
    pub const DESCRIPTORS_IN_USE: &str = "local_lb_descriptors_in_use";
    /// Gauge: the most file descriptors the data plane's connections and flows may hold (the
    /// open-files limit less the manager's reserve).
    pub const DESCRIPTORS_BUDGET: &str = "local_lb_descriptors_budget";
}

/// Reads one counter of a listener.
type ReadStat = fn(&ListenerShared) -> u64;

#[derive(Debug)]
pub(crate) struct DataPlaneCollector {
    pub(crate) inner: Weak<Inner>,
}

impl Collector for DataPlaneCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(());
        };
        let listeners: Vec<Arc<ListenerShared>> = inner.all_listeners();
        for (name, help, value) in [
            (
                names::DESCRIPTORS_IN_USE,
                "File descriptors the data plane's connections and flows hold.",
                inner.budget.used(),
            ),
            (
                names::DESCRIPTORS_BUDGET,
                "The most file descriptors the data plane's connections and flows may hold.",
                inner.budget.total(),
            ),
        ] {
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX))
                .encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        let counters: [(&str, &str, ReadStat); 5] = [
            (
                names::CONNECTIONS,
                "Connections (TCP) or flows (UDP) relayed to a backend.",
                |l| l.stats.connections.load(Ordering::Relaxed),
            ),
            (names::BYTES_IN, "Bytes received from clients.", |l| {
                l.stats.bytes_in.load(Ordering::Relaxed)
            }),
            (names::BYTES_OUT, "Bytes received from backends.", |l| {
                l.stats.bytes_out.load(Ordering::Relaxed)
            }),
            (
                names::BACKEND_CONNECT_ERRORS,
                "Failed connection attempts to backends.",
                |l| l.stats.backend_connect_errors.load(Ordering::Relaxed),
            ),
            (
                names::IDLE_TIMEOUTS,
                "TCP connections closed after the idle timeout without a byte either way.",
                |l| l.stats.idle_timeouts.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for listener in &listeners {
                let labels = [
                    ("load_balancer", &*listener.load_balancer),
                    ("listener", listener.label.as_str()),
                ];
                ConstCounter::new(value(listener)).encode(metric.encode_family(&labels)?)?;
            }
        }
        {
            let mut metric = encoder.encode_descriptor(
                names::ACTIVE_CONNECTIONS,
                "Connections (TCP) or flows (UDP) open now.",
                None,
                MetricType::Gauge,
            )?;
            for listener in &listeners {
                let labels = [
                    ("load_balancer", &*listener.load_balancer),
                    ("listener", listener.label.as_str()),
                ];
                let active = listener.stats.active.load(Ordering::Relaxed);
                ConstGauge::new(i64::try_from(active).unwrap_or(i64::MAX))
                    .encode(metric.encode_family(&labels)?)?;
            }
        }
        {
            let mut metric = encoder.encode_descriptor(
                names::REFUSED,
                "Connections or flows refused, by reason.",
                None,
                MetricType::Counter,
            )?;
            for listener in &listeners {
                for (reason, value) in [
                    ("source_range", &listener.stats.refused_source),
                    ("no_healthy_backend", &listener.stats.refused_no_backend),
                    ("descriptor_budget", &listener.stats.refused_budget),
                ] {
                    let labels = [
                        ("load_balancer", &*listener.load_balancer),
                        ("listener", listener.label.as_str()),
                        ("reason", reason),
                    ];
                    ConstCounter::new(value.load(Ordering::Relaxed))
                        .encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        {
            let mut metric = encoder.encode_descriptor(
                names::BACKEND_HEALTHY,
                "1 if the backend gets new connections, else 0.",
                None,
                MetricType::Gauge,
            )?;
            for listener in &listeners {
                for backend in &listener.config().backends {
                    let address = backend.addr.to_string();
                    let labels = [
                        ("load_balancer", &*listener.load_balancer),
                        ("listener", listener.label.as_str()),
                        ("backend", address.as_str()),
                        ("node", backend.node.as_str()),
                    ];
                    ConstGauge::new(i64::from(backend.is_healthy()))
                        .encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}
