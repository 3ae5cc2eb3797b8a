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
pub(crate) mod rate_limit;
pub(crate) mod review_cache;
pub(crate) mod review_slots;
pub(crate) mod service_account_credentials;
pub(crate) mod serving;
pub(crate) mod tls_curves;
pub(crate) mod upstream_flags;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, InitializeContext, Registry, RegistryError,
};
use tokio_util::sync::CancellationToken;

use client_factory::{ClientFactory, controller_clients};

use crate::write_fence::WriteFence;
use crate::{
    controllers::ControllerContext,
    informers::{InformerFactory, InitialList},
    metrics::Metrics,
    shadow::{DryRunLayer, ShadowCloud, ShadowReport, ShadowView},
};
pub use client::ClientError;
pub use command_line::CommandLine;
use controller_table::{ConfigureContext, ControllerName, ControllerSpec, StartFn};
pub use controllers_flag::{ControllerSelection, UnknownController};
use delegated_auth::DelegatedAuth;
use health::Health;
use leader_election::LeaderElector;
pub use leader_election::LeadershipLost;
pub use options::Options;
pub use service_account_credentials::CredentialsError;
use serving::ServerState;
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
/// `controllers` against the provider the command line names.
pub async fn run(
    command_line: CommandLine,
    registry: &Registry,
    controllers: &[ControllerSpec],
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let CommandLine { options, matches } = command_line;
    let known: Vec<ControllerName> = controllers.iter().map(|c| *c.name()).collect();
    let selection = ControllerSelection::parse(&options.generic.controllers, &known)?;
    options.validate()?;
    let client_features = feature_gates::ClientFeatures::from_env(std::env::vars_os())
        .map_err(AppError::Environment)?;
    let cloud = init_cloud(&options.cloud, &matches, registry)?;
    tracing::info!(
        provider = cloud.provider_name(),
        "cloud provider initialized from the registry"
    );
    // Every enabled controller's config is built and checked now, before anything starts.
    let configure = ConfigureContext::new(&options, &matches, cloud.as_ref());
    let mut configured = Vec::new();
    for spec in controllers
        .iter()
        .filter(|c| selection.is_enabled(c.name()))
    {
        match spec
            .configure(&configure)
            .map_err(|source| AppError::Configure {
                controller: spec.name().name,
                source,
            })? {
            Some(start) => configured.push(Configured {
                name: spec.name().name,
                service_account: spec.service_account(),
                start,
            }),
            None => tracing::info!(
                controller = spec.name().name,
                "controller is enabled but its configuration leaves it off"
            ),
        }
    }
    drop(configure);
    metrics.register_provider(cloud.as_ref());
    // With leader election, the API writes and the cloud calls of the controllers go on only while this
    // fence, which the elector opens and extends, allows.
    let leading = options.leader_election.leader_elect && !options.generic.dry_run;
    let fence = if leading {
        WriteFence::default()
    } else {
        WriteFence::unenforced()
    };
    // Every call the controllers make to the cloud is timed, its errors counted, and kept within
    // leadership.
    let cloud: Arc<dyn CloudProvider> = Arc::new(crate::cloud_metrics::MeteredCloud::new(
        cloud,
        metrics.cloud.clone(),
        fence.clone(),
    ));
    // Shadow mode: API writes become recorded dry runs, cloud writes recorded previews.
    let shadow = options
        .generic
        .dry_run
        .then(|| ShadowReport::new(metrics.dry_run.clone()));
    let actual_cloud = cloud.clone();
    let cloud: Arc<dyn CloudProvider> = match &shadow {
        Some(report) => Arc::new(ShadowCloud::new(cloud, report.clone())),
        None => cloud,
    };

    let config = client::client_config(&options.client).await?;
    let url = config.cluster_url.to_string();
    let mut clients = ClientFactory {
        config,
        options: options.client.clone(),
        metrics: metrics.clone(),
        fence: WriteFence::unenforced(),
        dry_run: shadow.clone().map(DryRunLayer::new),
        service_account_credentials: options.generic.use_service_account_credentials,
    };
    let client = clients.build()?;

    // The secure endpoint serves on every replica, leader or not, so probes work during standby, and
    // while the API server is away (a manager that waits for it is alive, not one to restart).
    let health = Arc::new(Health::default());
    // Every long-running task beside the controllers (the caches, the provider's background work, the
    // certificate reload) is started by it; one that fails fails `/healthz`.
    let supervisor = cloud_provider::Supervisor::new(metrics.supervisor.clone(), shutdown.clone());
    health.watch_tasks(supervisor.clone());
    let dry_run_view = shadow.map(|report| {
        Arc::new(ShadowView {
            report,
            client: client.clone(),
            cloud: actual_cloud,
            cluster_name: options.cloud.cluster_name.clone(),
        })
    });
    serving::start(
        &options.serving,
        Arc::new(ServerState {
            health: health.clone(),
            metrics: metrics.clone(),
            auth: DelegatedAuth::new(clients.build_for_reviews()?),
            always_allow: options.serving.authorization_always_allow_paths.clone(),
            dry_run: dry_run_view.clone(),
        }),
        &supervisor,
    )?;
    wait_for_api_server(&client, &url, &shutdown).await?;
    if shutdown.is_cancelled() {
        return Ok(());
    }

    if dry_run_view.is_some() {
        tracing::info!(
            leader_elect = options.leader_election.leader_elect,
            "--dry-run: leader election is off (a shadow writes nothing, so it needs no lease and must not take the acting manager's); every write is a recorded dry run, reported at /dry-run"
        );
    }
    // What the provider sees of the leader riding out an API-server outage: nothing, unless it leads
    // and the provider asked for it (the report is dropped otherwise).
    let (outage_report, api_outage) = cloud_provider::ApiOutage::channel();
    let elector = if leading {
        let mut elector = LeaderElector::new(
            clients.build_for_leader_election()?,
            &options.leader_election,
            leader_election::new_identity(),
            fence,
        );
        if cloud.rides_out_api_outages() {
            tracing::info!(
                "the provider serves traffic from this process: a leader that cannot reach the API server at its renew deadline stops writing but keeps running, until the API server answers or another replica serves"
            );
            elector = elector.riding_out_outages(outage_report, metrics.leader_election.clone());
        }
        let elector = Arc::new(elector);
        health.watch_leader(elector.clone());
        let lease = &options.leader_election.leader_elect_resource_name;
        metrics.leader_election.set_leading(lease, false);
        if !elector.acquire(&shutdown).await {
            return Ok(()); // shut down while waiting: nothing was started
        }
        metrics.leader_election.set_leading(lease, true);
        // Every client built from here on writes only while this replica's leadership is valid.
        clients.fence = elector.fence().clone();
        Some(elector)
    } else {
        None
    };

    // Controllers stop on shutdown, or at once when leadership is lost.
    let stop = shutdown.child_token();
    let lost = Arc::new(AtomicBool::new(false));
    // The provider's background work stops with the controllers, except a provider whose process
    // carries traffic: its data plane goes on serving through a graceful stop until it has handed the
    // traffic off (`CloudProvider::hand_off`, after the Lease is released), and stops at once when
    // leadership is lost. Cancelled whenever this function returns.
    let hands_off = cloud.hands_off_traffic();
    let provider_stop = if hands_off {
        CancellationToken::new()
    } else {
        stop.clone()
    };
    let _provider_stop_on_return = provider_stop.clone().drop_guard();
    // Renewal goes on until the controllers have finished their in-flight work, not only until the
    // shutdown signal: the leader's writes are fenced at its renew deadline, and a graceful stop may
    // take longer than that.
    let stop_renewing = CancellationToken::new();
    let lease = options.leader_election.leader_elect_resource_name.clone();
    let renewing = elector.clone().map(|elector| {
        let (stop, lost, stop_renewing) = (stop.clone(), lost.clone(), stop_renewing.clone());
        let (status, lease) = (metrics.leader_election.clone(), lease.clone());
        let provider_stop = provider_stop.clone();
        tokio::spawn(async move {
            let result = elector.keep_renewing(&stop_renewing).await;
            if result.is_err() {
                status.set_leading(&lease, false);
                lost.store(true, Ordering::Relaxed);
                provider_stop.cancel();
                stop.cancel();
            }
            result
        })
    });
    let leader_status = metrics.leader_election.clone();

    let initial_list = if client_features.enabled(feature_gates::WATCH_LIST_CLIENT) {
        InitialList::Streaming
    } else {
        InitialList::ListThenWatch
    };
    let ownership = crate::node_ownership::NodeOwnership::new(
        options.cloud.node_selector().clone(),
        cloud.clone(),
    );
    if !ownership.selects_everything() {
        tracing::info!(
            node_selector = options.cloud.node_selector().as_str(),
            "acting on the nodes this selector matches only"
        );
    }
    let result = run_controllers(
        configured,
        initial_list,
        &options.cloud.cloud_provider,
        cloud.clone(),
        ownership,
        &clients,
        metrics,
        &health,
        (stop.clone(), provider_stop),
        &supervisor,
        &lost,
        api_outage,
        &options.cloud.cluster_name,
    )
    .await;
    stop.cancel();
    stop_renewing.cancel();
    if let Some(renewing) = renewing
        && let Ok(Err(lost)) = renewing.await
    {
        tracing::error!("{lost}");
        return Err(AppError::LeadershipLost(lost));
    }
    result?;
    if let Some(elector) = elector {
        // In-flight work is done: hand over now rather than make the next leader wait out the lease.
        elector.release().await;
        leader_status.set_leading(&lease, false);
    }
    if hands_off {
        // A graceful stop: the traffic this process carries goes to the next leader.
        cloud.hand_off().await;
    }
    Ok(())
}

