//! The provider's settings changed (not in upstream): a provider whose settings can change while it
//! runs ([`LoadBalancer::settings_changes`](cloud_provider::LoadBalancer::settings_changes): `local`'s
//! address pools, from a reloaded cloud-config or MetalLB's objects) says so, and every synced load
//! balancer is previewed at once; those the new settings change are ensured again through the work
//! queue. Without it, a pool renumbered by its operator left its Services on addresses no pool gives out
//! (and no agent announces) until the drift check's next round, up to `--load-balancer-drift-period`
//! later, or for good with the drift check off.
//!
//! The previews run back to back, not spread as the drift check's: the provider asked for them, and
//! one that calls a rate-limited API keeps its own budget for previews (as `aws`'s does).

use std::sync::Arc;

use cloud_provider::LoadBalancerPreview;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    Context,
    drift::{Previewed, mark_for_sync, preview_tracked, synced_keys},
};

/// Until `shutdown` (or the provider drops its sender), on each change of `changes` syncs again every
/// load balancer that the provider's new settings change. Changes that come during a round are taken
/// together by the next one.
pub(super) async fn settings_loop(
    ctx: Arc<Context>,
    mut changes: watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    tracing::info!("the cloud provider no longer reports changes of its settings");
                    return;
                }
            }
        }
        // A sync running now may have read the settings before they changed: it is done again when
        // it completes (`sync::mark_synced`). One waiting for its retry reads them when it retries.
        for tracked in ctx.tracked().values_mut() {
            if !tracked.synced && tracked.retry_at.is_none() {
                tracked.settings_changed_during_sync = true;
            }
        }
        let keys = synced_keys(&ctx);
        let (checked, mut resynced) = (keys.len(), 0_usize);
        for key in keys {
            if shutdown.is_cancelled() {
                return;
            }
            let seen = match preview_tracked(&ctx, &key).await {
                // Synced, but due for a node sync, whose update would not give it a new address:
                // an ensure does both.
                Previewed::Skipped => match due_for_a_node_sync(&ctx, &key) {
                    Some(service) => service,
                    None => continue,
                },
                Previewed::Done {
                    preview: LoadBalancerPreview::UpToDate,
                    ..
                } => continue,
                Previewed::Done { seen, .. } => seen,
                Previewed::Failed(err) => {
                    // Its ensure tells: the settings changed, and the preview cannot say how.
                    tracing::warn!(service = %key, error = %err, "preview after a settings change failed; syncing it again");
                    match ctx.tracked().get(&key) {
                        Some(tracked) => tracked.service.clone(),
                        None => continue,
                    }
                }
                Previewed::CannotPreview => match ctx.tracked().get(&key) {
                    Some(tracked) => tracked.service.clone(),
                    None => continue,
                },
            };
            if let Some(service) = mark_for_sync(&ctx, &key, &seen) {
                resynced += 1;
                let _ = ctx.retry.send(ObjectRef::from_obj(service.as_ref()));
            }
        }
        tracing::info!(
            checked,
            resynced,
            "the cloud provider's settings changed: the load balancers they change are synced again"
        );
    }
}

/// The tracked Service `key` when it is synced (so the preview passed over it because a node sync is
/// due for it, not because a sync runs or waits for its retry).
fn due_for_a_node_sync(ctx: &Context, key: &str) -> Option<Arc<Service>> {
    ctx.tracked()
        .get(key)
        .filter(|tracked| tracked.synced)
        .map(|tracked| tracked.service.clone())
}
