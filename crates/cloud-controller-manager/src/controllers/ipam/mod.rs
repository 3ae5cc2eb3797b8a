//! The node-IPAM controller (`node-ipam-controller`, alias `nodeipam`; upstream has it only in the
//! Kubernetes example `main`): with `--allocate-node-cidrs`, gives every Node a pod CIDR per cluster
//! CIDR family (`spec.podCIDR` and `spec.podCIDRs`), never the same one twice.
//!
//! At start it rebuilds which CIDRs are taken from the Nodes themselves, so a restart reallocates
//! nothing; a deleted Node's CIDRs are freed; an exhausted range is not a failure for the others: the
//! nodes that find it full wait ([`waiting`]), each on its own back-off (5 s doubling to 5 min) with one
//! `CIDRNotAvailable` event per step, the range's being full is told once (a log line and a
//! `CIDRRangeExhausted` event in `kube-system`), and a freed CIDR goes at once to the node that has
//! waited longest.
//!
//! Views older than our own write. The controller acts on each watched change of a Node, and a change
//! written by someone else just before our CIDR write (the cloud-node controller initializes the same
//! new Node at the same moment) reaches us after the write succeeded, still without `spec.podCIDRs`.
//! Upstream's range allocator guards against acting twice in two ways, and so does this one:
//! - it remembers what it gave each node (upstream: the CIDR set plus, in older versions, its
//!   `nodesInProcessing` set), keyed by name *and UID*: `spec.podCIDRs` can only be set once, so a view
//!   of the same node without CIDRs is older than our write and needs nothing; a new UID under the same
//!   name is a new node, and the old one's CIDRs go back;
//! - before treating a failed write as a failure it looks at the node afresh, as upstream's
//!   `updateCIDRsAllocation` does before each write: a node that holds our CIDRs took the write, one
//!   that holds others keeps them ("Node already has a CIDR allocated. Releasing the new one") and
//!   ours go back. Only a node still without CIDRs gets the `CIDRAssignmentFailed` Warning.

pub mod allocator;
mod assign;
mod config;
pub mod waiting;

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube::Api;

pub use self::config::Config;
use self::{allocator::CidrSet, assign::Allocator};
use super::{ControllerContext, ControllerTask};
use crate::{
    cached_node::CachedNode,
    events::EventRecorder,
    informers::{Change, wait_for_cache_sync},
};

/// The event source, as upstream's range allocator names it.
pub const COMPONENT: &str = "cidrAllocator";

/// Starts the controller on CIDR sets from [`Config::cidr_sets`].
pub fn start(ctx: ControllerContext, sets: Vec<CidrSet>) -> Option<ControllerTask> {
    let nodes = ctx.informers.nodes();
    let changes = nodes.subscribe_changes();
    let allocator = Allocator::new(
        Api::all(ctx.client.clone()),
        EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        sets,
    );
    let shutdown = ctx.shutdown.clone();
    let ownership = ctx.ownership.clone();
    Some(Box::pin(async move {
        if !wait_for_cache_sync(&shutdown, [nodes.synced()]).await {
            return Ok(());
        }
        run(
            allocator,
            nodes.store().state(),
            changes,
            ownership,
            shutdown,
        )
        .await;
        Ok(())
    }))
}

async fn run(
    mut allocator: Allocator,
    existing: Vec<Arc<CachedNode>>,
    changes: impl Stream<Item = Change<CachedNode>> + Send,
    ownership: crate::node_ownership::NodeOwnership,
    shutdown: tokio_util::sync::CancellationToken,
) {
    // What is taken first, from every node, so nothing is handed out twice after a restart.
    for node in &existing {
        allocator.occupy(node);
    }
    tracing::info!(
        nodes = existing.len(),
        held = allocator.held.len(),
        "node CIDR allocations rebuilt from the cluster"
    );
    let mut changes = Box::pin(changes);
    loop {
        let next_step = allocator.waiting.next_step();
        // Only awaited while some node waits (the guard); the hour is never reached.
        let step = tokio::time::sleep_until(
            next_step.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        tokio::select! {
            change = changes.next() => match change {
                Some(Change::Applied(node)) => {
                    // Another manager's node gets no CIDR from this one, but the ones it has are
                    // taken, so none is handed out twice.
                    if !ownership.owns(&node) {
                        allocator.occupy(&node);
                    } else if node.metadata.deletion_timestamp.is_none() {
                        allocator.allocate(node).await;
                    }
                }
                Some(Change::Deleted(node)) => allocator.forget(&node),
                None => return,
            },
            () = step, if next_step.is_some() => allocator.step_due().await,
            () = shutdown.cancelled() => return,
        }
        // A CIDR that went back (a node deleted, a write refused) serves a waiting node at once.
        allocator.wake().await;
        if allocator.waiting.full_ended() {
            tracing::info!(
                waiting = allocator.waiting.len(),
                "no node waits for room in the pod CIDR range any more"
            );
        }
    }
}

#[cfg(test)]
mod tests;
