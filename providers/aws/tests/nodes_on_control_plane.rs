//! The `aws` provider inside the real manager, against the test control plane's real API server and
//! moto: nodes named by their instances' private DNS names are initialized with provider ID, labels
//! (upstream's `topology.k8s.aws/zone-id` too) and addresses; a stopped instance's NotReady node gets the shutdown taint; a terminated instance's node
//! is deleted; LoadBalancer Services get an NLB or a Classic ELB whose targets follow the nodes (HTTP
//! health checks on the `healthCheckNodePort` with `externalTrafficPolicy: Local`), and nothing tagged
//! for the cluster is left once they are deleted; VPC routes follow the nodes' pod CIDRs.

mod support;

use std::{sync::Arc, time::Duration};

use cloud_provider_aws::ZONE_ID_LABEL;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use manager_testkit::{ManagerUnderTest, nodes, set_ready};
use serde_json::json;
use support::*;
use test_control_plane::{control_plane, kubelet_node};

const WAIT: Duration = Duration::from_secs(30);
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    manager_testkit::eventually(what, WAIT, check).await
}

/// Waits (`what`) until moto holds nothing tagged for the cluster.
async fn nothing_left(what: &str) {
    eventually(what, || async {
        cluster_resources().await.is_empty().then_some(())
    })
    .await;
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

/// Registers the node `name` as a kubelet does and waits until the cloud-node controller gave it a
/// provider ID.
async fn create_initialized_node(api: &Api<Node>, name: &str) {
    api.create(&PostParams::default(), &kubelet_node(name))
        .await
        .expect("node created");
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

/// Runs the manager in-process on the `aws` provider (on moto) with these controllers; the provider is
/// returned too, for its call counts.
async fn start_manager(
    controllers: &str,
    extra_flags: &[&str],
) -> (ManagerUnderTest, Arc<cloud_provider_aws::AwsCloud>) {
    // The manager's log, shown with a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_ansi(false)
        .with_env_filter("info")
        .try_init();
    let cloud = Arc::new(cloud(&default_config()));
    let controllers = format!("--controllers={controllers}");
    let mut args = vec![
        controllers.as_str(),
        "--node-monitor-period=200ms",
        "--node-status-update-frequency=500ms",
    ];
    args.extend(extra_flags);
    let manager = ManagerUnderTest::start("aws", cloud.clone(), &args).await;
    (manager, cloud)
}

#[tokio::test]
async fn nodes_initialize_from_ec2_and_follow_their_instances() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 3).await;

    let (manager, cloud) = start_manager("cloud-node,cloud-node-lifecycle", &[]).await;

    let api = nodes().await;
    let names: Vec<String> = instances.iter().map(|i| i.private_dns.clone()).collect();
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &kubelet_node(name))
            .await
            .expect("node created");
    }

    for (name, instance) in names.iter().zip(&instances) {
        // The manager removes the taint (a PUT of the node) and then writes the addresses (its
        // status), as upstream's cloud-node controller does: wait for both, then check them.
        let node = eventually("the node initialized with its addresses", || async {
            api.get_opt(name).await.ok().flatten().filter(|n| {
                let initialized = !taint_keys(n).iter().any(|t| t.contains("uninitialized"));
                let addressed = n
                    .status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"));
                initialized && addressed
            })
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

    manager.stop().await;
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
    let instances = run_instances(&net, 3).await;
    let (manager, _cloud) = start_manager("cloud-node,service", &[]).await;
    let api = nodes().await;
    let names: Vec<String> = instances.iter().map(|i| i.private_dns.clone()).collect();
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    let create_node = |name: String| {
        let api = api.clone();
        async move { create_initialized_node(&api, &name).await }
    };
    // Two nodes first; the third joins later.
    for name in &names[..2] {
        create_node(name.clone()).await;
    }

    let services: Api<Service> = Api::namespaced(control_plane().admin_client().await, "default");
    let make = |name: &str, nlb: bool, local: bool| -> Service {
        let annotations = if nlb {
            json!({ "service.beta.kubernetes.io/aws-load-balancer-type": "nlb" })
        } else {
            json!({})
        };
        let policy = if local { "Local" } else { "Cluster" };
        serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": annotations },
            "spec": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": policy,
                "ports": [{ "port": 80, "targetPort": 8080 }]
            }
        }))
        .unwrap()
    };
    let all = [
        ("aws-nlb", true, false),
        ("aws-elb", false, false),
        ("aws-nlb-local", true, true),
    ];
    for (name, nlb, local) in all {
        let _ = services.delete(name, &DeleteParams::default()).await;
        services
            .create(&PostParams::default(), &make(name, nlb, local))
            .await
            .expect("service created");
    }
    let provisioned = |name: &'static str| {
        let services = services.clone();
        async move {
            eventually(&format!("{name}'s load-balancer hostname"), || async {
                services
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .filter(|s| ingress_hostname(s).is_some())
            })
            .await
        }
    };
    let nlb = provisioned("aws-nlb").await;
    let elb_service = provisioned("aws-elb").await;
    let local = provisioned("aws-nlb-local").await;
    let v2 = elbv2();
    let lbs = v2.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers().len(), 2, "one NLB per NLB Service");
    let arn_of = |service: &Service| -> String {
        let hostname = ingress_hostname(service).unwrap();
        lbs.load_balancers()
            .iter()
            .find(|lb| lb.dns_name() == Some(hostname.as_str()))
            .unwrap_or_else(|| panic!("no NLB named {hostname} in {lbs:?}"))
            .load_balancer_arn()
            .unwrap()
            .to_owned()
    };
    let lb_arn = arn_of(&nlb);
    let local_arn = arn_of(&local);
    let classic = elb().describe_load_balancers().send().await.unwrap();
    assert_eq!(classic.load_balancer_descriptions().len(), 1);
    assert_eq!(
        ingress_hostname(&elb_service).as_deref(),
        classic.load_balancer_descriptions()[0].dns_name()
    );

    // externalTrafficPolicy: Local: HTTP health checks of /healthz on the healthCheckNodePort the
    // API server allocated; Cluster: TCP on the traffic port.
    let health_check_node_port = local
        .spec
        .as_ref()
        .and_then(|s| s.health_check_node_port)
        .expect("the API server allocates a healthCheckNodePort for Local");
    let checks = |arn: String| {
        let v2 = v2.clone();
        async move {
            let groups = v2
                .describe_target_groups()
                .load_balancer_arn(arn)
                .send()
                .await
                .unwrap();
            groups
                .target_groups()
                .iter()
                .map(|g| {
                    (
                        g.health_check_protocol().map(|p| p.as_str().to_owned()),
                        g.health_check_port().map(str::to_owned),
                        g.health_check_path().map(str::to_owned),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        checks(local_arn).await,
        [(
            Some("HTTP".to_owned()),
            Some(health_check_node_port.to_string()),
            Some("/healthz".to_owned())
        )]
    );
    let cluster_checks = checks(lb_arn.clone()).await;
    assert_eq!(cluster_checks.len(), 1, "{cluster_checks:?}");
    assert_eq!(
        cluster_checks[0].0.as_deref(),
        Some("TCP"),
        "{cluster_checks:?}"
    );
    assert_eq!(
        cluster_checks[0].1.as_deref(),
        Some("traffic-port"),
        "{cluster_checks:?}"
    );

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
        let mut ids: Vec<String> = health
            .target_health_descriptions()
            .iter()
            .filter_map(|t| t.target()?.id().map(str::to_owned))
            .collect();
        ids.sort();
        Some(ids)
    };
    let elb_instances = || async {
        let d = elb().describe_load_balancers().send().await.ok()?;
        let mut ids: Vec<String> = d
            .load_balancer_descriptions()
            .first()?
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        ids.sort();
        Some(ids)
    };
    let ids = |which: &[usize]| -> Vec<String> {
        let mut ids: Vec<String> = which.iter().map(|i| instances[*i].id.clone()).collect();
        ids.sort();
        ids
    };
    eventually("both nodes as NLB targets", || async {
        targets().await.filter(|t| *t == ids(&[0, 1]))
    })
    .await;

    // Node churn: a node joins, its instance becomes a target of both load balancers; a node goes,
    // its instance stops being one.
    create_node(names[2].clone()).await;
    eventually("the new node as an NLB target", || async {
        targets().await.filter(|t| *t == ids(&[0, 1, 2]))
    })
    .await;
    eventually("the new node as an ELB instance", || async {
        elb_instances().await.filter(|t| *t == ids(&[0, 1, 2]))
    })
    .await;
    // Node churn: a node goes, its instance stops being a target of both load balancers.
    api.delete(&names[1], &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted node's instance no NLB target", || async {
        targets().await.filter(|t| *t == ids(&[0, 2]))
    })
    .await;
    eventually("the deleted node's instance no ELB instance", || async {
        elb_instances().await.filter(|t| *t == ids(&[0, 2]))
    })
    .await;

    // Deleting every Service leaves nothing that carries the cluster's tag.
    for (name, _, _) in all {
        services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    nothing_left("no cluster resources left").await;
    manager.stop().await;
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Issue #51 items 1 and 2 with the `aws` provider inside the manager: the Service's
/// `ccm.rs/LoadBalancerReady` condition says `Ensured` for an ELB made, `Refused` (naming the
/// annotation) for an annotation the provider refuses, and `Refused` for a `ccm.rs/load-balancer-retain`
/// that is neither "true" nor "false".
#[tokio::test]
async fn the_condition_says_ensured_or_why_aws_refuses() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let (manager, _cloud) = start_manager("cloud-node,service", &[]).await;
    let api = nodes().await;
    let name = instances[0].private_dns.clone();
    let _ = api.delete(&name, &DeleteParams::default()).await;
    create_initialized_node(&api, &name).await;
    let services: Api<Service> = Api::namespaced(control_plane().admin_client().await, "default");
    let cases = [
        ("cond-elb", json!({}), "Ensured", ""),
        (
            "cond-eip",
            json!({ "service.beta.kubernetes.io/aws-load-balancer-eip-allocations": "eipalloc-1" }),
            "Refused",
            "aws-load-balancer-eip-allocations",
        ),
        (
            "cond-keep",
            json!({ "ccm.rs/load-balancer-retain": "yes" }),
            "Refused",
            "ccm.rs/load-balancer-retain",
        ),
    ];
    for (service, annotations, _, _) in &cases {
        let _ = services.delete(service, &DeleteParams::default()).await;
        let object: Service = serde_json::from_value(json!({
            "metadata": { "name": service, "annotations": annotations },
            "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "targetPort": 8080 }] }
        }))
        .unwrap();
        services
            .create(&PostParams::default(), &object)
            .await
            .expect("service created");
    }
    for (service, _, reason, names) in &cases {
        let condition = eventually(
            &format!("{service}'s condition to say {reason}"),
            || async {
                services
                    .get(service)
                    .await
                    .ok()?
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "ccm.rs/LoadBalancerReady" && c.reason == *reason)
            },
        )
        .await;
        assert!(
            condition.message.contains(names),
            "{service}: {condition:?}"
        );
    }
    // The accepted one was made (that a refused Service makes nothing is load_balancers.rs's
    // `an_annotation_refused_for_its_kind_or_misspelt_changes_nothing`).
    assert!(!cluster_resources().await.is_empty());
    for (service, _, _, _) in &cases {
        services
            .delete(service, &DeleteParams::default())
            .await
            .unwrap();
    }
    nothing_left("no cluster resources left").await;
    manager.stop().await;
    let _ = api.delete(&name, &DeleteParams::default()).await;
}

/// A kubelet-registered node with this pod CIDR (as the node-IPAM controller or the kubelet sets it).
fn node_with_pod_cidr(name: &str, cidr: &str) -> Node {
    let mut node = kubelet_node(name);
    let spec = node.spec.get_or_insert_with(Default::default);
    spec.pod_cidr = Some(cidr.to_owned());
    spec.pod_cidrs = Some(vec![cidr.to_owned()]);
    node
}

#[tokio::test]
async fn routes_follow_the_nodes_pod_cidrs_in_the_clusters_route_table() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let table_id = cluster_route_table(&net).await;
    let instances = run_instances(&net, 3).await;
    let (manager, _cloud) = start_manager(
        "route",
        &[
            "--cluster-cidr=10.244.0.0/16",
            "--route-reconciliation-period=300ms",
        ],
    )
    .await;
    let api = nodes().await;
    let names: Vec<String> = instances.iter().map(|i| i.private_dns.clone()).collect();
    let cidrs = ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"];
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    let expected = |which: &[usize]| -> Vec<(String, String)> {
        let mut routes: Vec<(String, String)> = which
            .iter()
            .map(|i| (cidrs[*i].to_owned(), instances[*i].id.clone()))
            .collect();
        routes.sort();
        routes
    };
    for i in 0..2 {
        api.create(
            &PostParams::default(),
            &node_with_pod_cidr(&names[i], cidrs[i]),
        )
        .await
        .expect("node created");
    }
    eventually("a route per node", || async {
        let routes = instance_routes(&table_id).await;
        (routes == expected(&[0, 1])).then_some(())
    })
    .await;

    // A node joins: its route is added; a node goes: its route is removed.
    api.create(
        &PostParams::default(),
        &node_with_pod_cidr(&names[2], cidrs[2]),
    )
    .await
    .expect("node created");
    eventually("the new node's route", || async {
        let routes = instance_routes(&table_id).await;
        (routes == expected(&[0, 1, 2])).then_some(())
    })
    .await;
    api.delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted node's route removed", || async {
        let routes = instance_routes(&table_id).await;
        (routes == expected(&[1, 2])).then_some(())
    })
    .await;

    manager.stop().await;
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// The instances behind the NLB whose DNS name is `hostname` (its first target group's targets).
async fn nlb_instances(hostname: &str) -> Option<Vec<String>> {
    let v2 = elbv2();
    let lbs = v2.describe_load_balancers().send().await.ok()?;
    let lb_arn = lbs
        .load_balancers()
        .iter()
        .find(|lb| lb.dns_name() == Some(hostname))?
        .load_balancer_arn()?
        .to_owned();
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
    let mut ids: Vec<String> = health
        .target_health_descriptions()
        .iter()
        .filter_map(|t| t.target()?.id().map(str::to_owned))
        .collect();
    ids.sort();
    Some(ids)
}

