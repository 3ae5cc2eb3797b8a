//! The shared caches start with paged lists by default (in JSON a streaming list costs the API server
//! more than twice as much), and with streaming lists on the real API server (`WatchList` is on by
//! default in 1.37), as client-go's informers do since 1.35, when client-go's
//! `KUBE_FEATURE_WatchListClient=true` turns them on (an out-of-tree manager reads client-go's gates
//! from the environment; upstream's refuses `--feature-gates=WatchListClient=...`, and so does ours).
//!
//! The API server counts the streaming lists it completes (`apiserver_watch_list_duration_seconds`,
//! by resource); no other test binary runs meanwhile, and the test's own client never streams, so
//! every count added while a manager starts is that manager's.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use support::{
    admin, create_namespace, eventually, load_balancer_service, replica::Replica, services,
    status_ip,
};
use test_control_plane::unique_name;

const WAIT: Duration = Duration::from_secs(30);

/// The streaming lists the API server has completed for `resource` (core group, whole cluster).
async fn streaming_lists_of(resource: &str) -> u64 {
    let text = admin()
        .await
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("a request"),
        )
        .await
        .expect("the API server serves /metrics");
    let series = format!(
        "apiserver_watch_list_duration_seconds_count{{group=\"\",resource=\"{resource}\",scope=\"cluster\",version=\"v1\"}} "
    );
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map(|value| value.trim().parse::<f64>().expect("a number") as u64)
        .unwrap_or(0)
}

/// Starts a manager process running only the service controller (which reads the Node and Service
/// caches) with `env` added to its environment, and waits until it has provisioned a Service: its
/// caches have synced then. The manager runs as `system:cloud-controller-manager`, with the shipped
/// RBAC (applied here, so the test does not rely on another test binary having applied it).
async fn manager_with_synced_caches(
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (Replica, Api<Service>) {
    test_control_plane::apply_shipped_rbac().await;
    let namespace = unique_name("streaming");
    create_namespace(&namespace).await;
    let config = dir.join(format!("{namespace}.yaml"));
    let state = dir.join(format!("{namespace}.json"));
    std::fs::write(&config, format!("stateFile: {}\n", state.display())).unwrap();
    let manager = Replica::start_on_cloud_with_env(
        &config,
        &state,
        &["--controllers=service", "--leader-elect=false"],
        env,
    );
    let api = services(&namespace).await;
    api.create(&PostParams::default(), &load_balancer_service("web", &[80]))
        .await
        .expect("the Service is created");
    eventually("the Service's load balancer", WAIT, || async {
        api.get("web").await.ok().as_ref().and_then(status_ip)
    })
    .await;
    (manager, api)
}

/// Deletes the Service and waits until the manager has released it (its finalizer), then stops it.
async fn stop(manager: Replica, api: Api<Service>) {
    api.delete("web", &DeleteParams::default())
        .await
        .expect("the Service is deleted");
    eventually("the Service released", WAIT, || async {
        api.get_opt("web")
            .await
            .expect("the Service can be read")
            .is_none()
            .then_some(())
    })
    .await;
    drop(manager);
}

#[tokio::test(flavor = "multi_thread")]
async fn caches_start_with_paged_lists_unless_the_gate_turns_streaming_on() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, services) = (
        streaming_lists_of("nodes").await,
        streaming_lists_of("services").await,
    );
    let (manager, api) =
        manager_with_synced_caches(dir.path(), &[("KUBE_FEATURE_WatchListClient", "true")]).await;
    // The API server records a streaming list when its initial events end (before the client sees
    // the bookmark), so the counts are up once the caches synced.
    assert!(
        streaming_lists_of("nodes").await > nodes,
        "the Node cache started with a streaming list"
    );
    assert!(
        streaming_lists_of("services").await > services,
        "the Service cache started with a streaming list"
    );
    stop(manager, api).await;

    for (env, what) in [
        (&[][..], "by default"),
        (
            &[("KUBE_FEATURE_WatchListClient", "false")][..],
            "with WatchListClient=false",
        ),
    ] {
        let (nodes, services) = (
            streaming_lists_of("nodes").await,
            streaming_lists_of("services").await,
        );
        let (manager, api) = manager_with_synced_caches(dir.path(), env).await;
        assert_eq!(
            (
                streaming_lists_of("nodes").await,
                streaming_lists_of("services").await
            ),
            (nodes, services),
            "{what} the caches list first"
        );
        stop(manager, api).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_go_gate_the_manager_cannot_honour_stops_it_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    let state = dir.path().join("state.json");
    std::fs::write(&config, format!("stateFile: {}\n", state.display())).unwrap();
    for (name, value, said) in [
        (
            "KUBE_FEATURE_WatchListClient",
            "maybe",
            "KUBE_FEATURE_WatchListClient=maybe: not a boolean",
        ),
        (
            "KUBE_FEATURE_ClientsPreferCBOR",
            "true",
            "KUBE_FEATURE_ClientsPreferCBOR=true is not supported",
        ),
    ] {
        let mut manager = Replica::start_on_cloud_with_env(
            &config,
            &state,
            &["--controllers=service", "--leader-elect=false"],
            &[(name, value)],
        );
        assert_eq!(manager.wait_exit(WAIT), Some(1), "{}", manager.log());
        // The log is read by a thread: it may lag the exit by a moment.
        eventually("the refusal in the log", WAIT, || async {
            manager.log().contains(said).then_some(())
        })
        .await;
    }
}
