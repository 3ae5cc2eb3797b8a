//! Split brain, tried: a leader that loses contact with the API server while its requests hang (a
//! frozen API server, a silent network cut) stops writing at its renew deadline and exits 1, and a
//! standby takes over. The API server's audit log proves the old leader wrote nothing after its
//! deadline.

mod support;

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant, SystemTime},
};

use support::{
    SERIAL,
    audit::{audited_writes, describe},
    blackhole_proxy::{BlackholeProxy, api_server, kubeconfig_through},
    replica::{LEASE, Replica, delete_lease, leader_among},
};
use test_control_plane::control_plane;

/// The manager's defaults, as the replicas here run them.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Leeway for the process to notice, log and exit, on a loaded 2-core machine.
const EXIT_LEEWAY: Duration = Duration::from_secs(2);

/// Writes from `source` at or after `after`, described.
fn audited_writes_from(source: &str, after: SystemTime) -> Vec<String> {
    audited_writes(source, after).iter().map(describe).collect()
}

/// Waits for the replica to exit; returns its code and how long after `since` it exited.
async fn exit_after(
    replica: &mut Replica,
    since: Instant,
    within: Duration,
) -> (Option<i32>, Duration) {
    loop {
        if let Some(code) = replica.exited() {
            return (code, since.elapsed());
        }
        assert!(
            since.elapsed() < within,
            "the cut-off leader has not exited {within:?} after losing contact:\n{}",
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_lost_message(log: &str) {
    let line = log
        .lines()
        .find(|l| l.contains("leaderelection lost"))
        .unwrap_or_else(|| panic!("no 'leaderelection lost' line:\n{log}"));
    assert!(
        line.contains(&format!(
            "lease kube-system/{LEASE} was not renewed within the renew deadline of 10s (last renewed "
        )),
        "{line}"
    );
}

/// The leader reaches the API server through a proxy that goes silent (every byte dropped, both
/// ways); a standby connects directly. The cut lasts past the renew deadline and ends before the
/// standby could have taken over, so a leader that kept running would write again, from the proxy's
/// address, as soon as the cut ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_silently_stops_writing_at_its_deadline_and_a_standby_takes_over() {
    let _serial = SERIAL.lock().await;
    test_control_plane::apply_shipped_rbac().await;
    delete_lease(LEASE).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy_source = "127.0.0.2";
    let proxy = BlackholeProxy::start(api_server(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))).await;
    let through_proxy = dir.path().join("through-proxy.kubeconfig");
    kubeconfig_through(
        &control_plane().ccm_kubeconfig(),
        proxy.address(),
        &through_proxy,
    );

    let mut leader = Replica::start_with(dir.path(), 0, &through_proxy, &[]);
    leader_among(LEASE, &[&leader], Duration::from_secs(30)).await;
    let standby = Replica::start(dir.path(), 1);
    tokio::time::sleep(RETRY_PERIOD * 2).await; // the standby has seen the Lease renewed

    let cut_at = Instant::now();
    let cut_wall = SystemTime::now();
    proxy.set_cut(true);
    // Its last renewal started before the cut, so its deadline is at most this.
    let deadline_wall = cut_wall + RENEW_DEADLINE;

    let (code, exited_after) = exit_after(
        &mut leader,
        cut_at,
        RENEW_DEADLINE + RETRY_PERIOD + EXIT_LEEWAY,
    )
    .await;
    assert_eq!(
        code,
        Some(1),
        "exit code of the cut-off leader:\n{}",
        leader.log()
    );
    assert_lost_message(&leader.log());
    // End the cut before the standby can take over (lease duration 15 s): a leader still running would
    // renew now, from the proxy's address.
    proxy.set_cut(false);
    let takeover = leader_among(LEASE, &[&standby], Duration::from_secs(30)).await;
    assert_eq!(takeover, 0);
    let took_over_after = cut_at.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await; // the audit log is written as requests finish

    let late = audited_writes_from(proxy_source, deadline_wall);
    assert!(
        late.is_empty(),
        "the cut-off leader wrote after its deadline: {late:?}"
    );
    assert!(
        !audited_writes_from(proxy_source, cut_wall - Duration::from_secs(60)).is_empty(),
        "the audit log shows the leader's renewals through the proxy before the cut"
    );
    eprintln!(
        "silent cut: the leader exited 1 after {exited_after:?}, the standby led after {took_over_after:?}, 0 writes after the deadline"
    );
}

/// A frozen API server accepts connections and answers nothing: the leader's renewal hangs. It must
/// give up at its deadline and exit 1, and a standby leads once the API server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_api_server_freezes_exits_at_its_deadline() {
    let _serial = SERIAL.lock().await;
    test_control_plane::apply_shipped_rbac().await;
    delete_lease(LEASE).await;
    let dir = tempfile::tempdir().unwrap();
    let mut leader = Replica::start(dir.path(), 0);
    leader_among(LEASE, &[&leader], Duration::from_secs(30)).await;
    let standby = Replica::start(dir.path(), 1);
    tokio::time::sleep(RETRY_PERIOD * 2).await;

    let frozen_at = Instant::now();
    let frozen = control_plane().freeze_api_server();
    let (code, exited_after) = exit_after(
        &mut leader,
        frozen_at,
        RENEW_DEADLINE + RETRY_PERIOD + EXIT_LEEWAY,
    )
    .await;
    drop(frozen);
    assert_eq!(code, Some(1), "exit code of the leader:\n{}", leader.log());
    assert_lost_message(&leader.log());

    let takeover = leader_among(LEASE, &[&standby], Duration::from_secs(40)).await;
    assert_eq!(takeover, 0);
    eprintln!(
        "frozen API server: the leader exited 1 after {exited_after:?}; the standby led {:?} after the freeze",
        frozen_at.elapsed()
    );
}

