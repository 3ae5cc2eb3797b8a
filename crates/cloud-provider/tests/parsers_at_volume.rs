//! Bad input at volume (issue #16): property tests of every parser in `cloud-provider`, 100,000
//! generated inputs each, mixing mutations of valid input with arbitrary strings. Every property asserts
//! that the parser answers (`Ok`, or an error naming the input) and never panics, and that valid values
//! round-trip.
//!
//! `cargo test -p cloud-provider --test parsers_at_volume`; `PROPTEST_CASES=N` runs N cases of every
//! property instead.

use std::{sync::Arc, time::Duration};

use cloud_provider::{
    CloudConfig, CloudProvider, ProviderId, ProviderIdError, Registry, RegistryError,
    default_load_balancer_name, parse_go_duration,
    service_helpers::{
        ANNOTATION_LOAD_BALANCER_SOURCE_RANGES, SourceRangesError, UnknownIpFamily, ip_families,
        is_allow_all, load_balancer_source_ranges,
    },
};
use k8s_openapi::{
    api::core::v1::{Service, ServiceSpec},
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

/// Go's longest duration in nanoseconds.
const GO_MAX_NANOS: u64 = i64::MAX as u64;

// ---------------------------------------------------------------------------------------------------
// parse_go_duration
// ---------------------------------------------------------------------------------------------------

/// `n` nanoseconds as Go's `Duration.String` writes it (`1h2m3.5s`, `1.5ms`, `0s`), which Go's
/// `ParseDuration` reads back exactly.
fn go_string(n: u64) -> String {
    fn fraction(value: u64, precision: u32) -> (String, u64) {
        let scale = 10u64.pow(precision);
        let digits = value % scale;
        let text = if digits == 0 {
            String::new()
        } else {
            let padded = format!("{digits:0width$}", width = precision as usize);
            format!(".{}", padded.trim_end_matches('0'))
        };
        (text, value / scale)
    }
    if n == 0 {
        return "0s".to_owned();
    }
    if n < 1_000_000_000 {
        let (unit, precision) = match n {
            0..1_000 => ("ns", 0),
            1_000..1_000_000 => ("\u{b5}s", 3),
            _ => ("ms", 6),
        };
        let (fraction, whole) = fraction(n, precision);
        return format!("{whole}{fraction}{unit}");
    }
    let (fraction, seconds) = fraction(n, 9);
    let mut text = format!("{}{fraction}s", seconds % 60);
    let minutes = seconds / 60;
    if minutes > 0 {
        text = format!("{}m{text}", minutes % 60);
        let hours = minutes / 60;
        if hours > 0 {
            text = format!("{hours}h{text}");
        }
    }
    text
}

/// Other exact spellings of `n` nanoseconds.
fn other_spellings(n: u64) -> [String; 4] {
    [
        format!("{n}ns"),
        format!("{}.{:09}s", n / 1_000_000_000, n % 1_000_000_000),
        format!("{}h{}ns", n / 3_600_000_000_000, n % 3_600_000_000_000),
        format!("{}ms{}us{}ns", n / 1_000_000, n / 1_000 % 1_000, n % 1_000),
    ]
}

/// Nanosecond counts, weighted toward the edges: small, around a second, around Go's limit, past it.
fn nanos() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..=GO_MAX_NANOS,
        2 => 0u64..2_000_000_000,
        1 => (GO_MAX_NANOS - 10_000_000)..=GO_MAX_NANOS,
        1 => (GO_MAX_NANOS + 1)..=u64::MAX,
        1 => Just(GO_MAX_NANOS),
        1 => Just(GO_MAX_NANOS + 1),
    ]
}

const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Units Go does not know, and near misses of the ones it does.
const JUNK_UNITS: &[&str] = &[
    "",
    "S",
    "sec",
    "d",
    "w",
    "y",
    "\u{b5}",
    "\u{3bc}",
    "hh",
    "mss",
    " s",
    "s ",
    "H",
    "Ms",
    "n",
    "\u{0}",
    "é",
    "秒",
    "\u{202e}s",
    "-",
    "+",
    "e9s",
    "_",
    "s\n",
];

