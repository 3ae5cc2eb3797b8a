//! Running it for real: the deploy manifests, the secure endpoint with delegated auth, leader election,
//! graceful shutdown and failover between two replicas, all against the real API server.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    coordination::v1::Lease,
    core::v1::ServiceAccount,
};
use kube::{Api, api::PostParams};
use serde_json::json;
use support::{
    RunningManager, SERIAL, admin, create_namespace, create_node, delete_nodes, eventually,
    free_port, get_node, https_get, kubeconfig_token, load_balancer_service,
    replica::{Replica, holder, leader_among, lease},
    services, status_ip,
};
use test_control_plane::{
    apply_manifest, control_plane, kubelet_node, unique_name, workspace_root,
};

#[tokio::test]
async fn the_deploy_manifests_pass_a_server_side_dry_run() {
    let client = admin().await;
    let mut files: Vec<_> = std::fs::read_dir(workspace_root().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    // rbac.yaml before deployment.yaml: the ServiceAccount must exist for a dry run of the Deployment.
    files.sort_by_key(|p| !p.ends_with("rbac.yaml"));
    assert!(files.len() >= 2, "{files:?}");
    for file in files {
        let yaml = std::fs::read_to_string(&file).unwrap();
        apply_manifest(&client, &yaml, file.ends_with("deployment.yaml")).await;
    }
    // The role has no wildcards.
    let rbac = std::fs::read_to_string(workspace_root().join("deploy/rbac.yaml")).unwrap();
    assert!(!rbac.contains('*'), "a wildcard in deploy/rbac.yaml");
}

async fn service_account_token(namespace: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin().await, namespace);
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("a token")
}

/// A manager serving its HTTPS endpoint on a free loopback port, with `args` besides, once `/healthz`
/// answers there.
async fn manager_serving(args: &[&str]) -> (RunningManager, u16) {
    let port = free_port();
    let port_arg = format!("--secure-port={port}");
    let mut all = vec![port_arg.as_str(), "--bind-address=127.0.0.1"];
    all.extend_from_slice(args);
    let manager = RunningManager::start("", &all).await;
    eventually("the endpoint", Duration::from_secs(20), || async {
        (https_get(port, "/healthz", None).await.0 == 200).then_some(())
    })
    .await;
    (manager, port)
}

#[tokio::test]
async fn the_secure_endpoint_serves_health_openly_and_metrics_to_authorized_callers_only() {
    let _serial = SERIAL.lock().await;
    let (manager, port) =
        manager_serving(&["--leader-elect=true", "--controllers=cloud-node"]).await;
    assert_eq!(
        https_get(port, "/healthz", None).await,
        (200, "ok".to_owned())
    );
    assert_eq!(https_get(port, "/livez", None).await.0, 200);
    assert_eq!(https_get(port, "/readyz", None).await.0, 200);
    // Controller checks appear once the controllers run, i.e. once this replica leads.
    let verbose = eventually(
        "the controller's check",
        Duration::from_secs(30),
        || async {
            let (code, body) = https_get(port, "/healthz?verbose", None).await;
            (code == 200 && body.contains("[+]cloud-node-controller ok")).then_some(body)
        },
    )
    .await;
    assert!(verbose.contains("[+]leaderElection ok"), "{verbose}");
    // The supervised tasks (the caches' watches, ...) have a check of their own.
    assert!(verbose.contains("[+]supervisedTasks ok"), "{verbose}");

    // A node to initialize, so the cloud has been called when the metrics are read.
    let node = unique_name("serving");
    create_node(&kubelet_node(&node)).await;
    eventually("the node initialized", Duration::from_secs(20), || async {
        get_node(&node).await.filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_ref())
                .is_some()
        })
    })
    .await;

    // /metrics: anonymous is forbidden, a bad token unauthenticated, cluster-admin allowed.
    let (code, body) = https_get(port, "/metrics", None).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("system:anonymous"), "{body}");
    assert_eq!(
        https_get(port, "/metrics", Some("not-a-token")).await.0,
        401
    );
    let admin_token = kubeconfig_token(&control_plane().admin_kubeconfig());
    let (code, metrics) = https_get(port, "/metrics", Some(&admin_token)).await;
    assert_eq!(code, 200);
    for name in [
        "rest_client_requests_total",
        "rest_client_request_duration_seconds",
        "node_controller_initial_node_sync_delay_seconds",
        "service_controller_load_balancers",
        "cloudprovider_api_request_duration_seconds",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }

    // A ServiceAccount (a Prometheus, say): forbidden until RBAC grants it GET /metrics.
    let namespace = unique_name("metrics");
    create_namespace(&namespace).await;
    let token = service_account_token(&namespace, "prometheus").await;
    assert_eq!(https_get(port, "/metrics", Some(&token)).await.0, 403);
    let grant = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {namespace}-metrics-reader}}
