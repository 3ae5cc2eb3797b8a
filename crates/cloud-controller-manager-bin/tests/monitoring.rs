//! The monitoring files of `deploy/monitoring/`: the alert rules pass `promtool check rules` and every
//! rule test (`hack/prometheus check`, promtool built from its Go module on first use); the dashboards
//! are what `hack/monitoring-dashboards` writes; every alert has its runbook in `docs/monitoring.md`,
//! named by its `runbook` annotation, and a test. That each query's metrics and labels are served is
//! proven on a real cluster (`crates/cluster-tests/tests/monitoring.rs`).

use std::process::Command;

use serde_json::Value;
use test_control_plane::workspace_root;

fn succeed(program: &str, args: &[&str]) -> String {
    let output = Command::new(workspace_root().join(program))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|err| panic!("{program}: {err}"));
    assert!(
        output.status.success(),
        "{program} {}: {}\n{}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_rules_pass_promtool_and_their_tests() {
    let out = succeed("hack/prometheus", &["check"]);
    assert!(out.contains("every query parsed"), "{out}");
}

#[test]
fn the_dashboards_are_what_the_script_writes() {
    succeed("hack/monitoring-dashboards", &["--check"]);
}

/// The alerts of alerts.yaml, with their `runbook` annotations.
fn alerts() -> Vec<(String, String)> {
    let path = workspace_root().join("deploy/monitoring/alerts.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let rules: Value = serde_saphyr::from_str(&text).unwrap();
    let mut out = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"]
                .as_str()
                .expect("only alerting rules")
                .to_owned();
            let runbook = rule["annotations"]["runbook"]
                .as_str()
                .unwrap_or_else(|| panic!("{name} has no runbook annotation"))
                .to_owned();
            out.push((name, runbook));
        }
    }
    out
}

#[test]
fn every_alert_has_a_runbook_section_and_a_test() {
    let docs = std::fs::read_to_string(workspace_root().join("docs/monitoring.md")).unwrap();
    let tests_dir = workspace_root().join("deploy/monitoring/tests");
    let mut tests = String::new();
    for entry in std::fs::read_dir(&tests_dir).unwrap() {
        tests.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let alerts = alerts();
    assert!(alerts.len() >= 19, "{alerts:?}");
    for (name, runbook) in alerts {
        // GitHub's anchor of a heading `### Name`: the name in lower case.
        assert_eq!(
            runbook,
            format!("docs/monitoring.md#{}", name.to_lowercase()),
            "{name}'s runbook annotation"
        );
        assert!(
            docs.contains(&format!("\n### {name}\n")),
            "docs/monitoring.md has no runbook section ### {name}"
        );
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "deploy/monitoring/tests/ tests no alert {name}"
        );
    }
}
