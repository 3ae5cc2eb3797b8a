//! Value parsers for a provider's own flags (`#[arg(value_parser = ...)]`), reading values as the
//! manager's own flags do: Go's formats, as upstream's flags take them.
//!
//! ```
//! use std::time::Duration;
//! use cloud_provider::{clap, flag_values};
//!
//! #[derive(Debug, Clone, clap::Args)]
//! struct AcmeFlags {
//!     /// How often to look.
//!     #[arg(long, default_value = "1m", value_parser = flag_values::positive_go_duration)]
//!     acme_period: Duration,
//!     /// Whether to look at all (`--acme-enabled=false`; a bool flag takes a value with
//!     /// `ArgAction::Set`).
//!     #[arg(long, action = clap::ArgAction::Set, default_value = "true", value_parser = flag_values::go_bool)]
//!     acme_enabled: bool,
//! }
//! # use clap::{Args, FromArgMatches};
//! # let matches = AcmeFlags::augment_args(clap::Command::new("t"))
//! #     .try_get_matches_from(["t", "--acme-period", "1m30s", "--acme-enabled", "F"]).unwrap();
//! # let flags = AcmeFlags::from_arg_matches(&matches).unwrap();
//! # assert_eq!(flags.acme_period, Duration::from_secs(90));
//! # assert!(!flags.acme_enabled);
//! ```

use std::time::Duration;

/// A boolean as Go's `strconv.ParseBool` reads it (upstream's flags): `1`, `t`, `T`, `TRUE`, `true`,
/// `True`, and `0`, `f`, `F`, `FALSE`, `false`, `False`.
pub fn go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("not a boolean (true, false, 1, 0, t, f, TRUE, FALSE, True, False)".to_owned()),
    }
}

/// A duration in Go's syntax (`5s`, `1m30s`, `500ms`; `0` and `0s` are zero): [`crate::parse_go_duration`].
pub fn go_duration(text: &str) -> Result<Duration, String> {
    crate::parse_go_duration(text)
}

/// A duration in Go's syntax that must be above zero.
pub fn positive_go_duration(text: &str) -> Result<Duration, String> {
    let duration = crate::parse_go_duration(text)?;
    if duration.is_zero() {
        return Err("must be greater than 0".to_owned());
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_and_durations_read_as_go_reads_them() {
        for (text, want) in [
            ("1", Some(true)),
            ("True", Some(true)),
            ("F", Some(false)),
            ("yes", None),
            ("", None),
        ] {
            assert_eq!(go_bool(text).ok(), want, "{text:?}");
        }
        assert_eq!(go_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(positive_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(
            positive_go_duration("0").unwrap_err(),
            "must be greater than 0"
        );
        assert!(
            positive_go_duration("5").is_err(),
            "a number without a unit is refused, as Go does"
        );
    }
}
