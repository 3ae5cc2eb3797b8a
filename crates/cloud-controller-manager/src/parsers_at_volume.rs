//! Bad input at volume (issue #16): property tests of the manager's parsers, 100,000 generated inputs
//! each, mixing mutations of valid input (a valid command line with one value replaced by junk, a CIDR
//! with a prefix past its family, an annotation with a third IP) with arbitrary strings and bytes. Every
//! property asserts that the parser answers (`Ok`, or an error naming the flag, annotation or value at
//! fault) and never panics, and that valid values come back as given.
//!
//! `cargo test -p cloud-controller-manager --lib parsers_at_volume`; `PROPTEST_CASES=N` runs N cases of
//! every property instead. These tests need no control plane; they sit inside the crate because they
//! test its internals.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    ffi::OsString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use crate::{
    app::{
        ControllerSelection, Options, UnknownController,
        controller_table::{ControllerName, builtin_controllers, node_ipam_config},
        options::{ClientOptions, CloudProviderOptions, NodeIpamOptions},
        rate_limit::RateLimitLayer,
    },
    cidrs::{is_v4, parse_cidr_list},
    controllers::{
        ipam::allocator::CidrSet,
        node::plan::{
            NodeIpError, filter_by_node_ips, honor_provided_node_ip, parse_provided_node_ips,
        },
        service::node_set::{
            LABEL_EXCLUDE, NodeFacts, TAINT_TO_BE_DELETED, backend_set, is_backend, is_included,
        },
    },
    well_known::ANNOTATION_PROVIDED_NODE_IP,
};
use clap::{CommandFactory, FromArgMatches, Parser};
use ipnet::IpNet;
use k8s_openapi::{
    api::core::v1::{Node, NodeAddress, NodeSpec, Taint},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use proptest::{prelude::*, test_runner::Config};

/// Inputs per parser and run.
const CASES: u32 = 100_000;

fn config(cases: u32) -> Config {
    Config {
        // PROPTEST_CASES=N runs N cases of every property instead.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        // No regression files in the tree: a failure prints its minimal input, which goes into a unit
        // test next to the fix.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Short strings of any characters (proptest's `any::<String>()` is up to 100 characters).
fn any_short_string() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..12).prop_map(|c| c.into_iter().collect())
}

/// Values that are wrong for most typed flags, and odd for the rest.
fn junk() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "", " ", "-1", "0", "1.5", "99999999999999999999999", "18446744073709551616",
            "4294967296", "65536", "256", "NaN", "inf", "-inf", "1e-40", "1e39", "0x10", "١", "１",
            "é", "\u{202e}", "\u{0}", "\u{1F600}", "true ", "yes", "TRUE", "t", "[[[[[[[[[[", "{}",
            "=", "--", "-", "5 s", "5d", "+5s", "2562048h", "1.2.3.4.5", "::g", "10.0.0.0/33",
            "a,b,,c", "\n", "\t1",
        ]).prop_map(str::to_owned),
        1 => any_short_string(),
        1 => "[\\[{]{50,2000}",
    ]
}

// ---------------------------------------------------------------------------------------------------
// Durations: cloud_provider::parse_go_duration behind every duration flag
// ---------------------------------------------------------------------------------------------------

const DURATION_FLAGS: &[&str] = &[
    "leader-elect-lease-duration",
    "leader-elect-renew-deadline",
    "leader-elect-retry-period",
    "node-status-update-frequency",
    "node-monitor-period",
    "route-reconciliation-period",
    "orphaned-load-balancer-sweep-period",
    "load-balancer-drift-period",
];

/// The duration flags where `0s` means "off" rather than being refused.
const ZERO_MEANS_OFF: &[&str] = &[
    "orphaned-load-balancer-sweep-period",
    "load-balancer-drift-period",
];

fn duration_field(options: &Options, flag: &str) -> Duration {
    match flag {
        "leader-elect-lease-duration" => options.leader_election.leader_elect_lease_duration,
        "leader-elect-renew-deadline" => options.leader_election.leader_elect_renew_deadline,
        "leader-elect-retry-period" => options.leader_election.leader_elect_retry_period,
        "node-status-update-frequency" => options.node.node_status_update_frequency,
        "node-monitor-period" => options.node.node_monitor_period,
        "route-reconciliation-period" => options.route.route_reconciliation_period,
        "orphaned-load-balancer-sweep-period" => {
            options.service.orphaned_load_balancer_sweep_period
        }
        "load-balancer-drift-period" => options.service.load_balancer_drift_period,
        other => unreachable!("not a duration flag: {other}"),
    }
}

/// Go's longest duration.
const GO_MAX: &str = "2562047h47m16.854775807s";

/// Duration texts: valid ones (down to 1 ns, up to Go's longest), near misses and junk.
fn duration_text() -> impl Strategy<Value = String> {
    let unit = prop::sample::select(vec!["ns", "us", "µs", "μs", "ms", "s", "m", "h"]);
    let segment = ("[0-9]{1,6}(\\.[0-9]{0,10})?", unit).prop_map(|(n, u)| format!("{n}{u}"));
    prop_oneof![
        4 => prop::collection::vec(segment, 1..4).prop_map(|s| s.concat()),
        1 => prop::sample::select(vec![
            GO_MAX, "2562047h47m16.854775808s", "2562047h", "2562048h", "9223372036854775807ns",
            "9223372036854775808ns", "1ns", "0", "0s", "0.0h", ".5s", "5.s", "1e3s",
            "18446744073709551616s", "00000000000000000000000001s",
        ]).prop_map(str::to_owned),
        1 => "[0-9.]{0,25}[a-zµ ]{0,3}",
        1 => junk(),
    ]
}

fn argv(args: impl IntoIterator<Item = impl Into<OsString>>) -> Vec<OsString> {
    std::iter::once(OsString::from("cloud-controller-manager"))
        .chain(args.into_iter().map(Into::into))
        .collect()
}

