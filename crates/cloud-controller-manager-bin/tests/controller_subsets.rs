//! Any subset of the controllers works, as upstream's: every controller alone (`--controllers=X`) does
//! its job, and every selection that leaves one out (`--controllers=*,-X`) does the jobs of the others.
//! Each controller asks for the shared caches it reads, whatever else runs (issue #27: the lifecycle
//! controller alone never started the Node cache, so it never deleted a node).
//!
//! The tests run in parallel with each other (and with other tests on the same control plane), so
//! each job is checked on this test's own objects, in ways no other manager can fake or spoil:
//! - the node to initialize has a provider ID only this test's cloud knows: every other manager's cloud
//!   finds no instance for it, so its initialization is this manager's work, and while the cloud-node
//!   controller is left out it stays uninitialized;
//! - the not-ready node's instance is gone only in this test's cloud (every other cloud has it
//!   running), so its deletion is this manager's work, and while the lifecycle controller is left out
//!   it stays;
//! - routes and load balancers are read from this test's cloud.
//!
//! Node IPAM is the exception: every allocator hands a CIDR to every node without one, so the tests
//! that run it take [`IPAM`] and their CIDRs come from a range no other test uses; whether it is off is
//! not checked (another test's allocator may serve the node meanwhile).

mod support;

use std::{
    sync::atomic::{AtomicU8, Ordering},
    time::Duration,
};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::{
    RunningManager, create_namespace, create_node, delete_nodes, eventually, get_node,
    load_balancer_service, services,
};
use test_control_plane::{kubelet_node, unique_name};

const WAIT: Duration = Duration::from_secs(20);
/// How long a left-out controller's job is watched for not happening, once the others' are done:
/// five node-monitor and route periods.
const SETTLE: Duration = Duration::from_secs(1);
/// The pod network of these tests (no other test uses it): node IPAM allocates from it, and the route
/// controller routes the pod CIDRs inside it.
const CLUSTER_CIDR: &str = "10.232.0.0/16";
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The instance type this test's cloud gives the node to initialize.
const INSTANCE_TYPE: &str = "subset-type";

/// Held by the tests that run node IPAM (see the module docs).
static IPAM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A controller's job, by its `--controllers` alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    CloudNode,
    Lifecycle,
    Service,
    Route,
    Ipam,
}

use Job::*;

const ALL: [Job; 5] = [CloudNode, Lifecycle, Service, Route, Ipam];

impl Job {
    fn alias(self) -> &'static str {
        match self {
            CloudNode => "cloud-node",
            Lifecycle => "cloud-node-lifecycle",
            Service => "service",
            Route => "route",
            Ipam => "nodeipam",
        }
    }
}

/// This test's objects, each the subject of one job.
struct Objects {
    /// To initialize (cloud-node) and give a pod CIDR (node IPAM).
    fresh: String,
    /// Not ready, its instance gone (lifecycle).
    vanished: String,
    /// With a pod CIDR to route (route), and the CIDR.
    routed: String,
    routed_cidr: String,
    /// A `type: LoadBalancer` Service `web` in a namespace of its own (service).
    namespace: String,
}

impl Objects {
    async fn create() -> Self {
        // A pod CIDR per test, high in the range, away from what node IPAM hands out first.
        static NEXT_CIDR: AtomicU8 = AtomicU8::new(200);
        let routed_cidr = format!("10.232.{}.0/24", NEXT_CIDR.fetch_add(1, Ordering::Relaxed));
        let objects = Self {
            fresh: unique_name("subset-fresh"),
            vanished: unique_name("subset-vanished"),
            routed: unique_name("subset-routed"),
            routed_cidr,
            namespace: unique_name("subset"),
        };

        let mut fresh = kubelet_node(&objects.fresh);
        fresh.spec.as_mut().unwrap().provider_id = Some(objects.provider_id());
        create_node(&fresh).await;

        // An initialized node (no taint) whose kubelet stopped reporting.
        let mut vanished = kubelet_node(&objects.vanished);
        vanished.spec.as_mut().unwrap().taints = None;
        vanished
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        create_node(&vanished).await;

        let mut routed = kubelet_node(&objects.routed);
        let spec = routed.spec.as_mut().unwrap();
        spec.pod_cidr = Some(objects.routed_cidr.clone());
        spec.pod_cidrs = Some(vec![objects.routed_cidr.clone()]);
        create_node(&routed).await;

        create_namespace(&objects.namespace).await;
        services(&objects.namespace)
            .await
            .create(&Default::default(), &load_balancer_service("web", &[80]))
            .await
            .expect("service created");
        objects
    }

    /// A provider ID no other test's cloud knows (theirs know `fake://<name>`).
    fn provider_id(&self) -> String {
        format!("subset://{}", self.fresh)
    }

    /// This test's cloud: the node to initialize under its own provider ID, the vanished node gone.
    fn cloud_config(&self) -> String {
        format!(
            "instances:\n  {}: {{providerID: \"{}\", instanceType: {INSTANCE_TYPE}}}\n  {}: {{state: gone}}\n",
            self.fresh,
            self.provider_id(),
            self.vanished
        )
    }

    fn service_key(&self) -> String {
        format!("{}/web", self.namespace)
    }

    async fn remove(&self) {
        let api = services(&self.namespace).await;
        let _ = api.delete("web", &DeleteParams::default()).await;
        // A finalizer a stopped manager (this one or another test's) left would keep it forever.
        let _ = api
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
            )
            .await;
        delete_nodes(&[&self.fresh, &self.vanished, &self.routed]).await;
    }
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

