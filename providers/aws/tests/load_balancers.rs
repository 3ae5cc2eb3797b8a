//! Load balancers against moto: NLB and Classic ELB creation, idempotent syncs, backend changes by
//! difference, adoption of what cloud-provider-aws made, and deletion (also after a half-way failure)
//! that leaves nothing carrying the cluster's tag.

mod support;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, LoadBalancerTypeEnum, ProtocolEnum, Tag, TargetDescription,
    TargetTypeEnum,
};
use cloud_provider::{CloudProvider, LoadBalancerPreview};
use cloud_provider_aws::spec::{ANNOTATION_TYPE, Port};
use k8s_openapi::api::core::v1::Node;
use std::sync::Arc;

use support::*;

const UID: &str = "12345678-90ab-cdef-1234-567890abcdef";
/// `a` + the UID without dashes, cut to 32 characters.
const LB_NAME: &str = "a1234567890abcdef1234567890abcde";

fn hostname(status: &k8s_openapi::api::core::v1::LoadBalancerStatus) -> String {
    status
        .ingress
        .as_ref()
        .and_then(|i| i.first())
        .and_then(|i| i.hostname.clone())
        .unwrap_or_default()
}

/// The target groups of the NLB named [`LB_NAME`].
async fn nlb_target_groups() -> Vec<aws_sdk_elasticloadbalancingv2::types::TargetGroup> {
    let v2 = elbv2();
    let described = v2
        .describe_load_balancers()
        .names(LB_NAME)
        .send()
        .await
        .unwrap();
    v2.describe_target_groups()
        .load_balancer_arn(described.load_balancers()[0].load_balancer_arn().unwrap())
        .send()
        .await
        .unwrap()
        .target_groups()
        .to_vec()
}

async fn nlb_targets(port: i32) -> Vec<(String, i32)> {
    let v2 = elbv2();
    let lb = v2
        .describe_load_balancers()
        .names(LB_NAME)
        .send()
        .await
        .unwrap();
    let arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_owned();
    let groups = v2
        .describe_target_groups()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    let group = groups
        .target_groups()
        .iter()
        .find(|g| g.port() == Some(port))
        .unwrap_or_else(|| panic!("a target group on node port {port}"));
    let health = v2
        .describe_target_health()
        .target_group_arn(group.target_group_arn().unwrap())
        .send()
        .await
        .unwrap();
    let mut targets: Vec<(String, i32)> = health
        .target_health_descriptions()
        .iter()
        .filter_map(|d| d.target())
        .filter_map(|t| Some((t.id()?.to_owned(), t.port().unwrap_or(0))))
        .collect();
    targets.sort();
    targets
}

#[tokio::test]
async fn an_nlb_gets_target_groups_listeners_and_targets_and_goes_away_completely() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 3).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let service = lb_service("web", UID, &[(ANNOTATION_TYPE, "nlb")]);

    assert_eq!(
        lb.get_load_balancer("kubernetes", &service).await.unwrap(),
        None
    );
    let status = lb
        .ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();
    let v2 = elbv2();
    let described = v2
        .describe_load_balancers()
        .names(LB_NAME)
        .send()
        .await
        .unwrap();
    let nlb = &described.load_balancers()[0];
    assert_eq!(nlb.r#type(), Some(&LoadBalancerTypeEnum::Network));
    assert_eq!(
        hostname(&status),
        nlb.dns_name().unwrap(),
        "the ingress hostname is the DNS name"
    );
    assert_eq!(
        lb.get_load_balancer("kubernetes", &service).await.unwrap(),
        Some(status.clone())
    );

    let arn = nlb.load_balancer_arn().unwrap();
    let listeners = v2
        .describe_listeners()
        .load_balancer_arn(arn)
        .send()
        .await
        .unwrap();
    let mut ports: Vec<i32> = listeners
        .listeners()
        .iter()
        .filter_map(|l| l.port())
        .collect();
    ports.sort();
    assert_eq!(ports, [80, 443]);
    let groups = v2
        .describe_target_groups()
        .load_balancer_arn(arn)
        .send()
        .await
        .unwrap();
    assert_eq!(groups.target_groups().len(), 2, "one target group per port");
    for g in groups.target_groups() {
        assert_eq!(g.target_type(), Some(&TargetTypeEnum::Instance));
        assert_eq!(g.health_check_protocol(), Some(&ProtocolEnum::Tcp));
        assert_eq!(g.health_check_port(), Some("traffic-port"));
        assert!(
            g.target_group_name()
                .unwrap()
                .starts_with("k8s-default-web-")
        );
    }
    let mut expected: Vec<(String, i32)> =
        instances.iter().map(|i| (i.id.clone(), 30080)).collect();
    expected.sort();
    assert_eq!(nlb_targets(30080).await, expected);

    // A second sync finds everything in place and writes nothing.
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());

    // One node fewer: exactly one deregistration per target group, nothing recreated.
    let before = cloud.api_metrics().requests();
    lb.update_load_balancer("kubernetes", &service, &nodes[1..])
        .await
        .unwrap();
    let calls = cloud.api_metrics().requests();
    assert_eq!(
        calls.get("DeregisterTargets").copied().unwrap_or(0)
            - before.get("DeregisterTargets").copied().unwrap_or(0),
        2
    );
    assert_eq!(calls.get("RegisterTargets"), before.get("RegisterTargets"));
    assert_eq!(
        calls.get("elbv2:CreateLoadBalancer"),
        before.get("elbv2:CreateLoadBalancer")
    );
    assert_eq!(nlb_targets(30443).await.len(), 2);

    // Client rules were added to the nodes' group; deletion removes them with everything else.
    assert!(
        cluster_resources()
            .await
            .iter()
            .any(|r| r.contains("kubernetes.io/rule/nlb/client="))
    );
    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
    assert_eq!(
        lb.get_load_balancer("kubernetes", &service).await.unwrap(),
        None
    );
    // Deleting again is a no-op.
    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
}

#[tokio::test]
async fn external_traffic_policy_local_checks_http_on_the_health_check_node_port() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let mut service = lb_service("local", UID, &[(ANNOTATION_TYPE, "nlb")]);
    let spec = service.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32100);
    lb.ensure_load_balancer("kubernetes", &service, &[instance_node(&instances[0])])
        .await
        .unwrap();
    for g in nlb_target_groups().await {
        assert_eq!(g.health_check_protocol(), Some(&ProtocolEnum::Http));
        assert_eq!(g.health_check_port(), Some("32100"));
        assert_eq!(g.health_check_path(), Some("/healthz"));
    }
    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// `ClusterServiceLoadBalancerHealthProbeMode = Shared`: both kinds check kube-proxy's health port
/// (HTTP 10256 `/healthz`) instead of the Service's node port, and the NLB's health rule in the nodes'
/// group opens that port to the NLB's subnet.
#[tokio::test]
async fn the_shared_health_probe_checks_kube_proxy_on_both_kinds() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let cloud = cloud(&format!(
        "{}ClusterServiceLoadBalancerHealthProbeMode = Shared\n",
        default_config()
    ));
    let lb = cloud.load_balancer().unwrap();
    let nodes = [instance_node(&instances[0])];

    let nlb = lb_service("shared", UID, &[(ANNOTATION_TYPE, "nlb")]);
    lb.ensure_load_balancer("kubernetes", &nlb, &nodes)
        .await
        .unwrap();
    let groups = nlb_target_groups().await;
    assert!(!groups.is_empty());
    for g in &groups {
        assert_eq!(g.health_check_protocol(), Some(&ProtocolEnum::Http));
        assert_eq!(g.health_check_port(), Some("10256"));
        assert_eq!(g.health_check_path(), Some("/healthz"));
    }
    let health = format!("kubernetes.io/rule/nlb/health={LB_NAME}");
    let health_rules: Vec<(String, i32, i32, String)> = node_group_rules(&instances[0])
        .await
        .into_iter()
        .filter(|(d, ..)| *d == health)
        .map(|(_, p, from, to, cidr)| (p, from, to, cidr))
        .collect();
    assert_eq!(
        health_rules,
        [("tcp".to_owned(), 10256, 10256, "10.0.1.0/24".to_owned())],
        "the kube-proxy port, from the NLB's subnet"
    );

    const CLASSIC_UID: &str = "fedcba09-8765-4321-fedc-ba0987654321";
    let classic = lb_service("shared-classic", CLASSIC_UID, &[]);
    lb.ensure_load_balancer("kubernetes", &classic, &nodes)
        .await
        .unwrap();
    let described = elb()
        .describe_load_balancers()
        .load_balancer_names("afedcba0987654321fedcba098765432")
        .send()
        .await
        .unwrap();
    assert_eq!(
        described.load_balancer_descriptions()[0]
            .health_check()
            .map(|h| h.target()),
        Some("HTTP:10256/healthz")
    );

    lb.ensure_load_balancer_deleted("kubernetes", &nlb)
        .await
        .unwrap();
    lb.ensure_load_balancer_deleted("kubernetes", &classic)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

