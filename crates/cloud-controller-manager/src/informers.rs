//! Shared caches: one watch per resource for every controller that needs it, with client-go's
//! shared informer factory's contract.
//!
//! - **Asked for, then started.** A controller asks the [`InformerFactory`] for each cache it reads
//!   ([`InformerFactory::nodes`], [`InformerFactory::services`]) in its start function, before it
//!   returns its task (client-go's `InformerFor`). Once every enabled controller has started, the
//!   manager starts every cache that was asked for, each with one list and watch (client-go's
//!   `factory.Start`), and none that was not. A cache first asked for later, from a running task,
//!   starts at once. Reading a cache ([`SharedInformer::store`], [`SharedInformer::subscribe`]) never
//!   decides whether it runs.
//! - **Waited for.** A controller waits for the caches it reads with [`wait_for_cache_sync`]
//!   (client-go's `cache.WaitForCacheSync`), which also returns on shutdown.
//! - **Subscribed to at any time.** A subscriber gets every change after it subscribed, and first
//!   every object the cache holds then (client-go's `AddEventHandler` replays the cache the same way):
//!   one that subscribes before the cache starts gets the first full list as changes.
//!
//! The fan-out to subscribers is ours rather than kube-runtime's `store_shared`/`subscribe` (unstable in
//! kube 5): its subscriber stream can stall when an object is deleted before the subscriber reads it
//! (it returns `Pending` without a waker), it reports no deletions, and its `Store::wait_until_ready`
//! wakes only the last of several concurrent waiters. A bounded channel per subscriber and a watch flag
//! avoid all three.
//!
//! - **Paged first lists, or streamed.** A cache fetches its first full list in pages of 500, then
//!   watches from the list's resource version. With `KUBE_FEATURE_WatchListClient=true` in the
//!   manager's environment (client-go's gate, which an out-of-tree manager reads from there, not from
//!   `--feature-gates`) it streams the list instead (a watch with `sendInitialEvents`, KEP-3157), as
//!   client-go's reflectors do by default since 1.35: the API server sends the objects from its watch
//!   cache one by one instead of building list responses. In JSON the API server encodes each streamed
//!   object on its own and pays 2.3x what a paged list of the same 10,000 nodes costs it; in protobuf
//!   a paged list still costs it 0.77x a streamed one (`bench/results/read-costs-2026-12-01.md`), and
//!   in 1.37 a paged list is served from the watch cache's snapshot (`ListFromCacheSnapshot`), so paging
//!   no longer costs it the memory streaming lists were made to save. Hence the gate's default here. An API server that does
//!   not serve streaming lists (the `WatchList` feature gate off, or older than 1.27: either answers the
//!   request 400 or 422) gets a paged list and a watch instead, from then on, as client-go falls back.
//!
//! - **In protobuf.** The caches list and watch in protobuf (`--kube-api-content-type`, upstream's
//!   default; `crate::protobuf`), which costs the API server half or less of JSON for the same
//!   reads; with `application/json` they read JSON through kube's watcher.
//!
//! A failed watch is retried 0.8–1.6 s after the failure, doubling to at most [`WATCH_RETRY_MAX`] (5 s),
//! where client-go's reflector and kube-runtime's default back-off go to 30 s: after an API server
//! restart, every cache then reconnects within 5 s of the server's return instead of up to 30 s (the
//! fault tests measured up to 48 s of recovery at 500 nodes with the default). One list request per
//! resource every 5 s during an outage is no load for an API server.

use parking_lot::{Mutex, MutexGuard};
use std::{fmt::Debug, sync::Arc};

use cloud_provider::{Supervisor, supervise::Ends};
use futures::{Stream, StreamExt, stream::BoxStream};
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
use crate::protobuf::{self, KubeApiContentType};

/// How many changes a slow subscriber may lag behind before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock()
}

/// A change a subscriber sees.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// The object was added or changed (and, at subscription, every object the cache held then).
    Applied(Arc<K>),
    /// The object was deleted (its last state).
    Deleted(Arc<K>),
}

