//! EC2 instances behind nodes: finding a node's instance (by provider ID, private DNS name, or instance
//! ID for resource-based hostnames), batched `DescribeInstances`, and InstancesV2 / Zones.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use aws_sdk_ec2::types::{Filter, Instance as Ec2Instance};
use cloud_provider::{CloudResult, InstanceMetadata, node_address};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::{
    Error,
    config::NodeIpFamily,
    error::Result,
    sdk::{Calls, tag_pair},
    topology::{NETWORK_NODE_LABEL_PREFIX, Topology},
    zone_ids::{ZONE_ID_LABEL, ZoneIds},
};

/// The most values AWS accepts in one filter.
const FILTER_VALUES_MAX: usize = 200;
/// Page size of `DescribeInstances`.
const PAGE_SIZE: i32 = 1000;

/// What the provider needs to know about an instance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceInfo {
    /// `i-…`.
    pub id: String,
    /// The availability zone.
    pub zone: String,
    /// `pending`, `running`, `shutting-down`, `terminated`, `stopping`, `stopped`.
    pub state: String,
    /// The instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// The private DNS name (empty when the instance has none).
    pub private_dns: String,
    /// The public DNS name (empty when none).
    pub public_dns: String,
    /// The primary private IPv4 address.
    pub private_ip: String,
    /// The public IPv4 address.
    pub public_ip: String,
    /// Private IPv4 addresses of every network interface, by device index, the primary first.
    pub private_ips: Vec<String>,
    /// IPv6 addresses of every network interface, by device index.
    pub ipv6: Vec<String>,
    /// The VPC.
    pub vpc_id: String,
    /// The subnet.
    pub subnet_id: String,
    /// The security groups of the primary network interface (the instance's groups).
    pub security_groups: Vec<String>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

impl InstanceInfo {
    /// Reads what the provider uses out of an EC2 instance description.
    pub fn from_ec2(i: &Ec2Instance) -> Self {
        let mut enis: Vec<_> = i.network_interfaces().iter().collect();
        enis.sort_by_key(|n| {
            n.attachment()
                .and_then(|a| a.device_index())
                .unwrap_or(i32::MAX)
        });
        let mut private_ips = Vec::new();
        let mut ipv6 = Vec::new();
        for eni in &enis {
            let mut addrs: Vec<_> = eni.private_ip_addresses().iter().collect();
            addrs.sort_by_key(|a| !a.primary().unwrap_or(false));
            for a in addrs {
                if let Some(ip) = a.private_ip_address()
                    && !private_ips.iter().any(|p| p == ip)
                {
                    private_ips.push(ip.to_owned());
                }
            }
            for a in eni.ipv6_addresses() {
                if let Some(ip) = a.ipv6_address() {
                    ipv6.push(ip.to_owned());
                }
            }
        }
        let private_ip = i.private_ip_address().unwrap_or_default().to_owned();
        if private_ips.is_empty() && !private_ip.is_empty() {
            private_ips.push(private_ip.clone());
        }
        Self {
            id: i.instance_id().unwrap_or_default().to_owned(),
            zone: i
                .placement()
                .and_then(|p| p.availability_zone())
                .unwrap_or_default()
                .to_owned(),
            state: i
                .state()
                .and_then(|s| s.name())
                .map(|n| n.as_str().to_owned())
                .unwrap_or_default(),
            instance_type: i
                .instance_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            private_dns: i.private_dns_name().unwrap_or_default().to_owned(),
            public_dns: i.public_dns_name().unwrap_or_default().to_owned(),
            private_ip,
            public_ip: i.public_ip_address().unwrap_or_default().to_owned(),
            private_ips,
            ipv6,
            vpc_id: i.vpc_id().unwrap_or_default().to_owned(),
            subnet_id: i.subnet_id().unwrap_or_default().to_owned(),
            security_groups: i
                .security_groups()
                .iter()
                .filter_map(|g| g.group_id().map(str::to_owned))
                .collect(),
            tags: i
                .tags()
                .iter()
                .filter_map(|t| tag_pair(t.key(), t.value()))
                .collect(),
        }
    }

    /// `aws:///<zone>/<instance-id>`.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }

    /// Terminated instances no longer exist for Kubernetes.
    pub fn is_terminated(&self) -> bool {
        self.state == "terminated"
    }

    /// Stopped and stopping instances are shut down.
    pub fn is_shut_down(&self) -> bool {
        matches!(self.state.as_str(), "stopped" | "stopping")
    }

    /// The node addresses, as upstream lists them: per family in `families`' order, the private IPv4
    /// addresses (InternalIP) and the public one (ExternalIP), or the IPv6 ones (InternalIP); then the
    /// private DNS name (InternalDNS and Hostname) and the public one (ExternalDNS).
    pub fn node_addresses(&self, families: &[NodeIpFamily]) -> Vec<NodeAddress> {
        let mut out = Vec::new();
        for family in families {
            match family {
                NodeIpFamily::Ipv4 => {
                    out.extend(
                        self.private_ips
                            .iter()
                            .map(|ip| node_address("InternalIP", ip)),
                    );
                    if !self.public_ip.is_empty() {
                        out.push(node_address("ExternalIP", &self.public_ip));
                    }
                }
                NodeIpFamily::Ipv6 => {
                    out.extend(self.ipv6.iter().map(|ip| node_address("InternalIP", ip)));
                }
            }
        }
        if !self.private_dns.is_empty() {
            out.push(node_address("InternalDNS", &self.private_dns));
            out.push(node_address("Hostname", &self.private_dns));
        }
        if !self.public_dns.is_empty() {
            out.push(node_address("ExternalDNS", &self.public_dns));
        }
        out
    }
}

/// Reads the instance ID out of an AWS provider ID: `aws:///<zone>/<id>`, `aws:////<id>` or
/// `aws://<zone>/<id>` (upstream's `KubernetesInstanceID` forms). `None` when it is not one.
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<String> {
    let rest = provider_id.strip_prefix("aws://")?;
    let id = rest.rsplit('/').next()?;
    is_instance_id(id).then(|| id.to_owned())
}

/// `i-` followed by hex digits.
pub fn is_instance_id(text: &str) -> bool {
    text.strip_prefix("i-")
        .is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The instance ID in a resource-based hostname (`i-0123456789abcdef0` or
/// `i-0123456789abcdef0.us-west-2.compute.internal`), if the node name is one.
pub fn instance_id_from_resource_name(node_name: &str) -> Option<String> {
    let first = node_name.split('.').next()?;
    is_instance_id(first).then(|| first.to_owned())
}

/// How a node's instance is looked up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// By instance ID.
    Id(String),
    /// By private DNS name.
    PrivateDns(String),
}

impl Key {
    /// The key of a node: its provider ID's instance, else the instance in a resource-based name,
    /// else its name as a private DNS name.
    pub fn of(node: &Node) -> Result<Self> {
        let name = node.metadata.name.clone().unwrap_or_default();
        if let Some(provider_id) = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty())
        {
            return instance_id_from_provider_id(provider_id)
                .map(Key::Id)
                .ok_or_else(|| Error::ProviderId {
                    node: name.clone(),
                    provider_id: provider_id.to_owned(),
                });
        }
        Ok(match instance_id_from_resource_name(&name) {
            Some(id) => Key::Id(id),
            None => Key::PrivateDns(name),
        })
    }
}

type BatchResult = std::result::Result<Arc<Vec<InstanceInfo>>, Arc<Error>>;

/// The batch being gathered: the keys asked for and where its answer will be sent.
struct Open {
    keys: BTreeSet<Key>,
    answer: watch::Receiver<Option<BatchResult>>,
}

/// Coalesces concurrent instance look-ups: the first caller opens a batch and waits `window`; every
/// look-up in that time joins it; then one `DescribeInstances` (paged, with up to 200 values per filter)
/// answers them all.
pub struct Describer {
    calls: Calls,
    window: Duration,
    open: Mutex<Option<Open>>,
    /// [`Describer::find_recent`]'s answers by key, with when they came.
    answered: Mutex<Answered>,
}

/// Recent answers, pruned of the stale ones whenever they have doubled since the last pruning (so a
/// look-up costs O(1) amortized however many nodes there are).
#[derive(Default)]
struct Answered {
    by_key: BTreeMap<Key, (Instant, Option<InstanceInfo>)>,
    prune_at: usize,
}

