//! The benchmark runner: the Rust and the upstream Go cloud-controller-manager, each in turn on a fresh
//! test control plane, with the same simulated cloud, measured on node initialization, load balancers and
//! the steady state; plus the API server's own limit for the same writes. Writes a Markdown report and a
//! PNG of per-node initialization delays. See bench/README.md.

mod cache_start;
mod cluster;
mod manager;
mod pace;
mod profile;
mod report;
mod rounds;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::bail;
use clap::Parser;
use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use cluster::{
    InitWatch, Plane, count_delta, create_nodes, create_services, delete_nodes, request_delta,
    services_with_ingress,
};
use manager::{Binaries, Extra, Kind, Running, Settings, StatsFreshness};
use profile::ProfileResult;

/// Benchmarks both managers side by side.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Node counts for the initialization scenario.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000,25000")]
    nodes: Vec<usize>,
    /// Steady-state sizes, NODES:SERVICES: after each node-initialization run of NODES nodes, SERVICES
    /// LoadBalancer Services are provisioned, then the idle window is measured. The RSS target is
    /// checked at the smallest size.
    #[arg(long, value_delimiter = ',', default_value = "5000:500,10000:1000", value_parser = parse_steady)]
    steady: Vec<SteadySize>,
    /// LoadBalancer Services of the load-balancer scenario.
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
    /// Which managers to measure (one alone, to measure one change at a time).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rust,go")]
    managers: Vec<Kind>,
    /// The Rust manager binary.
    #[arg(long)]
    rust_bin: Option<PathBuf>,
    /// The Go manager binary (bench/go-ccm).
    #[arg(long)]
    go_bin: Option<PathBuf>,
    /// Where control planes, logs and cloud state go.
    #[arg(long, default_value = "target/bench")]
    work_dir: PathBuf,
    /// The Markdown report to write (its PNGs and profiles go beside it).
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
    /// `equal` settings are measured only at node counts up to this: there both managers sit on the same
    /// token bucket, whose floor, (2N − burst) / QPS, fixes the time of larger runs.
    #[arg(long, default_value_t = 5000)]
    equal_max_nodes: usize,
    /// Upstream at its own defaults (QPS 20, one node worker) is measured only at node counts up to
    /// this: it takes 25 minutes at 10,000 nodes and would take an hour at 25,000; above it, ours at its
    /// defaults is compared with upstream unthrottled and with the API server's own limit.
    #[arg(long, default_value_t = 10_000)]
    go_defaults_max_nodes: usize,
    /// Skip the API server's own limit (the minimal client's run at each node count).
    #[arg(long)]
    no_api_limit: bool,
    /// Measure each node-initialization row this many times, interleaved (every manager and the API
    /// limit at a size, then all of them again), and report each figure's median: one row moves 14–27 %
    /// between runs on a 2-core machine. Upstream at its own defaults (25 minutes at 10,000 nodes, judged
    /// only against a 5× target), the steady states and the profiles are measured in the first round only.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    rounds: u32,
    /// Profile the `unthrottled` node-initialization run at NODES nodes (`--profile` alone: the largest
    /// count; `--profile=off`: none, the default): a CPU profile of the API server for each manager (`go
    /// tool pprof -top`, saved beside the report as <out>-apiserver-<manager>.txt) and a flame graph of
    /// our manager (perf + inferno, <out>-flame-rust.svg).
    #[arg(long, value_name = "NODES", num_args = 0..=1, default_value = "off", default_missing_value = "largest", value_parser = parse_profile)]
    profile: ProfileAt,
    /// Which scenarios to run: node initialization (with the steady states and the API limit),
    /// load balancers, cache start.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "init,load-balancers,cache-start"
    )]
    scenarios: Vec<Scenario>,
    /// Nodes the API server holds in the cache-start scenario (each manager's caches started with a
    /// streaming list, a paged list, and a streaming list the API server refuses); 0 skips it.
    #[arg(long, default_value_t = 10_000)]
    cache_start_nodes: usize,
    /// How long the API server is watched after the manager starts in the cache-start scenario (the
    /// first lists of 10,000 nodes take a few seconds either way).
    #[arg(long, default_value_t = 20)]
    cache_start_seconds: u64,
    /// A label for the report (e.g. "smoke").
    #[arg(long, default_value = "full")]
    label: String,
    /// Measure nothing: render the report (Markdown and PNGs at `--out`) again from the raw results a
    /// run saved beside its report (`<out>.json`).
    #[arg(long, value_name = "JSON", conflicts_with = "resume")]
    from_results: Option<PathBuf>,
    /// Continue a run that stopped part-way: start from the results it saved (`<out>.partial.json`) and
    /// measure only the scenarios it lacks, with the same flags as the first try.
    #[arg(long, value_name = "JSON")]
    resume: Option<PathBuf>,
}

