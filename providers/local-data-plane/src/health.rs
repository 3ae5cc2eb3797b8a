//! HTTP health checks, shared by every load balancer that checks the same (address, port, path).
//!
//! The check is a hand-written HTTP/1.0 `GET` over a `TcpStream`: all it needs is the status code of
//! one response line, and a per-node agent should not carry an HTTP client stack (hyper, hyper-util,
//! http, their buffers and pools) for that. HTTP/1.0 with `Connection: close` keeps the exchange to one
//! request and one status line; the body is never read.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::spec::HealthCheckTiming;

/// What one probe checks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ProbeKey {
    pub(crate) addr: SocketAddr,
    pub(crate) path: String,
}

/// The health of one (address, port, path), kept current by a background task for as long as anyone
/// holds the `Arc<Probe>`.
#[derive(Debug)]
pub(crate) struct Probe {
    healthy: AtomicBool,
    /// `true` once the first check has finished.
    checked: watch::Sender<bool>,
}

impl Probe {
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Waits (at most `limit`) until the first check has a result.
    pub(crate) async fn first_result(&self, limit: Duration) {
        let mut rx = self.checked.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|checked| *checked)).await;
    }
}

/// Hands out shared probes.
#[derive(Debug)]
pub(crate) struct ProbeRegistry {
    timing: HealthCheckTiming,
    probes: Mutex<HashMap<ProbeKey, Weak<Probe>>>,
}

impl ProbeRegistry {
    pub(crate) fn new(timing: HealthCheckTiming) -> Self {
        ProbeRegistry {
            timing,
            probes: Mutex::new(HashMap::new()),
        }
    }

    /// The probe of `key`, started if nobody checks it yet.
    pub(crate) fn get(&self, key: &ProbeKey) -> Arc<Probe> {
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(probe) = probes.get(key).and_then(Weak::upgrade) {
            return probe;
        }
        probes.retain(|_, probe| probe.strong_count() > 0);
        // Unknown until the first check; `apply` waits for that first result, so a new backend that
        // fails its check never gets traffic, and one that passes gets it at once.
        let probe = Arc::new(Probe {
            healthy: AtomicBool::new(false),
            checked: watch::Sender::new(false),
        });
        probes.insert(key.clone(), Arc::downgrade(&probe));
        // Watched: `probing` starts the checks again after a panic (`restart::restarting`), until
        // the probe is let go.
        tokio::spawn(probing(
            Arc::downgrade(&probe),
            key.clone(),
            self.timing.clone(),
        ));
        probe
    }
}

/// Runs the probe's checks ([`run`]) until the last holder lets go, started again an interval later
/// should they panic (a bug): the backend's health would stay frozen at its last value otherwise, as
/// the registry hands out the same probe for as long as it is held.
async fn probing(probe: Weak<Probe>, key: ProbeKey, timing: HealthCheckTiming) {
    let wait = timing.interval.max(Duration::from_millis(1));
    let what = format!("the health checks of {}{}", key.addr, key.path);
    crate::restart::restarting(&crate::restart::HEALTH_CHECKS, &what, wait, || {
        (probe.strong_count() > 0).then(|| run(probe.clone(), key.clone(), timing.clone()))
    })
    .await
}

/// Checks until the last holder of the probe lets go.
async fn run(probe: Weak<Probe>, key: ProbeKey, timing: HealthCheckTiming) {
    let healthy_threshold = timing.healthy_threshold.max(1);
    let unhealthy_threshold = timing.unhealthy_threshold.max(1);
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: local-data-plane\r\nConnection: close\r\n\r\n",
        key.path, key.addr
    );
    let mut successes = 0u32;
    let mut failures = 0u32;
    let mut first = true;
    let mut ticker = tokio::time::interval(timing.interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if probe.strong_count() == 0 {
            return;
        }
        let ok = check(key.addr, request.as_bytes(), timing.timeout).await;
        let Some(probe) = probe.upgrade() else {
            return;
        };
        let was = probe.is_healthy();
        let now = if first {
            ok
        } else if ok {
            failures = 0;
            successes = successes.saturating_add(1);
            was || successes >= healthy_threshold
        } else {
            successes = 0;
            failures = failures.saturating_add(1);
            was && failures < unhealthy_threshold
        };
        if now != was {
            successes = 0;
            failures = 0;
            probe.healthy.store(now, Ordering::Relaxed);
            if !first {
                info!(backend = %key.addr, path = %key.path, healthy = now, "backend health changed");
            }
        }
        if first {
            debug!(backend = %key.addr, path = %key.path, healthy = now, "first health check");
            first = false;
            probe.checked.send_replace(true);
        }
    }
}

/// One check: connect, send the request, read the status line; healthy iff the status is 200.
async fn check(addr: SocketAddr, request: &[u8], timeout: Duration) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(request).await.ok()?;
        // "HTTP/1.1 200" is 12 bytes; read until we have them (or the peer closes).
        let mut buf = [0u8; 32];
        let mut len = 0;
        while len < 12 {
            let n = stream.read(&mut buf[len..]).await.ok()?;
            if n == 0 {
                break;
            }
            len += n;
        }
        Some(status_is_200(&buf[..len]))
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

fn status_is_200(line: &[u8]) -> bool {
    line.len() >= 12
        && line.starts_with(b"HTTP/1.")
        && line[8] == b' '
        && &line[9..12] == b"200"
        && line.get(12).is_none_or(|b| *b == b' ' || *b == b'\r')
}

#[cfg(test)]
mod tests {
    use super::status_is_200;

    #[test]
    fn only_status_200_is_healthy() {
        assert!(status_is_200(b"HTTP/1.1 200 OK\r\n"));
        assert!(status_is_200(b"HTTP/1.0 200\r\n"));
        assert!(status_is_200(b"HTTP/1.1 200"));
        assert!(!status_is_200(b"HTTP/1.1 2000 OK\r\n"));
        assert!(!status_is_200(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(!status_is_200(b"HTTP/1.1 20"));
        assert!(!status_is_200(b""));
        assert!(!status_is_200(b"SSH-2.0-OpenSSH_9.2\r\n"));
    }
}
