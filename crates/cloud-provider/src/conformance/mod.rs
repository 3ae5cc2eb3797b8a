//! A reusable test suite for providers: run it against your implementation to check the semantics the
//! generic controllers rely on (idempotent load balancers, not-found rules, route round trips,
//! provider-ID format, ...). Upstream has nothing like it.
//!
//! Each part the provider supports is checked; parts it does not offer are reported as skipped. Give
//! the suite a cloud and [`Fixtures`] that name a node whose instance **runs** in your cloud and one
//! the cloud has no instance for (and, optionally, one whose instance is shut down):
//!
//! ```no_run
//! # async fn example(cloud: std::sync::Arc<dyn cloud_provider::CloudProvider>) {
//! use cloud_provider::conformance::{Fixtures, run};
//!
//! let fixtures = Fixtures::new("node-that-exists", "node-that-does-not");
//! let report = run(cloud.as_ref(), &fixtures).await;
//! report.assert_passed(); // panics with every failed check, by name
//! # }
//! ```
//!
//! Use a cloud (or a test account) whose state the suite may change: it creates and deletes one load
//! balancer and one route. The load balancer's backends are exactly [`Fixtures::backend_nodes`]: the
//! suite adds none of its own.
//!
//! A failure that can come from the fixtures rather than the provider (the "existing" node is not
//! found, say) says so in its message: check the fixture before the provider.

mod checks;

use std::{fmt, sync::Arc};

use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, Service, ServicePort, ServiceSpec},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

use crate::{CloudProvider, Route};

/// What the suite works with.
#[derive(Debug, Clone)]
pub struct Fixtures {
    /// The `--cluster-name` passed to load-balancer and route calls.
    pub cluster_name: String,
    /// A node whose instance exists and **runs** (not stopped, not shut down).
    pub existing_node: Node,
    /// A node the cloud has no instance for.
    pub missing_node: Node,
    /// A node whose instance exists but is shut down (stopped), if your cloud can show one: the
    /// lifecycle controller taints such nodes. `None` skips the shut-down checks.
    pub shutdown_node: Option<Node>,
    /// A `type: LoadBalancer` Service to create a load balancer for (it needs a UID).
    pub service: Service,
    /// The nodes put behind the load balancer: [`Fixtures::new`] uses the existing node only. With two
    /// or more, the update check also moves to fewer backends.
    pub backend_nodes: Vec<Arc<Node>>,
    /// A route to create and delete.
    pub route: Route,
}

impl Fixtures {
    /// Fixtures around two node names: one your cloud has a running instance for, one it does not.
    /// The Service, the backends (the existing node alone) and the route get neutral defaults; change
    /// the fields to suit your cloud.
    pub fn new(existing_node: &str, missing_node: &str) -> Self {
        let backend_nodes = vec![backend_node(existing_node)];
        Self {
            cluster_name: "conformance".to_owned(),
            existing_node: node(existing_node),
            missing_node: node(missing_node),
            shutdown_node: None,
            service: load_balancer_service(
                "conformance",
                "web",
                "4a7d1ed4-6ad1-4d4a-9c35-3b8a0f1c2d3e",
            ),
            backend_nodes,
            route: Route {
                target_node: existing_node.to_owned(),
                destination_cidr: "10.244.7.0/24".to_owned(),
                ..Default::default()
            },
        }
    }

    /// The same fixtures with a node whose instance is shut down.
    pub fn with_shutdown_node(mut self, name: &str) -> Self {
        self.shutdown_node = Some(node(name));
        self
    }

    /// The same fixtures with these load-balancer backends.
    pub fn with_backend_nodes(mut self, names: &[&str]) -> Self {
        self.backend_nodes = names.iter().map(|n| backend_node(n)).collect();
        self
    }
}

/// A Node with only a name.
pub fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        ..Default::default()
    }
}

/// A backend Node with only a name, shared as the manager hands backends to
/// [`LoadBalancer`](crate::LoadBalancer) calls.
pub fn backend_node(name: &str) -> Arc<Node> {
    Arc::new(node(name))
}

/// A `type: LoadBalancer` Service with one TCP port (80 → node port 30080).
pub fn load_balancer_service(namespace: &str, name: &str, uid: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".to_owned()),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                protocol: Some("TCP".to_owned()),
                port: 80,
                node_port: Some(30080),
                target_port: Some(IntOrString::Int(8080)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every assertion held.
    Passed,
    /// The provider does not offer the part this check needs.
    Skipped(String),
    /// What went wrong.
    Failed(String),
}

/// One named check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// The check's name, e.g. `load_balancer_ensure_is_idempotent`.
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
}

/// The outcomes of every check.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// In the order they ran.
    pub results: Vec<CheckResult>,
}

impl Report {
    /// The checks that failed.
    pub fn failures(&self) -> Vec<&CheckResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
            .collect()
    }

    /// The checks that passed.
    pub fn passed(&self) -> Vec<&CheckResult> {
        self.results
            .iter()
            .filter(|r| r.outcome == Outcome::Passed)
            .collect()
    }

    /// Panics, naming every failed check and why, unless all passed or were skipped.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(
            self.failures().is_empty(),
            "provider conformance failed:\n{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for result in &self.results {
            match &result.outcome {
                Outcome::Passed => writeln!(f, "  ok      {}", result.name)?,
                Outcome::Skipped(why) => writeln!(f, "  skipped {}: {why}", result.name)?,
                Outcome::Failed(why) => writeln!(f, "  FAILED  {}: {why}", result.name)?,
            }
        }
        Ok(())
    }
}

/// Runs every check against `cloud`.
pub async fn run(cloud: &dyn CloudProvider, fixtures: &Fixtures) -> Report {
    let mut report = Report::default();
    for (name, check) in checks::ALL {
        let outcome = check(cloud, fixtures).await;
        report.results.push(CheckResult { name, outcome });
    }
    report
}