#[tokio::test]
async fn a_classic_elb_gets_listeners_health_check_instances_and_security_groups_then_goes_away() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let mut service = lb_service("classic", UID, &[]);
    service.spec.as_mut().unwrap().load_balancer_source_ranges =
        Some(vec!["203.0.113.0/24".into()]);

    let status = lb
        .ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();
    let described = elb()
        .describe_load_balancers()
        .load_balancer_names(LB_NAME)
        .send()
        .await
        .unwrap();
    let d = &described.load_balancer_descriptions()[0];
    assert_eq!(hostname(&status), d.dns_name().unwrap());
    let mut listeners: Vec<(i32, i32)> = d
        .listener_descriptions()
        .iter()
        .filter_map(|l| l.listener())
        .map(|l| (l.load_balancer_port(), l.instance_port()))
        .collect();
    listeners.sort();
    assert_eq!(listeners, [(80, 30080), (443, 30443)]);
    assert_eq!(d.health_check().map(|h| h.target()), Some("TCP:30080"));
    let mut registered: Vec<&str> = d
        .instances()
        .iter()
        .filter_map(|i| i.instance_id())
        .collect();
    registered.sort();
    let mut ids: Vec<&str> = instances.iter().map(|i| i.id.as_str()).collect();
    ids.sort();
    assert_eq!(registered, ids);
    // Our group, with the source range on the listener ports.
    let groups = ec2()
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(format!("k8s-elb-{LB_NAME}"))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let sg = &groups.security_groups()[0];
    assert_eq!(d.security_groups(), [sg.group_id().unwrap().to_owned()]);
    let cidrs: Vec<(i32, String)> = sg
        .ip_permissions()
        .iter()
        .filter(|p| p.ip_protocol() == Some("tcp"))
        .flat_map(|p| {
            p.ip_ranges().iter().map(move |r| {
                (
                    p.from_port().unwrap_or(0),
                    r.cidr_ip().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect();
    assert!(
        cidrs.contains(&(80, "203.0.113.0/24".to_owned()))
            && cidrs.contains(&(443, "203.0.113.0/24".to_owned())),
        "{cidrs:?}"
    );
    // The nodes' group lets the ELB's group in.
    assert!(
        cluster_resources()
            .await
            .iter()
            .any(|r| r.starts_with("rule in") && r.contains(sg.group_id().unwrap()))
    );

    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(
        writes_since(&cloud, &before),
        Vec::<String>::new(),
        "an in-place sync writes nothing"
    );

    let before = cloud.api_metrics().requests();
    lb.update_load_balancer("kubernetes", &service, &nodes[..1])
        .await
        .unwrap();
    assert_eq!(
        writes_since(&cloud, &before),
        ["DeregisterInstancesFromLoadBalancer"]
    );
    let described = elb()
        .describe_load_balancers()
        .load_balancer_names(LB_NAME)
        .send()
        .await
        .unwrap();
    assert_eq!(
        described.load_balancer_descriptions()[0].instances().len(),
        1
    );

    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

#[tokio::test]
async fn load_balancers_made_by_cloud_provider_aws_are_adopted_not_duplicated() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes = vec![instance_node(&instances[0])];
    // What cloud-provider-aws leaves for this Service: its NLB, one target group per port named by its
    // hash, listeners, all tagged kubernetes.io/cluster/<id>=owned and kubernetes.io/service-name.
    let v2 = elbv2();
    let tags = [
        Tag::builder()
            .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
            .value("owned")
            .build(),
        Tag::builder()
            .key("kubernetes.io/service-name")
            .value("default/adopt")
            .build(),
    ];
    let created = v2
        .create_load_balancer()
        .name(LB_NAME)
        .r#type(LoadBalancerTypeEnum::Network)
        .subnets(&net.subnet_id)
        .set_tags(Some(tags.to_vec()))
        .send()
        .await
        .unwrap();
    let lb_arn = created.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_owned();
    for (port, node_port) in [(80, 30080), (443, 30443)] {
        let name = cloud_provider_aws::target_group_name(
            CLUSTER_ID,
            "default/adopt",
            &Port {
                port,
                protocol: "TCP".into(),
                node_port,
            },
            "TCP",
            30,
        );
        let tg = v2
            .create_target_group()
            .name(name)
            .vpc_id(&net.vpc_id)
            .port(node_port)
            .protocol(ProtocolEnum::Tcp)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(ProtocolEnum::Tcp)
            .health_check_port("traffic-port")
            .health_check_interval_seconds(30)
            .health_check_timeout_seconds(10)
            .healthy_threshold_count(3)
            .unhealthy_threshold_count(3)
            .set_tags(Some(tags.to_vec()))
            .send()
            .await
            .unwrap();
        let tg_arn = tg.target_groups()[0].target_group_arn().unwrap().to_owned();
        v2.register_targets()
            .target_group_arn(&tg_arn)
            .targets(
                TargetDescription::builder()
                    .id(&instances[0].id)
                    .port(node_port)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        v2.create_listener()
            .load_balancer_arn(&lb_arn)
            .port(port)
            .protocol(ProtocolEnum::Tcp)
            .default_actions(
                Action::builder()
                    .r#type(ActionTypeEnum::Forward)
                    .target_group_arn(&tg_arn)
                    .build(),
            )
            .send()
            .await
            .unwrap();
    }

    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let service = lb_service("adopt", UID, &[(ANNOTATION_TYPE, "nlb")]);
    assert!(
        lb.get_load_balancer("kubernetes", &service)
            .await
            .unwrap()
            .is_some(),
        "found before any sync"
    );
    lb.ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();
    let calls = cloud.api_metrics().requests();
    for write in [
        "elbv2:CreateLoadBalancer",
        "CreateTargetGroup",
        "CreateListener",
        "ModifyListener",
        "RegisterTargets",
    ] {
        assert_eq!(
            calls.get(write),
            None,
            "{write} called on an adopted load balancer"
        );
    }
    let all = v2.describe_load_balancers().send().await.unwrap();
    assert_eq!(all.load_balancers().len(), 1, "no second load balancer");
    let all = v2.describe_target_groups().send().await.unwrap();
    assert_eq!(
        all.target_groups().len(),
        2,
        "no second set of target groups"
    );

    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

#[tokio::test]
async fn a_half_way_failure_is_finished_by_the_retry_and_deletion_leaves_nothing() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    // ELBv2 through a proxy that fails the first CreateListener: the NLB and a target group exist by then.
    let proxy = throttle::ThrottlingProxy::with_fault(
        moto().port,
        throttle::Fault::FailAction("CreateListener", 1),
    )
    .await;
    let config = config_through("elasticloadbalancingv2", proxy.port);
    let cloud = cloud(&config);
    let lb = cloud.load_balancer().unwrap();
    let service = lb_service("halfway", UID, &[(ANNOTATION_TYPE, "nlb")]);

    let err = lb
        .ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("CreateListener failed: ValidationError"),
        "{err}"
    );
    let left = cluster_resources().await;
    assert!(
        left.iter().any(|r| r.contains("loadbalancer"))
            && left.iter().any(|r| r.contains("targetgroup")),
        "{left:?}"
    );

    // The retry finishes the job with what exists: still one load balancer, one group per port.
    lb.ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();
    let v2 = elbv2();
    assert_eq!(
        v2.describe_load_balancers()
            .send()
            .await
            .unwrap()
            .load_balancers()
            .len(),
        1
    );
    assert_eq!(
        v2.describe_target_groups()
            .send()
            .await
            .unwrap()
            .target_groups()
            .len(),
        2
    );
    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());

    // Failed half-way and then deleted without a successful sync: the orphaned target group (no
    // listener points at it) is found by its tags and removed too.
    let proxy = throttle::ThrottlingProxy::with_fault(
        moto().port,
        throttle::Fault::FailAction("CreateListener", 100),
    )
    .await;
    let config = config_through("elasticloadbalancingv2", proxy.port);
    let cloud = support::cloud(&config);
    let lb = cloud.load_balancer().unwrap();
    assert!(
        lb.ensure_load_balancer("kubernetes", &service, &nodes)
            .await
            .is_err()
    );
    assert!(!cluster_resources().await.is_empty());
    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// The operations (and how many of each) `cloud` called since `before`.
fn calls_since(
    cloud: &cloud_provider_aws::AwsCloud,
    before: &std::collections::BTreeMap<&'static str, u64>,
) -> Vec<(String, u64)> {
    cloud
        .api_metrics()
        .requests()
        .into_iter()
        .filter_map(|(op, n)| {
            let since = n - before.get(op).copied().unwrap_or(0);
            (since > 0).then(|| (op.to_owned(), since))
        })
        .collect()
}

/// Deletions list the region's ELBv2 load balancers and tagged target groups once, then keep that
/// index by their own writes: a Classic Service's deletion asks ELBv2 nothing, and what a creation that
/// failed half-way made after the listing (an NLB and a target group) is still found and deleted when
/// the Service's annotation no longer says `nlb`.
#[tokio::test]
async fn deletions_list_elbv2_once_and_still_find_what_a_failed_creation_left() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let proxy = throttle::ThrottlingProxy::with_fault(
        moto().port,
        throttle::Fault::FailAction("CreateListener", 100),
    )
    .await;
    let config = config_through("elasticloadbalancingv2", proxy.port);
    let cloud = support::cloud(&config);
    let lb = cloud.load_balancer().unwrap();
    let elbv2_calls = |calls: &[(String, u64)]| -> Vec<(String, u64)> {
        calls
            .iter()
            .filter(|(op, _)| op.starts_with("elbv2:") || op.contains("TargetGroup"))
            .cloned()
            .collect()
    };

    // The first deletion lists (nothing there yet): the load balancers twice, as this is also the
    // process's first load-balancer call, which lists the cluster's kept and adopted ones
    // (`ccm.rs/load-balancer-retain`), and the target groups once.
    let never = lb_service("never", "00000000-0000-0000-0000-000000000001", &[]);
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer_deleted("kubernetes", &never)
        .await
        .unwrap();
    let listed = elbv2_calls(&calls_since(&cloud, &before));
    assert_eq!(
        listed,
        [
            ("DescribeTargetGroups".to_owned(), 1),
            ("elbv2:DescribeLoadBalancers".to_owned(), 2)
        ],
        "one listing of each for each index"
    );

    // An NLB creation that fails after its load balancer and target groups exist.
    let service = lb_service("halfway", UID, &[(ANNOTATION_TYPE, "nlb")]);
    assert!(
        lb.ensure_load_balancer("kubernetes", &service, &nodes)
            .await
            .is_err()
    );
    assert!(!cluster_resources().await.is_empty());

    // Another Classic Service's deletion: ELBv2 is not asked.
    let other = lb_service("other", "00000000-0000-0000-0000-000000000002", &[]);
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer_deleted("kubernetes", &other)
        .await
        .unwrap();
    assert_eq!(
        elbv2_calls(&calls_since(&cloud, &before)),
        [],
        "a Classic Service's deletion asks ELBv2 nothing once listed"
    );

    // The half-made NLB's Service, its annotation now gone: deleted all the same, groups included.
    let classic_now = lb_service("halfway", UID, &[]);
    lb.ensure_load_balancer_deleted("kubernetes", &classic_now)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// Deletions list the region's Classic ELBs once too: a Classic ELB made before the listing (and one
/// made after it by this process) is deleted without being described, its security group with it; a
/// deletion of a Service that never had one describes none either.
#[tokio::test]
async fn classic_deletions_are_found_in_the_listing_without_describing_each() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = support::cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let before_listing = lb_service("before", "0a000000-0000-0000-0000-000000000000", &[]);
    let after_listing = lb_service("after", "0b000000-0000-0000-0000-000000000000", &[]);
    lb.ensure_load_balancer("kubernetes", &before_listing, &nodes)
        .await
        .unwrap();
    let described = |calls: &[(String, u64)]| -> u64 {
        calls
            .iter()
            .filter(|(op, _)| op == "elb:DescribeLoadBalancers")
            .map(|(_, n)| n)
            .sum()
    };

    // The first deletion lists (one page), and describes nothing for a Service that never had one.
    let never = lb_service("never", "0c000000-0000-0000-0000-000000000000", &[]);
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer_deleted("kubernetes", &never)
        .await
        .unwrap();
    assert_eq!(
        described(&calls_since(&cloud, &before)),
        1,
        "the listing alone"
    );

    lb.ensure_load_balancer("kubernetes", &after_listing, &nodes)
        .await
        .unwrap();
    for service in [&before_listing, &after_listing] {
        let before = cloud.api_metrics().requests();
        lb.ensure_load_balancer_deleted("kubernetes", service)
            .await
            .unwrap();
        let calls = calls_since(&cloud, &before);
        assert_eq!(described(&calls), 0, "{calls:?}");
        assert!(
            calls.contains(&("elb:DeleteLoadBalancer".to_owned(), 1)),
            "{calls:?}"
        );
    }
    assert_eq!(cluster_resources().await, Vec::<String>::new());

    // Deleted again (a retry after a lost answer): nothing left to delete, nothing described.
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer_deleted("kubernetes", &before_listing)
        .await
        .unwrap();
    assert_eq!(described(&calls_since(&cloud, &before)), 0);
}

/// Issue #53 item 4: syncs and drift checks under way at once find their load balancers in shared
/// `DescribeLoadBalancers` calls (the first alone and at once, the others together), on both kinds;
/// a Service not provisioned yet is looked up alone (its look-up would most likely miss, and a miss
/// fails a shared call), so it is still created and the others still found; the nodes' instances,
/// looked up by one sync, are taken as they were by the next for a while.
#[tokio::test]
async fn syncs_and_checks_under_way_at_once_share_their_load_balancer_look_ups() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = support::cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let service = |kind: &str, i: usize| {
        let annotations: &[(&str, &str)] = if kind == "nlb" {
            &[(ANNOTATION_TYPE, "nlb")]
        } else {
            &[]
        };
        lb_service(
            &format!("{kind}-{i}"),
            &format!("0{}{i}00000-0000-0000-0000-000000000000", kind.len()),
            annotations,
        )
    };
    let described = |calls: &[(String, u64)], op: &str| -> u64 {
        calls.iter().filter(|(o, _)| o == op).map(|(_, n)| n).sum()
    };
    for (kind, op) in [
        ("classic", "elb:DescribeLoadBalancers"),
        ("nlb", "elbv2:DescribeLoadBalancers"),
    ] {
        let mut services: Vec<_> = (0..6).map(|i| service(kind, i)).collect();
        for s in &mut services[..5] {
            let status = lb
                .ensure_load_balancer("kubernetes", s, &nodes)
                .await
                .unwrap();
            // As the service controller writes it: a Service so provisioned shares its look-ups.
            s.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
                load_balancer: Some(status),
                ..Default::default()
            });
        }
        // Five that exist and one not made yet (looked up alone), all at once.
        let before = cloud.api_metrics().requests();
        let ensured = futures::future::join_all(
            services
                .iter()
                .map(|s| lb.ensure_load_balancer("kubernetes", s, &nodes)),
        )
        .await;
        let calls = calls_since(&cloud, &before);
        for (s, status) in services.iter_mut().zip(ensured) {
            let status = status.unwrap();
            assert!(
                !hostname(&status).is_empty(),
                "{kind}: {:?}",
                s.metadata.name
            );
            s.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
                load_balancer: Some(status),
                ..Default::default()
            });
        }
        assert!(
            described(&calls, op) <= 4,
            "{kind}: the new one's alone, the others' shared, and the new one's after its creation: {calls:?}"
        );

        // The six now all exist: their syncs and their drift checks share a call or two.
        let before = cloud.api_metrics().requests();
        let updates = futures::future::join_all(
            services
                .iter()
                .map(|s| lb.update_load_balancer("kubernetes", s, &nodes)),
        )
        .await;
        assert!(updates.into_iter().all(|u| u.is_ok()));
        let calls = calls_since(&cloud, &before);
        assert!(described(&calls, op) <= 2, "{kind} updates: {calls:?}");
        // The nodes' instances were looked up just now: the next sync takes them as they were.
        let before = cloud.api_metrics().requests();
        lb.update_load_balancer("kubernetes", &services[0], &nodes)
            .await
            .unwrap();
        let calls = calls_since(&cloud, &before);
        assert_eq!(
            described(&calls, "DescribeInstances"),
            0,
            "{kind}: {calls:?}"
        );
        let before = cloud.api_metrics().requests();
        let previews = futures::future::join_all(
            services
                .iter()
                .map(|s| lb.preview_load_balancer("kubernetes", s, &nodes)),
        )
        .await;
        for preview in previews {
            assert_eq!(preview.unwrap(), LoadBalancerPreview::UpToDate, "{kind}");
        }
        let calls = calls_since(&cloud, &before);
        assert!(described(&calls, op) <= 2, "{kind} previews: {calls:?}");
        for s in &services {
            lb.ensure_load_balancer_deleted("kubernetes", s)
                .await
                .unwrap();
        }
    }
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// The shadow-mode preview, asserting it made no AWS write.
async fn preview(
    cloud: &cloud_provider_aws::AwsCloud,
    service: &k8s_openapi::api::core::v1::Service,
    nodes: &[Arc<Node>],
) -> LoadBalancerPreview {
    let before = cloud.api_metrics().requests();
    let preview = cloud
        .load_balancer()
        .unwrap()
        .preview_load_balancer("kubernetes", service, nodes)
        .await
        .unwrap();
    assert_eq!(
        writes_since(cloud, &before),
        Vec::<String>::new(),
        "a preview makes Describe calls only"
    );
    preview
}

