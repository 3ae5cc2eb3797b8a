//! The cloud-node and cloud-node-lifecycle controllers against the real API server, with the fake cloud
//! (and, for two managers side by side, the `local` one).

mod support;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{
    RunningManager, SERIAL, create_node, delete_nodes, events_for, eventually, get_node, nodes,
    set_ready,
};
use test_control_plane::{kubelet_node, unique_name};

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const WAIT: Duration = Duration::from_secs(20);

/// Flags that make the periodic loops fast enough for a test.
const FAST: &[&str] = &[
    "--controllers=cloud-node,cloud-node-lifecycle",
    "--node-monitor-period=200ms",
    "--node-status-update-frequency=500ms",
];

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref().and_then(|s| s.provider_id.clone())
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn pair(t: &str, a: &str) -> (String, String) {
    (t.to_owned(), a.to_owned())
}

/// Waits until the node has lost the uninitialized taint and returns it.
async fn initialized(name: &str) -> Node {
    eventually(&format!("{name} to be initialized"), WAIT, || async {
        get_node(name)
            .await
            .filter(|n| !taint_keys(n).contains(&UNINITIALIZED.to_owned()))
    })
    .await
}

fn with_taint(mut node: Node, key: &str) -> Node {
    node.spec.as_mut().unwrap().taints.as_mut().unwrap().insert(
        0,
        Taint {
            key: key.into(),
            value: Some("x".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        },
    );
    node
}

fn with_node_ip(mut node: Node, ips: &str) -> Node {
    node.metadata.annotations = Some(
        [(
            "alpha.kubernetes.io/provided-node-ip".to_owned(),
            ips.to_owned(),
        )]
        .into(),
    );
    node
}

fn with_labels(mut node: Node, extra: &[(&str, &str)]) -> Node {
    let labels = node.metadata.labels.get_or_insert_with(Default::default);
    for (k, v) in extra {
        labels.insert(k.to_string(), v.to_string());
    }
    node
}

fn not_ready(mut node: Node) -> Node {
    let conditions = node.status.as_mut().unwrap().conditions.as_mut().unwrap();
    conditions[0].status = "False".into();
    node
}

#[tokio::test]
async fn instances_v2_initializes_a_kubelet_registered_node() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("v2");
    let cloud = format!(
        r#"
instances:
  {name}:
    instanceType: large
    zone: zone-b
    region: region-2
    addresses: [{{type: InternalIP, address: 10.0.0.1}}, {{type: ExternalIP, address: 198.51.100.1}}]
    additionalLabels:
      example.com/rack: r1
      example.com/pool: from-cloud
      kubernetes.io/role: sneaky
      topology.kubernetes.io/extra: sneaky
      node.k8s.io/extra: sneaky
      k8snio/kept: "yes"
"#
    );
    let manager = RunningManager::start(&cloud, FAST).await;
    let node = with_labels(
        with_taint(kubelet_node(&name), "dedicated"),
        &[("example.com/pool", "mine")],
    );
    create_node(&node).await;

    let node = initialized(&name).await;
    assert_eq!(
        provider_id(&node).as_deref(),
        Some(format!("fake://{name}").as_str())
    );
    let labels = labels(&node);
    for (key, value) in [
        ("node.kubernetes.io/instance-type", "large"),
        ("beta.kubernetes.io/instance-type", "large"),
        ("topology.kubernetes.io/zone", "zone-b"),
        ("failure-domain.beta.kubernetes.io/zone", "zone-b"),
        ("topology.kubernetes.io/region", "region-2"),
        ("failure-domain.beta.kubernetes.io/region", "region-2"),
        ("example.com/rack", "r1"),
        ("k8snio/kept", "yes"),
        ("example.com/pool", "mine"), // never overwritten
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "label {key}"
        );
    }
    for filtered in [
        "kubernetes.io/role",
        "topology.kubernetes.io/extra",
        "node.k8s.io/extra",
    ] {
        assert!(
            !labels.contains_key(filtered),
            "{filtered} must be filtered"
        );
    }
    assert_eq!(
        taint_keys(&node),
        ["dedicated"],
        "only the uninitialized taint is removed"
    );

    // Addresses follow in one status write; the kubelet's Hostname is kept because the cloud has none.
    let node = eventually("addresses", WAIT, || async {
        get_node(&name).await.filter(|n| addresses(n).len() == 3)
    })
    .await;
    assert_eq!(
        addresses(&node),
        [
            pair("InternalIP", "10.0.0.1"),
            pair("ExternalIP", "198.51.100.1"),
            pair("Hostname", &name)
        ]
    );
    eventually("the Synced event", WAIT, || async {
        let events = events_for(&name, "Synced").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let metrics = manager.metrics.encode();
    assert!(
        metrics.contains("node_controller_initial_node_sync_delay_seconds_count 1"),
        "{metrics}"
    );
    assert!(metrics.contains("node_controller_cloud_provider_taint_removal_delay_seconds_count 1"));

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

#[tokio::test]
async fn legacy_instances_and_zones_initialize_a_node() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("legacy");
    let cloud = format!(
        "instancesV2: false\ninstances:\n  {name}: {{instanceType: small, zone: zone-c, region: region-3, addresses: [{{type: InternalIP, address: 10.0.0.7}}]}}\n"
    );
    let manager = RunningManager::start(&cloud, FAST).await;
    create_node(&kubelet_node(&name)).await;

    let node = initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}")));
    let labels = labels(&node);
    assert_eq!(labels["node.kubernetes.io/instance-type"], "small");
    assert_eq!(labels["topology.kubernetes.io/zone"], "zone-c");
    assert_eq!(
        labels["failure-domain.beta.kubernetes.io/region"],
        "region-3"
    );
    let node = eventually("addresses", WAIT, || async {
        get_node(&name).await.filter(|n| addresses(n).len() == 2)
    })
    .await;
    assert_eq!(
        addresses(&node),
        [pair("InternalIP", "10.0.0.7"), pair("Hostname", &name)]
    );
    let calls = manager.cloud.snapshot();
    assert!(calls.calls_to("instance_id") >= 1 && calls.calls_to("get_zone_by_provider_id") >= 1);
    assert_eq!(
        calls.calls_to("instance_metadata"),
        0,
        "InstancesV2 is not offered"
    );

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

#[tokio::test]
async fn provided_node_ip_single_dual_stack_and_no_match() {
    let _serial = SERIAL.lock().await;
    let single = unique_name("nodeip-single");
    let dual = unique_name("nodeip-dual");
    let nomatch = unique_name("nodeip-nomatch");
    let addresses_yaml = "[{type: InternalIP, address: 10.0.0.1}, {type: InternalIP, address: 10.0.0.2}, {type: InternalIP, address: 'fd00::2'}, {type: ExternalIP, address: 198.51.100.2}]";
    let cloud = format!(
        "instances:\n  {single}: {{addresses: {addresses_yaml}}}\n  {dual}: {{addresses: {addresses_yaml}}}\n  {nomatch}: {{addresses: {addresses_yaml}}}\n"
    );
    let manager = RunningManager::start(&cloud, FAST).await;
    create_node(&with_node_ip(kubelet_node(&single), "10.0.0.2")).await;
    create_node(&with_node_ip(kubelet_node(&dual), "10.0.0.1,fd00:0:0::2")).await;
    create_node(&with_node_ip(kubelet_node(&nomatch), "10.9.9.9")).await;

    initialized(&single).await;
    let node = eventually("single-stack addresses", WAIT, || async {
        get_node(&single).await.filter(|n| addresses(n).len() == 3)
    })
    .await;
    assert_eq!(
        addresses(&node),
        [
            pair("InternalIP", "10.0.0.2"),
            pair("ExternalIP", "198.51.100.2"),
            pair("Hostname", &single)
        ]
    );
    initialized(&dual).await;
    let node = eventually("dual-stack addresses", WAIT, || async {
        get_node(&dual).await.filter(|n| addresses(n).len() == 4)
    })
    .await;
    assert_eq!(
        addresses(&node),
        [
            pair("InternalIP", "10.0.0.1"),
            pair("InternalIP", "fd00::2"),
            pair("ExternalIP", "198.51.100.2"),
            pair("Hostname", &dual)
        ]
    );

    // No cloud address matches: the node stays untouched (tainted, no provider ID) and is retried...
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = get_node(&nomatch).await.unwrap();
    assert_eq!(taint_keys(&node), [UNINITIALIZED]);
    assert_eq!(provider_id(&node), None);
    // ...until the cloud reports that address.
    manager.set_cloud(&format!(
        "instances:\n  {nomatch}: {{addresses: [{{type: InternalIP, address: 10.9.9.9}}]}}\n"
    ));
    initialized(&nomatch).await;

    manager.stop().await;
    delete_nodes(&[&single, &dual, &nomatch]).await;
}

/// A status that repeats an address is accepted on create, but the API server then refuses every
/// update of the node (422 "Duplicate value"): initialization once retried forever, silently. The
/// addresses are written first now, and the node is initialized.
#[tokio::test]
async fn a_node_whose_status_repeats_an_address_is_initialized() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("dup-addresses");
    let cloud =
        format!("instances:\n  {name}: {{addresses: [{{type: InternalIP, address: 10.0.0.7}}]}}\n");
    let manager = RunningManager::start(&cloud, FAST).await;
    let mut node = kubelet_node(&name);
    node.status.as_mut().unwrap().addresses = Some(vec![
        NodeAddress {
            type_: "InternalIP".to_owned(),
            address: "10.0.0.7".to_owned(),
        },
        NodeAddress {
            type_: "InternalIP".to_owned(),
            address: "10.0.0.7".to_owned(),
        },
        NodeAddress {
            type_: "Hostname".to_owned(),
            address: name.clone(),
        },
    ]);
    let created = create_node(&node).await;
    assert_eq!(
        addresses(&created).len(),
        3,
        "the API server keeps the repeat on create"
    );
    let node = initialized(&name).await;
    assert_eq!(
        provider_id(&node).as_deref(),
        Some(format!("fake://{name}").as_str())
    );
    let node = eventually("the addresses", WAIT, || async {
        get_node(&name).await.filter(|n| addresses(n).len() == 2)
    })
    .await;
    assert_eq!(
        addresses(&node),
        [pair("InternalIP", "10.0.0.7"), pair("Hostname", &name)]
    );
    manager.stop().await;
    delete_nodes(&[&name]).await;
}

