//! The `local` cloud's node agents (`loadBalancer.mode: agents`, `hack/cluster manager --agents`) on a
//! real cluster: each VIP announced and served from one node, elected per VIP; a node that dies moves
//! only its VIPs, and a client on the bridge (a network namespace of its own) follows the announcement.
//! Here too, with the same client: both modes (agents, and the leader's) through outages of the API
//! server and cuts between the nodes.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use cluster_tests::{
    FrozenApiServer, LONG, ManagerForm, cluster, deploy, echo_app, eventually, ingress,
    load_balancer, node_mac, run,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

/// The client's network namespace and its addresses on the bridge (outside the nodes' .11-.19 (::11-::19),
/// the VIP pools' .64-.127 (::100-::1ff) and the host's .1 (::1)).
const CLIENT_NETNS: &str = "ccm-client";
const CLIENT_IP: &str = "10.89.0.200";
const CLIENT_IP6: &str = "fd00:89::200";

/// A network namespace on the cluster's bridge, as another machine of the nodes' network; removed
/// (with its link) when dropped.
struct Client;

impl Client {
    fn new() -> Self {
        let _ = run(&["ip", "netns", "del", CLIENT_NETNS]);
        for command in [
            vec!["ip", "netns", "add", CLIENT_NETNS],
            vec![
                "ip",
                "link",
                "add",
                "ccm-client-h",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                CLIENT_NETNS,
            ],
            vec![
                "ip",
                "link",
                "set",
                "ccm-client-h",
                "master",
                "ccm-br0",
                "up",
            ],
        ] {
            run(&command).unwrap();
        }
        let address = format!("{CLIENT_IP}/24");
        let address6 = format!("{CLIENT_IP6}/64");
        for command in [
            vec!["ip", "address", "add", address.as_str(), "dev", "eth0"],
            vec![
                "ip",
                "address",
                "add",
                address6.as_str(),
                "dev",
                "eth0",
                "nodad",
            ],
            vec!["ip", "link", "set", "eth0", "up"],
            vec!["ip", "link", "set", "lo", "up"],
        ] {
            Self::exec(&command).unwrap();
        }
        Client
    }

    /// Runs `command` in the client's namespace: its standard output, or what went wrong.
    fn exec(command: &[&str]) -> Result<String, String> {
        let mut all = vec!["ip", "netns", "exec", CLIENT_NETNS];
        all.extend_from_slice(command);
        run(&all)
    }

    /// `GET /` through `vip`, with a short timeout: the pod's name.
    fn get(vip: IpAddr) -> Result<String, String> {
        Self::exec(&[
            "curl",
            "-sS",
            "--max-time",
            "0.5",
            &format!("http://{}/", SocketAddr::new(vip, 80)),
        ])
    }

    /// The client's neighbour entry for `ip`: its MAC address, if it has one.
    fn neighbour(ip: IpAddr) -> Option<String> {
        let text = Self::exec(&["ip", "neigh", "show", &ip.to_string(), "dev", "eth0"]).ok()?;
        let words: Vec<&str> = text.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "lladdr")?;
        words.get(at + 1).map(|w| (*w).to_owned())
    }

    /// How long the kernel of the client takes at least to learn a new MAC address for a neighbour of
    /// `ip`'s family by itself (without an announcement): the delay before its first probe, then its
    /// unicast probes.
    fn relearning_time(ip: IpAddr) -> Duration {
        let family = if ip.is_ipv4() { "ipv4" } else { "ipv6" };
        let read = |name: &str| -> u64 {
            Self::exec(&["cat", &format!("/proc/sys/net/{family}/neigh/eth0/{name}")])
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        Duration::from_secs(read("delay_first_probe_time"))
            + Duration::from_millis(read("ucast_solicit") * read("retrans_time_ms"))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth, and with it the peer on the bridge.
        let _ = run(&["ip", "netns", "del", CLIENT_NETNS]);
        let _ = run(&["ip", "link", "del", "ccm-client-h"]);
    }
}

/// The nodes by the MAC address of their eth0 (what a neighbour entry names).
fn nodes_by_mac() -> BTreeMap<String, String> {
    cluster()
        .nodes()
        .into_iter()
        .map(|n| (node_mac(&n), n))
        .collect()
}

/// The nodes whose eth0 has `vip`.
fn holders(vip: IpAddr) -> Vec<String> {
    cluster()
        .nodes()
        .into_iter()
        .filter(|n| vips_on(n).contains(&vip))
        .collect()
}

/// The VIPs of the pools on a node's eth0 (host addresses: /32 and /128).
fn vips_on(node: &str) -> BTreeSet<IpAddr> {
    let output = cluster().exec_on_node(node, &["ip", "-o", "address", "show", "dev", "eth0"]);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_suffix("/32").or_else(|| w.strip_suffix("/128")))
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// One HTTP/1.1 connection kept open between requests.
struct KeepAlive(BufReader<TcpStream>);

impl KeepAlive {
    async fn open(address: SocketAddr) -> Self {
        Self(BufReader::new(TcpStream::connect(address).await.unwrap()))
    }

