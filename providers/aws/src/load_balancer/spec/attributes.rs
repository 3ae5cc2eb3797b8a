//! The attributes read from the Service: a Classic ELB's (access log, connection draining, idle timeout,
//! cross-zone), PROXY protocol, and an NLB's target-group attributes.

use super::*;

/// A Classic ELB's attributes as upstream sets them on every sync: its defaults (access log and
/// connection draining off, a 60 s idle timeout, cross-zone off) unless an annotation says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicAttributes {
    /// `access-log-enabled`.
    pub access_log: bool,
    /// `access-log-emit-interval` (minutes), when set.
    pub access_log_interval: Option<i32>,
    /// `access-log-s3-bucket-name`, when set.
    pub access_log_bucket: Option<String>,
    /// `access-log-s3-bucket-prefix`, when set.
    pub access_log_prefix: Option<String>,
    /// `connection-draining-enabled`.
    pub draining: bool,
    /// `connection-draining-timeout` (seconds), when set.
    pub draining_timeout: Option<i32>,
    /// `connection-idle-timeout` (seconds; 60 unless set).
    pub idle_timeout: i32,
    /// `cross-zone-load-balancing-enabled`.
    pub cross_zone: bool,
}

/// The NLB target-group attributes: AWS's defaults for instance targets, then the annotation's values,
/// validated as upstream validates them (`error validating target group attributes: …`).
pub(super) fn target_group_attributes(
    service: &Service,
    ports: &[Port],
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<BTreeMap<String, bool>, Error> {
    let mut attributes: BTreeMap<String, bool> = [
        (PRESERVE_CLIENT_IP.to_owned(), true),
        (PROXY_PROTOCOL_V2.to_owned(), false),
    ]
    .into();
    let Some(value) =
        service_annotation(service, ANNOTATION_TARGET_GROUP_ATTRIBUTES).filter(|v| !v.is_empty())
    else {
        return Ok(attributes);
    };
    let invalid = |message: String| {
        bad(
            ANNOTATION_TARGET_GROUP_ATTRIBUTES,
            format!("error validating target group attributes: {message}"),
        )
    };
    for (key, text) in key_values(value) {
        if !attributes.contains_key(&key) {
            return Err(invalid(format!(
                "the attribute {key:?} is not supported by the controller or is invalid"
            )));
        }
        let on = match text.as_str() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(invalid(format!(
                    "invalid value {text:?} for {key:?}: true or false"
                )));
            }
        };
        if key == PRESERVE_CLIENT_IP && !on && ports.iter().any(|p| p.protocol == "UDP") {
            return Err(invalid(
                "client IP preservation can't be disabled for UDP ports".to_owned(),
            ));
        }
        attributes.insert(key, on);
    }
    Ok(attributes)
}

/// `aws-load-balancer-cross-zone-load-balancing-enabled`, when set.
pub(super) fn cross_zone_of(
    service: &Service,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<Option<bool>, Error> {
    Ok(match service_annotation(service, ANNOTATION_CROSS_ZONE) {
        None | Some("") => None,
        Some(v) => Some(
            parse_bool(v)
                .ok_or_else(|| bad(ANNOTATION_CROSS_ZONE, format!("{v:?} is not a boolean")))?,
        ),
    })
}

/// Whether the backends get a PROXY protocol header (`aws-load-balancer-proxy-protocol: "*"`).
pub(super) fn proxy_protocol_of(
    service: &Service,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<bool, Error> {
    Ok(
        match service_annotation(service, ANNOTATION_PROXY_PROTOCOL) {
            None | Some("") => false,
            Some("*") => true,
            Some(other) => {
                return Err(bad(
                    ANNOTATION_PROXY_PROTOCOL,
                    format!(
                        "annotation {ANNOTATION_PROXY_PROTOCOL:?}={other:?} detected, but the only value supported currently is '*'"
                    ),
                ));
            }
        },
    )
}

pub(super) fn classic_attributes(
    service: &Service,
    cross_zone: Option<bool>,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<ClassicAttributes, Error> {
    let set = |key: &str| service_annotation(service, key).filter(|v| !v.is_empty());
    let parse_error = |key: &str, value: &str| {
        bad(
            key,
            format!("error parsing service annotation: {key}={value}"),
        )
    };
    let flag = |key: &str| -> Result<bool, Error> {
        match set(key) {
            None => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(|| parse_error(key, v)),
        }
    };
    let number = |key: &str| -> Result<Option<i32>, Error> {
        set(key)
            .map(|v| v.parse::<i32>().map_err(|_| parse_error(key, v)))
            .transpose()
    };
    Ok(ClassicAttributes {
        access_log: flag(ANNOTATION_ACCESS_LOG_ENABLED)?,
        access_log_interval: number(ANNOTATION_ACCESS_LOG_INTERVAL)?,
        access_log_bucket: set(ANNOTATION_ACCESS_LOG_BUCKET).map(str::to_owned),
        access_log_prefix: set(ANNOTATION_ACCESS_LOG_PREFIX).map(str::to_owned),
        draining: flag(ANNOTATION_DRAINING_ENABLED)?,
        draining_timeout: number(ANNOTATION_DRAINING_TIMEOUT)?,
        idle_timeout: number(ANNOTATION_IDLE_TIMEOUT)?.unwrap_or(60),
        cross_zone: cross_zone.unwrap_or(false),
    })
}
