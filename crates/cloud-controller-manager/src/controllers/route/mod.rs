//! The node-route controller (`node-route-controller`, alias `route`): every
//! `--route-reconciliation-period`, makes the cloud's routes match the nodes' `spec.podCIDRs` within
//! `--cluster-cidr`, and reports the result in each node's `NetworkUnavailable` condition.

pub mod plan;

use crate::cached_node::CachedNode;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cloud_provider::{CloudProvider, Route, Routes};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};
use prometheus_client::{metrics::counter::Counter, registry::Registry};
use tokio_util::sync::CancellationToken;

use self::plan::{Action, ConditionWanted, condition_patch, plan_routes, wanted_condition};
use super::{
    ControllerContext, ControllerTask,
    patch::{with_resource_version, write_with_retry},
};
use crate::{
    events::EventRecorder,
    informers::{SharedNodes, wait_for_cache_sync},
};

/// The event source, as upstream names it (with an underscore).
pub const COMPONENT: &str = "route_controller";

/// At most this many cloud route calls in flight (upstream's limit).
const MAX_IN_FLIGHT: usize = 200;

/// The controller's metric (upstream's name).
#[derive(Clone)]
pub struct RouteMetrics {
    syncs: Counter,
}

impl RouteMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            syncs: Counter::default(),
        };
        registry.register(
            "route_controller_route_sync",
            "A metric counting the amount of times routes have been synced with the cloud provider.",
            metrics.syncs.clone(),
        );
        metrics
    }
}

struct Context {
    api: Api<Node>,
    cloud: Arc<dyn CloudProvider>,
    cluster_name: String,
    cluster_cidrs: Vec<IpNet>,
    events: EventRecorder,
    metrics: RouteMetrics,
}

/// The node-route controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `--cluster-name` passed to the cloud's route calls.
    pub cluster_name: String,
    /// The pod CIDRs of the cluster (`--cluster-cidr`): routes outside them are not ours.
    pub cluster_cidrs: Vec<IpNet>,
    /// How often routes are reconciled (`--route-reconciliation-period`).
    pub period: Duration,
}

/// Starts the controller: `None` (logged) when the cloud offers no routes.
pub fn start(ctx: ControllerContext, config: Config) -> Option<ControllerTask> {
    if ctx.cloud.routes().is_none() {
        tracing::warn!(
            "node-route-controller not started: the cloud provider does not support routes"
        );
        return None;
    }
    let Config {
        cluster_name,
        cluster_cidrs,
        period,
    } = config;
    let context = Context {
        api: Api::all(ctx.client.clone()),
        cloud: ctx.cloud.clone(),
        cluster_name,
        cluster_cidrs,
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        metrics: ctx.metrics.route.clone(),
    };
    let nodes = ctx.informers.nodes();
    let shutdown = ctx.shutdown.clone();
    Some(Box::pin(async move {
        run(context, nodes, period, shutdown).await;
        Ok(())
    }))
}

async fn run(ctx: Context, nodes: Arc<SharedNodes>, period: Duration, shutdown: CancellationToken) {
    if !wait_for_cache_sync(&shutdown, [nodes.synced()]).await {
        return;
    }
    let store = nodes.store();
    // Start to start, like upstream's non-sliding loop.
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let Some(routes) = ctx.cloud.routes() else {
            tracing::warn!("the cloud stopped offering routes; skipping this pass");
            continue;
        };
        reconcile(&ctx, routes, &store.state()).await;
    }
}

/// One pass: delete stale routes, create missing ones, then set the nodes' conditions.
async fn reconcile(ctx: &Context, routes: &dyn Routes, nodes: &[Arc<CachedNode>]) {
    ctx.metrics.syncs.inc();
    let existing = match routes.list_routes(&ctx.cluster_name).await {
        Ok(existing) => existing,
        Err(err) => {
            tracing::warn!(error = %err, "could not list routes; skipping this pass");
            return;
        }
    };
    let plan = plan_routes(nodes, &existing, &ctx.cluster_cidrs);

    // Deletions first (and, when routes carry node addresses, before any creation).
    futures::stream::iter(&plan.delete)
        .for_each_concurrent(MAX_IN_FLIGHT, |route| async move {
            tracing::info!(route = %route.name, target = %route.target_node, cidr = %route.destination_cidr, blackhole = route.blackhole, "deleting route");
            if let Err(err) = routes.delete_route(&ctx.cluster_name, route).await {
                tracing::warn!(route = %route.name, error = %err, "could not delete route");
            }
        })
        .await;

    let actions = Mutex::new(plan.actions);
    futures::stream::iter(plan.create)
        .for_each_concurrent(MAX_IN_FLIGHT, |(node, cidr)| {
            let actions = &actions;
            async move {
                let started = Instant::now();
                let route = Route {
                    target_node: node.name_any(),
                    target_node_addresses: node
                        .status
                        .as_ref()
                        .and_then(|s| s.addresses.clone())
                        .unwrap_or_default(),
                    destination_cidr: cidr.clone(),
                    ..Default::default()
                };
                let hint = node.metadata.uid.clone().unwrap_or_default();
                match routes.create_route(&ctx.cluster_name, &hint, &route).await {
                    Ok(()) => {
                        tracing::info!(node = %route.target_node, %cidr, "created route");
                        actions
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert((route.target_node.clone(), cidr.clone()), Action::Keep);
                    }
                    Err(err) => {
                        let message = format!(
                            "Could not create route {hint} {cidr} for node {} after {:?}: {err}",
                            route.target_node,
                            started.elapsed()
                        );
                        tracing::warn!("{message}");
                        ctx.events
                            .record(
                                node.as_ref(),
                                EventType::Warning,
                                "FailedToCreateRoute",
                                "CreateRoute",
                                message,
                            )
                            .await;
                    }
                }
            }
        })
        .await;

    let actions = actions.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut by_node: HashMap<String, Vec<Action>> = HashMap::new();
    for ((node, _), action) in &actions {
        by_node.entry(node.clone()).or_default().push(*action);
    }
    let targets: Vec<&Arc<CachedNode>> = nodes
        .iter()
        .filter(|n| {
            by_node.contains_key(&n.name_any()) || plan.route_targets.contains(&n.name_any())
        })
        .collect();
    futures::stream::iter(targets)
        .for_each_concurrent(MAX_IN_FLIGHT, |node| {
            let node_actions = by_node
                .get(&node.name_any())
                .map(Vec::as_slice)
                .unwrap_or_default();
            async move { set_condition(ctx, node, wanted_condition(node_actions)).await }
        })
        .await;
}

/// The write carries the node's `resourceVersion` and is re-planned from a fresh read on a conflict (the
/// node changed since the cache saw it); a strategic merge patch, so the other conditions stay.
async fn set_condition(ctx: &Context, node: &Node, wanted: ConditionWanted) {
    let now = Timestamp::now();
    let written = write_with_retry(&ctx.api, node, |current| {
        let patch = condition_patch(current, wanted, now)?;
        let patch = with_resource_version(patch, &current.resource_version().unwrap_or_default());
        let name = current.name_any();
        Some(async move {
            ctx.api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
        })
    })
    .await;
    if let Err(err) = written {
        tracing::warn!(node = %node.name_any(), error = %err, "could not update the NetworkUnavailable condition");
    }
}
