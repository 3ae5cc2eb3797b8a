//! The `local` cloud's load balancers carrying real traffic: the manager runs in-process against the
//! test control plane's real API server; echo servers on 127.x addresses stand in for the nodes'
//! NodePorts and health endpoints (the nodes' InternalIPs are those addresses).
//!
//! Each test has its own addresses: VIPs in 127.(100+id).0.0/24, nodes at 127.(200+id).0.n, node
//! ports 30(100+id)…, kube-proxy's health port 20(100+id). Its pool `t<id>` is `autoAssign: false` and
//! its Services name it, so a Service of another test (or test binary) never takes one of its addresses.

mod support;

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::*;
use tokio::io::AsyncReadExt;

const LONG: Duration = Duration::from_secs(30);

/// One test's cluster: a manager on `local`, nodes with their stand-ins, a namespace.
struct Scenario {
    id: u8,
    manager: Option<RunningManager>,
    nodes: Vec<FakeNode>,
    namespace: String,
}

impl Scenario {
    fn pool(id: u8) -> String {
        format!("127.{}.0.0/24", 100 + u16::from(id))
    }

    fn node_ip(id: u8, n: usize) -> String {
        format!("127.{}.0.{}", 200 + u16::from(id), n + 1)
    }

    fn node_port(id: u8, n: u16) -> u16 {
        30_000 + 100 * u16::from(id) % 2_700 + n
    }

    fn kube_proxy_port(id: u8) -> u16 {
        20_100 + u16::from(id)
    }

    /// The cloud-config: the named nodes in the inventory (every other node ignored), the test's pool,
    /// fast health checks, a 1 s drain.
    fn config(id: u8, names: &[String]) -> String {
        let machines: String = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                format!(
                    "  {name}: {{addresses: [{{type: InternalIP, address: {}}}]}}\n",
                    Self::node_ip(id, i)
                )
            })
            .collect();
        format!(
            "unlistedNodes: ignore\nmachines:\n{machines}addressPools:\n  - {{name: t{id}, addresses: [{}], autoAssign: false}}\n\
             loadBalancer:\n  kubeProxyHealthPort: {}\n  healthCheck: {{interval: 200ms, timeout: 300ms, healthyThreshold: 1, unhealthyThreshold: 2}}\n  drainTimeout: 1s\n  connectTimeout: 1s\n",
            Self::pool(id),
            Self::kube_proxy_port(id)
        )
    }

    /// Starts `count` node stand-ins serving `node_ports` (and kube-proxy's health port plus
    /// `health_ports`), registers their Nodes and starts the manager.
    async fn start(id: u8, count: usize, node_ports: &[u16], health_ports: &[u16]) -> Self {
        Self::start_with(id, count, node_ports, health_ports, "", &[]).await
    }

    /// As [`Self::start`], with `load_balancer` added to the config's `loadBalancer` section (lines
    /// indented by two) and `args` to the manager's flags.
    async fn start_with(
        id: u8,
        count: usize,
        node_ports: &[u16],
        health_ports: &[u16],
        load_balancer: &str,
        args: &[&str],
    ) -> Self {
        let namespace = test_control_plane::unique_name(&format!("local-lb-{id}"));
        ensure_namespace(&namespace).await;
        let names: Vec<String> = (0..count)
            .map(|i| test_control_plane::unique_name(&format!("lb{id}-n{i}")))
            .collect();
        let mut all_health = vec![Self::kube_proxy_port(id)];
        all_health.extend_from_slice(health_ports);
        let mut nodes = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ip = Self::node_ip(id, i);
            nodes.push(FakeNode::start(name, &ip, node_ports, &all_health).await);
            create_node(name, &[&ip]).await;
        }
        let config = Self::config(id, &names) + load_balancer;
        let manager = RunningManager::start(&config, args).await;
        Self {
            id,
            manager: Some(manager),
            nodes,
            namespace,
        }
    }

    fn manager(&self) -> &RunningManager {
        self.manager.as_ref().expect("the manager runs")
    }

    fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// A LoadBalancer Service of this test (its pool named), with `extra` merged into it.
    async fn service(
        &self,
        name: &str,
        ports: &[(u16, &str, u16)],
        extra: serde_json::Value,
    ) -> IpAddr {
        self.create(name, ports, extra).await;
        wait_for_vip(&self.namespace, name).await
    }

    async fn create(&self, name: &str, ports: &[(u16, &str, u16)], extra: serde_json::Value) {
        let mut service = lb_service(name, ports);
        service["metadata"]["annotations"] =
            json!({ "local.ccm.rs/address-pool": format!("t{}", self.id) });
        merge(&mut service, extra);
        create_service(&self.namespace, service).await;
    }

    /// Deletes the Services, stops the manager and deletes the Nodes.
    async fn finish(mut self) {
        delete_services(&self.namespace).await;
        if let Some(manager) = self.manager.take() {
            manager.stop().await;
        }
        let names = self.names();
        delete_nodes(&names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    }
}

