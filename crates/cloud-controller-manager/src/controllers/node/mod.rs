//! The cloud-node controller (`cloud-node-controller`, alias `cloud-node`): initializes Nodes that a
//! kubelet registered with `--cloud-provider=external`, reconciles their GA labels, and keeps their
//! addresses fresh.
//!
//! Nodes are initialized in the order they registered, as upstream's work queue hands them out
//! (ours is `controllers::work_queue`). Better than upstream where it is cheap to be: workers
//! default to 16 instead of 1, a node whose cloud lookup fails is retried on its own back-off
//! without holding up the others, and a reconcile with nothing to change sends nothing.
//! Initialization is one write, a PUT of the node's metadata and spec as upstream's `Update`
//! (without the status upstream also sends, which the API server ignores there); a node with a
//! field this build's types do not know gets a merge patch instead ([`write`]).

pub mod additional_labels;
mod cache_catch_up;
pub(crate) mod cloud;
mod follow_up;
pub mod plan;
mod status;
mod write;

use std::{sync::Arc, time::Duration};

use cloud_provider::CloudProvider;
use k8s_openapi::{
    api::core::v1::{Node, NodeAddress},
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};
use prometheus_client::{metrics::histogram::Histogram, registry::Registry};
use serde_json::json;

use self::{
    cloud::LookupError,
    plan::{NodeIpError, is_uninitialized, plan_initialization, plan_label_reconciliation},
};
use super::{
    ControllerContext, ControllerTask,
    backoff::PerObjectBackoff,
    patch::with_resource_version,
    work_queue::{self, Next},
};
use crate::{events::EventRecorder, informers::CachedNode, metrics::registered};

/// The event source, as upstream names it.
pub(crate) const COMPONENT: &str = "cloud-node-controller";

/// The controller's delay histograms (upstream's names and buckets).
#[derive(Clone)]
pub struct NodeMetrics {
    taint_removal_delay: Histogram,
    initial_sync_delay: Histogram,
}

impl NodeMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let buckets = [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0];
        Self {
            taint_removal_delay: registered(
                registry,
                "node_controller_cloud_provider_taint_removal_delay_seconds",
                "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node.",
                Histogram::new(buckets),
            ),
            initial_sync_delay: registered(
                registry,
                "node_controller_initial_node_sync_delay_seconds",
                "Number of seconds after node creation when NodeController finished the initial synchronization of a single node.",
                Histogram::new(buckets),
            ),
        }
    }

    fn since_creation(node: &Node) -> Option<f64> {
        let created = node.metadata.creation_timestamp.as_ref()?.0;
        let elapsed = Timestamp::now().duration_since(created);
        Some(elapsed.as_secs_f64().max(0.0))
    }
}

/// Why one node could not be reconciled (it is retried on its own back-off).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeError {
    /// The cloud could not describe the node.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The provided-node-ip annotation does not fit the cloud's addresses.
    #[error("node {node}: {source}")]
    NodeIp {
        /// The node.
        node: String,
        /// What is wrong.
        #[source]
        source: NodeIpError,
    },
    /// The API server refused a write.
    #[error("updating node {node}: {source}")]
    Write {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What the reconciler shares.
struct Context {
    api: Api<CachedNode>,
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    events: EventRecorder,
    metrics: NodeMetrics,
    /// Consecutive failures per node, for its exponential back-off.
    backoff: PerObjectBackoff,
    /// Which nodes are this manager's.
    ownership: crate::node_ownership::NodeOwnership,
    /// The shared node cache, to let the address write wait for it ([`cache_catch_up`]).
    nodes: cache_catch_up::NodeCache,
    /// What follows each initialization, off the workers ([`follow_up`]).
    follow_ups: follow_up::FollowUps,
    /// The reserved-namespace keys of the cloud's additional labels already warned about (each is
    /// warned about once, then logged at debug level on every pass).
    dropped_labels: parking_lot::Mutex<std::collections::BTreeSet<String>>,
}

impl Context {
    /// Says that the cloud's additional label `key` for `node` was dropped for lying in a
    /// Kubernetes-reserved namespace.
    fn reserved_label_dropped(&self, node: &str, key: &str) {
        if self.dropped_labels.lock().insert(key.to_owned()) {
            tracing::warn!(%node, label = %key, "dropping the cloud's additional label: it lies in a Kubernetes-reserved namespace (kubernetes.io, k8s.io), as upstream drops it (said once per label)");
        } else {
            tracing::debug!(%node, label = %key, "dropping the cloud's additional label in a Kubernetes-reserved namespace");
        }
    }
}

/// Per-node back-off after consecutive errors: upstream's work-queue default, 5 ms doubling up to 1000 s.
fn backoff() -> PerObjectBackoff {
    PerObjectBackoff::new(Duration::from_millis(5), Duration::from_secs(1000))
}

/// The cloud-node controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Nodes initialized at once (`--concurrent-node-syncs`).
    pub workers: usize,
    /// Workers refreshing node addresses (`--concurrent-node-status-updates`).
    pub status_workers: usize,
    /// How often every node's addresses are refreshed (`--node-status-update-frequency`).
    pub status_period: Duration,
    /// The status update also adds or updates the cloud's additional labels
    /// (`CloudNodeAdditionalLabelsReconciliation`).
    pub additional_labels: bool,
}

