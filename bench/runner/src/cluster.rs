//! The cluster side of a benchmark: a fresh control plane, kubelet-sized Node fixtures, Services, a
//! watch that timestamps initialization, and the API server's own request counters.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// A control plane started for one measurement and stopped after it.
pub(crate) struct Plane {
    pub(crate) dir: PathBuf,
    pub(crate) client: Client,
}

impl Plane {
    pub(crate) async fn up(dir: &Path) -> anyhow::Result<Self> {
        Self::up_with(dir, &[]).await
    }

    /// A control plane whose API server gets `apiserver_args` added to its command line.
    pub(crate) async fn up_with(dir: &Path, apiserver_args: &[&str]) -> anyhow::Result<Self> {
        let script = test_control_plane::workspace_root().join("hack/control-plane");
        let _ = Command::new(&script)
            .args(["down", "--dir"])
            .arg(dir)
            .output();
        let output = Command::new(&script)
            .args(["up", "--dir"])
            .arg(dir)
            .args(
                apiserver_args
                    .iter()
                    .map(|a| format!("--apiserver-arg={a}")),
            )
            .output()?;
        if !output.status.success() {
            bail!(
                "control plane did not start: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let kubeconfig = Kubeconfig::read_from(dir.join("admin.kubeconfig"))?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.read_timeout = Some(Duration::from_secs(120));
        Ok(Self {
            dir: dir.to_owned(),
            client: Client::try_from(config)?,
        })
    }

    /// The API server's process ID.
    pub(crate) fn apiserver_pid(&self) -> anyhow::Result<u32> {
        let path = self.dir.join("run/kube-apiserver.pid");
        std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{} holds no process ID", path.display()))
    }

    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    pub(crate) fn down(&self) {
        let script = test_control_plane::workspace_root().join("hack/control-plane");
        let _ = Command::new(script)
            .args(["down", "--dir"])
            .arg(&self.dir)
            .output();
    }

    /// The API server's `/metrics`.
    pub(crate) async fn metrics_text(&self) -> anyhow::Result<String> {
        Ok(self
            .client
            .request_text(http::Request::get("/metrics").body(Vec::new())?)
            .await?)
    }

    /// The API server's CPU seconds so far (its own `process_cpu_seconds_total`).
    pub(crate) async fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let text = self.metrics_text().await?;
        text.lines()
            .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
            .and_then(|v| v.trim().parse().ok())
            .context("the API server reports no process_cpu_seconds_total")
    }

    /// `apiserver_request_total` by (verb, resource/subresource, response code). The counters cannot tell
    /// clients apart, so callers diff two snapshots around windows the runner keeps quiet.
    pub(crate) async fn request_counts(&self) -> anyhow::Result<Counts> {
        let text = self.metrics_text().await?;
        let mut counts = Counts::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
        {
            let (labels, value) = line.rsplit_once(' ').context("a metric line")?;
            let label = |name: &str| label_value(labels, name);
            let resource = match label("subresource").as_str() {
                "" => label("resource"),
                sub => format!("{}/{sub}", label("resource")),
            };
            *counts
                .entry((label("verb"), resource, label("code")))
                .or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
        Ok(counts)
    }

    /// The API server's requests to etcd (`etcd_requests_total`) by "operation resource". A write whose
    /// watch-cache copy of the object was stale costs more than one: the API server first tries the
    /// cached copy, and its transaction fails (a second `update`) or its precondition check does (a
    /// `get` from etcd). Invisible in `apiserver_request_total`, which counts each request once.
    pub(crate) async fn etcd_counts(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        let text = self.metrics_text().await?;
        let mut counts = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("etcd_requests_total{"))
        {
            let (labels, value) = line.rsplit_once(' ').context("a metric line")?;
            let label = |name: &str| label_value(labels, name);
            *counts
                .entry(format!("{} {}", label("operation"), label("resource")))
                .or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
        Ok(counts)
    }
}

/// The value of label `name` in a metric line's `{...}` labels ("" when it has none).
fn label_value(labels: &str, name: &str) -> String {
    labels
        .split(&format!(",{name}=\""))
        .nth(1)
        .or_else(|| labels.split(&format!("{{{name}=\"")).nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
        .to_owned()
}

/// `apiserver_request_total` by (verb, resource/subresource, code).
pub(crate) type Counts = BTreeMap<(String, String, String), f64>;

/// Requests the API server makes to itself, which its counters include: its identity and
/// leader-election leases (the managers run without leader election here) and its OpenAPI
/// aggregation.
pub(crate) fn is_background(resource: &str) -> bool {
    resource == "leases" || resource.starts_with("/openapi")
}

/// Differences between two snapshots by (verb, resource, code): WATCH, non-resource requests (such as
/// the runner's reads of /metrics) and the API server's own background requests excluded.
pub(crate) fn count_delta(
    before: &Counts,
    after: &Counts,
) -> BTreeMap<(String, String, String), u64> {
    after
        .iter()
        .filter(|((verb, resource, _), _)| {
            verb != "WATCH" && !resource.is_empty() && !is_background(resource)
        })
        .filter_map(|(key, value)| {
            let delta = value - before.get(key).copied().unwrap_or(0.0);
            (delta >= 1.0).then(|| (key.clone(), delta.round() as u64))
        })
        .collect()
}

/// Differences between two snapshots by (verb, resource), all response codes together (see
/// [`count_delta`] for what is excluded).
pub(crate) fn request_delta(before: &Counts, after: &Counts) -> BTreeMap<(String, String), u64> {
    let mut requests = BTreeMap::new();
    for ((verb, resource, _), n) in count_delta(before, after) {
        *requests.entry((verb, resource)).or_default() += n;
    }
    requests
}

/// A Node as a real kubelet registers it with `--cloud-provider=external`: the uninitialized taint, a
/// full status (conditions, capacity, allocatable, node info, ~30 container images), no provider ID.
pub(crate) fn kubelet_node(name: &str, initialized: bool) -> Node {
    let images: Vec<_> = (0..30)
        .map(|i| {
            json!({
                "names": [
                    format!("registry.example.com/team-{}/service-{i}@sha256:{:064x}", i % 7, i * 7919 + 13),
                    format!("registry.example.com/team-{}/service-{i}:v1.{i}.0", i % 7),
                ],
                "sizeBytes": 20_000_000 + i * 3_000_000,
            })
        })
        .collect();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": format!("kubelet reports {type_}={status}"),
               "lastHeartbeatTime": "2026-11-22T00:00:00Z", "lastTransitionTime": "2026-11-22T00:00:00Z"})
    };
    let mut node = json!({
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "capacity": {"cpu": "8", "memory": "32858112Ki", "pods": "110", "ephemeral-storage": "101430960Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "7910m", "memory": "31610624Ki", "pods": "110", "ephemeral-storage": "93478772582", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "addresses": [{"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{:032x}", name.len() * 7919), "systemUUID": format!("ec2{:029x}", name.len()), "bootID": "5f3b1c2e-8d4a-4b6e-9c1f-2a3b4c5d6e7f",
                         "kernelVersion": "6.1.0-27-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.37.1", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        }
    });
    if initialized {
        node["spec"] = json!({"providerID": format!("fake://{name}")});
    }
    serde_json::from_value(node).expect("a valid Node")
}

