//! Support for the tests on a real cluster: `hack/cluster` (kubelets, kube-proxy, containerd and pods on
//! this machine), with the manager running in it as a Pod from the image `hack/image` builds.
//!
//! The cluster must be up before the tests run: `hack/test-cluster` brings it up, imports the image,
//! runs these tests with `CCM_TEST_CLUSTER=DIR`, and takes it down. Without the variable, or with a
//! cluster that is not up, every test fails with the reason: nothing skips.
//!
//! Tests share the cluster, one at a time (run them with `--test-threads=1`); each makes its own
//! namespace ([`Namespace`]) and leaves the cluster as it found it: every node up, a manager deployed.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UdpSocket},
};

/// The environment variable that names the running cluster's directory (`hack/cluster up --dir DIR`).
pub const ENV_VAR: &str = "CCM_TEST_CLUSTER";

/// The manager's namespace, workload name and Lease.
pub const MANAGER_NAMESPACE: &str = "kube-system";
/// The name of the manager's Deployment or DaemonSet, and of its Lease.
pub const MANAGER_NAME: &str = "cloud-controller-manager";

/// The workspace root (where `hack/` is).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/cluster-tests is two levels below the workspace root")
        .to_owned()
}

/// The running cluster of this test run.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    nodes: usize,
}

/// The cluster `CCM_TEST_CLUSTER` names, checked to be up (`hack/cluster status`: every node registered;
/// they are Ready once a manager has allocated their pod CIDRs).
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir = std::env::var_os(ENV_VAR).map(PathBuf::from).unwrap_or_else(|| {
            panic!(
                "{ENV_VAR} is not set: these tests need a running hack/cluster (hack/test-cluster brings one up, runs them and takes it down)"
            )
        });
        let status = Command::new(workspace_root().join("hack/cluster"))
            .args(["status", "--dir"])
            .arg(&dir)
            .output()
            .expect("cannot run hack/cluster");
        assert!(
            status.status.success(),
            "{ENV_VAR}={}: no cluster runs there (hack/cluster status): {}",
            dir.display(),
            String::from_utf8_lossy(&status.stderr)
        );
        let nodes = std::fs::read_to_string(dir.join("state/nodes"))
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{}: no state/nodes", dir.display()));
        Cluster { dir, nodes }
    })
}

/// How the manager is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagerForm {
    /// `deploy/overlays/local`: a Deployment of two replicas on the control-plane nodes.
    Deployment,
    /// `deploy/overlays/local-agents`: the Deployment with `loadBalancer.mode: agents`, and the node
    /// agents' DaemonSet, which announce and serve each VIP from one node.
    Agents,
    /// `deploy/overlays/local-daemonset`: a DaemonSet on the control-plane nodes, in the shape of
    /// upstream's example, with `--use-service-account-credentials`.
    DaemonSet,
    /// The Helm chart `deploy/helm/cloud-controller-manager` (kind Deployment), installed with
    /// `hack/helm` as the release `kube-system/cloud-controller-manager`.
    Helm,
}

impl Cluster {
    /// The directory it runs from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node names, `ccm-node-1` first.
    pub fn nodes(&self) -> Vec<String> {
        (1..=self.nodes).map(|i| format!("ccm-node-{i}")).collect()
    }

