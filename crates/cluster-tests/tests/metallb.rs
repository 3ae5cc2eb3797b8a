//! The hand-over from MetalLB to `local` and back, on a real cluster: MetalLB v0.15 (its controller and
//! speakers, built from its Go module: `hack/cluster metallb --default-class`) is the cluster's load
//! balancer, configured by its own objects (three pools: one scoped to a namespace, one not
//! auto-assigned, one IPv6, besides a dual-stack one; an `L2Advertisement` with a node selector) and
//! serving twelve Services. Then `local` starts beside it (`hack/cluster manager --agents` with a
//! cloud-config without pools: it reads MetalLB's objects), its agents take each VIP on the node
//! MetalLB's speaker announces it from (they elect as MetalLB does), and MetalLB's controller and
//! speakers stop. No request of a client on the bridge to any VIP fails meanwhile, no VIP moves to
//! another node, every Service keeps its ingress field for field (kube-proxy carries the traffic, as
//! under MetalLB: `ipMode: VIP`) and no status write changes an address, and each Service gets an event
//! saying it was taken over. A new Service gets an address from the right pool. Then the way back:
//! `local` goes, MetalLB starts again, and the addresses still stay.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use cluster_tests::{
    LONG, ManagerForm, Namespace, cluster, echo_app, eventually, host_neighbour, http_get,
    node_mac, run,
};
use k8s_openapi::api::core::v1::Service;

/// MetalLB's objects: pools on the bridge's subnet outside the manager's own pool (.64/26) and the
/// test clients' addresses (.200, ::200).
fn metallb_objects(team_namespace: &str) -> String {
    format!(
        r#"apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: general, namespace: metallb-system}}
spec: {{addresses: [10.89.0.128/28, 'fd00:89::300/124'], avoidBuggyIPs: true}}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: team, namespace: metallb-system}}
spec: {{addresses: [10.89.0.144/29], serviceAllocation: {{priority: 1, namespaces: [{team_namespace}]}}}}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: manual, namespace: metallb-system}}
spec: {{addresses: [10.89.0.152-10.89.0.159], autoAssign: false}}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: six, namespace: metallb-system}}
spec: {{addresses: ['fd00:89::310/124'], autoAssign: false}}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: l2, namespace: metallb-system}}
spec: {{nodeSelectors: [{{matchLabels: {{metallb-test/l2: "yes"}}}}]}}
"#
    )
}

/// The nodes the `L2Advertisement` selects.
const ANNOUNCING: [&str; 2] = ["ccm-node-1", "ccm-node-2"];

/// A LoadBalancer Service for the echo app on TCP `port` (to its 8080).
fn service(name: &str, port: u16, spec: &str, annotations: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  annotations: {{{annotations}}}
spec:
  type: LoadBalancer
  selector: {{app: echo}}
  {spec}
  ports:
  - {{name: http, port: {port}, targetPort: 8080, protocol: TCP}}
"#
    )
}

/// `namespace/name` → (ingress IPs, TCP port), of every Service of `namespaces`.
type Ingresses = BTreeMap<String, (Vec<IpAddr>, u16)>;

async fn ingresses(namespaces: &[&str]) -> Ingresses {
    let client = cluster().client().await;
    let mut out = BTreeMap::new();
    for namespace in namespaces {
        let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), namespace);
        for s in api.list(&Default::default()).await.unwrap().items {
            let ips: Vec<IpAddr> = s
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect();
            let port = s
                .spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .and_then(|p| p.first())
                .map(|p| u16::try_from(p.port).unwrap_or_default())
                .unwrap_or_default();
            out.insert(
                format!("{namespace}/{}", s.metadata.name.unwrap_or_default()),
                (ips, port),
            );
        }
    }
    out
}

/// The full ingress of every Service, as the API server has it (compared field by field).
async fn raw_ingress(namespaces: &[&str]) -> BTreeMap<String, serde_json::Value> {
    let client = cluster().client().await;
    let mut out = BTreeMap::new();
    for namespace in namespaces {
        let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), namespace);
        for s in api.list(&Default::default()).await.unwrap().items {
            let ingress = s
                .status
                .and_then(|s| s.load_balancer)
                .map(|lb| serde_json::to_value(lb).unwrap())
                .unwrap_or_default();
            out.insert(
                format!("{namespace}/{}", s.metadata.name.unwrap_or_default()),
                ingress,
            );
        }
    }
    out
}