/// Creates nodes with up to `concurrency` requests in flight; returns when each was created.
pub(crate) async fn create_nodes(
    client: &Client,
    names: &[String],
    initialized: bool,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let api: Api<Node> = Api::all(client.clone());
    let created = Arc::new(Mutex::new(HashMap::new()));
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let (api, created) = (api.clone(), created.clone());
            async move {
                api.create(&PostParams::default(), &kubelet_node(&name, initialized))
                    .await?;
                created.lock().unwrap().insert(name, Instant::now());
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(Arc::try_unwrap(created)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_default())
}

pub(crate) async fn delete_nodes(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Watches nodes and records when each was first seen without the uninitialized taint, and when each was
/// first seen with a cloud address (the second write of its initialization: the kubelet's node has only
/// its host name).
pub(crate) struct InitWatch {
    pub(crate) initialized: Arc<Mutex<HashMap<String, Instant>>>,
    pub(crate) addressed: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl InitWatch {
    pub(crate) fn start(client: &Client) -> Self {
        let initialized: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let addressed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let (sink, addresses_sink) = (initialized.clone(), addressed.clone());
        let events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(events);
            while let Some(Ok(node)) = events.next().await {
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED));
                if !tainted {
                    sink.lock()
                        .unwrap()
                        .entry(node.name_any())
                        .or_insert_with(Instant::now);
                }
                let cloud_address = node
                    .status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .is_some_and(|a| a.iter().any(|a| a.type_ != "Hostname"));
                if cloud_address {
                    addresses_sink
                        .lock()
                        .unwrap()
                        .entry(node.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        });
        Self {
            initialized,
            addressed,
            task,
        }
    }

    pub(crate) fn count_of(&self, names: &[String]) -> usize {
        let done = self.initialized.lock().unwrap();
        names.iter().filter(|n| done.contains_key(*n)).count()
    }
}

impl Drop for InitWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A `type: LoadBalancer` Service.
pub(crate) fn lb_service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))
    .expect("a valid Service")
}

pub(crate) async fn create_services(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &lb_service(&name))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// How many of the default namespace's Services have an ingress IP.
pub(crate) async fn services_with_ingress(client: &Client) -> anyhow::Result<usize> {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
        .count())
}
