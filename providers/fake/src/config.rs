//! The fake cloud's configuration: the YAML `--cloud-config` file. Every key is documented in
//! `cloud-config.example.yaml` beside this crate; they are part of the project's public interface.
//!
//! Values are checked while they are read, so a bad value is reported with its line and column.

use std::{
    collections::BTreeMap,
    fmt,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

pub use cloud_provider::config_values::{AddressConfig, AddressType, GoDuration};
use cloud_provider::panic_message;
use serde::{Deserialize, Deserializer, de};

/// Every method a failure can be injected into: upstream's method names in snake_case.
pub const METHODS: &[&str] = &[
    "get_load_balancer",
    "ensure_load_balancer",
    "update_load_balancer",
    "ensure_load_balancer_deleted",
    "retain_load_balancer",
    "preview_load_balancer",
    "list_load_balancers",
    "delete_orphaned_load_balancer",
    "node_addresses",
    "node_addresses_by_provider_id",
    "instance_id",
    "instance_type",
    "instance_type_by_provider_id",
    "instance_exists_by_provider_id",
    "instance_shutdown_by_provider_id",
    "instance_exists",
    "instance_shutdown",
    "instance_metadata",
    "get_zone",
    "get_zone_by_provider_id",
    "get_zone_by_node_name",
    "list_routes",
    "create_route",
    "delete_route",
];

/// How often the state file's background writer runs unless `stateFileFlushInterval` says otherwise.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(200);

/// The parsed cloud-config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Where the cloud-side state is written as JSON after every change.
    pub state_file: Option<PathBuf>,
    /// `true`: changes reach the state file within `stateFileFlushInterval` (from a background writer,
    /// as call counts always do) instead of before the call returns. For runs with thousands of
    /// load-balancer backends, where rewriting the whole file on every change would cost more than the
    /// manager under test.
    pub state_file_batched: bool,
    /// How often the background writer puts what changed (call counts; with `stateFileBatched`
    /// everything) into the state file: 200ms by default. More than 0.
    pub state_file_flush_interval: Option<GoDuration>,
    /// `true`: the state file is the cloud, shared by every process that names it: read back at start
    /// (so the cloud outlives the manager) and re-read whenever another process changed it, with every
    /// change made under an exclusive lock on `<stateFile>.lock`. Needs `stateFile`; cannot be combined
    /// with `stateFileBatched`. Read at start only.
    pub state_file_shared: bool,
    /// Added to every cloud call.
    pub latency: GoDuration,
    /// Injected failure probability per method (or `all`), from 0 to 1.
    pub failure_rate: BTreeMap<MethodName, Probability>,
    /// Injected panics, a provider's bug for the manager's panic handling to meet: the first this many
    /// calls of a method (or `all`) about each object (a Service's `namespace/name`; calls about no
    /// object count together) panic.
    pub panic_first_calls: BTreeMap<MethodName, u64>,
    /// Seed of the deterministic failure sequence.
    pub seed: u64,
    /// When set, injected failures are "retry after this delay" errors (a load balancer still
    /// provisioning, say) instead of plain errors.
    pub retry_after: Option<GoDuration>,
    /// `true` (default): the cloud offers InstancesV2. `false`: the legacy Instances and Zones APIs.
    #[serde(rename = "instancesV2")]
    pub instances_v2: bool,
    /// Whether the cloud knows the cluster's ID (default `true`).
    #[serde(rename = "hasClusterID")]
    pub has_cluster_id: bool,
    /// The fields of every instance not listed under `instances`.
    pub instance_defaults: InstanceDefaults,
    /// Instances by node name.
    pub instances: BTreeMap<String, InstanceConfig>,
    /// The load-balancer part.
    pub load_balancers: LoadBalancersConfig,
    /// The routes part.
    pub routes: RoutesConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            state_file: None,
            state_file_batched: false,
            state_file_flush_interval: None,
            state_file_shared: false,
            latency: GoDuration::default(),
            failure_rate: BTreeMap::new(),
            panic_first_calls: BTreeMap::new(),
            seed: 0,
            retry_after: None,
            instances_v2: true,
            has_cluster_id: true,
            instance_defaults: InstanceDefaults::default(),
            instances: BTreeMap::new(),
            load_balancers: LoadBalancersConfig::default(),
            routes: RoutesConfig::default(),
        }
    }
}

