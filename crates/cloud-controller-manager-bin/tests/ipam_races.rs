//! Node IPAM racing the cloud-node controller against the real API server: both write every new node at
//! once, so the IPAM controller sees views of a node older than its own write (the cloud-node
//! controller's write just before it). It must neither write a second CIDR (refused: podCIDR is
//! immutable, which upstream reports as a `CIDRAssignmentFailed` Warning) nor lose track of one.

mod support;

use std::{collections::HashSet, time::Duration};

use ipnet::IpNet;
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{Api, api::ListParams};
use support::{RunningManager, SERIAL, admin, create_node, delete_nodes, eventually, get_node};
use test_control_plane::{kubelet_node, unique_name};

const WAIT: Duration = Duration::from_secs(60);

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref()?.provider_id.as_deref()
}

async fn all_nodes() -> Vec<Node> {
    support::nodes()
        .await
        .list(&ListParams::default())
        .await
        .expect("nodes listed")
        .items
}

async fn all_events() -> Vec<Event> {
    Api::<Event>::all(admin().await)
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
}

fn about(event: &Event) -> &str {
    event
        .regarding
        .as_ref()
        .and_then(|r| r.name.as_deref())
        .unwrap_or_default()
}

/// A /17 in 10.64.0.0/10 that no node's pod CIDR overlaps (earlier runs leave none, but a crashed one
/// might): 128 node CIDRs of /24 that only this test's nodes can take.
fn unused_range(nodes: &[Node]) -> IpNet {
    let taken: Vec<IpNet> = nodes
        .iter()
        .flat_map(pod_cidrs)
        .filter_map(|c| c.parse().ok())
        .collect();
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    (0..128)
        .map(|i| (start + i) % 128)
        .map(|i| format!("10.{}.{}.0/17", 64 + i / 2, (i % 2) * 128))
        .map(|c| c.parse::<IpNet>().unwrap())
        .find(|range| {
            !taken
                .iter()
                .any(|t| range.contains(&t.network()) || t.contains(&range.network()))
        })
        .expect("a free /17 in 10.64.0.0/10")
}

/// Registers `names` at once, as a burst of kubelets would, and waits until the cloud-node controller
/// has initialized each and the IPAM controller has given each a CIDR.
async fn register_burst(names: &[String]) -> Vec<Node> {
    futures::future::join_all(names.iter().map(|name| async move {
        create_node(&kubelet_node(name)).await;
    }))
    .await;
    eventually("every node initialized with a CIDR", WAIT, || async {
        let ours: Vec<Node> = all_nodes()
            .await
            .into_iter()
            .filter(|n| names.contains(n.metadata.name.as_ref().unwrap()))
            .collect();
        (ours.len() == names.len()
            && ours
                .iter()
                .all(|n| provider_id(n).is_some() && !pod_cidrs(n).is_empty()))
        .then_some(ours)
    })
    .await
}

