//! The IAM policy shipped for the `aws` provider (`deploy/overlays/aws/iam-policy.json`) allows exactly
//! the AWS actions the provider's code calls, nothing missing and nothing more, and conditions every
//! write on the cluster's tag.
//!
//! Read from the source, not from a run: every SDK operation in `providers/aws/src` (a call on a client
//! bound as `ec2`, `elb` or `elbv2`, e.g. `elbv2.create_target_group()`) is an action
//! (`elasticloadbalancing:CreateTargetGroup`; Classic ELB and ELBv2 share the prefix), plus the actions
//! AWS authorizes besides the call itself: `ec2:CreateTags` / `elasticloadbalancing:AddTags` when a
//! create call tags what it creates, and `iam:CreateServiceLinkedRole` for the first load balancer or
//! target group of an account. moto cannot prove more: its IAM enforcement checks actions only (it
//! ignores `Condition` and passes `*` as the resource), and no implied action.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use regex_lite::Regex;
use serde_json::Value;

/// The policy file, from the workspace root.
const POLICY: &str = "deploy/overlays/aws/iam-policy.json";
/// The tag key every write is conditioned on, with the placeholder the operator replaces.
const CLUSTER_TAG: &str = "kubernetes.io/cluster/CLUSTER_ID";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("providers/aws is two levels below the workspace root")
        .to_owned()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A source file's production code: its unit-test module (always last) and comment lines left out.
fn production_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `describe_instances` → `DescribeInstances`.
fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// One SDK operation in the source.
struct Call {
    at: String,
    /// The IAM action: `ec2:Op` or `elasticloadbalancing:Op`.
    action: String,
    operation: String,
    /// Whether the request tags what it creates (`tag_specifications`, `tags`, `set_tags`).
    tags: bool,
}

struct Source {
    calls: Vec<Call>,
    /// The operation names given to `Calls::call` (metrics labels), `elb:`/`elbv2:` prefix dropped.
    labels: BTreeSet<String>,
    assumes_role: bool,
    tags_session: bool,
}

fn scan() -> Source {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 10, "found only {files:?}");
    let client_call =
        Regex::new(r"(^|[^A-Za-z0-9_.])(ec2|elb|elbv2)\s*\.\s*([a-z][a-z0-9_]*)\s*\(\s*\)")
            .unwrap();
    let label = Regex::new(r#"\.call\(\s*"([^"]+)""#).unwrap();
    let client_field = Regex::new(r"clients\s*\.\s*(ec2|elb|elbv2)\b").unwrap();
    let binding =
        Regex::new(r"^\s*let (ec2|elb|elbv2) = &[A-Za-z0-9_.]*\bclients\.(ec2|elb|elbv2);\s*$")
            .unwrap();
    let tagging = Regex::new(r"tag_specifications\(|\.(set_)?tags\(\s*[^)\s]").unwrap();
    let mut source = Source {
        calls: Vec::new(),
        labels: BTreeSet::new(),
        assumes_role: false,
        tags_session: false,
    };
    for path in &files {
        let code = production_code(path);
        let name = path.strip_prefix(&src).unwrap().display().to_string();
        // The scan sees calls on variables named after the clients; every use of a client is such a
        // binding, so no call escapes it.
        for (i, line) in code.lines().enumerate() {
            if client_field.is_match(line) {
                let bound = binding
                    .captures(line)
                    .is_some_and(|c| c.get(1).map(|m| m.as_str()) == c.get(2).map(|m| m.as_str()));
                assert!(
                    bound,
                    "src/{name}:{}: a client is used other than as `let ec2 = &….clients.ec2;` (or elb, elbv2), \
                     so this test cannot see its calls; bind it that way:\n{line}",
                    i + 1
                );
            }
        }
        for c in client_call.captures_iter(&code) {
            let whole = c.get(0).unwrap();
            let service = match &c[2] {
                "ec2" => "ec2",
                _ => "elasticloadbalancing",
            };
            let operation = camel(&c[3]);
            let rest = &code[whole.end()..];
            let builder = &rest[..rest.find(".send()").unwrap_or(rest.len())];
            source.calls.push(Call {
                at: format!(
                    "src/{name}:{}",
                    code[..c.get(2).unwrap().start()].matches('\n').count() + 1
                ),
                action: format!("{service}:{operation}"),
                operation,
                tags: tagging.is_match(builder),
            });
        }
        for c in label.captures_iter(&code) {
            let op = c[1].rsplit(':').next().unwrap_or_default();
            source.labels.insert(op.to_owned());
        }
        source.assumes_role |= code.contains("AssumeRoleProvider");
        source.tags_session |=
            code.contains("assume.tags(") || code.contains("assume = assume.tags(");
    }
    assert!(
        source.calls.len() > 40,
        "found only {} calls",
        source.calls.len()
    );
    source
}

