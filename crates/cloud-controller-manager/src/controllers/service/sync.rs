//! A Service's sync: executes what [`plan_sync`] decided (ensure, clean up, or nothing), records its
//! events, and retries a failure on the Service's own back-off.

use std::sync::Arc;

use cloud_provider::CloudError;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

use super::{
    Backends, Context, ServiceError, Tracked,
    deletion::delete_load_balancer,
    events::{ServiceEvent, Step},
    key,
    node_set::BackendLabels,
    plan::{
        Decision, LastSync, Replaced, StatusAfterEnsure, finalizers_patch, plan_sync,
        status_after_ensure, status_patch, with_finalizer, without_finalizer,
    },
};
use crate::controllers::{
    outage,
    patch::{Target, patch_with_retry, with_resource_version},
    work_queue::Next,
};

pub(super) fn error_policy(service: Arc<Service>, err: &ServiceError, ctx: Arc<Context>) -> Next {
    let key = key(&service);
    // A RetryAfter from the cloud is a fixed delay; it does not grow the back-off.
    let delay = err.retry_delay().unwrap_or_else(|| {
        let (_, delay) = ctx.backoff.failed(&key);
        let write_error = match err {
            ServiceError::Write { source, .. } => Some(source),
            _ => None,
        };
        outage::retry_delay(delay, write_error)
    });
    tracing::warn!(service = %key, error = %err, retry_in = ?delay, "failed to sync load balancer");
    Next::RequeueAfter(delay)
}

#[tracing::instrument(skip_all, fields(service = %key(&service)))]
pub(super) async fn reconcile(
    service: Arc<Service>,
    ctx: Arc<Context>,
) -> Result<Next, ServiceError> {
    let result = sync(&service, &ctx).await;
    if let Err(err) = &result {
        ServiceEvent::SyncLoadBalancerFailed(err)
            .record(&ctx.events, &service)
            .await;
    } else {
        ctx.backoff.succeeded(&key(&service));
    }
    ctx.update_gauge();
    result.map(|()| Next::AwaitChange)
}

async fn sync(service: &Arc<Service>, ctx: &Context) -> Result<(), ServiceError> {
    let key = key(service);
    let previous = ctx.tracked().get(&key).cloned();
    let label_keys = ctx
        .load_balancer()
        .map(|lb| lb.service_label_keys())
        .unwrap_or_default();
    let plan = plan_sync(
        service,
        previous.as_ref().map(|p| LastSync {
            service: &p.service,
            synced: p.synced,
        }),
        &ctx.served,
        &label_keys,
    );
    if let (Some(replaced), Some(previous)) = (plan.replaced, &previous) {
        if replaced == Replaced::DeleteLoadBalancer {
            delete_load_balancer(&previous.service, ctx).await?;
        }
        ctx.tracked().remove(&key);
    }
    match plan.decision {
        Decision::Forget => {
            ctx.tracked().remove(&key);
            Ok(())
        }
        Decision::Nothing => {
            if let Some(tracked) = ctx.tracked().get_mut(&key) {
                tracked.service = service.clone();
            }
            Ok(())
        }
        Decision::Ensure { add_finalizer } => ensure(service, ctx, add_finalizer).await,
        Decision::CleanUp {
            remove_finalizer,
            clear_status,
        } => cleanup(service, ctx, remove_finalizer, clear_status).await,
    }
}

async fn cleanup(
    service: &Arc<Service>,
    ctx: &Context,
    remove_finalizer: bool,
    clear_status: bool,
) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    let exists = lb
        .get_load_balancer(&ctx.cluster_name, service)
        .await
        .map_err(|source| ServiceError::Cloud {
            what: "failed to check if load balancer exists before cleanup",
            source,
        })?
        .is_some();
    if exists {
        ServiceEvent::DeletingLoadBalancer
            .record(&ctx.events, service)
            .await;
        match lb
            .ensure_load_balancer_deleted(&ctx.cluster_name, service)
            .await
        {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
            Err(source) => {
                return Err(ServiceError::Cloud {
                    what: "failed to delete load balancer",
                    source,
                });
            }
        }
    }
    ctx.metrics.sync_total.inc();
    // Forgotten before the finalizer goes: once it is gone the API server deletes the Service, and its
    // Deleted event must not find it tracked (the deletion handler would delete the load balancer a
    // second time). If the patch fails, the retry cleans up again; it needs no tracking.
    ctx.tracked().remove(&key(service));
    if remove_finalizer {
        // Re-planned from the current Service on a conflict.
        patch_with_retry(
            &ctx.api(service),
            service.as_ref(),
            Target::Status,
            |current, rv| {
                without_finalizer(current).map(|finalizers| finalizers_patch(&finalizers, rv))
            },
        )
        .await
        .map_err(|source| ServiceError::Write {
            what: "failed to remove load balancer cleanup finalizer",
            source,
        })?;
    }
    ServiceEvent::DeletedLoadBalancer
        .record(&ctx.events, service)
        .await;
    if clear_status {
        write_status(ctx, service, &LoadBalancerStatus::default()).await?;
    }
    Ok(())
}