/// The shared Node cache: slim Nodes, decoded without their images and managed fields
/// ([`CachedNode`]).
pub type SharedNodes = SharedInformer<CachedNode>;
/// The shared Service cache.
pub type SharedServices = SharedInformer<Service>;

/// Nothing to drop: a [`CachedNode`] is decoded without what no controller reads.
fn keep_node(_: &mut CachedNode) {}

/// Drops managed fields from cached Services.
pub(crate) fn prune_service(service: &mut Service) {
    service.metadata.managed_fields = None;
}

/// How a cache fetches its first full list (and a new one after its watch expired).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum InitialList {
    /// A streaming list (`sendInitialEvents`), falling back to [`InitialList::ListThenWatch`] for good
    /// when the API server refuses it: client-go's default since 1.35
    /// (`KUBE_FEATURE_WatchListClient=true`).
    Streaming,
    /// A paged list, then a watch from its resource version: this manager's default.
    #[default]
    ListThenWatch,
}

/// The manager's shared caches (upstream's shared informer factory): every controller's
/// [`ControllerContext`](crate::controllers::ControllerContext) holds the same one.
///
/// Ask for the caches a controller reads in its start function, before it returns its task: the
/// manager starts every cache asked for once all controllers have started, so each resource is listed
/// and watched once, for all of them. A cache asked for later (from inside a running task) starts at
/// once. A controller waits for its caches with [`wait_for_cache_sync`].
///
/// ```
/// use cloud_controller_manager::{
///     controllers::{ControllerContext, ControllerTask},
///     informers::wait_for_cache_sync,
/// };
///
/// fn start(ctx: ControllerContext, _: ()) -> Option<ControllerTask> {
///     // Asked for now, so the manager starts it with the others.
///     let nodes = ctx.informers.nodes();
///     Some(Box::pin(async move {
///         if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
///             return Ok(()); // shut down first
///         }
///         for node in nodes.store().state() {
///             let _ = node.metadata.name.as_deref();
///         }
///         Ok(())
///     }))
/// }
/// ```
#[derive(Clone)]
pub struct InformerFactory {
    state: Arc<Mutex<FactoryState>>,
}

#[derive(Default)]
struct FactoryState {
    nodes: Option<Arc<SharedNodes>>,
    services: Option<Arc<SharedServices>>,
    /// Set by [`InformerFactory::start`]: what a cache asked for from then on starts with.
    started: Option<Start>,
}

/// What every cache starts with.
#[derive(Clone)]
struct Start {
    client: Client,
    /// Runs each cache's watch, which stops with its shutdown.
    supervisor: Supervisor,
    initial_list: InitialList,
    /// How the caches that can read protobuf read (`--kube-api-content-type`).
    content_type: KubeApiContentType,
}

impl InformerFactory {
    /// A factory with no cache asked for and none started.
    pub(crate) fn new() -> Self {
        Self {
            state: Arc::default(),
        }
    }

    /// The shared Node cache, asked for: it starts once every controller has started (at once, when
    /// they have already). Every call returns the same cache.
    pub fn nodes(&self) -> Arc<SharedNodes> {
        let mut state = lock(&self.state);
        let FactoryState { nodes, started, .. } = &mut *state;
        informer_for(nodes, started, keep_node, Some(node_events_in_protobuf))
    }

    /// The shared Service cache, asked for: as [`InformerFactory::nodes`].
    pub fn services(&self) -> Arc<SharedServices> {
        let mut state = lock(&self.state);
        let FactoryState {
            services, started, ..
        } = &mut *state;
        informer_for(
            services,
            started,
            prune_service,
            Some(service_events_in_protobuf),
        )
    }

