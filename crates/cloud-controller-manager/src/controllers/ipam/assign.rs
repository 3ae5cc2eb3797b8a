//! Giving one node its CIDRs: the write, what is taken and by whom, and the events. Nodes that could not
//! get theirs wait in a [`WaitList`] (their back-off and what each failure tells are decided there).

use std::{collections::BTreeMap, sync::Arc};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};
use serde_json::json;
use tokio::time::Instant;

use super::{
    allocator::{CidrSet, Exhausted, has_room, take_one_each},
    waiting::{Attempt, Cause, WaitList},
};
use crate::{
    cached_node::CachedNode,
    events::EventRecorder,
    outage_retry::{API_OUTAGE_RETRY, api_unavailable},
};

/// The per-node event of a full range (upstream's).
pub const NOT_AVAILABLE: &str = "CIDRNotAvailable";
/// The per-node event of a failed write (upstream's).
pub const ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
/// The event about no object (in `kube-system`) when the range fills: ours, upstream has none.
pub const RANGE_FULL: &str = "CIDRRangeExhausted";

/// The pod CIDRs `node` holds (`spec.podCIDRs`, else `spec.podCIDR`).
pub fn pod_cidrs(node: &Node) -> Vec<IpNet> {
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
pub struct Held {
    /// The node's UID: a node deleted and re-created under the same name is another node.
    pub uid: Option<String>,
    /// Its CIDRs.
    pub cidrs: Vec<IpNet>,
}

/// What [`Allocator::allocate`] did for a node (the events follow from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// The node holds CIDRs already (its own, or ours from an earlier write): nothing written.
    Held,
    /// Our CIDRs were written to the node.
    Written,
    /// The node got CIDRs from elsewhere first; ours went back. No event.
    TakenElsewhere,
    /// The range is exhausted: the node waits (`CIDRNotAvailable` once per back-off step).
    NotAvailable,
    /// The write failed and the node still has no CIDRs: `CIDRAssignmentFailed`, and a retry.
    Failed,
    /// The node is gone.
    Gone,
}

/// The controller's state: what is taken, by whom, and who waits.
pub struct Allocator {
    pub(super) api: Api<Node>,
    pub(super) events: EventRecorder,
    pub(super) sets: Vec<CidrSet>,
    /// The CIDRs each node holds (as we know them, from its own `spec.podCIDRs` or from our write), to
    /// free them when the node goes, and to recognise a view of the node older than our write.
    pub(super) held: BTreeMap<String, Held>,
    /// Nodes that could not get CIDRs yet (exhausted range, or a failed write).
    pub(super) waiting: WaitList,
    /// Whether a CIDR went back since the nodes waiting for room were last woken.
    pub(super) freed: bool,
}

impl Allocator {
    /// An allocator of `sets` with nothing taken by a node yet.
    pub fn new(api: Api<Node>, events: EventRecorder, sets: Vec<CidrSet>) -> Self {
        Self {
            api,
            events,
            sets,
            held: BTreeMap::new(),
            waiting: WaitList::default(),
            freed: false,
        }
    }

    /// Records what `node` holds (its own `spec.podCIDRs`) as taken.
    pub fn occupy(&mut self, node: &Node) {
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
        self.freed |= !cidrs.is_empty();
    }

    /// Frees what the deleted `node` held, unless the name now belongs to a newer node.
    pub fn forget(&mut self, node: &Node) {
        let name = node.name_any();
        self.waiting.forget(node);
        if self
            .held
            .get(&name)
            .is_some_and(|held| held.uid.is_none() || held.uid == node.uid())
        {
            self.release(&name);
        }
    }

