//! The cloud-config: upstream's (cloud-provider-kubevirt's `CloudConfig`), key for key and with its
//! defaults, parsed once into types. Unlike upstream (whose YAML reader drops keys it does not know and
//! turns a poll interval of 0 into the default without a word), an unknown key or a value we cannot
//! use is refused, naming it.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use cloud_provider::labels::{check_dns_label, check_label_value, check_qualified_name};
use serde::Deserialize;

/// Upstream's `creationPollInterval` default, in seconds.
pub const DEFAULT_CREATION_POLL_INTERVAL_SECS: u64 = 5;
/// Upstream's `creationPollTimeout` default, in seconds.
pub const DEFAULT_CREATION_POLL_TIMEOUT_SECS: u64 = 300;
/// The infra client's default request rate (controller-runtime's client default, upstream's client).
pub const DEFAULT_INFRA_QPS: f32 = 20.0;
/// The infra client's default burst (controller-runtime's default).
pub const DEFAULT_INFRA_BURST: u32 = 30;

/// The labels upstream puts on an infra Service, which `infraLabels` may not replace (the mirroring
/// controller and the orphan sweep find the Services by them).
pub const RESERVED_INFRA_LABELS: [&str; 3] = [
    crate::load_balancer::TENANT_SERVICE_NAME_LABEL,
    crate::load_balancer::TENANT_SERVICE_NAMESPACE_LABEL,
    crate::load_balancer::TENANT_CLUSTER_NAME_LABEL,
];

/// The cloud-config file as written (upstream's keys).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    /// The infra cluster's kubeconfig (a path); empty: the pod's own service account (in-cluster).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The load-balancer interface.
    #[serde(default)]
    pub load_balancer: FileLoadBalancer,
    /// The instances interface.
    #[serde(default)]
    pub instances_v2: FileInstancesV2,
    /// The infra namespace the VMIs and the load balancers' Services live in.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Labels added to every infra Service.
    #[serde(default)]
    pub infra_labels: BTreeMap<String, String>,
    /// Ours: the infra client's request budget.
    #[serde(default)]
    pub infra_client: FileInfraClient,
}

/// `loadBalancer:` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileLoadBalancer {
    /// Upstream's `enabled` (default true).
    pub enabled: Option<bool>,
    /// Seconds between looks at a new infra Service for its address (default 5).
    pub creation_poll_interval: Option<i64>,
    /// Seconds a new infra Service may go without an address before it is reported as failing
    /// (default 300).
    pub creation_poll_timeout: Option<i64>,
    /// Infra Services without a selector: their endpoints are somebody else's to write.
    pub selectorless: Option<bool>,
    /// Mirror the tenant's endpoints for `externalTrafficPolicy: Local` Services (the `kubevirt-eps`
    /// controller).
    #[serde(rename = "enableEPSController")]
    pub enable_eps_controller: Option<bool>,
}

/// `instancesV2:` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileInstancesV2 {
    /// Upstream's `enabled` (default true).
    pub enabled: Option<bool>,
    /// Region and zone from the infra node that runs the VMI (default true).
    pub zone_and_region_enabled: Option<bool>,
}

/// `infraClient:` as written (ours).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileInfraClient {
    /// Requests per second to the infra API server (default 20).
    pub qps: Option<f32>,
    /// Requests allowed at once above the rate (default 30).
    pub burst: Option<u32>,
}

/// The cloud-config in force, checked and with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The infra kubeconfig; `None`: in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// The namespace as written (`None`: from the kubeconfig's context, else the pod's own).
    pub namespace: Option<String>,
    /// The load-balancer settings; `None` when `loadBalancer.enabled: false`.
    pub load_balancer: Option<LoadBalancerConfig>,
    /// The instance settings; `None` when `instancesV2.enabled: false`.
    pub instances: Option<InstancesConfig>,
    /// The infra client's budget.
    pub infra_qps: f32,
    /// The infra client's burst.
    pub infra_burst: u32,
}

/// What the load balancers do.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadBalancerConfig {
    /// Between looks at a new infra Service for its address.
    pub creation_poll_interval: Duration,
    /// How long a new infra Service may go without an address before that is an error.
    pub creation_poll_timeout: Duration,
    /// Infra Services without a selector.
    pub selectorless: bool,
    /// The endpoint-mirroring controller runs, and `externalTrafficPolicy: Local` infra Services have
    /// no selector.
    pub eps_controller: bool,
    /// Labels added to every infra Service.
    pub infra_labels: BTreeMap<String, String>,
}