/// A scenario of the benchmark (`--scenarios`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Init,
    LoadBalancers,
    CacheStart,
}

/// Which run `--profile` profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProfileAt {
    Off,
    Largest,
    Nodes(usize),
}

fn parse_profile(value: &str) -> Result<ProfileAt, String> {
    match value {
        "off" => Ok(ProfileAt::Off),
        "largest" => Ok(ProfileAt::Largest),
        n => n
            .parse()
            .map(ProfileAt::Nodes)
            .map_err(|_| format!("{value}: expected a node count, `largest` or `off`")),
    }
}

/// A steady-state size (`--steady NODES:SERVICES`).
#[derive(Debug, Clone, Copy)]
struct SteadySize {
    nodes: usize,
    services: usize,
}

fn parse_steady(value: &str) -> Result<SteadySize, String> {
    let (nodes, services) = value
        .split_once(':')
        .ok_or_else(|| format!("{value}: expected NODES:SERVICES, e.g. 5000:500"))?;
    let number = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|e| format!("{value}: {e}"))
    };
    Ok(SteadySize {
        nodes: number(nodes)?,
        services: number(services)?,
    })
}

/// Everything one run measured, saved beside the report so the report can be rendered again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Results {
    pub(crate) label: String,
    pub(crate) machine: String,
    pub(crate) minutes: f64,
    pub(crate) latency: String,
    /// Services of the load-balancer scenario.
    pub(crate) services: usize,
    pub(crate) lb_nodes: usize,
    pub(crate) churn: usize,
    pub(crate) idle_seconds: u64,
    pub(crate) inits: Vec<InitResult>,
    pub(crate) lbs: Vec<LbResult>,
    pub(crate) steadies: Vec<SteadyResult>,
    #[serde(default)]
    pub(crate) profiles: Vec<ProfileResult>,
    #[serde(default)]
    pub(crate) cache_starts: Vec<cache_start::CacheStartResult>,
}

/// Who the minimal client of the API server's own limit is, in the results.
pub(crate) const API_LIMIT: &str = "API limit";

impl Results {
    /// How many node-initialization runs of `who` at these settings and size are among the results.
    fn init_runs(&self, who: &str, settings: Settings, nodes: usize) -> usize {
        let settings = settings.to_string();
        self.inits
            .iter()
            .filter(|i| i.who == who && i.settings == settings && i.nodes == nodes)
            .count()
    }

    /// The results as reported: each node-initialization row measured in several rounds as its medians.
    fn with_median_rows(&self) -> Results {
        Results {
            inits: rounds::medians(&self.inits),
            ..self.clone()
        }
    }