/// A cloud of `config` initialized as a new leader's is (what it reads from the cluster as it starts),
/// and the token that stops its background work.
async fn new_leader(
    config: &str,
) -> (
    cloud_provider_local::LocalCloud,
    tokio_util::sync::CancellationToken,
) {
    let fresh = cloud_provider_local::LocalCloud::new(
        cloud_provider_local::Config::parse(config, None).unwrap(),
        None,
    );
    let stop = tokio_util::sync::CancellationToken::new();
    cloud_provider::CloudProvider::initialize(
        &fresh,
        cloud_provider::InitializeContext {
            client: admin().await,
            supervisor: cloud_provider::Supervisor::new(Default::default(), stop.clone()),
            shutdown: stop.clone(),
            api_outage: cloud_provider::ApiOutage::never(),
            cluster_name: "kubernetes".to_owned(),
        },
    )
    .await
    .unwrap();
    (fresh, stop)
}

fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// Waits until `count` new connections reach exactly the nodes in `expected`.
async fn wait_for_backends(what: &str, vip: IpAddr, port: u16, expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    eventually(what, LONG, || {
        let expected = expected.clone();
        async move {
            let seen: BTreeSet<String> = answering_nodes(vip, port, 12).await.into_iter().collect();
            (seen == expected).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn tcp_and_udp_bytes_flow_through_the_vip() {
    let _serial = SERIAL.lock().await;
    let id = 1;
    let np = Scenario::node_port(id, 0);
    let s = Scenario::start(id, 2, &[np], &[]).await;
    let vip = s
        .service("dns", &[(18053, "TCP", np), (18053, "UDP", np)], json!({}))
        .await;
    assert!(
        vip.to_string().starts_with("127.101.0."),
        "the VIP {vip} is from the pool"
    );
    // The data plane carries the traffic, so kube-proxy must leave the VIP alone: `ipMode: Proxy`,
    // with or without PROXY protocol.
    let status = services(&s.namespace)
        .await
        .get("dns")
        .await
        .unwrap()
        .status;
    let ingress = status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(ingress[0].ip_mode.as_deref(), Some("Proxy"), "{ingress:?}");
    let names = s.names();
    wait_for_backends(
        "both nodes behind the VIP",
        vip,
        18053,
        &[&names[0], &names[1]],
    )
    .await;

    let (node, mut stream) = connect(vip, 18053).await.unwrap();
    assert!(names.contains(&node));
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    echo(&mut stream, &payload).await.unwrap();

    let answer = udp_round_trip("127.0.0.1".parse().unwrap(), vip, 18053, b"hello")
        .await
        .unwrap();
    let (from, echoed) = answer.split_once(':').unwrap();
    assert!(names.iter().any(|n| n == from), "{answer}");
    assert_eq!(echoed, "hello");

    // The load balancer's metrics are on the manager's /metrics, with the bytes that went through.
    let text = s.manager().metrics.encode();
    let bytes_in: u64 = text
        .lines()
        .filter(|l| l.starts_with("local_lb_bytes_in_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(bytes_in > 0, "no bytes counted on /metrics:\n{text}");
    assert!(text.contains("local_lb_backend_healthy{"), "{text}");
    s.finish().await;
}

#[tokio::test]
async fn client_ip_affinity_sticks_to_one_backend() {
    let _serial = SERIAL.lock().await;
    let id = 2;
    let np = Scenario::node_port(id, 0);
    let s = Scenario::start(id, 3, &[np], &[]).await;
    let vip = s
        .service(
            "sticky",
            &[(18080, "TCP", np)],
            json!({"spec": {"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}}),
        )
        .await;
    let names = s.names();
    // Wait until the load balancer answers at all.
    eventually("the VIP answers", LONG, || async move {
        connect(vip, 18080).await.ok().map(|_| ())
    })
    .await;
    for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        let source: IpAddr = source.parse().unwrap();
        let mut seen = BTreeSet::new();
        for _ in 0..10 {
            let (node, _) = connect_from(source, vip, 18080).await.unwrap();
            seen.insert(node);
        }
        assert_eq!(seen.len(), 1, "{source} went to {seen:?}");
        assert!(names.contains(seen.first().unwrap()));
    }
    s.finish().await;
}

#[tokio::test]
async fn a_source_outside_the_source_ranges_is_refused() {
    let _serial = SERIAL.lock().await;
    let id = 3;
    let np = Scenario::node_port(id, 0);
    let s = Scenario::start(id, 1, &[np], &[]).await;
    let vip = s
        .service(
            "private",
            &[(18080, "TCP", np), (18080, "UDP", np)],
            json!({"spec": {"loadBalancerSourceRanges": ["127.0.0.8/29"]}}),
        )
        .await;
    let inside: IpAddr = "127.0.0.9".parse().unwrap();
    let outside: IpAddr = "127.0.0.20".parse().unwrap();
    eventually("an allowed source is served", LONG, || async move {
        connect_from(inside, vip, 18080).await.ok().map(|_| ())
    })
    .await;
    let refused = connect_from(outside, vip, 18080).await;
    assert!(
        refused.is_err(),
        "a source outside 127.0.0.8/29 got an answer: {:?}",
        refused.map(|r| r.0)
    );
    assert!(udp_round_trip(inside, vip, 18080, b"x").await.is_ok());
    assert!(
        udp_round_trip(outside, vip, 18080, b"x").await.is_err(),
        "UDP from outside the ranges is dropped"
    );
    s.finish().await;
}

#[tokio::test]
async fn an_unhealthy_backend_gets_no_new_connections_until_healthy_again() {
    let _serial = SERIAL.lock().await;
    let id = 4;
    let np = Scenario::node_port(id, 0);
    let s = Scenario::start(id, 3, &[np], &[]).await;
    let vip = s.service("web", &[(18080, "TCP", np)], json!({})).await;
    let names = s.names();
    wait_for_backends(
        "all three nodes",
        vip,
        18080,
        &[&names[0], &names[1], &names[2]],
    )
    .await;

    // Within interval 200 ms × unhealthy threshold 2 (the stand-in answers 503 at once, so no check
    // waits for its timeout), plus 150 ms of slack: one failed check too many (a threshold off by one)
    // would most often still leave the node in.
    s.nodes[1].set_healthy(false);
    tokio::time::sleep(Duration::from_millis(200 * 2 + 150)).await;
    let answered = answering_nodes(vip, 18080, 30).await;
    assert!(
        !answered.contains(&names[1]),
        "the unhealthy node still got new connections: {answered:?}"
    );
    assert!(
        answered.iter().all(|n| n == &names[0] || n == &names[2]),
        "{answered:?}"
    );

    s.nodes[1].set_healthy(true);
    wait_for_backends(
        "the node back once healthy",
        vip,
        18080,
        &[&names[0], &names[1], &names[2]],
    )
    .await;
    s.finish().await;
}

#[tokio::test]
async fn external_traffic_policy_local_sends_only_to_nodes_whose_health_check_node_port_answers() {
    let _serial = SERIAL.lock().await;
    let id = 5;
    let np = Scenario::node_port(id, 0);
    let hcnp = Scenario::node_port(id, 1);
    let s = Scenario::start(id, 3, &[np], &[hcnp]).await;
    // Node 2's healthCheckNodePort says "no local endpoint" while its kube-proxy port stays healthy:
    // only the former counts for a Local Service.
    s.nodes[2].set_port_healthy(hcnp, false);
    let vip = s
        .service(
            "local-only",
            &[(18080, "TCP", np)],
            json!({"spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": hcnp}}),
        )
        .await;
    let names = s.names();
    wait_for_backends(
        "the two nodes with endpoints",
        vip,
        18080,
        &[&names[0], &names[1]],
    )
    .await;
    let answered = answering_nodes(vip, 18080, 30).await;
    assert!(!answered.contains(&names[2]), "{answered:?}");
    s.finish().await;
}

#[tokio::test]
async fn an_established_connection_survives_a_change_of_the_backend_set() {
    let _serial = SERIAL.lock().await;
    let id = 6;
    let np = Scenario::node_port(id, 0);
    let mut s = Scenario::start(id, 2, &[np], &[]).await;
    let vip = s.service("steady", &[(18080, "TCP", np)], json!({})).await;
    let names = s.names();
    wait_for_backends("both nodes", vip, 18080, &[&names[0], &names[1]]).await;
    let (on, mut stream) = connect(vip, 18080).await.unwrap();
    echo(&mut stream, b"before").await.unwrap();

    // The node this connection goes to is deleted and a new one joins.
    let newcomer = test_control_plane::unique_name(&format!("lb{id}-n2"));
    let newcomer_ip = Scenario::node_ip(id, 2);
    let mut all = names.clone();
    all.push(newcomer.clone());
    s.manager().set_cloud(&Scenario::config(id, &all));
    s.nodes.push(
        FakeNode::start(
            &newcomer,
            &newcomer_ip,
            &[np],
            &[Scenario::kube_proxy_port(id)],
        )
        .await,
    );
    create_node(&newcomer, &[&newcomer_ip]).await;
    delete_nodes(&[&on]).await;
    let remaining: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|n| *n != on)
        .collect();
    wait_for_backends("the new backend set", vip, 18080, &remaining).await;

    echo(&mut stream, b"after the backend set changed")
        .await
        .expect("the established connection still carries bytes");
    drop(stream);
    s.finish().await;
}

#[tokio::test]
async fn deleting_the_service_closes_its_port() {
    let _serial = SERIAL.lock().await;
    let id = 7;
    let np = Scenario::node_port(id, 0);
    let s = Scenario::start(id, 1, &[np], &[]).await;
    let vip = s
        .service("short-lived", &[(18080, "TCP", np)], json!({}))
        .await;
    eventually("the VIP answers", LONG, || async move {
        connect(vip, 18080).await.ok().map(|_| ())
    })
    .await;
    services(&s.namespace)
        .await
        .delete("short-lived", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the port closed", LONG, || async move {
        match tokio::net::TcpStream::connect((vip, 18080)).await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    })
    .await;
    s.finish().await;
}

#[tokio::test]
async fn a_restarted_manager_keeps_every_vip() {
    let _serial = SERIAL.lock().await;
    let id = 8;
    let np: Vec<u16> = (0..4).map(|n| Scenario::node_port(id, n)).collect();
    let mut s = Scenario::start(id, 1, &np, &[]).await;
    let mut before = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let vip = s
            .service(name, &[(18080 + i as u16, "TCP", np[i])], json!({}))
            .await;
        before.push(vip);
    }
    let names = s.names();
    s.manager.take().unwrap().stop().await;

    // While no manager runs, a Service is created: after the restart it must not get an address the
    // others hold, although it may be synced first.
    s.create("d", &[(18083, "TCP", np[3])], json!({})).await;

    // What a new leader does first, with `d` synced before the others (the order the manager picks is
    // not fixed): initialize reserves what the Services' statuses carry, so `d` gets a free address.
    let (fresh, stop) = new_leader(&Scenario::config(id, &names)).await;
    let d = services(&s.namespace).await.get("d").await.unwrap();
    let status = cloud_provider::LoadBalancer::ensure_load_balancer(&fresh, "kubernetes", &d, &[])
        .await
        .unwrap();
    let first = status.ingress.unwrap()[0].ip.clone().unwrap();
    assert!(
        !before.contains(&first.parse().unwrap()),
        "synced first, d got {first}, which another Service's status carries"
    );
    cloud_provider::LoadBalancer::ensure_load_balancer_deleted(&fresh, "kubernetes", &d)
        .await
        .unwrap();
    stop.cancel();
    drop(fresh);

    s.manager = Some(RunningManager::start(&Scenario::config(id, &names), &[]).await);
    let d = wait_for_vip(&s.namespace, "d").await;
    assert!(
        !before.contains(&d),
        "d got {d}, which another Service holds"
    );
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let service = services(&s.namespace).await.get(name).await.unwrap();
        assert_eq!(status_ips(&service), vec![before[i]], "{name} kept its VIP");
        let vip = before[i];
        let port = 18080 + i as u16;
        eventually(
            &format!("{name} served again at {vip}"),
            LONG,
            || async move { connect(vip, port).await.ok().map(|_| ()) },
        )
        .await;
    }
    s.finish().await;
}

#[tokio::test]
async fn bad_input_is_a_warning_event_on_that_service_and_the_others_keep_serving() {
    let _serial = SERIAL.lock().await;
    let id = 9;
    let np: Vec<u16> = (0..4).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start(id, 1, &np, &[]).await;
    let good = s.service("good", &[(18080, "TCP", np[0])], json!({})).await;
    eventually("the good Service answers", LONG, || async move {
        connect(good, 18080).await.ok().map(|_| ())
    })
    .await;

    // A malformed annotation.
    s.create(
        "bad-annotation",
        &[(18081, "TCP", np[1])],
        json!({"metadata": {"annotations": {"local.ccm.rs/proxy-protocol": "v7"}}}),
    )
    .await;
    // A port another process holds on the requested VIP.
    let taken_vip = "127.109.0.200";
    let _holder = std::net::TcpListener::bind((taken_vip, 18082)).unwrap();
    s.create(
        "taken-port",
        &[(18082, "TCP", np[2])],
        json!({"metadata": {"annotations": {"local.ccm.rs/load-balancer-ips": taken_vip}}}),
    )
    .await;
    // A requested address outside every pool.
    s.create(
        "outside",
        &[(18083, "TCP", np[3])],
        json!({"spec": {"loadBalancerIP": "127.9.9.9"}}),
    )
    .await;

    for (name, expected) in [
        (
            "bad-annotation",
            "local.ccm.rs/proxy-protocol: \"v7\" is not valid",
        ),
        ("taken-port", "port already in use"),
        ("outside", "127.9.9.9 is in no address pool"),
    ] {
        let namespace = s.namespace.clone();
        let note = eventually(&format!("a Warning event on {name}"), LONG, || {
            let namespace = namespace.clone();
            async move {
                events_in(&namespace, name, "SyncLoadBalancerFailed")
                    .await
                    .into_iter()
                    .find_map(|e| e.note.filter(|n| n.contains(expected)))
            }
        })
        .await;
        assert!(note.contains(name), "the event names the Service: {note}");
    }
    // The Services show it too: ccm.rs/LoadBalancerReady says Refused for what the provider will not
    // do, and CloudError for the port it could not bind.
    for (name, reason) in [
        ("good", "Ensured"),
        ("bad-annotation", "Refused"),
        ("outside", "Refused"),
        ("taken-port", "CloudError"),
    ] {
        let api = services(&s.namespace).await;
        eventually(&format!("{name}'s condition to say {reason}"), LONG, || {
            let api = api.clone();
            async move {
                let service = api.get(name).await.ok()?;
                service
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "ccm.rs/LoadBalancerReady" && c.reason == reason)
            }
        })
        .await;
    }
    // The good Service never stopped.
    for _ in 0..5 {
        connect(good, 18080)
            .await
            .expect("the good Service still serves");
    }
    // Its port is bound once the other process lets go (the next retry of its back-off: 5 s, 10 s).
    drop(_holder);
    let vip: IpAddr = taken_vip.parse().unwrap();
    eventually(
        "taken-port serves once the port is free",
        Duration::from_secs(40),
        || async move { connect(vip, 18082).await.ok().map(|_| ()) },
    )
    .await;
    s.finish().await;
}

#[tokio::test]
async fn an_exhausted_pool_is_a_warning_event_and_the_others_keep_their_addresses() {
    let _serial = SERIAL.lock().await;
    let id = 10;
    let np: Vec<u16> = (0..3).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start(id, 1, &np, &[]).await;
    // The pool shrinks to two addresses.
    let names = s.names();
    let small =
        Scenario::config(id, &names).replace(&Scenario::pool(id), "127.110.0.1-127.110.0.2");
    s.manager().set_cloud(&small);
    let a = s.service("one", &[(18080, "TCP", np[0])], json!({})).await;
    let b = s.service("two", &[(18081, "TCP", np[1])], json!({})).await;
    s.create("three", &[(18082, "TCP", np[2])], json!({})).await;
    let namespace = s.namespace.clone();
    eventually("a Warning event on three", LONG, || {
        let namespace = namespace.clone();
        async move {
            events_in(&namespace, "three", "SyncLoadBalancerFailed")
                .await
                .into_iter()
                .find(|e| {
                    e.note.as_deref().is_some_and(|n| {
                        n.contains("no free IPv4 address: pool(s) t10 are exhausted")
                    })
                })
        }
    })
    .await;
    for (vip, port) in [(a, 18080), (b, 18081)] {
        connect(vip, port).await.expect("the others keep serving");
    }
    let three = services(&s.namespace).await.get("three").await.unwrap();
    assert!(status_ips(&three).is_empty());
    // A freed address goes to the waiting Service.
    services(&s.namespace)
        .await
        .delete("one", &DeleteParams::default())
        .await
        .unwrap();
    // (three is retried on its back-off: 5 s, 10 s, 20 s after its failures.)
    let got = eventually("three gets an address", Duration::from_secs(90), || {
        let namespace = s.namespace.clone();
        async move {
            let service = services(&namespace).await.get("three").await.ok()?;
            status_ips(&service).first().copied()
        }
    })
    .await;
    assert_eq!(got, a, "three gets the address one gave back");
    s.finish().await;
}

/// Issue #30: a pool limited to other namespaces refuses the Service (a Warning event that names the
/// limit) and the others keep serving; once the pool admits its namespace and labels, it is served.
#[tokio::test]
async fn a_pool_limited_to_other_namespaces_refuses_a_service_with_a_warning_event() {
    let _serial = SERIAL.lock().await;
    let id = 13;
    let np: Vec<u16> = (0..2).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start(id, 1, &np, &[]).await;
    let names = s.names();
    let limited = |scope: &str| {
        Scenario::config(id, &names).replace(
            "autoAssign: false}",
            &format!("autoAssign: false, {scope}}}"),
        )
    };
    s.manager().set_cloud(&limited("namespaces: [elsewhere]"));
    s.create("outside", &[(18080, "TCP", np[0])], json!({}))
        .await;
    let namespace = s.namespace.clone();
    let warned = |expected: &'static str| {
        let namespace = namespace.clone();
        eventually("a Warning event on outside", LONG, move || {
            let namespace = namespace.clone();
            async move {
                events_in(&namespace, "outside", "SyncLoadBalancerFailed")
                    .await
                    .into_iter()
                    .find(|e| e.note.as_deref().is_some_and(|n| n.contains(expected)))
            }
        })
    };
    warned("pool \"t13\" serves the namespaces elsewhere only, and this Service is in namespace")
        .await;
    let outside = services(&s.namespace).await.get("outside").await.unwrap();
    assert!(status_ips(&outside).is_empty());

    // Its namespace admitted, but only for Services labelled tier=edge: labelled otherwise, still
    // refused, now for its labels.
    s.manager().set_cloud(&limited(&format!(
        "namespaces: [elsewhere, {}], serviceSelector: {{matchLabels: {{tier: edge}}}}",
        s.namespace
    )));
    let label = |tier: &'static str| {
        let namespace = s.namespace.clone();
        async move {
            services(&namespace)
                .await
                .patch(
                    "outside",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"tier": tier}}})),
                )
                .await
                .unwrap();
        }
    };
    label("core").await;
    // (The refusal's new reason joins the Warning event's series, whose note stays the first one's.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outside = services(&s.namespace).await.get("outside").await.unwrap();
    assert!(status_ips(&outside).is_empty(), "still refused");
    // Labelled as the pool asks: served at once (a label the pool selects by syncs the Service).
    label("edge").await;
    let vip = eventually("outside gets an address", LONG, || {
        let namespace = s.namespace.clone();
        async move {
            let service = services(&namespace).await.get("outside").await.ok()?;
            status_ips(&service).first().copied()
        }
    })
    .await;
    connect(vip, 18080).await.expect("served");
    s.finish().await;
}