impl Describer {
    /// A describer that gathers look-ups for `window`.
    pub fn new(calls: Calls, window: Duration) -> Self {
        Self {
            calls,
            window,
            open: Mutex::new(None),
            answered: Mutex::default(),
        }
    }

    /// A describer of its own on the read-only form of the same call path ([`Calls::read_only`]): a
    /// batch it sends takes one token of the previews' budget, however many previews share it.
    pub fn read_only(&self) -> Self {
        Self::new(self.calls.read_only(), self.window)
    }

    /// The instance for `key` as EC2 answered it to this call at most `max_age` ago, else looked up
    /// now ([`Describer::find`]). For the load balancers' backends: a burst of node syncs over hundreds
    /// of load balancers looks each node's instance up once per `max_age`, instead of once per load
    /// balancer (upstream's instance cache keeps its snapshot for 10 minutes).
    pub async fn find_recent(&self, key: &Key, max_age: Duration) -> Result<Option<InstanceInfo>> {
        let recent = self
            .answered
            .lock()
            .by_key
            .get(key)
            .filter(|(at, _)| at.elapsed() <= max_age)
            .map(|(_, found)| found.clone());
        if let Some(found) = recent {
            return Ok(found);
        }
        let found = self.find(key).await?;
        // Only what was found is reused: an instance not found yet (EC2's answers lag a new
        // instance) is asked again by the next sync.
        if found.is_none() {
            return Ok(found);
        }
        let mut answered = self.answered.lock();
        if answered.by_key.len() >= answered.prune_at {
            answered.by_key.retain(|_, (at, _)| at.elapsed() <= max_age);
            answered.prune_at = (answered.by_key.len() * 2).max(1024);
        }
        answered
            .by_key
            .insert(key.clone(), (Instant::now(), found.clone()));
        Ok(found)
    }

    /// The instance for `key`; `None` when EC2 has none. Of several (a private DNS name reused after a
    /// termination) the one not terminated wins.
    pub async fn find(&self, key: &Key) -> Result<Option<InstanceInfo>> {
        let answer = {
            let mut open = self.open.lock();
            match open.as_mut() {
                // A batch whose leader was cancelled (its sender gone) is not joined: this look-up
                // leads a new one in its place, so batching goes on after a cancellation.
                Some(batch) if batch.answer.has_changed().is_ok() => {
                    batch.keys.insert(key.clone());
                    Some(batch.answer.clone())
                }
                _ => None,
            }
        };
        let result = match answer {
            Some(mut rx) => {
                let answer = rx
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|value| value.clone());
                match answer {
                    Some(result) => result,
                    // The batch's leader went away (its caller was cancelled): ask alone.
                    None => self
                        .describe(&BTreeSet::from([key.clone()]))
                        .await
                        .map(Arc::new)
                        .map_err(Arc::new),
                }
            }
            None => self.lead(key).await,
        };
        let instances = result.map_err(|e| (*e).clone())?;
        let mut matching: Vec<&InstanceInfo> = instances
            .iter()
            .filter(|i| match key {
                Key::Id(id) => &i.id == id,
                Key::PrivateDns(dns) => &i.private_dns == dns,
            })
            .collect();
        matching.sort_by_key(|i| i.is_terminated());
        Ok(matching.first().map(|i| (*i).clone()))
    }

    /// Opens a batch with `key`, waits for others to join, then describes them all.
    async fn lead(&self, key: &Key) -> BatchResult {
        let (tx, rx) = watch::channel(None);
        {
            let mut open = self.open.lock();
            *open = Some(Open {
                keys: BTreeSet::from([key.clone()]),
                answer: rx,
            });
        }
        tokio::time::sleep(self.window).await;
        let keys = {
            let mut open = self.open.lock();
            open.take().map(|o| o.keys).unwrap_or_default()
        };
        let result: BatchResult = self.describe(&keys).await.map(Arc::new).map_err(Arc::new);
        let _ = tx.send(Some(result.clone()));
        result
    }

    /// One `DescribeInstances` per 200 IDs and per 200 DNS names, every page.
    #[tracing::instrument(skip_all, fields(keys = keys.len()))]
    async fn describe(&self, keys: &BTreeSet<Key>) -> Result<Vec<InstanceInfo>> {
        let (mut ids, mut names) = (Vec::new(), Vec::new());
        for key in keys {
            match key {
                Key::Id(id) => ids.push(id.clone()),
                Key::PrivateDns(name) => names.push(name.clone()),
            }
        }
        let mut out = Vec::new();
        for (filter, values) in [("instance-id", ids), ("private-dns-name", names)] {
            for chunk in values.chunks(FILTER_VALUES_MAX) {
                let filter = Filter::builder()
                    .name(filter)
                    .set_values(Some(chunk.to_vec()))
                    .build();
                out.extend(self.describe_filtered(vec![filter]).await?);
            }
        }
        Ok(out)
    }

    /// Every instance matching `filters`, page by page.
    pub async fn describe_filtered(&self, filters: Vec<Filter>) -> Result<Vec<InstanceInfo>> {
        let ec2 = &self.calls.clients.ec2;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .calls
                .call("DescribeInstances", || {
                    ec2.describe_instances()
                        .set_filters(Some(filters.clone()))
                        .max_results(PAGE_SIZE)
                        .set_next_token(token.clone())
                        .send()
                })
                .await?;
            for reservation in page.reservations() {
                out.extend(reservation.instances().iter().map(InstanceInfo::from_ec2));
            }
            token = page
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            if token.is_none() {
                return Ok(out);
            }
        }
    }
}

