//! Events (events.k8s.io/v1, repeats aggregated into series by `event_series::SeriesRecorder`); events
//! about Nodes land in the `default` namespace, as upstream's do.
//!
//! Recording never blocks a reconcile: events go to a queue that a background task delivers, retrying
//! a failed write with back-off (1 s doubling to 10 s, 12 tries: about a minute and a half, as
//! client-go's broadcaster tries 12 times), so an API outage does not lose them. A full queue drops
//! the newest event, as client-go's does, with one log line per [`DROP_LOG_EVERY`] that counts them (a
//! line per dropped event made 78,358 lines in 9.5 minutes at a low QPS). An object whose name is too
//! long for the recorder's `<name>.<hex time>` event name gets an event whose name is cut to fit.
//!
//! A note longer than the API server takes ([`NOTE_LIMIT`] bytes) is cut to fit, keeping its start and
//! saying how much was cut ([`fit_note`]), rather than being refused and lost.
//!
//! An event about no object ([`EventRecorder::queue_unattached`], e.g. a pod-CIDR range that is full)
//! is written to `kube-system` without `regarding`, as the API server allows there.

use parking_lot::Mutex;
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
    runtime::events::{Event, EventType, Reporter},
};
use tokio::sync::{Semaphore, mpsc};

use crate::event_series::SeriesRecorder;

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
/// The longest note the API server takes: `NoteLengthLimit` in k8s.io/kubernetes
/// `pkg/apis/core/validation/events.go` (v1.37.1), which the events.k8s.io/v1 `note` is checked against
/// (as the core Event's `message`) with Go's `len`: **bytes**, not characters.
pub const NOTE_LIMIT: usize = 1024;
/// Where events about no object are recorded (the API server takes an event without `regarding` only
/// in `default` and `kube-system`).
pub const UNATTACHED_NAMESPACE: &str = "kube-system";
/// At most one "event queue full" log line per this long, counting the events dropped since the last.
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

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
    recorder: SeriesRecorder,
    /// Events queued and not yet delivered or given up on.
    undelivered: tokio::sync::watch::Sender<usize>,
    /// Events dropped on a full queue, and when that was last logged.
    drops: Mutex<DropLog>,
}

struct Pending {
    event: Event,
    /// The object the event is about; `None`: about no object (in [`UNATTACHED_NAMESPACE`]).
    reference: Option<ObjectReference>,
}

impl Pending {
    fn object(&self) -> Option<&str> {
        self.reference.as_ref().and_then(|r| r.name.as_deref())
    }
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
                recorder: SeriesRecorder::new(client.clone(), reporter.clone()),
                client,
                reporter,
                undelivered: tokio::sync::watch::Sender::new(0),
                drops: Mutex::default(),
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
        self.enqueue(Pending {
            event: event(type_, reason, action, note),
            reference: Some(object.object_ref(&())),
        });
    }

    /// Records an event about no object (about the cluster: a pod-CIDR range that is full, say), in
    /// [`UNATTACHED_NAMESPACE`] without `regarding`; `kubectl get events -n kube-system` shows it. Queued
    /// like [`EventRecorder::queue`]; never aggregated into a series.
    pub fn queue_unattached(&self, type_: EventType, reason: &str, action: &str, note: String) {
        self.enqueue(Pending {
            event: event(type_, reason, action, note),
            reference: None,
        });
    }

    fn enqueue(&self, pending: Pending) {
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(QUEUE);
            // Unsupervised: it only receives, takes a slot and spawns (nothing in it can fail; each
            // delivery catches its own panic); it ends by design once every recorder is gone, and
            // `enqueue` says so should it ever be gone before.
            tokio::spawn(deliver_all(self.inner.clone(), receiver));
            sender
        });
        self.inner.undelivered.send_modify(|n| *n += 1);
        let (dropped, why) = match queue.try_send(pending) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(dropped)) => (dropped, "event queue full"),
            // The delivery task is gone: only a panic of its own (a bug) ends it while a handle lives.
            Err(mpsc::error::TrySendError::Closed(dropped)) => {
                (dropped, "the event delivery stopped (a bug)")
            }
        };
        self.inner.undelivered.send_modify(|n| *n -= 1);
        let report = self.inner.drops.lock().dropped(tokio::time::Instant::now());
        if let Some(count) = report {
            tracing::warn!(
                reason = dropped.event.reason,
                object = ?dropped.object(),
                dropped = count,
                "{why}; dropping events (one line per {DROP_LOG_EVERY:?} at most)"
            );
        }
    }

    /// Waits until every event recorded so far is delivered (or given up on).
    pub async fn flush(&self) {
        let mut undelivered = self.inner.undelivered.subscribe();
        let _ = undelivered.wait_for(|n| *n == 0).await;
    }
}

/// The event to queue, its note cut to what the API server takes.
fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(fit_note(note)),
        action: action.to_owned(),
        secondary: None,
    }
}

