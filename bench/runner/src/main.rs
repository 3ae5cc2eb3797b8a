//! The benchmark runner: the Rust and the upstream Go cloud-controller-manager, each in turn on a fresh
//! test control plane, with the same simulated cloud, measured on node initialization, load balancers and
//! the steady state; plus the API server's own limit for the same writes. Writes a Markdown report and a
//! PNG of per-node initialization delays. See bench/README.md.

mod cluster;
mod manager;
mod report;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::bail;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use cluster::{
    InitWatch, Plane, create_nodes, create_services, delete_nodes, request_delta,
    services_with_ingress,
};
use manager::{Binaries, Kind, Running, Settings};

/// Benchmarks both managers side by side.
#[derive(Debug, Parser)]
struct Args {
    /// Node counts for the initialization scenario; the last also sizes the steady state.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    nodes: Vec<usize>,
    /// LoadBalancer Services (load-balancer scenario and steady state).
    #[arg(long, default_value_t = 500)]
    services: usize,
    /// Nodes behind the load balancers in the load-balancer scenario.
    #[arg(long, default_value_t = 100)]
    lb_nodes: usize,
    /// Nodes added and removed after the load balancers are up.
    #[arg(long, default_value_t = 50)]
    churn: usize,
    /// The idle window of the steady state.
    #[arg(long, default_value = "60")]
    idle_seconds: u64,
    /// Simulated latency of every cloud call (Go duration syntax), the same for both.
    #[arg(long, default_value = "20ms")]
    latency: String,
    /// The Rust manager binary.
    #[arg(long, required_unless_present = "from_results")]
    rust_bin: Option<PathBuf>,
    /// The Go manager binary (bench/go-ccm).
    #[arg(long, required_unless_present = "from_results")]
    go_bin: Option<PathBuf>,
    /// Where control planes, logs and cloud state go.
    #[arg(long, default_value = "target/bench")]
    work_dir: PathBuf,
    /// The Markdown report to write (its PNG goes beside it).
    #[arg(long)]
    out: PathBuf,
    /// Which settings to run each scenario at.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "defaults,equal,unthrottled"
    )]
    settings: Vec<Settings>,
    /// A label for the report (e.g. "smoke").
    #[arg(long, default_value = "full")]
    label: String,
    /// Measure nothing: render the report (Markdown and PNG at `--out`) again from the raw results a run
    /// saved beside its report (`<out>.json`).
    #[arg(long, value_name = "JSON")]
    from_results: Option<PathBuf>,
}

/// Everything one run measured, saved beside the report so the report can be rendered again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Results {
    pub(crate) label: String,
    pub(crate) machine: String,
    pub(crate) minutes: f64,
    pub(crate) latency: String,
    pub(crate) services: usize,
    pub(crate) lb_nodes: usize,
    pub(crate) churn: usize,
    pub(crate) idle_seconds: u64,
    pub(crate) inits: Vec<InitResult>,
    pub(crate) lbs: Vec<LbResult>,
    pub(crate) steadies: Vec<SteadyResult>,
}

/// One node-initialization measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct InitResult {
    pub(crate) who: String,
    pub(crate) settings: String,
    pub(crate) nodes: usize,
    pub(crate) total: Duration,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// All the manager's writes (node, status, events) per node.
    pub(crate) writes_per_node: f64,
    /// Of those, the event writes.
    pub(crate) events_per_node: f64,
    pub(crate) delays: Vec<f64>,
    pub(crate) peak_rss_mib: f64,
    /// CPU seconds the manager (or the minimal client) used from the first creation until the writes
    /// were counted.
    #[serde(default)]
    pub(crate) manager_cpu_seconds: f64,
    /// CPU seconds the API server used meanwhile (node creations included).
    #[serde(default)]
    pub(crate) apiserver_cpu_seconds: f64,
}

/// One load-balancer measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LbResult {
    pub(crate) who: String,
    pub(crate) settings: String,
    pub(crate) provision: Duration,
    pub(crate) churn: Duration,
    pub(crate) update_calls: u64,
    pub(crate) ensure_calls: u64,
    /// All the manager's writes (finalizer, status, events) per Service while provisioning.
    pub(crate) writes_per_service: f64,
    /// Of those, the event writes.
    pub(crate) events_per_service: f64,
}

/// One steady-state measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SteadyResult {
    pub(crate) who: String,
    pub(crate) settings: String,
    pub(crate) peak_rss_mib: f64,
    pub(crate) idle_rss_mib: f64,
    pub(crate) idle_cpu_seconds: f64,
    /// Requests in the idle window by "VERB resource".
    pub(crate) idle_requests: BTreeMap<String, u64>,
    pub(crate) idle_cloud_calls: u64,
}