    /// `GET path` on this connection: the body.
    async fn get(&mut self, path: &str) -> Result<String, String> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: vip\r\n\r\n");
        let stream = self.0.get_mut();
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut length = 0;
        loop {
            let mut line = String::new();
            let read = tokio::time::timeout(Duration::from_secs(5), self.0.read_line(&mut line))
                .await
                .map_err(|_| "no answer within 5s".to_owned())?
                .map_err(|e| e.to_string())?;
            if read == 0 {
                return Err("the connection was closed".into());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().map_err(|_| line.to_owned())?;
            }
        }
        let mut body = vec![0; length];
        self.0
            .read_exact(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// Kills `victim`, the announcer of `vip`: its link cut (here, so that the clock starts then), then its
/// agent, kubelet, kube-proxy and containers killed (`hack/cluster stop`, which cuts the link first too).
/// Asserts that `vip` answers the client again from another node, and that the client's neighbour entry
/// moved there through the new announcer's announcement, before the client's kernel could have
/// relearnt it by itself.
async fn follow_failover(vip: IpAddr, victim: &str, mac_of: &BTreeMap<String, String>) {
    let relearning = Client::relearning_time(vip);
    run(&["ip", "link", "set", victim, "down"]).unwrap();
    let killed = Instant::now();
    let stop = std::thread::spawn({
        let victim = victim.to_owned();
        move || cluster().script("stop", &["--node", &victim])
    });
    // Both watched in one loop, every 100 ms: the first answer through the VIP, and the moment the
    // client's neighbour entry names another node.
    let (mut failover, mut relearnt) = (None, None);
    while failover.is_none() || relearnt.is_none() {
        assert!(
            killed.elapsed() < LONG,
            "{vip} did not come back within {LONG:?}"
        );
        if relearnt.is_none()
            && let Some(node) = Client::neighbour(vip).and_then(|mac| mac_of.get(&mac).cloned())
            && node != victim
        {
            relearnt = Some((node, killed.elapsed()));
        }
        if failover.is_none() && Client::get(vip).is_ok() {
            failover = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (failover, relearnt) = (failover.unwrap(), relearnt.unwrap());
    stop.join().unwrap();
    println!(
        "failover: {vip} answered {:.1}s after {victim} died, announced by {} (the client's entry moved at {:.1}s; it would relearn by itself after {:.1}s at the earliest)",
        failover.as_secs_f64(),
        relearnt.0,
        relearnt.1.as_secs_f64(),
        relearning.as_secs_f64()
    );
    assert!(
        relearnt.1 < relearning,
        "the client's entry moved after {:?}: by its own probes, not by the announcement",
        relearnt.1
    );
}

async fn wait_node_ready(node: &str) {
    eventually(&format!("node {node} is Ready"), LONG, || async move {
        let out = cluster().kubectl_output(
            &[
                "get",
                "node",
                node,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
            ],
            None,
        );
        (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
    })
    .await;
}

#[tokio::test]
async fn each_vip_is_announced_from_one_node_and_a_dead_node_moves_only_its_own() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let _client = Client::new();
    let nodes = c.nodes();
    let mac_of = nodes_by_mac();

    let mut documents = vec![echo_app("echo", 3, true, None)];
    for i in 1..=6 {
        documents.push(load_balancer(&format!("web{i}"), "echo", "", ""));
    }
    let ns = deploy("agents", &documents).await;
    let mut vips = Vec::new();
    for i in 1..=6 {
        let (vip, mode) = ingress(ns.name(), &format!("web{i}")).await;
        assert_eq!(mode, "Proxy", "the agents' data plane serves web{i}");
        vips.push(vip);
    }

    // Each VIP answers the client, from the node whose MAC the client resolved it to, and is on that
    // node's interface only.
    let mut announcer: BTreeMap<IpAddr, String> = BTreeMap::new();
    for vip in &vips {
        eventually(&format!("{vip} answers the client"), LONG, || async move {
            Client::get(*vip).ok()
        })
        .await;
        let mac = Client::neighbour(*vip).expect("the client resolved the VIP");
        let node = mac_of
            .get(&mac)
            .unwrap_or_else(|| panic!("{vip} resolved to {mac}, no node's"));
        announcer.insert(*vip, node.clone());
    }
    let ours: BTreeSet<IpAddr> = vips.iter().copied().collect();
    for node in &nodes {
        let on: BTreeSet<IpAddr> = announcer
            .iter()
            .filter(|(_, n)| *n == node)
            .map(|(vip, _)| *vip)
            .collect();
        let held: BTreeSet<IpAddr> = vips_on(node).intersection(&ours).copied().collect();
        assert_eq!(held, on, "this test's VIPs on {node}'s eth0");
    }
    let holders: BTreeSet<&String> = announcer.values().collect();
    assert!(holders.len() >= 2, "every VIP on one node: {announcer:?}");
    // Each agent's /metrics (on its node's loopback) counts the VIPs its node announces (this test's,
    // and any other's).
    for node in &nodes {
        let url = "http://127.0.0.1:10264/metrics";
        let text = c.curl_on_node(node, url).unwrap();
        let announced: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("local_agent_vips_announced "))
            .unwrap_or_else(|| panic!("no local_agent_vips_announced in {url}"))
            .trim()
            .parse()
            .unwrap();
        let ours = announcer.values().filter(|n| *n == node).count();
        assert!(
            announced >= ours,
            "{node} announces {announced}, at least {ours} of this test's"
        );
    }
    println!("announcers: {announcer:?}");

    // A connection to a VIP of another node, which must survive the victim's death: a Service with
    // externalTrafficPolicy Local and its only pod on that node (so no byte of it crosses the victim).
    let victim = announcer[&vips[0]].clone();
    let keeper = nodes.iter().find(|n| **n != victim).unwrap().clone();
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(
            &[
                echo_app("pinned", 1, false, Some(&keeper)),
                load_balancer("pinned", "pinned", "externalTrafficPolicy: Local", ""),
            ]
            .join("---\n"),
        ),
    );
    cluster_tests::wait_rollout(ns.name(), "pinned").await;
    let (pinned_vip, _) = ingress(ns.name(), "pinned").await;
    eventually("the pinned VIP answers the client", LONG, || async move {
        Client::get(pinned_vip).ok()
    })
    .await;
    assert_eq!(
        mac_of.get(&Client::neighbour(pinned_vip).unwrap()),
        Some(&keeper),
        "externalTrafficPolicy Local: announced by the node of its endpoint"
    );
    let mut kept = KeepAlive::open(SocketAddr::new(pinned_vip, 80)).await;
    let first = kept.get("/").await.unwrap();

    follow_failover(vips[0], &victim, &mac_of).await;
    // Only the victim's VIPs moved; the others stayed, with their connections.
    for node in nodes.iter().filter(|n| **n != victim) {
        let on = vips_on(node);
        for (vip, was) in &announcer {
            if was == node {
                assert!(on.contains(vip), "{vip} left {node}, which stayed up");
            }
        }
    }
    let second = kept.get("/").await.expect("the kept connection survives");
    assert_eq!(first, second, "the kept connection's pod");

    // The victim comes back: it takes back the VIPs it ranks first for (announcing them again), and
    // holds nothing else.
    c.script("start", &["--node", &victim]);
    wait_node_ready(&victim).await;
    let theirs: BTreeSet<IpAddr> = announcer
        .iter()
        .filter(|(_, n)| **n == victim)
        .map(|(vip, _)| *vip)
        .collect();
    eventually("the victim announces its VIPs again", LONG, || async {
        (vips_on(&victim)
            .intersection(&ours)
            .copied()
            .collect::<BTreeSet<_>>()
            == theirs
            && Client::get(vips[0]).is_ok()
            && Client::neighbour(vips[0]).as_ref() == Some(&node_mac(&victim)))
        .then_some(())
    })
    .await;
}

/// Without node ports too (`allocateLoadBalancerNodePorts: false`, as MetalLB's users set it): with
/// kube-proxy carrying the traffic, nothing needs them.
#[tokio::test]
async fn with_kube_proxy_as_the_data_path_the_pod_sees_the_client() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let _client = Client::new();
    let node = c.nodes()[1].clone();
    let ns = deploy(
        "agents-vip",
        &[
            echo_app("echo", 1, false, Some(&node)),
            load_balancer(
                "direct",
                "echo",
                "externalTrafficPolicy: Local\n  allocateLoadBalancerNodePorts: false",
                "local.ccm.rs/data-path: kube-proxy",
            ),
        ],
    )
    .await;
    let node_ports = c.kubectl(
        &[
            "-n",
            ns.name(),
            "get",
            "service",
            "direct",
            "-o",
            "jsonpath={.spec.ports[*].nodePort}",
        ],
        None,
    );
    assert_eq!(node_ports.trim(), "", "the Service has no node ports");
    let (vip, mode) = ingress(ns.name(), "direct").await;
    assert_eq!(mode, "VIP", "kube-proxy carries it");
    let seen = eventually("the VIP answers the client", LONG, || async move {
        Client::exec(&[
            "curl",
            "-sS",
            "--max-time",
            "0.5",
            &format!("http://{vip}/clientip"),
        ])
        .ok()
    })
    .await;
    assert!(
        seen.starts_with(&format!("{CLIENT_IP}:")),
        "the pod saw {seen:?}, not the client's own address"
    );
    assert_eq!(
        Client::neighbour(vip),
        Some(node_mac(&node)),
        "announced by the node of the endpoint"
    );
    assert!(vips_on(&node).contains(&vip), "{vip} is on {node}'s eth0");
}

#[tokio::test]
async fn two_services_with_one_sharing_key_share_a_vip_announced_from_one_node() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let _client = Client::new();
    let service = |name: &str, port: &str| {
        format!(
            r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  annotations: {{local.ccm.rs/allow-shared-ip: pair}}
spec:
  type: LoadBalancer
  selector: {{app: echo}}
  ports: [{port}]
"#
        )
    };
    let ns = deploy(
        "agents-shared",
        &[
            echo_app("echo", 2, true, None),
            service(
                "http",
                "{name: http, port: 80, targetPort: 8080, protocol: TCP}",
            ),
            service(
                "udp",
                "{name: udp, port: 81, targetPort: 8081, protocol: UDP}",
            ),
        ],
    )
    .await;
    let (http_vip, _) = ingress(ns.name(), "http").await;
    let (udp_vip, _) = ingress(ns.name(), "udp").await;
    assert_eq!(http_vip, udp_vip, "the two Services share one VIP");
    eventually("the shared VIP answers HTTP", LONG, || async move {
        Client::get(http_vip).ok()
    })
    .await;
    let answer = eventually("the shared VIP answers UDP", LONG, || async move {
        cluster_tests::udp_ask(SocketAddr::new(udp_vip, 81), "ping")
            .await
            .ok()
    })
    .await;
    assert_eq!(answer, "ping", "the UDP echo's answer");
    let announcers = holders(http_vip);
    assert_eq!(announcers.len(), 1, "{http_vip} is on {announcers:?}");

