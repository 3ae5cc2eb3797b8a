//! Pod-CIDR routes against moto: created in the cluster's tagged route table with source/destination
//! checks turned off, listed with their nodes, idempotent, deleted; a route to a terminated instance is
//! reported as a blackhole (moto keeps it `active`, AWS would not).

mod support;

use cloud_provider::{CloudProvider, Route};
use support::*;

fn route(node: &str, cidr: &str) -> Route {
    Route {
        target_node: node.to_owned(),
        destination_cidr: cidr.to_owned(),
        ..Default::default()
    }
}

#[tokio::test]
async fn routes_follow_pod_cidrs_in_the_clusters_route_table() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 2).await;
    let table_id = cluster_route_table(&net).await;

    let cloud = cloud(&default_config());
    let routes = cloud.routes().unwrap();
    assert_eq!(
        routes.list_routes("kubernetes").await.unwrap(),
        Vec::<Route>::new()
    );
    let a = route(&instances[0].private_dns, "10.244.1.0/24");
    let b = route(&instances[1].private_dns, "10.244.2.0/24");
    routes
        .create_route("kubernetes", "uid-a", &a)
        .await
        .unwrap();
    routes
        .create_route("kubernetes", "uid-b", &b)
        .await
        .unwrap();

    let attr = ec2()
        .describe_instance_attribute()
        .instance_id(&instances[0].id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::SourceDestCheck)
        .send()
        .await
        .unwrap();
    assert_eq!(
        attr.source_dest_check().and_then(|v| v.value()),
        Some(false)
    );
    assert_eq!(
        instance_routes(&table_id).await,
        [
            ("10.244.1.0/24".to_owned(), instances[0].id.clone()),
            ("10.244.2.0/24".to_owned(), instances[1].id.clone())
        ]
    );

    let mut listed = routes.list_routes("kubernetes").await.unwrap();
    listed.sort_by(|x, y| x.destination_cidr.cmp(&y.destination_cidr));
    let pairs: Vec<(&str, &str, bool)> = listed
        .iter()
        .map(|r| {
            (
                r.target_node.as_str(),
                r.destination_cidr.as_str(),
                r.blackhole,
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [
            (instances[0].private_dns.as_str(), "10.244.1.0/24", false),
            (instances[1].private_dns.as_str(), "10.244.2.0/24", false)
        ]
    );

    // Creating what exists writes nothing.
    let before = cloud.api_metrics().requests();
    routes
        .create_route("kubernetes", "uid-a", &a)
        .await
        .unwrap();
    assert_eq!(writes_since(&cloud, &before), Vec::<String>::new());

    // The instance behind b goes away: its route is a blackhole (and is deleted as such).
    terminate(&instances[1].id).await;
    let listed = routes.list_routes("kubernetes").await.unwrap();
    let gone = listed
        .iter()
        .find(|r| r.destination_cidr == "10.244.2.0/24")
        .unwrap();
    assert!(gone.blackhole, "{gone:?}");
    assert_eq!(gone.target_node, "");
    routes.delete_route("kubernetes", gone).await.unwrap();
    routes.delete_route("kubernetes", &a).await.unwrap();
    assert_eq!(
        routes.list_routes("kubernetes").await.unwrap(),
        Vec::<Route>::new()
    );
    // Deleting what is gone is fine.
    routes.delete_route("kubernetes", &a).await.unwrap();

    // Without a tagged table (and no RouteTableID) listing says what is missing.
    let other = support::cloud("[Global]\nZone = us-west-2a\nKubernetesClusterID = other\n");
    let err = other
        .routes()
        .unwrap()
        .list_routes("kubernetes")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unable to find route table for AWS cluster: other"),
        "{err}"
    );
}
