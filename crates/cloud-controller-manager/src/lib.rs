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
//! or registers the factory explicitly with [`Manager::with_provider`]. The same `main` adds controllers
//! of its own ([`Manager::with_controller`]), replaces or drops built-in ones, and names the binary
//! ([`Manager::named`]); flags of its own come with its registration
//! (`register_provider!(name, factory, flags = MyFlags)`).

pub(crate) mod app;
mod cached_node;
pub(crate) mod cidrs;
pub(crate) mod cloud_metrics;
pub mod controllers;
mod event_series;
pub mod events;
mod forward;
pub mod informers;
mod jitter;
pub mod metrics;
pub mod node_ownership;
pub mod node_selector;
pub(crate) mod outage_retry;
mod protobuf;
pub(crate) mod request_metrics;
pub(crate) mod shadow;
#[cfg(test)]
mod upstream_source;
pub(crate) mod well_known;
pub(crate) mod write_fence;

#[cfg(test)]
mod mock_api;
#[cfg(test)]
mod parsers_at_volume;

/// The Kubernetes client the manager is built on, for providers and controllers that talk to the API
/// server (`InitializeContext::client`) at the same version.
pub use kube;

pub use protobuf::KubeApiContentType;

use std::{ffi::OsString, process::ExitCode};

use cloud_provider::{CloudConfig, ProviderResult, Registry};
use tokio_util::sync::CancellationToken;

use app::controller_table::builtin_controllers;
pub use app::{
    AppError, CommandLine, Options,
    command_line::BinaryIdentity,
    connection_guard::{ConnectionLimits, serve_plain_http},
    controller_table::{ConfigureContext, ConfigureError, ControllerName, ControllerSpec},
};

/// The errors [`AppError`] is made of, each naming what is at fault.
pub mod error {
    pub use crate::SetupError;
    pub use crate::app::command_line::FlagClash;
    pub use crate::app::options::FlagsError;
    pub use crate::app::{
        ClientError, CredentialsError, LeadershipLost, ServingError, UnknownController,
    };
    pub use crate::controllers::ControllerError;
    pub use cloud_provider::RegistryError;
}

/// How a [`Manager`] was put together wrongly ([`ManagerError::Setup`]); the first mistake is kept.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// [`Manager::with_controller`] with a name or alias another controller has.
    #[error(
        "controller {name:?} clashes with the controller {taken:?} already in the table (use Manager::replace_controller to replace it)"
    )]
    ControllerTaken {
        /// The controller added.
        name: &'static str,
        /// The one in the table with that name or alias.
        taken: &'static str,
    },
    /// [`Manager::replace_controller`] or [`Manager::without_controller`] of a name the table lacks.
    #[error("cannot {action} controller {name:?}: there is none by that name ({known})")]
    NoSuchController {
        /// `replace` or `drop`.
        action: &'static str,
        /// The name asked for.
        name: String,
        /// The table's names, comma-separated.
        known: String,
    },
    /// The providers linked into the binary could not be registered (one name taken twice, say).
    #[error(transparent)]
    LinkedProviders(std::sync::Arc<cloud_provider::RegistryError>),
    /// Two of them, or one and the manager, claim one flag.
    #[error(transparent)]
    FlagClash(#[from] app::command_line::FlagClash),
}

