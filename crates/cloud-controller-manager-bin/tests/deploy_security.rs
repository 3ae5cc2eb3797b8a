//! The shipped Deployment runs the manager locked down (non-root, read-only root filesystem, no
//! privilege escalation, no capabilities, the runtime's seccomp profile), and the manager, with the
//! manifest's own flags and its self-signed serving certificate, runs on a read-only root filesystem.

mod support;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Container, PodSpec},
};
use support::{eventually, free_port, https_get};
use test_control_plane::{control_plane, workspace_root};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-controller-manager");
const CONTAINER: &str = "cloud-controller-manager";

fn deployment() -> Deployment {
    let path = workspace_root().join("deploy/deployment.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let deployment = documents
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap_or_else(|| panic!("{}: no Deployment", path.display()));
    serde_json::from_value(deployment).unwrap()
}

fn pod_and_container(deployment: &Deployment) -> (PodSpec, Container) {
    let pod = deployment.spec.template.spec.clone().unwrap();
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == CONTAINER)
        .cloned()
        .unwrap_or_else(|| panic!("no container {CONTAINER}"));
    (pod, container)
}

/// The settings in force for the container: its own, else the pod's (as the kubelet resolves them).
struct Effective {
    run_as_non_root: Option<bool>,
    run_as_user: Option<i64>,
    seccomp: Option<String>,
    read_only_root: Option<bool>,
    allow_privilege_escalation: Option<bool>,
    privileged: Option<bool>,
    dropped: Vec<String>,
    added: Vec<String>,
}

fn effective(pod: &PodSpec, container: &Container) -> Effective {
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    let sc = container.security_context.clone().unwrap_or_default();
    let capabilities = sc.capabilities.clone().unwrap_or_default();
    Effective {
        run_as_non_root: sc.run_as_non_root.or(pod_sc.run_as_non_root),
        run_as_user: sc.run_as_user.or(pod_sc.run_as_user),
        seccomp: sc
            .seccomp_profile
            .or(pod_sc.seccomp_profile)
            .map(|p| p.type_),
        read_only_root: sc.read_only_root_filesystem,
        allow_privilege_escalation: sc.allow_privilege_escalation,
        privileged: sc.privileged,
        dropped: capabilities.drop.unwrap_or_default(),
        added: capabilities.add.unwrap_or_default(),
    }
}

#[test]
fn the_deployment_runs_the_manager_as_non_root_on_a_read_only_root_without_privileges() {
    let deployment = deployment();
    let (pod, container) = pod_and_container(&deployment);
    let e = effective(&pod, &container);
    assert_eq!(e.run_as_non_root, Some(true), "runAsNonRoot");
    // A numeric user: the kubelet can only verify runAsNonRoot for a numeric user (the image's USER may
    // be a name), and 0 would be root.
    assert!(
        e.run_as_user.is_some_and(|uid| uid > 0),
        "runAsUser must be a non-zero number: {:?}",
        e.run_as_user
    );
    assert_eq!(e.read_only_root, Some(true), "readOnlyRootFilesystem");
    assert_eq!(
        e.allow_privilege_escalation,
        Some(false),
        "allowPrivilegeEscalation"
    );
    assert_ne!(e.privileged, Some(true), "privileged");
    assert!(
        e.dropped.iter().any(|c| c == "ALL"),
        "capabilities.drop: {:?}",
        e.dropped
    );
    assert!(e.added.is_empty(), "capabilities.add: {:?}", e.added);
    assert_eq!(
        e.seccomp.as_deref(),
        Some("RuntimeDefault"),
        "seccompProfile"
    );

    // Without NET_BIND_SERVICE a non-root process binds only ports from 1024 up: the secure port (on the
    // host network) and the probes' port must be one of those.
    let port = port_of(&container.args.clone().unwrap_or_default());
    assert!(port >= 1024, "--secure-port={port} needs a capability");
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let probed = &probe.as_ref().unwrap().http_get.as_ref().unwrap().port;
        assert_eq!(
            *probed,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port)
        );
    }
    // Nothing writable is mounted: the manager needs no scratch space (see the test below).
    for mount in container.volume_mounts.iter().flatten() {
        assert_eq!(
            mount.read_only,
            Some(true),
            "{} is mounted writable",
            mount.name
        );
    }
}

fn port_of(args: &[String]) -> i32 {
    args.iter()
        .find_map(|a| a.strip_prefix("--secure-port="))
        .unwrap_or("10258")
        .parse()
        .unwrap()
}

