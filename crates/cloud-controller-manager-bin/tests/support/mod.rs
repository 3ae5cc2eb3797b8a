//! Running the manager in-process against the test control plane, with a fake cloud the test holds.

#![allow(dead_code)] // each test binary uses a different part

pub mod audit;
pub mod blackhole_proxy;
pub mod flood;
pub mod go_ccm;
pub mod replica;

use std::{future::Future, sync::Arc, time::Duration};

use clap::Parser;
use cloud_controller_manager::{Manager, Options, metrics::Metrics};
use cloud_provider::Registry;
use cloud_provider_fake::{Config, FakeCloud};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use test_control_plane::control_plane;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Tests in one binary share the cluster and every manager handles every Node, so they run one at a
/// time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A manager running in this process.
pub struct RunningManager {
    pub cloud: FakeCloud,
    pub metrics: Metrics,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), cloud_controller_manager::ManagerError>>,
}

impl RunningManager {
    /// Starts a manager on `cloud` with `args` added to the defaults of these tests.
    pub async fn start(cloud_yaml: &str, args: &[&str]) -> Self {
        // RUST_LOG=... shows the manager's logs when a test needs debugging.
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt().with_test_writer().try_init();
        }
        let cloud = FakeCloud::from_yaml(cloud_yaml).expect("valid fake cloud config");
        let mut registry = Registry::new();
        let shared = cloud.clone();
        registry
            .register("fake", move |_| Ok(Arc::new(shared.clone()) as _))
            .unwrap();
        let manager = Manager::with_registry(registry);
        let metrics = manager.metrics().clone();
        // The manager runs as system:cloud-controller-manager with exactly the shipped RBAC, so every
        // controller test also proves the role grants what the controller needs.
        test_control_plane::apply_shipped_rbac().await;
        let kubeconfig = control_plane().ccm_kubeconfig();
        let mut argv = vec![
            "cloud-controller-manager".to_owned(),
            "--cloud-provider=fake".to_owned(),
            format!("--kubeconfig={}", kubeconfig.display()),
            // Off unless a test turns them on: tests run one manager at a time but share the cluster.
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        let options = Options::try_parse_from(argv).expect("valid flags");
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move { manager.run(options, token).await });
        Self {
            cloud,
            metrics,
            shutdown,
            task,
        }
    }

    /// Replaces the cloud's config, as an edit of the cloud-config file does.
    pub fn set_cloud(&self, yaml: &str) {
        self.cloud
            .set_config(Config::parse(yaml, None).expect("valid fake cloud config"));
    }

    /// Stops the manager and checks it stopped without error.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the manager stops within 30 s")
            .expect("the manager task does not panic")
            .expect("the manager stops without error");
    }
}

/// Polls `check` every 100 ms until it returns `Some`, failing after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn admin() -> Client {
    control_plane().admin_client().await
}

pub async fn nodes() -> Api<Node> {
    Api::all(admin().await)
}

pub async fn create_node(node: &Node) -> Node {
    nodes()
        .await
        .create(&PostParams::default(), node)
        .await
        .expect("node created")
}

pub async fn get_node(name: &str) -> Option<Node> {
    nodes().await.get_opt(name).await.expect("node read")
}

pub async fn delete_nodes(names: &[&str]) {
    let api = nodes().await;
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Sets the node's Ready condition, as a kubelet (or its absence) would.
pub async fn set_ready(name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({ "status": { "conditions": [{
        "type": "Ready", "status": status, "reason": "Test", "message": "set by the test",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    nodes()
        .await
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("node status patched");
}

/// The events about `node` with `reason`.
pub async fn events_for(node: &str, reason: &str) -> Vec<Event> {
    events_in("default", node, reason).await
}

/// The events in `namespace` about the object `name` with `reason`.
pub async fn events_in(namespace: &str, name: &str, reason: &str) -> Vec<Event> {
    let node = name;
    let events: Api<Event> = Api::namespaced(admin().await, namespace);
    events
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// Creates a namespace (never deleted: no namespace controller runs in the test control plane).
pub async fn create_namespace(name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(admin().await);
    let namespace: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace created");
}

/// Creates a namespace unless it exists.
pub async fn ensure_namespace(name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(admin().await);
    if namespaces
        .get_opt(name)
        .await
        .expect("namespace read")
        .is_none()
    {
        create_namespace(name).await;
    }
}

/// The Services API of a namespace.
pub async fn services(namespace: &str) -> Api<k8s_openapi::api::core::v1::Service> {
    Api::namespaced(admin().await, namespace)
}

/// A `type: LoadBalancer` Service with TCP ports `port → 8080`.
pub fn load_balancer_service(name: &str, ports: &[i32]) -> k8s_openapi::api::core::v1::Service {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "type": "LoadBalancer",
            "selector": { "app": name },
            "ports": ports.iter().map(|p| json!({ "name": format!("p{p}"), "port": p, "targetPort": 8080, "protocol": "TCP" })).collect::<Vec<_>>(),
        }
    }))
    .unwrap()
}

/// A free loopback port (bound, then released for the manager to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET https://127.0.0.1:<port><path>` with an optional bearer token, via curl (the endpoint's
/// certificate is self-signed): the status code and body.
pub async fn https_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    // Async: the manager under test may run on this very runtime thread.
    let mut command = tokio::process::Command::new("curl");
    command.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let output = command
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The bearer token of a kubeconfig the test control plane wrote.
pub fn kubeconfig_token(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned))
        .expect("a token in the kubeconfig")
}

/// The ingress IP in a Service's status, if any.
pub fn status_ip(service: &k8s_openapi::api::core::v1::Service) -> Option<String> {
    service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

/// The load balancers the cloud holds for Services of `namespace`.
pub fn load_balancers_in(
    state: &cloud_provider_fake::CloudState,
    namespace: &str,
) -> Vec<cloud_provider_fake::LoadBalancerRecord> {
    let prefix = format!("{namespace}/");
    state
        .load_balancers
        .iter()
        .filter(|lb| lb.service.starts_with(&prefix))
        .cloned()
        .collect()
}