/// Issue #53 item 4: the previews (the drift check's, shadow mode's) keep to `DriftCheckCallsPerSecond`
/// for each AWS API, a sync never waits for it, and `0` lifts it. Counted by the calls that waited
/// (`aws_drift_check_budget_waits_total`), never timed.
#[tokio::test]
async fn previews_keep_to_the_drift_check_budget_and_syncs_do_not_wait_for_it() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let nlb = lb_service("budget", UID, &[(ANNOTATION_TYPE, "nlb")]);
    let budgeted = support::cloud(&format!(
        "{}DriftCheckCallsPerSecond = 1\n",
        default_config()
    ));
    let lb = budgeted.load_balancer().unwrap();
    lb.ensure_load_balancer("kubernetes", &nlb, &nodes)
        .await
        .unwrap();
    assert!(
        budgeted.api_metrics().budget_waits().is_empty(),
        "a sync waits for no budget"
    );
    // One NLB preview asks ELBv2 more than once, at one call a second: the second call waits.
    assert_eq!(
        preview(&budgeted, &nlb, &nodes).await,
        LoadBalancerPreview::UpToDate
    );
    let waits = budgeted.api_metrics().budget_waits();
    assert!(
        waits.get("Elastic Load Balancing v2").copied().unwrap_or(0) >= 1,
        "{waits:?}"
    );
    lb.ensure_load_balancer("kubernetes", &nlb, &nodes)
        .await
        .unwrap();
    assert_eq!(
        budgeted.api_metrics().budget_waits(),
        waits,
        "a sync after the previews waits for nothing"
    );

    let unlimited = support::cloud(&format!(
        "{}DriftCheckCallsPerSecond = 0\n",
        default_config()
    ));
    for _ in 0..3 {
        preview(&unlimited, &nlb, &nodes).await;
    }
    assert!(unlimited.api_metrics().budget_waits().is_empty());
    lb.ensure_load_balancer_deleted("kubernetes", &nlb)
        .await
        .unwrap();
}

