//! `--use-service-account-credentials` on the real API server: each controller writes as its own
//! ServiceAccount of kube-system (which the manager creates if missing and whose token it requests),
//! bound only by the API server's bootstrap roles, and the manager, bound only to `deploy/rbac.yaml`,
//! keeps its own identity for the rest. Without the right to request tokens, it stops at start naming
//! the ServiceAccount and the missing rule. In shadow mode it requests tokens but creates no
//! ServiceAccount, and its dry runs are made as the ServiceAccounts.

mod support;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use k8s_openapi::{
    api::{
        core::v1::{Node, ServiceAccount},
        rbac::v1::{ClusterRoleBinding, Role, RoleBinding},
    },
    jiff::Timestamp,
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::{Value, json};
use support::{
    RunningManager, SERIAL, admin, create_namespace, create_node, delete_nodes, events_for,
    events_in, eventually, get_node, kubeconfig_token, load_balancer_service, services, status_ip,
};
use test_control_plane::{control_plane, kubelet_node, unique_name, workspace_root};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-controller-manager");
const WAIT: Duration = Duration::from_secs(30);
const MANAGER: &str = "system:cloud-controller-manager";
const NODE_CONTROLLER: &str = "system:serviceaccount:kube-system:node-controller";
const SERVICE_CONTROLLER: &str = "system:serviceaccount:kube-system:service-controller";
const ROUTE_CONTROLLER: &str = "system:serviceaccount:kube-system:route-controller";
const SERVICE_ACCOUNTS: [&str; 3] = ["node-controller", "service-controller", "route-controller"];
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// A write from the API server's audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    user: String,
    verb: String,
    /// `resource` or `resource/subresource`.
    resource: String,
    namespace: String,
    name: String,
    /// Sent with `dryRun=All` (shadow mode).
    dry_run: bool,
}

/// Every audited write received at or after `since` (the test control plane logs the writes of the
/// manager's user and of kube-system's ServiceAccounts: hack/control-plane).
fn audited_writes_since(since: Timestamp) -> Vec<Write> {
    let log = std::fs::read_to_string(control_plane().dir().join("logs/audit.log"))
        .expect("the test control plane writes an audit log (hack/control-plane)");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            event["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .is_some_and(|t| t >= since)
        })
        .map(|event| {
            let object = &event["objectRef"];
            let mut resource = text(&object["resource"]);
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            Write {
                user: text(&event["user"]["username"]),
                verb: text(&event["verb"]),
                resource,
                namespace: text(&object["namespace"]),
                name: text(&object["name"]),
                dry_run: text(&event["requestURI"]).contains("dryRun=All"),
            }
        })
        .collect()
}

/// The audit policy of the running control plane logs kube-system's ServiceAccounts' writes (a control
/// plane started before that rule was added logs only the manager's user: restart it).
fn audit_policy_logs_service_accounts() {
    let policy = std::fs::read_to_string(control_plane().dir().join("audit-policy.yaml")).unwrap();
    assert!(
        policy.contains("system:serviceaccounts:kube-system"),
        "the test control plane in {} predates the audit rule for kube-system's ServiceAccounts; restart it (hack/control-plane down --dir DIR, then up)",
        control_plane().dir().display()
    );
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

fn is_initialized(node: &Node) -> bool {
    !node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED))
}

fn network_available(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
        })
}