/// A provided-node-ip that no cloud address matches (or that is no IP) keeps the node tainted: a
/// Warning event says why, on the node, even when its name is as long as a name may be (253
/// characters: the recorder's `<name>.<time>` event name would be too long). Fixed, it is initialized
/// and gets its Synced event.
#[tokio::test]
async fn a_bad_provided_node_ip_gets_a_warning_event_even_on_a_253_character_node() {
    let _serial = SERIAL.lock().await;
    let short = unique_name("badip");
    let long = format!("{short}.{}", "x".repeat(252 - short.len()));
    assert_eq!(long.len(), 253);
    let manager = RunningManager::start("", FAST).await;
    let mut long_node = with_node_ip(kubelet_node(&long), "10.9.9.9");
    // A label value has at most 63 characters: no hostname label (kubelets shorten it too).
    long_node
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove("kubernetes.io/hostname");
    create_node(&long_node).await;
    create_node(&with_node_ip(kubelet_node(&short), "not-an-ip")).await;

    let warning = eventually("the Warning event on the long-named node", WAIT, || async {
        events_for(&long, "FailedToInitializeNode").await.pop()
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains("failed to get node address from cloud provider that matches ip: 10.9.9.9"),
        "{note}"
    );
    let warning = eventually("the Warning event on the other node", WAIT, || async {
        events_for(&short, "FailedToInitializeNode").await.pop()
    })
    .await;
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains(r#"invalid alpha.kubernetes.io/provided-node-ip annotation "not-an-ip""#),
        "{note}"
    );
    let node = get_node(&long).await.unwrap();
    assert_eq!(taint_keys(&node), [UNINITIALIZED]);

    // The kubelet's --node-ip fixed: initialized, and the Synced event lands too.
    for name in [&long, &short] {
        nodes()
            .await
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": { "annotations": {
                    "alpha.kubernetes.io/provided-node-ip": null
                } } })),
            )
            .await
            .unwrap();
        initialized(name).await;
    }
    eventually("the Synced event on the long-named node", WAIT, || async {
        events_for(&long, "Synced").await.pop()
    })
    .await;
    manager.stop().await;
    delete_nodes(&[&long, &short]).await;
}

