//! Node sync: gives load balancers the cluster's current backend nodes when the node set changes in a way
//! that matters, and on a safety-net period.

use crate::{cached_node::CachedNode, controllers::provider_panic::caught};
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cloud_provider::CloudError;
use futures::{Stream, StreamExt};
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Backends, Context, ServedClasses, Tracked,
    events::{ServiceEvent, Step},
    node_set::BackendFacts,
    plan::wants_load_balancer,
};
use crate::informers::Change;

/// A node sync pass runs once relevant node changes have paused this long. The bursts a short wait can
/// gather are made by API clients (a script or `kubectl` deleting or relabelling nodes, an autoscaler
/// removing a group): their changes come a request round trip apart, a few milliseconds to some tens
/// (the benchmark's 20 creations and 20 deletions: 21 to 39 ms in all, at most 9 ms apart). Kubelets
/// registering new machines come seconds apart, which no wait here gathers. Every millisecond waited
/// delays every change, and is what upstream saves by syncing at once (paying with a second update for
/// the load balancers it updated mid-burst): hence 50 ms. A burst with a longer pause is two bursts,
/// and costs no more than upstream: the second reaches the load balancers the first one's pass has not
/// updated yet, so only those it updated already get a second update.
const NODE_SYNC_QUIET: Duration = Duration::from_millis(50);
/// However long a burst goes on, its pass runs at most this long after its first change.
const NODE_SYNC_MAX_WAIT: Duration = Duration::from_millis(500);
/// The safety net: a node sync pass this often even without node changes (upstream's
/// `nodeSyncPeriod`). A pass that finds every load balancer's backends current calls nothing.
const NODE_SYNC_PERIOD: Duration = Duration::from_secs(100);

/// Relevant node changes that no pass has handled yet.
#[derive(Debug, Clone, Copy)]
struct Burst {
    first: Instant,
    last: Instant,
}

impl Burst {
    fn new(now: Instant) -> Self {
        Self {
            first: now,
            last: now,
        }
    }

    /// When its pass is due: after [`NODE_SYNC_QUIET`] without another change, and no later than
    /// [`NODE_SYNC_MAX_WAIT`] after the first.
    fn due(&self) -> Instant {
        (self.last + NODE_SYNC_QUIET).min(self.first + NODE_SYNC_MAX_WAIT)
    }

    /// Whether a change at `now` pauses this burst's pass: the pass started before the burst ended (its
    /// changes paused longer than [`NODE_SYNC_QUIET`] and went on), so the updates it has not started
    /// would give the backends of the burst's middle; they wait for the burst to end instead. Only up to
    /// [`NODE_SYNC_MAX_WAIT`] after the first change: a burst that never pauses still gets its pass.
    fn pauses_pass_at(&self, now: Instant) -> bool {
        now < self.first + NODE_SYNC_MAX_WAIT
    }
}

/// Node sync: a node change that alters the backend set (added, deleted, exclusion flipped, provider ID
/// changed) updates the load balancers whose backends differ; other node updates (heartbeats, conditions,
/// labels) do nothing. A burst of changes makes one pass, once the changes have paused for
/// [`NODE_SYNC_QUIET`] (50 ms) or at most [`NODE_SYNC_MAX_WAIT`] (500 ms) after the first; so a lone
/// change waits 50 ms, and each load balancer gets one update per burst. One pass at a time: each of
/// its updates gives the backends current when that update starts, so changes during a pass reach the
/// load balancers not updated yet, and start the next burst, whose pass updates only the load balancers
/// given older backends. A change within [`NODE_SYNC_MAX_WAIT`] of its burst's first is that burst going
/// on after a pause: the pass starts no more updates (those in the cloud finish), and the load balancers
/// it has not reached wait with the burst for the next quiet period, rather than each getting the
/// backends of the burst's middle and a second update after it. Changes are read during a pass too, so
/// the shared node watch never waits for it. A sync that ends with outdated backends asks for a pass,
/// and one runs every [`NODE_SYNC_PERIOD`] in any case, with the backend list recomputed from the node
/// cache.
pub(super) async fn node_sync_loop(
    ctx: Arc<Context>,
    changes: impl Stream<Item = Change<CachedNode>> + Send + 'static,
    shutdown: CancellationToken,
) {
    let mut watch = NodeWatch {
        changes: Box::pin(changes),
        facts: HashMap::new(),
        ctx: ctx.clone(),
    };
    let mut period = tokio::time::interval(NODE_SYNC_PERIOD);
    period.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    period.reset(); // the first tick after a period, not at once
    // Changes seen during the last pass, for the next one.
    let mut next: Option<Burst> = None;
    loop {
        let burst = match next.take() {
            Some(burst) => Some(burst),
            None => watch.first_change(&mut period, &shutdown).await,
        };
        let Some(mut burst) = burst else { return };
        // Nodes often change in bursts (a script or an autoscaler deleting or relabelling a group): gather
        // what follows until the changes pause, so each load balancer gets one update for the burst, not
        // one per node.
        if !watch.until_quiet(&mut burst, &shutdown).await {
            return;
        }
        match watch.pass(&mut burst, &shutdown).await {
            None => return,
            // The updates it did not start wait for the burst's next quiet period (or its 500 ms).
            Some(PassEnd::Paused) => next = Some(burst),
            Some(PassEnd::Done { next_burst }) => next = next_burst,
        }
    }
}

