//! The provider's one error type.

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::{display::DisplayErrorContext, metadata::ProvideErrorMetadata};
use cloud_provider::CloudError;

/// Everything that can go wrong in the `aws` provider.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A line of the cloud-config is malformed or names an unknown key.
    #[error("cloud-config {source_name}, line {line}: {message}")]
    Config {
        /// The file (its path, or `<cloud-config>`).
        source_name: String,
        /// The 1-based line number.
        line: usize,
        /// What is wrong, naming the key or section.
        message: String,
    },
    /// The cloud-config as a whole is invalid (keys that contradict each other, not UTF-8).
    #[error("cloud-config {source_name}: {message}")]
    ConfigFile {
        /// The file (its path, or `<cloud-config>`).
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// No region is known: neither the cloud-config nor the SDK's settings give one.
    #[error(
        "no AWS region: set Region or Zone in [Global] of the cloud-config, or AWS_REGION in the environment"
    )]
    NoRegion,
    /// An AWS call failed (after the retries of throttling and transient errors).
    #[error("AWS {operation} failed: {detail}")]
    Api {
        /// The API operation, e.g. `DescribeInstances`.
        operation: &'static str,
        /// The AWS error code, when AWS sent one (e.g. `InvalidInstanceID.NotFound`).
        code: Option<String>,
        /// The code and message, or the transport failure with its causes.
        detail: String,
    },
    /// AWS answered without something it always sends (a malformed or unexpected response).
    #[error("AWS {operation}: the response has no {missing}")]
    Response {
        /// The API operation.
        operation: &'static str,
        /// What was missing.
        missing: &'static str,
    },
    /// A Service's annotation (or field) has a value this provider cannot use.
    #[error("Service {service}: {field}: {message}")]
    Service {
        /// `namespace/name`.
        service: String,
        /// The annotation or field.
        field: String,
        /// What is wrong with its value.
        message: String,
    },
    /// A node's provider ID is not an AWS one.
    #[error(
        "node {node}: provider ID {provider_id:?} is not an AWS provider ID (aws:///<zone>/<instance-id>)"
    )]
    ProviderId {
        /// The node's name.
        node: String,
        /// Its `spec.providerID`.
        provider_id: String,
    },
    /// The cluster's cloud resources are not as this provider needs them (no VPC, no subnet, …).
    #[error("{0}")]
    Setup(String),
    /// AWS still holds a resource being removed (a group in use by a load balancer that just went);
    /// the call is asked again after a fixed delay.
    #[error("{0}")]
    StillInUse(String),
    /// The manager's leadership lapsed: no further AWS write is made (`cloud_provider::leadership`).
    #[error("not changing AWS: this replica's leadership lapsed {0:?} ago")]
    LeadershipLost(std::time::Duration),
}

impl Error {
    /// The error of an SDK call: its AWS code and message, or the transport failure with its causes.
    pub(crate) fn api<E, R>(operation: &'static str, err: &SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let code = err.code().map(str::to_owned);
        let detail = match (&code, err.message()) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code.clone(),
            _ => DisplayErrorContext(err).to_string(),
        };
        Self::Api {
            operation,
            code,
            detail,
        }
    }

    /// The AWS error code, for an API error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => code.as_deref(),
            _ => None,
        }
    }
}

impl From<Error> for CloudError {
    fn from(err: Error) -> Self {
        match err {
            Error::StillInUse(message) => {
                CloudError::retry_after(message, std::time::Duration::from_secs(10))
            }
            Error::LeadershipLost(lapsed) => CloudError::LeadershipLost { lapsed },
            service @ Error::Service { .. } => CloudError::refused(service.to_string()),
            other => CloudError::Other {
                message: other.to_string(),
                source: None,
            },
        }
    }
}

/// The provider's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
