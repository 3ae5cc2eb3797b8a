//! The cloud-config's BGP settings: the routers the node agents peer with (`loadBalancer.bgp.peers`)
//! and, per address pool, how its VIPs are announced (`announce: bgp` and the pool's `bgp` block).
//! The field names are MetalLB's (`BGPPeer`, `BGPAdvertisement`) where MetalLB has the same setting, so
//! that its users read them as they know them.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr},
    str::FromStr,
    time::Duration,
};

use serde::{Deserialize, Deserializer, de};

use crate::config::GoDuration;

/// How a pool's VIPs reach the network (`announce`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Announce {
    /// One node per VIP holds it on its interface and tells the link (gratuitous ARP, unsolicited
    /// neighbour advertisement): MetalLB's layer 2.
    #[default]
    L2,
    /// Every node that can serve the VIP advertises a host route to it to its BGP peers, which spread
    /// the traffic over them (ECMP). Needs `loadBalancer.mode: agents` and `loadBalancer.bgp.peers`.
    Bgp,
    /// Nobody announces them: the pool's addresses are given out and written in the Services'
    /// status, and something else routes them to the nodes (kube-proxy takes them on whichever node
    /// they reach). MetalLB's pool without an advertisement. Needs `loadBalancer.mode: agents`.
    None,
}

/// `loadBalancer.bgp`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpConfig {
    /// The routers the node agents peer with.
    pub peers: Vec<BgpPeer>,
    /// BFD profiles, by name, for peers' `bfdProfile`.
    pub bfd_profiles: Vec<BfdProfile>,
}

impl BgpConfig {
    /// The BFD timers `peer` asks for, if it names a profile (checked to exist by validation).
    pub fn bfd_of(&self, peer: &BgpPeer) -> Option<local_bgp::BfdProfile> {
        let name = peer.bfd_profile.as_ref()?;
        self.bfd_profiles
            .iter()
            .find(|p| &p.name == name)
            .map(BfdProfile::timers)
    }
}

/// A BFD profile (`loadBalancer.bgp.bfdProfiles[]`), MetalLB's `BFDProfile` with the same fields and
/// units (milliseconds): single-hop BFD (RFC 5881) in asynchronous mode. Echo mode and multihop BFD
/// are not implemented: `echoMode: true`, `echoInterval` and `minimumTtl` are refused.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BfdProfile {
    /// The profile's name, for peers' `bfdProfile`.
    pub name: String,
    /// The shortest interval between the router's packets we can take, in milliseconds (default
    /// 300; 10 to 60000).
    #[serde(default = "default_bfd_interval")]
    pub receive_interval: u32,
    /// The interval we want between our packets, in milliseconds (default 300; 10 to 60000).
    #[serde(default = "default_bfd_interval")]
    pub transmit_interval: u32,
    /// Packets missed in a row before the other side counts as gone (default 3; 2 to 255). The
    /// router drops a dead node's routes within `transmitInterval x detectMultiplier` (with the
    /// router's receive interval, if longer).
    #[serde(default = "default_bfd_multiplier")]
    pub detect_multiplier: u32,
    /// Send nothing until the router's first packet (default `false`).
    #[serde(default)]
    pub passive_mode: bool,
    /// Echo mode: refused when `true` (not implemented).
    #[serde(default, deserialize_with = "refuse_echo_mode")]
    echo_mode: bool,
    /// Refused: echo mode is not implemented.
    #[serde(default, deserialize_with = "refuse_echo_interval")]
    echo_interval: Refused,
    /// Refused: it is for multihop BFD, which is not implemented (single hop takes TTL 255 only).
    #[serde(default, deserialize_with = "refuse_minimum_ttl")]
    minimum_ttl: Refused,
}

fn default_bfd_interval() -> u32 {
    300
}

fn default_bfd_multiplier() -> u32 {
    3
}

