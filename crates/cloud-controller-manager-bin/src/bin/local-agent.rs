//! `local-agent`: the node agent of the `local` cloud's `loadBalancer.mode: agents`, shipped in the
//! manager's image and run as a DaemonSet (deploy/components/local-agents). The work is in
//! `cloud_provider_local::agent`; this is its process: flags, logs, the Kubernetes client, the signals
//! that stop it, and a plain-HTTP `/metrics` and `/healthz`.

use std::{process::ExitCode, sync::Arc};

use cloud_provider::{clap::Parser, prometheus_client};
use cloud_provider_local::agent::{self, AgentFlags, AgentMetrics};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let flags = AgentFlags::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
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
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let metrics = AgentMetrics::default();
    if flags.metrics_bind_address != "0" {
        let mut registry = prometheus_client::registry::Registry::default();
        cloud.data_plane().register_metrics(&mut registry);
        metrics.register(&mut registry);
        serve_metrics(
            &flags.metrics_bind_address,
            Arc::new(registry),
            shutdown.clone(),
        )
        .await?;
    }
    agent::run(cloud, client, settings, metrics, shutdown)
        .await
        .map_err(|err| err.to_string())
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

/// Serves `/metrics` (Prometheus text) and `/healthz` on `address` until `shutdown`.
async fn serve_metrics(
    address: &str,
    registry: Arc<prometheus_client::registry::Registry>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|err| format!("--metrics-bind-address {address}: {err}"))?;
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
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    tracing::info!(%address, "serving /metrics and /healthz");
    tokio::spawn(async move {
        let stopped = shutdown.cancelled_owned();
        if let Err(err) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %err, "the metrics server stopped");
        }
    });
    Ok(())
}
