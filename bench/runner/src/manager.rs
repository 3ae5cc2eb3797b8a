//! The two managers under test, started with the same cloud behavior and comparable settings, and what
//! the runner reads of them: process CPU and memory, and the cloud's call counts and backend sets.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::Context as _;

/// Which manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// This project's.
    Rust,
    /// Upstream's k8s.io/cloud-provider with its fake provider (bench/go-ccm).
    Go,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Rust => "rust",
            Kind::Go => "go",
        })
    }
}

/// The settings a manager runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Settings {
    /// Each manager's own defaults (Go: QPS 20 / burst 30, 1 node worker, 1 service worker; Rust: QPS
    /// 200 / burst 400, 16 and 16).
    Defaults,
    /// Both at QPS 200 / burst 400, 16 node workers, 16 service workers.
    Equal,
    /// Both with 16 node and 16 service workers and a client-side limit too high to bind (QPS and burst
    /// 100,000): what each implementation makes of the API server when its own limiter is out of the way.
    Unthrottled,
}

/// The client-side token bucket both managers get at [`Settings::Equal`].
pub(crate) const EQUAL_QPS: f64 = 200.0;
/// See [`EQUAL_QPS`].
pub(crate) const EQUAL_BURST: f64 = 400.0;
/// A client-side limit too high to bind ([`Settings::Unthrottled`]).
const UNTHROTTLED: f64 = 100_000.0;

impl Settings {
    /// The flags that differ from a manager's defaults.
    fn flags(self) -> Vec<String> {
        let (qps, burst) = match self {
            Settings::Defaults => return Vec::new(),
            Settings::Equal => (EQUAL_QPS, EQUAL_BURST),
            Settings::Unthrottled => (UNTHROTTLED, UNTHROTTLED),
        };
        vec![
            format!("--kube-api-qps={qps}"),
            format!("--kube-api-burst={burst}"),
            "--concurrent-node-syncs=16".to_owned(),
            "--concurrent-service-syncs=16".to_owned(),
        ]
    }

    /// The client-side token bucket (QPS, burst) `kind` runs with at these settings: what the
    /// token-bucket floor of node initialization, (2N − burst) / QPS, is computed from.
    pub(crate) fn token_bucket(self, kind: Option<Kind>) -> (f64, f64) {
        match (self, kind) {
            (Settings::Defaults, Some(Kind::Go)) => (20.0, 30.0),
            (Settings::Defaults, _) => (200.0, 400.0),
            (Settings::Equal, _) => (EQUAL_QPS, EQUAL_BURST),
            (Settings::Unthrottled, _) => (UNTHROTTLED, UNTHROTTLED),
        }
    }
}

impl Settings {
    /// The token bucket (QPS, burst) of the API limit's minimal client at these settings: none
    /// unthrottled (the API server's own limit), the managers' bucket at equal settings.
    pub(crate) fn minimal_client_bucket(self) -> Option<(f64, f64)> {
        (self != Settings::Unthrottled).then(|| self.token_bucket(None))
    }
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Settings::Defaults => "own defaults",
            Settings::Equal => "equal settings",
            Settings::Unthrottled => "equal, unthrottled",
        })
    }
}

/// Paths to the two binaries (only those of the managers measured are needed).
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub(crate) rust: Option<PathBuf>,
    pub(crate) go: Option<PathBuf>,
}

/// How fresh the Rust fake cloud's counters and backends must be when the runner reads them (from its
/// state file, which a background writer updates; the Go peer's are read from its memory).
#[derive(Debug, Clone, Copy)]
pub(crate) enum StatsFreshness {
    /// The fake's default (200 ms): for the node-initialization and steady-state runs, where the state
    /// file holds thousands of backends and is read only after the run.
    Default,
    /// Within 10 ms: for the load-balancer churn, whose settle time the runner measures by polling the
    /// backends; a 200 ms writer would add up to 200 ms to ours and nothing to the Go peer's.
    Immediate,
}

impl StatsFreshness {
    fn flush_interval(self) -> &'static str {
        match self {
            Self::Default => "200ms",
            Self::Immediate => "10ms",
        }
    }
}

/// Flags and environment a run adds to a manager's.
#[derive(Debug, Default)]
pub(crate) struct Extra<'a> {
    pub(crate) args: &'a [&'a str],
    pub(crate) env: &'a [(&'a str, &'a str)],
}

/// A running manager.
pub(crate) struct Running {
    pub(crate) kind: Kind,
    child: Child,
    state_file: PathBuf,
    stats_addr: String,
}

/// The cloud-side counters of a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct CloudStats {
    pub(crate) calls: BTreeMap<String, u64>,
    pub(crate) backends: BTreeMap<String, Vec<String>>,
}

