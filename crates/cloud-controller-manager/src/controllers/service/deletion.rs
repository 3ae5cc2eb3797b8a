//! Deletion handling: Services that vanished without our finalizer (it was removed by hand, or they
//! predate us) still lose their load balancer, as upstream's cache path does.

use std::{panic::AssertUnwindSafe, sync::Arc};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    Context, ServiceError,
    events::ServiceEvent,
    key,
    plan::wants_load_balancer,
    retain::{self, Removed},
};
use crate::informers::Change;

/// Splits a change stream into applied objects (the controller's triggers) and deletions.
pub(super) fn split_changes(
    changes: impl Stream<Item = Change<Service>> + Send + 'static,
) -> (
    impl Stream<Item = Arc<Service>> + Send + 'static,
    mpsc::UnboundedReceiver<Arc<Service>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let applied = changes.filter_map(move |change| {
        std::future::ready(match change {
            Change::Applied(service) => Some(service),
            Change::Deleted(service) => {
                let _ = tx.send(service);
                None
            }
        })
    });
    (applied, rx)
}

/// Deletes the load balancer of a Service that is gone (or was replaced), as upstream's cache path does,
/// or keeps it when the Service asked (`ccm.rs/load-balancer-retain`).
pub(super) async fn delete_load_balancer(
    service: &Service,
    ctx: &Context,
) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    ServiceEvent::DeletingLoadBalancer
        .record(&ctx.events, service)
        .await;
    match retain::remove(lb, &ctx.cluster_name, service).await {
        Ok(removed) => {
            let event = match removed {
                Removed::Deleted => ServiceEvent::DeletedLoadBalancer,
                Removed::Retained => ServiceEvent::RetainedLoadBalancer,
            };
            event.record(&ctx.events, service).await;
            Ok(())
        }
        Err(source) => {
            ServiceEvent::DeleteLoadBalancerFailed(&source)
                .record(&ctx.events, service)
                .await;
            Err(ServiceError::Cloud {
                what: "failed to delete load balancer",
                source,
            })
        }
    }
}

/// Services that vanished without our finalizer (it was removed by hand, or they predate us) still lose
/// their load balancer; failures retry on the same back-off as syncs. Each deletion is a task of this
/// loop's own (they run side by side, and stop with it); a provider's deletion that panics (a bug) is
/// said at error level and retried on the same back-off, never lost.
pub(super) async fn handle_deletions(
    ctx: Arc<Context>,
    mut deletions: mpsc::UnboundedReceiver<Arc<Service>>,
    shutdown: CancellationToken,
) {
    let mut deleting = tokio::task::JoinSet::new();
    loop {
        let service = tokio::select! {
            service = deletions.recv() => match service { Some(s) => s, None => break },
            // Reaped as they end (none panics: each catches its attempts' panics).
            Some(_) = deleting.join_next(), if !deleting.is_empty() => continue,
            () = shutdown.cancelled() => break,
        };
        let key = key(&service);
        let tracked = ctx.tracked().get(&key).cloned();
        let Some(tracked) = tracked.filter(|t| t.service.metadata.uid == service.metadata.uid)
        else {
            continue; // cleaned up through the finalizer, or never ours
        };
        ctx.tracked().remove(&key);
        if !wants_load_balancer(&tracked.service, &ctx.served) {
            continue;
        }
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        deleting.spawn(async move {
            // This task's own count: the Service is gone, so its sync back-off no longer applies.
            let mut failures = 0;
            loop {
                let attempt =
                    AssertUnwindSafe(delete_load_balancer(&tracked.service, &ctx)).catch_unwind();
                let (delay, error) = match attempt.await {
                    Ok(Ok(())) => break,
                    Ok(Err(err)) => {
                        failures += 1;
                        let delay = err
                            .retry_delay()
                            .unwrap_or_else(|| ctx.backoff.delay(failures));
                        (delay, err.to_string())
                    }
                    Err(panic) => {
                        failures += 1;
                        let message = cloud_provider::panic_message(panic.as_ref());
                        tracing::error!(service = %key, "deleting the load balancer of a deleted service panicked (a bug): {message}");
                        (ctx.backoff.delay(failures), format!("panicked: {message}"))
                    }
                };
                tracing::warn!(service = %key, error, retry_in = ?delay, "failed to delete the load balancer of a deleted service");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return,
                }
            }
            ctx.update_gauge();
        });
    }
    // A deletion under way finishes its cloud call (as the controllers' in-flight work does at a
    // graceful stop) rather than be cut off halfway; one waiting to retry returns at shutdown.
    while deleting.join_next().await.is_some() {}
}
