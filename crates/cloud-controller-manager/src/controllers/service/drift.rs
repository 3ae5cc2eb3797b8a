//! Drift (not in upstream): a load balancer changed or deleted in the cloud behind the controller's
//! back (in a console, by a script, by a crashed data plane) is found and, by default, healed.
//!
//! Upstream looks at a load balancer only when its Service or the nodes change, so one deleted or
//! edited out of band stays broken until someone edits the Service or restarts the manager. Here every
//! Service whose load balancer the controller last synced successfully is checked once per
//! `--load-balancer-drift-period` with the provider's read-only
//! [`LoadBalancer::preview_load_balancer`](cloud_provider::LoadBalancer::preview_load_balancer) (what
//! `ensure` would change: nothing, a creation, or the changes it names). The checks of a round are spread
//! evenly over the period in groups of up to [`CHECKS_AT_ONCE`] Services checked side by side, each
//! spacing jittered by up to 20 %, so the cloud sees a steady rate of reads: `n / period` previews for
//! `n` Services, never more than one group per [`MIN_SPACING`] (with 1,000 Services and the default
//! 5 m: 50 groups of 20, one every 6 s). Checked side by side, a provider can answer a group's
//! look-ups with shared calls (the `aws` provider finds up to 20 load balancers in one
//! `DescribeLoadBalancers`).
//!
//! A drift is a Warning event `LoadBalancerDrift` on the Service naming what differs, and
//! `service_controller_load_balancer_drifts_total`; with `--load-balancer-drift=heal` (the default)
//! the Service is then synced again through the work queue, so `ensure_load_balancer` puts the load
//! balancer back as the Service asks (with the usual events); with `report` it is left as it is. Checks
//! skip a Service being synced, and one whose backends are due for a node sync (that update comes
//! first); a preview that meets such a change under way is discarded. A provider that cannot preview
//! ([`LoadBalancerPreview::Unknown`]) turns the checks off, with one log line.

use std::{sync::Arc, time::Duration};

use cloud_provider::LoadBalancerPreview;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use super::{Backends, Context, events::ServiceEvent, plan::wants_load_balancer};
use crate::{controllers::provider_panic::caught, jitter::jittered};

/// The shortest spacing between two groups of checks, however many Services there are.
pub(crate) const MIN_SPACING: Duration = Duration::from_millis(100);

/// The most Services checked side by side.
pub(crate) const CHECKS_AT_ONCE: usize = 20;

/// What a drift leads to (`--load-balancer-drift`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DriftAction {
    /// Report it, then ensure the load balancer again.
    Heal,
    /// Report it only.
    Report,
}

/// The spacing of `groups` checked one after the other over `period`.
pub(crate) fn spacing(period: Duration, groups: usize) -> Duration {
    let per = u32::try_from(groups.max(1)).unwrap_or(u32::MAX);
    (period / per).max(MIN_SPACING)
}

/// A round's Services in groups checked side by side: as few groups as [`CHECKS_AT_ONCE`] allows, of
/// sizes that differ by one at most (45 Services: 15, 15 and 15, not 20, 20 and 5).
pub(crate) fn groups(keys: Vec<String>) -> Vec<Vec<String>> {
    if keys.is_empty() {
        return Vec::new();
    }
    let count = keys.len().div_ceil(CHECKS_AT_ONCE);
    let (size, larger) = (keys.len() / count, keys.len() % count);
    let mut keys = keys.into_iter();
    (0..count)
        .map(|i| keys.by_ref().take(size + usize::from(i < larger)).collect())
        .collect()
}

