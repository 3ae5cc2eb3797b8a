//! A manager restart on a fake cloud whose state file is shared (`stateFileShared`): the cloud outlives
//! the manager, so after the restart every Service keeps its load balancer and IP, and deleting the
//! Services leaves nothing behind.

mod support;

use std::{collections::BTreeMap, path::Path, time::Duration};

use cloud_provider_fake::CloudState;
use k8s_openapi::api::core::v1::Service;
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use support::{
    RunningManager, SERIAL, create_namespace, create_node, delete_nodes, eventually,
    load_balancer_service, load_balancers_in, services, status_ip,
};
use test_control_plane::{kubelet_node, unique_name};

const SERVICES: usize = 20;
const WAIT: Duration = Duration::from_secs(60);

/// The Services of the namespace by name, with their status IPs.
async fn status_ips(api: &Api<Service>) -> BTreeMap<String, Option<String>> {
    api.list(&ListParams::default())
        .await
        .expect("services listed")
        .items
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), status_ip(s)))
        .collect()
}

/// The cloud's IP of each Service of `namespace`, by Service name.
fn cloud_ips(state: &CloudState, namespace: &str) -> BTreeMap<String, String> {
    load_balancers_in(state, namespace)
        .into_iter()
        .map(|lb| {
            let name = lb.service[namespace.len() + 1..].to_owned();
            (name, lb.ingress.first().cloned().unwrap_or_default())
        })
        .collect()
}

/// How many Services with a load balancer the manager has synced (its
/// `service_controller_load_balancers` gauge).
fn synced_load_balancers(manager: &RunningManager) -> u64 {
    manager
        .metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix("service_controller_load_balancers "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

fn shared_cloud(state_file: &Path) -> String {
    format!(
        "stateFile: {}\nstateFileShared: true\n",
        state_file.display()
    )
}

#[tokio::test]
async fn services_keep_their_ips_across_a_manager_restart_and_nothing_leaks() {
    let _serial = SERIAL.lock().await;
    let namespace = unique_name("restart");
    create_namespace(&namespace).await;
    let node = format!("{namespace}-node");
    create_node(&kubelet_node(&node)).await;
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let cloud_yaml = shared_cloud(&state_file);
    let names: Vec<String> = (0..SERVICES).map(|i| format!("svc-{i}")).collect();
    let api = services(&namespace).await;

    // The first manager provisions every Service.
    let first = RunningManager::start(&cloud_yaml, &["--controllers=service"]).await;
    for name in &names {
        api.create(&PostParams::default(), &load_balancer_service(name, &[80]))
            .await
            .expect("service created");
    }
    let ips: BTreeMap<String, String> =
        eventually("every Service to get an ingress IP", WAIT, || async {
            status_ips(&api)
                .await
                .into_iter()
                .map(|(name, ip)| Some((name, ip?)))
                .collect::<Option<BTreeMap<_, _>>>()
                .filter(|ips| ips.len() == SERVICES)
        })
        .await;
    let distinct: std::collections::BTreeSet<&String> = ips.values().collect();
    assert_eq!(distinct.len(), SERVICES, "IPs given twice: {ips:?}");
    first.stop().await;

    let on_disk = CloudState::read(&state_file).expect("the state file");
    assert_eq!(cloud_ips(&on_disk, &namespace), ips);

    // A new manager on a new fake cloud from the same cloud-config: it has seen none of the Services,
    // so it ensures each one again, and the cloud answers with the load balancer it already holds.
    let second = RunningManager::start(&cloud_yaml, &["--controllers=service"]).await;
    eventually("the new manager to sync every Service", WAIT, || async {
        (synced_load_balancers(&second) >= SERVICES as u64).then_some(())
    })
    .await;
    let after: BTreeMap<String, String> = eventually(
        "every Service's status to agree with the cloud",
        WAIT,
        || async {
            let cloud = cloud_ips(&second.cloud.snapshot(), &namespace);
            let statuses = status_ips(&api).await;
            (cloud.len() == SERVICES
                && statuses
                    .iter()
                    .all(|(name, ip)| ip.as_ref() == cloud.get(name)))
            .then_some(cloud)
        },
    )
    .await;
    assert_eq!(after, ips, "Services changed their IPs across the restart");
    let held = load_balancers_in(&second.cloud.snapshot(), &namespace);
    assert_eq!(
        held.len(),
        SERVICES,
        "the cloud holds {} load balancers for {SERVICES} Services: {held:?}",
        held.len()
    );

    // Deleting the Services deletes their load balancers: nothing leaks.
    for name in &names {
        api.delete(name, &DeleteParams::default())
            .await
            .expect("service deleted");
    }
    eventually("every Service to be gone", WAIT, || async {
        status_ips(&api).await.is_empty().then_some(())
    })
    .await;
    let left = load_balancers_in(&second.cloud.snapshot(), &namespace);
    assert!(left.is_empty(), "load balancers leaked: {left:?}");
    second.stop().await;
    let left = load_balancers_in(
        &CloudState::read(&state_file).expect("the state file"),
        &namespace,
    );
    assert!(left.is_empty(), "load balancers leaked: {left:?}");
    delete_nodes(&[&node]).await;
}