/// `note`, cut to at most [`NOTE_LIMIT`] bytes when longer: its start, then `… (cut: N more bytes)`,
/// where N is how many bytes of `note` were left out. Never splits a UTF-8 character (the start ends on
/// a character boundary, so it may keep a few bytes less than would fit).
pub fn fit_note(note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let total = note.len();
    // The marker grows with the number it carries, and that number shrinks as more of the note is
    // kept: start from the longest marker (everything cut) and keep more while the shorter marker
    // lets it fit. Each step keeps at least as much, and every step fits.
    let mut end = floor_char_boundary(&note, NOTE_LIMIT - cut_marker(total).len());
    loop {
        let more = floor_char_boundary(&note, NOTE_LIMIT - cut_marker(total - end).len());
        if more <= end {
            break;
        }
        end = more;
    }
    let mut cut = note;
    let marker = cut_marker(total - end);
    cut.truncate(end);
    cut.push_str(&marker);
    cut
}

/// What ends a cut note: how many bytes were left out.
fn cut_marker(bytes: usize) -> String {
    format!("… (cut: {bytes} more bytes)")
}

/// The largest character boundary of `text` at or before byte `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut end = index.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// Counts events dropped on a full queue, to log them at most once per [`DROP_LOG_EVERY`].
#[derive(Debug, Default)]
struct DropLog {
    /// When the last line was logged.
    logged: Option<tokio::time::Instant>,
    /// Dropped since then, not yet logged.
    unlogged: u64,
}

