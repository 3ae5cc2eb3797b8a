//! The Service's ports as the load balancer's: protocols each kind accepts, node ports, names.

use super::*;

/// A Service's ports as the load balancer reads them ([`ports_of`]).
pub(super) struct ServicePorts {
    /// Those with a node port, sorted.
    pub(super) ports: Vec<Port>,
    /// (port, name, protocol) of each, in the Service's order: `ssl-ports` names ports by either.
    pub(super) named: Vec<(i32, String, String)>,
    /// The first as the Service lists it (upstream's health check uses it).
    pub(super) first_listed: Option<Port>,
}

/// The Service's ports, each of a protocol the load balancer's kind carries; refused when none has a node
/// port, when protocols are mixed, or with a session affinity.
pub(super) fn ports_of(
    spec: &ServiceSpec,
    kind: Kind,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<ServicePorts, Error> {
    let mut ports = Vec::new();
    // (port, name) of each port, in the Service's order: `ssl-ports` names ports by either.
    let mut named = Vec::new();
    let service_ports = spec.ports.clone().unwrap_or_default();
    if service_ports.len() > 1
        && service_ports.iter().any(|p| {
            p.protocol.as_deref().unwrap_or("TCP")
                != service_ports[0].protocol.as_deref().unwrap_or("TCP")
        })
    {
        return Err(bad(
            "spec.ports",
            "mixed protocol is not supported for LoadBalancer".into(),
        ));
    }
    if let Some(affinity) = spec
        .session_affinity
        .as_deref()
        .filter(|a| !a.is_empty() && *a != "None")
    {
        return Err(bad(
            "spec.sessionAffinity",
            format!("unsupported load balancer affinity: {affinity}"),
        ));
    }
    for p in service_ports {
        let protocol = p.protocol.unwrap_or_else(|| "TCP".to_owned());
        match (kind, protocol.as_str()) {
            (_, "TCP") | (Kind::Nlb, "UDP") => {}
            _ => {
                return Err(bad(
                    "spec.ports",
                    format!(
                        "port {}: protocol {protocol} is not supported by this load balancer type",
                        p.port
                    ),
                ));
            }
        }
        let Some(node_port) = p.node_port.filter(|n| *n != 0) else {
            // Upstream ignores ports without a node port.
            continue;
        };
        named.push((p.port, p.name.clone().unwrap_or_default(), protocol.clone()));
        ports.push(Port {
            port: p.port,
            protocol,
            node_port,
        });
    }
    // Upstream's health check uses the first port as listed; the ports are kept sorted.
    let first_listed = ports.first().cloned();
    ports.sort();
    if ports.is_empty() {
        return Err(bad(
            "spec.ports",
            "requested load balancer with no ports".into(),
        ));
    }
    Ok(ServicePorts {
        ports,
        named,
        first_listed,
    })
}
