//! Values a provider's YAML or JSON cloud-config commonly holds, deserializable with serde, so each
//! provider does not write them again: durations in Go's syntax and node addresses.

use std::{str::FromStr, time::Duration};

use k8s_openapi::api::core::v1::NodeAddress;
use serde::{Deserialize, Deserializer, de};

use crate::parse_go_duration;

/// A duration written as Go writes them: `20ms`, `1.5s`, `1m30s`, `0`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_go_duration(text).map(Self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

/// A node address in a cloud-config (`{type: InternalIP, address: 10.0.0.7}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressConfig {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS` or `ExternalDNS`.
    #[serde(rename = "type")]
    pub type_: AddressType,
    /// The address (an IP for the `*IP` types).
    pub address: String,
}

impl AddressConfig {
    /// The address as the Node API has it.
    pub fn to_node_address(&self) -> NodeAddress {
        crate::node_address(self.type_.as_str(), self.address.clone())
    }
}

/// The node address types Kubernetes knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum AddressType {
    /// `InternalIP`
    #[serde(rename = "InternalIP")]
    InternalIp,
    /// `ExternalIP`
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    /// `Hostname`
    Hostname,
    /// `InternalDNS`
    #[serde(rename = "InternalDNS")]
    InternalDns,
    /// `ExternalDNS`
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
}

impl AddressType {
    /// The name Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InternalIp => "InternalIP",
            Self::ExternalIp => "ExternalIP",
            Self::Hostname => "Hostname",
            Self::InternalDns => "InternalDNS",
            Self::ExternalDns => "ExternalDNS",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_addresses_read_as_written() {
        let d: GoDuration = serde_json::from_str("\"1m30s\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(90));
        assert!(serde_json::from_str::<GoDuration>("\"90\"").is_err());
        let a: AddressConfig =
            serde_json::from_str(r#"{"type": "InternalIP", "address": "10.0.0.7"}"#).unwrap();
        assert_eq!(a.to_node_address().type_, "InternalIP");
        assert!(
            serde_json::from_str::<AddressConfig>(r#"{"type": "InternalIp", "address": "x"}"#)
                .is_err()
        );
        assert!(
            serde_json::from_str::<AddressConfig>(
                r#"{"type": "Hostname", "address": "x", "extra": 1}"#
            )
            .is_err()
        );
    }
}
