//! Load balancers of the `local` cloud: VIPs from the address pools, traffic through the in-process
//! data plane.
//!
//! **Addresses.** Each Service gets one VIP per IP family it asks for (`spec.ipFamilies` in order;
//! with `ipFamilyPolicy: PreferDualStack` the second family is given only when a pool of it has a free
//! address). `spec.loadBalancerIP` or the [`ANNOTATION_LOAD_BALANCER_IPS`] annotation asks for specific
//! addresses, which must lie in a pool; [`ANNOTATION_ADDRESS_POOL`] picks the pool. The allocation is
//! recorded on the Service itself, in the `status.loadBalancer.ingress` the service controller writes:
//! at start ([`CloudProvider::initialize`](cloud_provider::CloudProvider::initialize)) every address a
//! Service's status carries is reserved for it, and a Service keeps the addresses its status shows
//! when they are still free, so a restart re-assigns nothing.
//!
//! **Errors** (a malformed annotation, an exhausted pool, a requested address another Service holds, a
//! port that cannot be bound) are returned from `ensure_load_balancer`, which the service controller
//! turns into a `SyncLoadBalancerFailed` Warning event on that Service; no other Service is touched. A
//! VIP put on `vipInterface` but not announced to the link's neighbours (no `CAP_NET_RAW`) is no error:
//! the load balancer serves, and the provider records a Warning event
//! [`EVENT_VIP_NOT_ANNOUNCED`](crate::EVENT_VIP_NOT_ANNOUNCED) on the Service itself.
//!
//! **Idempotence.** An ensure that finds the data plane already running the same load balancer makes no
//! data-plane call.

mod allocation;
mod cloud;
mod data_plane_spec;
mod service_spec;
#[cfg(test)]
mod tests;

use std::{collections::BTreeSet, sync::Arc};

use cloud_provider::{
    CloudResult, ClusterLoadBalancer, LoadBalancer, LoadBalancerPreview, ServiceRef, async_trait,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use tracing::Instrument;

use crate::{LocalCloud, instances::lock};

pub(crate) use allocation::*;
pub(crate) use data_plane_spec::*;
pub use service_spec::*;

#[async_trait]
impl LoadBalancer for LocalCloud {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let allocations = lock(&self.inner.load_balancers);
        Ok(allocations
            .services
            .get(&service_key(service))
            .filter(|r| r.same_service(service.metadata.uid.as_deref()))
            .map(Record::status))
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        cloud_provider::leadership::check()?;
        let span = tracing::info_span!("ensure_load_balancer", service = %service_key(service));
        Ok(self.ensure(service, nodes).instrument(span).await?)
    }

    /// The data plane forwards to a node's `InternalIP:NodePort`, which any node on the network has: the
    /// backends are every eligible node this cloud does not ignore, owned by this manager or not.
    fn backends_beyond_owned_nodes(&self) -> bool {
        true
    }

    /// The label keys of every pool's `serviceSelector`: a Service relabelled into or out of a pool's
    /// scope is synced at once.
    /// The pools (a reloaded cloud-config, MetalLB's pools): a Service whose address left every pool
    /// gets a new one at once, and one whose pool no longer serves it moves.
    fn settings_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.pools_changes())
    }

    fn service_label_keys(&self) -> Vec<String> {
        let keys: BTreeSet<String> = self
            .config()
            .address_pools
            .iter()
            .flat_map(|p| p.service_label_keys().map(str::to_owned))
            .collect();
        keys.into_iter().collect()
    }

    /// Read-only: the Service's addresses, what was applied and what the data plane runs (see
    /// `LocalCloud::preview`).
    async fn preview_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        Ok(self.preview(service, nodes).await?)
    }

    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        cloud_provider::leadership::check()?;
        let span = tracing::info_span!("update_load_balancer", service = %service_key(service));
        self.update_backends(service, nodes)
            .instrument(span)
            .await?;
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let key = service_key(service);
        let span = tracing::info_span!("ensure_load_balancer_deleted", service = %key);
        async {
            let _serial = self.serialize(&key).await;
            self.forget_unserved(&key);
            let ips = lock(&self.inner.load_balancers)
                .services
                .get(&key)
                .filter(|r| r.same_service(service.metadata.uid.as_deref()))
                .map(|r| r.ips.clone());
            if let Some(ips) = ips {
                tracing::info!(vips = ?ips, "deleting the load balancer");
                self.stop_serving(&key, &ips).await;
                // Only now may another Service get these addresses: not while this load balancer's
                // connections drain on them (nor, with `vipInterface`, before they left the interface).
                lock(&self.inner.load_balancers).release(&key);
            }
        }
        .instrument(span)
        .await;
        Ok(())
    }

    fn retains_load_balancers(&self) -> bool {
        true
    }

    async fn retain_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let span = tracing::info_span!("retain_load_balancer", service = %service_key(service));
        self.retain(service).instrument(span).await?;
        Ok(())
    }

    /// Every load balancer this process holds addresses for, by the UID of its Service, and those kept
    /// for a Service that went (marked retained: the sweep leaves them).
    async fn list_load_balancers(
        &self,
        _cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let allocations = lock(&self.inner.load_balancers);
        Ok(allocations
            .services
            .iter()
            .filter_map(|(key, record)| {
                if record.retained {
                    let (namespace, name) = key.split_once('/')?;
                    return Some(
                        ClusterLoadBalancer::new(
                            format!("kept:{key}"),
                            Some(ServiceRef::new(namespace, name)),
                        )
                        .retained(),
                    );
                }
                let uid = record.uid.as_deref()?;
                let (namespace, name) = key.split_once('/')?;
                let mut service = Service::default();
                service.metadata.uid = Some(uid.to_owned());
                Some(ClusterLoadBalancer::new(
                    cloud_provider::default_load_balancer_name(&service),
                    Some(ServiceRef::new(namespace, name).with_uid(uid)),
                ))
            })
            .collect())
    }

    async fn delete_orphaned_load_balancer(
        &self,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        let Some(reference) = &load_balancer.service else {
            return Ok(()); // `list_load_balancers` names the Service of every load balancer it lists
        };
        let mut service = Service::default();
        service.metadata.namespace = Some(reference.namespace.clone());
        service.metadata.name = Some(reference.name.clone());
        service.metadata.uid = reference.uid.clone();
        self.ensure_load_balancer_deleted(cluster_name, &service)
            .await
    }
}