impl DropLog {
    /// One more event dropped at `now`: `Some(count)` when a line is due (the first drop, or the first
    /// after [`DROP_LOG_EVERY`]), with how many were dropped since the last line, this one included.
    fn dropped(&mut self, now: tokio::time::Instant) -> Option<u64> {
        self.unlogged += 1;
        let due = self
            .logged
            .is_none_or(|last| now.duration_since(last) >= DROP_LOG_EVERY);
        if !due {
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
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
        // Watched: one event's write, awaited by no one: a panic in it (a bug) is caught, said, and the
        // event counted as given up on (`write_caught`).
        tokio::spawn(async move {
            let what = (pending.event.reason.as_str(), pending.object());
            write_caught(deliver(&inner, &pending), &inner.undelivered, what).await;
            drop(slot);
        });
    }
}

/// Runs one event's write, `delivering`, and counts the event off `undelivered` whatever happens: a
/// panic in it (a bug) is caught and said (with the event's reason and object, `what`), so that the
/// delivery goes on and `flush` does not wait for the event.
async fn write_caught(
    delivering: impl Future<Output = ()>,
    undelivered: &tokio::sync::watch::Sender<usize>,
    (reason, object): (&str, Option<&str>),
) {
    let delivering = std::panic::AssertUnwindSafe(delivering);
    if let Err(panic) = futures::FutureExt::catch_unwind(delivering).await {
        let message = cloud_provider::panic_message(panic.as_ref());
        tracing::error!(reason, object = ?object, "delivering an event panicked (a bug): {message}");
    }
    undelivered.send_modify(|n| *n -= 1);
}

/// Writes one event, retrying what may succeed later (no answer, 5xx, 429, or a write the leader's
/// fence held back) and giving up on a refusal.
async fn deliver(inner: &Delivery, pending: &Pending) {
    let mut delay = FIRST_RETRY;
    for attempt in 1..=TRIES {
        let write = async {
            match &pending.reference {
                Some(reference) if !too_long(reference) => {
                    inner.recorder.publish(&pending.event, reference).await
                }
                _ => create_unaggregated(inner, pending).await,
            }
        };
        let err = match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => return,
            Ok(Err(err)) => DeliveryError::Api(err),
            Err(_) => DeliveryError::TimedOut,
        };
        if !err.retryable() || attempt == TRIES {
            tracing::warn!(reason = pending.event.reason, object = ?pending.object(), attempt, error = %err, "could not record an event");
            return;
        }
        tracing::debug!(reason = pending.event.reason, object = ?pending.object(), attempt, error = %err, "recording an event failed; retrying");
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
            Self::Api(err) => crate::outage_retry::api_unavailable(err),
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

/// The event the recorder would write, without series aggregation (such events are rare): about an
/// object whose name is too long, named `<name cut to fit>.<hex time>`; about no object, named
/// `<controller>.<hex time>` in [`UNATTACHED_NAMESPACE`].
async fn create_unaggregated(inner: &Delivery, pending: &Pending) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let (namespace, prefix) = match &pending.reference {
        Some(reference) => (
            reference.namespace.as_deref().unwrap_or("default"),
            cut_name(reference.name.as_deref().unwrap_or_default()).to_owned(),
        ),
        None => (
            UNATTACHED_NAMESPACE,
            name_prefix(&inner.reporter.controller),
        ),
    };
    let event = KubeEvent {
        action: Some(pending.event.action.clone()),
        reason: Some(pending.event.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: pending.reference.clone(),
        note: pending.event.note.clone(),
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(format!("{prefix}.{:x}", now.as_nanosecond())),
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
    Api::<KubeEvent>::namespaced(inner.client.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(drop)
}

/// A controller's name as the start of an event name (a DNS subdomain: lower case, digits, `-`, `.`):
/// `cidrAllocator` → `cidrallocator`.
fn name_prefix(controller: &str) -> String {
    let prefix: String = controller
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let prefix = cut_name(&prefix).trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        "event".to_owned()
    } else {
        prefix.to_owned()
    }
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

    /// An event's write that panics (a bug) is caught: the event is counted off, so `flush` does not
    /// wait for it, and the delivery goes on.
    #[tokio::test]
    async fn a_write_that_panics_is_counted_off_and_the_delivery_goes_on() {
        let undelivered = tokio::sync::watch::Sender::new(1);
        let panicking = futures::FutureExt::map(std::future::ready(()), |()| -> () {
            panic!("a bug in the write")
        });
        write_caught(panicking, &undelivered, ("Reason", Some("object"))).await;
        assert_eq!(*undelivered.borrow(), 0);
    }

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

    /// The cut note's kept start and the number its marker carries.
    fn parts(cut: &str) -> (&str, usize) {
        let (kept, marker) = cut.rsplit_once("… (cut: ").expect("a cut marker");
        let bytes = marker
            .strip_suffix(" more bytes)")
            .expect("the marker's end");
        (kept, bytes.parse().unwrap())
    }

    #[test]
    fn notes_within_the_limit_are_kept_whole() {
        for note in [
            String::new(),
            "Node n status is now: CIDRNotAvailable".to_owned(),
            "a".repeat(NOTE_LIMIT),
            // Exactly at the limit in bytes with multi-byte characters (341 × 3 + 1 = 1024).
            format!("{}a", "€".repeat(341)),
        ] {
            assert_eq!(fit_note(note.clone()), note);
        }
    }

    #[test]
    fn long_notes_are_cut_to_the_limit_keeping_the_start_and_saying_how_much() {
        // (note, bytes kept, bytes the marker says were cut)
        let cases: Vec<(String, usize, usize)> = vec![
            // One byte over: the marker ("… (cut: 25 more bytes)", 24 bytes) takes its own room.
            ("a".repeat(NOTE_LIMIT + 1), 1000, 25),
            ("a".repeat(10_000), 998, 9002),
            ("x".repeat(100_000), 997, 99_003),
        ];
        for (note, kept, said) in cases {
            let cut = fit_note(note.clone());
            assert_eq!(cut.len(), NOTE_LIMIT, "ASCII fills the limit exactly");
            let (start, bytes) = parts(&cut);
            assert_eq!((start.len(), bytes), (kept, said));
            assert_eq!(
                start.len() + bytes,
                note.len(),
                "the marker counts what is missing"
            );
            assert!(note.starts_with(start));
        }
    }

    #[test]
    fn a_multi_byte_character_at_the_boundary_is_left_out_whole() {
        for (width, ch) in [(2, 'é'), (3, '€'), (4, '🦀')] {
            for shift in 0..width {
                // The note's characters straddle the cut point at every offset.
                let note = format!("{}{}", "a".repeat(shift), ch.to_string().repeat(5000));
                let cut = fit_note(note.clone());
                assert!(cut.len() <= NOTE_LIMIT, "{width}/{shift}: {}", cut.len());
                assert!(
                    cut.len() > NOTE_LIMIT - width,
                    "{width}/{shift}: wasted room"
                );
                let (start, bytes) = parts(&cut);
                assert!(note.starts_with(start));
                assert!(start.ends_with(ch));
                assert_eq!(start.len() + bytes, note.len());
            }
        }
        // A 10,000-character annotation value as an attacker would write it.
        let note = format!("invalid annotation {:?}", "ß".repeat(10_000));
        let cut = fit_note(note.clone());
        assert!(cut.len() <= NOTE_LIMIT);
        assert!(cut.starts_with("invalid annotation \"ßß"));
    }

    #[test]
    fn queue_full_lines_come_at_most_once_per_period_with_the_count() {
        let start = tokio::time::Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut log = DropLog::default();
        // (time in ms, the line's count if one is due)
        let table = [
            (0, Some(1)),
            (1, None),
            (5_000, None),
            (9_999, None),
            // The drops at 1, 5,000, 9,999 and 10,000 ms.
            (10_000, Some(4)),
            (10_001, None),
            (60_000, Some(2)),
        ];
        for (ms, want) in table {
            assert_eq!(log.dropped(at(ms)), want, "at {ms} ms");
        }
    }

    #[test]
    fn events_about_no_object_get_a_valid_name() {
        assert_eq!(name_prefix("cidrAllocator"), "cidrallocator");
        assert_eq!(
            name_prefix("cloud-node-controller"),
            "cloud-node-controller"
        );
        assert_eq!(name_prefix("_x_"), "x");
        assert_eq!(name_prefix("__"), "event");
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
