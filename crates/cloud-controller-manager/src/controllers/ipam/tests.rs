//! The controller's loop on a mock API server, in virtual time: what nodes waiting on a full range cost
//! in events and log lines, and how soon a freed CIDR reaches one.

use parking_lot::Mutex;
use std::{sync::Arc, time::Duration};

use futures::channel::mpsc;
use serde_json::json;
use tracing_subscriber::{Layer, layer::SubscriberExt};

use super::*;
use crate::mock_api::{Requests, mock_client};

/// Every log line at info level or above (what an operator sees by default): "target: message".
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() <= tracing::Level::INFO {
            let mut message = Message(String::new());
            event.record(&mut message);
            let line = format!("{}: {}", event.metadata().target(), message.0);
            self.0.lock().push(line);
        }
    }
}

impl Lines {
    fn count(&self) -> usize {
        self.0.lock().len()
    }

    fn since(&self, from: usize) -> Vec<String> {
        self.0.lock()[from..].to_vec()
    }
}

fn node(name: &str, cidrs: &[&str]) -> Arc<CachedNode> {
    let mut spec = json!({});
    if !cidrs.is_empty() {
        spec = json!({ "podCIDR": cidrs[0], "podCIDRs": cidrs });
    }
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name, "uid": format!("uid-{name}") }, "spec": spec
        }))
        .unwrap(),
    )
}