async fn ensure(
    service: &Arc<Service>,
    ctx: &Context,
    add_finalizer: bool,
) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    ServiceEvent::EnsuringLoadBalancer
        .record(&ctx.events, service)
        .await;
    // The finalizer first: no cloud load balancer may exist without it. The Service as that write left
    // it is what the status write is planned from: its resourceVersion is the current one, so the status
    // write does not meet a certain conflict (a 409, a re-read and a second write per new Service).
    let mut written_service: Option<Service> = None;
    if add_finalizer {
        // Re-planned from the current Service on a conflict.
        written_service = patch_with_retry(
            &ctx.api(service),
            service.as_ref(),
            Target::Status,
            |current, rv| {
                with_finalizer(current).map(|finalizers| finalizers_patch(&finalizers, rv))
            },
        )
        .await
        .map_err(|source| ServiceError::Write {
            what: "failed to add load balancer cleanup finalizer",
            source,
        })?;
    }

    let Backends { nodes, set } = ctx.backends();
    if nodes.is_empty() {
        ServiceEvent::NoAvailableNodes(Step::Ensure)
            .record(&ctx.events, service)
            .await;
    }
    ctx.tracked().insert(
        key(service),
        Tracked {
            service: service.clone(),
            synced: false,
            backends: set,
            labels: BackendLabels::of(lb.backend_label_keys(service), &nodes),
        },
    );
    ctx.metrics.sync_total.inc();
    let status = match lb
        .ensure_load_balancer(&ctx.cluster_name, service, &nodes)
        .await
    {
        Ok(status) => status,
        Err(CloudError::ImplementedElsewhere) => {
            mark_synced(ctx, service);
            return Ok(());
        }
        Err(source) => {
            return Err(ServiceError::Cloud {
                what: "failed to ensure load balancer",
                source,
            });
        }
    };
    let after = status_after_ensure(service, &status);
    if after == StatusAfterEnsure::Missing {
        return Err(ServiceError::NoStatus);
    }
    ServiceEvent::EnsuredLoadBalancer
        .record(&ctx.events, service)
        .await;
    if after == StatusAfterEnsure::Update {
        write_status(ctx, written_service.as_ref().unwrap_or(service), &status).await?;
    }
    mark_synced(ctx, service);
    Ok(())
}

/// Marks the Service synced. Node changes during its sync were skipped by the node sync (it passes over
/// Services being synced), so if the backends it was given are no longer the wanted ones, a node sync
/// pass is asked for: it updates this load balancer like any other.
fn mark_synced(ctx: &Context, service: &Arc<Service>) {
    let (stale, labels) = match ctx.tracked().get_mut(&key(service)) {
        Some(tracked) => {
            tracked.synced = true;
            (tracked.backends.clone(), tracked.labels.clone())
        }
        None => return,
    };
    let Backends { nodes, set: wanted } = ctx.backends();
    if (!Arc::ptr_eq(&stale, &wanted) && *stale != *wanted) || labels.changed(&nodes) {
        tracing::info!(service = %key(service), "nodes changed during the sync; asking for a node sync");
        ctx.node_sync_wanted.notify_one();
    }
}

/// The write carries the Service's `resourceVersion` and is re-planned from a fresh read on a conflict
/// (nothing is written when the fresh Service has that status already).
async fn write_status(
    ctx: &Context,
    service: &Service,
    status: &LoadBalancerStatus,
) -> Result<(), ServiceError> {
    let written = patch_with_retry(
        &ctx.api(service),
        service,
        Target::Status,
        |current, resource_version| {
            let wanted = status.ingress.clone().unwrap_or_default();
            let has = current
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.clone())
                .unwrap_or_default();
            (has != wanted).then(|| with_resource_version(status_patch(status), resource_version))
        },
    )
    .await;
    match written {
        Ok(_) => Ok(()),
        // The Service went away once its finalizer was removed.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ServiceError::Write {
            what: "failed to update load balancer status",
            source,
        }),
    }
}
