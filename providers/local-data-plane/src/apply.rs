//! How [`DataPlane::apply`] brings a load balancer to its spec: the spec checked, the load balancer's
//! entry locked, the health checks' first results, the listeners that left the spec closed, the others
//! updated in place or bound.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{Instrument, debug, info, warn};

use crate::health::{Probe, ProbeKey};
use crate::pool::{BackendEntry, ListenerConfig, ListenerShared};
use crate::spec::ListenerKey;
use crate::{
    ApplyError, Backend, BindFailure, DataPlane, ListenerFailure, ListenerSpec, LoadBalancer,
    LoadBalancerSpec, Running, RunningListener, budget, drain_listeners, lock,
};

impl DataPlane {
    /// [`DataPlane::apply`], within the load balancer's span.
    pub(crate) async fn apply_inner(&self, spec: LoadBalancerSpec) -> Result<(), ApplyError> {
        validate(&spec)?;
        let (lb, _op) = self.lock_load_balancer(&spec.name).await;
        if lock(&lb.run).is_current(&spec) {
            debug!("unchanged");
            return Ok(());
        }
        // Health checks first, so listeners never see a backend whose health is unknown.
        let probes = self.first_probes(&spec).await;
        let wanted: BTreeMap<ListenerKey, ListenerSpec> =
            spec.listeners.iter().map(|l| (l.key(), *l)).collect();
        // Listeners that left the spec stop accepting first (their sockets closed), so a port that
        // moves between them and a new listener binds, and so does one re-added by the next apply.
        let mut leaving = lock(&lb.run).take_leaving(&wanted);
        for listener in &mut leaving {
            info!(listener = %listener.shared.label, "closing: left the spec");
            listener.stop_accepting().await;
        }
        let failures = self.run_listeners(&lb, &spec, &wanted, &probes);
        if !leaving.is_empty() {
            let drain = self.inner.settings.drain_timeout;
            // Unsupervised: bounded by the drain time (it waits, then cuts); a panic drops the
            // listeners, which cuts their connections as its end would.
            tokio::spawn(drain_listeners(leaving, drain).instrument(tracing::Span::current()));
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ApplyError::Listeners {
                load_balancer: spec.name,
                failures,
            })
        }
    }

    /// The load balancer `name` (created if new) with its operation lock held, so no other `apply`
    /// or `remove` of that name runs meanwhile. One removed while this waited for the lock is left
    /// for a fresh entry.
    async fn lock_load_balancer(
        &self,
        name: &str,
    ) -> (Arc<LoadBalancer>, tokio::sync::OwnedMutexGuard<()>) {
        loop {
            let lb = self.load_balancer_entry(name);
            let op = lb.op.clone().lock_owned().await;
            if !lock(&lb.run).removed {
                return (lb, op);
            }
            // Removed while we waited: start over with a fresh entry.
        }
    }

    /// The entry of the load balancer `name`, created with nothing running if there is none.
    fn load_balancer_entry(&self, name: &str) -> Arc<LoadBalancer> {
        let mut all = lock(&self.inner.load_balancers);
        all.entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(LoadBalancer {
                    name: name.into(),
                    op: Arc::new(tokio::sync::Mutex::new(())),
                    run: Mutex::new(Running::default()),
                })
            })
            .clone()
    }

    /// The health probes of `spec`'s backends (one per address, shared with every load balancer that
    /// checks the same), each with its first result or the health-check timeout passed. None
    /// without a health check.
    async fn first_probes(&self, spec: &LoadBalancerSpec) -> HashMap<IpAddr, Arc<Probe>> {
        let Some(check) = &spec.health_check else {
            return HashMap::new();
        };
        let mut probes = HashMap::new();
        for backend in &spec.backends {
            probes.entry(backend.address).or_insert_with(|| {
                self.inner.probes.get(&ProbeKey {
                    addr: SocketAddr::new(backend.address, check.port),
                    path: check.path.clone(),
                })
            });
        }
        let limit = self.inner.settings.health_check.timeout + Duration::from_millis(200);
        for probe in probes.values() {
            probe.first_result(limit).await;
        }
        probes
    }

    /// Brings the listeners of `lb` to `wanted` (those that left are already out): a running one gets
    /// its new config in place, a new one is bound and started. Notes `spec` and the listeners that
    /// could not be bound as what runs, and returns those.
    fn run_listeners(
        &self,
        lb: &LoadBalancer,
        spec: &LoadBalancerSpec,
        wanted: &BTreeMap<ListenerKey, ListenerSpec>,
        probes: &HashMap<IpAddr, Arc<Probe>>,
    ) -> Vec<ListenerFailure> {
        let mut failures = Vec::new();
        let mut run = lock(&lb.run);
        for listener in wanted.values() {
            let running = run.listeners.get(&listener.key());
            let config = self.listener_config(spec, listener, probes, running);
            if let Some(running) = running {
                running.shared.set_config(config);
                continue;
            }
            match self.new_listener(&lb.name, listener, config) {
                Ok(running) => {
                    run.listeners.insert(listener.key(), running);
                }
                Err(failure) => failures.push(failure),
            }
        }
        run.failed = failed_listeners(&failures);
        run.spec = Some(spec.clone());
        failures
    }

    /// Binds and starts `listener` of the load balancer `name`, which was not running; one that
    /// cannot be bound is a failure (logged).
    fn new_listener(
        &self,
        name: &Arc<str>,
        listener: &ListenerSpec,
        config: ListenerConfig,
    ) -> Result<RunningListener, ListenerFailure> {
        let shared = Arc::new(ListenerShared::new(
            name.clone(),
            *listener,
            config,
            budget::ListenerBudget::new(self.inner.budget.clone()),
        ));
        match self.start_listener(shared) {
            Ok(running) => {
                info!(listener = %listener, "listening");
                Ok(running)
            }
            Err(error) => {
                let reason = BindFailure::classify(&error);
                warn!(listener = %listener, %error, "cannot bind listener");
                Err(ListenerFailure {
                    listener: *listener,
                    reason,
                    error,
                })
            }
        }
    }

    /// The config `listener` runs with under `spec`: its backends (of the VIP's family where the nodes
    /// have it, each address once), reusing the entries `running` has for the same backend and check,
    /// so their connection counts go on.
    fn listener_config(
        &self,
        spec: &LoadBalancerSpec,
        listener: &ListenerSpec,
        probes: &HashMap<IpAddr, Arc<Probe>>,
        running: Option<&RunningListener>,
    ) -> ListenerConfig {
        let current = running.map(|r| r.shared.config());
        let mut backends: Vec<Arc<BackendEntry>> = Vec::new();
        // The VIP's own family where the nodes have it; else the other one (an IPv6 VIP on nodes with
        // IPv4 addresses only: kube-proxy serves a dual-stack Service's NodePort on either family).
        let vip_family = |b: &Backend| b.address.is_ipv4() == listener.vip.is_ipv4();
        let own_family = spec.backends.iter().any(vip_family);
        for backend in &spec.backends {
            if own_family && !vip_family(backend) {
                continue;
            }
            let addr = SocketAddr::new(backend.address, listener.node_port);
            if backends.iter().any(|b| b.addr == addr) {
                continue;
            }
            let probe = probes.get(&backend.address).cloned();
            let existing = current.as_ref().and_then(|c| {
                c.backends
                    .iter()
                    .find(|b| b.same_as(&backend.node, addr, &probe))
            });
            backends.push(match existing {
                Some(existing) => existing.clone(),
                None => Arc::new(BackendEntry::new(backend.node.clone(), addr, probe)),
            });
        }
        ListenerConfig {
            node_port: listener.node_port,
            backends,
            source_ranges: spec.source_ranges.clone(),
            proxy_protocol: spec.proxy_protocol,
            affinity: spec.session_affinity,
        }
    }
}

