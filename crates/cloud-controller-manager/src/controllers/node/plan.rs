//! Pure planning for the cloud-node controller: given a Node and what the cloud says, the smallest change
//! (or none). Every upstream rule of initialization, label reconciliation and address updates lives here.

use std::{collections::BTreeMap, net::IpAddr};

use cloud_provider::InstanceMetadata;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use serde_json::{Value, json};

use crate::well_known::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_REGION,
    LABEL_REGION_BETA, LABEL_ZONE, LABEL_ZONE_BETA, TAINT_UNINITIALIZED,
};

/// Whether the node has a taint with this key (any value or effect).
pub fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

/// The node's taints.
pub fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// Whether the node still waits for the cloud-node controller.
pub fn is_uninitialized(node: &Node) -> bool {
    has_taint(node, TAINT_UNINITIALIZED)
}

fn labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

fn node_provider_id(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|id| !id.is_empty())
}

/// Whether a label key lies in a Kubernetes-reserved namespace, exactly as upstream's
/// `k8sNamespaceRegex`, `(^|\.)(kubernetes|k8s)\.io/`, matches it: `kubernetes.io/` or `k8s.io/`
/// anywhere in the key, at its start or after a dot (`kubernetes.io/x`, `topology.kubernetes.io/x`,
/// `node.k8s.io/x`; not `k8snio/x`, `mykubernetes.io/x`).
pub fn is_kubernetes_namespaced(key: &str) -> bool {
    ["kubernetes.io/", "k8s.io/"].iter().any(|namespace| {
        key.match_indices(namespace)
            .any(|(at, _)| at == 0 || key.as_bytes()[at - 1] == b'.')
    })
}

/// The single write that initializes a node: provider ID, labels and taint removal together.
#[derive(Debug, Clone, PartialEq)]
pub struct Initialization {
    /// Set when the node has no provider ID and the cloud gave one.
    pub provider_id: Option<String>,
    /// Labels to add or change.
    pub labels: BTreeMap<String, String>,
    /// The node's taints without the uninitialized one (others kept, in order).
    pub taints: Vec<Taint>,
    /// Additional labels not applied because the node has the key with another value: (key, node's
    /// value, cloud's value).
    pub kept_labels: Vec<(String, String, String)>,
}

/// Plans the initialization of an uninitialized node from its instance metadata.
pub fn plan_initialization(node: &Node, metadata: &InstanceMetadata) -> Initialization {
    let current = labels(node);
    let mut wanted = BTreeMap::new();
    let mut set = |key: &str, value: &str| {
        if !value.is_empty() && current.get(key).map(String::as_str) != Some(value) {
            wanted.insert(key.to_owned(), value.to_owned());
        }
    };
    set(LABEL_INSTANCE_TYPE, &metadata.instance_type);
    set(LABEL_INSTANCE_TYPE_BETA, &metadata.instance_type);
    set(LABEL_ZONE, &metadata.zone);
    set(LABEL_ZONE_BETA, &metadata.zone);
    set(LABEL_REGION, &metadata.region);
    set(LABEL_REGION_BETA, &metadata.region);

    let mut kept_labels = Vec::new();
    for (key, value) in &metadata.additional_labels {
        if is_kubernetes_namespaced(key) {
            continue;
        }
        match current.get(key) {
            Some(existing) if existing != value => {
                kept_labels.push((key.clone(), existing.clone(), value.clone()))
            }
            Some(_) => {}
            None => {
                wanted.insert(key.clone(), value.clone());
            }
        }
    }

    let provider_id = match node_provider_id(node) {
        Some(_) => None,
        None => Some(metadata.provider_id.clone()).filter(|id| !id.is_empty()),
    };
    Initialization {
        provider_id,
        labels: wanted,
        taints: taints(node)
            .iter()
            .filter(|t| t.key != TAINT_UNINITIALIZED)
            .cloned()
            .collect(),
        kept_labels,
    }
}

