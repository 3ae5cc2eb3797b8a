//! The node-route controller (`node-route-controller`, alias `route`): every
//! `--route-reconciliation-period` (or, with the `CloudControllerManagerWatchBasedRoutesReconciliation`
//! gate, as soon as a node changes in a way routes depend on: see `triggers`), makes the cloud's routes
//! match the nodes' `spec.podCIDRs` within `--cluster-cidr`, and reports the result in each node's
//! `NetworkUnavailable` condition.

pub mod metrics;
pub mod plan;
pub mod triggers;

use crate::cached_node::CachedNode;
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use self::metrics::Outcome;
pub use self::metrics::RouteMetrics;
use self::triggers::{MIN_INTERVAL, NodeViews, Trigger};
use cloud_provider::{CloudProvider, Route, Routes};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};

use self::plan::{Action, ConditionWanted, condition_patch, plan_routes, wanted_condition};
use super::{
    ControllerContext, ControllerTask,
    patch::{with_resource_version, write_with_retry},
    periodic::{PassOutcome, PassRequests, Runner, Started},
};
use crate::{
    events::EventRecorder,
    informers::{Change, SharedNodes, wait_for_cache_sync},
};

/// The event source, as upstream names it (with an underscore).
pub const COMPONENT: &str = "route_controller";

/// At most this many cloud route calls in flight (upstream's limit).
const MAX_IN_FLIGHT: usize = 200;

struct Context {
    api: Api<Node>,
    cloud: Arc<dyn CloudProvider>,
    cluster_name: String,
    cluster_cidrs: Vec<IpNet>,
    events: EventRecorder,
    metrics: RouteMetrics,
    /// Which nodes are this manager's.
    ownership: crate::node_ownership::NodeOwnership,
}

/// The node-route controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `--cluster-name` passed to the cloud's route calls.
    pub cluster_name: String,
    /// The pod CIDRs of the cluster (`--cluster-cidr`): routes outside them are not ours.
    pub cluster_cidrs: Vec<IpNet>,
    /// How often routes are reconciled (`--route-reconciliation-period`); a safety net in
    /// watch-based mode.
    pub period: Duration,
    /// Reconcile on node changes (`CloudControllerManagerWatchBasedRoutesReconciliation`).
    pub watch_based: bool,
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
        watch_based,
    } = config;
    let context = Context {
        api: Api::all(ctx.client.clone()),
        cloud: ctx.cloud.clone(),
        cluster_name,
        cluster_cidrs,
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        metrics: ctx.metrics.route.clone(),
        ownership: ctx.ownership.clone(),
    };
    let nodes = ctx.informers.nodes();
    // Subscribed as the controller is built, so no change after the caches start is missed.
    let changes = watch_based.then(|| nodes.subscribe_changes());
    let runner = ctx.periodic_runner();
    Some(Box::pin(async move {
        run(context, nodes, period, changes, runner).await;
        Ok(())
    }))
}

async fn run(
    ctx: Context,
    nodes: Arc<SharedNodes>,
    period: Duration,
    changes: Option<impl futures::Stream<Item = Change<CachedNode>> + Send + 'static>,
    runner: Runner,
) {
    if !wait_for_cache_sync(&runner.shutdown, [nodes.synced()]).await {
        return;
    }
    let store = nodes.store();
    // Node changes that matter ask for a pass, at most one per MIN_INTERVAL (upstream's rate limiter).
    let requests = changes.as_ref().map(|_| PassRequests::new(MIN_INTERVAL));
    let watching = changes.zip(requests.clone()).map(|(changes, requests)| {
        // Its changes end only when the caches stop, at shutdown.
        runner.spawn_loop("node-watch", async move {
            let mut views = NodeViews::default();
            let mut changes = std::pin::pin!(changes);
            while let Some(change) = changes.next().await {
                if views.matters(&change) {
                    requests.ask();
                }
            }
        })
    });
    let watch_based = requests.is_some();
    let ctx = &ctx;
    // Start to start, like upstream's non-sliding loop.
    runner
        .run(period, requests, |started| {
            // Routes for this manager's nodes only: another cloud's nodes have none in this one.
            let nodes = ctx.ownership.owned(store.state());
            async move {
                let trigger = match started {
                    Started::Periodic => Trigger::Periodic,
                    Started::Asked => Trigger::NodeChange,
                };
                let Some(routes) = ctx.cloud.routes() else {
                    tracing::warn!("the cloud stopped offering routes; skipping this pass");
                    return PassOutcome::Done;
                };
                let outcome = Outcome::of(reconcile(ctx, routes, &nodes).await);
                ctx.metrics.synced(trigger, outcome);
                if outcome == Outcome::Error && watch_based {
                    // A failed pass is asked for again (rate-limited), as upstream re-queues it.
                    PassOutcome::AskAgain
                } else {
                    PassOutcome::Done
                }
            }
        })
        .await;
    if let Some(watching) = watching {
        watching.abort();
        watching.finished().await;
    }
}

