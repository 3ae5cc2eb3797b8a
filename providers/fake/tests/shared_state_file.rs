//! `stateFileShared`: the state file is the cloud, read back at start and shared under a file lock by
//! every fake cloud that names it.

use std::{collections::BTreeSet, path::Path, time::Duration};

use cloud_provider::{
    CloudProvider, LoadBalancer,
    conformance::{backend_node, load_balancer_service},
};
use cloud_provider_fake::{CloudState, FakeCloud};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

fn shared_yaml(state: &Path) -> String {
    format!("stateFile: {}\nstateFileShared: true\n", state.display())
}

fn service(name: &str) -> Service {
    // The load-balancer name comes from the UID: one per name.
    let uid = format!("00000000-0000-0000-0000-{}", hex(name));
    load_balancer_service("shop", name, &uid)
}

fn hex(name: &str) -> String {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{:012x}", hash & 0xffff_ffff_ffff)
}

fn ip(status: &LoadBalancerStatus) -> String {
    status.ingress.as_ref().unwrap()[0].ip.clone().unwrap()
}

/// Runs `edit` holding the state file's lock (`<state file>.lock`), as the clouds sharing it do.
fn edit_under_lock(path: &Path, edit: impl FnOnce()) {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = std::fs::File::options()
        .read(true)
        .write(true)
        .open(lock_path)
        .unwrap();
    lock.lock().unwrap();
    edit();
    lock.unlock().unwrap();
}

fn lb(cloud: &FakeCloud) -> &dyn LoadBalancer {
    cloud.load_balancer().unwrap()
}

#[tokio::test]
async fn two_clouds_on_one_file_see_each_others_load_balancers() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = shared_yaml(&dir.path().join("state.json"));
    let a = FakeCloud::from_yaml(&yaml).unwrap();
    let b = FakeCloud::from_yaml(&yaml).unwrap();
    let nodes = [backend_node("n1")];

    let web = lb(&a)
        .ensure_load_balancer("k", &service("web"), &nodes)
        .await
        .unwrap();
    let seen_by_b = lb(&b)
        .get_load_balancer("k", &service("web"))
        .await
        .unwrap();
    assert_eq!(seen_by_b.as_ref().map(ip), Some(ip(&web)));

    // b allocates around a's address, and a sees b's load balancer.
    let api = lb(&b)
        .ensure_load_balancer("k", &service("api"), &nodes)
        .await
        .unwrap();
    assert_ne!(ip(&api), ip(&web));
    let seen_by_a = lb(&a)
        .get_load_balancer("k", &service("api"))
        .await
        .unwrap();
    assert_eq!(seen_by_a.as_ref().map(ip), Some(ip(&api)));
    assert_eq!(a.snapshot().load_balancers.len(), 2);

    // An update by a of b's load balancer, then a deletion by b of a's.
    lb(&a)
        .update_load_balancer("k", &service("api"), &[backend_node("n2")])
        .await
        .unwrap();
    assert_eq!(
        *b.snapshot().load_balancer_of("shop/api").unwrap().nodes,
        ["n2"]
    );
    lb(&b)
        .ensure_load_balancer_deleted("k", &service("web"))
        .await
        .unwrap();
    assert_eq!(
        lb(&a)
            .get_load_balancer("k", &service("web"))
            .await
            .unwrap(),
        None
    );

    // Call counts are sums over both clouds (each adds its own).
    assert_eq!(a.snapshot().calls_to("ensure_load_balancer"), 2);
    assert_eq!(b.snapshot().calls_to("ensure_load_balancer"), 2);
}