#[tokio::test]
async fn cloud_errors_leave_the_node_untouched_and_it_is_retried_without_blocking_others() {
    let _serial = SERIAL.lock().await;
    let flaky = unique_name("flaky");
    let healthy = unique_name("healthy");
    // instance_metadata always fails for now; the healthy node's instance is found, the flaky one's
    // lookup fails with InstanceNotFound (an error for initialization, never a reason to delete).
    let cloud = format!("instances:\n  {flaky}: {{state: gone}}\n");
    let manager = RunningManager::start(&cloud, FAST).await;
    let created = create_node(&kubelet_node(&flaky)).await;
    create_node(&kubelet_node(&healthy)).await;

    initialized(&healthy).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = get_node(&flaky).await.expect("never deleted: it is Ready");
    assert_eq!(
        node.metadata.resource_version, created.metadata.resource_version,
        "untouched"
    );

    // Injected failures on every call: still untouched.
    manager.set_cloud("failureRate: {all: 1}\n");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = get_node(&flaky).await.unwrap();
    assert_eq!(
        node.metadata.resource_version,
        created.metadata.resource_version
    );
    assert!(
        manager.cloud.snapshot().calls_to("instance_metadata") >= 3,
        "retried"
    );

    // The cloud recovers: the node is initialized by its own retry.
    manager.set_cloud("");
    initialized(&flaky).await;

    manager.stop().await;
    delete_nodes(&[&flaky, &healthy]).await;
}

