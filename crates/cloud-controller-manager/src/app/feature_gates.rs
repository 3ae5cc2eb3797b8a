//! Feature gates, as upstream's cloud-controller-manager of 1.37 reads them:
//!
//! - `--feature-gates`, with upstream's syntax (`Gate=true,Other=false`, repeatable) and upstream's
//!   refusals (`unrecognized feature gate: X`), for exactly the gates upstream's manager lists: its own
//!   (k8s.io/cloud-provider, k8s.io/controller-manager), logging's and metrics', and the API server
//!   library's it embeds for its secure port.
//! - client-go's gates, which an out-of-tree manager does not list in `--feature-gates` (upstream
//!   refuses `--feature-gates=WatchListClient=false` as unrecognized): client-go reads them from
//!   `KUBE_FEATURE_<Gate>` environment variables ([`ClientFeatures::from_env`]).
//!
//! A gate this manager implements changes its behaviour. A gate it knows but does not implement is
//! accepted at the value that matches what this manager does, and refused out loud at the other, so a
//! manifest written for upstream never silently runs without what it asked for. Where client-go logs a
//! malformed or unknown `KUBE_FEATURE_` variable and goes on, this manager refuses to start.
//!
//! One implemented gate defaults otherwise here than upstream: `WatchListClient` is off (the caches page
//! their first lists), because a streaming list in JSON, which this manager speaks, costs the API server
//! more than twice a paged list; `KUBE_FEATURE_WatchListClient=true` streams them as client-go does.

use std::collections::BTreeMap;

/// A gate's maturity, as upstream lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Alpha.
    Alpha,
    /// Beta.
    Beta,
    /// Generally available (client-go's `InOrderInformers`, `InformerResourceVersion`).
    Ga,
}

/// What this manager does with a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Support {
    /// Implemented: either value works.
    Implemented,
    /// Implemented, but off or on by default here where upstream's default is the other (the gate's
    /// `note` says why); either value works.
    ImplementedDefaulting(bool),
    /// Not implemented: only this value (what the manager does anyway) is accepted.
    FixedAt(bool),
}

/// One known gate.
struct Gate {
    name: &'static str,
    stage: Stage,
    /// Upstream's default in 1.37.
    default: bool,
    support: Support,
    /// What this manager does about it, said when a value is refused (or why its default here is not
    /// upstream's).
    note: &'static str,
}

/// Watch-based route reconciliation (KEP-5237). Alpha and off by default in upstream's source at
/// k8s.io/controller-manager v0.37.1 and v0.38.0-beta.0, though the KEP planned beta, on by default, for
/// 1.37: the source wins.
pub const WATCH_BASED_ROUTES: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";

/// The periodic node status update also adds or updates the provider's additional labels (1.38, alpha).
pub const ADDITIONAL_LABELS: &str = "CloudNodeAdditionalLabelsReconciliation";

/// Streaming lists for the shared caches (client-go's gate, KEP-3157): `KUBE_FEATURE_WatchListClient`.
/// Off by default here, on in client-go since 1.35: see [`WATCH_LIST_CLIENT_OFF`].
pub const WATCH_LIST_CLIENT: &str = "WatchListClient";

/// Why this manager's caches page their first lists unless `KUBE_FEATURE_WatchListClient=true`.
const WATCH_LIST_CLIENT_OFF: &str = "this manager speaks JSON, and a streaming list in JSON costs the API server 2.3x a paged one (10,000 nodes: 2.42 s of its CPU against 1.07 s; bench/results/read-costs-2026-12-01.md); client-go streams in protobuf";

/// What a gate of the API server library means here: upstream's manager registers them because it
/// serves its secure port with that library; this manager's port is its own.
const SERVING_LIBRARY: &str = "a gate of the API server library upstream's manager embeds for its secure port; this manager's port follows the default";

