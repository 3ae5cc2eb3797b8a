//! `LocalCloud`'s load-balancer operations: reserving the published addresses at start, allocating,
//! running the data plane's load balancers or handing them to the node agents, releasing.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use cloud_provider::LoadBalancerPreview;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::{Api, api::ListParams};
use local_data_plane::{Backend, LoadBalancerSpec};

use crate::{Config, Error, LoadBalancerMode, LocalCloud, instances::lock};

use super::*;

/// How often `initialize` tries to list the Services.
pub(super) const LIST_ATTEMPTS: u32 = 5;

impl LocalCloud {
    /// Reserves the VIPs every LoadBalancer Service's status carries.
    /// Returns the Services taken over from MetalLB: those MetalLB gave their addresses to (its
    /// annotation `metallb.io/ip-allocated-from-pool`), which this cloud never served (no cleanup
    /// finalizer), whose addresses are now reserved in MetalLB's pools read as this cloud's.
    pub(crate) async fn reserve_published_addresses(
        &self,
        client: &kube::Client,
    ) -> Result<Vec<(Service, Vec<IpAddr>)>, Error> {
        let services: Api<Service> = Api::all(client.clone());
        // A new leader may meet a passing API hiccup: a few tries, 1 s apart, before start-up fails
        // (no controller may run before the published addresses are reserved).
        let mut attempt = 1;
        let list = loop {
            match services.list(&ListParams::default()).await {
                Ok(list) => break list,
                Err(err) if attempt < LIST_ATTEMPTS => {
                    tracing::warn!(error = %err, attempt, "local cloud: listing Services failed; retrying");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(source) => {
                    return Err(Error::Kube {
                        what: format!(
                            "local cloud: listing Services to reserve their load-balancer addresses ({LIST_ATTEMPTS} tries)"
                        ),
                        source,
                    });
                }
            }
        };
        let config = self.config();
        let mut allocations = lock(&self.inner.load_balancers);
        let mut reserved = 0;
        let mut taken_over = Vec::new();
        for service in &list.items {
            let ips = addresses_to_reserve(service, &config);
            if ips.is_empty() {
                continue;
            }
            let from_metallb = config.metallb_pools
                && service.metadata.annotations.as_ref().is_some_and(|a| {
                    a.keys()
                        .any(|k| k.ends_with(&format!("/{METALLB_OUTPUT_ANNOTATION}")))
                })
                && !service
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == "service.kubernetes.io/load-balancer-cleanup");
            if from_metallb {
                taken_over.push((service.clone(), ips.clone()));
            }
            let sharing = read_service(service, &config).ok().and_then(|w| w.sharing);
            allocations.reserve(
                &config,
                &service_key(service),
                service.metadata.uid.as_deref(),
                &ips,
                sharing,
                published_data_path(service),
            );
            reserved += ips.len();
        }
        tracing::info!(
            addresses = reserved,
            taken_over_from_metallb = taken_over.len(),
            "local cloud: reserved the load-balancer addresses Services carry"
        );
        Ok(taken_over)
    }

    /// Tells each Service taken over from MetalLB (a Normal event [`EVENT_TAKEN_OVER`]) that it keeps
    /// its addresses, now served by this cloud.
    pub(crate) fn tell_taken_over(&self, taken_over: &[(Service, Vec<IpAddr>)]) {
        for (service, ips) in taken_over {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            self.record_event(
                "Normal",
                crate::CloudEvent::about_vip(service, EVENT_TAKEN_OVER, "TakeOver"),
                &format!(
                    "keeps {} from MetalLB's pools, now served by the local cloud (MetalLB's objects \
                     read as its configuration)",
                    ips.join(", ")
                ),
            );
        }
    }

    /// Every address given out or reserved now.
    pub(crate) fn reserved_addresses(&self) -> Vec<IpAddr> {
        lock(&self.inner.load_balancers)
            .owners
            .keys()
            .copied()
            .collect()
    }

    /// How full each pool in force is ([`crate::pool_usage`]).
    pub fn pool_usage(&self) -> Vec<crate::pool_usage::PoolUsage> {
        let config = self.config();
        let owners = lock(&self.inner.load_balancers).owners.clone();
        crate::pool_usage::usage(&config, &owners)
    }