#[tokio::test]
async fn zero_cloud_addresses_never_wipe_and_the_refresh_follows_the_cloud() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("addresses");
    let manager =
        RunningManager::start(&format!("instances:\n  {name}: {{addresses: []}}\n"), FAST).await;
    create_node(&kubelet_node(&name)).await;

    // Initialized with no cloud addresses: the kubelet's stay.
    initialized(&name).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        addresses(&get_node(&name).await.unwrap()),
        [pair("Hostname", &name)]
    );

    // The periodic refresh picks up addresses that appear...
    manager.set_cloud(&format!(
        "instances:\n  {name}: {{addresses: [{{type: InternalIP, address: 10.0.0.5}}]}}\n"
    ));
    eventually("refreshed addresses", WAIT, || async {
        get_node(&name)
            .await
            .filter(|n| addresses(n) == [pair("InternalIP", "10.0.0.5"), pair("Hostname", &name)])
    })
    .await;
    // ...and changes...
    manager.set_cloud(&format!(
        "instances:\n  {name}: {{addresses: [{{type: InternalIP, address: 10.0.0.6}}]}}\n"
    ));
    eventually("changed addresses", WAIT, || async {
        get_node(&name)
            .await
            .filter(|n| addresses(n)[0] == pair("InternalIP", "10.0.0.6"))
    })
    .await;
    // ...but an empty answer never wipes them.
    manager.set_cloud(&format!("instances:\n  {name}: {{addresses: []}}\n"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        addresses(&get_node(&name).await.unwrap()),
        [pair("InternalIP", "10.0.0.6"), pair("Hostname", &name)]
    );

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

#[tokio::test]
async fn initialized_nodes_get_ga_labels_from_beta_labels_without_cloud_calls() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("labels");
    // Every cloud call fails: the labels are reconciled all the same, from the node alone.
    let manager = RunningManager::start("failureRate: {all: 1}\n", FAST).await;
    let mut node = with_labels(
        kubelet_node(&name),
        &[
            ("failure-domain.beta.kubernetes.io/zone", "old-zone"),
            ("beta.kubernetes.io/instance-type", "old-type"),
            ("topology.kubernetes.io/zone", "other-zone"),
        ],
    );
    node.spec.as_mut().unwrap().taints = None;
    node.status.as_mut().unwrap().addresses = Some(vec![NodeAddress {
        type_: "InternalIP".into(),
        address: "10.0.0.9".into(),
    }]);
    create_node(&node).await;

    let node = eventually("GA labels", WAIT, || async {
        get_node(&name).await.filter(|n| {
            labels(n)
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str)
                == Some("old-type")
        })
    })
    .await;
    assert_eq!(
        labels(&node)["topology.kubernetes.io/zone"],
        "old-zone",
        "beta is the source of truth"
    );
    assert!(!labels(&node).contains_key("topology.kubernetes.io/region"));

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

/// The cloud's additional labels, as the periodic status update keeps them with
/// `CloudNodeAdditionalLabelsReconciliation` (1.38, alpha) on, and leaves them without it.
async fn additional_labels_run(gate: bool) {
    const PERIOD: Duration = Duration::from_secs(1);
    let name = unique_name(if gate { "labels-on" } else { "labels-off" });
    let cloud = |rack: &str| {
        format!(
            "instances:\n  {name}:\n    additionalLabels: {{example.com/rack: {rack}, kubernetes.io/sneaky: x}}\n"
        )
    };
    let mut args = vec![
        "--controllers=cloud-node",
        "--node-status-update-frequency=1s",
    ];
    if gate {
        args.push("--feature-gates=CloudNodeAdditionalLabelsReconciliation=true");
    }
    let manager = RunningManager::start(&cloud("r1"), &args).await;
    create_node(&kubelet_node(&name)).await;
    initialized(&name).await;
    let rack = || async {
        labels(&get_node(&name).await.unwrap())
            .get("example.com/rack")
            .cloned()
    };
    assert_eq!(
        rack().await.as_deref(),
        Some("r1"),
        "applied at initialization"
    );
    // Past the status pass that follows the initialization.
    tokio::time::sleep(PERIOD * 2).await;

    // Someone else changes the label.
    let relabel = json!({ "metadata": { "labels": { "example.com/rack": "mine" } } });
    nodes()
        .await
        .patch(&name, &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    let changed = std::time::Instant::now();
    if gate {
        // The next pass, at most one period away, sets the cloud's value back.
        eventually("the cloud's value re-applied", PERIOD * 3, || async {
            (rack().await.as_deref() == Some("r1")).then_some(())
        })
        .await;
        eprintln!(
            "additional labels: re-applied {:?} after the change (period {PERIOD:?})",
            changed.elapsed()
        );
        // A new value in the cloud follows too.
        manager.set_cloud(&cloud("r2"));
        eventually("the cloud's new value", PERIOD * 3, || async {
            (rack().await.as_deref() == Some("r2")).then_some(())
        })
        .await;
        // Quiet passes write nothing.
        tokio::time::sleep(PERIOD).await;
        let writes = manager.metrics.api_writes();
        let lookups = manager.cloud.snapshot().calls_to("instance_metadata");
        tokio::time::sleep(PERIOD * 3).await;
        assert_eq!(manager.metrics.api_writes(), writes, "a quiet pass wrote");
        assert!(
            manager.cloud.snapshot().calls_to("instance_metadata") > lookups,
            "the status update ran meanwhile"
        );
    } else {
        // Three periods later the other writer's value stands, and so after a new cloud value.
        tokio::time::sleep(PERIOD * 3).await;
        assert_eq!(rack().await.as_deref(), Some("mine"));
        manager.set_cloud(&cloud("r2"));
        tokio::time::sleep(PERIOD * 3).await;
        assert_eq!(rack().await.as_deref(), Some("mine"));
    }
    // Never a label in a Kubernetes-reserved namespace.
    assert!(!labels(&get_node(&name).await.unwrap()).contains_key("kubernetes.io/sneaky"));

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

#[tokio::test]
async fn additional_labels_are_reconciled_every_status_period_with_the_gate_on() {
    let _serial = SERIAL.lock().await;
    additional_labels_run(true).await;
}

#[tokio::test]
async fn additional_labels_are_applied_only_at_initialization_with_the_gate_off() {
    let _serial = SERIAL.lock().await;
    additional_labels_run(false).await;
}

#[tokio::test]
async fn a_no_op_resync_makes_zero_writes() {
    let _serial = SERIAL.lock().await;
    let names: Vec<String> = (0..5).map(|i| unique_name(&format!("quiet-{i}"))).collect();
    let manager = RunningManager::start("", FAST).await;
    for name in &names {
        create_node(&kubelet_node(name)).await;
    }
    for name in &names {
        initialized(name).await;
        eventually("addresses", WAIT, || async {
            get_node(name).await.filter(|n| addresses(n).len() == 2)
        })
        .await;
        eventually("the Synced event", WAIT, || async {
            (!events_for(name, "Synced").await.is_empty()).then_some(())
        })
        .await;
    }
    // Settle, then count: several address refreshes (500 ms) and lifecycle passes (200 ms) go by, and
    // every node gets an update event that changes nothing the controllers care about.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes_before = manager.metrics.api_writes();
    let calls_before = manager.cloud.snapshot().calls_to("instance_metadata");
    for name in &names {
        let patch = json!({ "metadata": { "annotations": { "test/touched": "yes" } } });
        nodes()
            .await
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        manager.metrics.api_writes(),
        writes_before,
        "a no-op resync wrote to the API server"
    );
    assert!(
        manager.cloud.snapshot().calls_to("instance_metadata") > calls_before,
        "the address refresh did run meanwhile"
    );

    manager.stop().await;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    delete_nodes(&refs).await;
}

#[tokio::test]
async fn vanished_instances_delete_not_ready_nodes_only() {
    let _serial = SERIAL.lock().await;
    let ready = unique_name("gone-ready");
    let not_ready_name = unique_name("gone-notready");
    let manager = RunningManager::start("", FAST).await;
    create_node(&kubelet_node(&ready)).await;
    create_node(&not_ready(kubelet_node(&not_ready_name))).await;
    initialized(&ready).await;
    initialized(&not_ready_name).await;

    // Both instances disappear from the cloud.
    manager.set_cloud(&format!(
        "instances:\n  {ready}: {{state: gone}}\n  {not_ready_name}: {{state: gone}}\n"
    ));
    eventually("the not-ready node to be deleted", WAIT, || async {
        get_node(&not_ready_name).await.is_none().then_some(())
    })
    .await;
    let events = events_for(&not_ready_name, "DeletingNode").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].note.as_deref(),
        Some(
            format!(
                "Deleting node {not_ready_name} because it does not exist in the cloud provider"
            )
            .as_str()
        )
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get_node(&ready).await.is_some(),
        "a Ready node is never deleted"
    );

    manager.stop().await;
    delete_nodes(&[&ready]).await;
}