    /// A node's address on the bridge.
    pub fn node_ip(&self, node: &str) -> IpAddr {
        let index: u8 = node
            .strip_prefix("ccm-node-")
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("not a node of hack/cluster: {node}"));
        IpAddr::from([10, 89, 0, 10 + index])
    }

    /// A node's IPv6 address on the bridge (`fd00:89::<10+i>`, hack/cluster's).
    pub fn node_ip6(&self, node: &str) -> IpAddr {
        let IpAddr::V4(v4) = self.node_ip(node) else {
            unreachable!()
        };
        format!("fd00:89::{}", v4.octets()[3])
            .parse()
            .expect("an IPv6 address")
    }

    /// The host's address on the bridge: where clients on the host come from.
    pub fn host_ip(&self) -> IpAddr {
        IpAddr::from([10, 89, 0, 1])
    }

    /// The cluster-admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The API server's audit log (writes of the manager's user and of kube-system's ServiceAccounts).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("cp/logs/audit.log")
    }

    /// A client with cluster-admin rights.
    pub async fn client(&self) -> Client {
        let path = self.admin_kubeconfig();
        let parsed = Kubeconfig::read_from(&path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .unwrap_or_else(|err| panic!("cannot use {}: {err}", path.display()));
        Client::try_from(config).expect("a client for the cluster")
    }

    /// Runs `hack/cluster VERB --dir DIR ARGS...` and returns its standard output; panics with its
    /// standard error when it fails.
    pub fn script(&self, verb: &str, args: &[&str]) -> String {
        let output = Command::new(workspace_root().join("hack/cluster"))
            .arg(verb)
            .arg("--dir")
            .arg(&self.dir)
            .args(args)
            .output()
            .expect("cannot run hack/cluster");
        assert!(
            output.status.success(),
            "hack/cluster {verb} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `kubectl` as cluster-admin; panics with its standard error when it fails.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let output = self.kubectl_output(args, stdin);
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Each manager replica's `/metrics` (HTTPS on its node's port 10258, read with the cluster's
    /// admin token, which may), with the replica's host IP; a replica that does not answer is left out
    /// when `lenient`, and fails the test otherwise.
    pub fn manager_metrics(&self, lenient: bool) -> Vec<(String, String)> {
        let kubeconfig =
            std::fs::read_to_string(self.admin_kubeconfig()).expect("admin kubeconfig");
        let token = kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .expect("the admin kubeconfig has a token")
            .to_owned();
        let hosts = self.kubectl(
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=cloud-controller-manager",
                "-o",
                "jsonpath={.items[*].status.hostIP}",
            ],
            None,
        );
        let hosts: Vec<&str> = hosts.split_whitespace().collect();
        assert!(!hosts.is_empty(), "no manager pod has a host IP");
        hosts
            .into_iter()
            .filter_map(|host| {
                let scraped = run(&[
                    "curl",
                    "-sSfk",
                    "--max-time",
                    "10",
                    "-H",
                    &format!("Authorization: Bearer {token}"),
                    &format!("https://{host}:10258/metrics"),
                ]);
                match scraped {
                    Ok(text) => Some((host.to_owned(), text)),
                    Err(_) if lenient => None,
                    Err(err) => panic!("the manager on {host}: {err}"),
                }
            })
            .collect()
    }

    /// `kubectl` as cluster-admin, whatever it answers.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("cannot run kubectl");
        let mut input = child.stdin.take().expect("kubectl's stdin");
        if let Some(stdin) = stdin {
            input
                .write_all(stdin.as_bytes())
                .expect("writing kubectl's stdin");
        }
        drop(input);
        child.wait_with_output().expect("kubectl's output")
    }

    /// Applies YAML as cluster-admin (server-side).
    pub fn apply(&self, yaml: &str) {
        self.kubectl(
            &[
                "apply",
                "--server-side",
                "--field-manager=cluster-tests",
                "-f",
                "-",
            ],
            Some(yaml),
        );
    }

    /// Runs a command inside a node (its network and mount namespaces): `hack/cluster exec`.
    pub fn exec_on_node(&self, node: &str, command: &[&str]) -> Output {
        Command::new(workspace_root().join("hack/cluster"))
            .arg("exec")
            .arg("--dir")
            .arg(&self.dir)
            .args(["--node", node, "--"])
            .args(command)
            .output()
            .expect("cannot run hack/cluster exec")
    }

    /// `curl` from inside a node: the body, or the error curl printed.
    pub fn curl_on_node(&self, node: &str, url: &str) -> Result<String, String> {
        let output = self.exec_on_node(node, &["curl", "-sS", "--max-time", "3", url]);
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        }
    }

    /// Deploys the manager in `form` from the image imported on the nodes (`hack/cluster manager`),
    /// replacing the other form if it runs, and waits until it is rolled out, holds its Lease and every
    /// node is initialized.
    pub async fn ensure_manager(&self, form: ManagerForm) {
        let (kind, args): (&str, &[&str]) = match form {
            ManagerForm::Deployment => ("deployment", &[]),
            ManagerForm::DaemonSet => ("daemonset", &["--daemonset"]),
            ManagerForm::Helm => ("deployment", &["--helm"]),
            ManagerForm::Agents => ("deployment", &["--agents"]),
        };
        let running = self.kubectl_output(
            &[
                "-n",
                MANAGER_NAMESPACE,
                "get",
                kind,
                MANAGER_NAME,
                "-o",
                r#"jsonpath={.metadata.annotations.meta\.helm\.sh/release-name}"#,
            ],
            None,
        );
        let helm_release = !running.stdout.is_empty();
        // A Deployment from the chart is the local overlay's (tests/helm_chart.rs proves they render
        // the same), so it serves the Deployment form too.
        // The node agents run exactly with the Agents form (its cloud-config differs too).
        let agents = self
            .kubectl_output(
                &[
                    "-n",
                    MANAGER_NAMESPACE,
                    "get",
                    "daemonset",
                    "local-agent",
                    "-o",
                    "name",
                ],
                None,
            )
            .status
            .success();
        let deployed = running.status.success()
            && (form != ManagerForm::Helm || helm_release)
            && agents == (form == ManagerForm::Agents);
        if !deployed {
            self.script("manager", args);
        }
        let client = self.client().await;
        eventually(
            "the manager holds its Lease and every node is initialized",
            Duration::from_secs(90),
            || {
                let client = client.clone();
                async move {
                    let lease = manager_lease_holder(&client).await?;
                    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
                    let list = nodes.list(&Default::default()).await.ok()?;
                    list.items
                        .iter()
                        .all(|n| {
                            n.spec
                                .as_ref()
                                .and_then(|s| s.provider_id.as_deref())
                                .is_some_and(|id| id.starts_with("local://"))
                        })
                        .then_some(lease)
                }
            },
        )
        .await;
    }
}