    /// Every address a pool of `config` has given out, with its pool ([`crate::pool_metrics`]).
    pub(crate) fn assigned_addresses<'c>(
        &self,
        config: &'c crate::config::Config,
    ) -> Vec<(IpAddr, &'c crate::config::AddressPool)> {
        let owners = lock(&self.inner.load_balancers).owners.clone();
        owners
            .keys()
            .filter_map(|ip| {
                let pool = config
                    .address_pools
                    .iter()
                    .find(|p| p.addresses.iter().any(|r| r.contains(*ip)))?;
                Some((*ip, pool))
            })
            .collect()
    }

    /// The labels of namespace `namespace`, read from the API server only when a pool of `config`
    /// selects namespaces by label (`namespaceSelectors`); else none. Without a client (before
    /// `initialize`), none.
    pub(crate) async fn namespace_labels(
        &self,
        config: &Config,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, Error> {
        if config
            .address_pools
            .iter()
            .all(|p| p.namespace_selectors.is_empty())
        {
            return Ok(BTreeMap::new());
        }
        let Some((client, _)) = lock(&self.inner.reporter).clone() else {
            return Ok(BTreeMap::new());
        };
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let found = namespaces
            .get_opt(namespace)
            .await
            .map_err(|source| Error::Kube {
                what: format!(
                    "local cloud: reading the labels of namespace {namespace} (a pool selects namespaces by label)"
                ),
                source,
            })?;
        Ok(found.and_then(|n| n.metadata.labels).unwrap_or_default())
    }

    /// Keeps the addresses of `service`'s load balancer for a later Service of its namespace and name
    /// (`ccm.rs/load-balancer-retain`): recorded first in the ConfigMap of [`crate::retained`], then
    /// no longer served (its listeners closed, its addresses off the interface), and still reserved.
    pub(super) async fn retain(&self, service: &Service) -> Result<(), Error> {
        let key = service_key(service);
        let _serial = self.serialize(&key).await;
        let ips = lock(&self.inner.load_balancers)
            .services
            .get(&key)
            .filter(|r| !r.retained && r.same_service(service.metadata.uid.as_deref()))
            .map(|r| r.ips.clone());
        let Some(ips) = ips else {
            return Ok(()); // nothing held, or kept already
        };
        let client = lock(&self.inner.reporter).clone().map(|(client, _)| client);
        let Some(client) = client else {
            return Err(Error::Service {
                service: key,
                message: "ccm.rs/load-balancer-retain: the cloud has no API client yet".to_owned(),
            });
        };
        crate::retained::write(client, &key, Some(&ips)).await?;
        tracing::info!(vips = ?ips, "keeping the load balancer's addresses for a later Service of this name");
        self.forget_unserved(&key);
        self.stop_serving(&key, &ips).await;
        if let Some(record) = lock(&self.inner.load_balancers).services.get_mut(&key) {
            record.uid = None;
            record.applied = None;
            record.retained = true;
        }
        Ok(())
    }

    /// Closes the listeners of `key`'s load balancer and takes its addresses `ips` off the interface
    /// (with `vipInterface`); a shared address stays on the interface for the Services still on it.
    pub(super) async fn stop_serving(&self, key: &str, ips: &[IpAddr]) {
        self.inner.data_plane.remove(key).await;
        if let Some(addresses) = &self.inner.addresses {
            let sole: Vec<IpAddr> = {
                let allocations = lock(&self.inner.load_balancers);
                ips.iter()
                    .copied()
                    .filter(|ip| !allocations.held_by_another(*ip, key))
                    .collect()
            };
            for ip in sole {
                addresses.remove(ip).await;
            }
        }
    }

    /// Makes the kept addresses those `kept` lists ([`crate::retained`]).
    pub(crate) fn keep_only(&self, kept: &BTreeMap<String, Vec<IpAddr>>) {
        let config = self.config();
        let (released, added) = lock(&self.inner.load_balancers).keep_only(&config, kept);
        for key in released {
            tracing::info!(service = %key, "kept addresses released (their entry left {})", crate::retained::CONFIG_MAP);
        }
        for key in added {
            tracing::info!(service = %key, "addresses kept for a Service that went are reserved");
        }
    }

    /// What `service` (`key`) asks for under `config`, its namespace's labels read, and its backends: the
    /// nodes this cloud knows (listed or adopted) at their InternalIPs; nodes it ignores (another
    /// cloud's, or unlisted ones with `unlistedNodes: ignore`) and removed machines get no traffic.
    async fn wanted(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
        config: &Config,
        key: &str,
    ) -> Result<(Wanted, Vec<(String, Vec<IpAddr>)>), Error> {
        let mut wanted = read_service(service, config).map_err(|message| Error::Service {
            service: key.to_owned(),
            message,
        })?;
        wanted.namespace_labels = self.namespace_labels(config, &wanted.namespace).await?;
        let backends = nodes
            .iter()
            .filter_map(|node| self.backend_addresses(config, node))
            .collect();
        Ok((wanted, backends))
    }

    pub(super) async fn ensure(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, Error> {
        let key = service_key(service);
        let _serial = self.serialize(&key).await;
        let config = self.config();
        let bad = |message: String| Error::Service {
            service: key.clone(),
            message,
        };
        let (wanted, backends) = self.wanted(service, nodes, &config, &key).await?;
        let uid = service.metadata.uid.as_deref();
        // The serial lock keeps this Service's record as this ensure leaves it between the lock's turns.
        let (previous, vips, adopting) = {
            let mut allocations = lock(&self.inner.load_balancers);
            let previous: Vec<IpAddr> = allocations
                .services
                .get(&key)
                .map(|r| r.ips.clone())
                .unwrap_or_default();
            let adopting = allocations.services.get(&key).is_some_and(|r| r.retained);
            let vips = allocations
                .allocate(&config, &key, uid, &wanted, &published_ips(service))
                .map_err(bad)?;
            (previous, vips, adopting)
        };
        if adopting {
            self.forget_kept(&key, &vips).await;
        }
        if config.load_balancer.mode == LoadBalancerMode::Agents {
            // The node agents announce and serve the VIPs; the manager only assigns them.
            tracing::debug!(vips = ?vips, "addresses assigned; the node agents serve them");
            self.tell_if_unserved(service, &key, &vips).await;
            return Ok(self.status_of(&key));
        }
        let spec = build_spec(&key, &vips, &wanted, &backends);
        // Applied as asked, and the data plane still runs every listener of it (one lost out of band,
        // or that failed to bind, is applied again).
        let unchanged = lock(&self.inner.load_balancers)
            .services
            .get(&key)
            .is_some_and(|r| r.applied.as_ref() == Some(&spec))
            && self.running_differences(&spec).is_empty();
        if !unchanged {
            self.apply(service, &key, &vips, &previous, spec).await?;
        }
        Ok(self.status_of(&key))
    }

    /// The status of the load balancer `key` as its record says (empty without one).
    fn status_of(&self, key: &str) -> LoadBalancerStatus {
        lock(&self.inner.load_balancers)
            .services
            .get(key)
            .map(Record::status)
            .unwrap_or_default()
    }

    /// Forgets the addresses kept for `key`'s name in their ConfigMap, now that its Service holds them.
    async fn forget_kept(&self, key: &str, vips: &[IpAddr]) {
        tracing::info!(vips = ?vips, "adopting the addresses kept for this Service's name");
        let client = lock(&self.inner.reporter).clone().map(|(client, _)| client);
        if let Some(client) = client
            && let Err(err) = crate::retained::write(client, key, None).await
        {
            // The record stays in the ConfigMap; the Service holds the addresses all the same.
            tracing::warn!(error = %err, "could not forget the kept addresses in their ConfigMap");
        }
    }

    /// Applies `spec` (leader mode): the VIPs on the interface, the data plane's listeners, the VIPs
    /// announced, and the `previous` addresses no Service holds any more taken off.
    async fn apply(
        &self,
        service: &Service,
        key: &str,
        vips: &[IpAddr],
        previous: &[IpAddr],
        spec: LoadBalancerSpec,
    ) -> Result<(), Error> {
        let bad = |message: String| Error::Service {
            service: key.to_owned(),
            message,
        };
        // The VIPs go on the interface before the listeners bind them, and are announced after:
        // no neighbour is sent here before this host accepts (a previous holder, such as a
        // leader handing off, answers until then).
        if let Some(addresses) = &self.inner.addresses {
            for vip in vips {
                addresses.put_on(*vip).await.map_err(bad)?;
            }
        }
        tracing::info!(vips = ?vips, listeners = spec.listeners.len(), backends = spec.backends.len(), "applying the load balancer");
        self.inner
            .applies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = self.inner.data_plane.apply(spec.clone()).await;
        if let Some(record) = lock(&self.inner.load_balancers).services.get_mut(key) {
            record.applied = result.is_ok().then(|| spec.clone());
        }
        result.map_err(|source| Error::DataPlane {
            service: key.to_owned(),
            source,
        })?;
        if let Some(addresses) = &self.inner.addresses {
            for vip in vips {
                // A VIP on but not announced is served all the same: reported, not failed.
                if let Some(warning) = addresses.announce(*vip).await.map_err(bad)? {
                    self.report_unannounced_vip(service, &warning);
                }
            }
            let shared: Vec<IpAddr> = {
                let allocations = lock(&self.inner.load_balancers);
                previous
                    .iter()
                    .copied()
                    .filter(|ip| allocations.held_by_another(*ip, key))
                    .collect()
            };
            for old in previous
                .iter()
                .filter(|ip| !vips.contains(ip) && !shared.contains(ip))
            {
                addresses.remove(*old).await;
            }
        }
        Ok(())
    }
}

impl LocalCloud {
    /// [`listener_differences`] against the data plane now.
    pub(super) fn running_differences(&self, spec: &LoadBalancerSpec) -> Vec<String> {
        listener_differences(spec, self.inner.data_plane.state(&spec.name).as_ref())
    }

    /// What [`LoadBalancer::ensure_load_balancer`] would change, without changing anything: the load
    /// balancer missing (no addresses held for the Service), listeners the data plane does not run as
    /// asked (lost, failed, left over), backends that differ, and any other setting (health check,
    /// affinity, source ranges, PROXY protocol, addresses asked for) that differs from what was applied.
    pub(super) async fn preview(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerPreview, Error> {
        let key = service_key(service);
        let config = self.config();
        let (wanted, backends) = self.wanted(service, nodes, &config, &key).await?;
        let names =
            |b: &[Backend]| -> BTreeSet<String> { b.iter().map(|b| b.node.clone()).collect() };
        let record = lock(&self.inner.load_balancers)
            .services
            .get(&key)
            .filter(|r| r.same_service(service.metadata.uid.as_deref()))
            .cloned();
        let Some(record) = record else {
            let backends = names(&backend_list(&backends)).into_iter().collect();
            return Ok(LoadBalancerPreview::Create { backends });
        };
        let spec = build_spec(&key, &record.ips, &wanted, &backends);
        let agents = config.load_balancer.mode == LoadBalancerMode::Agents;
        // With node agents, this process runs no data plane: only the addresses are checked.
        let mut detail = if agents {
            Vec::new()
        } else {
            self.running_differences(&spec)
        };
        if record.data_path != wanted.data_path {
            detail.push(format!(
                "the data path would change to {:?} (ipMode {:?})",
                wanted.data_path,
                wanted.data_path.ip_mode()
            ));
        }
        detail.extend(address_changes(&record, &wanted, &config));
        let (added, removed) = match &record.applied {
            _ if agents => (Vec::new(), Vec::new()),
            Some(applied) => {
                let (was, will) = (names(&applied.backends), names(&spec.backends));
                detail.extend(setting_changes(applied, &spec));
                (
                    will.difference(&was).cloned().collect::<Vec<_>>(),
                    was.difference(&will).cloned().collect::<Vec<_>>(),
                )
            }
            None => (names(&spec.backends).into_iter().collect(), Vec::new()),
        };
        if detail.is_empty() && added.is_empty() && removed.is_empty() {
            return Ok(LoadBalancerPreview::UpToDate);
        }
        Ok(LoadBalancerPreview::Change {
            backends_added: added,
            backends_removed: removed,
            detail: detail.join("; "),
        })
    }

    /// Holds off every other ensure, update and delete of the load balancer `key` until the guard is
    /// dropped: the service sync and the node sync may call for the same Service at once, and the
    /// data plane must end up running the newer spec, not whichever apply finished last.
    pub(super) async fn serialize(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let mutex = lock(&self.inner.serial)
            .entry(key.to_owned())
            .or_default()
            .clone();
        mutex.lock_owned().await
    }

    /// Changes only the backends of the load balancer the data plane runs for this Service (upstream's
    /// `UpdateLoadBalancer`). The node sync calls this with the copy of the Service it last synced,
    /// which may be older than what the last ensure applied (or than the Service's deletion): so nothing
    /// else of the spec is taken from it, and a load balancer that is not running is left alone.
    pub(super) async fn update_backends(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), Error> {
        let key = service_key(service);
        let _serial = self.serialize(&key).await;
        let config = self.config();
        if config.load_balancer.mode == LoadBalancerMode::Agents {
            return Ok(()); // the node agents choose their backends themselves
        }
        let backends: Vec<(String, Vec<IpAddr>)> = nodes
            .iter()
            .filter_map(|node| self.backend_addresses(&config, node))
            .collect();
        let spec = {
            let allocations = lock(&self.inner.load_balancers);
            let Some(applied) = allocations
                .services
                .get(&key)
                .filter(|r| r.same_service(service.metadata.uid.as_deref()))
                .and_then(|r| r.applied.clone())
            else {
                tracing::debug!("no load balancer running for this Service; nothing to update");
                return Ok(());
            };
            let mut spec = applied.clone();
            spec.backends = backend_list(&backends);
            if spec == applied {
                return Ok(());
            }
            spec
        };
        tracing::info!(
            backends = spec.backends.len(),
            "updating the load balancer's backends"
        );
        self.inner
            .applies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = self.inner.data_plane.apply(spec.clone()).await;
        if let Some(record) = lock(&self.inner.load_balancers).services.get_mut(&key) {
            record.applied = result.is_ok().then(|| spec.clone());
        }
        result.map_err(|source| Error::DataPlane {
            service: key,
            source,
        })
    }
}

/// The addresses of `record` that would change: one the Service asks for that it does not hold, and one
/// its pool no longer gives the Service (the pools or their limits changed, or the Service names
/// another pool): an ensure takes another, so the drift check moves it.
fn address_changes(record: &Record, wanted: &Wanted, config: &Config) -> Vec<String> {
    let mut changes = Vec::new();
    for (family, ip) in &wanted.requested {
        if !record.ips.contains(ip) {
            changes.push(format!("the {family:?} address would change to {ip}"));
        }
    }
    for ip in &record.ips {
        let why = match config.pool_of(*ip) {
            None => Some("it is in no address pool now".to_owned()),
            Some(pool) if wanted.pool.as_ref().is_some_and(|n| n != &pool.name) => Some(format!(
                "it is in pool {:?}, not in the one the Service names",
                pool.name
            )),
            Some(pool) => pool.refuses(&wanted.namespace, &wanted.namespace_labels, &wanted.labels),
        };
        if let Some(why) = why {
            changes.push(format!("the address {ip} would change: {why}"));
        }
    }
    changes
}

/// The settings other than backends in which `spec` differs from the `applied` one.
fn setting_changes(applied: &LoadBalancerSpec, spec: &LoadBalancerSpec) -> Vec<String> {
    [
        (
            applied.health_check != spec.health_check,
            "the health check would change",
        ),
        (
            applied.session_affinity != spec.session_affinity,
            "the session affinity would change",
        ),
        (
            applied.source_ranges != spec.source_ranges,
            "the source ranges would change",
        ),
        (
            applied.proxy_protocol != spec.proxy_protocol,
            "PROXY protocol would change",
        ),
    ]
    .into_iter()
    .filter(|(changed, _)| *changed)
    .map(|(_, what)| what.to_owned())
    .collect()
}