/// What a preview says about drift: `None` when the load balancer is as the Service asks, else what
/// differs, in words.
pub(crate) fn drift_of(preview: &LoadBalancerPreview) -> Option<String> {
    match preview {
        LoadBalancerPreview::UpToDate | LoadBalancerPreview::Unknown => None,
        LoadBalancerPreview::Create { .. } => {
            Some("the load balancer is gone from the cloud".into())
        }
        LoadBalancerPreview::Change {
            backends_added,
            backends_removed,
            detail,
        } => {
            let mut parts = Vec::new();
            if !backends_added.is_empty() {
                parts.push(format!("backends missing: {}", backends_added.join(", ")));
            }
            if !backends_removed.is_empty() {
                parts.push(format!(
                    "backends that should not be there: {}",
                    backends_removed.join(", ")
                ));
            }
            if !detail.is_empty() {
                parts.push(detail.clone());
            }
            Some(if parts.is_empty() {
                "the load balancer differs from the Service".into()
            } else {
                parts.join("; ")
            })
        }
        // A kind of preview this version does not know: not taken for drift.
        _ => None,
    }
}

/// Checks every synced Service once per `period` until `shutdown`.
pub(super) async fn drift_loop(
    ctx: Arc<Context>,
    period: Duration,
    action: DriftAction,
    shutdown: CancellationToken,
) {
    loop {
        let keys = synced_keys(&ctx);
        if keys.is_empty() {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => continue,
            }
        }
        let groups = groups(keys);
        let spacing = spacing(period, groups.len());
        for group in groups {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(jittered(spacing)) => {}
            }
            let checks = group.iter().map(|key| check(&ctx, key, action));
            if !futures::future::join_all(checks)
                .await
                .into_iter()
                .all(|can| can)
            {
                tracing::warn!(
                    "the cloud provider cannot preview its load balancers; drift checks are off (--load-balancer-drift-period has no effect)"
                );
                return;
            }
        }
    }
}

/// The Services that want a load balancer and whose last sync succeeded: those a preview can check.
pub(super) fn synced_keys(ctx: &Context) -> Vec<String> {
    ctx.tracked()
        .iter()
        .filter(|(_, t)| t.synced && wants_load_balancer(&t.service, &ctx.served))
        .map(|(key, _)| key.clone())
        .collect()
}

/// Checks one Service; `false` when the provider cannot preview.
async fn check(ctx: &Context, key: &str, action: DriftAction) -> bool {
    let (preview, seen) = match preview_tracked(ctx, key).await {
        Previewed::Skipped => return true,
        Previewed::CannotPreview => return false,
        Previewed::Failed(err) => {
            ctx.metrics.drift_checks_failed.inc();
            tracing::warn!(service = %key, error = %err, "drift check failed; trying again next round");
            return true;
        }
        Previewed::Done { preview, seen } => (preview, seen),
    };
    ctx.metrics.drift_checks.inc();
    let Some(what) = drift_of(&preview) else {
        return true;
    };
    let service = if action == DriftAction::Heal {
        match mark_for_sync(ctx, key, &seen) {
            Some(service) => service,
            None => return true,
        }
    } else if still_as_seen(ctx, key, &seen) {
        seen
    } else {
        return true;
    };
    ctx.metrics.drifts.inc();
    tracing::warn!(service = %key, drift = %what, heal = (action == DriftAction::Heal), "load balancer drift");
    ServiceEvent::LoadBalancerDrift {
        what: &what,
        healing: action == DriftAction::Heal,
    }
    .record(&ctx.events, &service)
    .await;
    if action == DriftAction::Heal {
        let _ = ctx.retry.send(ObjectRef::from_obj(service.as_ref()));
    }
    true
}

/// What [`preview_tracked`] found.
pub(super) enum Previewed {
    /// Not looked at: not synced yet, being synced, or due for a node sync (that comes first).
    Skipped,
    /// The provider cannot preview its load balancers.
    CannotPreview,
    /// The preview failed.
    Failed(cloud_provider::CloudError),
    /// The preview, and the Service as it was previewed.
    Done {
        preview: LoadBalancerPreview,
        seen: Arc<Service>,
    },
}