/// One `<number><unit>` segment: its text and, when it is well formed, its exact value as
/// (nanoseconds, whether a fraction made it approximate by up to 1 ns).
#[derive(Debug, Clone)]
struct Segment {
    text: String,
    exact: Option<(u128, bool)>,
    joins_previous: bool,
    joins_next: bool,
}

fn segment() -> impl Strategy<Value = Segment> {
    let whole = prop_oneof![
        4 => "[0-9]{1,4}",
        2 => "[0-9]{1,25}",
        1 => Just(u64::MAX.to_string()),
        1 => Just("9223372036854775808".to_owned()),
        1 => Just("2562047".to_owned()),
        1 => Just(String::new()),
    ];
    let fraction = prop_oneof![
        4 => Just(None),
        2 => "[0-9]{0,12}".prop_map(Some),
        1 => "[0-9]{19,40}".prop_map(Some),
    ];
    let unit = prop_oneof![
        8 => (0..UNITS.len()).prop_map(|i| (UNITS[i].0.to_owned(), Some(UNITS[i].1))),
        1 => (0..JUNK_UNITS.len()).prop_map(|i| (JUNK_UNITS[i].to_owned(), None)),
    ];
    (whole, fraction, unit).prop_map(|(whole, fraction, (unit, scale))| {
        let text = match &fraction {
            Some(digits) => format!("{whole}.{digits}{unit}"),
            None => format!("{whole}{unit}"),
        };
        let digits = fraction.as_deref().unwrap_or("");
        let well_formed = !(whole.is_empty() && digits.is_empty());
        // Without a number or a dot, this segment's unit joins the previous one's ("5m" + "s" is
        // "5ms"); without a unit, its number joins the next one's.
        let (joins_previous, joins_next) =
            (whole.is_empty() && fraction.is_none(), unit.is_empty());
        let exact = scale.filter(|_| well_formed).map(|scale| {
            let whole: u128 = whole.parse().unwrap_or(0);
            // Only the first 18 fraction digits count (Go drops the rest; they weigh under 1 ns).
            let kept = &digits[..digits.len().min(18)];
            let part = if kept.is_empty() {
                0
            } else {
                kept.parse::<u128>().unwrap_or(0) * scale / 10u128.pow(kept.len() as u32)
            };
            (whole * scale + part, !digits.is_empty())
        });
        Segment {
            text,
            exact,
            joins_previous,
            joins_next,
        }
    })
}

/// A damaged copy of `text`: a character inserted, removed or replaced, a sign or blanks added, cut.
fn mutate(text: String) -> impl Strategy<Value = String> {
    let len = text.chars().count();
    let junk = prop_oneof![
        Just('.'),
        Just('-'),
        Just('+'),
        Just(' '),
        Just('\u{b5}'),
        Just('\u{0}'),
        proptest::char::range('0', '9'),
        any::<char>(),
    ];
    (0..=len, junk, 0..6u8).prop_map(move |(at, c, how)| {
        let mut chars: Vec<char> = text.chars().collect();
        match how {
            0 => chars.insert(at, c),
            1 if at < chars.len() => {
                chars.remove(at);
            }
            2 if at < chars.len() => chars[at] = c,
            3 => chars.insert(0, c),
            4 => chars.truncate(at),
            _ => chars.push(c),
        }
        chars.into_iter().collect()
    })
}

fn assert_names_input(text: &str, err: &str) {
    assert!(
        err.contains(&format!("{text:?}")),
        "the error for {text:?} does not quote it: {err}"
    );
    assert!(err.starts_with("invalid duration"), "{text:?}: {err}");
}

/// What holds for every answer: an error quotes the input; a duration is within Go's range, and its
/// Go spelling parses back to it.
fn check_duration_answer(text: &str, result: &Result<Duration, String>) {
    match result {
        Ok(d) => {
            let n = u64::try_from(d.as_nanos()).expect("at most 2^63 ns");
            assert!(n <= GO_MAX_NANOS, "{text:?} gave {d:?}, past Go's range");
            assert_eq!(parse_go_duration(&go_string(n)), Ok(*d), "{text:?}");
        }
        Err(err) => assert_names_input(text, err),
    }
}

