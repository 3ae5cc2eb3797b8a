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
    commit();
}

/// `CCM_GIT_COMMIT` for `--version`: the commit the binary is built from (`CCM_GIT_COMMIT` from the
/// environment wins, for builds without a `.git`, e.g. an image build), with `-dirty` for uncommitted
/// changes; `unknown` without git.
fn commit() {
    println!("cargo::rerun-if-env-changed=CCM_GIT_COMMIT");
    let commit = env::var("CCM_GIT_COMMIT").ok().or_else(|| {
        let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").ok()?).join("../..");
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("-C")
                .arg(&root)
                .args(args)
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        let head = git(&["rev-parse", "--short=12", "HEAD"])?;
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|status| !status.is_empty());
        // Rebuild when HEAD moves (a commit, a checkout).
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            println!("cargo::rerun-if-changed={dir}/HEAD");
            println!("cargo::rerun-if-changed={dir}/index");
        }
        Some(if dirty { format!("{head}-dirty") } else { head })
    });
    println!(
        "cargo::rustc-env=CCM_GIT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".to_owned())
    );
}