    /// Starts every cache asked for so far, with `client`, each fetching its first list as
    /// `initial_list` says, the Node cache in protobuf unless `content_type` is JSON; those asked for
    /// later start when they are. Each watch is a task of
    /// `supervisor`, and stops with its shutdown: one that panics or ends before fails the manager's
    /// health check (its cache would be frozen, its controllers deaf). Called once, after every
    /// controller has started.
    pub(crate) fn start(
        &self,
        client: Client,
        supervisor: Supervisor,
        initial_list: InitialList,
        content_type: KubeApiContentType,
    ) {
        let start = Start {
            client,
            supervisor,
            initial_list,
            content_type,
        };
        let mut state = lock(&self.state);
        if let Some(nodes) = &state.nodes {
            nodes.start(start.clone());
        }
        if let Some(services) = &state.services {
            services.start(start.clone());
        }
        state.started = Some(start);
    }
}

/// The cache in `slot`, made (with `prune`, and reading protobuf with `in_protobuf` where it can) if no
/// one asked for it before, and started if the factory has started.
fn informer_for<K>(
    slot: &mut Option<Arc<SharedInformer<K>>>,
    started: &Option<Start>,
    prune: fn(&mut K),
    in_protobuf: Option<ProtobufEvents<K>>,
) -> Arc<SharedInformer<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let informer = slot.get_or_insert_with(|| Arc::new(SharedInformer::new(prune, in_protobuf)));
    if let Some(start) = started {
        informer.start(start.clone());
    }
    informer.clone()
}

/// A cache's list and watch in protobuf (JSON where the API server has no protobuf).
type ProtobufEvents<K> =
    fn(Client, InitialList) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// The Node cache's list and watch in protobuf ([`protobuf::list_and_watch`]).
fn node_events_in_protobuf(
    client: Client,
    initial_list: InitialList,
) -> BoxStream<'static, Result<watcher::Event<CachedNode>, watcher::Error>> {
    protobuf::list_and_watch(client, initial_list).boxed()
}

/// The Service cache's list and watch in protobuf ([`protobuf::list_and_watch`]).
fn service_events_in_protobuf(
    client: Client,
    initial_list: InitialList,
) -> BoxStream<'static, Result<watcher::Event<Service>, watcher::Error>> {
    protobuf::list_and_watch(client, initial_list).boxed()
}

/// Whether a cache holds its first full list (client-go's `InformerSynced`), from
/// [`SharedInformer::synced`], for [`wait_for_cache_sync`].
#[derive(Debug, Clone)]
pub struct CacheSynced(watch::Receiver<bool>);

impl CacheSynced {
    /// Whether the cache has synced.
    pub fn is_synced(&self) -> bool {
        *self.0.borrow()
    }
}

/// Waits until every one of `caches` holds its first full list (client-go's `cache.WaitForCacheSync`):
/// `true` then, `false` when `shutdown` is cancelled first.
pub async fn wait_for_cache_sync(
    shutdown: &CancellationToken,
    caches: impl IntoIterator<Item = CacheSynced>,
) -> bool {
    let all_synced = async {
        for CacheSynced(mut synced) in caches {
            // An error means the cache is gone: it never syncs, and shutdown decides.
            if synced.wait_for(|synced| *synced).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        biased;
        () = shutdown.cancelled() => false,
        () = all_synced => true,
    }
}

/// The subscribers of one cache, fed by its watch.
struct Fanout<K> {
    subscribers: Mutex<Vec<mpsc::Sender<Change<K>>>>,
}

impl<K> Default for Fanout<K> {
    fn default() -> Self {
        Self {
            subscribers: Mutex::default(),
        }
    }
}

impl<K> Fanout<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// A new subscriber: every object `store` holds now, then every change the watch passes on after.
    fn subscribe(&self, store: &Store<K>) -> impl Stream<Item = Change<K>> + Send + 'static {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        // The watch applies a change to the store before it reads the subscribers under this lock, so a
        // change the snapshot misses reaches the channel (one it holds may come twice: no harm, as a
        // change is the object's state, not a delta).
        let held = {
            let mut subscribers = lock(&self.subscribers);
            subscribers.push(tx);
            store.state()
        };
        futures::stream::iter(held.into_iter().map(Change::Applied))
            .chain(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|change| (change, rx))
            }))
    }

    /// The subscribers to pass a change to (those whose stream was dropped are forgotten).
    fn subscribers(&self) -> Vec<mpsc::Sender<Change<K>>> {
        let mut subscribers = lock(&self.subscribers);
        subscribers.retain(|subscriber| !subscriber.is_closed());
        subscribers.clone()
    }
}

