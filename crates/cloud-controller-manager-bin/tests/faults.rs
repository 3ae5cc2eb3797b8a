//! Fault tests on the real control plane (issue #16): the API server or etcd stopped and restarted, a
//! cloud outage, a slow part of the cloud, and replicas whose leader is killed again and again. Each test
//! checks the end state (every node initialized, every Service with an ingress IP and exactly one load
//! balancer in the cloud, none left after the Services are deleted) and prints one `fault-figures:` line
//! with what was injected and how long recovery took from the moment the fault ended.
//!
//! `CCM_FAULT_SCALE=ci` (the default) runs small versions; `full` the long ones (`hack/faults` runs them
//! and writes the figures to `docs/reliability-results/`). Timing is never asserted beyond generous
//! upper bounds that prove recovery happened at all.

mod support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use cloud_provider_fake::{CloudState, LoadBalancerRecord};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use support::{
    RunningManager, SERIAL, create_namespace, load_balancer_service, load_balancers_in, nodes,
    replica::{LEASE, Replica, delete_lease, leader_among},
    services, status_ip,
};
use test_control_plane::{control_plane, kubelet_node, uninitialized_taint, unique_name};
use tokio::time::{Instant, sleep};

/// The label every node of these tests carries (value: the test run's id), so leftovers of an earlier,
/// failed run can be found and deleted.
const LABEL: &str = "ccm-rs.test/faults";

/// How big the tests are: `CCM_FAULT_SCALE=ci` (default) or `full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    Ci,
    Full,
}

impl Scale {
    fn get() -> Self {
        match std::env::var("CCM_FAULT_SCALE").as_deref() {
            Err(_) | Ok("") | Ok("ci") => Self::Ci,
            Ok("full") => Self::Full,
            Ok(other) => panic!("CCM_FAULT_SCALE={other}: use ci or full"),
        }
    }

    fn pick<T>(self, ci: T, full: T) -> T {
        match self {
            Self::Ci => ci,
            Self::Full => full,
        }
    }

    /// The upper bound for any end state to be reached: generous, it only proves recovery happened.
    fn wait(self) -> Duration {
        Duration::from_secs(self.pick(240, 900))
    }

    fn name(self) -> &'static str {
        self.pick("ci", "full")
    }
}

/// The figures of one test, printed as one `fault-figures:` line (`key=value` fields separated by
/// `; `) that `hack/faults` turns into a table row.
struct Figures {
    test: &'static str,
    injected: String,
    held: String,
    recovery: Duration,
    lost: usize,
    leaks: usize,
    notes: String,
}

impl Figures {
    fn print(&self) {
        println!(
            "fault-figures: test={}; scale={}; injected={}; held={}; recovery_s={:.1}; lost={}; leaks={}; notes={}",
            self.test,
            Scale::get().name(),
            self.injected,
            self.held,
            self.recovery.as_secs_f64(),
            self.lost,
            self.leaks,
            self.notes
        );
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// Whether the cloud-node controller has initialized `node`: a provider ID, and the uninitialized taint
/// gone.
fn initialized(node: &Node) -> bool {
    let taint = uninitialized_taint().key;
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.provider_id.as_deref())
        .is_some_and(|id| !id.is_empty())
        && !spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|taints| taints.iter().any(|t| t.key == taint))
}

/// Deletes the nodes of earlier runs of these tests (a failed run leaves them behind).
async fn delete_leftover_nodes() {
    let api = nodes().await;
    let leftovers = api
        .list(&ListParams::default().labels(LABEL))
        .await
        .expect("nodes listed");
    delete_all_nodes(&api, leftovers.items).await;
}

