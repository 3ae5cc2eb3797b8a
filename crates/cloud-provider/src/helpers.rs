//! Helpers every provider needs: the default load-balancer name and provider IDs.

use std::{fmt, time::Duration};

use k8s_openapi::api::core::v1::Service;

use crate::{CloudError, CloudProvider, CloudResult};

/// The default load-balancer name of a Service: `"a"` followed by the Service's UID without dashes,
/// cut to 32 characters (upstream `cloudprovider.DefaultLoadBalancerName`).
///
/// The leading letter suits clouds that need names to start with one; the 32-character cut suits
/// clouds with short name limits.
///
/// ```
/// # use k8s_openapi::api::core::v1::Service;
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
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (examples: 20ms, 1.5s, 1m30s)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad());
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    // As Go: a duration is an int64 of nanoseconds, about 292 years; anything longer is refused
    // (and a number too long for f64 is infinite, which `Duration::from_secs_f64` would panic on).
    if !total.is_finite() || total > MAX_GO_DURATION_SECONDS {
        return Err(format!(
            "invalid duration {text:?}: out of range (at most 2562047h47m16.854775807s, as in Go)"
        ));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Go's longest duration, `math.MaxInt64` nanoseconds, in seconds.
const MAX_GO_DURATION_SECONDS: f64 = i64::MAX as f64 / 1e9;

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