/// Deregisters `id` behind the load balancer straight through the SDK (the Classic ELB, or every
/// target group of the NLB), as an operator or another controller would.
async fn deregister_directly(nlb: bool, id: &str) {
    if !nlb {
        elb()
            .deregister_instances_from_load_balancer()
            .load_balancer_name(LB_NAME)
            .instances(
                aws_sdk_elasticloadbalancing::types::Instance::builder()
                    .instance_id(id)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        return;
    }
    let v2 = elbv2();
    let lb = v2
        .describe_load_balancers()
        .names(LB_NAME)
        .send()
        .await
        .unwrap();
    let groups = v2
        .describe_target_groups()
        .load_balancer_arn(lb.load_balancers()[0].load_balancer_arn().unwrap())
        .send()
        .await
        .unwrap();
    for g in groups.target_groups() {
        v2.deregister_targets()
            .target_group_arn(g.target_group_arn().unwrap())
            .targets(
                TargetDescription::builder()
                    .id(id)
                    .port(g.port().unwrap())
                    .build(),
            )
            .send()
            .await
            .unwrap();
    }
}

/// Create before the first sync, up to date after it, the backend a new node or a direct
/// deregistration would add, and a changed port in words: each answered without a write.
async fn preview_follows_what_ensure_would_do(annotations: &[(&str, &str)]) {
    let nlb = !annotations.is_empty();
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 3).await;
    let all: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let nodes = &all[..2];
    let name = |n: &Arc<Node>| n.metadata.name.clone().unwrap();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let service = lb_service("web", UID, annotations);

    let mut backends: Vec<String> = nodes.iter().map(name).collect();
    backends.sort();
    assert_eq!(
        preview(&cloud, &service, nodes).await,
        LoadBalancerPreview::Create { backends }
    );
    assert_eq!(
        cluster_resources().await,
        Vec::<String>::new(),
        "nothing made"
    );

    lb.ensure_load_balancer("kubernetes", &service, nodes)
        .await
        .unwrap();
    assert_eq!(
        preview(&cloud, &service, nodes).await,
        LoadBalancerPreview::UpToDate
    );

    // A node more: only that backend.
    assert_eq!(
        preview(&cloud, &service, &all).await,
        LoadBalancerPreview::Change {
            backends_added: vec![name(&all[2])],
            backends_removed: vec![],
            detail: String::new(),
        }
    );
    // A node fewer: only that backend.
    assert_eq!(
        preview(&cloud, &service, &nodes[..1]).await,
        LoadBalancerPreview::Change {
            backends_added: vec![],
            backends_removed: vec![name(&nodes[1])],
            detail: String::new(),
        }
    );

    // Deregistered behind our back: ensure would register it again.
    deregister_directly(nlb, &instances[0].id).await;
    assert_eq!(
        preview(&cloud, &service, nodes).await,
        LoadBalancerPreview::Change {
            backends_added: vec![name(&nodes[0])],
            backends_removed: vec![],
            detail: String::new(),
        }
    );
    lb.ensure_load_balancer("kubernetes", &service, nodes)
        .await
        .unwrap();
    assert_eq!(
        preview(&cloud, &service, nodes).await,
        LoadBalancerPreview::UpToDate,
        "ensure restored what the preview said it would"
    );

    // Port 80 becomes 8080: said in words, backends unchanged.
    let mut moved = service.clone();
    moved.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
    match preview(&cloud, &moved, nodes).await {
        LoadBalancerPreview::Change {
            backends_added,
            backends_removed,
            detail,
        } => {
            assert!(backends_added.is_empty() && backends_removed.is_empty());
            assert!(detail.contains("8080"), "{detail}");
            assert!(
                detail.contains("port 80 would be deleted") || detail.contains("[80]"),
                "{detail}"
            );
        }
        other => panic!("expected a change, got {other:?}"),
    }
    lb.ensure_load_balancer("kubernetes", &moved, nodes)
        .await
        .unwrap();
    assert_eq!(
        preview(&cloud, &moved, nodes).await,
        LoadBalancerPreview::UpToDate
    );

    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_classic_elb_preview_tells_create_up_to_date_and_changes_without_writing() {
    let _serial = SERIAL.lock().await;
    preview_follows_what_ensure_would_do(&[]).await;
}

#[tokio::test]
async fn an_nlb_preview_tells_create_up_to_date_and_changes_without_writing() {
    let _serial = SERIAL.lock().await;
    preview_follows_what_ensure_would_do(&[(ANNOTATION_TYPE, "nlb")]).await;
}

/// The sweep's two calls: every Classic ELB and NLB tagged for the cluster is listed with the Service
/// its tag names (one made by hand without the tag is not), and deleting them as orphans leaves nothing
/// carrying the cluster's tag; a call whose leadership lapsed makes no AWS write.
#[tokio::test]
async fn the_cluster_s_load_balancers_are_listed_and_orphans_deleted() {
    use cloud_provider::{
        CloudError, ServiceRef,
        leadership::{Leadership, LeadershipSource},
    };
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let nlb = lb_service("web", UID, &[(ANNOTATION_TYPE, "nlb")]);
    let classic = lb_service("legacy", "fedcba98-7654-3210-fedc-ba9876543210", &[]);
    lb.ensure_load_balancer("kubernetes", &nlb, &nodes)
        .await
        .unwrap();
    lb.ensure_load_balancer("kubernetes", &classic, &nodes)
        .await
        .unwrap();
    // Made by hand in the same account: never the cluster's to delete.
    elbv2()
        .create_load_balancer()
        .name("by-hand")
        .r#type(LoadBalancerTypeEnum::Network)
        .subnets(&net.subnet_id)
        .send()
        .await
        .unwrap();

    let mut listed = lb.list_load_balancers("kubernetes").await.unwrap();
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    let summary: Vec<(String, Option<ServiceRef>, String)> = listed
        .iter()
        .map(|l| (l.name.clone(), l.service.clone(), l.handle.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                LB_NAME.to_owned(),
                Some(ServiceRef::new("default", "web")),
                "nlb".to_owned()
            ),
            (
                lb.get_load_balancer_name("kubernetes", &classic),
                Some(ServiceRef::new("default", "legacy")),
                "classic".to_owned()
            ),
        ]
    );

    // Leadership lapsed: the deletion is refused before its first write.
    struct Lapsed;
    impl LeadershipSource for Lapsed {
        fn lapsed(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_secs(2))
        }
    }
    let refused = Leadership::new(std::sync::Arc::new(Lapsed))
        .scope(lb.delete_orphaned_load_balancer("kubernetes", &listed[0]))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, CloudError::LeadershipLost { .. }),
        "{refused}"
    );
    assert_eq!(lb.list_load_balancers("kubernetes").await.unwrap().len(), 2);

    for orphan in &listed {
        lb.delete_orphaned_load_balancer("kubernetes", orphan)
            .await
            .unwrap();
    }
    assert_eq!(cluster_resources().await, Vec::<String>::new());
    assert!(
        lb.list_load_balancers("kubernetes")
            .await
            .unwrap()
            .is_empty()
    );
    let left: Vec<String> = elbv2()
        .describe_load_balancers()
        .send()
        .await
        .unwrap()
        .load_balancers()
        .iter()
        .filter_map(|l| l.load_balancer_name().map(str::to_owned))
        .collect();
    assert_eq!(left, ["by-hand"]);
}

