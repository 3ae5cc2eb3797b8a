//! A FIFO work queue with client-go's semantics, and the workers that drain it: objects are reconciled in
//! the order their changes arrived, each by one worker at a time, at a cost per change that does not
//! depend on how many are waiting.
//!
//! Why not kube-runtime's `Controller`: its scheduler hands the backlog out in hash order, so with
//! thousands of new Nodes some waited for almost the whole run (the benchmark's p99 delay was twice
//! upstream's); and lifting its concurrency limit made it poll every pending reconcile on each wake,
//! which doubled the manager's CPU and grows with the square of the backlog. Its `Action` cannot be
//! reused as the reconcile's answer either (the requeue delay is private), hence [`Next`].
//!
//! The semantics, as client-go's `workqueue.Type`:
//! - a key added while it waits is not queued twice;
//! - a key added while a worker reconciles it is queued again, once, when that worker is done, so an
//!   object is never reconciled by two workers at once and no change is missed;
//! - [`WorkQueue::add_after`] queues a key after a delay; a later, longer delay for a key already waiting
//!   keeps the earlier deadline, and an [`WorkQueue::add`] meanwhile queues it at once (the delayed add
//!   is then dropped: the reconcile it asked for has happened).
//!
//! It exports client-go's `workqueue_*` metrics under the controller's name (see `queue_metrics`), and
//! [`run`] survives a reconcile that panics: the panic is logged, counted (`workqueue_panics_total`),
//! recorded as a Warning event on the object and in the controller's health, and the key is retried on
//! its own back-off, while the other keys go on.

use parking_lot::{Mutex, MutexGuard};
use std::{
    collections::{HashMap, HashSet, VecDeque},
    future::Future,
    hash::Hash,
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, Stream, StreamExt};
use kube::{
    Resource,
    runtime::{
        events::EventType,
        reflector::{ObjectRef, Store},
    },
};

use super::{
    backoff::PerObjectBackoff, controller_health::ControllerHealth, queue_metrics::QueueMetrics,
};
use crate::events::EventRecorder;
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

/// What a reconcile (or its error policy) asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the object changes again.
    AwaitChange,
    /// Reconcile the object again after this delay (or sooner, if it changes).
    RequeueAfter(Duration),
}

/// The queue's state behind its lock.
struct State<T> {
    /// Keys waiting for a worker, oldest first.
    queue: VecDeque<T>,
    /// Keys that need a reconcile: those in `queue`, and those added while being reconciled.
    dirty: HashSet<T>,
    /// Keys a worker is reconciling.
    processing: HashSet<T>,
    /// Keys with a delayed add pending, and its deadline.
    delayed: HashMap<T, Instant>,
    /// When each key in `dirty` was added (for `workqueue_queue_duration_seconds`).
    added_at: HashMap<T, Instant>,
    /// When a worker took each key in `processing` (for the work-duration metrics).
    started_at: HashMap<T, Instant>,
    shutting_down: bool,
}

/// A FIFO queue of keys with client-go's dedup rules (see the module docs).
pub(crate) struct WorkQueue<T> {
    state: Mutex<State<T>>,
    ready: Notify,
    metrics: QueueMetrics,
}