    // One of them deleted: the VIP stays, for the other. Both deleted: it leaves every node.
    c.kubectl(
        &["-n", ns.name(), "delete", "service", "http", "--wait=true"],
        None,
    );
    let answer = eventually("the shared VIP still answers UDP", LONG, || async move {
        cluster_tests::udp_ask(SocketAddr::new(udp_vip, 81), "still")
            .await
            .ok()
    })
    .await;
    assert_eq!(answer, "still");
    assert!(
        vips_on(&announcers[0]).contains(&http_vip),
        "{http_vip} left {}",
        announcers[0]
    );
    c.kubectl(
        &["-n", ns.name(), "delete", "service", "udp", "--wait=true"],
        None,
    );
    eventually(
        &format!("{http_vip} leaves every node"),
        LONG,
        || async move { holders(http_vip).is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn an_ipv6_vip_moves_with_an_unsolicited_neighbour_advertisement() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let _client = Client::new();
    let mac_of = nodes_by_mac();
    // A dual-stack Service: an IPv4 and an IPv6 VIP, each elected on its own; the IPv6 one is served by
    // the data plane on its node, which forwards to the nodes' (IPv4) NodePorts.
    let ns = deploy(
        "agents-ipv6",
        &[
            echo_app("echo", 3, true, None),
            load_balancer(
                "web",
                "echo",
                "ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]",
                "",
            ),
        ],
    )
    .await;
    let vips = ingresses(ns.name(), "web", 2).await;
    assert!(
        vips[0].is_ipv4() && vips[1].is_ipv6(),
        "one VIP per family, in the Service's order: {vips:?}"
    );
    let vip = vips[1];
    let pod = eventually(&format!("{vip} answers the client"), LONG, || async move {
        Client::get(vip).ok()
    })
    .await;
    assert!(pod.starts_with("echo-"), "answered {pod:?}");
    // The agents run: the manager, which reads their heartbeats, tells the Service nothing.
    let told = c.kubectl_output(
        &[
            "-n",
            ns.name(),
            "get",
            "events",
            "--field-selector",
            "reason=NoNodeAgent",
            "-o",
            "name",
        ],
        None,
    );
    assert!(told.status.success(), "{told:?}");
    assert_eq!(
        String::from_utf8_lossy(&told.stdout),
        "",
        "NoNodeAgent events"
    );
    let mac = Client::neighbour(vip).expect("the client resolved the VIP");
    let victim = mac_of
        .get(&mac)
        .unwrap_or_else(|| panic!("{vip} resolved to {mac}, no node's"))
        .clone();
    assert_eq!(
        holders(vip),
        std::slice::from_ref(&victim),
        "{vip} is on its announcer only"
    );
    // The Service says which node announces it (recorded once the node serves the VIP).
    let announced = format!("{vip} is announced from node {victim} (interface eth0)");
    let namespace = ns.name().to_owned();
    eventually("the Service's VIPAnnounced event", LONG, || {
        let (announced, namespace) = (announced.clone(), namespace.clone());
        async move {
            let messages = c.kubectl(
                &[
                    "-n",
                    &namespace,
                    "get",
                    "events",
                    "--field-selector",
                    "reason=VIPAnnounced,involvedObject.name=web",
                    "-o",
                    "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
                ],
                None,
            );
            messages.lines().any(|m| m == announced).then_some(())
        }
    })
    .await;

    follow_failover(vip, &victim, &mac_of).await;
    // (The victim is stopped: its namespaces cannot be entered.)
    assert!(
        c.nodes()
            .iter()
            .filter(|n| **n != victim)
            .any(|n| vips_on(n).contains(&vip)),
        "{vip} is on another node's eth0"
    );

    c.script("start", &["--node", &victim]);
    wait_node_ready(&victim).await;
    eventually("the victim announces the IPv6 VIP again", LONG, || async {
        (vips_on(&victim).contains(&vip)
            && Client::get(vip).is_ok()
            && Client::neighbour(vip).as_ref() == Some(&node_mac(&victim)))
        .then_some(())
    })
    .await;
}

/// The `count` load-balancer IPs of Service `namespace/name`, once it has them.
async fn ingresses(namespace: &str, name: &str, count: usize) -> Vec<IpAddr> {
    eventually(
        &format!("Service {namespace}/{name} has {count} load-balancer IPs"),
        LONG,
        || async move {
            let out = cluster().kubectl_output(
                &[
                    "-n",
                    namespace,
                    "get",
                    "service",
                    name,
                    "-o",
                    "jsonpath={.status.loadBalancer.ingress[*].ip}",
                ],
                None,
            );
            let ips: Vec<IpAddr> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|ip| ip.parse().ok())
                .collect();
            (ips.len() == count).then_some(ips)
        },
    )
    .await
}

/// Requests to `vip` from the client every 100 ms for `length`: the moments (since the start) of those
/// that failed, and how many were made.
fn requests_for(
    vip: IpAddr,
    length: Duration,
) -> tokio::task::JoinHandle<(Vec<(Duration, String)>, usize)> {
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let (mut failed, mut made) = (Vec::new(), 0);
        while start.elapsed() < length {
            let at = start.elapsed();
            if let Err(err) = Client::get(vip) {
                failed.push((at, err));
            }
            made += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        (failed, made)
    })
}

