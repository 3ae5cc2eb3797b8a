//! Node sync: gives load balancers the cluster's current backend nodes when the node set changes in a way
//! that matters, and on a safety-net period.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use cloud_provider::CloudError;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use tokio_util::sync::CancellationToken;

use super::{
    Backends, Context, Tracked,
    events::{ServiceEvent, Step},
    key,
    node_set::{BackendFacts, BackendSet},
    plan::wants_load_balancer,
};
use crate::informers::Change;

/// How long a node sync waits for more node changes after the first one.
const NODE_SYNC_SETTLE: Duration = Duration::from_millis(500);
/// The safety net: a node sync pass this often even without node changes (upstream's
/// `nodeSyncPeriod`). A pass that finds every load balancer's backends current calls nothing.
const NODE_SYNC_PERIOD: Duration = Duration::from_secs(100);

/// Node sync: a node change that alters the backend set (added, deleted, exclusion flipped, provider ID
/// changed) updates the load balancers whose backends differ; other node updates (heartbeats, conditions,
/// labels) do nothing. One pass at a time, after the changes of a burst have settled (500 ms); changes
/// during a pass cause one more pass. A sync that ends with outdated backends asks for a pass, and one
/// runs every [`NODE_SYNC_PERIOD`] in any case, with the backend list recomputed from the node cache.
pub(super) async fn node_sync_loop(
    ctx: Arc<Context>,
    changes: impl Stream<Item = Change<Node>> + Send + 'static,
    shutdown: CancellationToken,
) {
    let mut changes = Box::pin(changes);
    let mut facts: HashMap<String, BackendFacts> = HashMap::new();
    // Whether the change triggers a node sync; any change to what the predicates read also drops the
    // cached backend list.
    let mut observe = |change: Change<Node>| -> bool {
        let (before, after) = match change {
            Change::Applied(node) => {
                let now = BackendFacts::of(&node);
                (facts.insert(node.name_any(), now.clone()), Some(now))
            }
            Change::Deleted(node) => (facts.remove(&node.name_any()), None),
        };
        if before != after {
            ctx.forget_backends();
        }
        before.as_ref().map(BackendFacts::sync_facts)
            != after.as_ref().map(BackendFacts::sync_facts)
    };
    let mut period = tokio::time::interval(NODE_SYNC_PERIOD);
    period.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    period.reset(); // the first tick after a period, not at once
    loop {
        let mut pending = tokio::select! {
            change = changes.next() => match change { Some(change) => observe(change), None => return },
            () = ctx.node_sync_wanted.notified() => true,
            _ = period.tick() => {
                ctx.forget_backends();
                true
            }
            () = shutdown.cancelled() => return,
        };
        // Take every change already waiting, so a burst of node events makes one pass.
        while let Some(Some(change)) = changes.next().now_or_never() {
            pending |= observe(change);
        }
        if !pending {
            continue;
        }
        // Nodes come and go in bursts (a scale-up, a rolling replacement): gather what follows within a
        // short settle time, so each load balancer gets one update for the burst, not one per node.
        let settle = tokio::time::sleep(NODE_SYNC_SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(change) => { observe(change); }
                    None => return,
                },
                () = &mut settle => break,
                () = shutdown.cancelled() => return,
            }
        }
        sync_nodes(&ctx).await;
    }
}

async fn sync_nodes(ctx: &Arc<Context>) {
    let started = Instant::now();
    let Backends { nodes, set: wanted } = ctx.backends();
    let stale: Vec<Tracked> = ctx
        .tracked()
        .values()
        .filter(|t| {
            t.synced
                && wants_load_balancer(&t.service)
                && !Arc::ptr_eq(&t.backends, &wanted)
                && t.backends != wanted
        })
        .cloned()
        .collect();
    if stale.is_empty() {
        return;
    }
    tracing::info!(
        services = stale.len(),
        nodes = nodes.len(),
        "updating load balancer hosts"
    );
    futures::stream::iter(stale)
        .for_each_concurrent(ctx.workers.max(1), |tracked| {
            let nodes = &nodes;
            let wanted = &wanted;
            async move { update_hosts(ctx, tracked, nodes, wanted).await }
        })
        .await;
    ctx.metrics
        .nodesync_latency
        .observe(started.elapsed().as_secs_f64());
}

async fn update_hosts(ctx: &Context, tracked: Tracked, nodes: &[Node], wanted: &Arc<BackendSet>) {
    let service = tracked.service;
    let key = key(&service);
    // Recorded before the cloud call: a failure is retried through a full sync, not here.
    if let Some(entry) = ctx.tracked().get_mut(&key) {
        entry.backends = wanted.clone();
    }
    let Ok(lb) = ctx.load_balancer() else { return };
    let started = Instant::now();
    ctx.metrics.sync_total.inc();
    let result = lb
        .update_load_balancer(&ctx.cluster_name, &service, nodes)
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
            ServiceEvent::UpdateLoadBalancerFailed { nodes, error: &err }
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