#[tokio::test]
async fn proxy_protocol_v2_is_sent_and_reported_with_ip_mode_proxy() {
    let _serial = SERIAL.lock().await;
    let id = 11;
    let np = Scenario::node_port(id, 0);
    let s = Scenario::start(id, 1, &[np], &[]).await;
    let vip = s
        .service(
            "proxied",
            &[(18080, "TCP", np)],
            json!({"metadata": {"annotations": {"local.ccm.rs/proxy-protocol": "v2"}}}),
        )
        .await;
    let service = services(&s.namespace).await.get("proxied").await.unwrap();
    let ingress = service
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap();
    assert_eq!(ingress[0].ip_mode.as_deref(), Some("Proxy"));
    // The echo server sends its name first, then echoes what arrives: the PROXY v2 signature.
    let (mut stream, _) = eventually("the VIP answers", LONG, || async move {
        connect(vip, 18080).await.ok().map(|(_, s)| (s, ()))
    })
    .await;
    let mut signature = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut signature))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&signature, b"\r\n\r\n\0\r\nQUIT\n");
    s.finish().await;
}

#[tokio::test]
async fn a_changed_port_is_reapplied_and_the_vip_stays() {
    let _serial = SERIAL.lock().await;
    let id = 12;
    let np: Vec<u16> = (0..2).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start(id, 1, &np, &[]).await;
    let vip = s
        .service("moving", &[(18080, "TCP", np[0])], json!({}))
        .await;
    eventually("port 18080", LONG, || async move {
        connect(vip, 18080).await.ok().map(|_| ())
    })
    .await;
    let patch = json!({"spec": {"ports": [{"name": "tcp-18081", "port": 18081, "targetPort": 8080, "protocol": "TCP", "nodePort": np[1]}]}});
    services(&s.namespace)
        .await
        .patch("moving", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("port 18081 instead of 18080", LONG, || async move {
        let old_closed = tokio::net::TcpStream::connect((vip, 18080)).await.is_err();
        (old_closed && connect(vip, 18081).await.is_ok()).then_some(())
    })
    .await;
    let service = services(&s.namespace).await.get("moving").await.unwrap();
    assert_eq!(status_ips(&service), vec![vip], "the VIP stays");
    s.finish().await;
}

#[tokio::test]
async fn two_services_with_one_sharing_key_share_a_vip_and_it_stays_while_one_does() {
    let _serial = SERIAL.lock().await;
    let id = 14;
    let np: Vec<u16> = (0..2).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start(id, 1, &np, &[]).await;
    let shared = json!({"metadata": {"annotations": {"local.ccm.rs/allow-shared-ip": "pair"}}});
    let http = s
        .service("http", &[(18080, "TCP", np[0])], shared.clone())
        .await;
    let admin = s.service("admin", &[(18081, "TCP", np[1])], shared).await;
    assert_eq!(http, admin, "the two Services share one VIP");
    for port in [18080, 18081] {
        eventually(&format!("{http}:{port} answers"), LONG, || async move {
            connect(http, port).await.ok().map(|_| ())
        })
        .await;
    }
    // One goes: its port closes, the other's stays, on the same address.
    services(&s.namespace)
        .await
        .delete("http", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted Service's port closed", LONG, || async move {
        match tokio::net::TcpStream::connect((http, 18080)).await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    })
    .await;
    connect(admin, 18081)
        .await
        .expect("the other Service still answers on the shared VIP");
    s.finish().await;
}