/// An annotation for the other kind of load balancer (or a misspelt one) fails the sync with its name,
/// creates nothing, changes nothing on an existing load balancer, and does not stop its deletion.
#[tokio::test]
async fn an_annotation_refused_for_its_kind_or_misspelt_changes_nothing() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    const EIPS: &str = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
    const ACCESS_LOG: &str = "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
    const TYPO: &str = "service.beta.kubernetes.io/aws-load-balancer-conection-idle-timeout";
    for (nlb, refused) in [(false, EIPS), (true, ACCESS_LOG), (false, TYPO)] {
        let mut annotations = vec![(refused, "*")];
        if nlb {
            annotations.push((ANNOTATION_TYPE, "nlb"));
        }
        let service = lb_service("refused", UID, &annotations);
        let before = cloud.api_metrics().requests();
        let err = lb
            .ensure_load_balancer("kubernetes", &service, &nodes)
            .await
            .expect_err("refused");
        assert!(
            err.to_string()
                .contains(&format!("Service default/refused: {refused}: not ")),
            "{err}"
        );
        // A refusal, which the manager shows in the Service's condition as `Refused`.
        assert!(
            matches!(err, cloud_provider::CloudError::Refused { .. }),
            "{err:?}"
        );
        assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
        assert!(
            cluster_resources().await.is_empty(),
            "nothing made for a refused Service"
        );
    }

    // An existing Classic ELB: the annotation added later changes nothing, and deletion still works.
    let plain = lb_service("refused", UID, &[]);
    lb.ensure_load_balancer("kubernetes", &plain, &nodes)
        .await
        .unwrap();
    let made = cluster_resources().await;
    let refused = lb_service("refused", UID, &[(EIPS, "*")]);
    let before = cloud.api_metrics().requests();
    assert!(
        lb.ensure_load_balancer("kubernetes", &refused, &nodes[..1])
            .await
            .is_err()
    );
    assert!(
        lb.update_load_balancer("kubernetes", &refused, &nodes[..1])
            .await
            .is_err()
    );
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
    assert_eq!(cluster_resources().await, made);
    lb.ensure_load_balancer_deleted("kubernetes", &refused)
        .await
        .unwrap();
    assert!(cluster_resources().await.is_empty());
}

/// Issue #29 item 2: cloud-provider-aws authorizes a Classic ELB's group rules without a description;
/// ours carry one, and EC2 tells rules apart by protocol, ports and source only, so re-adding them failed
/// with `InvalidPermission.Duplicate` on every sync of an ELB upstream had made. Such rules are now
/// adopted as they are: no write.
#[tokio::test]
async fn a_classic_elb_group_whose_rules_carry_no_description_is_adopted_without_a_write() {
    use aws_sdk_ec2::types::{IpPermission, IpRange};
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes = vec![instance_node(&instances[0])];
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let service = lb_service("classic", UID, &[]);
    lb.ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .unwrap();

    // Make the ELB's group as upstream leaves it: the same rules, without descriptions.
    let ec2 = ec2();
    let groups = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(format!("k8s-elb-{LB_NAME}"))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let group = &groups.security_groups()[0];
    let group_id = group.group_id().unwrap().to_owned();
    let described: Vec<IpPermission> = group.ip_permissions().to_vec();
    assert!(!described.is_empty());
    ec2.revoke_security_group_ingress()
        .group_id(&group_id)
        .set_ip_permissions(Some(described.clone()))
        .send()
        .await
        .unwrap();
    let bare: Vec<IpPermission> = described
        .iter()
        .map(|p| {
            let mut p = p.clone();
            p.ip_ranges = Some(
                p.ip_ranges()
                    .iter()
                    .map(|r| IpRange::builder().cidr_ip(r.cidr_ip().unwrap()).build())
                    .collect(),
            );
            p
        })
        .collect();
    ec2.authorize_security_group_ingress()
        .group_id(&group_id)
        .set_ip_permissions(Some(bare))
        .send()
        .await
        .unwrap();

    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &service, &nodes)
        .await
        .expect("the sync of an ELB with upstream's rules succeeds");
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());

    lb.ensure_load_balancer_deleted("kubernetes", &service)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// The CIDR rules of the nodes' security groups, as (description, protocol, from, to, CIDR).
async fn node_group_rules(
    instance: &cloud_provider_aws::InstanceInfo,
) -> Vec<(String, String, i32, i32, String)> {
    let ec2 = ec2();
    let described = ec2
        .describe_instances()
        .instance_ids(&instance.id)
        .send()
        .await
        .unwrap();
    let groups: Vec<String> = described.reservations()[0].instances()[0]
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id().map(str::to_owned))
        .collect();
    let out = ec2
        .describe_security_groups()
        .set_group_ids(Some(groups))
        .send()
        .await
        .unwrap();
    let mut rules: Vec<(String, String, i32, i32, String)> = out
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| {
            p.ip_ranges().iter().map(move |r| {
                (
                    r.description().unwrap_or_default().to_owned(),
                    p.ip_protocol().unwrap_or_default().to_owned(),
                    p.from_port().unwrap_or(0),
                    p.to_port().unwrap_or(0),
                    r.cidr_ip().unwrap_or_default().to_owned(),
                )
            })
        })
        .filter(|r| r.0.starts_with("kubernetes.io/rule/nlb/"))
        .collect();
    rules.sort();
    rules
}