/// InstancesV2 for the provider.
pub struct Instances {
    describer: Arc<Describer>,
    zone_ids: Arc<ZoneIds>,
    topology: Arc<Topology>,
    families: Vec<NodeIpFamily>,
    region: String,
}

impl Instances {
    /// Instances answered through `describer`, with zone IDs from `zone_ids` and network-topology
    /// labels from `topology`.
    pub fn new(
        describer: Arc<Describer>,
        zone_ids: Arc<ZoneIds>,
        topology: Arc<Topology>,
        families: Vec<NodeIpFamily>,
        region: String,
    ) -> Self {
        Self {
            describer,
            zone_ids,
            topology,
            families,
            region,
        }
    }

    /// Upstream's additional labels: `topology.k8s.aws/zone-id` and the network-topology labels
    /// `topology.k8s.aws/network-node-layer-<N>`, each unless the node has it already.
    async fn additional_labels(
        &self,
        node: &Node,
        instance: &InstanceInfo,
    ) -> Result<BTreeMap<String, String>> {
        let mut labels = BTreeMap::new();
        let labelled = node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(ZONE_ID_LABEL));
        if !labelled && !instance.zone.is_empty() {
            let id = self.zone_ids.zone_id(&instance.zone).await?;
            labels.insert(ZONE_ID_LABEL.to_owned(), id);
        }
        let has_topology = node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(&format!("{NETWORK_NODE_LABEL_PREFIX}1")));
        labels.extend(
            self.topology
                .labels(
                    &instance.id,
                    &instance.instance_type,
                    &self.region,
                    has_topology,
                )
                .await?,
        );
        Ok(labels)
    }

    async fn instance(&self, node: &Node) -> Result<Option<InstanceInfo>> {
        let key = Key::of(node)?;
        self.describer.find(&key).await
    }
}