/// The fields of an instance that is not listed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceDefaults {
    /// Default `standard`.
    pub instance_type: String,
    /// Default `zone-a`.
    pub zone: String,
    /// Default `region-1`.
    pub region: String,
}

impl Default for InstanceDefaults {
    fn default() -> Self {
        Self {
            instance_type: "standard".to_owned(),
            zone: "zone-a".to_owned(),
            region: "region-1".to_owned(),
        }
    }
}

/// A listed instance; unset fields come from `instanceDefaults`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceConfig {
    /// Default `fake://<node name>`.
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    /// Instance type.
    pub instance_type: Option<String>,
    /// Zone.
    pub zone: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Default: one InternalIP derived from the node name.
    pub addresses: Option<Vec<AddressConfig>>,
    /// Extra labels for the node.
    pub additional_labels: BTreeMap<String, String>,
    /// `running` (default), `shutdown` or `gone`.
    pub state: InstanceState,
    /// Added to every call about this instance (`instance_metadata`, `instance_exists`, the legacy
    /// Instances and Zones calls by its name or provider ID), on top of the cloud-wide `latency`: a
    /// slow part of the cloud. Default: 0.
    pub latency: GoDuration,
}

/// The life state of an instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Exists and runs.
    #[default]
    Running,
    /// Exists but is shut down.
    Shutdown,
    /// Does not exist (any more).
    Gone,
}

/// The load-balancer part.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancersConfig {
    /// Whether the cloud offers load balancers (default `true`).
    pub enabled: bool,
    /// Where ingress IPs come from (default `203.0.113.0/24`).
    pub ip_pool: IpPool,
}

impl Default for LoadBalancersConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ip_pool: IpPool::default(),
        }
    }
}

/// The routes part.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutesConfig {
    /// Whether the cloud offers routes (default `true`).
    pub enabled: bool,
    /// Routes the cloud holds from the start (or from the reload that first lists them).
    pub initial: Vec<RouteConfig>,
}

impl Default for RoutesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            initial: Vec::new(),
        }
    }
}

/// A route in the config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    /// The route's name.
    pub name: String,
    /// Its target node (may be empty).
    #[serde(default)]
    pub target_node: String,
    /// Its destination CIDR.
    #[serde(rename = "destinationCIDR")]
    pub destination_cidr: String,
    /// Whether it is a blackhole route.
    #[serde(default)]
    pub blackhole: bool,
}

/// Why a cloud-config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The YAML is malformed or a value is wrong; the message names the line and column.
    #[error("malformed cloud-config{}: {message}", path_suffix(.path))]
    Malformed {
        /// The file, when known.
        path: Option<PathBuf>,
        /// What is wrong, and where.
        message: String,
    },
}

