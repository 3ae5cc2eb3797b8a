//! `local-agent`: the node agent of the `local` cloud's `loadBalancer.mode: agents`, shipped in the
//! manager's image and run as a DaemonSet (deploy/components/local-agents). The work is in
//! `cloud_provider_local::agent`; this is its process: flags, logs, the Kubernetes client, the signals
//! that stop it, and a plain-HTTP `/metrics` and `/healthz`.

use std::{process::ExitCode, sync::Arc};

use cloud_controller_manager::ConnectionLimits;
use cloud_provider::{clap::Parser, prometheus_client};
use cloud_provider_local::agent::{self, AgentFlags, AgentHealth, AgentMetrics};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let flags = AgentFlags::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // The agent's runtime relays the traffic of its node's VIPs: the data plane's event interval.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .event_interval(cloud_provider_local::RUNTIME_EVENT_INTERVAL)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("local-agent: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("local-agent: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: AgentFlags) -> Result<(), String> {
    let settings = flags.settings();
    settings.check().map_err(|err| err.to_string())?;
    let cloud = flags.cloud().map_err(|err| err.to_string())?;
    let client = client(&flags).await?;
    let shutdown = CancellationToken::new();
    // Unsupervised: waits for a signal, then cancels the shutdown (nothing in it can fail).
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let metrics = AgentMetrics::default();
    let health = AgentHealth::default();
    let mut serving = None;
    if flags.metrics_bind_address != "0" {
        let mut registry = prometheus_client::registry::Registry::default();
        cloud.data_plane().register_metrics(&mut registry);
        metrics.register(&mut registry);
        let registry = Arc::new(registry);
        let address = flags.metrics_bind_address.clone();
        match bind(&address) {
            Ok(listener) => serve_metrics(
                listener,
                &address,
                registry,
                health.clone(),
                shutdown.clone(),
            )?,
            // During a rolling update the agent this one replaces holds the address until it hands
            // over (the kubelet's probes reach it meanwhile): bind it once free.
            Err(err)
                if err.kind() == std::io::ErrorKind::AddrInUse
                    && flags.handover_socket.is_some() =>
            {
                tracing::info!(%address, "--metrics-bind-address is in use (by the agent this one replaces, until it hands over): serving once it is free");
                // Watched: the handle is awaited once the agent has run; its error or panic is the
                // run's error.
                serving = Some(tokio::spawn(serve_metrics_once_free(
                    address,
                    registry,
                    health.clone(),
                    shutdown.clone(),
                )));
            }
            Err(err) => return Err(format!("--metrics-bind-address {address}: {err}")),
        }
    }
    let result = agent::run(cloud, client, settings, metrics, health, shutdown.clone())
        .await
        .map_err(|err| err.to_string());
    if let Some(serving) = serving {
        shutdown.cancel();
        match serving.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return result.and(Err(err)),
            Err(err) => {
                return result.and(Err(format!(
                    "serving --metrics-bind-address once free failed: {err}"
                )));
            }
        }
    }
    result
}

fn bind(address: &str) -> std::io::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(address).and_then(|l| l.set_nonblocking(true).map(|()| l))
}

/// How long an agent that replaces another waits for `--metrics-bind-address` to be free: the old
/// agent frees it when it stops, which the DaemonSet asks for once this one is ready.
const METRICS_ADDRESS_FREE_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// Binds `address` once free (every 200 ms) and serves on it; stops the agent if it is not free
/// within [`METRICS_ADDRESS_FREE_WITHIN`] (another process holds it: its probes would lie).
async fn serve_metrics_once_free(
    address: String,
    registry: Arc<prometheus_client::registry::Registry>,
    health: AgentHealth,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + METRICS_ADDRESS_FREE_WITHIN;
    loop {
        match bind(&address) {
            Ok(listener) => return serve_metrics(listener, &address, registry, health, shutdown),
            Err(err) if tokio::time::Instant::now() >= deadline => {
                let err = format!(
                    "--metrics-bind-address {address}: still in use after {}s ({err}): another \
                     process holds it, and the kubelet's probes of this agent reach that one",
                    METRICS_ADDRESS_FREE_WITHIN.as_secs()
                );
                tracing::error!("{err}");
                shutdown.cancel();
                return Err(err);
            }
            Err(_) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
}

/// The client of `--kubeconfig`, else the pod's service account (or `$KUBECONFIG`).
async fn client(flags: &AgentFlags) -> Result<kube::Client, String> {
    let config = match &flags.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|err| format!("--kubeconfig {}: {err}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|err| format!("--kubeconfig {}: {err}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|err| {
            format!("no Kubernetes client configuration (in a pod, or --kubeconfig): {err}")
        })?,
    };
    kube::Client::try_from(config).map_err(|err| format!("the Kubernetes client: {err}"))
}

/// Cancels `shutdown` on SIGTERM (the kubelet stopping the pod) or SIGINT.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT; stop the agent with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    shutdown.cancel();
}

/// How many connections the agent's HTTP endpoint holds, and for how long when idle: enough for the
/// kubelet's probes and a scraper, and no more (the process carries the node's VIPs' traffic, whose
/// connections need the descriptors).
const HTTP_LIMITS: ConnectionLimits = ConnectionLimits {
    idle_timeout: std::time::Duration::from_secs(30),
    max_connections: 64,
    max_per_address: 16,
};

/// Serves `/metrics` (Prometheus text), `/healthz` and `/readyz` on `address` until `shutdown`.
fn serve_metrics(
    listener: std::net::TcpListener,
    address: &str,
    registry: Arc<prometheus_client::registry::Registry>,
    health: AgentHealth,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let answer = |result: Result<(), String>| match result {
        Ok(()) => (axum::http::StatusCode::OK, "ok".to_owned()),
        Err(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let live = health.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = registry.clone();
                async move {
                    let mut text = String::new();
                    match prometheus_client::encoding::text::encode(&mut text, &registry) {
                        Ok(()) => (
                            [(
                                "content-type",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        ),
                        Err(err) => (
                            [("content-type", "text/plain; charset=utf-8")],
                            format!("cannot encode the metrics: {err}"),
                        ),
                    }
                }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(move || {
                let result = live.live();
                async move { answer(result) }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let result = health.ready();
                async move { answer(result) }
            }),
        );
    cloud_controller_manager::serve_plain_http(listener, app, HTTP_LIMITS, shutdown)
        .map_err(|err| format!("--metrics-bind-address {address}: {err}"))?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    Ok(())
}
