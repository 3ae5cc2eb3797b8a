//! Upstream's flags this manager does not implement (k8s.io/cloud-provider v0.37.1's manager: its own
//! options, the controller-manager library's, the API server library's secure serving, authentication
//! and authorization, and component-base's logging). Each is on the command line, hidden from `--help`,
//! so that giving it is refused **by name, with why and what to do** (clap's `invalid value ... for
//! '--flag'`, then our message), never with a bare "unexpected argument"; a few are accepted at the one
//! value that means what this manager does anyway (`--webhook-secure-port=0`: no webhook server;
//! `--profiling=false`: no profiling endpoint). None is ever accepted and ignored at another value.
//!
//! `docs/migrating.md` lists the same flags, with the same advice.

use clap::{Arg, ArgAction, Command};

use cloud_provider::flag_values::go_bool;

/// Whether the flag takes a boolean (`--flag` alone means `true`) or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Value,
}

/// One upstream flag this manager does not implement.
#[derive(Debug)]
struct UpstreamFlag {
    name: &'static str,
    kind: Kind,
    /// The values accepted (they mean what this manager does anyway).
    accepts: fn(&str) -> bool,
    /// Why it is refused and what to do, said on refusal.
    why: &'static str,
}

fn never(_: &str) -> bool {
    false
}

fn is_false(value: &str) -> bool {
    go_bool(value) == Ok(false)
}

fn is_empty(value: &str) -> bool {
    value.trim().is_empty()
}

/// `--webhooks`: no webhook named. `*` (all on-by-default webhooks) names none either: this manager has
/// none, as upstream's sample manager has none.
fn no_webhooks(value: &str) -> bool {
    value
        .split(',')
        .map(str::trim)
        .all(|item| item.is_empty() || item == "*")
}

/// `--webhook-secure-port=0`: upstream's "don't serve webhooks at all".
fn port_zero(value: &str) -> bool {
    value.trim().parse::<i64>() == Ok(0)
}

/// `--tls-min-version=VersionTLS12` (or empty, Go's default): TLS 1.2 and 1.3, what this manager
/// serves.
fn tls12(value: &str) -> bool {
    value.is_empty() || value == "VersionTLS12"
}

const AUTHN: &str = "this manager authorizes /metrics with a TokenReview and a SubjectAccessReview over its own API server connection (decisions cached 10 s, upstream's defaults) and accepts no client certificates: remove it";

const NO_WEBHOOKS: &str = "this manager serves no webhooks (upstream's CloudControllerManagerWebhook gate is alpha and its manager ships none): remove it";

const NO_WEBHOOKS_EMPTY: &str = "this manager serves no webhooks (upstream's CloudControllerManagerWebhook gate is alpha and its manager ships none): accepted only empty; remove it";

const NO_WEBHOOKS_FALSE: &str = "this manager serves no webhooks (upstream's CloudControllerManagerWebhook gate is alpha and its manager ships none): accepted only at false; remove it";

const fn refused(name: &'static str, kind: Kind, why: &'static str) -> UpstreamFlag {
    UpstreamFlag {
        name,
        kind,
        accepts: never,
        why,
    }
}

const fn only(
    name: &'static str,
    kind: Kind,
    accepts: fn(&str) -> bool,
    why: &'static str,
) -> UpstreamFlag {
    UpstreamFlag {
        name,
        kind,
        accepts,
        why,
    }
}

use Kind::{Bool, Value};

