//! The `inventory-audit` controller: a controller of the provider's own. It asks the cloud about each
//! Node when the Node appears or changes, and again every `--inventory-audit-period`, and puts a Warning
//! event (`NotInInventory`) on each one the inventory does not list, once per Node.
//!
//! As a row of the manager's controller table it can be turned off with
//! `--controllers=*,-inventory-audit` (or run alone with `--controllers=inventory-audit`), shares the
//! manager's Node cache and event sink, runs on the manager's work queue (`workqueue_*{name=
//! "inventory-audit"}` metrics; a panicking reconcile is retried, not fatal), exports a metric of its own
//! (`inventory_audit_not_in_inventory_total`), shows in `/healthz`, and is awaited at shutdown.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use cloud_controller_manager::{
    ControllerSpec,
    controllers::{ControllerContext, ControllerTask, Next, run_on_work_queue},
    events::EventRecorder,
    informers::{CachedNode, wait_for_cache_sync},
    kube::{ResourceExt, runtime::events::EventType},
};
use cloud_provider::{CloudError, CloudProvider, prometheus_client::metrics::counter::Counter};

use crate::InventoryFlags;

/// The controller's name in `--controllers`, logs, events and metrics.
pub const NAME: &str = "inventory-audit";

/// The controller's row: its name, its config (the provider's flags) and its start function.
pub fn controller() -> ControllerSpec {
    ControllerSpec::new(NAME, |cfg| cfg.flags::<InventoryFlags>().map(Some), start)
}

/// What every reconcile shares.
struct Audit {
    cloud: Arc<dyn CloudProvider>,
    events: EventRecorder,
    period: Duration,
    /// Nodes already reported (one event per Node until it is listed again).
    reported: Mutex<BTreeSet<String>>,
    not_in_inventory: Counter,
}

/// Starts the controller; `None` when the cloud offers no instances to audit against.
pub fn start(ctx: ControllerContext, flags: InventoryFlags) -> Option<ControllerTask> {
    ctx.cloud.instances_v2()?;
    // Ask for the shared caches the task reads here, before returning it: the manager starts every
    // cache asked for once all controllers have started, whichever of them `--controllers` selects.
    let nodes = ctx.informers.nodes();
    let changes = nodes.subscribe();
    let audit = Arc::new(Audit {
        cloud: ctx.cloud.clone(),
        events: EventRecorder::new(ctx.events_client.clone(), NAME),
        period: flags.inventory_audit_period,
        reported: Mutex::default(),
        not_in_inventory: Counter::default(),
    });
    let counter = audit.not_in_inventory.clone();
    ctx.metrics.register_with(|registry| {
        registry.register(
            "inventory_audit_not_in_inventory",
            "Nodes found missing from the inventory (one per Node until it is listed again).",
            counter,
        )
    });
    Some(Box::pin(async move {
        if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
            return Ok(()); // shut down before the cache synced
        }
        let events = audit.events.clone();
        run_on_work_queue(
            &ctx,
            changes,
            nodes.store(),
            4,
            reconcile,
            |node, err: &CloudError, audit| {
                tracing::warn!(node = %node.name_any(), error = %err, "audit failed");
                Next::RequeueAfter(audit.period)
            },
            audit,
        )
        .await;
        events.flush().await;
        Ok(())
    }))
}

/// Audits one Node, and comes back to it after the period.
async fn reconcile(node: Arc<CachedNode>, audit: Arc<Audit>) -> Result<Next, CloudError> {
    let Some(instances) = audit.cloud.instances_v2() else {
        return Ok(Next::AwaitChange);
    };
    let name = node.name_any();
    let listed = instances.instance_exists(&node).await?;
    let mut reported = audit.reported.lock().unwrap_or_else(|e| e.into_inner());
    if listed {
        reported.remove(&name);
    } else if reported.insert(name.clone()) {
        audit.not_in_inventory.inc();
        audit.events.queue(
            node.as_ref(),
            EventType::Warning,
            "NotInInventory",
            "Audit",
            format!("Node {name} is not listed in the inventory"),
        );
    }
    Ok(Next::RequeueAfter(audit.period))
}