/// CPU seconds of the manager, or of this process for the minimal client that runs inside it.
fn manager_cpu(running: Option<&Running>) -> f64 {
    match running {
        Some(running) => running.cpu_seconds(),
        None => manager::process_cpu_seconds("self"),
    }
    .unwrap_or(0.0)
}

fn percentile(sorted: &[f64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_secs_f64(sorted[index])
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i:05}")).collect()
}

fn is_write(verb: &str) -> bool {
    matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY")
}

fn writes(delta: &BTreeMap<(String, String), u64>) -> u64 {
    delta
        .iter()
        .filter(|((verb, _), _)| is_write(verb))
        .map(|(_, v)| v)
        .sum()
}

/// Writes to Events (core/v1 and events.k8s.io/v1 both count as resource `events`).
fn event_writes(delta: &BTreeMap<(String, String), u64>) -> u64 {
    delta
        .iter()
        .filter(|((verb, resource), _)| is_write(verb) && resource == "events")
        .map(|(_, v)| v)
        .sum()
}

async fn wait_for(
    what: &str,
    timeout: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done().await? {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Nodes created while the manager runs; time until every one lost the uninitialized taint.
/// With `settle_services`, then also provisions Services and measures the idle steady state.
async fn node_init(
    args: &Args,
    bins: &Binaries,
    kind: Option<Kind>,
    settings: Settings,
    count: usize,
    steady: bool,
) -> anyhow::Result<(InitResult, Option<SteadyResult>)> {
    let who = kind.map_or("API limit".to_owned(), |k| k.to_string());
    let dir = args
        .work_dir
        .join(format!("init-{who}-{count}-{settings:?}").replace(' ', "-"));
    std::fs::create_dir_all(&dir)?;
    let plane = Plane::up(&dir.join("cp")).await?;
    eprintln!("bench: node init, {who}, {settings}, {count} nodes");
    let watch = InitWatch::start(&plane.client);
    let mut running = match kind {
        Some(kind) => Some(Running::start(
            kind,
            settings,
            bins,
            &plane.kubeconfig(),
            &dir,
            &args.latency,
        )?),
        None => {
            spawn_minimal_client(plane.client.clone());
            None
        }
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = plane.request_counts().await?;
    let (manager_cpu_before, apiserver_cpu_before) =
        (manager_cpu(running.as_ref()), plane.cpu_seconds().await?);
    let node_names = names("node", count);
    let started = Instant::now();
    let created = create_nodes(&plane.client, &node_names, false, 32).await?;
    // Upstream at its defaults (QPS 20, one worker) needs about 3 writes / 20 per second per node.
    let timeout = Duration::from_secs(120 + (count as u64 * 3) / 10);
    wait_for("all nodes initialized", timeout, async || {
        if let Some(running) = running.as_mut()
            && !running.is_running()
        {
            bail!("the {who} manager exited; see its log in {}", dir.display());
        }
        Ok(watch.count_of(&node_names) == count)
    })
    .await?;
    let done = watch.initialized.lock().unwrap().clone();
    let first_created = created.values().min().copied().unwrap_or(started);
    let last_done = done.values().max().copied().unwrap_or(started);
    let mut delays: Vec<f64> = node_names
        .iter()
        .filter_map(|n| {
            Some(
                done.get(n)?
                    .saturating_duration_since(*created.get(n)?)
                    .as_secs_f64(),
            )
        })
        .collect();
    delays.sort_by(|a, b| a.total_cmp(b));
    // Let the addresses and events of the last nodes land before counting writes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = plane.request_counts().await?;
    let (manager_cpu_after, apiserver_cpu_after) =
        (manager_cpu(running.as_ref()), plane.cpu_seconds().await?);
    let delta = request_delta(&before, &after);
    let node_creates = delta
        .get(&("POST".to_owned(), "nodes".to_owned()))
        .copied()
        .unwrap_or(0);
    let manager_writes = writes(&delta).saturating_sub(node_creates);
    let peak = running
        .as_ref()
        .map(|r| r.memory_mib().map(|m| m.0).unwrap_or(0.0))
        .unwrap_or(0.0);
    let result = InitResult {
        who: who.clone(),
        settings: settings.to_string(),
        nodes: count,
        total: last_done.saturating_duration_since(first_created),
        p50: percentile(&delays, 0.5),
        p99: percentile(&delays, 0.99),
        writes_per_node: manager_writes as f64 / count as f64,
        events_per_node: event_writes(&delta) as f64 / count as f64,
        delays,
        peak_rss_mib: peak,
        manager_cpu_seconds: manager_cpu_after - manager_cpu_before,
        apiserver_cpu_seconds: apiserver_cpu_after - apiserver_cpu_before,
    };
    eprintln!(
        "bench:   {:?} total, p50 {:?}, p99 {:?}, {:.2} writes/node, CPU {:.1} s (API server {:.1} s)",
        result.total,
        result.p50,
        result.p99,
        result.writes_per_node,
        result.manager_cpu_seconds,
        result.apiserver_cpu_seconds
    );

    let mut steady_result = None;
    if steady && let Some(running) = running.as_ref() {
        eprintln!(
            "bench: steady state, {who}, {settings}: {count} nodes + {} services",
            args.services
        );
        create_services(&plane.client, &names("svc", args.services)).await?;
        wait_for(
            "all services provisioned",
            Duration::from_secs(600),
            async || Ok(services_with_ingress(&plane.client).await? == args.services),
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let calls_before: u64 = running.cloud_stats().await?.calls.values().sum();
        let cpu_before = running.cpu_seconds()?;
        let requests_before = plane.request_counts().await?;
        tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
        let requests_after = plane.request_counts().await?;
        let cpu_after = running.cpu_seconds()?;
        let calls_after: u64 = running.cloud_stats().await?.calls.values().sum();
        let (peak, idle) = running.memory_mib()?;
        let mut idle_requests = request_delta(&requests_before, &requests_after);
        // The API server's own background requests (its identity lease, its OpenAPI aggregation), which
        // it counts too; the managers run without leader election here.
        let background = |verb: &str, resource: &str| {
            (verb == "PUT" && resource == "leases") || resource.starts_with("/openapi")
        };
        idle_requests.retain(|(verb, resource), _| !background(verb, resource));
        let idle_requests = idle_requests
            .into_iter()
            .map(|((verb, resource), n)| (format!("{verb} {resource}"), n))
            .collect();
        steady_result = Some(SteadyResult {
            who: who.clone(),
            settings: settings.to_string(),
            peak_rss_mib: peak,
            idle_rss_mib: idle,
            idle_cpu_seconds: cpu_after - cpu_before,
            idle_requests,
            idle_cloud_calls: calls_after.saturating_sub(calls_before),
        });
    }
    if let Some(running) = running.take() {
        running.stop();
    }
    drop(watch);
    plane.down();
    Ok((result, steady_result))
}

/// The API server's own limit: the same writes a manager makes per node (one node patch, one status
/// patch, one event), by a client with no controller logic and no client-side rate limit.
fn spawn_minimal_client(client: kube::Client) {
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client.clone());
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(client.clone(), "default");
        let stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        stream
            .for_each_concurrent(64, |node| {
                let (api, events) = (api.clone(), events.clone());
                async move {
                    let Ok(node) = node else { return };
                    let tainted = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| !t.is_empty());
                    if !tainted {
                        return;
                    }
                    let name = node.name_any();
                    let patch = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "standard"}},
                                       "spec": {"providerID": format!("fake://{name}"), "taints": []}});
                    let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}]}});
                    let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                    let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
                        "metadata": {"generateName": format!("{name}.")},
                        "involvedObject": {"kind": "Node", "name": name, "apiVersion": "v1"},
                        "reason": "Synced", "message": "Node synced successfully", "type": "Normal",
                        "source": {"component": "bench-minimal-client"}
                    }))
                    .expect("a valid Event");
                    let _ = events.create(&PostParams::default(), &event).await;
                }
            })
            .await;
    });
}

