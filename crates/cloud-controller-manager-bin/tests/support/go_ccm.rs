//! The upstream Go cloud-controller-manager (bench/go-ccm: k8s.io/cloud-provider's sample main with a
//! fake cloud that answers like ours) as a child process against the test control plane.
//!
//! The binary is built once by `bench/go-ccm/build` (cached under `~/.cache/ccm-rs/bench/`), so a test
//! that uses this needs the Go toolchain the first time.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use test_control_plane::{control_plane, workspace_root};

/// The Go peer's binary, built (or found in the cache) once per test process.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let script = workspace_root().join("bench/go-ccm/build");
        let output = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|err| panic!("running {}: {err}", script.display()));
        assert!(
            output.status.success(),
            "{} failed ({}): the Go toolchain builds the upstream CCM peer",
            script.display(),
            output.status
        );
        let path = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
        assert!(
            path.is_file(),
            "{} printed {}, which is not a file",
            script.display(),
            path.display()
        );
        path
    })
}

/// The Go peer running as a child process; killed when dropped.
pub struct GoCcm {
    child: Child,
    log: Arc<Mutex<String>>,
    stats_addr: String,
}

impl GoCcm {
    /// Starts the Go peer with the fake cloud against the test control plane, with `args` (upstream's
    /// flags) after `--cloud-provider=fake --kubeconfig=<kubeconfig> --secure-port=0 --v=2`.
    ///
    /// `kubeconfig` is usually the control plane's admin one: upstream's cloud-node controller
    /// *updates* Nodes, which the shipped RBAC (ours patches them) does not grant, so the Go peer runs
    /// as it would with upstream's own role.
    pub fn start(kubeconfig: &Path, args: &[&str]) -> Self {
        let stats_addr = format!("127.0.0.1:{}", super::free_port());
        let mut child = Command::new(binary())
            .arg("--cloud-provider=fake")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--secure-port=0")
            .arg("--v=2")
            .args(args)
            .env_remove("KUBECONFIG")
            .env("BENCH_STATS_ADDR", &stats_addr)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", binary().display()));
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Self {
            child,
            log,
            stats_addr,
        }
    }

    /// Like [`GoCcm::start`] with the test control plane's admin kubeconfig.
    pub fn start_as_admin(args: &[&str]) -> Self {
        Self::start(&control_plane().admin_kubeconfig(), args)
    }

    /// The name the API server records as the field manager of its writes (client-go derives it from
    /// the binary's file name).
    pub fn field_manager() -> String {
        binary().file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Where its `/stats` (cloud call counts and load balancer backends, JSON) is served.
    pub fn stats_addr(&self) -> &str {
        &self.stats_addr
    }

    /// How often its fake cloud was called, by method (`instance_metadata`, ...); empty until the
    /// stats endpoint answers.
    pub async fn calls(&self) -> BTreeMap<String, u64> {
        serde_json::from_value(self.stat("calls").await).unwrap_or_default()
    }

    /// The field `name` of its `/stats`; null until the endpoint answers.
    async fn stat(&self, name: &str) -> serde_json::Value {
        let output = tokio::process::Command::new("curl")
            .args(["-s", "--max-time", "5"])
            .arg(format!("http://{}/stats", self.stats_addr))
            .output()
            .await
            .expect("curl runs");
        serde_json::from_slice::<serde_json::Value>(&output.stdout)
            .map(|stats| stats[name].clone())
            .unwrap_or_default()
    }

    /// Each load balancer's backend nodes as its fake cloud last set them, by `namespace/name`; empty
    /// until the stats endpoint answers.
    pub async fn backends(&self) -> BTreeMap<String, Vec<String>> {
        serde_json::from_value(self.stat("backends").await).unwrap_or_default()
    }

    /// Whether its log has a line containing `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().contains(text)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it `signal` (`TERM`, `KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// Waits for it to exit, failing if it has not within `within`.
    pub fn wait_exit(&mut self, within: Duration) {
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < within,
                "the Go CCM did not exit within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for GoCcm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
