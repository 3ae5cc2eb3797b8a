//! Events survive an API outage: recording queues them, and delivery is retried until the API server
//! answers again. Repeats about one object are one Event with a series.

mod support;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use cloud_controller_manager::events::EventRecorder;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api, Client, Config,
    api::DeleteParams,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::events::EventType,
};
use support::{
    admin,
    blackhole_proxy::{BlackholeProxy, kubeconfig_through},
    events_for, eventually, free_port,
};
use test_control_plane::{control_plane, unique_name};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_recorded_while_the_api_server_is_unreachable_are_delivered_when_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    // A kubeconfig pointing at a port nothing listens on yet: every write is refused.
    let port = free_port();
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let kubeconfig = dir.path().join("outage.kubeconfig");
    kubeconfig_through(&control_plane().admin_kubeconfig(), address, &kubeconfig);
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let recorder = EventRecorder::new(Client::try_from(config).unwrap(), "cloud-node-controller");

    let names: Vec<String> = (0..3).map(|_| unique_name("outage-event")).collect();
    for name in &names {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            ..Default::default()
        };
        // Returns at once: recording never waits for the API server.
        tokio::time::timeout(
            Duration::from_secs(1),
            recorder.record(
                &node,
                EventType::Normal,
                "Synced",
                "InitializeNode",
                "Node synced successfully".to_owned(),
            ),
        )
        .await
        .expect("recording does not block");
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // a few refused tries
    for name in &names {
        assert!(events_for(name, "Synced").await.is_empty());
    }

    // The API server is back at that address.
    let server: SocketAddr = std::fs::read_to_string(control_plane().dir().join("run/server"))
        .unwrap()
        .trim()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let _back = BlackholeProxy::start_at(address, server, IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
    for name in &names {
        eventually("the event delivered", Duration::from_secs(30), || async {
            events_for(name, "Synced").await.pop()
        })
        .await;
    }
    tokio::time::timeout(Duration::from_secs(10), recorder.flush())
        .await
        .expect("nothing left to deliver");
}

#[tokio::test]
async fn repeats_about_one_object_are_one_event_with_a_series_count() {
    let recorder = EventRecorder::new(admin().await, "cloud-node-controller");
    let node = |name: &str| Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    };
    let (a, b) = (unique_name("series-a"), unique_name("series-b"));
    // (object, reason, note): one at a time, each delivered before the next.
    let recorded = [
        (&a, "Synced", "first"),
        (&a, "Synced", "second"),
        (&b, "Synced", "about b"),
        (&a, "Synced", "third"),
        (&a, "Failed", "another reason"),
    ];
    for (name, reason, note) in recorded {
        record_and_deliver(&recorder, &node(name), reason, note).await;
    }
    let synced = events_for(&a, "Synced").await;
    assert_eq!(synced.len(), 1, "{synced:?}");
    let series = synced[0].series.as_ref().expect("a series");
    assert_eq!(series.count, 3);
    assert_eq!(
        synced[0].note.as_deref(),
        Some("first"),
        "a series keeps its first note"
    );
    assert!(series.last_observed_time.0 >= synced[0].event_time.as_ref().unwrap().0);
    for (name, reason) in [(&b, "Synced"), (&a, "Failed")] {
        let events = events_for(name, reason).await;
        assert_eq!(events.len(), 1, "{name} {reason}: {events:?}");
        assert!(
            events[0].series.is_none(),
            "{name} {reason}: a single event"
        );
    }

    // The series' Event deleted (by an operator, or expired from the store): the next repeat is not
    // lost, it starts a new Event.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin().await, "default");
    events
        .delete(
            synced[0].metadata.name.as_deref().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .expect("the series' Event deleted");
    record_and_deliver(&recorder, &node(&a), "Synced", "after the deletion").await;
    let synced = events_for(&a, "Synced").await;
    assert_eq!(synced.len(), 1, "{synced:?}");
    assert!(synced[0].series.is_none(), "a new Event: {synced:?}");
    assert_eq!(synced[0].note.as_deref(), Some("after the deletion"));
}

/// Records a `Normal` event about `node` and waits until it is delivered, so that events recorded one
/// after the other reach the API server in that order.
async fn record_and_deliver(recorder: &EventRecorder, node: &Node, reason: &str, note: &str) {
    recorder
        .record(
            node,
            EventType::Normal,
            reason,
            "InitializeNode",
            note.to_owned(),
        )
        .await;
    tokio::time::timeout(Duration::from_secs(10), recorder.flush())
        .await
        .expect("delivered");
}
