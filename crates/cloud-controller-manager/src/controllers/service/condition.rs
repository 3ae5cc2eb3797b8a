//! The `ccm.rs/LoadBalancerReady` condition on a LoadBalancer Service's status: why its load balancer is
//! pending or failed, in the Service itself (kubernetes#18451). Pure: what the condition should say after
//! a sync ([`Readiness`]) and the conditions list that says it ([`conditions_with`]); `sync.rs` writes it.
//!
//! The type carries our domain: the condition is this manager's, not the Kubernetes API's (KEP-6128 puts
//! its conditions on a `LoadBalancer` object of its own), and other controllers' conditions on the same
//! Service are kept as they are. The list is written only when our condition changes (type, status,
//! reason, message or observed generation), so a quiet resync writes nothing.

use k8s_openapi::{
    api::core::v1::Service,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};

use super::ServiceError;
use cloud_provider::CloudError;

/// The condition's type.
pub const CONDITION_TYPE: &str = "ccm.rs/LoadBalancerReady";

/// The API server refuses a condition message over 32,768 bytes; a cloud error could be longer.
const MAX_MESSAGE: usize = 4096;

/// Why the condition has its status (the `reason` field: CamelCase, as the API requires).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The load balancer is there and its address published (status `True`).
    Ensured,
    /// The cloud is still making it (a "retry after" from the provider, or no address yet).
    Provisioning,
    /// It exists, but no node can take its traffic (every node excluded, being deleted or scaled down).
    NoNodes,
    /// The cloud call failed; it is retried on the Service's back-off.
    CloudError,
    /// The provider will not serve the Service as it asks (an annotation, a field, an address).
    Refused,
    /// This manager's cloud provider offers no load balancers.
    NotServed,
}

impl Reason {
    /// The `reason` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ensured => "Ensured",
            Self::Provisioning => "Provisioning",
            Self::NoNodes => "NoNodes",
            Self::CloudError => "CloudError",
            Self::Refused => "Refused",
            Self::NotServed => "NotServed",
        }
    }
}

/// What the condition says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Why.
    pub reason: Reason,
    /// What happened and what to do about it.
    pub message: String,
}

impl Readiness {
    /// The load balancer is ensured and published: `True`, unless no node backs it. (The message names
    /// no count: a count would change with every node and rewrite every Service's condition.)
    pub fn ensured(has_backends: bool) -> Self {
        if !has_backends {
            return Self {
                reason: Reason::NoNodes,
                message: "the load balancer exists but no node can take its traffic: every node is \
                          excluded (node.kubernetes.io/exclude-from-external-load-balancers), being \
                          deleted or being scaled down (ToBeDeletedByClusterAutoscaler)"
                    .to_owned(),
            };
        }
        Self {
            reason: Reason::Ensured,
            message: "the load balancer is ensured and its address published".to_owned(),
        }
    }

    /// What a failed sync says, or `None` when the failure is not the load balancer's (the API server
    /// refused or lost a write, leadership lapsed): the condition is left as it is.
    pub(crate) fn of_error(err: &ServiceError) -> Option<Self> {
        let (reason, message) = match err {
            ServiceError::Cloud { source, .. } => match source {
                CloudError::RetryAfter { message, .. } => {
                    (Reason::Provisioning, format!("{message}; asked again"))
                }
                CloudError::Refused { message } => (
                    Reason::Refused,
                    format!("{message}; fix the Service (it is retried on its back-off)"),
                ),
                CloudError::LeadershipLost { .. } => return None,
                _ => (
                    Reason::CloudError,
                    format!("{err}; retried on the Service's back-off"),
                ),
            },
            ServiceError::NoStatus => (
                Reason::Provisioning,
                "the cloud returned no address yet; asked again".to_owned(),
            ),
            ServiceError::Unsupported => (
                Reason::NotServed,
                "this manager's cloud provider offers no load balancers: give the Service the \
                 spec.loadBalancerClass of an implementation that serves it"
                    .to_owned(),
            ),
            ServiceError::Read { .. } | ServiceError::Write { .. } => return None,
        };
        Some(Self { reason, message })
    }

    fn status(&self) -> &'static str {
        if self.reason == Reason::Ensured {
            "True"
        } else {
            "False"
        }
    }
}