#[tokio::test]
async fn cloud_errors_never_delete_a_node() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("error-notready");
    let manager = RunningManager::start("", FAST).await;
    create_node(&not_ready(kubelet_node(&name))).await;
    initialized(&name).await;

    // The instance is gone but the cloud errors on every existence check: nothing is deleted.
    manager.set_cloud(&format!(
        "failureRate: {{instance_exists: 1}}\ninstances:\n  {name}: {{state: gone}}\n"
    ));
    let calls_before = manager.cloud.snapshot().calls_to("instance_exists");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        manager.cloud.snapshot().calls_to("instance_exists") > calls_before + 3,
        "checked every pass"
    );
    assert!(
        get_node(&name).await.is_some(),
        "an error is never taken for 'gone'"
    );

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

#[tokio::test]
async fn shutdown_instances_are_tainted_until_the_node_is_ready_again() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("shutdown");
    let manager = RunningManager::start("", FAST).await;
    create_node(&with_taint(kubelet_node(&name), "dedicated")).await;
    initialized(&name).await;

    manager.set_cloud(&format!("instances:\n  {name}: {{state: shutdown}}\n"));
    // Ready nodes are never tainted, whatever the cloud says.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(taint_keys(&get_node(&name).await.unwrap()), ["dedicated"]);

    set_ready(&name, false).await;
    let node = eventually("the shutdown taint", WAIT, || async {
        get_node(&name)
            .await
            .filter(|n| taint_keys(n).contains(&SHUTDOWN.to_owned()))
    })
    .await;
    let taint = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .find(|t| t.key == SHUTDOWN)
        .unwrap();
    assert_eq!((taint.effect.as_str(), taint.value), ("NoSchedule", None));
    assert_eq!(
        taint_keys(&get_node(&name).await.unwrap()),
        ["dedicated", SHUTDOWN],
        "other taints kept"
    );

    // The instance runs again and the kubelet reports Ready: the taint goes.
    manager.set_cloud("");
    set_ready(&name, true).await;
    eventually("the shutdown taint to go", WAIT, || async {
        get_node(&name)
            .await
            .filter(|n| taint_keys(n) == ["dedicated"])
    })
    .await;

    manager.stop().await;
    delete_nodes(&[&name]).await;
}