#[tokio::test]
async fn each_controller_writes_as_its_own_service_account_created_by_the_manager() {
    let _serial = SERIAL.lock().await;
    audit_policy_logs_service_accounts();
    // The manager creates the ServiceAccounts when they are missing.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin().await, "kube-system");
    for name in SERVICE_ACCOUNTS {
        let _ = accounts.delete(name, &DeleteParams::default()).await;
    }
    let since = Timestamp::now();
    let node_name = unique_name("sa-creds");
    let namespace = unique_name("sa-creds");
    create_namespace(&namespace).await;
    let manager = RunningManager::start(
        "",
        &[
            "--use-service-account-credentials=true",
            "--allocate-node-cidrs=true",
            "--cluster-cidr=10.203.0.0/16",
            "--route-reconciliation-period=1s",
        ],
    )
    .await;

    // The node is initialized (cloud-node), gets a pod CIDR (node-IPAM) and a route (node-route).
    create_node(&kubelet_node(&node_name)).await;
    eventually(
        "the node initialized, with a pod CIDR and its route",
        WAIT,
        || async {
            get_node(&node_name)
                .await
                .filter(|n| is_initialized(n) && !pod_cidrs(n).is_empty() && network_available(n))
        },
    )
    .await;
    // The LoadBalancer Service gets its status (service-lb).
    let api = services(&namespace).await;
    api.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .expect("service created");
    eventually("the Service's load-balancer status", WAIT, || async {
        api.get_opt("web")
            .await
            .unwrap()
            .filter(|s| status_ip(s).is_some())
    })
    .await;
    // Events are written as the controllers too (EnsuredLoadBalancer comes after the status).
    eventually("the node's and the Service's events", WAIT, || async {
        let node = events_for(&node_name, "Synced").await;
        let service = events_in(&namespace, "web", "EnsuredLoadBalancer").await;
        (!node.is_empty() && !service.is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await; // the audit log is written as requests finish
    let writes = audited_writes_since(since);

    let on = |resource: &str, name: &str| -> Vec<(String, String, String)> {
        writes
            .iter()
            .filter(|w| w.resource == resource && w.name == name)
            .map(|w| (w.user.clone(), w.verb.clone(), w.resource.clone()))
            .collect()
    };
    let node_writes: Vec<_> = [on("nodes", &node_name), on("nodes/status", &node_name)].concat();
    let has = |writes: &[(String, String, String)], user: &str, verb: &str, resource: &str| {
        writes
            .iter()
            .any(|(u, v, r)| u == user && v == verb && r == resource)
    };
    // cloud-node initializes with a PUT (update), node-IPAM patches the pod CIDR: node-controller.
    assert!(
        has(&node_writes, NODE_CONTROLLER, "update", "nodes"),
        "{node_writes:?}"
    );
    assert!(
        has(&node_writes, NODE_CONTROLLER, "patch", "nodes"),
        "{node_writes:?}"
    );
    // node-route sets the NetworkUnavailable condition: route-controller.
    assert!(
        has(&node_writes, ROUTE_CONTROLLER, "patch", "nodes/status"),
        "{node_writes:?}"
    );
    assert!(
        node_writes.iter().all(|(user, _, _)| user != MANAGER),
        "the manager's own identity wrote the node: {node_writes:?}"
    );
    // service-lb writes the finalizer and the status through the status subresource.
    let service_writes = [on("services", "web"), on("services/status", "web")].concat();
    assert!(
        has(
            &service_writes,
            SERVICE_CONTROLLER,
            "patch",
            "services/status"
        ),
        "{service_writes:?}"
    );
    assert!(
        service_writes
            .iter()
            .all(|(user, _, _)| user == SERVICE_CONTROLLER),
        "{service_writes:?}"
    );
    // Events: the Service's as service-controller, the node's as node-controller; none as the manager.
    let events: Vec<&Write> = writes.iter().filter(|w| w.resource == "events").collect();
    assert!(
        events
            .iter()
            .any(|w| w.namespace == namespace && w.user == SERVICE_CONTROLLER),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .filter(|w| w.namespace == namespace)
            .all(|w| w.user == SERVICE_CONTROLLER),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|w| w.name.starts_with(&node_name) && w.user == NODE_CONTROLLER),
        "{events:?}"
    );
    assert!(
        events.iter().all(|w| w.user != MANAGER),
        "events written as the manager: {events:?}"
    );
    // The manager's own writes: the missing ServiceAccounts and the tokens, nothing else.
    let mine: Vec<&Write> = writes.iter().filter(|w| w.user == MANAGER).collect();
    for name in SERVICE_ACCOUNTS {
        for resource in ["serviceaccounts", "serviceaccounts/token"] {
            assert!(
                mine.iter().any(|w| w.verb == "create"
                    && w.resource == resource
                    && w.namespace == "kube-system"
                    && w.name == name),
                "no create {resource} {name} by the manager: {mine:?}"
            );
        }
    }
    assert!(
        mine.iter()
            .all(|w| w.resource.starts_with("serviceaccounts")),
        "other writes as the manager: {mine:?}"
    );
    for name in SERVICE_ACCOUNTS {
        assert!(accounts.get_opt(name).await.unwrap().is_some(), "{name}");
    }

    // Clean up while the manager runs (it removes the Service's finalizer).
    api.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the Service gone", WAIT, || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    delete_nodes(&[&node_name]).await;
    manager.stop().await;
}

/// An identity of its own for the manager, bound like `system:cloud-controller-manager` by
/// `deploy/rbac.yaml` but without the rule `serviceaccounts/token`: a ServiceAccount in kube-system
/// whose token goes into a kubeconfig. Removed on drop.
struct ReducedIdentity {
    name: String,
    kubeconfig: tempfile::NamedTempFile,
}

impl ReducedIdentity {
    async fn create() -> Self {
        test_control_plane::apply_shipped_rbac().await;
        let client = admin().await;
        let name = unique_name("ccm-no-token");
        let rbac = std::fs::read_to_string(
            workspace_root().join("deploy/components/service-account-credentials/rbac.yaml"),
        )
        .unwrap();
        let documents: Vec<Option<Value>> = serde_saphyr::from_multiple(&rbac).unwrap();
        let mut role: Role = documents
            .into_iter()
            .flatten()
            .find(|d| {
                d["kind"] == "Role"
                    && d["metadata"]["name"]
                        == "system:cloud-controller-manager:service-account-credentials"
            })
            .map(|d| serde_json::from_value(d).unwrap())
            .expect("deploy/components/service-account-credentials has the Role");
        let rules = role.rules.take().unwrap_or_default();
        let before = rules.len();
        role.rules = Some(
            rules
                .into_iter()
                .filter(|r| {
                    !r.resources
                        .as_ref()
                        .is_some_and(|r| r.iter().any(|r| r == "serviceaccounts/token"))
                })
                .collect(),
        );
        assert_eq!(role.rules.as_ref().unwrap().len(), before - 1);
        role.metadata.name = Some(name.clone());
        let subject =
            json!([{ "kind": "ServiceAccount", "name": name, "namespace": "kube-system" }]);
        let post = PostParams::default();
        Api::<ServiceAccount>::namespaced(client.clone(), "kube-system")
            .create(
                &post,
                &serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap(),
            )
            .await
            .unwrap();
        Api::<Role>::namespaced(client.clone(), "kube-system")
            .create(&post, &role)
            .await
            .unwrap();
        Api::<RoleBinding>::namespaced(client.clone(), "kube-system")
            .create(
                &post,
                &serde_json::from_value(json!({
                    "metadata": { "name": name },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
                    "subjects": subject,
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(
                &post,
                &serde_json::from_value(json!({
                    "metadata": { "name": name },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:cloud-controller-manager" },
                    "subjects": subject,
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let token = Api::<ServiceAccount>::namespaced(client, "kube-system")
            .create_token_request(
                &name,
                &post,
                &serde_json::from_value(json!({ "spec": { "expirationSeconds": 600 } })).unwrap(),
            )
            .await
            .unwrap()
            .status
            .and_then(|s| s.token)
            .unwrap();
        // The manager's kubeconfig with this identity's token in place of the manager's.
        let ccm = control_plane().ccm_kubeconfig();
        let text = std::fs::read_to_string(&ccm)
            .unwrap()
            .replace(&kubeconfig_token(&ccm), &token);
        let kubeconfig = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(kubeconfig.path(), text).unwrap();
        Self { name, kubeconfig }
    }
}

impl Drop for ReducedIdentity {
    fn drop(&mut self) {
        for object in [
            format!("clusterrolebinding/{}", self.name),
            format!("rolebinding/{}", self.name),
            format!("role/{}", self.name),
            format!("serviceaccount/{}", self.name),
        ] {
            let _ = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(control_plane().admin_kubeconfig())
                .args([
                    "-n",
                    "kube-system",
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                ])
                .arg(object)
                .output();
        }
    }
}

#[tokio::test]
async fn without_the_right_to_request_tokens_the_manager_stops_at_start_naming_the_rule() {
    let _serial = SERIAL.lock().await;
    let identity = ReducedIdentity::create().await;
    let started = std::time::Instant::now();
    let output = tokio::task::spawn_blocking({
        let kubeconfig = identity.kubeconfig.path().to_owned();
        move || {
            Command::new(BIN)
                .arg("--cloud-provider=fake")
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args([
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--controllers=service",
                    "--use-service-account-credentials",
                ])
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        error.starts_with(
            "error: --use-service-account-credentials: cannot get a token for kube-system/service-controller: "
        ),
        "{error}"
    );
    assert!(
        error.contains(&format!(
            r#"User "system:serviceaccount:kube-system:{}" cannot create resource "serviceaccounts/token""#,
            identity.name
        )),
        "{error}"
    );
    assert!(
        error.ends_with(
            "(403 Forbidden); the manager's identity needs create on serviceaccounts/token (deploy/components/service-account-credentials)"
        ),
        "{error}"
    );
    assert!(
        !stderr.contains("starting controller"),
        "a controller started: {stderr}"
    );
}

/// Runs a manager in this process until it fails at start; its error.
async fn start_error(args: &[&str]) -> String {
    test_control_plane::apply_shipped_rbac().await;
    let cloud = cloud_provider_fake::FakeCloud::from_yaml("").unwrap();
    let mut registry = cloud_provider::Registry::new();
    registry
        .register("fake", move |_| Ok(std::sync::Arc::new(cloud.clone()) as _))
        .unwrap();
    let kubeconfig = format!(
        "--kubeconfig={}",
        control_plane().ccm_kubeconfig().display()
    );
    let mut argv = vec![
        "cloud-controller-manager",
        "--cloud-provider=fake",
        &kubeconfig,
        "--leader-elect=false",
        "--secure-port=0",
    ];
    argv.extend_from_slice(args);
    let options = <cloud_controller_manager::Options as clap::Parser>::try_parse_from(argv)
        .expect("valid flags");
    let manager = cloud_controller_manager::Manager::with_registry(registry);
    tokio::time::timeout(
        WAIT,
        manager.run(options, tokio_util::sync::CancellationToken::new()),
    )
    .await
    .expect("the manager stops at start")
    .expect_err("the manager fails at start")
    .to_string()
}

#[tokio::test]
async fn shadow_mode_requests_tokens_but_creates_no_service_account() {
    let _serial = SERIAL.lock().await;
    audit_policy_logs_service_accounts();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin().await, "kube-system");
    let _ = accounts
        .delete("service-controller", &DeleteParams::default())
        .await;
    let since = Timestamp::now();
    // Missing, and shadow mode creates nothing: a clear stop at start.
    let err = start_error(&[
        "--dry-run",
        "--use-service-account-credentials",
        "--controllers=service",
    ])
    .await;
    assert_eq!(
        err,
        "--use-service-account-credentials: the ServiceAccount kube-system/service-controller does not exist, and --dry-run (shadow mode) creates nothing; create it (kubectl -n kube-system create serviceaccount service-controller) or run the shadow without --use-service-account-credentials"
    );
    assert!(
        accounts
            .get_opt("service-controller")
            .await
            .unwrap()
            .is_none()
    );

    // Created by someone else (the incumbent): the shadow's dry runs are made as the ServiceAccount,
    // with a token requested for real.
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "service-controller" } }))
                .unwrap(),
        )
        .await
        .unwrap();
    let namespace = unique_name("sa-shadow");
    create_namespace(&namespace).await;
    let manager = RunningManager::start(
        "",
        &[
            "--dry-run",
            "--use-service-account-credentials",
            "--controllers=service",
        ],
    )
    .await;
    let api = services(&namespace).await;
    api.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .expect("service created");
    let writes = eventually("the shadow's dry-run status write", WAIT, || async {
        let writes = audited_writes_since(since);
        writes
            .iter()
            .any(|w| w.namespace == namespace && w.resource == "services/status")
            .then_some(writes)
    })
    .await;
    let service_writes: Vec<&Write> = writes
        .iter()
        .filter(|w| w.namespace == namespace && w.resource.starts_with("services"))
        .collect();
    assert!(
        service_writes
            .iter()
            .all(|w| w.dry_run && w.user == SERVICE_CONTROLLER),
        "{service_writes:?}"
    );
    let mine: Vec<&Write> = writes.iter().filter(|w| w.user == MANAGER).collect();
    assert!(
        mine.iter().any(|w| w.resource == "serviceaccounts/token"
            && w.name == "service-controller"
            && !w.dry_run),
        "{mine:?}"
    );
    assert!(
        !mine.iter().any(|w| w.resource == "serviceaccounts"),
        "shadow mode created a ServiceAccount: {mine:?}"
    );
    assert!(
        api.get("web").await.unwrap().metadata.finalizers.is_none(),
        "nothing stored"
    );
    api.delete("web", &DeleteParams::default()).await.unwrap();
    manager.stop().await;
}