/// The actions AWS authorizes for the source's calls: each call's own, and the implied ones.
fn actions_needed(source: &Source) -> BTreeMap<String, Vec<String>> {
    let mut needed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut need = |action: String, why: String| needed.entry(action).or_default().push(why);
    for call in &source.calls {
        need(call.action.clone(), call.at.clone());
        if call.operation.starts_with("Create") && call.tags {
            // Tag-on-create is authorized a second time, as the tagging action.
            let tagging = if call.action.starts_with("ec2:") {
                "ec2:CreateTags"
            } else {
                "elasticloadbalancing:AddTags"
            };
            need(tagging.to_owned(), format!("{} tags on create", call.at));
        }
        if matches!(
            call.action.as_str(),
            "elasticloadbalancing:CreateLoadBalancer" | "elasticloadbalancing:CreateTargetGroup"
        ) {
            need(
                "iam:CreateServiceLinkedRole".to_owned(),
                format!(
                    "{}: the first of an account makes ELB's service-linked role",
                    call.at
                ),
            );
        }
    }
    needed
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

fn policy() -> Vec<Value> {
    let path = workspace_root().join(POLICY);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{POLICY}: {e}"));
    let policy: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{POLICY}: {e}"));
    assert_eq!(policy["Version"], "2012-10-17", "{POLICY}");
    let statements = policy["Statement"]
        .as_array()
        .expect("a list of statements")
        .clone();
    for s in &statements {
        assert_eq!(s["Effect"], "Allow", "{POLICY}: {s}");
        for key in ["NotAction", "NotResource", "Principal"] {
            assert!(s.get(key).is_none(), "{POLICY}: {key} in {s}");
        }
        for action in strings(&s["Action"]) {
            assert!(
                !action.contains('*'),
                "{POLICY}: a wildcard action {action}"
            );
        }
    }
    statements
}

/// The condition values a statement gives `key` under any operator.
fn condition_values(statement: &Value, key: &str) -> Vec<String> {
    statement["Condition"]
        .as_object()
        .into_iter()
        .flat_map(|ops| ops.values())
        .flat_map(|keys| strings(&keys[key]))
        .collect()
}

#[test]
fn the_iam_policy_allows_exactly_the_calls_the_code_makes() {
    let source = scan();
    let needed = actions_needed(&source);
    let operations: BTreeSet<String> = source.calls.iter().map(|c| c.operation.clone()).collect();
    // Every call goes through `Calls::call` (retries, metrics) under its own operation's name.
    assert_eq!(
        operations,
        source.labels,
        "the SDK operations called and the names given to Calls::call differ: called only {:?}, named only {:?}",
        operations.difference(&source.labels).collect::<Vec<_>>(),
        source.labels.difference(&operations).collect::<Vec<_>>()
    );

    let allowed: BTreeSet<String> = policy()
        .iter()
        .flat_map(|s| strings(&s["Action"]))
        .collect();
    let missing: Vec<String> = needed
        .iter()
        .filter(|(action, _)| !allowed.contains(*action))
        .map(|(action, why)| format!("{action} ({})", why.join(", ")))
        .collect();
    let extra: Vec<&String> = allowed
        .iter()
        .filter(|a| !needed.contains_key(*a))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{POLICY} and the code differ:\n  called by the code but not allowed: {missing:#?}\n  allowed but never called: {extra:#?}"
    );

    // RoleARN: the SDK assumes the role as the pod's own identity, which needs sts:AssumeRole on the
    // role (and sts:TagSession for SourceARN's session tag); that is the caller's policy, not this one.
    let docs = std::fs::read_to_string(workspace_root().join("docs/aws-provider.md")).unwrap();
    assert!(
        docs.contains(POLICY),
        "docs/aws-provider.md does not name {POLICY}"
    );
    if source.assumes_role {
        assert!(
            docs.contains("sts:AssumeRole"),
            "docs/aws-provider.md does not name sts:AssumeRole"
        );
    }
    if source.tags_session {
        assert!(
            docs.contains("sts:TagSession"),
            "docs/aws-provider.md does not name sts:TagSession"
        );
    }
}

/// The creations of resources the provider tags `owned` in the same request.
const CREATED_TAGGED: [&str; 3] = [
    "ec2:CreateSecurityGroup",
    "elasticloadbalancing:CreateLoadBalancer",
    "elasticloadbalancing:CreateTargetGroup",
];

/// Whether the statement allows the provider to mark load balancers with its own tags (keys limited by
/// `aws:TagKeys`), rather than tagging on creation.
fn is_marking(statement: &Value) -> bool {
    !condition_values(statement, "aws:TagKeys").is_empty()
}

/// The tag keys the code marks kept and adopted load balancers with (the `TAG_*` constants of
/// `load_balancer/retained.rs`).
fn marking_tag_keys() -> BTreeSet<String> {
    let path = workspace_root().join("providers/aws/src/load_balancer/retained.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let keys: BTreeSet<String> = Regex::new(r#"const TAG_[A-Z_]+: &str = "([^"]+)";"#)
        .unwrap()
        .captures_iter(&text)
        .map(|c| c[1].to_owned())
        .collect();
    assert_eq!(keys.len(), 3, "{}: {keys:?}", path.display());
    keys
}

