//! TLS termination on moto, as cloud-provider-aws builds it: `ssl-cert`, `ssl-ports`,
//! `ssl-negotiation-policy` and `backend-protocol` give HTTPS/SSL listeners with the certificate and
//! upstream's negotiation policy on a Classic ELB, and TLS listeners (and TLS target groups with
//! `backend-protocol: ssl`) on an NLB; a second sync writes nothing; changing or removing an annotation
//! changes the load balancer on the next sync; a certificate that cannot be had fails the sync and
//! leaves no plain listener in its place; deletion leaves nothing.

mod support;

use cloud_provider::CloudProvider;
use cloud_provider_aws::spec::{
    ANNOTATION_BACKEND_PROTOCOL, ANNOTATION_SSL_CERT, ANNOTATION_SSL_POLICY, ANNOTATION_SSL_PORTS,
    ANNOTATION_TYPE,
};
use k8s_openapi::api::core::v1::{Node, Service};
use std::sync::Arc;

use support::*;

const UID: &str = "abcdef01-2345-6789-abcd-ef0123456789";
/// `a` + the UID without dashes, cut to 32 characters.
const LB_NAME: &str = "aabcdef0123456789abcdef012345678";
/// An IAM server certificate: moto takes IAM ARNs without looking them up.
const CERT: &str = "arn:aws:iam::123456789012:server-certificate/web";
const OTHER_CERT: &str = "arn:aws:iam::123456789012:server-certificate/web-2";
/// An ACM certificate moto does not have.
const MISSING_CERT: &str = "arn:aws:acm:us-west-2:123456789012:certificate/0000-missing";
const POLICY: &str = "ELBSecurityPolicy-TLS-1-2-2017-01";

/// A Classic ELB listener as described: (port, protocol, instance protocol, certificate, policies).
type ClassicListener = (i32, String, String, Option<String>, Vec<String>);

async fn classic_listeners() -> Vec<ClassicListener> {
    let described = elb()
        .describe_load_balancers()
        .load_balancer_names(LB_NAME)
        .send()
        .await
        .unwrap();
    let mut out: Vec<ClassicListener> = described.load_balancer_descriptions()[0]
        .listener_descriptions()
        .iter()
        .map(|d| {
            let l = d.listener().unwrap();
            (
                l.load_balancer_port(),
                l.protocol().to_ascii_uppercase(),
                l.instance_protocol()
                    .unwrap_or_default()
                    .to_ascii_uppercase(),
                l.ssl_certificate_id().map(str::to_owned),
                d.policy_names().to_vec(),
            )
        })
        .collect();
    out.sort();
    out
}

async fn classic_health_target() -> String {
    let described = elb()
        .describe_load_balancers()
        .load_balancer_names(LB_NAME)
        .send()
        .await
        .unwrap();
    described.load_balancer_descriptions()[0]
        .health_check()
        .map(|h| h.target())
        .unwrap_or_default()
        .to_owned()
}

/// An NLB listener as described: (port, protocol, certificate, policy when TLS, target-group protocol).
type NlbListener = (i32, String, Option<String>, Option<String>, String);

async fn nlb_listeners() -> Vec<NlbListener> {
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
    let listeners = v2
        .describe_listeners()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    let groups = v2
        .describe_target_groups()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    let mut out: Vec<NlbListener> = listeners
        .listeners()
        .iter()
        .map(|l| {
            let protocol = l.protocol().unwrap().as_str().to_owned();
            let group = l.default_actions()[0].target_group_arn().unwrap();
            let group_protocol = groups
                .target_groups()
                .iter()
                .find(|g| g.target_group_arn() == Some(group))
                .and_then(|g| g.protocol())
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| "missing".into());
            (
                l.port().unwrap(),
                protocol.clone(),
                l.certificates()
                    .first()
                    .and_then(|c| c.certificate_arn())
                    .map(str::to_owned),
                (protocol == "TLS")
                    .then(|| l.ssl_policy().map(str::to_owned))
                    .flatten(),
                group_protocol,
            )
        })
        .collect();
    out.sort();
    out
}

fn service(annotations: &[(&str, &str)]) -> Service {
    lb_service("tls", UID, annotations)
}

/// A wanted listener: (port, protocol, instance protocol, certificate, policies).
type Wanted<'a> = (i32, &'a str, &'a str, Option<&'a str>, &'a [&'a str]);

fn owned(listeners: &[Wanted]) -> Vec<ClassicListener> {
    listeners
        .iter()
        .map(|(port, protocol, instance, cert, policies)| {
            (
                *port,
                protocol.to_string(),
                instance.to_string(),
                cert.map(str::to_owned),
                policies.iter().map(|p| p.to_string()).collect(),
            )
        })
        .collect()
}