    /// Whether a run with these flags may continue these results: every parameter the results record
    /// must be the one the flags ask for, or the report would mix scenarios of different shapes.
    fn check_resumable_with(&self, args: &Args) -> Result<(), String> {
        let recorded = [
            ("--label", self.label.clone(), args.label.clone()),
            ("--latency", self.latency.clone(), args.latency.clone()),
            (
                "--services",
                self.services.to_string(),
                args.services.to_string(),
            ),
            (
                "--lb-nodes",
                self.lb_nodes.to_string(),
                args.lb_nodes.to_string(),
            ),
            ("--churn", self.churn.to_string(), args.churn.to_string()),
            (
                "--idle-seconds",
                self.idle_seconds.to_string(),
                args.idle_seconds.to_string(),
            ),
        ];
        let differing: Vec<String> = recorded
            .into_iter()
            .filter(|(_, was, now)| was != now)
            .map(|(flag, was, now)| format!("{flag} was {was}, now {now}"))
            .collect();
        if differing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "its results were measured with other flags ({}); pass the first try's flags",
                differing.join("; ")
            ))
        }
    }

    /// Whether the load-balancer run of `who` at these settings is among the results.
    fn has_lb(&self, who: &str, settings: Settings) -> bool {
        let settings = settings.to_string();
        self.lbs
            .iter()
            .any(|l| l.who == who && l.settings == settings)
    }
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
    /// The manager's requests by "VERB resource[/subresource]" over the same span, from the API
    /// server's counters (the runner's node creations, watches and the API server's own background
    /// requests excluded).
    #[serde(default)]
    pub(crate) requests: BTreeMap<String, u64>,
    /// Of those, the ones answered with an error, by "VERB resource code" (409 Conflict, 429 Too Many
    /// Requests, ...).
    #[serde(default)]
    pub(crate) errors: BTreeMap<String, u64>,
    /// The manager's client-side token bucket (QPS, burst); 0 in results saved before it was kept.
    #[serde(default)]
    pub(crate) qps: f64,
    #[serde(default)]
    pub(crate) burst: f64,
    /// The API server (and, for ours, perf) profiled this run: its numbers carry the profilers' cost.
    #[serde(default)]
    pub(crate) profiled: bool,
    /// The API server's requests to etcd for Nodes and Events over the same span, by "operation
    /// resource" (the runner's node creations included as `create nodes`); empty in results saved
    /// before they were kept.
    #[serde(default)]
    pub(crate) etcd: BTreeMap<String, u64>,
    /// How the run's time was spread: start, middle rate and tail; `None` in results saved before it
    /// was kept.
    #[serde(default)]
    pub(crate) pace: Option<pace::Pace>,
    /// A row measured in several rounds (`--rounds`) is reported as the medians of its runs; this lists
    /// each run's total in seconds. Empty for a row measured once (every raw result).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) round_totals: Vec<f64>,
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
    /// Its size; 0 in results saved before sizes were kept (then: the largest node count, and the
    /// load-balancer scenario's Services).
    #[serde(default)]
    pub(crate) nodes: usize,
    #[serde(default)]
    pub(crate) services: usize,
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
    done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    wait_for_every(Duration::from_millis(200), what, timeout, done).await
}

/// How often the churn's settling is checked: its result is a time of about half a second, which a
/// 200 ms poll would round up by as much as 40 %.
const CHURN_POLL: Duration = Duration::from_millis(20);

