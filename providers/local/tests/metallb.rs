//! MetalLB's objects as the `local` cloud's configuration, against the test control plane's real API
//! server with MetalLB's own CRDs (from its Go module, `hack/metallb-crds`): the manager (in
//! `loadBalancer.mode: agents`, so it only gives out addresses) reads the pools of a namespace of
//! MetalLB objects, gives Services addresses as MetalLB's objects and annotations say, reports what it
//! refuses as events on the objects, and follows the objects as they change.
//!
//! Its addresses: 127.61.0.0/16 and fd00:61::/64 (a pool only: the test control plane serves IPv4
//! Services only).

mod support;

use std::{net::IpAddr, time::Duration};

use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
};
use serde_json::json;
use support::*;

const LONG: Duration = Duration::from_secs(30);

/// Installs MetalLB's CRDs (once per process) and the RBAC that lets the manager read its objects.
async fn install_metallb_crds() {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        let root = test_control_plane::workspace_root();
        let output = std::process::Command::new(root.join("hack/metallb-crds"))
            .output()
            .expect("hack/metallb-crds runs");
        assert!(
            output.status.success(),
            "hack/metallb-crds failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let path = String::from_utf8(output.stdout).unwrap();
        let crds = std::fs::read_to_string(path.trim()).expect("the CRDs manifest");
        let admin = admin().await;
        test_control_plane::apply_manifest(&admin, &crds, false).await;
        let rbac =
            std::fs::read_to_string(root.join("deploy/components/local-agents/metallb-rbac.yaml"))
                .unwrap();
        test_control_plane::apply_manifest(&admin, &rbac, false).await;
        // The CRDs are served once established.
        eventually("MetalLB's CRDs served", LONG, || {
            let admin = admin.clone();
            async move {
                let api = metallb_api(
                    admin,
                    "default",
                    "IPAddressPool",
                    "ipaddresspools",
                    "v1beta1",
                );
                api.list(&Default::default()).await.ok().map(|_| ())
            }
        })
        .await;
    })
    .await;
}

fn metallb_api(
    client: kube::Client,
    namespace: &str,
    kind: &str,
    plural: &str,
    version: &str,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", version, kind),
        plural,
    );
    Api::namespaced_with(client, namespace, &resource)
}