/// A shared cache of one resource, with change subscriptions. Get it from the [`InformerFactory`].
pub struct SharedInformer<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    writer: Mutex<Option<Writer<K>>>,
    fanout: Arc<Fanout<K>>,
    synced: watch::Sender<bool>,
    /// Counts the watch events applied to the store, so a reader can wait for the store to change
    /// without polling it ([`SharedInformer::store_changes`]).
    applied: watch::Sender<u64>,
    prune: fn(&mut K),
    /// This resource's list and watch in protobuf, for a cache that reads it so.
    in_protobuf: Option<ProtobufEvents<K>>,
}

impl<K> SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A cache that is not watching yet; `prune` trims each object before it is cached, and
    /// `in_protobuf` lists and watches in protobuf when the factory's content type asks for it.
    fn new(prune: fn(&mut K), in_protobuf: Option<ProtobufEvents<K>>) -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            fanout: Arc::default(),
            synced: watch::Sender::new(false),
            applied: watch::Sender::new(0),
            prune,
            in_protobuf,
        }
    }

    /// The cache (empty until synced; see [`wait_for_cache_sync`]).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every object the cache holds now, then every change after; at any time (see the module docs).
    pub fn subscribe_changes(&self) -> impl Stream<Item = Change<K>> + Send + 'static {
        self.fanout.subscribe(&self.store)
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

    /// Marks each change of the store: `changed()` on the receiver returns after the next watch event
    /// has reached the store. Unlike [`SharedInformer::subscribe_changes`] it replays nothing and holds
    /// no object; for waiting until the store shows one object's change (see the node controller's
    /// `cache_catch_up`).
    pub(crate) fn store_changes(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Whether the cache holds its first full list, for [`wait_for_cache_sync`].
    pub fn synced(&self) -> CacheSynced {
        CacheSynced(self.synced.subscribe())
    }

    /// Starts the watch, unless it has started already; it stops with the supervisor's shutdown.
    fn start(&self, start: Start) {
        let Some(mut writer) = lock(&self.writer).take() else {
            return;
        };
        let Start {
            client,
            supervisor,
            mut initial_list,
            content_type,
        } = start;
        let in_protobuf = self
            .in_protobuf
            .filter(|_| content_type == KubeApiContentType::Protobuf);
        let fanout = self.fanout.clone();
        let synced = self.synced.clone();
        let applied = self.applied.clone();
        let store = self.store.clone();
        let prune = self.prune;
        let kind = K::kind(&()).into_owned();
        tracing::debug!(kind = %kind, ?initial_list, protobuf = in_protobuf.is_some(), "starting the shared cache");
        let api = Api::<K>::all(client.clone());
        let watching = async move {
            let mut tracker = ChangeTracker::default();
            // Left (to list and watch instead) when the API server refuses streaming lists.
            loop {
                let config = match initial_list {
                    InitialList::Streaming => watcher::Config::default().streaming_lists(),
                    InitialList::ListThenWatch => watcher::Config::default(),
                };
                let source = match in_protobuf {
                    Some(list_and_watch) => list_and_watch(client.clone(), initial_list),
                    None => watcher(api.clone(), config).boxed(),
                };
                let mut events = std::pin::pin!(source.backoff(watch_backoff()).modify(prune));
                while let Some(event) = events.next().await {
                    let changes: Vec<Change<K>> = match event {
                        Ok(event) => {
                            writer.apply_watcher_event(&event);
                            applied.send_modify(|count| *count = count.wrapping_add(1));
                            if matches!(event, watcher::Event::InitDone) {
                                synced.send_replace(true);
                            }
                            tracker.changes(&event, &store)
                        }
                        Err(err)
                            if initial_list == InitialList::Streaming
                                && refuses_streaming(&err) =>
                        {
                            tracing::info!(kind = %kind, error = %err, "the API server does not serve streaming lists; listing and watching instead");
                            initial_list = InitialList::ListThenWatch;
                            break;
                        }
                        Err(err) => {
                            tracing::warn!(kind = %kind, error = %err, "watch failed; retrying");
                            Vec::new()
                        }
                    };
                    // Read after the change reached the store (see `Fanout::subscribe`).
                    if changes.is_empty() {
                        continue;
                    }
                    let subscribers = fanout.subscribers();
                    for change in changes {
                        for subscriber in &subscribers {
                            // A subscriber that stopped (its controller ended) just misses out.
                            let _ = subscriber.send(change.clone()).await;
                        }
                    }
                }
            }
        };
        let name = format!("the {} cache", K::kind(&()));
        supervisor.spawn_once(name, Ends::AtShutdown, watching);
    }
}

