//! The Helm chart (`deploy/helm/cloud-controller-manager`): with default values it renders exactly the
//! objects of `kubectl kustomize deploy/overlays/local-agents` (agents mode, the manager unprivileged),
//! with `loadBalancerMode=leader` and `privilegedPorts=true` exactly those of `deploy/overlays/local`,
//! and with `kind=DaemonSet` as well exactly those of `deploy/overlays/local-daemonset`; its RBAC, the
//! agents' objects, the PodDisruptionBudget and the default cloud-configs are the kustomize files
//! themselves (symbolic links), also in a packaged chart; `helm lint --strict` passes; values that do
//! not apply, and capabilities no workload needs, are refused with a clear message; each override
//! changes what it says and nothing else; the render passes a server-side dry run on the test control
//! plane.
//!
//! helm is built from its Go module on first use by `hack/helm` (cached under `~/.cache/ccm-rs/helm`).

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::{Value, json};
use test_control_plane::{control_plane, workspace_root};

const CHART: &str = "deploy/helm/cloud-controller-manager";
const CONTAINER: &str = "cloud-controller-manager";
const AGENT: &str = "local-agent";

/// The values that render `deploy/overlays/local`: leader mode, with privileged ports.
const LEADER: [&str; 4] = [
    "--set",
    "loadBalancerMode=leader",
    "--set",
    "privilegedPorts=true",
];

/// The values that render `deploy/overlays/local-daemonset`.
const LEADER_DAEMONSET: [&str; 6] = [
    "--set",
    "loadBalancerMode=leader",
    "--set",
    "privilegedPorts=true",
    "--set",
    "kind=DaemonSet",
];

/// Each overlay the chart renders exactly, with the values that render it.
const OVERLAYS: [(&[&str], &str); 3] = [
    (&[], "deploy/overlays/local-agents"),
    (&LEADER, "deploy/overlays/local"),
    (&LEADER_DAEMONSET, "deploy/overlays/local-daemonset"),
];

fn chart() -> PathBuf {
    workspace_root().join(CHART)
}