/// Issue #29 item 7: an NLB's rules in the nodes' group as upstream makes them: client rules per node
/// port, TCP health rules on every probed node port (a UDP port's too) unless the client rules already
/// allow them, and the shared path-MTU-discovery rule per client CIDR; the last NLB's deletion takes
/// them all away.
#[tokio::test]
async fn nlb_rules_in_the_nodes_group_are_upstream_s_mtu_and_health_rules_included() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let client = format!("kubernetes.io/rule/nlb/client={LB_NAME}");
    let health = format!("kubernetes.io/rule/nlb/health={LB_NAME}");
    let mtu = "kubernetes.io/rule/nlb/mtu".to_owned();
    let rule = |d: &str, p: &str, from: i32, to: i32, cidr: &str| {
        (d.to_owned(), p.to_owned(), from, to, cidr.to_owned())
    };
    // Health checks come from the NLB's subnets: upstream allows their CIDRs, not the VPC's.
    let subnet_cidr = ec2()
        .describe_subnets()
        .subnet_ids(&net.subnet_id)
        .send()
        .await
        .unwrap()
        .subnets()[0]
        .cidr_block()
        .unwrap()
        .to_owned();

    // TCP from everywhere on the node ports the health check probes: no health rule is needed.
    let open = lb_service("rules", UID, &[(ANNOTATION_TYPE, "nlb")]);
    lb.ensure_load_balancer("kubernetes", &open, &nodes)
        .await
        .unwrap();
    let mut expected = vec![
        rule(&client, "tcp", 30080, 30080, "0.0.0.0/0"),
        rule(&client, "tcp", 30443, 30443, "0.0.0.0/0"),
        rule(&mtu, "icmp", 3, 4, "0.0.0.0/0"),
    ];
    expected.sort();
    assert_eq!(node_group_rules(&instances[0]).await, expected);

    // UDP ports from one client range: TCP health rules on the UDP node ports, the MTU rule follows.
    let mut udp = open.clone();
    let spec = udp.spec.as_mut().unwrap();
    spec.load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);
    for port in spec.ports.as_mut().unwrap() {
        port.protocol = Some("UDP".into());
    }
    lb.ensure_load_balancer("kubernetes", &udp, &nodes)
        .await
        .unwrap();
    let mut expected = vec![
        rule(&client, "udp", 30080, 30080, "203.0.113.0/24"),
        rule(&client, "udp", 30443, 30443, "203.0.113.0/24"),
        rule(&health, "tcp", 30080, 30080, &subnet_cidr),
        rule(&health, "tcp", 30443, 30443, &subnet_cidr),
        rule(&mtu, "icmp", 3, 4, "203.0.113.0/24"),
    ];
    expected.sort();
    assert_eq!(node_group_rules(&instances[0]).await, expected);
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &udp, &nodes)
        .await
        .unwrap();
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());

    lb.ensure_load_balancer_deleted("kubernetes", &udp)
        .await
        .unwrap();
    assert_eq!(node_group_rules(&instances[0]).await, Vec::new());
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// A Classic ELB's attributes (`*attributes` as described: access log enabled, interval, bucket,
/// prefix; draining enabled, timeout; idle timeout; cross-zone).
async fn classic_attributes() -> (
    bool,
    Option<i32>,
    Option<String>,
    Option<String>,
    bool,
    Option<i32>,
    i32,
    bool,
) {
    let out = elb()
        .describe_load_balancer_attributes()
        .load_balancer_name(LB_NAME)
        .send()
        .await
        .unwrap();
    let a = out.load_balancer_attributes().unwrap();
    let log = a.access_log().unwrap();
    let draining = a.connection_draining().unwrap();
    (
        log.enabled(),
        log.emit_interval(),
        log.s3_bucket_name().map(str::to_owned),
        log.s3_bucket_prefix().map(str::to_owned),
        draining.enabled(),
        draining.timeout(),
        a.connection_settings().unwrap().idle_timeout(),
        a.cross_zone_load_balancing().unwrap().enabled(),
    )
}

