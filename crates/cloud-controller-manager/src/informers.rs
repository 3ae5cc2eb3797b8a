//! Shared caches: one watch per resource for every controller that needs it (upstream's shared informer
//! factory). Started after all controllers subscribed, as upstream starts informers after constructing
//! the controllers.
//!
//! The fan-out to subscribers is ours rather than kube-runtime's `store_shared`/`subscribe` (unstable in
//! kube 5): its subscriber stream can stall when an object is deleted before the subscriber reads it
//! (it returns `Pending` without a waker), it reports no deletions, and its `Store::wait_until_ready`
//! wakes only the last of several concurrent waiters. A bounded channel per subscriber and a watch flag
//! avoid all three.
//!
//! A failed watch is retried 0.8–1.6 s after the failure, doubling to at most [`WATCH_RETRY_MAX`] (5 s),
//! where client-go's reflector and kube-runtime's default back-off go to 30 s: after an API server
//! restart, every cache then reconnects within 5 s of the server's return instead of up to 30 s (the
//! fault tests measured up to 48 s of recovery at 500 nodes with the default). One list request per
//! resource every 5 s during an outage is no load for an API server.

use std::{
    fmt::Debug,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store, store::Writer},
        utils::ResetTimerBackoff,
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

pub use crate::cached_node::CachedNode;

/// How many changes a slow subscriber may lag behind before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// A change a subscriber sees.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// The object was added or changed (after the first full list: every object once).
    Applied(Arc<K>),
    /// The object was deleted (its last state).
    Deleted(Arc<K>),
}

/// A shared cache of one resource, with change subscriptions.
pub struct SharedInformer<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    writer: Mutex<Option<Writer<K>>>,
    subscribers: Mutex<Vec<mpsc::Sender<Change<K>>>>,
    used: AtomicBool,
    synced: watch::Sender<bool>,
    prune: fn(&mut K),
}

/// The shared Node cache: slim Nodes, decoded without their images and managed fields
/// ([`CachedNode`]).
pub type SharedNodes = SharedInformer<CachedNode>;
/// The shared Service cache.
pub type SharedServices = SharedInformer<Service>;

/// Nothing to drop: a [`CachedNode`] is decoded without what no controller reads.
fn keep_node(_: &mut CachedNode) {}

/// Drops managed fields from cached Services.
pub fn prune_service(service: &mut Service) {
    service.metadata.managed_fields = None;
}

impl Default for SharedNodes {
    fn default() -> Self {
        Self::new(keep_node)
    }
}

impl Default for SharedServices {
    fn default() -> Self {
        Self::new(prune_service)
    }
}

impl<K> SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A cache that is not watching yet; `prune` trims each object before it is cached.
    pub fn new(prune: fn(&mut K)) -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            subscribers: Mutex::default(),
            used: AtomicBool::new(false),
            synced: watch::Sender::new(false),
            prune,
        }
    }

    /// The cache (empty until synced; see [`SharedInformer::wait_until_synced`]).
    pub fn store(&self) -> Store<K> {
        self.used.store(true, Ordering::Relaxed);
        self.store.clone()
    }

    /// Every change, as the cache holds it. Subscribe before [`SharedInformer::start`].
    pub fn subscribe_changes(&self) -> impl Stream<Item = Change<K>> + Send + 'static {
        self.used.store(true, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|change| (change, rx))
        })
    }

    /// Every object that is added or changed (deletions left out), e.g. as a controller's trigger.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribe_changes().filter_map(|change| {
            std::future::ready(match change {
                Change::Applied(object) => Some(object),
                Change::Deleted(_) => None,
            })
        })
    }

    /// Waits until the cache holds the first full list.
    pub async fn wait_until_synced(&self) {
        let mut synced = self.synced.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = synced.wait_for(|synced| *synced).await;
    }

    /// Starts the watch if any controller uses the cache; it stops when `shutdown` is cancelled.
    pub fn start(&self, client: Client, shutdown: CancellationToken) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let subscribers =
            std::mem::take(&mut *self.subscribers.lock().unwrap_or_else(|e| e.into_inner()));
        let synced = self.synced.clone();
        let store = self.store.clone();
        let kind = K::kind(&()).into_owned();
        let mut tracker = ChangeTracker::default();
        let events = watcher(Api::<K>::all(client), watcher::Config::default())
            .backoff(watch_backoff())
            .modify(self.prune)
            .reflect(writer)
            .for_each(move |event| {
                let subscribers = subscribers.clone();
                let changes: Vec<Change<K>> = match event {
                    Ok(event) => {
                        if matches!(event, watcher::Event::InitDone) {
                            synced.send_replace(true);
                        }
                        tracker.changes(&event, &store)
                    }
                    Err(err) => {
                        tracing::warn!(kind = %kind, error = %err, "watch failed; retrying");
                        Vec::new()
                    }
                };
                async move {
                    for change in changes {
                        for subscriber in &subscribers {
                            // A subscriber that stopped (its controller ended) just misses out.
                            let _ = subscriber.send(change.clone()).await;
                        }
                    }
                }
            });
        tokio::spawn(async move {
            tokio::select! {
                () = events => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

/// The longest wait before a failed watch is retried.
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);
const WATCH_RETRY_FIRST: Duration = Duration::from_millis(800);

/// The watch's retry delays: kube-runtime's exponential back-off (800 ms doubling) with at most
/// [`WATCH_RETRY_MAX`] between tries, back to the start after 2 minutes without a failure, as its
/// default is. backon's jitter adds up to the delay itself, so the delay is capped at half the maximum.
fn watch_backoff() -> ResetTimerBackoff<watcher::ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(WATCH_RETRY_FIRST)
        .with_max_delay(WATCH_RETRY_MAX / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), Duration::from_secs(120))
}

