//! The fake cloud passes the provider conformance kit, with each API style.

use cloud_provider::conformance::{Fixtures, Outcome, run};
use cloud_provider_fake::FakeCloud;

#[tokio::test]
async fn fake_cloud_with_instances_v2_is_conformant() {
    let cloud = FakeCloud::from_yaml("instances:\n  missing-node: {state: gone}\n").unwrap();
    let report = run(&cloud, &Fixtures::new("node-a", "missing-node")).await;
    report.assert_passed();
    assert!(report.passed().len() >= 7, "too few checks ran:\n{report}");
}

#[tokio::test]
async fn fake_cloud_with_legacy_instances_is_conformant() {
    let cloud =
        FakeCloud::from_yaml("instancesV2: false\ninstances:\n  missing-node: {state: gone}\n")
            .unwrap();
    let report = run(&cloud, &Fixtures::new("node-a", "missing-node")).await;
    report.assert_passed();
    let skipped: Vec<_> = report
        .results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Skipped(_)))
        .map(|r| r.name)
        .collect();
    assert!(
        skipped.iter().all(|name| name.starts_with("instances_v2")),
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