/// Issue #29 item 4: a label put on a node after the service controller has listed its backends
/// reaches the next Service that selects it with `aws-load-balancer-target-node-labels` (the cached
/// backend list used to keep the node as it was, so the new Service got no backend). Issue #28: a node
/// relabelled into or out of the selection joins or leaves the existing load balancer's targets.
#[tokio::test]
async fn node_labels_select_targets_for_new_and_existing_services() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let (manager, _cloud) = start_manager("cloud-node,service", &[]).await;
    let api = nodes().await;
    let names: Vec<String> = instances.iter().map(|i| i.private_dns.clone()).collect();
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &kubelet_node(name))
            .await
            .expect("node created");
    }
    let services: Api<Service> = Api::namespaced(control_plane().admin_client().await, "default");
    let nlb = |name: &str, selector: Option<&str>| -> Service {
        let mut annotations = json!({ "service.beta.kubernetes.io/aws-load-balancer-type": "nlb" });
        if let Some(selector) = selector {
            annotations["service.beta.kubernetes.io/aws-load-balancer-target-node-labels"] =
                json!(selector);
        }
        serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": annotations },
            "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "targetPort": 8080 }] }
        }))
        .unwrap()
    };
    let hostname_of = |name: &'static str| {
        let services = services.clone();
        async move {
            eventually(&format!("{name}'s load-balancer hostname"), || async {
                services
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|s| ingress_hostname(&s))
            })
            .await
        }
    };
    // A first Service makes the controller list the backends (both nodes, once initialized).
    let _ = services.delete("aws-all", &DeleteParams::default()).await;
    let _ = services.delete("aws-edge", &DeleteParams::default()).await;
    services
        .create(&PostParams::default(), &nlb("aws-all", None))
        .await
        .unwrap();
    let all = hostname_of("aws-all").await;
    let mut ids: Vec<String> = instances.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    eventually("both instances behind aws-all", || async {
        (nlb_instances(&all).await? == ids).then_some(())
    })
    .await;

    // Then one node is labelled, and a Service selecting the label is made.
    api.patch(
        &names[0],
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "labels": { "pool": "edge" } } })),
    )
    .await
    .expect("node labelled");
    tokio::time::sleep(Duration::from_millis(500)).await;
    services
        .create(&PostParams::default(), &nlb("aws-edge", Some("pool=edge")))
        .await
        .unwrap();
    let edge = hostname_of("aws-edge").await;
    eventually(
        "only the labelled node's instance behind aws-edge",
        || async { (nlb_instances(&edge).await? == [instances[0].id.clone()]).then_some(()) },
    )
    .await;

    // Issue #28: relabelling nodes moves them into and out of the targets, with no edit of the Service
    // (the provider declares the annotation's label keys; upstream never passes a label change on).
    api.patch(
        &names[1],
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "labels": { "pool": "edge" } } })),
    )
    .await
    .expect("second node labelled");
    eventually(
        "both instances behind aws-edge after the relabel",
        || async { (nlb_instances(&edge).await? == ids).then_some(()) },
    )
    .await;
    api.patch(
        &names[0],
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "labels": { "pool": null } } })),
    )
    .await
    .expect("first node unlabelled");
    eventually(
        "only the second instance behind aws-edge after the unlabel",
        || async { (nlb_instances(&edge).await? == [instances[1].id.clone()]).then_some(()) },
    )
    .await;
    assert_eq!(
        nlb_instances(&all).await,
        Some(ids.clone()),
        "aws-all keeps both"
    );

    for name in ["aws-all", "aws-edge"] {
        services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    nothing_left("no cluster resources left").await;
    manager.stop().await;
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// The notes of the `LoadBalancerDrift` events about the Service with `uid` (not about an earlier
/// Service of the same name: a reused control plane keeps their events).
async fn drift_events(uid: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(control_plane().admin_client().await, "default");
    events
        .list(&Default::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
                && e.reason.as_deref() == Some("LoadBalancerDrift")
        })
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The listener ports of the Classic ELB whose DNS name is `hostname` (`None`: no such ELB).
async fn classic_listener_ports(hostname: &str) -> Option<Vec<i32>> {
    let described = elb().describe_load_balancers().send().await.ok()?;
    let lb = described
        .load_balancer_descriptions()
        .iter()
        .find(|lb| lb.dns_name() == Some(hostname))?;
    let mut ports: Vec<i32> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|d| d.listener().map(|l| l.load_balancer_port()))
        .collect();
    ports.sort();
    Some(ports)
}

