//! The phases of [`run`](super::run) that are more than a few lines: configuring the controllers,
//! decorating the cloud, winning leadership, keeping it, and stepping down.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use cloud_provider::{ApiOutageReport, CloudProvider, Supervisor};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    AppError, CommandLine, Configured, ControllerSelection, Options, client,
    client_factory::ClientFactory,
    controller_table::{ConfigureContext, ControllerName, ControllerSpec},
    delegated_auth::DelegatedAuth,
    feature_gates,
    health::Health,
    leader_election::{self, LeaderElector, LeadershipLost},
    options::LeaderElectionOptions,
    serving::{self, ServerState},
};
use crate::{
    cloud_metrics::MeteredCloud,
    informers::InitialList,
    metrics::{LeaderElectionMetrics, Metrics},
    node_ownership::NodeOwnership,
    shadow::{DryRunLayer, ShadowCloud, ShadowReport, ShadowView},
    write_fence::WriteFence,
};

/// What the first phase makes: nothing started yet.
pub(super) struct Prepared {
    pub(super) options: Options,
    pub(super) client_features: feature_gates::ClientFeatures,
    /// The enabled controllers, configured.
    pub(super) configured: Vec<Configured>,
    /// The cloud as the controllers call it ([`decorate`]).
    pub(super) cloud: Arc<dyn CloudProvider>,
    /// The metered cloud without the shadow ([`decorate`]).
    pub(super) metered_cloud: Arc<dyn CloudProvider>,
    /// The leader's write fence (unenforced without leader election).
    pub(super) fence: WriteFence,
    /// Shadow mode's report (`--dry-run`).
    pub(super) shadow: Option<ShadowReport>,
    /// Whether this manager elects a leader.
    pub(super) leading: bool,
}

/// The first phase: the flags, the environment and the provider checked, every enabled controller
/// configured, and the cloud decorated; nothing started yet.
pub(super) fn prepare(
    command_line: CommandLine,
    registry: &cloud_provider::Registry,
    controllers: &[ControllerSpec],
    metrics: &Metrics,
) -> Result<Prepared, AppError> {
    let CommandLine { options, matches } = command_line;
    let known: Vec<ControllerName> = controllers.iter().map(|c| *c.name()).collect();
    let selection = ControllerSelection::parse(&options.generic.controllers, &known)?;
    options.validate()?;
    let client_features = feature_gates::ClientFeatures::from_env(std::env::vars_os())
        .map_err(AppError::Environment)?;
    let cloud = super::init_cloud(&options.cloud, &matches, registry)?;
    tracing::info!(
        provider = cloud.provider_name(),
        "cloud provider initialized from the registry"
    );
    let configured = configure(controllers, &selection, &options, &matches, cloud.as_ref())?;
    metrics.register_provider(cloud.as_ref());
    // With leader election, the API writes and the cloud calls of the controllers go on only while this
    // fence, which the elector opens and extends, allows.
    let leading = options.leader_election.leader_elect && !options.generic.dry_run;
    let fence = if leading {
        WriteFence::default()
    } else {
        WriteFence::unenforced()
    };
    // Shadow mode: API writes become recorded dry runs, cloud writes recorded previews.
    let shadow = options
        .generic
        .dry_run
        .then(|| ShadowReport::new(metrics.dry_run.clone()));
    let (cloud, actual_cloud) = decorate(cloud, metrics, &fence, shadow.as_ref());
    Ok(Prepared {
        options,
        client_features,
        configured,
        cloud,
        metered_cloud: actual_cloud,
        fence,
        shadow,
        leading,
    })
}

/// The factory of the manager's API clients (each with its own rate limit; with `shadow`, every write a
/// recorded dry run), not yet fenced by leadership, and the API server's URL.
pub(super) async fn clients(
    options: &Options,
    metrics: &Metrics,
    shadow: Option<&ShadowReport>,
) -> Result<(ClientFactory, String), AppError> {
    let config = client::client_config(&options.client).await?;
    let url = config.cluster_url.to_string();
    let clients = ClientFactory {
        config,
        options: options.client.clone(),
        metrics: metrics.clone(),
        fence: WriteFence::unenforced(),
        dry_run: shadow.cloned().map(DryRunLayer::new),
        service_account_credentials: options.generic.use_service_account_credentials,
    };
    Ok((clients, url))
}

