//! The command line: upstream's flag names and defaults, grouped by what they configure.
//!
//! Flags are added as the features behind them land; a flag is never accepted and ignored.

use std::time::Duration;

use cloud_provider::flag_values::{go_bool, go_duration, positive_go_duration};

use clap::{ArgAction, Args, Parser, ValueEnum};

use crate::KubeApiContentType;

/// The Kubernetes cloud-controller-manager.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cloud-controller-manager",
    version,
    about = "The Kubernetes cloud controller manager: runs the controllers that tie a cluster to its cloud.",
    long_about = None,
    // As with Go's flag package, a flag given twice takes its last value.
    args_override_self = true,
    // Go's flag package accepts `-flag` as well as `--flag`; clap only `--flag`. Users copy upstream
    // manifests, which use `--flag`, so that is what we support.
)]
pub struct Options {
    /// Which controllers run.
    #[command(flatten)]
    pub(crate) generic: GenericOptions,
    /// Leader election.
    #[command(flatten)]
    pub(crate) leader_election: LeaderElectionOptions,
    /// The secure health and metrics endpoint.
    #[command(flatten)]
    pub(crate) serving: ServingOptions,
    /// Which cloud, configured how.
    #[command(flatten)]
    pub(crate) cloud: CloudProviderOptions,
    /// The node controllers.
    #[command(flatten)]
    pub(crate) node: NodeControllerOptions,
    /// The service-lb controller.
    #[command(flatten)]
    pub(crate) service: ServiceControllerOptions,
    /// The node-route controller.
    #[command(flatten)]
    pub(crate) route: RouteControllerOptions,
    /// The node-IPAM controller.
    #[command(flatten)]
    pub(crate) ipam: NodeIpamOptions,
    /// How the manager talks to the API server.
    #[command(flatten)]
    pub(crate) client: ClientOptions,
    /// Log output.
    #[command(flatten)]
    pub(crate) logging: LoggingOptions,
}

impl Options {
    /// The provider `--cloud-provider` names.
    pub fn cloud_provider(&self) -> &str {
        &self.cloud.cloud_provider
    }
}

/// Which controllers run.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Generic")]
pub struct GenericOptions {
    /// Controllers to enable: '*' enables all on-by-default controllers, 'foo' enables the controller
    /// named 'foo', '-foo' disables it. The first mention of a controller wins. (`--help` lists the
    /// names from the controller table.)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "*",
        allow_hyphen_values = true
    )]
    pub controllers: Vec<String>,

    /// Shadow mode: run every enabled controller without leader election, beside the manager that acts
    /// (the incumbent), and write nothing to the API server or the cloud. API writes are sent with
    /// dryRun=All (validated, not stored); cloud writes become previews. Every would-be write is
    /// logged, counted in /metrics (cloud_controller_manager_dry_run_*) and listed as JSON at
    /// /dry-run on the secure port (same authorization as /metrics). Overrides --leader-elect.
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub dry_run: bool,

    /// If true, use individual service account credentials for each controller: each controller's API
    /// client authenticates with a token of its own ServiceAccount in kube-system (node-controller,
    /// service-controller, route-controller; a provider's controller: its own name), requested with the
    /// TokenRequest API and refreshed before it expires. The manager's identity creates a missing
    /// ServiceAccount (never with --dry-run) and needs the rules of deploy/rbac.yaml for it; the caches
    /// and leader election keep the manager's identity.
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub use_service_account_credentials: bool,

    /// Feature gates, upstream's syntax: `Gate=true,Other=false` (repeatable; a later setting wins). An
    /// unknown gate is refused, and so is a known gate at a value this manager does not implement.
    #[arg(long, action = ArgAction::Append, value_parser = feature_gates_value, long_help = super::feature_gates::help())]
    pub feature_gates: Vec<String>,
}

/// One `--feature-gates` value, checked as it is read.
fn feature_gates_value(text: &str) -> Result<String, String> {
    super::feature_gates::FeatureGates::parse([text])?;
    Ok(text.to_owned())
}