fn refuse_echo_mode<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    if bool::deserialize(d)? {
        return Err(de::Error::custom(
            "echoMode: echo mode is not implemented (BFD runs in asynchronous mode): remove it or \
             set it false",
        ));
    }
    Ok(false)
}

fn refuse_echo_interval<'de, D: Deserializer<'de>>(_: D) -> Result<Refused, D::Error> {
    Err(de::Error::custom(
        "echoInterval: echo mode is not implemented (BFD runs in asynchronous mode): remove it",
    ))
}

fn refuse_minimum_ttl<'de, D: Deserializer<'de>>(_: D) -> Result<Refused, D::Error> {
    Err(de::Error::custom(
        "minimumTtl is for multihop BFD, which is not implemented; single-hop BFD takes packets \
         sent with TTL 255 only (RFC 5881): remove it",
    ))
}

impl BfdProfile {
    /// The speaker's timers.
    pub fn timers(&self) -> local_bgp::BfdProfile {
        local_bgp::BfdProfile {
            receive_interval: Duration::from_millis(u64::from(self.receive_interval)),
            transmit_interval: Duration::from_millis(u64::from(self.transmit_interval)),
            detect_multiplier: u8::try_from(self.detect_multiplier).unwrap_or(u8::MAX),
            passive: self.passive_mode,
        }
    }

    /// What the types alone cannot check.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty() {
            return Err("loadBalancer.bgp.bfdProfiles: a profile has an empty name".to_owned());
        }
        for (field, ms) in [
            ("receiveInterval", self.receive_interval),
            ("transmitInterval", self.transmit_interval),
        ] {
            if !(10..=60_000).contains(&ms) {
                return Err(format!(
                    "loadBalancer.bgp.bfdProfiles {name:?}: {field} {ms}: milliseconds, from 10 \
                     to 60000"
                ));
            }
        }
        if !(2..=255).contains(&self.detect_multiplier) {
            return Err(format!(
                "loadBalancer.bgp.bfdProfiles {name:?}: detectMultiplier {}: from 2 to 255",
                self.detect_multiplier
            ));
        }
        Ok(())
    }
}

/// A router (`loadBalancer.bgp.peers[]`); each node agent whose node it selects opens a session
/// with it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpPeer {
    /// The peer's name, for pools' `bgp.peers`, logs and metrics.
    pub name: String,
    /// The router's address.
    pub peer_address: IpAddr,
    /// The router's AS number.
    #[serde(rename = "peerASN")]
    pub peer_asn: u32,
    /// The nodes' AS number (the router's for iBGP).
    #[serde(rename = "myASN")]
    pub my_asn: u32,
    /// The router's port (default 179).
    #[serde(default = "bgp_port")]
    pub peer_port: u16,
    /// The hold time proposed (default 90s; 0s for none, else at least 3s).
    #[serde(default = "default_hold")]
    pub hold_time: GoDuration,
    /// The node's address the session leaves from; unset, the kernel's choice (the node's address
    /// on the router's network).
    #[serde(default)]
    pub source_address: Option<IpAddr>,
    /// The router is more than one hop away (eBGP multihop: our packets go with TTL 255).
    #[serde(default)]
    pub ebgp_multi_hop: bool,
    /// The BGP identifier; unset, the node's IPv4 InternalIP (a node without one needs it set).
    #[serde(default, rename = "routerID")]
    pub router_id: Option<Ipv4Addr>,
    /// The nodes that peer with this router: those matching any of these selectors; none (the
    /// default): every node.
    #[serde(default)]
    pub node_selectors: Vec<NodeSelector>,
    /// Graceful restart (RFC 4724, restart time 120 s): when an agent hands over to its successor
    /// (a rolling update), it closes its sessions without a NOTIFICATION and the router keeps the
    /// node's routes until the successor's sessions send them again (default `false`).
    #[serde(default)]
    pub enable_graceful_restart: bool,
    /// The TCP MD5 password shared with the router (RFC 2385), in the cloud-config itself.
    #[serde(default)]
    pub password: Option<BgpPassword>,
    /// A file holding the TCP MD5 password (a Secret mounted into the agents' pods), read when the
    /// session starts; its trailing newline is not part of the password.
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// The BFD profile (of `loadBalancer.bgp.bfdProfiles`) of the node's BFD session with the
    /// router; unset, no BFD. Single hop only: refused with `ebgpMultiHop`.
    #[serde(default)]
    pub bfd_profile: Option<String>,
    /// Passive: the node agents never connect to this router; it connects to them, at port 179 of
    /// `sourceAddress` (of every address of the node, both families, when unset), and a connection
    /// from `peerAddress` becomes the session (default `false`: the agents connect).
    #[serde(default)]
    pub passive: bool,
    /// MetalLB's `passwordSecret`: refused, naming `passwordFile` (the agents read no Secret through
    /// the API server).
    #[serde(default, deserialize_with = "refuse_password_secret")]
    password_secret: Refused,
}

