//! The service-lb controller against the real API server, with the fake cloud's state file as the
//! cloud's view.

mod support;

use std::{path::PathBuf, time::Duration};

use cloud_provider_fake::{CloudState, LoadBalancerRecord, PortRecord};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::{
    RunningManager, SERIAL, create_namespace, create_node, delete_nodes, events_in, eventually,
    load_balancer_service, nodes, services,
};
use test_control_plane::{kubelet_node, unique_name};

const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
const WAIT: Duration = Duration::from_secs(30);

/// A manager running only the service controller, on a fake cloud that writes its state file.
struct Harness {
    manager: RunningManager,
    state_file: PathBuf,
    _dir: tempfile::TempDir,
    namespace: String,
    /// The test's nodes (other tests' leftovers in a reused control plane are ignored by the checks).
    prefix: String,
}

impl Harness {
    async fn start(extra_cloud_config: &str) -> Self {
        let namespace = unique_name("svc");
        create_namespace(&namespace).await;
        Self::start_in(namespace, extra_cloud_config).await
    }

    /// In a namespace that may exist already (the fake's failures are drawn per `namespace/name`, so a
    /// fixed namespace makes them the same on every run).
    async fn start_in(namespace: String, extra_cloud_config: &str) -> Self {
        Self::start_with(namespace, extra_cloud_config, &[]).await
    }

    /// With flags added to `--controllers=service`.
    async fn start_with(namespace: String, extra_cloud_config: &str, flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state_file = dir.path().join("state.json");
        let mut args = vec!["--controllers=service"];
        args.extend_from_slice(flags);
        let manager = RunningManager::start(
            &format!("stateFile: {}\n{extra_cloud_config}", state_file.display()),
            &args,
        )
        .await;
        Self {
            manager,
            state_file,
            _dir: dir,
            prefix: format!("{namespace}-node"),
            namespace,
        }
    }

    fn state(&self) -> CloudState {
        CloudState::read(&self.state_file).unwrap_or_default()
    }

    fn load_balancer(&self, service: &str) -> Option<LoadBalancerRecord> {
        let key = format!("{}/{service}", self.namespace);
        let state = self.state();
        let matching: Vec<_> = state
            .load_balancers
            .iter()
            .filter(|lb| lb.service == key)
            .collect();
        assert!(
            matching.len() <= 1,
            "more than one load balancer for {key}: {matching:?}"
        );
        matching.first().map(|lb| (*lb).clone())
    }