impl GenericOptions {
    /// The gates `--feature-gates` set (each value was checked as it was read).
    pub fn feature_gates(&self) -> super::feature_gates::FeatureGates {
        super::feature_gates::FeatureGates::parse(self.feature_gates.iter().map(String::as_str))
            .unwrap_or_default()
    }
}

/// Leader election on a coordination.k8s.io Lease (upstream's flags and defaults).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderElectionOptions {
    /// Start a leader election client and gain leadership before running the controllers. Enable this
    /// when running replicated components for high availability.
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    pub leader_elect: bool,

    /// How long non-leader candidates wait after observing a leadership renewal before attempting to
    /// acquire leadership of a led but unrenewed leader slot.
    #[arg(long, default_value = "15s", value_parser = positive_go_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the acting leader keeps trying to renew before it stops leading (and exits).
    #[arg(long, default_value = "10s", value_parser = positive_go_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How long candidates wait between tries of acquiring and renewing leadership.
    #[arg(long, default_value = "2s", value_parser = positive_go_duration)]
    pub leader_elect_retry_period: Duration,

    /// The type of resource object used for locking; only `leases` is supported.
    #[arg(long, default_value = "leases", value_parser = ["leases"])]
    pub leader_elect_resource_lock: String,

    /// The name of the Lease used for locking.
    #[arg(long, default_value = "cloud-controller-manager")]
    pub leader_elect_resource_name: String,

    /// The namespace of the Lease used for locking.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

/// Flags that cannot work together ([`Options::validate`]; clap checks each flag alone).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FlagsError {
    /// client-go's rule: the lease must outlast the renew deadline.
    #[error("--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline")]
    LeaseNotLongerThanRenewDeadline,
    /// client-go's rule: the renew deadline must exceed 1.2 retry periods.
    #[error("--leader-elect-renew-deadline must be greater than 1.2 × --leader-elect-retry-period")]
    RenewDeadlineTooShort,
    /// The client's bucket would take longer than Go's longest duration to refill.
    #[error(
        "--kube-api-burst={burst} at --kube-api-qps={qps} takes {refill:.0}s to refill, more than 2562047h; raise --kube-api-qps or lower --kube-api-burst"
    )]
    BurstRefillTooLong {
        /// `--kube-api-burst`.
        burst: u32,
        /// `--kube-api-qps`.
        qps: f32,
        /// The seconds a full refill takes.
        refill: f64,
    },
}

impl LeaderElectionOptions {
    /// client-go's checks: lease duration > renew deadline > 1.2 × retry period.
    pub fn validate(&self) -> Result<(), FlagsError> {
        if !self.leader_elect {
            return Ok(());
        }
        if self.leader_elect_lease_duration <= self.leader_elect_renew_deadline {
            return Err(FlagsError::LeaseNotLongerThanRenewDeadline);
        }
        if self.leader_elect_renew_deadline <= self.leader_elect_retry_period.mul_f64(1.2) {
            return Err(FlagsError::RenewDeadlineTooShort);
        }
        Ok(())
    }
}

/// The HTTPS endpoint: `/healthz`, `/livez`, `/readyz` and `/metrics`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Secure serving")]
pub struct ServingOptions {
    /// The port on which to serve HTTPS with authentication and authorization. 0 disables it.
    #[arg(long, default_value_t = 10258)]
    pub secure_port: u16,

    /// The IP address on which to listen for the --secure-port port.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: std::net::IpAddr,

    /// File containing the default x509 certificate for HTTPS (CA certificates, if any, concatenated
    /// after it). Without it, a self-signed certificate is generated in memory.
    #[arg(long, default_value = "", requires = "tls_private_key_file")]
    pub tls_cert_file: String,

    /// File containing the default x509 private key matching --tls-cert-file.
    #[arg(long, default_value = "", requires = "tls_cert_file")]
    pub tls_private_key_file: String,