impl Initialization {
    /// The Node to PUT that applies this plan (what upstream's `Update` sends, less the status): the
    /// node's metadata, its `resourceVersion` included so a concurrent change (to its taints, say)
    /// makes the write fail with a conflict instead of being overwritten, and its spec with the plan
    /// applied. No status and no managed fields: a PUT of a Node keeps the stored ones.
    pub fn apply(&self, node: &Node) -> Node {
        let mut metadata = node.metadata.clone();
        metadata.managed_fields = None;
        if !self.labels.is_empty() {
            metadata
                .labels
                .get_or_insert_with(Default::default)
                .extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let mut spec = node.spec.clone().unwrap_or_default();
        spec.taints = Some(self.taints.clone());
        if let Some(id) = &self.provider_id {
            spec.provider_id = Some(id.clone());
        }
        Node {
            metadata,
            spec: Some(spec),
            status: None,
        }
    }

    /// The JSON merge patch that applies this plan (for a node with fields this build does not know,
    /// which a PUT would erase). It carries the node's `resourceVersion`, so a
    /// concurrent change to the node (its taints, say) makes the write fail with a conflict instead of
    /// being overwritten; the caller re-reads and re-plans.
    pub fn patch(&self, resource_version: &str) -> Value {
        let mut spec = json!({ "taints": self.taints });
        if let Some(id) = &self.provider_id {
            spec["providerID"] = json!(id);
        }
        let mut metadata = json!({ "resourceVersion": resource_version });
        if !self.labels.is_empty() {
            metadata["labels"] = json!(self.labels);
        }
        json!({ "metadata": metadata, "spec": spec })
    }
}

/// The GA labels to set on an initialized node from its beta labels (the beta label is the source of
/// truth; a node with only GA labels is left alone). Empty: nothing to do.
pub fn plan_label_reconciliation(node: &Node) -> BTreeMap<String, String> {
    let current = labels(node);
    [
        (LABEL_ZONE_BETA, LABEL_ZONE),
        (LABEL_REGION_BETA, LABEL_REGION),
        (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
    ]
    .into_iter()
    .filter_map(|(beta, ga)| {
        let value = current.get(beta)?;
        (current.get(ga) != Some(value)).then(|| (ga.to_owned(), value.clone()))
    })
    .collect()
}

/// Why the provided-node-ip annotation cannot be honored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIpError {
    /// The annotation is not one IP or a dual-stack pair.
    #[error("invalid {ANNOTATION_PROVIDED_NODE_IP} annotation {value:?}: {why}")]
    Invalid {
        /// The annotation's value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The cloud reports no address equal to a provided IP.
    #[error("failed to get node address from cloud provider that matches ip: {0}")]
    NoMatch(IpAddr),
}

/// Parses the annotation: one IP, or an IPv4 and an IPv6 separated by a comma (no spaces; no
/// unspecified addresses).
pub fn parse_provided_node_ips(value: &str) -> Result<Vec<IpAddr>, NodeIpError> {
    let invalid = |why: &str| NodeIpError::Invalid {
        value: value.to_owned(),
        why: why.to_owned(),
    };
    let parts: Vec<&str> = value.split(',').collect();
    if parts.len() > 2 {
        return Err(invalid("at most two IPs (one IPv4, one IPv6) may be given"));
    }
    let ips = parts
        .iter()
        .map(|p| {
            p.parse::<IpAddr>()
                .map_err(|_| invalid(&format!("{p:?} is not an IP address")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ips.iter().any(IpAddr::is_unspecified) {
        return Err(invalid(
            "an unspecified address (0.0.0.0 or ::) cannot be a node IP",
        ));
    }
    if ips.len() == 2 && ips[0].is_ipv4() == ips[1].is_ipv4() {
        return Err(invalid("two IPs must be one IPv4 and one IPv6"));
    }
    Ok(ips)
}

/// Upstream's node-IP filter: for each provided IP, the cloud addresses equal to it come first and their
/// type becomes "enforced"; then every cloud address of a type that is not enforced, in cloud order.
pub fn filter_by_node_ips(
    ips: &[IpAddr],
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, NodeIpError> {
    let mut result = Vec::new();
    let mut enforced = Vec::new();
    for ip in ips {
        let matching: Vec<&NodeAddress> = cloud
            .iter()
            .filter(|a| a.address.parse::<IpAddr>().is_ok_and(|a| a == *ip))
            .collect();
        if matching.is_empty() {
            return Err(NodeIpError::NoMatch(*ip));
        }
        for address in matching {
            enforced.push(address.type_.clone());
            result.push(address.clone());
        }
    }
    result.extend(
        cloud
            .iter()
            .filter(|a| !enforced.contains(&a.type_))
            .cloned(),
    );
    Ok(result)
}

/// Applies the node's provided-node-ip annotation (if any) to the cloud's addresses.
pub fn honor_provided_node_ip(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, NodeIpError> {
    match node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
    {
        Some(value) => filter_by_node_ips(&parse_provided_node_ips(value)?, cloud),
        None => Ok(cloud.to_vec()),
    }
}

fn node_addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
}

/// The addresses to write to `status.addresses`, or `None` when nothing changes: the node is still
/// tainted, the cloud gave no addresses (they never wipe the node's), or the list is unchanged.
pub fn plan_addresses(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, NodeIpError> {
    if is_uninitialized(node) || cloud.is_empty() {
        return Ok(None);
    }
    let current = node_addresses(node);
    let wanted = without_duplicates(&honor_provided_node_ip(
        node,
        &with_hostname(cloud, current),
    )?);
    Ok(addresses_changed(current, &wanted).then_some(wanted))
}

/// `addresses` with each (type, address) pair once, first occurrence kept: the API server refuses any
/// update of a Node whose status repeats one ("Duplicate value").
pub fn without_duplicates(addresses: &[NodeAddress]) -> Vec<NodeAddress> {
    let mut seen = std::collections::HashSet::new();
    addresses
        .iter()
        .filter(|a| seen.insert((a.type_.as_str(), a.address.as_str())))
        .cloned()
        .collect()
}

/// The addresses to write before initializing a node whose status repeats an address (a kubelet or a
/// client may create it so; the API server then refuses every update of the node, the initialization
/// included): the addresses an initialized node would get ([`plan_addresses`]), or, if the cloud has
/// none, the node's own, without repeats. `None` when the node repeats none.
pub fn repair_duplicate_addresses(node: &Node, cloud: &[NodeAddress]) -> Option<Vec<NodeAddress>> {
    let current = node_addresses(node);
    let unique = without_duplicates(current);
    if unique.len() == current.len() {
        return None;
    }
    if cloud.is_empty() {
        return Some(unique);
    }
    Some(without_duplicates(&with_hostname(cloud, current)))
}

/// The cloud's addresses, plus the node's Hostname addresses when the cloud reports none.
fn with_hostname(cloud: &[NodeAddress], current: &[NodeAddress]) -> Vec<NodeAddress> {
    let mut wanted = cloud.to_vec();
    if !wanted.iter().any(|a| a.type_ == "Hostname") {
        wanted.extend(current.iter().filter(|a| a.type_ == "Hostname").cloned());
    }
    wanted
}

/// Upstream's comparison: different lengths, or a new address that differs from the (last) old address
/// of its type. Order does not matter.
pub fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if old.len() != new.len() {
        return true;
    }
    let by_type: BTreeMap<&str, &str> = old
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    new.iter()
        .any(|a| by_type.get(a.type_.as_str()) != Some(&a.address.as_str()))
}

/// The status patch that replaces the node's addresses.
pub fn addresses_patch(addresses: &[NodeAddress]) -> Value {
    json!({ "status": { "addresses": addresses } })
}

#[cfg(test)]
mod tests {
    use cloud_provider::node_address;
    use k8s_openapi::{
        api::core::v1::{NodeSpec, NodeStatus},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: Some("true".into()),
            ..Default::default()
        }
    }

    fn node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![taint(TAINT_UNINITIALIZED, "NoSchedule")]),
                ..Default::default()
            }),
            status: Some(NodeStatus::default()),
        }
    }

    fn with_labels(mut node: Node, labels: &[(&str, &str)]) -> Node {
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node
    }

    fn with_addresses(mut node: Node, addresses: Vec<NodeAddress>) -> Node {
        node.status.get_or_insert_with(Default::default).addresses = Some(addresses);
        node
    }

    fn untainted(mut node: Node) -> Node {
        node.spec.as_mut().unwrap().taints = None;
        node
    }

    fn with_node_ip(mut node: Node, value: &str) -> Node {
        node.metadata.annotations =
            Some([(ANNOTATION_PROVIDED_NODE_IP.to_string(), value.to_string())].into());
        node
    }

    fn metadata() -> InstanceMetadata {
        InstanceMetadata {
            provider_id: "fake://n1".into(),
            instance_type: "large".into(),
            zone: "zone-b".into(),
            region: "region-1".into(),
            node_addresses: vec![node_address("InternalIP", "10.0.0.1")],
            additional_labels: BTreeMap::new(),
        }
    }

    #[test]
    fn initialization_sets_provider_id_labels_in_both_forms_and_removes_only_the_taint() {
        let mut n = node();
        n.spec.as_mut().unwrap().taints = Some(vec![
            taint("dedicated", "NoSchedule"),
            taint(TAINT_UNINITIALIZED, "NoSchedule"),
            taint("other", "NoExecute"),
        ]);
        let plan = plan_initialization(&n, &metadata());
        assert_eq!(plan.provider_id.as_deref(), Some("fake://n1"));
        assert_eq!(
            plan.labels,
            BTreeMap::from([
                (LABEL_INSTANCE_TYPE.to_string(), "large".to_string()),
                (LABEL_INSTANCE_TYPE_BETA.to_string(), "large".to_string()),
                (LABEL_ZONE.to_string(), "zone-b".to_string()),
                (LABEL_ZONE_BETA.to_string(), "zone-b".to_string()),
                (LABEL_REGION.to_string(), "region-1".to_string()),
                (LABEL_REGION_BETA.to_string(), "region-1".to_string()),
            ])
        );
        let keys: Vec<_> = plan.taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["dedicated", "other"]);
    }

