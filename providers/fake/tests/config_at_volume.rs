//! Bad input at volume (issue #16): the fake cloud's cloud-config parser (`Config::parse`) on 100,000
//! generated documents per run: valid configs written out from a model (which must parse back to the
//! model), the same with one value, key or line damaged (an error that points at the right line),
//! damaged copies of `cloud-config.example.yaml`, deep nesting and alias bombs, and arbitrary text. The
//! parser must answer every one without panicking, caught or not.
//!
//! `cargo test -p cloud-provider-fake --test config_at_volume`; `PROPTEST_CASES=N` runs N cases of
//! every property instead.

use std::{net::Ipv4Addr, path::Path, time::Duration};

use cloud_provider_fake::{Config, InstanceState, IpPool, METHODS};
use proptest::{prelude::*, test_runner::Config as ProptestConfig};

/// Documents per run, over all properties.
const CASES: u32 = 100_000;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        // PROPTEST_CASES=N runs N cases of every property instead.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        // No regression files in the tree: a failure prints its minimal input, which goes into a unit
        // test next to the fix.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const EXAMPLE: &str = include_str!("../cloud-config.example.yaml");
const PATH: &str = "/etc/kubernetes/cloud-config.yaml";

/// A YAML node; scalars are YAML text already (quoted where needed).
#[derive(Debug, Clone)]
enum Yaml {
    Map(Vec<(String, Yaml)>),
    Scalar(String),
}

/// `text` as a YAML double-quoted scalar: JSON's escapes (which YAML shares), and `\u` escapes for the
/// characters YAML does not allow raw (outside its printable set, and the byte-order mark).
fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~'
            | '\u{a0}'..='\u{d7ff}'
            | '\u{e000}'..='\u{fefe}'
            | '\u{ff00}'..='\u{fffd}'
            | '\u{10000}'.. => out.push(c),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn scalar(text: impl Into<String>) -> Yaml {
    Yaml::Scalar(text.into())
}

/// Block-style text.
fn render(root: &Yaml) -> String {
    fn walk(node: &Yaml, indent: usize, out: &mut String) {
        if let Yaml::Map(entries) = node {
            for (key, value) in entries {
                match value {
                    Yaml::Scalar(text) => out.push_str(&format!("{:indent$}{key}: {text}\n", "")),
                    Yaml::Map(inner) if inner.is_empty() => {
                        out.push_str(&format!("{:indent$}{key}: {{}}\n", ""));
                    }
                    Yaml::Map(_) => {
                        out.push_str(&format!("{:indent$}{key}:\n", ""));
                        walk(value, indent + 2, out);
                    }
                }
            }
        }
    }
    let mut out = String::new();
    walk(root, 0, &mut out);
    out
}

/// `n` nanoseconds as Go writes durations (`1h2m3.5s`).
fn go_string(n: u64) -> String {
    let (seconds, nanos) = (n / 1_000_000_000, n % 1_000_000_000);
    let fraction = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_owned()
    };
    format!(
        "{}h{}m{}{fraction}s",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

// ---------------------------------------------------------------------------------------------------
// The model of a valid config
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Instance {
    provider_id: Option<String>,
    instance_type: Option<String>,
    zone: Option<String>,
    region: Option<String>,
    addresses: Option<Vec<(&'static str, String)>>,
    labels: Vec<(String, String)>,
    state: Option<&'static str>,
    latency: Option<u64>,
}

#[derive(Debug, Clone)]
struct Route {
    name: String,
    target_node: Option<String>,
    cidr: String,
    blackhole: Option<bool>,
}

type Pool = (Ipv4Addr, u8);

#[derive(Debug, Clone)]
struct Model {
    state_file: Option<String>,
    batched: Option<bool>,
    latency: Option<u64>,
    failure_rate: Vec<(&'static str, f64)>,
    seed: Option<u64>,
    retry_after: Option<u64>,
    instances_v2: Option<bool>,
    has_cluster_id: Option<bool>,
    defaults: Option<[Option<String>; 3]>,
    instances: Vec<(String, Instance)>,
    /// `enabled`, and `ipPool` as (address, prefix length).
    load_balancers: Option<(Option<bool>, Option<Pool>)>,
    routes: Option<(Option<bool>, Vec<Route>)>,
}

/// Names, zones and labels: plain, empty, or odd Unicode.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9-]{0,12}",
        1 => Just(String::new()),
        1 => prop::collection::vec(any::<char>(), 1..8).prop_map(|c| c.into_iter().collect()),
        1 => prop::sample::select(vec!["\u{202e}evil", "é", "名前", "\u{0}", "a: b", "- x", "#", "'", "\"", "~", "null", "true", "0x1F", "1e400"]).prop_map(str::to_owned),
    ]
}

fn nanos() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..10_000_000_000,
        0..=i64::MAX as u64,
        Just(i64::MAX as u64),
    ]
}

