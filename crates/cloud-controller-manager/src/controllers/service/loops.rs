//! The service controller's loops beside its work queue: deletions, the node sync, the orphan sweep,
//! the drift check and the provider's settings changes, each a supervised background loop.

use std::{sync::Arc, time::Duration};

use futures::Stream;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;

use super::{Context, deletion, drift, node_sync, settings, sweep};
use crate::{
    cached_node::CachedNode,
    controllers::{
        ControllerContext,
        background_loop::{BackgroundLoop, Ends},
    },
    informers::Change,
};

/// The running loops, waited for when the controller stops.
pub(super) struct Loops {
    deletions: BackgroundLoop,
    node_sync: BackgroundLoop,
    sweep: Option<BackgroundLoop>,
    drift: Option<BackgroundLoop>,
    settings: Option<BackgroundLoop>,
}

impl Loops {
    /// Starts the loops: the sweep when `orphan_sweep_period` is set, the drift check when `drift` is,
    /// the settings loop when the provider reports settings changes.
    pub(super) fn spawn(
        controller: &ControllerContext,
        context: &Arc<Context>,
        deletions: mpsc::UnboundedReceiver<Arc<Service>>,
        node_changes: impl Stream<Item = Change<CachedNode>> + Send + 'static,
        services: &Store<Service>,
        orphan_sweep_period: Option<Duration>,
        drift: Option<(Duration, drift::DriftAction)>,
    ) -> Self {
        let shutdown = &controller.shutdown;
        let deletions = controller.spawn_loop(
            "deletions",
            Ends::AtShutdown,
            deletion::handle_deletions(context.clone(), deletions, shutdown.clone()),
        );
        let node_sync = controller.spawn_loop(
            "node-sync",
            Ends::AtShutdown,
            node_sync::node_sync_loop(context.clone(), node_changes, shutdown.clone()),
        );
        let sweep = orphan_sweep_period.map(|period| {
            controller.spawn_loop(
                "orphan-sweep",
                Ends::WhenNothingToDo,
                sweep::sweep_loop(context.clone(), services.clone(), period, shutdown.clone()),
            )
        });
        let drift = drift.map(|(period, action)| {
            controller.spawn_loop(
                "drift-check",
                Ends::WhenNothingToDo,
                drift::drift_loop(context.clone(), period, action, shutdown.clone()),
            )
        });
        let settings = context
            .cloud
            .load_balancer()
            .and_then(|lb| lb.settings_changes())
            .map(|changes| {
                controller.spawn_loop(
                    "settings-changes",
                    Ends::WhenNothingToDo,
                    settings::settings_loop(context.clone(), changes, shutdown.clone()),
                )
            });
        Self {
            deletions,
            node_sync,
            sweep,
            drift,
            settings,
        }
    }

    /// Waits until every loop has ended (they end at shutdown).
    pub(super) async fn finished(self) {
        self.deletions.finished().await;
        self.node_sync.finished().await;
        for running in [self.sweep, self.drift, self.settings]
            .into_iter()
            .flatten()
        {
            running.finished().await;
        }
    }
}