/// Starts the controller: `None` (with a warning) when the cloud offers neither Instances API.
pub fn start(ctx: ControllerContext, config: Config) -> Option<ControllerTask> {
    if !ctx.offers_instances(COMPONENT) {
        return None;
    }
    let nodes = ctx.informers.nodes();
    let changes = nodes.subscribe();
    let store = nodes.store();
    let Config {
        workers,
        status_workers,
        status_period,
        additional_labels,
    } = config;
    let context = Arc::new(Context {
        api: Api::all(ctx.client.clone()),
        client: ctx.client.clone(),
        cloud: ctx.cloud.clone(),
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        metrics: ctx.metrics.node.clone(),
        backoff: backoff(),
        ownership: ctx.ownership.clone(),
        nodes: cache_catch_up::NodeCache {
            store: store.clone(),
            changes: nodes.store_changes(),
        },
        follow_ups: follow_up::FollowUps::new(
            follow_up::MAX_PENDING,
            ctx.metrics.work_queues.queue(ctx.name).panics,
            ctx.health.clone(),
        ),
        dropped_labels: Default::default(),
    });
    let shutdown = ctx.shutdown.clone();
    let reporting = work_queue::Reporting {
        metrics: ctx.metrics.work_queues.queue(ctx.name),
        health: ctx.health.clone(),
        events: context.events.clone(),
    };
    // Once the workers have stopped, what their initializations started.
    let finish_follow_ups = {
        let context = context.clone();
        async move { context.follow_ups.finish().await }
    };
    let loops = ctx.clone();
    Some(Box::pin(async move {
        let status_loop = loops.spawn_loop(
            "address-refresh",
            crate::controllers::background_loop::Ends::AtShutdown,
            status::run(
                context.clone(),
                nodes,
                status_period,
                status_workers,
                additional_labels,
                shutdown.clone(),
            ),
        );
        // Nodes are initialized in the order they registered (kube-runtime's Controller would take the
        // backlog in hash order; see work_queue).
        work_queue::run(
            changes,
            store,
            workers,
            reconcile,
            error_policy,
            context,
            reporting,
            shutdown,
        )
        .await;
        finish_follow_ups.await;
        status_loop.finished().await;
        Ok(())
    }))
}

fn error_policy(node: Arc<CachedNode>, err: &NodeError, ctx: Arc<Context>) -> Next {
    let name = node.name_any();
    let (failures, delay) = ctx.backoff.failed(&name);
    let write_error = match err {
        NodeError::Write { source, .. } => Some(source),
        _ => None,
    };
    let delay = crate::outage_retry::retry_delay(delay, write_error);
    tracing::warn!(node = %name, error = %err, retry_in = ?delay, "failed to reconcile node");
    // A failure that will not heal by itself (a bad annotation, a node the API server refuses) is told
    // on the node as well, on the 1st, 2nd, 4th, 8th... failure, so a stuck node is not silent.
    if needs_operator(err) && failures.is_power_of_two() {
        ctx.events.queue(
            node.as_ref(),
            EventType::Warning,
            INITIALIZATION_FAILED,
            "InitializeNode",
            format!("Failed to initialize node: {err}"),
        );
    }
    Next::RequeueAfter(delay)
}

/// The Warning event of a node initialization that needs an operator (our own: upstream only logs).
pub(crate) const INITIALIZATION_FAILED: &str = "FailedToInitializeNode";

/// Whether `err` needs someone to change the node or its annotations (retrying alone will not do).
fn needs_operator(err: &NodeError) -> bool {
    match err {
        NodeError::NodeIp { .. } => true,
        NodeError::Write {
            source: kube::Error::Api(status),
            ..
        } => status.code == 422 || status.code == 400,
        _ => false,
    }
}

#[tracing::instrument(skip_all, fields(node = %node.name_any()))]
async fn reconcile(node: Arc<CachedNode>, ctx: Arc<Context>) -> Result<Next, NodeError> {
    // Another manager's node (`--node-selector`, another cloud's provider ID): not ours to touch.
    if !ctx.ownership.owns(&node) {
        return Ok(Next::AwaitChange);
    }
    let result = if is_uninitialized(&node) {
        initialize(&node, &ctx).await
    } else {
        reconcile_labels(&node, &ctx).await
    };
    if result.is_ok() {
        ctx.backoff.succeeded(&node.name_any());
    }
    result.map(|()| Next::AwaitChange)
}

