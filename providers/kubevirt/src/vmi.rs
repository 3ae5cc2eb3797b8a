//! KubeVirt's `VirtualMachineInstance`, the fields the provider reads (kubevirt.io/api core/v1; the
//! crate does not depend on KubeVirt's Go types, and no Rust crate carries them).

use std::collections::BTreeMap;

use kube::{
    api::ApiResource,
    core::{GroupVersionKind, Object},
};
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VmiSpec {
    /// The guest's hostname (the third look-up of a node's VMI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `status`, as far as read.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
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

/// One entry of `status.interfaces`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
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
