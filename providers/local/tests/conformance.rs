//! The provider conformance kit passes for `local`, initialized on the test control plane as a leader
//! (its kept addresses are recorded in the API server).

mod support;

use cloud_provider::{
    CloudProvider,
    conformance::{Fixtures, Report, run},
};
use cloud_provider_local::{Config, LocalCloud};

/// A `local` cloud of `pool` (and `load_balancer`, a `loadBalancer:` line or nothing) whose inventory
/// lost `conf-gone` after the start: its machine no longer exists (a never-listed node would be
/// adopted).
fn cloud(pool: &str, load_balancer: &str) -> LocalCloud {
    let config = |machines: &str| {
        Config::parse(
            &format!(
                "machines:\n{machines}addressPools: [{{name: conformance, addresses: [{pool}]}}]\n\
                 {load_balancer}"
            ),
            None,
        )
        .unwrap()
    };
    let cloud = LocalCloud::new(
        config("  conf-running: {}\n  conf-stopped: {state: shutdown}\n  conf-gone: {}\n"),
        None,
    );
    cloud.set_config(config(
        "  conf-running: {}\n  conf-stopped: {state: shutdown}\n",
    ));
    cloud
}

/// Initializes `cloud` as the leading manager does, with the test control plane's client and the
/// ConfigMap of kept addresses the local overlays ship; the returned token stops its background work.
async fn initialized(cloud: &LocalCloud) -> tokio_util::sync::CancellationToken {
    let client = support::admin().await;
    let yaml = std::fs::read_to_string(
        test_control_plane::workspace_root()
            .join("deploy/components/local-pools/retained-addresses.yaml"),
    )
    .unwrap();
    test_control_plane::apply_manifest(&client, &yaml, false).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let supervisor = cloud_provider::Supervisor::new(Default::default(), stop.clone());
    cloud
        .initialize(cloud_provider::InitializeContext {
            client,
            supervisor: supervisor.clone(),
            shutdown: stop.clone(),
            api_outage: cloud_provider::ApiOutage::never(),
            cluster_name: "kubernetes".to_owned(),
        })
        .await
        .unwrap();
    // Its background work runs under the manager's supervisor (a panic restarts it, one that keeps
    // panicking or ends fails the manager's /healthz), none of it detached.
    assert_eq!(
        supervisor.running(),
        ["LocalPool objects", "kept addresses"],
        "the provider's background tasks, supervised"
    );
    stop
}

/// Runs the kit on `cloud` (which must pass it) with this file's machines.
async fn passes_the_kit(cloud: &LocalCloud) -> (Fixtures, Report) {
    let stop = initialized(cloud).await;
    let _stop = stop.drop_guard();
    let fixtures = Fixtures::new("conf-running", "conf-gone")
        .with_shutdown_node("conf-stopped")
        .with_backend_nodes(&["conf-running", "conf-stopped"]);
    let report = run(cloud, &fixtures).await;
    println!("{report}");
    report.assert_passed();
    (fixtures, report)
}

#[tokio::test]
async fn local_passes_the_conformance_kit() {
    let cloud = cloud("127.99.0.0/24", "");
    let (fixtures, report) = passes_the_kit(&cloud).await;
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "load_balancer_ensure_is_idempotent_and_get_agrees"),
        "{report}"
    );
    assert_eq!(cloud.provider_name(), "local");
    // Quiet: an ensure that finds nothing to change does not touch the data plane.
    let service = &fixtures.service;
    let nodes = &fixtures.backend_nodes;
    let lb = cloud.load_balancer().unwrap();
    lb.ensure_load_balancer("c", service, nodes).await.unwrap();
    let applied = cloud.data_plane_applies();
    lb.ensure_load_balancer("c", service, nodes).await.unwrap();
    lb.update_load_balancer("c", service, nodes).await.unwrap();
    assert_eq!(cloud.data_plane_applies(), applied);
    lb.ensure_load_balancer_deleted("c", service).await.unwrap();
    // Everything the kit created is gone.
    assert!(cloud.data_plane().names().is_empty());
}

/// With node agents the manager's side (addresses and status only) keeps the contract too: ensure gives
/// ingress of the asked family, idempotently, delete frees the address, and nothing is bound here.
#[tokio::test]
async fn local_with_node_agents_passes_the_conformance_kit() {
    let cloud = cloud("127.98.0.0/24", "loadBalancer: {mode: agents}\n");
    passes_the_kit(&cloud).await;
    assert_eq!(
        cloud.data_plane_applies(),
        0,
        "the agents serve, not the manager"
    );
    assert!(cloud.data_plane().names().is_empty());
}

#[test]
fn local_is_registered_under_its_name() {
    let registry = cloud_provider::Registry::linked().unwrap();
    assert!(registry.contains("local"));
}