/// What the client saw through a freeze of the API server.
struct ThroughAFreeze {
    /// The requests that failed in the 2 s before the freeze: not the outage's doing (the VIP answered
    /// steadily before the client started), reported apart so they are not taken for it.
    before: Vec<String>,
    /// The requests that failed while the API server was frozen (when, since the client started).
    during: Vec<String>,
    /// Those that failed in the 15 s after it resumed: the cluster moving, not the load balancer's
    /// doing (the kube-controller-manager marks the nodes whose kubelets could not report `Unknown`, and
    /// kube-proxy's health and endpoints follow for a moment; MetalLB's VIP fails then too).
    after: Vec<String>,
    made: usize,
}

/// Freezes the API server for `outage` while the client asks `vip` every 100 ms, from 2 s before until
/// 15 s after.
async fn through_a_freeze(vip: IpAddr, outage: Duration) -> ThroughAFreeze {
    let started = Instant::now();
    let traffic = requests_for(vip, outage + Duration::from_secs(17));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let frozen_at = started.elapsed();
    let frozen = FrozenApiServer::freeze();
    tokio::time::sleep(outage).await;
    drop(frozen);
    let resumed = started.elapsed();
    let (failed, made) = traffic.await.unwrap();
    let described = |(at, err): &(Duration, String)| format!("{:.1}s: {err}", at.as_secs_f64());
    let (before, failed): (Vec<_>, Vec<_>) = failed.iter().partition(|(at, _)| *at < frozen_at);
    let (during, after): (Vec<_>, Vec<_>) = failed.into_iter().partition(|(at, _)| *at < resumed);
    ThroughAFreeze {
        before: before.into_iter().map(described).collect(),
        during: during.into_iter().map(described).collect(),
        after: after.into_iter().map(described).collect(),
        made,
    }
}

/// The manager deployed in `form`, the client's namespace, and a namespace `prefix-…` with three echo
/// pods behind a LoadBalancer Service whose VIP answers the client.
async fn one_vip_served(
    form: ManagerForm,
    prefix: &str,
) -> (Client, cluster_tests::Namespace, IpAddr) {
    cluster().ensure_manager(form).await;
    let client = Client::new();
    let ns = deploy(
        prefix,
        &[
            echo_app("echo", 3, true, None),
            load_balancer("web", "echo", "", ""),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    answers_steadily(vip).await;
    (client, ns, vip)
}

/// Waits until `vip` answers 10 requests in a row, 100 ms apart: a new Service's first answer can come
/// while kube-proxy on another node still programs its NodePort (a CI run saw a request time out
/// 0.3 s after the first answer), and the tests that count failed requests measure an outage or an
/// upgrade, not that.
async fn answers_steadily(vip: IpAddr) {
    const IN_A_ROW: usize = 10;
    let deadline = Instant::now() + LONG;
    let mut in_a_row = 0;
    let mut last_error = String::new();
    while in_a_row < IN_A_ROW {
        assert!(
            Instant::now() < deadline,
            "{vip} did not answer {IN_A_ROW} requests in a row within {LONG:?}; last error: {last_error}"
        );
        match tokio::task::spawn_blocking(move || Client::get(vip))
            .await
            .unwrap()
        {
            Ok(_) => in_a_row += 1,
            Err(err) => (in_a_row, last_error) = (0, err),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The API server frozen for 40 s while a client asks a VIP every 100 ms: the agents hear each other
/// over their membership protocol, so no node's VIPs are taken off (before it, every request in the
/// outage failed). Afterwards the cluster converges: a Service created right after gets its VIP.
#[tokio::test]
async fn traffic_outlives_a_frozen_api_server() {
    let c = cluster();
    let (_client, ns, vip) = one_vip_served(ManagerForm::Agents, "agents-outage").await;
    // Every agent hears the two others before the outage.
    for node in c.nodes() {
        let node = &node;
        eventually(
            &format!("{node}'s agent hears two members"),
            LONG,
            || async move {
                let text = c
                    .curl_on_node(node, "http://127.0.0.1:10264/metrics")
                    .ok()?;
                text.lines()
                    .any(|l| l == "local_agent_membership_members 2")
                    .then_some(())
            },
        )
        .await;
    }

    let outage = Duration::from_secs(40);
    let seen = through_a_freeze(vip, outage).await;
    println!(
        "API server frozen {outage:?}: {} of {} requests failed while it was frozen, {} in the 15 s after: {:?}; before it: {:?}",
        seen.during.len(),
        seen.made,
        seen.after.len(),
        seen.after,
        seen.before
    );
    assert!(
        seen.during.is_empty(),
        "requests failed while the API server was frozen: {:?}",
        seen.during
    );
    // The VIP is on one node only.
    let holders = holders(vip);
    assert_eq!(holders.len(), 1, "{vip} on {holders:?}");

    // The cluster converges: a new Service gets its VIP, served.
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(&load_balancer("after", "echo", "", "")),
    );
    let (after, _) = ingress(ns.name(), "after").await;
    eventually(
        &format!("{after} answers the client"),
        LONG,
        || async move { Client::get(after).ok() },
    )
    .await;
}

/// A client of the cluster with the token of the `local-agent` ServiceAccount bound to the agent pod
/// on `node`, as that agent's own.
async fn agent_client(node: &str) -> kube::Client {
    let c = cluster();
    let pod = c.kubectl(
        &[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "k8s-app=local-agent",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
        None,
    );
    let token = c.kubectl(
        &[
            "-n",
            "kube-system",
            "create",
            "token",
            "local-agent",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            pod.trim(),
            "--duration",
            "10m",
        ],
        None,
    );
    let admin = kube::config::Kubeconfig::read_from(c.admin_kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(admin, &Default::default())
        .await
        .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.trim().to_owned().into()),
        ..Default::default()
    };
    kube::Client::try_from(config).unwrap()
}

/// An agent's token may write its own node's heartbeat Lease and no other Lease: not another node's
/// heartbeat, not the kube-controller-manager's (the ValidatingAdmissionPolicy shipped with the agents).
#[tokio::test]
async fn an_agent_may_write_only_its_own_heartbeat() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let nodes = c.nodes();
    let agent = agent_client(&nodes[0]).await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(agent, "kube-system");
    let touch = serde_json::json!({"metadata": {"annotations": {"ccm-rs.test/touched": "yes"}}});
    let patch = |name: String| {
        let leases = leases.clone();
        let touch = touch.clone();
        async move {
            leases
                .patch(&name, &PatchParams::default(), &Patch::Merge(&touch))
                .await
                .map(drop)
        }
    };
    patch(format!("local-agent-{}", nodes[0]))
        .await
        .expect("its own heartbeat");
    let refused = |what: &str, result: Result<(), kube::Error>| {
        let text = result
            .expect_err(&format!("{what} must be refused"))
            .to_string();
        assert!(
            text.contains("may write only its own node's heartbeat Lease"),
            "{what}: {text}"
        );
    };
    // Another node's heartbeat, and the manager's leader Lease.
    for other in [
        format!("local-agent-{}", nodes[1]),
        "cloud-controller-manager".to_owned(),
    ] {
        refused(&other, patch(other.clone()).await);
    }
    // A leader Lease of its own making (this cluster's kube-controller-manager elects no leader).
    let forged: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kube-controller-manager"},
        "spec": {"holderIdentity": "forged", "leaseDurationSeconds": 3600},
    }))
    .unwrap();
    refused(
        "creating kube-controller-manager",
        leases.create(&Default::default(), &forged).await.map(drop),
    );
}