/// A TCP MD5 password from the cloud-config; never printed (`Debug` says how long it is).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct BgpPassword(pub String);

impl fmt::Debug for BgpPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BgpPassword(<{} bytes>)", self.0.len())
    }
}

/// A key that is refused when set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Refused;

fn refuse_password_secret<'de, D: Deserializer<'de>>(_: D) -> Result<Refused, D::Error> {
    Err(de::Error::custom(
        "passwordSecret: the node agents read no Secret through the API server; mount the Secret \
         into the agents' pods and name the file with passwordFile",
    ))
}

/// The restart time announced with graceful restart (FRR's default).
pub const GRACEFUL_RESTART_TIME: u16 = 120;

/// A selector of nodes by their labels (a Kubernetes label selector).
pub type NodeSelector = crate::selector::LabelSelector;

impl BgpPeer {
    /// Whether a node with `labels` peers with this router.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        crate::selector::any_selects(&self.node_selectors, labels)
    }

    /// The speaker's settings for this peer on a node whose IPv4 InternalIP is `node_ipv4`, with
    /// the timers of its BFD profile `bfd` ([`BgpConfig::bfd_of`]).
    pub fn session(
        &self,
        node_ipv4: Option<Ipv4Addr>,
        bfd: Option<local_bgp::BfdProfile>,
    ) -> Result<local_bgp::PeerConfig, String> {
        let router_id = self.router_id.or(node_ipv4).ok_or_else(|| {
            format!(
                "loadBalancer.bgp.peers {:?}: the node has no IPv4 InternalIP to be its BGP \
                 identifier: set routerID",
                self.name
            )
        })?;
        let hold = self.hold_time.0.as_secs();
        let password = match (&self.password, &self.password_file) {
            (Some(password), _) => Some(password.0.clone().into_bytes()),
            (None, Some(file)) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| {
                        format!(
                            "loadBalancer.bgp.peers {:?}: passwordFile {}: {e}",
                            self.name,
                            file.display()
                        )
                    })?
                    .trim_end_matches(['\n', '\r'])
                    .as_bytes()
                    .to_vec(),
            ),
            (None, None) => None,
        };
        let config = local_bgp::PeerConfig {
            password: password.map(local_bgp::Password),
            port: self.peer_port,
            hold_time: u16::try_from(hold).unwrap_or(u16::MAX),
            source: self.source_address,
            ebgp_multihop: self.ebgp_multi_hop.then_some(255),
            graceful_restart: self
                .enable_graceful_restart
                .then_some(GRACEFUL_RESTART_TIME),
            bfd,
            passive: self.passive.then(|| {
                let on = self
                    .source_address
                    .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
                std::net::SocketAddr::new(on, local_bgp::BGP_PORT)
            }),
            ..local_bgp::PeerConfig::new(self.peer_address, self.peer_asn, self.my_asn, router_id)
        };
        config
            .validate()
            .map_err(|e| format!("loadBalancer.bgp.peers {:?}: {e}", self.name))?;
        Ok(config)
    }

    /// What the types alone cannot check; `bfd`: the timers of the profile it names.
    pub(crate) fn validate(&self, bfd: Option<local_bgp::BfdProfile>) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty() {
            return Err("loadBalancer.bgp.peers: a peer has an empty name".to_owned());
        }
        let hold = self.hold_time.0;
        if hold.subsec_nanos() != 0 || hold > Duration::from_secs(65535) {
            return Err(format!(
                "loadBalancer.bgp.peers {name:?}: holdTime {hold:?}: whole seconds, at most 65535s"
            ));
        }
        if self.password.is_some() && self.password_file.is_some() {
            return Err(format!(
                "loadBalancer.bgp.peers {name:?}: password and passwordFile both set: keep one"
            ));
        }
        if self.passive && self.peer_port != local_bgp::BGP_PORT {
            return Err(format!(
                "loadBalancer.bgp.peers {name:?}: peerPort {} with passive: true: peerPort is where \
                 the agents connect, and a passive peer never connects (the router connects to port \
                 179); remove one",
                self.peer_port
            ));
        }
        if self.ebgp_multi_hop && self.peer_asn == self.my_asn {
            return Err(format!(
                "loadBalancer.bgp.peers {name:?}: ebgpMultiHop is for eBGP, and peerASN equals \
                 myASN (iBGP): remove it"
            ));
        }
        // The speaker's own checks, with any identifier (the node's comes later) and without the
        // password file (read when a session starts, on the node).
        let without_file = BgpPeer {
            password_file: None,
            ..self.clone()
        };
        without_file
            .session(Some(Ipv4Addr::new(192, 0, 2, 1)), bfd)
            .map(|_| ())
    }
}

