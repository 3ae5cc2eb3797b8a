//! The errors a provider returns, classified so generic controllers can decide what to do.

use std::time::Duration;

/// A boxed error from the provider's own stack (an SDK, an HTTP client, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error every provider method returns.
///
/// The first variants are upstream's sentinel errors (`cloudprovider.InstanceNotFound`, `NotImplemented`,
/// `DiskNotFound`, `ImplementedElsewhere`) and `api.RetryError`; their messages are upstream's texts.
/// Controllers match on the variant, never on the text. The enum is `#[non_exhaustive]`: match it with a
/// wildcard arm, as later versions may add variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// The instance does not exist. The node-lifecycle controller treats it as "gone" and deletes the Node,
    /// so return it only when the cloud is sure; a stopped instance still exists.
    #[error("instance not found")]
    InstanceNotFound,

    /// This provider does not implement this call. Controllers fall back where upstream does
    /// (for example, a shutdown check that is not implemented means "not shut down").
    #[error("unimplemented")]
    NotImplemented,

    /// A volume does not exist (kept for parity with upstream; no generic controller uses it).
    #[error("disk is not found")]
    DiskNotFound,

    /// Another controller implements this load balancer: the service controller treats the call as a
    /// successful no-op. Never return it from `ensure_load_balancer_deleted`.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,

    /// Not an error so much as "not yet": retry after exactly this delay, without growing the
    /// exponential back-off (for example, a load balancer that is still provisioning).
    #[error("{message} (retry after {retry_after:?})")]
    RetryAfter {
        /// Why the call must be retried.
        message: String,
        /// How long to wait before the retry.
        retry_after: Duration,
    },

    /// This replica may no longer be the leader, so it must not change the cloud: the manager's
    /// leadership lapsed (its Lease was not renewed within the renew deadline) while the call ran.
    /// Return it from [`crate::leadership::check`] between the steps of a call that changes the cloud;
    /// the manager never retries it (the process is about to step down).
    #[error("not changing the cloud: this replica's leadership lapsed {lapsed:?} ago")]
    LeadershipLost {
        /// How long ago leadership lapsed.
        lapsed: Duration,
    },

    /// The provider will not serve the object as it asks: an annotation or field it cannot use, an
    /// address it cannot give. The message names what and why, so the user can fix it; the manager
    /// shows it (a Service's `ccm.rs/LoadBalancerReady` condition says `Refused`) and retries on the
    /// object's back-off, as for any failure, in case what was missing appears.
    #[error("{message}")]
    Refused {
        /// What is refused, and why (naming the annotation or field).
        message: String,
    },

    /// Anything else: what failed, with the underlying cause when there is one.
    #[error("{message}{}", .source.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    Other {
        /// What the provider was doing.
        message: String,
        /// The underlying cause.
        #[source]
        source: Option<BoxError>,
    },
}

impl CloudError {
    /// An error with only a message.
    pub fn other(message: impl Into<String>) -> Self {
        Self::Other {
            message: message.into(),
            source: None,
        }
    }

    /// An error that says what was being done, wrapping its cause.
    pub fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Other {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A refusal of what the object asks for ([`CloudError::Refused`]).
    pub fn refused(message: impl Into<String>) -> Self {
        Self::Refused {
            message: message.into(),
        }
    }

    /// A request to retry after `retry_after` (upstream's `api.NewRetryError`).
    pub fn retry_after(message: impl Into<String>, retry_after: Duration) -> Self {
        Self::RetryAfter {
            message: message.into(),
            retry_after,
        }
    }

    /// The requested retry delay, if this is a [`CloudError::RetryAfter`].
    pub fn retry_delay(&self) -> Option<Duration> {
        match self {
            Self::RetryAfter { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// `true` for [`CloudError::InstanceNotFound`].
    pub fn is_instance_not_found(&self) -> bool {
        matches!(self, Self::InstanceNotFound)
    }

    /// `true` for [`CloudError::NotImplemented`].
    pub fn is_not_implemented(&self) -> bool {
        matches!(self, Self::NotImplemented)
    }

    /// `true` for [`CloudError::ImplementedElsewhere`].
    pub fn is_implemented_elsewhere(&self) -> bool {
        matches!(self, Self::ImplementedElsewhere)
    }

    /// A short, stable name of the variant, for metric labels and event reasons.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InstanceNotFound => "instance_not_found",
            Self::NotImplemented => "not_implemented",
            Self::DiskNotFound => "disk_not_found",
            Self::ImplementedElsewhere => "implemented_elsewhere",
            Self::RetryAfter { .. } => "retry_after",
            Self::LeadershipLost { .. } => "leadership_lost",
            Self::Refused { .. } => "refused",
            Self::Other { .. } => "other",
        }
    }
}

/// The result of a provider call.
pub type CloudResult<T> = Result<T, CloudError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_upstream_texts() {
        assert_eq!(
            CloudError::InstanceNotFound.to_string(),
            "instance not found"
        );
        assert_eq!(CloudError::NotImplemented.to_string(), "unimplemented");
        assert_eq!(CloudError::DiskNotFound.to_string(), "disk is not found");
        assert_eq!(
            CloudError::ImplementedElsewhere.to_string(),
            "implemented by alternate to cloud provider"
        );
    }

    #[test]
    fn other_carries_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
        let err = CloudError::with_source("describing instances", io);
        assert_eq!(err.to_string(), "describing instances: connect timed out");
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(CloudError::other("boom").to_string(), "boom");
        assert_eq!(err.kind(), "other");
    }

    #[test]
    fn retry_after_exposes_its_delay() {
        let err = CloudError::retry_after("still provisioning", Duration::from_secs(7));
        assert_eq!(err.retry_delay(), Some(Duration::from_secs(7)));
        assert_eq!(CloudError::NotImplemented.retry_delay(), None);
        assert!(CloudError::InstanceNotFound.is_instance_not_found());
        assert!(CloudError::NotImplemented.is_not_implemented());
        assert!(CloudError::ImplementedElsewhere.is_implemented_elsewhere());
    }
}
