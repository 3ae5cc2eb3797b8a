//! The relay's own threads: one current-thread tokio runtime per core (by default; see
//! [`Settings::relay_threads`](crate::Settings::relay_threads)). A TCP listener's accept loop runs on
//! one of them and hands every accepted connection to the worker with the fewest connections (its own
//! on a tie), where it is relayed for its whole life: no work stealing moves it, so its reads and
//! writes never wait behind another worker's queue, and no two workers race for one socket (haproxy's
//! model with `nbthread`). Measured against the one multi-thread runtime the relay ran on before:
//! `bench/results/data-plane-2026-12-02-relay-workers.md`.
//!
//! Threads and runtimes of our own rather than the caller's runtime: tokio's multi-thread scheduler
//! cannot pin a task to a worker, and a current-thread runtime is the only tokio scheduler that never
//! moves a task.

use std::io;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The event interval (`tokio::runtime::Builder::event_interval`) of the relay's runtimes: how many
/// tasks a worker polls between two looks at the I/O driver (tokio's default is 61). With 31 the
/// relay's tail, rates and throughput were as good as or better than with 61, in three interleaved
/// runs each on an idle machine (`bench/results/data-plane-2026-12-01-event-interval.md`), measured
/// on the one multi-thread runtime the relay ran on then; kept for the relay threads, not measured
/// again on them. The runtimes of `local-agent` and of a manager running the `local` provider use it
/// too (their UDP relays and health checks).
pub const RUNTIME_EVENT_INTERVAL: u32 = 31;

/// The most relay threads started by default (one per core up to this): a manager or agent on a large
/// node, given CPU requests but no limit, sees every core of the node, and each thread's runtime holds
/// a few descriptors and a stack. `loadBalancer.relayThreads` sets any number.
pub const DEFAULT_MAX_RELAY_THREADS: usize = 16;

/// The relay threads, each running a current-thread runtime until this is dropped (which stops them
/// and drops what still runs on them).
#[derive(Debug)]
pub(crate) struct RelayThreads {
    pool: RelayPool,
    threads: Vec<RelayThread>,
}

#[derive(Debug)]
struct RelayThread {
    /// Dropped to stop the thread's runtime.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The relay threads' runtimes and how many connections each relays. Cheap to clone; it does not keep
/// the threads running (the tasks on them hold it, so it must not).
#[derive(Debug, Clone)]
pub(crate) struct RelayPool {
    workers: Arc<[Worker]>,
    /// The worker the next listener accepts on (round robin).
    next_acceptor: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct Worker {
    runtime: Handle,
    connections: AtomicUsize,
}

impl RelayThreads {
    /// Starts `count` threads (`None`: one per core the process may use, at most
    /// [`DEFAULT_MAX_RELAY_THREADS`]), named `relay-0`, `relay-1`, ... On an error the threads started
    /// so far are stopped and joined.
    pub(crate) fn start(count: Option<NonZeroUsize>) -> io::Result<RelayThreads> {
        let count = count.map_or_else(default_count, NonZeroUsize::get);
        let mut threads = Vec::with_capacity(count);
        let mut workers = Vec::with_capacity(count);
        for index in 0..count {
            match start_one(index) {
                Ok((thread, runtime)) => {
                    threads.push(thread);
                    workers.push(Worker {
                        runtime,
                        connections: AtomicUsize::new(0),
                    });
                }
                Err(error) => {
                    drop(RelayThreads::from_parts(workers, threads));
                    return Err(error);
                }
            }
        }
        Ok(RelayThreads::from_parts(workers, threads))
    }

    fn from_parts(workers: Vec<Worker>, threads: Vec<RelayThread>) -> RelayThreads {
        RelayThreads {
            pool: RelayPool {
                workers: workers.into(),
                next_acceptor: Arc::new(AtomicUsize::new(0)),
            },
            threads,
        }
    }

    /// The threads' runtimes.
    pub(crate) fn pool(&self) -> &RelayPool {
        &self.pool
    }
}

/// One per core the process may use (its CPU affinity and cgroup quota), at most
/// [`DEFAULT_MAX_RELAY_THREADS`].
fn default_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(DEFAULT_MAX_RELAY_THREADS)
}

/// Starts relay thread `index` and returns it with its runtime's handle. The runtime is built on the
/// new thread and lives and dies there: a runtime dropped inside an async context (the caller's) would
/// panic.
fn start_one(index: usize) -> io::Result<(RelayThread, Handle)> {
    let (stop, stopped) = oneshot::channel::<()>();
    let (started, handle) = std::sync::mpsc::sync_channel::<io::Result<Handle>>(1);
    let thread = std::thread::Builder::new()
        .name(format!("relay-{index}"))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .event_interval(RUNTIME_EVENT_INTERVAL)
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => return drop(started.send(Err(error))),
            };
            if started.send(Ok(runtime.handle().clone())).is_ok() {
                // Runs what is spawned on the runtime until `stop` is dropped; dropping the runtime
                // then drops what still runs on it (accept loops, connections).
                runtime.block_on(async {
                    tokio::select! {
                        _ = stopped => {}
                        never = keep_a_timer_ahead() => never,
                    }
                });
            }
        })?;
    let mut relay_thread = RelayThread {
        stop: Some(stop),
        thread: Some(thread),
    };
    // Blocks only while the new thread builds its runtime (microseconds).
    let received = handle.recv().map_err(|_| {
        io::Error::other(format!(
            "relay thread {index} ended before its runtime started"
        ))
    });
    match received.and_then(|built| built) {
        Ok(handle) => Ok((relay_thread, handle)),
        Err(error) => {
            if let Some(thread) = relay_thread.thread.take() {
                let _ = thread.join();
            }
            Err(error)
        }
    }
}

