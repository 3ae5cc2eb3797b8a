//! The binary's command line: help, every bad-input case, and a clean stop on SIGTERM/SIGINT.

use std::{
    io::Read,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

mod support;

const BIN: &str = env!("CARGO_BIN_EXE_cloud-controller-manager");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs")
}

#[track_caller]
fn assert_fails_with(args: &[&str], code: i32, needles: &[&str]) {
    let output = run(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(code),
        "{args:?} exited {:?}: {stderr}",
        output.status
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: stderr lacks {needle:?}:\n{stderr}"
        );
    }
}

#[test]
fn version_names_the_release_and_the_commit() {
    let output = run(&["--version"]);
    assert!(output.status.success());
    let version = String::from_utf8_lossy(&output.stdout);
    let expected = format!(
        "cloud-controller-manager {} (commit ",
        env!("CARGO_PKG_VERSION")
    );
    assert!(version.starts_with(&expected), "{version}");
    let commit = version
        .trim()
        .trim_start_matches(&expected)
        .trim_end_matches(')');
    let hash = commit.trim_end_matches("-dirty");
    assert!(
        hash == "unknown" || (hash.len() == 12 && hash.chars().all(|c| c.is_ascii_hexdigit())),
        "{version}"
    );
}

#[test]
fn help_lists_the_flags() {
    let output = run(&["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--cloud-provider",
        "--cloud-config",
        "--controllers",
        "--kubeconfig",
        "--master",
        "--kube-api-qps",
        "--kube-api-burst",
        "--allow-untagged-cloud",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn an_unknown_provider_lists_the_known_ones() {
    assert_fails_with(
        &["--cloud-provider=nope"],
        1,
        // The binary's default providers (with --all-features, aws and kubevirt among them).
        &[
            r#"unknown cloud provider "nope" (known providers: "#,
            "fake, ",
            "local)",
        ],
    );
    assert_fails_with(
        &[],
        1,
        &[
            "--cloud-provider cannot be empty (known providers: ",
            "fake, ",
            "local)",
        ],
    );
    assert_fails_with(
        &["--cloud-provider=external"],
        1,
        &["known providers: ", "fake, ", "local"],
    );
}

#[test]
fn an_unreadable_cloud_config_names_the_path() {
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            "--cloud-config=/nonexistent/cloud.yaml",
        ],
        1,
        &[
            "cannot read --cloud-config /nonexistent/cloud.yaml",
            "No such file or directory",
        ],
    );
}

#[test]
fn a_malformed_cloud_config_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud.yaml");
    std::fs::write(
        &path,
        "latency: 20ms\ninstances:\n  node-a:\n    state: exploded\n",
    )
    .unwrap();
    let arg = format!("--cloud-config={}", path.display());
    assert_fails_with(
        &["--cloud-provider=fake", &arg],
        1,
        &[
            &format!("malformed cloud-config {}", path.display()),
            "line 4 column 12",
            "unknown variant `exploded`",
        ],
    );
}

#[test]
fn an_unknown_controller_is_named() {
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            "--controllers=*,-no-such-controller",
        ],
        1,
        &[r#""no-such-controller" is not in the list of known controllers"#],
    );
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            "--controllers",
            "-no-such-controller",
        ],
        1,
        &[r#""no-such-controller" is not in the list of known controllers"#],
    );
}

#[test]
fn a_cloud_without_cluster_id_needs_allow_untagged_cloud() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud.yaml");
    std::fs::write(&path, "hasClusterID: false\n").unwrap();
    let arg = format!("--cloud-config={}", path.display());
    assert_fails_with(&["--cloud-provider=fake", &arg], 1, &["no ClusterID found"]);
    // With the flag it gets past that check, to the (missing) API server configuration.
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            &arg,
            "--allow-untagged-cloud",
            "--configure-cloud-routes=false",
            "--kubeconfig=/nonexistent/kubeconfig",
        ],
        1,
        &["cannot load --kubeconfig /nonexistent/kubeconfig"],
    );
}

