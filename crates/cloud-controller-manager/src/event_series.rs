//! Repeats of an event about an object become one Event with a series (events.k8s.io/v1): the first is
//! created, each repeat within [`SERIES_WINDOW`] of the last patches its `series` (count and last
//! observed time). The same key, names, fields and window as kube-runtime's `Recorder`, which this
//! replaces.
//!
//! Why our own: kube-runtime 5.0's `Recorder::publish` sweeps its whole cache for expired entries on
//! every event, under one lock that every delivery waits on. With an event per node that is a walk of
//! every node's entry per event: quadratic in the nodes of a burst. Initializing 25,000 nodes spent 29 %
//! of the manager's CPU in that sweep (`bench/results/2026-11-27-event-series.md`).
//! Here an entry found expired is treated as absent, and the sweep that frees expired entries runs at
//! most once per [`SWEEP_EVERY`]: constant work per event, and entries outlive the window by at most
//! that long. The cache keeps what a repeat needs (the Event's name and count), not the whole Event.

use std::collections::HashMap;

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event as KubeEvent, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType, Reporter},
};
use parking_lot::Mutex;

/// Repeats this close to the last one join its series (kube-runtime's and client-go's 6 minutes).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// How often expired entries are freed at most.
const SWEEP_EVERY: SignedDuration = SignedDuration::from_mins(1);

/// What makes two events repeats of one another: kube-runtime's `EventKey` (the reporter is the
/// recorder's own, so it is left out; the note is not part of it there either, so a repeat keeps the
/// first event's note).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    type_: EventType,
    action: String,
    reason: String,
    regarding: ObjectIdentity,
    related: Option<ObjectIdentity>,
}

/// The fields of an object reference that name the object (kube-runtime's `Reference` hash).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectIdentity {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for ObjectIdentity {
    fn from(reference: &ObjectReference) -> Self {
        Self {
            api_version: reference.api_version.clone(),
            kind: reference.kind.clone(),
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            uid: reference.uid.clone(),
        }
    }
}

/// The Event a series was written to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    name: String,
    count: i32,
    last_observed: Timestamp,
}

/// The write an event needs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Write {
    /// A new Event.
    Create,
    /// A repeat: the series of Event `name`, now `count` strong.
    Repeat { name: String, count: i32 },
}

/// The series written in the last [`SERIES_WINDOW`] (and expired ones not swept yet).
#[derive(Debug)]
struct SeriesCache {
    written: HashMap<SeriesKey, Written>,
    next_sweep: Timestamp,
}

impl SeriesCache {
    fn new(now: Timestamp) -> Self {
        Self {
            written: HashMap::new(),
            next_sweep: now + SWEEP_EVERY,
        }
    }

    /// What an event with `key` at `now` needs written.
    fn write_for(&mut self, key: &SeriesKey, now: Timestamp) -> Write {
        if now >= self.next_sweep {
            self.written
                .retain(|_, written| written.last_observed + SERIES_WINDOW > now);
            self.next_sweep = now + SWEEP_EVERY;
        }
        match self.written.get(key) {
            Some(written) if written.last_observed + SERIES_WINDOW > now => Write::Repeat {
                name: written.name.clone(),
                count: written.count + 1,
            },
            _ => Write::Create,
        }
    }