fn bgp_port() -> u16 {
    local_bgp::BGP_PORT
}

fn default_hold() -> GoDuration {
    GoDuration(Duration::from_secs(90))
}

/// A pool's `bgp` block: how its VIPs are advertised (MetalLB's `BGPAdvertisement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolBgp {
    /// The peers (by name) the VIPs go to; none (the default): every peer.
    pub peers: Vec<String>,
    /// Communities on the routes: `64512:100`, a well-known name (`no-export`, `no-advertise`,
    /// `no-export-subconfed`, `no-peer`), or `large:64512:1:2` (RFC 8092).
    pub communities: Vec<Community>,
    /// LOCAL_PREF, sent to iBGP peers only (an eBGP peer never receives it, RFC 4271): refused when
    /// every peer of the pool is eBGP.
    pub local_pref: Option<u32>,
    /// The length of the prefix an IPv4 VIP is announced in (default 32: a host route): a node
    /// announces the prefix of this length that holds each VIP it serves, once however many of its
    /// VIPs it holds. At least the length of every CIDR of the pool, so that no address outside
    /// the pool is announced.
    pub aggregation_length: u8,
    /// The same for IPv6 VIPs (default 128).
    #[serde(rename = "aggregationLengthV6")]
    pub aggregation_length_v6: u8,
}

impl Default for PoolBgp {
    fn default() -> Self {
        PoolBgp {
            peers: Vec::new(),
            communities: Vec::new(),
            local_pref: None,
            aggregation_length: 32,
            aggregation_length_v6: 128,
        }
    }
}

impl PoolBgp {
    /// The prefix `ip` is announced in: itself, or the aggregate of the pool's length.
    pub fn prefix_of(&self, ip: IpAddr) -> ipnet::IpNet {
        let length = match ip {
            IpAddr::V4(_) => self.aggregation_length,
            IpAddr::V6(_) => self.aggregation_length_v6,
        };
        ipnet::IpNet::new(ip, length)
            .map(|net| net.trunc())
            .unwrap_or_else(|_| ipnet::IpNet::from(ip))
    }