rules: [{{nonResourceURLs: [/metrics], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {namespace}-metrics-reader}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {namespace}-metrics-reader}}
subjects: [{{kind: ServiceAccount, name: prometheus, namespace: {namespace}}}]
"#
    );
    apply_manifest(&admin().await, &grant, false).await;
    // Decisions are cached for 10 s.
    eventually(
        "the grant to take effect",
        Duration::from_secs(30),
        || async { (https_get(port, "/metrics", Some(&token)).await.0 == 200).then_some(()) },
    )
    .await;
    manager.stop().await;
    // The endpoint goes with the manager.
    assert_eq!(https_get(port, "/healthz", None).await.0, 0);
    delete_nodes(&[&node]).await;
}

/// Anyone who reaches the secure port can ask for reviews: a flood of requests nobody authorized (new
/// paths anonymously, new bearer tokens) must never cost the leader its Lease nor stall its controllers
/// (issue #32: at `--kube-api-qps=5` it cost the Lease in 10.2 s). Reviews have a client and a rate of
/// their own, new paths share one cached answer, and the reviews in flight are bounded.
#[tokio::test]
async fn a_flood_of_unauthorized_requests_costs_the_leader_neither_its_lease_nor_its_controllers() {
    let _serial = SERIAL.lock().await;
    let lease_name = "cloud-controller-manager";
    let _ = Api::<Lease>::namespaced(admin().await, "kube-system")
        .delete(lease_name, &Default::default())
        .await;
    let (manager, port) = manager_serving(&[
        "--leader-elect=true",
        "--controllers=cloud-node",
        "--kube-api-qps=20",
        "--kube-api-burst=30",
    ])
    .await;
    let identity = eventually("the lease", Duration::from_secs(30), || async {
        lease(lease_name)
            .await
            .map(|l| holder(&l))
            .filter(|h| !h.is_empty())
    })
    .await;

    // 60 s (six renew deadlines) of requests, half anonymous with a new path each, half with a new
    // token each, over 4 × 100 kept-alive connections from four loopback addresses.
    const FLOOD: Duration = Duration::from_secs(60);
    let sources: Vec<std::net::IpAddr> = (10..14)
        .map(|i| std::net::IpAddr::from([127, 0, 0, i]))
        .collect();
    let flood =
        tokio::spawn(async move { support::flood::flood(port, &sources, 100, FLOOD).await });
    let started = Instant::now();

    // Meanwhile a node joins: the controllers keep working.
    let node = unique_name("flood");
    create_node(&kubelet_node(&node)).await;
    eventually(
        "the node initialized during the flood",
        Duration::from_secs(15),
        || async {
            get_node(&node).await.filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_ref())
                    .is_some()
            })
        },
    )
    .await;
    let node_initialized_after = started.elapsed();
    // The lease stays this replica's and keeps being renewed, every 5 s checked.
    let mut oldest_renewal = 0.0f64;
    while started.elapsed() < FLOOD {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = lease(lease_name).await.expect("the lease");
        assert_eq!(holder(&now), identity, "the leader lost its lease");
        let renewed = now.spec.and_then(|s| s.renew_time).expect("a renew time").0;
        let age = k8s_openapi::jiff::Timestamp::now()
            .duration_since(renewed)
            .as_secs_f64();
        oldest_renewal = oldest_renewal.max(age);
        assert!(
            age < 5.0,
            "the lease was last renewed {age:.1}s ago, during the flood"
        );
    }
    let result = flood.await.unwrap();
    let rate = result.rate();
    println!(
        "flood: {} requests in {:?} ({rate:.0}/s) by code {:?}, {} reconnects; node initialized {node_initialized_after:?} into it; lease at most {oldest_renewal:.1}s unrenewed at a check",
        result.codes.values().sum::<u64>(),
        result.elapsed,
        result.codes,
        result.reconnects
    );
    assert!(
        rate > 200.0,
        "the flood was too thin to prove anything: {result:?}"
    );
    // Each is refused: 403 (anonymous), 401 (a token that is no token) or 429 (no review slot free).
    for code in result.codes.keys() {
        assert!(
            [401, 403, 429].contains(code),
            "a flood request answered {code}: {result:?}"
        );
    }
    // Still the leader: it stops without a lost-lease error.
    manager.stop().await;
    delete_nodes(&[&node]).await;
}

