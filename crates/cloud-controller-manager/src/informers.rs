//! Shared caches: one watch per resource for every controller that needs it (upstream's shared informer
//! factory). Started after all controllers subscribed, as upstream starts informers after constructing
//! the controllers.
//!
//! The fan-out to subscribers is ours rather than kube-runtime's `store_shared`/`subscribe` (unstable in
//! kube 5): its subscriber stream can stall when an object is deleted before the subscriber reads it
//! (it returns `Pending` without a waker), it reports no deletions, and its `Store::wait_until_ready`
//! wakes only the last of several concurrent waiters. A bounded channel per subscriber and a watch flag
//! avoid all three.

use std::{
    fmt::Debug,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, store::Writer},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

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

/// The shared Node cache.
pub type SharedNodes = SharedInformer<Node>;
/// The shared Service cache.
pub type SharedServices = SharedInformer<Service>;

/// Drops what no controller reads from cached Nodes: managed fields and the container image list (the
/// largest part of a kubelet's Node). The controllers only ever patch, never write a cached object back,
/// so a pruned cache cannot lose data.
pub fn prune_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
    }
}

/// Drops managed fields from cached Services.
pub fn prune_service(service: &mut Service) {
    service.metadata.managed_fields = None;
}

impl Default for SharedNodes {
    fn default() -> Self {
        Self::new(prune_node)
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
        let events = watcher(Api::<K>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(self.prune)
            .reflect(writer)
            .for_each(move |event| {
                let subscribers = subscribers.clone();
                let changes: Vec<Change<K>> = match event {
                    Ok(watcher::Event::Apply(object)) => vec![Change::Applied(Arc::new(object))],
                    Ok(watcher::Event::Delete(object)) => vec![Change::Deleted(Arc::new(object))],
                    Ok(watcher::Event::InitDone) => {
                        synced.send_replace(true);
                        store.state().into_iter().map(Change::Applied).collect()
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Vec::new(),
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerImage, NodeStatus};
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn pruning_drops_only_what_no_controller_reads() {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                managed_fields: Some(vec![Default::default()]),
                ..Default::default()
            },
            status: Some(NodeStatus {
                images: Some(vec![ContainerImage::default()]),
                addresses: Some(vec![Default::default()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        prune_node(&mut node);
        assert!(node.metadata.managed_fields.is_none());
        let status = node.status.unwrap();
        assert!(status.images.is_none());
        assert_eq!(status.addresses.unwrap().len(), 1);
    }
}
