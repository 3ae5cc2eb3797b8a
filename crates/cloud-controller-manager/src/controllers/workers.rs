//! A first-come, first-served limit on concurrent reconciles (`--concurrent-node-syncs`,
//! `--concurrent-service-syncs`).
//!
//! kube-runtime's own limit (`controller::Config::concurrency`) parks the backlog in a `HashSet` and
//! starts it in hash order, so under load an object can wait for the whole backlog: in the benchmark,
//! the 99th-percentile node waited almost as long as the last one. Upstream's work queue is FIFO. So the
//! controllers run kube-runtime without a limit and take a permit from here first: tokio's semaphore is
//! fair, permits go to waiters in the order they asked.

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

/// The workers of one controller.
pub(crate) struct Workers {
    permits: Semaphore,
    shutdown: CancellationToken,
}

impl Workers {
    /// `count` workers (at least one); waiting stops when `shutdown` is cancelled.
    pub(crate) fn new(count: usize, shutdown: CancellationToken) -> Self {
        Self {
            permits: Semaphore::new(count.max(1)),
            shutdown,
        }
    }

    /// Waits for a free worker, in arrival order. `None` once the manager shuts down: the backlog is
    /// dropped, as upstream's queue drops it, rather than worked off before exiting.
    pub(crate) async fn acquire(&self) -> Option<SemaphorePermit<'_>> {
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => None,
            // The semaphore is never closed, so `ok()` never drops a permit.
            permit = self.permits.acquire() => permit.ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;

    #[tokio::test]
    async fn waiters_get_workers_in_arrival_order() {
        let workers = Arc::new(Workers::new(1, CancellationToken::new()));
        let first = workers.acquire().await.expect("a free worker");
        let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..20 {
            let (workers, order_tx) = (workers.clone(), order_tx.clone());
            tokio::spawn(async move {
                let _permit = workers.acquire().await.expect("a worker");
                order_tx.send(i).unwrap();
            });
            // Each waiter queues before the next is spawned.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drop(first);
        let mut order = Vec::new();
        for _ in 0..20 {
            order.push(order_rx.recv().await.unwrap());
        }
        assert_eq!(order, (0..20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn shutdown_releases_the_waiters_without_a_worker() {
        let shutdown = CancellationToken::new();
        let workers = Arc::new(Workers::new(1, shutdown.clone()));
        let _busy = workers.acquire().await.expect("a free worker");
        let waiter = {
            let workers = workers.clone();
            tokio::spawn(async move { workers.acquire().await.is_none() })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        shutdown.cancel();
        assert!(
            waiter.await.unwrap(),
            "a waiter got a worker after shutdown"
        );
    }
}
