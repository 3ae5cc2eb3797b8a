//! The node-route and node-IPAM controllers against the real API server, with the fake cloud's state
//! file as the cloud's view of its routes.

mod support;

use std::{collections::HashSet, path::PathBuf, time::Duration};

use cloud_provider_fake::CloudState;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use support::{
    RunningManager, SERIAL, create_node, delete_nodes, events_for, eventually, get_node,
};
use test_control_plane::{kubelet_node, unique_name};

const WAIT: Duration = Duration::from_secs(30);

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

fn network_condition(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn with_pod_cidrs(mut node: Node, cidrs: &[&str]) -> Node {
    let spec = node.spec.as_mut().unwrap();
    spec.pod_cidr = Some(cidrs[0].to_owned());
    spec.pod_cidrs = Some(cidrs.iter().map(|c| c.to_string()).collect());
    node
}

async fn ipam_manager(cluster_cidr: &str, extra: &[&str]) -> RunningManager {
    let cidr = format!("--cluster-cidr={cluster_cidr}");
    let mut args = vec![
        "--controllers=nodeipam",
        "--allocate-node-cidrs=true",
        cidr.as_str(),
    ];
    args.extend_from_slice(extra);
    RunningManager::start("", &args).await
}

/// A /23 (two /24s) that no earlier run used, for a test that exhausts it; nodes already in the cluster
/// (other tests', or an earlier run's) first get CIDRs from `wide`, so the tiny range serves only the
/// test's own nodes. `second` picks the first octet's neighbourhood (`10.<second + 0..64>.x.0/23`).
async fn tiny_range_for_this_test(wide: &str, second: u32) -> String {
    let filler = ipam_manager(wide, &[]).await;
    eventually("every node to hold a CIDR", WAIT, || async {
        let all = support::nodes()
            .await
            .list(&Default::default())
            .await
            .ok()?
            .items;
        all.iter().all(|n| !pod_cidrs(n).is_empty()).then_some(())
    })
    .await;
    filler.stop().await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("10.{}.{}.0/23", second + nanos % 64, (nanos / 64 % 128) * 2)
}

async fn cidrs_of(names: &[String], families: usize) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for name in names {
        let node = eventually(&format!("CIDRs for {name}"), WAIT, || async {
            get_node(name)
                .await
                .filter(|n| pod_cidrs(n).len() == families)
        })
        .await;
        assert_eq!(
            node.spec.as_ref().unwrap().pod_cidr.as_ref(),
            Some(&pod_cidrs(&node)[0]),
            "podCIDR is the first"
        );
        all.push(pod_cidrs(&node));
    }
    all
}

#[tokio::test]
async fn ipam_gives_fifty_nodes_distinct_cidrs_and_a_restart_reallocates_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster: IpNet = "10.200.0.0/16".parse().unwrap();
    let manager = ipam_manager("10.200.0.0/16", &[]).await;
    let names: Vec<String> = (0..50).map(|i| unique_name(&format!("ipam-{i}"))).collect();
    for name in &names {
        create_node(&kubelet_node(name)).await;
    }
    let first = cidrs_of(&names, 1).await;
    let distinct: HashSet<&String> = first.iter().flatten().collect();
    assert_eq!(distinct.len(), 50, "a CIDR was handed out twice");
    for cidr in &distinct {
        let net: IpNet = cidr.parse().unwrap();
        assert!(cluster.contains(&net) && net.prefix_len() == 24, "{cidr}");
    }
    manager.stop().await;

    // A new manager rebuilds what is taken from the nodes: nothing moves, and a new node gets a new CIDR.
    let manager = ipam_manager("10.200.0.0/16", &[]).await;
    let late = unique_name("ipam-late");
    create_node(&kubelet_node(&late)).await;
    let late_cidr = cidrs_of(std::slice::from_ref(&late), 1).await.remove(0);
    assert!(
        !distinct.contains(&late_cidr[0]),
        "{late_cidr:?} was already given out"
    );
    assert_eq!(
        cidrs_of(&names, 1).await,
        first,
        "a restart reallocated CIDRs"
    );
    manager.stop().await;

    let mut all: Vec<&str> = names.iter().map(String::as_str).collect();
    all.push(&late);
    delete_nodes(&all).await;
}