/// The secure endpoint's connections are bounded (issue #32): a connection that never finishes its TLS
/// handshake is closed after 10 s, one whose request headers never finish after the header-read timeout
/// (32 s), and a client holding 1,000 connections (a slowloris) gets at most its address's share
/// (128), so `/healthz` keeps answering everyone else.
#[tokio::test]
async fn slow_and_idle_connections_are_closed_and_a_slowloris_leaves_health_checks_answering() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let _serial = SERIAL.lock().await;
    let (manager, port) = manager_serving(&["--controllers=cloud-node"]).await;

    // A slowloris: 1,000 connections from 127.0.0.1 that never say anything.
    let mut held = Vec::new();
    for _ in 0..1000 {
        held.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect"),
        );
    }
    // Meanwhile a probe from another address is answered, every time.
    for _ in 0..5 {
        let output = tokio::process::Command::new("curl")
            .args([
                "-sk",
                "--max-time",
                "5",
                "--interface",
                "127.0.0.2",
                "-o",
                "/dev/null",
            ])
            .args(["-w", "%{http_code}"])
            .arg(format!("https://127.0.0.1:{port}/healthz"))
            .output()
            .await
            .expect("curl runs");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "200");
    }
    // All but the address's share were closed at once; the rest when their handshake times out.
    let started = Instant::now();
    let closed_at = futures::future::join_all(held.into_iter().map(|mut connection| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(20), connection.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "a connection that never started its handshake is still open after 20 s"
        );
        started.elapsed()
    }))
    .await;
    let at_once = closed_at
        .iter()
        .filter(|t| **t < Duration::from_secs(1))
        .count();
    println!(
        "slowloris: {at_once} of 1,000 connections closed at once, the rest within {:?}",
        closed_at.iter().max().unwrap()
    );
    assert!(at_once >= 1000 - 128, "{at_once} closed at once");

    // Half a request after the handshake: closed after the header-read timeout.
    let mut client = tokio::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl runs");
    let mut stdin = client.stdin.take().unwrap();
    stdin
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let exited = tokio::time::timeout(Duration::from_secs(45), client.wait()).await;
    assert!(
        exited.is_ok(),
        "a connection with half its headers was still open after 45 s"
    );
    println!("half-sent headers: closed after {:?}", started.elapsed());
    drop(stdin);
    manager.stop().await;
}

/// One replica acts, the other waits; SIGKILL of the leader hands over within the lease duration, and
/// SIGTERM of the next leader hands over in seconds (it releases the lease).
#[tokio::test]
async fn two_replicas_fail_over_on_sigkill_and_hand_over_on_sigterm() {
    let _serial = SERIAL.lock().await;
    test_control_plane::apply_shipped_rbac().await;
    let dir = tempfile::tempdir().unwrap();
    // The shipped role allows only the Lease kube-system/cloud-controller-manager. Start without it, so
    // the replicas must create it (the role's `create` rule) as well as take it over.
    let lease_name = "cloud-controller-manager";
    let _ = Api::<Lease>::namespaced(admin().await, "kube-system")
        .delete(lease_name, &Default::default())
        .await;
    let mut replicas = vec![Replica::start(dir.path(), 0), Replica::start(dir.path(), 1)];
    let first = leader_among(
        lease_name,
        &[&replicas[0], &replicas[1]],
        Duration::from_secs(30),
    )
    .await;
    let second = 1 - first;

    // Exactly one acts: only the leader's cloud sees the node.
    let node_a = unique_name("failover-a");
    create_node(&kubelet_node(&node_a)).await;
    eventually(
        "the leader to initialize a node",
        Duration::from_secs(20),
        || async {
            get_node(&node_a).await.filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_ref())
                    .is_some()
            })
        },
    )
    .await;
    eventually(
        "the leader's call counts",
        Duration::from_secs(5),
        || async { (replicas[first].calls("instance_metadata") >= 1).then_some(()) },
    )
    .await;
    assert_eq!(
        replicas[second].calls("instance_metadata"),
        0,
        "the standby acted:\n--- leader:\n{}\n--- standby:\n{}",
        replicas[first].log.lock().unwrap(),
        replicas[second].log.lock().unwrap()
    );

    // SIGKILL: no release; the standby takes over once the lease (15 s) runs out.
    let killed_at = Instant::now();
    replicas[first].signal("KILL");
    replicas[first].wait_exit(Duration::from_secs(5));
    leader_among(lease_name, &[&replicas[second]], Duration::from_secs(30)).await;
    let takeover = killed_at.elapsed();
    // The lease duration, plus up to two retry periods (2 s, +20 % jitter) to notice the last renewal
    // and then the expiry, plus the time to see the new holder here.
    assert!(
        takeover <= Duration::from_secs(15 + 5),
        "takeover after SIGKILL took {takeover:?}"
    );
    let node_b = unique_name("failover-b");
    create_node(&kubelet_node(&node_b)).await;
    eventually(
        "the new leader to initialize a node",
        Duration::from_secs(20),
        || async {
            get_node(&node_b).await.filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_ref())
                    .is_some()
            })
        },
    )
    .await;

    // A fresh standby; SIGTERM of the leader releases the lease and exits 0: handover in seconds.
    replicas.push(Replica::start(dir.path(), 2));
    eventually(
        "the new standby to try",
        Duration::from_secs(20),
        || async { replicas[2].identity() },
    )
    .await;
    let terminated_at = Instant::now();
    replicas[second].signal("TERM");
    assert_eq!(
        replicas[second].wait_exit(Duration::from_secs(35)),
        Some(0),
        "exit status after SIGTERM"
    );
    let leader = leader_among(lease_name, &[&replicas[2]], Duration::from_secs(30)).await;
    assert_eq!(leader, 0);
    let handover = terminated_at.elapsed();
    assert!(
        handover < Duration::from_secs(10),
        "handover after SIGTERM took {handover:?} (the lease is 15 s)"
    );
    let log = replicas[second].log.lock().unwrap().clone();
    assert!(log.contains("released the leader lease"), "{log}");
    assert!(
        !log.contains("stopped on its own"),
        "a spurious warning on SIGTERM:\n{log}"
    );

    replicas[2].signal("TERM");
    assert_eq!(replicas[2].wait_exit(Duration::from_secs(35)), Some(0));
    let released = lease(lease_name).await.unwrap();
    assert_eq!(
        holder(&released),
        "",
        "the lease is released on a clean exit"
    );
    delete_nodes(&[&node_a, &node_b]).await;
}

