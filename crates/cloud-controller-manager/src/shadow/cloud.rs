//! The shadow cloud: forwards every read to the provider and makes no write. `ensure` and `update` of a
//! load balancer become previews ([`LoadBalancer::preview_load_balancer`]) and answer the status the
//! load balancer has now (so the Service's status write is a no-op unless the Service's status itself
//! differs); `delete` of a load balancer (an orphan's too) and `create`/`delete` of a route are
//! recorded. Instances,
//! zones and clusters are reads and go to the provider as they are.

use parking_lot::Mutex;
use std::sync::Arc;

use async_trait::async_trait;
use cloud_provider::{
    CloudProvider, CloudResult, ClusterLoadBalancer, Clusters, InitializeContext, Instances,
    InstancesV2, LoadBalancer, LoadBalancerPreview, Route, Routes, Zones,
    service_helpers::service_key,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use serde_json::json;

use super::report::{CloudObject, ShadowReport, preview_json};
use crate::forward::{
    forward_load_balancer_answers, forward_provider_answers, offer_wrapped_parts,
};

/// A provider that writes nothing and reports what it would have written.
pub struct ShadowCloud {
    inner: Arc<dyn CloudProvider>,
    report: ShadowReport,
    /// The last backend list asked for, shared by the entries that ask for the same (node sync asks
    /// every load balancer for the same list).
    last_nodes: Mutex<Option<Arc<Vec<Arc<Node>>>>>,
}

impl ShadowCloud {
    /// Wraps `inner`, recording into `report`.
    pub fn new(inner: Arc<dyn CloudProvider>, report: ShadowReport) -> Self {
        Self {
            inner,
            report,
            last_nodes: Mutex::default(),
        }
    }

    fn shared_nodes(&self, nodes: &[Arc<Node>]) -> Arc<Vec<Arc<Node>>> {
        let mut last = self.last_nodes.lock();
        let names = |nodes: &[Arc<Node>]| -> Vec<Option<String>> {
            nodes.iter().map(|n| n.metadata.name.clone()).collect()
        };
        match last.as_ref() {
            Some(shared) if names(shared) == names(nodes) => shared.clone(),
            _ => {
                let shared = Arc::new(nodes.to_vec());
                *last = Some(shared.clone());
                shared
            }
        }
    }

    fn lb(&self) -> CloudResult<&dyn LoadBalancer> {
        self.inner
            .load_balancer()
            .ok_or(cloud_provider::CloudError::NotImplemented)
    }

    fn routes_part(&self) -> CloudResult<&dyn Routes> {
        self.inner
            .routes()
            .ok_or(cloud_provider::CloudError::NotImplemented)
    }

    /// Records the would-be `call` on the load balancer `key` of `service`, without backends (a deletion
    /// or a retention).
    fn record_load_balancer(
        &self,
        key: String,
        call: &'static str,
        service: Service,
        delete: bool,
        preview: serde_json::Value,
    ) {
        let object = CloudObject::LoadBalancer {
            service: Arc::new(service),
            nodes: Arc::default(),
            delete,
        };
        self.report.record_cloud(key, call, object, preview);
    }

    /// Records the would-be `call` creating (or deleting) `route`.
    fn record_route(
        &self,
        call: &'static str,
        route: &Route,
        create: bool,
        preview: serde_json::Value,
    ) {
        let key = format!("route {}", route.destination_cidr);
        let object = CloudObject::Route {
            route: route.clone(),
            create,
        };
        self.report.record_cloud(key, call, object, preview);
    }

    /// Previews ensuring the load balancer and records it under `call`.
    async fn preview(
        &self,
        call: &'static str,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let preview = self
            .lb()?
            .preview_load_balancer(cluster, service, nodes)
            .await?;
        if preview == LoadBalancerPreview::Unknown {
            tracing::debug!(
                service = %service_key(service),
                "dry run: the provider cannot preview load balancers; reported as unknown"
            );
        }
        self.report.record_cloud(
            lb_key(service),
            call,
            CloudObject::LoadBalancer {
                service: Arc::new(service.clone()),
                nodes: self.shared_nodes(nodes),
                delete: false,
            },
            preview_json(&preview),
        );
        Ok(())
    }
}

fn lb_key(service: &Service) -> String {
    format!("loadBalancer {}", service_key(service))
}

#[async_trait]
impl CloudProvider for ShadowCloud {
    async fn initialize(&self, ctx: InitializeContext) -> CloudResult<()> {
        self.inner.initialize(ctx).await
    }
    offer_wrapped_parts!(load_balancer: LoadBalancer, routes: Routes);
    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.instances()
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner.instances_v2()
    }
    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones()
    }
    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner.clusters()
    }
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }
    forward_provider_answers!();
    async fn hand_off(&self) {
        self.inner.hand_off().await;
    }
}