impl Running {
    /// Whether `spec` is what runs already, with every listener bound.
    fn is_current(&self, spec: &LoadBalancerSpec) -> bool {
        self.spec.as_ref() == Some(spec) && self.failed.is_empty()
    }

    /// Takes out the running listeners that `wanted` no longer has.
    fn take_leaving(
        &mut self,
        wanted: &BTreeMap<ListenerKey, ListenerSpec>,
    ) -> Vec<RunningListener> {
        leaving_keys(self.listeners.keys(), wanted)
            .iter()
            .filter_map(|key| self.listeners.remove(key))
            .collect()
    }
}

/// The keys of the `running` listeners that `wanted` no longer has.
fn leaving_keys<'a>(
    running: impl IntoIterator<Item = &'a ListenerKey>,
    wanted: &BTreeMap<ListenerKey, ListenerSpec>,
) -> Vec<ListenerKey> {
    running
        .into_iter()
        .filter(|key| !wanted.contains_key(key))
        .copied()
        .collect()
}

/// The listeners that could not be bound as the running state notes them: each with its reason and
/// error.
fn failed_listeners(failures: &[ListenerFailure]) -> Vec<(ListenerSpec, String)> {
    failures
        .iter()
        .map(|f| (f.listener, format!("{}: {}", f.reason, f.error)))
        .collect()
}

