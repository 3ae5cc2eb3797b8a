//! The node status update: addresses written right after initialization, and refreshed for every
//! initialized node every `--node-status-update-frequency` by `--concurrent-node-status-updates`
//! workers; with `CloudNodeAdditionalLabelsReconciliation`, the same pass also adds or updates the
//! cloud's additional labels ([`additional_labels`]).

use crate::cached_node::CachedNode;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use cloud_provider::CloudProvider;
use futures::StreamExt;
use k8s_openapi::api::core::v1::NodeAddress;
use kube::{ResourceExt, runtime::reflector::Store};
use tokio_util::sync::CancellationToken;

use crate::{
    controllers::patch::{Target, patch_with_retry, with_resource_version},
    informers::{SharedNodes, wait_for_cache_sync},
};

use super::{
    Context, additional_labels, cloud,
    plan::{addresses_patch, is_uninitialized, plan_addresses},
};

/// Writes the cloud's addresses to the node's status if they differ. Errors are logged, as upstream's.
/// The write carries the node's `resourceVersion` and is re-planned from a fresh read on a conflict.
/// Returns the node as written, when it was.
pub(super) async fn update_addresses(
    ctx: &Context,
    node: &CachedNode,
    cloud_addresses: &[NodeAddress],
) -> Option<CachedNode> {
    match plan_addresses(node, cloud_addresses) {
        Ok(Some(_)) => {}
        Ok(None) => return None,
        Err(err) => {
            tracing::warn!(node = %node.name_any(), error = %err, "not updating node addresses");
            return None;
        }
    }
    let written = patch_with_retry(
        &ctx.api,
        node,
        Target::Status,
        |current, resource_version| {
            let addresses = plan_addresses(current, cloud_addresses).ok().flatten()?;
            Some(with_resource_version(
                addresses_patch(&addresses),
                resource_version,
            ))
        },
    )
    .await;
    match written {
        Ok(updated) => {
            tracing::debug!(node = %node.name_any(), "node addresses updated");
            updated
        }
        Err(err) => {
            tracing::warn!(node = %node.name_any(), error = %err, "could not update node addresses");
            None
        }
    }
}

/// Adds or updates the cloud's additional labels on the node (never deletes one); a node whose labels
/// are already right gets no write. Errors are logged, as upstream's. The write carries the node's
/// `resourceVersion` and is re-planned from a fresh read on a conflict.
async fn update_additional_labels(
    ctx: &Context,
    node: &CachedNode,
    cloud_labels: &BTreeMap<String, String>,
) {
    let planned = additional_labels::plan(node, cloud_labels);
    for key in &planned.dropped {
        ctx.reserved_label_dropped(&node.name_any(), key);
    }
    if planned.set.is_empty() {
        return;
    }
    let written = patch_with_retry(
        &ctx.api,
        node,
        Target::Object,
        |current, resource_version| {
            let plan = additional_labels::plan(current, cloud_labels);
            (!plan.set.is_empty()).then(|| {
                with_resource_version(additional_labels::patch(&plan.set), resource_version)
            })
        },
    )
    .await;
    match written {
        Ok(Some(_)) => {
            tracing::info!(node = %node.name_any(), labels = ?planned.set, "additional labels from the cloud reconciled")
        }
        Ok(None) => {}
        Err(err) => {
            tracing::warn!(node = %node.name_any(), error = %err, "could not reconcile the additional labels from the cloud")
        }
    }
}

/// One pass of the status update over every cached, initialized node: its addresses, then (with
/// `additional_labels`) its additional labels, from one cloud lookup.
async fn refresh_all(
    ctx: &Context,
    cloud: &dyn CloudProvider,
    store: &Store<CachedNode>,
    workers: usize,
    additional_labels: bool,
) {
    let nodes = store.state();
    futures::stream::iter(
        nodes
            .into_iter()
            .filter(|n| !is_uninitialized(n) && ctx.ownership.owns(n)),
    )
    .for_each_concurrent(workers.max(1), |node| async move {
        match cloud::status_lookup(cloud, &node).await {
            Ok(found) => {
                let updated = update_addresses(ctx, &node, &found.addresses).await;
                if additional_labels {
                    let node = updated.as_ref().unwrap_or(&node);
                    update_additional_labels(ctx, node, &found.additional_labels).await;
                }
            }
            Err(err) => {
                tracing::warn!(node = %node.name_any(), error = %err, "address refresh failed")
            }
        }
    })
    .await;
}

/// The periodic status update: once the cache has synced, then every `period` after the previous
/// pass ended.
pub(super) async fn run(
    ctx: Arc<Context>,
    nodes: Arc<SharedNodes>,
    period: Duration,
    workers: usize,
    additional_labels: bool,
    shutdown: CancellationToken,
) {
    if !wait_for_cache_sync(&shutdown, [nodes.synced()]).await {
        return;
    }
    let cloud = ctx.cloud.clone();
    let store = nodes.store();
    loop {
        tokio::select! {
            () = refresh_all(&ctx, cloud.as_ref(), &store, workers, additional_labels) => {}
            () = shutdown.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
