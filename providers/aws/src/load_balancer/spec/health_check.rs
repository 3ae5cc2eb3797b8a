//! The load balancer's health check read from the Service: upstream's defaults for each kind and
//! traffic policy (kube-proxy's health-check node port for `Local`), and the annotations that override
//! them.

use super::*;

/// A health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP`, `HTTPS` (or `SSL`, Classic only).
    pub protocol: String,
    /// A node port, or `traffic-port` (NLB).
    pub port: String,
    /// The path for HTTP(S); empty for TCP.
    pub path: String,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds to wait for an answer.
    pub timeout: i32,
    /// Successes before healthy.
    pub healthy_threshold: i32,
    /// Failures before unhealthy.
    pub unhealthy_threshold: i32,
}

/// The health check, as upstream builds it: NLB — TCP on the traffic port (interval 30 s, timeout
/// 10 s, thresholds 3), or with `externalTrafficPolicy: Local` HTTP on the health-check node port at
/// `/healthz` (10 s, 10 s, 2, 2); Classic — TCP on the first node port, or HTTP on the health-check node
/// port (interval 10 s, timeout 5 s, healthy 2, unhealthy 6). The healthcheck-* annotations override.
///
/// With the shared probe (`ClusterServiceLoadBalancerHealthProbeMode = Shared`), a Service without
/// `externalTrafficPolicy: Local` is checked with HTTP on the shared port and path instead, in
/// upstream's order: a Classic ELB starts from it and its protocol, port and path annotations still
/// override it; an NLB's protocol, port and path annotations are overridden by it.
pub(super) fn health_check(
    service: &Service,
    kind: Kind,
    first_listed: Option<&Port>,
    tls: &Tls,
    probe: &ClusterHealthProbe,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<HealthCheck, Error> {
    let first_node_port = first_listed.map(|p| p.node_port).unwrap_or(0);
    let local = service_helpers::health_check_path_port(service);
    let shared = match (probe, local) {
        (ClusterHealthProbe::Shared { port, path }, None) => Some((*port, path.as_str())),
        _ => None,
    };
    let mut hc = defaults(kind, local, shared, tls, first_node_port);
    if let Some(protocol) =
        service_annotation(service, ANNOTATION_HC_PROTOCOL).filter(|v| !v.is_empty())
    {
        set_protocol(&mut hc, kind, protocol, bad)?;
    }
    if hc.protocol.starts_with("HTTP")
        && let Some(path) =
            service_annotation(service, ANNOTATION_HC_PATH).filter(|v| !v.is_empty())
    {
        hc.path = path.to_owned();
    }
    if let Some(port) = service_annotation(service, ANNOTATION_HC_PORT).filter(|v| !v.is_empty()) {
        set_port(&mut hc, kind, local.is_some(), first_node_port, port, bad)?;
    }
    if let (Kind::Nlb, Some((port, path))) = (kind, shared) {
        hc.protocol = "HTTP".into();
        hc.port = port.to_string();
        hc.path = path.to_owned();
    }
    set_numbers(&mut hc, service, bad)?;
    Ok(hc)
}

/// Upstream's health check before the annotations: by kind, for a `Local` Service (kube-proxy's
/// health-check node port and path), with the shared probe, or on the first node port.
fn defaults(
    kind: Kind,
    local: Option<(&str, i32)>,
    shared: Option<(u16, &str)>,
    tls: &Tls,
    first_node_port: i32,
) -> HealthCheck {
    match (kind, local) {
        (Kind::Nlb, None) => HealthCheck {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: String::new(),
            interval: 30,
            timeout: 10,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
        },
        (Kind::Nlb, Some((path, port))) => HealthCheck {
            protocol: "HTTP".into(),
            port: port.to_string(),
            path: path.into(),
            interval: 10,
            timeout: 10,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        },
        (Kind::Classic, local) => HealthCheck {
            protocol: match (local, shared, tls.backend_protocol.as_deref()) {
                (Some(_), _, _) | (None, Some(_), _) => "HTTP",
                // As upstream: SSL when the nodes speak TLS, whether or not a listener terminates it.
                (None, None, Some("https" | "ssl")) => "SSL",
                (None, None, _) => "TCP",
            }
            .into(),
            port: match (local, shared) {
                (Some((_, port)), _) => port,
                (None, Some((port, _))) => i32::from(port),
                (None, None) => first_node_port,
            }
            .to_string(),
            path: match (local, shared) {
                (Some((path, _)), _) | (None, Some((_, path))) => path.to_owned(),
                (None, None) => String::new(),
            },
            interval: 10,
            timeout: 5,
            healthy_threshold: 2,
            unhealthy_threshold: 6,
        },
    }
}

/// The `healthcheck-protocol` annotation: one the kind supports; HTTP(S) checks a path (`/` unless
/// one is set), the others none.
fn set_protocol(
    hc: &mut HealthCheck,
    kind: Kind,
    protocol: &str,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<(), Error> {
    let upper = protocol.to_ascii_uppercase();
    let allowed: &[&str] = match kind {
        Kind::Nlb => &["TCP", "HTTP", "HTTPS"],
        Kind::Classic => &["TCP", "HTTP", "HTTPS", "SSL"],
    };
    if !allowed.contains(&upper.as_str()) {
        return Err(bad(
            ANNOTATION_HC_PROTOCOL,
            format!("Unsupported health check protocol {protocol}"),
        ));
    }
    if upper.starts_with("HTTP") && hc.path.is_empty() {
        hc.path = "/".into();
    }
    if !upper.starts_with("HTTP") {
        hc.path.clear();
    }
    hc.protocol = upper;
    Ok(())
}

/// The `healthcheck-port` annotation: a port number, or `traffic-port`, which upstream's Classic ELB
/// reads as the port it started from (the shared probe's too), except that a `Local` Service is then
/// checked on its first node port.
fn set_port(
    hc: &mut HealthCheck,
    kind: Kind,
    local: bool,
    first_node_port: i32,
    port: &str,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<(), Error> {
    if port == "traffic-port" {
        match (kind, local) {
            (Kind::Nlb, _) => hc.port = "traffic-port".into(),
            (Kind::Classic, true) => hc.port = first_node_port.to_string(),
            (Kind::Classic, false) => {}
        }
        return Ok(());
    }
    let n: u16 = port.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
        bad(
            ANNOTATION_HC_PORT,
            format!("{port:?} is neither a port number nor traffic-port"),
        )
    })?;
    hc.port = n.to_string();
    Ok(())
}

/// The interval, timeout and thresholds annotations, each a whole number in AWS's range.
fn set_numbers(
    hc: &mut HealthCheck,
    service: &Service,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<(), Error> {
    for (key, field, range) in [
        (ANNOTATION_HC_INTERVAL, &mut hc.interval, 5..=300),
        (ANNOTATION_HC_TIMEOUT, &mut hc.timeout, 2..=120),
        (ANNOTATION_HC_HEALTHY, &mut hc.healthy_threshold, 2..=10),
        (ANNOTATION_HC_UNHEALTHY, &mut hc.unhealthy_threshold, 2..=10),
    ] {
        if let Some(v) = service_annotation(service, key).filter(|v| !v.is_empty()) {
            let n: i32 = v
                .parse()
                .map_err(|_| bad(key, format!("{v:?} is not a whole number")))?;
            if !range.contains(&n) {
                return Err(bad(
                    key,
                    format!("{n} is outside {}..={}", range.start(), range.end()),
                ));
            }
            *field = n;
        }
    }
    Ok(())
}