/// Issue #30: with node agents, a Service whose VIP no live agent serves (none runs, or none of its
/// loadBalancerClass) still gets its address (as MetalLB's controller gives one), and a Warning event
/// NoNodeAgent that says why, once; one an agent of its class serves gets none.
#[tokio::test]
async fn with_node_agents_a_service_no_live_agent_serves_gets_a_warning_event() {
    use k8s_openapi::api::coordination::v1::Lease;
    let _serial = SERIAL.lock().await;
    let id = 15;
    let class = "example.com/edge";
    // The agents would serve: nothing listens here (the node ports only need to differ).
    let np: Vec<u16> = (0..3).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start_with(
        id,
        1,
        &np,
        &[],
        "  mode: agents\n",
        &[&format!("--load-balancer-class={class}")],
    )
    .await;
    // The manager's permission to read the agents' heartbeats, as the local-agents component grants.
    let rbac = std::fs::read_to_string(
        test_control_plane::workspace_root()
            .join("deploy/components/local-agents/manager-rbac.yaml"),
    )
    .unwrap();
    test_control_plane::apply_manifest(&admin().await, &rbac, false).await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(admin().await, "kube-system");
    let lease_name = format!("local-agent-{}", s.names()[0]);
    // An agent's heartbeat as `local-agent` writes it (typed: the API server wants microseconds).
    let heartbeat = |class: Option<&str>| Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(lease_name.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/name".to_owned(),
                    "local-agent".to_owned(),
                )]
                .into(),
            ),
            annotations: class
                .map(|c| [("local.ccm.rs/load-balancer-class".to_owned(), c.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(s.names()[0].clone()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            ..Default::default()
        }),
    };
    let apply = |lease: Lease| {
        let leases = leases.clone();
        let name = lease_name.clone();
        async move {
            leases
                .patch(
                    &name,
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(lease),
                )
                .await
                .unwrap();
        }
    };
    let classed = json!({"spec": {"loadBalancerClass": class}});
    let told = |name: &'static str| {
        let namespace = s.namespace.clone();
        async move { events_in(&namespace, name, "NoNodeAgent").await }
    };

    // No agent at all: the address is given, and the Service is told nobody serves it.
    let vip = s
        .service("lonely", &[(18080, "TCP", np[0])], classed.clone())
        .await;
    let event = eventually("a NoNodeAgent event on lonely", LONG, || async {
        told("lonely").await.into_iter().next()
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.starts_with(&format!("{vip} assigned, but no local-agent has renewed its heartbeat Lease in namespace \"kube-system\"")),
        "{note}"
    );
    // Only agents of no class: told which class is missing.
    apply(heartbeat(None)).await;
    s.service("mismatch", &[(18081, "TCP", np[1])], classed.clone())
        .await;
    let event = eventually("a NoNodeAgent event on mismatch", LONG, || async {
        told("mismatch").await.into_iter().next()
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("no live local-agent serves loadBalancerClass \"{class}\" (live agents in namespace \"kube-system\": 1, serving the Services without a loadBalancerClass)")),
        "{note}"
    );
    // An agent of the class: nothing to tell.
    apply(heartbeat(Some(class))).await;
    s.service("served", &[(18082, "TCP", np[2])], classed).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(told("served").await.is_empty(), "served by a live agent");
    assert_eq!(told("lonely").await.len(), 1, "told once");

    leases
        .delete(&lease_name, &DeleteParams::default())
        .await
        .unwrap();
    s.finish().await;
}