#[async_trait]
impl LoadBalancer for ShadowCloud {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.lb()?.get_load_balancer(cluster, service).await
    }
    forward_load_balancer_answers!();
    /// Previews, and answers the load balancer's current status; without a load balancer, the
    /// Service's own status (so the controller neither writes a status nor takes "no status" for an
    /// error and retries).
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.preview("ensure_load_balancer", cluster, service, nodes)
            .await?;
        if let Some(status) = self.lb()?.get_load_balancer(cluster, service).await? {
            return Ok(status);
        }
        let mut own = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.clone())
            .unwrap_or_default();
        own.ingress.get_or_insert_with(Vec::new);
        Ok(own)
    }
    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.preview("update_load_balancer", cluster, service, nodes)
            .await
    }
    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let exists = self
            .lb()?
            .get_load_balancer(cluster, service)
            .await?
            .is_some();
        let preview = if exists {
            json!({"kind": "delete"})
        } else {
            json!({"kind": "upToDate"})
        };
        self.record_load_balancer(
            lb_key(service),
            "ensure_load_balancer_deleted",
            service.clone(),
            true,
            preview,
        );
        Ok(())
    }
    async fn preview_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        self.lb()?
            .preview_load_balancer(cluster, service, nodes)
            .await
    }
    /// Reported, not done: the load balancer would be kept for a later Service of the same name.
    async fn retain_load_balancer(&self, _cluster: &str, service: &Service) -> CloudResult<()> {
        self.lb()?;
        self.record_load_balancer(
            lb_key(service),
            "retain_load_balancer",
            service.clone(),
            false,
            json!({"kind": "retain", "reason": "ccm.rs/load-balancer-retain: its Service is going"}),
        );
        Ok(())
    }
    async fn list_load_balancers(&self, cluster: &str) -> CloudResult<Vec<ClusterLoadBalancer>> {
        self.lb()?.list_load_balancers(cluster).await
    }
    async fn delete_orphaned_load_balancer(
        &self,
        _cluster: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        self.lb()?;
        let mut service = Service::default();
        if let Some(reference) = &load_balancer.service {
            service.metadata.namespace = Some(reference.namespace.clone());
            service.metadata.name = Some(reference.name.clone());
        }
        self.record_load_balancer(
            format!("loadBalancer {}", load_balancer.name),
            "delete_orphaned_load_balancer",
            service,
            true,
            json!({"kind": "delete", "name": load_balancer.name, "reason": "its Service no longer exists"}),
        );
        Ok(())
    }
}

#[async_trait]
impl Routes for ShadowCloud {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        self.routes_part()?.list_routes(cluster).await
    }
    async fn create_route(
        &self,
        _cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        self.routes_part()?;
        self.record_route(
            "create_route",
            route,
            true,
            json!({"kind": "create", "destinationCIDR": route.destination_cidr, "targetNode": route.target_node}),
        );
        Ok(())
    }
    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        self.routes_part()?;
        self.record_route(
            "delete_route",
            route,
            false,
            json!({"kind": "delete", "destinationCIDR": route.destination_cidr, "targetNode": route.target_node, "name": route.name}),
        );
        Ok(())
    }
}
