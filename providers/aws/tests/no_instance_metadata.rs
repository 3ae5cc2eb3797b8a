//! The provider, built the production way (the registry's factory, the SDK's standard settings from the
//! environment), never calls the instance-metadata service when credentials and a region are given: the
//! IMDS endpoint is pointed at a local listener that records every connection, and the test fails on
//! any. `AWS_EC2_METADATA_DISABLED` is deliberately left unset, so a code path that would reach for IMDS
//! (in production: 169.254.169.254) would be seen here. The same run proves `AWS_ENDPOINT_URL` reaches
//! moto.
//!
//! The production path reads process-wide environment variables, so it runs in a child process (this
//! test binary again, running only `child_describes_a_node_through_the_environment`).

mod support;

use std::{
    net::TcpListener,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use cloud_provider::{CloudConfig, Registry};
use support::*;

// Linking the crate registers `aws`.
use cloud_provider_aws as _;

const CHILD_ENV: &str = "CCM_AWS_TEST_CHILD_NODE";
const CHILD_EXPECT: &str = "CCM_AWS_TEST_CHILD_EXPECT";

#[tokio::test]
async fn the_production_sdk_path_never_calls_instance_metadata() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let net = network().await;
    let instance = run_instances(&net, 1).await.remove(0);

    let listener = TcpListener::bind("127.0.0.1:0").expect("IMDS stand-in listens");
    let imds_port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });

    let home = tempfile::tempdir().unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_describes_a_node_through_the_environment",
            "--include-ignored",
            "--nocapture",
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_ENDPOINT_URL", moto().endpoint())
        .env(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            format!("http://127.0.0.1:{imds_port}"),
        )
        .env(CHILD_ENV, &instance.private_dns)
        .env(CHILD_EXPECT, instance.provider_id())
        .output()
        .expect("the child test runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the child failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the child test did not run:\n{text}"
    );
    // Give a stray connection a moment to be counted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the SDK contacted the instance-metadata endpoint"
    );
}

/// Run only by the test above, in a child process with its environment.
#[tokio::test]
#[ignore = "run as a child process by the_production_sdk_path_never_calls_instance_metadata"]
async fn child_describes_a_node_through_the_environment() {
    let node_name = std::env::var(CHILD_ENV).expect("run by the parent test");
    let expected = std::env::var(CHILD_EXPECT).expect("run by the parent test");
    let config = CloudConfig::from_bytes(
        None,
        format!("[Global]\nZone = {ZONE}\nKubernetesClusterID = {CLUSTER_ID}\n"),
    );
    let cloud = Registry::linked()
        .unwrap()
        .init("aws", &config)
        .expect("the aws provider builds");
    let mut node = k8s_openapi::api::core::v1::Node::default();
    node.metadata.name = Some(node_name);
    let meta = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&node)
        .await
        .expect("described through AWS_ENDPOINT_URL")
        .expect("found");
    assert_eq!(meta.provider_id, expected);
}