    /// Comma-separated numeric Go crypto/tls CurveID values: the key exchanges the secure port allows.
    /// This manager offers 23 (P-256), 24 (P-384) and 29 (X25519); others are refused by name. The
    /// order is ignored, as upstream's; empty: all three.
    #[arg(long, default_value = "", value_parser = super::tls_curves::TlsCurves::parse)]
    pub tls_curve_preferences: super::tls_curves::TlsCurves,

    /// Paths that need neither authentication nor authorization (exact paths, or a prefix ending in
    /// `*`). Everything else (e.g. /metrics) needs a caller the API server authenticates (TokenReview)
    /// and authorizes (SubjectAccessReview).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,
}

/// Which cloud, configured how.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Cloud provider")]
pub struct CloudProviderOptions {
    /// The provider for cloud services: the name a linked provider registered under.
    #[arg(long, default_value = "")]
    pub cloud_provider: String,

    /// The path to the cloud provider configuration file. Empty string for no configuration file.
    #[arg(long, default_value = "", value_hint = clap::ValueHint::FilePath)]
    pub cloud_config: String,

    /// The instance prefix for the cluster, passed to the cloud's load-balancer and route calls.
    #[arg(long, default_value = "kubernetes")]
    pub cluster_name: String,

    /// CIDR range of pods in the cluster: one CIDR, or an IPv4 and an IPv6 one separated by a comma.
    /// Required by the route controller (when routes are configured) and by node IPAM.
    #[arg(long, default_value = "")]
    pub cluster_cidr: String,

    /// Allow the cluster to run without the cluster-id on cloud instances (deprecated upstream, kept for
    /// compatibility): without it, a cloud that reports no cluster ID is fatal.
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub allow_untagged_cloud: bool,

    /// The nodes this manager owns, as a label selector in kubectl's `-l` syntax (`cloud=aws`,
    /// `pool in (a,b)`, `!edge`); default: every node. Of those, it owns the ones whose provider ID has
    /// its provider's scheme, or that have none yet and its provider recognizes. Its controllers
    /// initialize, delete, taint, route and load-balance owned nodes only, so managers of two clouds
    /// can share a cluster. Not in upstream.
    #[arg(long, default_value = "", value_parser = crate::node_selector::NodeSelector::parse)]
    pub node_selector: crate::node_selector::NodeSelector,

    /// --node-selector under cloud-provider-azure's name (kubernetes-sigs/cloud-provider-azure#9270;
    /// OCI's pending one): the same label-selector syntax, as Azure's parses it (apimachinery's
    /// `labels.Parse`). Give one of the two, not both.
    #[arg(
        long,
        value_parser = crate::node_selector::NodeSelector::parse,
        conflicts_with = "node_selector"
    )]
    pub node_filter_requirements: Option<crate::node_selector::NodeSelector>,
}

impl CloudProviderOptions {
    /// The nodes this manager owns: `--node-selector`, or its alias `--node-filter-requirements`.
    pub fn node_selector(&self) -> &crate::node_selector::NodeSelector {
        self.node_filter_requirements
            .as_ref()
            .unwrap_or(&self.node_selector)
    }
}

/// The cloud-node and cloud-node-lifecycle controllers.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Node controllers")]
pub struct NodeControllerOptions {
    /// The number of nodes the cloud-node controller initializes at once (and the lifecycle controller
    /// checks at once). Upstream's default is 1, which initializes a large cluster slowly; the cloud
    /// calls of 16 workers overlap, while the client QPS limit keeps the API server load bounded.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_node_syncs: u16,

    /// The number of workers refreshing node addresses; 0 means --concurrent-node-syncs.
    #[arg(long, default_value_t = 0)]
    pub concurrent_node_status_updates: u16,

    /// The number of nodes the cloud-node-lifecycle controller checks at once. Default:
    /// --concurrent-node-syncs (upstream's default is 1).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_node_lifecycle_syncs: Option<u16>,

    /// How often the cloud-node controller refreshes every node's addresses from the cloud.
    #[arg(long, default_value = "5m", value_parser = positive_go_duration)]
    pub node_status_update_frequency: Duration,