#[tokio::test]
async fn a_burst_of_nodes_initialized_concurrently_gets_one_cidr_each_and_no_failed_assignment() {
    let _serial = SERIAL.lock().await;
    // Nodes already in the cluster (other tests', earlier runs') get CIDRs from a wide range first, so
    // the exact-size range below serves only this test's nodes.
    let filler = RunningManager::start(
        "",
        &[
            "--controllers=nodeipam",
            "--allocate-node-cidrs=true",
            "--cluster-cidr=10.203.0.0/16",
        ],
    )
    .await;
    eventually("every node to hold a CIDR", WAIT, || async {
        all_nodes()
            .await
            .iter()
            .all(|n| !pod_cidrs(n).is_empty())
            .then_some(())
    })
    .await;
    filler.stop().await;

    // Exactly 128 node CIDRs for exactly 128 nodes: a CIDR taken and never given (leaked) leaves a node
    // without one.
    let range = unused_range(&all_nodes().await);
    let started = k8s_openapi::jiff::Timestamp::now();
    let manager = RunningManager::start(
        "",
        &[
            "--controllers=cloud-node,nodeipam",
            "--allocate-node-cidrs=true",
            &format!("--cluster-cidr={range}"),
            "--node-cidr-mask-size=24",
        ],
    )
    .await;

    // One node first, so both controllers are running when the bursts come.
    let probe = unique_name("race-probe");
    let mut nodes = register_burst(std::slice::from_ref(&probe)).await;
    // Two bursts of 63 and 64 kubelets registering at once: the cloud-node controller initializes each
    // while the IPAM controller allocates, so the IPAM controller sees the cloud-node controller's write
    // of a node after its own. In the first burst the range has room (a second allocation would be
    // written and refused); the second fills it (a second allocation would find it full).
    let first: Vec<String> = (0..63)
        .map(|i| unique_name(&format!("race-a{i}")))
        .collect();
    nodes.extend(register_burst(&first).await);
    let second: Vec<String> = (0..64)
        .map(|i| unique_name(&format!("race-b{i}")))
        .collect();
    nodes.extend(register_burst(&second).await);
    let names: Vec<String> = nodes
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();

    // Exactly one CIDR each (podCIDR is podCIDRs[0]), in the range, all distinct.
    let mut seen = HashSet::new();
    for node in &nodes {
        let name = node.metadata.name.as_deref().unwrap();
        let cidrs = pod_cidrs(node);
        assert_eq!(cidrs.len(), 1, "{name}: {cidrs:?}");
        assert_eq!(
            node.spec.as_ref().unwrap().pod_cidr.as_ref(),
            Some(&cidrs[0]),
            "{name}"
        );
        let net: IpNet = cidrs[0].parse().unwrap();
        assert!(
            range.contains(&net) && net.prefix_len() == 24,
            "{name}: {net}"
        );
        assert!(seen.insert(net), "{net} given to two nodes");
    }
    assert_eq!(seen.len(), 128);

    // A 129th node finds the range full.
    let overflow = unique_name("race-overflow");
    create_node(&kubelet_node(&overflow)).await;
    eventually("CIDRNotAvailable for the 129th node", WAIT, || async {
        all_events()
            .await
            .iter()
            .any(|e| about(e) == overflow && e.reason.as_deref() == Some("CIDRNotAvailable"))
            .then_some(())
    })
    .await;

    // Nothing leaked: the probe's CIDR, freed by its deletion, is the one the 129th node gets.
    let probe_cidr = pod_cidrs(&nodes[0]);
    delete_nodes(&[&probe]).await;
    let got = eventually("the freed CIDR for the 129th node", WAIT, || async {
        get_node(&overflow)
            .await
            .map(|n| pod_cidrs(&n))
            .filter(|c| !c.is_empty())
    })
    .await;
    assert_eq!(got, probe_cidr);

    // The controller handles changes in order, and the overflow node's changes came after every view of
    // the others (all of which held their CIDR before it was created): the events those views caused,
    // if any, were queued for delivery before its CIDRNotAvailable, which has arrived, and before its
    // allocation.
    let events = all_events().await;
    let failed: Vec<String> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("CIDRAssignmentFailed"))
        .filter(|e| {
            names.iter().any(|n| n == about(e))
                || e.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| t.0.as_second() >= started.as_second())
        })
        .map(|e| format!("{}: {}", about(e), e.note.as_deref().unwrap_or_default()))
        .collect();
    assert!(
        failed.is_empty(),
        "CIDRAssignmentFailed for nodes that got their CIDR: {failed:?}"
    );
    // Nor any other allocator event about a node that got its CIDR at once (a second allocation for a
    // node that has one would say CIDRNotAvailable once the range is full), nor any Warning.
    let spurious: Vec<String> = events
        .iter()
        .filter(|e| names.iter().any(|n| n == about(e)))
        .filter(|e| {
            e.reporting_controller.as_deref() == Some("cidrAllocator")
                || e.type_.as_deref() == Some("Warning")
        })
        .map(|e| format!("{} {}", about(e), e.reason.as_deref().unwrap_or_default()))
        .collect();
    assert!(spurious.is_empty(), "events: {spurious:?}");

    manager.stop().await;
    let mut all: Vec<&str> = first.iter().chain(&second).map(String::as_str).collect();
    all.push(&overflow);
    delete_nodes(&all).await;
}
