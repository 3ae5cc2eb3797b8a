//! Nodes waiting for pod CIDRs, each on its own back-off, and what each failed attempt tells.
//!
//! A node that could not get its CIDRs (the range is full, or the write failed) waits here. Its
//! **back-off steps** come [`FIRST_STEP`] (5 s) after the first failure, doubling to at most
//! [`MAX_STEP`] (5 min): at 0, 5, 15, 35, 75, 155, 315 s, then every 5 min. Each step retries the node
//! and tells it once on the node (an event); nothing else does. 5 min is upstream's cap for Services
//! (5 s doubling to 300 s) and the steady rate of client-go's event spam filter (one event per object per
//! 5 min): a node that waits an hour gets 17 events, where a retry every 5 s gave 720, and its event never
//! expires (the API server keeps events for an hour) while it waits.
//!
//! A full range does not empty itself: only a node's release frees a CIDR, and the controller sees every
//! release. So a release wakes the nodes waiting on a full range **at once**, oldest first, as many as
//! there is room for; such an early attempt that finds the range full again tells nothing and leaves the
//! node's back-off as it was. The steps only keep the node's event fresh (and retry what a release did
//! not reach).
//!
//! The range's being full is told **once** for the cluster (one log line, one event), by the first node
//! that finds it full while no other node waits on it; [`WaitList::full_ended`] says when the last of
//! them has left, so the next time the range fills it is told again.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::cached_node::CachedNode;

/// The wait before a waiting node's second step.
pub const FIRST_STEP: Duration = Duration::from_secs(5);
/// The longest wait between two steps.
pub const MAX_STEP: Duration = Duration::from_secs(300);

/// The wait after a node's `steps`-th step (1 for its first failure): [`FIRST_STEP`] × 2^(steps − 1), at
/// most [`MAX_STEP`].
pub fn step_delay(steps: u32) -> Duration {
    let factor = 2u32.saturating_pow(steps.saturating_sub(1));
    FIRST_STEP.saturating_mul(factor).min(MAX_STEP)
}

/// Why a node waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No CIDR left in a cluster CIDR (`CIDRNotAvailable`).
    Exhausted,
    /// The write of its CIDRs failed (`CIDRAssignmentFailed`).
    WriteFailed,
}

/// Which attempt for a node this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The node was not waiting (or a new node took the name of one that was).
    First,
    /// Its back-off step is due.
    Step,
    /// Before its step: a CIDR was freed, or the node changed.
    Early,
}

/// What a failed attempt tells and does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Tell it on the node (one event; the log line is at debug level for a full range).
    pub tell_node: bool,
    /// Take a back-off step: the next attempt after the doubled wait.
    pub step: bool,
    /// Tell the cluster that the range is full (one log line, one event).
    pub announce_full: bool,
}

/// What a failed attempt of kind `attempt` for `cause` tells and does; `full_told`: whether the range's
/// being full is already told (a node waiting on it was told first).
pub fn decide(cause: Cause, attempt: Attempt, full_told: bool) -> Decision {
    let exhausted = cause == Cause::Exhausted;
    // An early attempt for a full range is only a release that came too late or a change of the node:
    // nothing new to tell. A write that failed made an API call, whichever attempt it was.
    let step = !(exhausted && attempt == Attempt::Early);
    Decision {
        tell_node: step,
        step,
        announce_full: exhausted && !full_told,
    }
}

/// What [`WaitList::failed`] decided and what follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// What to tell.
    pub decision: Decision,
    /// The node's back-off steps so far.
    pub steps: u32,
    /// When its next step is due.
    pub next_step: Instant,
}

#[derive(Debug)]
struct Entry {
    /// The latest view of the node.
    node: Arc<CachedNode>,
    cause: Cause,
    steps: u32,
    due: Instant,
    /// When it started waiting, as a count: the oldest waiter is woken first.
    arrival: u64,
}

/// The nodes waiting for CIDRs, by name.
#[derive(Debug, Default)]
pub struct WaitList {
    entries: BTreeMap<String, Entry>,
    arrivals: u64,
    /// How many entries wait on a full range.
    exhausted: usize,
    /// Whether the range's being full was told and no node has stopped waiting on it since.
    full_told: bool,
}

impl WaitList {
    /// How many nodes wait.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no node waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many nodes wait on a full range.
    #[cfg(test)]
    pub fn exhausted(&self) -> usize {
        self.exhausted
    }

    /// Whether `name` waits.
    #[cfg(test)]
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Which attempt an attempt for `node` at `now` is.
    pub fn attempt(&self, node: &CachedNode, now: Instant) -> Attempt {
        match self.entries.get(&node.name_any()) {
            Some(entry) if entry.node.uid() == node.uid() => {
                if entry.due <= now {
                    Attempt::Step
                } else {
                    Attempt::Early
                }
            }
            _ => Attempt::First,
        }
    }

