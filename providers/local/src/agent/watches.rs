//! The agent's four watches (Services, Nodes, EndpointSlices, the agents' Leases), each kept in a
//! store; a change that concerns the agent (module `wake`) asks for a look.

use std::{
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::Notify;

use super::{
    AgentHealth, AgentSettings,
    heartbeat::{LEASE_LABEL, LeaseView},
    wake,
};
use crate::instances::lock;

/// A store kept by a watch of `api`; a change wakes `changed` when `concerns` says so (given the change
/// and the store as it is after it). Its watch retries for ever; if its task panics or ends anyway, the
/// store would go stale unseen: that fails `health` for good (the kubelet restarts the agent), as a
/// store's writer cannot be had again to restart it in place.
fn mirror<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: &Arc<Notify>,
    health: &AgentHealth,
    concerns: impl FnMut(wake::Touched<'_, K>, &Store<K>) -> bool + Send + 'static,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    let (store, writer) = reflector::store();
    let changed = changed.clone();
    let stream = reflector::reflector(
        writer,
        // Retried within 5 s, not kube-runtime's default 30 s: after a long API-server outage the
        // agents see the changes made since within seconds of its end.
        watcher(api, config).backoff(cloud_provider::watch_retry_backoff()),
    );
    let health = health.clone();
    let reader = store.clone();
    // Watched: catches the watch's panic, and its end, and fails `/healthz` (`part_died`).
    tokio::spawn(async move {
        let why = match AssertUnwindSafe(drive(stream, reader, concerns, changed))
            .catch_unwind()
            .await
        {
            Ok(()) => "ended".to_owned(),
            Err(panic) => format!(
                "panicked: {}",
                cloud_provider::panic_message(panic.as_ref())
            ),
        };
        let what = format!("the watch of {}", K::plural(&()));
        tracing::error!("local-agent: {what} {why}; the agent's health check fails from now on");
        health.part_died(&what, &why);
    });
    store
}

/// Runs a reflector's `stream`, waking `changed` for each change that `concerns` the agent.
async fn drive<K, S>(
    stream: S,
    store: Store<K>,
    mut concerns: impl FnMut(wake::Touched<'_, K>, &Store<K>) -> bool,
    changed: Arc<Notify>,
) where
    K: Resource<DynamicType = ()> + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let asks = match &item {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                concerns(wake::Touched::Applied(object), &store)
            }
            Ok(watcher::Event::Delete(object)) => concerns(wake::Touched::Deleted(object), &store),
            Ok(watcher::Event::InitDone) => concerns(wake::Touched::Relisted, &store),
            Ok(watcher::Event::Init) => false,
            Err(err) => {
                tracing::warn!(error = %err, "watch failed; retrying");
                false
            }
        };
        if asks {
            changed.notify_one();
        }
    }
}

/// What the agent's watches keep.
pub(super) struct Mirrors {
    pub(super) services: Store<Service>,
    pub(super) nodes: Store<Node>,
    pub(super) slices: Store<EndpointSlice>,
    pub(super) leases: Store<Lease>,
}

impl Mirrors {
    /// Until every watch has its first list.
    pub(super) async fn ready(&self) {
        let _ = self.services.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.slices.wait_until_ready().await;
        let _ = self.leases.wait_until_ready().await;
    }
}

/// Starts the four watches; each asks for a look (on `changed`) only for what concerns this agent's
/// Services (module `wake`). Each Lease change is observed as it arrives, in the returned view:
/// liveness is judged by when a change was seen.
pub(super) fn start(
    client: &Client,
    settings: &AgentSettings,
    changed: &Arc<Notify>,
    health: &AgentHealth,
) -> (Mirrors, Arc<Mutex<LeaseView>>) {
    let class = settings.load_balancer_class.clone();
    let mut service_changes = wake::ServiceChanges::new(class.as_deref());
    let services = mirror::<Service>(
        Api::all(client.clone()),
        watcher::Config::default(),
        changed,
        health,
        move |touched, _| service_changes.concerns(touched),
    );
    let nodes = mirror::<Node>(
        Api::all(client.clone()),
        watcher::Config::default(),
        changed,
        health,
        |_, _| true,
    );
    let slices = {
        let services = services.clone();
        mirror::<EndpointSlice>(
            Api::all(client.clone()),
            watcher::Config::default(),
            changed,
            health,
            move |touched, _| wake::slice_concerns(touched, &services, class.as_deref()),
        )
    };
    let lease_view = Arc::new(Mutex::new(LeaseView::default()));
    let leases = {
        let lease_view = lease_view.clone();
        mirror::<Lease>(
            Api::namespaced(client.clone(), &settings.namespace),
            watcher::Config::default().labels(&format!("{}={}", LEASE_LABEL.0, LEASE_LABEL.1)),
            changed,
            health,
            move |_, store| {
                lock(&lease_view).observe(
                    &store.state(),
                    Instant::now(),
                    k8s_openapi::jiff::Timestamp::now(),
                )
            },
        )
    };
    (
        Mirrors {
            services,
            nodes,
            slices,
            leases,
        },
        lease_view,
    )
}