    /// Gives `node` one CIDR per set, unless it has CIDRs already.
    pub async fn allocate(&mut self, node: Arc<CachedNode>) -> Allocation {
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
        let attempt = self.waiting.attempt(&node, Instant::now());
        let cidrs = match take_one_each(&mut self.sets) {
            Ok(cidrs) => cidrs,
            Err(full) => {
                self.wait_for_room(node, attempt, &full);
                return Allocation::NotAvailable;
            }
        };
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
            Err(err) => self.write_failed(node, cidrs, err, attempt).await,
        }
    }

    /// `node` found the range `full`: it waits for room; told on the node once per back-off step, and
    /// for the cluster when it is the first to wait.
    fn wait_for_room(&mut self, node: Arc<CachedNode>, attempt: Attempt, full: &Exhausted) {
        let name = node.name_any();
        let now = Instant::now();
        let waiting = self
            .waiting
            .failed(node.clone(), Cause::Exhausted, attempt, now, None);
        if waiting.decision.announce_full {
            tracing::warn!(node = %name, cluster = %full.cluster, "pod CIDR range full: {full}; nodes without pod CIDRs wait until a node is deleted (each told on its own node by {NOT_AVAILABLE} events, 5 s doubling to 5 min apart)");
            self.events.queue_unattached(
                EventType::Warning,
                RANGE_FULL,
                "AllocateCIDR",
                format!(
                    "Pod CIDR range {} is full ({} node CIDRs of /{}, all taken): node {name} and every later node without pod CIDRs wait until a node is deleted; widen --cluster-cidr or lengthen the node CIDR mask size to make room",
                    full.cluster, full.total, full.mask
                ),
            );
        }
        if waiting.decision.tell_node {
            tracing::debug!(node = %name, cluster = %full.cluster, step = waiting.steps, next_step_in = ?waiting.next_step.saturating_duration_since(now), "no pod CIDR left for the node; waiting");
            self.events.queue(
                node.as_ref(),
                EventType::Normal,
                NOT_AVAILABLE,
                "AllocateCIDR",
                format!("Node {name} status is now: {NOT_AVAILABLE}"),
            );
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
    /// the `CIDRAssignmentFailed` Warning, and a retry at its next back-off step.
    async fn write_failed(
        &mut self,
        node: Arc<CachedNode>,
        ours: Vec<IpNet>,
        err: kube::Error,
        attempt: Attempt,
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
        let now = Instant::now();
        let outage = api_unavailable(&err).then_some(API_OUTAGE_RETRY);
        let waiting = self
            .waiting
            .failed(node.clone(), Cause::WriteFailed, attempt, now, outage);
        tracing::warn!(node = %name, error = %err, read_error = ?read_error.map(|e| e.to_string()), step = waiting.steps, retry_in = ?waiting.next_step.saturating_duration_since(now), "could not write the node's pod CIDRs; will retry");
        if waiting.decision.tell_node {
            self.events.queue(
                node.as_ref(),
                EventType::Warning,
                ASSIGNMENT_FAILED,
                "AllocateCIDR",
                format!("Node {name} status is now: {ASSIGNMENT_FAILED}"),
            );
        }
        Allocation::Failed
    }

    /// Retries the nodes whose back-off step is due.
    pub async fn step_due(&mut self) {
        for node in self.waiting.due(Instant::now()) {
            self.allocate(node).await;
        }
    }

    /// After CIDRs went back: the nodes waiting for room get them at once, oldest first, as many as
    /// there is room for (nothing is told for those that still find none).
    pub async fn wake(&mut self) {
        while std::mem::take(&mut self.freed) {
            for node in self.waiting.waiting_on_room() {
                if !has_room(&self.sets) {
                    break;
                }
                self.allocate(node).await;
            }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
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
        let allocator = Allocator::new(
            Api::all(client.clone()),
            EventRecorder::new(client, super::super::COMPONENT),
            vec![CidrSet::new("10.0.0.0/22".parse().unwrap(), 24).unwrap()],
        );
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
        let event = delivered(&requests, ASSIGNMENT_FAILED).await;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["note"], "Node n status is now: CIDRAssignmentFailed");
        assert!(allocator.waiting.contains("n"));
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
        delivered(&requests, ASSIGNMENT_FAILED).await;
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
}
