//! Shared caches: one watch per resource for every controller that needs it (upstream's shared informer
//! factory). Started after all controllers subscribed, as upstream starts informers after constructing
//! the controllers.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        reflector::{self, ReflectHandle, Store, store::Writer},
        watcher,
    },
};
use tokio_util::sync::CancellationToken;

/// How many events a slow subscriber may lag behind before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The shared Node cache.
pub struct SharedNodes {
    store: Store<Node>,
    writer: Mutex<Option<Writer<Node>>>,
    used: AtomicBool,
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
        let (store, writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            used: AtomicBool::new(false),
        }
    }

    /// The cache (empty until the watch has listed; see `Store::wait_until_ready`).
    pub fn store(&self) -> Store<Node> {
        self.used.store(true, Ordering::Relaxed);
        self.store.clone()
    }

    /// A stream of changed Nodes for a controller; `None` once the watch has started.
    pub fn subscribe(&self) -> Option<ReflectHandle<Node>> {
        self.used.store(true, Ordering::Relaxed);
        self.writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()?
            .subscribe()
    }

    /// Starts the watch if any controller uses the cache; it stops when `shutdown` is cancelled.
    pub fn start(&self, client: Client, shutdown: CancellationToken) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let events = watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(prune_node)
            .reflect_shared(writer)
            .for_each(|event| {
                if let Err(err) = event {
                    tracing::warn!(error = %err, "node watch failed; retrying");
                }
                std::future::ready(())
            });
        tokio::spawn(async move {
            tokio::select! {
                () = events => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}