/// Load balancers: Services over existing nodes, then nodes added and removed.
async fn load_balancers(
    args: &Args,
    bins: &Binaries,
    kind: Kind,
    settings: Settings,
) -> anyhow::Result<LbResult> {
    let dir = args.work_dir.join(format!("lb-{kind}-{settings:?}"));
    std::fs::create_dir_all(&dir)?;
    let plane = Plane::up(&dir.join("cp")).await?;
    eprintln!(
        "bench: load balancers, {kind}, {settings}: {} services over {} nodes",
        args.services, args.lb_nodes
    );
    let first = names("node", args.lb_nodes);
    create_nodes(&plane.client, &first, true, 32).await?;
    let running = Running::start(
        kind,
        settings,
        bins,
        &plane.kubeconfig(),
        &dir,
        &args.latency,
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = plane.request_counts().await?;
    let started = Instant::now();
    create_services(&plane.client, &names("svc", args.services)).await?;
    wait_for(
        "all services provisioned",
        Duration::from_secs(900),
        async || Ok(services_with_ingress(&plane.client).await? == args.services),
    )
    .await?;
    let provision = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = plane.request_counts().await?;
    let delta = request_delta(&before, &after);
    let service_creates = delta
        .get(&("POST".to_owned(), "services".to_owned()))
        .copied()
        .unwrap_or(0);
    let writes_per_service =
        writes(&delta).saturating_sub(service_creates) as f64 / args.services as f64;
    let events_per_service = event_writes(&delta) as f64 / args.services as f64;

    let stats = running.cloud_stats().await?;
    let (updates_before, ensures_before) = (
        stats
            .calls
            .get("update_load_balancer")
            .copied()
            .unwrap_or(0),
        stats
            .calls
            .get("ensure_load_balancer")
            .copied()
            .unwrap_or(0),
    );
    let added = names("extra", args.churn);
    let removed: Vec<String> = first.iter().take(args.churn).cloned().collect();
    let mut wanted: Vec<String> = first
        .iter()
        .skip(args.churn)
        .cloned()
        .chain(added.iter().cloned())
        .collect();
    wanted.sort();
    let started = Instant::now();
    create_nodes(&plane.client, &added, true, 32).await?;
    delete_nodes(&plane.client, &removed).await?;
    wait_for(
        "every backend set updated",
        Duration::from_secs(900),
        async || {
            let stats = running.cloud_stats().await?;
            Ok(stats.backends.len() == args.services
                && stats.backends.values().all(|nodes| *nodes == wanted))
        },
    )
    .await?;
    let churn = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = running.cloud_stats().await?;
    let result = LbResult {
        who: kind.to_string(),
        settings: settings.to_string(),
        provision,
        churn,
        update_calls: stats
            .calls
            .get("update_load_balancer")
            .copied()
            .unwrap_or(0)
            - updates_before,
        ensure_calls: stats
            .calls
            .get("ensure_load_balancer")
            .copied()
            .unwrap_or(0)
            - ensures_before,
        writes_per_service,
        events_per_service,
    };
    eprintln!(
        "bench:   provisioned in {provision:?}; churn settled in {churn:?} with {} update calls",
        result.update_calls
    );
    running.stop();
    plane.down();
    Ok(result)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let results = match &args.from_results {
        Some(path) => {
            let raw = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            serde_json::from_slice(&raw).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not a results file of this runner: {e}",
                    path.display()
                )
            })?
        }
        None => measure(&args).await?,
    };
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if args.from_results.is_none() {
        std::fs::write(
            args.out.with_extension("json"),
            serde_json::to_vec_pretty(&results)?,
        )?;
    }
    std::fs::write(&args.out, report::markdown(&results))?;
    let plot = args.out.with_extension("png");
    report::plot(&plot, &results.inits)?;
    eprintln!("bench: wrote {} and {}", args.out.display(), plot.display());
    Ok(())
}