proptest! {
    #![proptest_config(config(CASES / 4))]

    /// Every duration in Go's range, written as Go writes it (and three other exact ways), parses back
    /// to the same nanosecond; past Go's range it is an "out of range" error.
    #[test]
    fn go_durations_round_trip(n in nanos()) {
        let mut spellings = vec![go_string(n)];
        spellings.extend(other_spellings(n));
        for text in spellings {
            let result = parse_go_duration(&text);
            if n <= GO_MAX_NANOS {
                prop_assert_eq!(result, Ok(Duration::from_nanos(n)), "{:?}", text);
            } else {
                let err = result.unwrap_err();
                assert_names_input(&text, &err);
                prop_assert!(err.contains("out of range"), "{}", err);
            }
        }
    }

    /// Sequences of segments, well formed or with a junk unit: a well-formed sequence parses to the sum
    /// of its segments (to the nanosecond, give or take 1 ns per fraction) when that is in Go's range,
    /// and is refused as out of range otherwise; a junk unit is refused and named.
    #[test]
    fn go_duration_segments(segments in prop::collection::vec(segment(), 1..5)) {
        let text: String = segments.iter().map(|s| s.text.as_str()).collect();
        let result = parse_go_duration(&text);
        check_duration_answer(&text, &result);
        let exact: Option<Vec<(u128, bool)>> = segments.iter().map(|s| s.exact).collect();
        let last = segments.len() - 1;
        let joined = segments.iter().enumerate().any(|(i, s)| (s.joins_previous && i > 0) || (s.joins_next && i < last));
        match exact {
            _ if joined => {} // segments run into each other: no simple model, only the checks above
            _ if text == "0" => prop_assert_eq!(result, Ok(Duration::ZERO)), // Go's one unitless duration
            Some(parts) => {
                let sum: u128 = parts.iter().map(|p| p.0).sum();
                let slack = parts.iter().filter(|p| p.1).count() as u128;
                if sum + slack <= u128::from(GO_MAX_NANOS) {
                    let got = result.expect("a well-formed duration in range parses").as_nanos();
                    prop_assert!(got <= sum + slack && got + slack >= sum, "{:?}: {} ns, expected {} ns", text, got, sum);
                } else if sum > u128::from(GO_MAX_NANOS) + slack {
                    prop_assert!(result.unwrap_err().contains("out of range"), "{:?}", text);
                }
            }
            None => {
                let err = result.expect_err("a segment without a number or with a junk unit is refused");
                assert_names_input(&text, &err);
            }
        }
    }

    /// Damaged durations: any answer, never a panic, and the answer is consistent.
    #[test]
    fn go_duration_mutations(text in (nanos(), 0..5usize)
        .prop_map(|(n, i)| if i == 0 { go_string(n) } else { other_spellings(n)[i - 1].clone() })
        .prop_flat_map(mutate)) {
        check_duration_answer(&text, &parse_go_duration(&text));
    }

    /// Arbitrary strings, from Go's alphabet and from all of Unicode.
    #[test]
    fn go_duration_arbitrary(text in prop_oneof![
        "[0-9.nsuµμmh+\\- ]{0,30}",
        any::<String>(),
    ]) {
        check_duration_answer(&text, &parse_go_duration(&text));
    }
}

// ---------------------------------------------------------------------------------------------------
// ProviderId
// ---------------------------------------------------------------------------------------------------

fn provider_part() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("fake".to_owned()),
        2 => "[a-z][a-z0-9-]{0,10}",
        1 => Just(String::new()),
        1 => "[a-z:/]{1,6}",
        1 => any::<String>(),
        1 => "\\PC{1,5}",
    ]
}

fn instance_part() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9-]{1,20}",
        2 => "/[a-z0-9-]{1,10}/i-[0-9a-f]{4,17}",
        1 => Just(String::new()),
        1 => "[a-z:/]{0,8}",
        1 => any::<String>(),
        1 => "\\PC{1,5}",
        1 => Just("a://b".to_owned()),
    ]
}