/// The flags, by what they configure.
const FLAGS: &[UpstreamFlag] = &[
    // Delegated authentication and authorization (k8s.io/apiserver).
    refused("authentication-kubeconfig", Value, AUTHN),
    refused("authentication-skip-lookup", Bool, AUTHN),
    refused("authentication-token-webhook-cache-ttl", Value, AUTHN),
    refused("authentication-tolerate-lookup-failure", Bool, AUTHN),
    refused("authorization-kubeconfig", Value, AUTHN),
    refused("authorization-webhook-cache-authorized-ttl", Value, AUTHN),
    refused("authorization-webhook-cache-unauthorized-ttl", Value, AUTHN),
    refused("client-ca-file", Value, AUTHN),
    refused("requestheader-allowed-names", Value, AUTHN),
    refused("requestheader-client-ca-file", Value, AUTHN),
    refused("requestheader-extra-headers-prefix", Value, AUTHN),
    refused("requestheader-group-headers", Value, AUTHN),
    refused("requestheader-uid-headers", Value, AUTHN),
    refused("requestheader-username-headers", Value, AUTHN),
    // Secure serving (k8s.io/apiserver).
    refused(
        "cert-dir",
        Value,
        "this manager writes no certificate to disk: use --tls-cert-file and --tls-private-key-file (reloaded when they change), or neither for a self-signed certificate made in memory",
    ),
    refused(
        "tls-cipher-suites",
        Value,
        "this manager serves rustls' default cipher suites (TLS 1.2 and 1.3, no weak suites): remove it",
    ),
    only(
        "tls-min-version",
        Value,
        tls12,
        "this manager serves TLS 1.2 and 1.3 and is accepted only at VersionTLS12: remove it",
    ),
    refused(
        "tls-sni-cert-key",
        Value,
        "this manager serves one certificate (--tls-cert-file): remove it",
    ),
    refused(
        "http2-max-streams-per-connection",
        Value,
        "this manager keeps its HTTP/2 server's own stream limit: remove it",
    ),
    only(
        "disable-http2-serving",
        Bool,
        is_false,
        "this manager serves HTTP/2 (ALPN h2) and is accepted only at false: remove it",
    ),
    refused(
        "permit-port-sharing",
        Bool,
        "this manager binds its port alone (no SO_REUSEPORT): remove it",
    ),
    refused(
        "permit-address-sharing",
        Bool,
        "this manager binds its address with the platform's defaults: remove it",
    ),
    // Profiling and leader migration (k8s.io/controller-manager).
    only(
        "profiling",
        Bool,
        is_false,
        "this manager has no /debug/pprof and is accepted only at false: remove it, and profile with perf",
    ),
    only(
        "contention-profiling",
        Bool,
        is_false,
        "this manager has no /debug/pprof and is accepted only at false: remove it",
    ),
    only(
        "enable-leader-migration",
        Bool,
        is_false,
        "leader migration from kube-controller-manager is not implemented (migrate from an out-of-tree manager through the shared Lease, docs/migrating.md); accepted only at false",
    ),
    refused(
        "leader-migration-config",
        Value,
        "leader migration from kube-controller-manager is not implemented: remove it (docs/migrating.md)",
    ),
    refused(
        "controller-start-interval",
        Value,
        "this manager starts its controllers together: remove it",
    ),
    refused(
        "min-resync-period",
        Value,
        "this manager's caches do not re-list on a timer: remove it",
    ),
    refused(
        "node-sync-period",
        Value,
        "deprecated and a no-op in upstream's manager: remove it",
    ),
    refused(
        "external-cloud-volume-plugin",
        Value,
        "a no-op in upstream's external manager too: remove it",
    ),
    // Logging (k8s.io/component-base).
    refused(
        "vmodule",
        Value,
        "use RUST_LOG for per-module levels (-v stays): remove it",
    ),
    refused(
        "log-flush-frequency",
        Value,
        "this manager's log lines are written as they come: remove it",
    ),
    refused(
        "log-text-info-buffer-size",
        Value,
        "this manager's log lines are written as they come: remove it",
    ),
    refused(
        "log-text-split-stream",
        Bool,
        "this manager writes its log to one stream: remove it",
    ),
    // Webhook serving (k8s.io/cloud-provider options/webhook.go): only "no webhook".
    only(
        "webhooks",
        Value,
        no_webhooks,
        "this manager serves no webhooks (upstream's CloudControllerManagerWebhook gate is alpha and its manager ships none): accepted only empty or '*', which enable none",
    ),
    only(
        "webhook-secure-port",
        Value,
        port_zero,
        "this manager serves no webhooks (upstream's CloudControllerManagerWebhook gate is alpha and its manager ships none): accepted only at 0, upstream's \"don't serve webhooks at all\"",
    ),
    refused("webhook-bind-address", Value, NO_WEBHOOKS),
    only("webhook-cert-dir", Value, is_empty, NO_WEBHOOKS_EMPTY),
    only("webhook-tls-cert-file", Value, is_empty, NO_WEBHOOKS_EMPTY),
    only(
        "webhook-tls-private-key-file",
        Value,
        is_empty,
        NO_WEBHOOKS_EMPTY,
    ),
    only(
        "webhook-tls-cipher-suites",
        Value,
        is_empty,
        NO_WEBHOOKS_EMPTY,
    ),
    only(
        "webhook-tls-curve-preferences",
        Value,
        is_empty,
        NO_WEBHOOKS_EMPTY,
    ),
    only(
        "webhook-tls-min-version",
        Value,
        is_empty,
        NO_WEBHOOKS_EMPTY,
    ),
    only(
        "webhook-tls-sni-cert-key",
        Value,
        is_empty,
        NO_WEBHOOKS_EMPTY,
    ),
    only(
        "webhook-disable-http2-serving",
        Bool,
        is_false,
        NO_WEBHOOKS_FALSE,
    ),
];