thread_local! {
    /// The manager's command, built once per test thread.
    static COMMAND: RefCell<clap::Command> = RefCell::new(Options::command());
    /// Commands of one of the manager's flags each, by long name.
    static ONE_FLAG: RefCell<BTreeMap<String, clap::Command>> = RefCell::default();
}

/// `Options::try_parse_from` on a command built once: the same parse (`command_lines` compares the two on
/// a sample), for half the time (a parse takes about 0.25 ms in debug, building the command as much).
fn parse(args: &[OsString]) -> Result<Options, clap::Error> {
    COMMAND.with(|command| {
        let mut command = command.borrow_mut();
        let mut matches = command.try_get_matches_from_mut(args)?;
        Options::from_arg_matches_mut(&mut matches).map_err(|err| err.format(&mut command))
    })
}

/// The values clap gives `--{long}` when its own `Arg` (value parser, delimiter, default) is the only
/// one in the command: the flag's parsing without the cost of the other forty.
fn parse_one<T: Clone + Send + Sync + 'static>(
    long: &str,
    args: &[OsString],
) -> Result<Vec<T>, clap::Error> {
    ONE_FLAG.with(|commands| {
        let mut commands = commands.borrow_mut();
        let command = commands.entry(long.to_owned()).or_insert_with(|| {
            let arg = Options::command()
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .cloned()
                .unwrap_or_else(|| panic!("no flag --{long}"));
            clap::Command::new("cloud-controller-manager").arg(arg)
        });
        let id = command
            .get_arguments()
            .next()
            .expect("one argument")
            .get_id()
            .clone();
        let matches = command.try_get_matches_from_mut(args)?;
        Ok(matches
            .get_many::<T>(id.as_str())
            .map(|values| values.cloned().collect())
            .unwrap_or_default())
    })
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Every duration flag takes exactly what `parse_go_duration` takes, minus zero (except where zero
    /// means "off"); any other value is an error that names the flag. (Each flag's own clap `Arg`; `command_lines` parses them in full
    /// command lines.)
    #[test]
    fn duration_flags(flag in prop::sample::select(DURATION_FLAGS), text in duration_text(), spaced in any::<bool>()) {
        let args = if spaced && !text.starts_with('-') {
            argv([format!("--{flag}"), text.clone()])
        } else {
            argv([format!("--{flag}={text}")])
        };
        let expected = cloud_provider::parse_go_duration(&text)
            .ok()
            .filter(|d| !d.is_zero() || ZERO_MEANS_OFF.contains(&flag));
        match (parse_one::<Duration>(flag, &args), expected) {
            (Ok(values), Some(expected)) => prop_assert_eq!(values, vec![expected]),
            (Err(err), None) => {
                let message = err.to_string();
                prop_assert!(message.contains(&format!("--{flag}")), "{}", message);
            }
            (got, expected) => prop_assert!(false, "--{}={:?}: {:?}, expected {:?}", flag, text, got.map(|_| ()), expected),
        }
    }
}

/// A huge but valid duration in every duration flag: the arithmetic the manager does on them
/// (`Instant::now() + d`, tokio intervals and sleeps, `mul_f64`) must not overflow. Each line names the
/// code it stands for; the leader elector and the controllers' loops cannot be started without an API
/// server, so their arithmetic is repeated here on the parsed values.
#[tokio::test]
async fn the_longest_durations_do_not_overflow_later() {
    let options = Options::try_parse_from(argv([
        format!("--leader-elect-lease-duration={GO_MAX}"),
        "--leader-elect-renew-deadline=2562046h".to_owned(),
        "--leader-elect-retry-period=2000000h".to_owned(),
        format!("--node-status-update-frequency={GO_MAX}"),
        format!("--node-monitor-period={GO_MAX}"),
        format!("--route-reconciliation-period={GO_MAX}"),
    ]))
    .unwrap();
    assert_eq!(options.validate(), Ok(()));
    let le = &options.leader_election;
    let longest = Duration::new(9_223_372_036, 854_775_807);
    assert_eq!(le.leader_elect_lease_duration, longest);
    // app/options.rs LeaderElectionOptions::validate: retry × 1.2.
    let _ = le.leader_elect_retry_period.mul_f64(1.2);
    // app/leader_election.rs `jittered`: period + 20 % of it.
    let _ = le.leader_elect_retry_period + le.leader_elect_retry_period.mul_f64(0.2);
    // app/leader_election.rs `attempt`: the write fence opens until `started + renew deadline`, and
    // the attempt runs under tokio::time::timeout(renew deadline); Instant + lease duration as well.
    let _ = Instant::now() + le.leader_elect_renew_deadline;
    let _ = Instant::now() + le.leader_elect_retry_period;
    let _ = Instant::now() + le.leader_elect_lease_duration;
    let attempt = tokio::time::timeout(le.leader_elect_renew_deadline, std::future::ready(true));
    assert_eq!(attempt.await, Ok(true));
    // app/leader_election.rs `check`: lease duration + 20 s of slack.
    let _ = le.leader_elect_lease_duration + Duration::from_secs(20);
    // controllers/node_lifecycle and controllers/route: tokio::time::interval(period), Delay on missed
    // ticks; controllers/node/status.rs: tokio::time::sleep(period). The first tick is at once, the
    // next one never comes within the test.
    for period in [
        options.node.node_monitor_period,
        options.route.route_reconciliation_period,
        options.node.node_status_update_frequency,
        options.service.orphaned_load_balancer_sweep_period,
        options.service.load_balancer_drift_period,
        le.leader_elect_retry_period,
    ] {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        let next = tokio::time::timeout(Duration::from_millis(5), ticks.tick()).await;
        assert!(next.is_err(), "a second tick after {period:?} came at once");
        let slept =
            tokio::time::timeout(Duration::from_millis(5), tokio::time::sleep(period)).await;
        assert!(slept.is_err());
    }
}

// ---------------------------------------------------------------------------------------------------
// The whole command line: clap plus Options::validate
// ---------------------------------------------------------------------------------------------------

/// What a flag takes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Duration,
    /// A duration where `0s` means "off".
    DurationOrZero,
    Bool,
    /// An integer in this range (clap's type range or the flag's own).
    Int(i128, i128),
    Qps,
    Ip,
    /// One of these.
    Enum(&'static [&'static str]),
    /// Any string (a list for the comma-separated ones).
    Text,
    /// A label selector (`--node-selector`).
    Selector,
}

