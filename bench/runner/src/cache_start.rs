//! What a manager's cache start costs the API server: the API server holds N kubelet-sized nodes, a
//! manager that runs only the service controller (it reads the Node and Service caches and, with no
//! Service, writes nothing) starts, and the API server's CPU and peak memory are measured over a fixed
//! window. Each way of fetching the first lists is one row, asked of both managers by client-go's gate
//! in their environment: a streaming list (`KUBE_FEATURE_WatchListClient=true`, client-go's default
//! since 1.35), a paged list (`KUBE_FEATURE_WatchListClient=false`, ours by default), and a streaming list
//! asked of an API server that refuses it (`--feature-gates=WatchList=false` on the server: the
//! manager falls back to a paged list).

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    Args,
    cluster::{Counts, Plane, create_nodes, is_background},
    manager::{Binaries, Extra, Kind, Running, Settings, StatsFreshness},
    names,
};

/// How the manager fetches its first lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstLists {
    /// A streaming list (`KUBE_FEATURE_WatchListClient=true`: client-go's default).
    Streaming,
    /// A paged list, then a watch (`KUBE_FEATURE_WatchListClient=false`: ours by default).
    Paged,
    /// A streaming list asked of an API server with `WatchList` off.
    Refused,
}

impl FirstLists {
    pub(crate) const ALL: [FirstLists; 3] = [Self::Streaming, Self::Paged, Self::Refused];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Streaming => "streaming list (WatchListClient=true)",
            Self::Paged => "paged list (WatchListClient=false)",
            Self::Refused => "streaming list refused (server WatchList=false), fallback",
        }
    }

    fn manager_env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Paged => &[("KUBE_FEATURE_WatchListClient", "false")],
            Self::Streaming | Self::Refused => &[("KUBE_FEATURE_WatchListClient", "true")],
        }
    }

    fn apiserver_flags(self) -> &'static [&'static str] {
        match self {
            Self::Refused => &["--feature-gates=WatchList=false"],
            Self::Streaming | Self::Paged => &[],
        }
    }
}

/// One cache-start measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CacheStartResult {
    pub(crate) who: String,
    pub(crate) first_lists: String,
    pub(crate) nodes: usize,
    pub(crate) window_seconds: u64,
    /// The API server's CPU seconds over the window.
    pub(crate) apiserver_cpu_seconds: f64,
    /// Its resident memory when the manager started, and its peak over the window (MiB).
    pub(crate) apiserver_rss_before_mib: f64,
    pub(crate) apiserver_peak_rss_mib: f64,
    /// The manager's peak resident memory over the window (MiB).
    pub(crate) manager_peak_rss_mib: f64,
    /// Streaming lists the API server completed, and their seconds in total
    /// (`apiserver_watch_list_duration_seconds`), Nodes and Services together.
    pub(crate) streaming_lists: u64,
    pub(crate) streaming_seconds: f64,
    /// The manager's finished requests for Nodes and Services by "VERB resource code" (a watch counts
    /// when it ends: a refused one at once, a running one not at all).
    pub(crate) requests: BTreeMap<String, u64>,
}

/// Resident memory (VmRSS) and its peak since the last reset (VmHWM) of `pid`, in MiB.
fn memory_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

/// Resets `pid`'s peak resident memory (VmHWM) to its current value (`clear_refs` 5, Linux ≥ 4.0).
fn reset_peak(pid: u32) -> anyhow::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    Ok(())
}

/// The API server's streaming-list count and seconds for Nodes and Services.
async fn streaming_lists(plane: &Plane) -> anyhow::Result<(f64, f64)> {
    let text = plane.metrics_text().await?;
    let (mut count, mut seconds) = (0.0, 0.0);
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_watch_list_duration_seconds_"))
        .filter(|l| l.contains("resource=\"nodes\"") || l.contains("resource=\"services\""))
    {
        let value: f64 = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0.0);
        if line.starts_with("apiserver_watch_list_duration_seconds_count") {
            count += value;
        } else if line.starts_with("apiserver_watch_list_duration_seconds_sum") {
            seconds += value;
        }
    }
    Ok((count, seconds))
}

/// Requests for Nodes and Services finished between two snapshots, by "VERB resource code".
fn node_and_service_requests(before: &Counts, after: &Counts) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|((_, resource, _), _)| {
            (resource == "nodes" || resource == "services") && !is_background(resource)
        })
        .filter_map(|((verb, resource, code), value)| {
            let key = (verb.clone(), resource.clone(), code.clone());
            let delta = value - before.get(&key).copied().unwrap_or(0.0);
            (delta >= 1.0).then(|| (format!("{verb} {resource} {code}"), delta.round() as u64))
        })
        .collect()
}

