use std::{net::IpAddr, sync::Arc, time::Duration};

use cloud_provider::{LoadBalancer, LoadBalancerPreview, service_helpers::IpFamily};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::{Api, api::ListParams};
use local_data_plane::{HealthCheck, LoadBalancerSpec, Protocol};

use crate::{Config, LocalCloud, instances::lock};

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, ServiceSpec, ServiceStatus, SessionAffinityConfig,
};
use serde_json::json;

use super::*;

fn svc(value: serde_json::Value) -> Service {
    let mut base = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 8080, "nodePort": 30080, "protocol": "TCP"}]}
    });
    merge(&mut base, value);
    serde_json::from_value(base).unwrap()
}

fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

fn config(yaml: &str) -> Config {
    Config::parse(yaml, None).unwrap()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn a_plain_service_reads_as_one_tcp_port_checked_on_kube_proxy() {
    let wanted = read_service(&svc(json!({})), &Config::default()).unwrap();
    assert_eq!(wanted.families, vec![(IpFamily::V4, true)]);
    assert_eq!(wanted.ports, vec![(8080, Protocol::Tcp, 30080)]);
    assert_eq!(
        wanted.health_check,
        Some(HealthCheck {
            port: 10256,
            path: "/healthz".into()
        })
    );
    assert!(wanted.source_ranges.is_empty(), "allow-all is no filter");
    assert!(!wanted.proxy_protocol && wanted.session_affinity.is_none());
}

#[test]
fn metallb_s_annotations_are_read_as_ours() {
    let config = Config::parse(
        "addressPools: [{name: gold, addresses: [127.52.0.0/24]}]\n",
        None,
    )
    .unwrap();
    for prefix in ["metallb.io", "metallb.universe.tf"] {
        let service = svc(json!({"metadata": {"annotations": {
            format!("{prefix}/loadBalancerIPs"): "127.52.0.7",
            format!("{prefix}/address-pool"): "gold",
            format!("{prefix}/allow-shared-ip"): "k",
            // MetalLB's own output: neither read nor refused.
            format!("{prefix}/ip-allocated-from-pool"): "gold",
        }}}));
        let wanted = read_service(&service, &config).unwrap();
        assert_eq!(
            wanted.requested.values().copied().collect::<Vec<_>>(),
            ["127.52.0.7".parse::<IpAddr>().unwrap()],
            "{prefix}"
        );
        assert_eq!(wanted.pool.as_deref(), Some("gold"), "{prefix}");
        assert_eq!(
            wanted.sharing.map(|s| s.key).as_deref(),
            Some("k"),
            "{prefix}"
        );
    }
    for (annotations, wanted) in [
        (
            json!({ANNOTATION_ADDRESS_POOL: "gold", "metallb.io/address-pool": "silver"}),
            "local.ccm.rs/address-pool says \"gold\" and metallb.io/address-pool says \"silver\"",
        ),
        (
            json!({"metallb.io/loadBalancerIPs": "x"}),
            "metallb.io/loadBalancerIPs: \"x\" is not an IP address",
        ),
        (
            json!({"metallb.universe.tf/address-pool": "lead"}),
            "there is no address pool \"lead\"",
        ),
        (
            json!({"metallb.io/bgp-communities": "a"}),
            "metallb.io/bgp-communities: a MetalLB annotation local does not read",
        ),
    ] {
        let service = svc(json!({"metadata": {"annotations": annotations}}));
        let err = read_service(&service, &config).unwrap_err();
        assert!(err.contains(wanted), "{err}\n  lacks {wanted}");
    }
    // The same value under two spellings is one setting.
    let service = svc(json!({"metadata": {"annotations": {
        ANNOTATION_ADDRESS_POOL: "gold", "metallb.io/address-pool": "gold"}}}));
    assert_eq!(
        read_service(&service, &config).unwrap().pool.as_deref(),
        Some("gold")
    );
}

#[test]
fn metallb_s_pools_leave_the_traffic_to_kube_proxy_by_default() {
    let mut config = Config::parse("loadBalancer: {mode: agents}\n", None).unwrap();
    config.metallb_pools = true;
    let plain = svc(json!({}));
    assert_eq!(
        read_service(&plain, &config).unwrap().data_path,
        DataPath::KubeProxy
    );
    for (annotations, wanted) in [
        (json!({ANNOTATION_DATA_PATH: "proxy"}), DataPath::Proxy),
        // PROXY protocol, which only the data plane sends.
        (json!({ANNOTATION_PROXY_PROTOCOL: "v2"}), DataPath::Proxy),
    ] {
        let service = svc(json!({"metadata": {"annotations": annotations}}));
        assert_eq!(read_service(&service, &config).unwrap().data_path, wanted);
    }
    config.metallb_pools = false;
    assert_eq!(
        read_service(&plain, &config).unwrap().data_path,
        DataPath::Proxy
    );
}

#[test]
fn local_traffic_affinity_ranges_and_proxy() {
    let mut service = svc(json!({
        "metadata": {"annotations": {ANNOTATION_PROXY_PROTOCOL: "v2"}},
        "spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                 "sessionAffinity": "ClientIP", "loadBalancerSourceRanges": ["127.0.0.0/24"],
                 "ports": [{"port": 53, "nodePort": 30053, "protocol": "UDP"}, {"port": 53, "nodePort": 30054, "protocol": "TCP"}]}
    }));
    let wanted = read_service(&service, &Config::default()).unwrap();
    assert_eq!(
        wanted.health_check,
        Some(HealthCheck {
            port: 31000,
            path: "/healthz".into()
        })
    );
    assert_eq!(wanted.session_affinity, Some(Duration::from_secs(10_800)));
    assert_eq!(wanted.source_ranges, vec!["127.0.0.0/24".parse().unwrap()]);
    assert!(wanted.proxy_protocol);
    assert_eq!(
        wanted.ports,
        vec![(53, Protocol::Tcp, 30054), (53, Protocol::Udp, 30053)]
    );
    service.spec.as_mut().unwrap().session_affinity_config = Some(SessionAffinityConfig {
        client_ip: Some(ClientIPConfig {
            timeout_seconds: Some(60),
        }),
    });
    assert_eq!(
        read_service(&service, &Config::default())
            .unwrap()
            .session_affinity,
        Some(Duration::from_secs(60))
    );
}