fn provider_id_text() -> impl Strategy<Value = String> {
    let separator = prop_oneof![
        6 => Just("://"),
        1 => Just(":/"),
        1 => Just("//"),
        1 => Just(":///"),
        1 => Just(""),
        1 => Just(":://"),
    ];
    prop_oneof![
        4 => (provider_part(), separator, instance_part()).prop_map(|(p, s, i)| format!("{p}{s}{i}")),
        1 => any::<String>(),
        1 => "[a-z:/]{0,12}",
    ]
}

proptest! {
    #![proptest_config(config(CASES))]

    /// `ProviderId::parse` agrees with its definition (split at the first `://`, both parts non-empty),
    /// an ID prints back to its input, and errors quote the input and say what is missing.
    #[test]
    fn provider_ids(text in provider_id_text(), expected in provider_part()) {
        let result = ProviderId::parse(&text);
        prop_assert_eq!(&result, &text.parse::<ProviderId>());
        match (text.split_once("://"), &result) {
            (Some((provider, instance)), Ok(id)) => {
                prop_assert!(!provider.is_empty() && !instance.is_empty());
                prop_assert_eq!(id.provider(), provider);
                prop_assert_eq!(id.instance(), instance);
                prop_assert_eq!(id.to_string(), text.clone());
                prop_assert_eq!(ProviderId::parse(&id.to_string()), Ok(id.clone()));
                prop_assert_eq!(&ProviderId::new(provider, instance), id);
            }
            (None, Err(err @ ProviderIdError::MissingSeparator(_)))
                => prop_assert!(err.to_string().contains("is not of the form")),
            (Some(("", _)), Err(err @ ProviderIdError::EmptyProvider(_)))
                => prop_assert!(err.to_string().contains("empty provider name")),
            (Some((_, "")), Err(err @ ProviderIdError::EmptyInstance(_)))
                => prop_assert!(err.to_string().contains("empty instance part")),
            (split, answer) => prop_assert!(false, "{:?} split as {:?} gave {:?}", text, split, answer),
        }
        if let Err(err) = &result {
            prop_assert!(err.to_string().contains(&format!("{text:?}")), "{}", err);
        }

        // parse_for: the same, plus the provider must be `expected`.
        match (ProviderId::parse_for(&expected, &text), &result) {
            (Ok(id), Ok(parsed)) => prop_assert!(&id == parsed && id.provider() == expected),
            (Err(ProviderIdError::WrongProvider { id, found, expected: wanted }), Ok(parsed)) => {
                prop_assert!(id == text && found == parsed.provider() && wanted == expected);
                prop_assert_ne!(parsed.provider(), expected.as_str());
            }
            (Err(err), Err(parse_err)) => prop_assert_eq!(&err, parse_err),
            (answer, parsed) => prop_assert!(false, "parse_for({:?}, {:?}) = {:?}, parse = {:?}", expected, text, answer, parsed),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// default_load_balancer_name, CloudConfig, Registry
// ---------------------------------------------------------------------------------------------------

fn uid() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        1 => Just(String::new()),
        1 => "[-]{0,40}",
        1 => any::<String>(),
        1 => "[a-zé秒\u{1F600}-]{0,40}",
    ]
}

struct Named;
impl CloudProvider for Named {
    fn provider_name(&self) -> &str {
        "known"
    }
}

proptest! {
    #![proptest_config(config(CASES))]

    /// The load-balancer name is `a` + the UID without dashes, cut to at most 32 bytes at a character
    /// boundary, whatever the UID holds.
    #[test]
    fn load_balancer_names(uid in uid()) {
        let service = Service {
            metadata: ObjectMeta { uid: Some(uid.clone()), ..Default::default() },
            ..Default::default()
        };
        let name = default_load_balancer_name(&service);
        let full: String = std::iter::once('a').chain(uid.chars().filter(|c| *c != '-')).collect();
        prop_assert!(name.starts_with('a') && name.len() <= 32, "{:?}", name);
        prop_assert!(full.starts_with(&name));
        if full.len() <= 32 {
            prop_assert_eq!(&name, &full);
        } else {
            // Cut at the last boundary at or before 32 bytes: the next character would not fit.
            let next = full[name.len()..].chars().next().expect("something was cut");
            prop_assert!(name.len() + next.len_utf8() > 32);
        }
    }

    /// A cloud-config's text is its contents when they are UTF-8, and a UTF-8 error otherwise; the
    /// registry finds the provider by its exact name, and every other name is an error that quotes it
    /// and lists the known ones.
    #[test]
    fn cloud_configs_and_provider_names(
        bytes in prop_oneof![
            any::<Vec<u8>>(),
            any::<String>().prop_map(String::into_bytes),
        ],
        name in prop_oneof![
            2 => Just("known".to_owned()),
            1 => Just("external".to_owned()),
            1 => Just(String::new()),
            2 => "[a-z]{0,8}",
            2 => any::<String>(),
        ],
    ) {
        let config = CloudConfig::from_bytes(Some("/etc/cloud.conf".into()), bytes.clone());
        prop_assert_eq!(config.contents(), Some(bytes.as_slice()));
        match (config.text(), std::str::from_utf8(&bytes)) {
            (Ok(Some(text)), Ok(expected)) => prop_assert_eq!(text, expected),
            (Err(err), Err(expected)) => prop_assert_eq!(err, expected),
            (got, expected) => prop_assert!(false, "{:?} vs {:?}", got, expected),
        }
        prop_assert!(matches!(CloudConfig::none().text(), Ok(None)));

        let mut registry = Registry::new();
        registry
            .register("known", |_: &CloudConfig| Ok(Arc::new(Named) as Arc<dyn CloudProvider>))
            .unwrap();
        let duplicate = registry
            .register(name.clone(), |_: &CloudConfig| Ok(Arc::new(Named) as Arc<dyn CloudProvider>));
        prop_assert_eq!(duplicate.is_err(), name == "known");
        let mut registry = Registry::new();
        registry
            .register("known", |_: &CloudConfig| Ok(Arc::new(Named) as Arc<dyn CloudProvider>))
            .unwrap();
        match registry.init(&name, &config) {
            Ok(cloud) => prop_assert!(name == "known" && cloud.provider_name() == "known"),
            Err(err) => {
                let message = err.to_string();
                prop_assert!(message.contains("known providers: known"), "{}", message);
                match err {
                    RegistryError::Empty { .. } => prop_assert!(name.is_empty()),
                    RegistryError::External { .. } => prop_assert_eq!(name.as_str(), "external"),
                    RegistryError::Unknown { name: unknown, .. } => {
                        prop_assert_eq!(&unknown, &name);
                        prop_assert!(message.contains(&format!("{name:?}")), "{}", message);
                    }
                    other => prop_assert!(false, "{:?}", other),
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Service fields and annotations: load-balancer source ranges, IP families
// ---------------------------------------------------------------------------------------------------

fn cidr_entry() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (any::<std::net::Ipv4Addr>(), 0u8..=32).prop_map(|(ip, p)| format!("{ip}/{p}")),
        3 => (any::<std::net::Ipv6Addr>(), 0u8..=128).prop_map(|(ip, p)| format!("{ip}/{p}")),
        1 => prop::sample::select(vec![
            "0.0.0.0/0", " 10.0.0.0/8 ", "10.0.0.1/24", "::/0", "", " ", "10.0.0.0", "10.0.0.0/33",
            "::/129", "10.0.0.0/8/8", "١٠.0.0.0/8", "fe80::1%eth0/64", "10.0.0.0/+8", "\u{0}",
        ]).prop_map(str::to_owned),
        1 => prop::collection::vec(any::<char>(), 0..10).prop_map(|c| c.into_iter().collect()),
    ]
}

fn family() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["IPv4", "IPv6"]).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["ipv4", "IPV6", "IPv4 ", "", "IPv5", "v4"]).prop_map(str::to_owned),
        1 => prop::collection::vec(any::<char>(), 0..6).prop_map(|c| c.into_iter().collect()),
    ]
}