/// Sets GA labels from beta labels on an initialized node; no cloud call, no write when in sync.
async fn reconcile_labels(node: &Node, ctx: &Context) -> Result<(), NodeError> {
    let labels = plan_label_reconciliation(node);
    if labels.is_empty() {
        return Ok(());
    }
    tracing::info!(?labels, "reconciling GA labels from beta labels");
    let patch = json!({ "metadata": { "labels": labels } });
    ctx.api
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| NodeError::Write {
            node: node.name_any(),
            source,
        })?;
    Ok(())
}

async fn initialize(node: &CachedNode, ctx: &Arc<Context>) -> Result<(), NodeError> {
    let name = node.name_any();
    let Some(metadata) = cloud::instance_metadata(ctx.cloud.as_ref(), node).await? else {
        tracing::info!(
            "the cloud returned no instance metadata; skipping the node until it changes"
        );
        return Ok(());
    };
    // Validate the kubelet's --node-ip against the cloud before touching the node.
    plan::honor_provided_node_ip(node, &metadata.node_addresses).map_err(|source| {
        NodeError::NodeIp {
            node: name.clone(),
            source,
        }
    })?;
    // A status that repeats an address makes the API server refuse every update of the node: write
    // the addresses first.
    if let Some(addresses) = plan::repair_duplicate_addresses(node, &metadata.node_addresses) {
        tracing::warn!(
            ?addresses,
            "the node's status repeats an address; writing its addresses first"
        );
        let resource_version = node.resource_version().unwrap_or_default();
        ctx.api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&with_resource_version(
                    plan::addresses_patch(&addresses),
                    &resource_version,
                )),
            )
            .await
            .map_err(|source| NodeError::Write {
                node: name.clone(),
                source,
            })?;
    }

    let updated = write::initialize(&ctx.api, &ctx.client, node, |current| {
        if !is_uninitialized(current) {
            return None; // initialized meanwhile (by another replica, or a retry that did land)
        }
        let plan = plan_initialization(current, &metadata);
        for (key, existing, wanted) in &plan.kept_labels {
            tracing::warn!(label = %key, %existing, %wanted, "not overwriting an existing label with the cloud's value");
        }
        Some(plan)
    })
    .await
    .map_err(|source| NodeError::Write {
        node: name.clone(),
        source,
    })?;
    let Some(updated) = updated else {
        return Ok(());
    };
    if let Some(delay) = NodeMetrics::since_creation(&updated) {
        ctx.metrics.taint_removal_delay.observe(delay);
    }
    tracing::info!(provider_id = ?updated.spec.as_ref().and_then(|s| s.provider_id.as_deref()), "node initialized");

    // The addresses, the event and the metric follow off this worker, which takes the next node.
    let written_over = node.resource_version().unwrap_or_default();
    ctx.follow_ups
        .start(follow_initialization(
            ctx.clone(),
            updated,
            metadata.node_addresses,
            written_over,
        ))
        .await;
    Ok(())
}

/// What follows the initialization write of a node (`updated`, written over version `written_over`):
/// its addresses right away, not at the next periodic refresh, then the `Synced` event and the
/// initial-sync metric.
///
/// The address write waits until the API server's cache holds the initialized node (else the API
/// server applies the patch twice and reads the node from etcd). A write that stored no new version
/// (a dry run in shadow mode) has nothing to wait for. After a conflict the write replaced a newer
/// version than the one we read; the cache then counts as caught up at once, and the API server's own
/// retry covers the rare stale case.
async fn follow_initialization(
    ctx: Arc<Context>,
    updated: CachedNode,
    cloud_addresses: Vec<NodeAddress>,
    written_over: String,
) {
    let name = updated.name_any();
    if updated.resource_version().as_deref() != Some(written_over.as_str())
        && plan::plan_addresses(&updated, &cloud_addresses).is_ok_and(|p| p.is_some())
        && !cache_catch_up::wait(&ctx.nodes, &name, &written_over).await
    {
        tracing::debug!(
            waited = ?cache_catch_up::MAX_WAIT,
            "the node cache has not seen the initialization yet; writing the addresses anyway"
        );
    }
    status::update_addresses(&ctx, &updated, &cloud_addresses).await;

    ctx.events
        .record(
            &updated,
            EventType::Normal,
            "Synced",
            "InitializeNode",
            "Node synced successfully".to_owned(),
        )
        .await;
    if let Some(delay) = NodeMetrics::since_creation(&updated) {
        ctx.metrics.initial_sync_delay.observe(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_to_1000s() {
        let backoff = backoff();
        assert_eq!(backoff.delay(1), Duration::from_millis(5));
        assert_eq!(backoff.delay(2), Duration::from_millis(10));
        assert_eq!(backoff.delay(11), Duration::from_millis(5 * 1024));
        assert_eq!(backoff.delay(40), Duration::from_secs(1000));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1000));
    }
}
