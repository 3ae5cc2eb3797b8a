//! A Service's sync: executes what [`plan_sync`] decided (ensure, clean up, or nothing), records its
//! events, and retries a failure on the Service's own back-off.

use std::sync::Arc;

use cloud_provider::CloudError;
use k8s_openapi::{
    api::core::v1::{LoadBalancerStatus, Service},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::{
    Backends, Context, ServiceError, Tracked,
    condition::{Readiness, conditions_with, has_condition},
    deletion::delete_load_balancer,
    events::{ServiceEvent, Step},
    key,
    node_set::BackendLabels,
    plan,
    plan::{
        Decision, LastSync, Replaced, StatusAfterEnsure, current_status, finalizers_patch,
        ingress_equal, plan_sync, served_elsewhere, status_after_ensure, status_patch,
        with_finalizer, without_finalizer,
    },
    retain::{self, Removed},
};
use crate::{
    controllers::{
        patch::{Target, patch_with_retry, with_resource_version},
        work_queue::Next,
    },
    outage_retry,
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
        outage_retry::retry_delay(delay, write_error)
    });
    tracing::warn!(service = %key, error = %err, retry_in = ?delay, "failed to sync load balancer");
    if let Some(tracked) = ctx.tracked().get_mut(&key) {
        tracked.retry_at = Some(tokio::time::Instant::now() + delay);
    }
    Next::RequeueAfter(delay)
}

/// How long a Service whose last sync failed still waits for its retry, when it changed since only in
/// ways that do not matter to its load balancer (its status, our own condition write among them):
/// such a change is not a reason to call the cloud again before the back-off says so. Upstream's
/// service controller is not even woken by it.
fn retry_pending(service: &Service, ctx: &Context) -> Option<std::time::Duration> {
    let label_keys = ctx
        .load_balancer()
        .map(|lb| lb.service_label_keys())
        .unwrap_or_default();
    let tracked = ctx.tracked();
    let tracked = tracked.get(&key(service))?;
    let wait = tracked
        .retry_at?
        .checked_duration_since(tokio::time::Instant::now())?;
    (!tracked.synced
        && plan::changes_nothing_that_matters(&tracked.service, service, &ctx.served, &label_keys))
    .then_some(wait)
}

