//! Running the manager in-process against the test control plane, with a fake cloud the test holds.

#![allow(dead_code)] // each test binary uses a different part

pub mod audit;
pub mod blackhole_proxy;
pub mod flood;
pub mod go_ccm;
pub mod replica;

use std::sync::Arc;

use cloud_controller_manager::metrics::Metrics;
use cloud_provider_fake::{Config, FakeCloud};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{Api, api::PostParams};
use serde_json::json;

// Each test binary uses a different part.
use manager_testkit::ManagerUnderTest;
#[allow(unused_imports)]
pub use manager_testkit::{
    SERIAL, admin, delete_nodes, events_in, eventually, get_node, nodes, set_ready,
};

/// A manager running in this process on a fake cloud the test holds.
pub struct RunningManager {
    pub cloud: FakeCloud,
    pub metrics: Metrics,
    manager: ManagerUnderTest,
}

impl RunningManager {
    /// Starts a manager on `cloud` with `args` added to the defaults of these tests.
    pub async fn start(cloud_yaml: &str, args: &[&str]) -> Self {
        let cloud = FakeCloud::from_yaml(cloud_yaml).expect("valid fake cloud config");
        let manager = ManagerUnderTest::start("fake", Arc::new(cloud.clone()), args).await;
        Self {
            cloud,
            metrics: manager.metrics.clone(),
            manager,
        }
    }

    /// Replaces the cloud's config, as an edit of the cloud-config file does.
    pub fn set_cloud(&self, yaml: &str) {
        self.cloud
            .set_config(Config::parse(yaml, None).expect("valid fake cloud config"));
    }

    /// Stops the manager and checks it stopped without error.
    pub async fn stop(self) {
        self.manager.stop().await;
    }
}

pub async fn create_node(node: &Node) -> Node {
    nodes()
        .await
        .create(&PostParams::default(), node)
        .await
        .expect("node created")
}

/// The events about `node` with `reason`.
pub async fn events_for(node: &str, reason: &str) -> Vec<Event> {
    events_in("default", node, reason).await
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