fn address_type() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "InternalIP",
        "ExternalIP",
        "Hostname",
        "InternalDNS",
        "ExternalDNS",
    ])
}

fn instance() -> impl Strategy<Value = Instance> {
    (
        (
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(text()),
        ),
        prop::option::of(prop::collection::vec((address_type(), text()), 0..3)),
        prop::collection::vec((text(), text()), 0..3),
        prop::option::of(prop::sample::select(vec!["running", "shutdown", "gone"])),
        prop::option::of(nanos()),
    )
        .prop_map(
            |(
                (provider_id, instance_type, zone, region),
                addresses,
                mut labels,
                state,
                latency,
            )| {
                labels.sort();
                labels.dedup_by(|a, b| a.0 == b.0);
                Instance {
                    provider_id,
                    instance_type,
                    zone,
                    region,
                    addresses,
                    labels,
                    state,
                    latency,
                }
            },
        )
}

fn model() -> impl Strategy<Value = Model> {
    let probability = prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0f64];
    let methods: Vec<&'static str> = METHODS.iter().copied().chain(["all"]).collect();
    (
        (
            prop::option::of(prop_oneof!["/[a-z/]{1,20}", text()]),
            prop::option::of(any::<bool>()),
            prop::option::of(nanos()),
            prop::collection::btree_map(prop::sample::select(methods), probability, 0..4),
            prop::option::of(any::<u64>()),
            prop::option::of(nanos()),
        ),
        (
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
            prop::option::of([
                prop::option::of(text()),
                prop::option::of(text()),
                prop::option::of(text()),
            ]),
            prop::collection::btree_map(text(), instance(), 0..3),
            prop::option::of((
                prop::option::of(any::<bool>()),
                prop::option::of((any::<Ipv4Addr>(), 0u8..=32)),
            )),
            prop::option::of((
                prop::option::of(any::<bool>()),
                prop::collection::vec(
                    (
                        text(),
                        prop::option::of(text()),
                        text(),
                        prop::option::of(any::<bool>()),
                    )
                        .prop_map(|(name, target_node, cidr, blackhole)| {
                            Route {
                                name,
                                target_node,
                                cidr,
                                blackhole,
                            }
                        }),
                    0..3,
                ),
            )),
        ),
    )
        .prop_map(
            |(
                (state_file, batched, latency, failure_rate, seed, retry_after),
                (instances_v2, has_cluster_id, defaults, instances, load_balancers, routes),
            )| Model {
                state_file,
                batched,
                latency,
                failure_rate: failure_rate.into_iter().collect(),
                seed,
                retry_after,
                instances_v2,
                has_cluster_id,
                defaults,
                instances: instances.into_iter().collect(),
                load_balancers,
                routes,
            },
        )
}

fn bool_text(b: bool) -> Yaml {
    scalar(if b { "true" } else { "false" })
}