/// What the instances do.
#[derive(Debug, Clone, PartialEq)]
pub struct InstancesConfig {
    /// Region and zone from the infra node.
    pub zone_and_region: bool,
}

impl Config {
    /// Parses and checks the cloud-config text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, crate::Error> {
        let malformed = |message: String| crate::Error::Config {
            source_name: source.to_owned(),
            message,
        };
        // The parser is a dependency: a panic in it must become an error naming the file, not a crash.
        let file = std::panic::catch_unwind(|| serde_saphyr::from_str::<Option<FileConfig>>(text))
            .map_err(|_| malformed("the YAML parser failed on it".to_owned()))?
            .map_err(|err| malformed(err.to_string()))?
            .unwrap_or_default();
        Self::from_file(file).map_err(malformed)
    }

    /// Fills in the defaults and checks what the types cannot.
    pub fn from_file(file: FileConfig) -> Result<Self, String> {
        let seconds = |key: &str, value: Option<i64>, default: u64| match value {
            None => Ok(Duration::from_secs(default)),
            Some(v) if v > 0 => Ok(Duration::from_secs(v as u64)),
            Some(v) => Err(format!(
                "loadBalancer.{key}: {v} is not a number of seconds above 0 (leave it out for {default})"
            )),
        };
        let lb = &file.load_balancer;
        let creation_poll_interval = seconds(
            "creationPollInterval",
            lb.creation_poll_interval,
            DEFAULT_CREATION_POLL_INTERVAL_SECS,
        )?;
        let creation_poll_timeout = seconds(
            "creationPollTimeout",
            lb.creation_poll_timeout,
            DEFAULT_CREATION_POLL_TIMEOUT_SECS,
        )?;
        if creation_poll_timeout < creation_poll_interval {
            return Err(format!(
                "loadBalancer.creationPollTimeout ({}s) is shorter than loadBalancer.creationPollInterval ({}s)",
                creation_poll_timeout.as_secs(),
                creation_poll_interval.as_secs()
            ));
        }
        for (key, value) in &file.infra_labels {
            if RESERVED_INFRA_LABELS.contains(&key.as_str()) {
                return Err(format!(
                    "infraLabels: {key:?} is the label the provider finds its infra Services by; it cannot be set here"
                ));
            }
            check_qualified_name(key).map_err(|why| format!("infraLabels: key {key:?}: {why}"))?;
            check_label_value(value)
                .map_err(|why| format!("infraLabels: value {value:?} of {key:?}: {why}"))?;
        }
        if let Some(namespace) = &file.namespace {
            check_dns_label(namespace).map_err(|why| format!("namespace: {namespace:?}: {why}"))?;
        }
        if let Some(path) = &file.kubeconfig
            && path.as_os_str().is_empty()
        {
            return Err("kubeconfig: an empty path (leave the key out to run in-cluster)".into());
        }
        let qps = file.infra_client.qps.unwrap_or(DEFAULT_INFRA_QPS);
        if !(qps.is_finite() && qps > 0.0) {
            return Err(format!("infraClient.qps: {qps} is not a rate above 0"));
        }
        let burst = file.infra_client.burst.unwrap_or(DEFAULT_INFRA_BURST);
        if burst == 0 {
            return Err("infraClient.burst: 0 lets no request through (at least 1)".into());
        }
        let load_balancer = lb.enabled.unwrap_or(true).then(|| LoadBalancerConfig {
            creation_poll_interval,
            creation_poll_timeout,
            selectorless: lb.selectorless.unwrap_or(false),
            eps_controller: lb.enable_eps_controller.unwrap_or(false),
            infra_labels: file.infra_labels.clone(),
        });
        let instances = file
            .instances_v2
            .enabled
            .unwrap_or(true)
            .then(|| InstancesConfig {
                zone_and_region: file.instances_v2.zone_and_region_enabled.unwrap_or(true),
            });
        Ok(Self {
            kubeconfig: file.kubeconfig,
            namespace: file.namespace,
            load_balancer,
            instances,
            infra_qps: qps,
            infra_burst: burst,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, "cloud.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_file_is_upstreams_defaults() {
        let config = parse("").unwrap();
        assert_eq!(
            config,
            Config {
                kubeconfig: None,
                namespace: None,
                load_balancer: Some(LoadBalancerConfig {
                    creation_poll_interval: Duration::from_secs(5),
                    creation_poll_timeout: Duration::from_secs(300),
                    selectorless: false,
                    eps_controller: false,
                    infra_labels: BTreeMap::new(),
                }),
                instances: Some(InstancesConfig {
                    zone_and_region: true
                }),
                infra_qps: DEFAULT_INFRA_QPS,
                infra_burst: DEFAULT_INFRA_BURST,
            }
        );
    }

    #[test]
    fn upstreams_shipped_files_parse() {
        // config/default/cloud-config and config/isolated/cloud-config at upstream 1178e8b.
        let default = parse(
            "loadBalancer:\n  creationPollInterval: 5\n  creationPollTimeout: 60\nnamespace: kvcluster\n",
        )
        .unwrap();
        assert_eq!(default.namespace.as_deref(), Some("kvcluster"));
        assert_eq!(
            default.load_balancer.unwrap().creation_poll_timeout,
            Duration::from_secs(60)
        );
        let isolated = parse(
            "loadBalancer:\n  creationPollInterval: 5\n  creationPollTimeout: 60\nnamespace: kvcluster\n\
             instancesV2:\n  enabled: true\n  zoneAndRegionEnabled: false\n",
        )
        .unwrap();
        assert_eq!(
            isolated.instances,
            Some(InstancesConfig {
                zone_and_region: false
            })
        );
    }

    #[test]
    fn every_key_is_read() {
        let config = parse(
            "kubeconfig: /etc/infra/kubeconfig\nnamespace: tenant-a\n\
             loadBalancer:\n  enabled: true\n  creationPollInterval: 2\n  creationPollTimeout: 30\n  selectorless: true\n  enableEPSController: true\n\
             instancesV2:\n  enabled: true\n  zoneAndRegionEnabled: false\n\
             infraLabels:\n  team: blue\n  example.com/tier: edge\n\
             infraClient:\n  qps: 50\n  burst: 100\n",
        )
        .unwrap();
        assert_eq!(
            config.kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/infra/kubeconfig"))
        );
        let lb = config.load_balancer.unwrap();
        assert_eq!(lb.creation_poll_interval, Duration::from_secs(2));
        assert!(lb.selectorless && lb.eps_controller);
        assert_eq!(lb.infra_labels.len(), 2);
        assert_eq!((config.infra_qps, config.infra_burst), (50.0, 100));
    }

    #[test]
    fn the_shipped_example_parses() {
        let example = parse(include_str!("../cloud-config.example.yaml")).unwrap();
        assert_eq!(example.namespace.as_deref(), Some("tenant-a"));
        assert!(example.load_balancer.unwrap().eps_controller);
    }

    #[test]
    fn interfaces_switched_off() {
        let config =
            parse("loadBalancer:\n  enabled: false\ninstancesV2:\n  enabled: false\n").unwrap();
        assert_eq!(config.load_balancer, None);
        assert_eq!(config.instances, None);
    }

    #[test]
    fn bad_input_is_refused_naming_it() {
        for (text, expected) in [
            ("loadbalancer:\n  enabled: true\n", "loadbalancer"),
            ("loadBalancer:\n  enable: true\n", "enable"),
            ("instancesV2:\n  zoneAndRegion: true\n", "zoneAndRegion"),
            (
                "loadBalancer:\n  creationPollInterval: 0\n",
                "loadBalancer.creationPollInterval: 0",
            ),
            (
                "loadBalancer:\n  creationPollTimeout: -5\n",
                "loadBalancer.creationPollTimeout: -5",
            ),
            (
                "loadBalancer:\n  creationPollInterval: 10\n  creationPollTimeout: 5\n",
                "shorter than",
            ),
            ("loadBalancer:\n  creationPollInterval: soon\n", "soon"),
            ("namespace: Tenant_A\n", "namespace: \"Tenant_A\""),
            (
                "infraLabels:\n  cluster.x-k8s.io/cluster-name: other\n",
                "finds its infra Services by",
            ),
            ("infraLabels:\n  \"bad key!\": x\n", "key \"bad key!\""),
            ("infraLabels:\n  team: \"-blue\"\n", "value \"-blue\""),
            ("kubeconfig: \"\"\n", "kubeconfig: an empty path"),
            ("infraClient:\n  qps: 0\n", "infraClient.qps"),
            ("infraClient:\n  burst: 0\n", "infraClient.burst"),
            ("loadBalancer: [1, 2]\n", "cloud.yaml"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(
                err.contains(expected) && err.contains("cloud.yaml"),
                "{text:?}: {err}"
            );
        }
    }
}