    /// The backends of a load balancer among this test's nodes.
    fn backends(&self, service: &str) -> Vec<String> {
        self.load_balancer(service)
            .map(|lb| {
                lb.nodes
                    .iter()
                    .filter(|n| n.starts_with(&self.prefix))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The calls of `method` so far, once a second passed without one.
    async fn calls_once_quiet(&self, method: &str) -> u64 {
        eventually(&format!("no {method} for a second"), WAIT, || async {
            let before = self.calls(method);
            tokio::time::sleep(Duration::from_secs(1)).await;
            (self.calls(method) == before).then_some(before)
        })
        .await
    }

    fn node_name(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }

    async fn api(&self) -> Api<Service> {
        services(&self.namespace).await
    }

    async fn create(&self, name: &str, ports: &[i32]) -> Service {
        self.api()
            .await
            .create(&PostParams::default(), &load_balancer_service(name, ports))
            .await
            .expect("service created")
    }

    async fn get(&self, name: &str) -> Option<Service> {
        self.api().await.get_opt(name).await.unwrap()
    }

    async fn patch(&self, name: &str, patch: serde_json::Value) {
        self.api()
            .await
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("service patched");
    }

    async fn delete(&self, name: &str) {
        self.api()
            .await
            .delete(name, &DeleteParams::default())
            .await
            .expect("service deleted");
    }

    /// Deletes the Service and waits until it and its load balancer are gone (so that the next tests'
    /// managers, which see every namespace, do not sync it).
    async fn delete_and_wait(&self, name: &str) {
        self.delete(name).await;
        eventually(&format!("{name} gone"), WAIT, || async {
            (self.get(name).await.is_none() && self.load_balancer(name).is_none()).then_some(())
        })
        .await;
    }

    fn calls(&self, method: &str) -> u64 {
        self.manager.cloud.snapshot().calls_to(method)
    }

    /// Waits until the Service shows ingress, its finalizer is on, and the cloud has its load balancer.
    async fn provisioned(&self, name: &str) -> (Service, LoadBalancerRecord) {
        eventually(&format!("{name} to be provisioned"), WAIT, || async {
            let service = self.get(name).await?;
            let ingress = service
                .status
                .as_ref()?
                .load_balancer
                .as_ref()?
                .ingress
                .as_ref()?;
            let has_finalizer = service
                .metadata
                .finalizers
                .as_ref()?
                .iter()
                .any(|f| f == FINALIZER);
            let lb = self.load_balancer(name)?;
            (has_finalizer
                && ingress.first()?.ip.as_deref() == lb.ingress.first().map(String::as_str))
            .then_some((service, lb))
        })
        .await
    }

    async fn stop(self, node_count: usize) {
        let names: Vec<String> = (0..node_count).map(|i| self.node_name(i)).collect();
        self.manager.stop().await;
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        delete_nodes(&refs).await;
    }
}

fn ports(lb: &LoadBalancerRecord) -> Vec<(String, i32)> {
    lb.ports
        .iter()
        .map(|p| (p.protocol.clone(), p.port))
        .collect()
}

#[tokio::test]
async fn a_load_balancer_service_gets_a_finalizer_a_load_balancer_and_an_ingress_ip() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start("").await;
    for i in 0..2 {
        create_node(&kubelet_node(&h.node_name(i))).await;
    }
    h.create("web", &[80, 443]).await;

    let (service, lb) = h.provisioned("web").await;
    let ip = service
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap()[0]
        .ip
        .clone()
        .unwrap();
    assert!(ip.starts_with("203.0.113."), "{ip}");
    let node_ports: Vec<i32> = service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.node_port.unwrap())
        .collect();
    assert_eq!(
        lb.ports,
        vec![
            PortRecord {
                protocol: "TCP".into(),
                port: 80,
                node_port: node_ports[0]
            },
            PortRecord {
                protocol: "TCP".into(),
                port: 443,
                node_port: node_ports[1]
            },
        ]
    );
    assert_eq!(h.backends("web"), [h.node_name(0), h.node_name(1)]);
    // The gauge follows the sync's end, a moment after its status write (which the test saw).
    let metrics = eventually("the load balancers' gauge at 1", WAIT, || async {
        let metrics = h.manager.metrics.encode();
        metrics
            .contains("service_controller_load_balancers 1")
            .then_some(metrics)
    })
    .await;
    assert!(
        metrics.contains("service_controller_loadbalancer_sync_total 1"),
        "{metrics}"
    );
    // client-go's work-queue series, labelled with the controller's name.
    for series in [
        r#"workqueue_adds_total{name="service-lb-controller"}"#,
        r#"workqueue_depth{name="service-lb-controller"} 0"#,
        r#"workqueue_work_duration_seconds_count{name="service-lb-controller"}"#,
        r#"workqueue_queue_duration_seconds_bucket{le="10.0",name="service-lb-controller"}"#,
        r#"workqueue_retries_total{name="service-lb-controller"}"#,
        r#"workqueue_unfinished_work_seconds{name="service-lb-controller"}"#,
        r#"workqueue_longest_running_processor_seconds{name="service-lb-controller"}"#,
    ] {
        assert!(metrics.contains(series), "missing {series} in:\n{metrics}");
    }

    // Changing ports updates the load balancer; an annotation change re-syncs it too.
    h.patch("web", json!({ "spec": { "ports": [{ "name": "p8080", "port": 8080, "targetPort": 8080, "protocol": "TCP" }] } }))
        .await;
    eventually("the new port", WAIT, || async {
        h.load_balancer("web")
            .filter(|lb| ports(lb) == [("TCP".to_owned(), 8080)])
    })
    .await;
    let ensures = h.calls("ensure_load_balancer");
    h.patch(
        "web",
        json!({ "metadata": { "annotations": { "example.com/lb-tier": "gold" } } }),
    )
    .await;
    eventually("an ensure for the annotation", WAIT, || async {
        (h.calls("ensure_load_balancer") > ensures).then_some(())
    })
    .await;
    // A label change does not concern the load balancer: no cloud call.
    let ensures = h.calls("ensure_load_balancer");
    h.patch("web", json!({ "metadata": { "labels": { "team": "a" } } }))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.calls("ensure_load_balancer"), ensures);
    // The same IP throughout.
    assert_eq!(h.load_balancer("web").unwrap().ingress, [ip]);

    // Deleting: the load balancer goes, then the Service.
    h.delete("web").await;
    eventually("the service to be gone", WAIT, || async {
        h.get("web").await.is_none().then_some(())
    })
    .await;
    assert!(h.load_balancer("web").is_none(), "load balancer leaked");
    h.stop(2).await;
}

