//! The `Dockerfile` builds the image `hack/image` builds. CI builds only the latter (no container engine
//! runs on this project's machines), so this compares the two files' text: the same binaries from the
//! same build, at the same paths; exactly the files `hack/image --check` expects; the same user, its
//! `/etc/passwd` and `/etc/group`, entrypoint, base and labels; and a Rust image new enough for the
//! workspace.

use std::collections::BTreeSet;

use test_control_plane::workspace_root;

fn read(file: &str) -> String {
    std::fs::read_to_string(workspace_root().join(file))
        .unwrap_or_else(|err| panic!("{file}: {err}"))
}

/// The value `hack/image` gives the shell variable `name` (a line `name=value` of its own), with the
/// variables it names expanded.
fn variable(script: &str, name: &str) -> String {
    let prefix = format!("{name}=");
    let values: Vec<&str> = script
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .collect();
    assert_eq!(values.len(), 1, "hack/image sets {name} once: {values:?}");
    expand(script, values[0].trim_matches('"'))
}

/// `text` with `$name`, `${name}` and `${name#/}` of hack/image's variables replaced by their values.
fn expand(script: &str, text: &str) -> String {
    let mut out = text.to_owned();
    for name in ["binary", "entrypoint", "agent", "target", "user"] {
        for (pattern, strip) in [
            (format!("${{{name}#/}}"), true),
            (format!("${{{name}}}"), false),
            (format!("${name}"), false),
        ] {
            if out.contains(&pattern) {
                let value = variable(script, name);
                let value = if strip {
                    value.trim_start_matches('/').to_owned()
                } else {
                    value
                };
                out = out.replace(&pattern, &value);
            }
        }
    }
    out
}

/// The text between `start` and the next `end` after it, for each occurrence of `start`.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Vec<&'a str> {
    text.match_indices(start)
        .map(|(at, _)| {
            let rest = &text[at + start.len()..];
            &rest[..rest
                .find(end)
                .unwrap_or_else(|| panic!("no {end:?} after {start:?}"))]
        })
        .collect()
}

/// The Dockerfile's instructions with their continuation lines joined, comments dropped.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    out.push(current.trim().to_owned());
                }
                current.clear();
            }
        }
    }
    out
}