/// Creates or replaces a MetalLB object.
async fn apply(
    namespace: &str,
    kind: &str,
    name: &str,
    spec: serde_json::Value,
    labels: serde_json::Value,
) {
    let (plural, version) = match kind {
        "IPAddressPool" => ("ipaddresspools", "v1beta1"),
        "L2Advertisement" => ("l2advertisements", "v1beta1"),
        "BGPAdvertisement" => ("bgpadvertisements", "v1beta1"),
        "BGPPeer" => ("bgppeers", "v1beta2"),
        "BFDProfile" => ("bfdprofiles", "v1beta1"),
        "Community" => ("communities", "v1beta1"),
        other => panic!("no MetalLB kind {other}"),
    };
    let api = metallb_api(admin().await, namespace, kind, plural, version);
    let object = json!({
        "apiVersion": format!("metallb.io/{version}"), "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    });
    api.patch(
        name,
        &PatchParams::apply("metallb-test").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|err| panic!("applying {kind} {name}: {err}"));
}

/// A LoadBalancer Service (one TCP port; the API server picks the node port).
fn service(
    name: &str,
    port: u16,
    annotations: serde_json::Value,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut value = json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"port": port, "targetPort": 8080, "protocol": "TCP"}]},
    });
    if let (Some(spec), Some(extra)) = (value["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    value
}

async fn label_namespace(name: &str, labels: serde_json::Value) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin().await);
    namespaces
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("namespace labelled");
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metallb_s_objects_are_the_pools_and_what_is_refused_is_said_on_the_object() {
    let _serial = SERIAL.lock().await;
    install_metallb_crds().await;
    forget_earlier_runs().await;
    let metallb = test_control_plane::unique_name("mlb");
    let (shop, other) = (
        test_control_plane::unique_name("shop"),
        test_control_plane::unique_name("other"),
    );
    for namespace in [&metallb, &shop, &other] {
        ensure_namespace(namespace).await;
    }
    label_namespace(&shop, json!({"team": "a"})).await;

    let none = json!({});
    // `main`: Services of namespaces labelled team=a, no .0/.255; `open`: everyone's, its network
    // address given out as MetalLB does; `reserved`: asked for only; `v6`.
    apply(&metallb, "IPAddressPool", "main", json!({"addresses": ["127.61.0.0/29"], "avoidBuggyIPs": true,
        "serviceAllocation": {"priority": 1, "namespaceSelectors": [{"matchLabels": {"team": "a"}}]}}), none.clone()).await;
    apply(
        &metallb,
        "IPAddressPool",
        "open",
        json!({"addresses": ["127.61.2.0/29"]}),
        none.clone(),
    )
    .await;
    apply(
        &metallb,
        "IPAddressPool",
        "reserved",
        json!({"addresses": ["127.61.1.1-127.61.1.3"], "autoAssign": false}),
        none.clone(),
    )
    .await;
    apply(
        &metallb,
        "IPAddressPool",
        "v6",
        json!({"addresses": ["fd00:61::/125"]}),
        json!({"family": "v6"}),
    )
    .await;
    // Refused: an overlap with `open` (older: creation times are whole seconds), an advertisement
    // naming interfaces.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    apply(
        &metallb,
        "IPAddressPool",
        "late",
        json!({"addresses": ["127.61.2.4/30"]}),
        none.clone(),
    )
    .await;
    apply(
        &metallb,
        "L2Advertisement",
        "l2",
        json!({"ipAddressPools": ["main", "open", "reserved"]}),
        none.clone(),
    )
    .await;
    apply(&metallb, "L2Advertisement", "nic", json!({"ipAddressPoolSelectors": [{"matchLabels": {"family": "v6"}}], "interfaces": ["eth9"]}), none.clone()).await;

    let manager = start_manager(&metallb, &[]).await;

    for (namespace, body) in [
        (&shop, service("web", 80, none.clone(), none.clone())),
        (&other, service("web", 80, none.clone(), none.clone())),
        (
            &shop,
            service(
                "asked",
                80,
                json!({"metallb.io/loadBalancerIPs": "127.61.1.2"}),
                none.clone(),
            ),
        ),
        (
            &shop,
            service(
                "named",
                80,
                json!({"metallb.universe.tf/address-pool": "reserved"}),
                none.clone(),
            ),
        ),
        (
            &shop,
            service(
                "spec-ip",
                80,
                none.clone(),
                json!({"loadBalancerIP": "127.61.1.3"}),
            ),
        ),
        (
            &shop,
            service(
                "shared-a",
                81,
                json!({"metallb.io/allow-shared-ip": "k", "metallb.io/address-pool": "open"}),
                none.clone(),
            ),
        ),
        (
            &other,
            service(
                "shared-b",
                82,
                json!({"metallb.io/allow-shared-ip": "k", "metallb.io/address-pool": "open"}),
                none.clone(),
            ),
        ),
        (
            &shop,
            service(
                "unread",
                80,
                json!({"metallb.io/bgp-communities": "x"}),
                none.clone(),
            ),
        ),
    ] {
        create_service(namespace, body).await;
    }
    assert_eq!(
        wait_for_vip(&shop, "web").await,
        ip("127.61.0.1"),
        "main, its .0 avoided"
    );
    let other_web = wait_for_vip(&other, "web").await;
    assert_eq!(wait_for_vip(&shop, "asked").await, ip("127.61.1.2"));
    assert_eq!(wait_for_vip(&shop, "named").await, ip("127.61.1.1"));
    assert_eq!(wait_for_vip(&shop, "spec-ip").await, ip("127.61.1.3"));
    let shared = wait_for_vip(&shop, "shared-a").await;
    assert_eq!(
        wait_for_vip(&other, "shared-b").await,
        shared,
        "MetalLB's sharing keys span namespaces"
    );
    // `main` refuses the other namespace: `open`, which gives out its network address as MetalLB does.
    let open: ipnet::IpNet = "127.61.2.0/29".parse().unwrap();
    assert!(open.contains(&other_web) && open.contains(&shared) && other_web != shared);
    assert!(
        [other_web, shared].contains(&ip("127.61.2.0")),
        "{other_web} {shared}"
    );

    // Each pool's usage in its status, in MetalLB's fields; `reserved` ran out (asked, named, spec-ip).
    let pools = metallb_api(
        admin().await,
        &metallb,
        "IPAddressPool",
        "ipaddresspools",
        "v1beta1",
    );
    for (name, assigned, available) in [("reserved", 3, 0), ("main", 1, 6)] {
        let pools = pools.clone();
        eventually(&format!("the usage of pool {name}"), LONG, || {
            let pools = pools.clone();
            async move {
                let status = pools.get(name).await.ok()?.data.get("status")?.clone();
                (status
                    == json!({"assignedIPv4": assigned, "assignedIPv6": 0,
                              "availableIPv4": available, "availableIPv6": 0}))
                .then_some(())
            }
        })
        .await;
    }
    let exhausted = eventually("the event of the exhausted pool", LONG, || {
        let metallb = metallb.clone();
        async move {
            Some(events_in(&metallb, "reserved", "PoolExhausted").await).filter(|e| !e.is_empty())
        }
    })
    .await;
    assert!(
        exhausted[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("has no free address"),
        "{:?}",
        exhausted[0].note
    );
    assert!(
        events_in(&metallb, "main", "PoolExhausted")
            .await
            .is_empty()
    );

    // Refusals, each on its object, naming the field.
    for (name, wanted) in [
        (
            "late",
            "spec.addresses: 127.61.2.4-127.61.2.7 overlaps 127.61.2.0-127.61.2.7 of IPAddressPool \"open\"",
        ),
        ("nic", "spec.interfaces [\"eth9\"]"),
    ] {
        let events = eventually(&format!("the refusal of {name}"), LONG, || {
            let metallb = metallb.clone();
            async move {
                Some(events_in(&metallb, name, "MetalLBObjectRefused").await)
                    .filter(|e| !e.is_empty())
            }
        })
        .await;
        let note = events[0].note.clone().unwrap_or_default();
        assert!(note.contains(wanted), "{note}\n  lacks {wanted}");
    }
    let unread = eventually("the refusal of the unread annotation", LONG, || {
        let shop = shop.clone();
        async move {
            Some(events_in(&shop, "unread", "SyncLoadBalancerFailed").await)
                .filter(|e| !e.is_empty())
        }
    })
    .await;
    let note = unread[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("metallb.io/bgp-communities: a MetalLB annotation local does not read"),
        "{note}"
    );

    // A pool made while the manager runs serves the next Service that names it.
    apply(
        &metallb,
        "IPAddressPool",
        "new",
        json!({"addresses": ["127.61.3.8/29"], "autoAssign": false}),
        none.clone(),
    )
    .await;
    create_service(
        &shop,
        service(
            "fresh",
            80,
            json!({"metallb.io/address-pool": "new"}),
            none.clone(),
        ),
    )
    .await;
    assert_eq!(wait_for_vip(&shop, "fresh").await, ip("127.61.3.8"));

    // Nothing a pool gave is taken back by a restart: the manager starts again on the same objects and
    // every address stays.
    let before: Vec<(String, String, Vec<IpAddr>)> = snapshot(&[&shop, &other]).await;
    manager.stop().await;
    let manager = start_manager(&metallb, &[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(snapshot(&[&shop, &other]).await, before);

    for namespace in [&shop, &other] {
        delete_services(namespace).await;
    }
    manager.stop().await;
}

/// Deletes the Services an earlier run of this test left (it failed before deleting them), so that
/// they hold none of its addresses: their finalizers go too, as no manager runs to remove them.
async fn forget_earlier_runs() {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin().await);
    for namespace in namespaces.list(&Default::default()).await.unwrap().items {
        let name = namespace.metadata.name.unwrap_or_default();
        if !(name.starts_with("shop-") || name.starts_with("other-")) {
            continue;
        }
        let api = services(&name).await;
        for service in api.list(&Default::default()).await.unwrap().items {
            let service = service.metadata.name.unwrap_or_default();
            let _ = api
                .patch(
                    &service,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
            let _ = api.delete(&service, &Default::default()).await;
        }
    }
}

/// A manager in agents mode whose pools are MetalLB's objects of namespace `metallb`.
async fn start_manager(metallb: &str, args: &[&str]) -> RunningManager {
    RunningManager::start(
        &format!(
            "unlistedNodes: ignore\nloadBalancer:\n  mode: agents\n  metallb: {{namespace: {metallb}}}\n"
        ),
        args,
    )
    .await
}

/// Every Service of `namespaces` with its ingress IPs.
async fn snapshot(namespaces: &[&String]) -> Vec<(String, String, Vec<IpAddr>)> {
    let mut out = Vec::new();
    for namespace in namespaces {
        for s in services(namespace)
            .await
            .list(&Default::default())
            .await
            .unwrap()
            .items
        {
            out.push((
                (*namespace).clone(),
                s.metadata.name.clone().unwrap_or_default(),
                status_ips(&s),
            ));
        }
    }
    out.sort();
    out
}

/// Shadow mode beside MetalLB: a manager with `--dry-run` reads MetalLB's objects, reserves the
/// addresses MetalLB wrote, and its preview (what `/dry-run` reports) says each Service keeps them, or
/// why one would not; it writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_beside_metallb_reports_each_service_kept_or_why_not() {
    let _serial = SERIAL.lock().await;
    install_metallb_crds().await;
    forget_earlier_runs().await;
    let metallb = test_control_plane::unique_name("mlb");
    let shop = test_control_plane::unique_name("shop");
    for namespace in [&metallb, &shop] {
        ensure_namespace(namespace).await;
    }
    let none = json!({});
    apply(
        &metallb,
        "IPAddressPool",
        "p",
        json!({"addresses": ["127.62.0.0/29"]}),
        none.clone(),
    )
    .await;
    apply(
        &metallb,
        "L2Advertisement",
        "l2",
        none.clone(),
        none.clone(),
    )
    .await;
    // The Services as MetalLB left them: addresses in its pool (`kept-*`), or in none (`lost`).
    let api = services(&shop).await;
    for (name, ip) in [
        ("kept-a", "127.62.0.0"),
        ("kept-b", "127.62.0.5"),
        ("lost", "127.99.0.1"),
    ] {
        create_service(&shop, service(name, 80, none.clone(), none.clone())).await;
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}}),
            ),
        )
        .await
        .expect("status written");
    }
    let before = snapshot(&[&shop]).await;

    let manager = start_manager(&metallb, &["--dry-run"]).await;
    // The service controller's would-be ensures, one per Service, are previews.
    eventually("the shadow's previews", LONG, || {
        let metrics = manager.metrics.encode();
        async move {
            let count = |preview: &str| {
                metrics
                    .lines()
                    .find(|l| l.starts_with(&format!(
                        r#"cloud_controller_manager_dry_run_cloud_writes_total{{call="ensure_load_balancer",preview="{preview}"}}"#
                    )))
                    .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            (count("upToDate") >= 2.0 && count("change") >= 1.0).then_some(())
        }
    })
    .await;
    let cloud = &manager.cloud;
    for (name, wanted) in [
        ("kept-a", None),
        ("kept-b", None),
        (
            "lost",
            Some("the address 127.99.0.1 would change: it is in no address pool now"),
        ),
    ] {
        let service = api.get(name).await.unwrap();
        let preview =
            cloud_provider::LoadBalancer::preview_load_balancer(cloud, "kubernetes", &service, &[])
                .await
                .unwrap();
        match (wanted, preview) {
            (None, cloud_provider::LoadBalancerPreview::UpToDate) => {}
            (Some(wanted), cloud_provider::LoadBalancerPreview::Change { detail, .. }) => {
                assert!(detail.contains(wanted), "{name}: {detail}");
            }
            (wanted, preview) => panic!("{name}: {preview:?}, wanted {wanted:?}"),
        }
    }
    // Nothing written: the statuses as MetalLB left them, and no finalizer of ours.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(snapshot(&[&shop]).await, before);
    for service in api.list(&Default::default()).await.unwrap().items {
        assert_eq!(
            service.metadata.finalizers, None,
            "{:?}",
            service.metadata.name
        );
    }
    manager.stop().await;
    let _ = api
        .delete_collection(&Default::default(), &Default::default())
        .await;
}