    /// How often the cloud-node-lifecycle controller checks not-ready nodes against the cloud.
    #[arg(long, default_value = "5s", value_parser = positive_go_duration)]
    pub node_monitor_period: Duration,
}

impl NodeControllerOptions {
    /// The lifecycle controller's workers: `--concurrent-node-lifecycle-syncs`, or
    /// `--concurrent-node-syncs`.
    pub fn lifecycle_workers(&self) -> usize {
        usize::from(
            self.concurrent_node_lifecycle_syncs
                .unwrap_or(self.concurrent_node_syncs),
        )
    }

    /// The address-refresh workers: `--concurrent-node-status-updates`, or `--concurrent-node-syncs`.
    pub fn status_workers(&self) -> usize {
        usize::from(if self.concurrent_node_status_updates == 0 {
            self.concurrent_node_syncs
        } else {
            self.concurrent_node_status_updates
        })
    }
}

/// The service-lb controller.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Service controller")]
pub struct ServiceControllerOptions {
    /// The number of Services synced at once, and of load balancers updated at once after a node
    /// change. Upstream's default is 1; 16 keeps many Services from queueing behind one slow cloud call.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_service_syncs: u16,

    /// How often the service controller looks for load balancers the cloud holds for this cluster whose
    /// Service no longer exists (left by a leader that froze during a call, or by anything else) and
    /// deletes them; `0s` turns the sweep off. Not in upstream. Needs a provider that lists its load
    /// balancers (`fake`, `local` and `aws` do; for others the sweep says once that it cannot run).
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub orphaned_load_balancer_sweep_period: Duration,

    /// Serve the Services of this `spec.loadBalancerClass` (repeatable, or comma-separated), and by
    /// default no classless ones. Without it, classless Services only (upstream's choice). A Service
    /// this manager does not serve is never touched: not its finalizer, not its status. Not in
    /// upstream.
    #[arg(
        long = "load-balancer-class",
        value_name = "CLASS",
        value_delimiter = ','
    )]
    pub load_balancer_classes: Vec<String>,

    /// Serve classless `type: LoadBalancer` Services too. Default: true without
    /// --load-balancer-class, false with it. Not in upstream.
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true")]
    pub serve_classless_load_balancers: Option<bool>,

    /// How often each load balancer the controller synced is checked against the cloud for drift (a
    /// read-only preview of what an ensure would change), the checks spread evenly over the period;
    /// `0s` turns the checks off. Not in upstream.
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub load_balancer_drift_period: Duration,

    /// What a drift leads to: `heal` (a Warning event `LoadBalancerDrift`, then the load balancer is
    /// ensured again) or `report` (the event only). Not in upstream.
    #[arg(long, value_enum, default_value = "heal")]
    pub load_balancer_drift: crate::controllers::service::DriftAction,
}

/// The node-route controller.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Route controller")]
pub struct RouteControllerOptions {
    /// Whether the cloud's routes for pod CIDRs are configured (needs --cluster-cidr when the cloud
    /// offers routes).
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    pub configure_cloud_routes: bool,

    /// The period for reconciling routes created for nodes by the cloud provider.
    #[arg(long, default_value = "10s", value_parser = positive_go_duration)]
    pub route_reconciliation_period: Duration,
}

/// The node-IPAM controller (node-ipam-controller, alias nodeipam).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Node IPAM")]
pub struct NodeIpamOptions {
    /// Whether pod CIDRs are allocated to nodes from --cluster-cidr.
    #[arg(long, action = ArgAction::Set, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub allocate_node_cidrs: bool,

    /// The CIDR allocator; only RangeAllocator is supported.
    #[arg(long, default_value = "RangeAllocator", value_parser = ["RangeAllocator"])]
    pub cidr_allocator_type: String,

    /// Mask size of a node's CIDR in a single-stack cluster (0: 24 for IPv4, 64 for IPv6).
    #[arg(long, default_value_t = 0)]
    pub node_cidr_mask_size: u8,

