//! Look-ups by key coalesced while the cloud is busy: at most a set number of calls at a time per kind
//! of look-up (one for the load balancers'); a caller that finds room makes its call at once, alone
//! (no added latency when idle), and the callers that come while the calls are under way gather into
//! the next call, up to a cap (20 names per `DescribeLoadBalancers`). So 16 Service syncs, or a group
//! of drift checks, that each look up their load balancer make two or three calls between them instead
//! of sixteen, and a lone sync still makes one call at once.
//!
//! Written here rather than taken from a crate: the batching crates (`dataloader`, `batched-fn`) gather
//! for a fixed window or run the batch on a task of their own. Here the caller at the head of a batch
//! makes the call itself, so it stays on the caller's call path (a preview's read-only path and its
//! budget, a sync's leadership fence) and in its tracing span, and a cancelled caller hands its place
//! on without leaving the others waiting.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    future::Future,
    sync::Arc,
};

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use crate::error::{Error, Result};

/// What one call answered: the values found, by key (a key without a value was not found).
type Answer<K, V> = std::result::Result<Arc<BTreeMap<K, V>>, Error>;

/// Coalesces look-ups by key of one kind (see the module's documentation).
pub struct Coalescer<K, V> {
    max_keys: usize,
    max_in_flight: usize,
    state: Mutex<State<K, V>>,
}

/// A batch waiting for its turn: its keys, where its answer will be, and how its leader is told to go.
struct Waiting<K, V> {
    id: u64,
    keys: BTreeSet<K>,
    answer: watch::Receiver<Option<Answer<K, V>>>,
    go: oneshot::Sender<BTreeSet<K>>,
}

struct State<K, V> {
    /// Calls under way (each leader releases its turn when its call ends, or when it is dropped).
    in_flight: usize,
    /// The batches waiting, oldest first; callers join the newest while it has room.
    waiting: VecDeque<Waiting<K, V>>,
    next_id: u64,
}

impl<K, V> State<K, V> {
    /// The call under way ended: the oldest waiting batch goes next (the turn passes to its leader,
    /// who releases it in turn), else nothing is under way.
    fn release(&mut self) {
        match self.waiting.pop_front() {
            // A leader that is gone by now releases the turn from its guard's drop.
            Some(next) => drop(next.go.send(next.keys)),
            None => self.in_flight -= 1,
        }
    }
}

/// How a caller takes part.
enum Role<K, V> {
    /// Makes the call for `keys` now.
    Lead(BTreeSet<K>),
    /// Leads batch `id` when its turn comes, answering through `answer`.
    LeadLater {
        id: u64,
        go: oneshot::Receiver<BTreeSet<K>>,
    },
    /// Joined a waiting batch: its answer comes here.
    Join(watch::Receiver<Option<Answer<K, V>>>),
}

/// A leader's hold on the coalescer: while queued, dropping it takes the batch out of the queue (its
/// joiners then ask alone); once it has the turn, dropping it passes the turn on.
struct Turn<'a, K, V> {
    coalescer: &'a Coalescer<K, V>,
    queued: Option<u64>,
}

impl<K, V> Drop for Turn<'_, K, V> {
    fn drop(&mut self) {
        let mut state = self.coalescer.state.lock();
        if let Some(id) = self.queued
            && let Some(at) = state.waiting.iter().position(|w| w.id == id)
        {
            state.waiting.remove(at);
            return;
        }
        state.release();
    }
}

impl<K: Ord + Clone, V: Clone> Coalescer<K, V> {
    /// A coalescer putting at most `max_keys` keys in one call, with at most `max_in_flight` calls
    /// under way at once.
    pub fn new(max_keys: usize, max_in_flight: usize) -> Self {
        Self {
            max_keys: max_keys.max(1),
            max_in_flight: max_in_flight.max(1),
            state: Mutex::new(State {
                in_flight: 0,
                waiting: VecDeque::new(),
                next_id: 0,
            }),
        }
    }

