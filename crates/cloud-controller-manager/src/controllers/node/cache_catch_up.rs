//! Waiting for the node cache to see our own initialization write before the address write follows it.
//!
//! The API server tries every write on its watch cache's copy of the object first. Right after our PUT
//! that copy is often the one before it: the status patch that follows then fails there and the API
//! server reads the node from etcd and applies the patch again (measured at 5,000 nodes, unthrottled:
//! 0.49 extra etcd reads per node, in `etcd_requests_total`; see `bench/results/2026-11-27-stale-cache.md`).
//! Our watch is served from that same cache, so once our cache holds something newer than the node we
//! wrote over, the API server's cache does too.
//!
//! kube-runtime's `Store` offers no wait for one object's change, and the fan-out of
//! `informers::SharedInformer` replays the whole cache to a new subscriber, so this looks at the node
//! in the store each time the shared informer has applied a watch event to it
//! (`SharedInformer::store_changes`). (It first polled the store each millisecond: at 5,000 nodes and
//! equal settings that cost 5–8 % of the manager's CPU per node, `bench/results/2026-11-27-equal-settings.md`.)
//! The wait is bounded: past it the write goes out anyway, and the API server's own retry keeps it
//! correct. It runs off the node workers ([`super::follow_up`]), so its bound is long enough for the
//! watch's lag in a registration storm: at 10,000 nodes unthrottled, a 500 ms bound let 35–38 % of the
//! address writes out before the cache had the node (3,526–3,808 extra etcd reads per run); 5 s, none
//! (`bench/results/2026-11-28-follow-ups.md`). Usually it ends within milliseconds.

use std::time::Duration;

use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::{sync::watch, time::Instant};

use crate::informers::CachedNode;

/// How long the address write waits for the cache at most.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(5);

/// The node cache and the signal that it changed.
#[derive(Clone)]
pub(super) struct NodeCache {
    pub(super) store: Store<CachedNode>,
    /// From `SharedInformer::store_changes`.
    pub(super) changes: watch::Receiver<u64>,
}

/// Whether the cache has seen a change beyond `written_over` (the `resourceVersion` our write replaced):
/// the node is gone from it, or it holds another version (resource versions are opaque: only equality
/// is meaningful).
pub(super) fn has_caught_up(cached: Option<&CachedNode>, written_over: &str) -> bool {
    cached.is_none_or(|node| node.resource_version().as_deref() != Some(written_over))
}

/// Waits until the cache holds node `name` newer than `written_over`, or [`MAX_WAIT`]. Returns whether
/// it caught up.
pub(super) async fn wait(cache: &NodeCache, name: &str, written_over: &str) -> bool {
    let key = ObjectRef::new(name);
    let caught_up = || has_caught_up(cache.store.get(&key).as_deref(), written_over);
    let deadline = Instant::now() + MAX_WAIT;
    let mut changes = cache.changes.clone();
    // Every change from here on wakes us, including one that lands between this and the first look.
    let _ = changes.borrow_and_update();
    loop {
        if caught_up() {
            return true;
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            // The informer is gone (the manager is stopping): nothing more will come.
            Ok(Err(_)) => return false,
            // The bound: one last look.
            Err(_) => return caught_up(),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};
    use serde_json::json;

    use super::*;

    fn node(resource_version: &str) -> CachedNode {
        serde_json::from_value(json!({
            "metadata": { "name": "n1", "resourceVersion": resource_version },
        }))
        .unwrap()
    }

    #[test]
    fn the_cache_has_caught_up_once_it_holds_another_version_or_none() {
        let cases = [
            (Some(node("7")), "7", false),
            (Some(node("8")), "7", true),
            // Opaque versions: an older-looking one is still another one.
            (Some(node("6")), "7", true),
            (None, "7", true),
        ];
        for (cached, written_over, expected) in cases {
            assert_eq!(
                has_caught_up(cached.as_ref(), written_over),
                expected,
                "cached {:?}, written over {written_over}",
                cached.as_ref().map(|n| n.resource_version())
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_when_the_cache_changes_or_at_its_bound() {
        let (store, mut writer) = reflector::store::<CachedNode>();
        let (changed, changes) = watch::channel(0u64);
        let cache = NodeCache { store, changes };
        let mut apply = |version: &str| {
            writer.apply_watcher_event(&watcher::Event::Apply(node(version)));
            changed.send_modify(|n| *n += 1);
        };
        apply("7");

        let started = Instant::now();
        assert!(!wait(&cache, "n1", "7").await);
        assert!(started.elapsed() >= MAX_WAIT);

        let waiting = tokio::spawn({
            let cache = cache.clone();
            async move { wait(&cache, "n1", "7").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A change of the store that is not the node's own new version does not end the wait.
        apply("7");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        apply("8");
        let started = Instant::now();
        assert!(waiting.await.unwrap());
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "woken by the change, not by a timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cache_that_stopped_ends_the_wait() {
        let (store, mut writer) = reflector::store::<CachedNode>();
        writer.apply_watcher_event(&watcher::Event::Apply(node("7")));
        let (changed, changes) = watch::channel(0u64);
        let cache = NodeCache { store, changes };
        drop(changed);
        let started = Instant::now();
        assert!(!wait(&cache, "n1", "7").await);
        assert!(started.elapsed() < MAX_WAIT);
    }
}
