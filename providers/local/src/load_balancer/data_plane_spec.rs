//! The data plane's spec of a Service's load balancer ([`build_spec`]) and what the running data
//! plane differs from it in ([`listener_differences`]).

use std::{collections::BTreeSet, net::IpAddr};

use local_data_plane::{Backend, ListenerSpec, LoadBalancerSpec};

use super::*;

/// The data plane's spec for `name` with `vips`.
pub(crate) fn build_spec(
    name: &str,
    vips: &[IpAddr],
    wanted: &Wanted,
    nodes: &[(String, Vec<IpAddr>)],
) -> LoadBalancerSpec {
    let mut listeners: Vec<ListenerSpec> = vips
        .iter()
        .flat_map(|vip| {
            wanted
                .ports
                .iter()
                .map(move |(port, protocol, node_port)| ListenerSpec {
                    vip: *vip,
                    port: *port,
                    protocol: *protocol,
                    node_port: *node_port,
                })
        })
        .collect();
    listeners.sort();
    LoadBalancerSpec {
        name: name.to_owned(),
        listeners,
        backends: backend_list(nodes),
        health_check: wanted.health_check.clone(),
        session_affinity: wanted.session_affinity,
        source_ranges: wanted.source_ranges.clone(),
        proxy_protocol: wanted.proxy_protocol,
    }
}

/// The backends of the nodes' addresses, sorted (so equal sets compare equal).
pub(super) fn backend_list(nodes: &[(String, Vec<IpAddr>)]) -> Vec<Backend> {
    let backends: BTreeSet<(String, IpAddr)> = nodes
        .iter()
        .flat_map(|(name, ips)| ips.iter().map(move |ip| (name.clone(), *ip)))
        .collect();
    backends
        .into_iter()
        .map(|(node, address)| Backend { node, address })
        .collect()
}

/// What differs between `spec` and what the data plane runs for it (listeners not running or failed,
/// listeners it should not run), in words; empty when it runs exactly `spec`'s listeners.
pub(crate) fn listener_differences(
    spec: &LoadBalancerSpec,
    running: Option<&local_data_plane::LoadBalancerState>,
) -> Vec<String> {
    let Some(running) = running else {
        return vec!["the data plane runs no load balancer for it".into()];
    };
    let words = |l: &ListenerSpec| format!("{:?} {}", l.protocol, l.socket_addr());
    let bound: BTreeSet<&ListenerSpec> = running.listeners.iter().map(|l| &l.spec).collect();
    let mut out = Vec::new();
    for (listener, why) in &running.failed_listeners {
        out.push(format!("the listener {} failed: {why}", words(listener)));
    }
    for listener in &spec.listeners {
        if !bound.contains(listener) && !running.failed_listeners.iter().any(|(f, _)| f == listener)
        {
            out.push(format!("the listener {} is not running", words(listener)));
        }
    }
    for listener in bound {
        if !spec.listeners.contains(listener) {
            out.push(format!("the listener {} should not run", words(listener)));
        }
    }
    out
}