/// Issue #47, leader mode: the data plane runs in the manager's process. With the API server frozen
/// well past the Lease's renew deadline and its duration, the leader stops writing but rides the outage
/// out instead of exiting: its VIP answers every request throughout. Once the API server is back it
/// renews its Lease (nobody could take it), and writes again: a new Service gets its VIP.
#[tokio::test]
async fn a_leader_rides_out_a_frozen_api_server_and_its_vip_answers_throughout() {
    let _serial = SERIAL.lock().await;
    let id = 16;
    let np: Vec<u16> = (0..2).map(|n| Scenario::node_port(id, n)).collect();
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(admin().await, "kube-system");
    let _ = leases
        .delete("cloud-controller-manager", &DeleteParams::default())
        .await;
    let s = Scenario::start_with(
        id,
        1,
        &np,
        &[],
        "",
        &[
            "--leader-elect=true",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=1s",
        ],
    )
    .await;
    let vip = s
        .service("served", &[(18080, "TCP", np[0])], json!({}))
        .await;
    connect(vip, 18080).await.expect("served before the freeze");
    let holder = |lease: k8s_openapi::api::coordination::v1::Lease| {
        lease.spec.and_then(|spec| spec.holder_identity)
    };
    let leader = holder(leases.get("cloud-controller-manager").await.unwrap());
    assert!(leader.is_some(), "the manager leads");

    // Frozen for the renew deadline, the lease duration and 5 s more: a connection every 100 ms.
    let frozen = test_control_plane::control_plane().freeze_api_server();
    let until = std::time::Instant::now() + Duration::from_secs(12);
    let (mut tried, mut failed) = (0, Vec::new());
    while std::time::Instant::now() < until {
        tried += 1;
        if let Err(err) = tokio::time::timeout(Duration::from_secs(1), connect(vip, 18080))
            .await
            .map_err(|_| "no answer within 1 s".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            failed.push(err);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.manager().is_running(), "the leader rides the outage out");
    let riding_out = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(r#"leader_election_riding_out{name="cloud-controller-manager"} "#)
            })
            .map(str::to_owned)
    };
    assert_eq!(
        riding_out(&s.manager().metrics.encode()).as_deref(),
        Some("1"),
        "the gauge says so"
    );
    drop(frozen);
    assert!(
        failed.is_empty(),
        "{} of {tried} connections failed while the API server was frozen: {failed:?}",
        failed.len()
    );

    // Back: the same leader renews, and writes again.
    let second = s
        .service("after", &[(18081, "TCP", np[1])], json!({}))
        .await;
    connect(second, 18081)
        .await
        .expect("the new Service is served");
    assert_eq!(
        holder(leases.get("cloud-controller-manager").await.unwrap()),
        leader,
        "the Lease is still the same leader's"
    );
    assert!(s.manager().is_running());
    assert_eq!(
        riding_out(&s.manager().metrics.encode()).as_deref(),
        Some("0")
    );
    s.finish().await;
}