async fn sync(cloud: &cloud_provider_aws::AwsCloud, service: &Service, nodes: &[Arc<Node>]) {
    cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer("kubernetes", service, nodes)
        .await
        .unwrap_or_else(|e| panic!("sync failed: {e}"));
}

/// Syncs twice; the second makes no AWS write.
async fn sync_settled(
    cloud: &cloud_provider_aws::AwsCloud,
    service: &Service,
    nodes: &[Arc<Node>],
) {
    sync(cloud, service, nodes).await;
    let before = cloud.api_metrics().requests();
    sync(cloud, service, nodes).await;
    assert_eq!(
        writes_since(cloud, &before),
        Vec::<String>::new(),
        "a second sync writes nothing"
    );
}

#[tokio::test]
async fn a_classic_elb_terminates_tls_as_upstream_and_follows_the_annotations() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let policy = format!("k8s-SSLNegotiationPolicy-{POLICY}");

    // TLS on 443 only, HTTP to the nodes, a negotiation policy.
    let mut annotations = vec![
        (ANNOTATION_SSL_CERT, CERT),
        (ANNOTATION_SSL_PORTS, "443"),
        (ANNOTATION_SSL_POLICY, POLICY),
        (ANNOTATION_BACKEND_PROTOCOL, "http"),
    ];
    sync_settled(&cloud, &service(&annotations), &nodes).await;
    assert_eq!(
        classic_listeners().await,
        owned(&[
            (80, "HTTP", "HTTP", None, &[]),
            (443, "HTTPS", "HTTP", Some(CERT), &[&policy]),
        ])
    );
    assert_eq!(classic_health_target().await, "TCP:30080");

    // Every port (no ssl-ports), another certificate, SSL to the nodes: the health check follows.
    annotations.retain(|(k, _)| *k != ANNOTATION_SSL_PORTS);
    annotations.retain(|(k, _)| *k != ANNOTATION_SSL_CERT && *k != ANNOTATION_BACKEND_PROTOCOL);
    annotations.push((ANNOTATION_SSL_CERT, OTHER_CERT));
    annotations.push((ANNOTATION_BACKEND_PROTOCOL, "ssl"));
    sync_settled(&cloud, &service(&annotations), &nodes).await;
    assert_eq!(
        classic_listeners().await,
        owned(&[
            (80, "SSL", "SSL", Some(OTHER_CERT), &[&policy]),
            (443, "SSL", "SSL", Some(OTHER_CERT), &[&policy]),
        ])
    );
    assert_eq!(classic_health_target().await, "SSL:30080");

    // The policy annotation removed: the listeners fall back to AWS's default.
    annotations.retain(|(k, _)| *k != ANNOTATION_SSL_POLICY);
    sync_settled(&cloud, &service(&annotations), &nodes).await;
    assert_eq!(
        classic_listeners().await,
        owned(&[
            (80, "SSL", "SSL", Some(OTHER_CERT), &[]),
            (443, "SSL", "SSL", Some(OTHER_CERT), &[]),
        ])
    );

    // No TLS annotation left: plain TCP again.
    sync_settled(&cloud, &service(&[]), &nodes).await;
    assert_eq!(
        classic_listeners().await,
        owned(&[
            (80, "TCP", "TCP", None, &[]),
            (443, "TCP", "TCP", None, &[])
        ])
    );
    assert_eq!(classic_health_target().await, "TCP:30080");

    cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer_deleted("kubernetes", &service(&[]))
        .await
        .unwrap();
    assert!(cluster_resources().await.is_empty());
}

