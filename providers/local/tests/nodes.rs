//! Nodes of the `local` cloud on the real API server: initialization from the inventory, adoption, the
//! shutdown taint for `state: shutdown`, and deletion of a machine removed from the inventory once its
//! node is NotReady.

mod support;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::*;

const LONG: Duration = Duration::from_secs(30);
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

fn label(node: &k8s_openapi::api::core::v1::Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref()?.get(key).cloned()
}

fn has_taint(node: &k8s_openapi::api::core::v1::Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

fn config(listed: &[(&str, &str)]) -> String {
    let machines: String = listed
        .iter()
        .map(|(name, extra)| format!("  {name}: {{{extra}}}\n"))
        .collect();
    let machines = if machines.is_empty() {
        " {}\n".to_owned()
    } else {
        format!("\n{machines}")
    };
    format!(
        "machines:{machines}addressPools: [{{name: n, addresses: [127.98.0.0/24], autoAssign: false}}]\n"
    )
}

#[tokio::test]
async fn nodes_are_initialized_from_the_inventory_or_adopted() {
    let _serial = SERIAL.lock().await;
    let listed = test_control_plane::unique_name("inv");
    let adopted = test_control_plane::unique_name("adopt");
    let manager = RunningManager::start(
        &config(&[(
            &listed,
            "addresses: [{type: InternalIP, address: 127.97.0.1}, {type: Hostname, address: h1}], \
             instanceType: nuc, zone: shelf-1, region: home, labels: {example.com/disk: ssd}",
        )]),
        &[],
    )
    .await;
    create_node(&listed, &[]).await;
    // A kubelet with --node-ip sets only the annotation.
    let mut node = test_control_plane::kubelet_node(&adopted);
    node.metadata.annotations = Some(
        [(
            "alpha.kubernetes.io/provided-node-ip".to_owned(),
            "127.97.0.2".to_owned(),
        )]
        .into(),
    );
    nodes()
        .await
        .create(&Default::default(), &node)
        .await
        .unwrap();

    // Initialized: the taint is gone (first write) and the addresses are in (second write).
    let initialized = |node: &k8s_openapi::api::core::v1::Node| {
        !has_taint(node, "node.cloudprovider.kubernetes.io/uninitialized")
            && node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"))
    };
    let node = eventually("the listed node initialized", LONG, || {
        let listed = listed.clone();
        async move { get_node(&listed).await.filter(initialized) }
    })
    .await;
    assert_eq!(
        node.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(format!("local://{listed}").as_str())
    );
    assert_eq!(
        label(&node, "topology.kubernetes.io/zone").as_deref(),
        Some("shelf-1")
    );
    assert_eq!(
        label(&node, "topology.kubernetes.io/region").as_deref(),
        Some("home")
    );
    assert_eq!(
        label(&node, "node.kubernetes.io/instance-type").as_deref(),
        Some("nuc")
    );
    assert_eq!(label(&node, "example.com/disk").as_deref(), Some("ssd"));
    assert_eq!(
        label(&node, "local.ccm.rs/source").as_deref(),
        Some("inventory")
    );
    let addresses: Vec<(String, String)> = node
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".into(), "127.97.0.1".into())),
        "{addresses:?}"
    );

    let node = eventually("the adopted node initialized", LONG, || {
        let adopted = adopted.clone();
        async move { get_node(&adopted).await.filter(initialized) }
    })
    .await;
    assert_eq!(
        node.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(format!("local://{adopted}").as_str())
    );
    assert_eq!(
        label(&node, "local.ccm.rs/source").as_deref(),
        Some("adopted")
    );
    assert_eq!(
        label(&node, "node.kubernetes.io/instance-type").as_deref(),
        Some("local")
    );
    let internal: Vec<String> = node
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert_eq!(internal, ["127.97.0.2"]);

    manager.stop().await;
    delete_nodes(&[&listed, &adopted]).await;
}

