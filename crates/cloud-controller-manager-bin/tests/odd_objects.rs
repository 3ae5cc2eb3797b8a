//! Odd objects the API server accepts (longest names, a hundred ports, one port on two protocols,
//! hundreds of addresses, address strings that are no IPs) are handled like any other and never hold
//! up the ordinary ones.

mod support;

use std::{collections::BTreeSet, path::Path, time::Duration};

use cloud_provider_fake::CloudState;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::{
    RunningManager, SERIAL, create_namespace, create_node, delete_nodes, eventually, get_node,
    load_balancer_service, load_balancers_in, services, status_ip,
};
use test_control_plane::{kubelet_node, unique_name};

const WAIT: Duration = Duration::from_secs(60);

fn initialized(node: &Node) -> bool {
    node.spec.as_ref().is_some_and(|s| {
        s.provider_id.is_some() && s.taints.as_deref().unwrap_or_default().is_empty()
    })
}

fn load_balancers_of(state_file: &Path, namespace: &str) -> Vec<(String, usize)> {
    load_balancers_in(&CloudState::read(state_file).unwrap_or_default(), namespace)
        .into_iter()
        .map(|lb| (lb.service, lb.ports.len()))
        .collect()
}

#[tokio::test]
async fn odd_objects_are_handled_and_never_hold_up_the_others() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let manager = RunningManager::start(
        &format!("stateFile: {}\n", state_file.display()),
        &["--controllers=cloud-node,service"],
    )
    .await;

    // Nodes: two ordinary ones, one with the longest name, one with 300 addresses some of which are
    // no IPs at all.
    let prefix = unique_name("odd");
    let ordinary: Vec<String> = (0..2).map(|i| format!("{prefix}-{i}")).collect();
    let long = format!("{prefix}.{}", "n".repeat(252 - prefix.len()));
    let crowded = format!("{prefix}-crowded");
    for name in &ordinary {
        create_node(&kubelet_node(name)).await;
    }
    let mut long_node = kubelet_node(&long);
    long_node
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove("kubernetes.io/hostname");
    create_node(&long_node).await;
    let mut crowded_node = kubelet_node(&crowded);
    let mut addresses: Vec<NodeAddress> = (0..290)
        .map(|i| NodeAddress {
            type_: "InternalIP".to_owned(),
            address: format!("10.77.{}.{}", i / 250, i % 250 + 1),
        })
        .collect();
    for odd in [
        "not-an-ip",
        "10.0.0.1/24",
        "::ffff:10.1.2.3",
        "0x7f.1",
        "",
        "ä",
        "1.2.3.4.5",
        "fe80::1%eth0",
        "[::1]",
        "999.1.1.1",
    ] {
        addresses.push(NodeAddress {
            type_: "ExternalIP".to_owned(),
            address: odd.to_owned(),
        });
    }
    crowded_node.status.as_mut().unwrap().addresses = Some(addresses);
    let created = create_node(&crowded_node).await;
    assert!(
        created.status.unwrap().addresses.unwrap().len() > 100,
        "the API server accepts hundreds of addresses"
    );

    // Services: the longest names, a hundred ports, one port on TCP and UDP, local traffic, and an
    // ordinary one.
    let namespace = format!("{prefix}-{}", "s".repeat(62 - prefix.len()));
    assert_eq!(namespace.len(), 63);
    create_namespace(&namespace).await;
    let api = services(&namespace).await;
    let longest = "l".repeat(63);
    let hundred: Vec<i32> = (1000..1100).collect();
    let mut odd_services = vec![
        load_balancer_service(&longest, &hundred),
        load_balancer_service("ordinary", &[80]),
    ];
    odd_services.push(
        serde_json::from_value(json!({
            "metadata": { "name": "dns" },
            "spec": { "type": "LoadBalancer", "selector": { "app": "dns" }, "ports": [
                { "name": "tcp", "port": 53, "protocol": "TCP" },
                { "name": "udp", "port": 53, "protocol": "UDP" },
            ] }
        }))
        .unwrap(),
    );
    odd_services.push(
        serde_json::from_value(json!({
            "metadata": { "name": "local" },
            "spec": { "type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": { "app": "local" },
                      "ports": [{ "port": 443, "protocol": "TCP" }] }
        }))
        .unwrap(),
    );
    let names: Vec<String> = odd_services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    for service in &odd_services {
        api.create(&PostParams::default(), service).await.unwrap();
    }

    for name in ordinary.iter().chain([&long, &crowded]) {
        eventually(&format!("{name} initialized"), WAIT, || async {
            get_node(name).await.filter(initialized)
        })
        .await;
    }
    for name in &names {
        eventually(&format!("{name} provisioned"), WAIT, || async {
            status_ip(&api.get_opt(name).await.unwrap()?)
        })
        .await;
    }
    let lbs = load_balancers_of(&state_file, &namespace);
    assert_eq!(lbs.len(), names.len(), "one load balancer each: {lbs:?}");
    let services_with_lb: BTreeSet<&str> = lbs.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(services_with_lb.len(), names.len(), "{lbs:?}");
    let ports = |service: &str| {
        lbs.iter()
            .find(|(s, _)| s == &format!("{namespace}/{service}"))
            .map(|(_, ports)| *ports)
    };
    assert_eq!(ports(&longest), Some(100));
    assert_eq!(ports("dns"), Some(2));

    for name in &names {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("every load balancer deleted", WAIT, || async {
        load_balancers_of(&state_file, &namespace)
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("every Service gone", WAIT, || async {
        for name in &names {
            if api.get_opt(name).await.unwrap().is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    manager.stop().await;
    let all: Vec<&str> = ordinary
        .iter()
        .chain([&long, &crowded])
        .map(String::as_str)
        .collect();
    delete_nodes(&all).await;
}