/// An agent's `/metrics` is on its node's loopback only: the client on the nodes' network cannot read
/// it. 2,000 connections opened to it on the node and left idle are capped (the agent holds at most 64)
/// and leave its data plane serving; its `/readyz` says ready.
#[tokio::test]
async fn an_agents_endpoint_is_local_and_capped() {
    let c = cluster();
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Agents, "agents-endpoint").await;
    let holder = holders(vip).pop().expect("a node holds the VIP");
    let from_outside = Client::exec(&[
        "curl",
        "-sS",
        "--max-time",
        "2",
        &format!("http://{}:10264/metrics", c.node_ip(&holder)),
    ]);
    assert!(
        from_outside.is_err(),
        "the client read the agent's metrics: {from_outside:?}"
    );
    assert_eq!(
        c.curl_on_node(&holder, "http://127.0.0.1:10264/readyz")
            .as_deref(),
        Ok("ok")
    );
    // 2,000 connections opened on the holder's loopback and held (bash keeps each one's descriptor),
    // while the client asks the VIP; then how many the agent kept open.
    let script = "ulimit -n 4096; for i in $(seq 2000); do exec {fd}<>/dev/tcp/127.0.0.1/10264 || true; \
                  done 2>/dev/null; sleep 5; ss -Htn state established '( dport = :10264 )' | wc -l";
    let hog = std::thread::spawn({
        let holder = holder.clone();
        move || cluster().exec_on_node(&holder, &["bash", "-c", script])
    });
    for _ in 0..20 {
        Client::get(vip).expect("the VIP answers while its agent's endpoint is flooded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let output = hog.join().unwrap();
    let held: usize = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{output:?}"));
    println!("2,000 connections opened to the agent's endpoint: {held} still established");
    assert!(held <= 64, "{held} connections held by the agent");
}

/// Requests to a VIP from the client every 100 ms, from [`Traffic::start`] until [`Traffic::stop`].
struct Traffic {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<String>, usize)>,
}

impl Traffic {
    fn start(vip: IpAddr) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::task::spawn_blocking({
            let stop = stop.clone();
            move || {
                let start = Instant::now();
                let (mut failed, mut made) = (Vec::new(), 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Err(err) = Client::get(vip) {
                        failed.push(format!("{:.1}s: {err}", start.elapsed().as_secs_f64()));
                    }
                    made += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                (failed, made)
            }
        });
        Self { stop, task }
    }

    /// The requests that failed (when, since the start, and why), and how many were made.
    async fn stop(self) -> (Vec<String>, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Packets between a node and some addresses dropped inside the node's own network namespace (an
/// nftables table of its own), until dropped. The node's host-network pods (the manager, the agent,
/// kube-proxy, the kubelet) are cut with it.
struct NodeCut(String);

impl NodeCut {
    const TABLE: &'static str = "ccm_test_cut";

    /// `node` cut from the API server only: its packets to the API server's port are dropped (those to
    /// the `kubernetes` Service too: kube-proxy translates them before this filter sees them).
    fn from_api_server(node: &str) -> Self {
        let port = api_server_port();
        let api = cluster().host_ip();
        Self::install(
            node,
            &[format!("ip daddr {api} tcp dport {port} drop")],
            &[],
        )
    }

    /// `node` cut from the other nodes only, as if its link to them were down: every packet between
    /// them is dropped, both ways, while the client, the host and the API server still reach it.
    fn from_peers(node: &str) -> Self {
        let c = cluster();
        let peers: Vec<String> = c.nodes().into_iter().filter(|n| n != node).collect();
        let v4: Vec<String> = peers.iter().map(|n| c.node_ip(n).to_string()).collect();
        let v6: Vec<String> = peers
            .iter()
            .map(|n| match c.node_ip(n) {
                IpAddr::V4(ip) => format!("fd00:89::{}", ip.octets()[3]),
                IpAddr::V6(ip) => ip.to_string(),
            })
            .collect();
        let (v4, v6) = (v4.join(", "), v6.join(", "));
        Self::install(
            node,
            &[
                format!("ip daddr {{ {v4} }} drop"),
                format!("ip6 daddr {{ {v6} }} drop"),
            ],
            &[
                format!("ip saddr {{ {v4} }} drop"),
                format!("ip6 saddr {{ {v6} }} drop"),
            ],
        )
    }

    fn install(node: &str, output: &[String], input: &[String]) -> Self {
        let c = cluster();
        let nft = |command: String| {
            let out = c.exec_on_node(node, &["nft", &command]);
            assert!(out.status.success(), "nft {command} on {node}: {out:?}");
        };
        let _ = c.exec_on_node(node, &["nft", "delete", "table", "inet", Self::TABLE]);
        nft(format!("add table inet {}", Self::TABLE));
        for (chain, rules) in [("output", output), ("input", input)] {
            nft(format!(
                "add chain inet {} {chain} {{ type filter hook {chain} priority 0 ; }}",
                Self::TABLE
            ));
            for rule in rules {
                nft(format!("add rule inet {} {chain} {rule}", Self::TABLE));
            }
        }
        Self(node.to_owned())
    }
}

impl Drop for NodeCut {
    fn drop(&mut self) {
        let _ = cluster().exec_on_node(&self.0, &["nft", "delete", "table", "inet", Self::TABLE]);
    }
}

/// The API server's port, from the cluster's kubeconfig (`server: https://<host>:<port>`).
fn api_server_port() -> u16 {
    let kubeconfig = std::fs::read_to_string(cluster().admin_kubeconfig()).unwrap();
    kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: "))
        .and_then(|url| url.rsplit(':').next())
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .expect("the kubeconfig names the API server's port")
}

/// The manager's pods: name, node, and how often their containers restarted.
async fn manager_pods() -> Vec<(String, String, i32)> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = kube::Api::namespaced(cluster().client().await, "kube-system");
    pods.list(&kube::api::ListParams::default().labels("k8s-app=cloud-controller-manager"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|pod| {
            let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
            let restarts = pod
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .iter()
                .map(|c| c.restart_count)
                .sum();
            (pod.metadata.name.unwrap_or_default(), node, restarts)
        })
        .collect()
}

/// The node of the manager's Lease holder (host-network pods have their node's host name).
async fn leading_node() -> String {
    let client = cluster().client().await;
    let holder = eventually("the manager's Lease is held", LONG, || {
        let client = client.clone();
        async move { cluster_tests::manager_lease_holder(&client).await }
    })
    .await;
    holder.split('_').next().unwrap_or_default().to_owned()
}

/// Issue #47, leader mode (the default): the API server frozen for 40 s while the client asks the VIP
/// every 100 ms. The leader cannot renew its Lease, but it rides the outage out with its data plane
/// serving, and no other replica can take the Lease either: no request fails, no manager restarts, and
/// afterwards the same replica leads and a new Service gets its VIP.
#[tokio::test]
async fn a_leader_rides_out_a_frozen_api_server() {
    let c = cluster();
    let (_client, ns, vip) = one_vip_served(ManagerForm::Deployment, "leader-outage").await;
    let kube = c.client().await;
    let leader = cluster_tests::manager_lease_holder(&kube)
        .await
        .expect("a leader");
    let restarts: i32 = manager_pods().await.iter().map(|p| p.2).sum();

    let outage = Duration::from_secs(40);
    let seen = through_a_freeze(vip, outage).await;
    println!(
        "leader mode, API server frozen {outage:?}: {} of {} requests failed while it was frozen, {} in the 15 s after: {:?}; before it: {:?}",
        seen.during.len(),
        seen.made,
        seen.after.len(),
        seen.after,
        seen.before
    );
    assert!(
        seen.during.is_empty(),
        "requests failed while the API server was frozen: {:?}",
        seen.during
    );
    assert_eq!(
        cluster_tests::manager_lease_holder(&kube).await.as_deref(),
        Some(leader.as_str()),
        "the same replica leads"
    );
    assert_eq!(
        manager_pods().await.iter().map(|p| p.2).sum::<i32>(),
        restarts,
        "no manager container restarted"
    );

    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(&load_balancer("after", "echo", "", "")),
    );
    let (after, _) = ingress(ns.name(), "after").await;
    eventually(
        &format!("{after} answers the client"),
        LONG,
        || async move { Client::get(after).ok() },
    )
    .await;
}

/// The cluster's kube-apiserver stopped (SIGTERM, as for an upgrade: it takes its endpoint out of the
/// `kubernetes` Service first) until dropped, which starts it again and waits until it is ready.
struct StoppedApiServer;

impl StoppedApiServer {
    fn stop() -> Self {
        Self::control_plane("stop");
        StoppedApiServer
    }