/// How a node sync's pass ended.
enum PassEnd {
    /// Paused by its burst going on: the updates not started wait for the burst's end.
    Paused,
    /// Done; a burst that started during it comes next.
    Done { next_burst: Option<Burst> },
}

/// The node changes the node sync reads, and what it knows of each node from them.
struct NodeWatch<S> {
    changes: std::pin::Pin<Box<S>>,
    /// Each node's backend facts and whether this manager may back with it.
    facts: HashMap<String, (BackendFacts, bool)>,
    ctx: Arc<Context>,
}

impl<S: Stream<Item = Change<CachedNode>>> NodeWatch<S> {
    /// Whether the change triggers a node sync; any change to what the predicates read also drops the
    /// cached backend list.
    fn observe(&mut self, change: Change<CachedNode>) -> bool {
        let ctx = &self.ctx;
        let (before, after) = match change {
            Change::Applied(node) => {
                // A node that stops (or starts) being this manager's leaves (or joins) the backends.
                let now = (BackendFacts::of(&node), ctx.may_back(&node));
                (self.facts.insert(node.name_any(), now.clone()), Some(now))
            }
            Change::Deleted(node) => (self.facts.remove(&node.name_any()), None),
        };
        if before != after {
            ctx.forget_backends();
        }
        let relevant = |f: &(BackendFacts, bool)| (f.0.sync_facts().clone(), f.1);
        before.as_ref().map(relevant) != after.as_ref().map(relevant)
            // A relabelled node, when some load balancer selects its backends by labels.
            || (before.as_ref().map(|f| f.0.labels()) != after.as_ref().map(|f| f.0.labels())
                && ctx.tracked().values().any(|t| t.labels.watched()))
    }

    /// Waits for a change that triggers a sync, a pass asked for, or the period; the burst it starts.
    /// `None` at shutdown, or when the changes ended.
    async fn first_change(
        &mut self,
        period: &mut tokio::time::Interval,
        shutdown: &CancellationToken,
    ) -> Option<Burst> {
        loop {
            let wanted = tokio::select! {
                change = self.changes.next() => self.observe(change?),
                () = self.ctx.node_sync_wanted.notified() => true,
                _ = period.tick() => {
                    self.ctx.forget_backends();
                    true
                }
                () = shutdown.cancelled() => return None,
            };
            if wanted {
                return Some(Burst::new(Instant::now()));
            }
        }
    }

    /// Gathers the burst's changes until they pause (or its longest wait); false at shutdown, or when
    /// the changes ended.
    async fn until_quiet(&mut self, burst: &mut Burst, shutdown: &CancellationToken) -> bool {
        loop {
            tokio::select! {
                change = self.changes.next() => match change {
                    Some(change) => if self.observe(change) {
                        burst.last = Instant::now();
                    },
                    None => return false,
                },
                () = tokio::time::sleep_until(burst.due()) => return true,
                () = shutdown.cancelled() => return false,
            }
        }
    }

    /// Runs a pass, observing the changes as they come. One soon after the burst's first change pauses
    /// the pass (the burst goes on); a later one starts the next burst, and the updates not started yet
    /// give the new backends. `None` at shutdown, or when the changes ended.
    async fn pass(&mut self, burst: &mut Burst, shutdown: &CancellationToken) -> Option<PassEnd> {
        let ctx = self.ctx.clone();
        let paused = AtomicBool::new(false);
        let mut next_burst: Option<Burst> = None;
        let pass = sync_nodes(&ctx, &paused);
        tokio::pin!(pass);
        loop {
            tokio::select! {
                () = &mut pass => break,
                change = self.changes.next() => if self.observe(change?) {
                    let now = Instant::now();
                    if paused.load(Ordering::Relaxed) || burst.pauses_pass_at(now) {
                        paused.store(true, Ordering::Relaxed);
                        burst.last = now;
                    } else {
                        next_burst.get_or_insert(Burst::new(now)).last = now;
                    }
                },
                () = shutdown.cancelled() => return None,
            }
        }
        Some(if paused.load(Ordering::Relaxed) {
            PassEnd::Paused
        } else {
            PassEnd::Done { next_burst }
        })
    }
}

/// Whether a load balancer needs `wanted` as its backends: the Service's last sync completed, it wants a
/// load balancer, and its backends differ.
fn outdated(tracked: &Tracked, backends: &Backends, served: &ServedClasses) -> bool {
    let wanted = &backends.set;
    tracked.synced
        && wants_load_balancer(&tracked.service, served)
        && ((!Arc::ptr_eq(&tracked.backends, wanted) && tracked.backends != *wanted)
            || tracked.labels.changed(&backends.nodes))
}