#[tokio::test]
async fn node_changes_reach_only_the_load_balancers_whose_backends_change() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start("").await;
    for i in 0..2 {
        create_node(&kubelet_node(&h.node_name(i))).await;
    }
    h.create("a", &[80]).await;
    h.create("b", &[80]).await;
    h.provisioned("a").await;
    h.provisioned("b").await;
    // Both nodes behind both load balancers, and the node sync quiet: a node the cache saw only during
    // an ensure is given by a node sync pass right after it (a CI run counted that pass as the
    // heartbeats' doing).
    eventually("both nodes behind both load balancers", WAIT, || async {
        (h.backends("a").len() == 2 && h.backends("b").len() == 2).then_some(())
    })
    .await;
    let updates = h.calls_once_quiet("update_load_balancer").await;

    // Heartbeat-like node changes (status, other labels, conditions, taints) make no cloud call.
    let api = nodes().await;
    for i in 0..2 {
        let name = h.node_name(i);
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "labels": { "heartbeat": "1" } } })),
        )
        .await
        .unwrap();
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": { "conditions": [{ "type": "Ready", "status": "False", "reason": "KubeletNotReady" }] } })),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        h.calls("update_load_balancer"),
        updates,
        "irrelevant node updates called the cloud"
    );
    assert_eq!(
        h.backends("a"),
        [h.node_name(0), h.node_name(1)],
        "readiness does not matter"
    );

    // A node added: both load balancers get it, one update each.
    create_node(&kubelet_node(&h.node_name(2))).await;
    eventually("the new backend", WAIT, || async {
        (h.backends("a").len() == 3 && h.backends("b").len() == 3).then_some(())
    })
    .await;
    assert_eq!(h.calls("update_load_balancer"), updates + 2);

    // Excluded by label (any value but a boolean false), then included again by "false".
    let exclude = |value: &str| json!({ "metadata": { "labels": { "node.kubernetes.io/exclude-from-external-load-balancers": value } } });
    api.patch(
        &h.node_name(0),
        &PatchParams::default(),
        &Patch::Merge(&exclude("")),
    )
    .await
    .unwrap();
    eventually("the excluded node to leave", WAIT, || async {
        (h.backends("a") == [h.node_name(1), h.node_name(2)]).then_some(())
    })
    .await;
    api.patch(
        &h.node_name(0),
        &PatchParams::default(),
        &Patch::Merge(&exclude("false")),
    )
    .await
    .unwrap();
    eventually("the node to come back", WAIT, || async {
        (h.backends("b").len() == 3).then_some(())
    })
    .await;

    // A node removed.
    delete_nodes(&[&h.node_name(2)]).await;
    eventually("the removed node to leave", WAIT, || async {
        (h.backends("a").len() == 2 && h.backends("b").len() == 2).then_some(())
    })
    .await;

    h.delete("a").await;
    h.delete("b").await;
    eventually("no load balancers", WAIT, || async {
        (h.load_balancer("a").is_none() && h.load_balancer("b").is_none()).then_some(())
    })
    .await;
    h.stop(3).await;
}

