//! InstancesV2: a tenant node is the VMI of the same name (or of its `node.kubernetes.io/instance-id`
//! label, or whose `spec.hostname` is the node's name) in the infra namespace, as upstream finds it.
//! The pure part (which VMI to look for, what the node's addresses are) is apart from the calls.

use cloud_provider::{CloudError, CloudResult, InstanceMetadata};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::{
    Error,
    infra::Infra,
    vmi::{self, Phase, Vmi},
};

/// The label a tenant node may carry with its VMI's name (upstream's `instanceIDLabelKey`).
pub const INSTANCE_ID_LABEL: &str = "node.kubernetes.io/instance-id";

/// How a node's VMI is looked for, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The VMI of this name.
    ByName(String),
    /// The one VMI whose `spec.hostname` is this.
    ByHostname(String),
}

/// Upstream's order: the `instance-id` label alone when the node has it, else the node's name as a
/// VMI name and then as a hostname.
pub fn lookups(node: &Node) -> Vec<Lookup> {
    let name = node.metadata.name.clone().unwrap_or_default();
    match node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(INSTANCE_ID_LABEL))
    {
        Some(id) => vec![Lookup::ByName(id.clone())],
        None => vec![Lookup::ByName(name.clone()), Lookup::ByHostname(name)],
    }
}

/// The VMI name in a provider ID `kubevirt://<name>` (upstream's pattern, `[0-9A-Za-z_-]+`).
pub fn vmi_name(provider_id: &str) -> Option<&str> {
    let name = provider_id
        .strip_prefix(crate::PROVIDER_NAME)?
        .strip_prefix("://")?;
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(name)
}

/// The provider ID of the VMI `name`.
pub fn provider_id(name: &str) -> String {
    format!("{}://{name}", crate::PROVIDER_NAME)
}

/// The node's addresses: every address of the VMI's `default` interface as an InternalIP (both
/// families on a dual-stack VMI), else, as upstream, the InternalIPs the node has (a guest agent that
/// has not reported yet must not take the node's address away). Neither: an error naming the VMI.
pub fn node_addresses(vmi: &Vmi, previous: &[NodeAddress]) -> Result<Vec<NodeAddress>, String> {
    let mut addresses: Vec<NodeAddress> = Vec::new();
    let mut add = |address: &str| {
        if !addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == address)
        {
            addresses.push(cloud_provider::node_address("InternalIP", address));
        }
    };
    let reported = vmi::default_interface_addresses(vmi);
    match reported.as_deref() {
        Some(found) if !found.is_empty() => found.iter().for_each(|a| add(a)),
        _ => previous
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .for_each(|a| add(&a.address)),
    }
    if addresses.is_empty() {
        let name = vmi.metadata.name.as_deref().unwrap_or_default();
        let why = match reported {
            None => {
                let names: Vec<&str> = vmi
                    .status
                    .iter()
                    .flat_map(|s| &s.interfaces)
                    .filter_map(|i| i.name.as_deref())
                    .collect();
                format!(
                    "has no interface named \"{}\" in status.interfaces (it has {names:?})",
                    vmi::DEFAULT_INTERFACE
                )
            }
            Some(_) => format!(
                "reports no address on its \"{}\" interface yet",
                vmi::DEFAULT_INTERFACE
            ),
        };
        return Err(format!(
            "VirtualMachineInstance {name} {why}, and the node has no InternalIP to keep"
        ));
    }
    Ok(addresses)
}

/// The instances of the infra cluster.
pub struct Instances<'a> {
    /// The infra cluster.
    pub infra: &'a Infra,
    /// Region and zone from the infra node.
    pub zone_and_region: bool,
}