/// Issue #51 item 2: `ccm.rs/load-balancer-retain: "true"`. Deleting the Service closes its port but
/// keeps its address (recorded in the ConfigMap `kube-system/local-retained-addresses`, which no other
/// Service's allocation may take); a Service of the same namespace and name gets it back and serves on
/// it; removing the ConfigMap's key (an operator's release) frees it for any Service.
#[tokio::test]
async fn a_retained_address_outlives_its_service_is_adopted_and_released() {
    let _serial = SERIAL.lock().await;
    // The ConfigMap and the manager's right to it, as deploy/components/local-pools ships them.
    let client = admin().await;
    for file in [
        "deploy/components/local-pools/rbac.yaml",
        "deploy/components/local-pools/retained-addresses.yaml",
    ] {
        let yaml =
            std::fs::read_to_string(test_control_plane::workspace_root().join(file)).expect(file);
        test_control_plane::apply_manifest(&client, &yaml, false).await;
    }
    let kept_api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "kube-system");
    let id = 17;
    let np: Vec<u16> = (0..3).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start(id, 1, &np, &[]).await;
    let retain = json!({"metadata": {"annotations": {"ccm.rs/load-balancer-retain": "true"}}});
    let vip = s
        .service("web", &[(18080, "TCP", np[0])], retain.clone())
        .await;
    eventually("web answers", LONG, || async move {
        connect(vip, 18080).await.ok().map(|_| ())
    })
    .await;
    let key = format!("{}.web", s.namespace);
    let kept = |key: String| {
        let kept_api = kept_api.clone();
        async move {
            kept_api
                .get("local-retained-addresses")
                .await
                .unwrap()
                .data
                .unwrap_or_default()
                .get(&key)
                .cloned()
        }
    };

    // Deleted: the port closes, the address is recorded as kept.
    services(&s.namespace)
        .await
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("web's port closed", LONG, || async move {
        match tokio::net::TcpStream::connect((vip, 18080)).await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    })
    .await;
    assert_eq!(kept(key.clone()).await, Some(vip.to_string()));
    // Another Service does not get it.
    let other = s
        .service("other", &[(18081, "TCP", np[1])], json!({}))
        .await;
    assert_ne!(other, vip);
    // Nor from a new leader: it reads the kept addresses as it starts.
    let (fresh, stop) = new_leader(&Scenario::config(id, &s.names())).await;
    let mut probe: k8s_openapi::api::core::v1::Service =
        serde_json::from_value(lb_service("probe", &[(18083, "TCP", np[2])])).unwrap();
    probe.metadata.namespace = Some(s.namespace.clone());
    probe.metadata.uid = Some("probe-uid".to_owned());
    probe.metadata.annotations =
        Some([("local.ccm.rs/address-pool".to_owned(), format!("t{id}"))].into());
    let status =
        cloud_provider::LoadBalancer::ensure_load_balancer(&fresh, "kubernetes", &probe, &[])
            .await
            .unwrap();
    let given: IpAddr = status.ingress.unwrap()[0]
        .ip
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(given != vip && given != other, "a new leader gave {given}");
    cloud_provider::LoadBalancer::ensure_load_balancer_deleted(&fresh, "kubernetes", &probe)
        .await
        .unwrap();
    stop.cancel();

    // A Service of the same name adopts it, and serves on it; the record goes.
    let again = s.service("web", &[(18080, "TCP", np[0])], json!({})).await;
    assert_eq!(again, vip);
    eventually("web answers again", LONG, || async move {
        connect(vip, 18080).await.ok().map(|_| ())
    })
    .await;
    eventually("the record gone once adopted", LONG, || {
        let key = key.clone();
        let kept = &kept;
        async move { kept(key).await.is_none().then_some(()) }
    })
    .await;

    // Kept once more, then released by the operator: any Service may have it.
    services(&s.namespace)
        .await
        .patch("web", &PatchParams::default(), &Patch::Merge(&retain))
        .await
        .unwrap();
    services(&s.namespace)
        .await
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("kept again", LONG, || {
        let key = key.clone();
        let kept = &kept;
        async move { (kept(key).await == Some(vip.to_string())).then_some(()) }
    })
    .await;
    kept_api
        .patch(
            "local-retained-addresses",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {key.clone(): null}})),
        )
        .await
        .unwrap();
    let third = s
        .service("third", &[(18082, "TCP", np[2])], json!({}))
        .await;
    assert_eq!(
        third, vip,
        "the released address is the pool's lowest free one again"
    );
    s.finish().await;
}

