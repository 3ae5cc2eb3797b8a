//! The controller table: one row per controller, with its name, its `--controllers` alias, whether `*`
//! enables it, how its typed config is built from the command line, and the function that starts it.
//!
//! A row's config is built and checked once, before anything starts (upstream's `ApplyTo`/`Validate`):
//! a malformed flag stops the manager at start with a message naming it, never a controller later. The
//! controllers never see the app's [`Options`]; each gets only its own typed config.
//!
//! A provider's `main` adds, replaces or drops rows with [`crate::Manager::with_controller`],
//! [`crate::Manager::replace_controller`] and [`crate::Manager::without_controller`].

use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use clap::ArgMatches;
use cloud_provider::{CloudConfig, CloudProvider};
use ipnet::IpNet;

use super::{
    Options,
    feature_gates::{ADDITIONAL_LABELS, WATCH_BASED_ROUTES},
    options::NodeIpamOptions,
};
use crate::{
    cidrs::parse_cidr_list,
    controllers::{ControllerContext, ControllerTask, ipam, node, node_lifecycle, route, service},
};

/// Starts a configured controller: `None` when it does not run (the cloud lacks what it needs; it logs
/// why).
pub type StartFn = Box<dyn FnOnce(ControllerContext) -> Option<ControllerTask> + Send>;

type ConfigureFn =
    Arc<dyn Fn(&ConfigureContext<'_>) -> Result<Option<StartFn>, ConfigureError> + Send + Sync>;

/// Why a controller's configuration was refused: a message naming the flag at fault. The manager
/// stops at start with it (exit 1, `error: <message>`). `?` and `.into()` turn a `String` or `&str`
/// into one.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ConfigureError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl ConfigureError {
    /// An error of the controller's own type (its source chain kept).
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(error))
    }
}

impl From<String> for ConfigureError {
    fn from(message: String) -> Self {
        Self(message.into())
    }
}

impl From<&str> for ConfigureError {
    fn from(message: &str) -> Self {
        Self(message.into())
    }
}

/// A controller the manager knows: its names and whether `*` enables it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerName {
    /// The canonical name (upstream `names/controller_names.go` for the built-in ones).
    pub name: &'static str,
    /// The legacy name `--controllers` also accepts, rewritten to `name`.
    pub alias: Option<&'static str>,
    /// Whether `*` enables it.
    pub enabled_by_default: bool,
}

impl ControllerName {
    /// Whether `entry` (from `--controllers`, without its `-`) names this controller.
    pub fn is_named(&self, entry: &str) -> bool {
        self.name == entry || self.alias == Some(entry)
    }
}

/// One row of the controller table.
#[derive(Clone)]
pub struct ControllerSpec {
    name: ControllerName,
    client_name: Option<&'static str>,
    configure: ConfigureFn,
    flags: Option<cloud_provider::AddFlagsFn>,
}

impl fmt::Debug for ControllerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerSpec")
            .field("name", &self.name)
            .field("service_account", &self.service_account())
            .finish_non_exhaustive()
    }
}