#[test]
fn bad_input_is_named() {
    let cases = [
        (
            json!({"metadata": {"annotations": {ANNOTATION_PROXY_PROTOCOL: "v1"}}}),
            "local.ccm.rs/proxy-protocol: \"v1\" is not valid",
        ),
        (
            json!({"metadata": {"annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.240.0.300"}}}),
            "local.ccm.rs/load-balancer-ips: \"127.240.0.300\" is not an IP address",
        ),
        (
            json!({"metadata": {"annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.240.0.3,127.240.0.4"}}}),
            "two IPv4 addresses",
        ),
        (
            json!({"spec": {"loadBalancerIP": "fd00::1"}}),
            "spec.loadBalancerIP: fd00::1 is an IPv6 address but the Service's IP families are [IPv4]",
        ),
        (
            json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "gold"}}}),
            "there is no address pool \"gold\" (pools: default)",
        ),
        (
            json!({"metadata": {"annotations": {"service.beta.kubernetes.io/load-balancer-source-ranges": "nope"}}}),
            "load-balancer-source-ranges: nope is not valid",
        ),
        (
            json!({"spec": {"ports": [{"port": 9, "protocol": "SCTP", "nodePort": 30009}]}}),
            "TCP and UDP only",
        ),
        (
            json!({"spec": {"ports": [{"port": 9, "protocol": "TCP"}]}}),
            "has no node port",
        ),
    ];
    for (patch, expected) in cases {
        let err = read_service(&svc(patch), &Config::default()).unwrap_err();
        assert!(err.contains(expected), "{err} lacks {expected}");
    }
}

#[test]
fn node_ports_are_needed_by_the_proxy_data_path_only() {
    let config = Config::parse("loadBalancer:\n  mode: agents\n", None).unwrap();
    let without_node_ports = |data_path: &str| {
        svc(json!({
            "metadata": {"annotations": {ANNOTATION_DATA_PATH: data_path}},
            "spec": {"allocateLoadBalancerNodePorts": false, "ports": [
                {"port": 80, "protocol": "TCP"}, {"port": 8080, "protocol": "TCP", "nodePort": 30080}]}
        }))
    };
    let wanted = read_service(&without_node_ports("kube-proxy"), &config).unwrap();
    assert_eq!(
        wanted.ports,
        [(80, Protocol::Tcp, 0), (8080, Protocol::Tcp, 30080)],
        "kube-proxy carries the VIP's traffic: no node port needed, a missing one is 0"
    );
    let err = read_service(&without_node_ports("proxy"), &config).unwrap_err();
    assert!(
        err.contains("port 80/TCP has no node port") && err.contains("kube-proxy needs none"),
        "{err}"
    );
}

fn dual(policy: &str, families: &[&str]) -> Service {
    svc(json!({"spec": {"ipFamilyPolicy": policy, "ipFamilies": families}}))
}

/// What an ensure allocates for `service` (under `key`) with `config`.
fn allocate_for(
    allocations: &mut Allocations,
    config: &Config,
    key: &str,
    service: &Service,
) -> Result<Vec<IpAddr>, String> {
    let wanted = read_service(service, config)?;
    allocations.allocate(
        config,
        key,
        service.metadata.uid.as_deref(),
        &wanted,
        &published_ips(service),
    )
}

/// A sharing key spans one namespace: a Service of another namespace with the same key gets an
/// address of its own, and asking for the holder's address is refused with a reason that names
/// neither the holder nor its key; a pool with `crossNamespaceSharing: true` lets it in.
#[test]
fn a_sharing_key_spans_one_namespace_unless_the_pool_says_otherwise() {
    let in_ns = |namespace: &str, port: u16, ask: bool| {
        let mut annotations = json!({ANNOTATION_ALLOW_SHARED_IP: "k"});
        if ask {
            annotations[ANNOTATION_LOAD_BALANCER_IPS] = json!("127.52.0.1");
        }
        svc(json!({
            "metadata": {"namespace": namespace, "annotations": annotations},
            "spec": {"ports": [{"port": port, "nodePort": 30000 + port, "protocol": "TCP"}]}
        }))
    };
    for (cross, want) in [(false, None), (true, Some("127.52.0.1"))] {
        let config = config(&format!(
            "addressPools:\n  - {{name: a, addresses: [127.52.0.1-127.52.0.3], crossNamespaceSharing: {cross}}}\n"
        ));
        let mut allocations = Allocations::default();
        let victim = allocate_for(
            &mut allocations,
            &config,
            "victim/web",
            &in_ns("victim", 443, false),
        );
        assert_eq!(victim.unwrap(), ips(&["127.52.0.1"]));
        // The same key from another namespace, picking: its own address unless the pool shares.
        let picked = allocate_for(
            &mut allocations,
            &config,
            "tenant/x",
            &in_ns("tenant", 80, false),
        );
        assert_eq!(
            picked.unwrap(),
            ips(&[want.unwrap_or("127.52.0.2")]),
            "crossNamespaceSharing: {cross}"
        );
        allocations.release("tenant/x");
        // Asking for the victim's address.
        let asked = allocate_for(
            &mut allocations,
            &config,
            "tenant/x",
            &in_ns("tenant", 80, true),
        );
        match want {
            Some(ip) => assert_eq!(asked.unwrap(), ips(&[ip])),
            None => {
                let err = asked.unwrap_err();
                assert_eq!(
                    err,
                    "the requested address 127.52.0.1 is taken: a Service of another namespace \
                     holds it, and its pool shares addresses within one namespace only \
                     (crossNamespaceSharing)"
                );
                assert!(!err.contains("victim") && !err.contains("\"k\""), "{err}");
            }
        }
    }
    // Another namespace's holder without the key is not named either.
    let config = config("addressPools:\n  - {name: a, addresses: [127.52.0.1-127.52.0.3]}\n");
    let mut allocations = Allocations::default();
    let plain = svc(json!({"metadata": {"namespace": "victim"}}));
    allocate_for(&mut allocations, &config, "victim/web", &plain).unwrap();
    let ask = svc(
        json!({"metadata": {"namespace": "tenant", "annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.52.0.1"}}}),
    );
    let err = allocate_for(&mut allocations, &config, "tenant/x", &ask).unwrap_err();
    assert!(
        err.contains(": a Service of another namespace holds it"),
        "{err}"
    );
}

