//! Instances of the fake cloud: InstancesV2, and the legacy Instances and Zones APIs.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use async_trait::async_trait;
use cloud_provider::{
    CloudError, CloudResult, InstanceMetadata, Instances, InstancesV2, ProviderId, Zone, Zones,
    node_address,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::{Config, FakeCloud, InstanceState, PROVIDER_NAME};

/// An instance as the cloud sees it: a listed one with its defaults filled in, or an unlisted one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instance {
    pub provider_id: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    pub addresses: Vec<NodeAddress>,
    pub additional_labels: BTreeMap<String, String>,
    pub state: InstanceState,
    /// Its own latency (`instances.<name>.latency`), added to every call about it.
    pub latency: Duration,
}

/// FNV-1a, 64 bits.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The InternalIP of an instance that lists no addresses: `10.a.b.c`, where `a`, `b` and `c` come from
/// the 32-bit FNV-1a hash `h` of the node name: `a = h >> 24`, `b = (h >> 16) & 255`,
/// `c = 1 + ((h >> 8) & 255) % 254`. Pure, so a peer implementation (the Go benchmark peer) can
/// reproduce it.
pub fn derived_internal_ip(node_name: &str) -> Ipv4Addr {
    let h = node_name.bytes().fold(0x811c_9dc5u32, |hash, b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    Ipv4Addr::new(
        10,
        (h >> 24) as u8,
        ((h >> 16) & 255) as u8,
        1 + (((h >> 8) & 255) % 254) as u8,
    )
}

fn default_provider_id(node_name: &str) -> String {
    format!("{PROVIDER_NAME}://{node_name}")
}

/// The instance behind a node name, whether or not it is listed (state `gone` included).
fn instance_by_name(config: &Config, node_name: &str) -> Instance {
    let defaults = &config.instance_defaults;
    match config.instances.get(node_name) {
        Some(listed) => Instance {
            provider_id: listed
                .provider_id
                .clone()
                .unwrap_or_else(|| default_provider_id(node_name)),
            instance_type: listed
                .instance_type
                .clone()
                .unwrap_or_else(|| defaults.instance_type.clone()),
            zone: listed.zone.clone().unwrap_or_else(|| defaults.zone.clone()),
            region: listed
                .region
                .clone()
                .unwrap_or_else(|| defaults.region.clone()),
            addresses: match &listed.addresses {
                Some(addresses) => addresses
                    .iter()
                    .map(cloud_provider::config_values::AddressConfig::to_node_address)
                    .collect(),
                None => vec![node_address(
                    "InternalIP",
                    derived_internal_ip(node_name).to_string(),
                )],
            },
            additional_labels: listed.additional_labels.clone(),
            state: listed.state,
            latency: listed.latency.0,
        },
        None => Instance {
            provider_id: default_provider_id(node_name),
            instance_type: defaults.instance_type.clone(),
            zone: defaults.zone.clone(),
            region: defaults.region.clone(),
            addresses: vec![node_address(
                "InternalIP",
                derived_internal_ip(node_name).to_string(),
            )],
            additional_labels: BTreeMap::new(),
            state: InstanceState::Running,
            latency: Duration::ZERO,
        },
    }
}

/// The instance with this provider ID: a listed instance with that ID, else the unlisted node that
/// `fake://<name>` names. `None` when no instance has the ID.
fn instance_by_provider_id(config: &Config, provider_id: &str) -> Option<Instance> {
    if let Some((name, _)) = config.instances.iter().find(|(name, listed)| {
        listed
            .provider_id
            .clone()
            .unwrap_or_else(|| default_provider_id(name))
            == provider_id
    }) {
        return Some(instance_by_name(config, name));
    }
    let id = ProviderId::parse_for(PROVIDER_NAME, provider_id).ok()?;
    let name = id.instance();
    // A listed node with its own provider ID is not reachable under fake://<name>.
    (!config.instances.contains_key(name)).then(|| instance_by_name(config, name))
}

/// Finds the instance of `node`: by provider ID when the node has one, else by name. Gone instances are
/// not found.
fn find(config: &Config, node_name: &str, provider_id: Option<&str>) -> CloudResult<Instance> {
    let instance = match provider_id.filter(|id| !id.is_empty()) {
        Some(id) => instance_by_provider_id(config, id),
        None => Some(instance_by_name(config, node_name)),
    };
    instance
        .filter(|i| i.state != InstanceState::Gone)
        .ok_or(CloudError::InstanceNotFound)
}

/// Waits the instance's own latency (a call about an instance that is not found waits nothing).
async fn slow(found: CloudResult<Instance>) -> CloudResult<Instance> {
    if let Ok(instance) = &found
        && !instance.latency.is_zero()
    {
        tokio::time::sleep(instance.latency).await;
    }
    found
}

fn find_node(config: &Config, node: &Node) -> CloudResult<Instance> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    find(config, name, provider_id)
}