/// A mock API server that takes every node patch and event write.
fn api() -> (kube::Client, Requests) {
    mock_client(|method, path, body| {
        if path.contains("/events") {
            return (201, body.clone());
        }
        assert_eq!(method, "PATCH", "{path}");
        let name = path.rsplit('/').next().unwrap();
        let cidrs: Vec<&str> = body["spec"]["podCIDRs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        let view = node(name, &cidrs);
        (200, serde_json::to_value(view.node()).unwrap())
    })
}

/// The event writes so far (a new event or a series patch: one write each).
fn event_writes(requests: &Requests) -> Vec<serde_json::Value> {
    requests
        .lock()
        .iter()
        .filter(|(_, path, _)| path.contains("/events"))
        .map(|(_, path, body)| json!({ "path": path, "body": body }))
        .collect()
}

/// The node patches so far: (node, its CIDRs).
fn patches(requests: &Requests) -> Vec<(String, serde_json::Value)> {
    requests
        .lock()
        .iter()
        .filter(|(method, path, _)| method == "PATCH" && path.starts_with("/api/v1/nodes/"))
        .map(|(_, path, body)| {
            (
                path.rsplit('/').next().unwrap().to_owned(),
                body["spec"]["podCIDRs"].clone(),
            )
        })
        .collect()
}

/// Lets the loop and the event delivery run without moving the clock.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn two_hundred_nodes_on_a_full_range_cost_one_event_each_per_step_and_a_freed_cidr_goes_at_once()
 {
    let lines = Lines::default();
    let _logs =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(lines.clone()));
    let (client, requests) = api();
    // 10.233.0.0/24 in /26s: 4 node CIDRs, as the real API server's test has.
    let sets = vec![CidrSet::new("10.233.0.0/24".parse().unwrap(), 26).unwrap()];
    let allocator = Allocator::new(
        Api::all(client.clone()),
        EventRecorder::new(client, COMPONENT),
        sets,
    );
    let (changes, stream) = mpsc::unbounded();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        allocator,
        Vec::new(),
        stream,
        crate::node_ownership::NodeOwnership::every_node(),
        shutdown.clone(),
    ));

    let holders: Vec<String> = (0..4).map(|i| format!("hold-{i}")).collect();
    for name in &holders {
        changes
            .unbounded_send(Change::Applied(node(name, &[])))
            .unwrap();
    }
    settle().await;
    assert_eq!(patches(&requests).len(), 4);
    let start = tokio::time::Instant::now();
    let waiting: Vec<String> = (0..200).map(|i| format!("wait-{i:03}")).collect();
    for name in &waiting {
        changes
            .unbounded_send(Change::Applied(node(name, &[])))
            .unwrap();
    }
    settle().await;
    let first = event_writes(&requests);
    // One summary about no object in kube-system, and one event per node.
    let summaries: Vec<&serde_json::Value> = first
        .iter()
        .filter(|e| e["body"]["reason"] == assign::RANGE_FULL)
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(
        summaries[0]["path"],
        "/apis/events.k8s.io/v1/namespaces/kube-system/events"
    );
    assert!(summaries[0]["body"]["regarding"].is_null());
    assert!(summaries[0]["body"]["note"].as_str().unwrap().starts_with(
        "Pod CIDR range 10.233.0.0/24 is full (4 node CIDRs of /26, all taken): node wait-000"
    ));
    assert_eq!(first.len(), 201);
    let logged = lines.since(0);
    assert_eq!(
        logged
            .iter()
            .filter(|l| l.contains("pod CIDR range full"))
            .count(),
        1,
        "{logged:#?}"
    );
    // The first minute: steps at 0, 5, 15 and 35 s, one event each.
    let before = lines.count();
    tokio::time::sleep_until(start + Duration::from_secs(60)).await;
    settle().await;
    let minute = event_writes(&requests).len();
    assert_eq!(minute, 1 + 200 * 4);
    assert_eq!(lines.since(before), Vec::<String>::new(), "log lines");
    // Their own changes (a kubelet's status update) tell nothing.
    for name in &waiting {
        changes
            .unbounded_send(Change::Applied(node(name, &[])))
            .unwrap();
    }
    settle().await;
    assert_eq!(event_writes(&requests).len(), minute);
    // The next ten minutes: steps at 75, 155, 315 and 615 s.
    tokio::time::sleep_until(start + Duration::from_secs(660)).await;
    settle().await;
    assert_eq!(event_writes(&requests).len(), minute + 200 * 4);
    assert_eq!(lines.since(before), Vec::<String>::new(), "log lines");

    // A holder deleted: its CIDR goes to the node that waited longest, with no time passing, and the
    // others are not told again.
    let events = event_writes(&requests).len();
    let woken_at = tokio::time::Instant::now();
    changes
        .unbounded_send(Change::Deleted(node(&holders[0], &["10.233.0.0/26"])))
        .unwrap();
    settle().await;
    assert_eq!(tokio::time::Instant::now(), woken_at, "the clock moved");
    assert_eq!(
        patches(&requests).last().unwrap(),
        &(waiting[0].clone(), json!(["10.233.0.0/26"]))
    );
    assert_eq!(event_writes(&requests).len(), events);
    // The rest go: the range is no longer told full.
    for name in &waiting[1..] {
        changes
            .unbounded_send(Change::Deleted(node(name, &[])))
            .unwrap();
    }
    settle().await;
    let logged = lines.since(before);
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert!(logged[0].contains("allocated pod CIDRs"));
    assert!(logged[1].contains("no node waits for room"));
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cidr_freed_while_several_wait_serves_as_many_as_fit_oldest_first() {
    let (client, requests) = api();
    let sets = vec![CidrSet::new("10.0.0.0/23".parse().unwrap(), 24).unwrap()];
    let allocator = Allocator::new(
        Api::all(client.clone()),
        EventRecorder::new(client, COMPONENT),
        sets,
    );
    let (changes, stream) = mpsc::unbounded();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        allocator,
        Vec::new(),
        stream,
        crate::node_ownership::NodeOwnership::every_node(),
        shutdown.clone(),
    ));
    for name in ["a", "b", "w1", "w2", "w3"] {
        changes
            .unbounded_send(Change::Applied(node(name, &[])))
            .unwrap();
        settle().await;
    }
    assert_eq!(patches(&requests).len(), 2);
    // Both holders go in one pass of changes: the two oldest waiters get their CIDRs.
    changes
        .unbounded_send(Change::Deleted(node("a", &["10.0.0.0/24"])))
        .unwrap();
    changes
        .unbounded_send(Change::Deleted(node("b", &["10.0.1.0/24"])))
        .unwrap();
    settle().await;
    let served: Vec<String> = patches(&requests)[2..]
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(served, ["w1", "w2"]);
    shutdown.cancel();
    task.await.unwrap();
}
