//! The `aws` provider inside the real manager, against the test control plane's real API server and
//! moto: nodes named by their instances' private DNS names are initialized with provider ID, labels
//! (upstream's `topology.k8s.aws/zone-id` too) and addresses; a stopped instance's NotReady node gets the shutdown taint; a terminated instance's node
//! is deleted.

mod support;

use std::{sync::Arc, time::Duration};

use clap::Parser;
use cloud_controller_manager::{Manager, app::Options};
use cloud_provider::Registry;
use cloud_provider_aws::ZONE_ID_LABEL;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::*;
use test_control_plane::{control_plane, kubelet_node};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn nodes() -> Api<Node> {
    Api::all(control_plane().admin_client().await)
}

async fn set_ready(name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({ "status": { "conditions": [{
        "type": "Ready", "status": status, "reason": "Test", "message": "set by the test",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    nodes()
        .await
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("node status patched");
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

type ManagerTask = tokio::task::JoinHandle<Result<(), anyhow::Error>>;

/// Runs the manager in-process on the `aws` provider (on moto) with these controllers; the provider is
/// returned too, for its call counts.
async fn start_manager(
    controllers: &str,
) -> (
    CancellationToken,
    ManagerTask,
    Arc<cloud_provider_aws::AwsCloud>,
) {
    let cloud = Arc::new(cloud(&default_config()));
    let mut registry = Registry::new();
    let shared = cloud.clone();
    registry
        .register("aws", move |_| Ok(shared.clone() as _))
        .unwrap();
    let manager = Manager::with_registry(registry);
    test_control_plane::apply_shipped_rbac().await;
    let argv = [
        "cloud-controller-manager".to_owned(),
        "--cloud-provider=aws".to_owned(),
        format!(
            "--kubeconfig={}",
            control_plane().ccm_kubeconfig().display()
        ),
        "--leader-elect=false".to_owned(),
        "--secure-port=0".to_owned(),
        format!("--controllers={controllers}"),
        "--node-monitor-period=200ms".to_owned(),
        "--node-status-update-frequency=500ms".to_owned(),
    ];
    let options = Options::try_parse_from(argv).expect("valid flags");
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move { manager.run(options, token).await });
    (shutdown, task, cloud)
}

async fn stop_manager(shutdown: CancellationToken, task: ManagerTask) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
}

#[tokio::test]
async fn nodes_initialize_from_ec2_and_follow_their_instances() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 3).await;

    let (shutdown, task, cloud) = start_manager("cloud-node,cloud-node-lifecycle").await;

    let api = nodes().await;
    let names: Vec<String> = instances.iter().map(|i| i.private_dns.clone()).collect();
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &kubelet_node(name))
            .await
            .expect("node created");
    }

    for (name, instance) in names.iter().zip(&instances) {
        let node = eventually("the node initialized", || async {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|n| !taint_keys(n).iter().any(|t| t.contains("uninitialized")))
        })
        .await;
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(
            spec.provider_id.as_deref(),
            Some(instance.provider_id().as_str())
        );
        assert_eq!(label(&node, "topology.kubernetes.io/zone"), Some(ZONE));
        assert_eq!(label(&node, "topology.kubernetes.io/region"), Some(REGION));
        assert_eq!(label(&node, ZONE_ID_LABEL), Some(MOTO_ZONE_ID));
        assert_eq!(
            label(&node, "node.kubernetes.io/instance-type"),
            Some("t3.medium")
        );
        let addresses: Vec<(String, String)> = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert!(
            addresses.contains(&("InternalIP".to_owned(), instance.private_ip.clone())),
            "{addresses:?}"
        );
        assert!(
            addresses.contains(&("InternalDNS".to_owned(), name.clone())),
            "{addresses:?}"
        );
    }
    assert_eq!(
        cloud
            .api_metrics()
            .requests()
            .get("DescribeAvailabilityZones"),
        Some(&1),
        "the zone IDs of all nodes come from one DescribeAvailabilityZones"
    );

    // Stopped, and NotReady: the shutdown taint.
    stop(&instances[0].id).await;
    set_ready(&names[0], false).await;
    eventually("the shutdown taint", || async {
        api.get_opt(&names[0])
            .await
            .ok()
            .flatten()
            .filter(|n| taint_keys(n).contains(&SHUTDOWN_TAINT.to_owned()))
    })
    .await;

    // Terminated, and NotReady: the node is deleted.
    terminate(&instances[1].id).await;
    set_ready(&names[1], false).await;
    eventually("the node deleted", || async {
        api.get_opt(&names[1])
            .await
            .ok()
            .and_then(|n| n.is_none().then_some(()))
    })
    .await;
    // The running instance's node stays.
    assert!(api.get_opt(&names[2]).await.unwrap().is_some());

    stop_manager(shutdown, task).await;
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