#[test]
fn the_dockerfile_builds_the_image_hack_image_builds() {
    let script = read("hack/image");
    let dockerfile = read("Dockerfile");
    let instructions = instructions(&dockerfile);
    let target = variable(&script, "target");
    let entrypoint = variable(&script, "entrypoint");
    let agent = variable(&script, "agent");
    let user = variable(&script, "user");
    assert_eq!(entrypoint, "/usr/local/bin/cloud-controller-manager");
    assert_eq!(agent, "/usr/local/bin/local-agent");

    // The same build: hack/image's cargo command (release, locked, the musl target, the binary crate;
    // with `cargo auditable`, the crate list in each binary), ring's C code with musl-gcc.
    let build = instructions
        .iter()
        .find(|i| i.starts_with("RUN ") && i.contains(" build "))
        .expect("the Dockerfile runs cargo build")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let cargo = script
        .lines()
        .map(str::trim)
        .find(|line| {
            line.starts_with("cargo ") && line.contains(" -p cloud-controller-manager-bin")
        })
        .expect("hack/image runs cargo ... -p cloud-controller-manager-bin");
    let cargo = cargo[..cargo.find(" -p cloud-controller-manager-bin").unwrap()]
        .replace("\"$target\"", &target);
    assert!(
        cargo.contains(&format!("--release --locked --target {target}")),
        "{cargo}"
    );
    for part in [
        "CC_x86_64_unknown_linux_musl=musl-gcc".to_owned(),
        format!("{cargo} -p cloud-controller-manager-bin"),
    ] {
        assert!(
            script.contains(&part) || part.starts_with("cargo "),
            "hack/image does not build with {part}"
        );
        assert!(
            build.contains(&part),
            "the Dockerfile does not build with {part}: {build}"
        );
    }
    // cargo-auditable at the version hack/cargo-tools pins.
    if cargo.starts_with("cargo auditable ") {
        let pinned = read("hack/cargo-tools")
            .lines()
            .find_map(|line| {
                line.trim_start_matches("pinned=\"")
                    .strip_prefix("cargo-auditable ")
            })
            .expect("hack/cargo-tools pins cargo-auditable")
            .trim_end_matches('"')
            .to_owned();
        let install = format!("cargo install --locked --version ={pinned} cargo-auditable");
        assert!(
            instructions.iter().any(|i| i.contains(&install)),
            "the Dockerfile does not run {install}"
        );
    }

    // Each binary hack/image puts in the image, built by that command and installed at its path.
    for path in [&entrypoint, &agent] {
        let name = path.rsplit('/').next().unwrap();
        let install = format!("install -D -m 0755 target/{target}/release/{name} /rootfs{path}");
        assert!(
            build.contains(&install),
            "the Dockerfile does not install {path}: {install:?} not in {build}"
        );
    }

    // Exactly the files `hack/image --check` expects in the root filesystem.
    let expected: BTreeSet<String> = between(&script, "expected=$(printf '%s\\n' ", " | sort)")
        .first()
        .expect("hack/image --check lists the expected files")
        .split_whitespace()
        .map(|file| expand(&script, file.trim_matches('"')))
        .collect();
    assert!(
        expected.contains("usr/local/bin/local-agent"),
        "{expected:?}"
    );
    let installed: BTreeSet<String> = build
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("/rootfs/"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        installed, expected,
        "the Dockerfile's root filesystem (/rootfs) is not hack/image's"
    );

    // The same /etc/passwd and /etc/group (root, and the image's user as nonroot).
    for file in ["etc/passwd", "etc/group"] {
        let content = |text: &str, into: &str| -> String {
            let line = text
                .lines()
                .position(|l| l.contains(&format!("{into}{file}")))
                .map(|at| {
                    // The printf is on that line or the one before it.
                    let lines: Vec<&str> = text.lines().collect();
                    format!("{} {}", lines[at.saturating_sub(1)], lines[at])
                })
                .unwrap_or_else(|| panic!("no {into}{file}"));
            between(&line, "printf '", "'")
                .last()
                .unwrap_or_else(|| panic!("no printf for {file}: {line}"))
                .to_string()
        };
        let ours = content(&script, "$staging/");
        assert_eq!(content(&dockerfile, "/rootfs/"), ours, "{file}");
        let (uid, gid) = user.split_once(':').unwrap();
        if file == "etc/passwd" {
            assert!(ours.contains(&format!(":x:{uid}:{gid}:")), "{ours}");
        }
    }

    // The final stage: scratch, the root filesystem, the user, the entrypoint, no Cmd.
    let last_from = instructions
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .unwrap();
    assert_eq!(instructions[last_from], "FROM scratch");
    let last_stage = &instructions[last_from..];
    assert!(
        last_stage.contains(&"COPY --from=build /rootfs/ /".to_owned()),
        "{last_stage:?}"
    );
    assert!(
        last_stage.contains(&format!("USER {user}")),
        "the image's user is not hack/image's {user}: {last_stage:?}"
    );
    assert!(
        last_stage.contains(&format!("ENTRYPOINT [\"{entrypoint}\"]")),
        "{last_stage:?}"
    );
    assert!(
        !last_stage
            .iter()
            .any(|i| i.starts_with("CMD") || i.starts_with("ENV") || i.starts_with("RUN")),
        "{last_stage:?}"
    );

    // hack/image's labels, with the crate's version, licenses and source (created aside: the commit's
    // time, which a build without .git does not know).
    let ours: BTreeSet<String> = between(&script, "--config.label \"", "=")
        .into_iter()
        .map(str::to_owned)
        .collect();
    let label = last_stage
        .iter()
        .find(|i| i.starts_with("LABEL "))
        .expect("a LABEL instruction");
    let labels: BTreeSet<String> = between(label, "org.opencontainers.image.", "=")
        .into_iter()
        .map(|key| format!("org.opencontainers.image.{key}"))
        .collect();
    let mut without_created = ours.clone();
    without_created.remove("org.opencontainers.image.created");
    assert_eq!(labels, without_created, "the Dockerfile's labels");
    let arg = |name: &str| -> String {
        let prefix = format!("ARG {name}=");
        last_stage
            .iter()
            .find_map(|i| i.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}"))
            .to_owned()
    };
    assert_eq!(arg("VERSION"), env!("CARGO_PKG_VERSION"));
    assert_eq!(arg("TITLE"), variable(&script, "binary"));
    for (key, value) in [
        ("licenses", env!("CARGO_PKG_LICENSE")),
        ("source", env!("CARGO_PKG_REPOSITORY")),
        (
            "description",
            "\"The Kubernetes cloud-controller-manager, in Rust\"",
        ),
    ] {
        let expected = format!("org.opencontainers.image.{key}={value}");
        assert!(label.contains(&expected), "{expected:?} not in {label}");
    }
    assert!(
        script.contains(
            "--config.label \"org.opencontainers.image.description=The Kubernetes cloud-controller-manager, in Rust\""
        ),
        "hack/image's description changed: change the Dockerfile's too"
    );

    // A Rust toolchain the workspace accepts.
    let from = instructions
        .iter()
        .find_map(|i| i.strip_prefix("FROM rust:"))
        .expect("the build stage is FROM rust:<version>");
    let version = |text: &str| -> Vec<u32> {
        text.split(['-', ' '])
            .next()
            .unwrap()
            .split('.')
            .map(|n| n.parse().unwrap())
            .collect()
    };
    assert!(
        version(from) >= version(env!("CARGO_PKG_RUST_VERSION"))[..2].to_vec(),
        "FROM rust:{from} is older than the workspace's rust-version {}",
        env!("CARGO_PKG_RUST_VERSION")
    );
}