#[cloud_provider::async_trait]
impl cloud_provider::InstancesV2 for Instances {
    #[tracing::instrument(skip_all, fields(node = node.metadata.name.as_deref().unwrap_or("")))]
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self
            .instance(node)
            .await?
            .is_some_and(|i| !i.is_terminated()))
    }

    #[tracing::instrument(skip_all, fields(node = node.metadata.name.as_deref().unwrap_or("")))]
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        match self.instance(node).await? {
            Some(i) => Ok(i.is_shut_down()),
            None => Err(cloud_provider::CloudError::InstanceNotFound),
        }
    }

    #[tracing::instrument(skip_all, fields(node = node.metadata.name.as_deref().unwrap_or("")))]
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let Some(i) = self.instance(node).await?.filter(|i| !i.is_terminated()) else {
            return Err(cloud_provider::CloudError::InstanceNotFound);
        };
        let additional_labels = self.additional_labels(node, &i).await?;
        Ok(Some(InstanceMetadata {
            provider_id: i.provider_id(),
            instance_type: i.instance_type.clone(),
            node_addresses: i.node_addresses(&self.families),
            zone: i.zone.clone(),
            region: self.region.clone(),
            additional_labels,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_in_upstreams_forms() {
        assert_eq!(
            instance_id_from_provider_id("aws:///us-west-2a/i-0abc").as_deref(),
            Some("i-0abc")
        );
        assert_eq!(
            instance_id_from_provider_id("aws:////i-0abc").as_deref(),
            Some("i-0abc")
        );
        assert_eq!(
            instance_id_from_provider_id("aws://us-west-2a/i-0abc").as_deref(),
            Some("i-0abc")
        );
        assert_eq!(instance_id_from_provider_id("gce:///z/i-0abc"), None);
        assert_eq!(
            instance_id_from_provider_id("aws:///us-west-2a/node-1"),
            None
        );
        assert_eq!(instance_id_from_provider_id("aws:///us-west-2a/i-"), None);
    }

    #[test]
    fn resource_based_hostnames_carry_the_instance_id() {
        assert_eq!(
            instance_id_from_resource_name("i-0123456789abcdef0").as_deref(),
            Some("i-0123456789abcdef0")
        );
        assert_eq!(
            instance_id_from_resource_name("i-0123456789abcdef0.us-west-2.compute.internal")
                .as_deref(),
            Some("i-0123456789abcdef0")
        );
        assert_eq!(
            instance_id_from_resource_name("ip-10-0-1-4.us-west-2.compute.internal"),
            None
        );
        assert_eq!(instance_id_from_resource_name("i-xyz"), None);
    }

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_owned());
        if let Some(p) = provider_id {
            n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: Some(p.to_owned()),
                ..Default::default()
            });
        }
        n
    }

    #[test]
    fn a_nodes_key_prefers_the_provider_id() {
        assert_eq!(
            Key::of(&node("ip-1", Some("aws:///z/i-1"))).unwrap(),
            Key::Id("i-1".into())
        );
        assert_eq!(
            Key::of(&node("i-2.eu.compute.internal", None)).unwrap(),
            Key::Id("i-2".into())
        );
        assert_eq!(
            Key::of(&node("ip-1.ec2.internal", None)).unwrap(),
            Key::PrivateDns("ip-1.ec2.internal".into())
        );
        let err = Key::of(&node("n", Some("fake://n")))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "node n: provider ID \"fake://n\" is not an AWS provider ID (aws:///<zone>/<instance-id>)"
        );
    }

    #[test]
    fn addresses_follow_the_families_in_order() {
        let i = InstanceInfo {
            private_ips: vec!["10.0.0.5".into(), "10.0.0.6".into()],
            public_ip: "54.1.2.3".into(),
            ipv6: vec!["2600::5".into()],
            private_dns: "ip-10-0-0-5.ec2.internal".into(),
            public_dns: "ec2-54-1-2-3.compute-1.amazonaws.com".into(),
            ..Default::default()
        };
        let pairs = |fams: &[NodeIpFamily]| -> Vec<(String, String)> {
            i.node_addresses(fams)
                .into_iter()
                .map(|a| (a.type_, a.address))
                .collect()
        };
        let v4 = pairs(&[NodeIpFamily::Ipv4]);
        assert_eq!(
            v4,
            [
                ("InternalIP", "10.0.0.5"),
                ("InternalIP", "10.0.0.6"),
                ("ExternalIP", "54.1.2.3"),
                ("InternalDNS", "ip-10-0-0-5.ec2.internal"),
                ("Hostname", "ip-10-0-0-5.ec2.internal"),
                ("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
        let v6 = pairs(&[NodeIpFamily::Ipv6, NodeIpFamily::Ipv4]);
        assert_eq!(v6[0], ("InternalIP".to_owned(), "2600::5".to_owned()));
        assert_eq!(v6[1], ("InternalIP".to_owned(), "10.0.0.5".to_owned()));
    }
}
