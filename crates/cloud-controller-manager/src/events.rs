//! Events, written through kube-runtime's recorder (events.k8s.io/v1, aggregated into series); events
//! about Nodes land in the `default` namespace, as upstream's do.

use kube::{
    Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

/// Records events as one controller.
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
}

/// This process's host name, for the events' reporting instance.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

impl EventRecorder {
    /// A recorder reporting as `component` (upstream's event source, e.g. `cloud-node-controller`).
    pub fn new(client: Client, component: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: component.to_owned(),
                    instance: hostname(),
                },
            ),
        }
    }

    /// Records an event about `object`; a failure is logged, never returned (events are best effort).
    pub async fn record<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference = object.object_ref(&());
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(reason, object = ?reference.name, error = %err, "could not record an event");
        }
    }
}