#[test]
fn the_route_controller_needs_a_valid_cluster_cidr() {
    // The fake cloud offers routes and every controller is on by default.
    assert_fails_with(
        &["--cloud-provider=fake"],
        1,
        &["--cluster-cidr is empty", "--configure-cloud-routes=false"],
    );
    assert_fails_with(
        &["--cloud-provider=fake", "--cluster-cidr=10.244.0.0"],
        1,
        &["--cluster-cidr: \"10.244.0.0\" is not a CIDR"],
    );
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            "--cluster-cidr=10.0.0.0/8,10.1.0.0/16",
        ],
        1,
        &["one IPv4 and one IPv6"],
    );
    // Without routes, or without the route controller, no --cluster-cidr is needed: the run gets as
    // far as the (missing) kubeconfig.
    for args in [
        ["--cloud-provider=fake", "--configure-cloud-routes=false"],
        ["--cloud-provider=fake", "--controllers=*,-route"],
    ] {
        let mut all = args.to_vec();
        all.push("--kubeconfig=/nonexistent/kubeconfig");
        assert_fails_with(&all, 1, &["cannot load --kubeconfig"]);
    }
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            "--configure-cloud-routes=false",
            "--allocate-node-cidrs",
            "--cluster-cidr=10.0.0.0/16,fd00::/48",
            "--node-cidr-mask-size=24",
        ],
        1,
        &["--node-cidr-mask-size cannot be used with a dual-stack --cluster-cidr"],
    );
}

#[test]
fn malformed_flags_are_rejected() {
    assert_fails_with(&["--kube-api-qps=fast"], 2, &["invalid value 'fast'"]);
    assert_fails_with(
        &["--no-such-flag"],
        2,
        &["unexpected argument '--no-such-flag'"],
    );
    assert_fails_with(
        &["stray-positional"],
        2,
        &["unexpected argument 'stray-positional'"],
    );
    assert_fails_with(
        &[
            "--cloud-provider=fake",
            "--configure-cloud-routes=false",
            "--master=http://[::1",
        ],
        1,
        &["invalid --master"],
    );
    // Upstream's --feature-gates: an unknown gate, a malformed pair, and a gate at a value this manager
    // does not implement are each refused, naming the gate.
    assert_fails_with(
        &["--feature-gates=NoSuchGate=true"],
        2,
        &["--feature-gates", "unrecognized feature gate: NoSuchGate"],
    );
    assert_fails_with(
        &["--feature-gates=ContextualLogging"],
        2,
        &["missing bool value for ContextualLogging"],
    );
    assert_fails_with(
        &["--feature-gates=CloudControllerManagerWebhook=true"],
        2,
        &[
            "CloudControllerManagerWebhook=true is not supported: this manager serves no admission webhooks",
        ],
    );
}

/// Upstream's flags this manager does not implement are refused by name, with why; the webhook ones
/// are accepted at the values that mean "no webhook"; the node-selector flags exclude each other.
#[test]
fn upstream_flags_are_refused_by_name_with_why() {
    assert_fails_with(
        &["--profiling"],
        2,
        &[
            "--profiling is upstream's, not implemented by this manager",
            "/debug/pprof",
        ],
    );
    assert_fails_with(
        &["--webhooks=cloud-node-labels"],
        2,
        &[
            "--webhooks is upstream's, not implemented by this manager",
            "serves no webhooks",
        ],
    );
    assert_fails_with(
        &["--webhook-secure-port=10260"],
        2,
        &["--webhook-secure-port is upstream's", "accepted only at 0"],
    );
    assert_fails_with(
        &["--tls-curve-preferences=4588"],
        2,
        &[
            "--tls-curve-preferences",
            "4588 (X25519MLKEM768) is not offered",
        ],
    );
    assert_fails_with(
        &["--node-selector=a=b", "--node-filter-requirements=c=d"],
        2,
        &[
            "--node-filter-requirements",
            "cannot be used with",
            "--node-selector",
        ],
    );
    // "No webhook" passes parsing: the manager goes on to pick its provider.
    assert_fails_with(
        &[
            "--webhooks=",
            "--webhook-secure-port=0",
            "--profiling=false",
            "--tls-curve-preferences=23,29",
            "--concurrent-node-lifecycle-syncs=2",
            "--node-filter-requirements=cloud=fake",
            "--cloud-provider=no-such-cloud",
        ],
        1,
        &["no-such-cloud"],
    );
}

