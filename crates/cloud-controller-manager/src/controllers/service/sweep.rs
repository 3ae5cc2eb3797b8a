//! The sweep of orphaned load balancers (not in upstream): every `--orphaned-load-balancer-sweep-period`
//! the controller lists the load balancers the cloud holds for this cluster and deletes each one whose
//! Service no longer exists.
//!
//! Upstream's service controller only ever deletes the load balancer of a Service it saw go, so one
//! created after that (a leader that froze in the middle of an ensure and resumed after the Service was
//! deleted, issue #32) or whose deletion was lost stays in the cloud, and is billed, for good. The sweep
//! finds it whatever leaked it.
//!
//! A load balancer is an orphan when its name is [`LoadBalancer::get_load_balancer_name`] of no Service
//! that exists, and the UID the cloud recorded for it ([`ClusterLoadBalancer::service`]: the Service
//! that adopted a kept one, say) is of no Service that exists either. The cache answers first; a candidate is then confirmed against a fresh list from the API
//! server (a Service created a moment ago may not be in the cache yet), taken after the cloud's list, so
//! a load balancer ensured for a Service always finds that Service in it unless it was deleted since. A
//! Service that exists but no longer wants a load balancer is the controller's business, not the
//! sweep's.

use std::{collections::HashSet, sync::Arc, time::Duration};

use cloud_provider::{CloudError, ClusterLoadBalancer, LoadBalancer};
use k8s_openapi::api::core::v1::Service;
use kube::{Api, api::ListParams, runtime::reflector::Store};
use tokio_util::sync::CancellationToken;

use super::{Context, ServiceError, events::ServiceEvent};

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Swept {
    /// Load balancers the cloud listed.
    pub(super) listed: usize,
    /// Orphans deleted.
    pub(super) deleted: usize,
    /// Orphans whose deletion failed (tried again at the next sweep).
    pub(super) failed: usize,
}

/// What the Services that exist claim: their load balancers' names, and their UIDs.
#[derive(Debug, Default)]
pub(super) struct Claims {
    names: HashSet<String>,
    uids: HashSet<String>,
}

impl Claims {
    /// The claims of `services`.
    fn of<'a>(
        lb: &dyn LoadBalancer,
        cluster_name: &str,
        services: impl IntoIterator<Item = &'a Service>,
    ) -> Self {
        let mut claims = Self::default();
        for service in services {
            claims
                .names
                .insert(lb.get_load_balancer_name(cluster_name, service));
            claims.uids.extend(service.metadata.uid.clone());
        }
        claims
    }

    fn claim(&self, lb: &ClusterLoadBalancer) -> bool {
        self.names.contains(&lb.name)
            || lb
                .service
                .as_ref()
                .and_then(|s| s.uid.as_ref())
                .is_some_and(|uid| self.uids.contains(uid))
    }
}

/// The listed load balancers no Service claims, except those kept for a Service that went
/// (`ccm.rs/load-balancer-retain`).
pub(super) fn unclaimed<'a>(
    listed: impl IntoIterator<Item = &'a ClusterLoadBalancer>,
    claims: &Claims,
) -> Vec<&'a ClusterLoadBalancer> {
    listed
        .into_iter()
        .filter(|lb| !lb.retained && !claims.claim(lb))
        .collect()
}

/// Sweeps every `period` (the first time one period after the start) until `shutdown`. Stops for good,
/// with one log line, when the provider cannot list its load balancers.
pub(super) async fn sweep_loop(
    ctx: Arc<Context>,
    services: Store<Service>,
    period: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        match sweep_once(&ctx, &services).await {
            Ok(swept) if swept.deleted + swept.failed > 0 => tracing::info!(
                listed = swept.listed,
                deleted = swept.deleted,
                failed = swept.failed,
                "orphaned load balancer sweep"
            ),
            Ok(swept) => {
                tracing::debug!(listed = swept.listed, "orphaned load balancer sweep: none")
            }
            Err(ServiceError::Cloud {
                source: CloudError::NotImplemented,
                ..
            }) => {
                tracing::info!(
                    provider = ctx.cloud.provider_name(),
                    "the provider does not list its load balancers: no sweep of orphaned load balancers"
                );
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "orphaned load balancer sweep failed; trying again in {period:?}")
            }
        }
    }
}

