//! Every event the service-lb controller records on a Service, typed: its type, upstream's reason and
//! action strings (kept exactly, since dashboards and `kubectl get events --field-selector reason=…`
//! match on them), and its message.

use std::sync::Arc;

use cloud_provider::CloudError;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::runtime::events::EventType;

use super::ServiceError;
use crate::events::EventRecorder;

/// How many node names an [`ServiceEvent::UpdateLoadBalancerFailed`] message lists (upstream's limit).
const NODE_NAMES_SHOWN: usize = 20;

/// The step of the controller an event belongs to (the event's `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Ensuring a Service's load balancer.
    Ensure,
    /// Updating a load balancer's hosts after a node change.
    Update,
    /// Deleting a load balancer.
    Delete,
    /// A Service's sync as a whole.
    Sync,
}

impl Step {
    /// The action string upstream records.
    pub(crate) fn action(self) -> &'static str {
        match self {
            Self::Ensure => "EnsureLoadBalancer",
            Self::Update => "UpdateLoadBalancer",
            Self::Delete => "DeleteLoadBalancer",
            Self::Sync => "SyncLoadBalancer",
        }
    }
}

/// An event the controller records on a Service.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ServiceEvent<'a> {
    /// An ensure begins.
    EnsuringLoadBalancer,
    /// The cloud ensured the load balancer.
    EnsuredLoadBalancer,
    /// No node can back the load balancer (the cloud call goes ahead regardless), found while ensuring
    /// ([`Step::Ensure`]) or updating hosts ([`Step::Update`]).
    NoAvailableNodes(Step),
    /// A sync failed (it is retried on the Service's back-off).
    SyncLoadBalancerFailed(&'a ServiceError),
    /// A load balancer is being deleted.
    DeletingLoadBalancer,
    /// A load balancer was deleted (upstream quirk kept: also after a cleanup that found none).
    DeletedLoadBalancer,
    /// Deleting the load balancer of a deleted Service failed.
    DeleteLoadBalancerFailed(&'a CloudError),
    /// The load balancer of a Service that went was kept for a later Service of its namespace and name
    /// (`ccm.rs/load-balancer-retain`; not in upstream).
    RetainedLoadBalancer,
    /// The sweep deleted a load balancer whose Service no longer exists (not in upstream): recorded on
    /// the Service it was made for, so `kubectl get events -n <its namespace>` shows it.
    DeletedOrphanedLoadBalancer {
        /// The load balancer's cloud-side name.
        name: &'a str,
    },
    /// A load balancer was given the current backend nodes.
    UpdatedLoadBalancer,
    /// The drift check found the load balancer differing from what the Service asks (not in upstream).
    LoadBalancerDrift {
        /// What differs, in words.
        what: &'a str,
        /// Whether it is being ensured again (`--load-balancer-drift=heal`).
        healing: bool,
    },
    /// Giving a load balancer the current backend nodes failed (it is retried through a full sync).
    UpdateLoadBalancerFailed {
        /// The nodes it was to be given.
        nodes: &'a [Arc<Node>],
        /// The cloud's error.
        error: &'a CloudError,
    },
}

impl ServiceEvent<'_> {
    /// Normal or Warning.
    pub(crate) fn type_(&self) -> EventType {
        match self {
            Self::EnsuringLoadBalancer
            | Self::EnsuredLoadBalancer
            | Self::DeletingLoadBalancer
            | Self::DeletedLoadBalancer
            | Self::DeletedOrphanedLoadBalancer { .. }
            | Self::RetainedLoadBalancer
            | Self::UpdatedLoadBalancer => EventType::Normal,
            Self::NoAvailableNodes(_)
            | Self::LoadBalancerDrift { .. }
            | Self::SyncLoadBalancerFailed(_)
            | Self::DeleteLoadBalancerFailed(_)
            | Self::UpdateLoadBalancerFailed { .. } => EventType::Warning,
        }
    }

    /// Upstream's reason string.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::EnsuringLoadBalancer => "EnsuringLoadBalancer",
            Self::EnsuredLoadBalancer => "EnsuredLoadBalancer",
            Self::NoAvailableNodes(_) => "UnAvailableLoadBalancer",
            Self::SyncLoadBalancerFailed(_) => "SyncLoadBalancerFailed",
            Self::DeletingLoadBalancer => "DeletingLoadBalancer",
            Self::DeletedLoadBalancer => "DeletedLoadBalancer",
            Self::DeleteLoadBalancerFailed(_) => "DeleteLoadBalancerFailed",
            Self::RetainedLoadBalancer => "RetainedLoadBalancer",
            Self::DeletedOrphanedLoadBalancer { .. } => "DeletedOrphanedLoadBalancer",
            Self::UpdatedLoadBalancer => "UpdatedLoadBalancer",
            Self::UpdateLoadBalancerFailed { .. } => "UpdateLoadBalancerFailed",
            Self::LoadBalancerDrift { .. } => "LoadBalancerDrift",
        }
    }

    /// The step it belongs to.
    pub(crate) fn step(&self) -> Step {
        match self {
            Self::EnsuringLoadBalancer | Self::EnsuredLoadBalancer => Step::Ensure,
            Self::NoAvailableNodes(step) => *step,
            Self::SyncLoadBalancerFailed(_) | Self::LoadBalancerDrift { .. } => Step::Sync,
            Self::DeletingLoadBalancer
            | Self::DeletedLoadBalancer
            | Self::DeleteLoadBalancerFailed(_)
            | Self::RetainedLoadBalancer
            | Self::DeletedOrphanedLoadBalancer { .. } => Step::Delete,
            Self::UpdatedLoadBalancer | Self::UpdateLoadBalancerFailed { .. } => Step::Update,
        }
    }

    /// The message (upstream's wording).
    pub(crate) fn message(&self) -> String {
        match self {
            Self::EnsuringLoadBalancer => "Ensuring load balancer".to_owned(),
            Self::EnsuredLoadBalancer => "Ensured load balancer".to_owned(),
            Self::NoAvailableNodes(_) => "There are no available nodes for LoadBalancer".to_owned(),
            Self::SyncLoadBalancerFailed(err) => format!("Error syncing load balancer: {err}"),
            Self::DeletingLoadBalancer => "Deleting load balancer".to_owned(),
            Self::DeletedLoadBalancer => "Deleted load balancer".to_owned(),
            Self::DeleteLoadBalancerFailed(err) => format!("Error deleting load balancer: {err}"),
            Self::RetainedLoadBalancer => "Kept the load balancer and its address \
                (ccm.rs/load-balancer-retain): a Service of this namespace and name adopts it; the \
                provider's docs say how to release it"
                .to_owned(),
            Self::DeletedOrphanedLoadBalancer { name } => format!(
                "Deleted load balancer {name}: the cloud still held it although its Service no longer exists"
            ),
            Self::UpdatedLoadBalancer => "Updated load balancer with new hosts".to_owned(),
            Self::LoadBalancerDrift { what, healing } => format!(
                "The load balancer differs from what the Service asks: {what}; {}",
                if *healing {
                    "ensuring it again"
                } else {
                    "left as it is (--load-balancer-drift=report)"
                }
            ),
            Self::UpdateLoadBalancerFailed { nodes, error } => {
                let names: Vec<&str> = nodes
                    .iter()
                    .take(NODE_NAMES_SHOWN)
                    .map(|n| n.metadata.name.as_deref().unwrap_or_default())
                    .collect();
                format!(
                    "Error updating load balancer with new hosts {names:?} [node number: {}]: {error}",
                    nodes.len()
                )
            }
        }
    }

    /// Records the event on `service` (best effort, never failing the caller).
    pub(crate) async fn record(self, events: &EventRecorder, service: &Service) {
        events
            .record(
                service,
                self.type_(),
                self.reason(),
                self.step().action(),
                self.message(),
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Every event with today's exact type, reason, action and message.
    #[test]
    fn every_event_keeps_upstreams_strings() {
        use EventType::{Normal, Warning};
        let cloud = CloudError::NotImplemented;
        let sync = ServiceError::NoStatus;
        let two = [Arc::new(node("a")), Arc::new(node("b"))];
        let many: Vec<Arc<Node>> = (0..25).map(|i| Arc::new(node(&format!("n{i}")))).collect();
        let twenty: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
        let table: Vec<(ServiceEvent<'_>, EventType, &str, &str, String)> = vec![
            (
                ServiceEvent::EnsuringLoadBalancer,
                Normal,
                "EnsuringLoadBalancer",
                "EnsureLoadBalancer",
                "Ensuring load balancer".into(),
            ),
            (
                ServiceEvent::EnsuredLoadBalancer,
                Normal,
                "EnsuredLoadBalancer",
                "EnsureLoadBalancer",
                "Ensured load balancer".into(),
            ),
            (
                ServiceEvent::NoAvailableNodes(Step::Ensure),
                Warning,
                "UnAvailableLoadBalancer",
                "EnsureLoadBalancer",
                "There are no available nodes for LoadBalancer".into(),
            ),
            (
                ServiceEvent::NoAvailableNodes(Step::Update),
                Warning,
                "UnAvailableLoadBalancer",
                "UpdateLoadBalancer",
                "There are no available nodes for LoadBalancer".into(),
            ),
            (
                ServiceEvent::SyncLoadBalancerFailed(&sync),
                Warning,
                "SyncLoadBalancerFailed",
                "SyncLoadBalancer",
                "Error syncing load balancer: service status returned by EnsureLoadBalancer is nil"
                    .into(),
            ),
            (
                ServiceEvent::DeletingLoadBalancer,
                Normal,
                "DeletingLoadBalancer",
                "DeleteLoadBalancer",
                "Deleting load balancer".into(),
            ),
            (
                ServiceEvent::DeletedLoadBalancer,
                Normal,
                "DeletedLoadBalancer",
                "DeleteLoadBalancer",
                "Deleted load balancer".into(),
            ),
            (
                ServiceEvent::DeleteLoadBalancerFailed(&cloud),
                Warning,
                "DeleteLoadBalancerFailed",
                "DeleteLoadBalancer",
                "Error deleting load balancer: unimplemented".into(),
            ),
            (
                ServiceEvent::DeletedOrphanedLoadBalancer { name: "a1b2" },
                Normal,
                "DeletedOrphanedLoadBalancer",
                "DeleteLoadBalancer",
                "Deleted load balancer a1b2: the cloud still held it although its Service no longer exists".into(),
            ),
            (
                ServiceEvent::UpdatedLoadBalancer,
                Normal,
                "UpdatedLoadBalancer",
                "UpdateLoadBalancer",
                "Updated load balancer with new hosts".into(),
            ),
            (
                ServiceEvent::LoadBalancerDrift {
                    what: "the load balancer is gone from the cloud",
                    healing: true,
                },
                Warning,
                "LoadBalancerDrift",
                "SyncLoadBalancer",
                "The load balancer differs from what the Service asks: the load balancer is gone from the cloud; ensuring it again".into(),
            ),
            (
                ServiceEvent::LoadBalancerDrift {
                    what: "backends missing: a",
                    healing: false,
                },
                Warning,
                "LoadBalancerDrift",
                "SyncLoadBalancer",
                "The load balancer differs from what the Service asks: backends missing: a; left as it is (--load-balancer-drift=report)".into(),
            ),
            (
                ServiceEvent::UpdateLoadBalancerFailed {
                    nodes: &two,
                    error: &cloud,
                },
                Warning,
                "UpdateLoadBalancerFailed",
                "UpdateLoadBalancer",
                r#"Error updating load balancer with new hosts ["a", "b"] [node number: 2]: unimplemented"#
                    .into(),
            ),
            (
                ServiceEvent::UpdateLoadBalancerFailed {
                    nodes: &many,
                    error: &cloud,
                },
                Warning,
                "UpdateLoadBalancerFailed",
                "UpdateLoadBalancer",
                format!(
                    "Error updating load balancer with new hosts {twenty:?} [node number: 25]: unimplemented"
                ),
            ),
        ];
        for (event, type_, reason, action, message) in table {
            assert_eq!(event.type_(), type_, "{event:?}");
            assert_eq!(event.reason(), reason, "{event:?}");
            assert_eq!(event.step().action(), action, "{event:?}");
            assert_eq!(event.message(), message, "{event:?}");
        }
    }
}