/// The model as a YAML tree: keys only for what the model sets.
fn to_yaml(model: &Model) -> Yaml {
    let mut top = Vec::new();
    let put = |entries: &mut Vec<(String, Yaml)>, key: &str, value: Option<Yaml>| {
        if let Some(value) = value {
            entries.push((key.to_owned(), value));
        }
    };
    put(
        &mut top,
        "stateFile",
        model.state_file.as_deref().map(|p| scalar(quoted(p))),
    );
    put(&mut top, "stateFileBatched", model.batched.map(bool_text));
    put(
        &mut top,
        "latency",
        model.latency.map(|n| scalar(go_string(n))),
    );
    if !model.failure_rate.is_empty() {
        let rates = model
            .failure_rate
            .iter()
            .map(|(method, p)| (method.to_string(), scalar(format!("{p:?}"))))
            .collect();
        top.push(("failureRate".to_owned(), Yaml::Map(rates)));
    }
    put(&mut top, "seed", model.seed.map(|s| scalar(s.to_string())));
    put(
        &mut top,
        "retryAfter",
        model.retry_after.map(|n| scalar(quoted(&format!("{n}ns")))),
    );
    put(&mut top, "instancesV2", model.instances_v2.map(bool_text));
    put(
        &mut top,
        "hasClusterID",
        model.has_cluster_id.map(bool_text),
    );
    if let Some([instance_type, zone, region]) = &model.defaults {
        let mut defaults = Vec::new();
        put(
            &mut defaults,
            "instanceType",
            instance_type.as_deref().map(|t| scalar(quoted(t))),
        );
        put(
            &mut defaults,
            "zone",
            zone.as_deref().map(|t| scalar(quoted(t))),
        );
        put(
            &mut defaults,
            "region",
            region.as_deref().map(|t| scalar(quoted(t))),
        );
        top.push(("instanceDefaults".to_owned(), Yaml::Map(defaults)));
    }
    if !model.instances.is_empty() {
        let instances = model
            .instances
            .iter()
            .map(|(name, i)| {
                let mut fields = Vec::new();
                put(
                    &mut fields,
                    "providerID",
                    i.provider_id.as_deref().map(|t| scalar(quoted(t))),
                );
                put(
                    &mut fields,
                    "instanceType",
                    i.instance_type.as_deref().map(|t| scalar(quoted(t))),
                );
                put(
                    &mut fields,
                    "zone",
                    i.zone.as_deref().map(|t| scalar(quoted(t))),
                );
                put(
                    &mut fields,
                    "region",
                    i.region.as_deref().map(|t| scalar(quoted(t))),
                );
                if let Some(addresses) = &i.addresses {
                    let items: Vec<String> = addresses
                        .iter()
                        .map(|(t, a)| format!("{{type: {t}, address: {}}}", quoted(a)))
                        .collect();
                    fields.push((
                        "addresses".to_owned(),
                        scalar(format!("[{}]", items.join(", "))),
                    ));
                }
                if !i.labels.is_empty() {
                    let labels = i
                        .labels
                        .iter()
                        .map(|(k, v)| (quoted(k), scalar(quoted(v))))
                        .collect();
                    fields.push(("additionalLabels".to_owned(), Yaml::Map(labels)));
                }
                put(&mut fields, "state", i.state.map(scalar));
                put(
                    &mut fields,
                    "latency",
                    i.latency.map(|n| scalar(go_string(n))),
                );
                (quoted(name), Yaml::Map(fields))
            })
            .collect();
        top.push(("instances".to_owned(), Yaml::Map(instances)));
    }
    if let Some((enabled, pool)) = &model.load_balancers {
        let mut lb = Vec::new();
        put(&mut lb, "enabled", enabled.map(bool_text));
        put(
            &mut lb,
            "ipPool",
            pool.map(|(ip, p)| scalar(format!("{ip}/{p}"))),
        );
        top.push(("loadBalancers".to_owned(), Yaml::Map(lb)));
    }
    if let Some((enabled, initial)) = &model.routes {
        let mut routes = Vec::new();
        put(&mut routes, "enabled", enabled.map(bool_text));
        let items: Vec<String> = initial
            .iter()
            .map(|r| {
                let mut fields = vec![
                    format!("name: {}", quoted(&r.name)),
                    format!("destinationCIDR: {}", quoted(&r.cidr)),
                ];
                if let Some(t) = &r.target_node {
                    fields.push(format!("targetNode: {}", quoted(t)));
                }
                if let Some(b) = r.blackhole {
                    fields.push(format!("blackhole: {b}"));
                }
                format!("{{{}}}", fields.join(", "))
            })
            .collect();
        routes.push((
            "initial".to_owned(),
            scalar(format!("[{}]", items.join(", "))),
        ));
        top.push(("routes".to_owned(), Yaml::Map(routes)));
    }
    Yaml::Map(top)
}