/// Services with one `allow-shared-ip` key, distinct ports and the same traffic policy share an
/// address, picked or asked for; any other pair does not, and the refusal says why; a shared
/// address is free again only when its last Service goes.
#[test]
fn services_with_one_sharing_key_and_distinct_ports_share_an_address() {
    let config = config("addressPools:\n  - {name: a, addresses: [127.52.0.1-127.52.0.3]}\n");
    let mut allocations = Allocations::default();
    let shared = |key: &str, port: u16, extra: serde_json::Value| {
        let mut service = json!({
            "metadata": {"annotations": {ANNOTATION_ALLOW_SHARED_IP: key}},
            "spec": {"ports": [{"port": port, "nodePort": 30000 + port, "protocol": "TCP"}]}
        });
        merge(&mut service, extra);
        svc(service)
    };
    let none = json!({});
    let web = allocate_for(
        &mut allocations,
        &config,
        "ns/web",
        &shared("k", 80, none.clone()),
    );
    assert_eq!(web.unwrap(), ips(&["127.52.0.1"]));
    // Same key, another port: the same address.
    let tls = allocate_for(
        &mut allocations,
        &config,
        "ns/tls",
        &shared("k", 443, none.clone()),
    );
    assert_eq!(tls.unwrap(), ips(&["127.52.0.1"]));
    // Same port, another key, no key: other addresses.
    let clash = allocate_for(
        &mut allocations,
        &config,
        "ns/clash",
        &shared("k", 80, none.clone()),
    );
    assert_eq!(clash.unwrap(), ips(&["127.52.0.2"]));
    let other = allocate_for(
        &mut allocations,
        &config,
        "ns/other",
        &shared("j", 8080, none.clone()),
    );
    assert_eq!(other.unwrap(), ips(&["127.52.0.3"]));
    // Asked for by address: refused with the reason.
    let ask = |extra: serde_json::Value| {
        let mut service =
            json!({"metadata": {"annotations": {ANNOTATION_LOAD_BALANCER_IPS: "127.52.0.1"}}});
        merge(&mut service, extra);
        service
    };
    for (service, why) in [
        (
            svc(ask(json!({}))),
            "Service ns/tls holds it (Services share an address only with the same local.ccm.rs/allow-shared-ip)",
        ),
        (
            shared("j", 8081, ask(json!({}))),
            "Service ns/tls holds it with another local.ccm.rs/allow-shared-ip key",
        ),
        (shared("k", 443, ask(json!({}))), "uses port 443/TCP too"),
        (
            shared(
                "k",
                8443,
                ask(
                    json!({"spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000, "selector": {"app": "x"}}}),
                ),
            ),
            "another externalTrafficPolicy",
        ),
    ] {
        let err = allocate_for(&mut allocations, &config, "ns/asker", &service).unwrap_err();
        assert!(
            err.starts_with("the requested address 127.52.0.1 is taken: "),
            "{err}"
        );
        assert!(err.contains(why), "{err}");
    }
    let joined = allocate_for(
        &mut allocations,
        &config,
        "ns/asker",
        &shared("k", 8443, ask(json!({}))),
    );
    assert_eq!(joined.unwrap(), ips(&["127.52.0.1"]));
    // The address stays held while one of its Services does.
    allocations.release("ns/web");
    allocations.release("ns/tls");
    assert!(allocations.held_by_another("127.52.0.1".parse().unwrap(), "ns/web"));
    allocations.release("ns/asker");
    assert!(
        !allocations
            .owners
            .contains_key(&"127.52.0.1".parse().unwrap())
    );
    // An empty key is refused, naming the annotation.
    let err = read_service(&shared("", 80, none), &config).unwrap_err();
    assert!(
        err.contains("local.ccm.rs/allow-shared-ip: the sharing key is empty"),
        "{err}"
    );
}

const DUAL_POOLS: &str = "addressPools:\n  - {name: a, addresses: [127.50.0.1-127.50.0.2, 'fd00:50::/126']}\n  - {name: b, addresses: [127.51.0.0/30], autoAssign: false}\n";

#[test]
fn a_dual_stack_service_takes_both_addresses_from_one_pool_when_one_can() {
    // `v4` is preferred for IPv4 but has no IPv6; `both` has both: MetalLB's rule takes both from
    // `both`. Once `both` has no IPv4 left, each family comes from its own most preferred pool.
    let config = config(
        "addressPools:\n  - {name: v4, addresses: [127.52.0.1-127.52.0.2], priority: 1}\n  - {name: both, addresses: [127.53.0.1-127.53.0.1, 'fd00:53::/126']}\n",
    );
    let mut allocations = Allocations::default();
    let require = dual("RequireDualStack", &["IPv4", "IPv6"]);
    assert_eq!(
        allocate_for(&mut allocations, &config, "ns/a", &require).unwrap(),
        ips(&["127.53.0.1", "fd00:53::1"])
    );
    assert_eq!(
        allocate_for(&mut allocations, &config, "ns/b", &require).unwrap(),
        ips(&["127.52.0.1", "fd00:53::2"])
    );
    // A single-stack Service still takes the most preferred pool of its family.
    assert_eq!(
        allocate_for(
            &mut allocations,
            &config,
            "ns/c",
            &dual("SingleStack", &["IPv4"])
        )
        .unwrap(),
        ips(&["127.52.0.2"])
    );
}

#[test]
fn families_pools_and_requests() {
    let config = config(DUAL_POOLS);
    let mut allocations = Allocations::default();
    let allocate = |allocations: &mut Allocations, key: &str, service: &Service| {
        allocate_for(allocations, &config, key, service)
    };
    // IPv6 first when the Service says so; both families when it requires dual-stack.
    assert_eq!(
        allocate(
            &mut allocations,
            "ns/a",
            &dual("RequireDualStack", &["IPv6", "IPv4"])
        )
        .unwrap(),
        ips(&["fd00:50::1", "127.50.0.1"])
    );
    // Idempotent.
    assert_eq!(
        allocate(
            &mut allocations,
            "ns/a",
            &dual("RequireDualStack", &["IPv6", "IPv4"])
        )
        .unwrap(),
        ips(&["fd00:50::1", "127.50.0.1"])
    );
    assert_eq!(
        allocate(&mut allocations, "ns/b", &dual("SingleStack", &["IPv4"])).unwrap(),
        ips(&["127.50.0.2"])
    );
    // IPv4 is exhausted: a PreferDualStack Service gets IPv6 alone, a SingleStack one an error
    // that names the pool, and nothing changes for it.
    assert_eq!(
        allocate(
            &mut allocations,
            "ns/c",
            &dual("PreferDualStack", &["IPv6", "IPv4"])
        )
        .unwrap(),
        ips(&["fd00:50::2"])
    );
    let err = allocate(&mut allocations, "ns/d", &dual("SingleStack", &["IPv4"])).unwrap_err();
    assert_eq!(err, "no free IPv4 address: pool(s) a are exhausted");
    assert!(!allocations.services.contains_key("ns/d"));
    // A pool kept out of auto-assignment serves those who name it.
    let named = svc(json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "b"}}}));
    assert_eq!(
        allocate(&mut allocations, "ns/d", &named).unwrap(),
        ips(&["127.51.0.1"])
    );
    // A requested address: taken, outside the pools, free.
    let asks = |ip: &str| svc(json!({"spec": {"loadBalancerIP": ip}}));
    assert_eq!(
        allocate(&mut allocations, "ns/e", &asks("127.50.0.2")).unwrap_err(),
        "the requested address 127.50.0.2 is taken: Service ns/b holds it (Services share an address only with the same local.ccm.rs/allow-shared-ip)"
    );
    assert!(
        allocate(&mut allocations, "ns/e", &asks("127.9.9.9"))
            .unwrap_err()
            .starts_with("the requested address 127.9.9.9 is in no address pool (a: ")
    );
    assert_eq!(
        allocate(&mut allocations, "ns/e", &asks("127.51.0.2")).unwrap(),
        ips(&["127.51.0.2"])
    );
    // Moving to another requested address frees the first.
    assert_eq!(
        allocate(&mut allocations, "ns/e", &asks("127.51.0.1")).unwrap_err(),
        "the requested address 127.51.0.1 is taken: Service ns/d holds it (Services share an address only with the same local.ccm.rs/allow-shared-ip)"
    );
    allocations.release("ns/d");
    assert_eq!(
        allocate(&mut allocations, "ns/e", &asks("127.51.0.1")).unwrap(),
        ips(&["127.51.0.1"])
    );
    assert!(
        !allocations
            .owners
            .contains_key(&"127.51.0.2".parse().unwrap())
    );
}