    #[test]
    fn the_taint_is_matched_by_key_whatever_its_effect_or_value() {
        let mut n = node();
        let mut odd = taint(TAINT_UNINITIALIZED, "NoExecute");
        odd.value = None;
        n.spec.as_mut().unwrap().taints = Some(vec![odd]);
        assert!(is_uninitialized(&n));
        assert!(plan_initialization(&n, &metadata()).taints.is_empty());
    }

    #[test]
    fn an_existing_provider_id_is_kept_and_empty_fields_set_nothing() {
        let mut n = node();
        n.spec.as_mut().unwrap().provider_id = Some("fake://already".into());
        let plan = plan_initialization(
            &n,
            &InstanceMetadata {
                provider_id: "fake://other".into(),
                ..Default::default()
            },
        );
        assert_eq!(plan.provider_id, None);
        assert!(plan.labels.is_empty());
    }

    #[test]
    fn additional_labels_skip_kubernetes_namespaces_and_never_overwrite() {
        let n = with_labels(node(), &[("example.com/rack", "r9")]);
        let mut meta = metadata();
        meta.additional_labels = [
            ("example.com/rack", "r1"),
            ("example.com/pool", "blue"),
            ("kubernetes.io/evil", "x"),
            ("k8s.io/evil", "x"),
            ("topology.kubernetes.io/evil", "x"),
            ("node.k8s.io/evil", "x"),
            ("k8snio/kept", "yes"),
            ("app.k8snio/kept", "yes"),
            ("plain", "yes"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let plan = plan_initialization(&n, &meta);
        for kept in [
            "example.com/pool",
            "k8snio/kept",
            "app.k8snio/kept",
            "plain",
        ] {
            assert!(plan.labels.contains_key(kept), "{kept} missing");
        }
        for dropped in [
            "kubernetes.io/evil",
            "k8s.io/evil",
            "topology.kubernetes.io/evil",
            "node.k8s.io/evil",
        ] {
            assert!(!plan.labels.contains_key(dropped), "{dropped} applied");
        }
        assert!(!plan.labels.contains_key("example.com/rack"));
        assert_eq!(
            plan.kept_labels,
            vec![(
                "example.com/rack".to_string(),
                "r9".to_string(),
                "r1".to_string()
            )]
        );
    }

    #[test]
    fn the_patch_carries_the_resource_version_and_the_whole_taint_list() {
        let plan = plan_initialization(&node(), &metadata());
        let patch = plan.patch("42");
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["spec"]["providerID"], "fake://n1");
        assert_eq!(patch["spec"]["taints"], json!([]));
        assert_eq!(patch["metadata"]["labels"][LABEL_ZONE], "zone-b");
    }

    #[test]
    fn the_put_body_is_the_node_with_the_plan_applied_and_without_status() {
        let mut n = with_labels(node(), &[("team", "a")]);
        n.metadata.managed_fields = Some(vec![Default::default()]);
        n.spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .push(taint("other", "NoExecute"));
        let plan = plan_initialization(&n, &metadata());
        let body = plan.apply(&n);
        assert_eq!(body.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(body.metadata.managed_fields, None);
        assert!(body.status.is_none());
        let labels = body.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[LABEL_ZONE], "zone-b");
        let spec = body.spec.as_ref().unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("fake://n1"));
        assert_eq!(
            spec.taints.as_deref(),
            Some(&[taint("other", "NoExecute")][..])
        );
        // The same write as the merge patch, on everything the patch touches.
        let patched = serde_json::to_value(&body).unwrap();
        let patch = plan.patch("42");
        assert_eq!(patched["spec"]["taints"], patch["spec"]["taints"]);
        assert_eq!(patched["spec"]["providerID"], patch["spec"]["providerID"]);
        for (key, value) in patch["metadata"]["labels"].as_object().unwrap() {
            assert_eq!(&patched["metadata"]["labels"][key], value, "{key}");
        }
    }

