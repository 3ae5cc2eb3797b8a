//! The node-IPAM controller (`node-ipam-controller`, alias `nodeipam`; upstream has it only in the
//! Kubernetes example `main`): with `--allocate-node-cidrs`, gives every Node a pod CIDR per cluster
//! CIDR family (`spec.podCIDR` and `spec.podCIDRs`), never the same one twice.
//!
//! At start it rebuilds which CIDRs are taken from the Nodes themselves, so a restart reallocates
//! nothing; a deleted Node's CIDRs are freed; an exhausted range is a `CIDRNotAvailable` event on the
//! Node that could not get one (retried as CIDRs free up), not a failure for the others.
//!
//! Views older than our own write. The controller acts on each watched change of a Node, and a change
//! written by someone else just before our CIDR write (the cloud-node controller initializes the same
//! new Node at the same moment) reaches us after the write succeeded, still without `spec.podCIDRs`.
//! Upstream's range allocator guards against acting twice in two ways, and so does this one:
//! - it remembers what it gave each node (upstream: the CIDR set plus, in older versions, its
//!   `nodesInProcessing` set), keyed by name *and UID*: `spec.podCIDRs` can only be set once, so a view
//!   of the same node without CIDRs is older than our write and needs nothing; a new UID under the same
//!   name is a new node, and the old one's CIDRs go back;
//! - before treating a failed write as a failure it looks at the node afresh, as upstream's
//!   `updateCIDRsAllocation` does before each write: a node that holds our CIDRs took the write, one
//!   that holds others keeps them ("Node already has a CIDR allocated. Releasing the new one") and
//!   ours go back. Only a node still without CIDRs gets the `CIDRAssignmentFailed` Warning.

pub mod allocator;

use crate::cached_node::CachedNode;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};
use serde_json::json;

use self::allocator::CidrSet;
use super::{ControllerContext, ControllerTask};
use crate::{
    cidrs::is_v4,
    events::EventRecorder,
    informers::{Change, wait_for_cache_sync},
};

/// The event source, as upstream's range allocator names it.
pub const COMPONENT: &str = "cidrAllocator";

/// How often nodes still waiting for a CIDR are retried.
const RETRY: Duration = Duration::from_secs(5);

/// The node-IPAM controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The pod CIDRs of the cluster (`--cluster-cidr`): one, or an IPv4 and an IPv6 one.
    pub cluster_cidrs: Vec<IpNet>,
    /// The mask size of a node's CIDR in a single-stack cluster (`--node-cidr-mask-size`); `None`: the
    /// family's own size.
    pub node_mask_size: Option<u8>,
    /// The mask size of a node's IPv4 CIDR (`--node-cidr-mask-size-ipv4`).
    pub node_mask_size_ipv4: u8,
    /// The mask size of a node's IPv6 CIDR (`--node-cidr-mask-size-ipv6`).
    pub node_mask_size_ipv6: u8,
    /// The Services' cluster IP ranges (`--service-cluster-ip-range`), never handed to a node.
    pub service_ranges: Vec<IpNet>,
}

impl Config {
    /// The node CIDR sets this describes, each with the service ranges occupied; an error names the
    /// flag at fault.
    pub fn cidr_sets(&self) -> Result<Vec<CidrSet>, String> {
        let dual = self.cluster_cidrs.len() == 2;
        if dual && self.node_mask_size.is_some() {
            return Err("--node-cidr-mask-size cannot be used with a dual-stack --cluster-cidr; use --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6".to_owned());
        }
        self.cluster_cidrs
            .iter()
            .map(|&cluster| {
                let mask = match (dual, is_v4(&cluster), self.node_mask_size) {
                    (false, _, Some(size)) => size,
                    (_, true, _) => self.node_mask_size_ipv4,
                    (_, false, _) => self.node_mask_size_ipv6,
                };
                let mut set = CidrSet::new(cluster, mask)
                    .map_err(|err| format!("--cluster-cidr {cluster}: {err}"))?;
                for service in &self.service_ranges {
                    set.occupy(service);
                }
                Ok(set)
            })
            .collect()
    }
}