/// One node sync pass; once `paused` is set it starts no more updates (those started finish).
async fn sync_nodes(ctx: &Arc<Context>, paused: &AtomicBool) {
    let started = Instant::now();
    // Without a load balancer to update, the backend list is not built: node initialization changes
    // every new node's facts, and rebuilding the list for each burst of a big backlog was a third of the
    // manager's CPU (measured at 2,000 nodes and no Services).
    let any_load_balancer = ctx
        .tracked()
        .values()
        .any(|tracked| tracked.synced && wants_load_balancer(&tracked.service, &ctx.served));
    if !any_load_balancer {
        return;
    }
    let backends = ctx.backends();
    let stale: Vec<String> = ctx
        .tracked()
        .iter()
        .filter(|(_, tracked)| outdated(tracked, &backends, &ctx.served))
        .map(|(key, _)| key.clone())
        .collect();
    if stale.is_empty() {
        return;
    }
    tracing::info!(
        services = stale.len(),
        nodes = backends.nodes.len(),
        "updating load balancer hosts"
    );
    futures::stream::iter(stale)
        .for_each_concurrent(ctx.workers.max(1), |key| async move {
            if !paused.load(Ordering::Relaxed) {
                update_hosts(ctx, key).await;
            }
        })
        .await;
    if paused.load(Ordering::Relaxed) {
        tracing::info!("node sync pass paused: the nodes are still changing");
    }
    ctx.metrics
        .nodesync_latency
        .observe(started.elapsed().as_secs_f64());
}

async fn update_hosts(ctx: &Context, key: String) {
    // The backends as they are when this update starts, not when the pass started: a node change since
    // then reaches this load balancer in this pass.
    let backends = ctx.backends();
    let service = {
        let mut tracked = ctx.tracked();
        let Some(entry) = tracked.get_mut(&key) else {
            return;
        };
        // A sync since the pass started may have given it these backends, or be under way.
        if !outdated(entry, &backends, &ctx.served) {
            return;
        }
        // Recorded before the cloud call: a failure is retried through a full sync, not here.
        entry.backends = backends.set.clone();
        entry.labels = entry.labels.now(&backends.nodes);
        entry.service.clone()
    };
    let nodes = backends.nodes;
    let Ok(lb) = ctx.load_balancer() else { return };
    let started = Instant::now();
    ctx.metrics.sync_total.inc();
    let result = caught(
        "update_load_balancer",
        lb.update_load_balancer(&ctx.cluster_name, &service, &nodes),
    )
    .await;
    ctx.metrics
        .host_update_latency
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(()) if nodes.is_empty() => {
            ServiceEvent::NoAvailableNodes(Step::Update)
                .record(&ctx.events, &service)
                .await;
        }
        Ok(()) => {
            ServiceEvent::UpdatedLoadBalancer
                .record(&ctx.events, &service)
                .await;
        }
        Err(CloudError::ImplementedElsewhere) => {}
        Err(err) => {
            // A load balancer that is gone needs no hosts.
            if let Ok(None) = lb.get_load_balancer(&ctx.cluster_name, &service).await {
                return;
            }
            ctx.metrics.nodesync_errors.inc();
            ServiceEvent::UpdateLoadBalancerFailed {
                nodes: &nodes,
                error: &err,
            }
            .record(&ctx.events, &service)
            .await;
            tracing::warn!(service = %key, error = %err, "updating load balancer hosts failed; retrying with a full sync");
            if let Some(entry) = ctx.tracked().get_mut(&key) {
                entry.synced = false;
            }
            let _ = ctx.retry.send(ObjectRef::from_obj(service.as_ref()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_waits_for_a_quiet_period_and_at_most_500_ms() {
        let start = Instant::now();
        let ms = |ms| Duration::from_millis(ms);
        // A lone change: 50 ms.
        let mut burst = Burst::new(start);
        assert_eq!(burst.due(), start + ms(50));
        // Each change pushes it back...
        burst.last = start + ms(40);
        assert_eq!(burst.due(), start + ms(90));
        // ...but not past 500 ms after the first.
        burst.last = start + ms(450);
        assert_eq!(burst.due(), start + ms(500));
    }

    #[test]
    fn a_change_pauses_the_pass_only_within_500_ms_of_the_bursts_first() {
        let start = Instant::now();
        let ms = |ms| Duration::from_millis(ms);
        let burst = Burst::new(start);
        for (after, pauses) in [
            (0, true),
            (60, true),
            (499, true),
            (500, false),
            (2_000, false),
        ] {
            assert_eq!(
                burst.pauses_pass_at(start + ms(after)),
                pauses,
                "a change {after} ms after the first"
            );
        }
    }
}
