//! The cache of delegated-auth answers: bounded in entries and in age, so a flood of new tokens or
//! identities can neither grow it without end nor cost more than O(1) per insert.
//!
//! Every entry lives for the same TTL (upstream's 10 s for both answers), so the order entries were
//! inserted in is the order they expire in: a queue of insertions is enough to drop the expired ones and,
//! when the cache is full, the oldest (upstream's webhook authorizer keeps an LRU of 8,192 entries).

use parking_lot::Mutex;
use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    time::{Duration, Instant},
};

/// Answers kept for `ttl`, at most `capacity` of them.
pub struct ExpiringCache<K, V> {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<Entries<K, V>>,
}

struct Entries<K, V> {
    /// The answer and when it was stored.
    map: HashMap<K, (Instant, V)>,
    /// Keys in the order they were stored (a key stored again is queued again; the stale queue entry is
    /// skipped when it comes up, by its time).
    order: VecDeque<(Instant, K)>,
}

impl<K: Hash + Eq + Clone, V: Clone> ExpiringCache<K, V> {
    /// An empty cache of at most `capacity` answers, each kept for `ttl`.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            entries: Mutex::new(Entries {
                map: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// The answer stored for `key`, unless it is older than the TTL.
    pub fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock();
        entries
            .map
            .get(key)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, value)| value.clone())
    }

    /// Stores `value` for `key`, dropping expired answers and, when full, the oldest.
    pub fn insert(&self, key: K, value: V) {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let Entries { map, order } = &mut *entries;
        while let Some((at, _)) = order.front() {
            let expired = now.saturating_duration_since(*at) >= self.ttl;
            if !expired && map.len() < self.capacity {
                break;
            }
            if let Some((at, old)) = order.pop_front()
                && map.get(&old).is_some_and(|(stored, _)| *stored == at)
            {
                map.remove(&old);
            }
        }
        order.push_back((now, key.clone()));
        map.insert(key, (now, value));
    }

    /// How many answers are stored (expired ones included until an insert drops them).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_expire_after_the_ttl() {
        let cache = ExpiringCache::new(Duration::from_millis(50), 10);
        cache.insert("a", 1);
        assert_eq!(cache.get(&"a"), Some(1));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get(&"a"), None);
        cache.insert("b", 2);
        assert_eq!(
            cache.len(),
            1,
            "the expired answer went with the next insert"
        );
    }

    #[test]
    fn a_full_cache_drops_its_oldest_answer() {
        let cache = ExpiringCache::new(Duration::from_secs(60), 3);
        for (key, value) in [("a", 1), ("b", 2), ("c", 3), ("d", 4)] {
            cache.insert(key, value);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&"a"), None);
        assert_eq!(cache.get(&"d"), Some(4));
    }

    #[test]
    fn a_key_stored_again_keeps_its_newest_answer() {
        let cache = ExpiringCache::new(Duration::from_secs(60), 2);
        cache.insert("a", 1);
        cache.insert("a", 2);
        // The first "a" in the queue is stale: dropping it must not drop the newer answer.
        cache.insert("b", 3);
        assert_eq!(cache.get(&"a"), Some(2));
        assert_eq!(cache.get(&"b"), Some(3));
        cache.insert("c", 4);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&"c"), Some(4));
    }

    #[test]
    fn a_flood_of_new_keys_stays_within_the_capacity() {
        let cache = ExpiringCache::new(Duration::from_secs(60), 8192);
        for n in 0..100_000u32 {
            cache.insert(n, ());
        }
        assert_eq!(cache.len(), 8192);
        assert!(cache.get(&99_999).is_some());
    }
}