#[tokio::test]
async fn a_new_cloud_on_an_existing_file_keeps_every_services_ip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let yaml = shared_yaml(&path);
    let names: Vec<String> = (0..20).map(|i| format!("svc-{i}")).collect();
    let nodes = [backend_node("n1")];

    let first = FakeCloud::from_yaml(&yaml).unwrap();
    let mut ips = Vec::new();
    for name in &names {
        let status = lb(&first)
            .ensure_load_balancer("k", &service(name), &nodes)
            .await
            .unwrap();
        ips.push(ip(&status));
    }
    // "gone" had an IP and lost its load balancer: the cloud keeps the IP for it.
    let gone = lb(&first)
        .ensure_load_balancer("k", &service("gone"), &nodes)
        .await
        .unwrap();
    lb(&first)
        .ensure_load_balancer_deleted("k", &service("gone"))
        .await
        .unwrap();
    let calls_before = first.snapshot().calls_to("ensure_load_balancer");
    drop(first);

    let second = FakeCloud::from_yaml(&yaml).unwrap();
    assert_eq!(second.snapshot().load_balancers.len(), 20);
    // A Service the cloud never saw gets a new address, not the one kept for "gone".
    let new = lb(&second)
        .ensure_load_balancer("k", &service("new"), &nodes)
        .await
        .unwrap();
    assert!(ip(&new) != ip(&gone) && !ips.contains(&ip(&new)), "{new:?}");
    for (name, before) in names.iter().zip(&ips) {
        let status = lb(&second)
            .ensure_load_balancer("k", &service(name), &nodes)
            .await
            .unwrap();
        assert_eq!(&ip(&status), before, "{name} changed its IP");
    }
    let back = lb(&second)
        .ensure_load_balancer("k", &service("gone"), &nodes)
        .await
        .unwrap();
    assert_eq!(ip(&back), ip(&gone));

    let state = CloudState::read(&path).unwrap();
    assert_eq!(state.load_balancers.len(), 22);
    assert_eq!(state.calls_to("ensure_load_balancer"), calls_before + 22);
    assert_eq!(state.calls_about("ensure_load_balancer", "shop/svc-0"), 2);
}

#[test]
fn two_clouds_creating_50_load_balancers_each_at_once_end_with_100_distinct_ips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let yaml = shared_yaml(&path);
    let threads: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|who| {
            let yaml = yaml.clone();
            std::thread::spawn(move || {
                let cloud = FakeCloud::from_yaml(&yaml).unwrap();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    for i in 0..50 {
                        lb(&cloud)
                            .ensure_load_balancer("k", &service(&format!("{who}-{i}")), &[])
                            .await
                            .unwrap();
                    }
                });
                cloud
            })
        })
        .collect();
    let clouds: Vec<FakeCloud> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    for state in [CloudState::read(&path).unwrap(), clouds[0].snapshot()] {
        assert_eq!(state.load_balancers.len(), 100);
        let ips: BTreeSet<&String> = state
            .load_balancers
            .iter()
            .flat_map(|lb| &lb.ingress)
            .collect();
        assert_eq!(ips.len(), 100, "IPs given twice");
        assert_eq!(state.ip_assignments.len(), 100);
        assert_eq!(state.calls_to("ensure_load_balancer"), 100);
    }
}

#[test]
fn a_malformed_state_file_is_a_clear_error_and_a_missing_one_an_empty_cloud() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let yaml = shared_yaml(&path);

    let cloud = FakeCloud::from_yaml(&yaml).unwrap();
    assert_eq!(cloud.snapshot(), CloudState::default());
    assert_eq!(CloudState::read(&path).unwrap(), CloudState::default());
    drop(cloud);

    std::fs::write(&path, "{\"loadBalancers\": [{\"name\": 1}]}\n").unwrap();
    let err = FakeCloud::from_yaml(&yaml).err().unwrap().to_string();
    assert!(
        err.starts_with(&format!(
            "the fake cloud's stateFile {} is malformed: invalid type: integer `1`, expected a string at line 1 column 29",
            path.display()
        )),
        "{err}"
    );
    std::fs::write(&path, "").unwrap();
    let err = FakeCloud::from_yaml(&yaml).err().unwrap().to_string();
    assert!(err.contains("is malformed: the file is empty"), "{err}");
}

