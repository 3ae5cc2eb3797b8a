//! Helpers every provider needs: the default load-balancer name and provider IDs.

use std::{fmt, time::Duration};

use k8s_openapi::api::core::v1::{Node, Service};

use crate::{CloudError, CloudProvider, CloudResult};

/// The default load-balancer name of a Service: `"a"` followed by the Service's UID without dashes,
/// cut to 32 characters (upstream `cloudprovider.DefaultLoadBalancerName`).
///
/// The leading letter suits clouds that need names to start with one; the 32-character cut suits
/// clouds with short name limits.
///
/// ```
/// # use k8s_openapi::api::core::v1::{Node, Service};
/// # use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
/// let svc = Service {
///     metadata: ObjectMeta { uid: Some("12345678-90ab-cdef-1234-567890abcdef".into()), ..Default::default() },
///     ..Default::default()
/// };
/// assert_eq!(cloud_provider::default_load_balancer_name(&svc), "a1234567890abcdef1234567890abcde");
/// ```
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    let mut name: String = std::iter::once('a')
        .chain(uid.chars().filter(|c| *c != '-'))
        .collect();
    if name.len() > 32 {
        // The UID is ASCII, so cutting at a byte index is cutting at a character.
        let cut = (0..=32)
            .rev()
            .find(|i| name.is_char_boundary(*i))
            .unwrap_or(0);
        name.truncate(cut);
    }
    name
}

/// A parsed provider ID, `<provider>://<instance>`: for example `fake://node-a` or
/// `aws:///us-east-1a/i-0123` (whose instance part is `/us-east-1a/i-0123`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderId {
    provider: String,
    instance: String,
}

/// Why a string is not a provider ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderIdError {
    /// There is no `://` separator.
    #[error("provider ID {0:?} is not of the form <provider>://<instance>")]
    MissingSeparator(String),
    /// Nothing stands before `://`.
    #[error("provider ID {0:?} has an empty provider name")]
    EmptyProvider(String),
    /// Nothing stands after `://`.
    #[error("provider ID {0:?} has an empty instance part")]
    EmptyInstance(String),
    /// The provider part is not the expected provider.
    #[error("provider ID {id:?} belongs to provider {found:?}, not {expected:?}")]
    WrongProvider {
        /// The whole ID.
        id: String,
        /// The provider this ID names.
        found: String,
        /// The provider that was expected.
        expected: String,
    },
}

impl ProviderId {
    /// Builds `<provider>://<instance>`.
    pub fn new(provider: impl Into<String>, instance: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            instance: instance.into(),
        }
    }

    /// Parses `<provider>://<instance>`; both parts must be non-empty.
    pub fn parse(id: &str) -> Result<Self, ProviderIdError> {
        let (provider, instance) = id
            .split_once("://")
            .ok_or_else(|| ProviderIdError::MissingSeparator(id.to_owned()))?;
        if provider.is_empty() {
            return Err(ProviderIdError::EmptyProvider(id.to_owned()));
        }
        if instance.is_empty() {
            return Err(ProviderIdError::EmptyInstance(id.to_owned()));
        }
        Ok(Self::new(provider, instance))
    }

    /// Parses an ID and checks that it belongs to `provider`.
    pub fn parse_for(provider: &str, id: &str) -> Result<Self, ProviderIdError> {
        let parsed = Self::parse(id)?;
        if parsed.provider != provider {
            return Err(ProviderIdError::WrongProvider {
                id: id.to_owned(),
                found: parsed.provider,
                expected: provider.to_owned(),
            });
        }
        Ok(parsed)
    }

    /// The provider part (before `://`).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The instance part (after `://`).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The instance `node` stands for in `provider`'s cloud: its provider ID's instance when it has
    /// one, else its name (a node registers before the cloud node controller names its instance).
    /// `None` for a node whose provider ID is another provider's or malformed.
    ///
    /// ```
    /// # use k8s_openapi::api::core::v1::{Node, NodeSpec};
    /// # use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    /// use cloud_provider::ProviderId;
    /// let node = |id: Option<&str>| Node {
    ///     metadata: ObjectMeta { name: Some("worker-1".into()), ..Default::default() },
    ///     spec: Some(NodeSpec { provider_id: id.map(Into::into), ..Default::default() }),
    ///     ..Default::default()
    /// };
    /// assert_eq!(ProviderId::instance_of_node("acme", &node(None)).as_deref(), Some("worker-1"));
    /// assert_eq!(ProviderId::instance_of_node("acme", &node(Some("acme://i-1"))).as_deref(), Some("i-1"));
    /// assert_eq!(ProviderId::instance_of_node("acme", &node(Some("other://i-1"))), None);
    /// ```
    pub fn instance_of_node(provider: &str, node: &Node) -> Option<String> {
        match node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|id| !id.is_empty())
        {
            Some(id) => Self::parse_for(provider, id).ok().map(|id| id.instance),
            None => node.metadata.name.clone(),
        }
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.provider, self.instance)
    }
}