/// A burst of node changes (10 nodes created and 10 deleted, all at once): each load balancer gets the
/// new backend set in exactly one `update_load_balancer`. (The benchmark deletes once its creations are
/// done; this debug-built client on a busy machine took up to 92 ms to turn around in between, which
/// outlasts the 50 ms pause that ends a burst and would make two bursts.)
#[tokio::test]
async fn a_burst_of_node_changes_updates_each_load_balancer_once() {
    let _serial = SERIAL.lock().await;
    // Cloud calls take 20 ms, as in the benchmark: a pass that started before the burst ended would
    // still be giving load balancers the backends of its middle.
    let h = Harness::start("latency: 20ms\n").await;
    let first: Vec<String> = (0..10).map(|i| h.node_name(i)).collect();
    let added: Vec<String> = (10..20).map(|i| h.node_name(i)).collect();
    for name in &first {
        create_node(&kubelet_node(name)).await;
    }
    let services: Vec<String> = (0..20).map(|i| format!("burst-{i}")).collect();
    for name in &services {
        h.create(name, &[80]).await;
    }
    for name in &services {
        h.provisioned(name).await;
        eventually(&format!("{name} with the first nodes"), WAIT, || async {
            (h.backends(name).len() == first.len()).then_some(())
        })
        .await;
    }
    let updates = |h: &Harness| -> Vec<u64> {
        let state = h.manager.cloud.snapshot();
        services
            .iter()
            .map(|name| {
                state.calls_about("update_load_balancer", &format!("{}/{name}", h.namespace))
            })
            .collect()
    };
    let before = updates(&h);

    let api = nodes().await;
    let creations = added.iter().map(|name| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &kubelet_node(name))
                .await
                .expect("node created");
        }
        .boxed()
    });
    let deletions = first.iter().map(|name| {
        let api = api.clone();
        async move {
            api.delete(name, &DeleteParams::default())
                .await
                .expect("node deleted");
        }
        .boxed()
    });
    futures::stream::iter(creations.chain(deletions))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    let mut wanted = added.clone();
    wanted.sort();
    for name in &services {
        eventually(&format!("{name} with the new nodes"), WAIT, || async {
            let mut backends = h.backends(name);
            backends.sort();
            (backends == wanted).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // a second update would come now
    let once: Vec<u64> = before.iter().map(|n| n + 1).collect();
    assert_eq!(updates(&h), once, "update_load_balancer calls per Service");
    for name in &services {
        h.delete(name).await;
    }
    for name in &services {
        eventually(&format!("{name} gone"), WAIT, || async {
            h.get(name).await.is_none().then_some(())
        })
        .await;
    }
    h.stop(20).await;
}

/// A node added while a pass is in the cloud reaches the load balancer that pass has not updated yet (in
/// the same pass if the change comes 500 ms or more after the pass's first change; otherwise the pass
/// pauses after the update in the cloud and the next one updates both), and only the load balancer
/// given the older backends is updated twice.
#[tokio::test]
async fn a_node_change_during_a_pass_reaches_the_load_balancers_it_has_not_updated_yet() {
    let _serial = SERIAL.lock().await;
    // One update at a time, 2 s each: the second node comes while the first update is in the cloud.
    let namespace = unique_name("svc");
    create_namespace(&namespace).await;
    let h = Harness::start_with(
        namespace,
        "latency: 2s\n",
        &["--concurrent-service-syncs=1"],
    )
    .await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    h.create("a", &[80]).await;
    h.create("b", &[80]).await;
    h.provisioned("a").await;
    h.provisioned("b").await;
    let updates = |h: &Harness| -> [u64; 2] {
        let state = h.manager.cloud.snapshot();
        ["a", "b"].map(|name| {
            state.calls_about("update_load_balancer", &format!("{}/{name}", h.namespace))
        })
    };
    let before = updates(&h);

    create_node(&kubelet_node(&h.node_name(1))).await;
    // The fake counts a call when it starts.
    eventually("the pass to start", WAIT, || async {
        (updates(&h) != before).then_some(())
    })
    .await;
    create_node(&kubelet_node(&h.node_name(2))).await;
    let all = [h.node_name(0), h.node_name(1), h.node_name(2)];
    eventually("both load balancers with every node", WAIT, || async {
        (h.backends("a") == all && h.backends("b") == all).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // another update would have started by now
    let after = updates(&h);
    let mut made = [after[0] - before[0], after[1] - before[1]];
    made.sort();
    assert_eq!(
        made,
        [1, 2],
        "update_load_balancer calls of the Service updated second and first"
    );
    h.delete("a").await;
    h.delete("b").await;
    eventually("both Services gone", WAIT, || async {
        (h.get("a").await.is_none() && h.get("b").await.is_none()).then_some(())
    })
    .await;
    h.stop(3).await;
}

/// A node that stops being a backend while the first ensure is still in the cloud: the node sync in
/// that window passes over the Service (it is being synced), and the ensure gave the cloud the old
/// backends. The load balancer must still end up without the node (it once kept it for good).
#[tokio::test]
async fn a_node_change_during_an_ensure_reaches_that_load_balancer() {
    let _serial = SERIAL.lock().await;
    // Every cloud call takes 3 s, so the taint lands while ensure_load_balancer is running.
    let h = Harness::start("latency: 3s\n").await;
    for i in 0..2 {
        create_node(&kubelet_node(&h.node_name(i))).await;
    }
    h.create("slow", &[80]).await;
    // The finalizer is written just before the cloud call starts.
    eventually("the finalizer", WAIT, || async {
        let service = h.get("slow").await?;
        service
            .metadata
            .finalizers?
            .iter()
            .any(|f| f == FINALIZER)
            .then_some(())
    })
    .await;
    let ingress = h
        .get("slow")
        .await
        .and_then(|s| s.status?.load_balancer?.ingress)
        .unwrap_or_default();
    assert!(ingress.is_empty(), "the ensure is still in the cloud");
    let leaving = h.node_name(1);
    nodes()
        .await
        .patch(
            &leaving,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "taints": [
                { "key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule" }
            ] } })),
        )
        .await
        .unwrap();
    h.provisioned("slow").await;
    eventually(
        "the tainted node to leave the load balancer",
        WAIT,
        || async { (h.backends("slow") == vec![h.node_name(0)]).then_some(()) },
    )
    .await;
    h.delete("slow").await;
    eventually("the load balancer deleted", WAIT, || async {
        h.load_balancer("slow").is_none().then_some(())
    })
    .await;
    h.stop(2).await;
}