    /// Mask size of a node's IPv4 CIDR in a dual-stack cluster.
    #[arg(long = "node-cidr-mask-size-ipv4", default_value_t = 24)]
    pub node_cidr_mask_size_ipv4: u8,

    /// Mask size of a node's IPv6 CIDR in a dual-stack cluster.
    #[arg(long = "node-cidr-mask-size-ipv6", default_value_t = 64)]
    pub node_cidr_mask_size_ipv6: u8,

    /// The Services' cluster IP range(s) (primary, and secondary for dual-stack); node CIDRs never
    /// overlap them.
    #[arg(long, default_value = "")]
    pub service_cluster_ip_range: String,
}

/// How the manager talks to the API server.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes client")]
pub struct ClientOptions {
    /// Path to a kubeconfig file with authorization and master location information. With neither this
    /// nor --master, the in-cluster service-account configuration is used. Also read from $KUBECONFIG.
    #[arg(long, env = "KUBECONFIG", default_value = "", value_hint = clap::ValueHint::FilePath)]
    pub kubeconfig: String,

    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, default_value = "")]
    pub master: String,

    /// QPS of each controller's client (and of the event client) talking to the API server. 0 or less
    /// turns the client-side limit off (the API server's priority and fairness still protects it).
    /// Upstream's default is 20, which alone makes a 5,000-node cluster take over 8 minutes to initialize
    /// (2 writes per node on the node controller's client); at 200 it takes under a minute.
    #[arg(long, default_value_t = 200.0, value_parser = kube_api_qps)]
    pub kube_api_qps: f32,

    /// Burst to use while talking with the API server (upstream's default is 30).
    #[arg(long, default_value_t = 400)]
    pub kube_api_burst: u32,

    /// How the manager reads from the API server, as upstream's flag. With protobuf (the default, as
    /// upstream's) the Node and Service caches list and watch in protobuf where the API server offers
    /// it, which costs the API server half or less of what the same reads cost it in JSON; every other
    /// read and every write is JSON.
    #[arg(long, value_enum, default_value_t = KubeApiContentType::Protobuf)]
    pub kube_api_content_type: KubeApiContentType,
}

/// The longest time the client's token bucket may take to refill: Go's longest duration, 2^63 ns (the
/// rate limiter counts nanoseconds in 64 bits, and panics past about twice this).
const MAX_BUCKET_REFILL_SECONDS: f64 = i64::MAX as f64 / 1e9;

/// `--kube-api-qps`: a number; 0 or less turns the limit off, and a positive rate must allow one request
/// within Go's longest duration (a smaller one made the rate limiter panic at start).
fn kube_api_qps(text: &str) -> Result<f32, String> {
    let qps: f32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !qps.is_finite() {
        return Err(format!(
            "{text:?} is not a finite number (0 or less turns the limit off)"
        ));
    }
    if qps > 0.0 && 1.0 / f64::from(qps) > MAX_BUCKET_REFILL_SECONDS {
        return Err(format!(
            "{text:?} is below one request per 2562047h (use 0 or less to turn the limit off)"
        ));
    }
    Ok(qps)
}

impl ClientOptions {
    /// `--kube-api-burst` requests must refill at `--kube-api-qps` within Go's longest duration, about
    /// 292 years (more overflowed the rate limiter's nanoseconds: a panic at start).
    pub fn validate(&self) -> Result<(), FlagsError> {
        if self.kube_api_qps > 0.0 {
            let refill = f64::from(self.kube_api_burst.max(1)) / f64::from(self.kube_api_qps);
            if refill > MAX_BUCKET_REFILL_SECONDS {
                return Err(FlagsError::BurstRefillTooLong {
                    burst: self.kube_api_burst,
                    qps: self.kube_api_qps,
                    refill,
                });
            }
        }
        Ok(())
    }
}