/// Every field of `config` is what `model` says (or its documented default).
fn check_matches(model: &Model, config: &Config) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        config.state_file.as_deref(),
        model.state_file.as_deref().map(Path::new)
    );
    prop_assert_eq!(config.state_file_batched, model.batched.unwrap_or(false));
    prop_assert_eq!(
        config.latency.0,
        Duration::from_nanos(model.latency.unwrap_or(0))
    );
    for method in METHODS {
        let own = model.failure_rate.iter().find(|(m, _)| m == method);
        let all = model.failure_rate.iter().find(|(m, _)| *m == "all");
        prop_assert_eq!(
            config.failure_rate(method),
            own.or(all).map_or(0.0, |(_, p)| *p)
        );
    }
    prop_assert_eq!(config.seed, model.seed.unwrap_or(0));
    prop_assert_eq!(
        config.retry_after.map(|d| d.0),
        model.retry_after.map(Duration::from_nanos)
    );
    prop_assert_eq!(config.instances_v2, model.instances_v2.unwrap_or(true));
    prop_assert_eq!(config.has_cluster_id, model.has_cluster_id.unwrap_or(true));
    let [instance_type, zone, region] = model.defaults.clone().unwrap_or_default();
    prop_assert_eq!(
        &config.instance_defaults.instance_type,
        instance_type.as_deref().unwrap_or("standard")
    );
    prop_assert_eq!(
        &config.instance_defaults.zone,
        zone.as_deref().unwrap_or("zone-a")
    );
    prop_assert_eq!(
        &config.instance_defaults.region,
        region.as_deref().unwrap_or("region-1")
    );
    prop_assert_eq!(config.instances.len(), model.instances.len());
    for (name, want) in &model.instances {
        let got = &config.instances[name];
        prop_assert_eq!(&got.provider_id, &want.provider_id);
        prop_assert_eq!(&got.instance_type, &want.instance_type);
        prop_assert_eq!(&got.zone, &want.zone);
        prop_assert_eq!(&got.region, &want.region);
        let addresses = got.addresses.as_ref().map(|a| {
            a.iter()
                .map(|a| (a.type_.as_str(), a.address.clone()))
                .collect::<Vec<_>>()
        });
        prop_assert_eq!(&addresses, &want.addresses);
        let labels: Vec<(String, String)> = got.additional_labels.clone().into_iter().collect();
        prop_assert_eq!(&labels, &want.labels);
        let state = match got.state {
            InstanceState::Running => "running",
            InstanceState::Shutdown => "shutdown",
            InstanceState::Gone => "gone",
        };
        prop_assert_eq!(state, want.state.unwrap_or("running"));
        prop_assert_eq!(
            got.latency.0,
            Duration::from_nanos(want.latency.unwrap_or(0))
        );
    }
    let (enabled, pool) = model.load_balancers.unwrap_or((None, None));
    prop_assert_eq!(config.load_balancers.enabled, enabled.unwrap_or(true));
    let expected_pool = match pool {
        Some((ip, prefix)) => format!("{ip}/{prefix}")
            .parse::<IpPool>()
            .expect("a valid pool"),
        None => IpPool::default(),
    };
    prop_assert_eq!(config.load_balancers.ip_pool, expected_pool);
    let (enabled, initial) = model.routes.clone().unwrap_or((None, Vec::new()));
    prop_assert_eq!(config.routes.enabled, enabled.unwrap_or(true));
    prop_assert_eq!(config.routes.initial.len(), initial.len());
    for (got, want) in config.routes.initial.iter().zip(&initial) {
        prop_assert_eq!(&got.name, &want.name);
        prop_assert_eq!(&got.target_node, want.target_node.as_deref().unwrap_or(""));
        prop_assert_eq!(&got.destination_cidr, &want.cidr);
        prop_assert_eq!(got.blackhole, want.blackhole.unwrap_or(false));
    }
    Ok(())
}