impl<T: Clone + Eq + Hash + Send + 'static> WorkQueue<T> {
    /// An empty queue reporting into `metrics`.
    pub(crate) fn new(metrics: QueueMetrics) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                delayed: HashMap::new(),
                added_at: HashMap::new(),
                started_at: HashMap::new(),
                shutting_down: false,
            }),
            ready: Notify::new(),
            metrics,
        })
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock()
    }

    /// Queues `key` at the back, unless it is waiting already; while a worker has it, it is queued
    /// again when that worker is done.
    pub(crate) fn add(&self, key: T) {
        let mut state = self.state();
        state.delayed.remove(&key);
        self.add_locked(&mut state, key);
    }

    /// client-go's `Add`: the metrics count a key once per time it becomes dirty.
    fn add_locked(&self, state: &mut State<T>, key: T) {
        if state.shutting_down || state.dirty.contains(&key) {
            return;
        }
        self.metrics.adds.inc();
        self.metrics.depth.inc();
        state
            .added_at
            .entry(key.clone())
            .or_insert_with(Instant::now);
        state.dirty.insert(key.clone());
        if state.processing.contains(&key) {
            return;
        }
        state.queue.push_back(key);
        self.ready.notify_one();
    }

    /// Queues `key` after `delay`, unless it is due sooner already.
    pub(crate) fn add_after(self: &Arc<Self>, key: T, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let deadline = Instant::now() + delay;
        {
            let mut state = self.state();
            if state.shutting_down {
                return;
            }
            // client-go counts every delayed add as a retry.
            self.metrics.retries.inc();
            match state.delayed.get(&key) {
                Some(due) if *due <= deadline => return,
                _ => state.delayed.insert(key.clone(), deadline),
            };
        }
        // One timer per delayed key: spawning is O(1), and a timer superseded by an earlier deadline
        // or an immediate add finds its deadline gone when it fires and does nothing.
        let queue = Arc::downgrade(self);
        // Unsupervised: a timer: sleeps, then queues the key (nothing in it can fail).
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let Some(queue) = queue.upgrade() else { return };
            let mut state = queue.state();
            if state.delayed.get(&key) == Some(&deadline) {
                state.delayed.remove(&key);
                queue.add_locked(&mut state, key);
            }
        });
    }

    /// The oldest waiting key, marked as being processed; `None` once the queue shuts down.
    pub(crate) async fn next(&self) -> Option<T> {
        loop {
            // Registered before the check, so an add between the check and the wait is not missed.
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.state();
                if state.shutting_down {
                    return None;
                }
                if let Some(key) = state.queue.pop_front() {
                    state.dirty.remove(&key);
                    state.processing.insert(key.clone());
                    let now = Instant::now();
                    self.metrics.depth.dec();
                    if let Some(added) = state.added_at.remove(&key) {
                        self.metrics
                            .queue_duration
                            .observe((now - added).as_secs_f64());
                    }
                    state.started_at.insert(key.clone(), now);
                    // More work waiting: pass the wake-up on to another idle worker.
                    if !state.queue.is_empty() {
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed: if it was added meanwhile, it is queued again.
    pub(crate) fn done(&self, key: &T) {
        let mut state = self.state();
        state.processing.remove(key);
        if let Some(started) = state.started_at.remove(key) {
            self.metrics
                .work_duration
                .observe(started.elapsed().as_secs_f64());
        }
        if state.dirty.contains(key) && !state.shutting_down {
            state.queue.push_back(key.clone());
            self.ready.notify_one();
        }
    }

    /// Stops handing out keys: every [`WorkQueue::next`] returns `None`, now and later.
    pub(crate) fn shut_down(&self) {
        self.state().shutting_down = true;
        self.ready.notify_waiters();
    }

    /// Sets `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds`
    /// from the keys being processed now (client-go does so every 500 ms).
    fn update_unfinished_work(&self) {
        let now = Instant::now();
        let (total, longest) = self
            .state()
            .started_at
            .values()
            .map(|started| (now - *started).as_secs_f64())
            .fold((0.0, 0.0f64), |(sum, max), s| (sum + s, max.max(s)));
        self.metrics.unfinished.set(total);
        self.metrics.longest.set(longest);
    }

    /// How many keys wait for a worker.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.state().queue.len()
    }
}

/// What [`run`] reports to: the queue's metrics, the controller's health, and where a panic's event
/// goes.
pub(crate) struct Reporting {
    /// The queue's `workqueue_*` series (labelled with the controller's name).
    pub(crate) metrics: QueueMetrics,
    /// The controller's health check.
    pub(crate) health: ControllerHealth,
    /// Records the Warning event on an object whose reconcile panicked.
    pub(crate) events: EventRecorder,
}

/// Runs a controller on the manager's work queue, as the built-in cloud-node and service controllers
/// run: every object `changes` yields is queued by its key (FIFO, a key waiting once, never worked on
/// by two workers at once), `workers` workers reconcile the queued objects as `store` holds them when
/// their turn comes (an object gone by then is skipped), and `reconcile`'s answer, or on error
/// `error_policy`'s, says whether to come back to the object after a delay.
///
/// The queue reports client-go's `workqueue_*` metrics labelled with the controller's name; a
/// reconcile that panics is logged, counted (`workqueue_panics_total`), told in a `ReconcilePanicked`
/// Warning event on the object and in the controller's `/healthz` check, and retried on its own
/// back-off (5 s doubling to 5 min) while the other objects go on. Returns once `ctx.shutdown` is
/// cancelled and the reconciles under way have finished.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use cloud_controller_manager::{controllers::{ControllerContext, ControllerTask, Next, run_on_work_queue}, informers::{wait_for_cache_sync, CachedNode}};
/// fn start(ctx: ControllerContext) -> Option<ControllerTask> {
///     let nodes = ctx.informers.nodes(); // asked for while the controller is built
///     let changes = nodes.subscribe();
///     Some(Box::pin(async move {
///         if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
///             return Ok(());
///         }
///         let reconcile = |node: Arc<CachedNode>, _: Arc<()>| async move {
///             tracing::info!(node = node.metadata.name.as_deref(), "seen");
///             Ok::<_, std::convert::Infallible>(Next::AwaitChange)
///         };
///         run_on_work_queue(&ctx, changes, nodes.store(), 4, reconcile, |_, _, _| Next::AwaitChange, Arc::new(())).await;
///         Ok(())
///     }))
/// }
/// ```
pub async fn run_on_work_queue<K, C, E, R, RFut, P>(
    ctx: &super::ControllerContext,
    changes: impl Stream<Item = Arc<K>> + Send + 'static,
    store: Store<K>,
    workers: usize,
    reconcile: R,
    error_policy: P,
    data: Arc<C>,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<C>) -> RFut + Send + Sync + 'static,
    RFut: Future<Output = Result<Next, E>> + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<C>) -> Next + Send + Sync + 'static,
{
    let reporting = Reporting {
        metrics: ctx.metrics.work_queues.queue(ctx.name),
        health: ctx.health.clone(),
        events: EventRecorder::new(ctx.events_client.clone(), ctx.name),
    };
    run(
        changes,
        store,
        workers,
        reconcile,
        error_policy,
        data,
        reporting,
        ctx.shutdown.clone(),
    )
    .await;
}

/// A panicking key's first retry; each further panic doubles it, up to [`PANIC_RETRY_MAX`].
const PANIC_RETRY_MIN: Duration = Duration::from_secs(5);
/// The longest wait before retrying a key whose reconcile keeps panicking.
const PANIC_RETRY_MAX: Duration = Duration::from_secs(300);

/// Runs a controller on the queue: every object `changes` yields is queued by its key, and `workers`
/// workers reconcile the queued objects in order, as the cache holds them when their turn comes (an
/// object gone from the cache by then is skipped). `reconcile`'s answer, or on error
/// `error_policy`'s, says whether to reconcile the object again after a delay. On `shutdown`, no new
/// reconcile starts and the ones under way finish before this returns.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run<K, C, E, R, RFut, P>(
    changes: impl Stream<Item = Arc<K>> + Send + 'static,
    store: Store<K>,
    workers: usize,
    reconcile: R,
    error_policy: P,
    ctx: Arc<C>,
    reporting: Reporting,
    shutdown: CancellationToken,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<C>) -> RFut + Send + Sync + 'static,
    RFut: Future<Output = Result<Next, E>> + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<C>) -> Next + Send + Sync + 'static,
{
    let Reporting {
        metrics,
        health,
        events,
    } = reporting;
    let queue: Arc<WorkQueue<ObjectRef<K>>> = WorkQueue::new(metrics.clone());
    let unfinished = {
        let queue = queue.clone();
        // Unsupervised: ticks, and sets two gauges (nothing in it can fail); aborted with the queue.
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(500));
            loop {
                ticks.tick().await;
                queue.update_unfinished_work();
            }
        })
    };
    let reported = Arc::new((metrics, health, events));
    let feed = spawn_feed(changes, queue.clone(), shutdown.clone(), reported.1.clone());
    let stop = {
        let queue = queue.clone();
        // Unsupervised: waits for the shutdown, then shuts the queue down (nothing in it can fail).
        tokio::spawn(async move {
            shutdown.cancelled().await;
            queue.shut_down();
        })
    };
    let worker = Worker {
        queue,
        store,
        ctx,
        reconcile: Arc::new(reconcile),
        error_policy: Arc::new(error_policy),
        panics: Arc::new(PerObjectBackoff::new(PANIC_RETRY_MIN, PANIC_RETRY_MAX)),
        reported,
    };
    let handles: Vec<_> = (0..workers.max(1))
        .map(|_| worker.clone().spawn())
        .collect();
    for handle in handles {
        if let Err(err) = handle.await {
            tracing::error!(error = %err, "a controller worker ended abnormally");
        }
    }
    feed.abort();
    stop.abort();
    unfinished.abort();
}

