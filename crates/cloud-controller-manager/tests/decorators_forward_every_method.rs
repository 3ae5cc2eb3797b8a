//! The manager wraps the provider in decorators that forward the provider traits' methods by hand:
//! `MeteredCloud` (the cloud-call metrics and the leadership fence) and `ShadowCloud` (`--dry-run`). A
//! method a trait gains with a default body compiles without being forwarded, and the decorator then
//! answers with the default (often `NotImplemented`) instead of the provider: it happened with the
//! orphan sweep's method. This test reads the traits' source and the decorators' and fails naming every
//! method of a trait that a decorator implements but does not forward.

use std::path::Path;

/// The provider traits, and the file of `crates/cloud-provider/src` each is declared in.
const TRAITS: [(&str, &str); 7] = [
    ("CloudProvider", "provider.rs"),
    ("LoadBalancer", "load_balancer.rs"),
    ("Instances", "instances.rs"),
    ("InstancesV2", "instances.rs"),
    ("Zones", "zones.rs"),
    ("Clusters", "clusters.rs"),
    ("Routes", "routes.rs"),
];

/// The decorators, and their file in this crate.
const DECORATORS: [(&str, &str); 2] = [
    ("MeteredCloud", "src/cloud_metrics.rs"),
    ("ShadowCloud", "src/shadow/cloud.rs"),
];

/// The body of the first block whose header contains `header`: the text between its `{` and the
/// matching `}`, string literals and line comments skipped when counting braces.
fn block<'a>(source: &'a str, header: &str) -> Option<&'a str> {
    let start = source.find(header)?;
    let open = start + source[start..].find('{')?;
    let bytes = source.as_bytes();
    let (mut depth, mut i) = (0usize, open);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&source[open + 1..i]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The names of the functions declared at the top level of a block's body.
fn functions(body: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for line in body.lines() {
        let code = code_of(line);
        let code = code.as_str();
        if depth == 0
            && let Some(at) = code.find("fn ")
            && (at == 0 || !code.as_bytes()[at - 1].is_ascii_alphanumeric())
        {
            let name: String = code[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
        depth += code.matches('{').count();
        depth = depth.saturating_sub(code.matches('}').count());
    }
    names
}

/// A line without its string literals' contents and its line comment.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push('"');
                while let Some(inner) = chars.next() {
                    match inner {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                out.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

#[test]
fn the_parsers_find_methods_and_blocks() {
    let source = "trait T {\n    fn a(&self);\n    async fn b(&self) -> X {\n        let s = \"}\"; // }\n        fn inner() {}\n    }\n}\nimpl T for D {\n    fn a(&self) {}\n}\n";
    assert_eq!(
        functions(block(source, "trait T").unwrap()),
        ["a".to_owned(), "b".to_owned()]
    );
    assert_eq!(
        functions(block(source, "impl T for D").unwrap()),
        ["a".to_owned()]
    );
    assert!(block(source, "impl T for E").is_none());
}

#[test]
fn every_decorator_forwards_every_method_of_each_trait_it_implements() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let provider_src = manifest.join("../cloud-provider/src");
    let mut missing = Vec::new();
    let mut checked = 0;
    for (decorator, file) in DECORATORS {
        let source = read(&manifest.join(file));
        for (trait_name, trait_file) in TRAITS {
            let trait_source = read(&provider_src.join(trait_file));
            let declared = functions(
                block(&trait_source, &format!("pub trait {trait_name}:"))
                    .unwrap_or_else(|| panic!("no trait {trait_name} in {trait_file}")),
            );
            assert!(!declared.is_empty(), "{trait_name}: no method found");
            let Some(body) = block(&source, &format!("impl {trait_name} for {decorator} {{"))
            else {
                // Not decorated: the decorator's CloudProvider hands out the provider's own part
                // (which the compiler checks: `self as &dyn Trait` needs the impl).
                continue;
            };
            let forwarded = functions(body);
            for method in declared {
                checked += 1;
                if !forwarded.contains(&method) {
                    missing.push(format!(
                        "{decorator} ({file}) does not forward {trait_name}::{method}"
                    ));
                }
            }
        }
    }
    assert!(checked > 40, "only {checked} methods checked");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// A provider's cloud that hands a trait's calls to a part of its own, as the forwarding it writes by
/// hand: (the trait, the cloud's impl header and file, the part's impl header and file), files from the
/// workspace root.
const PROVIDER_FORWARDERS: [(&str, &str, &str, &str, &str); 3] = [
    (
        "LoadBalancer",
        "impl LoadBalancer for AwsCloud {",
        "providers/aws/src/lib.rs",
        "impl LoadBalancer for LoadBalancers {",
        "providers/aws/src/load_balancer/mod.rs",
    ),
    (
        "InstancesV2",
        "impl InstancesV2 for AwsCloud {",
        "providers/aws/src/lib.rs",
        "impl cloud_provider::InstancesV2 for Instances {",
        "providers/aws/src/instances.rs",
    ),
    (
        "Routes",
        "impl Routes for AwsCloud {",
        "providers/aws/src/lib.rs",
        "impl Routes for RouteTables {",
        "providers/aws/src/routes.rs",
    ),
];

/// The same hazard inside a provider: `AwsCloud` answers each trait by handing the call to a part
/// (`LoadBalancers`, `Instances`, `RouteTables`), and a method the part implements but the cloud does not
/// forward answers the trait's default. It happened: `AwsCloud` did not forward the retain methods, so the
/// manager refused `ccm.rs/load-balancer-retain` that the part honoured. Every method a part implements
/// must be implemented by its cloud.
#[test]
fn a_providers_cloud_forwards_every_method_its_parts_implement() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut missing = Vec::new();
    let mut checked = 0;
    for (trait_name, outer, outer_file, inner, inner_file) in PROVIDER_FORWARDERS {
        let outer_source = read(&root.join(outer_file));
        let inner_source = read(&root.join(inner_file));
        let forwarded = functions(
            block(&outer_source, outer).unwrap_or_else(|| panic!("no {outer:?} in {outer_file}")),
        );
        let implemented = functions(
            block(&inner_source, inner).unwrap_or_else(|| panic!("no {inner:?} in {inner_file}")),
        );
        assert!(!implemented.is_empty(), "{inner}: no method found");
        for method in implemented {
            checked += 1;
            if !forwarded.contains(&method) {
                missing.push(format!(
                    "{outer_file}: {outer:?} does not forward {trait_name}::{method}, which {inner_file} implements"
                ));
            }
        }
    }
    assert!(checked > 15, "only {checked} methods checked");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
