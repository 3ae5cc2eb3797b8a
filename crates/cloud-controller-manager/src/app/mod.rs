//! The manager app: from parsed flags to running controllers, and back out on a signal.

pub(crate) mod certificate_reload;
pub(crate) mod client;
pub(crate) mod client_factory;
pub mod command_line;
pub mod connection_guard;
pub mod controller_table;
pub mod controllers_flag;
pub(crate) mod delegated_auth;
pub mod feature_gates;
pub(crate) mod health;
pub(crate) mod leader_election;
pub(crate) mod logging;
pub mod options;
mod phases;
pub(crate) mod rate_limit;
pub(crate) mod review_cache;
pub(crate) mod review_slots;
pub(crate) mod service_account_credentials;
pub(crate) mod serving;
pub(crate) mod tls_curves;
pub(crate) mod upstream_flags;

use std::{path::PathBuf, sync::Arc, time::Duration};

use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, InitializeContext, Registry, RegistryError,
};
use tokio_util::sync::CancellationToken;

use client_factory::{ClientFactory, controller_clients};

use crate::{controllers::ControllerContext, informers::InformerFactory, metrics::Metrics};
pub use client::ClientError;
pub use command_line::CommandLine;
use controller_table::{ControllerSpec, StartFn};
pub use controllers_flag::{ControllerSelection, UnknownController};
use health::Health;
pub use leader_election::LeadershipLost;
pub use options::Options;
pub use service_account_credentials::CredentialsError;
pub use serving::ServingError;

/// How long the manager waits at start for an API server that answers, but not as one (TLS refused,
/// unauthorized): a wrong configuration, said after this long. One that cannot be reached at all (an
/// outage, an upgrade) is waited for as long as it takes: a manager that exited would be restarted by
/// the kubelet with a back-off of up to 5 minutes, and be that late when the API server comes back.
const API_SERVER_WAIT: Duration = Duration::from_secs(30);