    /// Whether the aggregation lengths are valid for a pool of `ranges`: within the family's bits,
    /// and no aggregate of a VIP of the pool reaches outside the range it is in. What is wrong, in
    /// words, if anything.
    pub fn aggregation_problem(&self, ranges: &[crate::AddressRange]) -> Option<String> {
        if self.aggregation_length > 32 {
            return Some(format!(
                "bgp.aggregationLength {}: at most 32",
                self.aggregation_length
            ));
        }
        if self.aggregation_length_v6 > 128 {
            return Some(format!(
                "bgp.aggregationLengthV6 {}: at most 128",
                self.aggregation_length_v6
            ));
        }
        for range in ranges {
            // Every aggregate lies between those of the range's ends; a CIDR's network and
            // broadcast addresses may be in one.
            let (first, last) = range.span();
            let low = self.prefix_of(range.first());
            let high = self.prefix_of(range.last());
            if low.network() < first || high.broadcast() > last {
                let (field, length) = if range.first().is_ipv4() {
                    ("aggregationLength", self.aggregation_length)
                } else {
                    ("aggregationLengthV6", self.aggregation_length_v6)
                };
                let outside = if low.network() < range.first() {
                    low
                } else {
                    high
                };
                return Some(format!(
                    "bgp.{field} {length}: {outside} reaches outside the pool's addresses \
                     {first}-{last}: use a length at least that of the pool's CIDRs"
                ));
            }
        }
        None
    }

    /// The path attributes of the pool's routes.
    pub fn path(&self) -> local_bgp::Path {
        let mut path = local_bgp::Path {
            local_preference: self.local_pref,
            ..local_bgp::Path::default()
        };
        for community in &self.communities {
            match *community {
                Community::Standard(c) => path.communities.push(c),
                Community::Large(c) => path.large_communities.push(c),
            }
        }
        path.communities.sort_unstable();
        path.communities.dedup();
        path.large_communities.sort_unstable();
        path.large_communities.dedup();
        path
    }
}

/// A BGP community.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Community {
    /// RFC 1997: `asn << 16 | value`.
    Standard(u32),
    /// RFC 8092.
    Large([u32; 3]),
}

impl FromStr for Community {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "community {text:?}: {why} (expected ASN:VALUE with two 16-bit numbers such as \
                 64512:100, a well-known name: no-export, no-advertise, no-export-subconfed, \
                 no-peer, or large:ASN:VALUE:VALUE with three 32-bit numbers)"
            )
        };
        let well_known = match text {
            "no-export" => Some(0xFFFF_FF01),
            "no-advertise" => Some(0xFFFF_FF02),
            "no-export-subconfed" => Some(0xFFFF_FF03),
            "no-peer" => Some(0xFFFF_FF04),
            _ => None,
        };
        if let Some(value) = well_known {
            return Ok(Community::Standard(value));
        }
        if let Some(large) = text.strip_prefix("large:") {
            let parts: Vec<&str> = large.split(':').collect();
            let numbers: Option<Vec<u32>> = parts.iter().map(|p| p.parse().ok()).collect();
            return match numbers.as_deref() {
                Some(&[a, b, c]) => Ok(Community::Large([a, b, c])),
                _ => Err(bad("not three 32-bit numbers after large:")),
            };
        }
        let Some((asn, value)) = text.split_once(':') else {
            return Err(bad("no colon"));
        };
        match (asn.parse::<u16>(), value.parse::<u16>()) {
            (Ok(asn), Ok(value)) => Ok(Community::Standard(
                (u32::from(asn) << 16) | u32::from(value),
            )),
            _ => Err(bad("not two 16-bit numbers")),
        }
    }
}

impl fmt::Display for Community {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Community::Standard(c) => write!(f, "{}:{}", c >> 16, c & 0xffff),
            Community::Large([a, b, c]) => write!(f, "large:{a}:{b}:{c}"),
        }
    }
}