/// Every enabled controller's config, built and checked now, before anything starts.
pub(super) fn configure(
    controllers: &[ControllerSpec],
    selection: &ControllerSelection,
    options: &Options,
    matches: &clap::ArgMatches,
    cloud: &dyn CloudProvider,
) -> Result<Vec<Configured>, AppError> {
    let configure = ConfigureContext::new(options, matches, cloud);
    let mut configured = Vec::new();
    for spec in controllers
        .iter()
        .filter(|c| selection.is_enabled(c.name()))
    {
        let name = spec.name().name;
        let start = spec
            .configure(&configure)
            .map_err(|source| AppError::Configure {
                controller: name,
                source,
            })?;
        match start {
            Some(start) => configured.push(Configured {
                name,
                service_account: spec.service_account(),
                start,
            }),
            None => tracing::info!(
                controller = name,
                "controller is enabled but its configuration leaves it off"
            ),
        }
    }
    Ok(configured)
}

/// The cloud as the controllers call it: every call timed, its errors counted and kept within
/// leadership (`fence`); with `shadow`, its writes become recorded previews. Also the metered cloud
/// without the shadow (what shadow mode's report previews against).
pub(super) fn decorate(
    cloud: Arc<dyn CloudProvider>,
    metrics: &Metrics,
    fence: &WriteFence,
    shadow: Option<&ShadowReport>,
) -> (Arc<dyn CloudProvider>, Arc<dyn CloudProvider>) {
    let metered: Arc<dyn CloudProvider> = Arc::new(MeteredCloud::new(
        cloud,
        metrics.cloud.clone(),
        fence.clone(),
    ));
    let seen: Arc<dyn CloudProvider> = match shadow {
        Some(report) => Arc::new(ShadowCloud::new(metered.clone(), report.clone())),
        None => metered.clone(),
    };
    (seen, metered)
}

