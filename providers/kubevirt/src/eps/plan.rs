//! What the infra EndpointSlices of one mirrored infra Service should be (pure, table-tested): one
//! endpoint per VMI whose tenant node has an endpoint of the tenant Service, at the VMI's address of
//! the slice's family, sending to the tenant node port.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{
        core::v1::Service,
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};

use crate::vmi::{self, Phase, Vmi};

/// The controller's name in the slices' `endpointslice.kubernetes.io/managed-by` label (upstream's).
pub const MANAGED_BY: &str = "kubevirt-eps-controller";
/// The slices' managed-by label key.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The slices' Service label key.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Upstream's cap on endpoints per slice.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// One change to the infra cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Create this slice (named by `generateName`).
    Create(EndpointSlice),
    /// Replace the slice of this name with this one.
    Replace(EndpointSlice),
    /// Delete the slice of this name.
    Delete(String),
}

/// Whether `service` is mirrored: one of ours (the tenant labels) whose endpoints nobody else writes (no
/// selector).
pub fn mirrored(service: &Service) -> bool {
    let labels = service.metadata.labels.clone().unwrap_or_default();
    let ours = [
        crate::load_balancer::TENANT_SERVICE_NAME_LABEL,
        crate::load_balancer::TENANT_SERVICE_NAMESPACE_LABEL,
        crate::load_balancer::TENANT_CLUSTER_NAME_LABEL,
    ]
    .iter()
    .all(|k| labels.get(*k).is_some_and(|v| !v.is_empty()));
    let spec = service.spec.clone().unwrap_or_default();
    ours && spec.type_.as_deref() == Some("LoadBalancer")
        && spec.selector.as_ref().is_none_or(BTreeMap::is_empty)
}

/// The address types (`IPv4`, `IPv6`) of the Service's families (upstream's rule: its `ipFamilies`,
/// else its cluster IP's family, else both).
pub fn address_types(service: &Service) -> BTreeSet<&'static str> {
    let spec = service.spec.clone().unwrap_or_default();
    let mut types: BTreeSet<&'static str> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some("IPv4"),
            "IPv6" => Some("IPv6"),
            _ => None,
        })
        .collect();
    if types.is_empty() {
        match spec.cluster_ip.as_deref() {
            Some(ip) if !ip.is_empty() && ip != "None" => {
                types.insert(if ip.contains(':') { "IPv6" } else { "IPv4" });
            }
            _ => {
                types.extend(["IPv4", "IPv6"]);
            }
        }
    }
    types
}

/// What a tenant node's endpoints say: whether one of them is ready, and whether one is serving.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct NodeEndpoints {
    ready: bool,
    serving: bool,
}

/// The tenant nodes with an endpoint in `tenant_slices`, and whether one of each node's is ready and
/// serving (an unset condition counts as true, as the API says).
fn tenant_nodes(tenant_slices: &[EndpointSlice]) -> BTreeMap<String, NodeEndpoints> {
    let mut nodes: BTreeMap<String, NodeEndpoints> = BTreeMap::new();
    for endpoint in tenant_slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
    {
        let Some(node) = endpoint.node_name.as_ref() else {
            continue;
        };
        let conditions = endpoint.conditions.clone().unwrap_or_default();
        let ready = conditions.ready.unwrap_or(true);
        let serving = conditions.serving.unwrap_or(ready);
        let entry = nodes.entry(node.clone()).or_default();
        entry.ready |= ready;
        entry.serving |= serving;
    }
    nodes
}

fn family_of(address: &str, address_type: &str) -> bool {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => address_type == "IPv4",
        Ok(std::net::IpAddr::V6(_)) => address_type == "IPv6",
        Err(_) => false,
    }
}