/// A gate of the API server library, fixed at upstream's default.
const fn serving(name: &'static str, stage: Stage, default: bool) -> Gate {
    Gate {
        name,
        stage,
        default,
        support: Support::FixedAt(default),
        note: SERVING_LIBRARY,
    }
}

/// A gate this manager does not implement, fixed at `value`, with why.
const fn fixed(
    name: &'static str,
    stage: Stage,
    default: bool,
    value: bool,
    note: &'static str,
) -> Gate {
    Gate {
        name,
        stage,
        default,
        support: Support::FixedAt(value),
        note,
    }
}

use Stage::{Alpha, Beta, Ga};

/// The gates `--feature-gates` of upstream's 1.37 manager (k8s.io/cloud-provider's app) lists, but
/// `AllAlpha` and `AllBeta` (refused: see [`parse_one`]), in its order, and 1.38's
/// `CloudNodeAdditionalLabelsReconciliation`.
const COMPONENT: &[Gate] = &[
    fixed(
        "APIResponseCompression",
        Beta,
        true,
        false,
        "this manager's secure port does not compress its responses",
    ),
    serving("APIServerIdentity", Beta, true),
    serving("APIServerWebhookAuthenticationToken", Alpha, false),
    serving("APIServingWithRoutine", Alpha, false),
    serving("AllowParsingUserUIDFromCertAuth", Beta, true),
    serving("AllowUnsafeMalformedObjectDeletion", Beta, true),
    serving("CBORServingAndStorage", Alpha, false),
    Gate {
        name: WATCH_BASED_ROUTES,
        stage: Alpha,
        default: false,
        support: Support::Implemented,
        note: "",
    },
    // 1.38's (k8s.io/controller-manager v0.38.0-beta.0): upstream's 1.37 manager does not know it.
    Gate {
        name: ADDITIONAL_LABELS,
        stage: Alpha,
        default: false,
        support: Support::Implemented,
        note: "",
    },
    fixed(
        "CloudControllerManagerWebhook",
        Alpha,
        false,
        false,
        "this manager serves no admission webhooks",
    ),
    fixed(
        "ComponentFlagz",
        Beta,
        true,
        false,
        "this manager serves no /flagz endpoint",
    ),
    fixed(
        "ComponentStatusz",
        Beta,
        true,
        false,
        "this manager serves no /statusz endpoint",
    ),
    serving("ConcurrentWatchObjectDecode", Beta, true),
    serving("ConsistentListFromCacheSkipTimeoutFallback", Alpha, false),
    serving("ConstrainedImpersonation", Beta, true),
    fixed(
        "ContextualLogging",
        Beta,
        true,
        true,
        "this manager's log lines always carry their context (tracing spans)",
    ),
    fixed(
        "ControllerManagerReleaseLeaderElectionLockOnExit",
        Alpha,
        false,
        true,
        "this manager always releases its Lease on a graceful exit",
    ),
    fixed(
        "CoordinatedLeaderElection",
        Beta,
        false,
        false,
        "this manager's leader election is a plain Lease, without coordinated leader election",
    ),
    serving("DeclarativeValidationBeta", Beta, true),
    serving("DetectCacheInconsistency", Beta, true),
    serving("EtcdRangeStream", Beta, true),
    serving("ExcludeAdmissionWebhookVirtualResources", Beta, true),
    serving("ListFromCacheSnapshot", Beta, true),
    fixed(
        "LoggingAlphaOptions",
        Alpha,
        false,
        false,
        "this manager has no alpha logging options",
    ),
    fixed(
        "LoggingBetaOptions",
        Beta,
        true,
        true,
        "this manager's logging options are always on",
    ),
    serving("ManifestBasedAdmissionControlConfig", Beta, true),
    fixed(
        "NativeHistograms",
        Beta,
        true,
        false,
        "this manager's /metrics exposes classic histograms only",
    ),
    serving("OpenAPIEnums", Beta, true),
    serving("RemoteRequestHeaderUID", Beta, true),
    serving("ShardedListAndWatch", Alpha, false),
    serving("SizeBasedListCostEstimate", Beta, true),
    serving("StorageVersionAPI", Alpha, false),
    serving("StorageVersionHash", Beta, true),
    serving(
        "StructuredAuthenticationConfigurationEgressSelector",
        Beta,
        true,
    ),
    serving(
        "StructuredAuthenticationConfigurationJWKSMetrics",
        Beta,
        true,
    ),
    serving("TokenRequestServiceAccountUIDValidation", Beta, true),
    serving("UnknownVersionInteroperabilityProxy", Beta, true),
    serving("WatchList", Beta, true),
    serving("WatchListCompression", Beta, true),
    serving("WebhookRoundTripLoadBalancing", Beta, true),
];