/// One sweep: list, find the unclaimed, confirm them against the API server, delete them.
pub(super) async fn sweep_once(
    ctx: &Context,
    services: &Store<Service>,
) -> Result<Swept, ServiceError> {
    let lb = ctx.load_balancer()?;
    let listed = lb
        .list_load_balancers(&ctx.cluster_name)
        .await
        .map_err(|source| ServiceError::Cloud {
            what: "failed to list load balancers",
            source,
        })?;
    let mut swept = Swept {
        listed: listed.len(),
        ..Swept::default()
    };
    let cached = services.state();
    let candidates = unclaimed(
        &listed,
        &Claims::of(lb, &ctx.cluster_name, cached.iter().map(|s| s.as_ref())),
    );
    if candidates.is_empty() {
        return Ok(swept);
    }
    // Confirmed from a fresh, consistent list: the cache may not hold a Service created a moment ago.
    let fresh = Api::<Service>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| ServiceError::Read {
            what: "failed to list Services to confirm orphaned load balancers",
            source,
        })?;
    let claimed = Claims::of(lb, &ctx.cluster_name, &fresh.items);
    for orphan in unclaimed(candidates, &claimed) {
        let service = orphan.service.as_ref().map(ToString::to_string);
        match lb
            .delete_orphaned_load_balancer(&ctx.cluster_name, orphan)
            .await
        {
            Ok(()) => {
                swept.deleted += 1;
                ctx.metrics.orphans_deleted.inc();
                tracing::info!(
                    load_balancer = orphan.name,
                    service = service.as_deref().unwrap_or("(unknown)"),
                    "deleted an orphaned load balancer: its Service no longer exists"
                );
                if let Some(reference) = &orphan.service {
                    ServiceEvent::DeletedOrphanedLoadBalancer { name: &orphan.name }
                        .record(&ctx.events, &gone_service(reference))
                        .await;
                }
            }
            Err(err) => {
                swept.failed += 1;
                tracing::warn!(
                    load_balancer = orphan.name,
                    service = service.as_deref().unwrap_or("(unknown)"),
                    error = %err,
                    "failed to delete an orphaned load balancer; trying again at the next sweep"
                );
            }
        }
    }
    Ok(swept)
}

/// The Service an orphan was made for, as far as the cloud knows it, for the event's `regarding`.
fn gone_service(reference: &cloud_provider::ServiceRef) -> Service {
    let mut service = Service::default();
    service.metadata.namespace = Some(reference.namespace.clone());
    service.metadata.name = Some(reference.name.clone());
    service.metadata.uid = reference.uid.clone();
    service
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(name: &str) -> ClusterLoadBalancer {
        ClusterLoadBalancer::new(name, None)
    }

    #[test]
    fn only_names_no_service_claims_are_unclaimed() {
        let listed = [lb("a1"), lb("a2"), lb("a3")];
        let cases: [(&[&str], &[&str]); 4] = [
            (&[], &["a1", "a2", "a3"]),
            (&["a2"], &["a1", "a3"]),
            (&["a1", "a2", "a3", "other"], &[]),
            (&["A1"], &["a1", "a2", "a3"]), // names are compared exactly
        ];
        for (claimed, expected) in cases {
            let claimed = Claims {
                names: claimed.iter().map(|s| s.to_string()).collect(),
                ..Claims::default()
            };
            let names: Vec<&str> = unclaimed(&listed, &claimed)
                .into_iter()
                .map(|lb| lb.name.as_str())
                .collect();
            assert_eq!(names, expected, "claimed {claimed:?}");
        }
    }

    #[test]
    fn a_load_balancer_recorded_for_a_uid_that_exists_is_claimed() {
        let of = |uid: &str| {
            ClusterLoadBalancer::new(
                "a-kept",
                Some(cloud_provider::ServiceRef::new("shop", "web").with_uid(uid)),
            )
        };
        let listed = [of("u-adopter"), of("u-gone"), lb("a-untagged")];
        let claims = Claims {
            uids: ["u-adopter".to_owned()].into(),
            ..Claims::default()
        };
        let names: Vec<_> = unclaimed(&listed, &claims)
            .into_iter()
            .map(|lb| lb.service.as_ref().and_then(|s| s.uid.clone()))
            .collect();
        assert_eq!(names, [Some("u-gone".to_owned()), None]);
    }

    #[test]
    fn a_retained_load_balancer_is_never_an_orphan() {
        let listed = [lb("a1"), lb("a2").retained()];
        let names: Vec<&str> = unclaimed(&listed, &Claims::default())
            .into_iter()
            .map(|lb| lb.name.as_str())
            .collect();
        assert_eq!(names, ["a1"]);
    }

    #[test]
    fn the_gone_service_names_what_the_cloud_recorded() {
        let reference = cloud_provider::ServiceRef::new("shop", "web").with_uid("u-1");
        let service = gone_service(&reference);
        assert_eq!(service.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(service.metadata.name.as_deref(), Some("web"));
        assert_eq!(service.metadata.uid.as_deref(), Some("u-1"));
    }
}
