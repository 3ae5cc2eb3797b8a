//! Who holds which VIP ([`Allocations`]): addresses given, shared, kept and released, and those a
//! restart must reserve from the Services' statuses.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use cloud_provider::service_helpers::{IpFamily, ingress_for_ip};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};
use local_data_plane::LoadBalancerSpec;

use crate::{Config, config::AddressPool};

use super::*;

/// The finalizer of the service controller: a Service that carries it may still own a load balancer.
pub(super) const CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// Who holds which VIP.
#[derive(Debug, Default)]
pub(crate) struct Allocations {
    /// By `namespace/name`.
    pub(super) services: BTreeMap<String, Record>,
    /// VIP → the Services (`namespace/name`) that hold it: one, or several that share it.
    pub(super) owners: BTreeMap<IpAddr, BTreeSet<String>>,
}

/// One Service's load balancer.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) uid: Option<String>,
    /// The VIPs, primary family first.
    pub(super) ips: Vec<IpAddr>,
    /// What the data plane runs for it; `None` for a Service whose addresses were only reserved (at
    /// start) or whose load balancer the data plane could not run yet, and with `mode: agents`.
    pub(super) applied: Option<LoadBalancerSpec>,
    /// Who carries its traffic, which decides the status's `ipMode`.
    pub(super) data_path: DataPath,
    /// How it may share its VIPs; `None`: it may not.
    pub(super) sharing: Option<Sharing>,
    /// Kept for a later Service of its namespace and name after its own went
    /// (`ccm.rs/load-balancer-retain`; [`crate::retained`]): reserved, not served, and adopted by the
    /// next Service of that key.
    pub(super) retained: bool,
}

impl Record {
    /// A VIP the data plane serves is reported with `ipMode: Proxy`: the data plane terminates the client's connection on
    /// the VIP and opens its own to a node's `InternalIP:NodePort`, which is what `Proxy` tells
    /// kube-proxy. With `VIP`, kube-proxy would install the VIP on every node it runs on and DNAT
    /// traffic to it straight to the endpoints: the data plane (health checks, source ranges, PROXY
    /// protocol, metrics) would be bypassed for in-cluster clients and clients on a node, and a 127.x
    /// VIP would stop working altogether (a connection from 127.0.0.1 DNAT'ed to a pod is dropped:
    /// the kernel does not route a loopback source off `lo`), as a real kubelet and kube-proxy showed.
    /// A VIP kube-proxy carries (`local.ccm.rs/data-path: kube-proxy`, node agents only) is reported
    /// with `ipMode: VIP`, for exactly that.
    pub(super) fn status(&self) -> LoadBalancerStatus {
        let mode = self.data_path.ip_mode();
        LoadBalancerStatus {
            ingress: Some(
                self.ips
                    .iter()
                    .map(|ip| ingress_for_ip(*ip, mode))
                    .collect(),
            ),
        }
    }