/// Issue #30: pools limited to namespaces and Service labels serve only those Services, whether
/// they are picked, named by annotation or asked for by address; another Service gets an error that
/// says why (a Warning event on it), and a Service whose labels leave a pool's scope moves out of it.
#[test]
fn pools_serve_only_the_namespaces_and_labels_they_are_limited_to() {
    let config = config(
        "addressPools:\n  - {name: shop, addresses: [127.60.0.1/32], namespaces: [ns], serviceSelector: {matchLabels: {tier: edge}}}\n  - {name: rest, addresses: [127.61.0.1-127.61.0.2], namespaces: [ns, other]}\n",
    );
    let mut allocations = Allocations::default();
    let allocate = |allocations: &mut Allocations, key: &str, service: &Service| {
        allocate_for(allocations, &config, key, service)
    };
    let edge = |namespace: &str, extra: serde_json::Value| {
        let mut patch = json!({"metadata": {"namespace": namespace, "labels": {"tier": "edge"}}});
        merge(&mut patch, extra);
        svc(patch)
    };
    // The first pool serves labelled Services of ns; an unlabelled one gets the next pool.
    assert_eq!(
        allocate(&mut allocations, "ns/a", &edge("ns", json!({}))).unwrap(),
        ips(&["127.60.0.1"])
    );
    assert_eq!(
        allocate(&mut allocations, "ns/b", &svc(json!({}))).unwrap(),
        ips(&["127.61.0.1"])
    );
    // Another namespace: not the first pool even by name or address, and no pool at all from a
    // namespace neither serves.
    assert_eq!(
        allocate(
            &mut allocations,
            "other/c",
            &edge(
                "other",
                json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "shop"}}})
            )
        )
        .unwrap_err(),
        "local.ccm.rs/address-pool: pool \"shop\" serves the namespaces ns only, and this Service is in namespace \"other\", labels tier=edge"
    );
    assert_eq!(
        allocate(
            &mut allocations,
            "other/c",
            &edge("other", json!({"spec": {"loadBalancerIP": "127.60.0.1"}}))
        )
        .unwrap_err(),
        "the requested address 127.60.0.1 is in pool \"shop\", which this Service may not use: pool \"shop\" serves the namespaces ns only"
    );
    assert_eq!(
        allocate(&mut allocations, "far/d", &edge("far", json!({}))).unwrap_err(),
        "no address pool with IPv4 addresses serves this Service (namespace \"far\", labels tier=edge): pool \"shop\" serves the namespaces ns only; pool \"rest\" serves the namespaces ns, other only"
    );
    assert!(!allocations.services.contains_key("far/d"));
    // A Service whose labels no longer match leaves the pool for one that serves it.
    assert_eq!(
        allocate(
            &mut allocations,
            "ns/a",
            &svc(json!({"metadata": {"namespace": "ns"}}))
        )
        .unwrap(),
        ips(&["127.61.0.2"])
    );
    assert!(
        !allocations
            .owners
            .contains_key(&"127.60.0.1".parse().unwrap())
    );
}