/// Runs a command offline (no kubeconfig, proxy or helm namespace from the environment), feeding it
/// `stdin`.
fn run(program: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("KUBECONFIG")
        .env_remove("HELM_NAMESPACE")
        .env_remove("HELM_KUBECONTEXT")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", program.display()));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs `program args`, panicking with its stderr when it fails; returns its stdout.
fn succeed(program: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let output = run(program, args, stdin);
    assert!(
        output.status.success(),
        "{} {}: {}\n{}",
        program.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// helm, through `hack/helm` (which builds it on first use).
fn helm(args: &[&str]) -> Output {
    run(&workspace_root().join("hack/helm"), args, None)
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    succeed(Path::new("kubectl"), args, stdin)
}

fn parse(yaml: &str, what: &str) -> Vec<Value> {
    let documents: Vec<Option<Value>> =
        serde_saphyr::from_multiple(yaml).unwrap_or_else(|err| panic!("{what}: {err}"));
    let mut objects: Vec<Value> = documents.into_iter().flatten().collect();
    objects.sort_by_key(key);
    objects
}

fn key(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// `kubectl kustomize DIR`, sorted by (kind, namespace, name).
fn kustomize(dir: &str) -> Vec<Value> {
    let path = workspace_root().join(dir);
    let yaml = kubectl(&["kustomize", path.to_str().unwrap()], None);
    parse(&yaml, &format!("kubectl kustomize {dir}"))
}

/// `helm template` of `chart` (the chart directory or a packaged chart) with `values`, as YAML.
fn template_yaml(chart: &Path, values: &[&str]) -> String {
    let mut args = vec!["template", "ccm", chart.to_str().unwrap()];
    args.extend_from_slice(values);
    let output = helm(&args);
    assert!(
        output.status.success(),
        "helm {}: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The chart's objects for `values`, sorted by (kind, namespace, name).
fn template(values: &[&str]) -> Vec<Value> {
    parse(
        &template_yaml(&chart(), values),
        &format!("helm template {}", values.join(" ")),
    )
}

/// The message of a render that must fail.
fn refused(values: &[&str]) -> String {
    let mut args = vec!["template", "ccm", CHART];
    args.extend_from_slice(values);
    let output = helm(&args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "helm {} succeeded; it must fail:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

/// A line diff of two texts (`-` expected, `+` actual) with three lines of context.
fn diff(expected: &str, actual: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    // Longest common subsequence, from the ends.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            lines.push(('-', a[i]));
            i += 1;
        } else {
            lines.push(('+', b[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        lines[k.saturating_sub(3)..(k + 4).min(lines.len())]
            .iter()
            .any(|(tag, _)| *tag != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (tag, line)) in lines.iter().enumerate() {
        if near_change(k) {
            out.push_str(&format!("{tag} {line}\n"));
            skipped = false;
        } else if !skipped {
            out.push_str("  ...\n");
            skipped = true;
        }
    }
    out
}

/// Asserts `actual == expected` (both sorted by [`key`]), showing on failure a line diff of the JSON
/// of each object that differs, and the objects only one side has.
fn assert_same(actual: &[Value], expected: &[Value], what: &str) {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap();
    let name = |v: &Value| {
        let (kind, namespace, name) = key(v);
        format!("{kind} {namespace}/{name}")
    };
    let explain = || {
        let mut out = String::new();
        for object in expected {
            match actual.iter().find(|a| key(a) == key(object)) {
                None => out.push_str(&format!("missing: {}\n", name(object))),
                Some(a) if a != object => out.push_str(&format!(
                    "{} (- expected, + actual):\n{}",
                    name(object),
                    diff(&pretty(object), &pretty(a))
                )),
                Some(_) => {}
            }
        }
        for object in actual {
            if !expected.iter().any(|e| key(e) == key(object)) {
                out.push_str(&format!(
                    "unexpected: {}\n{}\n",
                    name(object),
                    pretty(object)
                ));
            }
        }
        out
    };
    // Not assert_eq!: its Debug dump of every object would bury the diff.
    assert!(actual == expected, "{what}:\n{}", explain());
}

/// The objects of `deploy/components/service-account-credentials` (the chart renders them with
/// `useServiceAccountCredentials`).
fn service_account_credentials_rbac() -> Vec<Value> {
    let path = chart().join("files/service-account-credentials.yaml");
    parse(
        &std::fs::read_to_string(&path).unwrap(),
        "the service-account-credentials component",
    )
}

/// The workload (a Deployment or a DaemonSet) named `name` among `objects`: the one.
fn workload_named<'a>(objects: &'a mut [Value], name: &str) -> &'a mut Value {
    let mut found = objects.iter_mut().filter(|o| {
        (o["kind"] == "Deployment" || o["kind"] == "DaemonSet") && o["metadata"]["name"] == name
    });
    let workload = found
        .next()
        .unwrap_or_else(|| panic!("no Deployment or DaemonSet {name}"));
    assert!(found.next().is_none(), "more than one workload {name}");
    workload
}

/// The manager's Deployment or DaemonSet.
fn workload(objects: &mut [Value]) -> &mut Value {
    workload_named(objects, CONTAINER)
}

/// The one container of the workload `name`, which has the same name.
fn only_container<'a>(objects: &'a mut [Value], name: &str) -> &'a mut Value {
    let containers = workload_named(objects, name)
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        .unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0]["name"], name);
    &mut containers[0]
}

/// The manager's container.
fn container(objects: &mut [Value]) -> &mut Value {
    only_container(objects, CONTAINER)
}

/// The node agents' container (agents mode).
fn agent(objects: &mut [Value]) -> &mut Value {
    only_container(objects, AGENT)
}

/// Removes the objects of `kind` from `objects`.
fn remove_kind(objects: &mut Vec<Value>, kind: &str) {
    objects.retain(|o| o["kind"] != kind);
}

fn args(objects: &mut [Value]) -> &mut Vec<Value> {
    container(objects)["args"].as_array_mut().unwrap()
}

/// Asserts that rendering with `values` gives the render with `base` values changed by `change`,
/// and nothing else.
fn assert_override(base: &[&str], values: &[&str], change: impl FnOnce(&mut Vec<Value>)) {
    let mut expected = template(base);
    change(&mut expected);
    let all = [base, values].concat();
    assert_same(
        &template(&all),
        &expected,
        &format!("helm template {}", all.join(" ")),
    );
}

#[test]
fn the_chart_is_the_crate_version_and_its_rbac_and_cloud_config_are_the_kustomize_files() {
    let chart_yaml: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["name"], "cloud-controller-manager");
    assert_eq!(chart_yaml["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"));
    // Relative symbolic links into deploy/, so the chart cannot drift from the kustomize files.
    for (link, target) in [
        ("templates/rbac.yaml", "../../../base/rbac.yaml"),
        (
            "files/cloud-config.yaml",
            "../../../overlays/local/cloud-config.yaml",
        ),
        (
            "files/cloud-config-agents.yaml",
            "../../../overlays/local-agents/cloud-config.yaml",
        ),
        (
            "files/pod-disruption-budget.yaml",
            "../../../base/pod-disruption-budget.yaml",
        ),
        (
            "files/service-account-credentials.yaml",
            "../../../components/service-account-credentials/rbac.yaml",
        ),
        (
            "files/local-agents.yaml",
            "../../../components/local-agents/agents.yaml",
        ),
        (
            "files/local-agents-heartbeat-policy.yaml",
            "../../../components/local-agents/heartbeat-policy.yaml",
        ),
        (
            "files/local-agents-manager-rbac.yaml",
            "../../../components/local-agents/manager-rbac.yaml",
        ),
        (
            "files/local-agents-metallb-rbac.yaml",
            "../../../components/local-agents/metallb-rbac.yaml",
        ),
        (
            "files/local-pools-crd.yaml",
            "../../../components/local-pools/localpools-crd.yaml",
        ),
        (
            "files/local-pools-rbac.yaml",
            "../../../components/local-pools/rbac.yaml",
        ),
        (
            "files/local-retained-addresses.yaml",
            "../../../components/local-pools/retained-addresses.yaml",
        ),
    ] {
        let path = chart().join(link);
        assert_eq!(
            std::fs::read_link(&path)
                .unwrap_or_else(|err| panic!("{link} is not a symbolic link: {err}")),
            Path::new(target),
            "{link}"
        );
        assert_eq!(
            std::fs::canonicalize(&path).unwrap(),
            std::fs::canonicalize(chart().join(link).parent().unwrap().join(target)).unwrap()
        );
    }
}

#[test]
fn helm_lint_strict_passes_for_every_overlays_values() {
    for (values, _) in OVERLAYS {
        let mut args = vec!["lint", "--strict", CHART];
        args.extend_from_slice(values);
        let output = helm(&args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "helm {}: {}\n{stdout}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("0 chart(s) failed"), "{stdout}");
        // The symbolic links were followed (helm says so on stderr).
        let stderr = String::from_utf8_lossy(&output.stderr);
        for link in [
            "templates/rbac.yaml",
            "files/cloud-config.yaml",
            "files/local-agents.yaml",
        ] {
            assert!(stderr.contains(&format!("{link} resolves to")), "{stderr}");
        }
    }
}

#[test]
fn default_values_render_exactly_the_local_agents_overlay() {
    let objects = template(&[]);
    assert_same(
        &objects,
        &kustomize("deploy/overlays/local-agents"),
        "helm template (default values) vs kubectl kustomize deploy/overlays/local-agents",
    );
    // Agents mode is the default: the manager binds nothing and runs as the base does, non-root with no
    // capability; the agents carry the traffic.
    let mut objects = objects;
    let security = container(&mut objects)["securityContext"].clone();
    assert_eq!(
        security,
        json!({
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"] },
        })
    );
    assert_eq!(
        agent(&mut objects)["securityContext"]["capabilities"]["add"],
        json!(["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE"])
    );
}

#[test]
fn leader_mode_with_privileged_ports_renders_exactly_the_local_overlay() {
    assert_same(
        &template(&LEADER),
        &kustomize("deploy/overlays/local"),
        "helm template --set loadBalancerMode=leader --set privilegedPorts=true vs kubectl kustomize \
         deploy/overlays/local",
    );
}

#[test]
fn leader_mode_as_a_daemonset_renders_exactly_the_local_daemonset_overlay() {
    assert_same(
        &template(&LEADER_DAEMONSET),
        &kustomize("deploy/overlays/local-daemonset"),
        "helm template --set loadBalancerMode=leader --set privilegedPorts=true --set kind=DaemonSet vs \
         kubectl kustomize deploy/overlays/local-daemonset",
    );
}

#[test]
fn a_packaged_chart_holds_the_linked_files_and_renders_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let output = helm(&["package", CHART, "-d", dir.path().to_str().unwrap()]);
    assert!(
        output.status.success(),
        "helm package: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let package = dir.path().join("cloud-controller-manager-0.1.0.tgz");
    assert!(
        package.is_file(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    for (values, overlay) in OVERLAYS {
        assert_same(
            &parse(&template_yaml(&package, values), "helm template PACKAGE"),
            &kustomize(overlay),
            &format!("the packaged chart {} vs {overlay}", values.join(" ")),
        );
    }
}

#[test]
fn values_that_do_not_apply_are_refused_with_a_clear_message() {
    // An unknown kind: refused by values.schema.json, and by the template when the schema is skipped.
    let message = refused(&["--set", "kind=StatefulSet"]);
    assert!(
        message.contains("at '/kind': value must be one of 'Deployment', 'DaemonSet'"),
        "{message}"
    );
    let message = refused(&["--skip-schema-validation", "--set", "kind=StatefulSet"]);
    assert!(
        message.contains("kind must be Deployment or DaemonSet, not StatefulSet"),
        "{message}"
    );
    // replicas with a DaemonSet, even 0.
    for replicas in ["replicas=3", "replicas=0"] {
        let message = refused(&["--set", "kind=DaemonSet", "--set", replicas]);
        assert!(
            message.contains("applies to kind Deployment only"),
            "{message}"
        );
    }
    // Unknown keys, at the top and nested, and wrong types.
    let message = refused(&["--set", "replica=3"]);
    assert!(
        message.contains("at '': additional properties 'replica' not allowed"),
        "{message}"
    );
    let message = refused(&["--set", "image.name=x"]);
    assert!(
        message.contains("at '/image': additional properties 'name' not allowed"),
        "{message}"
    );
    let message = refused(&["--set", "privilegedPorts=yes"]);
    assert!(
        message.contains("at '/privilegedPorts': got string, want boolean"),
        "{message}"
    );
    let message = refused(&["--set", "image.pullPolicy=Sometimes"]);
    assert!(message.contains("at '/image/pullPolicy'"), "{message}");
    // An unknown mode: refused by the schema, and by the template when the schema is skipped.
    let message = refused(&["--set", "loadBalancerMode=bgp"]);
    assert!(
        message.contains("at '/loadBalancerMode': value must be one of 'agents', 'leader'"),
        "{message}"
    );
    let message = refused(&["--skip-schema-validation", "--set", "loadBalancerMode=bgp"]);
    assert!(
        message.contains("loadBalancerMode must be agents (the node agents announce and serve the VIPs) or leader (the leading manager does), not bgp"),
        "{message}"
    );
    // A capability no workload needs: only NET_BIND_SERVICE, NET_ADMIN and NET_RAW, by the schema and by
    // the template.
    for capability in ["SYS_ADMIN", "NET_BROADCAST", "ALL"] {
        let set = format!("capabilities.add={{NET_ADMIN,{capability}}}");
        let message = refused(&[&LEADER[..], &["--set", &set]].concat());
        assert!(
            message.contains(
                "at '/capabilities/add/1': value must be one of 'NET_ADMIN', 'NET_RAW', 'NET_BIND_SERVICE'"
            ),
            "{message}"
        );
        let message =
            refused(&[&["--skip-schema-validation"][..], &LEADER, &["--set", &set]].concat());
        assert!(
            message.contains(&format!(
                "capabilities.add: {capability} is not one the manager needs"
            )),
            "{message}"
        );
    }
    // Capabilities the kernel would drop (a non-root user's, at execve).
    let message = refused(&[
        "--set",
        "loadBalancerMode=leader",
        "--set",
        "capabilities.add={NET_ADMIN}",
    ]);
    assert!(
        message.contains("capabilities.add (NET_ADMIN) needs privilegedPorts=true"),
        "{message}"
    );
    // What only leader mode's manager needs, in agents mode (the default), and the agents' values in
    // leader mode.
    let message = refused(&["--set", "privilegedPorts=true"]);
    assert!(
        message.contains("privilegedPorts applies to loadBalancerMode=leader only: in agents mode the node agents bind the Services' ports"),
        "{message}"
    );
    let message = refused(&["--set", "capabilities.add={NET_ADMIN,NET_RAW}"]);
    assert!(
        message.contains(
            "capabilities.add (NET_ADMIN, NET_RAW) applies to loadBalancerMode=leader only"
        ),
        "{message}"
    );
    let message = refused(&[&LEADER[..], &["--set", "agents.args={--interface=bond0}"]].concat());
    assert!(
        message.contains("agents.args (--interface=bond0) applies to loadBalancerMode=agents only"),
        "{message}"
    );
    // A cloud-config whose mode is not the chart's, either way.
    let agents_config = workspace_root().join("deploy/overlays/local-agents/cloud-config.yaml");
    let leader_config = workspace_root().join("deploy/overlays/local/cloud-config.yaml");
    let message = refused(
        &[
            &LEADER[..],
            &[
                "--set-file",
                &format!("cloudConfig={}", agents_config.display()),
            ],
        ]
        .concat(),
    );
    assert!(
        message.contains("loadBalancerMode is leader but the cloud-config's loadBalancer.mode is agents: the manager and the agents run the cloud-config's mode"),
        "{message}"
    );
    let message = refused(&[
        "--set-file",
        &format!("cloudConfig={}", leader_config.display()),
    ]);
    assert!(
        message.contains("loadBalancerMode is agents but the cloud-config's loadBalancer.mode is leader (its default: the file sets no mode)"),
        "{message}"
    );
    // The agents' heartbeats in another namespace than the chart's agents and their policy.
    let message = refused(&[
        "--set-string",
        "cloudConfig=loadBalancer: {mode: agents\\, agentNamespace: lb}",
    ]);
    assert!(
        message.contains("the cloud-config's loadBalancer.agentNamespace is lb, but the chart runs the agents in kube-system"),
        "{message}"
    );
    let message = refused(&["--set-string", "cloudConfig=not a map"]);
    assert!(
        message.contains("cloudConfig is not a YAML map"),
        "{message}"
    );
    // The agents' flags the DaemonSet sets, and a class the manager does not serve.
    for (flag, reason) in [
        (
            "--node-name=node-1",
            "each agent takes its node's name from NODE_NAME",
        ),
        (
            "--membership-key-file=/key",
            "the agents read the Secret kube-system/local-agent-membership",
        ),
        (
            "--cloud-config=/x",
            "the agents read the manager's cloud-config",
        ),
        (
            "--handover-socket=/tmp/h.sock",
            "a rolling update hands over through the socket in the hostPath directory /run/local-agent",
        ),
        (
            "--namespace=default",
            "the agents' heartbeat Leases are in kube-system",
        ),
    ] {
        let message = refused(&["--set", &format!("agents.args={{{flag}}}")]);
        assert!(
            message.contains(&format!(
                "agents.args: {flag} sets a flag the chart owns: {reason}"
            )),
            "{message}"
        );
    }
    let message = refused(&[
        "--set",
        "args={--load-balancer-class,example.com/edge}",
        "--set",
        "agents.args={--load-balancer-class=example.com/core}",
    ]);
    assert!(
        message.contains("the manager's --load-balancer-class (example.com/edge, in args) and the agents' (example.com/core, in agents.args) differ"),
        "{message}"
    );
    let message = refused(&["--set", "args={--load-balancer-class=example.com/edge}"]);
    assert!(
        message
            .contains("(example.com/edge, in args) and the agents' (none, in agents.args) differ"),
        "{message}"
    );
    let message = refused(&["--set", "agents.resources.limit.memory=1Gi"]);
    assert!(
        message.contains("at '/agents/resources': additional properties 'limit' not allowed"),
        "{message}"
    );
    // A flag a value owns, in args.
    let message = refused(&["--set", "args={--cluster-cidr=10.0.0.0/8}"]);
    assert!(
        message.contains(
            "args: --cluster-cidr=10.0.0.0/8 sets a flag the chart owns: set the value clusterCIDR instead"
        ),
        "{message}"
    );
    let message = refused(&["--set", "args={--cloud-provider=aws}"]);
    assert!(
        message.contains("this chart runs the `local` provider only"),
        "{message}"
    );
    // Node IPAM without the pod network.
    let message = refused(&["--set", "kind=DaemonSet", "--set", "clusterCIDR="]);
    assert!(
        message.contains("allocateNodeCIDRs needs clusterCIDR"),
        "{message}"
    );
}

#[test]
fn image_args_and_cloud_config_overrides_change_only_their_fields() {
    assert_override(
        &[],
        &[
            "--set",
            "image.repository=ghcr.io/example/ccm",
            "--set",
            "image.tag=v9.9.9",
            "--set",
            "image.pullPolicy=Always",
        ],
        |objects| {
            // The manager's and the agents' (one image holds both binaries).
            for name in [CONTAINER, AGENT] {
                let container = only_container(objects, name);
                container["image"] = json!("ghcr.io/example/ccm:v9.9.9");
                container["imagePullPolicy"] = json!("Always");
            }
        },
    );
    // Extra arguments go after the chart's own, in order, in either mode and kind.
    for values in [
        &["--set", "kind=Deployment"][..],
        &["--set", "kind=DaemonSet"],
        &LEADER,
        &LEADER_DAEMONSET,
    ] {
        assert_override(
            values,
            &["--set", "args={--v=2,--concurrent-service-syncs=4}"],
            |objects| {
                let args = args(objects);
                assert_eq!(
                    args.last().unwrap(),
                    "--cloud-config=/etc/cloud/cloud-config"
                );
                args.extend([json!("--v=2"), json!("--concurrent-service-syncs=4")]);
            },
        );
    }
    // The cloud-config, from a file, in either mode (the file's mode is the chart's).
    for (values, cloud_config) in [
        (
            &[][..],
            "# mine\nunlistedNodes: ignore\nmachines:\n  node-a:\n    zone: rack-1\n\naddressPools:\n  - name: lan\n    addresses: [192.168.1.240/28]\nloadBalancer:\n  mode: agents\n",
        ),
        (
            &LEADER[..],
            "# mine\nunlistedNodes: ignore\nmachines:\n  node-a:\n    zone: rack-1\n\naddressPools:\n  - name: lan\n    addresses: [192.168.1.240/28]\n",
        ),
        (
            &LEADER[..],
            "addressPools:\n  - name: lan\n    addresses: [192.168.1.240/28]\nloadBalancer:\n  mode: leader\n  vipInterface: eth0\n",
        ),
    ] {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), cloud_config).unwrap();
        let set_file = format!("cloudConfig={}", file.path().display());
        assert_override(values, &["--set-file", &set_file], |objects| {
            let config_map = objects
                .iter_mut()
                .find(|o| o["kind"] == "ConfigMap")
                .unwrap();
            assert_eq!(config_map["metadata"]["name"], "cloud-config");
            config_map["data"] = json!({ "cloud-config": cloud_config });
        });
    }
}

#[test]
fn agents_overrides_change_only_the_agents_container() {
    // Arguments after the agents' own; a class both the manager and the agents serve.
    assert_override(
        &[],
        &[
            "--set",
            "agents.args={--interface=bond0,--load-balancer-class=example.com/edge}",
            "--set",
            "args={--load-balancer-class=example.com/edge}",
        ],
        |objects| {
            let args = agent(objects)["args"].as_array_mut().unwrap();
            assert_eq!(
                args.last().unwrap(),
                "--handover-socket=/run/local-agent/handover.sock"
            );
            args.extend([
                json!("--interface=bond0"),
                json!("--load-balancer-class=example.com/edge"),
            ]);
            self::args(objects).push(json!("--load-balancer-class=example.com/edge"));
        },
    );
    // Resources merge with the defaults.
    assert_override(
        &[],
        &[
            "--set",
            "agents.resources.limits.memory=1Gi",
            "--set",
            "agents.resources.requests.cpu=null",
        ],
        |objects| {
            agent(objects)["resources"] = json!({
                "requests": { "memory": "64Mi" },
                "limits": { "memory": "1Gi" },
            });
        },
    );
}

#[test]
fn the_pod_disruption_budget_is_for_a_deployment_of_two_replicas_or_more() {
    let shipped = parse(
        &std::fs::read_to_string(workspace_root().join("deploy/base/pod-disruption-budget.yaml"))
            .unwrap(),
        "deploy/base/pod-disruption-budget.yaml",
    );
    assert_eq!(shipped.len(), 1);
    assert_eq!(shipped[0]["spec"]["maxUnavailable"], 1);
    for (values, overlay) in OVERLAYS {
        let budgets: Vec<Value> = template(values)
            .into_iter()
            .filter(|o| o["kind"] == "PodDisruptionBudget")
            .collect();
        if overlay.ends_with("daemonset") {
            assert!(budgets.is_empty(), "{overlay}: {budgets:?}");
        } else {
            assert_eq!(budgets, shipped, "{overlay}");
        }
    }
    // Three replicas: still one at a time. One, or none: nothing to protect, and no drain held up.
    assert_override(&[], &["--set", "replicas=3"], |objects| {
        workload(objects)["spec"]["replicas"] = json!(3)
    });
    for replicas in ["replicas=1", "replicas=0"] {
        assert_override(&[], &["--set", replicas], |objects| {
            workload(objects)["spec"]["replicas"] = json!(replicas[9..].parse::<u32>().unwrap());
            remove_kind(objects, "PodDisruptionBudget");
        });
    }
    // A DaemonSet in agents mode: the manager's DaemonSet (leader mode's, unprivileged), no budget, the
    // agents unchanged, and the Role to request the controllers' tokens (the DaemonSet's default).
    let mut expected = template(&[]);
    expected.retain(|o| o["kind"] != "Deployment" && o["kind"] != "PodDisruptionBudget");
    let daemonset =
        template(&[&LEADER_DAEMONSET[..], &["--set", "privilegedPorts=false"]].concat())
            .into_iter()
            .find(|o| o["kind"] == "DaemonSet")
            .unwrap();
    expected.push(daemonset);
    expected.extend(service_account_credentials_rbac());
    expected.sort_by_key(key);
    assert_same(
        &template(&["--set", "kind=DaemonSet"]),
        &expected,
        "helm template --set kind=DaemonSet (agents mode)",
    );
}

#[test]
fn security_overrides_change_only_the_containers_security_context() {
    // In leader mode, privilegedPorts=false: the base's non-root container, exactly (as agents mode's
    // manager, default_values_render_exactly_the_local_agents_overlay).
    let base: Vec<Value> = parse(
        &std::fs::read_to_string(workspace_root().join("deploy/deployment.yaml")).unwrap(),
        "deploy/deployment.yaml",
    );
    let base_security =
        base[0]["spec"]["template"]["spec"]["containers"][0]["securityContext"].clone();
    assert_eq!(base_security["runAsNonRoot"], true, "{base_security}");
    for values in [&LEADER[..], &LEADER_DAEMONSET] {
        assert_override(values, &["--set", "privilegedPorts=false"], |objects| {
            container(objects)["securityContext"] = base_security.clone()
        });
    }
    let mut agents_mode = template(&[]);
    assert_eq!(
        container(&mut agents_mode)["securityContext"],
        base_security
    );
    // capabilities.add: after NET_BIND_SERVICE, which is not repeated; NET_ADMIN and NET_RAW for VIPs
    // on an interface.
    assert_override(
        &LEADER,
        &["--set", "capabilities.add={NET_ADMIN,NET_BIND_SERVICE}"],
        |objects| {
            container(objects)["securityContext"]["capabilities"]["add"] =
                json!(["NET_BIND_SERVICE", "NET_ADMIN"]);
        },
    );
    assert_override(
        &LEADER_DAEMONSET,
        &["--set", "capabilities.add={NET_ADMIN,NET_RAW}"],
        |objects| {
            container(objects)["securityContext"]["capabilities"]["add"] =
                json!(["NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW"]);
        },
    );
}

#[test]
fn kind_defaults_and_scheduling_overrides_change_only_their_fields() {
    let daemonset = ["--set", "kind=DaemonSet"];
    let cluster_cidr = json!("--cluster-cidr=10.244.0.0/16");
    let extra = [
        json!("--use-service-account-credentials=true"),
        json!("--allocate-node-cidrs=true"),
    ];
    // replicas: the_pod_disruption_budget_is_for_a_deployment_of_two_replicas_or_more.
    // The DaemonSet's two flags on a Deployment, in the DaemonSet's place; and off on a DaemonSet.
    assert_override(
        &[],
        &[
            "--set",
            "useServiceAccountCredentials=true",
            "--set",
            "allocateNodeCIDRs=true",
        ],
        |objects| {
            let args = args(objects);
            let at = args.iter().position(|a| *a == cluster_cidr).unwrap() + 1;
            args.splice(at..at, extra.clone());
            // With the flag, the Role that requests the controllers' tokens, and its binding.
            objects.extend(service_account_credentials_rbac());
            objects.sort_by_key(key);
        },
    );
    assert_override(
        &daemonset,
        &["--set", "useServiceAccountCredentials=false"],
        |objects| {
            args(objects).retain(|a| *a != extra[0]);
            let theirs: Vec<_> = service_account_credentials_rbac().iter().map(key).collect();
            objects.retain(|o| !theirs.contains(&key(o)));
        },
    );
    assert_override(
        &daemonset,
        &["--set", "allocateNodeCIDRs=false"],
        |objects| args(objects).retain(|a| *a != extra[1]),
    );
    // The pod network: replaced, or (without node IPAM) left out.
    assert_override(
        &daemonset,
        &["--set", "clusterCIDR=10.0.0.0/8"],
        |objects| {
            for arg in args(objects).iter_mut() {
                if *arg == cluster_cidr {
                    *arg = json!("--cluster-cidr=10.0.0.0/8");
                }
            }
        },
    );
    assert_override(&[], &["--set", "clusterCIDR="], |objects| {
        args(objects).retain(|a| *a != cluster_cidr)
    });
    // Scheduling: maps merge with the defaults (a key set to null is removed), lists replace them.
    let pod = |objects: &mut Vec<Value>| -> Value {
        workload(objects)
            .pointer("/spec/template/spec")
            .unwrap()
            .clone()
    };
    let set_pod = |objects: &mut Vec<Value>, spec: Value| {
        *workload(objects)
            .pointer_mut("/spec/template/spec")
            .unwrap() = spec;
    };
    assert_override(
        &daemonset,
        &["--set", "nodeSelector.kubernetes\\.io/os=linux"],
        |objects| {
            let mut spec = pod(objects);
            spec["nodeSelector"]["kubernetes.io/os"] = json!("linux");
            set_pod(objects, spec);
        },
    );
    assert_override(
        &[],
        &[
            "--set",
            "nodeSelector.node-role\\.kubernetes\\.io/control-plane=null",
        ],
        |objects| {
            let mut spec = pod(objects);
            spec.as_object_mut().unwrap().remove("nodeSelector");
            set_pod(objects, spec);
        },
    );
    assert_override(
        &[],
        &[
            "--set",
            "tolerations[0].operator=Exists",
            "--set",
            "tolerations[0].key=dedicated",
        ],
        |objects| {
            let mut spec = pod(objects);
            spec["tolerations"] = json!([{ "key": "dedicated", "operator": "Exists" }]);
            set_pod(objects, spec);
        },
    );
    assert_override(
        &[],
        &["--set", "priorityClassName=system-node-critical"],
        |objects| {
            let mut spec = pod(objects);
            spec["priorityClassName"] = json!("system-node-critical");
            set_pod(objects, spec);
        },
    );
    assert_override(&[], &["--set", "priorityClassName="], |objects| {
        let mut spec = pod(objects);
        spec.as_object_mut().unwrap().remove("priorityClassName");
        set_pod(objects, spec);
    });
    assert_override(
        &daemonset,
        &["--set", "resources.limits.memory=200Mi"],
        |objects| {
            container(objects)["resources"]["limits"] = json!({ "memory": "200Mi" });
        },
    );
}

#[test]
fn the_render_for_each_overlays_values_passes_a_server_side_dry_run() {
    let kubeconfig = control_plane().admin_kubeconfig();
    for (values, overlay) in OVERLAYS {
        let yaml = template_yaml(&chart(), values);
        let output = kubectl(
            &[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "apply",
                "--server-side",
                "--field-manager=helm-chart-test",
                "--dry-run=server",
                "-f",
                "-",
            ],
            Some(&yaml),
        );
        let mut objects = vec![
            "configmap/cloud-config",
            "clusterrole.rbac.authorization.k8s.io/system:cloud-controller-manager",
        ];
        match overlay {
            "deploy/overlays/local-agents" => objects.extend([
                "deployment.apps/cloud-controller-manager",
                "poddisruptionbudget.policy/cloud-controller-manager",
                "daemonset.apps/local-agent",
                "validatingadmissionpolicy.admissionregistration.k8s.io/local-agent-own-heartbeat",
                "role.rbac.authorization.k8s.io/system:cloud-controller-manager:local-agent-heartbeats",
            ]),
            "deploy/overlays/local" => objects.extend([
                "deployment.apps/cloud-controller-manager",
                "poddisruptionbudget.policy/cloud-controller-manager",
            ]),
            _ => objects.push("daemonset.apps/cloud-controller-manager"),
        }
        for object in objects {
            let line = format!("{object} serverside-applied (server dry run)");
            assert!(
                output.contains(&line),
                "{overlay}: {line} not in:\n{output}"
            );
        }
    }
}

#[test]
fn every_values_example_lints_strictly_and_renders() {
    let dir = workspace_root().join("deploy/helm/examples");
    let mut examples: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 4, "{examples:?}");
    for example in &examples {
        let file = example.to_str().unwrap();
        let output = helm(&["lint", "--strict", CHART, "-f", file]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("0 chart(s) failed"),
            "helm lint --strict -f {file}: {}\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let objects = template(&["-f", file]);
        assert!(
            objects
                .iter()
                .any(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet"),
            "{file}: no workload rendered"
        );
    }
}

/// The monitoring objects (all off by default) are deploy/monitoring/'s files as they are: the
/// PrometheusRule's groups those of alerts.yaml, each dashboard ConfigMap the dashboard's JSON; the
/// ServiceMonitors scrape the manager's secure port and the agents' bind address.
#[test]
fn monitoring_objects_are_the_monitoring_files() {
    let monitoring = workspace_root().join("deploy/monitoring");
    let objects = template(&["-f", "deploy/helm/examples/monitoring.yaml"]);
    let of_kind =
        |kind: &str| -> Vec<&Value> { objects.iter().filter(|o| o["kind"] == kind).collect() };
    let alerts = std::fs::read_to_string(monitoring.join("alerts.yaml")).unwrap();
    let alerts: Value = serde_saphyr::from_str(&alerts).unwrap();
    let rules = of_kind("PrometheusRule");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["spec"]["groups"], alerts["groups"]);
    assert_eq!(
        rules[0]["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    for name in ["cloud-controller-manager", "local-load-balancers"] {
        let map = objects
            .iter()
            .find(|o| {
                o["kind"] == "ConfigMap"
                    && o["metadata"]["name"] == format!("ccm-rs-dashboard-{name}")
            })
            .unwrap_or_else(|| panic!("no ConfigMap for the dashboard {name}"));
        assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
        let file =
            std::fs::read_to_string(monitoring.join(format!("dashboards/{name}.json"))).unwrap();
        assert_eq!(
            map["data"][format!("{name}.json")].as_str().unwrap(),
            file.trim_end()
        );
    }
    let monitors = of_kind("ServiceMonitor");
    let endpoint = |name: &str| {
        monitors
            .iter()
            .find(|m| m["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no ServiceMonitor {name}"))["spec"]["endpoints"][0]
            .clone()
    };
    assert_eq!(endpoint("cloud-controller-manager")["scheme"], "https");
    assert_eq!(
        endpoint("cloud-controller-manager")["port"],
        "https-metrics"
    );
    assert_eq!(endpoint("local-agent")["port"], "http-metrics");
    let services = of_kind("Service");
    let port = |name: &str| {
        services
            .iter()
            .find(|s| s["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Service {name}"))["spec"]["ports"][0]["port"]
            .clone()
    };
    assert_eq!(port("cloud-controller-manager-metrics"), 10258);
    // The job of the agents' scrape is the Service's name, which the alert LocalAgentDown reads.
    assert_eq!(port("local-agent"), 10264);
    assert!(alerts.to_string().contains(r#"up{job=\"local-agent\"}"#));
    let mut rendered = objects.clone();
    let args = agent(&mut rendered)["args"].as_array().unwrap().clone();
    assert!(
        args.contains(&json!("--metrics-bind-address=0.0.0.0:10264")),
        "{args:?}"
    );
    // Off by default: none of them.
    let defaults = template(&[]);
    for kind in ["ServiceMonitor", "PrometheusRule", "Service"] {
        assert!(
            !defaults.iter().any(|o| o["kind"] == kind),
            "{kind} rendered by default"
        );
    }
}

#[test]
fn wrong_monitoring_values_are_refused_naming_the_field() {
    let cases: [(&[&str], &str); 11] = [
        // A setting of the agents in leader mode, where none runs.
        (
            &[
                "--set",
                "loadBalancerMode=leader",
                "--set",
                "privilegedPorts=true",
                "--set",
                "agents.metricsBindAddress=0.0.0.0:10264",
            ],
            "agents.metricsBindAddress (0.0.0.0:10264) applies to loadBalancerMode=agents only",
        ),
        // A misspelt key.
        (
            &["--set", "monitoring.servicemonitor.enabled=true"],
            "at '/monitoring': additional properties 'servicemonitor' not allowed",
        ),
        // A number for a string, a string for a boolean, an address without a port.
        (
            &["--set", "monitoring.serviceMonitor.interval=30"],
            "at '/monitoring/serviceMonitor/interval': got number, want string",
        ),
        (
            &["--set", "monitoring.prometheusRule.enabled=on"],
            "at '/monitoring/prometheusRule/enabled': got string, want boolean",
        ),
        (
            &["--set", "agents.metricsBindAddress=10264"],
            "at '/agents/metricsBindAddress'",
        ),
        // The agents' ServiceMonitor without an address Prometheus can reach, alone, or in leader mode.
        (
            &[
                "--set",
                "monitoring.serviceMonitor.enabled=true",
                "--set",
                "monitoring.serviceMonitor.agents=true",
            ],
            "the agents serve /metrics on their node's loopback (127.0.0.1:10264), which Prometheus \
             cannot reach; set agents.metricsBindAddress",
        ),
        (
            &[
                "--set",
                "monitoring.serviceMonitor.enabled=true",
                "--set",
                "monitoring.serviceMonitor.agents=true",
                "--set",
                "agents.metricsBindAddress=127.0.0.1:9999",
            ],
            "the agents serve /metrics on 127.0.0.1:9999",
        ),
        (
            &["--set", "monitoring.serviceMonitor.agents=true"],
            "monitoring.serviceMonitor.agents needs monitoring.serviceMonitor.enabled",
        ),
        (
            &[
                "-f",
                "deploy/helm/examples/monitoring.yaml",
                "--set",
                "loadBalancerMode=leader",
                "--set",
                "privilegedPorts=true",
            ],
            "applies to loadBalancerMode agents only",
        ),
        // Set twice.
        (
            &[
                "--set",
                "agents.metricsBindAddress=0.0.0.0:10264",
                "--set",
                "agents.args={--metrics-bind-address=0.0.0.0:9000}",
            ],
            "agents.args: --metrics-bind-address=0.0.0.0:9000 sets a flag the chart owns: the value \
             agents.metricsBindAddress sets it",
        ),
        (
            &["--set", "monitoring.dashboards.labels.grafana_dashboard=1"],
            "at '/monitoring/dashboards/labels/grafana_dashboard': got number, want string",
        ),
    ];
    for (values, expected) in cases {
        let message = refused(values);
        assert!(message.contains(expected), "{values:?}: {message}");
    }
}
