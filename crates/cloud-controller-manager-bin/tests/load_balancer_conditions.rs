//! The `ccm.rs/LoadBalancerReady` condition on the real API server, with the fake cloud: each reason a
//! sync can leave, no write when nothing changed (not even across a restart), other controllers'
//! conditions kept, and ours removed when the Service stops being ours.

mod support;

use std::time::Duration;

use k8s_openapi::{api::core::v1::Service, apimachinery::pkg::apis::meta::v1::Condition};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    RunningManager, SERIAL, create_namespace, create_node, delete_nodes, eventually,
    load_balancer_service, services,
};
use test_control_plane::{kubelet_node, unique_name};

const TYPE: &str = "ccm.rs/LoadBalancerReady";
const WAIT: Duration = Duration::from_secs(30);

fn ours(service: &Service) -> Option<Condition> {
    service
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == TYPE)
        .cloned()
}

/// Waits until the Service's condition has `reason`, and returns it.
async fn condition(namespace: &str, name: &str, reason: &str) -> Condition {
    let api = services(namespace).await;
    eventually(
        &format!("{name}'s condition to say {reason}"),
        WAIT,
        || async {
            let service = api.get_opt(name).await.unwrap()?;
            ours(&service).filter(|c| c.reason == reason)
        },
    )
    .await
}

fn resource_version(service: &Service) -> String {
    service.metadata.resource_version.clone().unwrap()
}

#[tokio::test]
async fn each_reason_shows_in_the_service_and_a_quiet_resync_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let namespace = unique_name("cond");
    create_namespace(&namespace).await;
    let node = format!("{namespace}-node");
    create_node(&kubelet_node(&node)).await;
    // A state file: the cloud outlives the manager's restart.
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let cloud = |extra: &str| format!("stateFile: {}\n{extra}", state_file.display());
    let manager = RunningManager::start(
        &cloud("failureRate: {ensure_load_balancer: 1}\nretryAfter: 300ms\n"),
        &["--controllers=service"],
    )
    .await;
    let api = services(&namespace).await;
    // Another controller's condition on the Service: kept through every write of ours.
    let mut web = load_balancer_service("web", &[80]);
    api.create(&PostParams::default(), &web).await.unwrap();
    let theirs = json!({ "status": { "conditions": [{
        "type": "example.com/Audited", "status": "True", "reason": "Checked", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z" }] } });
    api.patch_status("web", &PatchParams::default(), &Patch::Merge(&theirs))
        .await
        .unwrap();

    // Still provisioning (the cloud answers "retry after").
    let provisioning = condition(&namespace, "web", "Provisioning").await;
    assert_eq!(provisioning.status, "False");
    assert!(
        provisioning.message.contains("injected failure"),
        "{provisioning:?}"
    );

    // A failing cloud.
    manager.set_cloud(&cloud("failureRate: {ensure_load_balancer: 1}\n"));
    let failed = condition(&namespace, "web", "CloudError").await;
    assert_eq!(failed.status, "False");
    assert!(
        failed.message.contains("failed to ensure load balancer"),
        "{failed:?}"
    );

    // The cloud recovers: ensured, with the address.
    manager.set_cloud(&cloud(""));
    let ready = condition(&namespace, "web", "Ensured").await;
    assert_eq!(ready.status, "True");
    let service = api.get("web").await.unwrap();
    assert!(support::status_ip(&service).is_some());
    let conditions = service
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap();
    assert!(
        conditions.iter().any(|c| c.type_ == "example.com/Audited"),
        "another controller's condition is kept: {conditions:?}"
    );

    // A manager restart re-ensures every Service: nothing has changed, so nothing is written.
    let before = resource_version(&service);
    manager.stop().await;
    let manager = RunningManager::start(&cloud(""), &["--controllers=service"]).await;
    eventually("the restarted manager's ensure", WAIT, || async {
        (manager.cloud.snapshot().calls_to("ensure_load_balancer") >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(resource_version(&api.get("web").await.unwrap()), before);

    // The provider refuses what the Service asks (an address outside the cloud's pool).
    web = load_balancer_service("pinned", &[80]);
    web.spec.as_mut().unwrap().load_balancer_ip = Some("198.51.100.7".into());
    api.create(&PostParams::default(), &web).await.unwrap();
    let refused = condition(&namespace, "pinned", "Refused").await;
    assert_eq!(refused.status, "False");
    assert!(refused.message.contains("198.51.100.7"), "{refused:?}");
    // Fixed by the user: ensured at the address asked for.
    api.patch(
        "pinned",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "loadBalancerIP": "203.0.113.77" } })),
    )
    .await
    .unwrap();
    condition(&namespace, "pinned", "Ensured").await;

    // No node can back a load balancer.
    let exclude = json!({ "metadata": { "labels": {
        "node.kubernetes.io/exclude-from-external-load-balancers": "true" } } });
    support::nodes()
        .await
        .patch(&node, &PatchParams::default(), &Patch::Merge(&exclude))
        .await
        .unwrap();
    // Other tests' nodes in a shared control plane may still be backends: leave them out as well.
    let others: Vec<String> = support::nodes()
        .await
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| *n != node)
        .collect();
    for other in &others {
        support::nodes()
            .await
            .patch(other, &PatchParams::default(), &Patch::Merge(&exclude))
            .await
            .unwrap();
    }
    api.create(
        &PostParams::default(),
        &load_balancer_service("lonely", &[80]),
    )
    .await
    .unwrap();
    let lonely = condition(&namespace, "lonely", "NoNodes").await;
    assert_eq!(lonely.status, "False");
    let include = json!({ "metadata": { "labels": {
        "node.kubernetes.io/exclude-from-external-load-balancers": null } } });
    for other in &others {
        support::nodes()
            .await
            .patch(other, &PatchParams::default(), &Patch::Merge(&include))
            .await
            .unwrap();
    }

    // The cloud stops offering load balancers.
    manager.set_cloud(&cloud("loadBalancers: {enabled: false}\n"));
    api.create(
        &PostParams::default(),
        &load_balancer_service("unserved", &[80]),
    )
    .await
    .unwrap();
    let unserved = condition(&namespace, "unserved", "NotServed").await;
    assert!(
        unserved.message.contains("loadBalancerClass"),
        "{unserved:?}"
    );
    manager.set_cloud(&cloud(""));

    // No longer a LoadBalancer: the load balancer goes, and so does our condition (not the other).
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "type": "ClusterIP" } })),
    )
    .await
    .unwrap();
    let service = eventually("web's condition removed", WAIT, || async {
        let service = api.get("web").await.unwrap();
        ours(&service).is_none().then_some(service)
    })
    .await;
    let conditions = service.status.unwrap().conditions.unwrap();
    assert_eq!(
        conditions
            .iter()
            .map(|c| c.type_.as_str())
            .collect::<Vec<_>>(),
        ["example.com/Audited"]
    );

    for name in ["pinned", "lonely", "unserved"] {
        api.delete(name, &Default::default()).await.unwrap();
    }
    eventually("the Services gone", WAIT, || async {
        let left = api.list(&Default::default()).await.unwrap().items;
        left.iter()
            .all(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer"))
            .then_some(())
    })
    .await;
    manager.stop().await;
    delete_nodes(&[&node]).await;
}

