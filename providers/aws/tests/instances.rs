//! InstancesV2 and Zones against moto: look-ups by private DNS name, provider ID and resource-based
//! name; addresses, type, zone, region, the zone-ID label; stopped and terminated instances; batched
//! DescribeInstances and DescribeAvailabilityZones.

mod support;

use cloud_provider::{CloudError, CloudProvider};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use std::collections::BTreeMap;

use cloud_provider_aws::ZONE_ID_LABEL;
use support::*;

fn node(name: &str, provider_id: Option<&str>) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.to_owned());
    n.spec = Some(NodeSpec {
        provider_id: provider_id.map(str::to_owned),
        ..Default::default()
    });
    n
}

#[tokio::test]
async fn a_node_named_by_private_dns_gets_its_instances_metadata() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instance = run_instances(&net, 1).await.remove(0);
    assert!(
        !instance.private_dns.is_empty(),
        "moto gives a private DNS name"
    );

    let cloud = cloud(&default_config());
    let v2 = cloud.instances_v2().expect("InstancesV2 offered");
    let n = node(&instance.private_dns, None);
    let meta = v2.instance_metadata(&n).await.unwrap().expect("metadata");
    assert_eq!(meta.provider_id, format!("aws:///{ZONE}/{}", instance.id));
    assert_eq!(meta.instance_type, "t3.medium");
    assert_eq!(meta.zone, ZONE);
    assert_eq!(meta.region, REGION);
    // Upstream's zone-ID label, from DescribeAvailabilityZones (moto's ID for us-west-2a).
    assert_eq!(
        meta.additional_labels,
        BTreeMap::from([(ZONE_ID_LABEL.to_owned(), MOTO_ZONE_ID.to_owned())])
    );
    // A node that has the label already keeps its own (upstream's rule): none is offered.
    let mut labelled = node(&instance.private_dns, None);
    labelled.metadata.labels = Some(BTreeMap::from([(
        ZONE_ID_LABEL.to_owned(),
        "set-by-hand".to_owned(),
    )]));
    let meta_labelled = v2.instance_metadata(&labelled).await.unwrap().unwrap();
    assert!(meta_labelled.additional_labels.is_empty());
    let addresses: Vec<(String, String)> = meta
        .node_addresses
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect();
    assert_eq!(
        addresses[0],
        ("InternalIP".to_owned(), instance.private_ip.clone())
    );
    assert!(addresses.contains(&("InternalDNS".to_owned(), instance.private_dns.clone())));
    assert!(addresses.contains(&("Hostname".to_owned(), instance.private_dns.clone())));
    if !instance.public_ip.is_empty() {
        assert!(addresses.contains(&("ExternalIP".to_owned(), instance.public_ip.clone())));
    }
    assert!(v2.instance_exists(&n).await.unwrap());
    assert!(!v2.instance_shutdown(&n).await.unwrap());

    // The same instance by its provider ID, and by a resource-based name.
    let by_id = node("whatever", Some(&meta.provider_id));
    assert_eq!(
        v2.instance_metadata(&by_id)
            .await
            .unwrap()
            .unwrap()
            .provider_id,
        meta.provider_id
    );
    let resource_named = node(&format!("{}.{REGION}.compute.internal", instance.id), None);
    assert_eq!(
        v2.instance_metadata(&resource_named)
            .await
            .unwrap()
            .unwrap()
            .provider_id,
        meta.provider_id
    );

    // Zones agree.
    let zones = cloud.zones().expect("Zones offered");
    let zone = zones
        .get_zone_by_provider_id(&meta.provider_id)
        .await
        .unwrap();
    assert_eq!(
        (zone.failure_domain.as_str(), zone.region.as_str()),
        (ZONE, REGION)
    );
    let zone = zones
        .get_zone_by_node_name(&instance.private_dns)
        .await
        .unwrap();
    assert_eq!(zone.failure_domain, ZONE);
    assert_eq!(zones.get_zone().await.unwrap().failure_domain, ZONE);
}

#[tokio::test]
async fn stopped_instances_are_shut_down_and_terminated_ones_do_not_exist() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let cloud = cloud(&default_config());
    let v2 = cloud.instances_v2().unwrap();
    let stopped = node(&instances[0].private_dns, None);
    let gone = node("n", Some(&instances[1].provider_id()));

    stop(&instances[0].id).await;
    assert!(
        v2.instance_exists(&stopped).await.unwrap(),
        "a stopped instance still exists"
    );
    assert!(v2.instance_shutdown(&stopped).await.unwrap());

    terminate(&instances[1].id).await;
    assert!(!v2.instance_exists(&gone).await.unwrap());
    assert!(matches!(
        v2.instance_metadata(&gone).await,
        Err(CloudError::InstanceNotFound)
    ));

    // Never-seen names and IDs do not exist either (a filter that matches nothing, not an error).
    assert!(
        !v2.instance_exists(&node("ip-10-9-9-9.us-west-2.compute.internal", None))
            .await
            .unwrap()
    );
    assert!(
        !v2.instance_exists(&node("n", Some("aws:///us-west-2a/i-0000000000000000f")))
            .await
            .unwrap()
    );
    // A provider ID of another cloud is an error that names it.
    let err = v2
        .instance_exists(&node("n", Some("gce://p/z/n")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"gce://p/z/n\" is not an AWS provider ID"),
        "{err}"
    );
}