/// How often the wait for an unreachable API server says so (it tries every second).
const API_SERVER_WAIT_LOG_EVERY: Duration = Duration::from_secs(30);
/// How long in-flight work may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Why the manager stopped with an error. Each message names the flag or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// `--controllers` names an unknown controller.
    #[error(transparent)]
    Controllers(#[from] UnknownController),
    /// `--cloud-config` cannot be read.
    #[error("cannot read --cloud-config {path}: {source}")]
    CloudConfig {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The provider is unknown or its factory failed.
    #[error(transparent)]
    Provider(#[from] RegistryError),
    /// The cloud has no cluster ID and `--allow-untagged-cloud` is not set.
    #[error(
        "no ClusterID found. A ClusterID is required for the cloud provider to function properly. This check can be bypassed by setting the allow-untagged-cloud option"
    )]
    NoClusterId,
    /// The client could not be configured.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `--use-service-account-credentials`: a controller's ServiceAccount or its token could not be had.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The API server answered, but not as one will after a wait (TLS refused, unauthorized, not an
    /// API server at all), for 30 s. One that cannot be reached is waited for.
    #[error("the API server at {url} did not answer as one within {}s: {source}", API_SERVER_WAIT.as_secs())]
    ApiServer {
        /// The server's URL.
        url: String,
        /// The last error.
        #[source]
        source: kube::Error,
    },
    /// The provider's `initialize` failed.
    #[error("cloud provider {name:?} failed to initialize: {source}")]
    Initialize {
        /// The provider's name.
        name: String,
        /// Its error.
        #[source]
        source: CloudError,
    },
    /// Flags that cannot work together.
    #[error(transparent)]
    Flags(#[from] options::FlagsError),
    /// A controller's configuration (from its flags) is not acceptable.
    #[error("controller {controller}: {source}")]
    Configure {
        /// The controller.
        controller: &'static str,
        /// Why.
        #[source]
        source: controller_table::ConfigureError,
    },
    /// A `KUBE_FEATURE_` environment variable (client-go's feature gates) is not acceptable.
    #[error("{0}")]
    Environment(String),
    /// The secure endpoint could not start.
    #[error(transparent)]
    Serving(#[from] ServingError),
    /// This replica lost its leader lease (upstream exits then, and so do we).
    #[error(transparent)]
    LeadershipLost(LeadershipLost),
    /// The Lease's renewal panicked (a bug): leadership can no longer be vouched for.
    #[error("the leader election's renewal panicked: {0}")]
    RenewalPanicked(String),
    /// A controller stopped with an error.
    #[error("controller {name} failed: {source}")]
    Controller {
        /// The controller.
        name: &'static str,
        /// Its error.
        #[source]
        source: crate::controllers::ControllerError,
    },
}

/// Creates the cloud provider the flags name (upstream `cloudprovider.InitCloudProvider` plus the
/// sample main's checks).
pub fn init_cloud(
    options: &options::CloudProviderOptions,
    matches: &clap::ArgMatches,
    registry: &Registry,
) -> Result<Arc<dyn CloudProvider>, AppError> {
    let config = if options.cloud_config.is_empty() {
        CloudConfig::none()
    } else {
        CloudConfig::read(&options.cloud_config).map_err(|source| AppError::CloudConfig {
            path: PathBuf::from(&options.cloud_config),
            source,
        })?
    };
    // The provider's own flags (if it registered any) reach its factory beside the cloud-config.
    let config = config.with_flags(matches.clone());
    let cloud = registry.init(&options.cloud_provider, &config)?;
    if !cloud.has_cluster_id() {
        if !options.allow_untagged_cloud {
            return Err(AppError::NoClusterId);
        }
        tracing::warn!(
            "detected a cluster without a ClusterID. A ClusterID will be required in the future. Please tag your cluster to avoid any future issues"
        );
    }
    Ok(cloud)
}

/// Runs the manager until `shutdown` is cancelled (or a controller fails): the enabled rows of
/// `controllers` against the provider the command line names. In phases: the flags and the provider
/// checked and every controller configured (nothing started yet); the cloud decorated; the secure
/// endpoint started and the API server waited for; leadership won; the controllers run; then the
/// Lease released and the traffic handed off.
pub async fn run(
    command_line: CommandLine,
    registry: &Registry,
    controllers: &[ControllerSpec],
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let prepared = phases::prepare(command_line, registry, controllers, metrics)?;
    let (options, cloud) = (&prepared.options, prepared.cloud.clone());
    let (mut clients, url) = phases::clients(options, metrics, prepared.shadow.as_ref()).await?;
    let client = clients.build()?;
    let (health, supervisor) = phases::serve(&prepared, metrics, &clients, &client, &shutdown)?;
    wait_for_api_server(&client, &url, &shutdown).await?;
    if shutdown.is_cancelled() {
        return Ok(());
    }

    // What the provider sees of the leader riding out an API-server outage: nothing, unless it leads
    // and the provider asked for it (the report is dropped otherwise).
    let (outage_report, api_outage) = cloud_provider::ApiOutage::channel();
    let elector = if prepared.leading {
        let outage_report = cloud.rides_out_api_outages().then_some(outage_report);
        let won = phases::win_leadership(
            &mut clients,
            &options.leader_election,
            prepared.fence.clone(),
            outage_report,
            metrics,
            &health,
            &shutdown,
        );
        match won.await? {
            Some(elector) => Some(elector),
            None => return Ok(()), // shut down while waiting: nothing was started
        }
    } else {
        None
    };

    let hands_off = cloud.hands_off_traffic();
    let stops = phases::Stops::new(&shutdown, hands_off);
    // Cancelled whenever this function returns.
    let _provider_stop_on_return = stops.provider.clone().drop_guard();
    let lease = options.leader_election.leader_elect_resource_name.clone();
    let renewing = elector
        .clone()
        .map(|elector| phases::start_renewing(elector, &stops, metrics, &lease));

    let launch = Launch {
        options,
        client_features: &prepared.client_features,
        cloud: cloud.clone(),
        clients: &clients,
        metrics,
        health: &health,
        stops: &stops,
        supervisor: &supervisor,
    };
    let result = launch
        .run_controllers(prepared.configured, api_outage)
        .await;
    stops.controllers.cancel();
    stops.renewing.cancel();
    phases::renewal_ended(renewing).await?;
    result?;
    phases::step_down(
        elector,
        metrics,
        &lease,
        hands_off.then_some(cloud.as_ref()),
    )
    .await;
    Ok(())
}

/// An enabled controller, configured, not yet started.
struct Configured {
    name: &'static str,
    /// Its client name: the ServiceAccount of `--use-service-account-credentials`.
    service_account: &'static str,
    start: StartFn,
}

/// What the controllers are started with, once leadership is won.
struct Launch<'a> {
    options: &'a Options,
    client_features: &'a feature_gates::ClientFeatures,
    /// The decorated cloud.
    cloud: Arc<dyn CloudProvider>,
    clients: &'a ClientFactory,
    metrics: &'a Metrics,
    health: &'a Health,
    stops: &'a phases::Stops,
    supervisor: &'a cloud_provider::Supervisor,
}

impl Launch<'_> {
    /// Runs the `configured` controllers until the controllers' stop is cancelled (then lets in-flight
    /// work finish, unless leadership was lost) or one of them fails. The provider is initialized first,
    /// with the provider's stop as its shutdown (the controllers' own, unless it hands its traffic off).
    async fn run_controllers(
        self,
        configured: Vec<Configured>,
        api_outage: cloud_provider::ApiOutage,
    ) -> Result<(), AppError> {
        let stop = &self.stops.controllers;
        // As upstream: the shared informers, the event sink and each controller have a client (and so a
        // client-side rate limit) of their own, so events and one busy controller do not starve
        // another. The informers' client (upstream's `shared-informers`) keeps the manager's own
        // identity.
        let client = self.clients.build()?;
        let events_client = self.clients.build()?;
        let credentials = self
            .clients
            .service_account_credentials(self.supervisor.stopping_with(stop.clone()))?;
        // Names only across the awaits (a start function is `Send` but not `Sync`).
        let names = configured
            .iter()
            .map(|c| (c.name, c.service_account))
            .collect();
        let per_controller =
            controller_clients(names, self.clients, credentials.as_ref(), &events_client).await?;
        self.initialize_cloud(&client, api_outage).await?;

        // Each controller asks for the caches it reads as it starts; they start together afterwards.
        let informers = InformerFactory::new();
        let context = ControllerContext {
            client: client.clone(),
            events_client,
            cloud: self.cloud.clone(),
            shutdown: stop.clone(),
            informers: informers.clone(),
            metrics: self.metrics.clone(),
            ownership: phases::node_ownership(self.options, self.cloud.clone()),
            name: "",
            health: Default::default(),
        };
        let (running, names) = self.start_controllers(configured, per_controller, &context);
        // Every cache a controller asked for starts now that all have (upstream's
        // `InformerFactory.Start` after the controllers are built); one asked for later starts when it
        // is.
        let initial_list = phases::initial_list(self.client_features);
        informers.start(
            client,
            self.supervisor.stopping_with(stop.clone()),
            initial_list,
            self.options.client.kube_api_content_type,
        );
        phases::run_until_stopped(running, names, stop, self.health, &self.stops.lost).await
    }

    /// Initializes the provider: its client, its supervisor and shutdown (the provider's stop), what it
    /// sees of API-server outages, the cluster's name.
    async fn initialize_cloud(
        &self,
        client: &kube::Client,
        api_outage: cloud_provider::ApiOutage,
    ) -> Result<(), AppError> {
        let provider_stop = self.stops.provider.clone();
        self.cloud
            .initialize(InitializeContext {
                client: client.clone(),
                supervisor: self.supervisor.stopping_with(provider_stop.clone()),
                shutdown: provider_stop,
                api_outage,
                cluster_name: self.options.cloud.cluster_name.clone(),
            })
            .await
            .map_err(|source| AppError::Initialize {
                name: self.options.cloud.cloud_provider.clone(),
                source,
            })
    }

    /// Starts each configured controller with its own clients; the running ones, and their names by
    /// task.
    fn start_controllers(
        &self,
        configured: Vec<Configured>,
        per_controller: Vec<client_factory::ControllerClients>,
        context: &ControllerContext,
    ) -> (
        phases::Running,
        std::collections::HashMap<tokio::task::Id, &'static str>,
    ) {
        let mut running = tokio::task::JoinSet::new();
        let mut names = std::collections::HashMap::new();
        for (Configured { name, start, .. }, own) in configured.into_iter().zip(per_controller) {
            let context = ControllerContext {
                client: own.client,
                events_client: own.events_client,
                name,
                health: Default::default(),
                ..context.clone()
            };
            let controller_health = context.health.clone();
            match start(context) {
                Some(task) => {
                    tracing::info!(controller = name, "starting controller");
                    let handle = running.spawn(async move { (name, task.await) });
                    names.insert(handle.id(), name);
                    self.health.controller_started(name, controller_health);
                }
                None => tracing::info!(
                    controller = name,
                    "controller is enabled but does not run (see the reason above)"
                ),
            }
        }
        (running, names)
    }
}