impl Options {
    /// The checks that involve several flags (clap checks each flag alone): leader election's and the
    /// client's. The network flags are checked at start against the controllers that run.
    pub fn validate(&self) -> Result<(), FlagsError> {
        self.leader_election.validate()?;
        self.client.validate()
    }
}

/// Log output.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Logging")]
pub struct LoggingOptions {
    /// Log level verbosity, as klog's: 0-1 info, 2-4 debug, 5 and more trace. RUST_LOG, when set,
    /// takes precedence.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub logging_format: LogFormat,
}

/// The log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(
            std::iter::once("cloud-controller-manager").chain(args.iter().copied()),
        )
    }

    #[test]
    fn the_command_is_well_formed() {
        Options::command().debug_assert();
    }

    #[test]
    fn defaults_match_upstream_where_they_should() {
        // SAFETY of the test: KUBECONFIG may be set in a developer's shell; only check what it can't touch.
        let options = parse(&[]).unwrap();
        assert_eq!(options.generic.controllers, ["*"]);
        assert!(!options.generic.dry_run);
        assert!(parse(&["--dry-run"]).unwrap().generic.dry_run);
        assert!(!parse(&["--dry-run=false"]).unwrap().generic.dry_run);
        assert!(!options.generic.use_service_account_credentials);
        for (text, want) in [
            ("--use-service-account-credentials", true),
            ("--use-service-account-credentials=true", true),
            ("--use-service-account-credentials=T", true),
            ("--use-service-account-credentials=1", true),
            ("--use-service-account-credentials=false", false),
            ("--use-service-account-credentials=0", false),
        ] {
            let options = parse(&[text]).unwrap();
            assert_eq!(
                options.generic.use_service_account_credentials, want,
                "{text}"
            );
        }
        assert!(parse(&["--use-service-account-credentials=yes"]).is_err());
        assert_eq!(options.cloud.cloud_provider, "");
        assert_eq!(options.cloud.cloud_config, "");
        assert!(!options.cloud.allow_untagged_cloud);
        assert_eq!(options.client.master, "");
        assert_eq!(options.logging.logging_format, LogFormat::Text);
        assert_eq!(options.node.concurrent_node_syncs, 16);
        assert_eq!(options.node.status_workers(), 16);
        assert_eq!(
            options.node.node_status_update_frequency,
            Duration::from_secs(300)
        );
        assert_eq!(options.node.node_monitor_period, Duration::from_secs(5));
        assert_eq!(options.service.concurrent_service_syncs, 16);
        assert_eq!(
            options.service.orphaned_load_balancer_sweep_period,
            Duration::from_secs(300)
        );
        let le = &options.leader_election;
        assert!(le.leader_elect);
        assert_eq!(
            (
                le.leader_elect_lease_duration,
                le.leader_elect_renew_deadline,
                le.leader_elect_retry_period
            ),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        assert_eq!(le.leader_elect_resource_lock, "leases");
        assert_eq!(le.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(le.leader_elect_resource_namespace, "kube-system");
        assert!(le.validate().is_ok());
        assert_eq!(options.serving.secure_port, 10258);
        assert_eq!(options.serving.bind_address.to_string(), "0.0.0.0");
        assert_eq!(
            options.serving.authorization_always_allow_paths,
            ["/healthz", "/readyz", "/livez"]
        );
        assert_eq!(options.cloud.cluster_name, "kubernetes");
        assert_eq!(options.cloud.cluster_cidr, "");
        assert!(options.route.configure_cloud_routes);
        assert_eq!(
            options.route.route_reconciliation_period,
            Duration::from_secs(10)
        );
        assert!(!options.ipam.allocate_node_cidrs);
        assert_eq!(options.ipam.cidr_allocator_type, "RangeAllocator");
        assert_eq!(
            (
                options.ipam.node_cidr_mask_size,
                options.ipam.node_cidr_mask_size_ipv4,
                options.ipam.node_cidr_mask_size_ipv6
            ),
            (0, 24, 64)
        );
    }

    #[test]
    fn node_controller_flags() {
        let options = parse(&[
            "--concurrent-node-syncs=4",
            "--concurrent-node-status-updates=2",
            "--node-status-update-frequency=1m30s",
            "--node-monitor-period=500ms",
        ])
        .unwrap();
        assert_eq!(options.node.concurrent_node_syncs, 4);
        assert_eq!(options.node.status_workers(), 2);
        assert_eq!(
            options.node.node_status_update_frequency,
            Duration::from_secs(90)
        );
        assert_eq!(options.node.node_monitor_period, Duration::from_millis(500));
        assert_eq!(
            options.node.lifecycle_workers(),
            4,
            "--concurrent-node-syncs"
        );
        let options = parse(&["--concurrent-node-lifecycle-syncs=3"]).unwrap();
        assert_eq!(options.node.lifecycle_workers(), 3);
        let err = parse(&["--concurrent-node-lifecycle-syncs=0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--concurrent-node-lifecycle-syncs"), "{err}");
        // Zero workers is the upstream trap of a controller that silently does nothing.
        let err = parse(&["--concurrent-node-syncs=0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--concurrent-node-syncs"), "{err}");
        let err = parse(&["--node-monitor-period=soon"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid duration"), "{err}");
        assert!(parse(&["--node-monitor-period=0"]).is_err());
    }

    #[test]
    fn booleans_take_go_s_spellings() {
        for (text, want) in [
            ("1", true),
            ("T", true),
            ("True", true),
            ("0", false),
            ("F", false),
            ("FALSE", false),
        ] {
            let options =
                parse(&["--cloud-provider=fake", &format!("--leader-elect={text}")]).unwrap();
            assert_eq!(options.leader_election.leader_elect, want, "{text}");
        }
        let err = parse(&["--cloud-provider=fake", "--leader-elect=yes"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid value 'yes' for '--leader-elect"),
            "{err}"
        );
        assert!(err.contains("not a boolean"), "{err}");
    }

    #[test]
    fn both_flag_forms_and_go_style_booleans_work() {
        let options = parse(&[
            "--cloud-provider=fake",
            "--cloud-config",
            "/etc/cloud.yaml",
            "--controllers=*,-route",
            "--controllers",
            "-service",
            "--allow-untagged-cloud",
            "--kube-api-qps=20",
            "--kube-api-burst=30",
            "-v",
            "4",
        ])
        .unwrap();
        assert_eq!(options.cloud.cloud_provider, "fake");
        assert_eq!(options.cloud.cloud_config, "/etc/cloud.yaml");
        assert_eq!(options.generic.controllers, ["*", "-route", "-service"]);
        assert!(options.cloud.allow_untagged_cloud);
        assert_eq!(options.client.kube_api_qps, 20.0);
        assert_eq!(options.client.kube_api_burst, 30);
        assert_eq!(options.logging.verbosity, 4);
        assert!(
            !parse(&["--allow-untagged-cloud=false"])
                .unwrap()
                .cloud
                .allow_untagged_cloud
        );
    }

    #[test]
    fn leader_election_flags_are_checked_as_client_go_does() {
        let options = parse(&[
            "--leader-elect-lease-duration=10s",
            "--leader-elect-renew-deadline=10s",
        ])
        .unwrap();
        assert!(
            options
                .leader_election
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--leader-elect-lease-duration")
        );
        let options = parse(&[
            "--leader-elect-renew-deadline=2s",
            "--leader-elect-retry-period=2s",
        ])
        .unwrap();
        assert!(
            options
                .leader_election
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--leader-elect-renew-deadline")
        );
        let options = parse(&["--leader-elect=false", "--leader-elect-renew-deadline=1s"]).unwrap();
        assert!(
            options.leader_election.validate().is_ok(),
            "not checked when off"
        );
        assert!(parse(&["--leader-elect-resource-lock=endpoints"]).is_err());
        assert!(
            parse(&["--tls-cert-file=/x.crt"]).is_err(),
            "needs the key too"
        );
    }

    #[test]
    fn a_tiny_or_non_finite_qps_is_refused_not_a_panic_later() {
        // 1e-20 QPS is one request per 3e12 years: the rate limiter's Duration::from_secs_f64 panicked.
        for qps in ["1e-20", "1e-40", "NaN", "inf", "-inf", "fast", ""] {
            let err = parse(&[&format!("--kube-api-qps={qps}")])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--kube-api-qps"), "{qps}: {err}");
        }
        for qps in ["0", "-1", "0.5", "200", "1e-9"] {
            assert!(parse(&[&format!("--kube-api-qps={qps}")]).is_ok(), "{qps}");
        }
        // A burst that takes longer than Go's longest duration to refill overflowed the limiter.
        let options = parse(&["--kube-api-qps=1e-9", "--kube-api-burst=400"]).unwrap();
        let err = options.validate().unwrap_err().to_string();
        assert!(
            err.contains("--kube-api-burst=400") && err.contains("--kube-api-qps"),
            "{err}"
        );
        let options = parse(&["--kube-api-qps=0.1", "--kube-api-burst=4294967295"]).unwrap();
        assert!(options.validate().is_err());
        for args in [
            &["--kube-api-qps=0.1", "--kube-api-burst=1000"][..],
            &["--kube-api-qps=0", "--kube-api-burst=4294967295"],
            &["--kube-api-qps=1e-9", "--kube-api-burst=1"],
            &[],
        ] {
            let options = parse(args).unwrap();
            assert_eq!(options.validate(), Ok(()), "{args:?}");
            let _ = crate::app::rate_limit::RateLimitLayer::new(
                options.client.kube_api_qps,
                options.client.kube_api_burst,
            );
        }
    }

    /// Azure's `--node-filter-requirements` is `--node-selector` by another name: the same label
    /// selector; both at once is an error naming both.
    #[test]
    fn node_filter_requirements_is_an_alias_of_node_selector() {
        use crate::node_selector::NodeSelector;
        let selector = |args: &[&str]| parse(args).map(|o| o.cloud.node_selector().clone());
        assert_eq!(selector(&[]).unwrap(), NodeSelector::default());
        for text in [
            "environment=production",
            "!maintenance",
            "environment=production,tier=frontend",
            "environment in (production,staging)",
            "app=web,environment in (prod,staging),!maintenance",
        ] {
            let expected = NodeSelector::parse(text).unwrap();
            assert_eq!(
                selector(&[&format!("--node-filter-requirements={text}")]).unwrap(),
                expected,
                "{text}"
            );
            assert_eq!(
                selector(&[&format!("--node-selector={text}")]).unwrap(),
                expected,
                "{text}"
            );
        }
        let err = parse(&["--node-filter-requirements=a in (b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--node-filter-requirements"), "{err}");
        for args in [
            ["--node-selector=a=b", "--node-filter-requirements=a=b"],
            ["--node-filter-requirements=a=b", "--node-selector=c"],
        ] {
            let err = parse(&args).unwrap_err().to_string();
            assert!(
                err.contains("--node-selector") && err.contains("--node-filter-requirements"),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn tls_curve_preferences_take_go_s_curve_ids() {
        use super::super::tls_curves::TlsCurves;
        let options = parse(&[]).unwrap();
        assert_eq!(options.serving.tls_curve_preferences, TlsCurves::default());
        let options = parse(&["--tls-curve-preferences=23,29"]).unwrap();
        assert_eq!(
            options.serving.tls_curve_preferences,
            TlsCurves::parse("29,23").unwrap()
        );
        let err = parse(&["--tls-curve-preferences=23,25"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--tls-curve-preferences") && err.contains("25 (P-521) is not offered"),
            "{err}"
        );
    }

    #[test]
    fn malformed_flags_are_rejected() {
        assert!(parse(&["--kube-api-qps=fast"]).is_err());
        assert!(parse(&["--no-such-flag"]).is_err());
        assert!(parse(&["positional"]).is_err());
        assert!(parse(&["--logging-format=xml"]).is_err());
    }
}
