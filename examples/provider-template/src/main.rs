//! The provider's own cloud-controller-manager binary: link the provider, hand over to the library.

use cloud_provider_inventory as _; // registers `inventory`

fn main() -> std::process::ExitCode {
    cloud_controller_manager::Manager::linked().main()
}
