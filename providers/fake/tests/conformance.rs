//! The fake cloud passes the provider conformance kit, with each API style.

use cloud_provider::conformance::{Fixtures, Outcome, run};
use cloud_provider_fake::FakeCloud;

#[tokio::test]
async fn fake_cloud_with_instances_v2_is_conformant() {
    let cloud = FakeCloud::from_yaml(
        "instances:\n  missing-node: {state: gone}\n  stopped-node: {state: shutdown}\n",
    )
    .unwrap();
    let fixtures = Fixtures::new("node-a", "missing-node").with_shutdown_node("stopped-node");
    let report = run(&cloud, &fixtures).await;
    report.assert_passed();
    assert!(report.passed().len() >= 8, "too few checks ran:\n{report}");
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "instances_v2_report_a_shut_down_instance"),
        "{report}"
    );
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "load_balancer_is_listed_and_deleted_as_an_orphan"),
        "the sweep's contract is checked, not skipped"
    );
}

#[tokio::test]
async fn fake_cloud_with_legacy_instances_is_conformant() {
    let cloud = FakeCloud::from_yaml(
        "instancesV2: false\ninstances:\n  missing-node: {state: gone}\n  stopped-node: {state: shutdown}\n",
    )
    .unwrap();
    let fixtures = Fixtures::new("node-a", "missing-node").with_shutdown_node("stopped-node");
    let report = run(&cloud, &fixtures).await;
    report.assert_passed();
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "instances_report_a_shut_down_instance"),
        "{report}"
    );
    let skipped: Vec<_> = report
        .results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Skipped(_)))
        .map(|r| r.name)
        .collect();
    // The fake offers no Clusters API.
    assert!(
        skipped
            .iter()
            .all(|name| name.starts_with("instances_v2") || name.starts_with("clusters")),
        "{skipped:?}"
    );
}

#[tokio::test]
async fn the_kit_catches_a_broken_cloud() {
    // Every call fails: the kit must report failures, not pass silently.
    let cloud = FakeCloud::from_yaml("failureRate: {all: 1}\n").unwrap();
    let report = run(&cloud, &Fixtures::new("node-a", "missing-node")).await;
    assert!(report.failures().len() >= 5, "{report}");
    assert!(std::panic::catch_unwind(|| report.assert_passed()).is_err());
}

#[tokio::test]
async fn the_kit_catches_a_shut_down_instance_reported_gone_and_blames_a_wrong_fixture() {
    // The fixture says "shut down", the cloud says "gone": the lifecycle controller would delete the
    // node, so the kit fails, and says the fixture may be at fault.
    let cloud = FakeCloud::from_yaml(
        "instances:\n  missing-node: {state: gone}\n  stopped-node: {state: gone}\n  node-a: {state: shutdown}\n",
    )
    .unwrap();
    let fixtures = Fixtures::new("node-a", "missing-node").with_shutdown_node("stopped-node");
    let report = run(&cloud, &fixtures).await;
    let failed: Vec<_> = report.failures().iter().map(|r| r.name).collect();
    assert!(
        failed.contains(&"instances_v2_report_a_shut_down_instance"),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("Fixtures::shutdown_node must name a stopped instance"),
        "{text}"
    );
    assert!(
        text.contains("Fixtures::existing_node must name a node whose instance runs"),
        "{text}"
    );
}

#[tokio::test]
async fn the_kit_names_no_backend_of_its_own_and_leaves_nothing_behind() {
    let cloud = FakeCloud::from_yaml("instances:\n  missing-node: {state: gone}\n").unwrap();
    let fixtures = Fixtures::new("node-a", "missing-node");
    let backends: Vec<_> = fixtures
        .backend_nodes
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(backends, ["node-a"], "no backend the author did not name");
    run(&cloud, &fixtures).await.assert_passed();
    // Several backends: the update check also moves to fewer.
    let fixtures = fixtures.with_backend_nodes(&["node-a", "node-b", "node-c"]);
    run(&cloud, &fixtures).await.assert_passed();
    let state = cloud.snapshot();
    assert!(
        state.load_balancers.is_empty(),
        "{:?}",
        state.load_balancers
    );
    assert!(state.calls_to("update_load_balancer") >= 4);
}