    fn control_plane(verb: &str) {
        let dir = cluster().dir().join("cp");
        run(&[
            cluster_tests::workspace_root()
                .join("hack/control-plane")
                .to_str()
                .unwrap(),
            verb,
            "--component",
            "kube-apiserver",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .unwrap_or_else(|err| panic!("hack/control-plane {verb}: {err}"));
    }
}

impl Drop for StoppedApiServer {
    fn drop(&mut self) {
        Self::control_plane("start");
    }
}

/// Issue #47, leader mode: the API server stopped for 60 s (its restart then refuses the first
/// requests until its authorizer's caches fill). The leader rides it out: no request fails, the same
/// replica leads afterwards, no manager restarts, and a Service created right after the restart gets its
/// VIP in its status within seconds (it answers once kube-proxy has its NodePort, which takes kube-proxy
/// its own watch's back-off: docs/deploy.md, "Reaching the API server").
#[tokio::test]
async fn a_leader_rides_out_a_stopped_api_server() {
    let c = cluster();
    let (_client, ns, vip) = one_vip_served(ManagerForm::Deployment, "leader-stop").await;
    let kube = c.client().await;
    let leader = cluster_tests::manager_lease_holder(&kube)
        .await
        .expect("a leader");
    let restarts: i32 = manager_pods().await.iter().map(|p| p.2).sum();

    let traffic = Traffic::start(vip);
    let stopped = StoppedApiServer::stop();
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(stopped);
    let back = Instant::now();
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(&load_balancer("after", "echo", "", "")),
    );
    let (after, _) = ingress(ns.name(), "after").await;
    let assigned = back.elapsed();
    let (failed, made) = traffic.stop().await;
    // The cluster as the next test needs it: kube-proxy back on the nodes (it restores the `kubernetes`
    // Service and programs new NodePorts only once its own watch reconnects).
    eventually(
        &format!("{after} answers the client"),
        Duration::from_secs(180),
        || async move { Client::get(after).ok() },
    )
    .await;
    println!(
        "leader mode, API server stopped 60 s: {} of {made} requests failed; a Service created after the restart had its VIP {after} after {:.1}s and answered after {:.1}s",
        failed.len(),
        assigned.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    assert_eq!(
        cluster_tests::manager_lease_holder(&kube).await.as_deref(),
        Some(leader.as_str()),
        "the same replica leads"
    );
    assert_eq!(
        manager_pods().await.iter().map(|p| p.2).sum::<i32>(),
        restarts,
        "no manager container restarted"
    );
}

/// Issue #47, leader mode: the leader's node cut from the API server, not from the other nodes. The
/// leader rides the outage out, serving; the other replica takes the Lease once it expires and puts
/// the VIP on its own node; the cut-off leader hears that node claim the VIP and steps down, so the VIP
/// is on one node again a moment later, and the old leader's log says why it stepped down.
#[tokio::test]
async fn a_leader_cut_from_the_api_server_steps_down_when_the_next_leader_serves() {
    let c = cluster();
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Deployment, "leader-cut").await;
    let old = leading_node().await;
    assert_eq!(
        holders(vip),
        std::slice::from_ref(&old),
        "the leader's node holds {vip}"
    );
    let old_pod = manager_pods()
        .await
        .into_iter()
        .find(|p| p.1 == old)
        .expect("the leader's pod")
        .0;

    let traffic = Traffic::start(vip);
    let cut = NodeCut::from_api_server(&old);
    let cut_at = Instant::now();
    let new = eventually("another replica leads", Duration::from_secs(90), || {
        let old = old.clone();
        async move {
            let node = leading_node().await;
            (node != old).then_some(node)
        }
    })
    .await;
    let led_after = cut_at.elapsed();
    // Until only the new leader's node holds the VIP: how long both held it.
    let mut both_since: Option<Instant> = None;
    loop {
        let now = holders(vip);
        if now == [new.clone()] {
            break;
        }
        if now.contains(&new) && now.contains(&old) {
            both_since.get_or_insert_with(Instant::now);
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(120),
            "{vip} is still on {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let both_for = both_since.map(|t| t.elapsed()).unwrap_or_default();
    eventually(&format!("{vip} answers the client"), LONG, || async move {
        Client::get(vip).ok()
    })
    .await;
    let (failed, made) = traffic.stop().await;
    println!(
        "leader mode, {old} cut from the API server: {new} led after {:.1}s, both nodes held {vip} for {:.1}s, {} of {made} requests failed: {failed:?}",
        led_after.as_secs_f64(),
        both_for.as_secs_f64(),
        failed.len()
    );
    drop(cut);
    // The stepped-down container's log: the pod's last container until the kubelet restarted it (its
    // restart waits out a back-off), the previous one after.
    let said = "stepped down while riding out the API server's outage: another replica serves the VIPs now";
    eventually("the old leader's log says it stepped down", LONG, || {
        let old_pod = old_pod.clone();
        async move {
            [Some("--previous"), None].into_iter().find_map(|previous| {
                let mut args = vec!["-n", "kube-system", "logs", old_pod.as_str()];
                args.extend(previous);
                let out = c.kubectl_output(&args, None);
                String::from_utf8_lossy(&out.stdout)
                    .contains(said)
                    .then_some(())
            })
        }
    })
    .await;
    c.kubectl(
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/cloud-controller-manager",
            "--timeout=120s",
        ],
        None,
    );
}

/// Issue #47, agents: the node serving a VIP cut from the API server but not from the other nodes, for
/// 40 s. Its agent cannot renew its heartbeat, but the others hear it over membership: the VIP stays on
/// it and answers every request.
#[tokio::test]
async fn a_node_cut_from_the_api_server_keeps_serving_its_vips() {
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Agents, "agents-api-cut").await;
    let holder = holders(vip);
    assert_eq!(holder.len(), 1, "{vip} on {holder:?}");
    let holder = holder[0].clone();

    let traffic = Traffic::start(vip);
    let cut = NodeCut::from_api_server(&holder);
    tokio::time::sleep(Duration::from_secs(40)).await;
    let still = holders(vip);
    drop(cut);
    let (failed, made) = traffic.stop().await;
    println!(
        "agents, {holder} cut from the API server for 40 s: {} of {made} requests failed",
        failed.len()
    );
    assert_eq!(
        still,
        std::slice::from_ref(&holder),
        "{vip} stays on {holder}"
    );
    assert!(failed.is_empty(), "requests failed: {failed:?}");
}

/// Issue #51 item 3, agents: the cluster autoscaler taints the node serving a VIP
/// (`ToBeDeletedByClusterAutoscaler`) before it drains and deletes it. The VIP moves to another node at
/// once, while the tainted node still runs, so the client loses no request (before, the VIP stayed until
/// the node was gone and then failed over). The taint removed (a scale-down given up), it may come back.
#[tokio::test]
async fn a_node_the_autoscaler_removes_gives_its_vips_away_while_it_still_serves() {
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Agents, "agents-autoscaler").await;
    let holder = holders(vip);
    assert_eq!(holder.len(), 1, "{vip} on {holder:?}");
    let holder = holder[0].clone();
    let taint = |taints: &str| {
        cluster().kubectl(
            &[
                "patch",
                "node",
                &holder,
                "--type=merge",
                "-p",
                &format!("{{\"spec\": {{\"taints\": {taints}}}}}"),
            ],
            None,
        );
    };