/// Asks the provider what an ensure of the tracked Service `key` would change, without changing
/// anything.
pub(super) async fn preview_tracked(ctx: &Context, key: &str) -> Previewed {
    let Backends { nodes, set } = ctx.backends();
    let Some(before) = ctx.tracked().get(key).cloned() else {
        return Previewed::Skipped;
    };
    // Being synced, or due for a node sync: that comes first.
    if !before.synced
        || (!Arc::ptr_eq(&before.backends, &set) && *before.backends != *set)
        || before.labels.changed(&nodes)
    {
        return Previewed::Skipped;
    }
    let Ok(lb) = ctx.load_balancer() else {
        return Previewed::CannotPreview;
    };
    let preview = lb.preview_load_balancer(&ctx.cluster_name, &before.service, &nodes);
    match caught("preview_load_balancer", preview).await {
        Ok(LoadBalancerPreview::Unknown) => Previewed::CannotPreview,
        Ok(preview) => Previewed::Done {
            preview,
            seen: before.service,
        },
        Err(err) => Previewed::Failed(err),
    }
}

/// Whether the tracked Service `key` is still synced and as `seen`: a sync that began meanwhile may be
/// what a preview saw half-done, and its result stands.
fn still_as_seen(ctx: &Context, key: &str, seen: &Arc<Service>) -> bool {
    ctx.tracked()
        .get(key)
        .is_some_and(|now| now.synced && Arc::ptr_eq(&now.service, seen))
}

/// Marks the tracked Service `key` for an ensure (its next sync ensures even though it did not
/// change) when it is still synced and as `seen` ([`still_as_seen`]); returns it then. The caller
/// sends it to the work queue.
pub(super) fn mark_for_sync(ctx: &Context, key: &str, seen: &Arc<Service>) -> Option<Arc<Service>> {
    let mut tracked = ctx.tracked();
    let now = tracked.get_mut(key)?;
    if !now.synced || !Arc::ptr_eq(&now.service, seen) {
        return None;
    }
    now.synced = false;
    Some(now.service.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_are_spread_over_the_period_and_never_closer_than_the_minimum() {
        let five_minutes = Duration::from_secs(300);
        assert_eq!(spacing(five_minutes, 50), Duration::from_secs(6));
        assert_eq!(spacing(five_minutes, 1000), Duration::from_millis(300));
        assert_eq!(spacing(five_minutes, 1), five_minutes);
        assert_eq!(spacing(five_minutes, 0), five_minutes);
        assert_eq!(spacing(five_minutes, 1_000_000), MIN_SPACING);
        for _ in 0..10 {
            let j = jittered(Duration::from_millis(300));
            assert!(j >= Duration::from_millis(300) && j <= Duration::from_millis(360));
        }
    }

    #[test]
    fn a_round_is_checked_in_as_few_even_groups_as_the_cap_allows() {
        let keys = |n: usize| (0..n).map(|i| format!("ns/svc-{i}")).collect::<Vec<_>>();
        let sizes = |n: usize| groups(keys(n)).iter().map(Vec::len).collect::<Vec<_>>();
        for (services, want) in [
            (0, vec![]),
            (1, vec![1]),
            (20, vec![20]),
            (21, vec![11, 10]),
            (45, vec![15, 15, 15]),
            (1000, vec![20; 50]),
        ] {
            assert_eq!(sizes(services), want, "{services} Services");
        }
        // Every Service once, in order.
        assert_eq!(groups(keys(45)).concat(), keys(45));
    }

    #[test]
    fn previews_read_as_drift_in_words() {
        assert_eq!(drift_of(&LoadBalancerPreview::UpToDate), None);
        assert_eq!(drift_of(&LoadBalancerPreview::Unknown), None);
        assert_eq!(
            drift_of(&LoadBalancerPreview::Create {
                backends: vec!["a".into()]
            })
            .as_deref(),
            Some("the load balancer is gone from the cloud")
        );
        assert_eq!(
            drift_of(&LoadBalancerPreview::Change {
                backends_added: vec!["a".into(), "b".into()],
                backends_removed: vec!["c".into()],
                detail: "the listener on port 80 would be created".into(),
            })
            .as_deref(),
            Some(
                "backends missing: a, b; backends that should not be there: c; the listener on port 80 would be created"
            )
        );
    }
}