/// Issue #28, drift on `aws`: a Classic ELB deleted out of band is made again within a drift period,
/// with a `LoadBalancerDrift` Warning; a listener deleted out of band is put back; with
/// `--load-balancer-drift=report` only the event comes.
#[tokio::test]
async fn a_classic_elb_changed_out_of_band_is_healed_or_reported() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let api = nodes().await;
    let name = instances[0].private_dns.clone();
    let _ = api.delete(&name, &DeleteParams::default()).await;
    api.create(&PostParams::default(), &kubelet_node(&name))
        .await
        .expect("node created");
    let services: Api<Service> = Api::namespaced(control_plane().admin_client().await, "default");
    let _ = services.delete("aws-drift", &DeleteParams::default()).await;
    eventually("no Service aws-drift left from before", || async {
        services
            .get_opt("aws-drift")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "aws-drift" },
        "spec": { "type": "LoadBalancer", "ports": [
            { "name": "http", "port": 80, "targetPort": 8080 },
            { "name": "https", "port": 443, "targetPort": 8443 }
        ] }
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let lb_name = |s: &Service| {
        let uid = s.metadata.uid.clone().unwrap_or_default().replace('-', "");
        format!("a{uid}")[..32].to_owned()
    };

    let (manager, _cloud) =
        start_manager("cloud-node,service", &["--load-balancer-drift-period=2s"]).await;
    let hostname = eventually("aws-drift's hostname", || async {
        ingress_hostname(&services.get_opt("aws-drift").await.ok()??)
    })
    .await;
    let created = services.get("aws-drift").await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    elb()
        .delete_load_balancer()
        .load_balancer_name(lb_name(&created))
        .send()
        .await
        .unwrap();
    eventually("the ELB made again", || async {
        (classic_listener_ports(&hostname).await? == [80, 443]).then_some(())
    })
    .await;
    let notes = drift_events(&uid).await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("the load balancer is gone from the cloud")
                && n.ends_with("ensuring it again")),
        "{notes:?}"
    );

    elb()
        .delete_load_balancer_listeners()
        .load_balancer_name(lb_name(&created))
        .load_balancer_ports(443)
        .send()
        .await
        .unwrap();
    eventually("the listener on 443 put back", || async {
        (classic_listener_ports(&hostname).await? == [80, 443]).then_some(())
    })
    .await;
    manager.stop().await;

    // Report only: the event, and the listener stays gone.
    let before = drift_events(&uid).await.len();
    let (manager, _cloud) = start_manager(
        "cloud-node,service",
        &[
            "--load-balancer-drift-period=2s",
            "--load-balancer-drift=report",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    elb()
        .delete_load_balancer_listeners()
        .load_balancer_name(lb_name(&created))
        .load_balancer_ports(443)
        .send()
        .await
        .unwrap();
    let note = eventually("a reported drift", || async {
        drift_events(&uid)
            .await
            .into_iter()
            .find(|n| n.ends_with("(--load-balancer-drift=report)"))
    })
    .await;
    assert!(note.contains("listeners"), "{note}");
    assert!(drift_events(&uid).await.len() > before);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        classic_listener_ports(&hostname).await,
        Some(vec![80]),
        "reported, not healed"
    );

    services
        .delete("aws-drift", &DeleteParams::default())
        .await
        .unwrap();
    nothing_left("no cluster resources left").await;
    manager.stop().await;
    let _ = api.delete(&name, &DeleteParams::default()).await;
}