#[tracing::instrument(skip_all, fields(service = %key(&service)))]
pub(super) async fn reconcile(
    service: Arc<Service>,
    ctx: Arc<Context>,
) -> Result<Next, ServiceError> {
    if let Some(wait) = retry_pending(&service, &ctx) {
        tracing::debug!(retry_in = ?wait, "changed in no way that matters; the retry waits for its back-off");
        return Ok(Next::RequeueAfter(wait));
    }
    let result = sync(&service, &ctx).await;
    if let Err(err) = &result {
        ServiceEvent::SyncLoadBalancerFailed(err)
            .record(&ctx.events, &service)
            .await;
        if let Some(readiness) = Readiness::of_error(err).filter(|_| ctx.conditions) {
            // The failure is what the Service shows; a failed condition write does not replace it.
            if let Err(write) = write_status(&ctx, &service, None, Some(&readiness)).await {
                tracing::warn!(error = %write, "could not show the failure in the Service's condition");
            }
        }
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
            if has_condition(service) && !served_elsewhere(service, &ctx.served) {
                // Ours from before the Service stopped being a LoadBalancer (a change seen late).
                write_status(ctx, service, None, None).await?;
            }
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
    let mut removed = Removed::Deleted;
    if exists {
        ServiceEvent::DeletingLoadBalancer
            .record(&ctx.events, service)
            .await;
        removed = retain::remove(lb, &ctx.cluster_name, service)
            .await
            .map_err(|source| ServiceError::Cloud {
                what: "failed to delete load balancer",
                source,
            })?;
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
    let event = match removed {
        Removed::Deleted => ServiceEvent::DeletedLoadBalancer,
        Removed::Retained => ServiceEvent::RetainedLoadBalancer,
    };
    event.record(&ctx.events, service).await;
    // Another class's Service carries that implementation's condition of the same type (another manager
    // of ours, serving that class): not ours to remove.
    let ours = has_condition(service) && !served_elsewhere(service, &ctx.served);
    if clear_status || ours {
        let cleared = LoadBalancerStatus::default();
        write_status(ctx, service, clear_status.then_some(&cleared), None).await?;
    }
    Ok(())
}

async fn ensure(
    service: &Arc<Service>,
    ctx: &Context,
    add_finalizer: bool,
) -> Result<(), ServiceError> {
    let lb = ctx.load_balancer()?;
    // A load balancer the Service asks to keep, that this provider could not keep, is never made.
    retain::check(service, lb).map_err(|source| ServiceError::Cloud {
        what: "failed to ensure load balancer",
        source,
    })?;
    ServiceEvent::EnsuringLoadBalancer
        .record(&ctx.events, service)
        .await;
    // The finalizer first: no cloud load balancer may exist without it. The Service as that write left
    // it is what the status write is planned from: its resourceVersion is the current one, so the status
    // write does not meet a certain conflict (a 409, a re-read and a second write per new Service).
    let written_service = if add_finalizer {
        written_with_finalizer(service, ctx).await?
    } else {
        None
    };

    let Backends { nodes, set } = ctx.backends();
    if nodes.is_empty() {
        ServiceEvent::NoAvailableNodes(Step::Ensure)
            .record(&ctx.events, service)
            .await;
    }
    track(ctx, service, lb, &nodes, set);
    ctx.metrics.sync_total.inc();
    let status = match lb
        .ensure_load_balancer(&ctx.cluster_name, service, &nodes)
        .await
    {
        Ok(status) => status,
        Err(CloudError::ImplementedElsewhere) => {
            // Another controller makes this load balancer: the condition is not ours to give.
            write_status(ctx, written_service.as_ref().unwrap_or(service), None, None).await?;
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
    if status_after_ensure(service, &status) == StatusAfterEnsure::Missing {
        return Err(ServiceError::NoStatus);
    }
    ServiceEvent::EnsuredLoadBalancer
        .record(&ctx.events, service)
        .await;
    // Nothing is written when the Service shows this address and condition already.
    let readiness = Readiness::ensured(!nodes.is_empty());
    write_status(
        ctx,
        written_service.as_ref().unwrap_or(service),
        Some(&status),
        Some(&readiness),
    )
    .await?;
    mark_synced(ctx, service);
    Ok(())
}

/// Adds the cleanup finalizer (re-planned from the current Service on a conflict); the Service as the
/// write left it (`None` when it had the finalizer already).
async fn written_with_finalizer(
    service: &Arc<Service>,
    ctx: &Context,
) -> Result<Option<Service>, ServiceError> {
    patch_with_retry(
        &ctx.api(service),
        service.as_ref(),
        Target::Status,
        |current, rv| with_finalizer(current).map(|finalizers| finalizers_patch(&finalizers, rv)),
    )
    .await
    .map_err(|source| ServiceError::Write {
        what: "failed to add load balancer cleanup finalizer",
        source,
    })
}

/// Tracks the Service as being synced with the backends `set` (the node sync passes over it until
/// it is marked synced).
fn track(
    ctx: &Context,
    service: &Arc<Service>,
    lb: &dyn cloud_provider::LoadBalancer,
    nodes: &[Arc<k8s_openapi::api::core::v1::Node>],
    set: Arc<super::BackendSet>,
) {
    ctx.tracked().insert(
        key(service),
        Tracked {
            service: service.clone(),
            synced: false,
            backends: set,
            labels: BackendLabels::of(lb.backend_label_keys(service), nodes),
            retry_at: None,
            settings_changed_during_sync: false,
        },
    );
}

/// Marks the Service synced. Node changes during its sync were skipped by the node sync (it passes over
/// Services being synced), so if the backends it was given are no longer the wanted ones, a node sync
/// pass is asked for: it updates this load balancer like any other. A change of the provider's settings
/// during its sync was skipped by the settings loop: it is synced again (through the work queue).
fn mark_synced(ctx: &Context, service: &Arc<Service>) {
    let (stale, labels) = match ctx.tracked().get_mut(&key(service)) {
        Some(tracked) if tracked.settings_changed_during_sync => {
            tracked.settings_changed_during_sync = false;
            tracing::info!(service = %key(service), "the provider's settings changed during the sync; syncing it again");
            let _ = ctx
                .retry
                .send(kube::runtime::reflector::ObjectRef::from_obj(
                    service.as_ref(),
                ));
            return;
        }
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

/// Writes the published address (`ingress`; `None`: left as it is) and our condition (`readiness`;
/// `None`: ours removed) in one status patch, when either differs from what the Service shows. The
/// write carries the Service's `resourceVersion` and is re-planned from a fresh read on a conflict
/// (nothing is written when the fresh Service shows both already).
async fn write_status(
    ctx: &Context,
    service: &Service,
    ingress: Option<&LoadBalancerStatus>,
    readiness: Option<&Readiness>,
) -> Result<(), ServiceError> {
    let now = Time(Timestamp::now());
    let written = patch_with_retry(
        &ctx.api(service),
        service,
        Target::Status,
        |current, resource_version| {
            let ingress = ingress.filter(|wanted| !ingress_equal(&current_status(current), wanted));
            let conditions = ctx
                .conditions
                .then(|| conditions_with(current, readiness, &now))
                .flatten();
            (ingress.is_some() || conditions.is_some()).then(|| {
                with_resource_version(
                    status_patch(ingress, conditions.as_deref()),
                    resource_version,
                )
            })
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