/// A failing sync writes its condition, and that write comes back as a change of the Service: it must
/// not be taken for a reason to call the cloud again before the back-off says so. The fake's failure
/// messages differ from call to call (they carry the call's number), so each failure rewrites the
/// condition: without the back-off holding, the manager would call the cloud hundreds of times a second.
#[tokio::test]
async fn a_failure_s_own_condition_write_does_not_bypass_the_back_off() {
    let _serial = SERIAL.lock().await;
    let namespace = unique_name("cond-backoff");
    create_namespace(&namespace).await;
    let node = format!("{namespace}-node");
    create_node(&kubelet_node(&node)).await;
    let manager = RunningManager::start(
        "failureRate: {ensure_load_balancer: 1}\n",
        &["--controllers=service"],
    )
    .await;
    let api = services(&namespace).await;
    api.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .unwrap();
    condition(&namespace, "web", "CloudError").await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // At 0 s, once more as the finalizer's write comes back, then after 5 s (the back-off's first
    // step) at the earliest, or 10 s.
    let calls = manager.cloud.snapshot().calls_to("ensure_load_balancer");
    assert!(
        (2..=4).contains(&calls),
        "{calls} ensure calls in about 6 s"
    );
    manager.set_cloud("{}\n");
    condition(&namespace, "web", "Ensured").await;
    api.delete("web", &Default::default()).await.unwrap();
    eventually("web gone", WAIT, || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    manager.stop().await;
    delete_nodes(&[&node]).await;
}
