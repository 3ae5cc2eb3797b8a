//! Per-method cloud API metrics: every call the controllers make to the provider is timed and its
//! errors counted, whatever the provider (upstream leaves this to each provider, e.g.
//! `cloudprovider_aws_api_request_duration_seconds`; here every provider gets it).
//!
//! - `cloudprovider_api_request_duration_seconds{provider, request}` (histogram)
//! - `cloudprovider_api_request_errors_total{provider, request, kind}` (counter; `kind` is the
//!   `CloudError` variant, so "instance not found" answers are told apart from failures)
//!
//! The same wrapper keeps calls within leadership: each call runs in a `cloud_provider::leadership`
//! scope backed by the leader's write fence, and is dropped at its next await once the fence closed, so
//! a leader that froze in the middle of a call and resumed after a standby took over does not go on
//! changing the cloud (issue #32: it leaked the load balancer of a Service deleted meanwhile). A step
//! already sent can still land; the service controller's sweep of orphaned load balancers is the
//! backstop for that.

use std::{future::Future, sync::Arc, time::Instant};

use crate::{
    forward::{forward_load_balancer_answers, forward_provider_answers, offer_wrapped_parts},
    write_fence::WriteFence,
};

use async_trait::async_trait;
use cloud_provider::{
    CloudError, CloudProvider, CloudResult, ClusterLoadBalancer, Clusters, InitializeContext,
    InstanceMetadata, Instances, InstancesV2, LoadBalancer, LoadBalancerPreview, Route, Routes,
    Zone, Zones, leadership::Leadership,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    provider: String,
    request: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    provider: String,
    request: String,
    kind: String,
}

/// The cloud API metrics.
#[derive(Clone)]
pub struct CloudMetrics {
    duration: Family<CallLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
}

impl CloudMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let duration = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ])
        });
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "cloudprovider_api_request_duration_seconds",
            "Latency of cloud provider API calls, by provider and request.",
            duration.clone(),
        );
        registry.register(
            "cloudprovider_api_request_errors",
            "Cloud provider API calls that returned an error, by provider, request and error kind.",
            errors.clone(),
        );
        Self { duration, errors }
    }

    async fn observe<T>(
        &self,
        provider: &str,
        request: &str,
        call: impl Future<Output = CloudResult<T>>,
    ) -> CloudResult<T> {
        let started = Instant::now();
        let result = call.await;
        let labels = CallLabels {
            provider: provider.to_owned(),
            request: request.to_owned(),
        };
        self.duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        if let Err(err) = &result {
            self.errors
                .get_or_create(&ErrorLabels {
                    provider: labels.provider,
                    request: labels.request,
                    kind: err.kind().to_owned(),
                })
                .inc();
        }
        result
    }
}

/// A provider whose every call is measured and kept within leadership. It offers exactly the parts the
/// inner provider offers.
pub struct MeteredCloud {
    inner: Arc<dyn CloudProvider>,
    metrics: CloudMetrics,
    name: String,
    fence: WriteFence,
}

impl MeteredCloud {
    /// Wraps `inner`; its calls run while `fence` (the leader's, or an unenforced one) is open.
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: CloudMetrics, fence: WriteFence) -> Self {
        let name = inner.provider_name().to_owned();
        Self {
            inner,
            metrics,
            name,
            fence,
        }
    }

    async fn observe<T>(
        &self,
        request: &str,
        call: impl Future<Output = CloudResult<T>>,
    ) -> CloudResult<T> {
        let leadership = Leadership::new(Arc::new(self.fence.clone()));
        let fenced = async {
            if let Some(lapsed) = self.fence.closed_for() {
                return Err(CloudError::LeadershipLost { lapsed });
            }
            tokio::select! {
                // The fence first: a call resuming after a freeze finds it closed before it goes on.
                biased;
                lapsed = self.fence.closed() => {
                    tracing::warn!(request, ?lapsed, "cloud call dropped: leadership lapsed while it ran");
                    Err(CloudError::LeadershipLost { lapsed })
                }
                result = call => result,
            }
        };
        self.metrics
            .observe(&self.name, request, leadership.scope(fenced))
            .await
    }

    /// Measures `call` on the inner part `part`, which exists whenever the wrapper offered it
    /// (`NotImplemented` guards a provider that withdrew it between the accessor and the call).
    async fn call<'a, P: ?Sized, F, T>(
        &self,
        request: &str,
        part: Option<&'a P>,
        call: impl FnOnce(&'a P) -> F,
    ) -> CloudResult<T>
    where
        F: Future<Output = CloudResult<T>>,
    {
        let part = part.ok_or(CloudError::NotImplemented)?;
        self.observe(request, call(part)).await
    }
}