#[tokio::test]
async fn ipam_dual_stack_gives_one_cidr_per_family() {
    let _serial = SERIAL.lock().await;
    let manager = ipam_manager(
        "10.201.0.0/16,fd00:201::/56",
        &["--node-cidr-mask-size-ipv6=64"],
    )
    .await;
    let names: Vec<String> = (0..3).map(|i| unique_name(&format!("dual-{i}"))).collect();
    for name in &names {
        create_node(&kubelet_node(name)).await;
    }
    let cidrs = cidrs_of(&names, 2).await;
    for pair in &cidrs {
        let v4: IpNet = pair[0].parse().unwrap();
        let v6: IpNet = pair[1].parse().unwrap();
        assert!(
            matches!(v4, IpNet::V4(_)) && v4.prefix_len() == 24,
            "{pair:?}"
        );
        assert!(
            matches!(v6, IpNet::V6(_)) && v6.prefix_len() == 64,
            "{pair:?}"
        );
    }
    let distinct: HashSet<&String> = cidrs.iter().flatten().collect();
    assert_eq!(distinct.len(), 6);
    manager.stop().await;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    delete_nodes(&refs).await;
}

#[tokio::test]
async fn an_exhausted_range_is_an_event_and_a_deleted_node_frees_its_cidr() {
    let _serial = SERIAL.lock().await;
    let tiny = tiny_range_for_this_test("10.203.0.0/16", 128).await;
    let manager = ipam_manager(&tiny, &[]).await;
    let names: Vec<String> = (0..3).map(|i| unique_name(&format!("full-{i}"))).collect();
    for name in &names[..2] {
        create_node(&kubelet_node(name)).await;
    }
    let held = cidrs_of(&names[..2], 1).await;
    create_node(&kubelet_node(&names[2])).await;
    eventually("the CIDRNotAvailable event", WAIT, || async {
        (!events_for(&names[2], "CIDRNotAvailable").await.is_empty()).then_some(())
    })
    .await;
    assert!(pod_cidrs(&get_node(&names[2]).await.unwrap()).is_empty());

    // Freed by a deletion, the CIDR goes to the waiting node.
    delete_nodes(&[&names[0]]).await;
    let got = cidrs_of(&names[2..], 1).await.remove(0);
    assert_eq!(got, held[0]);
    manager.stop().await;
    delete_nodes(&[&names[1], &names[2]]).await;
}

