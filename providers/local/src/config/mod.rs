//! The `local` cloud's configuration: the YAML `--cloud-config` file. Every key is shown in
//! `cloud-config.example.yaml` beside this crate and described in `docs/local-provider.md`.
//!
//! Values are checked while they are read, so a bad value is reported with its file, line and column.
//! An empty file (or none at all) is a valid config: every node is adopted and load balancers get VIPs
//! from the default pool in 127.0.0.0/8.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr},
    path::Path,
    str::FromStr,
    time::Duration,
};

pub use crate::bgp_config::{
    Announce, BfdProfile, BgpConfig, BgpPassword, BgpPeer, Community, NodeSelector, PoolBgp,
};
pub use cloud_provider::config_values::{AddressConfig, AddressType, GoDuration};
use serde::{Deserialize, Deserializer, de};

use crate::Error;
pub use crate::selector::{LabelSelector, any_selects};

mod load_balancer;
mod pools;
mod validate;

pub use load_balancer::{
    Count, HealthCheckTiming, KubeletProbe, LoadBalancerConfig, LoadBalancerMode, MetallbConfig,
    MetallbObjects,
};
pub use pools::{AddressPool, AddressRange};
pub(crate) use validate::bgp_pool_problem;

/// The default pool's only range: 127.240.0.0/16, loopback addresses any process can bind.
pub const DEFAULT_POOL: &str = "127.240.0.0/16";

/// The parsed cloud-config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// What happens to nodes the inventory never listed: `adopt` (default) or `ignore`.
    #[serde(default)]
    pub unlisted_nodes: UnlistedNodes,
    /// The fields of adopted nodes, and of machines that leave them out.
    #[serde(default)]
    pub defaults: MachineDefaults,
    /// The inventory: machines by node name.
    #[serde(default)]
    pub machines: BTreeMap<String, Machine>,
    /// Where load-balancer VIPs come from, in order of preference. Default: one pool `default` with
    /// [`DEFAULT_POOL`].
    #[serde(default = "default_pools")]
    pub address_pools: Vec<AddressPool>,
    /// The load balancers' data plane.
    #[serde(default)]
    pub load_balancer: LoadBalancerConfig,
    /// The optional kubelet probe (off by default).
    #[serde(default)]
    pub kubelet_probe: KubeletProbe,
    /// Set by the cloud, never read from the file: the pools in force are MetalLB's (`metallb`), whose
    /// Services' traffic kube-proxy carries by default, as under MetalLB.
    #[serde(skip)]
    pub(crate) metallb_pools: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            unlisted_nodes: UnlistedNodes::default(),
            defaults: MachineDefaults::default(),
            machines: BTreeMap::new(),
            address_pools: default_pools(),
            load_balancer: LoadBalancerConfig::default(),
            kubelet_probe: KubeletProbe::default(),
            metallb_pools: false,
        }
    }
}

fn default_pools() -> Vec<AddressPool> {
    vec![AddressPool {
        name: "default".to_owned(),
        addresses: vec![DEFAULT_POOL.parse().expect("the default pool is a CIDR")],
        auto_assign: true,
        namespaces: Vec::new(),
        service_selector: None,
        service_selectors: Vec::new(),
        namespace_selectors: Vec::new(),
        node_selectors: Vec::new(),
        avoid_buggy_ips: false,
        priority: None,
        cross_namespace_sharing: false,
        announce: Announce::L2,
        bgp: None,
        metallb_election: false,
    }]
}

/// What happens to a node the inventory has never listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnlistedNodes {
    /// The node is a machine of this cloud: its provider ID is `local://<name>`, its addresses its own
    /// (or its `alpha.kubernetes.io/provided-node-ip`), its other fields the `defaults`.
    #[default]
    Adopt,
    /// The node is left alone: the cloud-node controller skips it (it keeps the uninitialized taint) and
    /// the lifecycle controller never deletes or taints it.
    Ignore,
}

/// The fields of adopted nodes and the defaults of listed machines.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineDefaults {
    /// Default `local`.
    pub instance_type: String,
    /// Default empty (no zone label).
    pub zone: String,
    /// Default empty (no region label).
    pub region: String,
}