/// Checks `done` every `poll` until it holds, or fails after `timeout`.
async fn wait_for_every(
    poll: Duration,
    what: &str,
    timeout: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done().await? {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

/// One node-initialization run: which manager (none: the minimal client of the API limit), at what
/// settings and size, and what else to measure on it.
struct InitRun {
    kind: Option<Kind>,
    settings: Settings,
    count: usize,
    /// Services to provision for the steady state after the initialization.
    steady_services: Option<usize>,
    /// Profile this run (the API server; for ours, perf too).
    profile: bool,
}

/// What a node-initialization run measured.
struct InitOutcome {
    init: InitResult,
    steady: Option<SteadyResult>,
    profile: Option<ProfileResult>,
}

/// A file beside the report: `<out stem>-<suffix>`.
fn beside_report(out: &std::path::Path, suffix: &str) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".to_owned());
    out.with_file_name(format!("{stem}-{suffix}"))
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Nodes created while the manager runs; time until every one lost the uninitialized taint. Then,
/// with `steady_services`, Services are provisioned and the idle steady state measured.
async fn node_init(args: &Args, bins: &Binaries, run: InitRun) -> anyhow::Result<InitOutcome> {
    let InitRun {
        kind,
        settings,
        count,
        steady_services,
        profile,
    } = run;
    let who = kind.map_or(API_LIMIT.to_owned(), |k| k.to_string());
    let dir = args
        .work_dir
        .join(format!("init-{who}-{count}-{settings:?}").replace(' ', "-"));
    std::fs::create_dir_all(&dir)?;
    let plane = Plane::up(&dir.join("cp")).await?;
    eprintln!(
        "bench: node init, {who}, {settings}, {count} nodes{}",
        if profile { " (profiled)" } else { "" }
    );
    let watch = InitWatch::start(&plane.client);
    let mut running = match kind {
        Some(kind) => Some(Running::start(
            kind,
            settings,
            bins,
            &plane.kubeconfig(),
            &dir,
            &args.latency,
            StatsFreshness::Default,
            &Extra::default(),
        )?),
        None => {
            spawn_minimal_client(plane.client.clone(), settings.minimal_client_bucket())?;
            None
        }
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = plane.request_counts().await?;
    let etcd_before = plane.etcd_counts().await?;
    let (manager_cpu_before, apiserver_cpu_before) =
        (manager_cpu(running.as_ref()), plane.cpu_seconds().await?);
    let node_names = names("node", count);
    let mut profile_result = profile.then(|| ProfileResult {
        who: who.clone(),
        settings: settings.to_string(),
        nodes: count,
        apiserver_seconds: profile::apiserver_seconds(count),
        ..Default::default()
    });
    let apiserver_profile = profile_result
        .as_ref()
        .map(|p| profile::start_apiserver(&plane.client, p.apiserver_seconds));
    let perf_data = dir.join("perf.data");
    let mut perf = None;
    if let (Some(result), Some(running)) = (profile_result.as_mut(), running.as_ref())
        && running.kind == Kind::Rust
    {
        match profile::Perf::start(running.pid(), &perf_data) {
            Ok(p) => perf = Some(p),
            Err(e) => result.notes.push(format!("perf did not start: {e:#}")),
        }
    }
    let started = Instant::now();
    let created = create_nodes(&plane.client, &node_names, false, 32).await?;
    // Upstream at its defaults (QPS 20, one worker) needs about 3 writes / 20 per second per node: 25
    // minutes for 10,000 nodes.
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
    let addressed = watch.addressed.lock().unwrap().clone();
    let pace = pace::pace(
        created.values().copied(),
        done.values().copied(),
        addressed.values().copied(),
    );
    let after = plane.request_counts().await?;
    let etcd_after = plane.etcd_counts().await?;
    let (manager_cpu_after, apiserver_cpu_after) =
        (manager_cpu(running.as_ref()), plane.cpu_seconds().await?);
    let perf_stopped = perf.take().map(profile::Perf::stop);
    let mut delta = request_delta(&before, &after);
    // The runner's own node creations.
    let node_creates = delta
        .remove(&("POST".to_owned(), "nodes".to_owned()))
        .unwrap_or(0);
    if node_creates as usize != count {
        eprintln!("bench:   note: {node_creates} node creations counted for {count} nodes");
    }
    let errors = count_delta(&before, &after)
        .into_iter()
        .filter(|((verb, resource, code), _)| {
            code.parse::<u16>().is_ok_and(|c| c >= 400) && !(verb == "POST" && resource == "nodes")
        })
        .map(|((verb, resource, code), n)| (format!("{verb} {resource} {code}"), n))
        .collect();
    let peak = running
        .as_ref()
        .map(|r| r.memory_mib().map(|m| m.0).unwrap_or(0.0))
        .unwrap_or(0.0);
    let (qps, burst) = settings.token_bucket(kind);
    let result = InitResult {
        who: who.clone(),
        settings: settings.to_string(),
        nodes: count,
        total: last_done.saturating_duration_since(first_created),
        p50: percentile(&delays, 0.5),
        p99: percentile(&delays, 0.99),
        writes_per_node: writes(&delta) as f64 / count as f64,
        events_per_node: event_writes(&delta) as f64 / count as f64,
        delays,
        peak_rss_mib: peak,
        manager_cpu_seconds: manager_cpu_after - manager_cpu_before,
        apiserver_cpu_seconds: apiserver_cpu_after - apiserver_cpu_before,
        requests: delta
            .iter()
            .map(|((verb, resource), n)| (format!("{verb} {resource}"), *n))
            .collect(),
        errors,
        qps,
        burst,
        profiled: profile,
        etcd: etcd_after
            .iter()
            .filter(|(key, _)| key.ends_with(" nodes") || key.ends_with(" events"))
            .filter_map(|(key, n)| {
                let delta = n - etcd_before.get(key).copied().unwrap_or(0.0);
                (delta >= 1.0).then(|| (key.clone(), delta.round() as u64))
            })
            .collect(),
        pace,
        round_totals: Vec::new(),
    };
    eprintln!(
        "bench:   etcd requests: {}",
        result
            .etcd
            .iter()
            .map(|(key, n)| format!("{key} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!(
        "bench:   {:?} total, p50 {:?}, p99 {:?}, {:.2} writes/node, CPU {:.1} s (API server {:.1} s)",
        result.total,
        result.p50,
        result.p99,
        result.writes_per_node,
        result.manager_cpu_seconds,
        result.apiserver_cpu_seconds
    );
    if let Some(pace) = &result.pace {
        eprintln!("bench:   {pace}");
    }
    if let (Some(result), Some(task)) = (profile_result.as_mut(), apiserver_profile) {
        let raw = dir.join(format!("apiserver-{who}.pprof"));
        let summary = match task.await {
            Ok(Ok(bytes)) => profile::summarize_apiserver(&bytes, &raw).await,
            Ok(Err(e)) => Err(e),
            Err(e) => Err(e.into()),
        };
        match summary {
            Ok(text) => {
                let path = beside_report(&args.out, &format!("apiserver-{who}.txt"));
                std::fs::write(&path, &text)?;
                result.apiserver_top = text;
                result.apiserver_file = Some(file_name(&path));
                eprintln!(
                    "bench:   API server profile: {} (raw: {})",
                    path.display(),
                    raw.display()
                );
            }
            Err(e) => result
                .notes
                .push(format!("the API server's CPU profile failed: {e:#}")),
        }
    }

    let mut steady_result = None;
    if let (Some(services), Some(running)) = (steady_services, running.as_ref()) {
        eprintln!("bench: steady state, {who}, {settings}: {count} nodes + {services} services");
        create_services(&plane.client, &names("svc", services)).await?;
        wait_for(
            "all services provisioned",
            Duration::from_secs(300 + services as u64),
            async || Ok(services_with_ingress(&plane.client).await? == services),
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
        let idle_requests = request_delta(&requests_before, &requests_after)
            .into_iter()
            .map(|((verb, resource), n)| (format!("{verb} {resource}"), n))
            .collect();
        steady_result = Some(SteadyResult {
            who: who.clone(),
            settings: settings.to_string(),
            nodes: count,
            services,
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
    // Drawn after the control plane is down, so perf script does not compete with a measurement.
    if let (Some(result), Some(stopped)) = (profile_result.as_mut(), perf_stopped) {
        let svg = beside_report(&args.out, &format!("flame-{who}.svg"));
        let title = format!("{who} manager: node initialization, {count} nodes, {settings}");
        match stopped {
            Ok(data) => match profile::flame_graph(&data, &svg, &title).await {
                Ok((samples, cut)) => {
                    result.flamegraph_file = Some(file_name(&svg));
                    result.flamegraph_samples = samples;
                    result.flamegraph_cut_samples = cut;
                    eprintln!(
                        "bench:   flame graph: {} ({samples} samples, {cut} with cut stacks)",
                        svg.display()
                    );
                }
                Err(e) => result.notes.push(format!("the flame graph failed: {e:#}")),
            },
            Err(e) => result.notes.push(format!("perf record failed: {e:#}")),
        }
    }
    if let Some(result) = &profile_result {
        for note in &result.notes {
            eprintln!("bench:   profile: {note}");
        }
    }
    Ok(InitOutcome {
        init: result,
        steady: steady_result,
        profile: profile_result,
    })
}

/// The minimal client of the API limit: the same three writes per node as a manager (the node, its
/// status, an event), 64 nodes at a time, with no controller logic. `bucket` (QPS, burst) puts the node
/// and status writes behind one token bucket and the events behind another, as a manager's node client
/// and event sink: the equal-settings limit, what any client with that bucket reaches on this machine
/// while the runner creates the nodes.
fn spawn_minimal_client(client: kube::Client, bucket: Option<(f64, f64)>) -> anyhow::Result<()> {
    // A bucket asked for and not built would measure the unthrottled limit under the bucket's name.
    let limiter = || -> anyhow::Result<Option<Arc<DefaultDirectRateLimiter>>> {
        let Some((qps, burst)) = bucket else {
            return Ok(None);
        };
        let bucket = token_bucket(qps, burst).ok_or_else(|| {
            anyhow::anyhow!("the minimal client's token bucket (QPS {qps}, burst {burst}) cannot be built: QPS and burst must be above 0")
        })?;
        Ok(Some(Arc::new(bucket)))
    };
    let (node_writes, event_writes) = (limiter()?, limiter()?);
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client.clone());
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(client.clone(), "default");
        let stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let take = async |bucket: &Option<Arc<DefaultDirectRateLimiter>>| {
            if let Some(bucket) = bucket {
                bucket.until_ready().await;
            }
        };
        stream
            .for_each_concurrent(64, |node| {
                let (api, events) = (api.clone(), events.clone());
                let (node_writes, event_writes) = (node_writes.clone(), event_writes.clone());
                async move {
                    let Ok(node) = node else { return };
                    let tainted = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| !t.is_empty());
                    if !tainted {
                        return;
                    }
                    let name = node.name_any();
                    let patch = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "standard"}},
                                       "spec": {"providerID": format!("fake://{name}"), "taints": []}});
                    take(&node_writes).await;
                    let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}]}});
                    take(&node_writes).await;
                    let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                    let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
                        "metadata": {"generateName": format!("{name}.")},
                        "involvedObject": {"kind": "Node", "name": name, "apiVersion": "v1"},
                        "reason": "Synced", "message": "Node synced successfully", "type": "Normal",
                        "source": {"component": "bench-minimal-client"}
                    }))
                    .expect("a valid Event");
                    take(&event_writes).await;
                    let _ = events.create(&PostParams::default(), &event).await;
                }
            })
            .await;
    });
    Ok(())
}

