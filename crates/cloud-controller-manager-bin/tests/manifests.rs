//! The kustomize base and overlays (`deploy/base`, `deploy/overlays/*`): each renders offline with
//! `kubectl kustomize`, passes a server-side dry run on the test control plane, then applies for real;
//! its permissions are exactly `deploy/rbac.yaml` (the role every controller test runs under), and it
//! changes the base's Deployment only as the overlay says. The Deployment's PodDisruptionBudget comes
//! with it and goes with the DaemonSet form; every workload has memory requests and limits.

mod support;

use std::{
    io::Write,
    process::{Command, Stdio},
};

use serde_json::{Value, json};
use support::SERIAL;
use test_control_plane::{control_plane, workspace_root};

const CONTAINER: &str = "cloud-controller-manager";
const CLOUD_CONFIG_FLAG: &str = "--cloud-config=/etc/cloud/cloud-config";

/// Runs kubectl, feeding it `stdin`; panics with its stderr when it fails.
fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Offline: nothing but the files and the test control plane.
        .env_remove("KUBECONFIG")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run kubectl: {err}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "kubectl {}: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// kubectl as cluster-admin on the test control plane.
fn kubectl_admin(args: &[&str], stdin: Option<&str>) -> String {
    let kubeconfig = control_plane().admin_kubeconfig();
    let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
    all.extend_from_slice(args);
    kubectl(&all, stdin)
}

fn parse(yaml: &str, what: &str) -> Vec<Value> {
    let documents: Vec<Option<Value>> =
        serde_saphyr::from_multiple(yaml).unwrap_or_else(|err| panic!("{what}: {err}"));
    documents.into_iter().flatten().collect()
}

fn render(dir: &str) -> (String, Vec<Value>) {
    let path = workspace_root().join(dir);
    let yaml = kubectl(&["kustomize", path.to_str().unwrap()], None);
    let objects = parse(&yaml, &format!("kubectl kustomize {dir}"));
    (yaml, objects)
}

fn is_rbac(object: &Value) -> bool {
    object["kind"] == "ServiceAccount"
        || object["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("rbac.authorization.k8s.io/"))
}

fn key(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// The objects that give the manager an identity or permissions, whole, in a stable order.
fn rbac_objects(objects: &[Value]) -> Vec<Value> {
    let mut rbac: Vec<Value> = objects.iter().filter(|o| is_rbac(o)).cloned().collect();
    rbac.sort_by_key(key);
    rbac
}

fn shipped_rbac() -> Vec<Value> {
    let path = workspace_root().join("deploy/rbac.yaml");
    let objects = parse(&std::fs::read_to_string(&path).unwrap(), "deploy/rbac.yaml");
    assert!(objects.iter().all(is_rbac), "deploy/rbac.yaml: {objects:?}");
    rbac_objects(&objects)
}

/// The one object of `kind` (for ConfigMaps: the cloud-config, not the `local` cloud's ConfigMap of
/// kept addresses).
fn the<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] != "local-retained-addresses")
        .collect();
    assert_eq!(found.len(), 1, "one {kind}: {found:?}");
    found[0]
}

fn container(deployment: &mut Value) -> &mut Value {
    let containers = deployment
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        .unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0]["name"], CONTAINER);
    &mut containers[0]
}

fn args(deployment: &Value) -> Vec<String> {
    let mut deployment = deployment.clone();
    serde_json::from_value(container(&mut deployment)["args"].clone()).unwrap()
}