#[tokio::test]
async fn a_state_file_broken_while_running_fails_the_calls_that_need_it_and_a_removed_one_empties_the_cloud()
 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let cloud = FakeCloud::from_yaml(&shared_yaml(&path)).unwrap();
    lb(&cloud)
        .ensure_load_balancer("k", &service("web"), &[])
        .await
        .unwrap();

    // As a careful hand edit does, under the lock: the cloud's background writer (call counts) renames
    // a new file over the path, and a write without the lock can land in the file it replaced.
    edit_under_lock(&path, || std::fs::write(&path, "not json").unwrap());
    let err = lb(&cloud)
        .ensure_load_balancer("k", &service("api"), &[])
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("stateFile {} is malformed", path.display())),
        "{err}"
    );
    let err = lb(&cloud)
        .get_load_balancer("k", &service("web"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is malformed"), "{err}");

    edit_under_lock(&path, || std::fs::remove_file(&path).unwrap());
    assert_eq!(
        lb(&cloud)
            .get_load_balancer("k", &service("web"))
            .await
            .unwrap(),
        None
    );
    lb(&cloud)
        .ensure_load_balancer("k", &service("api"), &[])
        .await
        .unwrap();
    let on_disk = CloudState::read(&path).unwrap();
    assert_eq!(on_disk.load_balancers.len(), 1);
    assert_eq!(on_disk.load_balancers[0].service, "shop/api");
}

#[tokio::test]
async fn initial_routes_belong_to_the_clouds_first_start_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let yaml = format!(
        "{}routes:\n  initial: [{{name: stray, destinationCIDR: 10.99.0.0/24, blackhole: true}}]\n",
        shared_yaml(&path)
    );
    let first = FakeCloud::from_yaml(&yaml).unwrap();
    let routes = first.routes().unwrap().list_routes("k").await.unwrap();
    assert_eq!(routes.len(), 1);
    first
        .routes()
        .unwrap()
        .delete_route("k", &routes[0])
        .await
        .unwrap();
    drop(first);

    // The cloud outlived the manager: the route deleted then stays deleted.
    let second = FakeCloud::from_yaml(&yaml).unwrap();
    assert!(
        second
            .routes()
            .unwrap()
            .list_routes("k")
            .await
            .unwrap()
            .is_empty()
    );
}

#[test]
fn shared_needs_a_state_file_and_refuses_batched_writes() {
    let err = FakeCloud::from_yaml(
        "stateFile: /tmp/x.json\nstateFileShared: true\nstateFileBatched: true\n",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.starts_with(
            "malformed cloud-config: stateFileShared and stateFileBatched cannot be combined"
        ),
        "{err}"
    );
    let err = FakeCloud::from_yaml("stateFileShared: true\n")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("stateFileShared needs a stateFile"), "{err}");
}

#[test]
fn a_reload_cannot_switch_sharing_or_move_a_shared_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let cloud = FakeCloud::from_yaml(&shared_yaml(&path)).unwrap();
    let parse = |yaml: &str| cloud_provider_fake::Config::parse(yaml, None).unwrap();

    let err = cloud
        .try_set_config(parse(&format!("stateFile: {}\n", path.display())))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stateFileShared is read at start only"),
        "{err}"
    );
    let moved = dir.path().join("other.json");
    let err = cloud
        .try_set_config(parse(&shared_yaml(&moved)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stateFile cannot change while stateFileShared is on"),
        "{err}"
    );
    assert!(cloud.config().state_file_shared);

    // Other keys change as usual.
    cloud
        .try_set_config(parse(&format!("{}latency: 5ms\n", shared_yaml(&path))))
        .unwrap();
    assert_eq!(cloud.config().latency.0, Duration::from_millis(5));
}

#[tokio::test]
async fn calls_that_change_nothing_reach_the_shared_file_within_a_poll_and_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let a = FakeCloud::from_yaml(&shared_yaml(&path)).unwrap();
    let b = FakeCloud::from_yaml(&shared_yaml(&path)).unwrap();
    a.routes().unwrap().list_routes("k").await.unwrap();
    b.routes().unwrap().list_routes("k").await.unwrap();
    let started = std::time::Instant::now();
    while CloudState::read(&path).unwrap().calls_to("list_routes") != 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the counts never reached the file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.routes().unwrap().list_routes("k").await.unwrap();
    drop(b);
    let started = std::time::Instant::now();
    while a.snapshot().calls_to("list_routes") != 3 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the count of the dropped cloud never reached the file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