/// A graceful stop lets in-flight work finish, and the leader keeps renewing its lease meanwhile: a
/// load-balancer ensure that takes longer than the renew deadline (12 s against 10 s) still writes the
/// Service's status after SIGTERM (the write fence would refuse it if renewal stopped at the signal).
#[tokio::test]
async fn in_flight_work_finishes_after_a_stop_signal_while_the_lease_is_renewed() {
    let _serial = SERIAL.lock().await;
    let namespace = unique_name("graceful");
    create_namespace(&namespace).await;
    let node = unique_name("graceful-node");
    create_node(&kubelet_node(&node)).await;
    let manager = RunningManager::start(
        "latency: 12s\n",
        &["--controllers=service", "--leader-elect=true"],
    )
    .await;
    let api = services(&namespace).await;
    api.create(
        &PostParams::default(),
        &load_balancer_service("slow", &[80]),
    )
    .await
    .unwrap();
    // The finalizer is written just before the 12 s cloud call starts.
    eventually("the ensure to start", Duration::from_secs(30), || async {
        let service = api.get_opt("slow").await.unwrap()?;
        (!service.metadata.finalizers.unwrap_or_default().is_empty()).then_some(())
    })
    .await;
    manager.stop().await; // waits for in-flight work (up to 30 s), and checks a clean exit
    let service = api.get("slow").await.unwrap();
    assert!(
        status_ip(&service).is_some(),
        "the status written after the stop signal is missing: {:?}",
        service.status
    );
    api.delete("slow", &Default::default()).await.unwrap();
    // No manager runs now: remove the finalizer so the Service goes (its fake load balancer went with
    // the manager's in-memory cloud).
    api.patch(
        "slow",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .unwrap();
    delete_nodes(&[&node]).await;
}

/// `leader_election_master_status{name}` (client-go's) is 1 on the leader and 0 on a standby, and flips
/// when the leader steps down and the standby takes over.
#[tokio::test]
async fn leader_election_master_status_flips_on_failover() {
    let _serial = SERIAL.lock().await;
    let lease_name = "cloud-controller-manager";
    let _ = Api::<Lease>::namespaced(admin().await, "kube-system")
        .delete(lease_name, &Default::default())
        .await;
    let args = [
        "--leader-elect=true",
        "--controllers=cloud-node",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ];
    let status = |metrics: &cloud_controller_manager::metrics::Metrics| {
        metrics.encode().lines().find_map(|l| {
            l.strip_prefix(r#"leader_election_master_status{name="cloud-controller-manager"} "#)
                .map(str::to_owned)
        })
    };
    let first = RunningManager::start("", &args).await;
    eventually("the first to lead", Duration::from_secs(30), || async {
        (status(&first.metrics).as_deref() == Some("1")).then_some(())
    })
    .await;
    let second = RunningManager::start("", &args).await;
    eventually(
        "the standby to report 0",
        Duration::from_secs(30),
        || async { (status(&second.metrics).as_deref() == Some("0")).then_some(()) },
    )
    .await;
    let first_metrics = first.metrics.clone();
    first.stop().await; // releases the Lease
    assert_eq!(status(&first_metrics).as_deref(), Some("0"), "stepped down");
    eventually("the standby to lead", Duration::from_secs(30), || async {
        (status(&second.metrics).as_deref() == Some("1")).then_some(())
    })
    .await;
    second.stop().await;
}