/// One of the queue's workers: it takes keys from the queue until it shuts down, and reconciles each
/// object as the cache holds it then.
struct Worker<K: Resource<DynamicType = ()> + 'static, C, R, P> {
    queue: Arc<WorkQueue<ObjectRef<K>>>,
    store: Store<K>,
    ctx: Arc<C>,
    reconcile: Arc<R>,
    error_policy: Arc<P>,
    /// The back-off of keys whose reconcile panicked, shared by the workers.
    panics: Arc<PerObjectBackoff>,
    reported: Arc<Reported>,
}

impl<K: Resource<DynamicType = ()> + 'static, C, R, P> Clone for Worker<K, C, R, P> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            store: self.store.clone(),
            ctx: self.ctx.clone(),
            reconcile: self.reconcile.clone(),
            error_policy: self.error_policy.clone(),
            panics: self.panics.clone(),
            reported: self.reported.clone(),
        }
    }
}

impl<K, C, E, R, RFut, P> Worker<K, C, R, P>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<C>) -> RFut + Send + Sync + 'static,
    RFut: Future<Output = Result<Next, E>> + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<C>) -> Next + Send + Sync + 'static,
{
    /// Starts working in a task of its own. A worker that dies outside a reconcile (a bug of the
    /// queue's own) would leave fewer, or none, to work: the controller's health check fails for good
    /// (the manager restarts).
    fn spawn(self) -> tokio::task::JoinHandle<()> {
        let health = self.reported.1.clone();
        // Watched: catches the worker's panic and fails the controller's health check; `run` awaits
        // the handle.
        tokio::spawn(async move {
            if let Err(panic) = std::panic::AssertUnwindSafe(self.work())
                .catch_unwind()
                .await
            {
                let why = format!(
                    "panicked: {}",
                    cloud_provider::panic_message(panic.as_ref())
                );
                tracing::error!(
                    "a worker of the work queue {why}; the controller's health check fails from now on, so that the manager is restarted"
                );
                health.background_loop_failed("worker", &why);
            }
        })
    }

    /// Reconciles the queued keys until the queue shuts down (a key whose object left the cache is
    /// skipped).
    async fn work(self) {
        while let Some(key) = self.queue.next().await {
            if let Some(object) = self.store.get(&key)
                && let Next::RequeueAfter(delay) = self.reconcile_one(object, &key).await
            {
                self.queue.add_after(key.clone(), delay);
            }
            self.queue.done(&key);
        }
    }

    /// Reconciles `object` (its error policy on an error) and says when to again. The reconcile runs
    /// in this worker's task: a panic is caught here, so the key is marked done and retried on its
    /// panic back-off, and the worker goes on with the next key.
    async fn reconcile_one(&self, object: Arc<K>, key: &ObjectRef<K>) -> Next {
        let (reconcile, error_policy, ctx) = (&self.reconcile, &self.error_policy, &self.ctx);
        let attempt = std::panic::AssertUnwindSafe(async {
            match reconcile(object.clone(), ctx.clone()).await {
                Ok(next) => next,
                Err(err) => error_policy(object.clone(), &err, ctx.clone()),
            }
        })
        .catch_unwind()
        .await;
        match attempt {
            Ok(next) => {
                self.panics.succeeded(&key.to_string());
                next
            }
            Err(panic) => {
                let message = cloud_provider::panic_message(panic.as_ref());
                panicked(object.as_ref(), key, &message, &self.panics, &self.reported)
            }
        }
    }
}