/// Every flag of upstream's manager (the Go peer: k8s.io/cloud-provider v0.37.1's sample main, as
/// built by bench/go-ccm/build) is on our command line: implemented, or hidden and refused by name
/// with why at any value it cannot mean.
#[test]
fn every_upstream_flag_is_implemented_or_refused_by_name() {
    if Command::new("go").arg("version").output().is_err() {
        eprintln!(
            "\n!!! SKIPPED: no `go` command, so upstream's manager cannot be built to read its flags\n"
        );
        return;
    }
    let help = Command::new(support::go_ccm::binary())
        .arg("--help")
        .output()
        .expect("the Go peer runs");
    let help =
        String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
    let mut upstream: Vec<&str> = help
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line
                .strip_prefix("-v, ")
                .or_else(|| line.strip_prefix("-h, "))
                .unwrap_or(line);
            line.strip_prefix("--")?.split_whitespace().next()
        })
        .filter(|flag| !matches!(*flag, "help" | "version"))
        .collect();
    assert!(upstream.len() > 60, "{help}");
    // Deprecated upstream (k8s.io/cloud-provider v0.37.1 options/kubecloudshared.go), so hidden from its
    // --help, but still accepted there.
    upstream.extend(["allow-untagged-cloud", "node-sync-period"]);
    let manager = cloud_controller_manager::Manager::linked();
    let command = manager.command().unwrap();
    for flag in upstream {
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag))
            .unwrap_or_else(|| panic!("upstream's --{flag} is neither implemented nor refused"));
        if arg.is_hide_set() {
            let err = manager
                .parse_from(["ccm", &format!("--{flag}=\u{1}")])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!(
                    "--{flag} is upstream's, not implemented by this manager: "
                )),
                "{flag}: {err}"
            );
        }
    }
}

/// A `--master` without a scheme made the client panic on a runtime worker (and the manager retry
/// forever); another scheme was retried forever. Both are refused at once now.
#[test]
fn a_master_url_without_an_http_scheme_is_refused_at_once() {
    for (master, needle) in [
        (
            "localhost:6443",
            "a URL with a scheme is needed, for example https://localhost:6443",
        ),
        (
            "ftp://localhost:6443",
            "the scheme must be http or https, not ftp",
        ),
    ] {
        let started = Instant::now();
        assert_fails_with(
            &[
                "--cloud-provider=fake",
                "--configure-cloud-routes=false",
                &format!("--master={master}"),
            ],
            1,
            &[&format!("invalid --master \"{master}\": {needle}")],
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{master}: not refused at once"
        );
    }
}

/// Durations past Go's range (2^63 ns) panicked the flag parser (exit 101); they are a usage error.
#[test]
fn durations_past_go_s_range_are_refused() {
    for flag in [
        "--node-monitor-period",
        "--node-status-update-frequency",
        "--route-reconciliation-period",
        "--leader-elect-lease-duration",
    ] {
        assert_fails_with(
            &[&format!("{flag}=18446744073709551616s")],
            2,
            &["out of range"],
        );
    }
}

fn stops_cleanly_on(signal: &str) {
    let plane = test_control_plane::control_plane();
    // Everything else at its defaults (leader election on, all controllers), but its own port: the two
    // signal tests run at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(BIN)
        .args([
            "--cloud-provider=fake",
            "--bind-address=127.0.0.1",
            "--cluster-cidr=10.244.0.0/16",
        ])
        .arg(format!("--secure-port={port}"))
        .arg("--kubeconfig")
        .arg(plane.admin_kubeconfig())
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it has reached the API server, then signal it.
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0
                || tx
                    .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                    .is_err()
            {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut log = String::new();
    while !log.contains("connected to the API server") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never connected:\n{log}"
        );
        if let Ok(more) = rx.recv_timeout(Duration::from_millis(100)) {
            log.push_str(&more);
        }
    }
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "did not stop within 10 s of SIG{signal}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "exit status after SIG{signal}");
}

#[test]
fn sigterm_stops_it_cleanly() {
    stops_cleanly_on("TERM");
}

#[test]
fn sigint_stops_it_cleanly() {
    stops_cleanly_on("INT");
}