/// Go's `strconv.ParseBool` spellings.
const GO_BOOLS: &[&str] = &[
    "1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False",
];

const FLAGS: &[(&str, Kind)] = &[
    ("controllers", Kind::Text),
    ("leader-elect", Kind::Bool),
    ("leader-elect-lease-duration", Kind::Duration),
    ("leader-elect-renew-deadline", Kind::Duration),
    ("leader-elect-retry-period", Kind::Duration),
    ("leader-elect-resource-lock", Kind::Enum(&["leases"])),
    ("leader-elect-resource-name", Kind::Text),
    ("leader-elect-resource-namespace", Kind::Text),
    ("secure-port", Kind::Int(0, u16::MAX as i128)),
    ("bind-address", Kind::Ip),
    ("authorization-always-allow-paths", Kind::Text),
    ("cloud-provider", Kind::Text),
    ("cloud-config", Kind::Text),
    ("cluster-name", Kind::Text),
    ("cluster-cidr", Kind::Text),
    ("allow-untagged-cloud", Kind::Bool),
    ("concurrent-node-syncs", Kind::Int(1, u16::MAX as i128)),
    (
        "concurrent-node-status-updates",
        Kind::Int(0, u16::MAX as i128),
    ),
    ("node-status-update-frequency", Kind::Duration),
    ("node-monitor-period", Kind::Duration),
    ("concurrent-service-syncs", Kind::Int(1, u16::MAX as i128)),
    ("orphaned-load-balancer-sweep-period", Kind::DurationOrZero),
    ("load-balancer-class", Kind::Text),
    ("serve-classless-load-balancers", Kind::Bool),
    ("load-balancer-drift-period", Kind::DurationOrZero),
    ("load-balancer-drift", Kind::Enum(&["heal", "report"])),
    ("node-selector", Kind::Selector),
    ("configure-cloud-routes", Kind::Bool),
    ("route-reconciliation-period", Kind::Duration),
    ("allocate-node-cidrs", Kind::Bool),
    ("cidr-allocator-type", Kind::Enum(&["RangeAllocator"])),
    ("node-cidr-mask-size", Kind::Int(0, u8::MAX as i128)),
    ("node-cidr-mask-size-ipv4", Kind::Int(0, u8::MAX as i128)),
    ("node-cidr-mask-size-ipv6", Kind::Int(0, u8::MAX as i128)),
    ("service-cluster-ip-range", Kind::Text),
    ("kubeconfig", Kind::Text),
    ("master", Kind::Text),
    ("kube-api-qps", Kind::Qps),
    ("kube-api-burst", Kind::Int(0, u32::MAX as i128)),
    ("v", Kind::Int(0, u8::MAX as i128)),
    ("logging-format", Kind::Enum(&["text", "json"])),
];

/// A valid value for a flag of this kind.
fn valid_value(kind: Kind) -> BoxedStrategy<String> {
    match kind {
        Kind::Duration | Kind::DurationOrZero => prop_oneof![
            (
                "[1-9][0-9]{0,3}",
                prop::sample::select(vec!["ms", "s", "m", "h"])
            )
                .prop_map(|(n, u)| format!("{n}{u}")),
            Just(GO_MAX.to_owned()),
            Just("1ns".to_owned()),
        ]
        .boxed(),
        Kind::Bool => prop::sample::select(GO_BOOLS.to_vec())
            .prop_map(str::to_owned)
            .boxed(),
        Kind::Int(low, high) => prop_oneof![
            (low..=high).prop_map(|n| n.to_string()),
            Just(low.to_string()),
            Just(high.to_string()),
        ]
        .boxed(),
        Kind::Qps => prop_oneof![
            Just("0".to_owned()),
            Just("-1".to_owned()),
            (1u32..100_000).prop_map(|n| n.to_string()),
            (1u32..1000).prop_map(|n| format!("0.{n}")),
        ]
        .boxed(),
        Kind::Ip => prop_oneof![
            any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
            any::<Ipv6Addr>().prop_map(|ip| ip.to_string()),
        ]
        .boxed(),
        Kind::Enum(values) => prop::sample::select(values).prop_map(str::to_owned).boxed(),
        Kind::Selector => prop_oneof![
            Just(String::new()),
            "[a-z]{1,8}(=|!=|==)[a-z0-9]{0,8}",
            "[a-z]{1,8} (in|notin) \\([a-z0-9]{1,5}(,[a-z0-9]{1,5}){0,3}\\)",
            "!?[a-z]{1,6}(/[a-z]{1,6})?",
            Just("cloud=aws,tier>2,!edge".to_owned()),
        ]
        .boxed(),
        Kind::Text => prop_oneof![
            "[a-z0-9./*-]{1,20}",
            Just("*,-route".to_owned()),
            Just("10.244.0.0/16".to_owned()),
        ]
        .boxed(),
    }
}