/// Access logs, connection draining, the idle timeout and cross-zone balancing follow their
/// annotations on a Classic ELB, back to upstream's defaults when they are removed; a second sync
/// writes nothing; on an NLB those annotations are refused by name.
#[tokio::test]
async fn classic_elb_attributes_follow_their_annotations_as_upstream() {
    use cloud_provider_aws::spec::{
        ANNOTATION_ACCESS_LOG_BUCKET, ANNOTATION_ACCESS_LOG_ENABLED,
        ANNOTATION_ACCESS_LOG_INTERVAL, ANNOTATION_ACCESS_LOG_PREFIX, ANNOTATION_CROSS_ZONE,
        ANNOTATION_DRAINING_ENABLED, ANNOTATION_DRAINING_TIMEOUT, ANNOTATION_IDLE_TIMEOUT,
    };
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let settled = |service: k8s_openapi::api::core::v1::Service| {
        let (cloud, lb, nodes) = (&cloud, &lb, &nodes);
        async move {
            lb.ensure_load_balancer("kubernetes", &service, nodes)
                .await
                .unwrap();
            let before = cloud.api_metrics().requests();
            lb.ensure_load_balancer("kubernetes", &service, nodes)
                .await
                .unwrap();
            assert_eq!(writes_since(cloud, &before), Vec::<String>::new());
        }
    };

    settled(lb_service("attrs", UID, &[])).await;
    let defaults = classic_attributes().await;
    assert_eq!(
        (defaults.0, defaults.4, defaults.6, defaults.7),
        (false, false, 60, false)
    );

    let annotated = lb_service(
        "attrs",
        UID,
        &[
            (ANNOTATION_ACCESS_LOG_ENABLED, "true"),
            (ANNOTATION_ACCESS_LOG_INTERVAL, "5"),
            (ANNOTATION_ACCESS_LOG_BUCKET, "logs"),
            (ANNOTATION_ACCESS_LOG_PREFIX, "web"),
            (ANNOTATION_DRAINING_ENABLED, "true"),
            (ANNOTATION_DRAINING_TIMEOUT, "30"),
            (ANNOTATION_IDLE_TIMEOUT, "120"),
            (ANNOTATION_CROSS_ZONE, "true"),
        ],
    );
    settled(annotated).await;
    assert_eq!(
        classic_attributes().await,
        (
            true,
            Some(5),
            Some("logs".into()),
            Some("web".into()),
            true,
            Some(30),
            120,
            true
        )
    );

    settled(lb_service("attrs", UID, &[])).await;
    let back = classic_attributes().await;
    assert_eq!((back.0, back.4, back.6, back.7), (false, false, 60, false));

    let nlb = lb_service(
        "attrs",
        UID,
        &[(ANNOTATION_TYPE, "nlb"), (ANNOTATION_IDLE_TIMEOUT, "120")],
    );
    let err = lb
        .ensure_load_balancer("kubernetes", &nlb, &nodes)
        .await
        .expect_err("refused on an NLB");
    assert!(err.to_string().contains("not supported on an NLB"), "{err}");

    lb.ensure_load_balancer_deleted("kubernetes", &lb_service("attrs", UID, &[]))
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// PROXY protocol on a Classic ELB's backends (upstream's `k8s-proxyprotocol-enabled` policy) and an
/// NLB's target-group attributes follow their annotations, and go back when they are removed; a second
/// sync writes nothing.
#[tokio::test]
async fn proxy_protocol_and_target_group_attributes_follow_their_annotations() {
    use cloud_provider_aws::spec::{ANNOTATION_PROXY_PROTOCOL, ANNOTATION_TARGET_GROUP_ATTRIBUTES};
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let settled = |service: k8s_openapi::api::core::v1::Service| {
        let (cloud, lb, nodes) = (&cloud, &lb, &nodes);
        async move {
            lb.ensure_load_balancer("kubernetes", &service, nodes)
                .await
                .unwrap();
            let before = cloud.api_metrics().requests();
            lb.ensure_load_balancer("kubernetes", &service, nodes)
                .await
                .unwrap();
            assert_eq!(writes_since(cloud, &before), Vec::<String>::new());
        }
    };
    let backends = || async {
        let d = elb()
            .describe_load_balancers()
            .load_balancer_names(LB_NAME)
            .send()
            .await
            .unwrap();
        let mut out: Vec<(i32, Vec<String>)> = d.load_balancer_descriptions()[0]
            .backend_server_descriptions()
            .iter()
            .map(|b| (b.instance_port().unwrap(), b.policy_names().to_vec()))
            .filter(|(_, p)| !p.is_empty())
            .collect();
        out.sort();
        out
    };

    settled(lb_service("pp", UID, &[(ANNOTATION_PROXY_PROTOCOL, "*")])).await;
    let policy = vec!["k8s-proxyprotocol-enabled".to_owned()];
    assert_eq!(
        backends().await,
        [(30080, policy.clone()), (30443, policy.clone())]
    );
    settled(lb_service("pp", UID, &[])).await;
    assert_eq!(backends().await, Vec::new());
    let err = lb
        .ensure_load_balancer(
            "kubernetes",
            &lb_service("pp", UID, &[(ANNOTATION_PROXY_PROTOCOL, "yes")]),
            &nodes,
        )
        .await
        .expect_err("only * is supported");
    assert!(
        err.to_string()
            .contains("the only value supported currently is '*'"),
        "{err}"
    );
    lb.ensure_load_balancer_deleted("kubernetes", &lb_service("pp", UID, &[]))
        .await
        .unwrap();

    // NLB: the attributes on every target group; back to AWS's defaults without the annotation.
    let attributes = || async {
        let v2 = elbv2();
        let groups = v2.describe_target_groups().send().await.unwrap();
        let mut out = Vec::new();
        for g in groups.target_groups() {
            let a = v2
                .describe_target_group_attributes()
                .target_group_arn(g.target_group_arn().unwrap())
                .send()
                .await
                .unwrap();
            let get = |key: &str| {
                a.attributes()
                    .iter()
                    .find(|x| x.key() == Some(key))
                    .and_then(|x| x.value())
                    .map(str::to_owned)
            };
            out.push((
                get("preserve_client_ip.enabled"),
                get("proxy_protocol_v2.enabled"),
            ));
        }
        out
    };
    settled(lb_service(
        "pp",
        UID,
        &[
            (ANNOTATION_TYPE, "nlb"),
            (
                ANNOTATION_TARGET_GROUP_ATTRIBUTES,
                "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=true",
            ),
        ],
    ))
    .await;
    let set = (Some("false".to_owned()), Some("true".to_owned()));
    assert_eq!(attributes().await, [set.clone(), set]);
    settled(lb_service("pp", UID, &[(ANNOTATION_TYPE, "nlb")])).await;
    let defaults = (Some("true".to_owned()), Some("false".to_owned()));
    assert_eq!(attributes().await, [defaults.clone(), defaults]);
    lb.ensure_load_balancer_deleted(
        "kubernetes",
        &lb_service("pp", UID, &[(ANNOTATION_TYPE, "nlb")]),
    )
    .await
    .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// `ip-address-type: dualstack`: refused while the cluster's subnets have no IPv6 CIDR (no NLB is
/// made); then a dual-stack NLB in the subnet that has one, which a second sync leaves alone; back to
/// `ipv4` in place (`SetIpAddressType`) when the annotation says so; nothing left after deletion.
#[tokio::test]
async fn a_dual_stack_nlb_needs_ipv6_subnets_and_follows_its_annotation() {
    use aws_sdk_elasticloadbalancingv2::types::IpAddressType;
    use cloud_provider_aws::spec::ANNOTATION_IP_ADDRESS_TYPE;
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let nodes = [instance_node(&instances[0])];
    let dual = |kind: &'static str| {
        let mut s = lb_service(
            "dual",
            UID,
            &[(ANNOTATION_TYPE, "nlb"), (ANNOTATION_IP_ADDRESS_TYPE, kind)],
        );
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        s
    };
    let ip_type = || async {
        elbv2()
            .describe_load_balancers()
            .names(LB_NAME)
            .send()
            .await
            .ok()
            .and_then(|d| d.load_balancers().first().cloned())
            .map(|l| l.ip_address_type().cloned())
    };

    let err = lb
        .ensure_load_balancer("kubernetes", &dual("dualstack"), &nodes)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a dual-stack NLB needs subnets with an IPv6 CIDR"),
        "{err}"
    );
    assert_eq!(ip_type().await, None, "no NLB without IPv6 subnets");

    let ec2 = ec2();
    let vpc = ec2
        .associate_vpc_cidr_block()
        .vpc_id(&net.vpc_id)
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await
        .unwrap();
    let block = vpc
        .ipv6_cidr_block_association()
        .and_then(|a| a.ipv6_cidr_block())
        .expect("an IPv6 block for the VPC")
        .to_owned();
    let subnet_block = format!("{}/64", block.split('/').next().unwrap());
    ec2.associate_subnet_cidr_block()
        .subnet_id(&net.subnet_id)
        .ipv6_cidr_block(&subnet_block)
        .send()
        .await
        .unwrap();

    lb.ensure_load_balancer("kubernetes", &dual("dualstack"), &nodes)
        .await
        .unwrap();
    assert_eq!(ip_type().await, Some(Some(IpAddressType::Dualstack)));
    let preview = lb
        .preview_load_balancer("kubernetes", &dual("dualstack"), &nodes)
        .await
        .unwrap();
    assert_eq!(preview, LoadBalancerPreview::UpToDate);
    match lb
        .preview_load_balancer("kubernetes", &dual("ipv4"), &nodes)
        .await
        .unwrap()
    {
        LoadBalancerPreview::Change { detail, .. } => assert!(
            detail.contains("the IP address type would change from dualstack to ipv4"),
            "{detail}"
        ),
        other => panic!("{other:?}"),
    }
    lb.ensure_load_balancer("kubernetes", &dual("ipv4"), &nodes)
        .await
        .unwrap();
    assert_eq!(ip_type().await, Some(Some(IpAddressType::Ipv4)));

    lb.ensure_load_balancer_deleted("kubernetes", &dual("ipv4"))
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// `private-ipv4-addresses` (internal NLB) and `eip-allocations` (internet-facing NLB): the NLB is
/// created with them, one per subnet (a private address goes to the subnet that holds it); a later sync
/// writes nothing; an address outside the subnets or a count that does not match is refused by name
/// and makes nothing; asking an existing NLB for other addresses is refused (AWS fixes them at creation)
/// and changes nothing; deletion leaves nothing.
#[tokio::test]
async fn an_nlb_gets_the_fixed_addresses_its_annotations_name() {
    use cloud_provider_aws::spec::{
        ANNOTATION_EIP_ALLOCATIONS, ANNOTATION_INTERNAL, ANNOTATION_PRIVATE_IPV4_ADDRESSES,
    };
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();
    let nodes = [instance_node(&instances[0])];
    let internal = |addresses: &'static str| {
        lb_service(
            "fixed",
            UID,
            &[
                (ANNOTATION_TYPE, "nlb"),
                (ANNOTATION_INTERNAL, "true"),
                (ANNOTATION_PRIVATE_IPV4_ADDRESSES, addresses),
            ],
        )
    };
    let addresses = || async {
        let described = elbv2()
            .describe_load_balancers()
            .names(LB_NAME)
            .send()
            .await
            .ok()?;
        let lb = described.load_balancers().first()?.clone();
        Some(
            lb.availability_zones()
                .iter()
                .flat_map(|z| z.load_balancer_addresses().iter())
                .map(|a| {
                    a.allocation_id()
                        .or(a.private_ipv4_address())
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>(),
        )
    };

    for (asked, refused) in [
        ("10.9.0.5", "10.9.0.5 is in none of the NLB's subnets"),
        ("10.0.1.50,10.0.1.51", "2 given for 1 subnets"),
    ] {
        let before = cloud.api_metrics().requests();
        let err = lb
            .ensure_load_balancer("kubernetes", &internal(asked), &nodes)
            .await
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains(ANNOTATION_PRIVATE_IPV4_ADDRESSES) && err.contains(refused),
            "{err}"
        );
        assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
        assert_eq!(addresses().await, None, "no NLB");
    }

    lb.ensure_load_balancer("kubernetes", &internal("10.0.1.50"), &nodes)
        .await
        .unwrap();
    assert_eq!(addresses().await, Some(vec!["10.0.1.50".to_owned()]));
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &internal("10.0.1.50"), &nodes)
        .await
        .unwrap();
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
    let err = lb
        .ensure_load_balancer("kubernetes", &internal("10.0.1.60"), &nodes)
        .await
        .expect_err("an existing NLB's addresses are fixed")
        .to_string();
    assert!(
        err.contains("has [10.0.1.50], and AWS fixes an NLB's addresses when it is created"),
        "{err}"
    );
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
    lb.ensure_load_balancer_deleted("kubernetes", &internal("10.0.1.50"))
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());

    let eip = ec2()
        .allocate_address()
        .domain(aws_sdk_ec2::types::DomainType::Vpc)
        .send()
        .await
        .unwrap()
        .allocation_id()
        .unwrap()
        .to_owned();
    let public = lb_service(
        "fixed",
        UID,
        &[
            (ANNOTATION_TYPE, "nlb"),
            (ANNOTATION_EIP_ALLOCATIONS, eip.as_str()),
        ],
    );
    lb.ensure_load_balancer("kubernetes", &public, &nodes)
        .await
        .unwrap();
    assert_eq!(addresses().await, Some(vec![eip.clone()]));
    lb.ensure_load_balancer_deleted("kubernetes", &public)
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}

