//! Shadow mode (`--dry-run`) on the real control plane: the manager writes nothing to the API server or
//! the cloud, reports every write it would have made (`/dry-run`, metrics), and, run beside the upstream
//! Go CCM acting on the same cluster and the same fake cloud, reports zero differing writes once both
//! agree, and the differences seeded afterwards.

mod support;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, PostParams};
use serde_json::Value;
use support::{
    RunningManager, SERIAL, create_namespace, create_node, delete_nodes, eventually, free_port,
    get_node, https_get, kubeconfig_token, load_balancer_service, services, status_ip,
};
use test_control_plane::{control_plane, kubelet_node, unique_name};

const WITHIN: Duration = Duration::from_secs(60);

fn admin_token() -> String {
    kubeconfig_token(&control_plane().admin_kubeconfig())
}

/// The report at `/dry-run`, as the cluster admin reads it.
async fn report(port: u16) -> Option<Value> {
    let (code, body) = https_get(port, "/dry-run", Some(&admin_token())).await;
    (code == 200).then(|| serde_json::from_str(&body).expect("the report is JSON"))
}

fn entries<'a>(report: &'a Value, list: &str) -> &'a [Value] {
    report[list].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The would-be write to an object (`namespace/name` or a node's name), to its `status` subresource
/// or to the object itself (`None`).
fn api_write<'a>(
    report: &'a Value,
    resource: &str,
    name: &str,
    subresource: Option<&str>,
) -> Option<&'a Value> {
    let (namespace, name) = match name.split_once('/') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, name),
    };
    entries(report, "apiWrites").iter().find(|e| {
        e["resource"] == resource
            && e["name"] == name
            && e["namespace"].as_str() == namespace
            && e["subresource"].as_str() == subresource
    })
}

/// The differing entries (API and cloud) about this test's objects: its namespace and nodes (the
/// cluster may hold other tests' objects).
fn differing_about<'a>(report: &'a Value, namespace: &str, nodes: &[&str]) -> Vec<&'a Value> {
    let ours = |e: &Value| {
        e["namespace"] == namespace
            || nodes
                .iter()
                .any(|n| e["resource"] == "nodes" && e["name"] == *n)
            || e["object"]
                .as_str()
                .is_some_and(|o| o.starts_with(&format!("loadBalancer {namespace}/")))
    };
    entries(report, "apiWrites")
        .iter()
        .chain(entries(report, "cloudWrites"))
        .filter(|e| e["classification"] == "differing" && ours(e))
        .collect()
}

fn cloud_write<'a>(report: &'a Value, object: &str) -> Option<&'a Value> {
    entries(report, "cloudWrites")
        .iter()
        .find(|e| e["object"] == object)
}

fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key.contains("uninitialized")))
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref()?.provider_id.clone()
}

fn secure_args(port: u16) -> Vec<String> {
    vec![
        "--dry-run".to_owned(),
        format!("--secure-port={port}"),
        "--bind-address=127.0.0.1".to_owned(),
        // Shadow mode ignores it: it must not take the incumbent's lease.
        "--leader-elect=true".to_owned(),
        "--configure-cloud-routes=false".to_owned(),
    ]
}