#[tokio::test]
async fn concurrent_lookups_share_one_describe_instances_call_and_one_zone_id_call() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 30).await;
    let cloud = cloud(&default_config());
    let v2 = cloud.instances_v2().unwrap();
    let nodes: Vec<Node> = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            // Half by name, half by provider ID: one call per kind of filter.
            if i % 2 == 0 {
                node(&inst.private_dns, None)
            } else {
                node("x", Some(&inst.provider_id()))
            }
        })
        .collect();
    let before = cloud
        .api_metrics()
        .requests()
        .get("DescribeInstances")
        .copied()
        .unwrap_or(0);
    let results = futures::future::join_all(nodes.iter().map(|n| v2.instance_metadata(n))).await;
    for (result, inst) in results.into_iter().zip(&instances) {
        assert_eq!(result.unwrap().unwrap().provider_id, inst.provider_id());
    }
    let calls = cloud.api_metrics().requests()["DescribeInstances"] - before;
    assert_eq!(
        calls, 2,
        "30 concurrent look-ups take one call per filter kind, not one per node"
    );
    assert_eq!(
        cloud.api_metrics().requests()["DescribeAvailabilityZones"],
        1,
        "the zone IDs of 30 nodes take one DescribeAvailabilityZones, not one per node"
    );
}

#[tokio::test]
async fn throttled_calls_are_retried_with_back_off_and_counted_on_metrics() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instance = run_instances(&net, 1).await.remove(0);
    // EC2 goes through a proxy that throttles the first 3 requests, reached by a [ServiceOverride].
    let proxy = throttle::ThrottlingProxy::start(moto().port, 3).await;
    let config = config_through("ec2", proxy.port);
    let cloud = cloud(&config);
    let mut registry = cloud_provider::prometheus_client::registry::Registry::default();
    cloud.register_metrics(&mut registry);

    let meta = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&node(&instance.private_dns, None))
        .await
        .expect("the look-up succeeds after the throttling")
        .unwrap();
    assert_eq!(meta.provider_id, instance.provider_id());
    assert_eq!(proxy.refused.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(cloud.api_metrics().throttled()["DescribeInstances"], 3);
    assert_eq!(cloud.api_metrics().requests()["DescribeInstances"], 4);
    let mut text = String::new();
    cloud_provider::prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("aws_api_throttled_total{operation=\"DescribeInstances\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("aws_api_requests_total{operation=\"DescribeInstances\"} 4"),
        "{text}"
    );

    // Throttling beyond the retries is an error that says so, counted by code.
    let proxy = throttle::ThrottlingProxy::start(moto().port, 100).await;
    let config = config_through("ec2", proxy.port);
    let cloud = support::cloud(&config);
    let err = cloud
        .instances_v2()
        .unwrap()
        .instance_exists(&node(&instance.private_dns, None))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("AWS DescribeInstances failed: RequestLimitExceeded"),
        "{err}"
    );
    assert_eq!(
        cloud.api_metrics().throttled()["DescribeInstances"],
        6,
        "every attempt counted"
    );
}

/// Upstream's network-topology labels: a P5 instance gets `topology.k8s.aws/network-node-layer-1..3`
/// from `DescribeInstanceTopology`; t3 instances get none, and their type is asked about once, not once
/// per node; a node that has the labels already is not asked about.
#[tokio::test]
async fn network_topology_labels_come_once_per_type_without_one() {
    use aws_sdk_ec2::types::InstanceType;
    use cloud_provider_aws::NETWORK_NODE_LABEL_PREFIX;
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let gpu = run_instances_of(&net, 1, InstanceType::P548xlarge)
        .await
        .remove(0);
    let small = run_instances(&net, 3).await;
    let cloud = cloud(&default_config());
    let v2 = cloud.instances_v2().unwrap();
    let topology_calls = || {
        cloud
            .api_metrics()
            .requests()
            .get("DescribeInstanceTopology")
            .copied()
            .unwrap_or(0)
    };

    let meta = v2
        .instance_metadata(&node(&gpu.private_dns, None))
        .await
        .unwrap()
        .unwrap();
    let layers: Vec<(&str, &str)> = meta
        .additional_labels
        .iter()
        .filter(|(k, _)| k.starts_with(NETWORK_NODE_LABEL_PREFIX))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        layers.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [1, 2, 3].map(|n| format!("{NETWORK_NODE_LABEL_PREFIX}{n}")),
        "{meta:?}"
    );
    assert!(
        layers.iter().all(|(_, v)| v.starts_with("nn-")),
        "{layers:?}"
    );
    assert_eq!(topology_calls(), 1);

    // Three t3 nodes initialized at once: one look-up for the type, not one per node.
    let small_nodes: Vec<_> = small.iter().map(|i| node(&i.private_dns, None)).collect();
    let metas =
        futures::future::join_all(small_nodes.iter().map(|n| v2.instance_metadata(n))).await;
    for meta in metas {
        let meta = meta.unwrap().unwrap();
        assert!(
            !meta
                .additional_labels
                .keys()
                .any(|k| k.starts_with(NETWORK_NODE_LABEL_PREFIX)),
            "{meta:?}"
        );
    }
    assert_eq!(
        topology_calls(),
        2,
        "t3.medium asked about once for three nodes at once"
    );

    let mut labelled = node(&gpu.private_dns, None);
    labelled.metadata.labels = Some(BTreeMap::from([(
        format!("{NETWORK_NODE_LABEL_PREFIX}1"),
        "nn-set".to_owned(),
    )]));
    v2.instance_metadata(&labelled).await.unwrap().unwrap();
    assert_eq!(topology_calls(), 2, "a labelled node is not asked about");
}