fn path_suffix(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

impl Config {
    /// Parses the YAML text of a cloud-config; `path` only names the file in errors. Never panics: the
    /// YAML parser is bounded (nesting depth, alias expansion), and should it panic all the same, that
    /// is reported as a malformed file.
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Self, ConfigError> {
        let malformed = |message: String| ConfigError::Malformed {
            path: path.map(Path::to_owned),
            message,
        };
        let config = std::panic::catch_unwind(|| serde_saphyr::from_str::<Option<Config>>(text))
            .map_err(|panic| {
                malformed(format!(
                    "the YAML parser failed on it ({})",
                    panic_message(panic.as_ref())
                ))
            })?
            .map_err(|err| malformed(err.to_string()))?
            .unwrap_or_default();
        config.validate(path)?;
        Ok(config)
    }

    /// How often the background writer flushes the state file (`stateFileFlushInterval`).
    pub fn flush_interval(&self) -> Duration {
        self.state_file_flush_interval
            .map_or(DEFAULT_FLUSH_INTERVAL, |interval| interval.0)
    }

    /// Checks what the types alone cannot: the state-file keys go together. [`Config::parse`] calls it;
    /// [`crate::FakeCloud::new`] calls it for a config built in code.
    pub fn validate(&self, path: Option<&Path>) -> Result<(), ConfigError> {
        let malformed = |message: &str| ConfigError::Malformed {
            path: path.map(Path::to_owned),
            message: message.to_owned(),
        };
        if self.state_file_shared && self.state_file_batched {
            return Err(malformed(
                "stateFileShared and stateFileBatched cannot be combined: a shared state file is \
                 written under its lock before each change returns, a batched one later from a \
                 background writer; turn one of them off",
            ));
        }
        if self
            .state_file_flush_interval
            .is_some_and(|interval| interval.0.is_zero())
        {
            return Err(malformed(
                "stateFileFlushInterval must be more than 0 (the background writer would never rest)",
            ));
        }
        if self.state_file_shared && self.state_file.is_none() {
            return Err(malformed(
                "stateFileShared needs a stateFile (the file the processes share)",
            ));
        }
        Ok(())
    }

    /// Whether a running cloud that started with `self` can switch to `next` (a reload of the file):
    /// the state file cannot be shared or unshared, or moved while shared, without a restart.
    pub fn check_reload(&self, next: &Config) -> Result<(), String> {
        if self.state_file_shared != next.state_file_shared {
            return Err(format!(
                "stateFileShared is read at start only (the running cloud has {}); restart to change it",
                self.state_file_shared
            ));
        }
        if self.state_file_shared && self.state_file != next.state_file {
            return Err(
                "stateFile cannot change while stateFileShared is on; restart to change it"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// Whether the `call`th call (1-based) of `method` about an object panics (`panicFirstCalls`: its
    /// own entry, else `all`).
    pub fn panics_on(&self, method: &str, call: u64) -> bool {
        self.panic_first_calls
            .get(&MethodName(method.to_owned()))
            .or_else(|| self.panic_first_calls.get(&MethodName("all".to_owned())))
            .is_some_and(|first| call <= *first)
    }

    /// The injected failure probability of `method`: its own entry, else `all`, else 0.
    pub fn failure_rate(&self, method: &str) -> f64 {
        self.failure_rate
            .get(&MethodName(method.to_owned()))
            .or_else(|| self.failure_rate.get(&MethodName("all".to_owned())))
            .map_or(0.0, |p| p.0)
    }
}

/// A method name in `failureRate` or `panicFirstCalls`: one of [`METHODS`] or `all`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MethodName(pub String);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if name == "all" || METHODS.contains(&name.as_str()) {
            Ok(Self(name))
        } else {
            Err(de::Error::custom(format!(
                "unknown method {name:?} in failureRate; use \"all\" or one of: {}",
                METHODS.join(", ")
            )))
        }
    }
}

/// A probability from 0 to 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probability(pub f64);

impl<'de> Deserialize<'de> for Probability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let p = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&p) {
            Ok(Self(p))
        } else {
            Err(de::Error::custom(format!(
                "failure rate {p} is not between 0 and 1"
            )))
        }
    }
}

/// An IPv4 pool in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPool {
    network: Ipv4Addr,
    prefix: u8,
}

impl Default for IpPool {
    fn default() -> Self {
        Self {
            network: Ipv4Addr::new(203, 0, 113, 0),
            prefix: 24,
        }
    }
}

impl IpPool {
    /// The usable addresses, lowest first (network and broadcast addresses excluded below /31).
    pub fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + use<> {
        let base = u32::from(self.network);
        let size = 1u64 << (32 - u32::from(self.prefix));
        let (first, last) = if self.prefix >= 31 {
            (0, size - 1)
        } else {
            (1, size - 2)
        };
        (first..=last).map(move |offset| Ipv4Addr::from(base + offset as u32))
    }

    /// Whether `ip` lies in the pool.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        u32::from(ip) & mask == u32::from(self.network)
    }
}

impl FromStr for IpPool {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            format!("invalid ipPool {text:?}: {why} (expected an IPv4 CIDR such as 203.0.113.0/24)")
        };
        let (ip, prefix) = text
            .split_once('/')
            .ok_or_else(|| bad("no prefix length"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| bad("bad prefix length"))?;
        if prefix > 32 {
            return Err(bad("prefix length over 32"));
        }
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        };
        Ok(Self {
            network: Ipv4Addr::from(u32::from(ip) & mask),
            prefix,
        })
    }
}