/// Removing the finalizer lets the API server delete the Service, and its Deleted event could reach the
/// deletion handler while the sync still tracked it: the load balancer was deleted twice (two
/// `DeletedLoadBalancer` events, and a `DeleteLoadBalancerFailed` for a gone Service if the second call
/// failed). Each is deleted once now.
#[tokio::test]
async fn a_deleted_service_s_load_balancer_is_deleted_once() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start("").await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    let names: Vec<String> = (0..20).map(|i| format!("once-{i}")).collect();
    for name in &names {
        h.create(name, &[80]).await;
    }
    for name in &names {
        h.provisioned(name).await;
    }
    for name in &names {
        h.delete(name).await;
    }
    for name in &names {
        eventually(&format!("{name} gone"), WAIT, || async {
            (h.get(name).await.is_none() && h.load_balancer(name).is_none()).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // a second deletion would come now
    let state = h.manager.cloud.snapshot();
    for name in &names {
        let object = format!("{}/{name}", h.namespace);
        assert_eq!(
            state.calls_about("ensure_load_balancer_deleted", &object),
            1,
            "{object}"
        );
        // Repeats of an event are one Event object with a series count.
        let recorded: i32 = events_in(&h.namespace, name, "DeletedLoadBalancer")
            .await
            .iter()
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum();
        assert_eq!(recorded, 1, "{object}");
    }
    h.stop(1).await;
}

/// Issue #52 item 2: a provider that panics (a bug; the fake's `panicFirstCalls`) neither stops the
/// manager nor loses the work. The ensure that panicked is retried on the back-off and provisions the
/// load balancer; the deletion that panicked (a Service deleted with our finalizer taken off by hand
/// at the same moment, so the sync or the handler of vanished Services deletes it) is retried until
/// the load balancer is gone; and the manager stops cleanly afterwards (no error, no panic).
#[tokio::test]
async fn a_provider_that_panics_is_retried_and_the_manager_goes_on() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start(
        "panicFirstCalls: {ensure_load_balancer: 1, ensure_load_balancer_deleted: 1}\n",
    )
    .await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    h.create("panicky", &[80]).await;
    h.create("calm", &[80]).await;
    h.provisioned("panicky").await;
    h.provisioned("calm").await;
    let object = |name: &str| format!("{}/{name}", h.namespace);
    let calls = |method: &str, name: &str| {
        h.manager
            .cloud
            .snapshot()
            .calls_about(method, &object(name))
    };
    assert!(
        calls("ensure_load_balancer", "panicky") >= 2,
        "the panic, then the retry"
    );

    h.patch("panicky", json!({ "metadata": { "finalizers": null } }))
        .await;
    h.delete("panicky").await;
    eventually(
        "the panicking deletion retried until the load balancer is gone",
        WAIT,
        || async {
            (h.get("panicky").await.is_none() && h.load_balancer("panicky").is_none()).then_some(())
        },
    )
    .await;
    assert!(calls("ensure_load_balancer_deleted", "panicky") >= 2);
    // The rest of the controller went on: the other Service still syncs.
    h.patch(
        "calm",
        json!({ "spec": { "ports": [{ "port": 81, "protocol": "TCP" }] } }),
    )
    .await;
    eventually("the other Service updated", WAIT, || async {
        h.load_balancer("calm")
            .filter(|lb| lb.ports.iter().any(|p| p.port == 81))
            .map(|_| ())
    })
    .await;
    h.delete_and_wait("calm").await;
    h.stop(1).await;
}

/// Issue #52 item 2: a provider that panics in the node sync's update or in a drift check's preview
/// (the loops beside the work queue) fails that one call, not the loop: the update is retried through
/// a full sync and reaches the new node, the drift check goes on and later finds and heals a load
/// balancer deleted out of band, and the manager stops cleanly.
#[tokio::test]
async fn a_provider_panic_in_the_node_sync_or_the_drift_check_fails_one_call_not_the_loop() {
    let _serial = SERIAL.lock().await;
    let namespace = unique_name("panics");
    create_namespace(&namespace).await;
    let h = Harness::start_with(
        namespace.clone(),
        "stateFileShared: true\npanicFirstCalls: {update_load_balancer: 1, preview_load_balancer: 1}\n",
        &["--load-balancer-drift-period=1s"],
    )
    .await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    h.create("web", &[80]).await;
    h.provisioned("web").await;
    create_node(&kubelet_node(&h.node_name(1))).await;
    eventually("the new node behind the load balancer", WAIT, || async {
        (h.backends("web").len() == 2).then_some(())
    })
    .await;
    let object = format!("{namespace}/web");
    eventually("a drift check that panicked, then more", WAIT, || async {
        (h.manager
            .cloud
            .snapshot()
            .calls_about("preview_load_balancer", &object)
            >= 2)
            .then_some(())
    })
    .await;
    assert!(
        h.manager
            .cloud
            .snapshot()
            .calls_about("update_load_balancer", &object)
            >= 1
    );
    let web = h.get("web").await.unwrap();
    delete_out_of_band(&h.state_file, &web).await;
    eventually(
        "the drift check still on: the load balancer made again",
        WAIT,
        || async { h.load_balancer("web").map(|_| ()) },
    )
    .await;
    h.delete_and_wait("web").await;
    h.stop(2).await;
}

#[tokio::test]
async fn services_that_are_not_ours_are_left_alone_and_a_type_change_cleans_up() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start("").await;
    create_node(&kubelet_node(&h.node_name(0))).await;

    // loadBalancerClass set: another implementation owns it.
    let mut classy = load_balancer_service("classy", &[80]);
    classy.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other-lb".into());
    h.api()
        .await
        .create(&PostParams::default(), &classy)
        .await
        .unwrap();
    h.create("web", &[80]).await;
    h.provisioned("web").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let classy = h.get("classy").await.unwrap();
    assert!(
        classy.metadata.finalizers.is_none(),
        "no finalizer on a classed Service"
    );
    assert!(h.load_balancer("classy").is_none());

    // type LoadBalancer → ClusterIP: the load balancer is deleted, the finalizer removed, status cleared.
    h.patch("web", json!({ "spec": { "type": "ClusterIP" } }))
        .await;
    let web = eventually("the cleanup", WAIT, || async {
        h.get("web")
            .await
            .filter(|s| s.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty()))
    })
    .await;
    assert!(h.load_balancer("web").is_none());
    let ingress = web
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|l| l.ingress)
        .unwrap_or_default();
    assert!(ingress.is_empty(), "{ingress:?}");
    h.stop(1).await;
}

