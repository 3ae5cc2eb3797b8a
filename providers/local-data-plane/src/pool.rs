//! A listener's backends and how one is picked: round robin over the healthy ones, with ClientIP
//! affinity kept in a map with expiry. Picking happens once per connection (TCP) or flow (UDP), never
//! per byte or datagram.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::budget::ListenerBudget;
use crate::health::Probe;
use crate::spec::ListenerSpec;

/// One backend of one listener: `node address:node_port`.
#[derive(Debug)]
pub(crate) struct BackendEntry {
    pub(crate) node: String,
    pub(crate) addr: SocketAddr,
    /// `None`: no health check, always healthy.
    pub(crate) probe: Option<Arc<Probe>>,
    /// Connections (or UDP flows) open to it through this listener.
    pub(crate) active: AtomicU64,
}

impl BackendEntry {
    pub(crate) fn new(node: String, addr: SocketAddr, probe: Option<Arc<Probe>>) -> Self {
        BackendEntry {
            node,
            addr,
            probe,
            active: AtomicU64::new(0),
        }
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.probe.as_ref().is_none_or(|probe| probe.is_healthy())
    }

    /// Same backend, same check: an update keeps the entry (and its connection count).
    pub(crate) fn same_as(&self, node: &str, addr: SocketAddr, probe: &Option<Arc<Probe>>) -> bool {
        self.node == node
            && self.addr == addr
            && match (&self.probe, probe) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

/// What a listener does with a connection; replaced as a whole by `apply`.
#[derive(Debug)]
pub(crate) struct ListenerConfig {
    /// The port on the backends (the listener's spec may have had another when it was bound).
    pub(crate) node_port: u16,
    pub(crate) backends: Vec<Arc<BackendEntry>>,
    pub(crate) source_ranges: Vec<ipnet::IpNet>,
    pub(crate) proxy_protocol: bool,
    pub(crate) affinity: Option<Duration>,
}

impl ListenerConfig {
    pub(crate) fn allows(&self, source: IpAddr) -> bool {
        self.source_ranges.is_empty() || self.source_ranges.iter().any(|net| net.contains(&source))
    }
}

/// Counters of one listener (read by the metrics collector).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) connections: AtomicU64,
    pub(crate) active: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) refused_source: AtomicU64,
    pub(crate) refused_no_backend: AtomicU64,
    /// Refused for want of descriptors (the client address's, the listener's or the data plane's).
    pub(crate) refused_budget: AtomicU64,
    pub(crate) backend_connect_errors: AtomicU64,
    /// TCP connections closed by the idle timeout.
    pub(crate) idle_timeouts: AtomicU64,
}

/// Shared between a listener's accept loop, its connections, `apply` and the metrics.
#[derive(Debug)]
pub(crate) struct ListenerShared {
    pub(crate) load_balancer: Arc<str>,
    pub(crate) spec: ListenerSpec,
    pub(crate) label: String,
    config: RwLock<Arc<ListenerConfig>>,
    /// Bumped by each [`ListenerShared::set_config`], so that a UDP relay re-reads the configuration
    /// only when it changed (one atomic load per datagram, no lock).
    config_version: AtomicU64,
    next: AtomicUsize,
    affinity: Mutex<AffinityTable>,
    pub(crate) stats: Stats,
    /// This listener's part of the descriptors.
    pub(crate) budget: Arc<ListenerBudget>,
}

impl ListenerShared {
    pub(crate) fn new(
        load_balancer: Arc<str>,
        spec: ListenerSpec,
        config: ListenerConfig,
        budget: Arc<ListenerBudget>,
    ) -> Self {
        ListenerShared {
            load_balancer,
            label: spec.to_string(),
            spec,
            config: RwLock::new(Arc::new(config)),
            config_version: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            affinity: Mutex::new(AffinityTable::default()),
            stats: Stats::default(),
            budget,
        }
    }

    /// The current configuration (one uncontended read lock and an `Arc` clone per connection).
    pub(crate) fn config(&self) -> Arc<ListenerConfig> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The configuration, if it changed since version `seen` (and its version): what a relay that keeps
    /// its own copy calls per datagram.
    pub(crate) fn config_since(&self, seen: u64) -> Option<(u64, Arc<ListenerConfig>)> {
        let version = self.config_version.load(Ordering::Acquire);
        (version != seen).then(|| (version, self.config()))
    }

