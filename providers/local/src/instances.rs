//! InstancesV2 of the `local` cloud: machines from the inventory, adopted nodes, and the optional
//! kubelet probe.
//!
//! A node is looked up by the name in its `local://<name>` provider ID, else by its node name, and is:
//!
//! - **listed**: the inventory has it now;
//! - **removed**: the inventory does not have it now but did list it: some config this process read
//!   listed it, or the node carries the label `local.ccm.rs/source=inventory` that initialization from
//!   the inventory puts on it (so a removal is recognised after a restart too). It does not exist: the
//!   lifecycle controller deletes its node once NotReady;
//! - **adopted** (`unlistedNodes: adopt`, the default) when never listed: a running machine known by
//!   the node's own addresses, labelled `local.ccm.rs/source=adopted`;
//! - **ignored** (`unlistedNodes: ignore`) when never listed, or when its provider ID belongs to
//!   another cloud: no metadata (the cloud-node controller skips it), and reported existing and running
//!   so the lifecycle controller never deletes nor taints a node this cloud does not own.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Mutex,
};

use cloud_provider::{
    CloudError, CloudResult, InstanceMetadata, InstancesV2, ProviderId, async_trait, node_address,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::{
    LocalCloud, PROVIDER_NAME,
    config::{Config, Machine, MachineState, UnlistedNodes},
};

/// The label that records where a node's metadata came from: `inventory` or `adopted`.
pub const SOURCE_LABEL: &str = "local.ccm.rs/source";

/// The annotation a kubelet started with `--cloud-provider=external --node-ip` sets.
pub const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

/// How the cloud sees a node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Known {
    /// In the inventory now.
    Listed(String, Machine),
    /// Listed once, not any more.
    Removed(String),
    /// Never listed; adopted.
    Adopted(String),
    /// Not this cloud's node.
    Ignored,
}