/// client-go's 1.37 gates (`KUBE_FEATURE_<Gate>`).
const CLIENT: &[Gate] = &[
    fixed(
        "AtomicFIFO",
        Beta,
        true,
        true,
        "this manager's caches apply a re-list to the cache as one replacement",
    ),
    fixed(
        "ClientsAllowCARotation",
        Beta,
        true,
        false,
        "this manager's client reads its CA bundle once, at start",
    ),
    fixed(
        "ClientsAllowCBOR",
        Alpha,
        false,
        false,
        "this manager's client speaks JSON",
    ),
    fixed(
        "ClientsAllowTLSCacheGC",
        Beta,
        true,
        true,
        "this manager keeps no TLS transport cache to collect",
    ),
    fixed(
        "ClientsPreferCBOR",
        Alpha,
        false,
        false,
        "this manager's client speaks JSON",
    ),
    fixed(
        "InOrderInformers",
        Ga,
        true,
        true,
        "this manager's caches deliver events in order",
    ),
    fixed(
        "InOrderInformersBatchProcess",
        Beta,
        true,
        true,
        "this manager's caches hand each subscriber its changes as they come, in order",
    ),
    fixed(
        "InformerResourceVersion",
        Ga,
        true,
        true,
        "this manager's caches track the last resource version they synced",
    ),
    fixed(
        "UnlockWhileProcessingFIFO",
        Beta,
        true,
        true,
        "this manager's caches never hold a lock while a controller handles a change",
    ),
    Gate {
        name: WATCH_LIST_CLIENT,
        stage: Beta,
        default: true,
        support: Support::ImplementedDefaulting(false),
        note: WATCH_LIST_CLIENT_OFF,
    },
];

/// The value of an implemented gate left unset, or of a gate fixed at what this manager does.
fn effective_default(gates: &[Gate], name: &str) -> bool {
    gates
        .iter()
        .find(|g| g.name == name)
        .is_some_and(|g| match g.support {
            Support::Implemented => g.default,
            Support::ImplementedDefaulting(value) | Support::FixedAt(value) => value,
        })
}

/// `name=on` checked against `gate`'s support.
fn check(gate: &Gate, on: bool) -> Result<(), String> {
    match gate.support {
        Support::FixedAt(fixed) if on != fixed => Err(format!(
            "{}={on} is not supported: {} ({:?} gate, upstream default {})",
            gate.name, gate.note, gate.stage, gate.default
        )),
        _ => Ok(()),
    }
}

/// client-go's gates as the environment set them (`KUBE_FEATURE_<Gate>=true|false`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFeatures {
    set: BTreeMap<&'static str, bool>,
}