/// Initialization is a PUT of the node's metadata and spec, and the shared cache decodes Nodes without
/// their images and managed fields: every field the PUT does not carry must survive it (the status, the
/// images, other managers' managed fields), and nothing but the initialization changes.
#[tokio::test]
async fn initialization_keeps_the_fields_the_cache_does_not_carry() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("kept");
    let cloud = format!(
        "instances:\n  {name}:\n    zone: zone-a\n    addresses: [{{type: InternalIP, address: 10.0.0.9}}]\n"
    );
    let mut node = kubelet_node(&name);
    node.spec.as_mut().unwrap().unschedulable = Some(true);
    node.spec.as_mut().unwrap().pod_cidr = Some("10.244.9.0/24".into());
    create_node(&node).await;
    let api = nodes().await;
    // What a kubelet and another controller write: the image list and system info in the status, and
    // an annotation and a label under a manager of their own (managed fields the cache never decodes).
    let status = json!({ "status": {
        "images": [
            { "names": ["registry.example/app@sha256:0123", "registry.example/app:v1"], "sizeBytes": 123456789 },
            { "names": ["registry.example/sidecar:v2"], "sizeBytes": 4567 },
        ],
        "nodeInfo": {
            "machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
            "osImage": "Debian", "containerRuntimeVersion": "containerd://2.0", "kubeletVersion": "v1.37.1",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
        "capacity": { "cpu": "4", "memory": "16Gi", "pods": "110" },
    }});
    api.patch_status(
        &name,
        &PatchParams::apply("kubelet-like").force(),
        &Patch::Apply(&json!({
            "apiVersion": "v1", "kind": "Node", "metadata": { "name": name },
            "status": status["status"],
        })),
    )
    .await
    .expect("status apply");
    api.patch(
        &name,
        &PatchParams::apply("another-controller"),
        &Patch::Apply(&json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name, "annotations": { "example.com/owner": "team-a" }, "labels": { "example.com/tier": "gold" } },
        })),
    )
    .await
    .expect("metadata apply");
    let before: serde_json::Value =
        serde_json::to_value(api.get(&name).await.expect("node before")).unwrap();

    let manager = RunningManager::start(&cloud, &["--controllers=cloud-node"]).await;
    initialized(&name).await;
    manager.stop().await;
    let after: serde_json::Value =
        serde_json::to_value(api.get(&name).await.expect("node after")).unwrap();

    for path in [
        "/status/images",
        "/status/nodeInfo",
        "/status/conditions",
        "/status/capacity",
        "/metadata/annotations",
        "/metadata/uid",
        "/metadata/creationTimestamp",
        "/spec/unschedulable",
        "/spec/podCIDR",
    ] {
        assert!(before.pointer(path).is_some(), "{path} set before");
        assert_eq!(before.pointer(path), after.pointer(path), "{path} kept");
    }
    let before_labels = before["metadata"]["labels"].as_object().unwrap();
    let after_labels = after["metadata"]["labels"].as_object().unwrap();
    for (key, value) in before_labels {
        assert_eq!(after_labels.get(key), Some(value), "label {key} kept");
    }
    assert_eq!(after_labels["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(after["spec"]["providerID"], format!("fake://{name}"));
    // The other managers' entries are kept as they were (the creator's shrinks by the removed taint);
    // ours is added.
    let after_entries = after["metadata"]["managedFields"].as_array().unwrap();
    for manager in ["kubelet-like", "another-controller"] {
        let entry = |node: &serde_json::Value| {
            node["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["manager"] == manager)
                .map(|e| (e["operation"].clone(), e["fieldsV1"].clone()))
        };
        assert!(entry(&before).is_some(), "{manager} before");
        assert_eq!(
            entry(&before),
            entry(&after),
            "managed fields of {manager} kept"
        );
    }
    assert!(
        after_entries.iter().any(|e| e["operation"] == "Update"
            && e.get("subresource").is_none()
            && !e["fieldsV1"]["f:spec"]["f:providerID"].is_null()),
        "the initialization is an Update of the node: {after_entries:#?}"
    );
    delete_nodes(&[&name]).await;
}

/// Issue #28, node ownership: two managers on one cluster, one per cloud, split by `--node-selector`:
/// each initializes its own node from its own cloud, and when both nodes are NotReady and one cloud's
/// instance is gone, only that cloud's manager deletes its node; the other's node stays untouched,
/// though the first cloud has no instance for it either (upstream's lifecycle controller deletes it).
#[tokio::test]
async fn two_managers_split_the_nodes_by_node_selector() {
    let _serial = SERIAL.lock().await;
    let a = unique_name("own-a");
    let b = unique_name("own-b");
    // Each cloud has its own machine, and not the other's (the fake takes an unlisted one for there).
    let cloud_of = |name: &str, zone: &str, other: &str| {
        format!(
            "instances:\n  {name}:\n    instanceType: small\n    zone: {zone}\n    region: r\n    addresses: [{{type: InternalIP, address: 10.0.0.9}}]\n  {other}: {{state: gone}}\n"
        )
    };
    let first = RunningManager::start(
        &cloud_of(&a, "zone-a", &b),
        &[FAST, &["--node-selector=cloud=a"]].concat(),
    )
    .await;
    let second = RunningManager::start(
        &cloud_of(&b, "zone-b", &a),
        &[FAST, &["--node-selector=cloud in (b)"]].concat(),
    )
    .await;
    create_node(&with_labels(kubelet_node(&a), &[("cloud", "a")])).await;
    create_node(&with_labels(kubelet_node(&b), &[("cloud", "b")])).await;

    let node_a = initialized(&a).await;
    let node_b = initialized(&b).await;
    assert_eq!(labels(&node_a)["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(labels(&node_b)["topology.kubernetes.io/zone"], "zone-b");
    assert_eq!(provider_id(&node_a), Some(format!("fake://{a}")));
    assert_eq!(provider_id(&node_b), Some(format!("fake://{b}")));
    // Both NotReady; the first cloud's instance goes: its node is deleted, the other's stays.
    set_ready(&a, false).await;
    set_ready(&b, false).await;
    first.set_cloud(&format!(
        "instances:\n  {a}: {{state: gone}}\n  {b}: {{state: gone}}\n"
    ));
    eventually("the first cloud's node deleted", WAIT, || async {
        get_node(&a).await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = get_node(&b).await.expect("the second cloud's node is kept");
    assert!(
        !taint_keys(&kept).contains(&SHUTDOWN.to_owned()),
        "and not tainted"
    );
    first.stop().await;
    second.stop().await;
    delete_nodes(&[&a, &b]).await;
}

/// Issue #28, two clouds on one cluster as an operator runs them: a `fake` manager with
/// `--node-selector=cloud=fake` serving classless Services, and a `local` one with
/// `--node-selector=cloud=local` serving `--load-balancer-class=ccm.rs/local`; two processes, each with
/// its own Lease (granted by a Role of its own, as docs/deploy.md says) and reaching the API server from
/// its own address. Each initializes only its node (`local` adopts any node it is shown), provisions
/// only its Service, deletes only its node once its machine is gone, and the API server's audit log
/// shows that neither wrote the other's nodes, Services or Lease.
#[tokio::test]
async fn a_fake_and_a_local_manager_split_the_cluster_as_two_processes() {
    use std::net::{IpAddr, Ipv4Addr};

    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::Api;
    use support::{
        audit::names_written,
        blackhole_proxy::{BlackholeProxy, api_server, kubeconfig_through},
        create_namespace, load_balancer_service,
        replica::{Replica, delete_lease},
        services, status_ip,
    };
    use test_control_plane::control_plane;

    let _serial = SERIAL.lock().await;
    test_control_plane::apply_shipped_rbac().await;
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::SystemTime::now();
    let fake_node = unique_name("cloud-fake");
    let local_node = unique_name("cloud-local");
    let fake_lease = unique_name("ccm-fake");
    let local_lease = unique_name("ccm-local");
    let namespace = unique_name("two-clouds");
    create_namespace(&namespace).await;

    // The shipped Role grants the Lease `cloud-controller-manager` only: each second Lease needs its own.
    let grant = unique_name("ccm-two-clouds");
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": grant, "namespace": "kube-system" },
        "rules": [{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "resourceNames": [fake_lease, local_lease], "verbs": ["get", "update"] }],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": grant, "namespace": "kube-system" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": grant },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": "system:cloud-controller-manager" }],
    }))
    .unwrap();
    let roles: Api<Role> = Api::namespaced(support::admin().await, "kube-system");
    let bindings: Api<RoleBinding> = Api::namespaced(support::admin().await, "kube-system");
    roles.create(&Default::default(), &role).await.unwrap();
    bindings
        .create(&Default::default(), &binding)
        .await
        .unwrap();

    // Each manager through a proxy of its own, so the audit log tells their requests apart.
    let fake_source = "127.0.0.5";
    let local_source = "127.0.0.6";
    let through = |source: &str| {
        let source: Ipv4Addr = source.parse().unwrap();
        let kubeconfig = dir.path().join(format!("through-{source}.kubeconfig"));
        async move {
            let proxy = BlackholeProxy::start(api_server(), IpAddr::V4(source)).await;
            kubeconfig_through(
                &control_plane().ccm_kubeconfig(),
                proxy.address(),
                &kubeconfig,
            );
            (proxy, kubeconfig)
        }
    };
    let (_fake_proxy, fake_kubeconfig) = through(fake_source).await;
    let (_local_proxy, local_kubeconfig) = through(local_source).await;

    // The nodes' addresses are loopback ones: local health-checks its backends (every node, as it
    // reaches nodes beyond its own), and tests send traffic only to this machine.
    let fake_config = dir.path().join("fake.yaml");
    let fake_cloud = |state: &str| {
        format!(
            "instances:\n  {fake_node}:\n    instanceType: small\n    zone: zone-fake\n    region: r\n    addresses: [{{type: InternalIP, address: 127.243.1.9}}]\n    state: {state}\n"
        )
    };
    std::fs::write(&fake_config, fake_cloud("running")).unwrap();
    let local_config = dir.path().join("local.yaml");
    let pool = "addressPools: [{name: two-clouds, addresses: [127.243.0.0/24]}]\n";
    std::fs::write(
        &local_config,
        format!(
            "machines:\n  {local_node}:\n    zone: zone-local\n    addresses: [{{type: InternalIP, address: 127.243.1.10}}]\n{pool}"
        ),
    )
    .unwrap();
    let common = [
        "--controllers=cloud-node,cloud-node-lifecycle,service",
        "--node-monitor-period=200ms",
        "--node-status-update-frequency=500ms",
    ];
    let fake_lease_flag = format!("--leader-elect-resource-name={fake_lease}");
    let local_lease_flag = format!("--leader-elect-resource-name={local_lease}");
    let fake = Replica::start_provider(
        "fake",
        &fake_config,
        &fake_kubeconfig,
        &[
            &common[..],
            &["--node-selector=cloud=fake", &fake_lease_flag],
        ]
        .concat(),
    );
    let local = Replica::start_provider(
        "local",
        &local_config,
        &local_kubeconfig,
        &[
            &common[..],
            &[
                "--node-selector=cloud=local",
                "--load-balancer-class=ccm.rs/local",
                &local_lease_flag,
            ],
        ]
        .concat(),
    );

    create_node(&with_labels(kubelet_node(&fake_node), &[("cloud", "fake")])).await;
    create_node(&with_labels(
        kubelet_node(&local_node),
        &[("cloud", "local")],
    ))
    .await;
    let initialized_by = |name: String| async move {
        let node = eventually(&format!("{name} to be initialized"), WAIT, || async {
            get_node(&name)
                .await
                .filter(|n| !taint_keys(n).contains(&UNINITIALIZED.to_owned()))
        })
        .await;
        provider_id(&node)
    };
    let (fake_log, local_log) = (fake.log.clone(), local.log.clone());
    let logs = move || {
        format!(
            "fake's log:\n{}\nlocal's log:\n{}",
            fake_log.lock().unwrap(),
            local_log.lock().unwrap()
        )
    };
    assert_eq!(
        initialized_by(fake_node.clone()).await,
        Some(format!("fake://{fake_node}")),
        "{}",
        logs()
    );
    assert_eq!(
        initialized_by(local_node.clone()).await,
        Some(format!("local://{local_node}")),
        "{}",
        logs()
    );

    // A classless Service and one of local's class: each provisioned by its own manager.
    let mut classed = load_balancer_service("classed", &[18080]);
    classed.spec.as_mut().unwrap().load_balancer_class = Some("ccm.rs/local".into());
    let api = services(&namespace).await;
    api.create(&Default::default(), &classed).await.unwrap();
    api.create(
        &Default::default(),
        &load_balancer_service("plain", &[18081]),
    )
    .await
    .unwrap();
    let provisioned = |name: &'static str| {
        let api = api.clone();
        async move {
            let service = eventually(&format!("{name} provisioned"), WAIT, || async {
                api.get(name).await.ok().filter(|s| status_ip(s).is_some())
            })
            .await;
            status_ip(&service).unwrap()
        }
    };
    let classed_ip = provisioned("classed").await;
    let plain_ip = provisioned("plain").await;
    assert!(
        classed_ip.starts_with("127.243.0."),
        "local's pool gave {classed_ip}"
    );
    assert!(!plain_ip.starts_with("127.243.0."), "fake gave {plain_ip}");

    // Both nodes NotReady; the fake machine goes: only its node is deleted (by the fake manager).
    set_ready(&fake_node, false).await;
    set_ready(&local_node, false).await;
    std::fs::write(&fake_config, fake_cloud("gone")).unwrap();
    eventually("the fake cloud's node deleted", WAIT, || async {
        get_node(&fake_node).await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = get_node(&local_node).await.expect("local's node is kept");
    assert!(!taint_keys(&kept).contains(&SHUTDOWN.to_owned()));
    // Then local's machine leaves its inventory: local deletes its node.
    std::fs::write(&local_config, pool).unwrap();
    eventually("the local cloud's node deleted", WAIT, || async {
        get_node(&local_node).await.is_none().then_some(())
    })
    .await;

    // Each Service's deletion is its own manager's (the finalizer goes with its load balancer).
    for name in ["classed", "plain"] {
        api.delete(name, &Default::default()).await.unwrap();
    }
    eventually("both Services deleted", WAIT, || async {
        api.list(&Default::default())
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(|_| ())
    })
    .await;
    drop(fake);
    drop(local);
    tokio::time::sleep(Duration::from_secs(1)).await; // the audit log is written as requests finish

    let written = |source: &str, resource: &str| names_written(source, started, resource);
    assert_eq!(written(fake_source, "nodes"), [fake_node.as_str()]);
    assert_eq!(written(local_source, "nodes"), [local_node.as_str()]);
    assert_eq!(written(fake_source, "services"), ["plain"]);
    assert_eq!(written(local_source, "services"), ["classed"]);
    assert_eq!(written(fake_source, "leases"), [fake_lease.as_str()]);
    assert_eq!(written(local_source, "leases"), [local_lease.as_str()]);

    delete_lease(&fake_lease).await;
    delete_lease(&local_lease).await;
    let _ = bindings.delete(&grant, &Default::default()).await;
    let _ = roles.delete(&grant, &Default::default()).await;
}