fn found_by_id(config: &Config, provider_id: &str) -> CloudResult<Instance> {
    find(config, "", Some(provider_id))
}

/// `Ok(false)` for a missing instance; other errors pass through.
fn exists(found: CloudResult<Instance>) -> CloudResult<bool> {
    match found {
        Ok(_) => Ok(true),
        Err(CloudError::InstanceNotFound) => Ok(false),
        Err(err) => Err(err),
    }
}

#[async_trait]
impl InstancesV2 for FakeCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        let config = self.enter("instance_exists").await?;
        exists(slow(find_node(&config, node)).await)
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let config = self.enter("instance_shutdown").await?;
        Ok(slow(find_node(&config, node)).await?.state == InstanceState::Shutdown)
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let config = self.enter("instance_metadata").await?;
        let instance = slow(find_node(&config, node)).await?;
        Ok(Some(InstanceMetadata {
            provider_id: instance.provider_id,
            instance_type: instance.instance_type,
            node_addresses: instance.addresses,
            zone: instance.zone,
            region: instance.region,
            additional_labels: instance.additional_labels,
        }))
    }
}

fn instance_id_of(provider_id: &str) -> String {
    ProviderId::parse(provider_id)
        .map_or_else(|_| provider_id.to_owned(), |id| id.instance().to_owned())
}

#[async_trait]
impl Instances for FakeCloud {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        let config = self.enter("node_addresses").await?;
        Ok(slow(find(&config, node_name, None)).await?.addresses)
    }

    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>> {
        let config = self.enter("node_addresses_by_provider_id").await?;
        Ok(slow(found_by_id(&config, provider_id)).await?.addresses)
    }

    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        let config = self.enter("instance_id").await?;
        Ok(instance_id_of(
            &slow(find(&config, node_name, None)).await?.provider_id,
        ))
    }

    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        let config = self.enter("instance_type").await?;
        Ok(slow(find(&config, node_name, None)).await?.instance_type)
    }

    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String> {
        let config = self.enter("instance_type_by_provider_id").await?;
        Ok(slow(found_by_id(&config, provider_id)).await?.instance_type)
    }

    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        let config = self.enter("instance_exists_by_provider_id").await?;
        exists(slow(found_by_id(&config, provider_id)).await)
    }

    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        let config = self.enter("instance_shutdown_by_provider_id").await?;
        Ok(slow(found_by_id(&config, provider_id)).await?.state == InstanceState::Shutdown)
    }
}

#[async_trait]
impl Zones for FakeCloud {
    async fn get_zone(&self) -> CloudResult<Zone> {
        let config = self.enter("get_zone").await?;
        Ok(Zone {
            failure_domain: config.instance_defaults.zone.clone(),
            region: config.instance_defaults.region.clone(),
        })
    }

    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        let config = self.enter("get_zone_by_provider_id").await?;
        let instance = slow(found_by_id(&config, provider_id)).await?;
        Ok(Zone {
            failure_domain: instance.zone,
            region: instance.region,
        })
    }

    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        let config = self.enter("get_zone_by_node_name").await?;
        let instance = slow(find(&config, node_name, None)).await?;
        Ok(Zone {
            failure_domain: instance.zone,
            region: instance.region,
        })
    }
}

