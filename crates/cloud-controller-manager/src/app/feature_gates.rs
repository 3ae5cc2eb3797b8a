//! `--feature-gates`, with upstream's syntax (`Gate=true,Other=false`, repeatable) and upstream's
//! refusals (`unrecognized feature gate: X`), for the gates a 1.37 cloud-controller-manager knows.
//!
//! A gate this manager implements changes its behaviour. A gate it knows but does not implement is
//! accepted at the value that matches what this manager does, and refused out loud at the other, so a
//! manifest written for upstream never silently runs without what it asked for.

use std::collections::BTreeMap;

/// A gate's maturity, as upstream lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Alpha.
    Alpha,
    /// Beta.
    Beta,
}

/// What this manager does with a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Support {
    /// Implemented: either value works.
    Implemented,
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
    /// What this manager does about it, said when a value is refused.
    note: &'static str,
}

/// Watch-based route reconciliation (KEP-5237).
pub const WATCH_BASED_ROUTES: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";

/// The gates of a 1.37 cloud-controller-manager (k8s.io/controller-manager and k8s.io/cloud-provider,
/// and client-go's and logging's that every component registers).
const KNOWN: &[Gate] = &[
    Gate {
        name: WATCH_BASED_ROUTES,
        stage: Stage::Alpha,
        default: false,
        support: Support::Implemented,
        note: "",
    },
    Gate {
        name: "CloudControllerManagerWebhook",
        stage: Stage::Alpha,
        default: false,
        support: Support::FixedAt(false),
        note: "this manager serves no admission webhooks",
    },
    Gate {
        name: "ControllerManagerReleaseLeaderElectionLockOnExit",
        stage: Stage::Alpha,
        default: false,
        support: Support::FixedAt(true),
        note: "this manager always releases its Lease on a graceful exit",
    },
    Gate {
        name: "WatchListClient",
        stage: Stage::Beta,
        default: true,
        support: Support::FixedAt(false),
        note: "this manager's caches start with paginated lists, not streaming lists",
    },
    Gate {
        name: "InOrderInformers",
        stage: Stage::Beta,
        default: true,
        support: Support::FixedAt(true),
        note: "this manager's caches deliver events in order",
    },
    Gate {
        name: "ContextualLogging",
        stage: Stage::Beta,
        default: true,
        support: Support::FixedAt(true),
        note: "this manager's log lines always carry their context (tracing spans)",
    },
    Gate {
        name: "LoggingAlphaOptions",
        stage: Stage::Alpha,
        default: false,
        support: Support::FixedAt(false),
        note: "this manager has no alpha logging options",
    },
    Gate {
        name: "LoggingBetaOptions",
        stage: Stage::Beta,
        default: true,
        support: Support::FixedAt(true),
        note: "this manager's logging options are always on",
    },
];

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
        self.set.get(name).copied().unwrap_or_else(|| {
            KNOWN
                .iter()
                .find(|g| g.name == name)
                .is_some_and(|g| match g.support {
                    Support::Implemented => g.default,
                    Support::FixedAt(value) => value,
                })
        })
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
        let on = super::options::go_bool(text)
            .map_err(|err| format!("invalid value of {name}={text}, err: {err}"))?;
        // Upstream sets every alpha (beta) gate to the value given, which would turn on gates this
        // manager does not implement or off ones it always follows: refused at either value.
        if matches!(name, "AllAlpha" | "AllBeta") {
            return Err(format!(
                "{name}={on} is not supported by this manager: it would set every {} gate at once; name each gate you want instead",
                if name == "AllAlpha" { "alpha" } else { "beta" }
            ));
        }
        let Some(gate) = KNOWN.iter().find(|g| g.name == name) else {
            return Err(format!("unrecognized feature gate: {name}"));
        };
        if let Support::FixedAt(fixed) = gate.support
            && on != fixed
        {
            return Err(format!(
                "{name}={on} is not supported: {} ({:?} gate, upstream default {})",
                gate.note, gate.stage, gate.default
            ));
        }
        out.push((gate.name, on));
    }
    Ok(out)
}

/// The gates `--help` lists.
pub(crate) fn help() -> String {
    let mut text = String::from(
        "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:",
    );
    for gate in KNOWN {
        let support = match gate.support {
            Support::Implemented => String::new(),
            Support::FixedAt(value) => format!(", only ={value}: {}", gate.note),
        };
        text.push_str(&format!(
            "\n{}=true|false ({}, default={}{support})",
            gate.name,
            match gate.stage {
                Stage::Alpha => "ALPHA",
                Stage::Beta => "BETA",
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
            (
                &["WatchListClient=true"],
                Err("WatchListClient=true is not supported"),
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
        // Upstream's default is true; this manager does not stream its lists.
        assert!(!gates.enabled("WatchListClient"));
        assert!(!gates.enabled(WATCH_BASED_ROUTES));
        assert!(!gates.enabled("NoSuchGate"));
        assert!(help().contains(
            "CloudControllerManagerWatchBasedRoutesReconciliation=true|false (ALPHA, default=false)"
        ));
    }
}