    #[test]
    fn label_reconciliation_copies_beta_to_ga() {
        let n = untainted(with_labels(
            node(),
            &[
                (LABEL_ZONE_BETA, "z1"),
                (LABEL_ZONE, "z0"),
                (LABEL_REGION_BETA, "r1"),
                (LABEL_INSTANCE_TYPE_BETA, "t1"),
                (LABEL_INSTANCE_TYPE, "t1"),
            ],
        ));
        assert_eq!(
            plan_label_reconciliation(&n),
            BTreeMap::from([
                (LABEL_ZONE.to_string(), "z1".to_string()),
                (LABEL_REGION.to_string(), "r1".to_string()),
            ])
        );
        let ga_only = untainted(with_labels(node(), &[(LABEL_ZONE, "z1")]));
        assert!(plan_label_reconciliation(&ga_only).is_empty());
        let in_sync = untainted(with_labels(
            node(),
            &[(LABEL_ZONE, "z1"), (LABEL_ZONE_BETA, "z1")],
        ));
        assert!(plan_label_reconciliation(&in_sync).is_empty());
    }

    #[test]
    fn provided_node_ip_parsing() {
        assert_eq!(parse_provided_node_ips("10.0.0.1").unwrap().len(), 1);
        assert_eq!(
            parse_provided_node_ips("10.0.0.1,fd00::1").unwrap().len(),
            2
        );
        for bad in [
            "10.0.0.1,10.0.0.2",
            "fd00::1,fd00::2",
            "10.0.0.1,fd00::1,10.0.0.2",
            "0.0.0.0,fd00::1",
            "0.0.0.0",
            "10.0.0.1, fd00::1",
            "node-a",
            "",
        ] {
            let err = parse_provided_node_ips(bad).unwrap_err();
            assert!(
                err.to_string().contains(ANNOTATION_PROVIDED_NODE_IP),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn the_node_ip_filter_puts_matches_first_and_drops_other_addresses_of_their_type() {
        let cloud = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("InternalIP", "10.0.0.2"),
            node_address("ExternalIP", "198.51.100.1"),
            node_address("InternalIP", "2600:1f14:1d4:d101::ba3d"),
            node_address("Hostname", "n1"),
        ];
        let single = filter_by_node_ips(&["10.0.0.2".parse().unwrap()], &cloud).unwrap();
        assert_eq!(
            single,
            vec![
                node_address("InternalIP", "10.0.0.2"),
                node_address("ExternalIP", "198.51.100.1"),
                node_address("Hostname", "n1"),
            ]
        );
        // Compared as IPs, not strings.
        let dual = filter_by_node_ips(
            &[
                "10.0.0.1".parse().unwrap(),
                "2600:1f14:1d4:d101:0:0:0:ba3d".parse().unwrap(),
            ],
            &cloud,
        )
        .unwrap();
        assert_eq!(
            dual,
            vec![
                node_address("InternalIP", "10.0.0.1"),
                node_address("InternalIP", "2600:1f14:1d4:d101::ba3d"),
                node_address("ExternalIP", "198.51.100.1"),
                node_address("Hostname", "n1"),
            ]
        );
        assert_eq!(
            filter_by_node_ips(&["10.9.9.9".parse().unwrap()], &cloud)
                .unwrap_err()
                .to_string(),
            "failed to get node address from cloud provider that matches ip: 10.9.9.9"
        );
    }

    #[test]
    fn addresses_are_planned_only_for_initialized_nodes_with_cloud_addresses_that_differ() {
        let cloud = vec![node_address("InternalIP", "10.0.0.1")];
        assert_eq!(plan_addresses(&node(), &cloud), Ok(None), "still tainted");
        let n = untainted(with_addresses(node(), vec![node_address("Hostname", "n1")]));
        assert_eq!(
            plan_addresses(&n, &[]),
            Ok(None),
            "zero cloud addresses never wipe"
        );
        let planned = plan_addresses(&n, &cloud).unwrap().unwrap();
        assert_eq!(
            planned,
            vec![
                node_address("InternalIP", "10.0.0.1"),
                node_address("Hostname", "n1")
            ]
        );
        let current = untainted(with_addresses(node(), planned.clone()));
        assert_eq!(plan_addresses(&current, &cloud), Ok(None), "unchanged");
        // The cloud's own Hostname wins over the kubelet's.
        let with_hostname = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("Hostname", "cloud-name"),
        ];
        assert_eq!(
            plan_addresses(&current, &with_hostname).unwrap(),
            Some(with_hostname)
        );
    }

    #[test]
    fn repeated_addresses_are_repaired_from_the_cloud_or_dropped() {
        let repeated = with_addresses(
            node(),
            vec![
                node_address("InternalIP", "10.0.0.9"),
                node_address("Hostname", "n1"),
                node_address("InternalIP", "10.0.0.9"),
            ],
        );
        let cloud = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("InternalIP", "10.0.0.1"),
        ];
        assert_eq!(
            repair_duplicate_addresses(&repeated, &cloud),
            Some(vec![
                node_address("InternalIP", "10.0.0.1"),
                node_address("Hostname", "n1"),
            ])
        );
        assert_eq!(
            repair_duplicate_addresses(&repeated, &[]),
            Some(vec![
                node_address("InternalIP", "10.0.0.9"),
                node_address("Hostname", "n1"),
            ])
        );
        let unique = with_addresses(node(), vec![node_address("Hostname", "n1")]);
        assert_eq!(repair_duplicate_addresses(&unique, &cloud), None);
        // The same address under two types is no repeat.
        let two_types = with_addresses(
            node(),
            vec![
                node_address("InternalIP", "n1"),
                node_address("Hostname", "n1"),
            ],
        );
        assert_eq!(repair_duplicate_addresses(&two_types, &cloud), None);
        // Planned addresses never repeat one either.
        let planned = plan_addresses(&untainted(unique), &cloud).unwrap().unwrap();
        assert_eq!(
            planned,
            vec![
                node_address("InternalIP", "10.0.0.1"),
                node_address("Hostname", "n1"),
            ]
        );
    }