impl Running {
    /// Starts `kind` at `settings`, with `extra` flags and environment added (`--controllers=...`
    /// replaces the default selection: cloud-node, cloud-node-lifecycle and service).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        kind: Kind,
        settings: Settings,
        bins: &Binaries,
        kubeconfig: &Path,
        dir: &Path,
        latency: &str,
        stats: StatsFreshness,
        extra: &Extra,
    ) -> anyhow::Result<Self> {
        let state_file = dir.join(format!("{kind}-cloud-state.json"));
        let log = std::fs::File::create(dir.join(format!("{kind}-manager.log")))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let stats_addr = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--cloud-provider=fake".to_owned(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
        ];
        if !extra.args.iter().any(|a| a.starts_with("--controllers=")) {
            args.push("--controllers=cloud-node,cloud-node-lifecycle,service".to_owned());
        }
        args.extend(settings.flags());
        args.extend(extra.args.iter().map(|a| a.to_string()));
        let mut command = match kind {
            Kind::Rust => {
                let config = dir.join("rust-cloud-config.yaml");
                // The default ipPool (a /24) holds 254 addresses; the runner provisions 500 load
                // balancers (the Go peer counts on past 203.0.113.254 the same way).
                std::fs::write(
                    &config,
                    format!(
                        "stateFile: {}\nstateFileBatched: true\nstateFileFlushInterval: {}\nlatency: {latency}\nloadBalancers: {{ipPool: 203.0.112.0/22}}\n",
                        state_file.display(),
                        stats.flush_interval(),
                    ),
                )?;
                let mut command = Command::new(bins.rust.as_ref().context("--rust-bin is needed")?);
                command
                    .args(&args)
                    .arg(format!("--cloud-config={}", config.display()));
                // Warnings only, as upstream's `--v=0`; `CCM_BENCH_RUST_LOG` (a `RUST_LOG` filter) to
                // diagnose a run, e.g. `info` for the node sync's passes. Logging costs CPU: not for
                // runs whose figures are quoted.
                let filter = std::env::var("CCM_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into());
                command.env("RUST_LOG", filter);
                command
            }
            Kind::Go => {
                let mut command = Command::new(bins.go.as_ref().context("--go-bin is needed")?);
                command.args(&args).arg("--v=0");
                command
                    .env("BENCH_LATENCY", latency)
                    .env("BENCH_STATS_ADDR", &stats_addr);
                command
            }
        };
        let child = command
            .envs(extra.env.iter().copied())
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the {kind} manager"))?;
        Ok(Self {
            kind,
            child,
            state_file,
            stats_addr,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak and current resident memory, in MiB (VmHWM, VmRSS).
    pub(crate) fn memory_mib(&self) -> anyhow::Result<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let field = |name: &str| -> f64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
                .unwrap_or(0.0)
                / 1024.0
        };
        Ok((field("VmHWM:"), field("VmRSS:")))
    }

    /// CPU seconds used so far (user + system).
    pub(crate) fn cpu_seconds(&self) -> anyhow::Result<f64> {
        process_cpu_seconds(&self.pid().to_string())
    }

    pub(crate) async fn cloud_stats(&self) -> anyhow::Result<CloudStats> {
        match self.kind {
            Kind::Rust => {
                let state =
                    cloud_provider_fake::CloudState::read(&self.state_file).unwrap_or_default();
                Ok(CloudStats {
                    calls: state.calls.into_iter().collect(),
                    backends: state
                        .load_balancers
                        .into_iter()
                        .map(|lb| (lb.service, lb.nodes.to_vec()))
                        .collect(),
                })
            }
            Kind::Go => {
                let output = tokio::process::Command::new("curl")
                    .args(["-s", "--max-time", "5"])
                    .arg(format!("http://{}/stats", self.stats_addr))
                    .output()
                    .await?;
                let json: serde_json::Value =
                    serde_json::from_slice(&output.stdout).unwrap_or_default();
                let calls = json["calls"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                            .collect()
                    })
                    .unwrap_or_default();
                let backends = json["backends"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| {
                                let nodes = v
                                    .as_array()
                                    .map(|a| {
                                        a.iter()
                                            .filter_map(|n| n.as_str().map(str::to_owned))
                                            .collect()
                                    })
                                    .unwrap_or_default();
                                (k.clone(), nodes)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(CloudStats { calls, backends })
            }
        }
    }

    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        for _ in 0..100 {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) a process used so far; `pid` may be `self`.
pub(crate) fn process_cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of /proc/<pid>/stat (utime, stime), counted after the name's closing ')'.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((ticks(11) + ticks(12)) / 100.0)
}