impl ClientFeatures {
    /// Reads every `KUBE_FEATURE_` variable of `vars` (the process's: `std::env::vars_os()`), with
    /// client-go's syntax (Go booleans). A gate client-go does not know, a value that is not a boolean,
    /// or a value this manager does not implement is an error that names the variable.
    pub fn from_env(
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Self, String> {
        const PREFIX: &str = "KUBE_FEATURE_";
        let mut features = Self::default();
        for (key, value) in vars {
            let Some(name) = key.to_str().and_then(|k| k.strip_prefix(PREFIX)) else {
                continue;
            };
            let value = value.to_string_lossy();
            let Some(gate) = CLIENT.iter().find(|g| g.name == name) else {
                return Err(format!(
                    "{PREFIX}{name}: client-go has no feature gate {name:?} (known: {})",
                    CLIENT.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
                ));
            };
            let on = cloud_provider::flag_values::go_bool(&value)
                .map_err(|err| format!("{PREFIX}{name}={value}: {err}"))?;
            check(gate, on).map_err(|err| format!("{PREFIX}{err}"))?;
            features.set.insert(gate.name, on);
        }
        Ok(features)
    }

    /// Whether client-go's gate `name` is on in this manager (as set, else its default here).
    pub fn enabled(&self, name: &str) -> bool {
        self.set
            .get(name)
            .copied()
            .unwrap_or_else(|| effective_default(CLIENT, name))
    }
}

/// The gates as the command line set them (upstream's defaults for the rest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<&'static str, bool>,
}

impl FeatureGates {
    /// Whether `name` is on in this manager: as set, else the implemented gate's upstream default, else
    /// what the manager does (a gate it does not implement is fixed at that value, whatever upstream's
    /// default).
    pub fn enabled(&self, name: &str) -> bool {
        self.set
            .get(name)
            .copied()
            .unwrap_or_else(|| effective_default(COMPONENT, name))
    }

    /// Every `--feature-gates` value, in order (a later setting of a gate wins, as upstream's map flag).
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut gates = Self::default();
        for value in values {
            for (name, on) in parse_one(value)? {
                gates.set.insert(name, on);
            }
        }
        Ok(gates)
    }
}

/// One `--feature-gates` value: `Gate=bool` pairs separated by commas (spaces around them allowed).
fn parse_one(value: &str) -> Result<Vec<(&'static str, bool)>, String> {
    let mut out = Vec::new();
    for pair in value.split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((name, text)) = pair.split_once('=') else {
            return Err(format!("missing bool value for {pair}"));
        };
        let (name, text) = (name.trim(), text.trim());
        let on = cloud_provider::flag_values::go_bool(text)
            .map_err(|err| format!("invalid value of {name}={text}, err: {err}"))?;
        // Upstream sets every alpha (beta) gate to the value given, which would turn on gates this
        // manager does not implement or off ones it always follows: refused at either value.
        if matches!(name, "AllAlpha" | "AllBeta") {
            return Err(format!(
                "{name}={on} is not supported by this manager: it would set every {} gate at once; name each gate you want instead",
                if name == "AllAlpha" { "alpha" } else { "beta" }
            ));
        }
        let Some(gate) = COMPONENT.iter().find(|g| g.name == name) else {
            return Err(format!("unrecognized feature gate: {name}"));
        };
        check(gate, on)?;
        out.push((gate.name, on));
    }
    Ok(out)
}