/// What holds for any answer: no panic reached the parser's safety net; an error names the file and a
/// line; a config holds only values its types allow, and its IP pool is usable.
fn check_answer(
    text: &str,
    result: &Result<Config, cloud_provider_fake::ConfigError>,
) -> Result<Option<usize>, TestCaseError> {
    match result {
        Ok(config) => {
            for method in METHODS {
                let p = config.failure_rate(method);
                prop_assert!((0.0..=1.0).contains(&p), "{}: {}", method, p);
            }
            prop_assert!(config.latency.0.as_nanos() <= i64::MAX as u128);
            let pool = config.load_balancers.ip_pool;
            prop_assert_eq!(pool.to_string().parse::<IpPool>(), Ok(pool));
            let prefix: u32 = pool
                .to_string()
                .split('/')
                .nth(1)
                .and_then(|p| p.parse().ok())
                .expect("a prefix");
            let size = 1u64 << (32 - prefix);
            let usable = if prefix >= 31 { size } else { size - 2 };
            prop_assert_eq!(
                pool.addresses().size_hint(),
                (usable as usize, Some(usable as usize))
            );
            let first = pool.addresses().next().expect("a pool has an address");
            prop_assert!(pool.contains(first), "{} not in {}", first, pool);
            Ok(None)
        }
        Err(err) => {
            let message = err.to_string();
            prop_assert!(
                !message.contains("the YAML parser failed on it"),
                "the YAML parser panicked on {:?}: {}",
                text,
                message
            );
            prop_assert!(
                message.starts_with(&format!("malformed cloud-config {PATH}: ")),
                "{}",
                message
            );
            // Every YAML or value error says where it is; the state-file checks name their keys.
            if message.contains("stateFile") && !message.contains("line ") {
                return Ok(None);
            }
            let line = message.match_indices("line ").find_map(|(at, _)| {
                let digits: String = message[at + 5..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse::<usize>().ok()
            });
            prop_assert!(line.is_some(), "no line in: {}", message);
            Ok(line)
        }
    }
}

fn parse(text: &str) -> Result<Config, cloud_provider_fake::ConfigError> {
    Config::parse(text, Some(Path::new(PATH)))
}

// ---------------------------------------------------------------------------------------------------
// Damage
// ---------------------------------------------------------------------------------------------------

/// Replacement values: wrong types, out of range, huge, empty, odd Unicode, deep nesting, aliases.
fn junk_value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "", "~", "null", "[]", "{}", "\"\"", "-1", "1.5", "2", "-0.1", "1e400", ".nan", ".inf",
            "99999999999999999999999", "18446744073709551616", "0x10", "yes", "\"true\"", "5d", "5 ms",
            "2562048h", "9223372036854775808ns", "10.0.0.0/33", "300.0.0.0/8", "10.0.0.0", "::/0",
            "running!", "Running", "InternalIp", "[1, 2]", "{a: 1}", "*nowhere", "&anchor 1", "!!binary aGk=",
            "!!int 1", "!custom x", "'it''s'", "\"\\u202e\"", "é", "\u{0}", "\u{FEFF}", "\"\\ud800\"",
            "|", ">", "? x", "- x", "[", "{", "]", "}", "\"unterminated", "'unterminated", "%YAML 1.2",
            "a: b: c", "@x", "`x`",
        ]).prop_map(str::to_owned),
        1 => (1usize..3000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n))),
        1 => (1usize..3000).prop_map(|n| format!("{}1{}", "{a: ".repeat(n), "}".repeat(n))),
        1 => (1usize..3000).prop_map(|n| "[".repeat(n)),
        1 => prop::collection::vec(any::<char>(), 0..10).prop_map(|c| c.into_iter().filter(|c| *c != '\n').collect()),
    ]
}

