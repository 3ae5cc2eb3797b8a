//! The generic controllers. Each module owns a typed `Config` and a `start` function; the table that
//! names them for `--controllers` and builds their configs from the flags is
//! [`crate::app::controller_table`].

mod backoff;
pub mod controller_health;
pub mod ipam;
pub mod node;
pub mod node_lifecycle;
pub mod outage;
mod patch;
pub mod queue_metrics;
pub mod route;
pub mod service;
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
    /// The controller's name in the table (`--controllers`): its work queue's `name` label.
    pub name: &'static str,
    /// The controller's health check behind `/healthz` (reconciles that keep panicking fail it).
    pub health: controller_health::ControllerHealth,
}

/// A running controller: resolves when the controller stops, with its error if it failed (which stops
/// the manager, naming the controller).
pub type ControllerTask = Pin<Box<dyn Future<Output = Result<(), ControllerError>> + Send>>;

/// Why a controller stopped with an error. `?` converts the API client's and the cloud's errors, and
/// a message (`String`, `&str`) becomes [`ControllerError::Failed`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// An API server call failed for good.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A cloud call failed for good.
    #[error(transparent)]
    Cloud(#[from] cloud_provider::CloudError),
    /// Anything else, said in words.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for ControllerError {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

impl From<&str> for ControllerError {
    fn from(message: &str) -> Self {
        Self::Failed(message.to_owned())
    }
}