    /// Event `name` now holds `count` occurrences of `key`, the last at `now`.
    fn written(&mut self, key: SeriesKey, name: String, count: i32, now: Timestamp) {
        self.written.insert(
            key,
            Written {
                name,
                count,
                last_observed: now,
            },
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.written.len()
    }
}

/// Writes events as one reporter, repeats as series.
pub struct SeriesRecorder {
    client: Client,
    reporter: Reporter,
    cache: Mutex<SeriesCache>,
}

impl SeriesRecorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            cache: Mutex::new(SeriesCache::new(Timestamp::now())),
        }
    }

    /// Writes `event` about `regarding` (in its namespace; `default` for a cluster-scoped object): a new
    /// Event, or a patch of the series it repeats (a new Event if the series' Event is gone). A failed
    /// write leaves the series as it was.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = SeriesKey {
            type_: event.type_,
            action: event.action.clone(),
            reason: event.reason.clone(),
            regarding: regarding.into(),
            related: event.secondary.as_ref().map(ObjectIdentity::from),
        };
        let write = self.cache.lock().write_for(&key, now);
        let events: Api<KubeEvent> = Api::namespaced(
            self.client.clone(),
            regarding.namespace.as_deref().unwrap_or("default"),
        );
        let (name, count) = match write {
            Write::Create => self.create(&events, event, regarding, now).await?,
            Write::Repeat { name, count } => {
                let series = KubeEvent {
                    series: Some(EventSeries {
                        count,
                        last_observed_time: MicroTime(now),
                    }),
                    ..Default::default()
                };
                match events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                    .await
                {
                    Ok(_) => (name, count),
                    // The series' Event is gone (deleted by someone, or expired from the store): the
                    // repeat starts a new series rather than being lost.
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        self.create(&events, event, regarding, now).await?
                    }
                    Err(err) => return Err(err),
                }
            }
        };
        self.cache.lock().written(key, name, count, now);
        Ok(())
    }

    /// Creates the first Event of a series: its name, and the count 1.
    async fn create(
        &self,
        events: &Api<KubeEvent>,
        event: &Event,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> Result<(String, i32), kube::Error> {
        let created = self.new_event(event, regarding, now);
        let name = created.metadata.name.clone().unwrap_or_default();
        events.create(&PostParams::default(), &created).await?;
        Ok((name, 1))
    }

    /// The first Event of a series, as kube-runtime's `Recorder` writes it: named
    /// `<object name>.<hex nanoseconds>`.
    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> KubeEvent {
        KubeEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding
                        .name
                        .as_deref()
                        .unwrap_or(&self.reporter.controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, reason: &str) -> SeriesKey {
        SeriesKey {
            type_: EventType::Normal,
            action: "Sync".into(),
            reason: reason.into(),
            regarding: ObjectIdentity {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                namespace: None,
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
            },
            related: None,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn repeats_within_the_window_join_the_series_and_later_ones_start_a_new_one() {
        let mut cache = SeriesCache::new(at(0));
        let a = key("a", "Synced");
        // (seconds, event, what it needs, the Event it then lives in)
        let table: [(i64, &SeriesKey, Write, &str); 6] = [
            (0, &a, Write::Create, "a.1"),
            (
                10,
                &a,
                Write::Repeat {
                    name: "a.1".into(),
                    count: 2,
                },
                "a.1",
            ),
            (
                369,
                &a,
                Write::Repeat {
                    name: "a.1".into(),
                    count: 3,
                },
                "a.1",
            ),
            // Six minutes after the last repeat: a new series.
            (729, &a, Write::Create, "a.2"),
            (
                730,
                &a,
                Write::Repeat {
                    name: "a.2".into(),
                    count: 2,
                },
                "a.2",
            ),
            // Another reason about the same object is another series.
            (731, &key("a", "Other"), Write::Create, "a.3"),
        ];
        for (seconds, event, want, name) in table {
            let got = cache.write_for(event, at(seconds));
            assert_eq!(got, want, "at {seconds} s");
            let count = match got {
                Write::Create => 1,
                Write::Repeat { count, .. } => count,
            };
            cache.written(event.clone(), name.into(), count, at(seconds));
        }
    }

    #[test]
    fn a_failed_write_leaves_the_series_as_it_was() {
        let mut cache = SeriesCache::new(at(0));
        let a = key("a", "Synced");
        assert_eq!(cache.write_for(&a, at(0)), Write::Create);
        cache.written(a.clone(), "a.1".into(), 1, at(0));
        // The repeat's patch fails: nothing is recorded, and the next repeat asks for the same count.
        for second in [1, 2] {
            assert_eq!(
                cache.write_for(&a, at(second)),
                Write::Repeat {
                    name: "a.1".into(),
                    count: 2
                }
            );
        }
    }

    #[test]
    fn expired_entries_are_freed_at_most_once_a_minute_and_never_reused() {
        let mut cache = SeriesCache::new(at(0));
        for i in 0..1000 {
            let k = key(&format!("n{i}"), "Synced");
            assert_eq!(cache.write_for(&k, at(0)), Write::Create);
            cache.written(k, format!("n{i}.1"), 1, at(0));
        }
        // Within the window nothing is freed, however many events come.
        let fresh = key("fresh", "Synced");
        for second in [30, 61, 200, 359] {
            cache.write_for(&fresh, at(second));
        }
        assert_eq!(cache.len(), 1000);
        // Past the window: an expired entry is not reused even before the sweep frees it...
        assert_eq!(
            cache.write_for(&key("n1", "Synced"), at(361)),
            Write::Create
        );
        assert_eq!(cache.len(), 1000, "the last sweep was at 359 s");
        // ...and the next sweep frees them all.
        cache.write_for(&fresh, at(420));
        assert_eq!(cache.len(), 0);
    }
}