impl std::str::FromStr for ProviderId {
    type Err = ProviderIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The provider ID of `node_name` through the legacy [`Instances`](crate::Instances) API: `<provider
/// name>://<instance id>` (upstream `cloudprovider.GetInstanceProviderID`).
///
/// [`CloudError::NotImplemented`] and [`CloudError::InstanceNotFound`] pass through unchanged; other
/// errors are wrapped. As upstream, an empty instance ID yields `"<provider>://"`.
pub async fn get_instance_provider_id(
    cloud: &dyn CloudProvider,
    node_name: &str,
) -> CloudResult<String> {
    let instances = cloud
        .instances()
        .ok_or_else(|| CloudError::other("failed to get instances from cloud provider"))?;
    match instances.instance_id(node_name).await {
        Ok(id) => Ok(format!("{}://{}", cloud.provider_name(), id)),
        Err(err @ (CloudError::NotImplemented | CloudError::InstanceNotFound)) => Err(err),
        Err(err) => Err(CloudError::with_source(
            "failed to get instance ID from cloud provider",
            err,
        )),
    }
}

/// Parses a duration as Go's `time.ParseDuration` does (`20ms`, `1.5s`, `1m30s`, `0`), the syntax of
/// upstream flags and of many providers' configs.
///
/// Go's syntax, not humantime's: fractions and unit sequences without spaces, hence our own few lines.
/// Go's arithmetic too: whole nanoseconds in 64 bits, so `2562047h47m16.854775807s` (Go's longest
/// duration) parses exactly and anything longer is refused. A sign is refused: a `Duration` cannot be
/// negative.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("invalid duration {text:?}{why} (examples: 20ms, 1.5s, 1m30s)");
    let out_of_range = || {
        format!(
            "invalid duration {text:?}: out of range (at most 2562047h47m16.854775807s, as in Go)"
        )
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad(""));
    }
    let mut rest = text;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let (nanos, after) = go_duration_term(rest).map_err(|e| match e {
            GoDurationError::Syntax(why) => bad(&why),
            GoDurationError::OutOfRange => out_of_range(),
        })?;
        rest = after;
        total = total
            .checked_add(nanos)
            .filter(|t| *t <= GO_DURATION_LIMIT)
            .ok_or_else(out_of_range)?;
    }
    if total > GO_DURATION_LIMIT - 1 {
        return Err(out_of_range());
    }
    Ok(Duration::from_nanos(total))
}

/// What is wrong with a term of a Go duration.
#[derive(Debug, PartialEq)]
enum GoDurationError {
    /// Not Go's syntax; what follows the quoted text in the message (`""`, `": missing unit"`, …).
    Syntax(String),
    /// More than 2^63 nanoseconds.
    OutOfRange,
}

/// The first term of `text`, `[0-9]*(\.[0-9]*)?` and a unit, in nanoseconds (at most 2^63 and an
/// hour's worth of fraction), with the text after it.
fn go_duration_term(text: &str) -> Result<(u64, &str), GoDurationError> {
    if !text.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
        return Err(GoDurationError::Syntax(String::new()));
    }
    let (whole, whole_len) = go_whole_part(text).ok_or(GoDurationError::OutOfRange)?;
    let mut rest = &text[whole_len..];
    let (mut fraction, mut scale, mut fraction_len) = (0u64, 1f64, 0);
    if let Some(after_dot) = rest.strip_prefix('.') {
        (fraction, scale, fraction_len) = go_fraction_part(after_dot);
        rest = &after_dot[fraction_len..];
    }
    if whole_len == 0 && fraction_len == 0 {
        return Err(GoDurationError::Syntax(String::new()));
    }
    let unit_len = rest
        .find(|c: char| c == '.' || c.is_ascii_digit())
        .unwrap_or(rest.len());
    let unit = go_unit(&rest[..unit_len]).map_err(GoDurationError::Syntax)?;
    if whole > GO_DURATION_LIMIT / unit {
        return Err(GoDurationError::OutOfRange);
    }
    let mut nanos = whole * unit;
    if fraction > 0 {
        // As Go: a float64 keeps fractions of hours nanosecond-accurate (the product is at most
        // 3.6e12, an hour in nanoseconds); `as` cannot overflow here.
        nanos += (fraction as f64 * (unit as f64 / scale)) as u64;
    }
    Ok((nanos, &rest[unit_len..]))
}