/// Takes the cloud-config the overlay adds (flag, mount, volume, ConfigMap) off `deployment` after
/// checking it, and returns the ConfigMap's file.
fn take_cloud_config(deployment: &mut Value, objects: &[Value]) -> String {
    let container = container(deployment);
    let args = container["args"].as_array_mut().unwrap();
    assert_eq!(
        args.iter().filter(|a| *a == CLOUD_CONFIG_FLAG).count(),
        1,
        "{args:?}"
    );
    assert_eq!(
        args.iter()
            .filter(|a| a.as_str().unwrap().starts_with("--cloud-config"))
            .count(),
        1,
        "{args:?}"
    );
    args.retain(|a| a != CLOUD_CONFIG_FLAG);
    let mounts = container
        .as_object_mut()
        .unwrap()
        .remove("volumeMounts")
        .unwrap();
    assert_eq!(
        mounts,
        json!([{ "name": "cloud-config", "mountPath": "/etc/cloud", "readOnly": true }])
    );
    let volumes = deployment
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
        .unwrap()
        .remove("volumes")
        .unwrap();
    let volumes = volumes.as_array().unwrap();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0]["name"], "cloud-config");
    let config_map = volumes[0]["configMap"]["name"].as_str().unwrap();
    // The cloud-config; for `local` also the (empty) ConfigMap of the addresses kept for Services that
    // went (deploy/components/local-pools/retained-addresses.yaml).
    let config_maps: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] != "local-retained-addresses")
        .collect();
    assert_eq!(config_maps.len(), 1, "{config_maps:?}");
    assert_eq!(config_maps[0]["metadata"]["name"], config_map);
    assert_eq!(config_maps[0]["metadata"]["namespace"], "kube-system");
    let data = config_maps[0]["data"].as_object().unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["cloud-config"],
        "the ConfigMap's keys"
    );
    data["cloud-config"].as_str().unwrap().to_owned()
}

/// Deletes what an apply created besides the shared RBAC (which every test applies, unchanged): the
/// Deployment, its PodDisruptionBudget and the ConfigMaps. Runs on drop, so a failed check cleans up
/// too.
struct Applied(Vec<Value>);