/// An enabled controller, configured, not yet started.
struct Configured {
    name: &'static str,
    /// Its client name: the ServiceAccount of `--use-service-account-credentials`.
    service_account: &'static str,
    start: StartFn,
}

/// Runs the enabled controllers until `stop` is cancelled (then lets in-flight work finish, unless
/// leadership was `lost`) or one of them fails. The provider is initialized with `provider_stop` as
/// its shutdown (`stop` itself, unless it hands its traffic off).
#[allow(clippy::too_many_arguments)]
async fn run_controllers(
    configured: Vec<Configured>,
    initial_list: InitialList,
    provider_name: &str,
    cloud: Arc<dyn CloudProvider>,
    ownership: crate::node_ownership::NodeOwnership,
    clients: &ClientFactory,
    metrics: &Metrics,
    health: &Health,
    (stop, provider_stop): (CancellationToken, CancellationToken),
    supervisor: &cloud_provider::Supervisor,
    lost: &AtomicBool,
    api_outage: cloud_provider::ApiOutage,
    cluster_name: &str,
) -> Result<(), AppError> {
    // As upstream: the shared informers, the event sink and each controller have a client (and so a
    // client-side rate limit) of their own, so events and one busy controller do not starve another.
    // The informers' client (upstream's `shared-informers`) keeps the manager's own identity.
    let client = clients.build()?;
    let events_client = clients.build()?;
    let credentials =
        clients.service_account_credentials(supervisor.stopping_with(stop.clone()))?;
    // Names only across the awaits (a start function is `Send` but not `Sync`).
    let names = configured
        .iter()
        .map(|c| (c.name, c.service_account))
        .collect();
    let per_controller =
        controller_clients(names, clients, credentials.as_ref(), &events_client).await?;
    cloud
        .initialize(InitializeContext {
            client: client.clone(),
            supervisor: supervisor.stopping_with(provider_stop.clone()),
            shutdown: provider_stop,
            api_outage,
            cluster_name: cluster_name.to_owned(),
        })
        .await
        .map_err(|source| AppError::Initialize {
            name: provider_name.to_owned(),
            source,
        })?;

    // Each controller asks for the caches it reads as it starts; they start together afterwards.
    let informers = InformerFactory::new();
    let context = ControllerContext {
        client: client.clone(),
        events_client: events_client.clone(),
        cloud,
        shutdown: stop.clone(),
        informers: informers.clone(),
        metrics: metrics.clone(),
        ownership,
        name: "",
        health: Default::default(),
    };
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
                health.controller_started(name, controller_health);
            }
            None => tracing::info!(
                controller = name,
                "controller is enabled but does not run (see the reason above)"
            ),
        }
    }

    // Every cache a controller asked for starts now that all have (upstream's `InformerFactory.Start`
    // after the controllers are built); one asked for later starts when it is.
    informers.start(client, supervisor.stopping_with(stop.clone()), initial_list);

    // Run until stopped; a controller that fails (or panics) stops the manager with its error.
    while !stop.is_cancelled() {
        tokio::select! {
            () = stop.cancelled() => {}
            Some(joined) = running.join_next(), if !running.is_empty() => {
                let failure = match joined {
                    // Controllers return when `stop` is cancelled: that is no news.
                    Ok((_, Ok(()))) if stop.is_cancelled() => None,
                    Ok((name, Ok(()))) => {
                        tracing::warn!(controller = name, "controller stopped on its own");
                        None
                    }
                    Ok((name, Err(source))) => Some(AppError::Controller { name, source }),
                    Err(err) => Some(AppError::Controller {
                        name: names.get(&err.id()).copied().unwrap_or("unknown"),
                        source: crate::controllers::ControllerError::Panicked(err.to_string()),
                    }),
                };
                if let Some(failure) = failure {
                    stop.cancel();
                    return Err(failure);
                }
            }
        }
    }
    health.shutting_down();
    if lost.load(Ordering::Relaxed) {
        return Ok(()); // another replica may act already: stop at once
    }
    tracing::info!("shutting down: waiting for controllers to finish in-flight work");
    if tokio::time::timeout(SHUTDOWN_GRACE, async {
        while running.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "controllers did not stop in time; abandoning them");
    }
    Ok(())
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