fn pod_cidrs(node: &Node) -> Vec<IpNet> {
    node.spec
        .as_ref()
        .and_then(|s| {
            s.pod_cidrs
                .clone()
                .or_else(|| s.pod_cidr.clone().map(|c| vec![c]))
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .collect()
}

/// The CIDRs a node holds, as this controller knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// The node's UID: a node deleted and re-created under the same name is another node.
    uid: Option<String>,
    cidrs: Vec<IpNet>,
}

/// What [`Allocator::allocate`] did for a node (the events follow from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allocation {
    /// The node holds CIDRs already (its own, or ours from an earlier write): nothing written.
    Held,
    /// Our CIDRs were written to the node.
    Written,
    /// The node got CIDRs from elsewhere first; ours went back. No event.
    TakenElsewhere,
    /// The range is exhausted: `CIDRNotAvailable`, and the node waits.
    NotAvailable,
    /// The write failed and the node still has no CIDRs: `CIDRAssignmentFailed`, and a retry.
    Failed,
    /// The node is gone.
    Gone,
}

struct Allocator {
    api: Api<Node>,
    events: EventRecorder,
    sets: Vec<CidrSet>,
    /// The CIDRs each node holds (as we know them, from its own `spec.podCIDRs` or from our write), to
    /// free them when the node goes, and to recognise a view of the node older than our write.
    held: BTreeMap<String, Held>,
    /// Nodes that could not get CIDRs yet (exhausted range, or a failed write).
    waiting: BTreeMap<String, Arc<CachedNode>>,
}

