//! `--use-service-account-credentials`: each controller's API client authenticates as a ServiceAccount
//! of its own in `kube-system` (upstream's `DynamicControllerClientBuilder` in
//! `k8s.io/controller-manager/pkg/clientbuilder`).
//!
//! For each ServiceAccount a controller names ([`crate::ControllerSpec::client_name`]: the built-in
//! controllers use upstream's `node-controller`, `service-controller` and `route-controller`, which the
//! API server's bootstrap roles bind), the manager, with its own identity:
//! 1. gets the ServiceAccount, creating it if missing (`getOrCreateServiceAccount`; creating the
//!    namespace first is tried and tolerated to fail, as upstream). In shadow mode (`--dry-run`) nothing
//!    is created: a missing ServiceAccount is an error that says so;
//! 2. requests a token for it (`POST .../serviceaccounts/<name>/token`, `expirationSeconds: 3600`), and
//!    keeps it fresh ([`token_source`]).
//!
//! The first token is requested before the controllers start, so missing RBAC stops the manager at start
//! with the ServiceAccount and the API error named. The controllers' clients are built from an anonymous
//! copy of the manager's config (the server and its CA, no client certificate, token or basic auth:
//! `restclient.AnonymousClientConfig`) with [`auth_layer`] adding the token.

pub(crate) mod auth_layer;
pub(crate) mod token_source;

use std::{collections::HashMap, sync::Arc};

use cloud_provider::Supervisor;
use k8s_openapi::{
    api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::{Namespace, ServiceAccount},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

pub(crate) use auth_layer::ServiceAccountAuthLayer;
pub(crate) use token_source::TokenSource;
use token_source::{Fetch, IssuedToken};

/// The namespace of the controllers' ServiceAccounts (upstream: `metav1.NamespaceSystem`).
pub const NAMESPACE: &str = "kube-system";
/// The lifetime asked of each token (upstream's `defaultExpirationSeconds`).
pub const EXPIRATION_SECONDS: i64 = 3600;

/// Why a controller's ServiceAccount or its token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The token request failed.
    #[error(
        "--use-service-account-credentials: cannot get a token for {NAMESPACE}/{service_account}: {}{}",
        brief(source),
        if is_forbidden(source) { "; the manager's identity needs create on serviceaccounts/token (deploy/components/service-account-credentials)" } else { "" }
    )]
    Token {
        /// The ServiceAccount.
        service_account: String,
        /// The API server's answer.
        #[source]
        source: kube::Error,
    },
    /// The ServiceAccount could not be read or created.
    #[error(
        "--use-service-account-credentials: cannot {verb} the ServiceAccount {NAMESPACE}/{service_account}: {}{}",
        brief(source),
        if is_forbidden(source) { "; the manager's identity needs get and create on serviceaccounts in kube-system (deploy/components/service-account-credentials)" } else { "" }
    )]
    ServiceAccount {
        /// The ServiceAccount.
        service_account: String,
        /// `get` or `create`.
        verb: &'static str,
        /// The API server's answer.
        #[source]
        source: kube::Error,
    },
    /// Shadow mode creates nothing, and the ServiceAccount does not exist.
    #[error(
        "--use-service-account-credentials: the ServiceAccount {NAMESPACE}/{service_account} does not exist, and --dry-run (shadow mode) creates nothing; create it (kubectl -n {NAMESPACE} create serviceaccount {service_account}) or run the shadow without --use-service-account-credentials"
    )]
    MissingInShadowMode {
        /// The ServiceAccount.
        service_account: String,
    },
    /// The API server's answer held no token.
    #[error(
        "--use-service-account-credentials: the token request for {NAMESPACE}/{service_account} returned no token"
    )]
    NoToken {
        /// The ServiceAccount.
        service_account: String,
    },
    /// The token cannot be sent in a header.
    #[error(
        "--use-service-account-credentials: the token request for {NAMESPACE}/{service_account} returned a token that is not a valid header value"
    )]
    BadToken {
        /// The ServiceAccount.
        service_account: String,
    },
}

fn is_forbidden(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 403)
}