/// Every scenario, for each manager in turn.
async fn measure(args: &Args) -> anyhow::Result<Results> {
    let (Some(rust), Some(go)) = (args.rust_bin.clone(), args.go_bin.clone()) else {
        bail!("--rust-bin and --go-bin are needed to measure");
    };
    let bins = Binaries { rust, go };
    std::fs::create_dir_all(&args.work_dir)?;
    let started = Instant::now();
    let mut results = Results {
        label: args.label.clone(),
        machine: report::machine_description(),
        minutes: 0.0,
        latency: args.latency.clone(),
        services: args.services,
        lb_nodes: args.lb_nodes,
        churn: args.churn,
        idle_seconds: args.idle_seconds,
        inits: Vec::new(),
        lbs: Vec::new(),
        steadies: Vec::new(),
    };
    // What was measured so far goes to `<out>.partial.json` after every scenario, so a failure late in
    // an hour-long run loses only the scenario that failed (`--from-results` renders a partial file).
    let partial = args.out.with_extension("partial.json");
    let save = |results: &mut Results| -> anyhow::Result<()> {
        results.minutes = started.elapsed().as_secs_f64() / 60.0;
        if let Some(parent) = partial.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&partial, serde_json::to_vec_pretty(results)?)?;
        Ok(())
    };
    let largest = args.nodes.iter().copied().max().unwrap_or(0);
    for &count in &args.nodes {
        for &settings in &args.settings {
            for kind in [Kind::Rust, Kind::Go] {
                let (init, steady) =
                    node_init(args, &bins, Some(kind), settings, count, count == largest).await?;
                results.inits.push(init);
                results.steadies.extend(steady);
                save(&mut results)?;
            }
        }
        let (limit, _) = node_init(args, &bins, None, Settings::Unthrottled, count, false).await?;
        results.inits.push(limit);
        save(&mut results)?;
    }
    for &settings in &args.settings {
        for kind in [Kind::Rust, Kind::Go] {
            results
                .lbs
                .push(load_balancers(args, &bins, kind, settings).await?);
            save(&mut results)?;
        }
    }
    let _ = std::fs::remove_file(&partial);
    results.minutes = started.elapsed().as_secs_f64() / 60.0;
    Ok(results)
}
