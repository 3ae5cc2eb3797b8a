//! The API clients the manager builds: its own (the caches, the provider, shadow mode's view), the
//! leader elector's and the secure endpoint's reviews' (each apart, so a flood of reviews or a
//! controller's burst never delays a Lease renewal), and each controller's, with `--use-service-account-credentials` authenticating as the controller's
//! ServiceAccount. Every client has its own `--kube-api-qps`/`--kube-api-burst` bucket, records into the
//! request metrics, writes only while the leader's fence allows, and in shadow mode writes only dry runs.

use std::sync::Arc;

use cloud_provider::Supervisor;

use super::{
    AppError, client, options,
    service_account_credentials::{self, ServiceAccountCredentials, TokenSource},
};
use crate::{metrics::Metrics, shadow::DryRunLayer, write_fence::WriteFence};

/// The delegated-auth client's rate (upstream's).
const REVIEW_QPS: f32 = 200.0;
const REVIEW_BURST: u32 = 400;

/// Builds API clients, each with its own `--kube-api-qps`/`--kube-api-burst` bucket, all recording into
/// the manager's request metrics and writing only while `fence` allows.
pub(super) struct ClientFactory {
    pub(super) config: kube::Config,
    pub(super) options: options::ClientOptions,
    pub(super) metrics: Metrics,
    pub(super) fence: WriteFence,
    pub(super) dry_run: Option<DryRunLayer>,
    /// `--use-service-account-credentials`.
    pub(super) service_account_credentials: bool,
}

impl ClientFactory {
    /// A client with the manager's own identity.
    pub(super) fn build(&self) -> Result<kube::Client, AppError> {
        self.build_with(self.config.clone(), self.dry_run.as_ref(), None)
    }

    /// The leader elector's client: the manager's identity and a bucket of its own, so that nothing else
    /// the manager asks of the API server (a flood of reviews, a controller's burst) delays a renewal.
    pub(super) fn build_for_leader_election(&self) -> Result<kube::Client, AppError> {
        self.build_for("leader-election")
    }

    /// The client of the secure endpoint's TokenReviews and SubjectAccessReviews: the manager's
    /// identity, and a bucket of its own at upstream's rate for delegated authn/authz (200 QPS, burst
    /// 400, `DelegatingAuthenticationOptions`), whatever `--kube-api-qps` says, apart from the elector's
    /// and the controllers'. Never fenced nor dry run: a review stores nothing, and every replica serves.
    pub(super) fn build_for_reviews(&self) -> Result<kube::Client, AppError> {
        let mut config = self.config.clone();
        client::set_user_agent(&mut config, Some("delegated-auth"));
        let options = options::ClientOptions {
            kube_api_qps: REVIEW_QPS,
            kube_api_burst: REVIEW_BURST,
            ..self.options.clone()
        };
        Ok(client::build_client(
            config,
            &options,
            &self.metrics.requests,
            &WriteFence::unenforced(),
            None,
            None,
        )?)
    }

    /// A client whose user agent names `controller` (upstream's per-controller clients), with the
    /// manager's own identity.
    fn build_for(&self, controller: &str) -> Result<kube::Client, AppError> {
        let mut config = self.config.clone();
        client::set_user_agent(&mut config, Some(controller));
        self.build_with(config, self.dry_run.as_ref(), None)
    }

    /// A client of `controller` that authenticates with `token` alone (upstream builds it from
    /// `restclient.AnonymousClientConfig` of the manager's config).
    fn build_as(&self, controller: &str, token: &TokenSource) -> Result<kube::Client, AppError> {
        let mut config = client::anonymous_config(&self.config);
        client::set_user_agent(&mut config, Some(controller));
        self.build_with(config, self.dry_run.as_ref(), Some(token))
    }

    /// The ServiceAccounts' tokens, requested with the manager's own identity, for real even in shadow
    /// mode (a TokenRequest stores nothing; shadow mode creates no ServiceAccount instead), until `stop`.
    pub(super) fn service_account_credentials(
        &self,
        supervisor: Supervisor,
    ) -> Result<Option<Arc<ServiceAccountCredentials>>, AppError> {
        if !self.service_account_credentials {
            return Ok(None);
        }
        let client = self.build_with(self.config.clone(), None, None)?;
        Ok(Some(Arc::new(ServiceAccountCredentials::new(
            client,
            self.dry_run.is_some(),
            supervisor,
        ))))
    }

    fn build_with(
        &self,
        config: kube::Config,
        dry_run: Option<&DryRunLayer>,
        token: Option<&TokenSource>,
    ) -> Result<kube::Client, AppError> {
        Ok(client::build_client(
            config,
            &self.options,
            &self.metrics.requests,
            &self.fence,
            dry_run,
            token,
        )?)
    }
}

/// A controller's clients: its own, and the one its events are written with (each with a rate limit of
/// its own).
pub(super) struct ControllerClients {
    pub(super) client: kube::Client,
    pub(super) events_client: kube::Client,
}

/// The clients of every controller (`(name, ServiceAccount)`), before any starts: with
/// `--use-service-account-credentials`, each authenticates as the controller's ServiceAccount (whose
/// first token is requested now, so missing RBAC stops the manager here) and its events are written as
/// that ServiceAccount too (upstream gives each controller an event broadcaster on its own client);
/// without, each has the manager's identity and events share `shared_events_client`.
pub(super) async fn controller_clients(
    names: Vec<(&'static str, &'static str)>,
    clients: &ClientFactory,
    credentials: Option<&Arc<ServiceAccountCredentials>>,
    shared_events_client: &kube::Client,
) -> Result<Vec<ControllerClients>, AppError> {
    let mut all = Vec::with_capacity(names.len());
    for (name, service_account) in names {
        all.push(match credentials {
            Some(credentials) => {
                let token = credentials.token_source(service_account).await?;
                tracing::info!(
                    controller = name,
                    service_account = %format!("{}/{service_account}", service_account_credentials::NAMESPACE),
                    "the controller authenticates as its ServiceAccount (--use-service-account-credentials)"
                );
                ControllerClients {
                    client: clients.build_as(name, &token)?,
                    events_client: clients.build_as(name, &token)?,
                }
            }
            None => ControllerClients {
                client: clients.build_for(name)?,
                events_client: shared_events_client.clone(),
            },
        });
    }
    Ok(all)
}
