//! Shared caches: one watch per resource for every controller that needs it (upstream's shared informer
//! factory). Started after all controllers subscribed, as upstream starts informers after constructing
//! the controllers.
//!
//! The fan-out to subscribers is ours rather than kube-runtime's `store_shared`/`subscribe` (unstable in
//! kube 5): its subscriber stream can stall when an object is deleted before the subscriber reads it
//! (it returns `Pending` without a waker), and its `Store::wait_until_ready` wakes only the last of
//! several concurrent waiters. A bounded channel per subscriber and a watch flag avoid both.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, store::Writer},
        watcher,
    },
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How many changed objects a slow subscriber may lag behind before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The shared Node cache.
pub struct SharedNodes {
    store: Store<Node>,
    writer: Mutex<Option<Writer<Node>>>,
    subscribers: Mutex<Vec<mpsc::Sender<Arc<Node>>>>,
    used: AtomicBool,
    synced: watch::Sender<bool>,
}

impl Default for SharedNodes {
    fn default() -> Self {
        Self::new()
    }
}

/// Drops what no controller reads from cached Nodes: managed fields and the container image list (the
/// largest part of a kubelet's Node). The controllers only ever patch, never write a cached object back,
/// so a pruned cache cannot lose data.
pub fn prune_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
    }
}

impl SharedNodes {
    /// A cache that is not watching yet.
    pub fn new() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            subscribers: Mutex::default(),
            used: AtomicBool::new(false),
            synced: watch::Sender::new(false),
        }
    }

    /// The cache (empty until synced; see [`SharedNodes::wait_until_synced`]).
    pub fn store(&self) -> Store<Node> {
        self.used.store(true, Ordering::Relaxed);
        self.store.clone()
    }

    /// Every Node that is added or changed, as the cache holds it (after the first full list, every
    /// Node once). Subscribe before [`SharedNodes::start`].
    pub fn subscribe(&self) -> impl Stream<Item = Arc<Node>> + Send + 'static {
        self.used.store(true, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|node| (node, rx))
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
        let events = watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(prune_node)
            .reflect(writer)
            .for_each(move |event| {
                let subscribers = subscribers.clone();
                let changed: Vec<Arc<Node>> = match event {
                    Ok(watcher::Event::Apply(node)) => vec![Arc::new(node)],
                    Ok(watcher::Event::InitDone) => {
                        synced.send_replace(true);
                        store.state()
                    }
                    Ok(_) => Vec::new(),
                    Err(err) => {
                        tracing::warn!(error = %err, "node watch failed; retrying");
                        Vec::new()
                    }
                };
                async move {
                    for node in changed {
                        for subscriber in &subscribers {
                            // A subscriber that stopped (its controller ended) just misses out.
                            let _ = subscriber.send(node.clone()).await;
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