/// Refuses a spec `apply` cannot run: no name, a listener twice, or a health check's port 0 or bad
/// path.
fn validate(spec: &LoadBalancerSpec) -> Result<(), ApplyError> {
    let invalid = |reason: String| ApplyError::InvalidSpec {
        load_balancer: spec.name.clone(),
        reason,
    };
    if spec.name.is_empty() {
        return Err(invalid("the name is empty".into()));
    }
    let mut seen = std::collections::HashSet::new();
    for listener in &spec.listeners {
        if !seen.insert(listener.key()) {
            return Err(invalid(format!("listener {listener} appears twice")));
        }
    }
    if let Some(check) = &spec.health_check {
        if check.port == 0 {
            return Err(invalid("health-check port 0".into()));
        }
        if !check.path.starts_with('/')
            || check
                .path
                .bytes()
                .any(|b| b.is_ascii_control() || b == b' ')
        {
            return Err(invalid(format!(
                "health-check path {:?} must start with / and hold no spaces or control characters",
                check.path
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Protocol;

    fn listener(port: u16, protocol: Protocol) -> ListenerSpec {
        ListenerSpec {
            vip: "10.0.0.1".parse().unwrap(),
            port,
            protocol,
            node_port: 30080,
        }
    }

    #[test]
    fn the_listeners_leaving_are_those_running_that_the_spec_no_longer_has() {
        let wanted: BTreeMap<ListenerKey, ListenerSpec> = [listener(80, Protocol::Tcp)]
            .into_iter()
            .map(|l| (l.key(), l))
            .collect();
        let running = [
            listener(80, Protocol::Tcp).key(),
            listener(80, Protocol::Udp).key(),
            listener(443, Protocol::Tcp).key(),
        ];
        assert_eq!(
            leaving_keys(&running, &wanted),
            vec![
                listener(80, Protocol::Udp).key(),
                listener(443, Protocol::Tcp).key()
            ]
        );
        assert!(leaving_keys(&running[..1], &wanted).is_empty());
        assert_eq!(leaving_keys(&running, &BTreeMap::new()), running.to_vec());
    }

    #[test]
    fn a_listener_that_failed_to_bind_is_noted_with_its_reason_and_error() {
        let failures = [ListenerFailure {
            listener: listener(80, Protocol::Tcp),
            reason: BindFailure::PortInUse,
            error: std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address in use"),
        }];
        assert_eq!(
            failed_listeners(&failures),
            vec![(
                listener(80, Protocol::Tcp),
                "port already in use: Address in use".to_string()
            )]
        );
    }
}