/// Whether clap takes `value` for a flag of this kind (the test's own reading of each type).
fn is_valid(kind: Kind, value: &str) -> bool {
    match kind {
        Kind::Duration => cloud_provider::parse_go_duration(value).is_ok_and(|d| !d.is_zero()),
        Kind::DurationOrZero => cloud_provider::parse_go_duration(value).is_ok(),
        // Go's strconv.ParseBool spellings, as upstream's flags take.
        Kind::Bool => GO_BOOLS.contains(&value),
        // clap reads integers as i64 (Rust's syntax: an optional sign, ASCII digits), then checks the range.
        Kind::Int(low, high) => value
            .parse::<i128>()
            .is_ok_and(|n| (low..=high).contains(&n)),
        Kind::Qps => value.parse::<f32>().is_ok_and(|q| {
            q.is_finite() && (q <= 0.0 || 1.0 / f64::from(q) <= i64::MAX as f64 / 1e9)
        }),
        Kind::Ip => value.parse::<IpAddr>().is_ok(),
        Kind::Enum(values) => values.contains(&value),
        Kind::Text => true,
        Kind::Selector => crate::node_selector::NodeSelector::parse(value).is_ok(),
    }
}

/// A valid command line (each flag once, `--flag=value` or `--flag value`), and optionally one flag
/// whose value is junk for its type.
/// Flags given as (index in `FLAGS`, value, `--flag value` rather than `--flag=value`).
type GivenFlags = Vec<(usize, String, bool)>;

fn command_line() -> impl Strategy<Value = (GivenFlags, Option<(usize, String)>)> {
    let flag =
        (0..FLAGS.len()).prop_flat_map(|i| (Just(i), valid_value(FLAGS[i].1), any::<bool>()));
    let bad = (0..FLAGS.len()).prop_flat_map(|i| (Just(i), prop_oneof![junk(), duration_text()]));
    (
        prop::collection::vec(flag, 0..8),
        prop::option::weighted(0.6, bad),
    )
        .prop_map(|(mut flags, bad)| {
            // Each flag once (list flags append, the others take the last value: either way one value).
            let mut seen = std::collections::BTreeSet::new();
            flags.retain(|(i, _, _)| seen.insert(*i));
            if let Some((i, _)) = &bad {
                flags.retain(|(j, _, _)| j != i);
            }
            (flags, bad)
        })
}

fn render(flags: &GivenFlags, bad: &Option<(usize, String)>) -> Vec<OsString> {
    let mut args = Vec::new();
    for (i, value, spaced) in flags {
        let name = FLAGS[*i].0;
        if *spaced && !value.starts_with('-') {
            args.push(format!("--{name}"));
            args.push(value.clone());
        } else {
            args.push(format!("--{name}={value}"));
        }
    }
    if let Some((i, value)) = bad {
        args.push(format!("--{}={value}", FLAGS[*i].0));
    }
    argv(args)
}

/// The built-in controllers' names.
fn known_controllers() -> Vec<ControllerName> {
    builtin_controllers().iter().map(|c| *c.name()).collect()
}

/// The node-IPAM controller's CIDR sets from its flags, as the manager builds them at start.
fn cidr_sets(cloud: &CloudProviderOptions, ipam: &NodeIpamOptions) -> Result<Vec<CidrSet>, String> {
    let clusters = parse_cidr_list("--cluster-cidr", &cloud.cluster_cidr)?;
    node_ipam_config(ipam, &clusters)
        .map_err(|err| err.to_string())?
        .cidr_sets()
}

/// What runs after a successful parse at start: the cross-flag checks, the rate limiter, `--controllers`
/// and the CIDR flags. None of it may panic, whatever clap let through.
fn after_parse(options: &Options) {
    let _ = options.validate();
    let _ = RateLimitLayer::new(options.client.kube_api_qps, options.client.kube_api_burst);
    let _ = ControllerSelection::parse(&options.generic.controllers, &known_controllers());
    let _ = parse_cidr_list("--cluster-cidr", &options.cloud.cluster_cidr);
    let _ = cidr_sets(&options.cloud, &options.ipam);
}

proptest! {
    #![proptest_config(config(CASES / 2))]

    /// A valid command line parses to the values given; the same line with one value replaced by junk
    /// for its type is an error that names that flag.
    #[test]
    fn command_lines((flags, bad) in command_line(), compare in 0..16u8) {
        let args = render(&flags, &bad);
        let result = parse(&args);
        if compare == 0 {
            same_as_try_parse_from(&args, &result)?;
        }
        let bad = bad.filter(|(i, value)| !is_valid(FLAGS[*i].1, value));
        match (&result, &bad) {
            (Ok(options), None) => {
                after_parse(options);
                for (i, value, _) in &flags {
                    if matches!(FLAGS[*i].1, Kind::Duration | Kind::DurationOrZero) {
                        let expected = cloud_provider::parse_go_duration(value).unwrap();
                        prop_assert_eq!(duration_field(options, FLAGS[*i].0), expected);
                    }
                }
            }
            (Err(err), Some((i, value))) => {
                let message = err.to_string();
                prop_assert!(message.contains(&format!("--{}", FLAGS[*i].0)), "--{}={:?}: {}", FLAGS[*i].0, value, message);
            }
            (Err(err), None) => prop_assert!(false, "{:?} was refused: {}", args, err),
            (Ok(_), Some((i, value))) => prop_assert!(false, "--{}={:?} was accepted", FLAGS[*i].0, value),
        }
    }

    /// Arbitrary argument vectors: known and unknown flags with any values, any strings, and bytes that
    /// are not UTF-8. clap answers; what it accepts passes through the start-up checks without a panic.
    #[test]
    fn arbitrary_command_lines(args in prop::collection::vec(prop_oneof![
        4 => (
            prop::sample::select(vec!["--", "-", "", "---"]),
            prop_oneof![
                4 => prop::sample::select(FLAGS).prop_map(|(name, _)| name.to_owned()),
                1 => prop::sample::select(vec!["help", "version", "h", "V", "tls-cert-file", "tls-private-key-file", "no-such-flag"]).prop_map(str::to_owned),
                1 => any_short_string(),
            ],
            prop::option::of(prop_oneof![junk(), duration_text()]),
        ).prop_map(|(dashes, name, value)| match value {
            Some(value) => OsString::from(format!("{dashes}{name}={value}")),
            None => OsString::from(format!("{dashes}{name}")),
        }),
        1 => junk().prop_map(OsString::from),
        1 => prop::collection::vec(any::<u8>(), 0..12).prop_map(non_utf8),
    ], 0..10), compare in 0..16u8) {
        let args = argv(args);
        let result = parse(&args);
        if compare == 0 {
            same_as_try_parse_from(&args, &result)?;
        }
        match result {
            Ok(options) => after_parse(&options),
            Err(err) => prop_assert!(!err.to_string().trim().is_empty(), "{:?}", args),
        }
    }
}