impl<'de> Deserialize<'de> for Community {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communities_are_read_as_metallb_writes_them() {
        for (text, expected) in [
            ("64512:100", Community::Standard((64512 << 16) | 100)),
            ("no-export", Community::Standard(0xFFFF_FF01)),
            ("no-advertise", Community::Standard(0xFFFF_FF02)),
            (
                "large:4200000000:1:2",
                Community::Large([4_200_000_000, 1, 2]),
            ),
        ] {
            assert_eq!(text.parse::<Community>(), Ok(expected), "{text}");
        }
        for (text, says) in [
            ("64512", "no colon"),
            ("70000:1", "not two 16-bit numbers"),
            ("large:1:2", "not three 32-bit numbers"),
            ("no-exports", "no colon"),
        ] {
            let error = text.parse::<Community>().unwrap_err();
            assert!(error.contains(says) && error.contains(text), "{error}");
        }
    }

    #[test]
    fn a_password_file_is_read_when_the_session_starts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tor-a");
        let text = format!(
            "loadBalancer: {{mode: agents, bgp: {{peers: [{{name: tor-a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passwordFile: {}}}]}}}}",
            file.display()
        );
        let config = crate::Config::parse(&text, None).unwrap();
        let peer = &config.load_balancer.bgp.peers[0];
        let missing = peer.session(Some(Ipv4Addr::LOCALHOST), None).unwrap_err();
        assert!(
            missing.contains("passwordFile") && missing.contains("tor-a"),
            "{missing}"
        );
        let inline = crate::Config::parse(
            "loadBalancer: {mode: agents, bgp: {peers: [{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, password: s3cret}]}}",
            None,
        )
        .unwrap();
        assert!(
            !format!("{inline:?}").contains("s3cret"),
            "a password is never printed"
        );
        std::fs::write(&file, "s3cret\n").unwrap();
        let session = peer.session(Some(Ipv4Addr::LOCALHOST), None).unwrap();
        assert_eq!(
            session.password,
            Some(local_bgp::Password(b"s3cret".to_vec()))
        );
    }

    #[test]
    fn a_passive_peer_listens_on_port_179_of_its_source_address_or_of_every_address() {
        for (peer, listens) in [
            (
                "{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passive: true, sourceAddress: 10.0.0.5}",
                Some("10.0.0.5:179"),
            ),
            (
                "{name: b, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passive: true}",
                Some("[::]:179"),
            ),
            (
                "{name: c, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}",
                None,
            ),
        ] {
            let text = format!("loadBalancer: {{mode: agents, bgp: {{peers: [{peer}]}}}}");
            let config = crate::Config::parse(&text, None).unwrap();
            let session = config.load_balancer.bgp.peers[0]
                .session(Some(Ipv4Addr::LOCALHOST), None)
                .unwrap();
            assert_eq!(
                session.passive,
                listens.map(|l| l.parse().unwrap()),
                "{peer}"
            );
        }
    }

    #[test]
    fn a_passive_peer_refuses_a_port_it_would_never_use_and_listeners_that_cannot_coexist() {
        for (peers, says) in [
            (
                "{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passive: true, peerPort: 1179}",
                "peerPort 1179 with passive: true",
            ),
            (
                "{name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2, passive: true}, \
                 {name: b, peerAddress: 10.0.0.2, peerASN: 1, myASN: 2, passive: true, sourceAddress: 10.0.0.5}",
                "peers \"a\" and \"b\": both passive",
            ),
        ] {
            let text = format!("loadBalancer: {{mode: agents, bgp: {{peers: [{peers}]}}}}");
            let err = crate::Config::parse(&text, None).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn a_pool_s_path_has_each_community_once() {
        let pool = PoolBgp {
            communities: vec![
                "64512:2".parse().unwrap(),
                "64512:1".parse().unwrap(),
                "64512:2".parse().unwrap(),
                "large:1:2:3".parse().unwrap(),
            ],
            local_pref: Some(200),
            ..PoolBgp::default()
        };
        let path = pool.path();
        assert_eq!(path.communities, vec![(64512 << 16) | 1, (64512 << 16) | 2]);
        assert_eq!(path.large_communities, vec![[1, 2, 3]]);
        assert_eq!(path.local_preference, Some(200));
    }
}