/// How the old leader's writes are held back while a standby takes over.
#[derive(Debug, Clone, Copy)]
enum Freeze {
    /// The leader process is stopped (SIGSTOP) and continued after the takeover.
    Process,
    /// The network between it and the API server holds every byte and delivers them after the
    /// takeover.
    HeldBytes,
}

/// Writes from `source` received at or after `after` that completed, with their resource and response
/// code: `(verb resource/name at time, resource, code)`.
fn audited_writes_with_codes(source: &str, after: SystemTime) -> Vec<(String, String, i64)> {
    audited_writes(source, after)
        .iter()
        .filter(|event| event["stage"] == "ResponseComplete")
        .map(|event| {
            (
                describe(event),
                event["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or("?")
                    .to_owned(),
                event["responseStatus"]["code"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

/// The old leader is frozen (stopped, or its bytes held by the network) in the middle of a 300-node
/// burst, a standby takes over and finishes the burst, then the old leader's held writes arrive. Every
/// write of the old leader the API server received after the standby acquired the Lease must have failed
/// (a precondition: 409), except events, which carry none (a late event is a duplicate report, not a
/// wrong state). Prints the figures.
async fn late_writes_of_a_frozen_leader_fail(freeze: Freeze) {
    use k8s_openapi::api::coordination::v1::Lease;
    const NODES: usize = 300;
    test_control_plane::apply_shipped_rbac().await;
    delete_lease(LEASE).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy_source = "127.0.0.3";
    let proxy = BlackholeProxy::start(api_server(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3))).await;
    let through_proxy = dir.path().join("through-proxy.kubeconfig");
    kubeconfig_through(
        &control_plane().ccm_kubeconfig(),
        proxy.address(),
        &through_proxy,
    );
    // One shared cloud whose instance calls take 20 ms, so the burst lasts a few seconds.
    let state_file = dir.path().join("state.json");
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "stateFile: {}\nstateFileShared: true\nlatency: 20ms\n",
            state_file.display()
        ),
    )
    .unwrap();
    let args = ["--controllers=cloud-node"];
    let mut leader = Replica::start_on_cloud_through(&config, &state_file, &through_proxy, &args);
    leader_among(LEASE, &[&leader], Duration::from_secs(30)).await;
    let standby = Replica::start_on_cloud(&config, &state_file, &args);
    tokio::time::sleep(RETRY_PERIOD * 2).await;

    let prefix = format!("late-{}-{:?}", std::process::id(), freeze).to_lowercase();
    let names: Vec<String> = (0..NODES).map(|i| format!("{prefix}-{i:03}")).collect();
    let api =
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(control_plane().admin_client().await);
    let initialized = || async {
        let list = api.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .filter(|n| {
                n.metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| name.starts_with(&prefix))
                    && n.spec
                        .as_ref()
                        .and_then(|s| s.provider_id.as_ref())
                        .is_some()
                    && !n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|t| {
                            t.iter()
                                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized")
                        })
            })
            .count()
    };
    let creating = {
        let api = api.clone();
        let names = names.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            futures::stream::iter(names)
                .for_each_concurrent(16, |name| {
                    let api = api.clone();
                    async move {
                        api.create(
                            &Default::default(),
                            &test_control_plane::kubelet_node(&name),
                        )
                        .await
                        .unwrap();
                    }
                })
                .await;
        })
    };
    // Freeze it in the middle of the burst.
    loop {
        let done = initialized().await;
        if done >= 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let frozen_at = Instant::now();
    match freeze {
        Freeze::Process => leader.signal("STOP"),
        Freeze::HeldBytes => proxy.set_held(true),
    }
    let done_at_freeze = initialized().await;
    creating.await.unwrap();

    // The standby takes over; its acquire time is when the old leader's writes must have stopped
    // applying.
    let leases =
        kube::Api::<Lease>::namespaced(control_plane().admin_client().await, "kube-system");
    let acquired = loop {
        let lease = leases.get(LEASE).await.unwrap();
        let spec = lease.spec.unwrap_or_default();
        if spec.holder_identity.is_some() && spec.holder_identity == standby.identity() {
            break spec.acquire_time.expect("acquireTime").0;
        }
        assert!(frozen_at.elapsed() < Duration::from_secs(60), "no takeover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took_over_after = frozen_at.elapsed();
    // Let the standby finish the burst, then release the old leader's writes.
    loop {
        if initialized().await == NODES {
            break;
        }
        assert!(
            frozen_at.elapsed() < Duration::from_secs(180),
            "burst not finished"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match freeze {
        Freeze::Process => leader.signal("CONT"),
        Freeze::HeldBytes => proxy.set_held(false),
    }
    let released_after = frozen_at.elapsed();
    let (code, _) = exit_after(&mut leader, frozen_at, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // the held bytes arrive; the audit log is written

    let acquired_wall: SystemTime = acquired.into();
    let late = audited_writes_with_codes(proxy_source, acquired_wall);
    let applied: Vec<&(String, String, i64)> = late
        .iter()
        .filter(|(_, resource, code)| resource != "events" && (200..300).contains(code))
        .collect();
    let mut codes: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, resource, code) in &late {
        *codes.entry(format!("{resource} {code}")).or_default() += 1;
    }
    eprintln!(
        "late writes ({freeze:?}): frozen with {done_at_freeze}/{NODES} nodes initialized; standby led {took_over_after:?} after the freeze; released after {released_after:?}; old leader exited {code:?}; writes received after the takeover: {} ({codes:?}); applied (events aside): {}",
        late.len(),
        applied.len()
    );
    assert!(
        applied.is_empty(),
        "late writes of the old leader were applied after the takeover: {applied:?}"
    );
    assert_eq!(initialized().await, NODES);
    drop(standby);
    for name in &names {
        let _ = api.delete(name, &Default::default()).await;
    }
    delete_lease(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_writes_of_a_leader_stopped_mid_burst_fail_after_the_takeover() {
    let _serial = SERIAL.lock().await;
    late_writes_of_a_frozen_leader_fail(Freeze::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_writes_held_by_the_network_fail_after_the_takeover() {
    let _serial = SERIAL.lock().await;
    late_writes_of_a_frozen_leader_fail(Freeze::HeldBytes).await;
}