/// The Service's conditions.
fn conditions(service: &Service) -> &[Condition] {
    service
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

/// Whether the Service carries our condition.
pub fn has_condition(service: &Service) -> bool {
    conditions(service)
        .iter()
        .any(|c| c.type_ == CONDITION_TYPE)
}

fn truncated(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// The Service's conditions with ours saying `wanted` (`None`: ours removed), or `None` when they say it
/// already. Other conditions keep their place and content; `lastTransitionTime` moves only when the
/// status does.
pub fn conditions_with(
    service: &Service,
    wanted: Option<&Readiness>,
    now: &Time,
) -> Option<Vec<Condition>> {
    let current = conditions(service);
    let ours = current.iter().position(|c| c.type_ == CONDITION_TYPE);
    let Some(wanted) = wanted else {
        let i = ours?;
        let mut list = current.to_vec();
        list.remove(i);
        return Some(list);
    };
    let generation = service.metadata.generation;
    let message = truncated(&wanted.message);
    let status = wanted.status();
    if let Some(existing) = ours.map(|i| &current[i])
        && existing.status == status
        && existing.reason == wanted.reason.as_str()
        && existing.message == message
        && existing.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = ours
        .map(|i| &current[i])
        .filter(|c| c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: CONDITION_TYPE.to_owned(),
        status: status.to_owned(),
        reason: wanted.reason.as_str().to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    };
    let mut list = current.to_vec();
    match ours {
        Some(i) => list[i] = condition,
        None => list.push(condition),
    }
    Some(list)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::ServiceStatus, apimachinery::pkg::apis::meta::v1::ObjectMeta,
        jiff::Timestamp,
    };

    use super::*;

    fn time(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn service(generation: i64, conditions: Vec<Condition>) -> Service {
        Service {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            status: Some(ServiceStatus {
                conditions: Some(conditions),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str, at: i64) -> Condition {
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation: Some(1),
            last_transition_time: time(at),
        }
    }

    fn ensured() -> Readiness {
        Readiness::ensured(true)
    }

    #[test]
    fn written_only_when_it_changes_and_its_transition_time_moves_only_with_its_status() {
        let now = time(100);
        let ours = |status, reason, message: &str, at| {
            condition(CONDITION_TYPE, status, reason, message, at)
        };
        let other = condition("io.cilium/lb-ipam-request-satisfied", "True", "x", "", 5);
        let ready = ensured();
        struct Case {
            name: &'static str,
            before: Service,
            wanted: Option<Readiness>,
            after: Option<Vec<Condition>>,
        }
        let cases = [
            Case {
                name: "added beside another controller's",
                before: service(1, vec![other.clone()]),
                wanted: Some(ready.clone()),
                after: Some(vec![
                    other.clone(),
                    ours("True", "Ensured", &ready.message, 100),
                ]),
            },
            Case {
                name: "the same: no write",
                before: service(1, vec![ours("True", "Ensured", &ready.message, 7)]),
                wanted: Some(ready.clone()),
                after: None,
            },
            Case {
                name: "a new generation: written, transition time kept",
                before: service(2, vec![ours("True", "Ensured", &ready.message, 7)]),
                wanted: Some(ready.clone()),
                after: Some(vec![Condition {
                    observed_generation: Some(2),
                    ..ours("True", "Ensured", &ready.message, 7)
                }]),
            },
            Case {
                name: "another reason, same status: transition time kept",
                before: service(
                    1,
                    vec![ours("False", "CloudError", "boom", 7), other.clone()],
                ),
                wanted: Some(Readiness {
                    reason: Reason::Refused,
                    message: "bad".into(),
                }),
                after: Some(vec![ours("False", "Refused", "bad", 7), other.clone()]),
            },
            Case {
                name: "a new status: transition time now",
                before: service(1, vec![ours("False", "CloudError", "boom", 7)]),
                wanted: Some(ready.clone()),
                after: Some(vec![ours("True", "Ensured", &ready.message, 100)]),
            },
            Case {
                name: "removed, others kept",
                before: service(1, vec![other.clone(), ours("False", "Refused", "x", 7)]),
                wanted: None,
                after: Some(vec![other.clone()]),
            },
            Case {
                name: "nothing to remove: no write",
                before: service(1, vec![other.clone()]),
                wanted: None,
                after: None,
            },
            Case {
                name: "no status at all: nothing to remove",
                before: Service::default(),
                wanted: None,
                after: None,
            },
        ];
        for case in cases {
            assert_eq!(
                conditions_with(&case.before, case.wanted.as_ref(), &now),
                case.after,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn no_backend_is_not_ready() {
        assert_eq!(Readiness::ensured(false).reason, Reason::NoNodes);
        assert_eq!(Readiness::ensured(false).status(), "False");
        assert_eq!(Readiness::ensured(true).status(), "True");
    }

    #[test]
    fn each_failure_has_its_reason_and_api_failures_leave_the_condition() {
        let cloud = |source| ServiceError::Cloud {
            what: "failed to ensure load balancer",
            source,
        };
        let reason = |err: ServiceError| Readiness::of_error(&err).map(|r| r.reason);
        assert_eq!(
            reason(cloud(CloudError::retry_after(
                "still provisioning",
                std::time::Duration::from_secs(5)
            ))),
            Some(Reason::Provisioning)
        );
        assert_eq!(
            reason(cloud(CloudError::refused("annotation x: bad"))),
            Some(Reason::Refused)
        );
        assert_eq!(
            reason(cloud(CloudError::other("throttled"))),
            Some(Reason::CloudError)
        );
        assert_eq!(
            reason(cloud(CloudError::LeadershipLost {
                lapsed: std::time::Duration::from_secs(1)
            })),
            None
        );
        assert_eq!(reason(ServiceError::NoStatus), Some(Reason::Provisioning));
        assert_eq!(reason(ServiceError::Unsupported), Some(Reason::NotServed));
        let refused =
            Readiness::of_error(&cloud(CloudError::refused("annotation x: bad"))).unwrap();
        assert!(
            refused.message.starts_with("annotation x: bad"),
            "{refused:?}"
        );
        let failed = Readiness::of_error(&cloud(CloudError::other("throttled"))).unwrap();
        assert!(
            failed
                .message
                .contains("failed to ensure load balancer: throttled"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_long_message_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE);
        let cut = truncated(&long);
        assert!(cut.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