/// Turns watch events (already applied to the cache) into changes. A re-list (after a watch expired)
/// replaces the cache at its end; an object that was deleted meanwhile is in the old cache but not the
/// new one (or has another UID there), and is reported as deleted: the watch itself never says so
/// (upstream's informers report it as `DeletedFinalStateUnknown`).
struct ChangeTracker<K> {
    before_relist: Option<Vec<Arc<K>>>,
}

impl<K> Default for ChangeTracker<K> {
    fn default() -> Self {
        Self {
            before_relist: None,
        }
    }
}

impl<K> ChangeTracker<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn changes(&mut self, event: &watcher::Event<K>, store: &Store<K>) -> Vec<Change<K>> {
        match event {
            // The cache's own copy, shared rather than cloned: a burst of changes queued for the
            // subscribers then costs no memory of its own.
            watcher::Event::Apply(object) => vec![Change::Applied(
                store
                    .get(&ObjectRef::from_obj(object))
                    .unwrap_or_else(|| Arc::new(object.clone())),
            )],
            watcher::Event::Delete(object) => vec![Change::Deleted(Arc::new(object.clone()))],
            // The cache still holds what it held before the list.
            watcher::Event::Init => {
                self.before_relist = Some(store.state());
                Vec::new()
            }
            watcher::Event::InitApply(_) => Vec::new(),
            watcher::Event::InitDone => {
                let mut changes: Vec<Change<K>> = self
                    .before_relist
                    .take()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|old| {
                        store
                            .get(&ObjectRef::from_obj(old.as_ref()))
                            .is_none_or(|new| new.meta().uid != old.meta().uid)
                    })
                    .map(Change::Deleted)
                    .collect();
                changes.extend(store.state().into_iter().map(Change::Applied));
                changes
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::ObjectMeta;

    use super::*;

    fn node(name: &str, uid: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn summary(changes: &[Change<Node>]) -> Vec<String> {
        let mut lines: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Applied(n) => format!("applied {}", n.metadata.uid.as_deref().unwrap()),
                Change::Deleted(n) => format!("deleted {}", n.metadata.uid.as_deref().unwrap()),
            })
            .collect();
        lines.sort();
        lines
    }

    /// Feeds `event` through the cache, as `.reflect(writer)` does, then through the tracker.
    fn feed(
        writer: &mut Writer<Node>,
        store: &Store<Node>,
        tracker: &mut ChangeTracker<Node>,
        event: watcher::Event<Node>,
    ) -> Vec<Change<Node>> {
        writer.apply_watcher_event(&event);
        tracker.changes(&event, store)
    }

    #[test]
    fn failed_watches_are_retried_within_5_s() {
        let delays: Vec<Duration> = watch_backoff().take(12).collect();
        assert!(delays[0] >= WATCH_RETRY_FIRST, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= WATCH_RETRY_MAX), "{delays:?}");
        assert!(
            delays[4..].iter().all(|d| *d >= WATCH_RETRY_MAX / 2),
            "{delays:?}"
        );
    }

    #[test]
    fn a_relist_reports_objects_deleted_while_the_watch_was_down() {
        let (store, mut writer) = reflector::store();
        let mut tracker = ChangeTracker::default();
        let mut all = Vec::new();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(node("a", "a1")),
            watcher::Event::InitApply(node("b", "b1")),
            watcher::Event::InitApply(node("c", "c1")),
            watcher::Event::InitDone,
        ] {
            all.extend(feed(&mut writer, &store, &mut tracker, event));
        }
        assert_eq!(summary(&all), ["applied a1", "applied b1", "applied c1"]);

        // The watch expired; meanwhile b was deleted and c re-created under the same name.
        let mut relisted = Vec::new();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(node("a", "a1")),
            watcher::Event::InitApply(node("c", "c2")),
            watcher::Event::InitDone,
        ] {
            relisted.extend(feed(&mut writer, &store, &mut tracker, event));
        }
        assert_eq!(
            summary(&relisted),
            ["applied a1", "applied c2", "deleted b1", "deleted c1"]
        );
        assert_eq!(
            summary(&feed(
                &mut writer,
                &store,
                &mut tracker,
                watcher::Event::Delete(node("a", "a1"))
            )),
            ["deleted a1"]
        );
    }
}