/// The whole part that `text` starts with, `[0-9]*`, and its length; `None` past 2^63, as Go.
fn go_whole_part(text: &str) -> Option<(u64, usize)> {
    let len = text.bytes().take_while(u8::is_ascii_digit).count();
    let mut whole: u64 = 0;
    for digit in text[..len].bytes() {
        whole = whole
            .checked_mul(10)
            .and_then(|w| w.checked_add(u64::from(digit - b'0')))
            .filter(|w| *w <= GO_DURATION_LIMIT)?;
    }
    Some((whole, len))
}

/// The fraction digits that `after_dot` starts with: their value, the power of ten it is to be
/// divided by, and how many there are. As Go, digits past 64 bits of precision are dropped.
fn go_fraction_part(after_dot: &str) -> (u64, f64, usize) {
    let len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
    let (mut fraction, mut scale) = (0u64, 1f64);
    let mut overflow = false;
    for digit in after_dot[..len].bytes() {
        if overflow || fraction > (GO_DURATION_LIMIT - 1) / 10 {
            overflow = true;
            continue;
        }
        let next = fraction * 10 + u64::from(digit - b'0');
        if next > GO_DURATION_LIMIT {
            overflow = true;
            continue;
        }
        fraction = next;
        scale *= 10.0;
    }
    (fraction, scale, len)
}

/// The nanoseconds in one Go duration `unit`; what is wrong with it, as the message's tail.
fn go_unit(unit: &str) -> Result<u64, String> {
    match unit {
        "" => Err(": missing unit".to_owned()),
        "ns" => Ok(1),
        "us" | "\u{b5}s" | "\u{3bc}s" => Ok(1_000),
        "ms" => Ok(1_000_000),
        "s" => Ok(1_000_000_000),
        "m" => Ok(60_000_000_000),
        "h" => Ok(3_600_000_000_000),
        other => Err(format!(": unknown unit {other:?}")),
    }
}

