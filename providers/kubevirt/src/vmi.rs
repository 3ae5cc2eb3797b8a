//! KubeVirt's `VirtualMachineInstance`, the fields the provider reads (kubevirt.io/api core/v1; the
//! crate does not depend on KubeVirt's Go types, and no Rust crate carries them).

use std::collections::BTreeMap;

use kube::{
    api::ApiResource,
    core::{GroupVersionKind, Object},
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A VMI: `kubevirt.io/v1`, `VirtualMachineInstance`.
pub type Vmi = Object<VmiSpec, VmiStatus>;

/// The annotation KubeVirt sets with the VMI's instance type (`kubevirtv1.InstancetypeAnnotation`).
pub const INSTANCE_TYPE_ANNOTATION: &str = "kubevirt.io/instancetype-name";

/// The interface whose addresses are the node's (upstream's rule).
pub const DEFAULT_INTERFACE: &str = "default";

/// The API resource of VMIs.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    )
}

/// `spec`, as far as read.
///
/// The three types below read their fields leniently: a field of the wrong shape is read as absent.
/// KubeVirt's own CRD has a schema that rules that out, a hand-made one may not, and one malformed VMI
/// must not stop the watch (and so the endpoint mirroring) of every other: the look-ups that need the
/// field then say what is missing, naming the VMI.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VmiSpec {
    /// The guest's hostname (the third look-up of a node's VMI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `status`, as far as read (leniently, as [`VmiSpec`]).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VmiStatus {
    /// `Pending`, `Scheduling`, `Scheduled`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The infra node the VMI runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The guest's interfaces as the guest agent reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<VmiInterface>,
}

/// One entry of `status.interfaces` (read leniently, as [`VmiSpec`]).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VmiInterface {
    /// The network's name (`default` for the pod network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The first address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// Every address (both families on a dual-stack network).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
}

fn text(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

impl VmiInterface {
    fn read(value: &Value) -> Option<Self> {
        value.is_object().then(|| Self {
            name: text(value, "name"),
            ip_address: text(value, "ipAddress"),
            ip_addresses: value
                .get("ipAddresses")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

impl<'de> Deserialize<'de> for VmiSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(Self {
            hostname: text(&value, "hostname"),
        })
    }
}

impl<'de> Deserialize<'de> for VmiStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(Self {
            phase: text(&value, "phase"),
            node_name: text(&value, "nodeName"),
            interfaces: value
                .get("interfaces")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(VmiInterface::read).collect())
                .unwrap_or_default(),
        })
    }
}

/// A VMI's phase as the provider reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `Succeeded` or `Failed`: the guest is down.
    Down,
    /// `Unknown`: the infra cannot say (its host is probably down).
    Unknown,
    /// Anything else (running, or on its way).
    Up,
}

/// The phase of `vmi`.
pub fn phase(vmi: &Vmi) -> Phase {
    match vmi.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded" | "Failed") => Phase::Down,
        Some("Unknown") => Phase::Unknown,
        _ => Phase::Up,
    }
}

/// Whether `vmi` is `Running`.
pub fn running(vmi: &Vmi) -> bool {
    vmi.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The addresses of the `default` interface (all of them, in the order reported: `ipAddresses`, else
/// `ipAddress`), or `None` when there is no such interface.
pub fn default_interface_addresses(vmi: &Vmi) -> Option<Vec<String>> {
    let interface = vmi
        .status
        .as_ref()?
        .interfaces
        .iter()
        .find(|i| i.name.as_deref() == Some(DEFAULT_INTERFACE))?;
    let mut addresses: Vec<String> = interface
        .ip_addresses
        .iter()
        .filter(|a| !a.is_empty())
        .cloned()
        .collect();
    if addresses.is_empty()
        && let Some(first) = interface.ip_address.as_ref().filter(|a| !a.is_empty())
    {
        addresses.push(first.clone());
    }
    Some(addresses)
}

/// The VMI's annotations (empty when it has none).
pub fn annotations(vmi: &Vmi) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    vmi.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(object: serde_json::Value) -> Vmi {
        serde_json::from_value(object).expect("a VMI, however malformed its spec and status")
    }

    #[test]
    fn a_well_formed_vmi_is_read() {
        let vmi = read(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm-1"},
            "spec": {"hostname": "host-1", "domain": {}},
            "status": {"phase": "Running", "nodeName": "infra-a", "interfaces": [
                {"name": "default", "ipAddress": "10.0.0.1", "ipAddresses": ["10.0.0.1", "fd00::1"]}]},
        }));
        assert_eq!(vmi.spec.hostname.as_deref(), Some("host-1"));
        assert!(running(&vmi));
        assert_eq!(
            default_interface_addresses(&vmi),
            Some(vec!["10.0.0.1".to_owned(), "fd00::1".to_owned()])
        );
    }

    #[test]
    fn malformed_fields_read_as_absent_and_the_rest_is_kept() {
        // (spec, status, hostname, phase, addresses of `default`)
        for (spec, status, hostname, phase, addresses) in [
            (json!("oops"), json!({"phase": 5}), None, None, None),
            (json!({"hostname": ["a"]}), json!("oops"), None, None, None),
            (
                json!({"hostname": "h"}),
                json!({"phase": "Failed", "interfaces": "oops"}),
                Some("h"),
                Some("Failed"),
                None,
            ),
            (
                json!({}),
                json!({"interfaces": [7, {"name": "default", "ipAddresses": ["10.0.0.2", 3]}]}),
                None,
                None,
                Some(vec!["10.0.0.2".to_owned()]),
            ),
        ] {
            let vmi = read(json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "vm-1"}, "spec": spec, "status": status,
            }));
            assert_eq!(vmi.spec.hostname.as_deref(), hostname);
            assert_eq!(vmi.status.as_ref().and_then(|s| s.phase.as_deref()), phase);
            assert_eq!(default_interface_addresses(&vmi), addresses);
        }
    }
}