impl Default for MachineDefaults {
    fn default() -> Self {
        Self {
            instance_type: "local".to_owned(),
            zone: String::new(),
            region: String::new(),
        }
    }
}

/// A machine of the inventory. Unset fields come from `defaults`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    /// The machine's addresses. Empty (default): the node's own addresses, as for an adopted node.
    pub addresses: Vec<AddressConfig>,
    /// Instance type.
    pub instance_type: Option<String>,
    /// Zone.
    pub zone: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Extra labels for the node (keys in Kubernetes' own namespaces are dropped by the node controller).
    pub labels: BTreeMap<String, String>,
    /// `running` (default) or `shutdown`.
    pub state: MachineState,
}

/// The power state of a machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineState {
    /// Runs.
    #[default]
    Running,
    /// Exists but is shut down: its node gets the shutdown taint once NotReady.
    Shutdown,
}

fn yes() -> bool {
    true
}

/// What a config that sets `loadBalancer.ipCommand` is told.
pub(crate) const IP_COMMAND_REMOVED: &str = "loadBalancer.ipCommand is no longer supported: VIPs are put \
     on loadBalancer.vipInterface through netlink now (no `ip` command is run; CAP_NET_ADMIN puts them \
     on, CAP_NET_RAW announces them); remove the ipCommand key";

impl Config {
    /// Parses the YAML text of a cloud-config; `path` names the file in errors. Never panics.
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Self, Error> {
        let malformed = |message: String| Error::Config {
            path: path.map(|p| p.display().to_string()),
            message,
        };
        let config = std::panic::catch_unwind(|| serde_saphyr::from_str::<Option<Config>>(text))
            .map_err(|_| malformed("the YAML parser failed on it".to_owned()))?
            .map_err(|err| malformed(err.to_string()))?
            .unwrap_or_default();
        config.validate().map_err(malformed)?;
        Ok(config)
    }

    /// The pools in the order a Service that names none tries them ([`AddressPool::priority`]).
    pub fn pools_by_preference(&self) -> Vec<&AddressPool> {
        let mut pools: Vec<&AddressPool> = self.address_pools.iter().collect();
        // Stable: the file's order among equal priorities.
        pools.sort_by_key(|p| (p.priority.is_none(), p.priority));
        pools
    }

