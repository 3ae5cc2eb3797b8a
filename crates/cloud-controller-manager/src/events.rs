//! Events, written through kube-runtime's recorder (events.k8s.io/v1, aggregated into series); events
//! about Nodes land in the `default` namespace, as upstream's do.
//!
//! Recording never blocks a reconcile: events go to a queue that a background task delivers, retrying
//! a failed write with back-off (1 s doubling to 10 s, 12 tries: about a minute and a half, as
//! client-go's broadcaster tries 12 times), so an API outage does not lose them. A full queue drops
//! the newest event with a log line, as client-go's does. An object whose name is too long for the
//! recorder's `<name>.<hex time>` event name gets an event whose name is cut to fit.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as KubeEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::PostParams,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::{Semaphore, mpsc};

/// Events waiting for delivery, per recorder.
const QUEUE: usize = 1000;
/// Events delivered at once, per recorder.
const DELIVERING: usize = 16;
/// Tries per event.
const TRIES: u32 = 12;
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(10);
/// How long one write may take before it counts as failed (a request to a frozen or unreachable API
/// server would otherwise wait for the client's read timeout, minutes).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest object name that fits the recorder's event name: a name may have 253 characters, and
/// the recorder appends `.` and the time in hex nanoseconds (16 digits).
const LONGEST_NAME: usize = 253 - 17;

/// Records events as one controller.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Delivery>,
    /// The delivery task's queue, started at the first event. Only the recorders hold it, so the task
    /// ends once every recorder is gone and the queue is drained.
    queue: Arc<OnceLock<mpsc::Sender<Pending>>>,
}

/// What the delivery task needs.
struct Delivery {
    client: Client,
    reporter: Reporter,
    recorder: Recorder,
    /// Events queued and not yet delivered or given up on.
    undelivered: tokio::sync::watch::Sender<usize>,
}

struct Pending {
    event: Event,
    reference: ObjectReference,
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
        let reporter = Reporter {
            controller: component.to_owned(),
            instance: hostname(),
        };
        Self {
            inner: Arc::new(Delivery {
                recorder: Recorder::new(client.clone(), reporter.clone()),
                client,
                reporter,
                undelivered: tokio::sync::watch::Sender::new(0),
            }),
            queue: Arc::default(),
        }
    }

    /// Records an event about `object`: queued for delivery, never failing the caller (events are best
    /// effort, but retried).
    pub async fn record<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.queue(object, type_, reason, action, note);
    }

    /// [`EventRecorder::record`] for callers that cannot await (must run inside a tokio runtime).
    pub fn queue<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let pending = Pending {
            event: Event {
                type_,
                reason: reason.to_owned(),
                note: Some(note),
                action: action.to_owned(),
                secondary: None,
            },
            reference: object.object_ref(&()),
        };
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(QUEUE);
            tokio::spawn(deliver_all(self.inner.clone(), receiver));
            sender
        });
        self.inner.undelivered.send_modify(|n| *n += 1);
        if let Err(mpsc::error::TrySendError::Full(dropped)) = queue.try_send(pending) {
            self.inner.undelivered.send_modify(|n| *n -= 1);
            tracing::warn!(
                reason = dropped.event.reason,
                object = ?dropped.reference.name,
                "event queue full; dropping an event"
            );
        }
    }

    /// Waits until every event recorded so far is delivered (or given up on).
    pub async fn flush(&self) {
        let mut undelivered = self.inner.undelivered.subscribe();
        let _ = undelivered.wait_for(|n| *n == 0).await;
    }
}

/// Delivers queued events, a few at a time, until every recorder handle is gone.
async fn deliver_all(inner: Arc<Delivery>, mut queue: mpsc::Receiver<Pending>) {
    let slots = Arc::new(Semaphore::new(DELIVERING));
    while let Some(pending) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            deliver(&inner, &pending).await;
            inner.undelivered.send_modify(|n| *n -= 1);
            drop(slot);
        });
    }
}

