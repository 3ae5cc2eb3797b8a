//! The `spec` of MetalLB's objects (`metallb.io`, v0.15), field for field: every field MetalLB has is
//! named here, so that one `local` does not implement is refused by its name, and a field MetalLB
//! does not have either is refused as unknown.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `IPAddressPool.spec` (v1beta1).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct IpAddressPoolSpec {
    pub addresses: Vec<String>,
    #[serde(default)]
    pub auto_assign: Option<bool>,
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    #[serde(default)]
    pub service_allocation: Option<ServiceAllocation>,
}

/// `IPAddressPool.spec.serviceAllocation`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ServiceAllocation {
    pub priority: i64,
    pub namespaces: Vec<String>,
    pub namespace_selectors: Vec<serde_json::Value>,
    pub service_selectors: Vec<serde_json::Value>,
}

/// `L2Advertisement.spec` (v1beta1).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct L2AdvertisementSpec {
    #[serde(rename = "ipAddressPools")]
    pub ip_address_pools: Vec<String>,
    #[serde(rename = "ipAddressPoolSelectors")]
    pub ip_address_pool_selectors: Vec<serde_json::Value>,
    pub node_selectors: Vec<serde_json::Value>,
    pub interfaces: Vec<String>,
}

/// `BGPAdvertisement.spec` (v1beta1).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct BgpAdvertisementSpec {
    pub aggregation_length: Option<i64>,
    #[serde(rename = "aggregationLengthV6")]
    pub aggregation_length_v6: Option<i64>,
    pub local_pref: u32,
    pub communities: Vec<String>,
    #[serde(rename = "ipAddressPools")]
    pub ip_address_pools: Vec<String>,
    #[serde(rename = "ipAddressPoolSelectors")]
    pub ip_address_pool_selectors: Vec<serde_json::Value>,
    pub node_selectors: Vec<serde_json::Value>,
    pub peers: Vec<String>,
}

/// `BGPPeer.spec` (v1beta2; v1beta1 objects are served converted by the API server).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct BgpPeerSpec {
    #[serde(rename = "myASN")]
    pub my_asn: u32,
    #[serde(default, rename = "peerASN")]
    pub peer_asn: u32,
    #[serde(default, rename = "dynamicASN")]
    pub dynamic_asn: Option<String>,
    #[serde(default)]
    pub peer_address: Option<String>,
    #[serde(default)]
    pub interface: Option<String>,
    #[serde(default)]
    pub source_address: Option<String>,
    #[serde(default)]
    pub peer_port: Option<u16>,
    #[serde(default)]
    pub hold_time: Option<String>,
    #[serde(default)]
    pub keepalive_time: Option<String>,
    #[serde(default)]
    pub connect_time: Option<String>,
    #[serde(default, rename = "routerID")]
    pub router_id: Option<String>,
    #[serde(default)]
    pub node_selectors: Vec<serde_json::Value>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub password_secret: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    pub bfd_profile: Option<String>,
    #[serde(default)]
    pub enable_graceful_restart: bool,
    #[serde(default)]
    pub ebgp_multi_hop: bool,
    #[serde(default)]
    pub vrf: Option<String>,
    #[serde(default, rename = "disableMP")]
    pub disable_mp: bool,
    #[serde(default)]
    pub dual_stack_address_family: bool,
}

/// `BFDProfile.spec` (v1beta1).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct BfdProfileSpec {
    pub receive_interval: Option<u32>,
    pub transmit_interval: Option<u32>,
    pub detect_multiplier: Option<u32>,
    pub echo_interval: Option<u32>,
    pub echo_mode: Option<bool>,
    pub passive_mode: Option<bool>,
    pub minimum_ttl: Option<u32>,
}

/// `Community.spec` (v1beta1).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CommunitySpec {
    pub communities: Vec<CommunityAlias>,
}

/// One alias of a `Community`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CommunityAlias {
    pub name: String,
    pub value: String,
}