/// A token bucket of `qps` per second and `burst` at once (`governor`, as our manager's client-side
/// limiter); `None` for a rate governor cannot express (0, or faster than one per nanosecond).
fn token_bucket(qps: f64, burst: f64) -> Option<DefaultDirectRateLimiter> {
    let period = Duration::try_from_secs_f64(1.0 / qps).ok()?;
    let burst = std::num::NonZeroU32::new(burst as u32)?;
    Some(RateLimiter::direct(
        Quota::with_period(period)?.allow_burst(burst),
    ))
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
        StatsFreshness::Immediate,
        &Extra::default(),
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = plane.request_counts().await?;
    let started = Instant::now();
    create_services(&plane.client, &names("svc", args.services)).await?;
    let timeout = Duration::from_secs(300 + args.services as u64 * 6 / 5);
    wait_for("all services provisioned", timeout, async || {
        Ok(services_with_ingress(&plane.client).await? == args.services)
    })
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
    wait_for_every(
        CHURN_POLL,
        "every backend set updated",
        timeout,
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

/// The results a run saved (`<out>.json`, or `<out>.partial.json` of a run that stopped).
fn read_results(path: &Path) -> anyhow::Result<Results> {
    let raw =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut results: Results = serde_json::from_slice(&raw).map_err(|e| {
        anyhow::anyhow!(
            "{} is not a results file of this runner: {e}",
            path.display()
        )
    })?;
    // Results saved before steady-state sizes were kept ran it after the largest count, with the
    // load-balancer scenario's Services.
    let largest = results.inits.iter().map(|i| i.nodes).max().unwrap_or(0);
    for steady in results.steadies.iter_mut().filter(|s| s.nodes == 0) {
        (steady.nodes, steady.services) = (largest, results.services);
    }
    Ok(results)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let results = match &args.from_results {
        Some(path) => read_results(path)?,
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
    // The JSON keeps every run; the report shows a row measured in several rounds as its medians.
    let results = results.with_median_rows();
    let growth = beside_report(&args.out, "growth.png");
    let plot = args.out.with_extension("png");
    std::fs::write(
        &args.out,
        report::markdown(&results, &file_name(&plot), &file_name(&growth)),
    )?;
    report::plot(&plot, &results.inits)?;
    let mut wrote = vec![args.out.display().to_string(), plot.display().to_string()];
    if report::plot_growth(&growth, &results.inits)? {
        wrote.push(growth.display().to_string());
    }
    eprintln!("bench: wrote {}", wrote.join(", "));
    Ok(())
}

/// Every scenario, for each manager in turn.
async fn measure(args: &Args) -> anyhow::Result<Results> {
    let mut managers = args.managers.clone();
    managers.dedup();
    let bins = Binaries {
        rust: args.rust_bin.clone(),
        go: args.go_bin.clone(),
    };
    if managers.contains(&Kind::Rust) && bins.rust.is_none() {
        bail!("--rust-bin is needed to measure the rust manager");
    }
    if managers.contains(&Kind::Go) && bins.go.is_none() {
        bail!("--go-bin is needed to measure the go manager");
    }
    let largest = args.nodes.iter().copied().max().unwrap_or(0);
    let profile_at = match args.profile {
        ProfileAt::Off => None,
        ProfileAt::Largest => Some(largest),
        ProfileAt::Nodes(n) => Some(n),
    };
    if let Some(n) = profile_at {
        if !args.nodes.contains(&n) || !args.settings.contains(&Settings::Unthrottled) {
            eprintln!(
                "bench: note: --profile={n} profiles nothing: it needs {n} among --nodes and unthrottled among --settings"
            );
        } else {
            profile::check_tools(managers.contains(&Kind::Rust))?;
        }
    }
    for steady in &args.steady {
        if !args.nodes.contains(&steady.nodes) {
            eprintln!(
                "bench: note: no steady state at {} nodes: not among --nodes",
                steady.nodes
            );
        }
    }
    std::fs::create_dir_all(&args.work_dir)?;
    let started = Instant::now();
    let resumed = match &args.resume {
        Some(path) => {
            let results = read_results(path)?;
            results
                .check_resumable_with(args)
                .map_err(|e| anyhow::anyhow!("cannot resume {}: {e}", path.display()))?;
            Some(results)
        }
        None => None,
    };
    let minutes_before = resumed.as_ref().map_or(0.0, |r| r.minutes);
    let mut results = resumed.unwrap_or_else(|| Results {
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
        profiles: Vec::new(),
        cache_starts: Vec::new(),
    });
    if args.resume.is_some() {
        let here = report::machine_description();
        if here != results.machine {
            results.machine = format!("{}; resumed on {here}", results.machine);
        }
    }
    // What was measured so far goes to `<out>.partial.json` after every scenario, so a failure late in
    // an hour-long run loses only the scenario that failed (`--from-results` renders a partial file).
    let partial = args.out.with_extension("partial.json");
    let save = |results: &mut Results| -> anyhow::Result<()> {
        results.minutes = minutes_before + started.elapsed().as_secs_f64() / 60.0;
        if let Some(parent) = partial.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&partial, serde_json::to_vec_pretty(results)?)?;
        Ok(())
    };
    let node_counts: &[usize] = if args.scenarios.contains(&Scenario::Init) {
        &args.nodes
    } else {
        &[]
    };
    for &count in node_counts {
        let steady_services = args
            .steady
            .iter()
            .find(|s| s.nodes == count)
            .map(|s| s.services);
        for round in 1..=args.rounds as usize {
            for &settings in &args.settings {
                if settings == Settings::Equal && count > args.equal_max_nodes {
                    continue;
                }
                for &kind in &managers {
                    let go_defaults = kind == Kind::Go && settings == Settings::Defaults;
                    if go_defaults && count > args.go_defaults_max_nodes {
                        if round == 1 {
                            eprintln!(
                                "bench: go at its own defaults is not measured at {count} nodes (--go-defaults-max-nodes {})",
                                args.go_defaults_max_nodes
                            );
                        }
                        continue;
                    }
                    let wanted = if go_defaults { 1 } else { round };
                    if results.init_runs(&kind.to_string(), settings, count) >= wanted {
                        if round == 1 {
                            eprintln!(
                                "bench: resume: {kind} at {settings}, {count} nodes: measured already"
                            );
                        }
                        continue;
                    }
                    if args.rounds > 1 {
                        eprintln!("bench: round {round} of {}", args.rounds);
                    }
                    // The profiles come from a run of their own before the measured one, so that the
                    // row the targets judge carries no profiler's cost.
                    let profile_first = profile_at == Some(count)
                        && settings == Settings::Unthrottled
                        && !results
                            .profiles
                            .iter()
                            .any(|p| p.who == kind.to_string() && p.nodes == count);
                    let runs: &[bool] = if profile_first {
                        &[true, false]
                    } else {
                        &[false]
                    };
                    for &profile in runs {
                        if profile {
                            eprintln!(
                                "bench: the profiled run (its numbers are not reported; the next run's are)"
                            );
                        }
                        let outcome = node_init(
                            args,
                            &bins,
                            InitRun {
                                kind: Some(kind),
                                settings,
                                count,
                                steady_services: steady_services.filter(|_| !profile && round == 1),
                                profile,
                            },
                        )
                        .await?;
                        results.profiles.extend(outcome.profile);
                        if !profile {
                            results.inits.push(outcome.init);
                            results.steadies.extend(outcome.steady);
                        }
                        save(&mut results)?;
                    }
                }
            }
            // The API server's own limit, and at equal settings what a client with the managers'
            // token bucket reaches (the floor (2N − burst) / QPS only where the API server has room).
            let limits = [Settings::Unthrottled, Settings::Equal]
                .into_iter()
                .filter(|&s| {
                    s == Settings::Unthrottled
                        || (args.settings.contains(&s) && count <= args.equal_max_nodes)
                });
            for settings in limits {
                if args.no_api_limit || results.init_runs(API_LIMIT, settings, count) >= round {
                    continue;
                }
                let outcome = node_init(
                    args,
                    &bins,
                    InitRun {
                        kind: None,
                        settings,
                        count,
                        steady_services: None,
                        profile: false,
                    },
                )
                .await?;
                results.inits.push(outcome.init);
                save(&mut results)?;
            }
        }
    }
    let lb_settings: &[Settings] = if args.scenarios.contains(&Scenario::LoadBalancers) {
        &args.settings
    } else {
        &[]
    };
    for &settings in lb_settings {
        for &kind in &managers {
            if results.has_lb(&kind.to_string(), settings) {
                eprintln!("bench: resume: {kind} load balancers at {settings}: measured already");
                continue;
            }
            results
                .lbs
                .push(load_balancers(args, &bins, kind, settings).await?);
            save(&mut results)?;
        }
    }
    if args.cache_start_nodes > 0 && args.scenarios.contains(&Scenario::CacheStart) {
        for &kind in &managers {
            for how in cache_start::FirstLists::ALL {
                if results
                    .cache_starts
                    .iter()
                    .any(|r| r.who == kind.to_string() && r.first_lists == how.label())
                {
                    eprintln!(
                        "bench: resume: {kind} cache start, {}: measured already",
                        how.label()
                    );
                    continue;
                }
                results.cache_starts.push(
                    cache_start::cache_start(args, &bins, kind, how, args.cache_start_nodes)
                        .await?,
                );
                save(&mut results)?;
            }
        }
    }
    let _ = std::fs::remove_file(&partial);
    results.minutes = minutes_before + started.elapsed().as_secs_f64() / 60.0;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["ccm-bench", "--out", "/tmp/report.md"];
        argv.extend_from_slice(extra);
        Args::parse_from(argv)
    }

    fn results_of(args: &Args) -> Results {
        Results {
            label: args.label.clone(),
            machine: String::new(),
            minutes: 1.0,
            latency: args.latency.clone(),
            services: args.services,
            lb_nodes: args.lb_nodes,
            churn: args.churn,
            idle_seconds: args.idle_seconds,
            inits: Vec::new(),
            lbs: Vec::new(),
            steadies: Vec::new(),
            profiles: Vec::new(),
            cache_starts: Vec::new(),
        }
    }

    #[test]
    fn results_resume_only_with_the_flags_they_were_measured_with() {
        let first = args(&["--services", "500", "--latency", "20ms"]);
        let results = results_of(&first);
        assert_eq!(results.check_resumable_with(&first), Ok(()));
        let other = args(&["--services", "100", "--latency", "50ms"]);
        let error = results.check_resumable_with(&other).unwrap_err();
        assert!(error.contains("--services was 500, now 100"), "{error}");
        assert!(error.contains("--latency was 20ms, now 50ms"), "{error}");
        assert!(!error.contains("--churn"), "{error}");
    }

    #[test]
    fn the_minimal_clients_bucket_is_built_or_refused() {
        assert!(token_bucket(200.0, 400.0).is_some());
        assert!(token_bucket(0.0, 400.0).is_none());
        assert!(token_bucket(200.0, 0.0).is_none());
        assert_eq!(Settings::Unthrottled.minimal_client_bucket(), None);
        assert_eq!(
            Settings::Equal.minimal_client_bucket(),
            Some((200.0, 400.0))
        );
    }

    #[test]
    fn a_resumed_run_finds_the_scenarios_measured_already() {
        let mut results = results_of(&args(&[]));
        let measured: InitResult = serde_json::from_value(serde_json::json!({
            "who": "rust", "settings": Settings::Equal.to_string(), "nodes": 1000,
            "total": {"secs": 8, "nanos": 0}, "p50": {"secs": 2, "nanos": 0},
            "p99": {"secs": 6, "nanos": 0}, "writes_per_node": 3.0, "events_per_node": 1.0,
            "delays": [], "peak_rss_mib": 30.0
        }))
        .unwrap();
        results.inits.push(measured);
        assert_eq!(results.init_runs("rust", Settings::Equal, 1000), 1);
        assert_eq!(results.init_runs("go", Settings::Equal, 1000), 0);
        assert_eq!(results.init_runs("rust", Settings::Unthrottled, 1000), 0);
        assert_eq!(results.init_runs("rust", Settings::Equal, 5000), 0);
        assert!(!results.has_lb("rust", Settings::Equal));
    }
}
