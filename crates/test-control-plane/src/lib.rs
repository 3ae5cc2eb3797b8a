//! Integration-test support: one real kube-apiserver + etcd per test run, started by
//! `hack/control-plane`, and clients for it.
//!
//! - With `CCM_TEST_CONTROL_PLANE=DIR` set (as `hack/test` does), the control plane already running from
//!   DIR is used; it must be up.
//! - Without it, the first test that asks starts one in `target/test-control-plane` (building the Go
//!   binaries on first use) and leaves it running for the next run;
//!   `hack/control-plane down --dir target/test-control-plane` stops it.
//!
//! If the control plane cannot start, the test fails with the reason: integration tests never skip.
//! Tests share the control plane, so each uses its own names ([`unique_name`]) and cleans up after itself.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    discovery::{self, Scope},
};

/// The environment variable that names a running control plane's directory.
pub const ENV_VAR: &str = "CCM_TEST_CONTROL_PLANE";

/// A running test control plane.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    dir: PathBuf,
}

/// The workspace root (where `hack/` is).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/test-control-plane is two levels below the workspace root")
        .to_owned()
}

/// The control plane of this test run, started on first use.
pub fn control_plane() -> &'static ControlPlane {
    static PLANE: OnceLock<ControlPlane> = OnceLock::new();
    PLANE.get_or_init(|| start(ENV_VAR, "target/test-control-plane"))
}

/// The environment variable that names a running second control plane's directory: the infra cluster
/// of the `kubevirt` provider's tests.
pub const INFRA_ENV_VAR: &str = "CCM_TEST_INFRA_CONTROL_PLANE";

/// A second control plane, apart from [`control_plane`] (its own etcd and API server): the infra
/// cluster whose VirtualMachineInstances the `kubevirt` provider's tests make. Started on first use as
/// [`control_plane`] is (`CCM_TEST_INFRA_CONTROL_PLANE`, else `target/test-infra-control-plane`).
pub fn infra_control_plane() -> &'static ControlPlane {
    static PLANE: OnceLock<ControlPlane> = OnceLock::new();
    PLANE.get_or_init(|| start(INFRA_ENV_VAR, "target/test-infra-control-plane"))
}