#[cfg(test)]
mod tests {
    use cloud_provider::{CloudProvider, conformance};

    use super::*;

    const LISTED: &str = r#"
instanceDefaults: {instanceType: standard, zone: zone-a, region: region-1}
instances:
  node-a:
    providerID: fake://custom-a
    instanceType: large
    zone: zone-b
    addresses: [{type: InternalIP, address: 10.0.0.1}, {type: ExternalIP, address: 198.51.100.1}]
    additionalLabels: {example.com/rack: r1}
  node-down: {state: shutdown}
  node-gone: {state: gone}
"#;

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        let mut node = conformance::node(name);
        node.spec.as_mut().unwrap().provider_id = provider_id.map(str::to_owned);
        node
    }

    /// `instances.<name>.latency` slows the calls about that instance only, by name or provider ID,
    /// on top of the cloud-wide latency; other instances answer without it.
    #[tokio::test]
    async fn an_instance_latency_slows_only_the_calls_about_that_instance() {
        const SLOW: Duration = Duration::from_millis(400);
        let cloud = FakeCloud::from_yaml(
            "latency: 10ms\ninstances:\n  node-slow: {latency: 400ms}\n  node-listed: {zone: zone-b}\n",
        )
        .unwrap();
        let v2 = cloud.instances_v2().unwrap();
        let started = tokio::time::Instant::now();
        let metadata = v2
            .instance_metadata(&node("node-slow", None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(metadata.provider_id, "fake://node-slow");
        assert!(started.elapsed() >= SLOW, "{:?}", started.elapsed());
        let started = tokio::time::Instant::now();
        assert!(
            v2.instance_exists(&node("x", Some("fake://node-slow")))
                .await
                .unwrap()
        );
        assert!(started.elapsed() >= SLOW, "by provider ID too");
        // Ten calls about other instances, listed or not, take less than one slow call.
        let started = tokio::time::Instant::now();
        for fast in ["node-listed", "node-unlisted"].repeat(5) {
            v2.instance_metadata(&node(fast, None))
                .await
                .unwrap()
                .unwrap();
        }
        assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
        // Not found: no instance, no latency of its own.
        let started = tokio::time::Instant::now();
        assert!(
            !v2.instance_exists(&node("x", Some("other://node-slow")))
                .await
                .unwrap()
        );
        assert!(started.elapsed() < SLOW);

        let legacy =
            FakeCloud::from_yaml("instancesV2: false\ninstances: {node-slow: {latency: 400ms}}\n")
                .unwrap();
        let started = tokio::time::Instant::now();
        legacy
            .instances()
            .unwrap()
            .node_addresses("node-slow")
            .await
            .unwrap();
        legacy
            .zones()
            .unwrap()
            .get_zone_by_node_name("node-slow")
            .await
            .unwrap();
        assert!(started.elapsed() >= SLOW * 2, "the legacy calls wait too");
        // The default is no latency of its own.
        let config = Config::parse("instances: {node-a: {}}", None).unwrap();
        assert!(config.instances["node-a"].latency.0.is_zero());
    }

    #[test]
    fn derived_ips_are_stable_private_and_distinct() {
        let a = derived_internal_ip("node-a");
        assert_eq!(a, derived_internal_ip("node-a"));
        assert_eq!(a.octets()[0], 10);
        assert!((1..=254).contains(&a.octets()[3]));
        let distinct: std::collections::HashSet<_> = (0..1000)
            .map(|i| derived_internal_ip(&format!("node-{i:05}")))
            .collect();
        assert!(distinct.len() > 990, "{} distinct of 1000", distinct.len());
    }

    #[tokio::test]
    async fn unlisted_nodes_are_running_instances_with_the_defaults() {
        let cloud = FakeCloud::from_yaml(LISTED).unwrap();
        let v2 = cloud.instances_v2().unwrap();
        let meta = v2
            .instance_metadata(&node("worker-1", None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(meta.provider_id, "fake://worker-1");
        assert_eq!(
            (
                meta.instance_type.as_str(),
                meta.zone.as_str(),
                meta.region.as_str()
            ),
            ("standard", "zone-a", "region-1")
        );
        assert_eq!(
            meta.node_addresses,
            vec![node_address(
                "InternalIP",
                derived_internal_ip("worker-1").to_string()
            )]
        );
        assert!(
            v2.instance_exists(&node("worker-1", Some("fake://worker-1")))
                .await
                .unwrap()
        );
        assert!(!v2.instance_shutdown(&node("worker-1", None)).await.unwrap());
    }

    #[tokio::test]
    async fn listed_instances_are_found_by_provider_id_first() {
        let cloud = FakeCloud::from_yaml(LISTED).unwrap();
        let v2 = cloud.instances_v2().unwrap();
        let meta = v2
            .instance_metadata(&node("node-a", None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(meta.provider_id, "fake://custom-a");
        assert_eq!(meta.instance_type, "large");
        assert_eq!(meta.zone, "zone-b");
        assert_eq!(meta.region, "region-1");
        assert_eq!(meta.node_addresses.len(), 2);
        assert_eq!(meta.additional_labels["example.com/rack"], "r1");
        // By provider ID, whatever the node is called.
        let renamed = v2
            .instance_metadata(&node("other-name", Some("fake://custom-a")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(renamed.instance_type, "large");
        // A listed node with its own ID is not reachable under fake://<name>.
        assert!(
            !v2.instance_exists(&node("x", Some("fake://node-a")))
                .await
                .unwrap()
        );
        // An ID of another provider names nothing here.
        assert!(
            !v2.instance_exists(&node("worker-1", Some("aws://i-1")))
                .await
                .unwrap()
        );
    }

    #[tokio::test]
    async fn shutdown_and_gone_states() {
        let cloud = FakeCloud::from_yaml(LISTED).unwrap();
        let v2 = cloud.instances_v2().unwrap();
        assert!(v2.instance_exists(&node("node-down", None)).await.unwrap());
        assert!(
            v2.instance_shutdown(&node("node-down", None))
                .await
                .unwrap()
        );
        assert!(!v2.instance_exists(&node("node-gone", None)).await.unwrap());
        assert!(
            !v2.instance_exists(&node("node-gone", Some("fake://node-gone")))
                .await
                .unwrap()
        );
        assert!(matches!(
            v2.instance_metadata(&node("node-gone", None)).await,
            Err(CloudError::InstanceNotFound)
        ));
    }

    #[tokio::test]
    async fn the_legacy_apis_answer_alike() {
        let cloud = FakeCloud::from_yaml(&format!("instancesV2: false\n{LISTED}")).unwrap();
        let legacy = cloud.instances().unwrap();
        assert_eq!(legacy.instance_id("node-a").await.unwrap(), "custom-a");
        assert_eq!(
            legacy
                .instance_type_by_provider_id("fake://custom-a")
                .await
                .unwrap(),
            "large"
        );
        assert_eq!(legacy.node_addresses("node-a").await.unwrap().len(), 2);
        assert!(matches!(
            legacy.instance_id("node-gone").await,
            Err(CloudError::InstanceNotFound)
        ));
        assert!(
            !legacy
                .instance_exists_by_provider_id("fake://node-gone")
                .await
                .unwrap()
        );
        assert!(
            legacy
                .instance_shutdown_by_provider_id("fake://node-down")
                .await
                .unwrap()
        );
        let zones = cloud.zones().unwrap();
        assert_eq!(
            zones
                .get_zone_by_node_name("node-a")
                .await
                .unwrap()
                .failure_domain,
            "zone-b"
        );
        assert_eq!(
            zones
                .get_zone_by_provider_id("fake://w")
                .await
                .unwrap()
                .failure_domain,
            "zone-a"
        );
        assert_eq!(zones.get_zone().await.unwrap().region, "region-1");
        assert_eq!(
            cloud_provider::get_instance_provider_id(&cloud, "worker-9")
                .await
                .unwrap(),
            "fake://worker-9"
        );
    }
}
