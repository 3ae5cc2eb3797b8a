//! Per-load-balancer metrics, read from the running listeners at scrape time (a `Collector`), so a
//! removed load balancer's series disappear with it and the data path only bumps atomics.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
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
    /// Counter: the data plane's long-running tasks started again after a panic (a bug), labelled
    /// by `task` (`accept_loop`: a listener's accept or receive loop; `health_checks`: a backend's
    /// checks), for the process.
    pub const TASK_RESTARTS: &str = "local_lb_task_restarts";
    /// Gauge: file descriptors the data plane's connections and flows hold.
    pub const DESCRIPTORS_IN_USE: &str = "local_lb_descriptors_in_use";
    /// Gauge: the most file descriptors the data plane's connections and flows may hold (the
    /// open-files limit less the manager's reserve).
    pub const DESCRIPTORS_BUDGET: &str = "local_lb_descriptors_budget";
}

/// Reads one counter of a listener.
type ReadStat = fn(&ListenerShared) -> u64;

/// A metric family's name, help and type.
type Family = (&'static str, &'static str, MetricType);

/// Encodes a listener's series of one family.
type SeriesOf = fn(&mut MetricEncoder, &ListenerShared) -> fmt::Result;

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
        encode_descriptor_budget(&mut encoder, &inner)?;
        encode_task_restarts(&mut encoder)?;
        encode_listener_counters(&mut encoder, &listeners)?;
        let families: [(Family, SeriesOf); 3] = [
            (
                (
                    names::ACTIVE_CONNECTIONS,
                    "Connections (TCP) or flows (UDP) open now.",
                    MetricType::Gauge,
                ),
                active_connections,
            ),
            (
                (
                    names::REFUSED,
                    "Connections or flows refused, by reason.",
                    MetricType::Counter,
                ),
                refusals,
            ),
            (
                (
                    names::BACKEND_HEALTHY,
                    "1 if the backend gets new connections, else 0.",
                    MetricType::Gauge,
                ),
                backend_health,
            ),
        ];
        for (family, series) in families {
            encode_per_listener(&mut encoder, &listeners, family, series)?;
        }
        Ok(())
    }
}

/// The labels every per-listener series has: its load balancer and the listener.
fn listener_labels(listener: &ListenerShared) -> [(&str, &str); 2] {
    [
        ("load_balancer", &*listener.load_balancer),
        ("listener", listener.label.as_str()),
    ]
}

/// Encodes the descriptors' gauges: how many the connections and flows hold, and the most they may.
fn encode_descriptor_budget(
    encoder: &mut DescriptorEncoder,
    inner: &Inner,
) -> Result<(), std::fmt::Error> {
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
    Ok(())
}

/// Encodes the restarts after a panic of the tasks [`crate::restart`] keeps going, one series per
/// kind (zero included, so that an alert can watch the series from the start).
fn encode_task_restarts(encoder: &mut DescriptorEncoder) -> fmt::Result {
    let mut family = encoder.encode_descriptor(
        names::TASK_RESTARTS,
        "The data plane's tasks started again after a panic (a bug), by task.",
        None,
        MetricType::Counter,
    )?;
    for task in crate::restart::TASKS {
        ConstCounter::new(task.restarts())
            .encode(family.encode_family(&[("task", task.label)])?)?;
    }
    Ok(())
}

/// Encodes the counters that have one series per listener: connections, bytes in and out, backend
/// connect errors and idle timeouts.
fn encode_listener_counters(
    encoder: &mut DescriptorEncoder,
    listeners: &[Arc<ListenerShared>],
) -> Result<(), std::fmt::Error> {
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
        encode_per_listener(
            encoder,
            listeners,
            (name, help, MetricType::Counter),
            |metric, listener| {
                ConstCounter::new(value(listener))
                    .encode(metric.encode_family(&listener_labels(listener))?)
            },
        )?;
    }
    Ok(())
}

/// Encodes one family whose series `series` writes listener by listener.
fn encode_per_listener(
    encoder: &mut DescriptorEncoder,
    listeners: &[Arc<ListenerShared>],
    (name, help, kind): Family,
    series: impl Fn(&mut MetricEncoder, &ListenerShared) -> fmt::Result,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for listener in listeners {
        series(&mut metric, listener)?;
    }
    Ok(())
}

/// The connections (TCP) or flows (UDP) a listener has open now.
fn active_connections(metric: &mut MetricEncoder, listener: &ListenerShared) -> fmt::Result {
    let active = listener.stats.active.load(Ordering::Relaxed);
    ConstGauge::new(i64::try_from(active).unwrap_or(i64::MAX))
        .encode(metric.encode_family(&listener_labels(listener))?)
}

/// A listener's refusals, one series per `reason`.
fn refusals(metric: &mut MetricEncoder, listener: &ListenerShared) -> fmt::Result {
    for (reason, value) in [
        ("source_range", &listener.stats.refused_source),
        ("no_healthy_backend", &listener.stats.refused_no_backend),
        ("descriptor_budget", &listener.stats.refused_budget),
    ] {
        let [load_balancer, listener_label] = listener_labels(listener);
        let labels = [load_balancer, listener_label, ("reason", reason)];
        ConstCounter::new(value.load(Ordering::Relaxed)).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The health of each backend of a listener (1 if it gets new connections, else 0).
fn backend_health(metric: &mut MetricEncoder, listener: &ListenerShared) -> fmt::Result {
    for backend in &listener.config().backends {
        let address = backend.addr.to_string();
        let [load_balancer, listener_label] = listener_labels(listener);
        let labels = [
            load_balancer,
            listener_label,
            ("backend", address.as_str()),
            ("node", backend.node.as_str()),
        ];
        ConstGauge::new(i64::from(backend.is_healthy())).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}
