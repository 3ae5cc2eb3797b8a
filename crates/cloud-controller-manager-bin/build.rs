//! Links the providers the `provider-<name>` features select: a crate that is only a dependency is not
//! linked unless something names it, so this writes one `extern crate cloud_provider_<name>;` per feature.
//! Adding a provider to the binary is then a Cargo.toml change only, as importing a package is in Go.

use std::{env, fs, path::PathBuf};

fn main() {
    let mut lines = String::new();
    let mut features: Vec<String> = env::vars()
        .filter_map(|(key, _)| {
            key.strip_prefix("CARGO_FEATURE_PROVIDER_")
                .map(str::to_lowercase)
        })
        .collect();
    features.sort();
    for feature in features {
        lines.push_str(&format!("extern crate cloud_provider_{feature};\n"));
    }
    let out =
        PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("linked_providers.rs");
    fs::write(out, lines).expect("OUT_DIR is writable");
    println!("cargo::rerun-if-changed=build.rs");
}