#[async_trait]
impl CloudProvider for MeteredCloud {
    async fn initialize(&self, ctx: InitializeContext) -> CloudResult<()> {
        self.inner.initialize(ctx).await
    }
    offer_wrapped_parts!(
        load_balancer: LoadBalancer,
        instances: Instances,
        instances_v2: InstancesV2,
        zones: Zones,
        clusters: Clusters,
        routes: Routes,
    );
    fn provider_name(&self) -> &str {
        &self.name
    }
    forward_provider_answers!();
    async fn hand_off(&self) {
        self.inner.hand_off().await;
    }
}

/// Implements `$trait` for [`MeteredCloud`]: each method listed calls the inner provider's part `$part`,
/// measured (and fenced) under the method's name; `with forward_…` adds the methods that the inner part
/// answers as it is ([`crate::forward`]).
macro_rules! metered {
    ($trait:ident via $part:ident $(with $forwarded:ident)? { $(
        async fn $method:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;
    )* }) => {
        #[async_trait]
        impl $trait for MeteredCloud {
            $($forwarded!();)?
            $(async fn $method(&self $(, $arg: $ty)*) -> $ret {
                self.call(stringify!($method), self.inner.$part(), |part| part.$method($($arg),*))
                    .await
            })*
        }
    };
}

metered!(LoadBalancer via load_balancer with forward_load_balancer_answers {
    async fn get_load_balancer(&self, cluster: &str, service: &Service)
        -> CloudResult<Option<LoadBalancerStatus>>;
    async fn ensure_load_balancer(&self, cluster: &str, service: &Service, nodes: &[Arc<Node>])
        -> CloudResult<LoadBalancerStatus>;
    async fn update_load_balancer(&self, cluster: &str, service: &Service, nodes: &[Arc<Node>])
        -> CloudResult<()>;
    async fn ensure_load_balancer_deleted(&self, cluster: &str, service: &Service)
        -> CloudResult<()>;
    async fn preview_load_balancer(&self, cluster: &str, service: &Service, nodes: &[Arc<Node>])
        -> CloudResult<LoadBalancerPreview>;
    async fn retain_load_balancer(&self, cluster: &str, service: &Service) -> CloudResult<()>;
    async fn list_load_balancers(&self, cluster: &str) -> CloudResult<Vec<ClusterLoadBalancer>>;
    async fn delete_orphaned_load_balancer(
        &self, cluster: &str, load_balancer: &ClusterLoadBalancer
    ) -> CloudResult<()>;
});

metered!(Instances via instances {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>>;
    async fn node_addresses_by_provider_id(&self, provider_id: &str)
        -> CloudResult<Vec<NodeAddress>>;
    async fn instance_id(&self, node_name: &str) -> CloudResult<String>;
    async fn instance_type(&self, node_name: &str) -> CloudResult<String>;
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String>;
    async fn add_ssh_key_to_all_instances(&self, user: &str, key: &[u8]) -> CloudResult<()>;
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String>;
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
});

metered!(InstancesV2 via instances_v2 {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;
});

metered!(Zones via zones {
    async fn get_zone(&self) -> CloudResult<Zone>;
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone>;
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone>;
});