/// Writes one event, retrying what may succeed later (no answer, 5xx, 429, or a write the leader's
/// fence held back) and giving up on a refusal.
async fn deliver(inner: &Delivery, pending: &Pending) {
    let mut delay = FIRST_RETRY;
    for attempt in 1..=TRIES {
        let write = async {
            if too_long(&pending.reference) {
                create_with_cut_name(inner, pending).await
            } else {
                inner
                    .recorder
                    .publish(&pending.event, &pending.reference)
                    .await
            }
        };
        let err = match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => return,
            Ok(Err(err)) => DeliveryError::Api(err),
            Err(_) => DeliveryError::TimedOut,
        };
        if !err.retryable() || attempt == TRIES {
            tracing::warn!(reason = pending.event.reason, object = ?pending.reference.name, attempt, error = %err, "could not record an event");
            return;
        }
        tracing::debug!(reason = pending.event.reason, object = ?pending.reference.name, attempt, error = %err, "recording an event failed; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY);
    }
}

#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("no answer within {WRITE_TIMEOUT:?}")]
    TimedOut,
}

impl DeliveryError {
    fn retryable(&self) -> bool {
        match self {
            Self::Api(err) => crate::controllers::outage::api_unavailable(err),
            Self::TimedOut => true,
        }
    }
}

fn too_long(reference: &ObjectReference) -> bool {
    reference
        .name
        .as_ref()
        .is_some_and(|n| n.len() > LONGEST_NAME)
}

/// The event the recorder would write, named `<name cut to fit>.<hex time>` (no series aggregation:
/// such names are rare).
async fn create_with_cut_name(inner: &Delivery, pending: &Pending) -> Result<(), kube::Error> {
    let reference = &pending.reference;
    let now = Timestamp::now();
    let name = reference.name.as_deref().unwrap_or_default();
    let event = KubeEvent {
        action: Some(pending.event.action.clone()),
        reason: Some(pending.event.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(reference.clone()),
        note: pending.event.note.clone(),
        metadata: ObjectMeta {
            namespace: reference.namespace.clone(),
            name: Some(format!("{}.{:x}", cut_name(name), now.as_nanosecond())),
            ..Default::default()
        },
        reporting_controller: Some(inner.reporter.controller.clone()),
        reporting_instance: Some(
            inner
                .reporter
                .instance
                .clone()
                .unwrap_or_else(|| inner.reporter.controller.clone()),
        ),
        type_: Some(match pending.event.type_ {
            EventType::Normal => "Normal".to_owned(),
            EventType::Warning => "Warning".to_owned(),
        }),
        ..Default::default()
    };
    let namespace = reference.namespace.as_deref().unwrap_or("default");
    Api::<KubeEvent>::namespaced(inner.client.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(drop)
}

/// `name` cut to [`LONGEST_NAME`], ending in an alphanumeric character as a DNS subdomain must.
fn cut_name(name: &str) -> &str {
    let mut end = name.len().min(LONGEST_NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_to_fit_and_end_alphanumeric() {
        let long = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        assert_eq!(long.len(), 253);
        let cut = cut_name(&long);
        assert_eq!(cut, "a".repeat(235));
        assert!(format!("{cut}.{:x}", u64::MAX).len() <= 253);
        assert_eq!(cut_name("node-a"), "node-a");
        let dotted = format!("{}.x", "a".repeat(LONGEST_NAME - 1));
        assert_eq!(cut_name(&dotted), "a".repeat(LONGEST_NAME - 1));
    }

    #[test]
    fn refusals_are_final_and_outages_and_timeouts_retried() {
        let status = |code| {
            DeliveryError::Api(kube::Error::Api(
                kube::core::Status {
                    code,
                    ..Default::default()
                }
                .boxed(),
            ))
        };
        assert!(!status(422).retryable());
        assert!(!status(403).retryable());
        assert!(status(503).retryable());
        assert!(DeliveryError::TimedOut.retryable());
    }
}
