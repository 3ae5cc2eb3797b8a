//! What the provider decorators ([`crate::cloud_metrics::MeteredCloud`] and
//! [`crate::shadow::ShadowCloud`]) hand to the provider they wrap as it is: the methods that neither
//! call the cloud nor write, written once here for both. Each macro is invoked inside the decorator's
//! trait impl, and uses the decorator's `inner: Arc<dyn CloudProvider>` field.
//!
//! The async methods (`initialize`, `hand_off`) stay in each impl: `async_trait` rewrites the methods
//! it sees, and does not see into a macro. The test `decorators_forward_every_method` reads these
//! macros' bodies as part of the impls that invoke them.

/// The `CloudProvider` accessors of the parts a decorator wraps, `part: Trait` each: the decorator
/// offers itself as the part whenever the wrapped provider offers it.
macro_rules! offer_wrapped_parts {
    ($($part:ident: $trait:ident),* $(,)?) => {
        $(
            fn $part(&self) -> Option<&dyn $trait> {
                self.inner.$part().map(|_| self as &dyn $trait)
            }
        )*
    };
}
pub(crate) use offer_wrapped_parts;

/// The `CloudProvider` methods that answer what the wrapped provider answers.
macro_rules! forward_provider_answers {
    () => {
        fn owns_provider_id(&self, provider_id: &str) -> bool {
            self.inner.owns_provider_id(provider_id)
        }
        fn recognizes_node(&self, node: &::k8s_openapi::api::core::v1::Node) -> bool {
            self.inner.recognizes_node(node)
        }
        fn register_metrics(&self, registry: &mut ::prometheus_client::registry::Registry) {
            self.inner.register_metrics(registry);
        }
        fn has_cluster_id(&self) -> bool {
            self.inner.has_cluster_id()
        }
        fn rides_out_api_outages(&self) -> bool {
            self.inner.rides_out_api_outages()
        }
        fn hands_off_traffic(&self) -> bool {
            self.inner.hands_off_traffic()
        }
    };
}
pub(crate) use forward_provider_answers;

/// The `LoadBalancer` methods that answer what the wrapped provider's load balancer answers (or the
/// trait's default, when the provider withdrew its load balancer between the accessor and the call).
macro_rules! forward_load_balancer_answers {
    () => {
        fn get_load_balancer_name(
            &self,
            cluster: &str,
            service: &::k8s_openapi::api::core::v1::Service,
        ) -> String {
            self.inner
                .load_balancer()
                .map(|lb| lb.get_load_balancer_name(cluster, service))
                .unwrap_or_else(|| ::cloud_provider::default_load_balancer_name(service))
        }
        fn backends_beyond_owned_nodes(&self) -> bool {
            self.inner
                .load_balancer()
                .is_some_and(|lb| lb.backends_beyond_owned_nodes())
        }
        fn backend_label_keys(
            &self,
            service: &::k8s_openapi::api::core::v1::Service,
        ) -> Vec<String> {
            self.inner
                .load_balancer()
                .map(|lb| lb.backend_label_keys(service))
                .unwrap_or_default()
        }
        fn service_label_keys(&self) -> Vec<String> {
            self.inner
                .load_balancer()
                .map(|lb| lb.service_label_keys())
                .unwrap_or_default()
        }
        fn settings_changes(&self) -> Option<::tokio::sync::watch::Receiver<u64>> {
            self.inner.load_balancer()?.settings_changes()
        }
        fn retains_load_balancers(&self) -> bool {
            self.inner
                .load_balancer()
                .is_some_and(|lb| lb.retains_load_balancers())
        }
    };
}
pub(crate) use forward_load_balancer_answers;
