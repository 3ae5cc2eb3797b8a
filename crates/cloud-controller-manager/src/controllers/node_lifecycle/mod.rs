//! The cloud-node-lifecycle controller (`cloud-node-lifecycle-controller`, alias
//! `cloud-node-lifecycle`): every `--node-monitor-period`, deletes not-ready Nodes whose instance is
//! gone and taints those whose instance is shut down.
//!
//! Only a definite answer from the cloud acts: a cloud error skips the node for this pass, never
//! deletes it. Ready nodes are never deleted or tainted. Passes run nodes concurrently (up to
//! `--concurrent-node-syncs`), where upstream goes one by one.

pub mod plan;

use crate::cached_node::CachedNode;
use std::{sync::Arc, time::Duration};

use cloud_provider::CloudProvider;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Preconditions},
    runtime::events::EventType,
};
use serde_json::json;

use self::plan::{is_ready, with_shutdown_taint, without_shutdown_taint};
use super::{
    ControllerContext, ControllerTask,
    node::cloud,
    patch::{Target, patch_with_retry},
    periodic::{PassOutcome, Runner},
};
use crate::{
    events::EventRecorder,
    informers::{SharedNodes, wait_for_cache_sync},
};

/// The event source, as upstream names it.
pub const COMPONENT: &str = "cloud-node-lifecycle-controller";

struct Context {
    api: Api<Node>,
    cloud: Arc<dyn CloudProvider>,
    events: EventRecorder,
    /// Which nodes are this manager's.
    ownership: crate::node_ownership::NodeOwnership,
}

/// The cloud-node-lifecycle controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// How often not-ready nodes are checked against the cloud (`--node-monitor-period`).
    pub period: Duration,
    /// Nodes checked at once (`--concurrent-node-lifecycle-syncs`, by default `--concurrent-node-syncs`).
    pub workers: usize,
}

/// Starts the controller: `None` (with a warning) when the cloud offers neither Instances API.
pub fn start(ctx: ControllerContext, config: Config) -> Option<ControllerTask> {
    if !ctx.offers_instances(COMPONENT) {
        return None;
    }
    let nodes = ctx.informers.nodes();
    let Config { period, workers } = config;
    let context = Context {
        api: Api::all(ctx.client.clone()),
        cloud: ctx.cloud.clone(),
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        ownership: ctx.ownership.clone(),
    };
    let runner = ctx.periodic_runner();
    Some(Box::pin(async move {
        run(context, nodes, period, workers, runner).await;
        Ok(())
    }))
}

async fn run(
    ctx: Context,
    nodes: Arc<SharedNodes>,
    period: Duration,
    workers: usize,
    runner: Runner,
) {
    if !wait_for_cache_sync(&runner.shutdown, [nodes.synced()]).await {
        return;
    }
    let store = nodes.store();
    tracing::debug!(
        nodes = store.state().len(),
        "node cache synced; monitoring nodes"
    );
    let ctx = &ctx;
    runner
        .run(period, None, |_| {
            // A pass in flight finishes even on shutdown: each node's work is short and bounded. Another
            // manager's nodes are never deleted nor tainted here (their instances are not this cloud's).
            let nodes = ctx.ownership.owned(store.state());
            async move {
                futures::stream::iter(nodes)
                    .for_each_concurrent(workers.max(1), |node| monitor(ctx, node))
                    .await;
                PassOutcome::Done
            }
        })
        .await;
}

#[tracing::instrument(skip_all, fields(node = %node.name_any()))]
async fn monitor(ctx: &Context, node: Arc<CachedNode>) {
    if is_ready(&node) {
        if without_shutdown_taint(&node).is_some() {
            set_taints(
                ctx,
                &node,
                without_shutdown_taint,
                "removing the shutdown taint from a ready node",
            )
            .await;
        }
        return;
    }
    match cloud::instance_exists(ctx.cloud.as_ref(), &node).await {
        Err(err) => {
            tracing::warn!(error = %err, "cannot tell whether the instance exists; leaving the node alone this pass");
        }
        Ok(false) => delete(ctx, &node).await,
        Ok(true) => match cloud::instance_shutdown(ctx.cloud.as_ref(), &node).await {
            Ok(true) if with_shutdown_taint(&node).is_some() => {
                set_taints(ctx, &node, with_shutdown_taint, "tainting a shut-down node").await;
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "cannot tell whether the instance is shut down")
            }
        },
    }
}

async fn set_taints(
    ctx: &Context,
    node: &Node,
    change: fn(&Node) -> Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    what: &str,
) {
    tracing::info!("{what}");
    let result = patch_with_retry(&ctx.api, node, Target::Object, |current, resource_version| {
        let taints = change(current)?;
        Some(json!({ "metadata": { "resourceVersion": resource_version }, "spec": { "taints": taints } }))
    })
    .await;
    if let Err(err) = result {
        tracing::warn!(error = %err, "could not update the node's taints");
    }
}

async fn delete(ctx: &Context, node: &Node) {
    let name = node.name_any();
    tracing::info!("deleting node: its instance does not exist in the cloud provider");
    ctx.events
        .record(
            node,
            EventType::Normal,
            "DeletingNode",
            "DeleteNode",
            format!("Deleting node {name} because it does not exist in the cloud provider"),
        )
        .await;
    // The UID precondition never deletes a node that was re-created under the same name meanwhile.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match ctx.api.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => {
            tracing::warn!(error = %err, "could not delete the node");
            ctx.events
                .record(
                    node,
                    EventType::Warning,
                    "DeletingNodeFailed",
                    "DeleteNode",
                    format!("Failed deleting node {name}: {err}"),
                )
                .await;
        }
    }
}
