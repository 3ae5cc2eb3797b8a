//! Log setup: `tracing` to stderr, text or JSON, verbosity from `-v` unless RUST_LOG is set.

use tracing_subscriber::{EnvFilter, fmt};

use super::options::{LogFormat, LoggingOptions};

/// The filter `-v N` stands for, klog-style.
pub fn filter_for(verbosity: u8) -> &'static str {
    match verbosity {
        0 | 1 => "info",
        2..=4 => {
            "info,cloud_controller_manager=debug,cloud_provider=debug,cloud_provider_fake=debug"
        }
        _ => "debug,cloud_controller_manager=trace,cloud_provider=trace,cloud_provider_fake=trace",
    }
}

/// Installs the global subscriber. Safe to call more than once (later calls are no-ops).
pub fn init(options: &LoggingOptions) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(filter_for(options.verbosity)));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match options.logging_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