/// A manager running the route controller on a fake cloud that writes its state file.
struct Routing {
    manager: RunningManager,
    state_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Routing {
    async fn start(cloud: &str) -> Self {
        Self::start_with(cloud, &["--route-reconciliation-period=300ms"]).await
    }

    async fn start_with(cloud: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state_file = dir.path().join("state.json");
        let mut args = vec![
            "--controllers=route",
            "--cluster-cidr=10.210.0.0/16,fd00:210::/56",
        ];
        args.extend_from_slice(extra);
        let manager = RunningManager::start(
            &format!("stateFile: {}\n{cloud}", state_file.display()),
            &args,
        )
        .await;
        Self {
            manager,
            state_file,
            _dir: dir,
        }
    }

    /// (target node, CIDR, blackhole) of every route the cloud holds.
    fn routes(&self) -> Vec<(String, String, bool)> {
        CloudState::read(&self.state_file)
            .unwrap_or_default()
            .routes
            .into_iter()
            .map(|r| (r.target_node, r.destination_cidr, r.blackhole))
            .collect()
    }

    fn has_route(&self, node: &str, cidr: &str) -> bool {
        self.routes()
            .iter()
            .any(|(n, c, b)| n == node && c == cidr && !b)
    }

    fn calls(&self, method: &str) -> u64 {
        self.manager.cloud.snapshot().calls_to(method)
    }
}

#[tokio::test]
async fn routes_follow_the_nodes_pod_cidrs_within_the_cluster_cidr() {
    let _serial = SERIAL.lock().await;
    let r = Routing::start(
        r#"
routes:
  initial:
    - {name: stale-blackhole, targetNode: "", destinationCIDR: 10.210.99.0/24, blackhole: true}
    - {name: foreign, targetNode: somewhere, destinationCIDR: 192.168.50.0/24}
    - {name: foreign-blackhole, targetNode: "", destinationCIDR: 192.168.51.0/24, blackhole: true}
"#,
    )
    .await;
    let a = unique_name("route-a");
    let b = unique_name("route-b");
    let created = create_node(&with_pod_cidrs(
        kubelet_node(&a),
        &["10.210.1.0/24", "fd00:210:0:1::/64"],
    ))
    .await;
    create_node(&with_pod_cidrs(kubelet_node(&b), &["10.210.2.0/24"])).await;

    // A route per pod CIDR (dual-stack too), named from the node's UID.
    eventually("the routes", WAIT, || async {
        (r.has_route(&a, "10.210.1.0/24")
            && r.has_route(&a, "fd00:210:0:1::/64")
            && r.has_route(&b, "10.210.2.0/24"))
        .then_some(())
    })
    .await;
    let state = CloudState::read(&r.state_file).unwrap();
    let uid = created.metadata.uid.unwrap();
    assert!(
        state
            .routes
            .iter()
            .any(|route| route.target_node == a && route.name.starts_with(&uid)),
        "{state:?}"
    );
    // The blackhole inside the cluster CIDR goes; routes outside it stay, blackhole or not.
    eventually("the blackhole to go", WAIT, || async {
        (!r.routes().iter().any(|(_, c, _)| c == "10.210.99.0/24")).then_some(())
    })
    .await;
    assert!(r.routes().iter().any(|(_, c, _)| c == "192.168.50.0/24"));
    assert!(r.routes().iter().any(|(_, c, _)| c == "192.168.51.0/24"));

    // The nodes report their network as routed.
    for name in [&a, &b] {
        eventually("NetworkUnavailable=False/RouteCreated", WAIT, || async {
            get_node(name)
                .await
                .filter(|n| network_condition(n) == Some(("False".into(), "RouteCreated".into())))
        })
        .await;
    }

    // Nothing changes: passes go on (listing) but make no cloud write and no API write.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (creates, deletes, lists) = (
        r.calls("create_route"),
        r.calls("delete_route"),
        r.calls("list_routes"),
    );
    let writes = r.manager.metrics.api_writes();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(r.calls("list_routes") >= lists + 3, "passes ran");
    assert_eq!(
        (r.calls("create_route"), r.calls("delete_route")),
        (creates, deletes),
        "a no-op pass wrote to the cloud"
    );
    assert_eq!(
        r.manager.metrics.api_writes(),
        writes,
        "a no-op pass wrote to the API server"
    );
    // Upstream's labels: the passes that created and deleted routes `changed`, the quiet ones `noop`.
    let metrics = r.manager.metrics.encode();
    for sample in [
        r#"route_controller_route_sync_total{outcome="changed",trigger="periodic"}"#,
        r#"route_controller_route_sync_total{outcome="noop",trigger="periodic"}"#,
    ] {
        assert!(metrics.contains(sample), "{sample} in\n{metrics}");
    }

    // A deleted node's route goes.
    delete_nodes(&[&b]).await;
    eventually("the deleted node's route to go", WAIT, || async {
        (!r.routes().iter().any(|(n, _, _)| n == &b)).then_some(())
    })
    .await;

    r.manager.stop().await;
    delete_nodes(&[&a]).await;
}

