//! `inventory`: a provider whose cloud is a static inventory file, one instance per line:
//!
//! ```text
//! # node-name   zone     instance-type
//! worker-1      zone-a   m5.large
//! ```
//!
//! It offers InstancesV2 only; a node not in the inventory does not exist. Replace the inventory with
//! calls to your cloud's API and you have a provider.

use std::{collections::BTreeMap, sync::Arc};

use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, ProviderId,
    ProviderResult, async_trait, k8s_openapi::api::core::v1::Node, register_provider,
};

/// The name `--cloud-provider` selects, and the scheme of this provider's IDs.
pub const NAME: &str = "inventory";

// Linking this crate into a manager binary makes `--cloud-provider=inventory` available.
register_provider!(NAME, new_provider);

/// The factory: parses the `--cloud-config` inventory.
pub fn new_provider(config: &CloudConfig) -> ProviderResult {
    let text = config.text()?.unwrap_or_default();
    Ok(Arc::new(Inventory::parse(text)?))
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Machine {
    zone: String,
    instance_type: String,
}

/// The cloud: machines by node name.
#[derive(Debug, Default)]
pub struct Inventory {
    machines: BTreeMap<String, Machine>,
}

impl Inventory {
    /// Parses the inventory; a malformed line is an error that names it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut machines = BTreeMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, zone, instance_type] = fields[..] else {
                return Err(format!(
                    "inventory line {}: expected `node-name zone instance-type`, got {line:?}",
                    number + 1
                ));
            };
            let machine = Machine {
                zone: zone.to_owned(),
                instance_type: instance_type.to_owned(),
            };
            if machines.insert(name.to_owned(), machine).is_some() {
                return Err(format!(
                    "inventory line {}: node {name:?} is listed twice",
                    number + 1
                ));
            }
        }
        Ok(Self { machines })
    }

    /// The machine of a node: by provider ID when it has one, else by name.
    fn machine(&self, node: &Node) -> Option<(String, &Machine)> {
        let name = match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(id) if !id.is_empty() => {
                ProviderId::parse_for(NAME, id).ok()?.instance().to_owned()
            }
            _ => node.metadata.name.clone()?,
        };
        let machine = self.machines.get(&name)?;
        Some((name, machine))
    }
}

#[async_trait]
impl InstancesV2 for Inventory {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.machine(node).is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.machine(node)
            .map(|_| false)
            .ok_or(CloudError::InstanceNotFound)
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let (name, machine) = self.machine(node).ok_or(CloudError::InstanceNotFound)?;
        Ok(Some(InstanceMetadata {
            provider_id: ProviderId::new(NAME, name).to_string(),
            instance_type: machine.instance_type.clone(),
            zone: machine.zone.clone(),
            region: machine
                .zone
                .rsplit_once('-')
                .map(|(region, _)| region.to_owned())
                .unwrap_or_default(),
            ..Default::default()
        }))
    }
}

impl CloudProvider for Inventory {
    fn provider_name(&self) -> &str {
        NAME
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}