    /// `node` could not get its CIDRs for `cause` on `attempt` at `now`: it waits (on its latest view),
    /// stepping its back-off when the decision says so. `cap` shortens the next wait (an API outage: see
    /// `controllers::outage`).
    pub fn failed(
        &mut self,
        node: Arc<CachedNode>,
        cause: Cause,
        attempt: Attempt,
        now: Instant,
        cap: Option<Duration>,
    ) -> Waiting {
        let decision = decide(cause, attempt, self.full_told && self.exhausted > 0);
        let name = node.name_any();
        let previous = self
            .remove_entry(&name)
            .filter(|_| attempt != Attempt::First);
        let arrival = previous.as_ref().map_or_else(
            || {
                self.arrivals += 1;
                self.arrivals
            },
            |p| p.arrival,
        );
        let (mut steps, mut due) = previous.as_ref().map_or((0, now), |p| (p.steps, p.due));
        if decision.step {
            steps = steps.saturating_add(1);
            let wait = step_delay(steps);
            due = now + cap.map_or(wait, |cap| wait.min(cap));
        }
        if decision.announce_full {
            self.full_told = true;
        }
        if cause == Cause::Exhausted {
            self.exhausted += 1;
        }
        self.entries.insert(
            name,
            Entry {
                node,
                cause,
                steps,
                due,
                arrival,
            },
        );
        Waiting {
            decision,
            steps,
            next_step: due,
        }
    }

    /// `name` waits no more (it holds CIDRs, or is gone); `true` if it waited.
    pub fn remove(&mut self, name: &str) -> bool {
        self.remove_entry(name).is_some()
    }

    /// Removes `node` if it is the one waiting under its name (a deletion of an older node of that name
    /// leaves a newer one waiting).
    pub fn forget(&mut self, node: &Node) {
        let name = node.name_any();
        if self
            .entries
            .get(&name)
            .is_some_and(|entry| entry.node.uid() == node.uid())
        {
            self.remove_entry(&name);
        }
    }

    fn remove_entry(&mut self, name: &str) -> Option<Entry> {
        let entry = self.entries.remove(name)?;
        if entry.cause == Cause::Exhausted {
            self.exhausted -= 1;
        }
        Some(entry)
    }

    /// `true` once, when the range's being full was told and no node waits on it any more (so the next
    /// node that finds it full tells it again).
    pub fn full_ended(&mut self) -> bool {
        if self.full_told && self.exhausted == 0 {
            self.full_told = false;
            return true;
        }
        false
    }

    /// When the next step of any node is due.
    pub fn next_step(&self) -> Option<Instant> {
        self.entries.values().map(|entry| entry.due).min()
    }

    /// The nodes whose step is due at `now`, oldest waiter first.
    pub fn due(&self, now: Instant) -> Vec<Arc<CachedNode>> {
        self.in_order(|entry| entry.due <= now)
    }

    /// The nodes waiting on a full range, oldest waiter first (whom a freed CIDR goes to).
    pub fn waiting_on_room(&self) -> Vec<Arc<CachedNode>> {
        self.in_order(|entry| entry.cause == Cause::Exhausted)
    }

