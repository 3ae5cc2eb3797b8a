//! The provider's one error type.

use cloud_provider::CloudError;

/// Everything that can go wrong in the `kubevirt` provider.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud-config is malformed, names an unknown key or a value we cannot use.
    #[error("cloud-config {source_name}: {message}")]
    Config {
        /// The file (its path, or `<cloud-config>`).
        source_name: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// The infra cluster's kubeconfig cannot be read or used.
    #[error("the infra cluster's kubeconfig {path}: {message}")]
    Kubeconfig {
        /// Its path (`in-cluster` without one).
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The provider was used before the manager initialized it (a bug in the caller).
    #[error(
        "the kubevirt provider is not initialized yet (CloudProvider::initialize was not called)"
    )]
    NotInitialized,
    /// A call to the infra API server failed.
    #[error("infra API server: {verb} {what}: {detail}")]
    Infra {
        /// `get`, `list`, `create`, ...
        verb: &'static str,
        /// The object or collection, e.g. `virtualmachineinstance tenant-a/node-1`.
        what: String,
        /// The server's answer or the transport failure, with what to do about a refusal.
        detail: String,
        /// The HTTP status the server answered with, when it answered.
        code: Option<u16>,
    },
    /// A node's provider ID is not `kubevirt://<vmi>`.
    #[error("node {node}: provider ID {provider_id:?} is not of the form \"kubevirt://<vmi>\"")]
    ProviderId {
        /// The node.
        node: String,
        /// Its provider ID.
        provider_id: String,
    },
    /// What the infra cluster has cannot be used (a VMI without an address, more than one VMI for a
    /// hostname, a phase that says nothing).
    #[error("{0}")]
    Infrastructure(String),
}

impl Error {
    /// A failed infra call, said in words: a refusal names the permission the provider lacks.
    pub(crate) fn infra(verb: &'static str, what: impl Into<String>, err: kube::Error) -> Self {
        let what = what.into();
        match err {
            kube::Error::Api(status) => {
                let code = status.code;
                let hint = match code {
                    403 => {
                        "; the provider's identity lacks this permission in the infra cluster (see deploy/kubevirt/infra-rbac.yaml)"
                    }
                    401 => "; the infra kubeconfig's credentials are not accepted",
                    _ => "",
                };
                Self::Infra {
                    verb,
                    what,
                    detail: format!("{} ({}){hint}", status.message, status.reason),
                    code: Some(code),
                }
            }
            other => Self::Infra {
                verb,
                what,
                detail: other.to_string(),
                code: None,
            },
        }
    }

    /// Whether the infra API server answered 404 Not Found.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::Infra {
                code: Some(404),
                ..
            }
        )
    }
}

impl From<Error> for CloudError {
    fn from(err: Error) -> Self {
        CloudError::other(err.to_string())
    }
}
