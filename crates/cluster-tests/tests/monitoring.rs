//! The dashboards and alert rules of `deploy/monitoring/` query what the manager and the node agents
//! really serve: every metric a panel or a rule selects is on the `/metrics` of a manager replica or an
//! agent of this cluster (`hack/cluster manager --agents`), with every label the query uses (its
//! matchers, the labels it groups by or matches on). The queries are read by Prometheus's own parser
//! (`hack/prometheus selectors`); the cluster carries a load-balanced Service with traffic, and one
//! whose reconciles fail, so that the error series exist too.

use std::collections::{BTreeMap, BTreeSet};

use cluster_tests::{
    LONG, ManagerForm, cluster, deploy, echo_app, ingress, load_balancer, run, workspace_root,
};

/// Labels Prometheus adds to every scraped series (the target's), not on `/metrics` itself.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Series Prometheus makes itself, not any `/metrics`'.
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// Metrics this cluster cannot serve, and where they are proven instead.
const ELSEWHERE: [(&str, &str); 1] = [(
    "cloudprovider_aws_api_throttled_requests_total",
    "the aws provider's, with label operation_name: providers/aws/src/sdk.rs, test \
     upstream_s_metric_names_and_labels_are_served",
)];

/// The series names of an OpenMetrics text and, for each, every label name its samples carry.
fn series_labels(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let labels = out.entry(name.to_owned()).or_default();
        if let Some(body) = rest.strip_prefix('{') {
            // Label values are quoted and may hold commas or braces: take each name before `="`.
            let mut body = body;
            while let Some(eq) = body.find("=\"") {
                let label = body[..eq].trim_start_matches([',', ' ']);
                labels.insert(label.to_owned());
                // Past the value's closing quote (an escaped quote is `\"`).
                let value = &body[eq + 2..];
                let mut end = 0;
                let bytes = value.as_bytes();
                while end < bytes.len()
                    && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\'))
                {
                    end += 1;
                }
                body = &value[(end + 1).min(value.len())..];
                if body.starts_with('}') {
                    break;
                }
            }
        }
    }
    out
}

/// What the dashboards and rules select: (where, metric, labels).
fn queried() -> Vec<(String, String, Vec<String>)> {
    let root = workspace_root();
    let monitoring = root.join("deploy/monitoring");
    let mut files: Vec<String> = std::fs::read_dir(monitoring.join("dashboards"))
        .expect("deploy/monitoring/dashboards")
        .map(|e| e.expect("a dashboard").path().display().to_string())
        .collect();
    files.sort();
    files.push(monitoring.join("alerts.yaml").display().to_string());
    let script = root.join("hack/prometheus").display().to_string();
    let mut command = vec![script.as_str(), "selectors"];
    command.extend(files.iter().map(String::as_str));
    let json = run(&command).unwrap_or_else(|err| panic!("{err}"));
    let queries: serde_json::Value = serde_json::from_str(&json).expect("promql-selectors' JSON");
    let mut out = Vec::new();
    for query in queries.as_array().expect("an array of queries") {
        let where_ = query["where"].as_str().expect("where").to_owned();
        for selector in query["selectors"].as_array().expect("selectors") {
            let labels = selector["labels"]
                .as_array()
                .expect("labels")
                .iter()
                .map(|l| l.as_str().expect("a label").to_owned())
                .collect();
            out.push((
                where_.clone(),
                selector["metric"].as_str().expect("metric").to_owned(),
                labels,
            ));
        }
    }
    assert!(
        out.len() > 50,
        "promql-selectors found only {} selectors",
        out.len()
    );
    out
}

/// The manager replicas' `/metrics` (HTTPS on their node's port 10258, with the cluster's admin
/// token, which may read it) and every agent's (plain HTTP on its node's loopback).
fn scrape_all() -> Vec<(String, String)> {
    let c = cluster();
    let mut out: Vec<(String, String)> = c
        .manager_metrics(false)
        .into_iter()
        .map(|(host, text)| (format!("manager on {host}"), text))
        .collect();
    for node in c.nodes() {
        let text = c
            .curl_on_node(&node, "http://127.0.0.1:10264/metrics")
            .unwrap_or_else(|err| panic!("the agent on {node}: {err}"));
        out.push((format!("agent on {node}"), text));
    }
    out
}

/// Every metric and label the dashboards and rules query, missing from what the cluster serves.
fn missing(
    queried: &[(String, String, Vec<String>)],
    served: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (where_, metric, labels) in queried {
        if PROMETHEUS_SERIES.contains(&metric.as_str())
            || ELSEWHERE.iter().any(|(m, _)| m == metric)
        {
            continue;
        }
        let Some(has) = served.get(metric) else {
            problems.push(format!(
                "{where_}: {metric} is served by no manager or agent"
            ));
            continue;
        };
        for label in labels {
            if !has.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                problems.push(format!(
                    "{where_}: {metric} has no label {label} (it has {has:?})"
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

#[test]
fn the_series_parser_reads_names_and_labels() {
    let text = "# TYPE a counter\na_total{x=\"1\",y=\"a,\\\"b}\"} 3\nb 1\nc{z=\"\"} 0\n# EOF\n";
    let got = series_labels(text);
    assert_eq!(got["a_total"], BTreeSet::from(["x".into(), "y".into()]));
    assert!(got["b"].is_empty());
    assert_eq!(got["c"], BTreeSet::from(["z".into()]));
    let queried = vec![
        (
            "d/p".to_owned(),
            "a_total".to_owned(),
            vec!["x".to_owned(), "instance".to_owned()],
        ),
        ("d/q".to_owned(), "a_total".to_owned(), vec!["w".to_owned()]),
        ("d/r".to_owned(), "gone".to_owned(), vec![]),
        ("d/s".to_owned(), "up".to_owned(), vec!["job".to_owned()]),
    ];
    assert_eq!(
        missing(&queried, &got),
        vec![
            "d/q: a_total has no label w (it has {\"x\", \"y\"})".to_owned(),
            "d/r: gone is served by no manager or agent".to_owned(),
        ]
    );
}

#[tokio::test]
async fn every_metric_a_dashboard_or_an_alert_queries_is_served_with_its_labels() {
    let c = cluster();
    c.ensure_manager(ManagerForm::Agents).await;
    let ns = deploy(
        "monitoring",
        &[
            echo_app("echo", 2, true, None),
            load_balancer("web", "echo", "", ""),
            // A pool that does not exist: every reconcile fails (cloud errors, retries).
            load_balancer(
                "broken",
                "echo",
                "",
                "local.ccm.rs/address-pool: no-such-pool",
            ),
        ],
    )
    .await;
    let (ip, _) = ingress(ns.name(), "web").await;
    let vip = std::net::SocketAddr::new(ip, 80);
    cluster_tests::steady_answers("the VIP answers", vip, 5).await;
    let queried = queried();
    // The error series exist once the broken Service's first reconcile has failed, and the VIP's
    // announcement once an agent took it: scraped again until nothing is missing (or LONG passes).
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let mut served: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (_, text) in scrape_all() {
            for (name, labels) in series_labels(&text) {
                served.entry(name).or_default().extend(labels);
            }
        }
        let problems = missing(&queried, &served);
        if problems.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after {LONG:?}, what deploy/monitoring/ queries and nobody serves:\n{}",
            problems.join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    for (metric, proof) in ELSEWHERE {
        eprintln!("{metric}: not on this cluster; {proof}");
    }
}