#[tokio::test]
async fn alone_in_dry_run_nothing_changes_and_every_would_be_write_is_reported() {
    let _serial = SERIAL.lock().await;
    let port = free_port();
    let args = secure_args(port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let manager = RunningManager::start("routes: {enabled: false}\n", &args).await;

    let node = unique_name("shadow");
    create_node(&kubelet_node(&node)).await;
    let namespace = unique_name("shadow");
    create_namespace(&namespace).await;
    let svc = services(&namespace).await;
    svc.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .unwrap();
    let lb_key = format!("loadBalancer {namespace}/web");
    // Upstream's service controller (and ours) patches the finalizer through the status subresource.
    let service_key = format!("{namespace}/web");

    let report = eventually(
        "the node's and the load balancer's would-be writes in the report",
        WITHIN,
        || async {
            let report = report(port).await?;
            let node_write = api_write(&report, "nodes", &node, None)?;
            let lb = cloud_write(&report, &lb_key)?;
            let finalizer = api_write(&report, "services", &service_key, Some("status"))?;
            (node_write["classification"] == "differing"
                && lb["classification"] == "differing"
                && finalizer["classification"] == "differing")
                .then_some(report)
        },
    )
    .await;
    // The node write initializes it: provider ID and the taint gone (the body is the patch).
    let body = api_write(&report, "nodes", &node, None).unwrap()["body"].to_string();
    assert!(body.contains(&format!("fake://{node}")), "{body}");
    // The load balancer would be created with the node as its backend.
    let lb = cloud_write(&report, &lb_key).unwrap();
    assert_eq!(lb["change"]["kind"], "create", "{lb}");
    assert!(
        entries(&lb["change"], "backends").contains(&Value::from(node.as_str())),
        "{lb}"
    );
    // The Service write is the finalizer (the status itself would not change: no load balancer yet).
    let body =
        api_write(&report, "services", &service_key, Some("status")).unwrap()["body"].to_string();
    assert!(
        body.contains("service.kubernetes.io/load-balancer-cleanup"),
        "{body}"
    );
    assert!(report["differing"].as_u64().unwrap() >= 3, "{report:#}");
    assert!(
        report["events"]["total"].as_u64().unwrap() >= 1,
        "{report:#}"
    );

    // Nothing changed, on the server or in the cloud.
    let stored = get_node(&node).await.unwrap();
    assert!(
        has_taint(&stored) && provider_id(&stored).is_none(),
        "{stored:?}"
    );
    let stored: Service = svc.get("web").await.unwrap();
    assert!(stored.metadata.finalizers.is_none(), "{stored:?}");
    assert_eq!(status_ip(&stored), None);
    assert!(manager.cloud.snapshot().load_balancers.is_empty());
    assert_eq!(manager.cloud.snapshot().calls_to("ensure_load_balancer"), 0);

    // The same writes are on /metrics.
    let metrics = manager.metrics.encode();
    assert!(
        metrics.contains(
            r#"cloud_controller_manager_dry_run_writes_total{resource="nodes",verb="PATCH"}"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"cloud_controller_manager_dry_run_cloud_writes_total{call="ensure_load_balancer",preview="create"}"#),
        "{metrics}"
    );

    // The report is behind the same authorization as /metrics.
    assert_eq!(https_get(port, "/dry-run", None).await.0, 403);
    assert_eq!(
        https_get(port, "/dry-run", Some("not-a-token")).await.0,
        401
    );

    manager.stop().await;
    svc.delete("web", &DeleteParams::default()).await.unwrap();
    delete_nodes(&[&node]).await;
}

/// The upstream Go CCM, acting, with its load balancers in the fake cloud's shared state file.
struct GoPeer(Child);

impl GoPeer {
    fn start(state_file: &Path) -> Self {
        let child = Command::new(support::go_ccm::binary())
            .arg("--cloud-provider=fake")
            .arg(format!(
                "--kubeconfig={}",
                control_plane().admin_kubeconfig().display()
            ))
            .args([
                "--secure-port=0",
                "--leader-elect=false",
                "--controllers=cloud-node,cloud-node-lifecycle,service",
                "--configure-cloud-routes=false",
            ])
            .env_remove("KUBECONFIG")
            .env("BENCH_FAKE_STATE_FILE", state_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the Go CCM starts");
        Self(child)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.0.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn beside_the_go_ccm_on_one_cloud_zero_differences_then_the_seeded_ones() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("cloud.json");
    let go = GoPeer::start(&state_file);

    let (a, b) = (unique_name("inc-a"), unique_name("inc-b"));
    create_node(&kubelet_node(&a)).await;
    create_node(&kubelet_node(&b)).await;
    let namespace = unique_name("incumbent");
    create_namespace(&namespace).await;
    let svc = services(&namespace).await;
    svc.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .unwrap();
    // The incumbent converges: nodes initialized, the load balancer (in the shared file) with both.
    for name in [&a, &b] {
        eventually("the Go CCM initializing the node", WITHIN, || async {
            get_node(name)
                .await
                .filter(|n| !has_taint(n) && provider_id(n).is_some())
        })
        .await;
    }
    eventually("the Go CCM's load balancer", WITHIN, || async {
        let service = svc.get("web").await.ok()?;
        status_ip(&service)?;
        let state = cloud_provider_fake::CloudState::read(&state_file).ok()?;
        let lb = state.load_balancer_of(&format!("{namespace}/web"))?;
        (lb.nodes.len() >= 2).then_some(())
    })
    .await;

    // Ours in shadow mode, on the same file as the cloud. The node `seeded` has a label in our cloud
    // that the Go peer's cloud does not have.
    let seeded = unique_name("seeded");
    let port = free_port();
    let args = secure_args(port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cloud = format!(
        "stateFile: {}\nstateFileShared: true\nroutes: {{enabled: false}}\ninstances:\n  {seeded}:\n    additionalLabels: {{example.com/rack: r1}}\n",
        state_file.display()
    );
    let manager = RunningManager::start(&cloud, &args).await;
    let lb_key = format!("loadBalancer {namespace}/web");
    let converged = eventually("our shadow's view of the load balancer", WITHIN, || async {
        let report = report(port).await?;
        (cloud_write(&report, &lb_key)?["classification"] == "upToDate").then_some(report)
    })
    .await;
    assert_eq!(
        differing_about(&converged, &namespace, &[&a, &b]),
        Vec::<&Value>::new(),
        "{converged:#}"
    );
    assert_eq!(converged["unknown"], 0, "{converged:#}");

    // Seeded difference 1: the load balancer's backends differ (the cloud lost node b).
    let service: Service = svc.get("web").await.unwrap();
    let node_a = get_node(&a).await.unwrap();
    cloud_provider::CloudProvider::load_balancer(&manager.cloud)
        .unwrap()
        .update_load_balancer("kubernetes", &service, &[std::sync::Arc::new(node_a)])
        .await
        .unwrap();
    let report_now = eventually("the backend difference", WITHIN, || async {
        let report = report(port).await?;
        (cloud_write(&report, &lb_key)?["classification"] == "differing").then_some(report)
    })
    .await;
    let change = &cloud_write(&report_now, &lb_key).unwrap()["change"];
    assert_eq!(change["kind"], "change", "{change}");
    assert!(
        entries(change, "backendsAdded").contains(&Value::from(b.as_str())),
        "{change}"
    );
    assert_eq!(
        differing_about(&report_now, &namespace, &[&a, &b]).len(),
        1,
        "{report_now:#}"
    );

    // Seeded difference 2: a node label the incumbent does not set. The Go peer is stopped while the
    // node registers, so only our would-be initialization exists for it.
    go.signal("STOP");
    create_node(&kubelet_node(&seeded)).await;
    let report_now = eventually("the label difference", WITHIN, || async {
        let report = report(port).await?;
        let write = api_write(&report, "nodes", &seeded, None)?;
        (write["classification"] == "differing").then_some(report)
    })
    .await;
    let body = api_write(&report_now, "nodes", &seeded, None).unwrap()["body"].to_string();
    assert!(body.contains("example.com/rack"), "{body}");
    // Initializing it is two writes (labels, provider ID and taint; then its addresses), both about
    // it; the load balancer's difference is still there.
    let differing = differing_about(&report_now, &namespace, &[&a, &b, &seeded]);
    let about_seeded = differing
        .iter()
        .filter(|e| e["name"] == seeded.as_str())
        .count();
    assert!(about_seeded >= 1, "{report_now:#}");
    assert_eq!(differing.len(), about_seeded + 1, "{report_now:#}");
    go.signal("CONT");
    // The incumbent initializes it (without the label); our write is then superseded: our node
    // controller does not revisit the labels of initialized nodes, as upstream's does not.
    let stored = eventually(
        "the Go CCM initializing the seeded node",
        WITHIN,
        || async {
            get_node(&seeded)
                .await
                .filter(|n| !has_taint(n) && provider_id(n).is_some())
        },
    )
    .await;
    assert!(
        !stored
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("example.com/rack")
    );

    manager.stop().await;
    drop(go);
    svc.delete("web", &DeleteParams::default()).await.unwrap();
    delete_nodes(&[&a, &b, &seeded]).await;
}