impl ControllerSpec {
    /// A controller named `name`, enabled by `*`, whose typed config `C` is built by `config` from the
    /// command line and which `start` starts.
    ///
    /// `config` runs once, before anything starts, and only when the controller is enabled: return
    /// `Err` with a message naming the flag at fault to stop the manager, or `Ok(None)` (after logging
    /// why) when the flags turn the controller off.
    ///
    /// `start` asks for the shared caches the controller reads (`ctx.informers.nodes()`, ...) before
    /// it returns the task: the manager starts them once every controller has started
    /// ([`crate::informers::InformerFactory`]).
    ///
    /// ```
    /// use clap::Args;
    /// use cloud_controller_manager::{
    ///     ControllerSpec,
    ///     controllers::{ControllerContext, ControllerTask},
    ///     informers::wait_for_cache_sync,
    /// };
    ///
    /// #[derive(Debug, Clone, Args)]
    /// struct TaggerFlags {
    ///     /// The tag the tagger writes.
    ///     #[arg(long, default_value = "owner")]
    ///     tagger_tag: String,
    /// }
    ///
    /// fn start(ctx: ControllerContext, flags: TaggerFlags) -> Option<ControllerTask> {
    ///     let nodes = ctx.informers.nodes();
    ///     Some(Box::pin(async move {
    ///         if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
    ///             return Ok(());
    ///         }
    ///         let _ = (nodes.store().state(), flags.tagger_tag);
    ///         ctx.shutdown.cancelled().await;
    ///         Ok(())
    ///     }))
    /// }
    ///
    /// let spec = ControllerSpec::new("tagger", |cfg| cfg.flags::<TaggerFlags>().map(Some), start)
    ///     .alias("tag");
    /// assert_eq!(spec.name().alias, Some("tag"));
    /// ```
    pub fn new<C: Send + 'static>(
        name: &'static str,
        config: impl Fn(&ConfigureContext<'_>) -> Result<Option<C>, ConfigureError>
        + Send
        + Sync
        + 'static,
        start: fn(ControllerContext, C) -> Option<ControllerTask>,
    ) -> Self {
        Self {
            name: ControllerName {
                name,
                alias: None,
                enabled_by_default: true,
            },
            client_name: None,
            flags: None,
            configure: Arc::new(move |cfg| {
                Ok(config(cfg)?
                    .map(|config| -> StartFn { Box::new(move |context| start(context, config)) }))
            }),
        }
    }

    /// The legacy name `--controllers` also accepts.
    pub fn alias(mut self, alias: &'static str) -> Self {
        self.name.alias = Some(alias);
        self
    }

    /// The name of its API client (upstream's `ClientName`), which is also the name of the ServiceAccount
    /// in `kube-system` it authenticates as under `--use-service-account-credentials`. Without it, the
    /// controller's name. Controllers may share one (the node controllers share `node-controller`). The
    /// manager's identity may request tokens only for the ServiceAccounts its role names
    /// (`deploy/rbac.yaml`: the built-in ones): a controller of a provider's needs a rule of its own
    /// there, and a role bound to its ServiceAccount.
    pub fn client_name(mut self, client_name: &'static str) -> Self {
        self.client_name = Some(client_name);
        self
    }

    /// The name of its API client and ServiceAccount (see [`ControllerSpec::client_name`]).
    pub fn service_account(&self) -> &'static str {
        self.client_name.unwrap_or(self.name.name)
    }

    /// `*` does not enable it; only naming it in `--controllers` does.
    pub fn disabled_by_default(mut self) -> Self {
        self.name.enabled_by_default = false;
        self
    }

    /// Flags of the controller's own, added to the command line under its heading; its config reads
    /// them with [`ConfigureContext::flags`].
    pub fn with_flags<T: clap::Args>(mut self) -> Self {
        self.flags = Some(T::augment_args);
        self
    }

    /// What adds its own flags to the command line, if it has any.
    pub fn flags(&self) -> Option<cloud_provider::AddFlagsFn> {
        self.flags
    }

    /// Its names.
    pub fn name(&self) -> &ControllerName {
        &self.name
    }

    /// Builds its config from the command line; `Ok(None)` when the flags turn it off.
    pub(crate) fn configure(
        &self,
        cfg: &ConfigureContext<'_>,
    ) -> Result<Option<StartFn>, ConfigureError> {
        (self.configure)(cfg)
    }
}

/// What a row's config is built from: the parsed command line (the manager's flags and any a provider
/// added) and the cloud.
pub struct ConfigureContext<'a> {
    options: &'a Options,
    matches: &'a ArgMatches,
    cloud: &'a dyn CloudProvider,
    cluster_cidrs: OnceLock<Result<Vec<IpNet>, String>>,
}

