//! The contract's conformance suite (`cloud_provider::conformance`) against the `aws` provider on moto.

mod support;

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use cloud_provider::conformance::{Fixtures, run};
use support::*;

#[tokio::test]
async fn the_aws_provider_passes_the_conformance_suite() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 3).await;
    stop(&instances[2].id).await;
    ec2()
        .create_route_table()
        .vpc_id(&net.vpc_id)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::RouteTable)
                .tags(
                    Tag::builder()
                        .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let cloud = cloud(&default_config());
    let fixtures = Fixtures::new(
        &instances[0].private_dns,
        "ip-10-9-9-9.us-west-2.compute.internal",
    )
    .with_shutdown_node(&instances[2].private_dns)
    .with_backend_nodes(&[&instances[0].private_dns, &instances[1].private_dns]);
    let report = run(&cloud, &fixtures).await;
    report.assert_passed();
    assert!(report.passed().len() >= 10, "{:?}", report.results);
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "load_balancer_is_listed_and_deleted_as_an_orphan"),
        "the sweep's contract is checked, not skipped"
    );
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "load_balancer_kept_is_adopted_by_the_next_service_of_its_name"),
        "keeping a load balancer is checked, not skipped"
    );
}
