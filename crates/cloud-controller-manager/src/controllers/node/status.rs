//! Node addresses: written right after initialization, and refreshed for every initialized node every
//! `--node-status-update-frequency` by `--concurrent-node-status-updates` workers.

use crate::cached_node::CachedNode;
use std::{sync::Arc, time::Duration};

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
    Context, cloud,
    plan::{addresses_patch, is_uninitialized, plan_addresses},
};

/// Writes the cloud's addresses to the node's status if they differ. Errors are logged, as upstream's.
/// The write carries the node's `resourceVersion` and is re-planned from a fresh read on a conflict.
pub(super) async fn update_addresses(
    ctx: &Context,
    node: &CachedNode,
    cloud_addresses: &[NodeAddress],
) {
    match plan_addresses(node, cloud_addresses) {
        Ok(Some(_)) => {}
        Ok(None) => return,
        Err(err) => {
            tracing::warn!(node = %node.name_any(), error = %err, "not updating node addresses");
            return;
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
        Ok(_) => tracing::debug!(node = %node.name_any(), "node addresses updated"),
        Err(err) => {
            tracing::warn!(node = %node.name_any(), error = %err, "could not update node addresses")
        }
    }
}

/// One pass of the address refresh over every cached, initialized node.
async fn refresh_all(
    ctx: &Context,
    cloud: &dyn CloudProvider,
    store: &Store<CachedNode>,
    workers: usize,
) {
    let nodes = store.state();
    futures::stream::iter(
        nodes
            .into_iter()
            .filter(|n| !is_uninitialized(n) && ctx.ownership.owns(n)),
    )
    .for_each_concurrent(workers.max(1), |node| async move {
        match cloud::node_addresses(cloud, &node).await {
            Ok(addresses) => update_addresses(ctx, &node, &addresses).await,
            Err(err) => {
                tracing::warn!(node = %node.name_any(), error = %err, "address refresh failed")
            }
        }
    })
    .await;
}

/// The periodic refresh: once the cache has synced, then every `period` after the previous pass ended.
pub(super) async fn run(
    ctx: Arc<Context>,
    nodes: Arc<SharedNodes>,
    period: Duration,
    workers: usize,
    shutdown: CancellationToken,
) {
    if !wait_for_cache_sync(&shutdown, [nodes.synced()]).await {
        return;
    }
    let cloud = ctx.cloud.clone();
    let store = nodes.store();
    loop {
        tokio::select! {
            () = refresh_all(&ctx, cloud.as_ref(), &store, workers) => {}
            () = shutdown.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