/// Whether a failed watch is the API server refusing a streaming list: it answers 400 (Bad Request)
/// or 422 (Invalid) to `sendInitialEvents` when its `WatchList` feature gate is off, and to
/// `resourceVersionMatch` on a watch when it predates streaming lists.
fn refuses_streaming(err: &watcher::Error) -> bool {
    matches!(err, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 400 || status.code == 422)
}

/// The longest wait before a failed watch is retried (the contract crate's, shared with providers).
pub use cloud_provider::WATCH_RETRY_MAX;

/// The watch's retry delays ([`cloud_provider::watch_retry_backoff`]).
fn watch_backoff() -> ResetTimerBackoff<watcher::ExponentialBackoff> {
    cloud_provider::watch_retry_backoff()
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
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;
    use kube::{ResourceExt, api::ObjectMeta};

    use super::*;

    /// A supervisor of the caches whose tasks stop with `shutdown`.
    fn supervised(shutdown: &CancellationToken) -> Supervisor {
        Supervisor::new(Default::default(), shutdown.clone())
    }

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

    /// An API server that lists one Node (`a`) and no Services, and logs the paths asked for.
    fn api_server() -> (Client, crate::mock_api::Requests) {
        crate::mock_api::mock_client(|_, path, _| {
            let answer = match path {
                "/api/v1/nodes" => serde_json::json!({
                    "apiVersion": "v1", "kind": "NodeList", "metadata": { "resourceVersion": "1" },
                    "items": [{ "metadata": { "name": "a", "uid": "a1", "resourceVersion": "1" } }],
                }),
                _ => serde_json::json!({
                    "apiVersion": "v1", "kind": "ServiceList", "metadata": { "resourceVersion": "1" },
                    "items": [],
                }),
            };
            (200, answer)
        })
    }

    fn paths(requests: &crate::mock_api::Requests) -> Vec<String> {
        let mut paths: Vec<String> = requests
            .lock()
            .iter()
            .map(|(_, path, _)| path.clone())
            .collect();
        paths.dedup();
        paths
    }

    #[tokio::test]
    async fn a_cache_whose_watch_panics_fails_the_health_check() {
        let (client, _requests) = api_server();
        let shutdown = CancellationToken::new();
        let supervisor = supervised(&shutdown);
        let nodes: SharedInformer<Node> =
            SharedInformer::new(|_| panic!("a bug in the pruning"), None);
        nodes.start(Start {
            client,
            supervisor: supervisor.clone(),
            initial_list: InitialList::ListThenWatch,
            content_type: KubeApiContentType::Protobuf,
        });
        for _ in 0..200 {
            if supervisor.check().is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let why = supervisor.check().unwrap_err();
        assert!(
            why.contains("\"the Node cache\" panicked (a bug): a bug in the pruning"),
            "{why}"
        );
        assert!(!nodes.synced().is_synced());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn only_the_caches_asked_for_start_and_not_before_the_factory_does() {
        let (client, requests) = api_server();
        let shutdown = CancellationToken::new();
        let factory = InformerFactory::new();
        let nodes = factory.nodes();
        assert!(
            Arc::ptr_eq(&nodes, &factory.nodes()),
            "one cache per resource"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(paths(&requests).is_empty(), "asked for, not started");
        assert!(!nodes.synced().is_synced());

        factory.start(
            client,
            supervised(&shutdown),
            InitialList::ListThenWatch,
            KubeApiContentType::Protobuf,
        );
        assert!(wait_for_cache_sync(&shutdown, [nodes.synced()]).await);
        assert_eq!(paths(&requests), ["/api/v1/nodes"], "no Service cache");
        let names: Vec<String> = nodes.store().state().iter().map(|n| n.name_any()).collect();
        assert_eq!(names, ["a"]);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_cache_asked_for_after_the_start_starts_at_once_and_late_subscribers_get_its_objects()
    {
        let (client, requests) = api_server();
        let shutdown = CancellationToken::new();
        let factory = InformerFactory::new();
        factory.start(
            client,
            supervised(&shutdown),
            InitialList::ListThenWatch,
            KubeApiContentType::Protobuf,
        );
        let nodes = factory.nodes();
        let services = factory.services();
        assert!(
            wait_for_cache_sync(&shutdown, [nodes.synced(), services.synced()]).await,
            "both started at once"
        );
        assert!(paths(&requests).contains(&"/api/v1/services".to_owned()));

        // Subscribed after the first list: the cache's objects come first.
        let mut changes = Box::pin(nodes.subscribe_changes());
        match changes.next().await {
            Some(Change::Applied(node)) => assert_eq!(node.name_any(), "a"),
            other => panic!("expected node a, got {other:?}"),
        }
        shutdown.cancel();
    }

    /// An API server that holds Node `a` and answers streaming lists as `streaming` says: with the
    /// node and the end-of-initial-events bookmark, or 422 as one with the `WatchList` gate off. Plain
    /// lists get the node; any other watch gets 500 (so the watcher backs off, the test does not spin).
    fn streaming_api_server(streaming: bool) -> (Client, crate::mock_api::Requests) {
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "a", "uid": "a1", "resourceVersion": "7" },
        });
        crate::mock_api::mock_client_with_query(move |_, uri, _| {
            let status = |code: u16, message: &str| {
                serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "code": code, "message": message,
                }))
                .unwrap()
            };
            if uri.contains("sendInitialEvents=true") {
                if !streaming {
                    return (
                        422,
                        status(
                            422,
                            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                        ),
                    );
                }
                let events = [
                    serde_json::json!({ "type": "ADDED", "object": node }),
                    serde_json::json!({ "type": "BOOKMARK", "object": {
                        "apiVersion": "v1", "kind": "Node",
                        "metadata": {
                            "resourceVersion": "7",
                            "annotations": { "k8s.io/initial-events-end": "true" },
                        },
                    }}),
                ];
                let lines: Vec<String> = events.iter().map(|e| e.to_string()).collect();
                return (200, (lines.join("\n") + "\n").into_bytes());
            }
            if uri.contains("watch=true") {
                return (500, status(500, "no more watching in this test"));
            }
            let list = serde_json::json!({
                "apiVersion": "v1", "kind": "NodeList", "metadata": { "resourceVersion": "7" },
                "items": [node],
            });
            (200, serde_json::to_vec(&list).unwrap())
        })
    }

    /// The requests made, as "list" (a plain or paged list), "stream" (a streaming list) or "watch".
    fn request_kinds(requests: &crate::mock_api::Requests) -> Vec<&'static str> {
        let mut kinds: Vec<&'static str> = requests
            .lock()
            .iter()
            .map(|(_, uri, _)| {
                if uri.contains("sendInitialEvents=true") {
                    "stream"
                } else if uri.contains("watch=true") {
                    "watch"
                } else {
                    "list"
                }
            })
            .collect();
        kinds.dedup();
        kinds
    }

    #[tokio::test]
    async fn a_streaming_list_fills_the_cache_without_a_list_request() {
        let (client, requests) = streaming_api_server(true);
        let shutdown = CancellationToken::new();
        let factory = InformerFactory::new();
        let nodes = factory.nodes();
        factory.start(
            client,
            supervised(&shutdown),
            InitialList::Streaming,
            KubeApiContentType::Protobuf,
        );
        assert!(wait_for_cache_sync(&shutdown, [nodes.synced()]).await);
        let names: Vec<String> = nodes.store().state().iter().map(|n| n.name_any()).collect();
        assert_eq!(names, ["a"]);
        // The list's events (start, the object, done) each marked the store as changed.
        assert!(*nodes.store_changes().borrow() >= 3);
        assert_eq!(request_kinds(&requests)[0], "stream");
        assert!(
            !request_kinds(&requests).contains(&"list"),
            "{:?}",
            requests.lock()
        );
        shutdown.cancel();
    }

    #[tokio::test]
    async fn an_api_server_that_refuses_streaming_lists_is_listed_and_not_asked_again() {
        let (client, requests) = streaming_api_server(false);
        let shutdown = CancellationToken::new();
        let factory = InformerFactory::new();
        let nodes = factory.nodes();
        factory.start(
            client,
            supervised(&shutdown),
            InitialList::Streaming,
            KubeApiContentType::Protobuf,
        );
        assert!(wait_for_cache_sync(&shutdown, [nodes.synced()]).await);
        let names: Vec<String> = nodes.store().state().iter().map(|n| n.name_any()).collect();
        assert_eq!(names, ["a"]);
        // Let the watch fail and retry a few times: the streaming list is never asked for again.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let kinds = request_kinds(&requests);
        assert_eq!(&kinds[..2], ["stream", "list"], "{:?}", requests.lock());
        assert_eq!(kinds.iter().filter(|k| **k == "stream").count(), 1);
        assert!(kinds[2..].iter().all(|k| *k == "watch"), "{kinds:?}");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn with_streaming_lists_off_the_cache_lists_first() {
        let (client, requests) = streaming_api_server(true);
        let shutdown = CancellationToken::new();
        let factory = InformerFactory::new();
        let nodes = factory.nodes();
        factory.start(
            client,
            supervised(&shutdown),
            InitialList::ListThenWatch,
            KubeApiContentType::Protobuf,
        );
        assert!(wait_for_cache_sync(&shutdown, [nodes.synced()]).await);
        assert_eq!(request_kinds(&requests)[0], "list");
        assert!(!request_kinds(&requests).contains(&"stream"));
        shutdown.cancel();
    }

    #[tokio::test]
    async fn waiting_for_a_cache_ends_on_shutdown() {
        let factory = InformerFactory::new();
        let nodes = factory.nodes();
        let shutdown = CancellationToken::new();
        let canceller = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            canceller.cancel();
        });
        assert!(!wait_for_cache_sync(&shutdown, [nodes.synced()]).await);
    }

    #[tokio::test]
    async fn a_subscriber_misses_no_change_made_while_it_subscribes() {
        let (store, mut writer) = reflector::store::<Node>();
        let fanout = Fanout::default();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(node("a", "a1")),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&event);
        }
        let early = fanout.subscribe(&store);
        // A change applied to the store after the subscription is passed on through the channel.
        let b = node("b", "b1");
        writer.apply_watcher_event(&watcher::Event::Apply(b.clone()));
        let b = Arc::new(b);
        for subscriber in fanout.subscribers() {
            subscriber.send(Change::Applied(b.clone())).await.unwrap();
        }
        let late = fanout.subscribe(&store);
        drop(fanout);
        let seen = |changes: Vec<Change<Node>>| summary(&changes);
        assert_eq!(
            seen(early.collect().await),
            ["applied a1", "applied b1"],
            "the held object, then the change"
        );
        assert_eq!(
            seen(late.collect().await),
            ["applied a1", "applied b1"],
            "everything held at subscription"
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