    pub(crate) fn set_config(&self, config: ListenerConfig) {
        let affinity_off = config.affinity.is_none();
        {
            let mut current = self.config.write().unwrap_or_else(|e| e.into_inner());
            *current = Arc::new(config);
            // Under the write lock: a reader that sees the new version reads the new configuration.
            self.config_version.fetch_add(1, Ordering::Release);
        }
        if affinity_off {
            self.affinity
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
    }

    /// A healthy backend for `client`, not one of `exclude` (backends that just failed to connect).
    pub(crate) fn pick(
        &self,
        config: &ListenerConfig,
        client: IpAddr,
        exclude: &[SocketAddr],
    ) -> Option<Arc<BackendEntry>> {
        let usable = |b: &BackendEntry| b.is_healthy() && !exclude.contains(&b.addr);
        let Some(timeout) = config.affinity else {
            return self.round_robin(config, usable);
        };
        let now = Instant::now();
        let mut table = self.affinity.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((addr, expires)) = table.entries.get(&client).copied()
            && expires > now
            && let Some(backend) = config.backends.iter().find(|b| b.addr == addr && usable(b))
        {
            table.entries.insert(client, (addr, now + timeout));
            return Some(backend.clone());
        }
        let backend = self.round_robin(config, usable)?;
        table.insert(client, backend.addr, now, timeout);
        Some(backend)
    }

    fn round_robin(
        &self,
        config: &ListenerConfig,
        usable: impl Fn(&BackendEntry) -> bool,
    ) -> Option<Arc<BackendEntry>> {
        let n = config.backends.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| &config.backends[start.wrapping_add(i) % n])
            .find(|b| usable(b))
            .cloned()
    }
}

/// The most clients one listener remembers for ClientIP affinity. Past it (many clients, spoofed UDP
/// sources), new clients are served round robin without being remembered until entries expire.
pub(crate) const MAX_AFFINITY_ENTRIES: usize = 65_536;

/// Client IP → (backend address, expiry). Expired entries are swept when the table has doubled since
/// the last sweep, so it stays proportional to the clients seen within one timeout, and at most
/// [`MAX_AFFINITY_ENTRIES`] long.
#[derive(Debug, Default)]
struct AffinityTable {
    entries: HashMap<IpAddr, (SocketAddr, Instant)>,
    sweep_at: usize,
    /// When the full table was last swept (a full table is swept at most once a second).
    full_sweep: Option<Instant>,
}

impl AffinityTable {
    fn insert(&mut self, client: IpAddr, backend: SocketAddr, now: Instant, timeout: Duration) {
        if self.entries.len() >= MAX_AFFINITY_ENTRIES && !self.entries.contains_key(&client) {
            if self
                .full_sweep
                .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
            {
                return;
            }
            self.full_sweep = Some(now);
            self.entries.retain(|_, (_, expires)| *expires > now);
            if self.entries.len() >= MAX_AFFINITY_ENTRIES {
                return;
            }
        }
        self.entries.insert(client, (backend, now + timeout));
        if self.entries.len() > self.sweep_at.max(1024) {
            self.entries.retain(|_, (_, expires)| *expires > now);
            self.sweep_at = self.entries.len() * 2;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.sweep_at = 0;
        self.full_sweep = None;
    }
}

/// Counts a connection (or flow) as active on its listener and backend while alive.
pub(crate) struct ActiveGuard {
    shared: Arc<ListenerShared>,
    backend: Arc<BackendEntry>,
}

impl ActiveGuard {
    pub(crate) fn new(shared: Arc<ListenerShared>, backend: Arc<BackendEntry>) -> Self {
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        shared.stats.active.fetch_add(1, Ordering::Relaxed);
        backend.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard { shared, backend }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.shared.stats.active.fetch_sub(1, Ordering::Relaxed);
        self.backend.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_affinity_table_stops_growing_at_its_cap_and_frees_expired_entries() {
        let mut table = AffinityTable::default();
        let backend: SocketAddr = "127.0.0.1:30080".parse().unwrap();
        let start = Instant::now();
        let timeout = Duration::from_secs(10);
        let client = |n: u32| IpAddr::from(std::net::Ipv6Addr::from(u128::from(n) + 1));
        for n in 0..MAX_AFFINITY_ENTRIES as u32 {
            table.insert(client(n), backend, start, timeout);
        }
        assert_eq!(table.entries.len(), MAX_AFFINITY_ENTRIES);
        // Full, nothing expired: a new client is not remembered; a known one is refreshed.
        table.insert(client(u32::MAX - 1), backend, start, timeout);
        assert_eq!(table.entries.len(), MAX_AFFINITY_ENTRIES);
        assert!(!table.entries.contains_key(&client(u32::MAX - 1)));
        table.insert(client(0), backend, start + Duration::from_secs(1), timeout);
        assert_eq!(table.entries[&client(0)].1, start + Duration::from_secs(11));
        // Once entries expire, a full table is swept (at most once a second) and takes new clients.
        let later = start + Duration::from_secs(20);
        table.insert(client(u32::MAX - 1), backend, later, timeout);
        assert!(table.entries.contains_key(&client(u32::MAX - 1)));
        assert!(table.entries.len() <= 2, "{}", table.entries.len());
    }
}