/// Waits until `job` is done on `objects` by `manager`.
async fn done(job: Job, manager: &RunningManager, objects: &Objects) {
    match job {
        CloudNode => {
            eventually("the node initialized by this cloud", WAIT, || async {
                let node = get_node(&objects.fresh).await?;
                let labels = node.metadata.labels.clone().unwrap_or_default();
                (!taint_keys(&node).contains(&UNINITIALIZED.to_owned())
                    && labels
                        .get("node.kubernetes.io/instance-type")
                        .map(String::as_str)
                        == Some(INSTANCE_TYPE))
                .then_some(())
            })
            .await;
        }
        Lifecycle => {
            eventually("the vanished node deleted", WAIT, || async {
                get_node(&objects.vanished).await.is_none().then_some(())
            })
            .await;
        }
        Service => {
            let key = objects.service_key();
            eventually("the load balancer in this cloud", WAIT, || async {
                manager
                    .cloud
                    .snapshot()
                    .load_balancer_of(&key)
                    .map(|lb| assert!(!lb.ingress.is_empty(), "{lb:?}"))
            })
            .await;
        }
        Route => {
            eventually("the route in this cloud", WAIT, || async {
                manager
                    .cloud
                    .snapshot()
                    .routes
                    .iter()
                    .any(|r| {
                        r.target_node == objects.routed
                            && r.destination_cidr == objects.routed_cidr
                            && !r.blackhole
                    })
                    .then_some(())
            })
            .await;
        }
        Ipam => {
            let cidrs = eventually("a pod CIDR", WAIT, || async {
                let cidrs = pod_cidrs(&get_node(&objects.fresh).await?);
                (!cidrs.is_empty()).then_some(cidrs)
            })
            .await;
            let cluster: IpNet = CLUSTER_CIDR.parse().unwrap();
            let cidr: IpNet = cidrs[0].parse().unwrap();
            assert!(
                cluster.contains(&cidr) && cidr.prefix_len() == 24,
                "{cidrs:?} is not a node CIDR of {CLUSTER_CIDR}"
            );
        }
    }
}

/// Checks that `job`, left out, did not happen on `objects` (node IPAM is not checked: see the module
/// docs).
async fn not_done(job: Job, manager: &RunningManager, objects: &Objects) {
    let state = manager.cloud.snapshot();
    match job {
        CloudNode => {
            let node = get_node(&objects.fresh).await.expect("the node");
            assert!(
                taint_keys(&node).contains(&UNINITIALIZED.to_owned()),
                "initialized without the cloud-node controller: {node:?}"
            );
            assert_eq!(state.calls_to("instance_metadata"), 0);
        }
        Lifecycle => assert!(
            get_node(&objects.vanished).await.is_some(),
            "deleted without the lifecycle controller"
        ),
        Service => {
            assert!(state.load_balancer_of(&objects.service_key()).is_none());
            assert_eq!(state.calls_to("ensure_load_balancer"), 0);
        }
        Route => {
            assert!(state.routes.is_empty(), "{:?}", state.routes);
            assert_eq!(state.calls_to("list_routes"), 0);
        }
        Ipam => {}
    }
}

/// Runs the manager with `--controllers=<selection>` and checks that exactly the jobs of `running`
/// are done.
async fn check(selection: &str, running: &[Job]) {
    let _ipam = match running.contains(&Ipam) {
        true => Some(IPAM.lock().await),
        false => None,
    };
    let objects = Objects::create().await;
    let controllers = format!("--controllers={selection}");
    let cluster_cidr = format!("--cluster-cidr={CLUSTER_CIDR}");
    let manager = RunningManager::start(
        &objects.cloud_config(),
        &[
            &controllers,
            &cluster_cidr,
            "--allocate-node-cidrs=true",
            "--node-monitor-period=200ms",
            "--route-reconciliation-period=200ms",
        ],
    )
    .await;
    for job in running {
        done(*job, &manager, &objects).await;
    }
    let left_out: Vec<Job> = ALL.into_iter().filter(|j| !running.contains(j)).collect();
    if !left_out.is_empty() {
        tokio::time::sleep(SETTLE).await;
        for job in left_out {
            not_done(job, &manager, &objects).await;
        }
    }
    objects.remove().await;
    manager.stop().await;
}

async fn alone(job: Job) {
    check(job.alias(), &[job]).await;
}

async fn all_but(job: Job) {
    let others: Vec<Job> = ALL.into_iter().filter(|j| *j != job).collect();
    check(&format!("*,-{}", job.alias()), &others).await;
}

#[tokio::test]
async fn all_controllers_do_their_jobs() {
    check("*", &ALL).await;
}

#[tokio::test]
async fn cloud_node_alone_initializes_a_node() {
    alone(CloudNode).await;
}

#[tokio::test]
async fn cloud_node_lifecycle_alone_deletes_a_not_ready_node_whose_instance_is_gone() {
    alone(Lifecycle).await;
}

#[tokio::test]
async fn service_alone_provisions_a_load_balancer() {
    alone(Service).await;
}

#[tokio::test]
async fn route_alone_creates_routes_for_pod_cidrs() {
    alone(Route).await;
}

#[tokio::test]
async fn node_ipam_alone_allocates_a_pod_cidr() {
    alone(Ipam).await;
}

#[tokio::test]
async fn all_but_cloud_node_do_their_jobs() {
    all_but(CloudNode).await;
}

#[tokio::test]
async fn all_but_cloud_node_lifecycle_do_their_jobs() {
    all_but(Lifecycle).await;
}

#[tokio::test]
async fn all_but_service_do_their_jobs() {
    all_but(Service).await;
}

#[tokio::test]
async fn all_but_route_do_their_jobs() {
    all_but(Route).await;
}

#[tokio::test]
async fn all_but_node_ipam_do_their_jobs() {
    all_but(Ipam).await;
}
