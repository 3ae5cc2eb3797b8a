//! Shadow mode's metrics:
//!
//! - `cloud_controller_manager_dry_run_writes_total{resource, verb}`: API writes not made (events
//!   excluded), repeats included;
//! - `cloud_controller_manager_dry_run_events_total{reason}`: events not written;
//! - `cloud_controller_manager_dry_run_cloud_writes_total{call, preview}`: cloud writes not made, by
//!   call and what the preview said (`create`, `change`, `delete`, `upToDate`, `unknown`);
//! - `cloud_controller_manager_dry_run_objects{kind}`: objects with a would-be write on record
//!   (`api`, `cloud`), as recorded (the JSON report classifies them against the current state).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::registered;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    resource: String,
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloudLabels {
    call: String,
    preview: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    kind: String,
}

/// The shadow mode's counters (registered always; they stay empty without `--dry-run`).
#[derive(Clone)]
pub struct DryRunMetrics {
    writes: Family<WriteLabels, Counter>,
    events: Family<EventLabels, Counter>,
    cloud: Family<CloudLabels, Counter>,
    objects: Family<ObjectLabels, Gauge>,
}

impl DryRunMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        Self {
            writes: registered(
                registry,
                "cloud_controller_manager_dry_run_writes",
                "API writes the manager would have made in --dry-run (events apart), by resource and verb.",
                Family::default(),
            ),
            events: registered(
                registry,
                "cloud_controller_manager_dry_run_events",
                "Events the manager would have written in --dry-run, by reason.",
                Family::default(),
            ),
            cloud: registered(
                registry,
                "cloud_controller_manager_dry_run_cloud_writes",
                "Cloud writes the manager would have made in --dry-run, by call and what the preview said.",
                Family::default(),
            ),
            objects: registered(
                registry,
                "cloud_controller_manager_dry_run_objects",
                "Objects with a would-be write on record in --dry-run (api: API objects, cloud: load balancers and routes).",
                Family::default(),
            ),
        }
    }

    pub(crate) fn write(&self, resource: &str, verb: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                resource: resource.to_owned(),
                verb: verb.to_owned(),
            })
            .inc();
    }

    pub(crate) fn event(&self, reason: &str) {
        self.events
            .get_or_create(&EventLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(crate) fn cloud_write(&self, call: &str, preview: &str) {
        self.cloud
            .get_or_create(&CloudLabels {
                call: call.to_owned(),
                preview: preview.to_owned(),
            })
            .inc();
    }

    pub(crate) fn objects(&self, kind: &str, count: usize) {
        self.objects
            .get_or_create(&ObjectLabels {
                kind: kind.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}