/// The endpoints of `address_type`: one per address of the family on each VMI's `default` interface,
/// for each tenant node with an endpoint whose VMI exists (ready and serving while the VMI runs and
/// the tenant's endpoints on that node are; terminating when the VMI is down), sorted by address.
pub fn endpoints(
    tenant_slices: &[EndpointSlice],
    vmis: &BTreeMap<String, Vmi>,
    address_type: &str,
) -> Vec<Endpoint> {
    let mut endpoints = Vec::new();
    for (node, tenant) in tenant_nodes(tenant_slices) {
        let Some(vmi) = vmis.get(&node) else {
            continue;
        };
        let running = vmi::running(vmi);
        let terminating = vmi::phase(vmi) == Phase::Down;
        for address in vmi::default_interface_addresses(vmi)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| family_of(a, address_type))
        {
            endpoints.push(Endpoint {
                addresses: vec![address],
                conditions: Some(EndpointConditions {
                    ready: Some(running && tenant.ready),
                    serving: Some(running && tenant.serving),
                    terminating: Some(terminating),
                }),
                node_name: vmi.status.as_ref().and_then(|s| s.node_name.clone()),
                ..Default::default()
            });
        }
    }
    endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    endpoints.dedup_by(|a, b| a.addresses == b.addresses);
    endpoints
}

/// The slices' ports: the infra Service's, to its target ports (the tenant node ports).
fn ports(service: &Service) -> Vec<EndpointPort> {
    service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| EndpointPort {
            name: Some(p.name.clone().unwrap_or_default()),
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            port: match &p.target_port {
                Some(IntOrString::Int(port)) => Some(*port),
                _ => Some(p.port),
            },
            app_protocol: None,
        })
        .collect()
}

/// The labels of a slice of `service`: the Service's, the Service name and managed-by.
fn labels(service: &Service) -> BTreeMap<String, String> {
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.insert(
        SERVICE_NAME_LABEL.into(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels
}

fn owner(service: &Service) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: service.metadata.name.clone().unwrap_or_default(),
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]
}

fn slice_content_equal(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.endpoints == b.endpoints
        && a.ports == b.ports
        && a.metadata.labels == b.metadata.labels
        && a.metadata.owner_references == b.metadata.owner_references
}

