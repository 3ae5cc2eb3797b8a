//! The test control plane's audit log (hack/control-plane logs every write of the manager's user, with
//! the address it came from): which process wrote what.

use std::time::SystemTime;

use test_control_plane::control_plane;

/// The audit events of writes by the manager's user that reached the API server from `source` at or
/// after `after` (the audit policy logs only writes).
pub fn audited_writes(source: &str, after: SystemTime) -> Vec<serde_json::Value> {
    let log = std::fs::read_to_string(control_plane().dir().join("logs/audit.log"))
        .expect("the test control plane writes an audit log (hack/control-plane)");
    let after = k8s_openapi::jiff::Timestamp::try_from(after).unwrap();
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| {
            event["sourceIPs"]
                .as_array()
                .is_some_and(|ips| ips.iter().any(|ip| ip == source))
        })
        .filter(|event| {
            event["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t >= after)
        })
        .collect()
}

/// An audit event as `verb resource/name at time`.
pub fn describe(event: &serde_json::Value) -> String {
    format!(
        "{} {}/{} at {}",
        event["verb"].as_str().unwrap_or("?"),
        event["objectRef"]["resource"].as_str().unwrap_or("?"),
        event["objectRef"]["name"].as_str().unwrap_or("?"),
        event["requestReceivedTimestamp"].as_str().unwrap_or("?"),
    )
}

/// The objects of `resource` (`nodes`, `services`, ...) written from `source` at or after `after`,
/// by name (subresources count as writes of their object).
pub fn names_written(source: &str, after: SystemTime, resource: &str) -> Vec<String> {
    let mut names: Vec<String> = audited_writes(source, after)
        .iter()
        .filter(|event| event["objectRef"]["resource"] == resource)
        .filter_map(|event| event["objectRef"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}