/// `parse` answers as `Options::try_parse_from` does.
fn same_as_try_parse_from(
    args: &[OsString],
    result: &Result<Options, clap::Error>,
) -> Result<(), TestCaseError> {
    match (Options::try_parse_from(args), result) {
        (Ok(a), Ok(b)) => prop_assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
        (a, b) => prop_assert!(false, "{:?}: {:?} vs {:?}", args, a, b),
    }
    Ok(())
}

#[cfg(unix)]
fn non_utf8(bytes: Vec<u8>) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let mut bytes = bytes;
    bytes.extend_from_slice(b"--v=\xff");
    OsString::from_vec(bytes)
}

#[cfg(not(unix))]
fn non_utf8(bytes: Vec<u8>) -> OsString {
    OsString::from(String::from_utf8_lossy(&bytes).into_owned())
}

proptest! {
    #![proptest_config(config(CASES))]

    /// `--kube-api-qps` and `--kube-api-burst`: what passes the flag's parser and `Options::validate`
    /// builds a rate limiter without a panic.
    #[test]
    fn client_rate_limits(
        qps in prop_oneof![
            any::<f32>().prop_map(|q| q.to_string()),
            prop::sample::select(vec!["1e-9", "1e-10", "1.1e-10", "1e-20", "0.1", "200", "-0", "3.4e38"]).prop_map(str::to_owned),
            junk(),
        ],
        burst in prop_oneof![any::<u32>(), Just(u32::MAX), Just(0u32), 1u32..1000],
    ) {
        match parse_one::<f32>("kube-api-qps", &argv([format!("--kube-api-qps={qps}")])) {
            Ok(values) => {
                prop_assert!(is_valid(Kind::Qps, &qps), "{:?} was accepted", qps);
                let client = ClientOptions {
                    kubeconfig: String::new(),
                    master: String::new(),
                    kube_api_qps: values[0],
                    kube_api_burst: burst,
                    kube_api_content_type: Default::default(),
                };
                match client.validate() {
                    Ok(()) => {
                        let limiter = RateLimitLayer::new(client.kube_api_qps, client.kube_api_burst);
                        // Over 1e9 QPS the period is under the limiter's nanosecond: no limit.
                        let limited = client.kube_api_qps > 0.0 && client.kube_api_qps <= 1e9;
                        if client.kube_api_qps <= 0.0 || limited {
                            prop_assert_eq!(limiter.is_some(), limited, "{}", client.kube_api_qps);
                        }
                    }
                    Err(err) => { let err = err.to_string(); prop_assert!(err.contains("--kube-api-burst") && err.contains("--kube-api-qps"), "{}", err) }
                }
            }
            Err(err) => {
                prop_assert!(!is_valid(Kind::Qps, &qps), "{:?} was refused: {}", qps, err);
                prop_assert!(err.to_string().contains("--kube-api-qps"), "{}", err);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// --controllers
// ---------------------------------------------------------------------------------------------------

fn controller_entry() -> impl Strategy<Value = String> {
    let known: Vec<String> = known_controllers()
        .iter()
        .flat_map(|c| std::iter::once(c.name).chain(c.alias))
        .map(str::to_owned)
        .chain(["*".to_owned()])
        .collect();
    let entry = prop_oneof![
        6 => prop::sample::select(known),
        2 => prop::sample::select(vec![
            "", " ", "-", "--route", "**", "Route", "ipam", "node", "cloud-node-controller-", "-*",
            "nodeipam\u{0}", "service\u{200b}", "\u{0130}", "*route",
        ]).prop_map(str::to_owned),
        1 => any_short_string(),
    ];
    (
        entry,
        any::<bool>(),
        prop::sample::select(vec!["", " ", "\t", "  "]),
        prop::sample::select(vec!["", " ", "\n"]),
    )
        .prop_map(|(name, minus, before, after)| {
            format!("{before}{}{name}{after}", if minus { "-" } else { "" })
        })
}

/// What `--controllers` means, as the flag's help defines it: entries split at commas and trimmed, empty
/// ones ignored; `*`, `name` or `-name` by canonical name or alias; the first mention of a controller
/// decides, else `*` enables it.
fn controllers_model(values: &[String]) -> Result<Vec<&'static str>, String> {
    let entries: Vec<&str> = values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let mut decided: BTreeMap<&str, bool> = BTreeMap::new();
    let mut star = false;
    for entry in entries {
        if entry == "*" {
            star = true;
            continue;
        }
        let (on, name) = match entry.strip_prefix('-') {
            Some(name) => (false, name),
            None => (true, entry),
        };
        let controller = known_controllers()
            .into_iter()
            .find(|c| c.name == name || c.alias == Some(name))
            .ok_or_else(|| name.to_owned())?;
        decided.entry(controller.name).or_insert(on);
    }
    Ok(known_controllers()
        .iter()
        .filter(|c| decided.get(c.name).copied().unwrap_or(star))
        .map(|c| c.name)
        .collect())
}

proptest! {
    #![proptest_config(config(CASES / 2))]

    /// Lists of entries, several per value: the selection enables what the flag's definition says, and an
    /// unknown entry is an error that quotes it and lists every known name.
    #[test]
    fn controllers_flag(values in prop::collection::vec(
        prop::collection::vec(controller_entry(), 0..5).prop_map(|e| e.join(",")),
        0..4,
    )) {
        check_controllers(&values)?;
    }

    /// Arbitrary values, and the same values through clap's `--controllers` (which splits at commas
    /// first): the same answer.
    #[test]
    fn controllers_flag_arbitrary(values in prop::collection::vec(prop_oneof![any_short_string(), "[a-z,* -]{0,30}"], 0..4)) {
        check_controllers(&values)?;
        let args = argv(values.iter().map(|v| format!("--controllers={v}")));
        if let Ok(given) = parse_one::<String>("controllers", &args) {
            let through_clap = ControllerSelection::parse(&given, &known_controllers());
            let direct = ControllerSelection::parse(&values, &known_controllers());
            if !values.is_empty() {
                prop_assert_eq!(through_clap, direct);
            }
        }
    }
}

fn check_controllers(values: &[String]) -> Result<(), TestCaseError> {
    let known = known_controllers();
    let result = ControllerSelection::parse(values, &known);
    match (&result, controllers_model(values)) {
        (Ok(selection), Ok(expected)) => {
            let enabled: Vec<&str> = selection
                .enabled(&known)
                .into_iter()
                .map(|c| c.name)
                .collect();
            prop_assert_eq!(enabled, expected, "{:?}", values);
        }
        (Err(UnknownController { name, known }), Err(expected)) => {
            prop_assert_eq!(name, &expected);
            prop_assert_eq!(known.len(), 2 * self::known_controllers().len());
            let message = result.as_ref().unwrap_err().to_string();
            prop_assert!(
                message.starts_with(&format!(
                    "--controllers: {name:?} is not in the list of known controllers ("
                )),
                "{}",
                message
            );
        }
        (got, expected) => prop_assert!(false, "{:?}: {:?}, expected {:?}", values, got, expected),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// CIDRs: --cluster-cidr, --service-cluster-ip-range, and the node-IPAM mask sizes
// ---------------------------------------------------------------------------------------------------

/// One CIDR text: valid (any address, any prefix of its family), past its family's prefix, or junk.
fn cidr_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (any::<Ipv4Addr>(), prop_oneof![0u8..=32, Just(0), Just(32)]).prop_map(|(ip, p)| format!("{ip}/{p}")),
        4 => (any::<Ipv6Addr>(), prop_oneof![0u8..=128, Just(0), Just(128)]).prop_map(|(ip, p)| format!("{ip}/{p}")),
        1 => (any::<Ipv4Addr>(), 33u16..300).prop_map(|(ip, p)| format!("{ip}/{p}")),
        1 => (any::<Ipv6Addr>(), 129u16..300).prop_map(|(ip, p)| format!("{ip}/{p}")),
        1 => prop::sample::select(vec![
            "", "10.0.0.0", "10.0.0.0/", "/8", "10.0.0.0/8/8", "10.0.0.256/8", "::/-1", " 10.0.0.0/8 ",
            "10.0.0.0/08", "fe80::1%eth0/64", "[::1]/128", "::ffff:1.2.3.4/120", "10.0.0.0/+8",
            "١٠.0.0.0/8", "10.0.0.0 /8", "0.0.0.0/0", "::/0",
        ]).prop_map(str::to_owned),
        1 => junk(),
    ]
}

fn cidr_list() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::collection::vec(cidr_text(), 1..4).prop_flat_map(|parts| {
            prop::sample::select(vec![",", ", ", " ,", ",,"]).prop_map(move |sep| parts.join(sep))
        }),
        1 => any_short_string(),
    ]
}

fn check_cidr_list(flag: &str, value: &str) -> Result<Option<Vec<IpNet>>, TestCaseError> {
    let result = parse_cidr_list(flag, value);
    let parts: Vec<Option<IpNet>> = value
        .split(',')
        .map(|p| p.trim().parse::<IpNet>().ok().map(|n| n.trunc()))
        .collect();
    match &result {
        Ok(nets) => {
            prop_assert!(!value.trim().is_empty());
            let expected: Vec<IpNet> = parts
                .iter()
                .map(|p| p.expect("every part parsed"))
                .collect();
            prop_assert_eq!(nets, &expected);
            prop_assert!(
                nets.len() == 1 || (nets.len() == 2 && is_v4(&nets[0]) != is_v4(&nets[1])),
                "{:?}",
                nets
            );
            // A parsed list prints and parses back to itself.
            let printed: Vec<String> = nets.iter().map(ToString::to_string).collect();
            prop_assert_eq!(&parse_cidr_list(flag, &printed.join(",")), &result);
        }
        Err(err) => {
            prop_assert!(err.contains(flag), "{:?} does not name {}", err, flag);
            if value.trim().is_empty() {
                prop_assert!(err.contains("is empty"), "{}", err);
            } else if let Some(bad) = value
                .split(',')
                .find(|p| p.trim().parse::<IpNet>().is_err())
            {
                prop_assert!(
                    err.contains(&format!("{bad:?} is not a CIDR")),
                    "{:?}: {}",
                    bad,
                    err
                );
            } else {
                prop_assert!(
                    parts.len() > 2 || is_v4(&parts[0].unwrap()) == is_v4(&parts[1].unwrap()),
                    "{:?}: {}",
                    value,
                    err
                );
                prop_assert!(err.contains(&format!("{value:?}")), "{}", err);
            }
        }
    }
    Ok(result.ok())
}

fn mask() -> impl Strategy<Value = u8> {
    prop_oneof![
        Just(0u8),
        Just(24),
        Just(64),
        Just(32),
        Just(128),
        0u8..=32,
        0u8..=128,
        any::<u8>(),
    ]
}

proptest! {
    #![proptest_config(config(CASES / 2))]

    /// `parse_cidr_list`: one CIDR or an IPv4 and an IPv6 one, host bits dropped; errors name the flag and
    /// the part at fault.
    #[test]
    fn cidr_lists(flag in prop::sample::select(vec!["--cluster-cidr", "--service-cluster-ip-range"]), value in cidr_list()) {
        check_cidr_list(flag, &value)?;
    }

    /// The node-IPAM flags together (`cidr_sets`, checked at start): valid ones give a set per cluster
    /// CIDR whose node CIDRs lie inside it, have the mask asked for and miss the service range; bad ones
    /// are errors naming a flag. Arbitrary CIDRs occupied and released never panic.
    #[test]
    fn node_ipam_flags(
        cluster in cidr_list(),
        services in prop_oneof![Just(String::new()), cidr_list()],
        size in mask(), size_v4 in mask(), size_v6 in mask(),
        extra in prop::collection::vec(cidr_text(), 0..3),
    ) {
        let cloud = CloudProviderOptions {
            cloud_provider: "fake".into(),
            cloud_config: String::new(),
            cluster_name: "kubernetes".into(),
            cluster_cidr: cluster.clone(),
            allow_untagged_cloud: false,
            node_selector: Default::default(),
            node_filter_requirements: None,
        };
        let ipam = NodeIpamOptions {
            allocate_node_cidrs: true,
            cidr_allocator_type: "RangeAllocator".into(),
            node_cidr_mask_size: size,
            node_cidr_mask_size_ipv4: size_v4,
            node_cidr_mask_size_ipv6: size_v6,
            service_cluster_ip_range: services.clone(),
        };
        let (size, size_v6) = (ipam.node_cidr_mask_size, ipam.node_cidr_mask_size_ipv6);
        let clusters = check_cidr_list("--cluster-cidr", &cluster)?;
        match cidr_sets(&cloud, &ipam) {
            Ok(mut sets) => {
                let clusters = clusters.expect("a valid --cluster-cidr");
                let service_nets = if services.trim().is_empty() { Vec::new() } else {
                    parse_cidr_list("--service-cluster-ip-range", &services).expect("a valid service range")
                };
                prop_assert_eq!(sets.len(), clusters.len());
                for (set, cluster) in sets.iter_mut().zip(&clusters) {
                    prop_assert_eq!(set.cluster(), *cluster);
                    prop_assert!(set.free() <= 1 << 16);
                    let want = match (clusters.len(), is_v4(cluster), size) {
                        (1, _, s) if s != 0 => s,
                        (_, true, _) => size_v4,
                        (_, false, _) => size_v6,
                    };
                    let mut given = Vec::new();
                    for _ in 0..3 {
                        let Some(node_cidr) = set.allocate() else { break };
                        prop_assert!(cluster.contains(&node_cidr), "{} outside {}", node_cidr, cluster);
                        prop_assert_eq!(node_cidr.prefix_len(), want);
                        prop_assert!(!given.contains(&node_cidr));
                        for service in &service_nets {
                            prop_assert!(!service.contains(&node_cidr.network()) && !node_cidr.contains(&service.network()),
                                "{} overlaps the service range {}", node_cidr, service);
                        }
                        given.push(node_cidr);
                    }
                    for text in &extra {
                        if let Ok(net) = text.parse::<IpNet>() {
                            let touches = cluster.contains(&net.trunc().network())
                                || cluster.contains(&net.trunc().broadcast())
                                || net.trunc().contains(cluster);
                            prop_assert_eq!(set.occupy(&net), touches, "{} in {}", net, cluster);
                            prop_assert_eq!(set.release(&net), touches);
                        }
                    }
                }
            }
            Err(err) => {
                prop_assert!(
                    ["--cluster-cidr", "--service-cluster-ip-range", "--node-cidr-mask-size"].iter().any(|f| err.contains(f)),
                    "{}", err
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// node.kubernetes.io/exclude-from-external-load-balancers (Go's strconv.ParseBool)
// ---------------------------------------------------------------------------------------------------

/// Go's `strconv.ParseBool`.
fn go_parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn label_value() -> impl Strategy<Value = String> {
    let words = vec![
        "1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False",
    ];
    prop_oneof![
        4 => prop::sample::select(words.clone()).prop_map(str::to_owned),
        // Near misses: other cases, blanks, look-alikes.
        2 => (prop::sample::select(words), prop::sample::select(vec![
            "upper", "lower", "space", "nul", "trailing", "fullwidth",
        ])).prop_map(|(w, how)| match how {
            "upper" => w.to_uppercase().replace('T', "t"),
            "lower" => w.to_lowercase().replacen('f', "F", 1),
            "space" => format!(" {w}"),
            "nul" => format!("{w}\u{0}"),
            "trailing" => format!("{w} "),
            _ => w.replace('0', "０").replace('1', "１"),
        }),
        1 => prop::sample::select(vec!["", "yes", "no", "on", "off", "00", "01", "2", "-0", "flase"]).prop_map(str::to_owned),
        1 => any_short_string(),
    ]
}

fn node_with(
    label: Option<String>,
    other_labels: bool,
    autoscaler_taint: bool,
    provider_id: Option<String>,
) -> Node {
    let mut labels = BTreeMap::new();
    if other_labels {
        labels.insert("kubernetes.io/hostname".to_owned(), "node-a".to_owned());
    }
    if let Some(value) = label {
        labels.insert(LABEL_EXCLUDE.to_owned(), value);
    }
    Node {
        metadata: ObjectMeta {
            name: Some("node-a".into()),
            labels: (!labels.is_empty() || other_labels).then_some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id,
            taints: autoscaler_taint.then(|| {
                vec![Taint {
                    key: TAINT_TO_BE_DELETED.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(config(CASES))]

    /// A node is a load-balancer backend candidate unless it carries the exclusion label with a value
    /// that is not Go's boolean false (an empty or unparsable value excludes, as upstream).
    #[test]
    fn exclusion_label(
        label in prop::option::weighted(0.9, label_value()),
        other_labels in any::<bool>(),
        autoscaler_taint in any::<bool>(),
        provider_id in prop::option::of("[a-z]{1,5}://[a-z0-9-]{1,10}"),
    ) {
        let node = node_with(label.clone(), other_labels, autoscaler_taint, provider_id.clone());
        let included = label.as_deref().is_none_or(|v| go_parse_bool(v) == Some(false));
        prop_assert_eq!(is_included(&node), included, "{:?}", label);
        prop_assert_eq!(is_backend(&node), included && !autoscaler_taint);
        prop_assert_eq!(backend_set([&node]).len(), usize::from(included && !autoscaler_taint));
        let flipped = node_with(Some(if included { "true".into() } else { "false".into() }), other_labels, autoscaler_taint, provider_id);
        prop_assert_ne!(NodeFacts::of(&node), NodeFacts::of(&flipped));
    }
}

// ---------------------------------------------------------------------------------------------------
// alpha.kubernetes.io/provided-node-ip
// ---------------------------------------------------------------------------------------------------

fn ip_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
        4 => any::<Ipv6Addr>().prop_map(|ip| ip.to_string()),
        1 => prop::sample::select(vec![
            "0.0.0.0", "::", "10.0.0.1", "fd00::1", "::ffff:10.0.0.1", "fe80::1%eth0", "[::1]",
            "010.0.0.1", "10.0.0.1/24", " 10.0.0.1", "10.0.0.1 ", "10.0.0", "١٠.0.0.1", "",
            "2600:1f14:1d4:d101:0:0:0:ba3d", "::1", "127.0.0.1",
        ]).prop_map(str::to_owned),
        1 => junk(),
    ]
}

fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec(ip_text(), 1..4).prop_map(|ips| ips.join(",")),
        1 => any_short_string(),
        1 => "[0-9a-f.:, ]{0,30}",
    ]
}

fn address_type() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "InternalIP",
        "ExternalIP",
        "Hostname",
        "InternalDNS",
        "ExternalDNS",
        "",
        "Odd",
    ])
    .prop_map(str::to_owned)
}

proptest! {
    #![proptest_config(config(CASES))]

    /// The annotation is one IP, or an IPv4 and an IPv6 one; errors quote the value, name the annotation
    /// and say what is wrong. Applied to generated cloud addresses, the provided IPs' addresses come
    /// first and nothing that the cloud did not report is added.
    #[test]
    fn provided_node_ip(
        value in annotation_value(),
        cloud in prop::collection::vec((address_type(), prop_oneof![ip_text(), "[a-z.]{1,12}"]), 0..6),
        reuse in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
    ) {
        let parts: Vec<&str> = value.split(',').collect();
        let parsed: Vec<Option<IpAddr>> = parts.iter().map(|p| p.parse().ok()).collect();
        let result = parse_provided_node_ips(&value);
        match &result {
            Ok(ips) => {
                prop_assert!(parts.len() <= 2);
                prop_assert_eq!(ips.iter().copied().map(Some).collect::<Vec<_>>(), parsed.clone());
                prop_assert!(ips.iter().all(|ip| !ip.is_unspecified()));
                prop_assert!(ips.len() == 1 || ips[0].is_ipv4() != ips[1].is_ipv4());
                let printed: Vec<String> = ips.iter().map(ToString::to_string).collect();
                prop_assert_eq!(&parse_provided_node_ips(&printed.join(",")), &result);
            }
            Err(err @ NodeIpError::Invalid { value: quoted, why }) => {
                prop_assert_eq!(quoted, &value);
                let message = err.to_string();
                prop_assert!(message.contains(ANNOTATION_PROVIDED_NODE_IP) && message.contains(&format!("{value:?}")), "{}", message);
                if parts.len() > 2 {
                    prop_assert!(why.contains("at most two"), "{}", why);
                } else if let Some(bad) = parts.iter().zip(&parsed).find(|(_, ip)| ip.is_none()) {
                    prop_assert!(why.contains(&format!("{:?} is not an IP address", bad.0)), "{}", why);
                } else {
                    let ips: Vec<IpAddr> = parsed.iter().flatten().copied().collect();
                    prop_assert!(ips.iter().any(IpAddr::is_unspecified) || ips[0].is_ipv4() == ips[1].is_ipv4(), "{}", why);
                }
            }
            Err(other) => prop_assert!(false, "parsing gave {:?}", other),
        }

        // The cloud's addresses, some of them equal to the provided IPs.
        let mut addresses: Vec<NodeAddress> = cloud
            .into_iter()
            .map(|(type_, address)| NodeAddress { type_, address })
            .collect();
        if let Ok(ips) = &result {
            for index in &reuse {
                let ip = index.get(ips);
                addresses.push(NodeAddress { type_: "InternalIP".into(), address: ip.to_string() });
            }
        }
        let node = Node {
            metadata: ObjectMeta {
                annotations: Some([(ANNOTATION_PROVIDED_NODE_IP.to_owned(), value.clone())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match (honor_provided_node_ip(&node, &addresses), &result) {
            (Ok(kept), Ok(ips)) => {
                prop_assert_eq!(Ok(kept.clone()), filter_by_node_ips(ips, &addresses));
                prop_assert!(kept.iter().all(|a| addresses.contains(a)));
                let first = kept.first().expect("a matching address comes first");
                prop_assert!(first.address.parse::<IpAddr>().is_ok_and(|a| a == ips[0]));
            }
            (Err(NodeIpError::NoMatch(ip)), Ok(ips)) => {
                prop_assert!(ips.contains(&ip));
                prop_assert!(!addresses.iter().any(|a| a.address.parse::<IpAddr>().is_ok_and(|a| a == ip)));
            }
            (Err(err), Err(parse_err)) => prop_assert_eq!(&err, parse_err),
            (got, parsed) => prop_assert!(false, "{:?} with {:?}", got, parsed),
        }
    }
}
