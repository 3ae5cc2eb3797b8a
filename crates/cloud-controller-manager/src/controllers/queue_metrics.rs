//! The work queues' metrics, with client-go's names, labels and buckets (`k8s.io/component-base/metrics/
//! prometheus/workqueue`), so dashboards and alerts written for upstream's managers work here: each
//! series is labelled `name` (the queue's, which is its controller's name).
//!
//! - `workqueue_depth` (gauge), `workqueue_adds_total`, `workqueue_retries_total` (counters)
//! - `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds` (histograms, 1 ns to 10 s ×
//!   10, as client-go's)
//! - `workqueue_unfinished_work_seconds`, `workqueue_longest_running_processor_seconds` (gauges,
//!   refreshed every 500 ms while the queue runs, as client-go refreshes them)
//!
//! Beyond client-go: `workqueue_panics_total`, reconciles that panicked (the key is retried on its
//! back-off, and a controller that keeps panicking fails its health check), and for the node controller
//! also the follow-ups of its initializations that panicked (`controllers::node::follow_up`).

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::sync::atomic::AtomicU64;

use crate::metrics::{NameLabel, registered};

type FloatGauge = Gauge<f64, AtomicU64>;

/// The queue metrics of every controller (one family per metric, one series per queue).
#[derive(Clone)]
pub struct WorkQueueMetrics {
    depth: Family<NameLabel, Gauge>,
    adds: Family<NameLabel, Counter>,
    retries: Family<NameLabel, Counter>,
    panics: Family<NameLabel, Counter>,
    queue_duration: Family<NameLabel, Histogram>,
    work_duration: Family<NameLabel, Histogram>,
    unfinished: Family<NameLabel, FloatGauge>,
    longest: Family<NameLabel, FloatGauge>,
}

/// client-go's buckets: `ExponentialBuckets(10e-9, 10, 10)`, 10 ns to 10 s.
fn duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        10e-9, 10.0, 10,
    ))
}

impl WorkQueueMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let sub = registry.sub_registry_with_prefix("workqueue");
        Self {
            depth: registered(
                sub,
                "depth",
                "Current depth of workqueue",
                Family::default(),
            ),
            adds: registered(
                sub,
                "adds",
                "Total number of adds handled by workqueue",
                Family::default(),
            ),
            retries: registered(
                sub,
                "retries",
                "Total number of retries handled by workqueue",
                Family::default(),
            ),
            panics: registered(
                sub,
                "panics",
                "Total number of reconciles that panicked (the key is retried on its back-off)",
                Family::default(),
            ),
            queue_duration: registered(
                sub,
                "queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
                Family::new_with_constructor(duration_histogram),
            ),
            work_duration: registered(
                sub,
                "work_duration_seconds",
                "How long in seconds processing an item from workqueue takes",
                Family::new_with_constructor(duration_histogram),
            ),
            unfinished: registered(
                sub,
                "unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases",
                Family::default(),
            ),
            longest: registered(
                sub,
                "longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
                Family::default(),
            ),
        }
    }

    /// The series of the queue `name`.
    pub(crate) fn queue(&self, name: &str) -> QueueMetrics {
        let label = NameLabel::new(name);
        QueueMetrics {
            depth: self.depth.get_or_create(&label).clone(),
            adds: self.adds.get_or_create(&label).clone(),
            retries: self.retries.get_or_create(&label).clone(),
            panics: self.panics.get_or_create(&label).clone(),
            queue_duration: self.queue_duration.get_or_create(&label).clone(),
            work_duration: self.work_duration.get_or_create(&label).clone(),
            unfinished: self.unfinished.get_or_create(&label).clone(),
            longest: self.longest.get_or_create(&label).clone(),
        }
    }
}

/// One queue's series (handles into the families; cheap to clone).
#[derive(Clone)]
pub(crate) struct QueueMetrics {
    pub(crate) depth: Gauge,
    pub(crate) adds: Counter,
    pub(crate) retries: Counter,
    pub(crate) panics: Counter,
    pub(crate) queue_duration: Histogram,
    pub(crate) work_duration: Histogram,
    pub(crate) unfinished: FloatGauge,
    pub(crate) longest: FloatGauge,
}