    fn in_order(&self, keep: impl Fn(&Entry) -> bool) -> Vec<Arc<CachedNode>> {
        let mut entries: Vec<&Entry> = self.entries.values().filter(|e| keep(e)).collect();
        entries.sort_by_key(|entry| entry.arrival);
        entries
            .into_iter()
            .map(|entry| entry.node.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn node(name: &str, uid: &str) -> Arc<CachedNode> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "uid": uid }
            }))
            .unwrap(),
        )
    }

    fn names(nodes: &[Arc<CachedNode>]) -> Vec<String> {
        nodes.iter().map(|n| n.name_any()).collect()
    }

    #[test]
    fn steps_double_from_5_s_to_5_min() {
        let table = [
            (0, 5),
            (1, 5),
            (2, 10),
            (3, 20),
            (4, 40),
            (5, 80),
            (6, 160),
            (7, 300),
            (8, 300),
            (40, 300),
            (u32::MAX, 300),
        ];
        for (steps, wait) in table {
            assert_eq!(step_delay(steps), secs(wait), "after step {steps}");
        }
    }

    #[test]
    fn what_each_failed_attempt_tells() {
        use Attempt::*;
        use Cause::*;
        // (cause, attempt, full already told) → (tell the node, step, tell the cluster)
        let table = [
            (Exhausted, First, false, (true, true, true)),
            (Exhausted, First, true, (true, true, false)),
            (Exhausted, Step, true, (true, true, false)),
            (Exhausted, Step, false, (true, true, true)),
            (Exhausted, Early, true, (false, false, false)),
            (Exhausted, Early, false, (false, false, true)),
            (WriteFailed, First, false, (true, true, false)),
            (WriteFailed, Step, true, (true, true, false)),
            (WriteFailed, Early, true, (true, true, false)),
        ];
        for (cause, attempt, told, (tell_node, step, announce_full)) in table {
            assert_eq!(
                decide(cause, attempt, told),
                Decision {
                    tell_node,
                    step,
                    announce_full
                },
                "{cause:?} {attempt:?} told={told}"
            );
        }
    }

    #[test]
    fn a_node_on_a_full_range_steps_at_5_15_35_75_155_315_s_then_every_5_min() {
        let start = Instant::now();
        let mut list = WaitList::default();
        let a = node("a", "uid-a");
        let mut told = Vec::new();
        let mut at = start;
        // Attempts every second for an hour, as a retry every tick would make.
        while at <= start + secs(3600) {
            let attempt = list.attempt(&a, at);
            let waiting = list.failed(a.clone(), Cause::Exhausted, attempt, at, None);
            if waiting.decision.tell_node {
                told.push((at - start).as_secs());
            }
            at += secs(1);
        }
        assert_eq!(
            told[..9],
            [0, 5, 15, 35, 75, 155, 315, 615, 915],
            "the steps"
        );
        assert_eq!(told.len(), 17, "events in an hour: {told:?}");
    }

    #[test]
    fn the_full_range_is_told_once_until_no_node_waits_on_it() {
        let now = Instant::now();
        let mut list = WaitList::default();
        let first = list.failed(node("a", "1"), Cause::Exhausted, Attempt::First, now, None);
        assert!(first.decision.announce_full);
        for name in ["b", "c"] {
            let later = list.failed(
                node(name, name),
                Cause::Exhausted,
                Attempt::First,
                now,
                None,
            );
            assert!(!later.decision.announce_full, "{name}");
            assert!(later.decision.tell_node);
        }
        assert!(!list.full_ended());
        assert!(list.remove("a"));
        assert!(list.remove("b"));
        assert!(!list.full_ended(), "c still waits");
        // A node that stops waiting on the range (it found room, but its write failed) ends it too.
        let c = list.waiting_on_room().remove(0);
        let failed = list.failed(c, Cause::WriteFailed, Attempt::Early, now, None);
        assert!(!failed.decision.announce_full);
        assert_eq!(list.exhausted(), 0);
        assert!(list.full_ended());
        assert!(!list.full_ended(), "said once");
        // Full again: told again.
        let again = list.failed(node("d", "d"), Cause::Exhausted, Attempt::First, now, None);
        assert!(again.decision.announce_full);
    }

    #[test]
    fn early_attempts_keep_the_back_off_and_the_latest_view() {
        let start = Instant::now();
        let mut list = WaitList::default();
        let a = node("a", "1");
        let first = list.failed(a.clone(), Cause::Exhausted, Attempt::First, start, None);
        assert_eq!((first.steps, first.next_step), (1, start + secs(5)));
        assert_eq!(list.attempt(&a, start + secs(4)), Attempt::Early);
        let early = list.failed(
            a.clone(),
            Cause::Exhausted,
            Attempt::Early,
            start + secs(4),
            None,
        );
        assert_eq!((early.steps, early.next_step), (1, start + secs(5)));
        assert_eq!(list.attempt(&a, start + secs(5)), Attempt::Step);
        assert_eq!(list.next_step(), Some(start + secs(5)));
        // A new node under the name starts afresh.
        assert_eq!(
            list.attempt(&node("a", "2"), start + secs(5)),
            Attempt::First
        );
        // A write that failed for want of an API server is retried within the cap.
        let step = list.failed(
            a,
            Cause::WriteFailed,
            Attempt::Step,
            start + secs(5),
            Some(secs(5)),
        );
        assert_eq!((step.steps, step.next_step), (2, start + secs(10)));
    }

    #[test]
    fn the_oldest_waiters_come_first_and_a_stale_deletion_leaves_a_newer_node() {
        let now = Instant::now();
        let mut list = WaitList::default();
        for name in ["c", "a", "b"] {
            list.failed(
                node(name, name),
                Cause::Exhausted,
                Attempt::First,
                now,
                None,
            );
        }
        list.failed(
            node("w", "w"),
            Cause::WriteFailed,
            Attempt::First,
            now,
            None,
        );
        // "c" tries early again: it keeps its place.
        list.failed(node("c", "c"), Cause::Exhausted, Attempt::Early, now, None);
        assert_eq!(names(&list.waiting_on_room()), ["c", "a", "b"]);
        assert_eq!(names(&list.due(now + secs(5))), ["c", "a", "b", "w"]);
        assert!(list.due(now + secs(4)).is_empty());
        list.forget(&node("a", "older"));
        assert!(list.contains("a"));
        list.forget(&node("a", "a"));
        assert!(!list.contains("a"));
        assert_eq!((list.len(), list.exhausted()), (3, 2));
    }
}