impl Instances<'_> {
    async fn find(&self, node: &Node) -> Result<Option<Vmi>, Error> {
        for lookup in lookups(node) {
            match lookup {
                Lookup::ByName(name) => {
                    if let Some(vmi) = self.infra.vmi(&name).await? {
                        return Ok(Some(vmi));
                    }
                }
                Lookup::ByHostname(hostname) => {
                    let mut found = self.infra.vmis_by_hostname(&hostname).await?;
                    match found.len() {
                        0 => {}
                        1 => return Ok(found.pop()),
                        n => {
                            return Err(Error::Infrastructure(format!(
                                "{n} VirtualMachineInstances in {} have the hostname {hostname:?}: cannot tell which is node {hostname}'s",
                                self.infra.namespace()
                            )));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// The VMI the node's provider ID names (`None`: no such VMI). A node without a provider ID yet is
    /// looked for as [`Instances::metadata`] does (the framework's contract: upstream errs there);
    /// another cloud's provider ID is an error, never "gone" (which would delete the node).
    async fn by_provider_id(&self, node: &Node) -> Result<Option<Vmi>, Error> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        if provider_id.is_empty() {
            return self.find(node).await;
        }
        let name = vmi_name(provider_id).ok_or_else(|| Error::ProviderId {
            node: node.metadata.name.clone().unwrap_or_default(),
            provider_id: provider_id.to_owned(),
        })?;
        self.infra.vmi(name).await
    }

    /// Upstream's `InstanceExists`.
    pub async fn exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.by_provider_id(node).await?.is_some())
    }

    /// Upstream's `InstanceShutdown`: a missing VMI, or one `Succeeded` or `Failed`, is shut down; one
    /// in phase `Unknown` is an error (never a taint: its host is probably down, not the guest).
    pub async fn shutdown(&self, node: &Node) -> CloudResult<bool> {
        let Some(vmi) = self.by_provider_id(node).await? else {
            return Ok(true);
        };
        match vmi::phase(&vmi) {
            Phase::Down => Ok(true),
            Phase::Up => Ok(false),
            Phase::Unknown => Err(Error::Infrastructure(format!(
                "VirtualMachineInstance {}/{} is in phase Unknown (its infra node is probably down): not saying whether it is shut down",
                self.infra.namespace(),
                vmi.metadata.name.as_deref().unwrap_or_default()
            ))
            .into()),
        }
    }

    /// Upstream's `InstanceMetadata`.
    pub async fn metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let Some(vmi) = self.find(node).await? else {
            return Err(CloudError::InstanceNotFound);
        };
        let previous = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or_default();
        let node_addresses = node_addresses(&vmi, previous).map_err(Error::Infrastructure)?;
        let instance_type = vmi::annotations(&vmi)
            .get(vmi::INSTANCE_TYPE_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        let (region, zone) = if self.zone_and_region {
            self.region_and_zone(&vmi).await?
        } else {
            (String::new(), String::new())
        };
        Ok(Some(InstanceMetadata {
            provider_id: provider_id(vmi.metadata.name.as_deref().unwrap_or_default()),
            instance_type,
            node_addresses,
            zone,
            region,
            ..Default::default()
        }))
    }

    /// The topology labels of the infra node the VMI runs on.
    async fn region_and_zone(&self, vmi: &Vmi) -> Result<(String, String), Error> {
        let vmi_name = vmi.metadata.name.as_deref().unwrap_or_default();
        let Some(node_name) = vmi
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
        else {
            return Err(Error::Infrastructure(format!(
                "VirtualMachineInstance {}/{vmi_name} has no status.nodeName: its region and zone are not known yet",
                self.infra.namespace()
            )));
        };
        let node = self.infra.node(node_name).await?.ok_or_else(|| {
            Error::Infrastructure(format!(
                "VirtualMachineInstance {}/{vmi_name} runs on infra node {node_name}, which does not exist",
                self.infra.namespace()
            ))
        })?;
        let label = |key: &str| {
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .cloned()
                .unwrap_or_default()
        };
        Ok((
            label("topology.kubernetes.io/region"),
            label("topology.kubernetes.io/zone"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::vmi::{VmiInterface, VmiStatus};

    fn node(name: &str, instance_id: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        if let Some(id) = instance_id {
            node.metadata.labels = Some(BTreeMap::from([(INSTANCE_ID_LABEL.into(), id.into())]));
        }
        node
    }

    fn vmi(interfaces: Vec<(&str, Option<&str>, Vec<&str>)>) -> Vmi {
        let mut vmi = Vmi::new("vm-1", &vmi::api_resource(), Default::default());
        vmi.status = Some(VmiStatus {
            phase: Some("Running".into()),
            node_name: Some("infra-1".into()),
            interfaces: interfaces
                .into_iter()
                .map(|(name, first, all)| VmiInterface {
                    name: Some(name.into()),
                    ip_address: first.map(Into::into),
                    ip_addresses: all.into_iter().map(Into::into).collect(),
                })
                .collect(),
        });
        vmi
    }

    fn internal(addresses: &[&str]) -> Vec<NodeAddress> {
        addresses
            .iter()
            .map(|a| cloud_provider::node_address("InternalIP", *a))
            .collect()
    }

    #[test]
    fn lookups_follow_upstreams_order() {
        assert_eq!(
            lookups(&node("n1", None)),
            vec![Lookup::ByName("n1".into()), Lookup::ByHostname("n1".into())]
        );
        assert_eq!(
            lookups(&node("n1", Some("vm-7"))),
            vec![Lookup::ByName("vm-7".into())]
        );
    }

    #[test]
    fn provider_ids() {
        for (id, expected) in [
            ("kubevirt://vm-1", Some("vm-1")),
            ("kubevirt://vm_1-A", Some("vm_1-A")),
            ("kubevirt://", None),
            ("kubevirt://ns/vm", None),
            ("kubevirt:/vm", None),
            ("aws:///us-east-1a/i-1", None),
            ("", None),
        ] {
            assert_eq!(vmi_name(id), expected, "{id}");
        }
        assert_eq!(provider_id("vm-1"), "kubevirt://vm-1");
    }

    /// A VMI, the node's previous addresses, and the addresses expected (or a fragment of the error).
    type AddressCase = (
        Vmi,
        Vec<NodeAddress>,
        Result<Vec<NodeAddress>, &'static str>,
    );

    #[test]
    fn addresses_of_the_default_interface() {
        let cases: Vec<AddressCase> = vec![
            (
                vmi(vec![(
                    "default",
                    Some("10.0.0.5"),
                    vec!["10.0.0.5", "fd00::5"],
                )]),
                vec![],
                Ok(internal(&["10.0.0.5", "fd00::5"])),
            ),
            (
                vmi(vec![
                    ("other", None, vec!["192.168.1.1"]),
                    ("default", Some("10.0.0.5"), vec![]),
                ]),
                vec![],
                Ok(internal(&["10.0.0.5"])),
            ),
            (
                vmi(vec![("default", None, vec!["10.0.0.5", "10.0.0.5"])]),
                vec![],
                Ok(internal(&["10.0.0.5"])),
            ),
            // Nothing reported yet: the node keeps its InternalIPs (not its other addresses).
            (
                vmi(vec![("default", None, vec![])]),
                vec![
                    cloud_provider::node_address("InternalIP", "10.0.0.9"),
                    cloud_provider::node_address("Hostname", "n1"),
                ],
                Ok(internal(&["10.0.0.9"])),
            ),
            (
                vmi(vec![("secondary", None, vec!["192.168.1.1"])]),
                vec![],
                Err(
                    "has no interface named \"default\" in status.interfaces (it has [\"secondary\"])",
                ),
            ),
            (
                vmi(vec![("default", None, vec![])]),
                vec![],
                Err("reports no address on its \"default\" interface yet"),
            ),
        ];
        for (vmi, previous, expected) in cases {
            let got = node_addresses(&vmi, &previous);
            match expected {
                Ok(addresses) => assert_eq!(got, Ok(addresses)),
                Err(fragment) => {
                    let err = got.expect_err(fragment);
                    assert!(err.contains(fragment) && err.contains("vm-1"), "{err}");
                }
            }
        }
    }
}