fn ingress_hostname(service: &Service) -> Option<String> {
    service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

#[tokio::test]
async fn load_balancer_services_get_nlbs_and_elbs_follow_nodes_and_leave_nothing() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let (shutdown, task, _cloud) = start_manager("cloud-node,service").await;
    let api = nodes().await;
    let names: Vec<String> = instances.iter().map(|i| i.private_dns.clone()).collect();
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &kubelet_node(name))
            .await
            .expect("node created");
    }
    for name in &names {
        eventually("the node initialized", || async {
            api.get_opt(name).await.ok().flatten().filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_ref())
                    .is_some()
            })
        })
        .await;
    }

    let services: Api<Service> = Api::namespaced(control_plane().admin_client().await, "default");
    let make = |name: &str, nlb: bool| -> Service {
        let annotations = if nlb {
            json!({ "service.beta.kubernetes.io/aws-load-balancer-type": "nlb" })
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": annotations },
            "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "targetPort": 8080 }] }
        }))
        .unwrap()
    };
    for (name, nlb) in [("aws-nlb", true), ("aws-elb", false)] {
        let _ = services.delete(name, &DeleteParams::default()).await;
        services
            .create(&PostParams::default(), &make(name, nlb))
            .await
            .expect("service created");
    }
    let nlb = eventually("the NLB hostname", || async {
        services
            .get_opt("aws-nlb")
            .await
            .ok()
            .flatten()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await;
    let v2 = elbv2();
    let lbs = v2.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers().len(), 1);
    assert_eq!(
        ingress_hostname(&nlb).as_deref(),
        lbs.load_balancers()[0].dns_name()
    );
    let elb_service = eventually("the ELB hostname", || async {
        services
            .get_opt("aws-elb")
            .await
            .ok()
            .flatten()
            .filter(|s| ingress_hostname(s).is_some())
    })
    .await;
    let classic = elb().describe_load_balancers().send().await.unwrap();
    assert_eq!(classic.load_balancer_descriptions().len(), 1);
    assert_eq!(
        ingress_hostname(&elb_service).as_deref(),
        classic.load_balancer_descriptions()[0].dns_name()
    );
    let lb_arn = lbs.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_owned();
    let targets = || async {
        let groups = v2
            .describe_target_groups()
            .load_balancer_arn(&lb_arn)
            .send()
            .await
            .ok()?;
        let group = groups
            .target_groups()
            .first()?
            .target_group_arn()?
            .to_owned();
        let health = v2
            .describe_target_health()
            .target_group_arn(group)
            .send()
            .await
            .ok()?;
        Some(health.target_health_descriptions().len())
    };
    eventually("both nodes as NLB targets", || async {
        targets().await.filter(|n| *n == 2)
    })
    .await;

    // Node churn: a node goes, its instance stops being a target of both load balancers.
    api.delete(&names[1], &DeleteParams::default())
        .await
        .unwrap();
    eventually("one NLB target left", || async {
        targets().await.filter(|n| *n == 1)
    })
    .await;
    eventually("one ELB instance left", || async {
        let d = elb().describe_load_balancers().send().await.ok()?;
        (d.load_balancer_descriptions().first()?.instances().len() == 1).then_some(())
    })
    .await;

    // Deleting every Service leaves nothing that carries the cluster's tag.
    for name in ["aws-nlb", "aws-elb"] {
        services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("no cluster resources left", || async {
        cluster_resources().await.is_empty().then_some(())
    })
    .await;
    stop_manager(shutdown, task).await;
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}