/// A document built from the model, with one of its lines damaged: a value replaced by junk, a key
/// renamed or dropped, a line duplicated or indented differently.
#[derive(Debug, Clone)]
enum Damage {
    None,
    Value(prop::sample::Index, String),
    Key(prop::sample::Index, String),
    DropLine(prop::sample::Index),
    DuplicateLine(prop::sample::Index),
    Indent(prop::sample::Index, usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        3 => Just(Damage::None),
        6 => (any::<prop::sample::Index>(), junk_value()).prop_map(|(i, v)| Damage::Value(i, v)),
        1 => (any::<prop::sample::Index>(), prop_oneof!["[a-zA-Z]{1,12}", Just("stateFile".to_owned()), Just("\"\"".to_owned())]).prop_map(|(i, k)| Damage::Key(i, k)),
        1 => any::<prop::sample::Index>().prop_map(Damage::DropLine),
        1 => any::<prop::sample::Index>().prop_map(Damage::DuplicateLine),
        1 => (any::<prop::sample::Index>(), 1usize..4).prop_map(|(i, n)| Damage::Indent(i, n)),
    ]
}

/// Applies `damage` to the rendered document; returns the text and the damaged line (1-based).
fn apply(text: &str, damage: &Damage) -> (String, Option<usize>) {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        return (text.to_owned(), None);
    }
    let at = |i: &prop::sample::Index| i.index(lines.len());
    let line = match damage {
        Damage::None => return (text.to_owned(), None),
        Damage::Value(i, value) => {
            let n = at(i);
            let line = &lines[n];
            let Some(colon) = line
                .find(": ")
                .or_else(|| line.ends_with(':').then(|| line.len() - 1))
            else {
                return (text.to_owned(), None);
            };
            lines[n] = format!("{}: {value}", &line[..colon]);
            n
        }
        Damage::Key(i, key) => {
            let n = at(i);
            let line = &lines[n];
            let indent = line.len() - line.trim_start().len();
            let Some(colon) = line.find(':') else {
                return (text.to_owned(), None);
            };
            lines[n] = format!("{:indent$}{key}{}", "", &line[colon..]);
            n
        }
        Damage::DropLine(i) => {
            let n = at(i);
            lines.remove(n);
            n.saturating_sub(1)
        }
        Damage::DuplicateLine(i) => {
            let n = at(i);
            lines.insert(n, lines[n].clone());
            n
        }
        Damage::Indent(i, by) => {
            // Indented further, a line may continue the previous line's value: that line is damaged too.
            let n = at(i);
            lines[n] = format!("{:by$}{}", "", lines[n]);
            n.saturating_sub(1)
        }
    };
    let mut out = lines.join("\n");
    out.push('\n');
    (out, Some(line + 1))
}