    let traffic = Traffic::start(vip);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tainted = Instant::now();
    taint(
        r#"[{"key": "ToBeDeletedByClusterAutoscaler", "value": "1764460800", "effect": "NoSchedule"}]"#,
    );
    let new_holder = eventually(&format!("{vip} off {holder}"), LONG, || async {
        let now = holders(vip);
        (now.len() == 1 && now[0] != holder).then(|| now[0].clone())
    })
    .await;
    let moved = tainted.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (failed, made) = traffic.stop().await;
    taint("null");
    println!(
        "agents: {vip} moved from {holder} to {new_holder} {:.2} s after the autoscaler's taint; {} of {made} requests failed",
        moved.as_secs_f64(),
        failed.len()
    );
    assert!(failed.is_empty(), "requests failed: {failed:?}");
}

/// Issue #47, agents: the node serving a VIP cut from the other nodes (its link to them down) but not
/// from the API server or the client. The others stop hearing it and take its VIP over within the
/// failover time; it hears nobody while the Leases say the others hear each other, so it stops
/// announcing: the VIP is on one node again at once, and the client's neighbour entry follows.
#[tokio::test]
async fn a_node_cut_from_its_peers_gives_its_vips_up() {
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Agents, "agents-peer-cut").await;
    let mac_of = nodes_by_mac();
    let holder = holders(vip);
    assert_eq!(holder.len(), 1, "{vip} on {holder:?}");
    let old = holder[0].clone();