/// The machine name a node stands for: the instance of its `local://` provider ID, else its name.
/// `None` for a node with another cloud's provider ID.
fn machine_name(node: &Node) -> Option<String> {
    ProviderId::instance_of_node(PROVIDER_NAME, node)
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

impl LocalCloud {
    /// How the cloud sees `node` under `config`.
    pub(crate) fn classify(&self, config: &Config, node: &Node) -> Known {
        let Some(name) = machine_name(node) else {
            return Known::Ignored;
        };
        if let Some(machine) = config.machines.get(&name) {
            return Known::Listed(name, machine.clone());
        }
        if self.was_listed(&name) || label(node, SOURCE_LABEL) == Some("inventory") {
            return Known::Removed(name);
        }
        match config.unlisted_nodes {
            UnlistedNodes::Adopt => Known::Adopted(name),
            UnlistedNodes::Ignore => Known::Ignored,
        }
    }

    /// The node's first InternalIP, else the machine's configured one.
    fn probe_address(node: &Node, machine: Option<&Machine>) -> Option<IpAddr> {
        let from_node = first_internal_ip(node);
        from_node.or_else(|| {
            machine?
                .addresses
                .iter()
                .filter(|a| a.type_.as_str() == "InternalIP")
                .find_map(|a| a.address.parse().ok())
        })
    }

    /// With the kubelet probe on: one TCP connect to the node's kubelet port; `true` once
    /// `failureThreshold` probes in a row have failed.
    async fn probe_says_down(&self, config: &Config, name: &str, address: Option<IpAddr>) -> bool {
        let probe = &config.kubelet_probe;
        if !probe.enabled {
            return false;
        }
        let Some(ip) = address else {
            tracing::debug!(node = name, "kubelet probe: no InternalIP to probe");
            return false;
        };
        let target = SocketAddr::new(ip, probe.port);
        let answered = matches!(
            tokio::time::timeout(probe.timeout.0, tokio::net::TcpStream::connect(target)).await,
            Ok(Ok(_))
        );
        let mut failures = lock(&self.inner.probe_failures);
        if answered {
            failures.remove(name);
            return false;
        }
        let count = failures.entry(name.to_owned()).or_default();
        *count = count.saturating_add(1);
        tracing::info!(node = name, %target, failures = *count, threshold = probe.failure_threshold.0, "kubelet probe: no answer");
        *count >= probe.failure_threshold.0
    }
}

impl LocalCloud {
    /// The node's name and the addresses a load balancer sends its traffic to: for a listed machine its
    /// inventory InternalIPs; else (or when the inventory gives none) the node's InternalIPs, else the
    /// IPs of its provided-node-ip annotation (there from registration, before the node is initialized).
    /// `None` for nodes this cloud does not serve (ignored or removed).
    pub(crate) fn backend_addresses(
        &self,
        config: &Config,
        node: &Node,
    ) -> Option<(String, Vec<IpAddr>)> {
        let machine = match self.classify(config, node) {
            Known::Listed(_, machine) => Some(machine),
            Known::Adopted(_) => None,
            Known::Removed(_) | Known::Ignored => return None,
        };
        let from_inventory: Vec<IpAddr> = machine
            .iter()
            .flat_map(|m| m.addresses.iter())
            .filter(|a| a.type_.as_str() == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect();
        let from_node = || -> Vec<IpAddr> { internal_ips(node).collect() };
        let mut ips = from_inventory;
        if ips.is_empty() {
            ips = from_node();
        }
        if ips.is_empty() {
            ips = provided_node_ips(node);
        }
        Some((node.metadata.name.clone().unwrap_or_default(), ips))
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The IPs of a node's provided-node-ip annotation (none without it; what does not parse is skipped).
fn provided_node_ips(node: &Node) -> Vec<IpAddr> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVIDED_NODE_IP_ANNOTATION))
        .map(|v| {
            v.split(',')
                .filter_map(|ip| ip.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses of a node that the inventory gives none for: the IPs of its provided-node-ip
/// annotation as InternalIPs with its other non-InternalIP addresses, else its own addresses, else its
/// name as Hostname.
fn own_addresses(node: &Node, name: &str) -> Vec<NodeAddress> {
    let status: Vec<NodeAddress> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    let provided = provided_node_ips(node);
    let mut addresses: Vec<NodeAddress> = if provided.is_empty() {
        status
    } else {
        provided
            .iter()
            .map(|ip| node_address("InternalIP", ip.to_string()))
            .chain(status.into_iter().filter(|a| a.type_ != "InternalIP"))
            .collect()
    };
    let mut seen = std::collections::BTreeSet::new();
    addresses.retain(|a| seen.insert((a.type_.clone(), a.address.clone())));
    if addresses.is_empty() {
        addresses.push(node_address("Hostname", name));
    }
    addresses
}

fn metadata(
    config: &Config,
    node: &Node,
    name: &str,
    machine: Option<&Machine>,
) -> InstanceMetadata {
    let defaults = &config.defaults;
    let addresses = match machine {
        Some(m) if !m.addresses.is_empty() => m
            .addresses
            .iter()
            .map(cloud_provider::config_values::AddressConfig::to_node_address)
            .collect(),
        _ => own_addresses(node, name),
    };
    let mut labels: BTreeMap<String, String> =
        machine.map(|m| m.labels.clone()).unwrap_or_default();
    labels.insert(
        SOURCE_LABEL.to_owned(),
        if machine.is_some() {
            "inventory"
        } else {
            "adopted"
        }
        .to_owned(),
    );
    let pick = |own: Option<&String>, default: &String| own.unwrap_or(default).clone();
    InstanceMetadata {
        provider_id: format!("{PROVIDER_NAME}://{name}"),
        instance_type: pick(
            machine.and_then(|m| m.instance_type.as_ref()),
            &defaults.instance_type,
        ),
        zone: pick(machine.and_then(|m| m.zone.as_ref()), &defaults.zone),
        region: pick(machine.and_then(|m| m.region.as_ref()), &defaults.region),
        node_addresses: addresses,
        additional_labels: labels,
    }
}

#[async_trait]
impl InstancesV2 for LocalCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        let config = self.config();
        Ok(!matches!(self.classify(&config, node), Known::Removed(_)))
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let config = self.config();
        match self.classify(&config, node) {
            Known::Listed(name, machine) => {
                if machine.state == MachineState::Shutdown {
                    return Ok(true);
                }
                let address = Self::probe_address(node, Some(&machine));
                Ok(self.probe_says_down(&config, &name, address).await)
            }
            Known::Adopted(name) => {
                let address = Self::probe_address(node, None);
                Ok(self.probe_says_down(&config, &name, address).await)
            }
            Known::Removed(_) | Known::Ignored => Ok(false),
        }
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let config = self.config();
        match self.classify(&config, node) {
            Known::Listed(name, machine) => {
                Ok(Some(metadata(&config, node, &name, Some(&machine))))
            }
            Known::Adopted(name) => Ok(Some(metadata(&config, node, &name, None))),
            Known::Removed(_) => Err(CloudError::InstanceNotFound),
            Known::Ignored => Ok(None),
        }
    }
}

/// Per-node counts of failed kubelet probes in a row.
pub(crate) type ProbeFailures = Mutex<HashMap<String, u32>>;

/// The InternalIPs of the Node's status that parse as IPs, in its order.
fn internal_ips(node: &Node) -> impl Iterator<Item = IpAddr> + '_ {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
}

/// The first InternalIP of the Node's status that parses as an IP.
pub(crate) fn first_internal_ip(node: &Node) -> Option<IpAddr> {
    internal_ips(node).next()
}

#[cfg(test)]
mod tests {
    use cloud_provider::conformance::node;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};

    use super::*;

    fn cloud(yaml: &str) -> LocalCloud {
        LocalCloud::new(Config::parse(yaml, None).unwrap(), None)
    }

    fn with_status(name: &str, addresses: &[(&str, &str)]) -> Node {
        let mut n = node(name);
        n.status = Some(NodeStatus {
            addresses: Some(addresses.iter().map(|(t, a)| node_address(t, *a)).collect()),
            ..Default::default()
        });
        n
    }

    #[tokio::test]
    async fn listed_machines_carry_their_inventory() {
        let cloud = cloud(
            "machines:\n  a:\n    addresses: [{type: InternalIP, address: 10.1.0.1}]\n    instanceType: big\n    zone: z1\n    region: r1\n    labels: {example.com/x: y}\n",
        );
        let m = cloud.instance_metadata(&node("a")).await.unwrap().unwrap();
        assert_eq!(m.provider_id, "local://a");
        assert_eq!(
            (m.instance_type.as_str(), m.zone.as_str(), m.region.as_str()),
            ("big", "z1", "r1")
        );
        assert_eq!(
            m.node_addresses,
            vec![node_address("InternalIP", "10.1.0.1")]
        );
        assert_eq!(m.additional_labels["example.com/x"], "y");
        assert_eq!(m.additional_labels[SOURCE_LABEL], "inventory");
        assert!(cloud.instance_exists(&node("a")).await.unwrap());
        assert!(!cloud.instance_shutdown(&node("a")).await.unwrap());
    }

    #[tokio::test]
    async fn adopted_nodes_use_their_own_addresses_or_the_provided_node_ip() {
        let cloud = cloud("");
        let n = with_status("b", &[("InternalIP", "10.2.0.1"), ("Hostname", "b")]);
        let m = cloud.instance_metadata(&n).await.unwrap().unwrap();
        assert_eq!(m.provider_id, "local://b");
        assert_eq!(m.instance_type, "local");
        assert_eq!(m.zone, "");
        assert_eq!(m.additional_labels[SOURCE_LABEL], "adopted");
        assert_eq!(
            m.node_addresses,
            vec![
                node_address("InternalIP", "10.2.0.1"),
                node_address("Hostname", "b")
            ]
        );

        let mut annotated = with_status("c", &[("Hostname", "c")]);
        annotated.metadata.annotations = Some(
            [(
                PROVIDED_NODE_IP_ANNOTATION.to_owned(),
                "10.3.0.1,fd00::3".to_owned(),
            )]
            .into(),
        );
        let m = cloud.instance_metadata(&annotated).await.unwrap().unwrap();
        assert_eq!(
            m.node_addresses,
            vec![
                node_address("InternalIP", "10.3.0.1"),
                node_address("InternalIP", "fd00::3"),
                node_address("Hostname", "c")
            ]
        );
        let bare = cloud.instance_metadata(&node("d")).await.unwrap().unwrap();
        assert_eq!(bare.node_addresses, vec![node_address("Hostname", "d")]);
    }

    #[tokio::test]
    async fn shutdown_state_and_removal() {
        let cloud = cloud("machines:\n  a: {}\n  s: {state: shutdown}\n");
        assert!(cloud.instance_exists(&node("s")).await.unwrap());
        assert!(cloud.instance_shutdown(&node("s")).await.unwrap());

        // `a` is removed from the inventory: it no longer exists, although unlisted nodes are adopted.
        cloud.set_config(Config::parse("machines:\n  s: {state: shutdown}\n", None).unwrap());
        assert!(!cloud.instance_exists(&node("a")).await.unwrap());
        assert!(matches!(
            cloud.instance_metadata(&node("a")).await,
            Err(CloudError::InstanceNotFound)
        ));
        // A never-listed node is adopted.
        assert!(cloud.instance_exists(&node("never")).await.unwrap());

        // After a restart (a new cloud), the label initialization put on the node says it was listed.
        let restarted = LocalCloud::new(Config::default(), None);
        let mut labelled = node("a");
        labelled.metadata.labels = Some([(SOURCE_LABEL.to_owned(), "inventory".to_owned())].into());
        assert!(!restarted.instance_exists(&labelled).await.unwrap());
        labelled.metadata.labels = Some([(SOURCE_LABEL.to_owned(), "adopted".to_owned())].into());
        assert!(restarted.instance_exists(&labelled).await.unwrap());
    }

    #[tokio::test]
    async fn ignored_and_foreign_nodes_are_left_alone() {
        let cloud = cloud("unlistedNodes: ignore\n");
        assert_eq!(cloud.instance_metadata(&node("x")).await.unwrap(), None);
        assert!(cloud.instance_exists(&node("x")).await.unwrap());
        assert!(!cloud.instance_shutdown(&node("x")).await.unwrap());

        let adopting = self::cloud("");
        let mut foreign = node("y");
        foreign.spec = Some(NodeSpec {
            provider_id: Some("aws:///us-east-1a/i-123".into()),
            ..Default::default()
        });
        assert_eq!(adopting.instance_metadata(&foreign).await.unwrap(), None);
        assert!(adopting.instance_exists(&foreign).await.unwrap());

        // A node is found by the name in its provider ID first.
        let listed = self::cloud("machines:\n  m1: {state: shutdown}\n");
        let mut renamed = node("other-name");
        renamed.spec = Some(NodeSpec {
            provider_id: Some("local://m1".into()),
            ..Default::default()
        });
        assert!(listed.instance_shutdown(&renamed).await.unwrap());
    }

    #[test]
    fn backends_use_the_inventory_then_the_node_then_its_provided_node_ip() {
        let cloud = cloud(
            "machines:\n  a: {addresses: [{type: InternalIP, address: 127.0.9.1}]}\n  b: {}\n  gone: {}\n",
        );
        cloud.set_config(
            Config::parse(
                "machines:\n  a: {addresses: [{type: InternalIP, address: 127.0.9.1}]}\n  b: {}\n",
                None,
            )
            .unwrap(),
        );
        let config = cloud.config();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // The inventory wins over what the node says (the node may not be initialized yet).
        let a = with_status("a", &[("InternalIP", "10.0.0.1")]);
        assert_eq!(
            cloud.backend_addresses(&config, &a),
            Some(("a".into(), vec![ip("127.0.9.1")]))
        );
        let b = with_status("b", &[("InternalIP", "127.0.9.2"), ("Hostname", "b")]);
        assert_eq!(
            cloud.backend_addresses(&config, &b),
            Some(("b".into(), vec![ip("127.0.9.2")]))
        );
        let mut adopted = node("c");
        adopted.metadata.annotations = Some(
            [(
                PROVIDED_NODE_IP_ANNOTATION.to_owned(),
                "127.0.9.3".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            cloud.backend_addresses(&config, &adopted),
            Some(("c".into(), vec![ip("127.0.9.3")]))
        );
        assert_eq!(cloud.backend_addresses(&config, &node("gone")), None);
    }

    #[tokio::test]
    async fn the_kubelet_probe_reports_shutdown_after_its_threshold() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cloud = cloud(&format!(
            "kubeletProbe: {{enabled: true, port: {port}, timeout: 500ms, failureThreshold: 2}}\n"
        ));
        let n = with_status("p", &[("InternalIP", "127.0.0.1")]);
        assert!(!cloud.instance_shutdown(&n).await.unwrap(), "it answers");
        drop(listener);
        assert!(
            !cloud.instance_shutdown(&n).await.unwrap(),
            "1 failure of 2"
        );
        assert!(
            cloud.instance_shutdown(&n).await.unwrap(),
            "2 failures of 2"
        );
        let _listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        assert!(!cloud.instance_shutdown(&n).await.unwrap(), "answers again");
    }
}