    /// The value for `key`, `None` when the cloud has none. `describe` makes one call for the keys it is
    /// given (this caller's batch, or this key alone) and answers what it found by key.
    pub async fn get<F, Fut>(&self, key: K, describe: F) -> Result<Option<V>>
    where
        F: FnOnce(Vec<K>) -> Fut,
        Fut: Future<Output = Result<BTreeMap<K, V>>>,
    {
        let (answer_tx, answer_rx) = watch::channel(None);
        let role = self.take_part(&key, answer_rx);
        let found = match role {
            Role::Join(mut answer) => {
                let joined = answer
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .map(|answer| answer.clone().unwrap_or_else(unreachable_answer));
                match joined {
                    Some(answer) => answer,
                    // The batch's leader was cancelled before it answered: ask alone.
                    None => describe(vec![key.clone()]).await.map(Arc::new),
                }
            }
            Role::Lead(keys) => {
                let _turn = Turn {
                    coalescer: self,
                    queued: None,
                };
                describe(keys.into_iter().collect()).await.map(Arc::new)
            }
            Role::LeadLater { id, go } => {
                let mut turn = Turn {
                    coalescer: self,
                    queued: Some(id),
                };
                // The sender is only dropped with the coalescer, which this borrow outlives.
                let keys = go.await.unwrap_or_else(|_| BTreeSet::from([key.clone()]));
                turn.queued = None;
                let answer = describe(keys.into_iter().collect()).await.map(Arc::new);
                answer_tx.send_replace(Some(answer.clone()));
                answer
            }
        };
        Ok(found?.get(&key).cloned())
    }

    /// Under the lock: lead at once when nothing is under way, else join the newest waiting batch
    /// with room, else open a new one.
    fn take_part(&self, key: &K, answer: watch::Receiver<Option<Answer<K, V>>>) -> Role<K, V> {
        let mut state = self.state.lock();
        if state.in_flight < self.max_in_flight {
            state.in_flight += 1;
            return Role::Lead(BTreeSet::from([key.clone()]));
        }
        if let Some(newest) = state.waiting.back_mut()
            && (newest.keys.len() < self.max_keys || newest.keys.contains(key))
            && newest.answer.has_changed().is_ok()
        {
            newest.keys.insert(key.clone());
            return Role::Join(newest.answer.clone());
        }
        let id = state.next_id;
        state.next_id += 1;
        let (go, go_rx) = oneshot::channel();
        state.waiting.push_back(Waiting {
            id,
            keys: BTreeSet::from([key.clone()]),
            answer,
            go,
        });
        Role::LeadLater { id, go: go_rx }
    }
}