impl Allocator {
    fn occupy(&mut self, node: &Node) {
        let cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            return;
        }
        let name = node.name_any();
        let held = Held {
            uid: node.uid(),
            cidrs,
        };
        if self.held.get(&name) == Some(&held) {
            return;
        }
        // Whatever we held for this name before (another node of that name, or CIDRs we wrote that lost
        // to someone else's) is no longer in use.
        self.release(&name);
        for cidr in &held.cidrs {
            for set in &mut self.sets {
                set.occupy(cidr);
            }
        }
        self.held.insert(name, held);
    }

    fn release(&mut self, name: &str) {
        if let Some(held) = self.held.remove(name) {
            self.release_cidrs(&held.cidrs);
        }
    }

    /// Returns CIDRs this controller took but did not give to any node.
    fn release_cidrs(&mut self, cidrs: &[IpNet]) {
        for cidr in cidrs {
            for set in &mut self.sets {
                set.release(cidr);
            }
        }
    }

    /// Frees what the deleted `node` held, unless the name now belongs to a newer node.
    fn forget(&mut self, node: &Node) {
        let name = node.name_any();
        if self
            .waiting
            .get(&name)
            .is_some_and(|waiting| waiting.uid() == node.uid())
        {
            self.waiting.remove(&name);
        }
        if self
            .held
            .get(&name)
            .is_some_and(|held| held.uid.is_none() || held.uid == node.uid())
        {
            self.release(&name);
        }
    }

    /// Gives `node` one CIDR per set, unless it has CIDRs already.
    async fn allocate(&mut self, node: Arc<CachedNode>) -> Allocation {
        let name = node.name_any();
        if !pod_cidrs(&node).is_empty() {
            self.occupy(&node);
            self.waiting.remove(&name);
            return Allocation::Held;
        }
        if let Some(held) = self.held.get(&name) {
            if held.uid == node.uid() {
                // We gave this very node its CIDRs (or saw it holding them), and `spec.podCIDRs` can only
                // be set once: this view of the node predates that write. Events about a node arrive in
                // order, but one written by someone else (the cloud-node controller, say) just before our
                // write is still on its way when the write succeeds. Writing again would be refused (422,
                // podCIDR is immutable) and reported as CIDRAssignmentFailed for a node that has its CIDRs.
                tracing::debug!(node = %name, cidrs = ?held.cidrs, "node view older than its pod CIDRs; nothing to do");
                self.waiting.remove(&name);
                return Allocation::Held;
            }
            // Another node of the same name: the one that held these CIDRs is gone.
            self.release(&name);
        }
        let mut cidrs = Vec::new();
        for set in &mut self.sets {
            match set.allocate() {
                Some(cidr) => cidrs.push(cidr),
                None => {
                    let cluster = set.cluster();
                    self.release_cidrs(&cidrs);
                    tracing::warn!(node = %name, %cluster, "no pod CIDR left for the node");
                    self.events
                        .record(
                            node.as_ref(),
                            EventType::Normal,
                            "CIDRNotAvailable",
                            "AllocateCIDR",
                            format!("Node {name} status is now: CIDRNotAvailable"),
                        )
                        .await;
                    self.waiting.insert(name, node);
                    return Allocation::NotAvailable;
                }
            }
        }
        let texts: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let patch = json!({ "spec": { "podCIDR": texts[0], "podCIDRs": texts } });
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                tracing::info!(node = %name, cidrs = ?texts, "allocated pod CIDRs");
                self.settle(&name, &cidrs, &updated)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.release_cidrs(&cidrs);
                self.waiting.remove(&name);
                Allocation::Gone
            }
            Err(err) => self.write_failed(node, cidrs, err).await,
        }
    }

    /// Records what `node` (fresh from the API server) holds after we proposed `ours` for it: ours if it
    /// took them, else its own (and ours go back).
    fn settle(&mut self, name: &str, ours: &[IpNet], node: &Node) -> Allocation {
        self.waiting.remove(name);
        let theirs = pod_cidrs(node);
        if theirs.as_slice() == ours {
            self.held.insert(
                name.to_owned(),
                Held {
                    uid: node.uid(),
                    cidrs: ours.to_vec(),
                },
            );
            return Allocation::Written;
        }
        // The node got CIDRs from elsewhere first (another allocator: only one of the CCM and the
        // kube-controller-manager may allocate): it keeps those; ours go back. Logged as upstream does.
        tracing::warn!(node = %name, cidrs = ?theirs, released = ?ours, "node already has a CIDR allocated; releasing the new one");
        self.release_cidrs(ours);
        self.occupy(node);
        Allocation::TakenElsewhere
    }

    /// After a refused or failed write, reads the node afresh, as upstream's range allocator does before
    /// each write (`updateCIDRsAllocation`): a node that holds our CIDRs took the write (the error was
    /// about the answer); a node that holds others keeps those and ours go back, with no event (a 422
    /// "may not change once set" or a 409 is exactly this). Only a node still without CIDRs is a failure:
    /// the `CIDRAssignmentFailed` Warning, and a retry.
    async fn write_failed(
        &mut self,
        node: Arc<CachedNode>,
        ours: Vec<IpNet>,
        err: kube::Error,
    ) -> Allocation {
        let name = node.name_any();
        let read_error = match self.api.get_opt(&name).await {
            Ok(None) => {
                self.release_cidrs(&ours);
                self.waiting.remove(&name);
                return Allocation::Gone;
            }
            Ok(Some(fresh)) if !pod_cidrs(&fresh).is_empty() => {
                return self.settle(&name, &ours, &fresh);
            }
            Ok(Some(_)) => None,
            Err(err) => Some(err),
        };
        // As upstream: CIDRs of a write whose outcome is unknown (the server timed out, or the answer was
        // lost) stay taken rather than risk handing them to a second node; a restart rebuilds the set
        // from the nodes and frees them.
        if outcome_known(&err) {
            self.release_cidrs(&ours);
        }
        tracing::warn!(node = %name, error = %err, read_error = ?read_error.map(|e| e.to_string()), "could not write the node's pod CIDRs; will retry");
        self.events
            .record(
                node.as_ref(),
                EventType::Warning,
                "CIDRAssignmentFailed",
                "AllocateCIDR",
                format!("Node {name} status is now: CIDRAssignmentFailed"),
            )
            .await;
        self.waiting.insert(name, node);
        Allocation::Failed
    }

    async fn retry_waiting(&mut self) {
        let waiting: Vec<Arc<CachedNode>> = self.waiting.values().cloned().collect();
        for node in waiting {
            self.allocate(node).await;
        }
    }
}