/// The deletions of whole resources: only of those the provider made (`owned`).
const DELETED_WHOLE: [&str; 4] = [
    "ec2:DeleteSecurityGroup",
    "elasticloadbalancing:DeleteListener",
    "elasticloadbalancing:DeleteLoadBalancer",
    "elasticloadbalancing:DeleteTargetGroup",
];

#[test]
fn every_write_in_the_iam_policy_is_conditioned_on_the_cluster_tag() {
    let source = scan();
    let statements = policy();
    let is_read = |action: &str| {
        action
            .split_once(':')
            .is_some_and(|(_, op)| op.starts_with("Describe"))
    };
    for s in &statements {
        let actions = strings(&s["Action"]);
        let resources = strings(&s["Resource"]);
        if actions.iter().any(|a| is_read(a)) {
            // Most Describe* actions have no resource-level permissions: a resource or a condition
            // would deny them. They change nothing.
            assert!(
                actions.iter().all(|a| is_read(a))
                    && resources == ["*"]
                    && s.get("Condition").is_none(),
                "{POLICY}: reads go alone, on \"*\", unconditioned: {s}"
            );
            continue;
        }
        if actions == ["ec2:CreateSecurityGroup"] && resources == ["arn:aws:ec2:*:*:vpc/*"] {
            // CreateSecurityGroup is authorized on the new group (conditioned on its tag, in another
            // statement) and on the VPC it goes in, which need not carry the cluster's tag.
            assert!(s.get("Condition").is_none(), "{s}");
            continue;
        }
        if actions == ["iam:CreateServiceLinkedRole"] {
            assert_eq!(
                condition_values(s, "iam:AWSServiceName"),
                ["elasticloadbalancing.amazonaws.com"],
                "{POLICY}: the service-linked role is ELB's only: {s}"
            );
            continue;
        }
        let on_tag = condition_values(s, &format!("aws:ResourceTag/{CLUSTER_TAG}"));
        let request_tag = condition_values(s, &format!("aws:RequestTag/{CLUSTER_TAG}"));
        let tagging = actions
            .iter()
            .all(|a| a == "ec2:CreateTags" || a == "elasticloadbalancing:AddTags");
        if is_marking(s) {
            // Marking a load balancer kept or adopted (`ccm.rs/load-balancer-retain`): only the
            // provider's own tags, only on what it owns, never the cluster's tag.
            assert!(
                actions.iter().all(|a| a == "elasticloadbalancing:AddTags"
                    || a == "elasticloadbalancing:RemoveTags"),
                "{POLICY}: marking tags goes alone: {s}"
            );
            assert_eq!(
                on_tag,
                ["owned"],
                "{POLICY}: marking anything but owned: {s}"
            );
            let keys: BTreeSet<String> = s["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect();
            assert_eq!(
                keys,
                marking_tag_keys(),
                "{POLICY}: marking must allow exactly the keys the code writes (ForAllValues): {s}"
            );
            continue;
        }
        if tagging || actions.iter().all(|a| CREATED_TAGGED.contains(&a.as_str())) {
            // A creation carries the tag it will be known by.
            assert_eq!(
                request_tag,
                ["owned"],
                "{POLICY}: a creation or its tagging without the owned tag in the request: {s}"
            );
            continue;
        }
        // Any other write acts on an existing resource, which must carry the cluster's tag; a
        // resource the provider creates (and deletes) only as `owned`, never `shared`.
        assert!(
            !on_tag.is_empty() && on_tag.iter().all(|v| v == "owned" || v == "shared"),
            "{POLICY}: a write not conditioned on the resource's cluster tag ({CLUSTER_TAG}): {s}"
        );
        for action in &actions {
            if DELETED_WHOLE.contains(&action.as_str()) {
                assert_eq!(
                    on_tag,
                    ["owned"],
                    "{POLICY}: {action} on anything but owned: {s}"
                );
            }
        }
    }
    for action in CREATED_TAGGED {
        assert!(
            source.calls.iter().any(|c| c.action == action && c.tags),
            "{action} is conditioned on the tag of its request, but the code does not tag it"
        );
        assert!(
            statements
                .iter()
                .any(|s| strings(&s["Action"]).iter().any(|a| a == action)
                    && condition_values(s, &format!("aws:RequestTag/{CLUSTER_TAG}")) == ["owned"]),
            "{POLICY}: {action} is not allowed with the owned tag"
        );
    }

    // Tagging is allowed only as part of the creations that tag, exactly those.
    for (tagging, key, prefix) in [
        ("ec2:CreateTags", "ec2:CreateAction", "ec2:"),
        (
            "elasticloadbalancing:AddTags",
            "elasticloadbalancing:CreateAction",
            "elasticloadbalancing:",
        ),
    ] {
        let creating: BTreeSet<String> = source
            .calls
            .iter()
            .filter(|c| c.tags && c.action.starts_with(prefix) && c.operation.starts_with("Create"))
            .map(|c| c.operation.clone())
            .collect();
        for s in statements
            .iter()
            .filter(|s| strings(&s["Action"]).iter().any(|a| a == tagging) && !is_marking(s))
        {
            let allowed: BTreeSet<String> = condition_values(s, key).into_iter().collect();
            assert_eq!(
                allowed, creating,
                "{POLICY}: {tagging} must be allowed exactly for the creations that tag ({key}): {s}"
            );
            assert_eq!(
                condition_values(s, &format!("aws:RequestTag/{CLUSTER_TAG}")),
                ["owned"],
                "{POLICY}: {tagging} on creation must carry the owned tag: {s}"
            );
        }
    }
}
