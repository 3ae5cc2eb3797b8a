//! The node agents announcing by BGP (`hack/cluster manager --agents`: pool `routed`, 10.90.0.0/28 and
//! fd00:90::/124, `announce: bgp`, peers `router` and `router6`) to a real router: FRR (zebra and
//! bgpd, Debian's `frr`) in a network namespace of its own on the cluster's bridge (10.89.0.250,
//! fd00:89::250, AS 64512, taking any node of the bridge's subnets as a neighbour), with a client
//! behind it in another namespace that reaches the VIPs only through the routes the router learnt.
//! The router spreads connections over its ECMP next hops by their ports (L4 hash), and masquerades
//! the client's traffic to the bridge.

use std::{
    net::{IpAddr, SocketAddr},
    process::{Child, Command, Stdio},
    time::Duration,
};

use cluster_tests::{
    LONG, ManagerForm, cluster, deploy, echo_app, eventually, ingress, load_balancer, run,
};
use serde_json::Value;

const ROUTER_NETNS: &str = "ccm-router";
const CLIENT_NETNS: &str = "ccm-routed-client";
const ROUTER_LINK: &str = "ccm-router-h";

fn in_netns(netns: &str, command: &[&str]) -> Result<String, String> {
    let mut all = vec!["ip", "netns", "exec", netns];
    all.extend_from_slice(command);
    run(&all)
}

/// The router and the client behind it; both namespaces (and their links) are removed when dropped.
struct Router {
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
}