/// Starts the secure endpoint (on every replica, leader or not, so that probes work during standby
/// and while the API server is away: a manager that waits for it is alive, not one to restart), with
/// the health checks and the supervisor of every long-running task beside the controllers (the
/// caches, the provider's background work, the certificate reload: one that fails fails `/healthz`).
pub(super) fn serve(
    prepared: &Prepared,
    metrics: &Metrics,
    clients: &ClientFactory,
    client: &kube::Client,
    shutdown: &CancellationToken,
) -> Result<(Arc<Health>, Supervisor), AppError> {
    let options = &prepared.options;
    if prepared.shadow.is_some() {
        tracing::info!(
            leader_elect = options.leader_election.leader_elect,
            "--dry-run: leader election is off (a shadow writes nothing, so it needs no lease and must not take the acting manager's); every write is a recorded dry run, reported at /dry-run"
        );
    }
    let health = Arc::new(Health::default());
    let supervisor = Supervisor::new(metrics.supervisor.clone(), shutdown.clone());
    health.watch_tasks(supervisor.clone());
    let dry_run = prepared.shadow.clone().map(|report| {
        Arc::new(ShadowView {
            report,
            client: client.clone(),
            cloud: prepared.metered_cloud.clone(),
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
            dry_run,
        }),
        &supervisor,
    )?;
    Ok((health, supervisor))
}

/// How the caches fetch their first list: streamed when client-go's `WatchListClient` gate is on (off
/// by default here: a paged list in JSON costs the API server less than half a streamed one).
/// Said once at start, since the default differs from client-go's.
pub(super) fn initial_list(features: &feature_gates::ClientFeatures) -> InitialList {
    if features.enabled(feature_gates::WATCH_LIST_CLIENT) {
        tracing::info!("the caches stream their first lists (KUBE_FEATURE_WatchListClient=true)");
        InitialList::Streaming
    } else {
        tracing::info!(
            "the caches page their first lists (KUBE_FEATURE_WatchListClient is off here unless set \
             to true: in JSON a streamed list costs the API server more than twice a paged one)"
        );
        InitialList::ListThenWatch
    }
}

/// The nodes this manager acts on (`--node-selector`), said when it is not all of them.
pub(super) fn node_ownership(options: &Options, cloud: Arc<dyn CloudProvider>) -> NodeOwnership {
    let ownership = NodeOwnership::new(options.cloud.node_selector().clone(), cloud);
    if !ownership.selects_everything() {
        tracing::info!(
            node_selector = options.cloud.node_selector().as_str(),
            "acting on the nodes this selector matches only"
        );
    }
    ownership
}

/// Wins leadership (`--leader-elect`): the elector made, watched by the health check, and the Lease
/// acquired; from then on the clients' writes are fenced by it. With `outage_report` (a provider that
/// serves traffic from this process), a leader that cannot reach the API server rides the outage out.
/// `None`: shut down while waiting (nothing was started).
pub(super) async fn win_leadership(
    clients: &mut ClientFactory,
    election: &LeaderElectionOptions,
    fence: WriteFence,
    outage_report: Option<ApiOutageReport>,
    metrics: &Metrics,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<LeaderElector>>, AppError> {
    let mut elector = LeaderElector::new(
        clients.build_for_leader_election()?,
        election,
        leader_election::new_identity(),
        fence,
    );
    if let Some(outage_report) = outage_report {
        tracing::info!(
            "the provider serves traffic from this process: a leader that cannot reach the API server at its renew deadline stops writing but keeps running, until the API server answers or another replica serves"
        );
        elector = elector.riding_out_outages(outage_report, metrics.leader_election.clone());
    }
    let elector = Arc::new(elector);
    health.watch_leader(elector.clone());
    let lease = &election.leader_elect_resource_name;
    metrics.leader_election.set_leading(lease, false);
    if !elector.acquire(shutdown).await {
        return Ok(None);
    }
    metrics.leader_election.set_leading(lease, true);
    clients.fence = elector.fence().clone();
    Ok(Some(elector))
}

/// What stops the leader's work, and when.
pub(super) struct Stops {
    /// The controllers': on shutdown, or at once when leadership is lost.
    pub(super) controllers: CancellationToken,
    /// The provider's background work stops with the controllers, except a provider whose process
    /// carries traffic (`hands_off`): its data plane goes on serving through a graceful stop until it
    /// has handed the traffic off (`CloudProvider::hand_off`, after the Lease is released), and stops
    /// at once when leadership is lost.
    pub(super) provider: CancellationToken,
    /// The Lease's renewal goes on until the controllers have finished their in-flight work, not only
    /// until the shutdown signal: the leader's writes are fenced at its renew deadline, and a graceful
    /// stop may take longer than that.
    pub(super) renewing: CancellationToken,
    /// Set when the Lease was lost.
    pub(super) lost: Arc<AtomicBool>,
}

impl Stops {
    pub(super) fn new(shutdown: &CancellationToken, hands_off: bool) -> Self {
        let controllers = shutdown.child_token();
        let provider = if hands_off {
            CancellationToken::new()
        } else {
            controllers.clone()
        };
        Self {
            controllers,
            provider,
            renewing: CancellationToken::new(),
            lost: Arc::default(),
        }
    }
}

/// Starts renewing the Lease `lease` until `stops.renewing`; a lost Lease stops the controllers and
/// the provider at once.
pub(super) fn start_renewing(
    elector: Arc<LeaderElector>,
    stops: &Stops,
    metrics: &Metrics,
    lease: &str,
) -> JoinHandle<Result<(), LeadershipLost>> {
    let on_loss = OnLoss {
        stops: [stops.controllers.clone(), stops.provider.clone()],
        lost: stops.lost.clone(),
        status: metrics.leader_election.clone(),
        lease: lease.to_owned(),
    };
    let stop_renewing = stops.renewing.clone();
    let renewing = async move { elector.keep_renewing(&stop_renewing).await };
    // Watched: the handle is awaited in `renewal_ended`, which reports a panic; a panic stops the
    // controllers and the provider at once, as a lost Lease does (`keep_renewing`).
    tokio::spawn(keep_renewing(renewing, on_loss))
}

/// What a lost Lease stops and tells.
struct OnLoss {
    /// The controllers' and the provider's stop tokens.
    stops: [CancellationToken; 2],
    lost: Arc<AtomicBool>,
    /// `leader_election_master_status`.
    status: LeaderElectionMetrics,
    /// The Lease's name (the metric's label).
    lease: String,
}

/// Runs `renewing` (the elector's renewal, until told to stop); a lost Lease stops the controllers and
/// the provider at once.
/// So does a panic of the renewal (a bug: the Lease is no longer renewed, and another replica takes it
/// over once it expires), which is then resumed for [`renewal_ended`] to report.
async fn keep_renewing(
    renewing: impl Future<Output = Result<(), LeadershipLost>>,
    on_loss: OnLoss,
) -> Result<(), LeadershipLost> {
    let renewing = std::panic::AssertUnwindSafe(renewing);
    let result = match futures::FutureExt::catch_unwind(renewing).await {
        Ok(result) => result,
        Err(panic) => {
            tracing::error!(
                "the leader election's renewal panicked (a bug): {}; stopping the controllers, as \
                 on a lost Lease",
                cloud_provider::panic_message(panic.as_ref())
            );
            on_loss.stop();
            std::panic::resume_unwind(panic);
        }
    };
    if result.is_err() {
        on_loss.stop();
    }
    result
}

impl OnLoss {
    /// No longer leading: the status says so, and the controllers and the provider stop at once.
    fn stop(&self) {
        self.status.set_leading(&self.lease, false);
        self.lost.store(true, Ordering::Relaxed);
        for stop in &self.stops {
            stop.cancel();
        }
    }
}

/// How the renewal ended, once told to stop: an error when the Lease was lost, or when the renewal
/// itself panicked (a bug: leadership can no longer be vouched for).
pub(super) async fn renewal_ended(
    renewing: Option<JoinHandle<Result<(), LeadershipLost>>>,
) -> Result<(), AppError> {
    let Some(renewing) = renewing else {
        return Ok(());
    };
    match renewing.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(lost)) => {
            tracing::error!("{lost}");
            Err(AppError::LeadershipLost(lost))
        }
        Err(err) => {
            tracing::error!("the leader election's renewal panicked (a bug): {err}");
            Err(AppError::RenewalPanicked(err.to_string()))
        }
    }
}

