//! The network-topology labels `topology.k8s.aws/network-node-layer-<N>`, as upstream's
//! `instanceTopologyManager` sets them: `DescribeInstanceTopology` names the network nodes between an
//! instance and the region's spine (layer 1 the farthest), for the instance types AWS reports it for
//! (HPC, Trainium, P-series GPU). Types, instances and regions that get no answer are remembered for
//! 24 hours, so a cluster of other types asks once per type, not once per node.
//!
//! As upstream: a type that matches `SupportedTopologyInstanceTypePattern` (default
//! `^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$`) is expected to have a topology, so a failed
//! call fails the node's initialization (it is retried) and an empty answer marks only that instance;
//! for any other type a failed call is logged and the node goes on without the labels, and an empty
//! answer marks the type. A region without the API (`UnsupportedOperation`) or a role without the
//! permission (`UnauthorizedOperation`) marks the region.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::{Error, error::Result, sdk::Calls};

/// The labels' prefix; the layer number (from 1) follows.
pub const NETWORK_NODE_LABEL_PREFIX: &str = "topology.k8s.aws/network-node-layer-";

/// Upstream's `defaultSupportedTopologyInstanceTypePattern`.
pub const DEFAULT_TOPOLOGY_INSTANCE_TYPES: &str =
    r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$";

/// How long a type, instance or region without a topology is not asked again (upstream's
/// `instanceTopologyManagerCacheTimeout`).
const UNSUPPORTED_FOR: Duration = Duration::from_secs(24 * 60 * 60);

/// Asks AWS for instances' network topology, remembering what has none.
pub struct Topology {
    calls: Calls,
    expected: regex_lite::Regex,
    /// Region, instance ID or instance type → when it was found to have no topology.
    unsupported: Mutex<HashMap<String, Instant>>,
    /// One look-up at a time per instance type not expected to have a topology, so that a burst of new
    /// nodes of one type asks AWS once, and the others find its (empty) answer remembered. Expected
    /// types are not serialized: each of their instances needs its own answer.
    type_turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Topology {
    /// Topology over `calls`; `expected` matches the instance types that must have one.
    pub fn new(calls: Calls, expected: regex_lite::Regex) -> Self {
        Self {
            calls,
            expected,
            unsupported: Mutex::new(HashMap::new()),
            type_turns: Mutex::new(HashMap::new()),
        }
    }

    /// The labels of one instance: `network-node-layer-1` … `-N`, or none (a type without a
    /// topology, a region without the API, or the node has the labels already: `labelled`).
    pub async fn labels(
        &self,
        instance_id: &str,
        instance_type: &str,
        region: &str,
        labelled: bool,
    ) -> Result<BTreeMap<String, String>> {
        if labelled
            || instance_type.is_empty()
            || [region, instance_id, instance_type]
                .iter()
                .any(|key| self.is_unsupported(key))
        {
            return Ok(BTreeMap::new());
        }
        let expected = self.expected.is_match(instance_type);
        let turn = (!expected).then(|| {
            self.type_turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(instance_type.to_owned())
                .or_default()
                .clone()
        });
        let _turn = match &turn {
            Some(turn) => Some(turn.lock().await),
            None => None,
        };
        if turn.is_some() && self.is_unsupported(instance_type) {
            return Ok(BTreeMap::new());
        }
        let ec2 = &self.calls.clients.ec2;
        let answer = self
            .calls
            .call("DescribeInstanceTopology", || {
                ec2.describe_instance_topology()
                    .instance_ids(instance_id)
                    .send()
            })
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(Error::Api {
                code: Some(code), ..
            }) if code == "UnsupportedOperation" || code == "UnauthorizedOperation" => {
                tracing::warn!(
                    region,
                    code,
                    "DescribeInstanceTopology is not available; nodes in this region get no network-topology labels for 24 h"
                );
                self.mark_unsupported(region);
                return Ok(BTreeMap::new());
            }
            Err(err) if expected => return Err(err),
            Err(err) => {
                tracing::warn!(instance_id, instance_type, error = %err, "no network-topology labels: DescribeInstanceTopology failed");
                return Ok(BTreeMap::new());
            }
        };
        let Some(topology) = answer
            .instances()
            .iter()
            .find(|i| i.instance_id() == Some(instance_id))
        else {
            // An expected type may be shutting down: remember the instance, not its type.
            self.mark_unsupported(if expected { instance_id } else { instance_type });
            return Ok(BTreeMap::new());
        };
        Ok(topology
            .network_nodes()
            .iter()
            .enumerate()
            .map(|(i, node)| {
                (
                    format!("{NETWORK_NODE_LABEL_PREFIX}{}", i + 1),
                    node.clone(),
                )
            })
            .collect())
    }

    fn is_unsupported(&self, key: &str) -> bool {
        let mut unsupported = self.unsupported();
        match unsupported.get(key) {
            Some(since) if since.elapsed() < UNSUPPORTED_FOR => true,
            Some(_) => {
                unsupported.remove(key);
                false
            }
            None => false,
        }
    }

    fn mark_unsupported(&self, key: &str) {
        self.unsupported().insert(key.to_owned(), Instant::now());
    }

    fn unsupported(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.unsupported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_default_pattern_matches_the_types_with_a_topology() {
        let pattern = regex_lite::Regex::new(DEFAULT_TOPOLOGY_INSTANCE_TYPES).unwrap();
        for t in [
            "p5.48xlarge",
            "p4d.24xlarge",
            "trn1.32xlarge",
            "trn1n.32xlarge",
            "hpc7g.16xlarge",
            "p5e-foo.48xlarge",
        ] {
            assert!(pattern.is_match(t), "{t}");
        }
        for t in ["t3.medium", "m5.large", "c7g.xlarge", "inf2.xlarge", "p5"] {
            assert!(!pattern.is_match(t), "{t}");
        }
    }
}