impl Router {
    fn start() -> Self {
        Self::remove();
        let dir = tempfile::tempdir().unwrap();
        // zebra and bgpd run as the user frr and write their sockets here.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        for command in [
            vec!["ip", "netns", "add", ROUTER_NETNS],
            vec!["ip", "netns", "add", CLIENT_NETNS],
            vec![
                "ip",
                "link",
                "add",
                ROUTER_LINK,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ROUTER_NETNS,
            ],
            vec!["ip", "link", "set", ROUTER_LINK, "master", "ccm-br0", "up"],
            vec![
                "ip",
                "-n",
                ROUTER_NETNS,
                "link",
                "add",
                "client",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                CLIENT_NETNS,
            ],
        ] {
            run(&command).unwrap();
        }
        for command in [
            "ip address add 10.89.0.250/24 dev eth0",
            "ip address add fd00:89::250/64 dev eth0 nodad",
            "ip address add 10.88.0.1/30 dev client",
            "ip address add fd00:88::1/126 dev client nodad",
            "ip link set lo up",
            "ip link set eth0 up",
            "ip link set client up",
            "sysctl -q -w net.ipv4.ip_forward=1",
            "sysctl -q -w net.ipv6.conf.all.forwarding=1",
            // ECMP by the connection's ports too, so that one client's connections spread.
            "sysctl -q -w net.ipv4.fib_multipath_hash_policy=1",
            "sysctl -q -w net.ipv6.fib_multipath_hash_policy=1",
        ] {
            in_netns(ROUTER_NETNS, &command.split(' ').collect::<Vec<_>>()).unwrap();
        }
        // The client's traffic leaves for the bridge as the router's own: the nodes answer it on-link.
        let nat = "table inet ccm_router_nat {\n chain post {\n  type nat hook postrouting priority 100;\n  oifname \"eth0\" masquerade\n }\n}\n";
        let nft = dir.path().join("nat.nft");
        std::fs::write(&nft, nat).unwrap();
        in_netns(ROUTER_NETNS, &["nft", "-f", &nft.display().to_string()]).unwrap();
        for command in [
            "ip address add 10.88.0.2/30 dev eth0",
            "ip address add fd00:88::2/126 dev eth0 nodad",
            "ip link set lo up",
            "ip link set eth0 up",
            "ip route add default via 10.88.0.1",
            "ip -6 route add default via fd00:88::1",
        ] {
            in_netns(CLIENT_NETNS, &command.split(' ').collect::<Vec<_>>()).unwrap();
        }
        let bgpd = "frr defaults datacenter\nhostname ccm-router\nlog stdout informational\n\
            router bgp 64512\n bgp router-id 10.89.0.250\n no bgp ebgp-requires-policy\n\
            \x20neighbor nodes peer-group\n neighbor nodes remote-as 64513\n bgp listen range 10.89.0.0/24 peer-group nodes\n\
            \x20neighbor nodes6 peer-group\n neighbor nodes6 remote-as 64513\n bgp listen range fd00:89::/64 peer-group nodes6\n\
            \x20neighbor nodes bfd profile nodes\n neighbor nodes6 bfd profile nodes\n\
            \x20address-family ipv4 unicast\n  maximum-paths 8\n  no neighbor nodes6 activate\n exit-address-family\n\
            \x20address-family ipv6 unicast\n  maximum-paths 8\n  neighbor nodes6 activate\n exit-address-family\n";
        std::fs::write(dir.path().join("bgpd.conf"), bgpd).unwrap();
        std::fs::write(dir.path().join("zebra.conf"), "hostname ccm-router\n").unwrap();
        // BFD with every node at the nodes' profile (hack/cluster: MetalLB's default, 300 ms x 3).
        let bfdd = "hostname ccm-router\nlog stdout informational\nbfd\n profile nodes\n  \
            detect-multiplier 3\n  receive-interval 300\n  transmit-interval 300\n";
        std::fs::write(dir.path().join("bfdd.conf"), bfdd).unwrap();
        let path = |name: &str| dir.path().join(name).display().to_string();
        let mut daemons = Vec::new();
        let bfdctl = path("bfdd.sock");
        for (daemon, extra) in [
            ("zebra", vec![]),
            ("bfdd", vec!["--bfdctl", bfdctl.as_str()]),
            ("bgpd", vec!["-S"]),
        ] {
            let log = std::fs::File::create(dir.path().join(format!("{daemon}.log"))).unwrap();
            let mut command = Command::new("ip");
            command
                .args([
                    "netns",
                    "exec",
                    ROUTER_NETNS,
                    &format!("/usr/lib/frr/{daemon}"),
                ])
                .args([
                    "-f",
                    &path(&format!("{daemon}.conf")),
                    "-i",
                    &path(&format!("{daemon}.pid")),
                ])
                .args(["-z", &path("zserv.api"), "--vty_socket", &path("")])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            daemons.push(command.spawn().unwrap());
            // bfdd and bgpd connect to zebra's socket at start.
            std::thread::sleep(Duration::from_millis(500));
        }
        Router { dir, daemons }
    }

    fn remove() {
        let _ = run(&["ip", "netns", "del", CLIENT_NETNS]);
        let _ = run(&["ip", "netns", "del", ROUTER_NETNS]);
        let _ = run(&["ip", "link", "del", ROUTER_LINK]);
    }

    fn vtysh(&self, command: &str) -> Result<Value, String> {
        let text = run(&[
            "vtysh",
            "--vty_socket",
            &self.dir.path().display().to_string(),
            "-c",
            command,
        ])?;
        serde_json::from_str(&text).map_err(|e| format!("{command}: {e}: {text}"))
    }

    /// The next hops bgpd has for `prefix` (best and multipath), sorted.
    fn bgp_next_hops(&self, prefix: &str) -> Vec<String> {
        let family = if prefix.contains(':') { "ipv6" } else { "ipv4" };
        let table = self
            .vtysh(&format!("show bgp {family} unicast json"))
            .unwrap_or_default();
        let mut hops: Vec<String> = table["routes"][prefix]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                p["bestpath"].as_bool() == Some(true) || p["multipath"].as_bool() == Some(true)
            })
            .filter_map(|p| p["nexthops"][0]["ip"].as_str().map(str::to_owned))
            .collect();
        hops.sort();
        hops
    }

    /// The next hops of `prefix` in the router's kernel table (where zebra put the ECMP route).
    fn kernel_next_hops(&self, prefix: &str) -> Vec<String> {
        let family = if prefix.contains(':') { "-6" } else { "-4" };
        let text = in_netns(ROUTER_NETNS, &["ip", family, "-j", "route", "show", prefix])
            .unwrap_or_default();
        let routes: Value = serde_json::from_str(&text).unwrap_or_default();
        let mut hops: Vec<String> = routes
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| {
                let single = r["gateway"].as_str().map(str::to_owned);
                let multi = r["nexthops"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|h| h["gateway"].as_str().map(str::to_owned));
                single.into_iter().chain(multi).collect::<Vec<_>>()
            })
            .collect();
        hops.sort();
        hops
    }

    /// Waits until every node has its IPv4 and IPv6 sessions up with the router (the agents retry
    /// with back-off up to 30 s, and a router started after another one went away is found after
    /// the nodes' hold timer and their next attempt); fails with bgpd's view and log.
    fn wait_for_every_node(&self) {
        let c = cluster();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let summary = self.vtysh("show bgp summary json").unwrap_or_default();
            let established = |family: &str, address: String| {
                summary[family]["peers"][&address]["state"].as_str() == Some("Established")
            };
            let up = c.nodes().iter().all(|n| {
                established("ipv4Unicast", c.node_ip(n).to_string())
                    && established("ipv6Unicast", c.node_ip6(n).to_string())
            });
            if up {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the router has no session with every node after 120 s: {summary}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `GET /` through `vip` from the client behind the router: the pod's name.
    fn get(vip: IpAddr) -> Result<String, String> {
        in_netns(
            CLIENT_NETNS,
            &[
                "curl",
                "-sS",
                "--max-time",
                "2",
                &format!("http://{}/", SocketAddr::new(vip, 80)),
            ],
        )
    }

    /// bfdd's sessions that are up, by the nodes' addresses, sorted.
    fn bfd_up(&self) -> Vec<String> {
        let peers = self.vtysh("show bfd peers json").unwrap_or_default();
        let mut up: Vec<String> = peers
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"].as_str() == Some("up"))
            .filter_map(|p| p["peer"].as_str().map(str::to_owned))
            .collect();
        up.sort();
        up
    }

    fn logs(&self) -> String {
        ["zebra", "bfdd", "bgpd"]
            .iter()
            .map(|d| {
                std::fs::read_to_string(self.dir.path().join(format!("{d}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        for daemon in &mut self.daemons {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        Self::remove();
    }
}

/// The `local_lb_connections` the agent on `node` counted for the load balancer `key`.
fn node_connections(node: &str, key: &str) -> f64 {
    let text = cluster()
        .curl_on_node(node, "http://127.0.0.1:10264/metrics")
        .unwrap_or_default();
    let label = format!("load_balancer=\"{key}\"");
    text.lines()
        .filter(|l| l.starts_with("local_lb_connections_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn host_route(ip: IpAddr) -> String {
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    format!("{ip}/{bits}")
}

#[tokio::test]
async fn a_routed_vip_is_reached_through_every_node_and_an_endpoint_only_vip_through_its_nodes() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let router = Router::start();
    let nodes = c.nodes();
    let node_ips: Vec<String> = nodes.iter().map(|n| c.node_ip(n).to_string()).collect();

    // Every node peers with the router, and runs BFD with it over IPv4 and IPv6.
    router.wait_for_every_node();
    bfd_up_with_every_node(&router).await;

    // Each node says so in an event (after the Warning ones of the attempts made before the router
    // was up).
    eventually(
        "a BGPSessionEstablished event on every node",
        LONG,
        || async {
            let regarding = c.kubectl(
                &[
                    "-n",
                    "default",
                    "get",
                    "events.events.k8s.io",
                    "--field-selector",
                    "reason=BGPSessionEstablished",
                    "-o",
                    "jsonpath={.items[*].regarding.name}",
                ],
                None,
            );
            nodes
                .iter()
                .all(|n| regarding.split_whitespace().any(|r| r == n))
                .then_some(())
        },
    )
    .await;

    let pool = "\"local.ccm.rs/address-pool\": routed";
    let ns = deploy(
        "bgp",
        &[
            echo_app("echo", 3, true, None),
            load_balancer("web", "echo", "", pool),
            // Dual-stack, IPv6 first: the pods have IPv4 addresses only, so a single-stack IPv6
            // Service would have no endpoints (kube-proxy rejects its traffic).
            load_balancer(
                "web6",
                "echo",
                "ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv6, IPv4]",
                pool,
            ),
            // kube-proxy carries this one's traffic from whichever node the router picks.
            load_balancer(
                "web-kp",
                "echo",
                "",
                &format!("{pool}, \"local.ccm.rs/data-path\": kube-proxy"),
            ),
        ],
    )
    .await;
    let (vip, ip_mode) = ingress(ns.name(), "web").await;
    assert!(
        vip.to_string().starts_with("10.90.0."),
        "{vip} is not of the routed pool"
    );
    assert_eq!(ip_mode, "Proxy");

    // One path per node in the router's BGP table, and the same ECMP route in its kernel.
    let mut expected = node_ips.clone();
    expected.sort();
    let prefix = host_route(vip);
    eventually(&format!("{prefix} through every node"), LONG, || async {
        let bgp = router.bgp_next_hops(&prefix);
        let kernel = router.kernel_next_hops(&prefix);
        (bgp == expected && kernel == expected).then_some(())
    })
    .await;

    // The client behind the router reaches it (once kube-proxy on every node programmed the new
    // Service's NodePort, which each node's data plane relays to: until then a connection relayed
    // to a node without it is refused); its connections spread over the nodes.
    eventually("10 answers in a row through the router", LONG, || async {
        (0..10).all(|_| Router::get(vip).is_ok()).then_some(())
    })
    .await;
    let key = format!("{}/web", ns.name());
    let before: Vec<f64> = nodes.iter().map(|n| node_connections(n, &key)).collect();
    let mut failed = Vec::new();
    for _ in 0..60 {
        if let Err(err) = Router::get(vip) {
            failed.push(err);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 60 requests failed: {failed:?}\n{}",
        failed.len(),
        router.logs()
    );
    let through: Vec<f64> = nodes
        .iter()
        .zip(&before)
        .map(|(n, b)| node_connections(n, &key) - b)
        .collect();
    assert!(
        through.iter().filter(|n| **n > 0.0).count() >= 2,
        "60 connections went through {through:?} (per node): the router's ECMP did not spread them"
    );

    // The kube-proxy data path (ipMode: VIP): each node holds the VIP on its loopback and kube-proxy
    // takes what the router sends it there to the pods.
    let (vip_kp, ip_mode_kp) = ingress(ns.name(), "web-kp").await;
    assert_eq!(ip_mode_kp, "VIP");
    let prefix_kp = host_route(vip_kp);
    eventually(&format!("{prefix_kp} through every node"), LONG, || async {
        (router.kernel_next_hops(&prefix_kp) == expected).then_some(())
    })
    .await;
    let pods: std::collections::BTreeSet<String> = eventually(
        "30 answers in a row from the kube-proxy VIP through the router",
        LONG,
        || async {
            let answers: Result<Vec<String>, String> =
                (0..30).map(|_| Router::get(vip_kp)).collect();
            answers.ok().map(|a| a.into_iter().collect())
        },
    )
    .await;
    assert!(
        pods.len() >= 2,
        "30 requests through the router reached only {pods:?}"
    );

    // IPv6: the session with router6 carries it.
    let (vip6, _) = ingress(ns.name(), "web6").await;
    assert!(
        vip6.is_ipv6(),
        "{vip6}: the first ingress of an IPv6-first Service"
    );
    let prefix6 = host_route(vip6);
    let mut expected6: Vec<String> = nodes.iter().map(|n| c.node_ip6(n).to_string()).collect();
    expected6.sort();
    eventually(&format!("{prefix6} through every node"), LONG, || async {
        (router.bgp_next_hops(&prefix6) == expected6
            && router.kernel_next_hops(&prefix6) == expected6)
            .then_some(())
    })
    .await;
    eventually("the client reaches the IPv6 VIP", LONG, || async {
        Router::get(vip6).ok()
    })
    .await;

    // externalTrafficPolicy: Local: only the nodes with a ready endpoint are next hops, and they follow
    // the endpoint when it moves.
    let first = &nodes[1];
    let second = &nodes[2];
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(
            &[
                echo_app("pinned", 1, false, Some(first)),
                load_balancer("local", "pinned", "externalTrafficPolicy: Local", pool),
            ]
            .join("---\n"),
        ),
    );
    let (local_vip, _) = ingress(ns.name(), "local").await;
    let local_prefix = host_route(local_vip);
    for node in [first, second] {
        if node == second {
            c.kubectl(
                &["-n", ns.name(), "apply", "-f", "-"],
                Some(&echo_app("pinned", 1, false, Some(second))),
            );
        }
        let expected = vec![c.node_ip(node).to_string()];
        eventually(
            &format!("{local_prefix} through {node} only"),
            LONG,
            || async {
                (router.bgp_next_hops(&local_prefix) == expected
                    && router.kernel_next_hops(&local_prefix) == expected)
                    .then_some(())
            },
        )
        .await;
        eventually(
            &format!("the client reaches {local_vip} through {node}"),
            LONG,
            || async { Router::get(local_vip).ok() },
        )
        .await;
    }

    // The Service gone: its routes are withdrawn from every node.
    c.kubectl(&["-n", ns.name(), "delete", "service", "web"], None);
    eventually(&format!("{prefix} withdrawn"), LONG, || async {
        (router.bgp_next_hops(&prefix).is_empty() && router.kernel_next_hops(&prefix).is_empty())
            .then_some(())
    })
    .await;

    // The agents' metrics say the sessions are up, with MetalLB's names.
    for node in &nodes {
        let text = c
            .curl_on_node(node, "http://127.0.0.1:10264/metrics")
            .unwrap_or_default();
        for line in [
            "metallb_bgp_session_up{peer=\"10.89.0.250:179\"} 1",
            "metallb_bfd_session_up{peer=\"10.89.0.250\"} 1",
            "metallb_bfd_session_up{peer=\"fd00:89::250\"} 1",
        ] {
            assert!(text.contains(line), "{node}: no {line:?} in its metrics");
        }
    }
}

/// A node dies (its link to the bridge cut, as `bench/local-failover` does): the router's BFD finds
/// it gone after 3 missed packets of 300 ms, and drops its routes then rather than after the 9 s
/// hold time; the client's requests go to the other nodes. Its link back, its sessions come back
/// and the router routes to it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_s_routes_are_withdrawn_by_bfd() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let router = std::sync::Arc::new(Router::start());
    let nodes = c.nodes();
    let (_ns, vip, prefix) = routed_service(&router, "bgp-bfd").await;
    bfd_up_with_every_node(&router).await;

    let victim = nodes[1].clone();
    let victim_ip = c.node_ip(&victim).to_string();
    let sampler = Sampler::start(router.clone(), vip, prefix.clone());
    let link = Link::cut(&victim);
    let cut = std::time::Instant::now();
    eventually(
        &format!("{victim}'s next hop gone from the router's kernel table"),
        LONG,
        || async { (!router.kernel_next_hops(&prefix).contains(&victim_ip)).then_some(()) },
    )
    .await;
    let withdrawn_after = cut.elapsed();
    // Still cut: the router's BFD ended the session (its log: the Cease, subcode BFD Down, it sent),
    // not its hold timer.
    let logs = router.logs();
    assert!(
        logs.contains(&format!(
            "sent to neighbor {victim_ip} 6/10 (Cease/BFD Down)"
        )) || logs.contains(&format!(
            "{victim_ip}(Unknown) in vrf default Down BFD down received"
        )),
        "the router dropped {victim_ip} other than by BFD:\n{logs}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(link);
    let (_, requests, failed) = sampler.stop().await;
    eprintln!(
        "{victim} cut: its routes withdrawn after {withdrawn_after:?} (BFD 300 ms x 3, hold time 9 s); \
         {} of {requests} requests failed meanwhile (those hashed to it until then)",
        failed.len()
    );

    // The node back: its sessions and BFD come back, and so does its next hop.
    router.wait_for_every_node();
    bfd_up_with_every_node(&router).await;
    eventually(&format!("{victim} routed to again"), LONG, || async {
        (router.kernel_next_hops(&prefix).len() == nodes.len()).then_some(())
    })
    .await;
}

/// Waits until the router's BFD sessions with every node, over IPv4 and IPv6, are up.
async fn bfd_up_with_every_node(router: &Router) {
    let c = cluster();
    let mut all: Vec<String> = c
        .nodes()
        .iter()
        .flat_map(|n| [c.node_ip(n).to_string(), c.node_ip6(n).to_string()])
        .collect();
    all.sort();
    eventually("BFD up with every node", LONG, || async {
        (router.bfd_up() == all).then_some(())
    })
    .await;
}

/// A node's link to the bridge, set down; up again when dropped.
struct Link(String);

impl Link {
    fn cut(node: &str) -> Self {
        run(&["ip", "link", "set", node, "down"]).unwrap();
        Link(node.to_owned())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = run(&["ip", "link", "set", &self.0, "up"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_of_the_agents_keeps_every_route_and_fails_no_request() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let router = std::sync::Arc::new(Router::start());
    let nodes = c.nodes();
    let (_ns, vip, prefix) = routed_service(&router, "bgp-roll").await;

    // While the agents roll: the router's kernel route sampled, and the client asking, every 100 ms.
    let sampler = Sampler::start(router.clone(), vip, prefix.clone());
    c.kubectl(
        &[
            "-n",
            "kube-system",
            "rollout",
            "restart",
            "daemonset/local-agent",
        ],
        None,
    );
    let status = tokio::task::spawn_blocking(|| {
        cluster().kubectl(
            &[
                "-n",
                "kube-system",
                "rollout",
                "status",
                "daemonset/local-agent",
                "--timeout=180s",
            ],
            None,
        )
    });
    status.await.unwrap();
    // The last node's successor opens its sessions after its hand-over: a few seconds more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (fewest, asked, failed) = sampler.stop().await;
    println!(
        "agents rolled over BGP: {} of {asked} requests failed; the route had at least {fewest} of {} next hops",
        failed.len(),
        nodes.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {asked} requests failed: {failed:?}",
        failed.len()
    );
    assert_eq!(
        fewest,
        nodes.len(),
        "a node's route left the router's kernel during the roll (graceful restart should keep it)\n{}",
        router.logs()
    );
    // Every node's new agent has its sessions up, and the routes are fresh (not stale).
    eventually("the routes refreshed by the new agents", LONG, || async {
        let table = router
            .vtysh(&format!("show bgp ipv4 unicast {prefix} json"))
            .ok()?;
        let paths = table["paths"].as_array()?;
        (paths.len() == nodes.len() && paths.iter().all(|p| p["stale"].as_bool() != Some(true)))
            .then_some(())
    })
    .await;
}

/// The router's kernel route to a VIP sampled, and the client behind it asking the VIP, every 100 ms,
/// on a thread of its own until stopped.
struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, usize, Vec<String>)>,
}

impl Sampler {
    fn start(router: std::sync::Arc<Router>, vip: IpAddr, prefix: String) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut fewest = usize::MAX;
                let (mut asked, mut failed) = (0, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    fewest = fewest.min(router.kernel_next_hops(&prefix).len());
                    asked += 1;
                    if let Err(err) = Router::get(vip) {
                        failed.push(err);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                (fewest, asked, failed)
            })
        };
        Sampler { stop, thread }
    }

    /// The fewest next hops seen, the requests asked, and those that failed.
    async fn stop(self) -> (usize, usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap()
    }
}

/// A routed Service (`web`, over the echo app on every node) in a namespace of the test's own, once
/// the router has its route through every node and the client gets steady answers: its VIP and
/// host route.
async fn routed_service(
    router: &Router,
    prefix_of_namespace: &str,
) -> (cluster_tests::Namespace, IpAddr, String) {
    let nodes = cluster().nodes();
    router.wait_for_every_node();
    let ns = deploy(
        prefix_of_namespace,
        &[
            echo_app("echo", 3, true, None),
            load_balancer("web", "echo", "", "\"local.ccm.rs/address-pool\": routed"),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    let prefix = host_route(vip);
    eventually(&format!("{prefix} through every node"), LONG, || async {
        (router.kernel_next_hops(&prefix).len() == nodes.len()).then_some(())
    })
    .await;
    eventually("10 answers in a row through the router", LONG, || async {
        (0..10).all(|_| Router::get(vip).is_ok()).then_some(())
    })
    .await;
    (ns, vip, prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_vip_keeps_serving_while_the_api_server_is_frozen() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let router = std::sync::Arc::new(Router::start());
    let nodes = c.nodes();
    let (_ns, vip, prefix) = routed_service(&router, "bgp-frozen").await;
    let sampler = Sampler::start(router.clone(), vip, prefix.clone());
    {
        let _frozen = cluster_tests::FrozenApiServer::freeze();
        tokio::time::sleep(Duration::from_secs(40)).await;
    }
    let (fewest, asked, failed) = sampler.stop().await;
    println!(
        "API server frozen 40s over BGP: {} of {asked} requests failed; the route had at least {fewest} of {} next hops",
        failed.len(),
        nodes.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {asked} requests failed while frozen: {failed:?}",
        failed.len()
    );
    assert_eq!(
        fewest,
        nodes.len(),
        "a node's route left the router while the API server was frozen"
    );
}