/// In-flight work done: releases the Lease now rather than make the next leader wait it out, then
/// hands the traffic this process carries to the next leader (`handing_off`).
pub(super) async fn step_down(
    elector: Option<Arc<LeaderElector>>,
    metrics: &Metrics,
    lease: &str,
    handing_off: Option<&dyn CloudProvider>,
) {
    if let Some(elector) = elector {
        elector.release().await;
        metrics.leader_election.set_leading(lease, false);
    }
    if let Some(cloud) = handing_off {
        cloud.hand_off().await;
    }
}

/// The controllers of one run, each with its name.
pub(super) type Running = tokio::task::JoinSet<(
    &'static str,
    Result<(), crate::controllers::ControllerError>,
)>;

/// Runs the controllers until `stop` is cancelled, then lets their in-flight work finish for at most
/// [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE) (at once, when leadership was `lost`); a controller that
/// fails (or panics) stops the manager with its error. `names`: the controllers' names by task.
pub(super) async fn run_until_stopped(
    mut running: Running,
    names: HashMap<tokio::task::Id, &'static str>,
    stop: &CancellationToken,
    health: &Health,
    lost: &AtomicBool,
) -> Result<(), AppError> {
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
    if tokio::time::timeout(super::SHUTDOWN_GRACE, async {
        while running.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(grace = ?super::SHUTDOWN_GRACE, "controllers did not stop in time; abandoning them");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal that panics (a bug) no longer renews the Lease: the controllers and the provider stop at
    /// once, as on a lost Lease, and the panic goes on to `renewal_ended`, which fails the run.
    #[tokio::test]
    async fn a_renewal_that_panics_stops_the_controllers_and_the_provider_at_once() {
        let stops = [CancellationToken::new(), CancellationToken::new()];
        let lost = Arc::new(AtomicBool::new(false));
        let on_loss = OnLoss {
            stops: stops.clone(),
            lost: lost.clone(),
            status: Metrics::new().leader_election.clone(),
            lease: "cloud-controller-manager".to_owned(),
        };
        let panicking =
            futures::FutureExt::map(std::future::ready(()), |()| -> Result<(), LeadershipLost> {
                panic!("a bug in the renewal")
            });
        let renewing = tokio::spawn(keep_renewing(panicking, on_loss));
        let ended = renewal_ended(Some(renewing)).await;
        assert!(
            matches!(&ended, Err(AppError::RenewalPanicked(why)) if why.contains("panicked")),
            "{ended:?}"
        );
        assert!(stops.iter().all(CancellationToken::is_cancelled));
        assert!(lost.load(Ordering::Relaxed));
    }
}
