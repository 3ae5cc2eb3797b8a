//! The command line: upstream's flag names and defaults, grouped by what they configure.
//!
//! Flags are added as the features behind them land; a flag is never accepted and ignored.

use clap::{ArgAction, Args, Parser, ValueEnum};

/// The Kubernetes cloud-controller-manager.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cloud-controller-manager",
    version,
    about = "The Kubernetes cloud controller manager: runs the controllers that tie a cluster to its cloud.",
    long_about = None,
    // Go's flag package accepts `-flag` as well as `--flag`; clap only `--flag`. Users copy upstream
    // manifests, which use `--flag`, so that is what we support.
)]
pub struct Options {
    /// Which controllers run.
    #[command(flatten)]
    pub generic: GenericOptions,
    /// Which cloud, configured how.
    #[command(flatten)]
    pub cloud: CloudProviderOptions,
    /// How the manager talks to the API server.
    #[command(flatten)]
    pub client: ClientOptions,
    /// Log output.
    #[command(flatten)]
    pub logging: LoggingOptions,
}

/// Which controllers run.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Generic")]
pub struct GenericOptions {
    /// Controllers to enable: '*' enables all on-by-default controllers, 'foo' enables the controller
    /// named 'foo', '-foo' disables it. The first mention of a controller wins. Known names:
    /// cloud-node-controller (cloud-node), cloud-node-lifecycle-controller (cloud-node-lifecycle),
    /// service-lb-controller (service), node-route-controller (route).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "*",
        allow_hyphen_values = true
    )]
    pub controllers: Vec<String>,
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

    /// Allow the cluster to run without the cluster-id on cloud instances (deprecated upstream, kept for
    /// compatibility): without it, a cloud that reports no cluster ID is fatal.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub allow_untagged_cloud: bool,
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

    /// QPS to use while talking with the API server. 0 or less turns the client-side limit off (the API
    /// server's priority and fairness still protects it). Upstream's default is 20; ours is higher so a
    /// large cluster is not throttled by the client.
    #[arg(long, default_value_t = 100.0)]
    pub kube_api_qps: f32,

    /// Burst to use while talking with the API server (upstream's default is 30).
    #[arg(long, default_value_t = 200)]
    pub kube_api_burst: u32,
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
        assert_eq!(options.cloud.cloud_provider, "");
        assert_eq!(options.cloud.cloud_config, "");
        assert!(!options.cloud.allow_untagged_cloud);
        assert_eq!(options.client.master, "");
        assert_eq!(options.logging.logging_format, LogFormat::Text);
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
    fn malformed_flags_are_rejected() {
        assert!(parse(&["--kube-api-qps=fast"]).is_err());
        assert!(parse(&["--no-such-flag"]).is_err());
        assert!(parse(&["positional"]).is_err());
        assert!(parse(&["--logging-format=xml"]).is_err());
    }
}