/// The gates `--help` lists.
pub(crate) fn help() -> String {
    let mut text = String::from(
        "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:",
    );
    for gate in COMPONENT {
        let support = match gate.support {
            Support::Implemented => String::new(),
            Support::ImplementedDefaulting(value) => {
                format!(", default here ={value}: {}", gate.note)
            }
            Support::FixedAt(value) => format!(", only ={value}: {}", gate.note),
        };
        text.push_str(&format!(
            "\n{}=true|false ({}, default={}{support})",
            gate.name,
            match gate.stage {
                Stage::Alpha => "ALPHA",
                Stage::Beta => "BETA",
                Stage::Ga => "GA",
            },
            gate.default
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse_as_upstream_and_what_is_not_implemented_is_refused() {
        let cases: &[(&[&str], Result<bool, &str>)] = &[
            (&[], Ok(false)),
            (
                &["CloudControllerManagerWatchBasedRoutesReconciliation=true"],
                Ok(true),
            ),
            (
                &[
                    " CloudControllerManagerWatchBasedRoutesReconciliation = True , ContextualLogging=true",
                ],
                Ok(true),
            ),
            // A later value wins, as upstream's map flag.
            (
                &[
                    "CloudControllerManagerWatchBasedRoutesReconciliation=1",
                    "CloudControllerManagerWatchBasedRoutesReconciliation=false",
                ],
                Ok(false),
            ),
            (&["AllAlpha=false"], Err("AllAlpha=false is not supported")),
            (&["AllBeta=false"], Err("AllBeta=false is not supported")),
            (
                &["NoSuchGate=true"],
                Err("unrecognized feature gate: NoSuchGate"),
            ),
            (
                &["CloudControllerManagerWatchBasedRoutesReconciliation"],
                Err("missing bool value for CloudControllerManagerWatchBasedRoutesReconciliation"),
            ),
            (
                &["CloudControllerManagerWatchBasedRoutesReconciliation=yes"],
                Err("invalid value of CloudControllerManagerWatchBasedRoutesReconciliation=yes"),
            ),
            (
                &["CloudControllerManagerWebhook=true"],
                Err(
                    "CloudControllerManagerWebhook=true is not supported: this manager serves no admission webhooks",
                ),
            ),
            (&["CloudControllerManagerWebhook=false"], Ok(false)),
            // client-go's gates are not --feature-gates of an out-of-tree manager (upstream: the same).
            (
                &["WatchListClient=false"],
                Err("unrecognized feature gate: WatchListClient"),
            ),
            // The API server library's gates: upstream's default accepted, the other value refused.
            (&["WatchList=true,EtcdRangeStream=true"], Ok(false)),
            (
                &["WatchList=false"],
                Err("WatchList=false is not supported: a gate of the API server library"),
            ),
            (&["AllAlpha=true"], Err("AllAlpha=true is not supported")),
        ];
        for (values, expected) in cases {
            let parsed = FeatureGates::parse(values.iter().copied());
            match (parsed, expected) {
                (Ok(gates), Ok(on)) => {
                    assert_eq!(gates.enabled(WATCH_BASED_ROUTES), *on, "{values:?}")
                }
                (Err(err), Err(start)) => assert!(err.starts_with(start), "{values:?}: {err}"),
                (got, _) => panic!("{values:?}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn defaults_are_upstream_s_for_gates_not_set() {
        let gates = FeatureGates::default();
        assert!(gates.enabled("ContextualLogging"));
        // Upstream's default is true; this manager serves no /flagz.
        assert!(!gates.enabled("ComponentFlagz"));
        assert!(gates.enabled("WatchList"));
        // Opt-in, as upstream's source has it (not the KEP's beta-in-1.37).
        assert!(!gates.enabled(WATCH_BASED_ROUTES));
        assert!(!gates.enabled(ADDITIONAL_LABELS));
        assert!(!gates.enabled("NoSuchGate"));
        assert!(help().contains(
            "CloudControllerManagerWatchBasedRoutesReconciliation=true|false (ALPHA, default=false)"
        ));
        assert!(
            help().contains(
                "CloudNodeAdditionalLabelsReconciliation=true|false (ALPHA, default=false)"
            )
        );
        let on = FeatureGates::parse(["CloudNodeAdditionalLabelsReconciliation=true"]).unwrap();
        assert!(on.enabled(ADDITIONAL_LABELS));
        let off =
            FeatureGates::parse(["CloudControllerManagerWatchBasedRoutesReconciliation=false"])
                .unwrap();
        assert!(!off.enabled(WATCH_BASED_ROUTES));
    }

    /// The stage and default of every gate of upstream's manager (`k8s.io/controller-manager`'s
    /// `pkg/features`), read from upstream's source in the Go module cache: the pinned v0.37.1, and
    /// v0.38.0-beta.0 for the gates 1.37 does not have.
    #[test]
    fn stages_and_defaults_are_upstream_s_source() {
        let mut seen = Vec::new();
        for version in ["v0.37.1", "v0.38.0-beta.0"] {
            let Some(source) = crate::upstream_source::read(
                "k8s.io/controller-manager",
                version,
                "pkg/features/kube_features.go",
            ) else {
                return;
            };
            let specs = source
                .split("versionedCloudPublicFeatureGates = ")
                .nth(1)
                .expect("the versioned gates");
            let upstream = upstream_gates(specs);
            assert!(upstream.len() >= 3, "{version}: {upstream:?}");
            for (name, stage, default) in upstream {
                if seen.contains(&name) {
                    continue; // 1.37's stance, checked above
                }
                let ours = COMPONENT
                    .iter()
                    .find(|g| g.name == name)
                    .unwrap_or_else(|| panic!("{version}'s gate {name} is not listed"));
                assert_eq!(
                    (ours.stage, ours.default),
                    (stage, default),
                    "{version}: {name}"
                );
                seen.push(name);
            }
        }
        assert!(seen.iter().any(|g| g == ADDITIONAL_LABELS), "{seen:?}");
    }

    /// `Gate: { {Version: ..., Default: false, PreRelease: featuregate.Alpha}, ... },` entries: each
    /// gate's last (newest) spec.
    fn upstream_gates(specs: &str) -> Vec<(String, Stage, bool)> {
        let mut gates: Vec<(String, Stage, bool)> = Vec::new();
        let mut name = None;
        for line in specs.lines().map(str::trim) {
            if line == "}" {
                break;
            }
            if let Some(gate) = line.strip_suffix(": {") {
                name = Some(gate.to_owned());
            } else if let (Some(gate), Some(spec)) = (&name, line.strip_prefix("{Version:")) {
                let default = spec.contains("Default: true");
                let stage = if spec.contains("featuregate.Alpha") {
                    Alpha
                } else if spec.contains("featuregate.Beta") {
                    Beta
                } else {
                    assert!(spec.contains("featuregate.GA"), "{spec}");
                    Ga
                };
                gates.retain(|(g, _, _)| g != gate);
                gates.push((gate.clone(), stage, default));
            }
        }
        gates
    }

    #[test]
    fn client_go_gates_come_from_the_environment_and_what_is_not_implemented_is_refused() {
        let env = |pairs: &[(&str, &str)]| {
            ClientFeatures::from_env(
                pairs
                    .iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .chain([("PATH".into(), "/bin".into())]),
            )
        };
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<bool, &'a str>);
        let cases: &[Case] = &[
            (&[], Ok(false)),
            (&[("KUBE_FEATURE_WatchListClient", "false")], Ok(false)),
            (&[("KUBE_FEATURE_WatchListClient", "0")], Ok(false)),
            (&[("KUBE_FEATURE_WatchListClient", "True")], Ok(true)),
            (
                &[("KUBE_FEATURE_WatchListClient", "no")],
                Err("KUBE_FEATURE_WatchListClient=no: not a boolean"),
            ),
            (&[("KUBE_FEATURE_InOrderInformers", "true")], Ok(false)),
            (
                &[("KUBE_FEATURE_ClientsPreferCBOR", "true")],
                Err(
                    "KUBE_FEATURE_ClientsPreferCBOR=true is not supported: this manager's client speaks JSON",
                ),
            ),
            (
                &[("KUBE_FEATURE_NoSuchGate", "true")],
                Err("KUBE_FEATURE_NoSuchGate: client-go has no feature gate \"NoSuchGate\""),
            ),
        ];
        for (pairs, expected) in cases {
            match (env(pairs), expected) {
                (Ok(features), Ok(on)) => {
                    assert_eq!(features.enabled(WATCH_LIST_CLIENT), *on, "{pairs:?}")
                }
                (Err(err), Err(start)) => assert!(err.starts_with(start), "{pairs:?}: {err}"),
                (got, _) => panic!("{pairs:?}: {got:?}, expected {expected:?}"),
            }
        }
    }
}
