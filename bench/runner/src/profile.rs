//! Profiles of one node-initialization run (`--profile`): a CPU profile of the API server from its own
//! pprof endpoint, summarized with `go tool pprof -top`, and a flame graph of our manager recorded with
//! `perf record` and drawn with inferno (`inferno-collapse-perf`, `inferno-flamegraph`).

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use futures::AsyncReadExt as _;
use kube::Client;
use serde::{Deserialize, Serialize};

/// What the profilers of one run produced; files are named relative to the report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ProfileResult {
    pub(crate) who: String,
    pub(crate) settings: String,
    pub(crate) nodes: usize,
    /// Length of the API server's CPU profile, from the first node creation.
    pub(crate) apiserver_seconds: u64,
    /// `go tool pprof -top` of the API server's profile, by cumulative and by own (flat) time.
    pub(crate) apiserver_top: String,
    /// The same text, saved beside the report.
    pub(crate) apiserver_file: Option<String>,
    /// The manager's flame graph (SVG) beside the report (ours only).
    pub(crate) flamegraph_file: Option<String>,
    /// Samples behind the flame graph.
    pub(crate) flamegraph_samples: u64,
    /// Of those, the ones whose stack perf could not unwind to the thread's start (deeper than the
    /// 64 KiB it copies): drawn under `[unknown]`, from where the unwinding stopped.
    #[serde(default)]
    pub(crate) flamegraph_cut_samples: u64,
    /// What did not work (the run goes on without that profile).
    pub(crate) notes: Vec<String>,
}