#[tokio::test]
async fn a_route_the_cloud_refuses_is_an_event_and_a_network_unavailable_node() {
    let _serial = SERIAL.lock().await;
    let r = Routing::start("failureRate: {create_route: 1}\n").await;
    let name = unique_name("route-fail");
    create_node(&with_pod_cidrs(kubelet_node(&name), &["10.210.7.0/24"])).await;
    eventually("FailedToCreateRoute", WAIT, || async {
        (!events_for(&name, "FailedToCreateRoute").await.is_empty()).then_some(())
    })
    .await;
    eventually("NetworkUnavailable=True/NoRouteCreated", WAIT, || async {
        get_node(&name)
            .await
            .filter(|n| network_condition(n) == Some(("True".into(), "NoRouteCreated".into())))
    })
    .await;
    // A pass whose creations all failed changed nothing: upstream's `noop`, not `changed` (counted
    // once the pass ends, after the conditions are written).
    let metrics = eventually("a noop pass counted", WAIT, || async {
        let metrics = r.manager.metrics.encode();
        metrics
            .contains(r#"route_controller_route_sync_total{outcome="noop",trigger="periodic"}"#)
            .then_some(metrics)
    })
    .await;
    assert!(!metrics.contains(r#"outcome="changed""#), "{metrics}");
    // The cloud recovers: the next pass creates it and the condition flips.
    r.manager
        .set_cloud(&format!("stateFile: {}\n", r.state_file.display()));
    eventually("RouteCreated", WAIT, || async {
        get_node(&name)
            .await
            .filter(|n| network_condition(n) == Some(("False".into(), "RouteCreated".into())))
    })
    .await;
    assert!(r.has_route(&name, "10.210.7.0/24"));
    // A pass that cannot list the routes is an `error`.
    r.manager.set_cloud(&format!(
        "stateFile: {}\nfailureRate: {{list_routes: 1}}\n",
        r.state_file.display()
    ));
    eventually("an error pass counted", WAIT, || async {
        r.manager
            .metrics
            .encode()
            .contains(r#"route_controller_route_sync_total{outcome="error",trigger="periodic"}"#)
            .then_some(())
    })
    .await;
    r.manager.stop().await;
    delete_nodes(&[&name]).await;
}

/// Writes to `events` by the manager's user received within `[from, to)`, from the audit log.
fn audited_event_writes(from: std::time::SystemTime, to: std::time::SystemTime) -> usize {
    let log = std::fs::read_to_string(
        test_control_plane::control_plane()
            .dir()
            .join("logs/audit.log"),
    )
    .expect("the test control plane writes an audit log");
    let from = k8s_openapi::jiff::Timestamp::try_from(from).unwrap();
    let to = k8s_openapi::jiff::Timestamp::try_from(to).unwrap();
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["objectRef"]["resource"] == "events")
        .filter(|e| e["user"]["username"] == "system:cloud-controller-manager")
        .filter(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t >= from && t < to)
        })
        .count()
}

/// 200 nodes wait on a full range (issue #32 item 4): the events and log lines they cost per second are
/// bounded by their back-off (5 s doubling to 5 min per node), not one per node every 5 s; a CIDR freed
/// later goes to a waiting node at once. Prints the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_nodes_waiting_on_a_full_range_cost_bounded_events_and_logs() {
    use futures::StreamExt;
    use support::replica::{LEASE, Replica, delete_lease};
    const WAITING: usize = 200;
    const WINDOW: Duration = Duration::from_secs(60);
    let _serial = SERIAL.lock().await;
    test_control_plane::apply_shipped_rbac().await;
    delete_lease(LEASE).await;
    let tiny = tiny_range_for_this_test("10.204.0.0/16", 192).await;
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let config = dir.path().join("cloud.yaml");
    std::fs::write(&config, format!("stateFile: {}\n", state_file.display())).unwrap();
    let cidr = format!("--cluster-cidr={tiny}");
    let replica = Replica::start_on_cloud(
        &config,
        &state_file,
        &[
            "--controllers=nodeipam",
            "--allocate-node-cidrs=true",
            &cidr,
        ],
    );
    let holders: Vec<String> = (0..2)
        .map(|i| unique_name(&format!("holder-{i}")))
        .collect();
    for name in &holders {
        create_node(&kubelet_node(name)).await;
    }
    let held = cidrs_of(&holders, 1).await;
    let waiting: Vec<String> = (0..WAITING)
        .map(|i| unique_name(&format!("waiting-{i:03}")))
        .collect();
    let from = std::time::SystemTime::now();
    let lines_before = replica.log().lines().count();
    futures::stream::iter(waiting.clone())
        .for_each_concurrent(16, |name| async move {
            create_node(&kubelet_node(&name)).await;
        })
        .await;
    tokio::time::sleep(WINDOW).await;
    let to = std::time::SystemTime::now();
    let log = replica.log();
    let window_lines: Vec<&str> = log.lines().skip(lines_before).collect();
    let events = audited_event_writes(from, to);
    let per_second = |n: usize| n as f64 / WINDOW.as_secs_f64();
    eprintln!(
        "full range: {WAITING} nodes waiting for {WINDOW:?}: {events} event writes ({:.1}/s), {} log lines ({:.2}/s)",
        per_second(events),
        window_lines.len(),
        per_second(window_lines.len())
    );
    // Back-off steps at 0, 5, 15 and 35 s (then 75 s) fall in the window: at most 4 events per node and
    // the range's one, where a retry every 5 s would have cost 12 per node.
    assert!(
        events <= WAITING * 4 + 10,
        "{events} event writes for {WAITING} waiting nodes in {WINDOW:?}"
    );
    assert!(
        window_lines.len() <= 20,
        "log lines in the window:\n{}",
        window_lines.join("\n")
    );
    for name in waiting.iter().take(3) {
        assert!(pod_cidrs(&get_node(name).await.unwrap()).is_empty());
    }

    // A CIDR freed now goes to a waiting node at once, not at its next back-off step (up to 40 s away).
    let freed_at = std::time::Instant::now();
    delete_nodes(&[&holders[0]]).await;
    let taker = eventually("a waiting node to get the freed CIDR", WAIT, || async {
        let all = support::nodes()
            .await
            .list(&Default::default())
            .await
            .ok()?
            .items;
        all.into_iter().find(|n| {
            n.metadata
                .name
                .as_ref()
                .is_some_and(|name| waiting.contains(name))
                && pod_cidrs(n) == held[0]
        })
    })
    .await;
    eprintln!(
        "full range: the freed CIDR went to {} {:?} after the deletion",
        taker.metadata.name.unwrap_or_default(),
        freed_at.elapsed()
    );
    assert!(freed_at.elapsed() < Duration::from_secs(5));
    drop(replica);
    let mut all: Vec<&str> = waiting.iter().map(String::as_str).collect();
    all.push(&holders[1]);
    delete_nodes(&all).await;
    delete_lease(LEASE).await;
}

