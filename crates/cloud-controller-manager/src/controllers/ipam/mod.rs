//! The node-IPAM controller (`node-ipam-controller`, alias `nodeipam`; upstream has it only in the
//! Kubernetes example `main`): with `--allocate-node-cidrs`, gives every Node a pod CIDR per cluster
//! CIDR family (`spec.podCIDR` and `spec.podCIDRs`), never the same one twice.
//!
//! At start it rebuilds which CIDRs are taken from the Nodes themselves, so a restart reallocates
//! nothing; a deleted Node's CIDRs are freed; an exhausted range is a `CIDRNotAvailable` event on the
//! Node that could not get one (retried as CIDRs free up), not a failure for the others.

pub mod allocator;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};
use serde_json::json;

use self::allocator::CidrSet;
use super::{ControllerContext, ControllerTask};
use crate::{
    app::options::{CloudProviderOptions, NodeIpamOptions},
    cidrs::{is_v4, parse_cidr_list},
    events::EventRecorder,
    informers::Change,
};

/// The event source, as upstream's range allocator names it.
pub const COMPONENT: &str = "cidrAllocator";

/// How often nodes still waiting for a CIDR are retried.
const RETRY: Duration = Duration::from_secs(5);

/// The node CIDR sets the flags describe, each with the service range occupied.
pub fn cidr_sets(
    cloud: &CloudProviderOptions,
    ipam: &NodeIpamOptions,
) -> Result<Vec<CidrSet>, String> {
    let clusters = parse_cidr_list("--cluster-cidr", &cloud.cluster_cidr)?;
    let dual = clusters.len() == 2;
    if dual && ipam.node_cidr_mask_size != 0 {
        return Err("--node-cidr-mask-size cannot be used with a dual-stack --cluster-cidr; use --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6".to_owned());
    }
    let services = if ipam.service_cluster_ip_range.trim().is_empty() {
        Vec::new()
    } else {
        parse_cidr_list("--service-cluster-ip-range", &ipam.service_cluster_ip_range)?
    };
    clusters
        .into_iter()
        .map(|cluster| {
            let mask = match (dual, is_v4(&cluster), ipam.node_cidr_mask_size) {
                (false, _, size) if size != 0 => size,
                (_, true, _) => ipam.node_cidr_mask_size_ipv4,
                (_, false, _) => ipam.node_cidr_mask_size_ipv6,
            };
            let mut set = CidrSet::new(cluster, mask)
                .map_err(|err| format!("--cluster-cidr {cluster}: {err}"))?;
            for service in &services {
                set.occupy(service);
            }
            Ok(set)
        })
        .collect()
}

fn pod_cidrs(node: &Node) -> Vec<IpNet> {
    node.spec
        .as_ref()
        .and_then(|s| {
            s.pod_cidrs
                .clone()
                .or_else(|| s.pod_cidr.clone().map(|c| vec![c]))
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .collect()
}

struct Allocator {
    api: Api<Node>,
    events: EventRecorder,
    sets: Vec<CidrSet>,
    /// The CIDRs each node holds (as we know them), to free them when the node goes.
    held: BTreeMap<String, Vec<IpNet>>,
    /// Nodes that could not get CIDRs yet (exhausted range, or a failed write).
    waiting: BTreeMap<String, Arc<Node>>,
}

impl Allocator {
    fn occupy(&mut self, node: &Node) {
        let cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            return;
        }
        for cidr in &cidrs {
            for set in &mut self.sets {
                set.occupy(cidr);
            }
        }
        self.held.insert(node.name_any(), cidrs);
    }

    fn release(&mut self, name: &str) {
        if let Some(cidrs) = self.held.remove(name) {
            for cidr in &cidrs {
                for set in &mut self.sets {
                    set.release(cidr);
                }
            }
        }
    }

    /// Gives `node` one CIDR per set, unless it has CIDRs already.
    async fn allocate(&mut self, node: Arc<Node>) {
        let name = node.name_any();
        if !pod_cidrs(&node).is_empty() {
            self.occupy(&node);
            self.waiting.remove(&name);
            return;
        }
        let mut cidrs = Vec::new();
        for set in &mut self.sets {
            match set.allocate() {
                Some(cidr) => cidrs.push(cidr),
                None => {
                    let cluster = set.cluster();
                    for (taken, set) in cidrs.iter().zip(self.sets.iter_mut()) {
                        set.release(taken);
                    }
                    tracing::warn!(node = %name, %cluster, "no pod CIDR left for the node");
                    self.events
                        .record(
                            node.as_ref(),
                            EventType::Normal,
                            "CIDRNotAvailable",
                            "AllocateCIDR",
                            format!("Node {name} status is now: CIDRNotAvailable"),
                        )
                        .await;
                    self.waiting.insert(name, node);
                    return;
                }
            }
        }
        let texts: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let patch = json!({ "spec": { "podCIDR": texts[0], "podCIDRs": texts } });
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                tracing::info!(node = %name, cidrs = ?texts, "allocated pod CIDRs");
                self.held.insert(name.clone(), cidrs);
                self.waiting.remove(&name);
                // A node that already had CIDRs (set concurrently) keeps those; ours go back.
                if pod_cidrs(&updated) != self.held[&name] {
                    self.release(&name);
                    self.occupy(&updated);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                for (cidr, set) in cidrs.iter().zip(self.sets.iter_mut()) {
                    set.release(cidr);
                }
                self.waiting.remove(&name);
            }
            Err(err) => {
                for (cidr, set) in cidrs.iter().zip(self.sets.iter_mut()) {
                    set.release(cidr);
                }
                tracing::warn!(node = %name, error = %err, "could not write the node's pod CIDRs; will retry");
                self.events
                    .record(
                        node.as_ref(),
                        EventType::Warning,
                        "CIDRAssignmentFailed",
                        "AllocateCIDR",
                        format!("Node {name} status is now: CIDRAssignmentFailed"),
                    )
                    .await;
                self.waiting.insert(name, node);
            }
        }
    }

    async fn retry_waiting(&mut self) {
        let waiting: Vec<Arc<Node>> = self.waiting.values().cloned().collect();
        for node in waiting {
            self.allocate(node).await;
        }
    }
}

