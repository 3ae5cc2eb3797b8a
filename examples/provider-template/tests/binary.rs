//! The provider's binary: its own name, its flags under its heading, its controller in the table.

use cloud_controller_manager::Manager;
use cloud_provider_inventory::audit;

fn manager() -> Manager {
    Manager::linked()
        .named("inventory-cloud-controller-manager", "0.1.0")
        .with_controller(audit::controller())
}

#[test]
fn help_shows_the_binary_its_flags_and_its_controller() {
    let help = manager().command().unwrap().render_long_help().to_string();
    assert!(
        help.contains("Usage: inventory-cloud-controller-manager"),
        "{help}"
    );
    let heading = help
        .find("Provider inventory:")
        .expect("the provider's heading");
    assert!(
        help[heading..].contains("--inventory-audit-period"),
        "{help}"
    );
    assert!(help.contains(audit::NAME), "{help}");
}

#[test]
fn the_flags_parse_with_the_managers_and_reach_the_factory() {
    let command_line = manager()
        .parse_from([
            "inventory-cloud-controller-manager",
            "--cloud-provider=inventory",
            "--inventory-default-region=home",
            "--controllers=*,-inventory-audit",
        ])
        .unwrap();
    assert_eq!(command_line.options.cloud_provider(), "inventory");
    let config = cloud_provider::CloudConfig::from_bytes(None, "worker-1 lab m5.large\n")
        .with_flags(command_line.matches);
    let flags: cloud_provider_inventory::InventoryFlags = config.flags().unwrap();
    assert_eq!(flags.inventory_default_region, "home");
    assert!(cloud_provider_inventory::new_provider(&config).is_ok());

    let err = manager()
        .parse_from([
            "inventory-cloud-controller-manager",
            "--inventory-audit-period=0s",
        ])
        .unwrap_err();
    assert!(
        err.to_string().contains("--inventory-audit-period"),
        "{err}"
    );
}