impl Drop for Applied {
    fn drop(&mut self) {
        for object in self.0.iter().filter(|o| {
            o["kind"] == "Deployment"
                || o["kind"] == "ConfigMap"
                || o["kind"] == "PodDisruptionBudget"
        }) {
            let (kind, namespace, name) = key(object);
            let output = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(control_plane().admin_kubeconfig())
                .args(["delete", "--ignore-not-found", "--wait=false", "-n"])
                .arg(&namespace)
                .arg(format!("{}/{name}", kind.to_lowercase()))
                .output()
                .unwrap();
            if !output.status.success() && !std::thread::panicking() {
                panic!(
                    "deleting {kind} {namespace}/{name}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
    }
}

/// The RBAC objects of `deploy/components/local-pools` (the manager's right to write LocalPools),
/// which every `local` overlay includes.
fn local_pools_rbac() -> Vec<Value> {
    let path = workspace_root().join("deploy/components/local-pools/rbac.yaml");
    rbac_objects(&parse(
        &std::fs::read_to_string(path).unwrap(),
        "the local-pools component",
    ))
}

/// Renders `dir`, applies it (server-side dry run, then for real), checks its kinds and permissions,
/// and returns its objects and its Deployment; what it created is deleted when the guard drops.
fn render_and_apply(dir: &str) -> (Applied, Vec<Value>, Value) {
    let (yaml, objects) = render(dir);
    let local = dir.starts_with("deploy/overlays/local");
    // Only the manager's identity, its permissions, its Deployment with its PodDisruptionBudget, and
    // its cloud-config; for `local`, the LocalPool CRD too (deploy/components/local-pools).
    for object in &objects {
        assert!(
            is_rbac(object)
                || (object["apiVersion"] == "apps/v1" && object["kind"] == "Deployment")
                || (object["apiVersion"] == "policy/v1" && object["kind"] == "PodDisruptionBudget")
                || (object["apiVersion"] == "v1" && object["kind"] == "ConfigMap")
                || (local
                    && object["kind"] == "CustomResourceDefinition"
                    && object["metadata"]["name"] == "localpools.local.ccm.rs"),
            "{dir} renders an unexpected object: {:?}",
            key(object)
        );
    }
    // Exactly deploy/rbac.yaml (and, for `local`, the local-pools component's): the same objects,
    // names, rules, role references and subjects, nothing added, removed or widened.
    let mut expected = shipped_rbac();
    if local {
        expected.extend(local_pools_rbac());
        expected.sort_by_key(key);
    }
    let mut rendered = rbac_objects(&objects);
    rendered.sort_by_key(key);
    assert_eq!(
        rendered, expected,
        "{dir}: the RBAC objects differ from deploy/rbac.yaml"
    );

    let apply = [
        "apply",
        "--server-side",
        "--field-manager=test-control-plane",
        "-f",
        "-",
    ];
    let dry_run = kubectl_admin(&[&apply[..], &["--dry-run=server"]].concat(), Some(&yaml));
    assert!(dry_run.contains("(server dry run)"), "{dry_run}");
    let guard = Applied(objects.clone());
    let applied = kubectl_admin(&apply, Some(&yaml));
    assert!(
        applied.contains("deployment.apps/cloud-controller-manager serverside-applied"),
        "{applied}"
    );

    // What the cluster now holds for the manager is what deploy/rbac.yaml says.
    for shipped in shipped_rbac() {
        let (kind, namespace, name) = key(&shipped);
        let mut get = vec!["get", "-o", "json", kind.as_str(), name.as_str()];
        if !namespace.is_empty() {
            get.extend(["-n", namespace.as_str()]);
        }
        let live: Value = serde_json::from_str(&kubectl_admin(&get, None)).unwrap();
        for field in ["rules", "roleRef", "subjects", "aggregationRule"] {
            assert_eq!(
                live.get(field),
                shipped.get(field),
                "{dir}: the cluster's {kind} {name} has other {field}"
            );
        }
    }
    let deployment = the(&objects, "Deployment").clone();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"], "cloud-controller-manager",
        "{dir}: the manager runs as another ServiceAccount"
    );
    // The base's PodDisruptionBudget, unchanged, selecting the Deployment's pods.
    assert_eq!(
        the(&objects, "PodDisruptionBudget"),
        &shipped_pod_disruption_budget(),
        "{dir}: the PodDisruptionBudget"
    );
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        shipped_pod_disruption_budget()["spec"]["selector"]["matchLabels"]
    );
    assert!(
        applied.contains("poddisruptionbudget.policy/cloud-controller-manager serverside-applied"),
        "{applied}"
    );
    (guard, objects, deployment)
}

/// The base's PodDisruptionBudget, as `deploy/base/pod-disruption-budget.yaml` has it.
fn shipped_pod_disruption_budget() -> Value {
    let path = workspace_root().join("deploy/base/pod-disruption-budget.yaml");
    let objects = parse(
        &std::fs::read_to_string(&path).unwrap(),
        "deploy/base/pod-disruption-budget.yaml",
    );
    the(&objects, "PodDisruptionBudget").clone()
}

/// The base's Deployment, as `deploy/deployment.yaml` has it.
fn shipped_deployment() -> Value {
    let path = workspace_root().join("deploy/deployment.yaml");
    let objects = parse(
        &std::fs::read_to_string(&path).unwrap(),
        "deploy/deployment.yaml",
    );
    the(&objects, "Deployment").clone()
}

#[tokio::test]
async fn the_base_applies_and_is_the_shipped_files() {
    let _serial = SERIAL.lock().await;
    let (_applied, objects, deployment) = render_and_apply("deploy/base");
    assert_eq!(deployment, shipped_deployment());
    // The RBAC, the Deployment and its PodDisruptionBudget.
    assert_eq!(objects.len(), shipped_rbac().len() + 2, "{objects:?}");
    assert_eq!(
        shipped_pod_disruption_budget()["spec"],
        json!({
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": { "matchLabels": { "k8s-app": "cloud-controller-manager" } },
        })
    );
    // A provider that ships (not `fake`), with no cloud-config.
    let args = args(&deployment);
    assert_eq!(args[0], "--cloud-provider=local", "{args:?}");
    assert!(
        !args.iter().any(|a| a.starts_with("--cloud-config")),
        "{args:?}"
    );
    // deploy/rbac.yaml and deploy/deployment.yaml are the base's files, not copies that could drift.
    for file in ["rbac.yaml", "deployment.yaml"] {
        let top = std::fs::canonicalize(workspace_root().join("deploy").join(file)).unwrap();
        assert_eq!(
            top,
            std::fs::canonicalize(workspace_root().join("deploy/base").join(file)).unwrap()
        );
    }
}

#[tokio::test]
async fn the_local_overlay_applies_with_its_cloud_config_and_only_net_bind_service() {
    let _serial = SERIAL.lock().await;
    let (_applied, objects, mut deployment) = render_and_apply("deploy/overlays/local");
    let args = args(&deployment);
    assert_eq!(
        args.iter()
            .filter(|a| a.starts_with("--cloud-provider"))
            .collect::<Vec<_>>(),
        ["--cloud-provider=local"]
    );
    let cloud_config = take_cloud_config(&mut deployment, &objects);
    assert_eq!(
        the(&objects, "ConfigMap")["metadata"]["name"],
        "cloud-config",
        "no hash suffix: the local provider re-reads the file in place"
    );
    let file =
        std::fs::read_to_string(workspace_root().join("deploy/overlays/local/cloud-config.yaml"))
            .unwrap();
    assert_eq!(cloud_config, file);
    #[cfg(feature = "provider-local")]
    cloud_provider_local::Config::parse(
        &cloud_config,
        Some(std::path::Path::new("cloud-config.yaml")),
    )
    .unwrap_or_else(|err| panic!("the local overlay's cloud-config: {err}"));

    // Privileged ports: UID 0 with NET_BIND_SERVICE alone (a capability added to a non-root user is
    // dropped at execve), everything else as locked down as the base.
    let container = container(&mut deployment);
    let security = container["securityContext"].as_object_mut().unwrap();
    assert_eq!(security.remove("runAsUser"), Some(json!(0)));
    assert_eq!(
        security.insert("runAsNonRoot".into(), json!(true)),
        Some(json!(false))
    );
    let capabilities = security["capabilities"].as_object_mut().unwrap();
    assert_eq!(
        capabilities.remove("add"),
        Some(json!(["NET_BIND_SERVICE"]))
    );
    assert_eq!(capabilities["drop"], json!(["ALL"]));
    // Nothing else differs from the base.
    assert_eq!(deployment, shipped_deployment());
}

#[tokio::test]
async fn the_aws_overlay_applies_with_its_cloud_config_and_nothing_privileged() {
    let _serial = SERIAL.lock().await;
    let (_applied, objects, mut deployment) = render_and_apply("deploy/overlays/aws");
    let cloud_config = take_cloud_config(&mut deployment, &objects);
    assert!(
        the(&objects, "ConfigMap")["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("cloud-config-"),
        "a hash suffix: the aws provider reads its cloud-config at start, so a change rolls the pods"
    );
    let file =
        std::fs::read_to_string(workspace_root().join("deploy/overlays/aws/cloud.conf")).unwrap();
    assert_eq!(cloud_config, file);
    assert!(cloud_config.contains("[Global]"), "{cloud_config}");

    let container = container(&mut deployment);
    let args = container["args"].as_array_mut().unwrap();
    assert_eq!(args[0], "--cloud-provider=aws");
    assert_eq!(
        args.iter()
            .filter(|a| a.as_str().unwrap().starts_with("--cloud-provider"))
            .count(),
        1
    );
    args[0] = json!("--cloud-provider=local");
    // An image with the aws provider linked (the default binary links fake and local only).
    let image = container["image"].as_str().unwrap().to_owned();
    assert_eq!(
        image,
        "registry.example.com/cloud-controller-manager-aws:0.1.0"
    );
    container["image"] = json!("registry.example.com/cloud-controller-manager:0.1.0");
    // Nothing else differs from the base: the same non-root user, no capabilities, read-only root.
    assert_eq!(deployment, shipped_deployment());
}

#[tokio::test]
async fn the_daemonset_overlay_is_the_local_overlay_as_upstreams_daemonset() {
    let _serial = SERIAL.lock().await;
    let (_, local) = render("deploy/overlays/local");
    let (yaml, objects) = render("deploy/overlays/local-daemonset");
    // The same RBAC plus the token-requesting Role (its DaemonSet runs with
    // --use-service-account-credentials) and the same cloud-config, a DaemonSet instead of the
    // Deployment, nothing else.
    let component =
        workspace_root().join("deploy/components/service-account-credentials/rbac.yaml");
    let mut expected = shipped_rbac();
    expected.extend(rbac_objects(&parse(
        &std::fs::read_to_string(&component).unwrap(),
        "the service-account-credentials component",
    )));
    expected.extend(local_pools_rbac());
    let mut rendered = rbac_objects(&objects);
    rendered.sort_by_key(key);
    expected.sort_by_key(key);
    assert_eq!(
        rendered, expected,
        "deploy/overlays/local-daemonset: the RBAC objects differ from deploy/rbac.yaml and the \
         service-account-credentials component"
    );
    let kinds: Vec<String> = objects
        .iter()
        .filter(|o| !is_rbac(o))
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect();
    // No PodDisruptionBudget: components/daemonset deletes the Deployment's. The LocalPool CRD and the
    // kept addresses' ConfigMap, as in the local overlay.
    assert_eq!(
        kinds,
        [
            "CustomResourceDefinition",
            "ConfigMap",
            "ConfigMap",
            "DaemonSet"
        ],
        "{kinds:?}"
    );
    assert_eq!(the(&objects, "ConfigMap"), the(&local, "ConfigMap"));
    let copy = std::fs::read_to_string(
        workspace_root().join("deploy/overlays/local-daemonset/cloud-config.yaml"),
    )
    .unwrap();
    let original =
        std::fs::read_to_string(workspace_root().join("deploy/overlays/local/cloud-config.yaml"))
            .unwrap();
    assert_eq!(
        copy, original,
        "overlays/local-daemonset/cloud-config.yaml must stay a copy of overlays/local's"
    );

    // The pod is the Deployment's, but for what a DaemonSet changes: no anti-affinity (one pod per
    // node already), and upstream's example's two flags, before the cloud-config's.
    let mut daemonset = the(&objects, "DaemonSet").clone();
    let mut deployment = the(&local, "Deployment").clone();
    let args = container(&mut daemonset)["args"].as_array_mut().unwrap();
    let at = args
        .iter()
        .position(|a| a == CLOUD_CONFIG_FLAG)
        .expect("the cloud-config flag");
    assert_eq!(
        args.drain(at - 2..at).collect::<Vec<_>>(),
        [
            json!("--use-service-account-credentials=true"),
            json!("--allocate-node-cidrs=true")
        ]
    );
    let pod = deployment
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
        .unwrap();
    assert!(pod.remove("affinity").is_some());
    assert_eq!(
        daemonset["spec"]["template"], deployment["spec"]["template"],
        "the DaemonSet's pod drifted from the Deployment's"
    );
    assert_eq!(
        daemonset["spec"]["selector"],
        deployment["spec"]["selector"]
    );
    assert_eq!(daemonset["metadata"], deployment["metadata"]);

    // The API server takes it.
    let dry_run = kubectl_admin(
        &[
            "apply",
            "--server-side",
            "--field-manager=test-control-plane",
            "--dry-run=server",
            "-f",
            "-",
        ],
        Some(&yaml),
    );
    assert!(
        dry_run.contains(
            "daemonset.apps/cloud-controller-manager serverside-applied (server dry run)"
        ),
        "{dry_run}"
    );
}

/// Memory requests and limits from measured figures (docs/deploy.md, "Memory"), the same in every form
/// of a workload; no CPU limit (throttling would delay Lease renewals, heartbeats and the data plane).
#[test]
fn every_workload_has_memory_requests_and_limits_and_no_cpu_limit() {
    let manager = json!({
        "requests": { "cpu": "100m", "memory": "100Mi" },
        "limits": { "memory": "512Mi" },
    });
    let agent = json!({
        "requests": { "cpu": "50m", "memory": "64Mi" },
        "limits": { "memory": "512Mi" },
    });
    for (dir, kind, name, expected) in [
        ("deploy/base", "Deployment", CONTAINER, &manager),
        ("deploy/overlays/local", "Deployment", CONTAINER, &manager),
        ("deploy/overlays/aws", "Deployment", CONTAINER, &manager),
        (
            "deploy/overlays/local-daemonset",
            "DaemonSet",
            CONTAINER,
            &manager,
        ),
        (
            "deploy/overlays/local-agents",
            "Deployment",
            CONTAINER,
            &manager,
        ),
        (
            "deploy/overlays/local-agents",
            "DaemonSet",
            "local-agent",
            &agent,
        ),
    ] {
        let (_, objects) = render(dir);
        let workload = objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{dir}: no {kind} {name}"));
        let containers = workload["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1, "{dir} {kind}");
        assert_eq!(
            &containers[0]["resources"], expected,
            "{dir} {kind} {name}: resources"
        );
    }
    // Each number's source is named beside it.
    for file in [
        "deploy/base/deployment.yaml",
        "deploy/components/daemonset/daemonset.yaml",
        "deploy/components/local-agents/agents.yaml",
    ] {
        let text = std::fs::read_to_string(workspace_root().join(file)).unwrap();
        for source in ["bench/results/2026-11-28.md", "docs/real-cluster.md"] {
            assert!(text.contains(source), "{file} does not name {source}");
        }
    }
}