#[tokio::test]
async fn an_nlb_terminates_tls_as_upstream_and_follows_the_annotations() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let tls_policy = "ELBSecurityPolicy-TLS13-1-2-2021-06";
    let listener =
        |port: i32, protocol: &str, cert: Option<&str>, policy: Option<&str>, group: &str| {
            (
                port,
                protocol.to_owned(),
                cert.map(str::to_owned),
                policy.map(str::to_owned),
                group.to_owned(),
            )
        };

    let mut annotations = vec![
        (ANNOTATION_TYPE, "nlb"),
        (ANNOTATION_SSL_CERT, CERT),
        (ANNOTATION_SSL_PORTS, "443"),
        (ANNOTATION_SSL_POLICY, tls_policy),
        (ANNOTATION_BACKEND_PROTOCOL, "ssl"),
    ];
    sync_settled(&cloud, &service(&annotations), &nodes).await;
    assert_eq!(
        nlb_listeners().await,
        [
            listener(80, "TCP", None, None, "TCP"),
            listener(443, "TLS", Some(CERT), Some(tls_policy), "TLS"),
        ]
    );

    // backend-protocol removed: plain TCP to the nodes, a new target group in place of the TLS one.
    annotations.retain(|(k, _)| *k != ANNOTATION_BACKEND_PROTOCOL);
    sync_settled(&cloud, &service(&annotations), &nodes).await;
    assert_eq!(
        nlb_listeners().await,
        [
            listener(80, "TCP", None, None, "TCP"),
            listener(443, "TLS", Some(CERT), Some(tls_policy), "TCP"),
        ]
    );

    // Another certificate on every port.
    annotations.retain(|(k, _)| *k != ANNOTATION_SSL_PORTS && *k != ANNOTATION_SSL_CERT);
    annotations.push((ANNOTATION_SSL_CERT, OTHER_CERT));
    sync_settled(&cloud, &service(&annotations), &nodes).await;
    assert_eq!(
        nlb_listeners().await,
        [
            listener(80, "TLS", Some(OTHER_CERT), Some(tls_policy), "TCP"),
            listener(443, "TLS", Some(OTHER_CERT), Some(tls_policy), "TCP"),
        ]
    );

    // No certificate: plain TCP listeners again.
    sync_settled(&cloud, &service(&[(ANNOTATION_TYPE, "nlb")]), &nodes).await;
    assert_eq!(
        nlb_listeners().await,
        [
            listener(80, "TCP", None, None, "TCP"),
            listener(443, "TCP", None, None, "TCP"),
        ]
    );

    cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer_deleted("kubernetes", &service(&[(ANNOTATION_TYPE, "nlb")]))
        .await
        .unwrap();
    assert!(cluster_resources().await.is_empty());
}

/// A certificate AWS does not have fails the sync; no listener that should terminate TLS is made
/// without it.
#[tokio::test]
async fn a_certificate_that_cannot_be_had_fails_the_sync_and_leaves_no_plain_listener() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instances = run_instances(&net, 1).await;
    let nodes: Vec<Arc<Node>> = instances.iter().map(instance_node).collect();
    let cloud = cloud(&default_config());
    let lb = cloud.load_balancer().unwrap();

    // Classic: the ELB is made with its listeners in one call, which fails.
    let classic = service(&[
        (ANNOTATION_SSL_CERT, MISSING_CERT),
        (ANNOTATION_SSL_PORTS, "443"),
    ]);
    let err = lb
        .ensure_load_balancer("kubernetes", &classic, &nodes)
        .await
        .expect_err("no such certificate");
    assert!(err.to_string().contains("Certificate"), "{err}");
    let described = elb()
        .describe_load_balancers()
        .load_balancer_names(LB_NAME)
        .send()
        .await;
    assert!(described.is_err(), "no Classic ELB was made");
    lb.ensure_load_balancer_deleted("kubernetes", &classic)
        .await
        .unwrap();

    // NLB: the listener on 443 fails; nothing listens on 443.
    let nlb = service(&[
        (ANNOTATION_TYPE, "nlb"),
        (ANNOTATION_SSL_CERT, MISSING_CERT),
        (ANNOTATION_SSL_PORTS, "443"),
    ]);
    let err = lb
        .ensure_load_balancer("kubernetes", &nlb, &nodes)
        .await
        .expect_err("no such certificate");
    assert!(err.to_string().contains("Certificate"), "{err}");
    assert!(
        nlb_listeners().await.iter().all(|l| l.0 != 443),
        "{:?}",
        nlb_listeners().await
    );
    // Both refusals are counted in upstream's status series, by the service that answered.
    let mut registry = prometheus_client::registry::Registry::default();
    cloud.api_metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let statuses: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("cloudprovider_aws_api_response_status_total{"))
        .collect();
    assert!(
        statuses
            .iter()
            .any(|l| l.contains(r#"service="Elastic Load Balancing""#)
                && l.contains(r#"operation="CreateLoadBalancer""#)
                && !l.contains(r#"status_code="2"#))
            && statuses
                .iter()
                .any(|l| l.contains(r#"service="Elastic Load Balancing v2""#)
                    && l.contains(r#"operation="CreateListener""#)),
        "{statuses:#?}"
    );
    lb.ensure_load_balancer_deleted("kubernetes", &nlb)
        .await
        .unwrap();
    assert!(cluster_resources().await.is_empty());
}