/// Why [`Manager::command`] or [`Manager::run`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The manager was put together wrongly (a controller name taken twice, a provider registered
    /// twice, ...).
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The command line could not be built.
    #[error(transparent)]
    Command(#[from] clap::Error),
    /// The manager stopped with an error (a flag, the cloud-config, the provider, the API server, a
    /// lost Lease, a failed controller): the message names what is at fault.
    #[error(transparent)]
    Run(#[from] app::AppError),
}
use metrics::Metrics;

/// The manager: a provider registry, the controller table, and the app that runs them.
pub struct Manager {
    registry: Registry,
    controllers: Vec<ControllerSpec>,
    identity: Option<BinaryIdentity>,
    setup_error: Option<SetupError>,
    metrics: Metrics,
}

impl Default for Manager {
    fn default() -> Self {
        Self::with_registry(Registry::new())
    }
}

impl Manager {
    /// A manager with every provider linked into this binary (see
    /// [`cloud_provider::register_provider!`]) and the built-in controllers.
    pub fn linked() -> Self {
        match Registry::linked() {
            Ok(registry) => Self::with_registry(registry),
            Err(err) => Self {
                setup_error: Some(SetupError::LinkedProviders(std::sync::Arc::new(err))),
                ..Self::default()
            },
        }
    }

    /// A manager with exactly these providers and the built-in controllers.
    pub fn with_registry(registry: Registry) -> Self {
        Self {
            registry,
            controllers: builtin_controllers(),
            identity: None,
            setup_error: None,
            metrics: Metrics::default(),
        }
    }

    /// Adds a provider factory under `name`, in place of any provider linked under that name.
    pub fn with_provider(
        mut self,
        name: &str,
        factory: impl Fn(&CloudConfig) -> ProviderResult + Send + Sync + 'static,
    ) -> Self {
        self.registry.replace(name, factory);
        self
    }

    /// Adds a controller to the table: it starts after the built-in ones, `--controllers` knows it
    /// (and `--help` lists it), and it shares the manager's caches, events, metrics, health and
    /// shutdown. A name or alias that is taken makes [`Manager::main`] fail.
    pub fn with_controller(mut self, spec: ControllerSpec) -> Self {
        let name = spec.name();
        if let Some(taken) = self.controllers.iter().find(|c| {
            let c = c.name();
            [Some(name.name), name.alias]
                .into_iter()
                .flatten()
                .any(|n| c.is_named(n))
        }) {
            self.fail(SetupError::ControllerTaken {
                name: name.name,
                taken: taken.name().name,
            });
        } else {
            self.controllers.push(spec);
        }
        self
    }

    /// Replaces the controller of the same name (a built-in one, say) with `spec`, in its place.
    pub fn replace_controller(mut self, spec: ControllerSpec) -> Self {
        match self
            .controllers
            .iter_mut()
            .find(|c| c.name().name == spec.name().name)
        {
            Some(row) => *row = spec,
            None => {
                self.fail(SetupError::NoSuchController {
                    action: "replace",
                    name: spec.name().name.to_owned(),
                    known: self.controller_names().join(", "),
                });
            }
        }
        self
    }

    /// Drops the controller `name` from the table: it never runs, and `--controllers` no longer knows it.
    pub fn without_controller(mut self, name: &str) -> Self {
        let before = self.controllers.len();
        self.controllers.retain(|c| c.name().name != name);
        if self.controllers.len() == before {
            self.fail(SetupError::NoSuchController {
                action: "drop",
                name: name.to_owned(),
                known: self.controller_names().join(", "),
            });
        }
        self
    }

    /// The binary's own name and version in `--help` and `--version` (a provider's binary sets its
    /// own, e.g. `env!("CARGO_PKG_NAME")`, `env!("CARGO_PKG_VERSION")`).
    pub fn named(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.identity = Some(BinaryIdentity {
            name: name.into(),
            version: version.into(),
            about: self.identity.and_then(|identity| identity.about),
        });
        self
    }

    /// The one line `--help` starts with.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        let identity = self.identity.get_or_insert_with(|| BinaryIdentity {
            name: "cloud-controller-manager".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            about: None,
        });
        identity.about = Some(about.into());
        self
    }

    fn fail(&mut self, error: SetupError) {
        self.setup_error.get_or_insert(error);
    }

    fn controller_names(&self) -> Vec<&'static str> {
        self.controllers.iter().map(|c| c.name().name).collect()
    }

    /// The registry this manager picks its provider from.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The controller table, in start order.
    pub fn controllers(&self) -> &[ControllerSpec] {
        &self.controllers
    }

    /// The manager's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The whole command: the manager's flags, the linked providers' flags, the controller table.
    pub fn command(&self) -> Result<clap::Command, ManagerError> {
        self.check_setup()?;
        app::command_line::command(&self.registry, &self.controllers, self.identity.as_ref())
            .map_err(|clash| ManagerError::Setup(clash.into()))
    }

    /// Parses a command line (the binary's name first), the linked providers' flags included.
    pub fn parse_from<I, T>(&self, args: I) -> Result<CommandLine, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        app::command_line::parse_from(
            &self.registry,
            &self.controllers,
            self.identity.as_ref(),
            args,
        )
    }

    fn check_setup(&self) -> Result<(), ManagerError> {
        match &self.setup_error {
            Some(err) => Err(ManagerError::Setup(err.clone())),
            None => Ok(()),
        }
    }

    /// Runs the manager with `command_line` (from [`Manager::parse_from`], or the manager's own
    /// [`Options`]) until `shutdown` is cancelled.
    pub async fn run(
        &self,
        command_line: impl Into<CommandLine>,
        shutdown: CancellationToken,
    ) -> Result<(), ManagerError> {
        self.check_setup()?;
        app::run(
            command_line.into(),
            &self.registry,
            &self.controllers,
            &self.metrics,
            shutdown,
        )
        .await
        .map_err(Into::into)
    }

    /// The process's async runtime: tokio's multi-threaded one, with the event interval the chosen
    /// provider registered (see [`cloud_provider::Registration::with_runtime_event_interval`]), if any.
    fn runtime_for(&self, command_line: &CommandLine) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all();
        if let Some(interval) = self.runtime_event_interval(command_line) {
            builder.event_interval(interval);
        }
        builder.build()
    }

    /// The event interval the provider `command_line` names registered for the manager's runtime.
    fn runtime_event_interval(&self, command_line: &CommandLine) -> Option<u32> {
        self.registry
            .runtime_event_interval(&command_line.options.cloud.cloud_provider)
    }

    /// The whole process: parses the command line, sets up logging, runs until SIGTERM or SIGINT, and
    /// returns the exit code (0 after a clean shutdown, 1 on an error, 2 on a malformed command line).
    /// A provider's binary that adds flags or controllers keeps all of this.
    pub fn main(self) -> ExitCode {
        if let Err(err) = self.check_setup() {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
        let command_line = match self.parse_from(std::env::args_os()) {
            Ok(command_line) => command_line,
            Err(err) => {
                let _ = err.print();
                return if err.use_stderr() {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
        };
        app::logging::init(&command_line.options.logging);
        raise_open_files_limit();
        let runtime = match self.runtime_for(&command_line) {
            Ok(runtime) => runtime,
            Err(err) => {
                eprintln!("error: cannot start the async runtime: {err}");
                return ExitCode::FAILURE;
            }
        };
        let result = runtime.block_on(async {
            let shutdown = CancellationToken::new();
            // Unsupervised: waits for a signal, then cancels the shutdown or exits (nothing in it
            // can fail).
            tokio::spawn(stop_on_signals(shutdown.clone()));
            self.run(command_line, shutdown).await
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

/// Raises the soft limit on open files to the hard limit, as the Go runtime does for every Go program
/// (so for upstream's manager): a provider with a data plane holds descriptors per connection, and the
/// common soft limit of 1024 is far below what the hard limit allows.
fn raise_open_files_limit() {
    #[cfg(unix)]
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open-files limit"),
        Err(err) => tracing::warn!(error = %err, "cannot raise the open-files limit"),
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cloud_provider::CloudProvider;

    use super::*;
    use crate::controllers::{ControllerContext, ControllerTask};

    /// The tagger's flags (this comment must not become the binary's description).
    #[derive(Debug, Clone, clap::Args)]
    struct TaggerFlags {
        /// The tag the tagger writes.
        #[arg(long, default_value = "owner")]
        tagger_tag: String,
    }

    #[derive(Debug, clap::Args)]
    struct ClashingFlags {
        /// Clashes with the manager's flag.
        #[arg(long)]
        cluster_name: Option<String>,
    }

    struct Plain;
    impl CloudProvider for Plain {
        fn provider_name(&self) -> &str {
            "plain"
        }
    }

    fn start_tagger(_: ControllerContext, _: TaggerFlags) -> Option<ControllerTask> {
        None
    }

    fn tagger() -> ControllerSpec {
        ControllerSpec::new(
            "tagger",
            |cfg| cfg.flags::<TaggerFlags>().map(Some),
            start_tagger,
        )
        .alias("tag")
    }

    fn manager() -> Manager {
        let mut registry = Registry::new();
        registry
            .register("plain", |_| Ok(Arc::new(Plain) as _))
            .unwrap();
        registry.register_flags("plain", <TaggerFlags as clap::Args>::augment_args);
        Manager::with_registry(registry)
    }

    fn help(manager: &Manager) -> String {
        manager.command().unwrap().render_long_help().to_string()
    }

    #[test]
    fn the_runtime_takes_the_event_interval_of_the_provider_the_command_line_names() {
        let mut registry = Registry::new();
        for name in ["plain", "relay"] {
            registry
                .register(name, |_| Ok(Arc::new(Plain) as _))
                .unwrap();
        }
        registry.set_runtime_event_interval("relay", std::num::NonZeroU32::new(31).unwrap());
        let manager = Manager::with_registry(registry);
        let chosen = |name: &str| {
            let command_line = manager
                .parse_from(["ccm", &format!("--cloud-provider={name}")])
                .unwrap();
            manager.runtime_event_interval(&command_line)
        };
        assert_eq!(chosen("relay"), Some(31));
        assert_eq!(chosen("plain"), None, "tokio's default for the others");
        let command_line = manager
            .parse_from(["ccm", "--cloud-provider=relay"])
            .unwrap();
        assert!(manager.runtime_for(&command_line).is_ok());
    }

    #[test]
    fn an_added_controller_is_in_the_help_and_the_controllers_flag() {
        let manager = manager().with_controller(tagger().disabled_by_default());
        let help = help(&manager);
        assert!(help.contains("tagger (tag; off by default)"), "{help}");
        assert!(help.contains("node-ipam-controller (nodeipam)"), "{help}");
        let names: Vec<_> = manager
            .controllers()
            .iter()
            .map(|c| c.name().name)
            .collect();
        assert_eq!(names.last(), Some(&"tagger"));
    }

    #[test]
    fn a_providers_flags_show_under_its_heading_and_parse_with_the_rest() {
        let manager = manager();
        let help = help(&manager);
        assert!(
            help.starts_with("The Kubernetes cloud controller manager"),
            "{help}"
        );
        let heading = help.find("Provider plain:").expect(&help);
        assert!(help[heading..].contains("--tagger-tag"), "{help}");
        let command_line = manager
            .parse_from(["ccm", "--cloud-provider=plain", "--tagger-tag=team"])
            .unwrap();
        assert_eq!(command_line.options.cloud.cloud_provider, "plain");
        let flags =
            <TaggerFlags as clap::FromArgMatches>::from_arg_matches(&command_line.matches).unwrap();
        assert_eq!(flags.tagger_tag, "team");
        let err = manager.parse_from(["ccm", "--tagger-tag"]).unwrap_err();
        assert!(err.to_string().contains("--tagger-tag"), "{err}");
    }

    #[test]
    fn a_flag_that_clashes_is_refused_with_both_owners_named() {
        let mut manager = manager();
        manager
            .registry
            .register_flags("plain", <ClashingFlags as clap::Args>::augment_args);
        let err = manager.command().unwrap_err().to_string();
        assert_eq!(
            err,
            "provider \"plain\" adds the flag --cluster-name, which the manager already has; rename it (prefix it with the provider's or controller's name)"
        );
    }

    #[test]
    fn the_binary_is_named_after_the_provider() {
        let manager = manager().named("acme-ccm", "1.2.3").about("Acme's CCM.");
        let mut command = manager.command().unwrap();
        assert_eq!(command.render_version().trim(), "acme-ccm 1.2.3");
        let help = command.render_help().to_string();
        assert!(help.starts_with("Acme's CCM."), "{help}");
        assert!(help.contains("Usage: acme-ccm"), "{help}");
    }

    #[test]
    fn table_edits_that_name_nothing_or_clash_are_errors() {
        let clash = manager().with_controller(
            ControllerSpec::new(
                "other",
                |_| {
                    Ok(Some(TaggerFlags {
                        tagger_tag: String::new(),
                    }))
                },
                start_tagger,
            )
            .alias("service"),
        );
        let err = clash.command().unwrap_err().to_string();
        assert!(
            err.contains("clashes with the controller \"service-lb-controller\""),
            "{err}"
        );
        let missing = manager().without_controller("nope");
        assert!(
            missing
                .command()
                .unwrap_err()
                .to_string()
                .contains("cannot drop controller \"nope\"")
        );
        let missing = manager().replace_controller(tagger());
        assert!(
            missing
                .command()
                .unwrap_err()
                .to_string()
                .contains("cannot replace controller \"tagger\"")
        );
    }

    #[test]
    fn built_in_controllers_can_be_dropped_or_replaced_in_place() {
        let manager = manager().without_controller("node-route-controller");
        let names: Vec<_> = manager
            .controllers()
            .iter()
            .map(|c| c.name().name)
            .collect();
        assert!(!names.contains(&"node-route-controller"));
        assert!(help(&manager).contains("Known names: cloud-node-controller (cloud-node), cloud-node-lifecycle-controller (cloud-node-lifecycle), service-lb-controller (service), node-ipam-controller (nodeipam)"));
        let replaced = manager.replace_controller(ControllerSpec::new(
            "service-lb-controller",
            |cfg| cfg.flags::<TaggerFlags>().map(Some),
            start_tagger,
        ));
        let names: Vec<_> = replaced
            .controllers()
            .iter()
            .map(|c| c.name().name)
            .collect();
        assert_eq!(names[2], "service-lb-controller");
        assert_eq!(replaced.controllers()[2].name().alias, None);
    }
}