/// One row: `kind` starting its caches `how` on an API server holding `count` nodes.
pub(crate) async fn cache_start(
    args: &Args,
    bins: &Binaries,
    kind: Kind,
    how: FirstLists,
    count: usize,
) -> anyhow::Result<CacheStartResult> {
    let dir = args
        .work_dir
        .join(format!("cache-start-{kind}-{how:?}-{count}"));
    std::fs::create_dir_all(&dir)?;
    let plane = Plane::up_with(&dir.join("cp"), how.apiserver_flags()).await?;
    eprintln!("bench: cache start, {kind}, {}, {count} nodes", how.label());
    create_nodes(&plane.client, &names("node", count), true, 32).await?;
    // Let the API server finish what the creations left (watch-cache fills, GC) before the baseline.
    tokio::time::sleep(Duration::from_secs(args.cache_start_seconds.min(5))).await;
    let apiserver = plane.apiserver_pid()?;
    let (rss_before, _) = memory_mib(apiserver)?;
    reset_peak(apiserver)?;
    let counts_before = plane.request_counts().await?;
    let (lists_before, seconds_before) = streaming_lists(&plane).await?;
    let cpu_before = plane.cpu_seconds().await?;
    let mut running = Running::start(
        kind,
        Settings::Defaults,
        bins,
        &plane.kubeconfig(),
        &dir,
        &args.latency,
        StatsFreshness::Default,
        &Extra {
            args: &["--controllers=service"],
            env: how.manager_env(),
        },
    )?;
    let window = Duration::from_secs(args.cache_start_seconds);
    tokio::time::sleep(window).await;
    if !running.is_running() {
        anyhow::bail!(
            "the {kind} manager exited during the cache start; see its log in {}",
            dir.display()
        );
    }
    let cpu_after = plane.cpu_seconds().await?;
    let (_, apiserver_peak) = memory_mib(apiserver)?;
    let (manager_peak, _) = running.memory_mib()?;
    let (lists_after, seconds_after) = streaming_lists(&plane).await?;
    let counts_after = plane.request_counts().await?;
    running.stop();
    plane.down();
    Ok(CacheStartResult {
        who: kind.to_string(),
        first_lists: how.label().to_owned(),
        nodes: count,
        window_seconds: window.as_secs(),
        apiserver_cpu_seconds: cpu_after - cpu_before,
        apiserver_rss_before_mib: rss_before,
        apiserver_peak_rss_mib: apiserver_peak,
        manager_peak_rss_mib: manager_peak,
        streaming_lists: (lists_after - lists_before).round() as u64,
        streaming_seconds: seconds_after - seconds_before,
        requests: node_and_service_requests(&counts_before, &counts_after),
    })
}

/// The report's section.
pub(crate) fn section(md: &mut String, rows: &[CacheStartResult]) {
    let Some(first) = rows.first() else {
        return;
    };
    let _ = writeln!(md, "## Cache start ({} nodes)\n", first.nodes);
    let _ = writeln!(
        md,
        "The API server holds {} kubelet-sized nodes; a manager running only the service controller (its caches: Nodes and Services; no Service, so no write) starts at its own defaults but for client-go's `WatchListClient` gate, set as each row says, and the API server is measured for {} s. *API server CPU*: its CPU seconds over the window. *API server memory*: its resident memory when the manager started → its peak over the window (VmHWM, reset at the start). *Streamed*: streaming lists the API server completed (Nodes and Services) and their seconds. *Requests*: the manager's finished requests for Nodes and Services (a watch counts when it ends: a refused one at once, a running one not at all). The Go manager is upstream's (client-go 1.37: streaming lists by default, protobuf); ours reads its caches in protobuf (`--kube-api-content-type`, upstream's default; JSON until 2026-12-02) and pages by default.\n",
        first.nodes, first.window_seconds
    );
    let _ = writeln!(
        md,
        "| manager | first lists | API server CPU | API server memory | manager peak RSS | streamed | requests |"
    );
    let _ = writeln!(md, "| --- | --- | ---: | ---: | ---: | ---: | --- |");
    for row in rows {
        let requests: Vec<String> = row
            .requests
            .iter()
            .map(|(what, n)| format!("{what} ×{n}"))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} s | {:.0} → {:.0} MiB (+{:.0}) | {:.0} MiB | {} in {:.2} s | {} |",
            row.who,
            row.first_lists,
            row.apiserver_cpu_seconds,
            row.apiserver_rss_before_mib,
            row.apiserver_peak_rss_mib,
            row.apiserver_peak_rss_mib - row.apiserver_rss_before_mib,
            row.manager_peak_rss_mib,
            row.streaming_lists,
            row.streaming_seconds,
            if requests.is_empty() {
                "none finished".to_owned()
            } else {
                requests.join(", ")
            }
        );
    }
    let _ = writeln!(md);
}