impl<'a> ConfigureContext<'a> {
    pub(crate) fn new(
        options: &'a Options,
        matches: &'a ArgMatches,
        cloud: &'a dyn CloudProvider,
    ) -> Self {
        Self {
            options,
            matches,
            cloud,
            cluster_cidrs: OnceLock::new(),
        }
    }

    /// Flags a provider added to the command line (see `cloud_provider::register_provider!`), read
    /// into their clap type. A command line built from [`Options`] alone gives every such flag its
    /// default.
    pub fn flags<T: clap::Args>(&self) -> Result<T, ConfigureError> {
        if self.matches.ids().next().is_none() {
            return CloudConfig::none().flags::<T>().map_err(ConfigureError);
        }
        cloud_provider::read_flags::<T>(self.matches).map_err(ConfigureError)
    }

    /// The cloud the manager runs against.
    pub fn cloud(&self) -> &dyn CloudProvider {
        self.cloud
    }

    /// `--cluster-name`.
    pub fn cluster_name(&self) -> &str {
        &self.options.cloud.cluster_name
    }

    /// `--cluster-cidr`, parsed once for every controller that needs it; an error when it is empty or
    /// malformed.
    pub fn cluster_cidrs(&self) -> Result<&[IpNet], ConfigureError> {
        self.cluster_cidrs
            .get_or_init(|| parse_cidr_list("--cluster-cidr", &self.options.cloud.cluster_cidr))
            .as_deref()
            .map_err(|err| ConfigureError::from(err.clone()))
    }

    fn options(&self) -> &Options {
        self.options
    }
}

/// The built-in controllers, in the order the manager starts them, with upstream's client names
/// (`DefaultInitFuncConstructors` in k8s.io/cloud-provider/app/controllermanager.go): the ServiceAccounts
/// that `--use-service-account-credentials` uses, which the API server's bootstrap roles
/// (`system:controller:<name>`) bind.
pub fn builtin_controllers() -> Vec<ControllerSpec> {
    vec![
        // The cloud-node controller shares `node-controller` with the lifecycle controller "for
        // historical reasons" (upstream, kubernetes/kubernetes#72764).
        ControllerSpec::new(node::COMPONENT, node_config, node::start)
            .alias("cloud-node")
            .client_name("node-controller"),
        ControllerSpec::new(
            node_lifecycle::COMPONENT,
            node_lifecycle_config,
            node_lifecycle::start,
        )
        .alias("cloud-node-lifecycle")
        .client_name("node-controller"),
        ControllerSpec::new("service-lb-controller", service_config, service::start)
            .alias("service")
            .client_name("service-controller"),
        ControllerSpec::new("node-route-controller", route_config, route::start)
            .alias("route")
            .client_name("route-controller"),
        // Upstream's CCM has no node-IPAM controller; kube-controller-manager's node-ipam controller
        // (cmd/kube-controller-manager/app/core.go, newNodeIpamController) builds its client with
        // `controllerContext.NewClient("node-controller")`, and so does ours.
        ControllerSpec::new("node-ipam-controller", ipam_config, ipam::start)
            .alias("nodeipam")
            .client_name("node-controller"),
    ]
}

fn node_config(cfg: &ConfigureContext<'_>) -> Result<Option<node::Config>, ConfigureError> {
    let options = cfg.options();
    let node = &options.node;
    Ok(Some(node::Config {
        workers: usize::from(node.concurrent_node_syncs),
        status_workers: node.status_workers(),
        status_period: node.node_status_update_frequency,
        additional_labels: options.generic.feature_gates().enabled(ADDITIONAL_LABELS),
    }))
}

fn node_lifecycle_config(
    cfg: &ConfigureContext<'_>,
) -> Result<Option<node_lifecycle::Config>, ConfigureError> {
    let node = &cfg.options().node;
    Ok(Some(node_lifecycle::Config {
        period: node.node_monitor_period,
        workers: node.lifecycle_workers(),
    }))
}