#[tokio::test]
async fn a_shut_down_machine_taints_its_node_and_a_removed_one_is_deleted_once_not_ready() {
    let _serial = SERIAL.lock().await;
    let stopped = test_control_plane::unique_name("stopped");
    let removed = test_control_plane::unique_name("removed");
    let manager = RunningManager::start(&config(&[(&stopped, ""), (&removed, "")]), &[]).await;
    create_node(&stopped, &["127.97.1.1"]).await;
    create_node(&removed, &["127.97.1.2"]).await;
    for name in [&stopped, &removed] {
        eventually("initialized", LONG, || {
            let name = name.clone();
            async move { get_node(&name).await?.spec?.provider_id.map(|_| ()) }
        })
        .await;
    }

    // The machine is shut down: once NotReady its node gets the shutdown taint and stays.
    manager.set_cloud(&config(&[(&stopped, "state: shutdown"), (&removed, "")]));
    set_ready(&stopped, false).await;
    eventually("the shutdown taint", LONG, || {
        let stopped = stopped.clone();
        async move {
            get_node(&stopped)
                .await
                .filter(|n| has_taint(n, SHUTDOWN_TAINT))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get_node(&stopped).await.is_some(),
        "a shut-down machine's node is not deleted"
    );
    // Running and Ready again: the taint goes.
    manager.set_cloud(&config(&[(&stopped, ""), (&removed, "")]));
    set_ready(&stopped, true).await;
    eventually("the taint removed", LONG, || {
        let stopped = stopped.clone();
        async move {
            get_node(&stopped)
                .await
                .filter(|n| !has_taint(n, SHUTDOWN_TAINT))
        }
    })
    .await;

    // The machine leaves the inventory: its node stays while Ready, and is deleted once NotReady.
    manager.set_cloud(&config(&[(&stopped, "")]));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get_node(&removed).await.is_some(),
        "a Ready node is never deleted"
    );
    set_ready(&removed, false).await;
    eventually("the removed machine's node deleted", LONG, || {
        let removed = removed.clone();
        async move { get_node(&removed).await.is_none().then_some(()) }
    })
    .await;

    manager.stop().await;
    delete_nodes(&[&stopped, &removed]).await;
}

#[tokio::test]
async fn a_removal_is_recognised_after_a_restart_but_a_never_listed_node_is_kept() {
    let _serial = SERIAL.lock().await;
    let listed = test_control_plane::unique_name("was-listed");
    let never = test_control_plane::unique_name("never-listed");
    let manager = RunningManager::start(&config(&[(&listed, "")]), &[]).await;
    create_node(&listed, &["127.97.2.1"]).await;
    create_node(&never, &["127.97.2.2"]).await;
    for name in [&listed, &never] {
        eventually("initialized", LONG, || {
            let name = name.clone();
            async move { get_node(&name).await?.spec?.provider_id.map(|_| ()) }
        })
        .await;
    }
    manager.stop().await;

    // A new manager whose inventory lists neither: the label the first put on `listed` says it was
    // listed, so it is gone; `never` was adopted and stays adopted.
    let manager = RunningManager::start(&config(&[]), &[]).await;
    set_ready(&listed, false).await;
    set_ready(&never, false).await;
    eventually("the removed machine's node deleted", LONG, || {
        let listed = listed.clone();
        async move { get_node(&listed).await.is_none().then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get_node(&never).await.is_some(),
        "an adopted node is not deleted"
    );

    // A label edit is no way in: the cloud reads only `local.ccm.rs/source=inventory`.
    let patch = json!({"metadata": {"labels": {"local.ccm.rs/source": "something-else"}}});
    nodes()
        .await
        .patch(&never, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(get_node(&never).await.is_some());

    manager.stop().await;
    delete_nodes(&[&listed, &never]).await;
}

#[tokio::test]
async fn a_malformed_edit_at_runtime_keeps_the_last_good_config_and_is_a_warning_event() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("local.yaml");
    let name = test_control_plane::unique_name("reload");
    let other = test_control_plane::unique_name("reload");
    std::fs::write(&path, config(&[(&name, "zone: before")])).unwrap();
    let manager = RunningManager::start_from_file(&path, &[]).await;
    // Once a node is initialized, the manager runs (and the cloud has its client from initialize).
    create_node(&name, &[]).await;
    let node = eventually("the node initialized", LONG, || {
        let name = name.clone();
        async move {
            get_node(&name)
                .await
                .filter(|n| label(n, "topology.kubernetes.io/zone").is_some())
        }
    })
    .await;
    assert_eq!(
        label(&node, "topology.kubernetes.io/zone").as_deref(),
        Some("before")
    );

    // A malformed edit (an overlapping pool, which also lists another machine) is refused: the event
    // names the file, and the config in force stays.
    let bad = format!(
        "machines:\n  {name}: {{zone: after}}\n  {other}: {{zone: after}}\naddressPools:\n  - {{name: n, addresses: [127.98.0.0/24]}}\n  - {{name: again, addresses: [127.98.0.7/32]}}\n"
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &bad).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let file = path.display().to_string();
    let note = eventually("a CloudConfigRejected event", LONG, || {
        let file = file.clone();
        async move {
            events_in_namespace("kube-system", "CloudConfigRejected")
                .await
                .into_iter()
                .filter_map(|e| e.note)
                .find(|n| n.contains(&file))
        }
    })
    .await;
    assert!(note.contains("overlaps"), "{note}");
    let config = manager.cloud.config();
    assert_eq!(
        config.machines[&name].zone.as_deref(),
        Some("before"),
        "the last good config stays"
    );
    assert!(!config.machines.contains_key(&other));

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

#[tokio::test]
async fn the_kubelet_probe_taints_a_machine_whose_kubelet_stops_answering() {
    let _serial = SERIAL.lock().await;
    let name = test_control_plane::unique_name("probed");
    let kubelet = std::net::TcpListener::bind("127.97.3.1:0").unwrap();
    let port = kubelet.local_addr().unwrap().port();
    let yaml = format!(
        "machines:\n  {name}: {{addresses: [{{type: InternalIP, address: 127.97.3.1}}]}}\n\
         kubeletProbe: {{enabled: true, port: {port}, timeout: 200ms, failureThreshold: 2}}\n"
    );
    let manager = RunningManager::start(&yaml, &[]).await;
    create_node(&name, &["127.97.3.1"]).await;
    eventually("initialized", LONG, || {
        let name = name.clone();
        async move { get_node(&name).await?.spec?.provider_id.map(|_| ()) }
    })
    .await;
    // NotReady, but the kubelet port answers: not shut down (several 1 s lifecycle passes).
    set_ready(&name, false).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let node = get_node(&name).await.unwrap();
    assert!(!has_taint(&node, SHUTDOWN_TAINT), "the kubelet answers");
    // The kubelet stops answering: after 2 failed probes the machine counts as shut down.
    drop(kubelet);
    eventually("the shutdown taint", LONG, || {
        let name = name.clone();
        async move {
            get_node(&name)
                .await
                .filter(|n| has_taint(n, SHUTDOWN_TAINT))
        }
    })
    .await;
    assert!(
        get_node(&name).await.is_some(),
        "a probe never deletes a node"
    );

    manager.stop().await;
    delete_nodes(&[&name]).await;
}