/// The message a refused value gets: why, and what to do.
fn refusal(flag: &UpstreamFlag) -> String {
    format!(
        "--{} is upstream's, not implemented by this manager: {}",
        flag.name, flag.why
    )
}

/// Adds every flag, hidden, to `command`.
pub(crate) fn add(mut command: Command) -> Command {
    for flag in FLAGS {
        let message = refusal(flag);
        let accepts = flag.accepts;
        let mut arg = Arg::new(flag.name)
            .long(flag.name)
            .hide(true)
            .action(ArgAction::Set)
            .value_parser(move |value: &str| {
                if accepts(value) {
                    Ok(())
                } else {
                    Err(message.clone())
                }
            });
        arg = match flag.kind {
            Kind::Bool => arg
                .value_name("BOOL")
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true"),
            Kind::Value => arg
                .value_name("VALUE")
                .num_args(0..=1)
                .default_missing_value(""),
        };
        command = command.arg(arg);
    }
    command
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::app::Options;

    fn parse(args: &[&str]) -> Result<(), String> {
        add(Options::command())
            .try_get_matches_from(std::iter::once("ccm").chain(args.iter().copied()))
            .map(|_| ())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn the_command_stays_well_formed() {
        add(Options::command()).debug_assert();
    }

    #[test]
    fn every_flag_is_refused_by_name_with_why_unless_at_its_one_value() {
        let accepted: &[&str] = &[
            "--webhooks=",
            "--webhooks=*",
            "--webhook-secure-port=0",
            "--webhook-cert-dir=",
            "--webhook-tls-cert-file=",
            "--webhook-tls-curve-preferences=",
            "--webhook-disable-http2-serving=false",
            "--profiling=false",
            "--contention-profiling=0",
            "--enable-leader-migration=false",
            "--disable-http2-serving=false",
            "--tls-min-version=VersionTLS12",
        ];
        for args in accepted {
            assert_eq!(parse(&[args]), Ok(()), "{args}");
        }
        assert_eq!(
            parse(&["--webhooks", "", "--webhook-secure-port", "0"]),
            Ok(())
        );

        let refused: &[(&str, &str)] = &[
            ("--webhooks=foo", "serves no webhooks"),
            ("--webhooks=*,-foo", "serves no webhooks"),
            ("--webhook-secure-port=10260", "accepted only at 0"),
            ("--webhook-bind-address=0.0.0.0", "serves no webhooks"),
            ("--webhook-tls-cert-file=/x.crt", "serves no webhooks"),
            ("--webhook-tls-curve-preferences=23", "serves no webhooks"),
            ("--webhook-disable-http2-serving", "serves no webhooks"),
            ("--profiling", "no /debug/pprof"),
            ("--profiling=true", "no /debug/pprof"),
            ("--cert-dir=/tmp", "--tls-cert-file"),
            ("--cert-dir", "--tls-cert-file"),
            ("--authentication-kubeconfig=/k", "TokenReview"),
            (
                "--tls-min-version=VersionTLS13",
                "accepted only at VersionTLS12",
            ),
            ("--vmodule=x=4", "RUST_LOG"),
            ("--log-text-split-stream", "one stream"),
        ];
        for (arg, why) in refused {
            let err = parse(&[arg]).unwrap_err();
            let name = arg.split('=').next().unwrap();
            assert!(
                err.contains(&format!(
                    "{name} is upstream's, not implemented by this manager"
                )),
                "{arg}: {err}"
            );
            assert!(err.contains(why), "{arg}: {err}");
        }
    }

    #[test]
    fn none_is_one_of_ours() {
        let ours: Vec<String> = Options::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        for flag in FLAGS {
            assert!(!ours.iter().any(|o| o == flag.name), "{}", flag.name);
        }
    }
}