/// The ingress rules of the security group `id` as (protocol, from, to, CIDR), IPv6 ranges too.
async fn group_rules(id: &str) -> Vec<(String, i32, i32, String)> {
    let out = ec2()
        .describe_security_groups()
        .group_ids(id)
        .send()
        .await
        .unwrap();
    let mut rules: Vec<(String, i32, i32, String)> = out
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| {
            let v4 = p.ip_ranges().iter().filter_map(|r| r.cidr_ip());
            let v6 = p.ipv6_ranges().iter().filter_map(|r| r.cidr_ipv6());
            v4.chain(v6).map(move |cidr| {
                (
                    p.ip_protocol().unwrap_or_default().to_owned(),
                    p.from_port().unwrap_or(0),
                    p.to_port().unwrap_or(0),
                    cidr.to_owned(),
                )
            })
        })
        .collect();
    rules.sort();
    rules
}

/// The security groups of the NLB named [`LB_NAME`], `None` without the NLB.
async fn nlb_security_groups() -> Option<Vec<String>> {
    elbv2()
        .describe_load_balancers()
        .names(LB_NAME)
        .send()
        .await
        .ok()
        .and_then(|d| d.load_balancers().first().cloned())
        .map(|l| l.security_groups().to_vec())
}

/// Issue #29, `NLBSecurityGroupMode = Managed`: a new NLB gets its own group under upstream's name,
/// tagged `owned`, with the listeners' ports and path-MTU ICMP open to the source ranges, following
/// them; a second sync writes nothing; `aws-load-balancer-security-groups` replaces the group (deleted)
/// with the given ones, which are left as they are and survive the Service; an NLB made without the
/// mode keeps having no groups, and asking it for some by annotation is refused by name; deletion
/// leaves nothing of ours.
#[tokio::test]
async fn an_nlb_gets_a_security_group_of_its_own_with_the_managed_mode() {
    use cloud_provider_aws::{nlb_security_group_name, spec::ANNOTATION_SECURITY_GROUPS};
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let cloud = cloud(&format!(
        "{}NLBSecurityGroupMode = Managed\n",
        default_config()
    ));
    let lb = cloud.load_balancer().unwrap();
    let nodes = [instance_node(&instances[0])];
    let nlb = |ranges: &[&str], groups: Option<&str>| {
        let mut annotations = vec![(ANNOTATION_TYPE, "nlb")];
        if let Some(g) = groups {
            annotations.push((ANNOTATION_SECURITY_GROUPS, g));
        }
        let mut s = lb_service("web", UID, &annotations);
        if !ranges.is_empty() {
            s.spec.as_mut().unwrap().load_balancer_source_ranges =
                Some(ranges.iter().map(|r| r.to_string()).collect());
        }
        s
    };
    let rules = |cidr: &str| -> Vec<(String, i32, i32, String)> {
        vec![
            ("icmp".into(), 3, 4, cidr.into()),
            ("tcp".into(), 80, 80, cidr.into()),
            ("tcp".into(), 443, 443, cidr.into()),
        ]
    };

    lb.ensure_load_balancer("kubernetes", &nlb(&[], None), &nodes)
        .await
        .unwrap();
    let groups = nlb_security_groups().await.expect("the NLB");
    assert_eq!(groups.len(), 1, "{groups:?}");
    let own = groups[0].clone();
    let described = ec2()
        .describe_security_groups()
        .group_ids(&own)
        .send()
        .await
        .unwrap();
    let group = &described.security_groups()[0];
    assert_eq!(
        group.group_name(),
        Some(nlb_security_group_name("kubernetes", "default", "web", UID).as_str())
    );
    assert_eq!(
        group.description(),
        Some("[k8s] Managed SecurityGroup for LoadBalancer")
    );
    assert!(
        group.tags().iter().any(|t| t.key()
            == Some(format!("kubernetes.io/cluster/{CLUSTER_ID}").as_str())
            && t.value() == Some("owned")),
        "{:?}",
        group.tags()
    );
    assert_eq!(group_rules(&own).await, rules("0.0.0.0/0"));

    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &nlb(&[], None), &nodes)
        .await
        .unwrap();
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
    assert_eq!(
        lb.preview_load_balancer("kubernetes", &nlb(&[], None), &nodes)
            .await
            .unwrap(),
        LoadBalancerPreview::UpToDate
    );

    lb.ensure_load_balancer("kubernetes", &nlb(&["10.1.0.0/16"], None), &nodes)
        .await
        .unwrap();
    assert_eq!(group_rules(&own).await, rules("10.1.0.0/16"));

    // The groups of the annotation replace ours, which goes away; theirs get no rule of ours.
    let byo = ec2()
        .create_security_group()
        .group_name("byo")
        .description("the operator's")
        .vpc_id(&net.vpc_id)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    lb.ensure_load_balancer("kubernetes", &nlb(&[], Some(&byo)), &nodes)
        .await
        .unwrap();
    assert_eq!(nlb_security_groups().await, Some(vec![byo.clone()]));
    assert_eq!(group_rules(&byo).await, Vec::new());
    let gone = ec2()
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-id")
                .values(&own)
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(gone.security_groups().is_empty(), "our group is deleted");

    // Back to a group of its own (made again under the same name); the operator's stays.
    lb.ensure_load_balancer("kubernetes", &nlb(&[], None), &nodes)
        .await
        .unwrap();
    let groups = nlb_security_groups().await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_ne!(groups[0], byo);
    assert_eq!(group_rules(&groups[0]).await, rules("0.0.0.0/0"));

    lb.ensure_load_balancer_deleted("kubernetes", &nlb(&[], None))
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
    assert_eq!(
        ec2()
            .describe_security_groups()
            .group_ids(&byo)
            .send()
            .await
            .unwrap()
            .security_groups()
            .len(),
        1,
        "the operator's group is left"
    );

    // An NLB made without the mode cannot be given groups: it keeps none, without a write, and a
    // Service that asks for groups by annotation is refused by name.
    let unmanaged = support::cloud(&default_config());
    unmanaged
        .load_balancer()
        .unwrap()
        .ensure_load_balancer("kubernetes", &nlb(&[], None), &nodes)
        .await
        .unwrap();
    assert_eq!(nlb_security_groups().await, Some(Vec::new()));
    let before = cloud.api_metrics().requests();
    lb.ensure_load_balancer("kubernetes", &nlb(&[], None), &nodes)
        .await
        .unwrap();
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());
    assert_eq!(nlb_security_groups().await, Some(Vec::new()));
    let err = lb
        .ensure_load_balancer("kubernetes", &nlb(&[], Some(&byo)), &nodes)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(ANNOTATION_SECURITY_GROUPS)
            && err.contains("was created without security groups"),
        "{err}"
    );
    assert_eq!(nlb_security_groups().await, Some(Vec::new()));
    lb.ensure_load_balancer_deleted("kubernetes", &nlb(&[], None))
        .await
        .unwrap();
    assert_eq!(cluster_resources().await, Vec::<String>::new());
}