    /// The pool an address belongs to.
    pub fn pool_of(&self, ip: IpAddr) -> Option<&AddressPool> {
        self.address_pools
            .iter()
            .find(|p| p.addresses.iter().any(|r| r.contains(ip)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_file_parses() {
        let config = Config::parse(include_str!("../../cloud-config.example.yaml"), None).unwrap();
        assert_eq!(config.unlisted_nodes, UnlistedNodes::Adopt);
        assert_eq!(config.machines["node-b"].state, MachineState::Shutdown);
        assert_eq!(config.address_pools.len(), 3);
        assert!(!config.address_pools[1].auto_assign);
        assert_eq!(config.address_pools[2].namespaces, ["shop"]);
        assert_eq!(
            config.load_balancer.health_check.interval,
            GoDuration(Duration::from_secs(2))
        );
    }

    #[test]
    fn an_empty_config_adopts_every_node_and_has_a_loopback_pool() {
        for text in ["", "# nothing\n", "{}"] {
            let config = Config::parse(text, None).unwrap();
            assert_eq!(config, Config::default());
        }
        let config = Config::default();
        assert_eq!(config.unlisted_nodes, UnlistedNodes::Adopt);
        let pool = &config.address_pools[0];
        let first = pool.addresses[0].first();
        assert_eq!(first, "127.240.0.1".parse::<IpAddr>().unwrap());
        assert!(first.is_loopback());
        assert_eq!(config.load_balancer.kube_proxy_health_port, 10256);
        assert!(!config.kubelet_probe.enabled);
    }

    #[test]
    fn ranges_and_cidrs_of_both_families() {
        let r: AddressRange = "127.0.10.1 - 127.0.10.3".parse().unwrap();
        assert_eq!(r.addresses().count(), 3);
        let r: AddressRange = "10.0.0.0/30".parse().unwrap();
        assert_eq!(
            r.addresses().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["10.0.0.1", "10.0.0.2"]
        );
        let r: AddressRange = "10.0.0.7/32".parse().unwrap();
        assert_eq!(r.addresses().count(), 1);
        let r: AddressRange = "fd00::/126".parse().unwrap();
        assert_eq!(
            r.addresses().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["fd00::1", "fd00::2", "fd00::3"]
        );
        let huge: AddressRange = "fd00::/64".parse().unwrap();
        assert_eq!(
            huge.addresses().nth(1).unwrap().to_string(),
            "fd00::2",
            "lazy"
        );
        assert!(huge.contains("fd00::ffff".parse().unwrap()));
        assert!(!huge.contains("10.0.0.1".parse().unwrap()));
        for bad in [
            "10.0.0.0",
            "10.0.0.5-10.0.0.1",
            "10.0.0.1-fd00::1",
            "x-y",
            "10.0.0.0/33",
        ] {
            let err = bad.parse::<AddressRange>().unwrap_err();
            assert!(err.contains("invalid address range"), "{err}");
        }
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = Config::parse(
            "machines:\n  a:\n    state: off\n",
            Some(Path::new("/etc/local.yaml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("malformed cloud-config /etc/local.yaml:"),
            "{err}"
        );
        assert!(err.contains("line 3"), "{err}");
        let err = Config::parse(
            "addressPools:\n  - name: a\n    addresses: [127.1.0.0/33]\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 3") && err.contains("invalid address range"),
            "{err}"
        );
        let err = Config::parse("unlistedNodes: maybe\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
        let idle = Config::parse("loadBalancer:\n  tcpIdleTimeout: 5m\n", None).unwrap();
        assert_eq!(
            idle.load_balancer.tcp_idle_timeout.0,
            Duration::from_secs(300)
        );
        assert!(
            Config::default().load_balancer.tcp_idle_timeout.0.is_zero(),
            "off by default"
        );
        let threads = Config::parse("loadBalancer:\n  relayThreads: 3\n", None).unwrap();
        assert_eq!(
            threads.load_balancer.relay_threads,
            std::num::NonZeroUsize::new(3)
        );
        assert_eq!(
            Config::default().load_balancer.relay_threads,
            None,
            "one per core by default"
        );
        let err = Config::parse("loadBalancer:\n  relayThreads: 0\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("relayThreads") && err.contains("line 2"),
            "{err}"
        );
        let err = Config::parse("loadBalancer:\n  drainTimeout: soon\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        let err = Config::parse(
            "loadBalancer:\n  healthCheck: {healthyThreshold: 0}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 2") && err.contains("at least 1"),
            "{err}"
        );
        let err = Config::parse("machine: {}\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `machine`"), "{err}");
    }

    #[test]
    fn a_pool_s_scope_is_checked_and_read() {
        let scoped = Config::parse(
            "addressPools:\n  - name: team\n    addresses: [127.1.0.0/30]\n    namespaces: [shop, web]\n    serviceSelector: {matchLabels: {tier: edge}}\n",
            None,
        )
        .unwrap();
        let pool = &scoped.address_pools[0];
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = labels(&[]);
        assert_eq!(
            pool.refuses("shop", &none, &labels(&[("tier", "edge")])),
            None
        );
        assert_eq!(
            pool.refuses("db", &none, &labels(&[("tier", "edge")]))
                .as_deref(),
            Some("pool \"team\" serves the namespaces shop, web only")
        );
        assert_eq!(
            pool.refuses("web", &none, &labels(&[("tier", "core")]))
                .as_deref(),
            Some("pool \"team\" serves Services labelled tier=edge only")
        );
        // Selectors of namespaces and of Services, MetalLB's: any one suffices.
        let selected = Config::parse(
            "addressPools:\n  - name: team\n    addresses: [127.1.0.0/30]\n    namespaces: [shop]\n    namespaceSelectors: [{matchLabels: {team: a}}]\n    serviceSelectors: [{matchLabels: {tier: edge}}, {matchExpressions: [{key: tier, operator: In, values: [core]}]}]\n",
            None,
        )
        .unwrap();
        let pool = &selected.address_pools[0];
        let core = labels(&[("tier", "core")]);
        assert_eq!(pool.refuses("shop", &none, &core), None);
        assert_eq!(pool.refuses("db", &labels(&[("team", "a")]), &core), None);
        assert_eq!(
            pool.refuses("db", &labels(&[("team", "b")]), &core)
                .as_deref(),
            Some("pool \"team\" serves the namespaces shop, namespaces labelled team=a only")
        );
        assert_eq!(
            pool.refuses("shop", &none, &labels(&[("tier", "web")]))
                .as_deref(),
            Some("pool \"team\" serves Services labelled (tier=edge) or (tier in (core)) only")
        );
        for (yaml, expected) in [
            (
                "namespaces: [Shop]",
                "pool \"team\": \"Shop\" is not a namespace's name",
            ),
            (
                "serviceSelector: {matchLabels: {-tier: edge}}",
                "line 4 column 22: matchLabels: label key \"-tier\"",
            ),
            (
                "serviceSelector: {matchExpressions: [{key: a, operator: Has}]}",
                "operator \"Has\" is not one of",
            ),
            (
                "nodeSelectors: [{matchFields: {}}]",
                "unknown field `matchFields`",
            ),
        ] {
            let err = Config::parse(
                &format!(
                    "addressPools:\n  - name: team\n    addresses: [127.1.0.0/30]\n    {yaml}\n"
                ),
                None,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(expected), "{err} lacks {expected}");
        }
    }

    const BGP_PEERS: &str = "loadBalancer:\n  mode: agents\n  bgp:\n    peers:\n      - {name: tor-a, peerAddress: 10.89.0.250, peerASN: 64512, myASN: 64513}\n      - {name: tor-b, peerAddress: 'fd00:89::250', peerASN: 64513, myASN: 64513, holdTime: 9s, nodeSelectors: [{matchLabels: {rack: b}}]}\n";

    #[test]
    fn bgp_peers_and_pools_are_read() {
        let config = Config::parse(
            &format!("{BGP_PEERS}addressPools:\n  - name: routed\n    addresses: [10.90.0.0/24]\n    announce: bgp\n    bgp: {{peers: [tor-a, tor-b], communities: ['64513:100', no-export, 'large:64513:1:2'], localPref: 200}}\n  - {{name: l2, addresses: [10.89.0.64/26]}}\n"),
            None,
        )
        .unwrap();
        let peers = &config.load_balancer.bgp.peers;
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[0].peer_port, 179);
        assert_eq!(peers[0].hold_time.0, Duration::from_secs(90));
        assert!(peers[0].selects(&BTreeMap::new()));
        assert!(!peers[1].selects(&BTreeMap::new()));
        assert!(peers[1].selects(&[("rack".to_owned(), "b".to_owned())].into()));
        let session = peers[1]
            .session(Some(Ipv4Addr::new(10, 89, 0, 11)), None)
            .unwrap();
        assert_eq!(
            (session.hold_time, session.router_id),
            (9, Ipv4Addr::new(10, 89, 0, 11))
        );
        assert_eq!(config.address_pools[0].announce, Announce::Bgp);
        assert_eq!(config.address_pools[1].announce, Announce::L2);
        let path = config.address_pools[0].bgp.as_ref().unwrap().path();
        assert_eq!(path.communities, vec![(64513 << 16) | 100, 0xFFFF_FF01]);
        assert_eq!(path.large_communities, vec![[64513, 1, 2]]);
        assert_eq!(path.local_preference, Some(200));
        assert!(
            peers[1]
                .session(None, None)
                .unwrap_err()
                .contains("set routerID")
        );
    }

    #[test]
    fn a_range_spans_the_block_its_cidr_was() {
        for (text, first, last) in [
            ("10.90.0.0/24", "10.90.0.0", "10.90.0.255"),
            ("10.90.0.0/30", "10.90.0.0", "10.90.0.3"),
            ("10.90.0.10-10.90.0.20", "10.90.0.10", "10.90.0.20"),
            ("10.0.0.5/32", "10.0.0.5", "10.0.0.5"),
            ("fd00:90::/120", "fd00:90::", "fd00:90::ff"),
        ] {
            let range: AddressRange = text.parse().unwrap();
            assert_eq!(
                range.span(),
                (first.parse().unwrap(), last.parse().unwrap()),
                "{text}"
            );
        }
    }

    #[test]
    fn bfd_profiles_are_read_as_metallb_writes_them() {
        let config = Config::parse(
            "loadBalancer:\n  mode: agents\n  bgp:\n    bfdProfiles:\n      - {name: fast, receiveInterval: 100, transmitInterval: 150, detectMultiplier: 5, passiveMode: true, echoMode: false}\n      - {name: defaults}\n    peers:\n      - {name: tor-a, peerAddress: 10.89.0.250, peerASN: 64512, myASN: 64513, bfdProfile: fast}\n      - {name: tor-b, peerAddress: 10.89.0.251, peerASN: 64512, myASN: 64513, bfdProfile: defaults}\n      - {name: tor-c, peerAddress: 10.89.0.252, peerASN: 64512, myASN: 64513}\n",
            None,
        )
        .unwrap();
        let bgp = &config.load_balancer.bgp;
        let fast = bgp.bfd_of(&bgp.peers[0]).unwrap();
        assert_eq!(
            fast,
            local_bgp::BfdProfile {
                receive_interval: Duration::from_millis(100),
                transmit_interval: Duration::from_millis(150),
                detect_multiplier: 5,
                passive: true,
            }
        );
        assert_eq!(
            bgp.bfd_of(&bgp.peers[1]),
            Some(local_bgp::BfdProfile::default())
        );
        assert_eq!(bgp.bfd_of(&bgp.peers[2]), None);
        let session = bgp.peers[0]
            .session(Some(Ipv4Addr::new(10, 89, 0, 11)), Some(fast))
            .unwrap();
        assert_eq!(session.bfd, Some(fast));
    }

    #[test]
    fn bad_bgp_settings_are_named() {
        let pool = |extra: &str| {
            format!("addressPools:\n  - name: routed\n    addresses: [10.90.0.0/24]\n{extra}")
        };
        for (text, expected) in [
            (format!("{BGP_PEERS}{}", pool("    bgp: {peers: [tor-a]}\n")), "pool \"routed\" has a bgp block but announces by layer 2"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {peers: [tor-c]}\n")), "bgp.peers names \"tor-c\", which is no peer of loadBalancer.bgp.peers (tor-a, tor-b)"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {peers: [tor-a], localPref: 10}\n")), "bgp.localPref goes to iBGP peers only"),
            (format!("{BGP_PEERS}addressPools:\n  - {{name: six, addresses: ['fd00:90::/120'], announce: bgp, bgp: {{peers: [tor-a]}}}}\n"), "pool \"six\": it has IPv6 addresses, but none of its BGP peers has an IPv6 address"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {communities: ['64513:x']}\n")), "community \"64513:x\": not two 16-bit numbers"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {aggregationLength: 20}\n")), "pool \"routed\": bgp.aggregationLength 20: 10.90.0.0/20 reaches outside the pool's addresses 10.90.0.0-10.90.0.255"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {aggregationLength: 33}\n")), "bgp.aggregationLength 33: at most 32"),
            (format!("{BGP_PEERS}{}", pool("    announce: bgp\n    bgp: {aggregationPrefix: 24}\n")), "unknown field `aggregationPrefix`"),
            (format!("loadBalancer: {{mode: agents}}\n{}", pool("    announce: bgp\n")), "announce: bgp, but loadBalancer.bgp.peers is empty"),
            (pool("    announce: bgp\n"), "announce: bgp needs loadBalancer.mode: agents"),
            (pool("    announce: ospf\n"), "unknown variant `ospf`"),
            ("loadBalancer: {bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}]}}".to_owned(), "loadBalancer.bgp is the agents mode's"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}, {name: a, peerAddress: 10.0.0.2, peerASN: 1, myASN: 2}]}}".to_owned(), "two peers are named \"a\""),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 0, myASN: 2}]}}".to_owned(), "peers \"a\": BGP peer 10.0.0.1:179: peer ASN 0 is reserved"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, holdTime: 2s}]}}".to_owned(), "hold time 2 s"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 1, ebgpMultiHop: true}]}}".to_owned(), "ebgpMultiHop is for eBGP"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passwordSecret: {name: x}}]}}".to_owned(), "mount the Secret into the agents' pods and name the file with passwordFile"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, password: x, passwordFile: /y}]}}".to_owned(), "password and passwordFile both set"),
            (format!("loadBalancer: {{mode: agents, bgp: {{peers: [{{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, password: {}}}]}}}}", "x".repeat(81)), "a TCP MD5 password of 81 bytes"),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, nodeSelectors: [{matchLabels: {-x: y}}]}]}}".to_owned(), "matchLabels: label key \"-x\""),
            ("loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, bfdProfile: fast}]}}".to_owned(), "peers \"a\": bfdProfile \"fast\" is no profile of loadBalancer.bgp.bfdProfiles (it has none)"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast}], peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, ebgpMultiHop: true, bfdProfile: fast}]}}".to_owned(), "multihop BFD (RFC 5883) is not implemented"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast}, {name: fast}]}}".to_owned(), "two profiles are named \"fast\""),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, detectMultiplier: 1}]}}".to_owned(), "bfdProfiles \"fast\": detectMultiplier 1: from 2 to 255"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, receiveInterval: 5}]}}".to_owned(), "bfdProfiles \"fast\": receiveInterval 5: milliseconds, from 10 to 60000"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, echoMode: true}]}}".to_owned(), "echoMode: echo mode is not implemented"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, echoInterval: 50}]}}".to_owned(), "echoInterval: echo mode is not implemented"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, minimumTtl: 254}]}}".to_owned(), "minimumTtl is for multihop BFD"),
            ("loadBalancer: {mode: agents, bgp: {bfdProfiles: [{name: fast, echo: true}]}}".to_owned(), "unknown field `echo`"),
        ] {
            let err = Config::parse(&text, None).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}\n  lacks {expected}");
        }
    }

    #[test]
    fn ip_command_is_refused_with_what_to_do() {
        for text in [
            "loadBalancer:\n  vipInterface: eth0\n  ipCommand: ip\n",
            "loadBalancer: {ipCommand: /sbin/ip}\n",
        ] {
            let err = Config::parse(text, Some(Path::new("/etc/local.yaml")))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("malformed cloud-config /etc/local.yaml:")
                    && err.contains(IP_COMMAND_REMOVED),
                "{err}"
            );
            assert!(!err.contains("unknown field"), "{err}");
        }
        let err = Config::parse(
            "loadBalancer:\n  vipInterface: eth0\n  ipCommand: ip\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 3"), "{err}");
        let err = Config::parse("loadBalancer: {vipInterface: ' '}\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("loadBalancer.vipInterface cannot be empty"),
            "{err}"
        );
        let config = Config::parse("loadBalancer: {vipInterface: eth0}\n", None).unwrap();
        assert_eq!(config.load_balancer.vip_interface.as_deref(), Some("eth0"));
    }

    #[test]
    fn pools_must_not_overlap_nor_share_a_name() {
        let err = Config::parse(
            "addressPools:\n  - {name: a, addresses: [127.1.0.0/24]}\n  - {name: b, addresses: [127.1.0.9-127.1.1.3]}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("overlaps"), "{err}");
        let err = Config::parse(
            "addressPools:\n  - {name: a, addresses: [127.1.0.0/24]}\n  - {name: a, addresses: [127.2.0.0/24]}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("two pools are named \"a\""), "{err}");
        let err = Config::parse(
            "machines:\n  a: {addresses: [{type: InternalIP, address: nope}]}\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("machines.a.addresses"), "{err}");
    }

    #[test]
    fn no_input_makes_the_parser_panic() {
        let deep = format!("machines: {}{}\n", "[".repeat(50_000), "]".repeat(50_000));
        for text in [
            deep.as_str(),
            "addressPools: [{name: x, addresses: ['255.255.255.255/0']}]",
            "addressPools: [{name: x, addresses: ['::/0']}]",
            "addressPools: [{name: x, addresses: ['0.0.0.0/0']}]",
            "loadBalancer: {drainTimeout: 18446744073709551616s}",
            "kubeletProbe: {port: 70000}",
            "*x",
        ] {
            let _ = Config::parse(text, None);
        }
        let all: AddressRange = "::/0".parse().unwrap();
        assert_eq!(all.addresses().next().unwrap().to_string(), "::1");
    }
}