/// Remounts every filesystem but /proc, /dev and /sys read-only (in a private mount namespace: the rest
/// of the machine is untouched), checks that nothing is writable any more, then runs the command. As
/// `readOnlyRootFilesystem: true` with no writable volume leaves the container.
const READ_ONLY_ROOT: &str = r#"
awk '{print $2}' /proc/self/mounts | sort -u | while read -r m; do
  case "$m" in /proc|/proc/*|/dev|/dev/*|/sys|/sys/*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null || true ;; esac
done
for d in / /tmp /var/tmp "$PWD" "$HOME" "$(dirname "$1")"; do
  if ( : > "$d/.ccm-read-only-probe" ) 2>/dev/null; then
    rm -f "$d/.ccm-read-only-probe"; echo "read-only root: $d is still writable" >&2; exit 97
  fi
done
exec "$@"
"#;

/// How this machine can run a process on a read-only root: as root with a private mount namespace, or
/// as an unprivileged user in a user namespace of its own.
fn read_only_root_prefix() -> Option<Vec<&'static str>> {
    [
        vec!["unshare", "--mount", "--propagation", "private"],
        vec![
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ],
    ]
    .into_iter()
    .find(|prefix| {
        Command::new(prefix[0])
            .args(&prefix[1..])
            .args(["sh", "-c", READ_ONLY_ROOT, "sh", "/bin/true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

struct Process {
    child: Mutex<Child>,
    log: Arc<Mutex<String>>,
}

impl Process {
    fn spawn(mut command: Command) -> Self {
        let mut child = command
            .env_remove("RUST_LOG")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
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
            child: Mutex::new(child),
            log,
        }
    }

    fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child.lock().unwrap().try_wait().unwrap()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn terminate(&self, within: Duration) -> Option<i32> {
        let pid = self.child.lock().unwrap().id();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return status.code();
            }
            assert!(
                started.elapsed() < within,
                "no exit within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[tokio::test]
async fn the_manager_with_the_manifests_flags_and_a_self_signed_certificate_runs_on_a_read_only_root()
 {
    test_control_plane::apply_shipped_rbac().await;
    let (_, container) = pod_and_container(&deployment());
    let port = free_port();
    // The manifest's flags, with the test's API server and port; no leader election (the Lease belongs
    // to other tests) and a loopback address.
    let mut args = container.args.clone().unwrap_or_default();
    assert!(
        !args.iter().any(|a| a.starts_with("--tls-cert-file")),
        "the manifest now names a certificate: this test is about the self-signed one"
    );
    args.extend([
        format!(
            "--kubeconfig={}",
            control_plane().ccm_kubeconfig().display()
        ),
        format!("--secure-port={port}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--leader-elect=false".to_owned(),
    ]);
    // The same scratch directory as $HOME, $TMPDIR and the working directory, to see what is written
    // where a program would usually write.
    let scratch = tempfile::tempdir().unwrap();
    let prefix = read_only_root_prefix();
    let mut command = match &prefix {
        Some(prefix) => {
            let mut command = Command::new(prefix[0]);
            command
                .args(&prefix[1..])
                .args(["sh", "-c", READ_ONLY_ROOT, "sh", BIN]);
            command
        }
        None => {
            eprintln!(
                "this machine cannot make a read-only mount namespace (unshare refused); checking \
                 only that nothing is written to $HOME, $TMPDIR or the working directory"
            );
            Command::new(BIN)
        }
    };
    command
        .args(&args)
        .current_dir(scratch.path())
        .env("HOME", scratch.path())
        .env("TMPDIR", scratch.path());
    let manager = Process::spawn(command);
    let served = eventually("HTTPS /healthz", Duration::from_secs(30), || async {
        if let Some(status) = manager.exited() {
            panic!("the manager exited ({status}):\n{}", manager.log());
        }
        let (code, body) = https_get(port, "/healthz", None).await;
        (code == 200).then_some(body)
    })
    .await;
    assert_eq!(served, "ok");
    let log = manager.log();
    assert!(
        !log.contains("Read-only file system") && !log.contains("os error 30"),
        "{log}"
    );
    // A clean shutdown (the Lease is off, so only the controllers stop) needs no disk either.
    assert_eq!(
        manager.terminate(Duration::from_secs(35)),
        Some(0),
        "{}",
        manager.log()
    );
    let written: Vec<_> = std::fs::read_dir(scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        written.is_empty(),
        "the manager wrote {written:?} to {}",
        Path::new(scratch.path()).display()
    );
}