/// The changes that make `existing` (the slices this controller manages for `service`, any family)
/// what `service` (`None`: deleted, or no longer mirrored) and the tenant's slices ask for.
pub fn plan(
    service: Option<&Service>,
    tenant_slices: &[EndpointSlice],
    vmis: &BTreeMap<String, Vmi>,
    existing: &[EndpointSlice],
) -> Vec<Change> {
    let mut changes = Vec::new();
    let Some(service) = service.filter(|s| mirrored(s)) else {
        changes.extend(
            existing
                .iter()
                .filter_map(|s| s.metadata.name.clone())
                .map(Change::Delete),
        );
        return changes;
    };
    let types = address_types(service);
    let name = service.metadata.name.clone().unwrap_or_default();
    for slice in existing {
        if !types.contains(slice.address_type.as_str()) {
            changes.extend(slice.metadata.name.clone().map(Change::Delete));
        }
    }
    for address_type in types {
        let wanted: Vec<Vec<Endpoint>> = endpoints(tenant_slices, vmis, address_type)
            .chunks(MAX_ENDPOINTS_PER_SLICE)
            .map(<[Endpoint]>::to_vec)
            .collect();
        let mut have: Vec<&EndpointSlice> = existing
            .iter()
            .filter(|s| s.address_type == address_type)
            .collect();
        have.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        // An empty slice is kept when there are no endpoints (as the endpoint-slice controller does), so
        // consumers see "none" rather than "not mirrored yet".
        let wanted = if wanted.is_empty() {
            vec![Vec::new()]
        } else {
            wanted
        };
        let needed = wanted.len();
        for (i, endpoints) in wanted.into_iter().enumerate() {
            let slice = EndpointSlice {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{name}-")),
                    namespace: service.metadata.namespace.clone(),
                    labels: Some(labels(service)),
                    owner_references: Some(owner(service)),
                    ..Default::default()
                },
                address_type: address_type.to_owned(),
                endpoints: Some(endpoints),
                ports: Some(ports(service)),
            };
            match have.get(i) {
                None => changes.push(Change::Create(slice)),
                Some(current) if slice_content_equal(current, &slice) => {}
                Some(current) => {
                    let mut replaced = slice;
                    replaced.metadata.name = current.metadata.name.clone();
                    replaced.metadata.resource_version = current.metadata.resource_version.clone();
                    changes.push(Change::Replace(replaced));
                }
            }
        }
        for surplus in have.iter().skip(needed) {
            changes.extend(surplus.metadata.name.clone().map(Change::Delete));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    use super::*;
    use crate::vmi::{VmiInterface, VmiStatus};

    fn service(families: &[&str], selector: bool) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("a123".into());
        s.metadata.namespace = Some("infra".into());
        s.metadata.uid = Some("uid-1".into());
        s.metadata.labels = Some(BTreeMap::from([
            ("cluster.x-k8s.io/tenant-service-name".into(), "web".into()),
            (
                "cluster.x-k8s.io/tenant-service-namespace".into(),
                "shop".into(),
            ),
            ("cluster.x-k8s.io/cluster-name".into(), "t1".into()),
        ]));
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ip_families: Some(families.iter().map(|f| (*f).to_owned()).collect()),
            selector: selector.then(|| BTreeMap::from([("a".into(), "b".into())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(30080)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        s
    }

    fn tenant(endpoints: &[(&str, bool)]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(
                endpoints
                    .iter()
                    .map(|(node, ready)| Endpoint {
                        addresses: vec!["10.244.0.5".into()],
                        node_name: Some((*node).into()),
                        conditions: Some(EndpointConditions {
                            ready: Some(*ready),
                            serving: Some(*ready),
                            terminating: Some(false),
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn vmi(name: &str, phase: &str, ips: &[&str]) -> (String, Vmi) {
        let mut vmi = Vmi::new(name, &vmi::api_resource(), Default::default());
        vmi.status = Some(VmiStatus {
            phase: Some(phase.into()),
            node_name: Some(format!("infra-{name}")),
            interfaces: vec![VmiInterface {
                name: Some("default".into()),
                ip_address: ips.first().map(|s| (*s).to_owned()),
                ip_addresses: ips.iter().map(|s| (*s).to_owned()).collect(),
            }],
        });
        (name.to_owned(), vmi)
    }

    fn addresses(change: &Change) -> Vec<(String, bool, bool)> {
        let (Change::Create(s) | Change::Replace(s)) = change else {
            return Vec::new();
        };
        s.endpoints
            .iter()
            .flatten()
            .map(|e| {
                let c = e.conditions.clone().unwrap();
                (
                    e.addresses[0].clone(),
                    c.ready.unwrap(),
                    c.terminating.unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn only_our_selectorless_load_balancers_are_mirrored() {
        assert!(mirrored(&service(&["IPv4"], false)));
        assert!(!mirrored(&service(&["IPv4"], true)));
        let mut foreign = service(&["IPv4"], false);
        foreign.metadata.labels = None;
        assert!(!mirrored(&foreign));
    }

    #[test]
    fn address_types_follow_upstream() {
        assert_eq!(
            address_types(&service(&["IPv4", "IPv6"], false)),
            BTreeSet::from(["IPv4", "IPv6"])
        );
        let mut by_cluster_ip = service(&[], false);
        by_cluster_ip.spec.as_mut().unwrap().cluster_ip = Some("fd00::1".into());
        assert_eq!(address_types(&by_cluster_ip), BTreeSet::from(["IPv6"]));
        by_cluster_ip.spec.as_mut().unwrap().cluster_ip = None;
        assert_eq!(
            address_types(&by_cluster_ip),
            BTreeSet::from(["IPv4", "IPv6"])
        );
    }

    #[test]
    fn endpoints_per_vmi_of_a_node_with_endpoints() {
        let vmis = BTreeMap::from([
            vmi("n1", "Running", &["10.0.0.1", "fd00::1"]),
            vmi("n2", "Running", &["10.0.0.2"]),
            vmi("n3", "Failed", &["10.0.0.3"]),
            vmi("n4", "Running", &["10.0.0.4"]),
        ]);
        // n1 ready, n2 only not-ready endpoints, n3's VMI failed, n4 has no endpoint, n5 no VMI.
        let tenant_slices = [tenant(&[
            ("n1", true),
            ("n2", false),
            ("n3", true),
            ("n5", true),
        ])];
        let changes = plan(Some(&service(&["IPv4"], false)), &tenant_slices, &vmis, &[]);
        assert_eq!(changes.len(), 1);
        assert_eq!(
            addresses(&changes[0]),
            vec![
                ("10.0.0.1".into(), true, false),
                ("10.0.0.2".into(), false, false),
                ("10.0.0.3".into(), false, true),
            ]
        );
        let Change::Create(slice) = &changes[0] else {
            panic!("a create")
        };
        assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(30080));
        assert_eq!(
            slice.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            MANAGED_BY
        );
        assert_eq!(
            slice.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL],
            "a123"
        );
        assert_eq!(
            slice.endpoints.as_ref().unwrap()[0].node_name.as_deref(),
            Some("infra-n1")
        );
        // Dual-stack: one slice per family, each with its own family's addresses.
        let dual = plan(
            Some(&service(&["IPv4", "IPv6"], false)),
            &tenant_slices,
            &vmis,
            &[],
        );
        assert_eq!(dual.len(), 2);
        assert_eq!(addresses(&dual[1]), vec![("fd00::1".into(), true, false)]);
    }

    fn applied(changes: &[Change]) -> Vec<EndpointSlice> {
        changes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Change::Create(s) => {
                    let mut s = s.clone();
                    s.metadata.name = Some(format!("a123-{i}"));
                    Some(s)
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_second_look_changes_nothing_and_moves_are_replaced() {
        let vmis = BTreeMap::from([
            vmi("n1", "Running", &["10.0.0.1"]),
            vmi("n2", "Running", &["10.0.0.2"]),
        ]);
        let svc = service(&["IPv4"], false);
        let first = plan(Some(&svc), &[tenant(&[("n1", true)])], &vmis, &[]);
        let existing = applied(&first);
        assert_eq!(
            plan(Some(&svc), &[tenant(&[("n1", true)])], &vmis, &existing),
            vec![]
        );
        // The endpoint moves to n2: the slice is replaced, keeping its name.
        let moved = plan(Some(&svc), &[tenant(&[("n2", true)])], &vmis, &existing);
        assert_eq!(moved.len(), 1);
        let Change::Replace(slice) = &moved[0] else {
            panic!("a replace")
        };
        assert_eq!(slice.metadata.name.as_deref(), Some("a123-0"));
        assert_eq!(addresses(&moved[0]), vec![("10.0.0.2".into(), true, false)]);
        // No endpoint at all: an empty slice, not none.
        let none = plan(Some(&svc), &[], &vmis, &existing);
        let Change::Replace(empty) = &none[0] else {
            panic!("a replace")
        };
        assert_eq!(empty.endpoints, Some(Vec::new()));
    }

    #[test]
    fn slices_go_when_the_service_goes_or_gets_a_selector_or_changes_family() {
        let vmis = BTreeMap::from([vmi("n1", "Running", &["10.0.0.1", "fd00::1"])]);
        let svc = service(&["IPv4"], false);
        let existing = applied(&plan(Some(&svc), &[tenant(&[("n1", true)])], &vmis, &[]));
        assert_eq!(
            plan(None, &[], &vmis, &existing),
            vec![Change::Delete("a123-0".into())]
        );
        assert_eq!(
            plan(Some(&service(&["IPv4"], true)), &[], &vmis, &existing),
            vec![Change::Delete("a123-0".into())]
        );
        let v6 = plan(
            Some(&service(&["IPv6"], false)),
            &[tenant(&[("n1", true)])],
            &vmis,
            &existing,
        );
        assert_eq!(v6[0], Change::Delete("a123-0".into()));
        assert!(matches!(&v6[1], Change::Create(s) if s.address_type == "IPv6"));
    }

    #[test]
    fn large_services_are_split_at_a_hundred() {
        let vmis: BTreeMap<String, Vmi> = (0..250)
            .map(|i| {
                vmi(
                    &format!("n{i}"),
                    "Running",
                    &[&format!("10.0.{}.{}", i / 200, i % 200 + 1)],
                )
            })
            .collect();
        let nodes: Vec<String> = (0..250).map(|i| format!("n{i}")).collect();
        let tenant_slices = [tenant(
            &nodes.iter().map(|n| (n.as_str(), true)).collect::<Vec<_>>(),
        )];
        let svc = service(&["IPv4"], false);
        let changes = plan(Some(&svc), &tenant_slices, &vmis, &[]);
        let sizes: Vec<usize> = changes.iter().map(|c| addresses(c).len()).collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        // Fewer endpoints later: the surplus slice is deleted.
        let existing = applied(&changes);
        let fewer = plan(Some(&svc), &[tenant(&[("n1", true)])], &vmis, &existing);
        assert!(fewer.contains(&Change::Delete("a123-1".into())));
        assert!(fewer.contains(&Change::Delete("a123-2".into())));
    }
}