impl fmt::Display for IpPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl<'de> Deserialize<'de> for IpPool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_example_file_parses() {
        let text = include_str!("../cloud-config.example.yaml");
        let config = Config::parse(text, None).unwrap();
        assert_eq!(config.latency, GoDuration(Duration::from_millis(20)));
        assert_eq!(config.failure_rate("ensure_load_balancer"), 0.3);
        assert_eq!(config.failure_rate("instance_metadata"), 0.0);
        assert_eq!(config.instances["node-a"].state, InstanceState::Running);
        assert_eq!(
            config.instances["node-a"].addresses.as_ref().unwrap().len(),
            2
        );
        assert_eq!(config.load_balancers.ip_pool.to_string(), "203.0.113.0/24");
        assert_eq!(config.routes.initial[0].destination_cidr, "10.99.0.0/24");
        assert!(config.routes.initial[0].blackhole);
    }

    #[test]
    fn empty_config_means_defaults() {
        for text in ["", "# nothing\n", "{}"] {
            let config = Config::parse(text, None).unwrap();
            assert_eq!(config, Config::default());
        }
        let defaults = Config::parse("", None).unwrap();
        assert!(
            defaults.instances_v2 && defaults.load_balancers.enabled && defaults.routes.enabled
        );
        assert_eq!(defaults.instance_defaults.instance_type, "standard");
    }

    #[test]
    fn errors_name_the_line() {
        let err = Config::parse(
            "latency: 20ms\ninstances:\n  a:\n    state: bogus\n",
            Some(Path::new("/etc/c.yaml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("malformed cloud-config /etc/c.yaml:"),
            "{err}"
        );
        assert!(err.contains("line 4"), "{err}");
        let err = Config::parse("failureRate:\n  ensure_lb: 0.5\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("unknown method \"ensure_lb\""),
            "{err}"
        );
        let err = Config::parse("failureRate:\n  all: 1.5\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not between 0 and 1"), "{err}");
        let err = Config::parse("latency: fast\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 1") && err.contains("invalid duration"),
            "{err}"
        );
        let err = Config::parse("loadBalancers:\n  ipPool: 10.0.0.0\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("invalid ipPool"),
            "{err}"
        );
        let err = Config::parse("stateFiel: /tmp/x\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `stateFiel`"), "{err}");
    }

    #[test]
    fn no_input_makes_the_parser_panic() {
        let deep_seq = format!(
            "instances: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let deep_map = format!("a: {}1{}\n", "{b: ".repeat(10_000), "}".repeat(10_000));
        let aliases = (1..12).fold(
            "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned(),
            |text, i| {
                let previous = format!("*a{}", i - 1);
                format!(
                    "{text}a{i}: &a{i} [{}]\n",
                    [previous.as_str(); 10].join(", ")
                )
            },
        );
        let inputs = [
            "latency: 18446744073709551616s".to_owned(),
            "latency: 9223372037s".to_owned(),
            format!("latency: {}s", "9".repeat(400)),
            "latency: 1e400s".to_owned(),
            "latency: .s".to_owned(),
            "latency: -1s".to_owned(),
            "latency: 5µs".to_owned(),
            "retryAfter: 99999999999h".to_owned(),
            "seed: -1".to_owned(),
            "seed: 1e30".to_owned(),
            "seed: 18446744073709551616".to_owned(),
            "failureRate: {all: .nan}".to_owned(),
            "failureRate: {all: .inf}".to_owned(),
            "loadBalancers: {ipPool: 0.0.0.0/0}".to_owned(),
            "loadBalancers: {ipPool: 255.255.255.255/99999999999}".to_owned(),
            "loadBalancers: {ipPool: /}".to_owned(),
            "instances: {a: {addresses: [{type: InternalIP}]}}".to_owned(),
            "stateFile: \"\\0\"".to_owned(),
            "!!binary AAAA".to_owned(),
            "--- !<tag:yaml.org,2002:js/undefined> ~".to_owned(),
            "? [a, b]\n: c".to_owned(),
            "\u{feff}\u{feff}latency: 1s".to_owned(),
            "a: \"\\uD800\"".to_owned(),
            "\t- \"".to_owned(),
            "*unknown".to_owned(),
            deep_seq,
            deep_map,
            aliases,
        ];
        for text in &inputs {
            // Each either parses or is refused; none panics (a panic fails the test with the input).
            if let Ok(config) = Config::parse(text, None) {
                assert!(config.validate(None).is_ok(), "{text:.80}");
            }
        }
        let err = Config::parse("latency: 18446744073709551616s\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("out of range"), "{err}");
    }

    #[test]
    fn the_flush_interval_defaults_to_200ms_and_must_be_more_than_0() {
        assert_eq!(Config::default().flush_interval(), DEFAULT_FLUSH_INTERVAL);
        let config = Config::parse("stateFileFlushInterval: 15ms\n", None).unwrap();
        assert_eq!(config.flush_interval(), Duration::from_millis(15));
        let err = Config::parse(
            "stateFileFlushInterval: 0s\n",
            Some(Path::new("/etc/c.yaml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "malformed cloud-config /etc/c.yaml: stateFileFlushInterval must be more than 0"
            ),
            "{err}"
        );
        let err = Config::parse("stateFileFlushInterval: soon\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("stateFileFlushInterval"), "{err}");
    }

    #[test]
    fn the_state_file_keys_go_together() {
        let err = Config::parse(
            "stateFile: /tmp/s.json\nstateFileShared: true\nstateFileBatched: true\n",
            Some(Path::new("/etc/c.yaml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("malformed cloud-config /etc/c.yaml: stateFileShared and stateFileBatched cannot be combined"),
            "{err}"
        );
        let err = Config::parse("stateFileShared: true\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("stateFileShared needs a stateFile"), "{err}");
        let shared =
            Config::parse("stateFile: /tmp/s.json\nstateFileShared: true\n", None).unwrap();
        assert!(shared.state_file_shared && !shared.state_file_batched);
        assert!(!Config::default().state_file_shared);
        assert!(shared.check_reload(&shared.clone()).is_ok());
        assert!(shared.check_reload(&Config::default()).is_err());
        assert!(Config::default().check_reload(&shared).is_err());
    }

    #[test]
    fn the_first_calls_panic_as_asked() {
        let config = Config::parse(
            "panicFirstCalls: {ensure_load_balancer_deleted: 2, all: 0}\n",
            None,
        )
        .unwrap();
        let panics: Vec<bool> = (1..=3)
            .map(|call| config.panics_on("ensure_load_balancer_deleted", call))
            .collect();
        assert_eq!(panics, [true, true, false]);
        assert!(!config.panics_on("ensure_load_balancer", 1));
        assert!(Config::parse("panicFirstCalls: {no_such_method: 1}\n", None).is_err());
    }

    #[test]
    fn failure_rate_falls_back_to_all() {
        let config = Config::parse("failureRate:\n  all: 0.1\n  create_route: 1\n", None).unwrap();
        assert_eq!(config.failure_rate("create_route"), 1.0);
        assert_eq!(config.failure_rate("list_routes"), 0.1);
    }

    #[test]
    fn latency_uses_go_duration_syntax() {
        assert_eq!(
            "1m30s".parse::<GoDuration>(),
            Ok(GoDuration(Duration::from_secs(90)))
        );
        assert!("5 ms".parse::<GoDuration>().is_err());
    }

    #[test]
    fn ip_pools() {
        let pool: IpPool = "198.51.100.7/30".parse().unwrap();
        assert_eq!(pool.to_string(), "198.51.100.4/30");
        let all: Vec<_> = pool.addresses().collect();
        assert_eq!(
            all,
            vec![
                Ipv4Addr::new(198, 51, 100, 5),
                Ipv4Addr::new(198, 51, 100, 6)
            ]
        );
        assert!(pool.contains(Ipv4Addr::new(198, 51, 100, 6)));
        assert!(!pool.contains(Ipv4Addr::new(198, 51, 100, 8)));
        assert_eq!(
            "10.0.0.1/32".parse::<IpPool>().unwrap().addresses().count(),
            1
        );
        assert!("10.0.0.0/33".parse::<IpPool>().is_err());
    }
}
