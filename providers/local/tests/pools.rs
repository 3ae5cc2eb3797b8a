//! The cloud-config's pools as `LocalPool` objects (`deploy/components/local-pools`), on the test
//! control plane's real API server: one per pool, with its usage and an `Exhausted` condition, an event
//! when one runs out, and the object of a pool removed from the cloud-config deleted.
//!
//! Its addresses: 127.63.0.0/16.

mod support;

use std::time::Duration;

use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::json;
use support::*;

const LONG: Duration = Duration::from_secs(30);

fn local_pools() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("local.ccm.rs", "v1alpha1", "LocalPool"),
        "localpools",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pool_is_an_object_with_its_usage() {
    let _serial = SERIAL.lock().await;
    let admin = admin().await;
    let root = test_control_plane::workspace_root();
    for file in ["localpools-crd.yaml", "rbac.yaml"] {
        let yaml =
            std::fs::read_to_string(root.join("deploy/components/local-pools").join(file)).unwrap();
        test_control_plane::apply_manifest(&admin, &yaml, false).await;
    }
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &local_pools());
    eventually("the LocalPool CRD served", LONG, || {
        let api = api.clone();
        async move { api.list(&Default::default()).await.ok().map(|_| ()) }
    })
    .await;
    let namespace = test_control_plane::unique_name("pools");
    ensure_namespace(&namespace).await;
    let config = |pools: &str| {
        format!("unlistedNodes: ignore\nloadBalancer: {{mode: agents}}\naddressPools:\n{pools}")
    };
    let manager = RunningManager::start(
        &config("  - {name: tiny, addresses: [127.63.0.1-127.63.0.2], autoAssign: false}\n  - {name: spare, addresses: [127.63.1.0/24], autoAssign: false}\n"),
        &[],
    )
    .await;
    for name in ["a", "b"] {
        create_service(
            &namespace,
            json!({"metadata": {"name": name, "annotations": {"local.ccm.rs/address-pool": "tiny"}},
                   "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}),
        )
        .await;
        wait_for_vip(&namespace, name).await;
    }
    let tiny = eventually("LocalPool tiny full", LONG, || {
        let api = api.clone();
        async move {
            let pool = api.get("tiny").await.ok()?;
            (pool.data["status"]["availableIPv4"] == 0).then_some(pool)
        }
    })
    .await;
    assert_eq!(
        tiny.data["spec"]["addresses"],
        json!(["127.63.0.1-127.63.0.2"])
    );
    assert_eq!(tiny.data["spec"]["announce"], "l2");
    let status = &tiny.data["status"];
    assert_eq!(status["assignedIPv4"], 2);
    assert_eq!(status["serviceCount"], 2);
    assert_eq!(
        status["services"],
        json!([format!("{namespace}/a"), format!("{namespace}/b")])
    );
    assert_eq!(status["conditions"][0]["type"], "Exhausted");
    assert_eq!(status["conditions"][0]["status"], "True");
    let spare = api.get("spare").await.unwrap();
    assert_eq!(spare.data["status"]["availableIPv4"], 254);
    assert_eq!(spare.data["status"]["conditions"][0]["status"], "False");
    let events = eventually("the PoolExhausted event", LONG, || async {
        Some(events_in("default", "tiny", "PoolExhausted").await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(
        events[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("pool \"tiny\" has no free address")
    );
    // Quiet: nothing changes, nothing is written.
    let version = tiny.metadata.resource_version.clone();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        api.get("tiny").await.unwrap().metadata.resource_version,
        version
    );

    // A pool removed from the cloud-config: its object goes; the one kept stays.
    delete_services(&namespace).await;
    manager.set_cloud(&config(
        "  - {name: spare, addresses: [127.63.1.0/24], autoAssign: false}\n",
    ));
    eventually("LocalPool tiny deleted", LONG, || {
        let api = api.clone();
        async move { api.get_opt("tiny").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(api.get_opt("spare").await.unwrap().is_some());
    manager.stop().await;
    let _ = api.delete("spare", &Default::default()).await;
}