/// Whether a failed write surely did not happen: an answer from the API server other than a timeout
/// (upstream releases the CIDRs unless `IsServerTimeout`).
fn outcome_known(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code != 504 && status.reason != "Timeout",
        _ => false,
    }
}

/// Starts the controller on CIDR sets from [`Config::cidr_sets`].
pub fn start(ctx: ControllerContext, sets: Vec<CidrSet>) -> Option<ControllerTask> {
    let nodes = ctx.informers.nodes();
    let changes = nodes.subscribe_changes();
    let allocator = Allocator {
        api: Api::all(ctx.client.clone()),
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        sets,
        held: BTreeMap::new(),
        waiting: BTreeMap::new(),
    };
    let shutdown = ctx.shutdown.clone();
    Some(Box::pin(async move {
        if !wait_for_cache_sync(&shutdown, [nodes.synced()]).await {
            return Ok(());
        }
        run(allocator, nodes.store().state(), changes, shutdown).await;
        Ok(())
    }))
}

async fn run(
    mut allocator: Allocator,
    existing: Vec<Arc<CachedNode>>,
    changes: impl Stream<Item = Change<CachedNode>> + Send,
    shutdown: tokio_util::sync::CancellationToken,
) {
    // What is taken first, from every node, so nothing is handed out twice after a restart.
    for node in &existing {
        allocator.occupy(node);
    }
    tracing::info!(
        nodes = existing.len(),
        held = allocator.held.len(),
        "node CIDR allocations rebuilt from the cluster"
    );
    let mut changes = Box::pin(changes);
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Change::Applied(node)) => {
                    if node.metadata.deletion_timestamp.is_none() {
                        allocator.allocate(node).await;
                    }
                }
                Some(Change::Deleted(node)) => {
                    allocator.forget(&node);
                    // Freed CIDRs may serve a node that is waiting.
                    allocator.retry_waiting().await;
                }
                None => return,
            },
            _ = retry.tick(), if !allocator.waiting.is_empty() => allocator.retry_waiting().await,
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(cluster: &str, size: u8, services: &str) -> Config {
        let cidrs = |list: &str| -> Vec<IpNet> {
            list.split(',')
                .filter(|c| !c.is_empty())
                .map(|c| c.parse::<IpNet>().unwrap().trunc())
                .collect()
        };
        Config {
            cluster_cidrs: cidrs(cluster),
            node_mask_size: (size != 0).then_some(size),
            node_mask_size_ipv4: 24,
            node_mask_size_ipv6: 64,
            service_ranges: cidrs(services),
        }
    }

    #[test]
    fn mask_sizes_follow_the_stack() {
        let config = options("10.244.0.0/16", 0, "");
        let sets = config.cidr_sets().unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].free(), 256);
        let config = options("10.244.0.0/16", 26, "");
        assert_eq!(config.cidr_sets().unwrap()[0].free(), 1024);
        let config = options("10.244.0.0/16,fd00:10:244::/56", 0, "");
        let sets = config.cidr_sets().unwrap();
        assert_eq!((sets[0].free(), sets[1].free()), (256, 256));
        let config = options("10.244.0.0/16,fd00:10:244::/56", 24, "");
        assert!(
            config
                .cidr_sets()
                .unwrap_err()
                .contains("--node-cidr-mask-size cannot be used")
        );
    }

    use crate::mock_api::{Requests, mock_client};

    fn node(name: &str, uid: &str, cidrs: &[&str]) -> serde_json::Value {
        let mut spec = json!({});
        if !cidrs.is_empty() {
            spec = json!({ "podCIDR": cidrs[0], "podCIDRs": cidrs });
        }
        json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "uid": uid }, "spec": spec })
    }

    fn node_view(name: &str, uid: &str, cidrs: &[&str]) -> Arc<CachedNode> {
        Arc::new(serde_json::from_value(node(name, uid, cidrs)).unwrap())
    }

    fn status(code: u16, reason: &str) -> serde_json::Value {
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
                "message": "spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid" })
    }

    /// An allocator of 10.0.0.0/22 in /24s (4 CIDRs) on `respond`; event writes succeed.
    fn mock_allocator(
        respond: impl Fn(&str, &str, &serde_json::Value) -> (u16, serde_json::Value)
        + Send
        + Sync
        + 'static,
    ) -> (Allocator, Requests) {
        let (client, requests) = mock_client(move |method, path, body| {
            if path.contains("/events") {
                (201, body.clone())
            } else {
                respond(method, path, body)
            }
        });
        let allocator = Allocator {
            api: Api::all(client.clone()),
            events: EventRecorder::new(client, COMPONENT),
            sets: vec![CidrSet::new("10.0.0.0/22".parse().unwrap(), 24).unwrap()],
            held: BTreeMap::new(),
            waiting: BTreeMap::new(),
        };
        (allocator, requests)
    }

    /// The API server writes what each patch says, as it would for a node without pod CIDRs; the
    /// node it answers with has the next of `uids`.
    fn accept_patches(
        uids: &'static [&'static str],
    ) -> impl Fn(&str, &str, &serde_json::Value) -> (u16, serde_json::Value) + Send + Sync + 'static
    {
        let count = std::sync::atomic::AtomicUsize::new(0);
        move |method, path, body| {
            assert_eq!(method, "PATCH", "{path}");
            let name = path.rsplit('/').next().unwrap();
            let cidrs: Vec<&str> = body["spec"]["podCIDRs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (200, node(name, uids[n], &cidrs))
        }
    }

    /// The requests about nodes (events are delivered on their own schedule), as "METHOD".
    fn node_requests(requests: &Requests) -> Vec<String> {
        requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, path, _)| path.starts_with("/api/v1/nodes"))
            .map(|(method, _, _)| method.clone())
            .collect()
    }

    /// Waits for the event with `reason` to reach the API server.
    async fn delivered(requests: &Requests, reason: &str) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let found = requests
                .lock()
                .unwrap()
                .iter()
                .find(|(_, path, body)| path.contains("/events") && body["reason"] == reason)
                .map(|(_, _, body)| body.clone());
            if let Some(event) = found {
                return event;
            }
            assert!(tokio::time::Instant::now() < deadline, "no {reason} event");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_view_of_a_node_older_than_our_write_is_not_written_again() {
        let (mut allocator, requests) = mock_allocator(accept_patches(&["uid-1"]));
        let ours: IpNet = "10.0.0.0/24".parse().unwrap();
        assert_eq!(
            allocator.allocate(node_view("n", "uid-1", &[])).await,
            Allocation::Written
        );
        assert_eq!(allocator.held["n"].cidrs, vec![ours]);
        // The cloud-node controller's write from just before ours: the node as it was, without CIDRs.
        for _ in 0..2 {
            assert_eq!(
                allocator.allocate(node_view("n", "uid-1", &[])).await,
                Allocation::Held
            );
        }
        assert_eq!(node_requests(&requests), ["PATCH"], "wrote again");
        assert_eq!(allocator.sets[0].free(), 3, "took a second CIDR");
        assert!(allocator.waiting.is_empty());
        // Then the view with our CIDRs: nothing to do either.
        assert_eq!(
            allocator
                .allocate(node_view("n", "uid-1", &["10.0.0.0/24"]))
                .await,
            Allocation::Held
        );
        assert_eq!(node_requests(&requests), ["PATCH"]);
        assert_eq!(allocator.sets[0].free(), 3);
    }

    #[tokio::test]
    async fn a_refused_write_to_a_node_that_has_cidrs_keeps_those_and_releases_ours_quietly() {
        let (mut allocator, requests) = mock_allocator(|method, _, _| match method {
            "PATCH" => (422, status(422, "Invalid")),
            _ => (200, node("n", "uid-1", &["10.0.2.0/24"])),
        });
        // Allocated elsewhere (the kube-controller-manager's allocator, say) after the view we act on.
        assert_eq!(
            allocator.allocate(node_view("n", "uid-1", &[])).await,
            Allocation::TakenElsewhere
        );
        assert_eq!(
            node_requests(&requests),
            ["PATCH", "GET"],
            "re-read after the refusal"
        );
        assert_eq!(
            allocator.held["n"].cidrs,
            vec!["10.0.2.0/24".parse::<IpNet>().unwrap()]
        );
        // Ours (10.0.0.0/24) went back; theirs is taken.
        assert_eq!(allocator.sets[0].free(), 3);
        assert_eq!(
            allocator.sets[0].allocate(),
            Some("10.0.1.0/24".parse().unwrap())
        );
        assert!(allocator.waiting.is_empty());
    }

    #[tokio::test]
    async fn a_refused_write_to_a_node_without_cidrs_is_a_warning_and_a_retry() {
        let (mut allocator, requests) = mock_allocator(|method, _, _| match method {
            "PATCH" => (422, status(422, "Invalid")),
            _ => (200, node("n", "uid-1", &[])),
        });
        assert_eq!(
            allocator.allocate(node_view("n", "uid-1", &[])).await,
            Allocation::Failed
        );
        let event = delivered(&requests, "CIDRAssignmentFailed").await;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["note"], "Node n status is now: CIDRAssignmentFailed");
        assert!(allocator.waiting.contains_key("n"));
        assert!(!allocator.held.contains_key("n"));
        assert_eq!(allocator.sets[0].free(), 4, "the refused CIDR went back");

        // A server timeout: the write may still land, so its CIDR stays taken (as upstream).
        let (mut allocator, requests) = mock_allocator(|method, _, _| match method {
            "PATCH" => (504, status(504, "Timeout")),
            _ => (200, node("n", "uid-1", &[])),
        });
        assert_eq!(
            allocator.allocate(node_view("n", "uid-1", &[])).await,
            Allocation::Failed
        );
        delivered(&requests, "CIDRAssignmentFailed").await;
        assert_eq!(allocator.sets[0].free(), 3);
    }

    #[tokio::test]
    async fn a_node_recreated_under_its_name_gets_new_cidrs_and_a_late_delete_of_the_old_one_frees_nothing()
     {
        let (mut allocator, _) = mock_allocator(accept_patches(&["uid-1", "uid-2"]));
        allocator.allocate(node_view("n", "uid-1", &[])).await;
        // Deleted and registered again before we saw the deletion: another node.
        assert_eq!(
            allocator.allocate(node_view("n", "uid-2", &[])).await,
            Allocation::Written
        );
        assert_eq!(allocator.held["n"].uid.as_deref(), Some("uid-2"));
        assert_eq!(
            allocator.held["n"].cidrs,
            vec!["10.0.1.0/24".parse::<IpNet>().unwrap()]
        );
        assert_eq!(allocator.sets[0].free(), 3, "the old node's CIDR went back");
        allocator.forget(&node_view("n", "uid-1", &["10.0.0.0/24"]));
        assert_eq!(
            allocator.sets[0].free(),
            3,
            "a delete of the old node freed the new one's"
        );
        allocator.forget(&node_view("n", "uid-2", &["10.0.1.0/24"]));
        assert_eq!(allocator.sets[0].free(), 4);
        assert!(allocator.held.is_empty());
    }

    #[test]
    fn the_service_range_is_never_handed_out() {
        let config = options("10.0.0.0/16", 0, "10.0.0.0/20");
        let mut sets = config.cidr_sets().unwrap();
        assert_eq!(sets[0].free(), 256 - 16);
        assert_eq!(sets[0].allocate().unwrap().to_string(), "10.0.16.0/24");
    }
}
