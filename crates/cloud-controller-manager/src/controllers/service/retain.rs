//! `ccm.rs/load-balancer-retain: "true"`: a Service's load balancer, and its address, outlive the
//! Service (cloud-provider-aws#88 and #342, hcloud#327, DigitalOcean#454). When such a Service goes
//! (deleted, or no longer a LoadBalancer), the provider keeps its load balancer
//! ([`LoadBalancer::retain_load_balancer`]) instead of deleting it; a later Service of the same namespace
//! and name adopts it; the sweep leaves it ([`cloud_provider::ClusterLoadBalancer::retained`]).
//!
//! Nothing the annotation asks is dropped silently: a value other than `"true"` or `"false"` is refused
//! (the Service's condition says `Refused`; a Service that is going keeps its finalizer, and its load
//! balancer is neither deleted nor kept, until the value is fixed), and so is `"true"` with a provider
//! that cannot keep a load balancer, at the Service's first sync, before anything is made for it.

use cloud_provider::{CloudError, LoadBalancer};
use k8s_openapi::api::core::v1::Service;

/// The annotation.
pub const ANNOTATION: &str = "ccm.rs/load-balancer-retain";

/// Whether the Service asks for its load balancer to be kept: its annotation read, or why its value is
/// refused.
pub(crate) fn wanted(service: &Service) -> Result<bool, String> {
    let value = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION));
    match value.map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!(
            "{ANNOTATION}: {other:?} is neither \"true\" nor \"false\""
        )),
    }
}

/// Refuses, before anything is made, a Service whose load balancer could not be kept as it asks.
pub(crate) fn check(service: &Service, lb: &dyn LoadBalancer) -> Result<(), CloudError> {
    match wanted(service) {
        Ok(false) => Ok(()),
        Ok(true) if lb.retains_load_balancers() => Ok(()),
        Ok(true) => Err(CloudError::refused(format!(
            "{ANNOTATION}: this cloud provider cannot keep a load balancer once its Service goes; \
             remove the annotation, or use a provider that can (local, aws, fake)"
        ))),
        Err(why) => Err(CloudError::refused(why)),
    }
}

/// What became of the load balancer of a Service that went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// Deleted.
    Deleted,
    /// Kept for a later Service of the same namespace and name.
    Retained,
}

/// Deletes the load balancer of a Service that is going, or keeps it when the Service asks. A malformed
/// annotation is refused: neither is done.
pub(crate) async fn remove(
    lb: &dyn LoadBalancer,
    cluster_name: &str,
    service: &Service,
) -> Result<Removed, CloudError> {
    let keep = wanted(service).map_err(|why| {
        CloudError::refused(format!(
            "{why}: the load balancer is neither deleted nor kept until it is fixed"
        ))
    })?;
    if keep {
        lb.retain_load_balancer(cluster_name, service).await?;
        return Ok(Removed::Retained);
    }
    match lb.ensure_load_balancer_deleted(cluster_name, service).await {
        Ok(()) | Err(CloudError::ImplementedElsewhere) => Ok(Removed::Deleted),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn annotated(value: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: value.map(|v| [(ANNOTATION.to_owned(), v.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_true_and_false_are_taken() {
        for (value, expected) in [
            (None, Ok(false)),
            (Some("false"), Ok(false)),
            (Some("true"), Ok(true)),
        ] {
            assert_eq!(wanted(&annotated(value)), expected, "{value:?}");
        }
        for value in ["yes", "True", "1", ""] {
            let why = wanted(&annotated(Some(value))).unwrap_err();
            assert!(why.starts_with(ANNOTATION), "{why}");
            assert!(why.contains(&format!("{value:?}")), "{why}");
        }
    }
}
