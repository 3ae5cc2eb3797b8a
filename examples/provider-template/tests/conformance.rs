//! The provider passes the conformance kit that ships with the contract crate.

use cloud_provider::{
    CloudConfig,
    conformance::{Fixtures, run},
};

#[tokio::test]
async fn inventory_provider_is_conformant() {
    let config = CloudConfig::from_bytes(None, "worker-1 eu-west-1a m5.large\n");
    let cloud = cloud_provider_inventory::new_provider(&config).unwrap();
    let report = run(
        cloud.as_ref(),
        &Fixtures::new("worker-1", "not-in-inventory"),
    )
    .await;
    report.assert_passed();
    assert_eq!(report.passed().len(), 4, "{report}");
}

#[test]
fn a_malformed_inventory_names_the_line() {
    let config = CloudConfig::from_bytes(None, "# comment\nworker-1 zone-a\n");
    let err = cloud_provider_inventory::new_provider(&config)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "inventory line 2: expected `node-name zone instance-type`, got \"worker-1 zone-a\""
    );
}
