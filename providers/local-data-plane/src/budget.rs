//! The data plane's file descriptors, shared out so that one client cannot take them all (issue #32: 600
//! idle connections to one VIP under a 1,024 open-files limit made every Service stop serving).
//!
//! A TCP connection costs two descriptors (toward the client and toward the backend), a UDP flow one.
//! Of the process's open-files limit:
//!
//! - a **reserve** (an eighth, at least 64) is never used here: it is the manager's, for its API and
//!   cloud connections and its HTTPS endpoint;
//! - of the rest (the **budget**), one listener may hold at most **half**;
//! - and one client address at most **half of a listener's share**.
//!
//! Past any of these a new connection is reset (a new flow's datagram dropped), and
//! `local_lb_refused_total{reason="descriptor_budget"}` counts it. So a client that holds as many
//! connections as it can to one VIP gets a quarter of the budget; other clients of that Service keep
//! the rest of its share, and every other Service keeps the other half and the reserve. Under a 1,024
//! limit: a reserve of 128, a budget of 896, 448 descriptors per listener (224 connections), 224 per
//! client address (112 connections). Under the usual 1,048,576: 458,752 per listener.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

/// The smallest reserve, whatever the limit.
const MIN_RESERVE: usize = 64;

/// The whole data plane's descriptors.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Descriptors the data plane may use in all.
    total: usize,
    used: AtomicUsize,
    /// The most one listener may use.
    listener_share: usize,
    /// The most one client address may use on one listener.
    address_share: usize,
}

impl Budget {
    /// The budget for an open-files limit of `limit`.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let reserve = (limit / 8).max(MIN_RESERVE);
        let total = limit.saturating_sub(reserve).max(4);
        let listener_share = (total / 2).max(2);
        Arc::new(Self {
            total,
            used: AtomicUsize::new(0),
            listener_share,
            address_share: (listener_share / 2).max(2),
        })
    }

    /// The budget for `configured`, or else this process's soft open-files limit (`RLIMIT_NOFILE`, read
    /// from `/proc/self/limits`; 1,024, the usual default, when it cannot be read).
    pub(crate) fn for_limit(configured: Option<u64>) -> Arc<Self> {
        Self::new(configured.unwrap_or_else(|| process_open_files_limit().unwrap_or(1024)))
    }

    /// Descriptors the data plane may use.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Descriptors in use.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, descriptors: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + descriptors <= self.total).then_some(used + descriptors)
            })
            .is_ok()
    }

    fn give_back(&self, descriptors: usize) {
        self.used.fetch_sub(descriptors, Ordering::AcqRel);
    }
}

/// The soft open-files limit of this process.
fn process_open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    match soft {
        "unlimited" => Some(u64::MAX),
        number => number.parse().ok(),
    }
}

/// One listener's part of the budget.
#[derive(Debug)]
pub(crate) struct ListenerBudget {
    budget: Arc<Budget>,
    open: Mutex<ListenerUse>,
}

#[derive(Debug, Default)]
struct ListenerUse {
    used: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl ListenerBudget {
    pub(crate) fn new(budget: Arc<Budget>) -> Arc<Self> {
        Arc::new(Self {
            budget,
            open: Mutex::default(),
        })
    }

    /// `descriptors` for a connection or flow from `address`, or `None` when a share (the address's,
    /// the listener's) or the whole budget is spent. Given back when the [`Claim`] is dropped.
    pub(crate) fn claim(self: &Arc<Self>, address: IpAddr, descriptors: usize) -> Option<Claim> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let from_address = open.by_address.get(&address).copied().unwrap_or(0);
        if from_address + descriptors > self.budget.address_share
            || open.used + descriptors > self.budget.listener_share
            || !self.budget.take(descriptors)
        {
            return None;
        }
        open.used += descriptors;
        *open.by_address.entry(address).or_default() += descriptors;
        Some(Claim {
            listener: self.clone(),
            address,
            descriptors,
        })
    }
}

/// Descriptors held by one connection or flow.
#[derive(Debug)]
pub(crate) struct Claim {
    listener: Arc<ListenerBudget>,
    address: IpAddr,
    descriptors: usize,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut open = self.listener.open.lock().unwrap_or_else(|e| e.into_inner());
        open.used = open.used.saturating_sub(self.descriptors);
        if let Some(count) = open.by_address.get_mut(&self.address) {
            *count = count.saturating_sub(self.descriptors);
            if *count == 0 {
                open.by_address.remove(&self.address);
            }
        }
        self.listener.budget.give_back(self.descriptors);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn shares_for_common_limits() {
        // (limit, budget, listener share, address share)
        let table = [
            (1024, 896, 448, 224),
            (256, 192, 96, 48),
            (1_048_576, 917_504, 458_752, 229_376),
            (10, 4, 2, 2),
        ];
        for (limit, total, listener, address) in table {
            let budget = Budget::new(limit);
            assert_eq!(
                (budget.total, budget.listener_share, budget.address_share),
                (total, listener, address),
                "limit {limit}"
            );
        }
    }

    #[test]
    fn one_address_gets_its_share_then_others_the_listener_s_then_other_listeners_the_rest() {
        // Budget 192: 96 per listener, 48 per address.
        let budget = Budget::new(256);
        let first = ListenerBudget::new(budget.clone());
        let second = ListenerBudget::new(budget.clone());
        let mut held = Vec::new();
        while let Some(claim) = first.claim(ip(1), 2) {
            held.push(claim);
        }
        assert_eq!(
            held.len(),
            24,
            "one address: 48 descriptors, 24 connections"
        );
        while let Some(claim) = first.claim(ip(2), 2) {
            held.push(claim);
        }
        assert_eq!(held.len(), 48, "the listener's share: 96 descriptors");
        assert!(first.claim(ip(3), 1).is_none(), "the listener is full");
        assert!(
            second.claim(ip(1), 2).is_some(),
            "another listener still serves"
        );
        assert_eq!(budget.used(), 96);
        held.truncate(10);
        assert!(
            first.claim(ip(3), 2).is_some(),
            "closed connections free their place"
        );
        drop(held);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_whole_budget_bounds_many_listeners() {
        // Budget 4 (limit 10): 2 per listener.
        let budget = Budget::new(10);
        let listeners: Vec<_> = (0..3)
            .map(|_| ListenerBudget::new(budget.clone()))
            .collect();
        let a = listeners[0].claim(ip(1), 2);
        let b = listeners[1].claim(ip(1), 2);
        assert!(a.is_some() && b.is_some());
        assert!(
            listeners[2].claim(ip(1), 1).is_none(),
            "the budget is spent"
        );
    }

    #[test]
    fn this_process_s_limit_is_read() {
        assert!(process_open_files_limit().is_some_and(|limit| limit > 0));
    }
}