#[tokio::test]
async fn a_service_recreated_under_the_same_name_gets_a_fresh_load_balancer() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start("").await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    let first = h.create("web", &[80]).await;
    let (_, lb) = h.provisioned("web").await;

    // Strip our finalizer by hand and delete: the load balancer must still go.
    h.api()
        .await
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    h.delete("web").await;
    eventually("the service gone", WAIT, || async {
        h.get("web").await.is_none().then_some(())
    })
    .await;
    let second = h.create("web", &[80]).await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    let (_, new_lb) = h.provisioned("web").await;
    assert_ne!(
        new_lb.name, lb.name,
        "the load balancer follows the new UID"
    );
    let state = h.state();
    assert!(
        !state.load_balancers.iter().any(|l| l.name == lb.name),
        "the old load balancer leaked"
    );
    h.delete("web").await;
    eventually("cleanup", WAIT, || async {
        h.load_balancer("web").is_none().then_some(())
    })
    .await;
    h.stop(1).await;
}

#[tokio::test]
async fn a_failing_cloud_is_retried_and_holds_the_finalizer_until_the_load_balancer_is_gone() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start("failureRate: {ensure_load_balancer: 1}\n").await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    h.create("web", &[80]).await;

    // Ensure fails: the finalizer is on (it is added before any cloud call), no load balancer, no ingress.
    eventually("failed attempts", WAIT, || async {
        (h.calls("ensure_load_balancer") >= 1).then_some(())
    })
    .await;
    let service = h.get("web").await.unwrap();
    assert!(
        service
            .metadata
            .finalizers
            .unwrap()
            .contains(&FINALIZER.to_owned())
    );
    assert!(h.load_balancer("web").is_none());
    // The cloud recovers: the retry (5 s back-off) provisions it, once.
    h.manager
        .set_cloud(&format!("stateFile: {}\n", h.state_file.display()));
    h.provisioned("web").await;

    // Deleted while deletion fails: the Service stays (finalizer) and so does its load balancer...
    h.manager.set_cloud(&format!(
        "stateFile: {}\nfailureRate: {{ensure_load_balancer_deleted: 1}}\n",
        h.state_file.display()
    ));
    h.delete("web").await;
    eventually("a failed delete", WAIT, || async {
        (h.calls("ensure_load_balancer_deleted") >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let service = h.get("web").await.expect("the finalizer holds the Service");
    assert!(service.metadata.deletion_timestamp.is_some());
    assert!(h.load_balancer("web").is_some());
    // ...until the cloud deletes it.
    h.manager
        .set_cloud(&format!("stateFile: {}\n", h.state_file.display()));
    eventually("the service gone", Duration::from_secs(60), || async {
        h.get("web").await.is_none().then_some(())
    })
    .await;
    assert!(h.load_balancer("web").is_none());
    h.stop(1).await;
}

#[tokio::test]
async fn a_retry_after_from_the_cloud_is_a_fixed_delay_not_a_growing_back_off() {
    let _serial = SERIAL.lock().await;
    // Every ensure answers "retry after 300ms": at the exponential back-off (5 s, 10 s, ...) 8 s would
    // allow 2 attempts; at the asked-for delay, over 20.
    let h = Harness::start("failureRate: {ensure_load_balancer: 1}\nretryAfter: 300ms\n").await;
    create_node(&kubelet_node(&h.node_name(0))).await;
    h.create("web", &[80]).await;
    eventually(
        "several retries at the cloud's pace",
        Duration::from_secs(8),
        || async { (h.calls("ensure_load_balancer") >= 5).then_some(()) },
    )
    .await;
    h.manager
        .set_cloud(&format!("stateFile: {}\n", h.state_file.display()));
    h.provisioned("web").await;
    h.delete("web").await;
    eventually("cleanup", WAIT, || async {
        h.get("web").await.is_none().then_some(())
    })
    .await;
    h.stop(1).await;
}

#[tokio::test]
async fn a_hundred_services_converge_under_a_30_percent_failure_rate_without_duplicates_or_leaks() {
    let _serial = SERIAL.lock().await;
    // The fake draws each Service's failures from the seed and its `namespace/name`: with this namespace
    // and seed no Service fails more than 4 times in a row (the back-off then waits 5+10+20+40 s at
    // most), so the run converges in bounded time; which calls fail is still 30 % of them.
    let namespace = "svc-hundred".to_owned();
    support::ensure_namespace(&namespace).await;
    let h = Harness::start_in(namespace, "failureRate: {all: 0.3}\nseed: 209\n").await;
    for i in 0..3 {
        create_node(&kubelet_node(&h.node_name(i))).await;
    }
    let names: Vec<String> = (0..100).map(|i| format!("svc-{i:03}")).collect();
    for name in &names {
        h.create(name, &[80]).await;
    }
    eventually("all 100 to converge", Duration::from_secs(300), || async {
        let state = h.state();
        let ours = state
            .load_balancers
            .iter()
            .filter(|lb| lb.service.starts_with(&format!("{}/", h.namespace)))
            .count();
        let mut ready = 0;
        for service in h.api().await.list(&Default::default()).await.ok()?.items {
            let has_ingress = service
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .is_some_and(|i| !i.is_empty());
            ready += usize::from(has_ingress);
        }
        (ready == 100 && ours == 100).then_some(())
    })
    .await;
    for name in &names {
        let lb = h
            .load_balancer(name)
            .expect("one load balancer per service"); // asserts no duplicates
        assert_eq!(
            lb.nodes.iter().filter(|n| n.starts_with(&h.prefix)).count(),
            3
        );
    }
    assert!(
        h.calls("ensure_load_balancer") > 100,
        "failures were injected and retried"
    );

    for name in &names {
        h.delete(name).await;
    }
    eventually("all deleted", Duration::from_secs(300), || async {
        let remaining = h
            .api()
            .await
            .list(&Default::default())
            .await
            .ok()?
            .items
            .len();
        let leaked = h
            .state()
            .load_balancers
            .iter()
            .filter(|lb| lb.service.starts_with(&format!("{}/", h.namespace)))
            .count();
        (remaining == 0 && leaked == 0).then_some(())
    })
    .await;
    h.stop(3).await;
}

/// Issue #28, load-balancer classes: a manager serving classless Services and one serving
/// `--load-balancer-class=ccm.rs/local`, side by side on one cluster, each with its own cloud: each
/// provisions and deletes only its own Services, and neither touches the other's finalizer (the same
/// name for both) or status, even while the other's Services are deleted.
#[tokio::test]
async fn two_managers_split_the_services_by_load_balancer_class() {
    let _serial = SERIAL.lock().await;
    let classless = Harness::start("").await;
    let namespace = classless.namespace.clone();
    let classed = Harness::start_with(
        namespace.clone(),
        "",
        &["--load-balancer-class=ccm.rs/local"],
    )
    .await;
    create_node(&kubelet_node(&classless.node_name(0))).await;

    let mut local = load_balancer_service("local", &[80]);
    local.spec.as_mut().unwrap().load_balancer_class = Some("ccm.rs/local".into());
    classless
        .api()
        .await
        .create(&PostParams::default(), &local)
        .await
        .unwrap();
    classless.create("plain", &[81]).await;
    let (plain, plain_lb) = classless.provisioned("plain").await;
    let (local, local_lb) = classed.provisioned("local").await;
    assert!(classless.load_balancer("local").is_none());
    assert!(classed.load_balancer("plain").is_none());
    assert_eq!(
        support::status_ip(&plain),
        plain_lb.ingress.first().cloned()
    );
    assert_eq!(
        support::status_ip(&local),
        local_lb.ingress.first().cloned()
    );

    // A while later, still so: neither manager rewrote the other's Service (its resource version is
    // the one its own manager's last write left).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let plain_now = classless.get("plain").await.unwrap();
    let local_now = classed.get("local").await.unwrap();
    assert_eq!(
        plain_now.metadata.resource_version,
        plain.metadata.resource_version
    );
    assert_eq!(
        local_now.metadata.resource_version,
        local.metadata.resource_version
    );
    assert!(classless.load_balancer("local").is_none());
    assert!(classed.load_balancer("plain").is_none());

    // Each deletion is its own manager's: the finalizer goes with that manager's load balancer.
    classless.delete("local").await;
    eventually("local's deletion", WAIT, || async {
        classless.get("local").await.is_none().then_some(())
    })
    .await;
    assert!(classed.load_balancer("local").is_none());
    assert!(classless.get("plain").await.is_some());
    assert!(classless.load_balancer("plain").is_some());
    classless.delete("plain").await;
    eventually("plain's deletion", WAIT, || async {
        classless.get("plain").await.is_none().then_some(())
    })
    .await;
    assert!(classless.load_balancer("plain").is_none());
    classed.manager.stop().await;
    classless.stop(1).await;
}

/// Deletes the load balancer of `service` behind the manager's back: another process on the same shared
/// state file (a console, a script).
async fn delete_out_of_band(state_file: &std::path::Path, service: &Service) {
    use cloud_provider::CloudProvider;
    let other = cloud_provider_fake::FakeCloud::from_yaml(&format!(
        "stateFile: {}\nstateFileShared: true\n",
        state_file.display()
    ))
    .unwrap();
    other
        .load_balancer()
        .unwrap()
        .ensure_load_balancer_deleted("kubernetes", service)
        .await
        .unwrap();
}

/// Issue #28, drift: a load balancer deleted out of band is found by the next drift check (every
/// second here) and made again, with a `LoadBalancerDrift` Warning on its Service; with
/// `--load-balancer-drift=report` only the event comes and the load balancer stays gone.
#[tokio::test]
async fn a_load_balancer_deleted_out_of_band_is_reported_and_healed() {
    let _serial = SERIAL.lock().await;
    for heal in [true, false] {
        let namespace = unique_name("drift");
        create_namespace(&namespace).await;
        let action = if heal {
            "--load-balancer-drift=heal"
        } else {
            "--load-balancer-drift=report"
        };
        let h = Harness::start_with(
            namespace.clone(),
            "stateFileShared: true\n",
            &["--load-balancer-drift-period=1s", action],
        )
        .await;
        create_node(&kubelet_node(&h.node_name(0))).await;
        h.create("web", &[80]).await;
        let (web, before) = h.provisioned("web").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            events_in(&namespace, "web", "LoadBalancerDrift")
                .await
                .is_empty(),
            "no drift while the load balancer is as the Service asks"
        );

        delete_out_of_band(&h.state_file, &web).await;
        let drift = eventually("the LoadBalancerDrift event", WAIT, || async {
            events_in(&namespace, "web", "LoadBalancerDrift")
                .await
                .into_iter()
                .next()
        })
        .await;
        let note = drift.note.unwrap_or_default();
        assert!(
            note.contains("the load balancer is gone from the cloud"),
            "{note}"
        );
        assert_eq!(drift.type_.as_deref(), Some("Warning"));
        if heal {
            assert!(note.ends_with("ensuring it again"), "{note}");
            let after = eventually("the load balancer made again", WAIT, || async {
                h.load_balancer("web")
            })
            .await;
            assert_eq!(ports(&after), ports(&before));
            assert_eq!(
                support::status_ip(&h.get("web").await.unwrap()),
                after.ingress.first().cloned()
            );
        } else {
            assert!(note.ends_with("(--load-balancer-drift=report)"), "{note}");
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert!(h.load_balancer("web").is_none(), "report only");
        }
        h.delete("web").await;
        eventually("web's deletion", WAIT, || async {
            h.get("web").await.is_none().then_some(())
        })
        .await;
        h.stop(1).await;
    }
}