/// Every second, a timer: so that the one each connection sets for its first second
/// (`tcp::DEAD_PEER_DETECTION_AFTER`) is never the earliest on its thread. Tokio wakes its own I/O
/// driver (a write to an eventfd, and a turn of the event loop) whenever a timer earlier than every
/// other is set, even from the driver's own thread: once per connection without this, once a second
/// with it.
async fn keep_a_timer_ahead() {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
    }
}

impl Drop for RelayThreads {
    fn drop(&mut self) {
        for thread in &mut self.threads {
            thread.stop = None;
        }
        let here = std::thread::current().id();
        for thread in &mut self.threads {
            // A relay thread cannot wait for itself (should the last share of the data plane be
            // dropped on one): it stops once the task that dropped it yields.
            if let Some(joined) = thread.thread.take()
                && joined.thread().id() != here
            {
                let _ = joined.join();
            }
        }
    }
}

impl RelayPool {
    /// How many workers there are.
    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// The worker a new listener accepts on: each in turn.
    pub(crate) fn next_acceptor(&self) -> usize {
        self.next_acceptor.fetch_add(1, Ordering::Relaxed) % self.workers.len()
    }

    /// Worker `index`'s runtime.
    pub(crate) fn runtime(&self, index: usize) -> &Handle {
        &self.workers[index].runtime
    }

    /// The worker a connection accepted on worker `here` goes to: the one relaying the fewest
    /// connections, `here` on a tie (no hand-over between threads when the load is even). The
    /// connection counts until the returned share is dropped.
    pub(crate) fn pick(&self, here: usize) -> WorkerShare {
        let mut best = here;
        let mut fewest = self.workers[here].connections.load(Ordering::Relaxed);
        for (index, worker) in self.workers.iter().enumerate() {
            let connections = worker.connections.load(Ordering::Relaxed);
            if connections < fewest {
                (best, fewest) = (index, connections);
            }
        }
        self.workers[best]
            .connections
            .fetch_add(1, Ordering::Relaxed);
        WorkerShare {
            pool: self.clone(),
            index: best,
        }
    }
}

/// One connection's share of a worker's load (see [`RelayPool::pick`]).
#[derive(Debug)]
pub(crate) struct WorkerShare {
    pool: RelayPool,
    index: usize,
}

impl WorkerShare {
    /// The worker.
    #[cfg(test)]
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Its runtime.
    pub(crate) fn runtime(&self) -> &Handle {
        self.pool.runtime(self.index)
    }
}

impl Drop for WorkerShare {
    fn drop(&mut self) {
        self.pool.workers[self.index]
            .connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_worker_runs_its_tasks_on_a_thread_of_its_own_until_dropped() {
        let workers = RelayThreads::start(NonZeroUsize::new(2)).expect("workers start");
        let pool = workers.pool().clone();
        assert_eq!(pool.len(), 2);
        let mut names = Vec::new();
        for index in 0..pool.len() {
            let name = pool
                .runtime(index)
                .spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .expect("the task runs");
            names.push(name);
        }
        assert_eq!(
            names,
            [Some("relay-0".to_owned()), Some("relay-1".to_owned())]
        );
        drop(workers);
        for index in 0..pool.len() {
            let spawned = pool.runtime(index).spawn(async {}).await;
            assert!(
                spawned.is_err_and(|e| e.is_cancelled()),
                "a stopped worker runs nothing"
            );
        }
    }

    #[test]
    fn by_default_one_worker_per_core() {
        let cores = std::thread::available_parallelism()
            .map_or(1, NonZeroUsize::get)
            .min(DEFAULT_MAX_RELAY_THREADS);
        let workers = RelayThreads::start(None).expect("workers start");
        assert_eq!(workers.pool().len(), cores);
    }

    #[test]
    fn a_connection_goes_to_the_least_loaded_worker_and_stays_on_its_own_on_a_tie() {
        let workers = RelayThreads::start(NonZeroUsize::new(3)).expect("workers start");
        let pool = workers.pool();
        let first = pool.pick(1);
        assert_eq!(first.index(), 1, "all even: the accepting worker keeps it");
        let second = pool.pick(1);
        assert_eq!(second.index(), 0, "the first of the least loaded");
        let third = pool.pick(1);
        assert_eq!(third.index(), 2);
        let fourth = pool.pick(2);
        assert_eq!(fourth.index(), 2, "even again: its own");
        drop((first, second));
        assert_eq!(
            pool.pick(2).index(),
            0,
            "a connection that ended frees its share"
        );
        let acceptors: Vec<usize> = (0..4).map(|_| pool.next_acceptor()).collect();
        assert_eq!(
            acceptors,
            [0, 1, 2, 0],
            "listeners accept on each worker in turn"
        );
    }
}