metered!(Clusters via clusters {
    async fn list_clusters(&self) -> CloudResult<Vec<String>>;
    async fn master(&self, cluster_name: &str) -> CloudResult<String>;
});

metered!(Routes via routes {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>>;
    async fn create_route(&self, cluster: &str, name_hint: &str, route: &Route) -> CloudResult<()>;
    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()>;
});

#[cfg(test)]
mod tests {
    use cloud_provider_fake::FakeCloud;
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[tokio::test]
    async fn a_call_is_dropped_when_leadership_lapses_while_it_runs() {
        let mut registry = Registry::default();
        let metrics = CloudMetrics::register(&mut registry);
        let fake = FakeCloud::from_yaml("latency: 300ms\n").unwrap();
        let fence = WriteFence::default();
        let cloud = MeteredCloud::new(Arc::new(fake.clone()), metrics, fence.clone());
        let mut service = Service::default();
        service.metadata.namespace = Some("shop".into());
        service.metadata.name = Some("web".into());
        service.metadata.uid = Some("11111111-1111-1111-1111-111111111111".into());
        let lb = cloud.load_balancer().unwrap();

        // Never acquired: refused before the provider is called.
        let err = lb
            .ensure_load_balancer("k", &service, &[])
            .await
            .unwrap_err();
        assert!(matches!(err, CloudError::LeadershipLost { .. }), "{err}");
        assert_eq!(fake.snapshot().calls_to("ensure_load_balancer"), 0);

        // Leading for 100 ms of the call's 300: dropped at the deadline, nothing created.
        fence.allow_until(std::time::Instant::now() + std::time::Duration::from_millis(100));
        let started = std::time::Instant::now();
        let err = lb
            .ensure_load_balancer("k", &service, &[])
            .await
            .unwrap_err();
        assert!(matches!(err, CloudError::LeadershipLost { .. }), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_millis(300));
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert!(fake.snapshot().load_balancers.is_empty());

        // Leading throughout: the call completes.
        fence.allow_until(std::time::Instant::now() + std::time::Duration::from_secs(60));
        lb.ensure_load_balancer("k", &service, &[]).await.unwrap();
        assert_eq!(fake.snapshot().load_balancers.len(), 1);
    }

    #[tokio::test]
    async fn every_call_is_timed_and_errors_counted_by_kind() {
        let mut registry = Registry::default();
        let metrics = CloudMetrics::register(&mut registry);
        let fake = FakeCloud::from_yaml("instances:\n  gone: {state: gone}\nfailureRate: {list_routes: 1}\nloadBalancers: {enabled: false}\n").unwrap();
        let cloud = MeteredCloud::new(Arc::new(fake), metrics, WriteFence::unenforced());
        assert!(
            cloud.load_balancer().is_none(),
            "offers what the inner cloud offers"
        );
        assert!(cloud.instances_v2().is_some() && cloud.routes().is_some());
        let mut node = Node::default();
        node.metadata.name = Some("gone".into());
        assert!(matches!(
            cloud.instances_v2().unwrap().instance_metadata(&node).await,
            Err(CloudError::InstanceNotFound)
        ));
        assert!(cloud.routes().unwrap().list_routes("k").await.is_err());
        node.metadata.name = Some("here".into());
        assert!(
            cloud
                .instances_v2()
                .unwrap()
                .instance_exists(&node)
                .await
                .unwrap()
        );

        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"cloudprovider_api_request_duration_seconds_count{provider="fake",request="instance_metadata"} 1"#), "{text}");
        assert!(text.contains(r#"cloudprovider_api_request_duration_seconds_count{provider="fake",request="instance_exists"} 1"#));
        assert!(text.contains(r#"cloudprovider_api_request_errors_total{provider="fake",request="instance_metadata",kind="instance_not_found"} 1"#));
        assert!(text.contains(r#"cloudprovider_api_request_errors_total{provider="fake",request="list_routes",kind="other"} 1"#));
        assert!(
            !text.contains(r#"request="instance_exists",kind"#),
            "no error for a successful call"
        );
    }
}