fn service_with(
    ranges: Option<Vec<String>>,
    annotation: Option<String>,
    families: Option<Vec<String>>,
) -> Service {
    Service {
        metadata: ObjectMeta {
            annotations: annotation
                .map(|v| [(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES.to_owned(), v)].into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_source_ranges: ranges,
            ip_families: families,
            ..Default::default()
        }),
        status: None,
    }
}

proptest! {
    #![proptest_config(config(CASES))]

    /// `spec.loadBalancerSourceRanges`, else the source-ranges annotation (comma-separated), else
    /// 0.0.0.0/0: each entry trimmed, host bits dropped, duplicates dropped, sorted; an entry that is
    /// not a CIDR is an error quoting it (the field) or the whole value (the annotation). What parses
    /// prints back to itself. `spec.ipFamilies`: IPv4 and IPv6 only, an unknown one named.
    #[test]
    fn source_ranges_and_ip_families(
        ranges in prop::option::of(prop::collection::vec(cidr_entry(), 0..4)),
        annotation in prop::option::of(prop_oneof![
            4 => prop::collection::vec(cidr_entry(), 1..4).prop_map(|e| e.join(",")),
            1 => prop::collection::vec(any::<char>(), 0..16).prop_map(|c| c.into_iter().collect::<String>()),
        ]),
        families in prop::option::of(prop::collection::vec(family(), 0..3)),
    ) {
        let service = service_with(ranges.clone(), annotation.clone(), families.clone());
        let result = load_balancer_source_ranges(&service);
        let from_spec = ranges.as_ref().is_some_and(|r| !r.is_empty());
        let entries: Vec<String> = if from_spec {
            ranges.clone().unwrap_or_default()
        } else {
            let value = annotation.as_deref().map(str::trim).filter(|v| !v.is_empty()).unwrap_or("0.0.0.0/0");
            value.split(',').map(str::to_owned).collect()
        };
        let parsed: Vec<Option<ipnet::IpNet>> = entries.iter().map(|e| e.trim().parse::<ipnet::IpNet>().ok().map(|n| n.trunc())).collect();
        match &result {
            Ok(nets) => {
                let mut expected: Vec<ipnet::IpNet> = parsed.iter().map(|p| p.expect("every entry parsed")).collect();
                expected.sort();
                expected.dedup();
                prop_assert_eq!(nets, &expected);
                prop_assert_eq!(is_allow_all(nets), nets.iter().any(|n| n.prefix_len() == 0 && n.addr().is_ipv4()));
                let printed: Vec<String> = nets.iter().map(ToString::to_string).collect();
                let again = service_with(None, Some(printed.join(",")), None);
                prop_assert_eq!(&load_balancer_source_ranges(&again), &result);
            }
            Err(err @ SourceRangesError::Spec { ranges: given, bad }) => {
                prop_assert!(from_spec);
                prop_assert_eq!(Some(given), ranges.as_ref());
                let first_bad = entries.iter().zip(&parsed).find(|(_, p)| p.is_none()).map(|(e, _)| e.trim().to_owned());
                prop_assert_eq!(Some(bad.clone()), first_bad);
                prop_assert!(err.to_string().contains(&format!("invalid CIDR address: {bad}")), "{}", err);
            }
            Err(err @ SourceRangesError::Annotation { value }) => {
                prop_assert!(!from_spec && parsed.iter().any(Option::is_none));
                prop_assert_eq!(Some(value.as_str()), annotation.as_deref().map(str::trim));
                let message = err.to_string();
                prop_assert!(message.starts_with(&format!("{ANNOTATION_LOAD_BALANCER_SOURCE_RANGES}: {value} is not valid")), "{}", message);
            }
        }

        match (ip_families(&service), &families) {
            (Ok(got), Some(given)) => {
                let names: Vec<&str> = got.iter().map(|f| f.as_str()).collect();
                prop_assert_eq!(names, given.iter().map(String::as_str).collect::<Vec<_>>());
            }
            (Ok(got), None) => prop_assert!(got.is_empty()),
            (Err(UnknownIpFamily(name)), Some(given)) => {
                let first = given.iter().find(|f| *f != "IPv4" && *f != "IPv6");
                prop_assert_eq!(Some(&name), first);
                let message = UnknownIpFamily(name.clone()).to_string();
                prop_assert!(message.contains(&format!("{name:?}")), "{}", message);
            }
            (Err(err), None) => prop_assert!(false, "{:?} without families", err),
        }
    }
}