/// Runs `command` on the host: its standard output, or the command and what it said on failure.
pub fn run(command: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(command[0])
        .args(&command[1..])
        .output()
        .map_err(|err| format!("{}: {err}", command.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            command.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The kube-apiserver of the cluster stopped (SIGSTOP: it holds its connections and answers nothing,
/// as an API server stalled on etcd does) until dropped, which resumes it.
pub struct FrozenApiServer(String);

impl FrozenApiServer {
    /// Freezes it now.
    pub fn freeze() -> Self {
        let pid_file = cluster().dir().join("cp/run/kube-apiserver.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|err| panic!("{}: {err}", pid_file.display()))
            .trim()
            .to_owned();
        run(&["kill", "-STOP", &pid]).unwrap();
        Self(pid)
    }
}

impl Drop for FrozenApiServer {
    fn drop(&mut self) {
        let _ = run(&["kill", "-CONT", &self.0]);
    }
}

/// The holder of the manager's Lease, if it is held.
pub async fn manager_lease_holder(client: &Client) -> Option<String> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let lease = leases.get_opt(MANAGER_NAME).await.ok()??;
    lease
        .spec?
        .holder_identity
        .filter(|holder| !holder.is_empty())
}

/// A namespace of a test's own, deleted (without waiting) when dropped.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

impl Namespace {
    /// Creates `<prefix>-<unique suffix>`.
    pub fn new(prefix: &str) -> Self {
        let name = unique_name(prefix);
        cluster().kubectl(&["create", "namespace", &name], None);
        Self { name }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ =
            cluster().kubectl_output(&["delete", "namespace", &self.name, "--wait=false"], None);
    }
}

/// A name no other test (or earlier run) uses, valid as a DNS-1123 label.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{n}-{:x}", nanos % 0xfffff)
}

/// Polls `check` every 250 ms until it gives a value; panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `GET path` over HTTP/1.0 from the host: the body, or what went wrong.
pub async fn http_get(address: SocketAddr, path: &str) -> Result<String, String> {
    let exchange = async {
        let mut stream = TcpStream::connect(address)
            .await
            .map_err(|err| format!("connect {address}: {err}"))?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await
            .map_err(|err| format!("send to {address}: {err}"))?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .map_err(|err| format!("read from {address}: {err}"))?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{address}: not an HTTP response: {response:?}"))?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(format!(
                "{address}{path}: {}",
                head.lines().next().unwrap_or_default()
            ));
        }
        Ok(body.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .map_err(|_| format!("{address}{path}: no answer within 3s"))?
}

/// Sends one datagram from the host and returns the answer, or what went wrong.
pub async fn udp_ask(address: SocketAddr, payload: &str) -> Result<String, String> {
    let exchange = async {
        let socket = UdpSocket::bind("0.0.0.0:0")
            .await
            .map_err(|err| format!("bind: {err}"))?;
        socket
            .send_to(payload.as_bytes(), address)
            .await
            .map_err(|err| format!("send to {address}: {err}"))?;
        let mut buffer = [0u8; 2048];
        let (n, _) = socket
            .recv_from(&mut buffer)
            .await
            .map_err(|err| format!("receive from {address}: {err}"))?;
        Ok(String::from_utf8_lossy(&buffer[..n]).trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| format!("{address}: no UDP answer within 2s"))?
}

// --- workloads and what a client on the bridge sees -------------------------------------------------

/// How long the helpers below wait for the cluster to get where a test wants it.
pub const LONG: Duration = Duration::from_secs(90);

/// A Deployment of `ccm-rs/echo:test` spread over the nodes (one pod per node at most, when
/// `spread`), and a Service in front of it.
pub fn echo_app(name: &str, replicas: usize, spread: bool, node: Option<&str>) -> String {
    let placement = match (spread, node) {
        (_, Some(node)) => format!("nodeSelector: {{kubernetes.io/hostname: {node}}}"),
        (true, None) => format!(
            "topologySpreadConstraints: [{{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: {name}}}}}}}]"
        ),
        (false, None) => "nodeSelector: {}".to_owned(),
    };
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      {placement}
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: ccm-rs/echo:test
        imagePullPolicy: Never
        env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
        ports: [{{containerPort: 8080}}, {{containerPort: 8081, protocol: UDP}}]
        readinessProbe: {{httpGet: {{path: /healthz, port: 8080}}, periodSeconds: 1}}
"#
    )
}

/// A LoadBalancer Service for the echo app `app`: HTTP on 80 and UDP on 81.
pub fn load_balancer(name: &str, app: &str, extra_spec: &str, annotations: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  annotations: {{{annotations}}}
spec:
  type: LoadBalancer
  selector: {{app: {app}}}
  {extra_spec}
  ports:
  - {{name: http, port: 80, targetPort: 8080, protocol: TCP}}
  - {{name: udp, port: 81, targetPort: 8081, protocol: UDP}}
"#
    )
}

/// A namespace of the test's own with `documents` applied in it (the echo app among them), once the app
/// is rolled out.
pub async fn deploy(prefix: &str, documents: &[String]) -> Namespace {
    let ns = Namespace::new(prefix);
    cluster().kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(&documents.join("---\n")),
    );
    wait_rollout(ns.name(), "echo").await;
    ns
}