    #[test]
    fn addresses_honor_the_annotation_and_report_a_mismatch() {
        let n = with_node_ip(untainted(node()), "10.0.0.2");
        let cloud = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("InternalIP", "10.0.0.2"),
        ];
        assert_eq!(
            plan_addresses(&n, &cloud).unwrap(),
            Some(vec![node_address("InternalIP", "10.0.0.2")])
        );
        assert!(matches!(
            plan_addresses(&n, &[node_address("InternalIP", "10.0.0.1")]),
            Err(NodeIpError::NoMatch(_))
        ));
    }

    #[test]
    fn address_comparison_follows_upstream() {
        let a = node_address("InternalIP", "10.0.0.1");
        let b = node_address("ExternalIP", "1.2.3.4");
        assert!(
            !addresses_changed(&[a.clone(), b.clone()], &[b.clone(), a.clone()]),
            "order-insensitive"
        );
        let only_a = vec![a.clone()];
        assert!(addresses_changed(&only_a, &[a.clone(), b.clone()]));
        assert!(addresses_changed(
            &only_a,
            &[node_address("InternalIP", "10.0.0.9")]
        ));
        assert_eq!(
            addresses_patch(&[a])["status"]["addresses"][0]["address"],
            "10.0.0.1"
        );
    }
}