/// A pool renumbered while the manager runs (a reloaded cloud-config): the Service whose address left
/// every pool gets one of the new range at once and is served there, with the drift check off: the
/// provider's settings change is what syncs it (`LoadBalancer::settings_changes`). A Service of
/// another pool, untouched by the edit, keeps its address and gets no second ensure.
#[tokio::test]
async fn a_renumbered_pool_moves_its_services_at_once() {
    let _serial = SERIAL.lock().await;
    let id = 18;
    let np: Vec<u16> = (0..2).map(|n| Scenario::node_port(id, n)).collect();
    let s = Scenario::start_with(id, 1, &np, &[], "", &["--load-balancer-drift-period=0"]).await;
    let names = s.names();
    // The test's pool in its lower half, and another pool (the upper quarter) for a Service the edit
    // does not touch.
    let lower = Scenario::config(id, &names).replace(
        &format!("{}], autoAssign: false}}", Scenario::pool(id)),
        "127.118.0.0/25], autoAssign: false}\n  - {name: other, addresses: [127.118.0.192/26], autoAssign: false}",
    );
    assert_ne!(
        lower,
        Scenario::config(id, &names),
        "the pools were rewritten"
    );
    s.manager().set_cloud(&lower);
    let vip = s
        .service("moving", &[(18080, "TCP", np[0])], json!({}))
        .await;
    let other = s
        .service(
            "staying",
            &[(18081, "TCP", np[1])],
            json!({"metadata": {"annotations": {"local.ccm.rs/address-pool": "other"}}}),
        )
        .await;
    assert!(
        vip.to_string().starts_with("127.118.0.")
            && vip < "127.118.0.128".parse::<IpAddr>().unwrap()
    );
    connect(vip, 18080)
        .await
        .expect("served on its first address");
    let applies = s.manager().cloud.data_plane_applies();

    // The pool moves to the range's second quarter.
    s.manager()
        .set_cloud(&lower.replace("127.118.0.0/25", "127.118.0.128/26"));
    let namespace = s.namespace.clone();
    let moved = eventually("a new address from the renumbered pool", LONG, || {
        let namespace = namespace.clone();
        async move {
            let service = services(&namespace).await.get("moving").await.ok()?;
            status_ips(&service)
                .first()
                .copied()
                .filter(|ip| ip.to_string().starts_with("127.118.0.") && *ip != vip)
        }
    })
    .await;
    let (low, high): (IpAddr, IpAddr) = (
        "127.118.0.128".parse().unwrap(),
        "127.118.0.191".parse().unwrap(),
    );
    assert!(
        moved >= low && moved <= high,
        "{moved} is in the renumbered pool"
    );
    eventually(
        "served on the new address, not the old",
        LONG,
        || async move {
            let old_closed = tokio::net::TcpStream::connect((vip, 18080)).await.is_err();
            (old_closed && connect(moved, 18080).await.is_ok()).then_some(())
        },
    )
    .await;
    let staying = services(&s.namespace).await.get("staying").await.unwrap();
    assert_eq!(
        status_ips(&staying),
        vec![other],
        "the other pool's Service keeps its address"
    );
    connect(other, 18081).await.expect("and is served");
    assert_eq!(
        s.manager().cloud.data_plane_applies(),
        applies + 1,
        "only the moved Service's load balancer was applied again"
    );
    s.finish().await;
}