/// Waits until every Service of `namespaces` has as many addresses as `expected` says.
async fn all_assigned(namespaces: &[&str], expected: &BTreeMap<&str, usize>) -> Ingresses {
    eventually("every Service has its addresses", LONG, || async move {
        let now = ingresses(namespaces).await;
        expected
            .iter()
            .all(|(key, n)| now.get(*key).is_some_and(|(ips, _)| ips.len() == *n))
            .then_some(now)
    })
    .await
}

/// Waits until every IPv4 VIP of `services` answers HTTP from the host (a client on the bridge); the
/// time each took. IPv6 VIPs have their addresses checked only: this cluster's pods have IPv4 addresses
/// only, so kube-proxy, which carries the traffic under MetalLB and under `local` alike, has no IPv6
/// endpoint to send them to.
async fn all_answer(services: &Ingresses, since: Instant) -> BTreeMap<(String, IpAddr), Duration> {
    let mut took = BTreeMap::new();
    for (key, (ips, port)) in services {
        for ip in ips.iter().filter(|ip| ip.is_ipv4()) {
            let address = SocketAddr::new(*ip, *port);
            eventually(
                &format!("{key} answers at {address}"),
                LONG,
                || async move { http_get(address, "/").await.ok() },
            )
            .await;
            took.insert((key.clone(), *ip), since.elapsed());
        }
    }
    took
}

fn in_net(ip: IpAddr, net: &str) -> bool {
    net.parse::<ipnet::IpNet>().unwrap().contains(&ip)
}