/// An API server's refusal as its message and code (kube's own text adds the whole status, debug
/// printed); other errors as they are.
fn brief(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

/// The ServiceAccounts' tokens, one [`TokenSource`] per ServiceAccount however many controllers share
/// it (the node controllers share `node-controller`).
pub(crate) struct ServiceAccountCredentials {
    accounts: Api<ServiceAccount>,
    namespaces: Api<Namespace>,
    /// Shadow mode: create nothing.
    shadow: bool,
    /// Runs the tokens' refreshes.
    supervisor: Supervisor,
    sources: tokio::sync::Mutex<HashMap<String, TokenSource>>,
}

impl ServiceAccountCredentials {
    /// Requests tokens with `client` (the manager's own identity, writing for real even in shadow mode:
    /// a TokenRequest stores nothing), refreshed by tasks of `supervisor` until its shutdown; with
    /// `shadow`, never creates a ServiceAccount.
    pub(crate) fn new(client: Client, shadow: bool, supervisor: Supervisor) -> Self {
        Self {
            accounts: Api::namespaced(client.clone(), NAMESPACE),
            namespaces: Api::all(client),
            shadow,
            supervisor,
            sources: tokio::sync::Mutex::default(),
        }
    }

    /// The token source of `service_account`: its first token is got now (the ServiceAccount is
    /// created first if missing), and kept fresh from then on.
    pub(crate) async fn token_source(
        self: &Arc<Self>,
        service_account: &str,
    ) -> Result<TokenSource, CredentialsError> {
        let mut sources = self.sources.lock().await;
        if let Some(source) = sources.get(service_account) {
            return Ok(source.clone());
        }
        let this = Arc::clone(self);
        let name = service_account.to_owned();
        let fetch: Fetch = Arc::new(move || {
            let (this, name) = (this.clone(), name.clone());
            Box::pin(async move { this.fetch(&name).await })
        });
        let source = TokenSource::start(service_account, fetch, &self.supervisor).await?;
        sources.insert(service_account.to_owned(), source.clone());
        Ok(source)
    }

    /// Upstream's `tokenSourceImpl.Token`: the ServiceAccount, then a token for it.
    async fn fetch(&self, service_account: &str) -> Result<IssuedToken, CredentialsError> {
        self.get_or_create(service_account).await?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(EXPIRATION_SECONDS),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = self
            .accounts
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .map_err(|source| CredentialsError::Token {
                service_account: service_account.to_owned(),
                source,
            })?;
        let status = answer.status.unwrap_or_default();
        match status.token {
            Some(token) if !token.is_empty() => Ok(IssuedToken {
                token,
                // Without an expiration (no API server omits it), the token counts as expiring now,
                // which the schedule pins to the shortest lifetime, as upstream's zero time is.
                expiration: status
                    .expiration_timestamp
                    .map_or_else(Timestamp::now, |time| time.0),
            }),
            _ => Err(CredentialsError::NoToken {
                service_account: service_account.to_owned(),
            }),
        }
    }

    /// Upstream's `getOrCreateServiceAccount` (creating nothing in shadow mode).
    async fn get_or_create(&self, service_account: &str) -> Result<(), CredentialsError> {
        let failed = |verb, source| CredentialsError::ServiceAccount {
            service_account: service_account.to_owned(),
            verb,
            source,
        };
        if self
            .accounts
            .get_opt(service_account)
            .await
            .map_err(|source| failed("get", source))?
            .is_some()
        {
            return Ok(());
        }
        if self.shadow {
            return Err(CredentialsError::MissingInShadowMode {
                service_account: service_account.to_owned(),
            });
        }
        self.create_namespace_if_missing().await;
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(service_account.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match self.accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {
                tracing::info!(service_account = %format!("{NAMESPACE}/{service_account}"), "created the controller's ServiceAccount");
                Ok(())
            }
            // Created meanwhile (another replica): there now.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(source) => Err(failed("create", source)),
        }
    }

    /// Upstream creates the namespace when it can see it is missing, and tolerates any failure (the
    /// manager's role does not allow reading namespaces: the read is refused, and nothing is tried).
    async fn create_namespace_if_missing(&self) {
        if let Ok(None) = self.namespaces.get_opt(NAMESPACE).await {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(NAMESPACE.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match self
                .namespaces
                .create(&PostParams::default(), &namespace)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => tracing::warn!(error = %err, "cannot create the namespace {NAMESPACE}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::mock_api::mock_client;

    fn status(code: u16, message: &str) -> (u16, Value) {
        (
            code,
            json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": message, "reason": if code == 403 { "Forbidden" } else { "NotFound" } }),
        )
    }

    fn token_answer() -> (u16, Value) {
        (
            201,
            json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": { "audiences": [] },
                "status": { "token": "the-token", "expirationTimestamp": "2100-01-01T00:00:00Z" } }),
        )
    }

    async fn credentials(
        shadow: bool,
        respond: impl Fn(&str, &str, &Value) -> (u16, Value) + Send + Sync + 'static,
    ) -> (Arc<ServiceAccountCredentials>, crate::mock_api::Requests) {
        let (client, requests) = mock_client(respond);
        (
            Arc::new(ServiceAccountCredentials::new(
                client,
                shadow,
                Supervisor::new(Default::default(), CancellationToken::new()),
            )),
            requests,
        )
    }

    fn calls(requests: &crate::mock_api::Requests) -> Vec<String> {
        requests
            .lock()
            .iter()
            .map(|(method, path, _)| format!("{method} {path}"))
            .collect()
    }

    #[tokio::test]
    async fn a_missing_service_account_is_created_then_a_token_requested_for_an_hour() {
        let (credentials, requests) = credentials(false, |method, path, _| match (method, path) {
            ("GET", "/api/v1/namespaces/kube-system/serviceaccounts/service-controller") => {
                status(404, "not found")
            }
            ("GET", "/api/v1/namespaces/kube-system") => status(403, "forbidden"),
            ("POST", "/api/v1/namespaces/kube-system/serviceaccounts") => {
                (201, json!({ "metadata": { "name": "service-controller" } }))
            }
            ("POST", "/api/v1/namespaces/kube-system/serviceaccounts/service-controller/token") => {
                token_answer()
            }
            _ => status(404, "unexpected"),
        })
        .await;
        let source = credentials
            .token_source("service-controller")
            .await
            .unwrap();
        assert_eq!(source.service_account(), "service-controller");
        assert_eq!(
            calls(&requests),
            [
                "GET /api/v1/namespaces/kube-system/serviceaccounts/service-controller",
                "GET /api/v1/namespaces/kube-system",
                "POST /api/v1/namespaces/kube-system/serviceaccounts",
                "POST /api/v1/namespaces/kube-system/serviceaccounts/service-controller/token",
            ]
        );
        let bodies: Vec<Value> = requests.lock().iter().map(|r| r.2.clone()).collect();
        assert_eq!(bodies[2]["metadata"]["name"], "service-controller");
        assert_eq!(bodies[3]["spec"]["expirationSeconds"], 3600);
        // A second controller with the same ServiceAccount shares the source: no new request.
        credentials
            .token_source("service-controller")
            .await
            .unwrap();
        assert_eq!(calls(&requests).len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forbidden_token_request_names_the_service_account_and_the_missing_rule() {
        let (credentials, _) = credentials(false, |method, _, _| match method {
            "GET" => (200, json!({ "metadata": { "name": "route-controller" } })),
            _ => status(
                403,
                r#"serviceaccounts "route-controller" is forbidden: User "system:cloud-controller-manager" cannot create resource "serviceaccounts/token" in API group "" in the namespace "kube-system""#,
            ),
        })
        .await;
        let err = credentials
            .token_source("route-controller")
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with(
                "--use-service-account-credentials: cannot get a token for kube-system/route-controller: "
            ),
            "{err}"
        );
        assert!(
            err.contains(r#"cannot create resource "serviceaccounts/token""#),
            "{err}"
        );
        assert!(
            err.ends_with(
                "; the manager's identity needs create on serviceaccounts/token (deploy/components/service-account-credentials)"
            ),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shadow_mode_creates_no_service_account() {
        let (credentials, requests) = credentials(true, |_, _, _| status(404, "not found")).await;
        let err = credentials
            .token_source("node-controller")
            .await
            .err()
            .unwrap();
        assert!(
            matches!(err, CredentialsError::MissingInShadowMode { .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("kubectl -n kube-system create serviceaccount node-controller"),
            "{err}"
        );
        assert!(
            calls(&requests).iter().all(|c| c.starts_with("GET ")),
            "{:?}",
            calls(&requests)
        );
    }
}
