//! The `inventory-audit` controller: a controller of the provider's own. Every
//! `--inventory-audit-period` it asks the cloud about every Node and puts a Warning event
//! (`NotInInventory`) on each one the inventory does not list, once per Node.
//!
//! As a row of the manager's controller table it can be turned off with
//! `--controllers=*,-inventory-audit` (or run alone with `--controllers=inventory-audit`), shares the
//! manager's Node cache and event sink, shows in `/healthz`, and is awaited at shutdown.

use std::collections::BTreeSet;

use cloud_controller_manager::{
    ControllerSpec,
    controllers::{ControllerContext, ControllerTask},
    events::EventRecorder,
    informers::wait_for_cache_sync,
    kube::{ResourceExt, runtime::events::EventType},
};

use crate::InventoryFlags;

/// The controller's name in `--controllers`, logs and events.
pub const NAME: &str = "inventory-audit";

/// The controller's row: its name, its config (the provider's flags) and its start function.
pub fn controller() -> ControllerSpec {
    ControllerSpec::new(NAME, |cfg| cfg.flags::<InventoryFlags>().map(Some), start)
}

/// Starts the controller; `None` when the cloud offers no instances to audit against.
pub fn start(ctx: ControllerContext, flags: InventoryFlags) -> Option<ControllerTask> {
    ctx.cloud.instances_v2()?;
    // Ask for the shared caches the task reads here, before returning it: the manager starts every
    // cache asked for once all controllers have started, whichever of them `--controllers` selects.
    let nodes = ctx.informers.nodes();
    Some(Box::pin(async move {
        let events = EventRecorder::new(ctx.events_client.clone(), NAME);
        if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
            return Ok(()); // shut down before the cache synced
        }
        let store = nodes.store();
        let mut reported = BTreeSet::new();
        let mut ticks = tokio::time::interval(flags.inventory_audit_period);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = ctx.shutdown.cancelled() => break,
            }
            let Some(instances) = ctx.cloud.instances_v2() else {
                break;
            };
            for node in store.state() {
                let name = node.name_any();
                match instances.instance_exists(&node).await {
                    Ok(false) if reported.insert(name.clone()) => events.queue(
                        node.as_ref(),
                        EventType::Warning,
                        "NotInInventory",
                        "Audit",
                        format!("Node {name} is not listed in the inventory"),
                    ),
                    Ok(true) => {
                        reported.remove(&name);
                    }
                    Ok(false) => {}
                    Err(err) => tracing::warn!(node = %name, error = %err, "audit failed"),
                }
            }
        }
        events.flush().await;
        Ok(())
    }))
}