/// With `CloudControllerManagerWatchBasedRoutesReconciliation` (KEP-5237) a pod CIDR given to a node is
/// routed at once, not at the next period (an hour here); a heartbeat-like change (a label) starts no
/// pass; each pass is counted with its trigger.
#[tokio::test]
async fn watch_based_routes_follow_a_node_change_without_waiting_for_the_period() {
    let _serial = SERIAL.lock().await;
    let r = Routing::start_with(
        "",
        &[
            "--route-reconciliation-period=1h",
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true",
        ],
    )
    .await;
    let name = unique_name("watched");
    create_node(&kubelet_node(&name)).await;
    // The first pass (the period's first tick) has run.
    eventually("the first pass", WAIT, || async {
        (r.calls("list_routes") >= 1).then_some(())
    })
    .await;
    // Past upstream's 10 s between passes started by node changes, so the next one is not held back.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let lists = r.calls("list_routes");

    // A label changes nothing routes depend on: no pass.
    let nodes = support::nodes().await;
    nodes
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(r.calls("list_routes"), lists, "a label started a pass");

    // A pod CIDR: routed at once.
    let given = std::time::Instant::now();
    nodes
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"podCIDR": "10.210.77.0/24", "podCIDRs": ["10.210.77.0/24"]}})),
        )
        .await
        .unwrap();
    eventually("the route, long before the 1 h period", WAIT, || async {
        r.has_route(&name, "10.210.77.0/24").then_some(())
    })
    .await;
    eprintln!(
        "watch-based routes: routed {:?} after the pod CIDR was set",
        given.elapsed()
    );
    // Counted once the pass ends, after the nodes' conditions are written.
    eventually(
        "the pass counted as a node change that changed routes",
        WAIT,
        || async {
            r.manager
                .metrics
                .encode()
                .contains(
                    r#"route_controller_route_sync_total{outcome="changed",trigger="node_change"}"#,
                )
                .then_some(())
        },
    )
    .await;
    r.manager.stop().await;
    delete_nodes(&[&name]).await;
}