/// Issue #30: a Service that names no pool takes the pool with the lowest priority number that
/// serves it and has a free address, then the next; the pools without a priority come last, in the
/// file's order; sharers meet in the preferred pool; a named pool is taken whatever its priority.
#[test]
fn pools_are_tried_by_priority_then_in_the_files_order() {
    let config = config(
        "addressPools:\n  - {name: plain, addresses: [127.62.0.1/32]}\n  - {name: second, addresses: [127.63.0.1/32], priority: 20}\n  - {name: first, addresses: [127.64.0.1/32], priority: 10, namespaces: [ns]}\n  - {name: last, addresses: [127.65.0.1/32]}\n",
    );
    assert_eq!(
        config
            .pools_by_preference()
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["first", "second", "plain", "last"]
    );
    let mut allocations = Allocations::default();
    let in_ns = |extra: serde_json::Value| {
        let mut patch = json!({"metadata": {"namespace": "ns"}});
        merge(&mut patch, extra);
        svc(patch)
    };
    let cases = [
        // The first pool serves ns only: another namespace starts at the second.
        (
            "other/a",
            svc(json!({"metadata": {"namespace": "other"}})),
            "127.63.0.1",
        ),
        ("ns/b", in_ns(json!({})), "127.64.0.1"),
        // Both prioritized pools are full: the file's order.
        ("ns/c", in_ns(json!({})), "127.62.0.1"),
        ("ns/d", in_ns(json!({})), "127.65.0.1"),
    ];
    for (key, service, want) in &cases {
        assert_eq!(
            allocate_for(&mut allocations, &config, key, service).unwrap(),
            ips(&[want]),
            "{key}"
        );
    }
    // A Service that names a pool gets that pool only, whatever its rank (here: full).
    let named = in_ns(json!({"metadata": {"annotations": {ANNOTATION_ADDRESS_POOL: "plain"}}}));
    assert!(allocate_for(&mut allocations, &config, "ns/e", &named).is_err());
    // 0, which MetalLB reads as "none", is refused rather than taken as the first.
    let err = Config::parse(
        "addressPools: [{name: zero, addresses: [127.66.0.1/32], priority: 0}]\n",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("pool \"zero\": priority 0 is ambiguous"),
        "{err}"
    );
    let mut sharers = Allocations::default();
    let shared = |port: u16| {
        in_ns(json!({
            "metadata": {"annotations": {ANNOTATION_ALLOW_SHARED_IP: "k"}},
            "spec": {"ports": [{"port": port, "protocol": "TCP", "nodePort": 30000 + port}]}
        }))
    };
    assert_eq!(
        allocate_for(
            &mut sharers,
            &config,
            "ns/x",
            &svc(json!({"metadata": {"namespace": "ns"}}))
        )
        .unwrap(),
        ips(&["127.64.0.1"]),
        "an unshared Service takes the first pool"
    );
    assert_eq!(
        allocate_for(&mut sharers, &config, "ns/f", &shared(81)).unwrap(),
        ips(&["127.63.0.1"]),
        "a sharer cannot join an unshared Service: the next pool"
    );
    assert_eq!(
        allocate_for(&mut sharers, &config, "ns/g", &shared(82)).unwrap(),
        ips(&["127.63.0.1"]),
        "the second sharer meets the first"
    );
}

/// Issue #28: a manager serving `--load-balancer-class` keeps its classed Services' addresses over
/// a restart, and addresses another implementation's Services hold in this cloud's pools are not
/// handed out; what such a Service holds elsewhere is none of this cloud's business.
#[test]
fn the_addresses_reserved_at_start() {
    let config = config(DUAL_POOLS);
    let with = |patch: serde_json::Value, ips_: &[&str]| {
        let mut s = svc(patch);
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    ips_.iter()
                        .map(|ip| LoadBalancerIngress {
                            ip: Some(ip.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        s
    };
    let classed = json!({"spec": {"loadBalancerClass": "example.com/other"}});
    for (service, expected) in [
        (with(json!({}), &["127.50.0.2"][..]), &["127.50.0.2"][..]),
        (
            with(classed.clone(), &["127.51.0.1", "10.9.9.9"]),
            &["127.51.0.1"],
        ),
        (
            with(
                json!({"metadata": {"finalizers": [CLEANUP_FINALIZER]}, "spec": {"loadBalancerClass": "x"}}),
                &["10.9.9.9"],
            ),
            &["10.9.9.9"],
        ),
        (
            with(json!({"spec": {"type": "ClusterIP"}}), &["127.50.0.4"]),
            &[],
        ),
    ] {
        assert_eq!(
            addresses_to_reserve(&service, &config),
            ips(expected),
            "{:?}",
            service.spec
        );
    }
}

#[test]
fn a_restart_keeps_published_and_reserved_addresses() {
    let config = config(DUAL_POOLS);
    let mut allocations = Allocations::default();
    let mut published = svc(json!({}));
    published.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some("127.50.0.2".into()),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    // Reserved at start: another Service cannot get it.
    allocations.reserve(
        &config,
        "ns/web",
        Some("u1"),
        &ips(&["127.50.0.2"]),
        None,
        DataPath::Proxy,
    );
    let other = svc(json!({"metadata": {"name": "other", "uid": "u2"}}));
    let wanted = read_service(&other, &config).unwrap();
    assert_eq!(
        allocations
            .allocate(&config, "ns/other", Some("u2"), &wanted, &[])
            .unwrap(),
        ips(&["127.50.0.1"])
    );
    let wanted = read_service(&published, &config).unwrap();
    assert_eq!(
        allocations
            .allocate(
                &config,
                "ns/web",
                Some("u1"),
                &wanted,
                &published_ips(&published)
            )
            .unwrap(),
        ips(&["127.50.0.2"])
    );
    // Without the reservation (initialize not run), the status alone keeps the address.
    let mut fresh = Allocations::default();
    assert_eq!(
        fresh
            .allocate(
                &config,
                "ns/web",
                Some("u1"),
                &wanted,
                &published_ips(&published)
            )
            .unwrap(),
        ips(&["127.50.0.2"])
    );
}

#[test]
fn the_spec_has_a_listener_per_vip_and_port_and_the_nodes_internal_ips() {
    let service = dual("RequireDualStack", &["IPv4", "IPv6"]);
    let wanted = read_service(&service, &config(DUAL_POOLS)).unwrap();
    let node =
        |name: &str, ips: &[&str]| -> (String, Vec<IpAddr>) { (name.to_owned(), self::ips(ips)) };
    let spec = build_spec(
        "ns/web",
        &ips(&["127.50.0.1", "fd00:50::1"]),
        &wanted,
        &[
            node("n2", &["127.0.2.1", "fd00::2"]),
            node("n1", &["127.0.1.1"]),
            node("n3", &[]),
        ],
    );
    assert_eq!(spec.listeners.len(), 2);
    assert_eq!(spec.listeners[0].to_string(), "127.50.0.1:8080/TCP");
    assert_eq!(spec.listeners[1].to_string(), "[fd00:50::1]:8080/TCP");
    let backends: Vec<String> = spec
        .backends
        .iter()
        .map(|b| format!("{}={}", b.node, b.address))
        .collect();
    assert_eq!(backends, ["n1=127.0.1.1", "n2=127.0.2.1", "n2=fd00::2"]);
}

fn adopted_node(name: &str, ip: &str) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
        }))
        .unwrap(),
    )
}