/// What a work queue's panics are told to: its metrics, the controller's health, the object's events.
type Reported = (QueueMetrics, ControllerHealth, EventRecorder);

/// A reconcile of `object` (`key`) panicked with `message`: counted, told in the controller's health
/// and a Warning event on the object, and retried on the key's panic back-off (returned).
fn panicked<K: Resource<DynamicType = ()>>(
    object: &K,
    key: &ObjectRef<K>,
    message: &str,
    panics: &PerObjectBackoff,
    (metrics, health, events): &Reported,
) -> Next {
    let (count, delay) = panics.failed(&key.to_string());
    metrics.panics.inc();
    health.panicked();
    tracing::error!(object = %key, panics = count, retry_in = ?delay, "reconcile panicked: {message}");
    events.queue(
        object,
        EventType::Warning,
        "ReconcilePanicked",
        "Reconcile",
        format!(
            "The controller panicked reconciling this object ({message}); retrying in {delay:?}"
        ),
    );
    Next::RequeueAfter(delay)
}

/// Queues the key of every object `changes` yields until `shutdown`. The changes cannot be had again:
/// a feed that ends before shutdown (or panics) leaves the controller deaf, so it fails the
/// controller's health check for good (the manager restarts).
fn spawn_feed<K>(
    changes: impl Stream<Item = Arc<K>> + Send + 'static,
    queue: Arc<WorkQueue<ObjectRef<K>>>,
    shutdown: CancellationToken,
    health: ControllerHealth,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    // Watched: catches the feed's panic, and its early end, and fails the controller's health check.
    tokio::spawn(async move {
        let feeding = std::panic::AssertUnwindSafe(async {
            let mut changes = Box::pin(changes);
            loop {
                tokio::select! {
                    change = changes.next() => match change {
                        Some(object) => queue.add(ObjectRef::from_obj(object.as_ref())),
                        None => return "ended while the manager was not stopping".to_owned(),
                    },
                    () = shutdown.cancelled() => return String::new(),
                }
            }
        });
        let why = match feeding.catch_unwind().await {
            Ok(why) => why,
            Err(panic) => format!(
                "panicked: {}",
                cloud_provider::panic_message(panic.as_ref())
            ),
        };
        if !why.is_empty() {
            tracing::error!(
                "the work queue's feed of changes {why}; the controller's health check fails from now on, so that the manager is restarted"
            );
            health.background_loop_failed("feed", &why);
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        ResourceExt,
        api::ObjectMeta,
        runtime::{reflector, watcher},
    };

    use super::*;
    use crate::controllers::queue_metrics::WorkQueueMetrics;

    fn test_metrics() -> QueueMetrics {
        WorkQueueMetrics::register(&mut prometheus_client::registry::Registry::default())
            .queue("test")
    }

    /// Reporting into a registry of its own and a mock API server (the events' requests are logged).
    fn test_reporting() -> (
        Reporting,
        prometheus_client::registry::Registry,
        crate::mock_api::Requests,
    ) {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = WorkQueueMetrics::register(&mut registry).queue("test-controller");
        let (client, requests) = crate::mock_api::mock_client(|_, _, body| (201, body.clone()));
        (
            Reporting {
                metrics,
                health: ControllerHealth::default(),
                events: EventRecorder::new(client, "test-controller"),
            },
            registry,
            requests,
        )
    }

    #[tokio::test]
    async fn keys_come_out_in_the_order_they_went_in_and_a_waiting_key_is_not_queued_twice() {
        let queue = WorkQueue::new(test_metrics());
        for key in ["c", "a", "b", "a", "c"] {
            queue.add(key);
        }
        assert_eq!(queue.len(), 3);
        for wanted in ["c", "a", "b"] {
            let key = queue.next().await.unwrap();
            assert_eq!(key, wanted);
            queue.done(&key);
        }
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test]
    async fn a_key_added_while_processed_is_queued_again_once_after_it_is_done() {
        let queue = WorkQueue::new(test_metrics());
        queue.add("a");
        let key = queue.next().await.unwrap();
        queue.add("a");
        queue.add("a");
        queue.add("b");
        assert_eq!(queue.len(), 1, "only b waits while a is processed");
        assert_eq!(queue.next().await, Some("b"));
        queue.done(&"a");
        assert_eq!(queue.len(), 1, "a again, once");
        assert_eq!(queue.next().await, Some(key));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_add_fires_after_its_delay_and_the_earlier_deadline_wins() {
        let queue = WorkQueue::new(test_metrics());
        queue.add_after("a", Duration::from_secs(10));
        queue.add_after("a", Duration::from_secs(30));
        queue.add_after("b", Duration::from_secs(30));
        queue.add_after("b", Duration::from_secs(5));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(queue.len(), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(queue.next().await, Some("b"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(queue.next().await, Some("a"));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(queue.len(), 0, "each delayed add fires once");
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_add_supersedes_a_delayed_one() {
        let queue = WorkQueue::new(test_metrics());
        queue.add_after("a", Duration::from_secs(10));
        queue.add("a");
        assert_eq!(queue.next().await, Some("a"));
        queue.done(&"a");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test]
    async fn shutting_down_ends_every_waiting_worker() {
        let queue: Arc<WorkQueue<&str>> = WorkQueue::new(test_metrics());
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move { queue.next().await }
        });
        tokio::task::yield_now().await;
        queue.shut_down();
        assert_eq!(waiting.await.unwrap(), None);
        queue.add("a");
        assert_eq!(queue.next().await, None);
    }

    fn config_map(name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// What the test controller saw: reconciles in order, and the most at once per object.
    #[derive(Default)]
    struct Seen {
        order: Mutex<Vec<String>>,
        running: Mutex<HashMap<String, usize>>,
        most_at_once: AtomicUsize,
    }

    #[tokio::test]
    async fn the_workers_reconcile_in_arrival_order_skip_deleted_objects_and_never_overlap() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let names: Vec<String> = (0..50).map(|i| format!("cm-{i:02}")).collect();
        for name in &names {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map(name, "1")));
        }
        // Deleted from the cache before its turn: skipped.
        writer.apply_watcher_event(&watcher::Event::Delete(config_map("cm-07", "1")));
        let (tx, rx) = futures::channel::mpsc::unbounded::<Arc<ConfigMap>>();
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(run(
            rx,
            store,
            1,
            |object: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                let name = object.name_any();
                let at_once = {
                    let mut running = seen.running.lock();
                    let n = running.entry(name.clone()).or_default();
                    *n += 1;
                    *n
                };
                seen.most_at_once.fetch_max(at_once, Ordering::SeqCst);
                tokio::task::yield_now().await;
                *seen.running.lock().get_mut(&name).unwrap() -= 1;
                seen.order.lock().push(name);
                Ok::<_, std::convert::Infallible>(Next::AwaitChange)
            },
            |_, _, _| Next::AwaitChange,
            seen.clone(),
            test_reporting().0,
            shutdown.clone(),
        ));
        for name in &names {
            tx.unbounded_send(Arc::new(config_map(name, "1"))).unwrap();
        }
        let wanted: Vec<String> = names.iter().filter(|n| *n != "cm-07").cloned().collect();
        while seen.order.lock().len() < wanted.len() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*seen.order.lock(), wanted);
        assert_eq!(seen.most_at_once.load(Ordering::SeqCst), 1);
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test]
    async fn many_workers_never_reconcile_one_object_twice_at_once_and_shutdown_waits_for_them() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Apply(config_map("hot", "1")));
        let (tx, rx) = futures::channel::mpsc::unbounded::<Arc<ConfigMap>>();
        let seen = Arc::new(Seen::default());
        let finished = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(run(
            rx,
            store,
            8,
            {
                let finished = finished.clone();
                move |object: Arc<ConfigMap>, seen: Arc<Seen>| {
                    let finished = finished.clone();
                    async move {
                        let name = object.name_any();
                        let at_once = {
                            let mut running = seen.running.lock();
                            let n = running.entry(name.clone()).or_default();
                            *n += 1;
                            *n
                        };
                        seen.most_at_once.fetch_max(at_once, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        *seen.running.lock().get_mut(&name).unwrap() -= 1;
                        finished.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(Next::AwaitChange)
                    }
                }
            },
            |_, _, _| Next::AwaitChange,
            seen.clone(),
            test_reporting().0,
            shutdown.clone(),
        ));
        for _ in 0..200 {
            tx.unbounded_send(Arc::new(config_map("hot", "1"))).unwrap();
            tokio::task::yield_now().await;
        }
        while finished.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        shutdown.cancel();
        run.await.unwrap();
        assert_eq!(seen.most_at_once.load(Ordering::SeqCst), 1);
        assert!(
            seen.running.lock().values().all(|n| *n == 0),
            "no reconcile is cut off by the shutdown"
        );
    }

    /// A reconcile that panics on one key: the key is retried on its back-off, the panic is counted,
    /// told in an event on the object and in the controller's health, and the other keys go on.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_key_is_retried_counted_and_reported_while_the_others_go_on() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        for name in ["good-1", "poison", "good-2"] {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map(name, "1")));
        }
        let (tx, rx) = futures::channel::mpsc::unbounded::<Arc<ConfigMap>>();
        let seen = Arc::new(Seen::default());
        let (reporting, registry, requests) = test_reporting();
        let health = reporting.health.clone();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(run(
            rx,
            store,
            1,
            |object: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                let name = object.name_any();
                seen.order.lock().push(name.clone());
                if name == "poison" {
                    panic!("cannot handle {name}");
                }
                Ok::<_, std::convert::Infallible>(Next::AwaitChange)
            },
            |_, _, _| Next::AwaitChange,
            seen.clone(),
            reporting,
            shutdown.clone(),
        ));
        for name in ["good-1", "poison", "good-2"] {
            tx.unbounded_send(Arc::new(config_map(name, "1"))).unwrap();
        }
        // Retried after 5 s, then 10 s: three attempts within 16 s.
        tokio::time::sleep(Duration::from_secs(16)).await;
        let order = seen.order.lock().clone();
        assert_eq!(order, ["good-1", "poison", "good-2", "poison", "poison"]);
        assert!(
            health.check().is_ok(),
            "three panics of one key are not a sick controller"
        );

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for expected in [
            r#"workqueue_panics_total{name="test-controller"} 3"#,
            r#"workqueue_adds_total{name="test-controller"} 5"#,
            r#"workqueue_retries_total{name="test-controller"} 3"#, // the third is scheduled
            r#"workqueue_depth{name="test-controller"} 0"#,
            r#"workqueue_work_duration_seconds_count{name="test-controller"} 5"#,
            r#"workqueue_queue_duration_seconds_count{name="test-controller"} 5"#,
            r#"workqueue_longest_running_processor_seconds{name="test-controller"} 0"#,
            r#"workqueue_unfinished_work_seconds{name="test-controller"} 0"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in:\n{text}");
        }
        shutdown.cancel();
        run.await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await; // the events are delivered
        let events: Vec<String> = requests
            .lock()
            .iter()
            .filter(|(method, _, _)| method == "POST")
            .map(|(_, _, body)| body["note"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert!(
            events.first().is_some_and(
                |note| note.contains("cannot handle poison") && note.contains("retrying in 5s")
            ),
            "{events:?}"
        );
    }

    /// An error policy that panics is a reconcile that panicked: retried, counted, the worker goes on.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_error_policy_is_caught_and_the_worker_goes_on() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        for name in ["failing", "good"] {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map(name, "1")));
        }
        let (tx, rx) = futures::channel::mpsc::unbounded::<Arc<ConfigMap>>();
        let seen = Arc::new(Seen::default());
        let (reporting, registry, _requests) = test_reporting();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(run(
            rx,
            store,
            1,
            |object: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                let name = object.name_any();
                seen.order.lock().push(name.clone());
                if name == "failing" {
                    Err(name)
                } else {
                    Ok(Next::AwaitChange)
                }
            },
            |_, err: &String, _| panic!("the error policy cannot handle {err}"),
            seen.clone(),
            reporting,
            shutdown.clone(),
        ));
        for name in ["failing", "good"] {
            tx.unbounded_send(Arc::new(config_map(name, "1"))).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            *seen.order.lock(),
            ["failing", "good", "failing"],
            "retried after 5 s"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"workqueue_panics_total{name="test-controller"} 2"#),
            "{text}"
        );
        shutdown.cancel();
        run.await.unwrap();
    }

    /// The changes cannot be had again: a feed that ends before shutdown fails the health check.
    #[tokio::test]
    async fn a_feed_of_changes_that_ends_fails_the_health_check_for_good() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let (reporting, _registry, _requests) = test_reporting();
        let health = reporting.health.clone();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(run(
            futures::stream::empty::<Arc<ConfigMap>>(),
            store,
            1,
            |_: Arc<ConfigMap>, _: Arc<()>| async {
                Ok::<_, std::convert::Infallible>(Next::AwaitChange)
            },
            |_, _, _| Next::AwaitChange,
            Arc::new(()),
            reporting,
            shutdown.clone(),
        ));
        while health.check().is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let why = health.check().unwrap_err();
        assert!(
            why.contains("feed") && why.contains("ended while the manager was not stopping"),
            "{why}"
        );
        shutdown.cancel();
        run.await.unwrap();
    }
}