fn service_config(cfg: &ConfigureContext<'_>) -> Result<Option<service::Config>, ConfigureError> {
    let options = &cfg.options().service;
    let served = service::ServedClasses::new(
        &options.load_balancer_classes,
        options.serve_classless_load_balancers,
    )
    .map_err(ConfigureError::from)?;
    Ok(Some(service::Config {
        cluster_name: cfg.cluster_name().to_owned(),
        workers: usize::from(options.concurrent_service_syncs),
        orphan_sweep_period: Some(options.orphaned_load_balancer_sweep_period)
            .filter(|period| !period.is_zero()),
        served,
        drift: Some(options.load_balancer_drift_period)
            .filter(|period| !period.is_zero())
            .map(|period| (period, options.load_balancer_drift)),
        conditions: !cfg.options().generic.dry_run,
    }))
}

/// Upstream: a route controller with routes supported and no valid `--cluster-cidr` is fatal.
fn route_config(cfg: &ConfigureContext<'_>) -> Result<Option<route::Config>, ConfigureError> {
    let options = cfg.options();
    if !options.route.configure_cloud_routes {
        tracing::info!("node-route-controller not started: --configure-cloud-routes is false");
        return Ok(None);
    }
    if cfg.cloud().routes().is_none() {
        tracing::warn!(
            "node-route-controller not started: the cloud provider does not support routes"
        );
        return Ok(None);
    }
    let cluster_cidrs = cfg.cluster_cidrs().map_err(|err| {
        format!("{err} (the route controller needs it; or set --configure-cloud-routes=false)")
    })?;
    Ok(Some(route::Config {
        cluster_name: cfg.cluster_name().to_owned(),
        cluster_cidrs: cluster_cidrs.to_vec(),
        period: options.route.route_reconciliation_period,
        watch_based: options.generic.feature_gates().enabled(WATCH_BASED_ROUTES),
    }))
}

fn ipam_config(
    cfg: &ConfigureContext<'_>,
) -> Result<Option<Vec<ipam::allocator::CidrSet>>, ConfigureError> {
    let options = cfg.options();
    if !options.ipam.allocate_node_cidrs {
        tracing::info!("node-ipam-controller not started: --allocate-node-cidrs is false");
        return Ok(None);
    }
    let config = node_ipam_config(&options.ipam, cfg.cluster_cidrs()?)?;
    Ok(config.cidr_sets().map(Some)?)
}

/// The node-IPAM controller's config from its flags and the parsed `--cluster-cidr`.
pub fn node_ipam_config(
    ipam: &NodeIpamOptions,
    cluster_cidrs: &[IpNet],
) -> Result<ipam::Config, ConfigureError> {
    let service_ranges = if ipam.service_cluster_ip_range.trim().is_empty() {
        Vec::new()
    } else {
        parse_cidr_list("--service-cluster-ip-range", &ipam.service_cluster_ip_range)?
    };
    Ok(ipam::Config {
        cluster_cidrs: cluster_cidrs.to_vec(),
        node_mask_size: (ipam.node_cidr_mask_size != 0).then_some(ipam.node_cidr_mask_size),
        node_mask_size_ipv4: ipam.node_cidr_mask_size_ipv4,
        node_mask_size_ipv6: ipam.node_cidr_mask_size_ipv6,
        service_ranges,
    })
}

/// The `--controllers` help, generated from the table.
pub fn controllers_help(table: &[ControllerSpec]) -> String {
    let names: Vec<String> = table
        .iter()
        .map(|spec| {
            let name = spec.name();
            let mut text = name.name.to_owned();
            match (name.alias, name.enabled_by_default) {
                (Some(alias), true) => text.push_str(&format!(" ({alias})")),
                (Some(alias), false) => text.push_str(&format!(" ({alias}; off by default)")),
                (None, false) => text.push_str(" (off by default)"),
                (None, true) => {}
            }
            text
        })
        .collect();
    format!(
        "Controllers to enable: '*' enables all on-by-default controllers, 'foo' enables the controller named 'foo', '-foo' disables it. The first mention of a controller wins. Known names: {}",
        names.join(", ")
    )
}
