//! The Rust Kubernetes cloud-controller-manager, as a library: the generic controllers and the app
//! that runs them against a cloud from the provider registry.
//!
//! The `cloud-controller-manager` binary is [`main`]. A provider author who wants a binary of their own
//! writes a `main` of a few lines:
//!
//! ```no_run
//! // Linking your provider crate registers it (it calls `cloud_provider::register_provider!`):
//! // use my_cloud as _;
//! fn main() -> std::process::ExitCode {
//!     cloud_controller_manager::Manager::linked().main()
//! }
//! ```
//!
//! or registers the factory explicitly with [`Manager::with_provider`].

pub mod app;
pub mod cidrs;
pub mod cloud_metrics;
pub mod controllers;
pub mod events;
pub mod informers;
pub mod metrics;
pub mod well_known;

/// The Kubernetes client the manager is built on, for providers and controllers that talk to the API
/// server (`InitializeContext::client`) at the same version.
pub use kube;

use std::process::ExitCode;

use clap::Parser;
use cloud_provider::{CloudConfig, ProviderResult, Registry, RegistryError};
use tokio_util::sync::CancellationToken;

use app::Options;
use metrics::Metrics;

/// The manager: a provider registry plus the app that runs it.
#[derive(Default)]
pub struct Manager {
    registry: Registry,
    registration_error: Option<RegistryError>,
    metrics: Metrics,
}

impl Manager {
    /// A manager with every provider linked into this binary (see
    /// [`cloud_provider::register_provider!`]).
    pub fn linked() -> Self {
        match Registry::linked() {
            Ok(registry) => Self::with_registry(registry),
            Err(err) => Self {
                registration_error: Some(err),
                ..Self::default()
            },
        }
    }

    /// A manager with exactly these providers.
    pub fn with_registry(registry: Registry) -> Self {
        Self {
            registry,
            ..Self::default()
        }
    }

    /// Adds a provider factory under `name`. A name that is already taken makes [`Manager::main`] fail
    /// with "cloud provider "<name>" was registered twice".
    pub fn with_provider(
        mut self,
        name: &str,
        factory: impl Fn(&CloudConfig) -> ProviderResult + Send + Sync + 'static,
    ) -> Self {
        if let Err(err) = self.registry.register(name, factory)
            && self.registration_error.is_none()
        {
            self.registration_error = Some(err);
        }
        self
    }

    /// The registry this manager picks its provider from.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The manager's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs the manager with `options` until `shutdown` is cancelled.
    pub async fn run(
        &self,
        options: Options,
        shutdown: CancellationToken,
    ) -> Result<(), anyhow::Error> {
        if let Some(err) = &self.registration_error {
            return Err(anyhow::anyhow!("{err}"));
        }
        app::run(options, &self.registry, &self.metrics, shutdown)
            .await
            .map_err(Into::into)
    }

    /// The whole process: parses the command line, sets up logging, runs until SIGTERM or SIGINT, and
    /// returns the exit code (0 after a clean shutdown, 1 on an error, 2 on a malformed command line).
    pub fn main(self) -> ExitCode {
        let options = match Options::try_parse() {
            Ok(options) => options,
            Err(err) => {
                let _ = err.print();
                return if err.use_stderr() {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
        };
        app::logging::init(&options.logging);
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(err) => {
                eprintln!("error: cannot start the async runtime: {err}");
                return ExitCode::FAILURE;
            }
        };
        let result = runtime.block_on(async {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signals(shutdown.clone()));
            self.run(options, shutdown).await
        });
        // Whatever is still running (work abandoned after a lost lease, blocking DNS lookups) must not
        // delay the exit: a replica that lost its lease exits at once, so the next one acts alone.
        runtime.shutdown_timeout(std::time::Duration::from_millis(500));
        match result {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(err) => {
                // Our error messages already carry their causes; print the top one only.
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        }
    }
}

/// The `cloud-controller-manager` binary: [`Manager::linked`] then [`Manager::main`].
pub fn main() -> ExitCode {
    Manager::linked().main()
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT; a second one exits at once.
async fn stop_on_signals(shutdown: CancellationToken) {
    for round in 0..2 {
        let signal = wait_for_signal().await;
        if round == 0 {
            tracing::info!(
                signal,
                "received a signal, shutting down (send it again to exit at once)"
            );
            shutdown.cancel();
        } else {
            tracing::warn!(signal, "received a second signal, exiting now");
            std::process::exit(1);
        }
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        unreachable!("pending never resolves")
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "Ctrl-C"
}