fn applied(cloud: &LocalCloud) -> Option<LoadBalancerSpec> {
    lock(&cloud.inner.load_balancers)
        .services
        .get("ns/web")
        .and_then(|r| r.applied.clone())
}

/// The node sync hands `update_load_balancer` the copy of the Service it last synced: it may be
/// older than the last ensure, or than the Service's deletion.
#[tokio::test]
async fn load_balancers_are_listed_by_their_service_s_uid_and_an_orphan_deleted() {
    let cloud = LocalCloud::new(Config::default(), None);
    let web =
        svc(json!({"spec": {"ports": [{"port": 18778, "nodePort": 30778, "protocol": "TCP"}]}}));
    cloud
        .ensure_load_balancer("c", &web, &[adopted_node("n1", "127.0.9.1")])
        .await
        .unwrap();
    let listed = cloud.list_load_balancers("c").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, cloud.get_load_balancer_name("c", &web));
    let reference = listed[0].service.clone().unwrap();
    assert_eq!(
        (reference.namespace.as_str(), reference.name.as_str()),
        (
            web.metadata.namespace.as_deref().unwrap_or("default"),
            web.metadata.name.as_deref().unwrap()
        )
    );
    cloud
        .delete_orphaned_load_balancer("c", &listed[0])
        .await
        .unwrap();
    assert!(cloud.list_load_balancers("c").await.unwrap().is_empty());
    assert!(
        applied(&cloud).is_none(),
        "the data plane no longer runs it"
    );
}

#[tokio::test]
async fn with_node_agents_the_manager_only_assigns_addresses_and_reports_the_data_path() {
    let agents = config("loadBalancer: {mode: agents}\n");
    let cloud = LocalCloud::new(agents.clone(), None);
    let proxied =
        svc(json!({"spec": {"ports": [{"port": 18778, "nodePort": 30778, "protocol": "TCP"}]}}));
    let direct = svc(json!({
        "metadata": {"name": "direct", "annotations": {ANNOTATION_DATA_PATH: "kube-proxy"}},
        "spec": {"ports": [{"port": 18779, "nodePort": 30779, "protocol": "TCP"}]}
    }));
    let node = adopted_node("n1", "127.0.9.1");
    let mode =
        |status: &LoadBalancerStatus| status.ingress.as_ref().unwrap()[0].ip_mode.clone().unwrap();
    let status = cloud
        .ensure_load_balancer("c", &proxied, std::slice::from_ref(&node))
        .await
        .unwrap();
    assert_eq!(mode(&status), "Proxy");
    let status = cloud
        .ensure_load_balancer("c", &direct, std::slice::from_ref(&node))
        .await
        .unwrap();
    assert_eq!(mode(&status), "VIP");
    // Nothing bound here: the agents serve.
    assert_eq!(cloud.data_plane_applies(), 0);
    assert!(cloud.data_plane().names().is_empty());
    cloud
        .update_load_balancer("c", &proxied, std::slice::from_ref(&node))
        .await
        .unwrap();
    assert_eq!(cloud.data_plane_applies(), 0);
    assert!(matches!(
        cloud
            .preview_load_balancer("c", &proxied, &[node])
            .await
            .unwrap(),
        LoadBalancerPreview::UpToDate
    ));

    // What is refused, and where.
    let leader = Config::default();
    let err = read_service(&direct, &leader).unwrap_err();
    assert!(
        err.contains("kube-proxy needs loadBalancer.mode: agents"),
        "{err}"
    );
    let both = svc(json!({"metadata": {"annotations": {
        ANNOTATION_DATA_PATH: "kube-proxy", ANNOTATION_PROXY_PROTOCOL: "v2"}}}));
    let err = read_service(&both, &agents).unwrap_err();
    assert!(err.contains("kube-proxy sends no PROXY header"), "{err}");
    let bogus = svc(json!({"metadata": {"annotations": {ANNOTATION_DATA_PATH: "ebpf"}}}));
    let err = read_service(&bogus, &agents).unwrap_err();
    assert!(
        err.contains("local.ccm.rs/data-path: \"ebpf\" is not valid"),
        "{err}"
    );
    // The leader mode's interface cannot go with the agents.
    let err = Config::parse("loadBalancer: {mode: agents, vipInterface: eth0}\n", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("vipInterface is the leader mode's"), "{err}");
    // Where the agents' heartbeats are: kube-system unless said; said, only with the agents.
    assert_eq!(agents.load_balancer.agent_namespace(), "kube-system");
    let elsewhere = Config::parse(
        "loadBalancer: {mode: agents, agentNamespace: lb-system}\n",
        None,
    )
    .unwrap();
    assert_eq!(elsewhere.load_balancer.agent_namespace(), "lb-system");
    for (yaml, why) in [
        (
            "loadBalancer: {agentNamespace: lb-system}\n",
            "loadBalancer.agentNamespace is the agents mode's",
        ),
        (
            "loadBalancer: {mode: agents, agentNamespace: LB}\n",
            "loadBalancer.agentNamespace: \"LB\" is not a namespace's name",
        ),
    ] {
        let err = Config::parse(yaml, None).unwrap_err().to_string();
        assert!(err.contains(why), "{yaml}: {err}");
    }
}