    pub(super) fn same_service(&self, uid: Option<&str>) -> bool {
        match (self.uid.as_deref(), uid) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

/// `, labels a=b,c=d` (`, no labels` without), for messages about a pool's scope.
pub(super) fn labels_text(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return ", no labels".to_owned();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(", labels {}", pairs.join(","))
}

/// The IPs a Service's status carries.
pub(crate) fn published_ips(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// Why no address of `family` could be found for `wanted`: the pools that would serve it refuse it (and
/// why), or there is none of that family, or those there are exhausted.
fn no_address(config: &Config, family: IpFamily, wanted: &Wanted) -> String {
    let candidates: Vec<&AddressPool> = config
        .address_pools
        .iter()
        .filter(|p| wanted.pool.as_ref().is_none_or(|n| &p.name == n))
        .filter(|p| wanted.pool.is_some() || p.auto_assign)
        .filter(|p| {
            p.addresses
                .iter()
                .any(|r| IpFamily::of(r.first()) == family)
        })
        .collect();
    let pools: Vec<&str> = candidates
        .iter()
        .filter(|p| pool_refusal(p, wanted).is_none())
        .map(|p| p.name.as_str())
        .collect();
    if pools.is_empty() && !candidates.is_empty() {
        let reasons: Vec<String> = candidates
            .iter()
            .filter_map(|p| pool_refusal(p, wanted))
            .collect();
        return format!(
            "no address pool with {} addresses serves this Service (namespace {:?}{}): {}",
            family.as_str(),
            wanted.namespace,
            labels_text(&wanted.labels),
            reasons.join("; ")
        );
    }
    if pools.is_empty() {
        format!(
            "no address pool has {} addresses{}",
            family.as_str(),
            wanted
                .pool
                .as_ref()
                .map(|n| format!(" (pool {n:?} asked by {ANNOTATION_ADDRESS_POOL})"))
                .unwrap_or_default()
        )
    } else {
        format!(
            "no free {} address: pool(s) {} are exhausted",
            family.as_str(),
            pools.join(", ")
        )
    }
}

/// Why `pool` may not serve `wanted` (its namespace and labels), if it may not.
fn pool_refusal(pool: &AddressPool, wanted: &Wanted) -> Option<String> {
    pool.refuses(&wanted.namespace, &wanted.namespace_labels, &wanted.labels)
}

impl Allocations {
    /// The VIPs of `key` for `wanted`: the addresses it holds, else those its status carries, else
    /// free ones from the pools. Changes nothing unless every required family gets an address.
    pub(super) fn allocate(
        &mut self,
        config: &Config,
        key: &str,
        uid: Option<&str>,
        wanted: &Wanted,
        published: &[IpAddr],
    ) -> Result<Vec<IpAddr>, String> {
        // A record of an earlier Service of the same name (deleted and re-created) is released.
        if self.services.get(key).is_some_and(|r| !r.same_service(uid)) {
            self.release(key);
        }
        let current: Vec<IpAddr> = self
            .services
            .get(key)
            .map(|r| r.ips.clone())
            .unwrap_or_default();
        let free_for_us = |ip: &IpAddr| self.sharing_refused(config, ip, key, wanted).is_none();
        let refusal = |pool: &AddressPool| pool_refusal(pool, wanted);
        if let Some(name) = &wanted.pool
            && let Some(why) = config
                .address_pools
                .iter()
                .find(|p| &p.name == name)
                .and_then(refusal)
        {
            return Err(format!(
                "{ANNOTATION_ADDRESS_POOL}: {why}, and this Service is in namespace {:?}{}",
                wanted.namespace,
                labels_text(&wanted.labels)
            ));
        }
        let pool_ok = |ip: &IpAddr| match (config.pool_of(*ip), &wanted.pool) {
            (Some(pool), _) if !pool.gives_out(*ip) => false,
            (Some(pool), Some(name)) => &pool.name == name && refusal(pool).is_none(),
            (Some(pool), None) => refusal(pool).is_none(),
            (None, _) => false,
        };
        // A dual-stack Service new to addresses takes both from one pool when a pool can give both
        // (MetalLB's rule), else each from the most preferred pool of its family.
        let one_pool = (wanted.families.len() == 2
            && wanted.requested.is_empty()
            && current.is_empty()
            && published.is_empty())
        .then(|| self.pool_for_both(config, wanted))
        .flatten();
        let mut ips = Vec::new();
        for (family, required) in &wanted.families {
            let of_family = |ip: &&IpAddr| IpFamily::of(**ip) == *family;
            let chosen = if let Some(ip) = wanted.requested.get(family) {
                Some(self.check_requested(config, ip, key, wanted)?)
            } else if let Some(ip) = current.iter().filter(of_family).find(|ip| pool_ok(ip)) {
                Some(*ip)
            } else if let Some(ip) = published
                .iter()
                .filter(of_family)
                .find(|ip| pool_ok(ip) && free_for_us(ip))
            {
                Some(*ip)
            } else {
                self.first_free(config, *family, wanted, one_pool.as_deref())
            };
            match chosen {
                Some(ip) => ips.push(ip),
                None if *required => return Err(no_address(config, *family, wanted)),
                None => {
                    tracing::info!(
                        service = key,
                        family = family.as_str(),
                        "no free address of the second IP family (PreferDualStack): serving one family"
                    );
                }
            }
        }
        self.record_allocation(key, uid, wanted, &current, &ips);
        Ok(ips)
    }

    /// Checks the address `ip` the Service `key` asks for: in a pool it may use (the one it names, if
    /// it names one), given out by that pool, and free for it (or shared as it allows).
    fn check_requested(
        &self,
        config: &Config,
        ip: &IpAddr,
        key: &str,
        wanted: &Wanted,
    ) -> Result<IpAddr, String> {
        let Some(pool) = config.pool_of(*ip) else {
            return Err(format!(
                "the requested address {ip} is in no address pool ({})",
                pool_list(config)
            ));
        };
        if let Some(name) = &wanted.pool
            && &pool.name != name
        {
            return Err(format!(
                "the requested address {ip} is in pool {:?}, not in {name:?} ({ANNOTATION_ADDRESS_POOL})",
                pool.name
            ));
        }
        if let Some(why) = pool_refusal(pool, wanted) {
            return Err(format!(
                "the requested address {ip} is in pool {:?}, which this Service may not use: {why}",
                pool.name
            ));
        }
        if !pool.gives_out(*ip) {
            return Err(format!(
                "the requested address {ip} is in pool {:?}, which gives out no IPv4 \
                 address ending in .0 or .255 (avoidBuggyIPs)",
                pool.name
            ));
        }
        if let Some(why) = self.sharing_refused(config, ip, key, wanted) {
            return Err(format!("the requested address {ip} is taken: {why}"));
        }
        Ok(*ip)
    }

    /// Records `ips` as `key`'s (its former `current` ones not among them given up), with what
    /// `wanted` says of its data path and sharing.
    fn record_allocation(
        &mut self,
        key: &str,
        uid: Option<&str>,
        wanted: &Wanted,
        current: &[IpAddr],
        ips: &[IpAddr],
    ) {
        for ip in current {
            if !ips.contains(ip) {
                self.disown(*ip, key);
            }
        }
        for ip in ips {
            self.owners.entry(*ip).or_default().insert(key.to_owned());
        }
        let record = self
            .services
            .entry(key.to_owned())
            .or_insert_with(|| Record {
                uid: uid.map(str::to_owned),
                ips: Vec::new(),
                applied: None,
                data_path: wanted.data_path,
                sharing: None,
                retained: false,
            });
        record.retained = false;
        record.ips = ips.to_vec();
        record.data_path = wanted.data_path;
        record.sharing = wanted.sharing.clone();
        record.uid = uid.map(str::to_owned).or(record.uid.take());
    }

    /// The address of `family` for `wanted` from the pool it names, else from the auto-assign pools by
    /// preference (priority, then the file's order; only pools that serve the Service's namespace and
    /// labels): for a Service that allows sharing, the first address a compatible Service holds
    /// (sharers meet on one address, as MetalLB's do), else the lowest free one.
    /// `only`: from that pool alone.
    pub(super) fn first_free(
        &self,
        config: &Config,
        family: IpFamily,
        wanted: &Wanted,
        only: Option<&str>,
    ) -> Option<IpAddr> {
        let pools: Vec<&AddressPool> = config
            .pools_by_preference()
            .into_iter()
            .filter(|p| match &wanted.pool {
                Some(name) => &p.name == name,
                None => p.auto_assign,
            })
            .filter(|p| only.is_none_or(|name| p.name == name))
            .filter(|p| {
                p.refuses(&wanted.namespace, &wanted.namespace_labels, &wanted.labels)
                    .is_none()
            })
            .collect();
        if let Some(sharing) = &wanted.sharing {
            let compatible = |pool: &AddressPool, holders: &BTreeSet<String>| {
                holders.iter().all(|holder| {
                    let theirs = self.services.get(holder).and_then(|r| r.sharing.as_ref());
                    sharing
                        .conflict(theirs, holder, pool.cross_namespace_sharing)
                        .is_none()
                })
            };
            let shared = pools.iter().find_map(|pool| {
                self.owners.iter().find_map(|(ip, holders)| {
                    (IpFamily::of(*ip) == family
                        && pool.addresses.iter().any(|r| r.contains(*ip))
                        && compatible(pool, holders))
                    .then_some(*ip)
                })
            });
            if shared.is_some() {
                return shared;
            }
        }
        pools
            .iter()
            .flat_map(|p| p.addresses.iter().map(move |r| (*p, r)))
            .filter(|(_, r)| IpFamily::of(r.first()) == family)
            .find_map(|(p, r)| {
                r.addresses()
                    .find(|ip| p.gives_out(*ip) && !self.owners.contains_key(ip))
            })
    }

    /// The most preferred pool that can give `wanted` an address of both families, if any.
    pub(super) fn pool_for_both(&self, config: &Config, wanted: &Wanted) -> Option<String> {
        config
            .pools_by_preference()
            .into_iter()
            .map(|p| p.name.as_str())
            .find(|name| {
                wanted.families.iter().all(|(family, _)| {
                    self.first_free(config, *family, wanted, Some(name))
                        .is_some()
                })
            })
            .map(str::to_owned)
    }

    /// Why `key` (asking `wanted`) may not hold `ip` beside the Services that hold it, if it may not.
    pub(super) fn sharing_refused(
        &self,
        config: &Config,
        ip: &IpAddr,
        key: &str,
        wanted: &Wanted,
    ) -> Option<String> {
        let holders = self.owners.get(ip)?;
        let cross = config
            .pool_of(*ip)
            .is_some_and(|p| p.cross_namespace_sharing);
        holders.iter().filter(|h| *h != key).find_map(|holder| {
            let theirs = self.services.get(holder).and_then(|r| r.sharing.as_ref());
            match &wanted.sharing {
                Some(mine) => mine.conflict(theirs, holder, cross),
                None => Some(format!(
                    "{} holds it (Services share an address only with the same {ANNOTATION_ALLOW_SHARED_IP})",
                    holder_text(&wanted.namespace, holder)
                )),
            }
        })
    }

    /// `key` no longer holds `ip`.
    pub(super) fn disown(&mut self, ip: IpAddr, key: &str) {
        if let Some(holders) = self.owners.get_mut(&ip) {
            holders.remove(key);
            if holders.is_empty() {
                self.owners.remove(&ip);
            }
        }
    }

    /// Whether a Service other than `key` holds `ip` (a shared address stays on the interface).
    pub(crate) fn held_by_another(&self, ip: IpAddr, key: &str) -> bool {
        self.owners
            .get(&ip)
            .is_some_and(|holders| holders.iter().any(|h| h != key))
    }

    pub(super) fn release(&mut self, key: &str) -> Option<Record> {
        let record = self.services.remove(key)?;
        for ip in &record.ips {
            self.disown(*ip, key);
        }
        Some(record)
    }

    /// Reserves the addresses a Service's status carries (at start). An address another Service
    /// already holds is not taken (and logged), unless both may share it (`sharing`: how this one may,
    /// read from the Service as it is). `data_path`: the one its status's `ipMode` says.
    pub(super) fn reserve(
        &mut self,
        config: &Config,
        key: &str,
        uid: Option<&str>,
        ips: &[IpAddr],
        sharing: Option<Sharing>,
        data_path: DataPath,
    ) {
        let mut mine = Vec::new();
        for ip in ips {
            let cross = config
                .pool_of(*ip)
                .is_some_and(|p| p.cross_namespace_sharing);
            let refused = self.owners.get(ip).and_then(|holders| {
                holders.iter().filter(|h| *h != key).find_map(|holder| {
                    let theirs = self.services.get(holder).and_then(|r| r.sharing.as_ref());
                    match &sharing {
                        Some(mine) => mine.conflict(theirs, holder, cross),
                        None => Some(format!("Service {holder} holds it")),
                    }
                })
            });
            match refused {
                Some(why) => {
                    tracing::warn!(service = key, %ip, %why, "two Services' statuses carry one address; it stays with the first");
                }
                None => {
                    self.owners.entry(*ip).or_default().insert(key.to_owned());
                    mine.push(*ip);
                }
            }
        }
        if !mine.is_empty() {
            self.services.insert(
                key.to_owned(),
                Record {
                    uid: uid.map(str::to_owned),
                    ips: mine,
                    applied: None,
                    data_path,
                    sharing,
                    retained: false,
                },
            );
        }
    }

    /// Reserves `ips` for `key`, kept after its Service went, as [`Allocations::reserve`] reserves
    /// the addresses a Service's status carries: each address another Service holds now is left to it
    /// (said in the log).
    pub(super) fn keep(&mut self, config: &Config, key: &str, ips: &[IpAddr]) {
        self.reserve(config, key, None, ips, None, DataPath::default());
        if let Some(record) = self.services.get_mut(key) {
            record.retained = true;
        }
    }

    /// Makes the kept records those of `kept`: a kept record no longer listed is released (an
    /// operator's release), a listed key with no record is kept (another leader's, or from before a
    /// restart); a key a live Service holds is that Service's (it adopted the addresses).
    pub(super) fn keep_only(
        &mut self,
        config: &Config,
        kept: &BTreeMap<String, Vec<IpAddr>>,
    ) -> (Vec<String>, Vec<String>) {
        let released: Vec<String> = self
            .services
            .iter()
            .filter(|(key, record)| record.retained && !kept.contains_key(*key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &released {
            self.release(key);
        }
        let mut added = Vec::new();
        for (key, ips) in kept {
            if !self.services.contains_key(key) {
                self.keep(config, key, ips);
                added.push(key.clone());
            }
        }
        (released, added)
    }
}

pub(super) fn pool_list(config: &Config) -> String {
    config
        .address_pools
        .iter()
        .map(|p| {
            let ranges: Vec<String> = p.addresses.iter().map(ToString::to_string).collect();
            format!("{}: {}", p.name, ranges.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The addresses a Service's status holds that must not be handed to another Service after a
/// restart: all of them for a classless `type: LoadBalancer` Service or one with the cleanup finalizer
/// (the service controller's by default); for a Service with a `loadBalancerClass` (this manager's when
/// it runs with `--load-balancer-class`, else another implementation's, which the provider cannot tell
/// apart) those in this cloud's pools, so neither loses its address to the other.
pub(super) fn addresses_to_reserve(service: &Service, config: &Config) -> Vec<IpAddr> {
    let spec = service.spec.as_ref();
    let load_balancer = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    let classed = spec.and_then(|s| s.load_balancer_class.as_ref()).is_some();
    let finalized = service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER));
    let mut ips = if load_balancer || finalized {
        published_ips(service)
    } else {
        Vec::new()
    };
    if classed && !finalized {
        ips.retain(|ip| config.pool_of(*ip).is_some());
    }
    ips
}