async fn delete_all_nodes(api: &Api<Node>, list: Vec<Node>) {
    stream::iter(list)
        .for_each_concurrent(16, |node| {
            let api = api.clone();
            async move {
                let name = node.metadata.name.unwrap_or_default();
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        })
        .await;
}

/// One test's objects: its namespace (the Services) and node label value, both named by `id`.
struct Run {
    id: String,
}

impl Run {
    async fn new(prefix: &str) -> Self {
        delete_leftover_nodes().await;
        let id = unique_name(prefix);
        create_namespace(&id).await;
        Self { id }
    }

    fn node_name(&self, i: usize) -> String {
        format!("{}-n{i:04}", self.id)
    }

    fn service_name(i: usize) -> String {
        format!("svc-{i:04}")
    }

    /// Registers nodes as kubelets do, 16 at a time.
    async fn create_nodes(&self, names: impl IntoIterator<Item = String>) {
        let api = nodes().await;
        stream::iter(names)
            .for_each_concurrent(16, |name| {
                let api = api.clone();
                async move {
                    let mut node = kubelet_node(&name);
                    node.metadata
                        .labels
                        .get_or_insert_default()
                        .insert(LABEL.to_owned(), self.id.clone());
                    api.create(&PostParams::default(), &node)
                        .await
                        .unwrap_or_else(|err| panic!("node {name} not created: {err}"));
                }
            })
            .await;
    }

    /// Creates LoadBalancer Services, 16 at a time.
    async fn create_services(&self, indexes: impl IntoIterator<Item = usize>) {
        let api = services(&self.id).await;
        stream::iter(indexes)
            .for_each_concurrent(16, |i| {
                let api = api.clone();
                async move {
                    let name = Self::service_name(i);
                    api.create(&PostParams::default(), &load_balancer_service(&name, &[80]))
                        .await
                        .unwrap_or_else(|err| panic!("service {name} not created: {err}"));
                }
            })
            .await;
    }

    /// This run's nodes, `None` while the API server does not answer.
    async fn nodes(&self) -> Option<Vec<Node>> {
        let params = ListParams::default().labels(&format!("{LABEL}={}", self.id));
        nodes()
            .await
            .list(&params)
            .await
            .ok()
            .map(|list| list.items)
    }

    /// This run's Services with their status IPs, `None` while the API server does not answer.
    async fn service_ips(&self) -> Option<BTreeMap<String, Option<String>>> {
        let list = services(&self.id)
            .await
            .list(&ListParams::default())
            .await
            .ok()?;
        Some(
            list.items
                .iter()
                .map(|s| (s.metadata.name.clone().unwrap_or_default(), status_ip(s)))
                .collect(),
        )
    }

    /// (nodes initialized, Services with an ingress IP), `None` while the API server does not answer.
    async fn progress(&self) -> Option<(usize, usize)> {
        let nodes = self.nodes().await?;
        let ips = self.service_ips().await?;
        Some((
            nodes.iter().filter(|n| initialized(n)).count(),
            ips.values().filter(|ip| ip.is_some()).count(),
        ))
    }

    /// `Ok` in the end state: all `want_nodes` nodes initialized, all `want_services` Services with an
    /// ingress IP, and the cloud holding exactly one load balancer per Service, with that IP, and none
    /// for anything else. Otherwise what is missing.
    async fn end_state(
        &self,
        want_nodes: usize,
        want_services: usize,
        cloud: &dyn Fn() -> CloudState,
    ) -> Result<(), String> {
        let nodes = self.nodes().await.ok_or("the API server does not answer")?;
        let ready = nodes.iter().filter(|n| initialized(n)).count();
        if nodes.len() != want_nodes || ready != want_nodes {
            return Err(format!(
                "{ready} of {want_nodes} nodes initialized ({} listed)",
                nodes.len()
            ));
        }
        let ips = self
            .service_ips()
            .await
            .ok_or("the API server does not answer")?;
        let with_ip = ips.values().filter(|ip| ip.is_some()).count();
        if ips.len() != want_services || with_ip != want_services {
            return Err(format!(
                "{with_ip} of {want_services} Services have an ingress IP ({} listed)",
                ips.len()
            ));
        }
        let mut in_cloud: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for lb in load_balancers_in(&cloud(), &self.id) {
            let name = lb.service[self.id.len() + 1..].to_owned();
            in_cloud
                .entry(name)
                .or_default()
                .push(lb.ingress.first().cloned().unwrap_or_default());
        }
        for (name, ip) in &ips {
            match in_cloud.remove(name).as_deref() {
                Some([cloud_ip]) if Some(cloud_ip) == ip.as_ref() => {}
                other => {
                    return Err(format!(
                        "Service {name} has IP {ip:?}, the cloud's load balancers for it: {other:?}"
                    ));
                }
            }
        }
        if !in_cloud.is_empty() {
            return Err(format!(
                "load balancers for Services that do not exist: {in_cloud:?}"
            ));
        }
        Ok(())
    }

    /// Waits for [`Run::end_state`], failing after `timeout` with what is still missing; returns when it
    /// was reached.
    async fn wait_end_state(
        &self,
        want_nodes: usize,
        want_services: usize,
        cloud: &dyn Fn() -> CloudState,
        timeout: Duration,
    ) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            match self.end_state(want_nodes, want_services, cloud).await {
                Ok(()) => return Instant::now(),
                Err(why) => assert!(
                    Instant::now() < deadline,
                    "no end state within {timeout:?}: {why}"
                ),
            }
            sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes every Service of the run, waits for them to be gone (the manager removes its finalizer
    /// after deleting the load balancer), and returns the load balancers the cloud still holds for them
    /// and how long that took.
    async fn delete_services(
        &self,
        cloud: &dyn Fn() -> CloudState,
        timeout: Duration,
    ) -> (Vec<LoadBalancerRecord>, Duration) {
        let started = Instant::now();
        let api = services(&self.id).await;
        let names: Vec<String> = self
            .service_ips()
            .await
            .expect("services listed")
            .into_keys()
            .collect();
        stream::iter(names)
            .for_each_concurrent(16, |name| {
                let api = api.clone();
                async move {
                    let _ = api.delete(&name, &DeleteParams::default()).await;
                }
            })
            .await;
        support::eventually("every Service to be gone", timeout, || async {
            self.service_ips()
                .await
                .filter(|ips| ips.is_empty())
                .map(|_| ())
        })
        .await;
        (load_balancers_in(&cloud(), &self.id), started.elapsed())
    }

    async fn delete_nodes(&self) {
        let api = nodes().await;
        delete_all_nodes(&api, self.nodes().await.unwrap_or_default()).await;
    }
}

/// Stops `component` of the control plane, without blocking the runtime.
async fn stop_component(component: &'static str) {
    tokio::task::spawn_blocking(move || control_plane().stop_component(component))
        .await
        .expect("stop_component does not panic");
}

/// Starts `component` again and waits until the API server is ready.
async fn start_component(component: &'static str) {
    tokio::task::spawn_blocking(move || control_plane().start_component(component))
        .await
        .expect("start_component does not panic");
}

/// a/b: `component` of the control plane is stopped while the manager initializes N nodes and
/// provisions M Services, and started again: the manager ends in the end state, and nothing leaks.
async fn control_plane_component_outage(test: &'static str, component: &'static str) {
    let _serial = SERIAL.lock().await;
    let scale = Scale::get();
    let (want_nodes, want_services) = scale.pick((100, 20), (500, 100));
    let down_for = Duration::from_secs(scale.pick(5, 30));
    let run = Run::new(test.split('_').next().unwrap_or("cp")).await;
    // 500 ms per cloud call keeps the manager busy for seconds, so the fault lands in the middle.
    let manager =
        RunningManager::start("latency: 500ms\n", &["--controllers=cloud-node,service"]).await;
    let cloud = || manager.cloud.snapshot();

    run.create_nodes((0..want_nodes).map(|i| run.node_name(i)))
        .await;
    run.create_services(0..want_services).await;
    // The fault lands once the manager is under way: a tenth of the nodes initialized.
    let (nodes_before, services_before) = support::eventually(
        "a tenth of the nodes to be initialized",
        scale.wait(),
        || async {
            let (nodes, services) = run.progress().await?;
            (nodes >= want_nodes / 10).then_some((nodes, services))
        },
    )
    .await;
    stop_component(component).await;
    let stopped = Instant::now();
    sleep(down_for.saturating_sub(stopped.elapsed())).await;
    start_component(component).await;
    let outage = stopped.elapsed();
    let fault_ended = Instant::now();

    let converged = run
        .wait_end_state(want_nodes, want_services, &cloud, scale.wait())
        .await;
    let recovery = converged - fault_ended;
    let (left, deletion) = run.delete_services(&cloud, scale.wait()).await;
    assert!(left.is_empty(), "load balancers leaked: {left:?}");
    manager.stop().await;
    run.delete_nodes().await;

    Figures {
        test,
        injected: format!(
            "{component} stopped for {} s while {want_nodes} nodes were initialized and {want_services} Services provisioned (cloud latency 500 ms)",
            secs(outage)
        ),
        held: format!(
            "{want_nodes}/{want_nodes} nodes initialized, {want_services}/{want_services} Services with one load balancer each, 0 after deletion"
        ),
        recovery,
        lost: 0,
        leaks: left.len(),
        notes: format!(
            "done before the fault: {nodes_before} nodes, {services_before} Services; deleting the Services took {} s",
            secs(deletion)
        ),
    }
    .print();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_restart_during_node_and_service_work() {
    control_plane_component_outage(
        "api_server_restart_during_node_and_service_work",
        "kube-apiserver",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_during_node_and_service_work() {
    control_plane_component_outage("etcd_restart_during_node_and_service_work", "etcd").await;
}

/// c: every cloud call fails for T seconds while nodes and Services are created: nothing is initialized
/// or provisioned meanwhile, and everything is once the cloud is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_outage_while_nodes_and_services_are_created() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::get();
    let (want_nodes, want_services) = scale.pick((100, 20), (500, 100));
    let outage = Duration::from_secs(scale.pick(15, 60));
    let run = Run::new("cloud-outage").await;
    let healthy = "latency: 20ms\n";
    let manager = RunningManager::start(healthy, &["--controllers=cloud-node,service"]).await;
    let cloud = || manager.cloud.snapshot();

    manager.set_cloud("latency: 20ms\nfailureRate: {all: 1.0}\n");
    let started = Instant::now();
    // Half at the start of the outage, half in its middle.
    run.create_nodes((0..want_nodes / 2).map(|i| run.node_name(i)))
        .await;
    run.create_services(0..want_services / 2).await;
    sleep((outage / 2).saturating_sub(started.elapsed())).await;
    run.create_nodes((want_nodes / 2..want_nodes).map(|i| run.node_name(i)))
        .await;
    run.create_services(want_services / 2..want_services).await;
    sleep(outage.saturating_sub(started.elapsed())).await;
    let during = run.progress().await.expect("the API server answers");
    let failed_calls = cloud().calls.values().sum::<u64>();
    manager.set_cloud(healthy);
    let fault_ended = Instant::now();
    assert_eq!(
        during,
        (0, 0),
        "nothing can be initialized or provisioned while every cloud call fails"
    );

    let converged = run
        .wait_end_state(want_nodes, want_services, &cloud, scale.wait())
        .await;
    let recovery = converged - fault_ended;
    let (left, deletion) = run.delete_services(&cloud, scale.wait()).await;
    assert!(left.is_empty(), "load balancers leaked: {left:?}");
    manager.stop().await;
    run.delete_nodes().await;

    Figures {
        test: "cloud_outage_while_nodes_and_services_are_created",
        injected: format!(
            "every cloud call failed for {} s ({failed_calls} calls) while {want_nodes} nodes and {want_services} Services were created",
            secs(outage)
        ),
        held: format!(
            "nothing initialized during the outage; then {want_nodes}/{want_nodes} nodes, {want_services}/{want_services} Services with one load balancer each, 0 after deletion"
        ),
        recovery,
        lost: 0,
        leaks: left.len(),
        notes: format!(
            "recovery includes the back-off of the last failed attempt (nodes 5 ms doubling, Services 5 s doubling); deleting the Services took {} s",
            secs(deletion)
        ),
    }
    .print();
}

/// c': only the load-balancer calls fail for T seconds: the cloud-node controller, which does not need
/// them, initializes every node during the outage; the Services are provisioned once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_outage_does_not_stop_node_initialization() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::get();
    let (want_nodes, want_services) = scale.pick((100, 20), (500, 100));
    let outage = Duration::from_secs(scale.pick(15, 60));
    let run = Run::new("lb-outage").await;
    let healthy = "latency: 20ms\n";
    let manager = RunningManager::start(healthy, &["--controllers=cloud-node,service"]).await;
    let cloud = || manager.cloud.snapshot();

    manager.set_cloud(
        "latency: 20ms\nfailureRate: {get_load_balancer: 1, ensure_load_balancer: 1, update_load_balancer: 1, ensure_load_balancer_deleted: 1}\n",
    );
    let started = Instant::now();
    run.create_services(0..want_services).await;
    run.create_nodes((0..want_nodes).map(|i| run.node_name(i)))
        .await;
    let nodes_done = support::eventually(
        "every node to be initialized while the load-balancer calls fail",
        outage.saturating_sub(started.elapsed()),
        || async {
            let (nodes, _) = run.progress().await?;
            (nodes == want_nodes).then(|| started.elapsed())
        },
    )
    .await;
    let (_, services_during) = run.progress().await.expect("the API server answers");
    sleep(outage.saturating_sub(started.elapsed())).await;
    let failed_calls = cloud().calls_to("ensure_load_balancer");
    manager.set_cloud(healthy);
    let fault_ended = Instant::now();
    assert_eq!(
        services_during, 0,
        "no Service can get an IP while ensure_load_balancer fails"
    );
    assert!(failed_calls > 0, "the service controller tried");

    let converged = run
        .wait_end_state(want_nodes, want_services, &cloud, scale.wait())
        .await;
    let recovery = converged - fault_ended;
    let (left, deletion) = run.delete_services(&cloud, scale.wait()).await;
    assert!(left.is_empty(), "load balancers leaked: {left:?}");
    manager.stop().await;
    run.delete_nodes().await;

    Figures {
        test: "load_balancer_outage_does_not_stop_node_initialization",
        injected: format!(
            "every load-balancer call failed for {} s ({failed_calls} ensure_load_balancer calls) while {want_nodes} nodes and {want_services} Services were created",
            secs(outage)
        ),
        held: format!(
            "all {want_nodes} nodes initialized during the outage (in {} s); then {want_services}/{want_services} Services with one load balancer each, 0 after deletion",
            secs(nodes_done)
        ),
        recovery,
        lost: 0,
        leaks: left.len(),
        notes: format!(
            "recovery includes the Services' back-off (5 s doubling); deleting the Services took {} s",
            secs(deletion)
        ),
    }
    .print();
}

/// Waits until `count` nodes of `run` are initialized; each node's time from `started`.
async fn initialization_times(
    run: &Run,
    count: usize,
    started: Instant,
    timeout: Duration,
) -> BTreeMap<String, Duration> {
    let mut done: BTreeMap<String, Duration> = BTreeMap::new();
    while done.len() < count {
        assert!(
            started.elapsed() < timeout,
            "only {} of {count} nodes initialized within {timeout:?}",
            done.len()
        );
        for node in run.nodes().await.unwrap_or_default() {
            if initialized(&node) {
                let name = node.metadata.name.unwrap_or_default();
                done.entry(name).or_insert_with(|| started.elapsed());
            }
        }
        sleep(Duration::from_millis(50)).await;
    }
    done
}

/// d: a few instances answer in 5 s per call: the other nodes initialize at normal speed. The fast
/// nodes are first initialized alone (the baseline), then again, as new nodes, with the slow ones
/// registered just before them: they must finish within twice the baseline (plus 2 s), and the slow ones
/// not before their 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_instances_do_not_hold_up_the_others() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::get();
    let (fast, slow) = scale.pick((100, 3), (500, 5));
    const SLOW: Duration = Duration::from_secs(5);
    let run = Run::new("slow-cloud").await;

    // The baseline: the fast nodes alone.
    let manager = RunningManager::start("latency: 20ms\n", &["--controllers=cloud-node"]).await;
    let started = Instant::now();
    run.create_nodes((0..fast).map(|i| format!("{}-base-{i:04}", run.id)))
        .await;
    let baseline = initialization_times(&run, fast, started, scale.wait()).await;
    let baseline_last = *baseline.values().max().expect("fast nodes");
    manager.stop().await;
    run.delete_nodes().await;
    support::eventually("the baseline nodes to be gone", scale.wait(), || async {
        run.nodes().await.filter(Vec::is_empty).map(|_| ())
    })
    .await;

    let slow_names: Vec<String> = (0..slow).map(|i| format!("{}-slow-{i}", run.id)).collect();
    let mut yaml = "latency: 20ms\ninstances:\n".to_owned();
    for name in &slow_names {
        yaml.push_str(&format!("  {name}: {{latency: 5s}}\n"));
    }
    let manager = RunningManager::start(&yaml, &["--controllers=cloud-node"]).await;
    // The slow ones first: they take their workers before the fast ones arrive.
    let started = Instant::now();
    run.create_nodes(slow_names.clone()).await;
    run.create_nodes((0..fast).map(|i| run.node_name(i))).await;
    let done = initialization_times(&run, fast + slow, started, scale.wait()).await;
    manager.stop().await;
    run.delete_nodes().await;

    let slow_times: Vec<Duration> = slow_names.iter().map(|n| done[n]).collect();
    let mut fast_times: Vec<Duration> = done
        .iter()
        .filter(|(name, _)| !slow_names.contains(name))
        .map(|(_, t)| *t)
        .collect();
    fast_times.sort();
    let fast_last = *fast_times.last().expect("fast nodes");
    let fast_median = fast_times[fast_times.len() / 2];
    let slow_first = *slow_times.iter().min().expect("slow nodes");
    let slow_last = *slow_times.iter().max().expect("slow nodes");
    assert!(
        slow_first >= SLOW,
        "a slow node was initialized in {slow_first:?}, before its instance answered"
    );
    let bound = baseline_last * 2 + Duration::from_secs(2);
    assert!(
        fast_last <= bound,
        "with {slow} slow instances the {fast} fast nodes took {fast_last:?}, alone {baseline_last:?}: the slow ones held them up"
    );

    Figures {
        test: "slow_instances_do_not_hold_up_the_others",
        injected: format!(
            "{slow} of {} instances answer in 5 s per call (the others 20 ms)",
            fast + slow
        ),
        held: format!(
            "the {fast} fast nodes initialized in {} s (alone: {} s; median {} s), {} the first slow one ({} s; last {} s)",
            secs(fast_last),
            secs(baseline_last),
            secs(fast_median),
            if fast_last < slow_first { "all before" } else { "not all before" },
            secs(slow_first),
            secs(slow_last)
        ),
        recovery: Duration::ZERO,
        lost: 0,
        leaks: 0,
        notes: "no fault ends here (recovery 0): the figures are initialization times from the first node's creation"
            .to_owned(),
    }
    .print();
}

/// The replicas of a test; when the test fails, whether each still runs and the end of its log are
/// printed.
struct Replicas(Vec<Replica>);

impl Drop for Replicas {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (i, replica) in self.0.iter_mut().enumerate() {
            let log = replica.log();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- replica {i} (pid {}, exited: {:?}), last 80 log lines ---\n{}",
                replica.pid(),
                replica.exited(),
                lines[lines.len().saturating_sub(80)..].join("\n")
            );
        }
    }
}

