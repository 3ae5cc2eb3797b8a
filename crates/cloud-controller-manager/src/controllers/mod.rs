//! What a controller is made of: its context ([`ControllerContext`]: clients, cloud, shared caches,
//! metrics, health, stop token), its task ([`ControllerTask`], ending with a [`ControllerError`]), and
//! the two runners every controller runs on: the work queue ([`run_on_work_queue`]) for controllers
//! that reconcile objects one by one, and the periodic runner ([`periodic::Runner`]) for those that
//! work in passes. The built-in controllers (cloud-node, cloud-node-lifecycle, service, route, node
//! IPAM) are internal; a provider's own controller joins the table with
//! [`crate::ControllerSpec`] and [`crate::Manager::with_controller`].

pub mod background_loop;
mod backoff;
pub mod controller_health;
pub(crate) mod ipam;
pub(crate) mod node;
pub(crate) mod node_lifecycle;
mod patch;
pub mod periodic;
pub(crate) mod provider_panic;
pub(crate) mod queue_metrics;
pub(crate) mod route;
pub(crate) mod service;
pub(crate) mod work_queue;

pub use work_queue::{Next, run_on_work_queue};

use std::{future::Future, pin::Pin, sync::Arc};

use cloud_provider::CloudProvider;
use tokio_util::sync::CancellationToken;

use crate::{informers::InformerFactory, metrics::Metrics};

/// What every controller gets from the manager.
#[derive(Clone)]
pub struct ControllerContext {
    /// This controller's API client, with its own `--kube-api-qps` / `--kube-api-burst` bucket. With
    /// `--use-service-account-credentials` it authenticates as the controller's ServiceAccount
    /// ([`crate::ControllerSpec::client_name`]), else as the manager.
    pub client: kube::Client,
    /// The client events are written through (a bucket of its own, as upstream's event sink), with the
    /// same identity as `client`.
    pub events_client: kube::Client,
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// The stop token: cancelled on a graceful shutdown (stop taking new work; the manager waits for
    /// the task, so finish what is in flight) and also when this replica loses its leadership (then the
    /// manager exits at once and in-flight work is abandoned; its writes are fenced).
    pub shutdown: CancellationToken,
    /// The shared caches: ask for the ones the controller reads (`informers.nodes()`,
    /// `informers.services()`) in its start function, before it returns its task, and the manager starts
    /// them with every other controller's once all have started; wait for them in the task with
    /// [`crate::informers::wait_for_cache_sync`].
    pub informers: InformerFactory,
    /// The manager's metrics.
    pub metrics: Metrics,
    /// Which nodes this manager owns (`--node-selector` and the provider's IDs): act on those only.
    pub ownership: crate::node_ownership::NodeOwnership,
    /// The controller's name in the table (`--controllers`): its work queue's `name` label.
    pub name: &'static str,
    /// The controller's health check behind `/healthz` (reconciles that keep panicking fail it).
    pub health: controller_health::ControllerHealth,
}

impl ControllerContext {
    /// Whether the cloud offers either Instances API; when it offers neither, warns that `controller`,
    /// which needs one, does not start.
    pub(crate) fn offers_instances(&self, controller: &str) -> bool {
        if self.cloud.instances_v2().is_none() && self.cloud.instances().is_none() {
            tracing::warn!(
                controller,
                "cloud provider does not support instances; not starting"
            );
            return false;
        }
        true
    }

    /// Runs `task` as the background loop `loop_name` of this controller, beside its work queue or
    /// passes ([`background_loop`]): if it panics, or ends while the manager is not stopping when
    /// `ends` says it must not, that is logged and counted and the controller's health check fails for
    /// good. Wait for it with
    /// [`background_loop::BackgroundLoop::finished`] when the controller stops.
    pub fn spawn_loop(
        &self,
        loop_name: &'static str,
        ends: background_loop::Ends,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> background_loop::BackgroundLoop {
        background_loop::spawn(&self.loop_reporting(), loop_name, ends, task)
    }

    fn loop_reporting(&self) -> background_loop::LoopReporting {
        background_loop::LoopReporting {
            controller: self.name,
            health: self.health.clone(),
            metrics: self.metrics.background_loops.clone(),
            shutdown: self.shutdown.clone(),
        }
    }

    /// The periodic runner of this controller ([`periodic::Runner::run`]): for controllers that work
    /// in passes over every object, with this controller's name, health check and stop token.
    pub fn periodic_runner(&self) -> periodic::Runner {
        periodic::Runner {
            name: self.name,
            health: self.health.clone(),
            metrics: self.metrics.periodic.clone(),
            shutdown: self.shutdown.clone(),
            loops: self.loop_reporting(),
        }
    }
}

/// A running controller: resolves when the controller stops, with its error if it failed (which stops
/// the manager, naming the controller).
pub type ControllerTask = Pin<Box<dyn Future<Output = Result<(), ControllerError>> + Send>>;

/// Why a controller stopped with an error. `?` converts the API client's and the cloud's errors, and
/// a message (`String`, `&str`) becomes [`ControllerError::Other`], as does any error of the
/// controller's own with [`ControllerError::other`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// An API server call failed for good.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A cloud call failed for good.
    #[error(transparent)]
    Cloud(#[from] cloud_provider::CloudError),
    /// The controller's task panicked (a bug); the panic's message.
    #[error("it panicked: {0}")]
    Panicked(String),
    /// An error of the controller's own (its source kept), or a message.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl ControllerError {
    /// An error of the controller's own type, its source chain kept.
    pub fn other(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Other(Box::new(error))
    }
}

impl From<String> for ControllerError {
    fn from(message: String) -> Self {
        Self::Other(message.into())
    }
}

impl From<&str> for ControllerError {
    fn from(message: &str) -> Self {
        Self::Other(message.into())
    }
}
