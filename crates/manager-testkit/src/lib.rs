//! The manager under test, for the manager's, the providers' and the cluster's tests: the real
//! manager run in this process against the test control plane (`test-control-plane`), as
//! `system:cloud-controller-manager` with exactly the shipped RBAC, so that every test that runs it
//! also proves the role grants what the controllers need; and the helpers every such test needs
//! (waiting for a condition, Nodes, their Ready condition, events).
//!
//! One copy of what four test suites had each written for themselves.

use std::{future::Future, sync::Arc, time::Duration};

use clap::Parser;
use cloud_controller_manager::{Manager, ManagerError, Options, metrics::Metrics};
use cloud_provider::{CloudProvider, Registry};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use test_control_plane::control_plane;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Tests in one binary share the cluster and every manager handles every Node, so they run one at a
/// time: each holds this lock.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long [`ManagerUnderTest::stop`] waits for the manager to stop.
pub const STOP_WITHIN: Duration = Duration::from_secs(30);

/// A manager running in this process.
pub struct ManagerUnderTest {
    /// Its metrics: what its `/metrics` serves.
    pub metrics: Metrics,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl ManagerUnderTest {
    /// Starts the manager with `cloud` registered as the provider `provider`, and `args` after these
    /// defaults: `--cloud-provider=<provider>`, the manager's kubeconfig, no leader election (tests
    /// run one manager at a time but share the cluster) and no serving port.
    pub async fn start(provider: &str, cloud: Arc<dyn CloudProvider>, args: &[&str]) -> Self {
        let mut registry = Registry::new();
        registry
            .register(provider, move |_| Ok(cloud.clone()))
            .expect("a provider name");
        Self::start_with(Manager::with_registry(registry), provider, args).await
    }

    /// Starts the manager with the providers linked into the test binary (one that reads its
    /// `--cloud-config`, say), as [`ManagerUnderTest::start`] does otherwise.
    pub async fn start_linked(provider: &str, args: &[&str]) -> Self {
        let registry = Registry::linked().expect("the linked providers register");
        Self::start_with(Manager::with_registry(registry), provider, args).await
    }

    async fn start_with(manager: Manager, provider: &str, args: &[&str]) -> Self {
        show_logs();
        let metrics = manager.metrics().clone();
        test_control_plane::apply_shipped_rbac().await;
        let mut argv = vec![
            "cloud-controller-manager".to_owned(),
            format!("--cloud-provider={provider}"),
            format!(
                "--kubeconfig={}",
                control_plane().ccm_kubeconfig().display()
            ),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
        ];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        let options = Options::try_parse_from(argv).expect("valid flags");
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        // Watched: `stop` awaits the handle, and fails the test on a panic or an error.
        let task = tokio::spawn(async move { manager.run(options, token).await });
        Self {
            metrics,
            shutdown,
            task,
        }
    }

    /// Whether the manager still runs (it has not returned, with or without an error).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops the manager and checks it stopped, within [`STOP_WITHIN`], without a panic or an error.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(STOP_WITHIN, self.task)
            .await
            .expect("the manager stops within 30 s")
            .expect("the manager task does not panic")
            .expect("the manager stops without error");
    }
}

/// With `RUST_LOG` set, the manager's log goes to the test's output (shown when a test fails).
pub fn show_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
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

/// The test control plane's admin client.
pub async fn admin() -> Client {
    control_plane().admin_client().await
}

/// The Nodes, as the admin.
pub async fn nodes() -> Api<Node> {
    Api::all(admin().await)
}

/// The Node `name`, if there is one.
pub async fn get_node(name: &str) -> Option<Node> {
    nodes().await.get_opt(name).await.expect("node read")
}

/// Deletes the Nodes `names` (those that are not there are no error).
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

/// The events in `namespace` about the object `name` with `reason`.
pub async fn events_in(namespace: &str, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(admin().await, namespace);
    events
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}