    let traffic = Traffic::start(vip);
    let cut = NodeCut::from_peers(&old);
    let cut_at = Instant::now();
    let (mut moved, mut both_since, mut both_for) = (None, None::<Instant>, Duration::ZERO);
    loop {
        let now = holders(vip);
        if moved.is_none() && now.iter().any(|n| *n != old) {
            moved = Some(cut_at.elapsed());
        }
        if now.len() > 1 {
            both_since.get_or_insert_with(Instant::now);
        } else if let Some(since) = both_since.take() {
            both_for += since.elapsed();
        }
        if now.len() == 1 && now[0] != old {
            break;
        }
        assert!(
            cut_at.elapsed() < LONG,
            "{vip} is still on {now:?} {LONG:?} after {old} was cut from its peers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new = holders(vip)[0].clone();
    let relearnt = eventually(
        "the client's neighbour entry names the new node",
        LONG,
        || {
            let (new, mac_of) = (new.clone(), &mac_of);
            async move {
                Client::neighbour(vip)
                    .and_then(|mac| mac_of.get(&mac).cloned())
                    .filter(|node| *node == new)
            }
        },
    )
    .await;
    eventually(&format!("{vip} answers the client"), LONG, || async move {
        Client::get(vip).ok()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the client's requests after the move
    let (failed, made) = traffic.stop().await;
    let on_old = vips_on(&old).contains(&vip);
    drop(cut);
    println!(
        "agents, {old} cut from its peers: {vip} on {relearnt} after {:.1}s, on two nodes for {:.1}s, {} of {made} requests failed (until 3 s after it answered again): {failed:?}",
        moved.unwrap_or_default().as_secs_f64(),
        both_for.as_secs_f64(),
        failed.len()
    );
    assert!(!on_old, "{old} still holds {vip}");
}

/// A metric of the agent on `node` (its first sample), if it answers.
fn agent_metric(node: &str, name: &str) -> Option<f64> {
    let text = cluster()
        .curl_on_node(node, "http://127.0.0.1:10264/metrics")
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// What one worker of [`long_lived_connections`] saw.
#[derive(Debug, Default)]
struct LongLived {
    connections: usize,
    requests: usize,
    errors: Vec<String>,
}

impl LongLived {
    /// What all the workers saw, once they are done.
    async fn sum(workers: Vec<tokio::task::JoinHandle<LongLived>>) -> LongLived {
        let mut seen = LongLived::default();
        for worker in workers {
            let one = worker.await.unwrap();
            seen.connections += one.connections;
            seen.requests += one.requests;
            seen.errors.extend(one.errors);
        }
        seen
    }
}

/// `kubectl rollout restart` of `workload` in kube-system, and its `rollout status` (off the runtime's
/// threads: the long-lived connections go on meanwhile).
async fn roll(workload: &'static str) {
    tokio::task::spawn_blocking(move || {
        let c = cluster();
        c.kubectl(&["-n", "kube-system", "rollout", "restart", workload], None);
        c.kubectl(
            &[
                "-n",
                "kube-system",
                "rollout",
                "status",
                workload,
                "--timeout=300s",
            ],
            None,
        );
    })
    .await
    .unwrap();
}

/// Every node that holds `vip`, looked at every 250 ms until `stop`.
fn nodes_holding(
    vip: IpAddr,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<BTreeSet<String>> {
    let stop = stop.clone();
    tokio::task::spawn_blocking(move || {
        let mut seen = BTreeSet::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            seen.extend(holders(vip));
            std::thread::sleep(Duration::from_millis(250));
        }
        seen
    })
}

/// `workers` long-lived connections to `vip`, one after another per worker until `stop`: each an HTTP
/// keep-alive connection asking every 200 ms, 20 times (4 s, less than hack/cluster's drain time of
/// 5 s), then closed by the client. Whatever breaks one (a reset, a close, no answer) is an error.
fn long_lived_connections(
    vip: IpAddr,
    workers: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<LongLived>> {
    let started = Instant::now();
    (0..workers)
        .map(|worker| {
            let stop = stop.clone();
            tokio::spawn(async move {
                // Spread the workers' connections over the 4 s of one.
                tokio::time::sleep(Duration::from_millis(200 * worker as u64)).await;
                let mut seen = LongLived::default();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Since the start, and the time of day (UTC), to match the agents' logs.
                    let at = || {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default();
                        let day = now.as_secs() % 86_400;
                        format!(
                            "{:.1}s ({:02}:{:02}:{:02}.{:03} UTC)",
                            started.elapsed().as_secs_f64(),
                            day / 3600,
                            day / 60 % 60,
                            day % 60,
                            now.subsec_millis()
                        )
                    };
                    let stream = tokio::time::timeout(
                        Duration::from_secs(2),
                        TcpStream::connect(SocketAddr::new(vip, 80)),
                    )
                    .await;
                    let mut connection = match stream {
                        Ok(Ok(stream)) => KeepAlive(BufReader::new(stream)),
                        Ok(Err(err)) => {
                            seen.errors.push(format!("{}: connect: {err}", at()));
                            continue;
                        }
                        Err(_) => {
                            seen.errors
                                .push(format!("{}: connect: no answer in 2s", at()));
                            continue;
                        }
                    };
                    seen.connections += 1;
                    for request in 0..20 {
                        if let Err(err) = connection.get("/").await {
                            seen.errors.push(format!(
                                "{}: worker {worker}, request {request} of a connection: {err}",
                                at()
                            ));
                            break;
                        }
                        seen.requests += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                seen
            })
        })
        .collect()
}

/// Issue #47, item 3: the agents' DaemonSet rolled (`kubectl rollout restart`) while the client asks
/// the VIP every 100 ms and 20 long-lived connections go through it (HTTP keep-alive, a request every
/// 200 ms for 4 s each, opened one after another through the whole roll). On each node the new agent
/// starts beside the old one (maxSurge), which hands it its VIPs, listening sockets and membership,
/// then lets its own connections finish: no request fails, no long-lived connection is cut, and the
/// VIP never leaves its node.
// Several threads, and kubectl off them: the long-lived connections must go on while `kubectl rollout
// status` waits (on a one-thread runtime they would stall until it returns, and the old agent's drain
// would cut them, idle).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_of_the_agents_cuts_no_connection() {
    let c = cluster();
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Agents, "agents-upgrade").await;
    let holder = holders(vip);
    assert_eq!(holder.len(), 1, "{vip} on {holder:?}");
    let holder = holder[0].clone();

    let traffic = Traffic::start(vip);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers = long_lived_connections(vip, 20, &stop);
    // Where the VIP is, every 250 ms through the roll.
    let watching = nodes_holding(vip, &stop);
    tokio::time::sleep(Duration::from_secs(5)).await;

    let rolling = Instant::now();
    roll("daemonset/local-agent").await;
    // The old agents drain, then exit: one pod per node again.
    let nodes = c.nodes().len();
    eventually("the old agents gone", LONG, || async move {
        let out = c.kubectl(
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=local-agent",
                "-o",
                "name",
            ],
            None,
        );
        (out.lines().count() == nodes).then_some(())
    })
    .await;
    let rolled = rolling.elapsed();
    // The connections opened last run their course.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = LongLived::sum(workers).await;
    let (failed, made) = traffic.stop().await;
    let holders_seen = watching.await.unwrap();
    let handed_over = agent_metric(&holder, "local_agent_handovers_received_total");
    println!(
        "agents rolled in {:.0}s: {} of {made} new requests failed; {} long-lived connections ({} requests on them), {} cut; {vip} on {holders_seen:?} throughout; the new agent on {holder} received {handed_over:?} hand-over",
        rolled.as_secs_f64(),
        failed.len(),
        seen.connections,
        seen.requests,
        seen.errors.len()
    );
    assert_eq!(
        holders_seen,
        BTreeSet::from([holder.clone()]),
        "{vip} stayed on {holder}"
    );
    assert_eq!(
        handed_over,
        Some(1.0),
        "the new agent on {holder} took over from the old one"
    );
    assert!(failed.is_empty(), "new requests failed: {failed:?}");
    assert!(
        seen.errors.is_empty(),
        "long-lived connections were cut: {:?}",
        seen.errors
    );
    assert!(
        seen.connections >= 20,
        "the long-lived connections ran ({})",
        seen.connections
    );
}

/// The sum of a metric over the manager's replicas that answer.
fn manager_metric_sum(name: &str) -> f64 {
    cluster()
        .manager_metrics(true)
        .iter()
        .filter_map(|(_, text)| {
            text.lines().find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
        })
        .sum()
}

/// Issue #47, item 3, leader mode: the manager's Deployment rolled (`kubectl rollout restart`) while the
/// client asks the VIP every 100 ms and 20 long-lived connections go through it. The leader moves to
/// another node: the one that stops serves until the next leader claims the VIP, then stops answering
/// for it and lets its connections finish, while the next leader forwards their packets to it. No
/// request fails, no long-lived connection is cut, and a new leader counts the hand-off it received.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_of_the_leading_manager_cuts_no_connection() {
    let (_client, _ns, vip) = one_vip_served(ManagerForm::Deployment, "leader-upgrade").await;
    let first = holders(vip);
    assert_eq!(first.len(), 1, "{vip} on {first:?}");

    let traffic = Traffic::start(vip);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers = long_lived_connections(vip, 20, &stop);
    let watching = nodes_holding(vip, &stop);
    tokio::time::sleep(Duration::from_secs(5)).await;

    let rolling = Instant::now();
    roll("deployment/cloud-controller-manager").await;
    eventually("the old replicas gone", LONG, || async move {
        let pods = manager_pods().await;
        (pods.len() == 2).then_some(())
    })
    .await;
    let rolled = rolling.elapsed();
    // A new leader serves, and the connections opened last run their course.
    leading_node().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = LongLived::sum(workers).await;
    let (failed, made) = traffic.stop().await;
    let holders_seen = watching.await.unwrap();
    let received = manager_metric_sum("local_leader_handoffs_received_total");
    println!(
        "manager rolled in {:.0}s: {} of {made} new requests failed; {} long-lived connections ({} requests on them), {} cut; {vip} on {holders_seen:?} through the roll; hand-offs received by the replicas running now: {received}",
        rolled.as_secs_f64(),
        failed.len(),
        seen.connections,
        seen.requests,
        seen.errors.len()
    );
    assert!(
        holders_seen.len() > 1,
        "the VIP moved to another node with the leader ({holders_seen:?})"
    );
    assert!(
        received >= 1.0,
        "a new leader forwarded its predecessor's connections"
    );
    assert!(failed.is_empty(), "new requests failed: {failed:?}");
    assert!(
        seen.errors.is_empty(),
        "long-lived connections were cut: {:?}",
        seen.errors
    );
    assert!(
        seen.connections >= 20,
        "the long-lived connections ran ({})",
        seen.connections
    );
}