/// The tags of the load balancer whose DNS name is `hostname`, of either kind (`None`: there is none).
async fn load_balancer_tags(hostname: &str) -> Option<std::collections::BTreeMap<String, String>> {
    let classic = elb().describe_load_balancers().send().await.ok()?;
    if let Some(name) = classic
        .load_balancer_descriptions()
        .iter()
        .find(|lb| lb.dns_name() == Some(hostname))
        .and_then(|lb| lb.load_balancer_name())
    {
        let tags = elb()
            .describe_tags()
            .load_balancer_names(name)
            .send()
            .await
            .ok()?;
        return Some(
            tags.tag_descriptions()
                .iter()
                .flat_map(|d| d.tags())
                .map(|t| (t.key().to_owned(), t.value().unwrap_or_default().to_owned()))
                .collect(),
        );
    }
    let v2 = elbv2().describe_load_balancers().send().await.ok()?;
    let arn = v2
        .load_balancers()
        .iter()
        .find(|lb| lb.dns_name() == Some(hostname))?
        .load_balancer_arn()?
        .to_owned();
    let tags = elbv2()
        .describe_tags()
        .resource_arns(arn)
        .send()
        .await
        .ok()?;
    Some(
        tags.tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .filter_map(|t| {
                Some((
                    t.key()?.to_owned(),
                    t.value().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
    )
}

/// The backends of the load balancer whose DNS name is `hostname`: a Classic ELB's instances, an NLB's
/// first target group's targets.
async fn backends(hostname: &str) -> Option<Vec<String>> {
    let classic = elb().describe_load_balancers().send().await.ok()?;
    if let Some(lb) = classic
        .load_balancer_descriptions()
        .iter()
        .find(|lb| lb.dns_name() == Some(hostname))
    {
        let mut ids: Vec<String> = lb
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        ids.sort();
        return Some(ids);
    }
    nlb_instances(hostname).await
}

/// Issue #51 item 2 on `aws`: a Service with `ccm.rs/load-balancer-retain: "true"` leaves its Classic
/// ELB or NLB when deleted (tagged as kept, no backends), the orphan sweep leaves it, and the next
/// Service of the same namespace and name adopts it: the same DNS name, its instances back. Deleted with
/// that Service (which does not ask to keep it), nothing is left. A kept one an operator releases (its
/// `ccm.rs/retained-for` tag removed, as docs/aws-provider.md says) is deleted by the sweep.
#[tokio::test]
async fn a_kept_load_balancer_outlives_its_service_and_the_next_of_its_name_adopts_it() {
    let _serial = SERIAL.lock().await;
    // A failed run's Services go first, without a manager (their load balancers went with moto's reset).
    let services: Api<Service> = Api::namespaced(control_plane().admin_client().await, "default");
    for name in ["keep-elb", "keep-nlb", "keep-released"] {
        let unfinalized = json!({ "metadata": { "finalizers": null } });
        let _ = services
            .patch(name, &PatchParams::default(), &Patch::Merge(&unfinalized))
            .await;
        let _ = services.delete(name, &DeleteParams::default()).await;
    }
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let (manager, _cloud) = start_manager(
        "cloud-node,service",
        &["--orphaned-load-balancer-sweep-period=1s"],
    )
    .await;
    let api = nodes().await;
    let node = instances[0].private_dns.clone();
    let _ = api.delete(&node, &DeleteParams::default()).await;
    create_initialized_node(&api, &node).await;
    let create = |name: &'static str, annotations: serde_json::Value| {
        let services = services.clone();
        async move {
            let object: Service = serde_json::from_value(json!({
                "metadata": { "name": name, "annotations": annotations },
                "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "targetPort": 8080 }] }
            }))
            .unwrap();
            let made = services
                .create(&PostParams::default(), &object)
                .await
                .expect("service created");
            let uid = made.metadata.uid.clone().unwrap();
            let hostname = eventually(&format!("{name}'s load balancer"), || async {
                ingress_hostname(&services.get(name).await.ok()?)
            })
            .await;
            (uid, hostname)
        }
    };
    let gone = |name: &'static str| {
        let services = services.clone();
        async move {
            services
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
            eventually(&format!("{name} gone"), || async {
                services.get_opt(name).await.ok()?.is_none().then_some(())
            })
            .await;
        }
    };
    let nlb = json!({ "service.beta.kubernetes.io/aws-load-balancer-type": "nlb" });
    for (name, kind) in [("keep-elb", json!({})), ("keep-nlb", nlb)] {
        let mut keep = kind.clone();
        keep["ccm.rs/load-balancer-retain"] = json!("true");
        let (first_uid, hostname) = create(name, keep).await;
        eventually(&format!("{name}'s instance registered"), || async {
            (backends(&hostname).await? == [instances[0].id.clone()]).then_some(())
        })
        .await;
        gone(name).await;
        let tags = load_balancer_tags(&hostname)
            .await
            .expect("the load balancer is kept");
        assert_eq!(
            tags.get("ccm.rs/retained-for").map(String::as_str),
            Some(&*format!("default/{name}")),
            "{tags:?}"
        );
        assert_eq!(tags.get("ccm.rs/named-for-uid"), Some(&first_uid));
        assert_eq!(
            backends(&hostname).await,
            Some(vec![]),
            "a kept one serves nothing"
        );
        // Three sweeps later it is still there.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            load_balancer_tags(&hostname).await.is_some(),
            "the sweep left it"
        );

        // The next Service of the name, which does not ask to keep it, adopts it.
        let (next_uid, adopted) = create(name, kind.clone()).await;
        assert_ne!(next_uid, first_uid);
        assert_eq!(adopted, hostname, "the same DNS name");
        eventually(&format!("{name}'s instance registered again"), || async {
            (backends(&hostname).await? == [instances[0].id.clone()]).then_some(())
        })
        .await;
        let tags = load_balancer_tags(&hostname).await.unwrap();
        assert_eq!(tags.get("ccm.rs/adopted-by"), Some(&next_uid), "{tags:?}");
        assert!(!tags.contains_key("ccm.rs/retained-for"), "{tags:?}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            load_balancer_tags(&hostname).await.is_some(),
            "the sweep leaves the adopter's load balancer, though its name is of the first UID"
        );
        gone(name).await;
        eventually(
            &format!("{name}'s load balancer deleted with its adopter"),
            || async { load_balancer_tags(&hostname).await.is_none().then_some(()) },
        )
        .await;
    }
    nothing_left("no cluster resources left").await;

    // An operator's release: the tag removed, the sweep deletes it.
    let (_, hostname) = create(
        "keep-released",
        json!({ "ccm.rs/load-balancer-retain": "true" }),
    )
    .await;
    gone("keep-released").await;
    let kept = elb().describe_load_balancers().send().await.unwrap();
    let name = kept
        .load_balancer_descriptions()
        .iter()
        .find(|lb| lb.dns_name() == Some(hostname.as_str()))
        .and_then(|lb| lb.load_balancer_name())
        .expect("kept")
        .to_owned();
    elb()
        .remove_tags()
        .load_balancer_names(&name)
        .tags(
            aws_sdk_elasticloadbalancing::types::TagKeyOnly::builder()
                .key("ccm.rs/retained-for")
                .build(),
        )
        .send()
        .await
        .unwrap();
    nothing_left("the released load balancer swept").await;
    manager.stop().await;
    let _ = api.delete(&node, &DeleteParams::default()).await;
}