fn start(env_var: &str, default_dir: &str) -> ControlPlane {
    let dir = match std::env::var_os(env_var) {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join(default_dir),
    };
    let script = workspace_root().join("hack/control-plane");
    // `up` is a no-op on a running control plane, so this both checks and, if needed, starts it.
    let output = Command::new(&script)
        .args(["up", "--dir"])
        .arg(&dir)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", script.display()));
    assert!(
        output.status.success(),
        "the test control plane did not start ({} up --dir {}):\n{}",
        script.display(),
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    ControlPlane { dir }
}

impl ControlPlane {
    /// The directory it runs from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster-admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The kubeconfig of user `system:cloud-controller-manager`, which has only what RBAC grants it.
    pub fn ccm_kubeconfig(&self) -> PathBuf {
        self.dir.join("ccm.kubeconfig")
    }

    /// A client with cluster-admin rights.
    pub async fn admin_client(&self) -> Client {
        client_for(&self.admin_kubeconfig()).await
    }

    /// A client as `system:cloud-controller-manager`.
    pub async fn ccm_client(&self) -> Client {
        client_for(&self.ccm_kubeconfig()).await
    }

    /// Stops one component (`kube-apiserver` or `etcd`), keeping its data, ports and certificates:
    /// `hack/control-plane stop --component NAME`. Blocks until it has exited; panics with the script's
    /// output on failure.
    pub fn stop_component(&self, name: &str) {
        self.component("stop", name);
    }

    /// Starts a component [`ControlPlane::stop_component`] stopped, with the same command line, and
    /// blocks until the API server is ready again (or, while the API server is stopped, until etcd is
    /// healthy): `hack/control-plane start --component NAME`. Panics with the script's output on failure.
    pub fn start_component(&self, name: &str) {
        self.component("start", name);
    }

    /// Freezes the kube-apiserver (SIGSTOP): it keeps its connections and answers nothing, as a hung
    /// API server or a silent network does. It continues (SIGCONT) when the guard is dropped, also when
    /// the test panics.
    pub fn freeze_api_server(&self) -> FrozenApiServer {
        let pid_file = self.dir.join("run/kube-apiserver.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", pid_file.display()));
        let pid = pid.trim().to_owned();
        let stopped = Command::new("kill").args(["-STOP", &pid]).status();
        assert!(
            stopped.as_ref().is_ok_and(|s| s.success()),
            "kill -STOP {pid} (the kube-apiserver): {stopped:?}"
        );
        FrozenApiServer(pid)
    }

    fn component(&self, verb: &str, name: &str) {
        let script = workspace_root().join("hack/control-plane");
        let output = Command::new(&script)
            .args([verb, "--component", name, "--dir"])
            .arg(&self.dir)
            .output()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", script.display()));
        assert!(
            output.status.success(),
            "{} {verb} --component {name} --dir {} failed:\n{}",
            script.display(),
            self.dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The kube-apiserver frozen by [`ControlPlane::freeze_api_server`], until this is dropped.
pub struct FrozenApiServer(String);

impl Drop for FrozenApiServer {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

async fn client_for(kubeconfig: &Path) -> Client {
    let parsed = Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|err| panic!("cannot use {}: {err}", kubeconfig.display()));
    Client::try_from(config)
        .unwrap_or_else(|err| panic!("cannot build a client for {}: {err}", kubeconfig.display()))
}

/// A name no other test (or earlier run) uses: `<prefix>-<pid>-<counter>`, valid as a DNS-1123 label.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{n}-{:x}", std::process::id(), nanos % 0xffff)
}

/// The taint a kubelet started with `--cloud-provider=external` registers its Node with.
pub fn uninitialized_taint() -> Taint {
    Taint {
        key: "node.cloudprovider.kubernetes.io/uninitialized".to_owned(),
        value: Some("true".to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// A Node as a kubelet started with `--cloud-provider=external` registers it: the uninitialized taint,
/// no provider ID, a Ready condition and a hostname address.
pub fn kubelet_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                [
                    ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                    ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                    ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![uninitialized_taint()]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                reason: Some("KubeletReady".to_owned()),
                message: Some("kubelet is posting ready status".to_owned()),
                ..Default::default()
            }]),
            addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                type_: "Hostname".to_owned(),
                address: name.to_owned(),
            }]),
            ..Default::default()
        }),
    }
}

/// Applies every object of a multi-document YAML manifest with server-side apply (field manager
/// `test-control-plane`), or only validates them on the server with `dry_run`, as
/// `kubectl apply [--dry-run=server] -f` would. Panics with the object's kind and name on failure.
pub async fn apply_manifest(client: &Client, yaml: &str, dry_run: bool) {
    let documents: Vec<Option<serde_json::Value>> =
        serde_saphyr::from_multiple(yaml).unwrap_or_else(|err| panic!("malformed manifest: {err}"));
    for document in documents.into_iter().flatten() {
        let object: DynamicObject = serde_json::from_value(document)
            .unwrap_or_else(|err| panic!("not a Kubernetes object: {err}"));
        let types = object
            .types
            .clone()
            .expect("every object has apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).expect("a valid apiVersion");
        let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|err| panic!("unknown kind {}: {err}", types.kind));
        let name = object
            .metadata
            .name
            .clone()
            .expect("every object has a name");
        let api: Api<DynamicObject> =
            match (capabilities.scope, object.metadata.namespace.as_deref()) {
                (Scope::Namespaced, Some(namespace)) => {
                    Api::namespaced_with(client.clone(), namespace, &resource)
                }
                (Scope::Namespaced, None) => {
                    Api::default_namespaced_with(client.clone(), &resource)
                }
                (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
            };
        let mut params = PatchParams::apply("test-control-plane").force();
        if dry_run {
            params = params.dry_run();
        }
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|err| panic!("applying {} {name}: {err}", types.kind));
    }
}

/// Applies `deploy/rbac.yaml` (once per test process), so the `system:cloud-controller-manager` user of
/// `ccm.kubeconfig` has exactly the shipped permissions.
pub async fn apply_shipped_rbac() {
    static APPLIED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    APPLIED
        .get_or_init(|| async {
            for file in [
                "deploy/rbac.yaml",
                "deploy/components/service-account-credentials/rbac.yaml",
            ] {
                let yaml = std::fs::read_to_string(workspace_root().join(file)).expect(file);
                apply_manifest(&control_plane().admin_client().await, &yaml, false).await;
            }
        })
        .await;
}