/// Whether `err` says the API server could not be reached at all (refused, reset, timed out, or an
/// answer of 5xx while it starts), rather than that it answered in a way that waiting will not change.
fn unreachable(err: &kube::Error) -> bool {
    if let kube::Error::Api(status) = err {
        return status.code >= 500;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | TimedOut
                    | HostUnreachable
                    | NetworkUnreachable
                    | NotConnected
                    | UnexpectedEof
                    | BrokenPipe
            ) {
                return true;
            }
        }
        if error.is::<tokio::time::error::Elapsed>() {
            return true;
        }
        source = error.source();
    }
    false
}

async fn wait_for_api_server(
    client: &kube::Client,
    url: &str,
    shutdown: &CancellationToken,
) -> Result<(), AppError> {
    let started = tokio::time::Instant::now();
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        match client.apiserver_version().await {
            Ok(version) => {
                tracing::info!(server = url, version = %version.git_version, "connected to the API server");
                return Ok(());
            }
            Err(source) if !unreachable(&source) && started.elapsed() >= API_SERVER_WAIT => {
                return Err(AppError::ApiServer {
                    url: url.to_owned(),
                    source,
                });
            }
            Err(err) => {
                if said.is_none_or(|at| at.elapsed() >= API_SERVER_WAIT_LOG_EVERY) {
                    tracing::info!(server = url, error = %err, waited = ?started.elapsed(), "waiting for the API server");
                    said = Some(tokio::time::Instant::now());
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod api_server_wait_tests {
    use super::unreachable;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"code": code, "message": "x"})).unwrap(),
        ))
    }

    fn io(kind: std::io::ErrorKind) -> kube::Error {
        kube::Error::Service(Box::new(std::io::Error::from(kind)))
    }

    /// An API server that cannot be reached is waited for; one that answers wrongly is not.
    #[test]
    fn unreachable_means_no_answer_or_a_5xx() {
        use std::io::ErrorKind::*;
        for kind in [
            ConnectionRefused,
            ConnectionReset,
            TimedOut,
            HostUnreachable,
        ] {
            assert!(unreachable(&io(kind)), "{kind:?}");
        }
        assert!(unreachable(&status(503)));
        assert!(!unreachable(&status(401)));
        assert!(!unreachable(&status(403)));
        assert!(!unreachable(&io(InvalidData)), "a TLS failure is no outage");
        assert!(
            !unreachable(&io(Other)),
            "a name that does not resolve is no outage"
        );
    }
}