/// The cloud-config of the replicas' shared cloud: 20 % of all calls fail, as "retry after 2 s" (a
/// throttling cloud). Plain errors would put each Service on its own back-off (5 s doubling to 300 s)
/// whose tail, not the faults, would set the test's length: with two calls per deletion attempt, one
/// Service in a hundred fails six attempts in a row and waits over five minutes.
fn shared_cloud_config(dir: &Path, state_file: &Path) -> PathBuf {
    let path = dir.join("cloud.yaml");
    std::fs::write(
        &path,
        format!(
            "stateFile: {}\nstateFileShared: true\nlatency: 50ms\nfailureRate: {{all: 0.2}}\nseed: 16\nretryAfter: 2s\n",
            state_file.display()
        ),
    )
    .unwrap();
    path
}

/// e: three replicas share one cloud (20 % of its calls fail); the leader is SIGKILLed every 20 s while
/// Services are created (and replaced by a new replica, as a Deployment would): exactly one load
/// balancer per Service with the Service's IP, and none after the Services are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_leader_killed_every_20_s_with_cloud_failures() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::get();
    let want_services = scale.pick(40, 200);
    let kills = scale.pick(2, 10);
    const PERIOD: Duration = Duration::from_secs(20);
    const BACKENDS: usize = 3;
    test_control_plane::apply_shipped_rbac().await;
    delete_lease(LEASE).await;
    let run = Arc::new(Run::new("chaos").await);
    run.create_nodes((0..BACKENDS).map(|i| run.node_name(i)))
        .await;

    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let config = shared_cloud_config(dir.path(), &state_file);
    let verbosity = if std::env::var_os("CCM_FAULT_DEBUG").is_some() {
        "-v=4"
    } else {
        "-v=0"
    };
    let args = [
        verbosity,
        "--controllers=service,cloud-node",
        "--leader-elect-lease-duration=8s",
        "--leader-elect-renew-deadline=6s",
        "--leader-elect-retry-period=2s",
    ];
    let start = || Replica::start_on_cloud(&config, &state_file, &args);
    let mut replicas = Replicas((0..3).map(|_| start()).collect());
    let cloud = || CloudState::read(&state_file).expect("the shared state file");

    // The Services arrive one by one over the whole kill window.
    let window = PERIOD * kills as u32;
    let creator = {
        let run = run.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let interval = window / want_services as u32;
            for i in 0..want_services {
                sleep((interval * i as u32).saturating_sub(started.elapsed())).await;
                run.create_services([i]).await;
            }
        })
    };
    let started = Instant::now();
    let mut handovers = Vec::new();
    let mut last_kill = Instant::now();
    for k in 1..=kills {
        sleep((PERIOD * k as u32).saturating_sub(started.elapsed())).await;
        let refs: Vec<&Replica> = replicas.0.iter().collect();
        let leader = leader_among(LEASE, &refs, Duration::from_secs(60)).await;
        replicas.0[leader].signal("KILL");
        last_kill = Instant::now();
        replicas.0[leader].wait_exit(Duration::from_secs(10));
        replicas.0[leader] = start();
        // How long the replicas were without a leader.
        let refs: Vec<&Replica> = replicas.0.iter().collect();
        leader_among(LEASE, &refs, Duration::from_secs(60)).await;
        handovers.push(last_kill.elapsed());
    }
    creator.await.expect("the Services were created");
    let converged = run
        .wait_end_state(BACKENDS, want_services, &cloud, scale.wait())
        .await;
    let recovery = converged - last_kill;
    eprintln!(
        "chaos: end state {:?} after the first Service was created",
        converged - started
    );
    let (left, deletion) = run.delete_services(&cloud, scale.wait()).await;

    assert!(left.is_empty(), "load balancers leaked: {left:?}");
    if std::env::var_os("CCM_FAULT_DEBUG").is_some() {
        for (i, replica) in replicas.0.iter().enumerate() {
            eprintln!(
                "--- replica {i} (pid {}) ---\n{}",
                replica.pid(),
                replica.log()
            );
        }
    }
    let state = cloud();
    let calls: u64 = state.calls.values().sum();
    let replicas_started = 3 + kills;
    drop(replicas);
    run.delete_nodes().await;
    delete_lease(LEASE).await;

    let handovers: Vec<String> = handovers.into_iter().map(secs).collect();
    Figures {
        test: "chaos_leader_killed_every_20_s_with_cloud_failures",
        injected: format!(
            "3 replicas on one shared fake cloud, the leader SIGKILLed every 20 s ({kills} times, lease 8 s) while {want_services} Services were created, 20 % of all cloud calls failing (retry after 2 s)"
        ),
        held: format!(
            "{want_services}/{want_services} Services with exactly one load balancer carrying their IP, 0 after deletion"
        ),
        recovery,
        lost: 0,
        leaks: left.len(),
        notes: format!(
            "new leader after each kill in {} s; deleting the Services took {} s; {replicas_started} replica processes, {calls} cloud calls",
            handovers.join("/"),
            secs(deletion)
        ),
    }
    .print();
}