#[tokio::test]
async fn services_keep_their_addresses_from_metallb_to_local_and_back() {
    let c = cluster();
    // MetalLB alone serves Services of no class: ours goes first (its agents too).
    c.ensure_manager(ManagerForm::Agents).await;
    let restore = Restore;
    c.script("manager", &["--delete"]);
    for node in ANNOUNCING {
        c.kubectl(
            &["label", "node", node, "metallb-test/l2=yes", "--overwrite"],
            None,
        );
    }
    c.script("metallb", &["--default-class"]);

    let team = Namespace::new("mlb-team");
    let shop = Namespace::new("mlb-shop");
    c.kubectl(&["apply", "-f", "-"], Some(&metallb_objects(team.name())));
    let dual = "ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]";
    let six = "ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]";
    let shared = "\"metallb.io/allow-shared-ip\": k";
    let documents: Vec<(&Namespace, String)> = vec![
        (&team, service("web", 80, "", "")),
        (
            &team,
            service("local", 80, "externalTrafficPolicy: Local", ""),
        ),
        (
            &team,
            service("named", 80, "", "\"metallb.io/address-pool\": general"),
        ),
        (&shop, service("web", 80, "", "")),
        (
            &shop,
            service("local", 80, "externalTrafficPolicy: Local", ""),
        ),
        (
            &shop,
            service(
                "asked",
                80,
                "",
                "\"metallb.io/loadBalancerIPs\": 10.89.0.153",
            ),
        ),
        (
            &shop,
            service("spec-ip", 80, "loadBalancerIP: 10.89.0.154", ""),
        ),
        (
            &shop,
            service(
                "named",
                80,
                "",
                "\"metallb.universe.tf/address-pool\": manual",
            ),
        ),
        (&shop, service("shared-a", 8081, "", shared)),
        (&shop, service("shared-b", 8082, "", shared)),
        (&shop, service("dual", 80, dual, "")),
        (
            &shop,
            service("six", 80, six, "\"metallb.io/address-pool\": six"),
        ),
    ];
    for ns in [&team, &shop] {
        c.kubectl(
            &["-n", ns.name(), "apply", "-f", "-"],
            Some(&echo_app("echo", 3, true, None)),
        );
    }
    for (ns, document) in &documents {
        c.kubectl(&["-n", ns.name(), "apply", "-f", "-"], Some(document));
    }
    for ns in [&team, &shop] {
        cluster_tests::wait_rollout(ns.name(), "echo").await;
    }
    let namespaces = [team.name(), shop.name()];
    let key = |ns: &Namespace, name: &str| format!("{}/{name}", ns.name());
    let mut expected: BTreeMap<String, usize> = documents
        .iter()
        .map(|(ns, d)| {
            let name = d
                .lines()
                .nth(3)
                .unwrap()
                .trim()
                .trim_start_matches("name: ");
            (key(ns, name), 1)
        })
        .collect();
    expected.insert(key(&shop, "dual"), 2);
    let expected_ref: BTreeMap<&str, usize> =
        expected.iter().map(|(k, v)| (k.as_str(), *v)).collect();

    // MetalLB's assignment, checked against its objects.
    let metallb = all_assigned(&namespaces, &expected_ref).await;
    let ips = |name: &str| metallb[name].0.clone();
    for name in ["web", "local"] {
        assert!(
            ips(&key(&team, name))
                .iter()
                .all(|ip| in_net(*ip, "10.89.0.144/29")),
            "{name}: team pool"
        );
        assert!(
            ips(&key(&shop, name))
                .iter()
                .all(|ip| in_net(*ip, "10.89.0.128/28")),
            "{name}: general pool"
        );
    }
    assert_eq!(
        ips(&key(&shop, "asked")),
        ["10.89.0.153".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        ips(&key(&shop, "spec-ip")),
        ["10.89.0.154".parse::<IpAddr>().unwrap()]
    );
    assert!(in_net(ips(&key(&shop, "named"))[0], "10.89.0.152/29"));
    assert_eq!(ips(&key(&shop, "shared-a")), ips(&key(&shop, "shared-b")));
    assert!(in_net(ips(&key(&shop, "six"))[0], "fd00:89::310/124"));
    // MetalLB takes a dual-stack Service's two addresses from one pool.
    let dual_ips = ips(&key(&shop, "dual"));
    assert!(
        in_net(dual_ips[0], "10.89.0.128/28") && in_net(dual_ips[1], "fd00:89::300/124"),
        "{dual_ips:?}"
    );
    let before_raw = raw_ingress(&namespaces).await;
    all_answer(&metallb, Instant::now()).await;
    // Who announces each IPv4 VIP under MetalLB: the MAC the host resolved it to.
    let announced_by_metallb: BTreeMap<IpAddr, String> = metallb
        .values()
        .flat_map(|(ips, _)| ips.iter().copied().filter(IpAddr::is_ipv4))
        .map(|ip| {
            let (mac, _) =
                host_neighbour(ip).unwrap_or_else(|| panic!("no neighbour entry for {ip}"));
            (ip, mac)
        })
        .collect();

    // The hand-over, with no gap: ours starts beside MetalLB (its agents announce each VIP from the
    // node MetalLB's speaker announces it from, since they elect as MetalLB does, and kube-proxy
    // carries the traffic under both), then MetalLB's controller and speakers stop (its objects stay).
    // A watcher of the Services' status notes every address it sees change, and a client on the
    // bridge sends requests to every IPv4 VIP throughout.
    let changes = Arc::new(Mutex::new(Vec::<String>::new()));
    let watching = {
        let changes = changes.clone();
        let namespaces: Vec<String> = namespaces.iter().map(|n| n.to_string()).collect();
        let baseline = metallb.clone();
        tokio::spawn(async move {
            loop {
                let names: Vec<&str> = namespaces.iter().map(String::as_str).collect();
                for (key, (ips, _)) in ingresses(&names).await {
                    if baseline.get(&key).is_some_and(|(was, _)| *was != ips) {
                        changes.lock().unwrap().push(format!("{key}: {ips:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let targets: Vec<SocketAddr> = metallb
        .values()
        .flat_map(|(ips, port)| {
            ips.iter()
                .filter(|ip| ip.is_ipv4())
                .map(move |ip| SocketAddr::new(*ip, *port))
        })
        .collect();
    let stop_probing = Arc::new(AtomicBool::new(false));
    let probing = {
        let stop = stop_probing.clone();
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                for target in &targets {
                    match http_get(*target, "/").await {
                        Ok(_) => ok += 1,
                        Err(err) => failed.push(err),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (ok, failed)
        })
    };
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "# No pools: MetalLB's objects are read (loadBalancer.metallb.objects: auto).\nloadBalancer:\n  mode: agents\n  healthCheck: {interval: 1s, timeout: 500ms, healthyThreshold: 1, unhealthyThreshold: 2}\n  drainTimeout: 5s\n",
    )
    .unwrap();
    c.script(
        "manager",
        &[
            "--agents",
            "--cloud-config",
            config.path().to_str().unwrap(),
        ],
    );
    // Each IPv4 VIP is held by the node MetalLB announces it from (one the advertisement selects)
    // before MetalLB stops.
    let macs: BTreeMap<String, &str> = ["ccm-node-1", "ccm-node-2", "ccm-node-3"]
        .into_iter()
        .map(|n| (node_mac(n), n))
        .collect();
    for (vip, metallb_mac) in &announced_by_metallb {
        let node = macs[metallb_mac];
        assert!(
            ANNOUNCING.contains(&node),
            "{vip}: MetalLB announced it from {node}"
        );
        eventually(
            &format!("{vip} held by {node}, which MetalLB announced it from"),
            LONG,
            || async move {
                let held = c.exec_on_node(node, &["ip", "-o", "address", "show", "dev", "eth0"]);
                String::from_utf8_lossy(&held.stdout)
                    .contains(&format!(" {vip}/"))
                    .then_some(())
            },
        )
        .await;
    }
    c.kubectl(
        &[
            "-n",
            "metallb-system",
            "delete",
            "deployment/controller",
            "daemonset/speaker",
            "--wait=true",
        ],
        None,
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop_probing.store(true, Ordering::Relaxed);
    let (ok, failed) = probing.await.unwrap();
    println!(
        "the hand-over: {} of {} requests to {} VIPs failed, from before ours started to 10 s after MetalLB stopped",
        failed.len(),
        ok + failed.len() as u64,
        announced_by_metallb.len()
    );
    assert!(
        failed.is_empty(),
        "requests failed during the hand-over: {failed:?}"
    );
    // Where each VIP is now. Once in several runs the host's entry named another node 10 s after
    // MetalLB stopped, with no request failed. What fits (not proven): MetalLB's speakers stop one by
    // one, and one that outlives the VIP's speaker takes it over and sends its gratuitous ARP before
    // it stops too. Ours must still hold it on MetalLB's node and answer for it: asked again, the host
    // resolves it there (and the line printed names the node the entry had).
    let port_of: BTreeMap<IpAddr, u16> = metallb
        .values()
        .flat_map(|(ips, port)| ips.iter().map(move |ip| (*ip, *port)))
        .collect();
    for (vip, metallb_mac) in &announced_by_metallb {
        let node = macs[metallb_mac];
        let held = c.exec_on_node(node, &["ip", "-o", "address", "show", "dev", "eth0"]);
        assert!(
            String::from_utf8_lossy(&held.stdout).contains(&format!(" {vip}/")),
            "{vip} is no longer on {node}, which MetalLB announced it from"
        );
        let (mut mac, _) =
            host_neighbour(*vip).unwrap_or_else(|| panic!("no neighbour entry for {vip}"));
        if &mac != metallb_mac {
            let other = macs.get(&mac).copied().unwrap_or("a host that is no node");
            println!(
                "{vip}: the host's entry named {other} (MetalLB's stopping speakers re-announced it); \
                 asking again"
            );
            run(&["ip", "neigh", "del", &vip.to_string(), "dev", "ccm-br0"]).unwrap();
            http_get(SocketAddr::new(*vip, port_of[vip]), "/")
                .await
                .unwrap_or_else(|err| panic!("{vip} asked again: {err}"));
            mac = host_neighbour(*vip)
                .unwrap_or_else(|| panic!("no neighbour entry for {vip} asked again"))
                .0;
        }
        if &mac != metallb_mac {
            // What the agents did with it: which node took it, and why, is in their log.
            let logs = c.kubectl_output(
                &[
                    "-n",
                    "kube-system",
                    "logs",
                    "-l",
                    "k8s-app=local-agent",
                    "--prefix",
                    "--tail=400",
                ],
                None,
            );
            let about: Vec<String> = String::from_utf8_lossy(&logs.stdout)
                .lines()
                .filter(|l| {
                    l.contains(&vip.to_string()) || l.contains("member") || l.contains("fenced")
                })
                .map(str::to_owned)
                .collect();
            panic!(
                "{vip} moved to another node: the host resolves it to {mac}, MetalLB's node's is \
                 {metallb_mac}; the agents' log about it:\n{}",
                about.join("\n")
            );
        }
    }
    // Settled: every ingress as MetalLB wrote it, field for field, and none changed meanwhile.
    tokio::time::sleep(Duration::from_secs(5)).await;
    watching.abort();
    assert_eq!(raw_ingress(&namespaces).await, before_raw);
    assert_eq!(
        *changes.lock().unwrap(),
        Vec::<String>::new(),
        "an address changed during the hand-over"
    );
    // Each Service was told: it keeps its addresses, now served by local.
    for (service, (ips, _)) in &metallb {
        let (namespace, name) = service.split_once('/').unwrap();
        let events: kube::Api<k8s_openapi::api::events::v1::Event> =
            kube::Api::namespaced(c.client().await, namespace);
        let note = eventually(&format!("{service} told of the hand-over"), LONG, || {
            let events = events.clone();
            async move {
                events
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find_map(|e| {
                        (e.reason.as_deref() == Some("TakenOverFromMetalLB")
                            && e.regarding.as_ref()?.name.as_deref() == Some(name))
                        .then(|| e.note.unwrap_or_default())
                    })
            }
        })
        .await;
        assert!(note.contains(&ips[0].to_string()), "{service}: {note}");
    }

    // A new Service gets an address from the right pool.
    c.kubectl(
        &["-n", team.name(), "apply", "-f", "-"],
        Some(&service("fresh", 80, "", "")),
    );
    c.kubectl(
        &["-n", shop.name(), "apply", "-f", "-"],
        Some(&service("fresh", 80, "", "")),
    );
    let (team_fresh, _) = cluster_tests::ingress(team.name(), "fresh").await;
    let (shop_fresh, _) = cluster_tests::ingress(shop.name(), "fresh").await;
    assert!(in_net(team_fresh, "10.89.0.144/29"), "{team_fresh}");
    assert!(
        in_net(shop_fresh, "10.89.0.128/28"),
        "{shop_fresh}: general"
    );
    let before_renumbering = ingresses(&namespaces).await;

    // The team pool renumbered (its IPAddressPool patched, as an operator would): `local` reads the
    // change, and its manager gives the pool's Services new addresses at once (a settings change, not
    // the drift check's next round, minutes away), which the agents announce and kube-proxy serves.
    // Every other Service keeps its address.
    c.kubectl(
        &[
            "-n",
            "metallb-system",
            "patch",
            "ipaddresspool",
            "team",
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"addresses": ["10.89.0.160/29"]}}"#,
        ],
        None,
    );
    let renumbered = Instant::now();
    let team_keys: Vec<String> = ["web", "local", "fresh"]
        .iter()
        .map(|name| format!("{}/{name}", team.name()))
        .collect();
    let with_fresh = eventually("the team pool's Services renumbered", LONG, || {
        let (namespaces, team_keys) = (&namespaces, &team_keys);
        async move {
            let now = ingresses(namespaces).await;
            team_keys
                .iter()
                .all(|key| {
                    now.get(key).is_some_and(|(ips, _)| {
                        !ips.is_empty() && ips.iter().all(|ip| in_net(*ip, "10.89.0.160/29"))
                    })
                })
                .then_some(now)
        }
    })
    .await;
    for (key, (ips, port)) in &with_fresh {
        if !team_keys.contains(key) {
            assert_eq!(
                before_renumbering.get(key),
                Some(&(ips.clone(), *port)),
                "{key} is not in the renumbered pool and keeps its address"
            );
        }
    }
    let moved: Ingresses = with_fresh
        .iter()
        .filter(|(key, _)| team_keys.contains(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    all_answer(&moved, renumbered).await;

    // The way back: ours goes, MetalLB starts again; nothing moves.
    c.script("manager", &["--delete"]);
    c.script("metallb", &["--default-class"]);
    all_answer(&with_fresh, Instant::now()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        ingresses(&namespaces).await,
        with_fresh,
        "MetalLB kept every address"
    );

    drop(restore);
    c.ensure_manager(ManagerForm::Agents).await;
}

/// Puts the cluster back as the other tests have it, when the test ends or fails: MetalLB gone, the
/// nodes' labels off, ours in agents mode with `hack/cluster`'s own cloud-config (whose finalizers on
/// the Services then let them go).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let c = cluster();
        // Not `Cluster::script`, which panics on failure: this may run while the test panics.
        let script = |args: &[&str]| {
            let status =
                std::process::Command::new(cluster_tests::workspace_root().join("hack/cluster"))
                    .args(args)
                    .arg("--dir")
                    .arg(c.dir())
                    .status();
            if !status.is_ok_and(|s| s.success()) {
                eprintln!(
                    "putting the cluster back: hack/cluster {} failed",
                    args.join(" ")
                );
            }
        };
        script(&["metallb", "--default-class", "--delete"]);
        for node in ANNOUNCING {
            let _ = c.kubectl_output(&["label", "node", node, "metallb-test/l2-"], None);
        }
        script(&["manager", "--agents"]);
    }
}