/// 2^63 nanoseconds: one more than Go's longest duration (`math.MaxInt64` nanoseconds, about 292
/// years), the bound Go's parser checks its partial sums against.
const GO_DURATION_LIMIT: u64 = 1 << 63;

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn service_with_uid(uid: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn load_balancer_name_is_a_plus_uid_without_dashes_cut_to_32() {
        let svc = service_with_uid("12345678-90ab-cdef-1234-567890abcdef");
        let name = default_load_balancer_name(&svc);
        assert_eq!(name, "a1234567890abcdef1234567890abcde");
        assert_eq!(name.len(), 32);
        assert_eq!(
            default_load_balancer_name(&service_with_uid("ab-cd")),
            "aabcd"
        );
        assert_eq!(default_load_balancer_name(&Service::default()), "a");
    }

    #[test]
    fn go_durations() {
        let d = parse_go_duration;
        assert_eq!(d("0"), Ok(Duration::ZERO));
        assert_eq!(d("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(d("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(d("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(d("250us"), Ok(Duration::from_micros(250)));
        assert!(d("").is_err() && d("10").is_err() && d("5 ms").is_err() && d("ms").is_err());
        assert_eq!(
            d("fast").unwrap_err(),
            r#"invalid duration "fast" (examples: 20ms, 1.5s, 1m30s)"#
        );
    }

    #[test]
    fn go_durations_past_go_s_range_are_refused_not_panics() {
        let d = parse_go_duration;
        assert_eq!(d("2562047h"), Ok(Duration::from_secs(2562047 * 3600)));
        for text in [
            "18446744073709551616s",
            "2562048h",
            "1e400s",
            &format!("{}s", "9".repeat(400)),
        ] {
            let err = d(text).unwrap_err();
            assert!(
                err.contains("out of range") || err.contains("invalid duration"),
                "{text}: {err}"
            );
        }
        assert!(
            d("18446744073709551616s")
                .unwrap_err()
                .contains("out of range")
        );
    }

    #[test]
    fn go_durations_are_exact_nanoseconds_up_to_go_s_limit() {
        // With f64 seconds, the nanoseconds of long durations were lost, and up to ~0.6 µs past Go's
        // limit was accepted.
        let d = parse_go_duration;
        assert_eq!(
            d("2562047h47m16.854775807s"),
            Ok(Duration::new(9_223_372_036, 854_775_807))
        );
        assert!(
            d("2562047h47m16.854775808s")
                .unwrap_err()
                .contains("out of range")
        );
        assert_eq!(d("2562047h1ns"), Ok(Duration::new(2_562_047 * 3600, 1)));
        assert_eq!(d("1h0.000000001s"), Ok(Duration::new(3600, 1)));
        assert_eq!(d(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(d("1.s"), Ok(Duration::from_secs(1)));
        assert_eq!(d("1.5µs"), Ok(Duration::from_nanos(1500)));
        assert!(d(".s").is_err() && d("1..5s").is_err() && d("+1s").is_err());
        assert!(d("10").unwrap_err().contains("missing unit"));
        assert!(d("5d").unwrap_err().contains(r#"unknown unit "d""#));
    }

    #[test]
    fn go_duration_parts_read_as_go_reads_them() {
        for (text, expected) in [
            ("", Some((0, 0))),
            ("15m", Some((15, 2))),
            ("9223372036854775808s", Some((1 << 63, 19))),
            ("9223372036854775809s", None),
        ] {
            assert_eq!(go_whole_part(text), expected, "{text}");
        }
        for (after_dot, expected) in [
            ("s", (0, 1.0, 0)),
            ("25s", (25, 100.0, 2)),
            // Past 64 bits of precision, digits are counted but dropped.
            (
                "12345678901234567890123s",
                (1_234_567_890_123_456_789, 1e19, 23),
            ),
        ] {
            assert_eq!(go_fraction_part(after_dot), expected, "{after_dot}");
        }
        for (unit, expected) in [
            ("ns", Ok(1)),
            ("\u{3bc}s", Ok(1_000)),
            ("h", Ok(3_600_000_000_000)),
            ("", Err(": missing unit".to_owned())),
            ("d", Err(": unknown unit \"d\"".to_owned())),
        ] {
            assert_eq!(go_unit(unit), expected, "{unit:?}");
        }
        for (text, expected) in [
            ("1m30s", Ok((60_000_000_000, "30s"))),
            ("1.5h", Ok((5_400_000_000_000, ""))),
            (".s", Err(GoDurationError::Syntax(String::new()))),
            ("-1s", Err(GoDurationError::Syntax(String::new()))),
            ("2562048h", Err(GoDurationError::OutOfRange)),
        ] {
            assert_eq!(go_duration_term(text), expected, "{text}");
        }
    }

    #[test]
    fn provider_ids_parse_and_print() {
        let id = ProviderId::parse("fake://node-a").unwrap();
        assert_eq!(id.provider(), "fake");
        assert_eq!(id.instance(), "node-a");
        assert_eq!(id.to_string(), "fake://node-a");
        let aws: ProviderId = "aws:///us-east-1a/i-0123".parse().unwrap();
        assert_eq!(aws.instance(), "/us-east-1a/i-0123");
        assert_eq!(aws.to_string(), "aws:///us-east-1a/i-0123");
    }

    #[test]
    fn malformed_provider_ids_say_what_is_wrong() {
        assert_eq!(
            ProviderId::parse("node-a"),
            Err(ProviderIdError::MissingSeparator("node-a".into()))
        );
        assert_eq!(
            ProviderId::parse("://x"),
            Err(ProviderIdError::EmptyProvider("://x".into()))
        );
        assert_eq!(
            ProviderId::parse("fake://"),
            Err(ProviderIdError::EmptyInstance("fake://".into()))
        );
        let err = ProviderId::parse_for("fake", "aws://i-1").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"provider ID "aws://i-1" belongs to provider "aws", not "fake""#
        );
        assert!(ProviderId::parse_for("fake", "fake://n").is_ok());
    }
}