#[tokio::test]
async fn an_update_changes_only_backends_and_never_revives_a_deleted_load_balancer() {
    let cloud = LocalCloud::new(Config::default(), None);
    let old =
        svc(json!({"spec": {"ports": [{"port": 18777, "nodePort": 30777, "protocol": "TCP"}]}}));
    let new = svc(json!({"spec": {
        "ports": [{"port": 18777, "nodePort": 30777, "protocol": "TCP"}],
        "loadBalancerSourceRanges": ["10.0.0.0/8"]
    }}));
    let n1 = adopted_node("n1", "127.0.9.1");
    let n2 = adopted_node("n2", "127.0.9.2");
    cloud
        .ensure_load_balancer("c", &new, std::slice::from_ref(&n1))
        .await
        .unwrap();
    let ranges = applied(&cloud).unwrap().source_ranges;
    assert_eq!(ranges, vec!["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]);

    // A stale copy without source ranges: the backends change, the ranges stay.
    cloud
        .update_load_balancer("c", &old, &[n1.clone(), n2.clone()])
        .await
        .unwrap();
    let spec = applied(&cloud).unwrap();
    assert_eq!(
        spec.source_ranges, ranges,
        "a stale update loosened the source ranges"
    );
    assert_eq!(spec.backends.len(), 2);
    // The same backends again: no data-plane call.
    let applies = cloud
        .inner
        .applies
        .load(std::sync::atomic::Ordering::Relaxed);
    cloud
        .update_load_balancer("c", &old, &[n2.clone(), n1.clone()])
        .await
        .unwrap();
    assert_eq!(
        cloud
            .inner
            .applies
            .load(std::sync::atomic::Ordering::Relaxed),
        applies
    );

    // After the delete, an update still in flight creates nothing.
    cloud.ensure_load_balancer_deleted("c", &new).await.unwrap();
    cloud.update_load_balancer("c", &old, &[n1]).await.unwrap();
    assert!(cloud.get_load_balancer("c", &new).await.unwrap().is_none());
    assert!(cloud.data_plane().state("ns/web").is_none());
    assert!(applied(&cloud).is_none());
}

/// Issue #28, drift: the preview says what an ensure would change (nothing; a listener the data
/// plane lost; backends; a setting), and an ensure puts a lost listener back.
#[tokio::test]
async fn a_listener_lost_out_of_band_is_previewed_and_put_back() {
    let cloud = LocalCloud::new(Config::default(), None);
    let web =
        svc(json!({"spec": {"ports": [{"port": 18779, "nodePort": 30779, "protocol": "TCP"}]}}));
    let n1 = adopted_node("n1", "127.0.9.1");
    let n2 = adopted_node("n2", "127.0.9.2");
    let preview = |nodes: Vec<Arc<Node>>| {
        let cloud = &cloud;
        let web = &web;
        async move { cloud.preview_load_balancer("c", web, &nodes).await.unwrap() }
    };
    assert_eq!(
        preview(vec![n1.clone()]).await,
        LoadBalancerPreview::Create {
            backends: vec!["n1".into()]
        }
    );
    cloud
        .ensure_load_balancer("c", &web, std::slice::from_ref(&n1))
        .await
        .unwrap();
    assert_eq!(
        preview(vec![n1.clone()]).await,
        LoadBalancerPreview::UpToDate
    );
    match preview(vec![n1.clone(), n2.clone()]).await {
        LoadBalancerPreview::Change {
            backends_added,
            backends_removed,
            detail,
        } => {
            assert_eq!(backends_added, ["n2"]);
            assert!(backends_removed.is_empty());
            assert!(detail.is_empty(), "{detail}");
        }
        other => panic!("{other:?}"),
    }

    // The data plane loses the load balancer (as a crash of its listeners would).
    cloud.data_plane().remove("ns/web").await;
    match preview(vec![n1.clone()]).await {
        LoadBalancerPreview::Change { detail, .. } => assert_eq!(
            detail, "the data plane runs no load balancer for it",
            "{detail}"
        ),
        other => panic!("{other:?}"),
    }
    cloud
        .ensure_load_balancer("c", &web, std::slice::from_ref(&n1))
        .await
        .unwrap();
    let running = cloud.data_plane().state("ns/web").expect("running again");
    assert_eq!(running.listeners.len(), 1);
    assert_eq!(
        preview(vec![n1.clone()]).await,
        LoadBalancerPreview::UpToDate
    );

    // A setting of the Service that differs from what runs.
    let ranged = svc(json!({"spec": {
        "ports": [{"port": 18779, "nodePort": 30779, "protocol": "TCP"}],
        "loadBalancerSourceRanges": ["10.0.0.0/8"]
    }}));
    match cloud
        .preview_load_balancer("c", &ranged, std::slice::from_ref(&n1))
        .await
        .unwrap()
    {
        LoadBalancerPreview::Change { detail, .. } => {
            assert_eq!(detail, "the source ranges would change")
        }
        other => panic!("{other:?}"),
    }

    // Issue #30: its pool limited to another namespace: its address would change.
    let vip = cloud.get_load_balancer("c", &web).await.unwrap().unwrap();
    let vip = vip.ingress.unwrap()[0].ip.clone().unwrap();
    cloud.set_config(config(
        "addressPools: [{name: default, addresses: [127.240.0.0/16], namespaces: [elsewhere]}]\n",
    ));
    match preview(vec![n1.clone()]).await {
        LoadBalancerPreview::Change { detail, .. } => assert_eq!(
            detail,
            format!(
                "the address {vip} would change: pool \"default\" serves the namespaces elsewhere only"
            )
        ),
        other => panic!("{other:?}"),
    }
    cloud.ensure_load_balancer_deleted("c", &web).await.unwrap();
}

/// On a real interface (so this needs root, as CI runs). The pool is in TEST-NET-2: 192.0.2.0/24 is
/// the network of CI's own machine.
#[tokio::test]
async fn with_a_vip_interface_vips_go_on_it_and_come_off_with_their_load_balancer() {
    use crate::addresses::test_interface::TestInterface;
    let interface = TestInterface::create("l");
    let cloud = LocalCloud::new(
        config(&format!(
            "addressPools: [{{name: lan, addresses: [198.51.100.0/29]}}]\nloadBalancer: {{vipInterface: {}}}\n",
            interface.name()
        )),
        None,
    );
    let service =
        svc(json!({"spec": {"ports": [{"port": 18443, "nodePort": 30443, "protocol": "TCP"}]}}));
    let vip: IpAddr = "198.51.100.1".parse().unwrap();
    // The VIP goes on before the listener binds it (which would fail without it).
    cloud
        .ensure_load_balancer("c", &service, &[])
        .await
        .unwrap();
    assert!(interface.has(vip));
    assert!(cloud.data_plane().state("ns/web").is_some());
    cloud
        .ensure_load_balancer_deleted("c", &service)
        .await
        .unwrap();
    assert!(!interface.has(vip));
    // Loopback VIPs are never touched.
    let loopback = LocalCloud::new(
        config(&format!(
            "loadBalancer: {{vipInterface: {}}}\n",
            interface.name()
        )),
        None,
    );
    loopback
        .ensure_load_balancer("c", &service, &[])
        .await
        .unwrap();
    assert_eq!(interface.addresses(), []);
    loopback
        .ensure_load_balancer_deleted("c", &service)
        .await
        .unwrap();
}

/// A VIP put on `vipInterface` but not announced (a stand-in announcer fails as without
/// `CAP_NET_RAW`) is served all the same: the ensure succeeds, and the warning is a Warning event
/// `VIPNotAnnounced` on the Service, written with the manager's own (RBAC-limited) identity. Needs
/// root (a real interface) and the test control plane.
#[tokio::test]
async fn a_vip_not_announced_is_served_and_a_warning_event_on_its_service() {
    use crate::addresses::{
        AddressManager, announce_without_cap_net_raw, test_interface::TestInterface,
    };
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let interface = TestInterface::create("e");
    let mut cloud = LocalCloud::new(
        config(&format!(
            "addressPools: [{{name: lan, addresses: [198.51.100.210/32]}}]\nloadBalancer: {{vipInterface: {}}}\n",
            interface.name()
        )),
        None,
    );
    std::sync::Arc::get_mut(&mut cloud.inner)
        .expect("no other handle yet")
        .addresses = Some(
        AddressManager::new(interface.name().to_owned())
            .with_announcer(announce_without_cap_net_raw),
    );
    test_control_plane::apply_shipped_rbac().await;
    let client = test_control_plane::control_plane().ccm_client().await;
    *lock(&cloud.inner.reporter) = Some((client, tokio::runtime::Handle::current()));

    let name = test_control_plane::unique_name("unannounced");
    let service = svc(json!({
        "metadata": {"name": name, "namespace": "default", "uid": name},
        "spec": {"ports": [{"port": 18445, "nodePort": 30445, "protocol": "TCP"}]}
    }));
    let vip: IpAddr = "198.51.100.210".parse().unwrap();
    let status = cloud
        .ensure_load_balancer("c", &service, &[])
        .await
        .unwrap();
    assert_eq!(
        status.ingress.unwrap()[0].ip.as_deref(),
        Some("198.51.100.210")
    );
    assert!(interface.has(vip));
    assert!(
        cloud
            .data_plane()
            .state(&format!("default/{name}"))
            .is_some()
    );

    let admin = test_control_plane::control_plane().admin_client().await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin, "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let event = loop {
        let found = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(crate::EVENT_VIP_NOT_ANNOUNCED)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
            });
        if let Some(event) = found {
            break event;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no VIPNotAnnounced event on Service default/{name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.action.as_deref(), Some("AnnounceVIP"));
    let regarding = event.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.namespace.as_deref()),
        (Some("Service"), Some("default"))
    );
    assert_eq!(
        event.note.unwrap(),
        format!(
            "gratuitous ARP for 198.51.100.210 on {} not sent: Operation not permitted (CAP_NET_RAW is needed); neighbours keep the previous holder's MAC until their caches expire",
            interface.name()
        )
    );

    cloud
        .ensure_load_balancer_deleted("c", &service)
        .await
        .unwrap();
    assert!(!interface.has(vip));
}

#[test]
fn spec_helpers_are_the_contracts() {
    // The Service spec default: no families → IPv4.
    let service = Service {
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let wanted = read_service(&service, &Config::default()).unwrap();
    assert_eq!(wanted.families, vec![(IpFamily::V4, true)]);
    assert!(wanted.ports.is_empty());
}