/// Waits until the Deployment `namespace/name` is rolled out.
pub async fn wait_rollout(namespace: &str, name: &str) {
    let c = cluster();
    c.kubectl(
        &[
            "-n",
            namespace,
            "rollout",
            "status",
            &format!("deployment/{name}"),
            "--timeout=120s",
        ],
        None,
    );
}

/// The Service's load-balancer ingress (IP and ipMode), once the manager has written it.
pub async fn ingress(namespace: &str, name: &str) -> (std::net::IpAddr, String) {
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(cluster().client().await, namespace);
    eventually(
        &format!("Service {namespace}/{name} has a load-balancer IP"),
        LONG,
        || {
            let services = services.clone();
            async move {
                let service = services.get(name).await.ok()?;
                let ingress = service.status?.load_balancer?.ingress?.into_iter().next()?;
                Some((
                    ingress.ip?.parse().ok()?,
                    ingress.ip_mode.unwrap_or_default(),
                ))
            }
        },
    )
    .await
}

/// Who answers `count` requests to `GET /` through `address`: the pod names (an error fails).
pub async fn answers(address: SocketAddr, count: usize) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for _ in 0..count {
        names.push(http_get(address, "/").await?);
    }
    Ok(names)
}

/// `count` requests in a row that all succeed, within `timeout`: the pods that answered the last run.
pub async fn steady_answers(what: &str, address: SocketAddr, count: usize) -> BTreeSet<String> {
    eventually(what, LONG, || async move {
        answers(address, count)
            .await
            .ok()
            .map(|names| names.into_iter().collect())
    })
    .await
}

/// The MAC address of a node's eth0 (from netlink: a node's /sys is the host's).
pub fn node_mac(node: &str) -> String {
    let output = cluster().exec_on_node(node, &["ip", "-o", "link", "show", "dev", "eth0"]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "link/ether")
        .and_then(|i| words.get(i + 1))
        .unwrap_or_else(|| panic!("no MAC address in {text:?}"))
        .to_string()
}

/// The host's neighbour entry for `ip` on the bridge: (MAC, state).
pub fn host_neighbour(ip: std::net::IpAddr) -> Option<(String, String)> {
    let output = std::process::Command::new("ip")
        .args(["neigh", "show", &ip.to_string(), "dev", "ccm-br0"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    let mac = words
        .iter()
        .position(|w| *w == "lladdr")
        .and_then(|i| words.get(i + 1))?;
    Some((mac.to_string(), words.last()?.to_string()))
}
