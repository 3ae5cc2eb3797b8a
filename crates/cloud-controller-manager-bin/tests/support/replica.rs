//! Manager processes as replicas run them (the real binary, leader election on), and the Lease they
//! compete for.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use test_control_plane::control_plane;

use super::{admin, eventually};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-controller-manager");

/// The Lease the shipped role lets the manager use.
pub const LEASE: &str = "cloud-controller-manager";

/// The Lease `kube-system/<name>`, if it exists.
pub async fn lease(name: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(admin().await, "kube-system")
        .get_opt(name)
        .await
        .unwrap()
}

/// Deletes the Lease `kube-system/<name>` if it exists.
pub async fn delete_lease(name: &str) {
    let _ = Api::<Lease>::namespaced(admin().await, "kube-system")
        .delete(name, &Default::default())
        .await;
}

/// Who holds `lease` ("" when nobody).
pub fn holder(lease: &Lease) -> String {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

/// A manager process as a replica would run it, with its log collected.
pub struct Replica {
    child: Child,
    pub log: Arc<Mutex<String>>,
    /// The fake cloud's state file (none for another provider).
    state_file: Option<PathBuf>,
}

impl Replica {
    /// Replica `index` with its own fake cloud (state file in `dir`), running the cloud-node controller
    /// as `system:cloud-controller-manager`.
    pub fn start(dir: &Path, index: usize) -> Self {
        Self::start_with(dir, index, &control_plane().ccm_kubeconfig(), &[])
    }

    /// Like [`Replica::start`], reaching the API server through `kubeconfig`, with `args` added.
    pub fn start_with(dir: &Path, index: usize, kubeconfig: &Path, args: &[&str]) -> Self {
        let state_file = dir.join(format!("state-{index}.json"));
        let config = dir.join(format!("cloud-{index}.yaml"));
        std::fs::write(&config, format!("stateFile: {}\n", state_file.display())).unwrap();
        let mut all_args = vec!["--controllers=cloud-node"];
        all_args.extend_from_slice(args);
        Self::spawn(&config, state_file, kubeconfig, &all_args)
    }

    /// A replica on the cloud-config file `cloud_config`, whose state file is `state_file` (shared by
    /// every replica given the same file when the config says `stateFileShared: true`), as
    /// `system:cloud-controller-manager`, running exactly the controllers `args` name
    /// (`--controllers=...`; the default `*` otherwise), with leader election on.
    pub fn start_on_cloud(cloud_config: &Path, state_file: &Path, args: &[&str]) -> Self {
        Self::spawn(
            cloud_config,
            state_file.to_owned(),
            &control_plane().ccm_kubeconfig(),
            args,
        )
    }

    /// Like [`Replica::start_on_cloud`], with `env` added to the process's environment.
    pub fn start_on_cloud_with_env(
        cloud_config: &Path,
        state_file: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_with_env(
            cloud_config,
            state_file.to_owned(),
            &control_plane().ccm_kubeconfig(),
            args,
            env,
        )
    }

    /// Like [`Replica::start_on_cloud`], reaching the API server through `kubeconfig`.
    pub fn start_on_cloud_through(
        cloud_config: &Path,
        state_file: &Path,
        kubeconfig: &Path,
        args: &[&str],
    ) -> Self {
        Self::spawn(cloud_config, state_file.to_owned(), kubeconfig, args)
    }

    /// A replica on `--cloud-provider=provider` with the cloud-config file `cloud_config`, reaching the
    /// API server through `kubeconfig`, with `args` added (leader election on).
    pub fn start_provider(
        provider: &str,
        cloud_config: &Path,
        kubeconfig: &Path,
        args: &[&str],
    ) -> Self {
        Self::spawn_provider(provider, cloud_config, None, kubeconfig, args, &[])
    }

    fn spawn(config: &Path, state_file: PathBuf, kubeconfig: &Path, args: &[&str]) -> Self {
        Self::spawn_with_env(config, state_file, kubeconfig, args, &[])
    }

    fn spawn_with_env(
        config: &Path,
        state_file: PathBuf,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_provider("fake", config, Some(state_file), kubeconfig, args, env)
    }

    fn spawn_provider(
        provider: &str,
        config: &Path,
        state_file: Option<PathBuf>,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = Command::new(BIN)
            .arg(format!("--cloud-provider={provider}"))
            .arg(format!("--cloud-config={}", config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--secure-port=0")
            .arg("--leader-elect=true")
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("KUBECONFIG")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
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
            state_file,
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its leader-election identity, once it logged it.
    pub fn identity(&self) -> Option<String> {
        let log = self.log.lock().unwrap();
        let line = log
            .lines()
            .find(|l| l.contains("attempting to acquire leader lease"))?;
        let start = line.find("identity=")? + "identity=".len();
        Some(
            line[start..]
                .split_whitespace()
                .next()?
                .trim_matches('"')
                .to_owned(),
        )
    }

    /// How often its fake cloud was called with `method`.
    pub fn calls(&self, method: &str) -> u64 {
        let state_file = self
            .state_file
            .as_ref()
            .expect("only a fake replica counts its cloud's calls");
        cloud_provider_fake::CloudState::read(state_file)
            .map(|s| s.calls_to(method))
            .unwrap_or(0)
    }

    /// Sends it `signal` (`TERM`, `KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Its exit code, failing if it has not exited `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                started.elapsed() < within,
                "replica did not exit within {within:?}:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its exit code if it has exited.
    pub fn exited(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().unwrap().map(|status| status.code())
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for the Lease to name one of `replicas`, returning its index.
pub async fn leader_among(lease_name: &str, replicas: &[&Replica], within: Duration) -> usize {
    eventually("a leader", within, || async {
        let holder = holder(&lease(lease_name).await?);
        replicas
            .iter()
            .position(|r| r.identity().as_deref() == Some(holder.as_str()))
    })
    .await
}