/// One pass: delete stale routes, create missing ones, then set the nodes' conditions. Whether a route
/// was created or deleted (upstream's `changed`), or `Err` when the routes could not be listed (nothing
/// was done).
async fn reconcile(
    ctx: &Context,
    routes: &dyn Routes,
    nodes: &[Arc<CachedNode>],
) -> Result<bool, ()> {
    let existing = match routes.list_routes(&ctx.cluster_name).await {
        Ok(existing) => existing,
        Err(err) => {
            tracing::warn!(error = %err, "could not list routes; skipping this pass");
            return Err(());
        }
    };
    let changed = AtomicBool::new(false);
    let plan = plan_routes(nodes, &existing, &ctx.cluster_cidrs);

    // Deletions first (and, when routes carry node addresses, before any creation).
    futures::stream::iter(&plan.delete)
        .for_each_concurrent(MAX_IN_FLIGHT, |route| async {
            if delete_route(ctx, routes, route).await {
                changed.store(true, Ordering::Relaxed);
            }
        })
        .await;

    let actions = Mutex::new(plan.actions);
    futures::stream::iter(plan.create)
        .for_each_concurrent(MAX_IN_FLIGHT, |(node, cidr)| {
            let (actions, changed) = (&actions, &changed);
            async move {
                if create_route(ctx, routes, &node, &cidr).await {
                    changed.store(true, Ordering::Relaxed);
                    actions
                        .lock()
                        .insert((node.name_any(), cidr.clone()), Action::Keep);
                }
            }
        })
        .await;

    set_conditions(ctx, nodes, &actions.into_inner(), &plan.route_targets).await;
    Ok(changed.into_inner())
}

/// Deletes `route`; whether it was deleted (a failure is logged, and the next pass tries again).
async fn delete_route(ctx: &Context, routes: &dyn Routes, route: &Route) -> bool {
    tracing::info!(route = %route.name, target = %route.target_node, cidr = %route.destination_cidr, blackhole = route.blackhole, "deleting route");
    match routes.delete_route(&ctx.cluster_name, route).await {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(route = %route.name, error = %err, "could not delete route");
            false
        }
    }
}

/// Creates the route of `cidr` to `node`; whether it was created (a failure is logged and told in a
/// `FailedToCreateRoute` Warning event on the node, as upstream does).
async fn create_route(
    ctx: &Context,
    routes: &dyn Routes,
    node: &Arc<CachedNode>,
    cidr: &str,
) -> bool {
    let started = Instant::now();
    let route = Route {
        target_node: node.name_any(),
        target_node_addresses: node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default(),
        destination_cidr: cidr.to_owned(),
        ..Default::default()
    };
    let hint = node.metadata.uid.clone().unwrap_or_default();
    match routes.create_route(&ctx.cluster_name, &hint, &route).await {
        Ok(()) => {
            tracing::info!(node = %route.target_node, %cidr, "created route");
            true
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
            false
        }
    }
}

/// Sets the `NetworkUnavailable` condition of the nodes the pass's `actions` name, and of those with a
/// route (`route_targets`), as their routes' actions say.
async fn set_conditions(
    ctx: &Context,
    nodes: &[Arc<CachedNode>],
    actions: &HashMap<(String, String), Action>,
    route_targets: &std::collections::HashSet<String>,
) {
    let mut by_node: HashMap<String, Vec<Action>> = HashMap::new();
    for ((node, _), action) in actions {
        by_node.entry(node.clone()).or_default().push(*action);
    }
    let targets: Vec<&Arc<CachedNode>> = nodes
        .iter()
        .filter(|n| by_node.contains_key(&n.name_any()) || route_targets.contains(&n.name_any()))
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