/// A joiner is woken only once its batch's answer is set.
fn unreachable_answer<K, V>() -> Answer<K, V> {
    Err(Error::Setup(
        "a coalesced look-up woke without an answer".into(),
    ))
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    use super::*;

    /// A fake cloud: every call is recorded with its keys and takes `delay`; key `"gone"` has no value.
    #[derive(Default)]
    struct Cloud {
        calls: Mutex<Vec<Vec<String>>>,
        delay: Duration,
    }

    impl Cloud {
        async fn describe(&self, keys: Vec<String>) -> Result<BTreeMap<String, usize>> {
            self.calls.lock().push(keys.clone());
            tokio::time::sleep(self.delay).await;
            Ok(keys
                .into_iter()
                .filter(|k| k != "gone")
                .map(|k| (k.clone(), k.len()))
                .collect())
        }
    }

    fn cloud(delay_ms: u64) -> Arc<Cloud> {
        Arc::new(Cloud {
            delay: Duration::from_millis(delay_ms),
            ..Cloud::default()
        })
    }

    #[tokio::test]
    async fn a_lone_look_up_is_one_call_made_at_once() {
        let cloud = cloud(0);
        let coalescer = Coalescer::new(20, 1);
        let found = coalescer
            .get("lb-1".to_string(), |keys| cloud.describe(keys))
            .await
            .unwrap();
        assert_eq!(found, Some(4));
        let missing = coalescer
            .get("gone".to_string(), |keys| cloud.describe(keys))
            .await
            .unwrap();
        assert_eq!(missing, None);
        assert_eq!(
            *cloud.calls.lock(),
            vec![vec!["lb-1".to_string()], vec!["gone".to_string()]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn look_ups_made_while_one_is_under_way_share_the_next_call_up_to_the_cap() {
        let cloud = cloud(100);
        let coalescer = Arc::new(Coalescer::new(3, 1));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..8 {
            let (cloud, coalescer) = (cloud.clone(), coalescer.clone());
            tasks.spawn(async move {
                let key = format!("lb-{i}");
                let found = coalescer
                    .get(key.clone(), |keys| cloud.describe(keys))
                    .await;
                (key, found.unwrap())
            });
            // The first starts its call before the others come.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while let Some(done) = tasks.join_next().await {
            let (key, found) = done.unwrap();
            assert_eq!(found, Some(key.len()), "{key}");
        }
        let calls = cloud.calls.lock().clone();
        // lb-0 alone at once; the 7 that came while it was under way in batches of at most 3, one
        // call at a time.
        assert_eq!(calls[0], vec!["lb-0".to_string()]);
        assert_eq!(calls.len(), 4, "{calls:?}");
        assert!(calls.iter().all(|c| c.len() <= 3), "{calls:?}");
        let mut all: Vec<String> = calls.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_leader_neither_strands_its_batch_nor_the_next() {
        let cloud = cloud(100);
        let coalescer = Arc::new(Coalescer::new(20, 1));
        let calls_made = Arc::new(AtomicUsize::new(0));
        // Under way: lb-0.
        let first = {
            let (cloud, coalescer) = (cloud.clone(), coalescer.clone());
            tokio::spawn(async move {
                coalescer
                    .get("lb-0".to_string(), |k| cloud.describe(k))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        // lb-1 leads the next batch, lb-2 joins it; then lb-1 is cancelled before its turn.
        let leader = {
            let (cloud, coalescer) = (cloud.clone(), coalescer.clone());
            tokio::spawn(async move {
                coalescer
                    .get("lb-1".to_string(), |k| cloud.describe(k))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let joiner = {
            let (cloud, coalescer, calls_made) =
                (cloud.clone(), coalescer.clone(), calls_made.clone());
            tokio::spawn(async move {
                coalescer
                    .get("lb-22".to_string(), |k| {
                        calls_made.fetch_add(1, Ordering::SeqCst);
                        cloud.describe(k)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        leader.abort();
        assert_eq!(joiner.await.unwrap().unwrap(), Some(5));
        assert_eq!(
            calls_made.load(Ordering::SeqCst),
            1,
            "the joiner asked alone"
        );
        assert_eq!(first.await.unwrap().unwrap(), Some(4));
        // Nothing is left holding the turn: a new look-up goes at once.
        let later = tokio::time::timeout(
            Duration::from_millis(150),
            coalescer.get("lb-3".to_string(), |k| cloud.describe(k)),
        )
        .await
        .expect("the turn was passed on");
        assert_eq!(later.unwrap(), Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_fails_every_look_up_in_it() {
        let coalescer = Arc::new(Coalescer::<String, usize>::new(20, 1));
        let busy = {
            let coalescer = coalescer.clone();
            tokio::spawn(async move {
                coalescer
                    .get("lb-0".to_string(), |_| async {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok(BTreeMap::new())
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let fail = |_: Vec<String>| async { Err(Error::Setup("throttled for good".into())) };
        let (a, b) = tokio::join!(
            coalescer.get("lb-1".to_string(), fail),
            coalescer.get("lb-2".to_string(), fail)
        );
        assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
        assert_eq!(busy.await.unwrap().unwrap(), None);
    }
}
