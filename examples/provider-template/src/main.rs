//! The provider's own cloud-controller-manager binary: link the provider, add its controller, name the
//! binary, hand over to the library (which keeps the manager's flags, logging, signals and exit codes).

use cloud_provider_inventory::audit;

fn main() -> std::process::ExitCode {
    cloud_controller_manager::Manager::linked()
        .named(env!("CARGO_BIN_NAME"), env!("CARGO_PKG_VERSION"))
        .with_controller(audit::controller())
        .main()
}
