//! `inventory`: a provider whose cloud is a static inventory file, one instance per line:
//!
//! ```text
//! # node-name   zone     instance-type
//! worker-1      zone-a   m5.large
//! ```
//!
//! It offers InstancesV2 only; a node not in the inventory does not exist. Replace the inventory with
//! calls to your cloud's API and you have a provider.
//!
//! It also shows the two extension points a provider's binary has: flags of its own ([`InventoryFlags`],
//! registered with the provider) and a controller of its own ([`audit`], added in `main.rs`).

pub mod audit;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

// The contract re-exports what a provider needs at the versions it was built with; `clap` here lets
// `#[derive(clap::Args)]` work without a dependency of our own.
use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, ProviderId,
    ProviderResult, async_trait, clap, flag_values, k8s_openapi::api::core::v1::Node,
    register_provider,
};

/// The name `--cloud-provider` selects, and the scheme of this provider's IDs.
pub const NAME: &str = "inventory";

/// The provider's own flags: shown in `--help` under "Provider inventory", read by the factory and by
/// the audit controller.
#[derive(Debug, Clone, clap::Args)]
pub struct InventoryFlags {
    /// The region of machines whose zone has no `-` (e.g. zone `lab` in region `home`).
    #[arg(long, default_value = "")]
    pub inventory_default_region: String,

    /// How often the inventory-audit controller looks for nodes the inventory does not list.
    #[arg(long, default_value = "1m", value_parser = flag_values::positive_go_duration)]
    pub inventory_audit_period: Duration,
}

// Linking this crate into a manager binary makes `--cloud-provider=inventory` available, with its flags.
register_provider!(NAME, new_provider, flags = InventoryFlags);

/// The factory: parses the `--cloud-config` inventory and reads the provider's flags.
pub fn new_provider(config: &CloudConfig) -> ProviderResult {
    let text = config.text()?.unwrap_or_default();
    let flags: InventoryFlags = config.flags()?;
    let mut inventory = Inventory::parse(text)?;
    inventory.default_region = flags.inventory_default_region;
    Ok(Arc::new(inventory))
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
    default_region: String,
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
        Ok(Self {
            machines,
            default_region: String::new(),
        })
    }

    /// The machine of a node: by provider ID when it has one, else by name.
    fn machine(&self, node: &Node) -> Option<(String, &Machine)> {
        let name = ProviderId::instance_of_node(NAME, node)?;
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
                .unwrap_or_else(|| self.default_region.clone()),
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
