//! The generic controllers, and the table the `--controllers` flag is resolved against.

/// A controller the manager knows: its canonical name and the legacy alias `--controllers` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerName {
    /// The canonical name (upstream `names/controller_names.go`).
    pub name: &'static str,
    /// The legacy name, rewritten to `name` when parsing `--controllers`.
    pub alias: &'static str,
}

/// Every controller, in the order the manager starts them.
pub const KNOWN_CONTROLLERS: &[ControllerName] = &[
    ControllerName {
        name: "cloud-node-controller",
        alias: "cloud-node",
    },
    ControllerName {
        name: "cloud-node-lifecycle-controller",
        alias: "cloud-node-lifecycle",
    },
    ControllerName {
        name: "service-lb-controller",
        alias: "service",
    },
    ControllerName {
        name: "node-route-controller",
        alias: "route",
    },
    ControllerName {
        name: "node-ipam-controller",
        alias: "nodeipam",
    },
];

/// Controllers that `*` does not enable (upstream's set is empty).
pub const DISABLED_BY_DEFAULT: &[&str] = &[];

pub mod ipam;
pub mod node;
pub mod node_lifecycle;
pub mod outage;
mod patch;
pub mod route;
pub mod service;

use std::{future::Future, pin::Pin, sync::Arc};

use cloud_provider::CloudProvider;
use tokio_util::sync::CancellationToken;

use crate::{
    app::Options,
    informers::{SharedNodes, SharedServices},
    metrics::Metrics,
};

/// What every controller gets from the manager.
#[derive(Clone)]
pub struct ControllerContext {
    /// This controller's API client, with its own `--kube-api-qps` / `--kube-api-burst` bucket.
    pub client: kube::Client,
    /// The client events are written through (a bucket of its own, as upstream's event sink).
    pub events_client: kube::Client,
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// Cancelled on shutdown: stop taking new work, finish what is in flight.
    pub shutdown: CancellationToken,
    /// The manager's flags.
    pub options: Arc<Options>,
    /// The shared Node cache.
    pub nodes: Arc<SharedNodes>,
    /// The shared Service cache.
    pub services: Arc<SharedServices>,
    /// The manager's metrics.
    pub metrics: Metrics,
}

/// A running controller: resolves when the controller stops, with an error message if it failed.
pub type ControllerTask = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Starts the controller `name`, or returns `None` when it does not run: it is not part of this build
/// yet, or the cloud does not offer what it needs.
pub fn start(name: &str, context: ControllerContext) -> Option<ControllerTask> {
    match name {
        "cloud-node-controller" => node::start(context),
        "cloud-node-lifecycle-controller" => node_lifecycle::start(context),
        "service-lb-controller" => service::start(context),
        "node-route-controller" => route::start(context),
        "node-ipam-controller" => ipam::start(context),
        _ => None,
    }
}