/// Starts the controller: `None` (logged) without `--allocate-node-cidrs`.
pub fn start(ctx: ControllerContext) -> Option<ControllerTask> {
    if !ctx.options.ipam.allocate_node_cidrs {
        tracing::info!("node-ipam-controller not started: --allocate-node-cidrs is false");
        return None;
    }
    let sets = match cidr_sets(&ctx.options.cloud, &ctx.options.ipam) {
        Ok(sets) => sets,
        Err(err) => {
            // The app validates these flags before any controller starts; this is only a safeguard.
            tracing::error!(error = %err, "node-ipam-controller not started");
            return None;
        }
    };
    let changes = ctx.nodes.subscribe_changes();
    let nodes = ctx.nodes.clone();
    let allocator = Allocator {
        api: Api::all(ctx.client.clone()),
        events: EventRecorder::new(ctx.events_client.clone(), COMPONENT),
        sets,
        held: BTreeMap::new(),
        waiting: BTreeMap::new(),
    };
    let shutdown = ctx.shutdown.clone();
    Some(Box::pin(async move {
        tokio::select! {
            () = nodes.wait_until_synced() => {}
            () = shutdown.cancelled() => return Ok(()),
        }
        run(allocator, nodes.store().state(), changes, shutdown).await;
        Ok(())
    }))
}

async fn run(
    mut allocator: Allocator,
    existing: Vec<Arc<Node>>,
    changes: impl Stream<Item = Change<Node>> + Send,
    shutdown: tokio_util::sync::CancellationToken,
) {
    // What is taken first, from every node, so nothing is handed out twice after a restart.
    for node in &existing {
        allocator.occupy(node);
    }
    tracing::info!(
        nodes = existing.len(),
        held = allocator.held.len(),
        "node CIDR allocations rebuilt from the cluster"
    );
    let mut changes = Box::pin(changes);
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Change::Applied(node)) => {
                    if node.metadata.deletion_timestamp.is_none() {
                        allocator.allocate(node).await;
                    }
                }
                Some(Change::Deleted(node)) => {
                    let name = node.name_any();
                    allocator.waiting.remove(&name);
                    allocator.release(&name);
                    // Freed CIDRs may serve a node that is waiting.
                    allocator.retry_waiting().await;
                }
                None => return,
            },
            _ = retry.tick(), if !allocator.waiting.is_empty() => allocator.retry_waiting().await,
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(cluster: &str, size: u8, services: &str) -> (CloudProviderOptions, NodeIpamOptions) {
        (
            CloudProviderOptions {
                cloud_provider: "fake".into(),
                cloud_config: String::new(),
                cluster_name: "kubernetes".into(),
                cluster_cidr: cluster.into(),
                allow_untagged_cloud: false,
            },
            NodeIpamOptions {
                allocate_node_cidrs: true,
                cidr_allocator_type: "RangeAllocator".into(),
                node_cidr_mask_size: size,
                node_cidr_mask_size_ipv4: 24,
                node_cidr_mask_size_ipv6: 64,
                service_cluster_ip_range: services.into(),
            },
        )
    }

    #[test]
    fn mask_sizes_follow_the_stack() {
        let (cloud, ipam) = options("10.244.0.0/16", 0, "");
        let sets = cidr_sets(&cloud, &ipam).unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].free(), 256);
        let (cloud, ipam) = options("10.244.0.0/16", 26, "");
        assert_eq!(cidr_sets(&cloud, &ipam).unwrap()[0].free(), 1024);
        let (cloud, ipam) = options("10.244.0.0/16,fd00:10:244::/56", 0, "");
        let sets = cidr_sets(&cloud, &ipam).unwrap();
        assert_eq!((sets[0].free(), sets[1].free()), (256, 256));
        let (cloud, ipam) = options("10.244.0.0/16,fd00:10:244::/56", 24, "");
        assert!(
            cidr_sets(&cloud, &ipam)
                .unwrap_err()
                .contains("--node-cidr-mask-size cannot be used")
        );
        let (cloud, ipam) = options("", 0, "");
        assert!(
            cidr_sets(&cloud, &ipam)
                .unwrap_err()
                .contains("--cluster-cidr is empty")
        );
    }

    #[test]
    fn the_service_range_is_never_handed_out() {
        let (cloud, ipam) = options("10.0.0.0/16", 0, "10.0.0.0/20");
        let mut sets = cidr_sets(&cloud, &ipam).unwrap();
        assert_eq!(sets[0].free(), 256 - 16);
        assert_eq!(sets[0].allocate().unwrap().to_string(), "10.0.16.0/24");
    }
}
