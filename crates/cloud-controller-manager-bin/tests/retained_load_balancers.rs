//! `ccm.rs/load-balancer-retain: "true"` on the real API server, with the fake cloud: the load balancer
//! and its address outlive the Service, the sweep leaves it, a new Service of the same namespace and
//! name adopts it (the same address), and a malformed value is refused before anything is made.

mod support;

use std::time::Duration;

use cloud_provider_fake::CloudState;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    RunningManager, SERIAL, create_namespace, create_node, delete_nodes, events_in, eventually,
    load_balancer_service, services, status_ip,
};
use test_control_plane::{kubelet_node, unique_name};

const RETAIN: &str = "ccm.rs/load-balancer-retain";
const WAIT: Duration = Duration::from_secs(30);

fn retaining(name: &str, value: &str) -> k8s_openapi::api::core::v1::Service {
    let mut service = load_balancer_service(name, &[80]);
    service.metadata.annotations = Some([(RETAIN.to_owned(), value.to_owned())].into());
    service
}

#[tokio::test]
async fn a_retained_load_balancer_outlives_its_service_and_the_next_one_adopts_its_address() {
    let _serial = SERIAL.lock().await;
    let namespace = unique_name("keep");
    create_namespace(&namespace).await;
    let node = format!("{namespace}-node");
    create_node(&kubelet_node(&node)).await;
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let manager = RunningManager::start(
        &format!("stateFile: {}\n", state_file.display()),
        &[
            "--controllers=service",
            "--orphaned-load-balancer-sweep-period=1s",
        ],
    )
    .await;
    let state = || CloudState::read(&state_file).unwrap_or_default();
    let ours = |state: &CloudState| support::load_balancers_in(state, &namespace);
    let api = services(&namespace).await;

    // Kept when deleted.
    api.create(&PostParams::default(), &retaining("web", "true"))
        .await
        .unwrap();
    let address = eventually("web's address", WAIT, || async {
        status_ip(&api.get("web").await.ok()?)
    })
    .await;
    api.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("web gone", WAIT, || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let kept = ours(&state());
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].retained, "{kept:?}");
    assert_eq!(kept[0].ingress, std::slice::from_ref(&address));
    assert!(kept[0].nodes.is_empty(), "no backend while kept: {kept:?}");
    let note = eventually("the RetainedLoadBalancer event", WAIT, || async {
        events_in(&namespace, "web", "RetainedLoadBalancer")
            .await
            .into_iter()
            .find_map(|e| e.note)
    })
    .await;
    assert!(note.contains("adopts it"), "{note}");

    // The sweep (every second here) leaves it: its Service is gone, but it was asked to be kept.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ours(&state()).len(), 1);
    assert_eq!(
        manager
            .cloud
            .snapshot()
            .calls_to("delete_orphaned_load_balancer"),
        0
    );

    // A new Service of the same name adopts it: the same address, no new load balancer.
    api.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .unwrap();
    let adopted = eventually("web's address again", WAIT, || async {
        status_ip(&api.get("web").await.ok()?)
    })
    .await;
    assert_eq!(adopted, address);
    let now = ours(&state());
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(!now[0].retained);
    assert!(now[0].nodes.contains(&node), "{now:?}");

    // Retained on a type change too; then, without the annotation, deleted as usual.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { RETAIN: "true" } } })),
    )
    .await
    .unwrap();
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "type": "ClusterIP" } })),
    )
    .await
    .unwrap();
    eventually("kept on the type change", WAIT, || async {
        let now = ours(&state());
        (now.len() == 1 && now[0].retained).then_some(())
    })
    .await;
    // A LoadBalancer again: taken back, with its address, and no longer kept.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "type": "LoadBalancer" } })),
    )
    .await
    .unwrap();
    eventually("taken back", WAIT, || async {
        let now = ours(&state());
        (now.len() == 1 && !now[0].retained && now[0].nodes.contains(&node)).then_some(())
    })
    .await;
    assert_eq!(ours(&state())[0].ingress, std::slice::from_ref(&address));
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { RETAIN: null } } })),
    )
    .await
    .unwrap();

    // A malformed value: refused before anything is made, and said in the Service.
    api.create(&PostParams::default(), &retaining("odd", "yes"))
        .await
        .unwrap();
    let condition = eventually("odd refused", WAIT, || async {
        let service = api.get("odd").await.ok()?;
        service
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "ccm.rs/LoadBalancerReady" && c.reason == "Refused")
    })
    .await;
    assert!(condition.message.contains(RETAIN), "{condition:?}");
    assert!(
        !ours(&state()).iter().any(|lb| lb.service.ends_with("/odd")),
        "nothing made for odd"
    );

    for name in ["web", "odd"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("the Services gone", WAIT, || async {
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    manager.stop().await;
    delete_nodes(&[&node]).await;
}