proptest! {
    #![proptest_config(config(CASES * 2 / 5))]

    /// Valid configs written out from a model parse back to the model; with one line damaged, the
    /// answer is a config of valid values or an error naming a line at or before the damage.
    #[test]
    fn generated_configs(model in model(), damage in damage()) {
        let clean = render(&to_yaml(&model));
        let (text, damaged_line) = apply(&clean, &damage);
        let result = parse(&text);
        let error_line = check_answer(&text, &result)?;
        match (&result, damaged_line) {
            (Ok(config), None) => check_matches(&model, config)?,
            (Err(err), None) => prop_assert!(false, "a valid config was refused: {}\n{}", err, text),
            (Ok(_), Some(_)) => {} // the damage left a valid document (a string got another string)
            (Err(err), Some(damaged)) => {
                // The error points at the damaged line or after it (an unclosed bracket is found at the
                // end), never at the valid lines before it.
                if let Some(line) = error_line {
                    prop_assert!(line >= damaged,
                        "error at line {} for damage at line {}: {}\n{}", line, damaged, err, text);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The example file, damaged; nesting and aliases; arbitrary text
// ---------------------------------------------------------------------------------------------------

fn example_damage() -> impl Strategy<Value = String> {
    let len = EXAMPLE.len();
    let punctuation = prop::sample::select(vec![
        ":", "-", "[", "]", "{", "}", ",", "&a", "*a", "!", "|", ">", "'", "\"", "%", "@", "#",
        "?", " ", "\t", "\n", "\n  ", "\r", "\u{0}", "\u{FEFF}", "é", "---\n", "...\n", "<<: *a\n",
    ]);
    prop_oneof![
        // A character or YAML token inserted, a byte range cut out, the file cut short.
        3 => (0..=len, punctuation).prop_map(|(at, p)| {
            let at = (0..=at).rev().find(|i| EXAMPLE.is_char_boundary(*i)).unwrap_or(0);
            format!("{}{p}{}", &EXAMPLE[..at], &EXAMPLE[at..])
        }),
        1 => (0..=len, 0usize..40).prop_map(move |(at, n)| {
            let at = (0..=at).rev().find(|i| EXAMPLE.is_char_boundary(*i)).unwrap_or(0);
            let end = (at + n..=len).find(|i| EXAMPLE.is_char_boundary(*i)).unwrap_or(len);
            format!("{}{}", &EXAMPLE[..at], &EXAMPLE[end..])
        }),
        1 => (0..=len).prop_map(|at| {
            let at = (0..=at).rev().find(|i| EXAMPLE.is_char_boundary(*i)).unwrap_or(0);
            EXAMPLE[..at].to_owned()
        }),
        // A value of the example replaced by junk.
        3 => (any::<prop::sample::Index>(), junk_value()).prop_map(|(i, v)| {
            apply(EXAMPLE, &Damage::Value(i, v)).0
        }),
    ]
}

/// Deep nesting and alias expansion, which exhaust naive parsers.
fn bombs() -> impl Strategy<Value = String> {
    prop_oneof![
        (1usize..20_000).prop_map(|n| format!("seed: {}", "[".repeat(n))),
        (1usize..5_000).prop_map(|n| format!("instances: {}x{}", "{a: ".repeat(n), "}".repeat(n))),
        (1usize..2_000).prop_map(|n| (0..n).map(|i| format!("{:i$}- \n", "")).collect()),
        (1usize..2_000).prop_map(|n| (0..n).map(|i| format!("{:i$}k:\n", "")).collect()),
        (2usize..12, 2usize..12).prop_map(|(levels, width)| {
            let mut text = "a0: &a0 [x]\n".to_owned();
            for level in 1..levels {
                let refs = vec![format!("*a{}", level - 1); width].join(", ");
                text.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
            }
            text
        }),
        (2usize..12, 2usize..12).prop_map(|(levels, width)| {
            let mut text = "instances:\n  n0: &a0 {zone: z}\n".to_owned();
            for level in 1..levels {
                text.push_str(&format!("  n{level}: &a{level}\n"));
                for w in 0..width {
                    text.push_str(&format!(
                        "    <<: *a{}\n    k{w}: *a{}\n",
                        level - 1,
                        level - 1
                    ));
                }
            }
            text
        }),
    ]
}

proptest! {
    #![proptest_config(config(CASES / 5))]

    /// The example file with a token inserted, a range cut, the end cut or a value replaced.
    #[test]
    fn damaged_example(text in example_damage()) {
        check_answer(&text, &parse(&text))?;
    }
}

proptest! {
    #![proptest_config(config(CASES * 2 / 5))]

    /// Arbitrary text: YAML's punctuation, any Unicode, lines of the example shuffled; and, one case in
    /// fifteen, deep nesting or an alias bomb (refused at their first token of the wrong type: the
    /// deserializer streams, so no depth or expansion is reached).
    #[test]
    fn arbitrary_text(text in prop_oneof![
        6 => "[-:{}\\[\\],&*!|>'\"%@#? \n\ta-z0-9.]{0,120}",
        6 => prop::collection::vec(any::<char>(), 0..60).prop_map(|c| c.into_iter().collect::<String>()),
        2 => prop::collection::vec(prop::sample::select(EXAMPLE.lines().collect::<Vec<_>>()), 0..12).prop_map(|l| l.join("\n")),
        1 => bombs(),
    ]) {
        let started = std::time::Instant::now();
        check_answer(&text, &parse(&text))?;
        // A bomb is refused by the parser's budget, not by exhausting time or memory.
        prop_assert!(started.elapsed() < Duration::from_secs(5), "{} bytes took {:?}", text.len(), started.elapsed());
    }
}

/// The example itself is a valid config.
#[test]
fn the_example_parses() {
    let config = parse(EXAMPLE).unwrap();
    assert_eq!(config.load_balancers.ip_pool.to_string(), "203.0.113.0/24");
}