/// The tools `--profile` needs, checked before an hour of measuring rather than after.
pub(crate) fn check_tools(flame_graph: bool) -> anyhow::Result<()> {
    let mut needed = vec!["go"];
    if flame_graph {
        needed.extend(["perf", "inferno-collapse-perf", "inferno-flamegraph"]);
    }
    let missing: Vec<&str> = needed.into_iter().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        bail!(
            "--profile needs {} on PATH (bench/run installs inferno into ~/.cache/ccm-rs/tools; perf is the \
             distribution's linux-perf package)",
            missing.join(", ")
        );
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            dir.join(tool)
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// How long to profile the API server for a run of `nodes` nodes: shorter than the run itself at
/// either manager's unthrottled speed (about 5 ms per node here), so the profile holds only busy time.
pub(crate) fn apiserver_seconds(nodes: usize) -> u64 {
    (nodes as u64 / 250).clamp(5, 100)
}

/// Starts the API server's CPU profile (`/debug/pprof/profile`, on by default with `--profiling`);
/// the task ends with the raw profile after `seconds`.
pub(crate) fn start_apiserver(
    client: &Client,
    seconds: u64,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<u8>>> {
    let client = client.clone();
    tokio::spawn(async move {
        let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
            .body(Vec::new())?;
        let mut body = client.request_stream(request).await?;
        let mut raw = Vec::new();
        body.read_to_end(&mut raw).await?;
        Ok(raw)
    })
}

/// Saves the raw profile as `raw`, and returns `go tool pprof -top` of it, cumulative then flat.
pub(crate) async fn summarize_apiserver(raw_profile: &[u8], raw: &Path) -> anyhow::Result<String> {
    std::fs::write(raw, raw_profile)?;
    let mut text = String::new();
    for (title, extra) in [
        (
            "by cumulative time (the function and what it called)",
            Some("-cum"),
        ),
        ("by own time (flat)", None),
    ] {
        let output = tokio::process::Command::new("go")
            .args(["tool", "pprof", "-top", "-nodecount=25"])
            .args(extra)
            .arg(raw)
            .output()
            .await
            .context("running go tool pprof")?;
        if !output.status.success() {
            bail!(
                "go tool pprof failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        text.push_str(&format!("# {title}\n"));
        text.push_str(&String::from_utf8_lossy(&output.stdout));
        text.push('\n');
    }
    Ok(text)
}

/// `perf record` attached to a process.
pub(crate) struct Perf {
    child: Child,
    data: PathBuf,
}

impl Perf {
    /// Samples `pid` at 99 Hz with DWARF call stacks (a release build keeps no frame pointers), copying
    /// the most perf allows of each stack (64 KiB less 8 bytes): a tokio worker's stack of nested futures
    /// outgrows the default 8 KiB, and a cut stack is drawn as a root of its own; `data` is perf's
    /// output file, its log goes beside it.
    pub(crate) fn start(pid: u32, data: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(data.with_extension("log"))?;
        let child = Command::new("perf")
            .args(["record", "-F", "99", "--call-graph", "dwarf,65528", "-o"])
            .arg(data)
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting perf record")?;
        Ok(Self {
            child,
            data: data.to_owned(),
        })
    }

    /// Stops recording (SIGINT, as perf expects) and waits for perf to write its file.
    pub(crate) fn stop(mut self) -> anyhow::Result<PathBuf> {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait()? {
                // perf exits with 130 (SIGINT's) or 0 after a clean stop.
                if !status.success() && status.code() != Some(130) && status.code().is_some() {
                    bail!(
                        "perf record exited with {status}; see {}",
                        self.data.with_extension("log").display()
                    );
                }
                return Ok(self.data.clone());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        bail!("perf record did not stop within 60 s")
    }
}

impl Drop for Perf {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `perf script` of `data`, folded by `inferno-collapse-perf` and drawn by `inferno-flamegraph` into
/// `svg`; returns the number of samples and of those whose stack was cut. Inlined functions get frames of their own (from the line
/// tables of bench/run's release build) when perf resolves them within 10 minutes (it asks addr2line,
/// about 25 s for 500 samples here); otherwise the graph is drawn without them.
pub(crate) async fn flame_graph(
    data: &Path,
    svg: &Path,
    title: &str,
) -> anyhow::Result<(u64, u64)> {
    let script = data.with_extension("script");
    let folded = data.with_extension("folded");
    // Without the period field, each sample counts 1 in the folded stacks (not its period in ns).
    let perf_script = |inline: bool| {
        let mut command = tokio::process::Command::new("perf");
        command
            .arg("script")
            .arg(if inline { "--inline" } else { "--no-inline" })
            .args(["-F", "comm,pid,tid,time,event,ip,sym,dso", "-i"])
            .arg(data)
            .kill_on_drop(true);
        command
    };
    let inlined = tokio::time::timeout(
        Duration::from_secs(600),
        run_to_file(&mut perf_script(true), &script),
    )
    .await;
    if !matches!(inlined, Ok(Ok(()))) {
        eprintln!(
            "bench:   perf script with inlined frames failed or took too long; drawing without them"
        );
        run_to_file(&mut perf_script(false), &script).await?;
    }
    run_to_file(
        tokio::process::Command::new("inferno-collapse-perf")
            .arg("--all")
            .arg(&script),
        &folded,
    )
    .await?;
    let (mut samples, mut cut) = (0, 0);
    for line in std::fs::read_to_string(&folded)?.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        samples += n;
        // "<thread>;[unknown];...": the unwinding stopped before the thread's start.
        if stack.split(';').nth(1) == Some("[unknown]") {
            cut += n;
        }
    }
    // Frames narrower than half a pixel are left out: invisible anyway, and they would double the SVG.
    run_to_file(
        tokio::process::Command::new("inferno-flamegraph")
            .args([
                "--title",
                title,
                "--width",
                "1600",
                "--minwidth",
                "0.5",
                "--colors",
                "rust",
            ])
            .arg(&folded),
        svg,
    )
    .await?;
    Ok((samples, cut))
}

async fn run_to_file(command: &mut tokio::process::Command, out: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(out)?;
    let status = command
        .stdout(file)
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("running {command:?}"))?
        .wait_with_output()
        .await?;
    if !status.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    }
    Ok(())
}
