//! Which node announces each VIP: pure functions over what the agents watch (Services, Nodes,
//! EndpointSlices, the agents' heartbeats), so every agent that sees the same cluster reaches the same
//! answer without talking to the others.
//!
//! **The election.** A node is a *candidate* for a VIP when its Node is Ready, does not carry
//! `node.kubernetes.io/exclude-from-external-load-balancers`, is one this cloud serves (listed or
//! adopted), its agent's heartbeat is fresh, and, for each Service on the VIP with
//! `externalTrafficPolicy: Local`, it runs a ready endpoint of that Service. Among the candidates, the
//! node with the lowest [`rank`] of `(node, VIP)` announces it (MetalLB's layer-2 rule, with another
//! hash): VIPs spread over the nodes, and a node's loss moves only the VIPs it held, each to the next
//! node of its own order. A node that comes back takes back the VIPs it ranks first for.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

/// A node with this label gets no load-balancer traffic (upstream's well-known label; its value is
/// not read, as upstream's service controller does not).
pub(crate) const LABEL_EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The cluster autoscaler's taint on a node it is about to remove: its VIPs move to another node at
/// once, while it still runs, rather than failing over once it is gone.
pub(crate) const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

/// The label that ties an EndpointSlice to its Service.
pub(crate) const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The order of `node` for `vip`: the lowest announces. FNV-1a (64 bits) of `node#vip` followed by
/// MurmurHash3's 64-bit finalizer, written here rather than taken from `std`'s hasher, whose algorithm
/// may change between Rust releases: agents of two versions (a rolling upgrade) must rank alike. The
/// finalizer matters: FNV-1a alone ranks names that differ in one character (`node-1`, `node-2`) in
/// nearly the same order for consecutive VIPs, and a real cluster's six VIPs all went to one node.
pub(crate) fn rank(node: &str, vip: IpAddr) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = format!("{node}#{vip}").bytes().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    });
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// MetalLB's layer-2 election, for the pools read from MetalLB's objects: the node whose
/// SHA-256 of `node#ip` is the lowest, `ip` being the first address of the Service (so a dual-stack
/// Service's two VIPs go to one node), as MetalLB's speakers elect. A hand-over from MetalLB then moves
/// no VIP to another node.
pub(crate) fn metallb_announcer<'a>(
    ip: IpAddr,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates.into_iter().min_by_key(|node| {
        let digest = ring::digest::digest(&ring::digest::SHA256, format!("{node}#{ip}").as_bytes());
        <[u8; 32]>::try_from(digest.as_ref()).unwrap_or([u8::MAX; 32])
    })
}

/// The announcer of `vip` among `candidates`: the lowest rank, the lowest name on a tie.
pub(crate) fn announcer<'a>(
    vip: IpAddr,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .min_by_key(|node| (rank(node, vip), *node))
}

/// Why the Node is to leave the load balancers while it still runs, if it is: excluded
/// (`node.kubernetes.io/exclude-from-external-load-balancers`) or being removed by the cluster
/// autoscaler. Not a failure: its VIPs can be handed over make-before-break.
pub(crate) fn leaving_on_purpose(node: &Node) -> Option<&'static str> {
    let labels = node.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_EXCLUDE)) {
        return Some("excluded from load balancers");
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref());
    if taints.is_some_and(|t| t.iter().any(|t| t.key == TAINT_TO_BE_DELETED)) {
        return Some("being removed by the cluster autoscaler");
    }
    None
}

/// Why `node` cannot announce any VIP, or `None` when it can as far as the Node object goes (Ready, not
/// excluded, not being removed by the cluster autoscaler). `agent_heard`: its agent is a member of this agent's membership view; then a Ready
/// condition of `Unknown` (the control plane stopped hearing its kubelet: the API server was away, or
/// the node is cut from it) does not make it unfit, since its agent is heard directly. `False` (the
/// kubelet says the node is not ready) always does.
pub(crate) fn node_unfit(node: &Node, agent_heard: bool) -> Option<&'static str> {
    if let Some(why) = leaving_on_purpose(node) {
        return Some(why);
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True" || (agent_heard && c.status == "Unknown"));
    if !ready {
        return Some("not Ready");
    }
    if node.metadata.deletion_timestamp.is_some() {
        return Some("being deleted");
    }
    None
}

/// The nodes that run a ready endpoint of the Service `namespace/name`, from its EndpointSlices.
pub(crate) fn nodes_with_ready_endpoints<'a>(
    namespace: &str,
    name: &str,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> BTreeSet<String> {
    slices
        .into_iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SERVICE_NAME))
                .is_some_and(|n| n == name)
        })
        .flat_map(|s| s.endpoints.iter().flatten())
        // `ready` unset means ready (the API's rule for consumers).
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter_map(|e| e.node_name.clone())
        .collect()
}

/// One Service this cloud's agents serve: its VIPs (those of its status in this cloud's pools) and
/// whether only nodes with its endpoints may announce them.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub service: Arc<Service>,
    pub key: String,
    pub vips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: the nodes with a ready endpoint (only they may announce).
    pub local_endpoints: Option<BTreeSet<String>>,
}

/// What one agent is to do: the VIPs it announces, by Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `namespace/name` → the Service's VIPs this node announces (only Services with at least one).
    pub mine: BTreeMap<String, Vec<IpAddr>>,
    /// Every VIP → the node announcing it (`None`: no candidate).
    pub announcers: BTreeMap<IpAddr, Option<String>>,
}

/// The plan of agent `me`, given the Services served, and the candidate nodes (fit, served by this
/// cloud, heartbeat fresh), of which only those `may_announce` a VIP (its pool's `nodeSelectors`) are
/// its candidates. A VIP whose pool is MetalLB's (`metallb_election`) is elected as MetalLB elects
/// ([`metallb_announcer`]). A VIP for which `routed` is true (its pool announces by BGP) is announced
/// by every fit candidate, each one a next hop of the routers' ECMP route; its entry in
/// [`Plan::announcers`] is then `me` when this node is one of them, else the first fit one.
pub(crate) fn plan(
    me: &str,
    services: &[Served],
    candidates: &BTreeSet<String>,
    routed: impl Fn(IpAddr) -> bool,
    may_announce: impl Fn(IpAddr, &str) -> bool,
    metallb_election: impl Fn(IpAddr) -> bool,
) -> Plan {
    // Services sharing a VIP: a node must suit every one of them.
    let mut by_vip: BTreeMap<IpAddr, Vec<&Served>> = BTreeMap::new();
    for served in services {
        for vip in &served.vips {
            by_vip.entry(*vip).or_default().push(served);
        }
    }
    let mut out = Plan::default();
    for (vip, sharing) in by_vip {
        let fit = candidates.iter().filter(|node| {
            may_announce(vip, node.as_str())
                && sharing.iter().all(|s| {
                    s.local_endpoints
                        .as_ref()
                        .is_none_or(|nodes| nodes.contains(*node))
                })
        });
        let chosen = if routed(vip) {
            let fit: Vec<&String> = fit.collect();
            fit.iter()
                .find(|n| n.as_str() == me)
                .or(fit.first())
                .map(|n| (*n).clone())
        } else if metallb_election(vip) {
            let key = sharing
                .first()
                .and_then(|s| s.vips.first())
                .copied()
                .unwrap_or(vip);
            metallb_announcer(key, fit.map(String::as_str)).map(str::to_owned)
        } else {
            announcer(vip, fit.map(String::as_str)).map(str::to_owned)
        };
        if chosen.as_deref() == Some(me) {
            for served in sharing {
                out.mine.entry(served.key.clone()).or_default().push(vip);
            }
        }
        out.announcers.insert(vip, chosen);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`rank`] of `a#10.0.0.1`, computed apart (Python).
    const RANK_OF_A_10_0_0_1: u64 = 0x87df_15ca_f608_83a5;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn served(key: &str, vips: &[&str], local: Option<&[&str]>) -> Served {
        Served {
            service: Arc::new(Service::default()),
            key: key.to_owned(),
            vips: vips.iter().map(|v| v.parse().unwrap()).collect(),
            local_endpoints: local.map(set),
        }
    }

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_rank_is_fixed_across_processes_and_releases() {
        // A change of the hash moves VIPs when agents are upgraded: it must be a deliberate one.
        assert_eq!(rank("a", "10.0.0.1".parse().unwrap()), RANK_OF_A_10_0_0_1);
        assert_ne!(
            rank("a", "10.0.0.1".parse().unwrap()),
            rank("b", "10.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn consecutive_vips_spread_over_nodes_named_alike() {
        // hack/cluster's names and its pool (10.89.0.64/26): FNV-1a alone put every VIP of six on one
        // node; with the finalizer each node gets 18 to 26 of the 64 (a fair share is 21).
        let nodes = set(&["ccm-node-1", "ccm-node-2", "ccm-node-3"]);
        let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
        for last in 64..128 {
            let vip = IpAddr::from([10, 89, 0, last]);
            let node = announcer(vip, nodes.iter().map(String::as_str)).unwrap();
            *per_node.entry(node.to_owned()).or_default() += 1;
        }
        assert_eq!(per_node.len(), 3, "{per_node:?}");
        assert!(per_node.values().all(|n| *n >= 64 / 4), "{per_node:?}");
    }

    #[test]
    fn every_agent_picks_the_same_announcer_and_vips_spread() {
        let nodes = set(&["n1", "n2", "n3"]);
        let services: Vec<Served> = (1..=30)
            .map(|i| served(&format!("ns/s{i}"), &[&format!("10.0.0.{i}")], None))
            .collect();
        let plans: Vec<Plan> = ["n1", "n2", "n3"]
            .iter()
            .map(|me| plan(me, &services, &nodes, |_| false, |_, _| true, |_| false))
            .collect();
        // Same announcers from every point of view, and each VIP announced by exactly one.
        assert!(plans.iter().all(|p| p.announcers == plans[0].announcers));
        let total: usize = plans.iter().map(|p| p.mine.len()).sum();
        assert_eq!(total, 30);
        // Spread: every node announces some (30 VIPs over 3 nodes).
        assert!(plans.iter().all(|p| !p.mine.is_empty()), "{plans:?}");
    }

    #[test]
    fn a_lost_node_moves_only_its_vips() {
        let services: Vec<Served> = (1..=30)
            .map(|i| served(&format!("ns/s{i}"), &[&format!("10.0.0.{i}")], None))
            .collect();
        let before = plan(
            "n1",
            &services,
            &set(&["n1", "n2", "n3"]),
            |_| false,
            |_, _| true,
            |_| false,
        )
        .announcers;
        let after = plan(
            "n1",
            &services,
            &set(&["n1", "n2"]),
            |_| false,
            |_, _| true,
            |_| false,
        )
        .announcers;
        for (vip, was) in &before {
            let now = &after[vip];
            if was.as_deref() == Some("n3") {
                assert!(matches!(now.as_deref(), Some("n1" | "n2")));
            } else {
                assert_eq!(now, was, "{vip} moved although its node stayed");
            }
        }
        // And when it comes back, it takes back exactly those.
        assert_eq!(
            plan(
                "n1",
                &services,
                &set(&["n1", "n2", "n3"]),
                |_| false,
                |_, _| true,
                |_| false
            )
            .announcers,
            before
        );
    }

    #[test]
    fn local_traffic_policy_and_sharing_limit_the_candidates() {
        let nodes = set(&["n1", "n2", "n3"]);
        // (the Services, then each VIP's expected announcer)
        type Case<'a> = (&'a [Served], &'a [(&'a str, Option<&'a str>)]);
        let table: &[Case] = &[
            // Only the node with an endpoint.
            (
                &[served("ns/a", &["10.0.0.1"], Some(&["n2"]))],
                &[("10.0.0.1", Some("n2"))],
            ),
            // No ready endpoint anywhere: nobody announces.
            (
                &[served("ns/a", &["10.0.0.1"], Some(&[]))],
                &[("10.0.0.1", None)],
            ),
            // An endpoint on a node that is no candidate (its agent is gone) does not count.
            (
                &[served("ns/a", &["10.0.0.1"], Some(&["n9"]))],
                &[("10.0.0.1", None)],
            ),
            // Two Services on one VIP: a node with endpoints of both.
            (
                &[
                    served("ns/a", &["10.0.0.1"], Some(&["n1", "n3"])),
                    served("ns/b", &["10.0.0.1"], Some(&["n3"])),
                ],
                &[("10.0.0.1", Some("n3"))],
            ),
        ];
        for (services, expected) in table {
            let announcers =
                plan("n1", services, &nodes, |_| false, |_, _| true, |_| false).announcers;
            for (vip, node) in *expected {
                assert_eq!(
                    announcers[&vip.parse::<IpAddr>().unwrap()].as_deref(),
                    *node,
                    "{services:?}"
                );
            }
        }
        // A shared VIP is announced for both Services by its node.
        let shared = [
            served("ns/a", &["10.0.0.1"], None),
            served("ns/b", &["10.0.0.1"], None),
        ];
        let owner = plan("n1", &shared, &nodes, |_| false, |_, _| true, |_| false).announcers
            [&"10.0.0.1".parse::<IpAddr>().unwrap()]
            .clone()
            .unwrap();
        let mine = plan(&owner, &shared, &nodes, |_| false, |_, _| true, |_| false).mine;
        assert_eq!(mine.keys().collect::<Vec<_>>(), ["ns/a", "ns/b"]);
    }

    #[test]
    fn nodes_that_cannot_announce() {
        let ready = serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(node_unfit(&node(ready.clone()), false), None);
        let mut excluded = ready.clone();
        excluded["metadata"]["labels"] = serde_json::json!({LABEL_EXCLUDE: ""});
        assert_eq!(
            node_unfit(&node(excluded.clone()), false),
            Some("excluded from load balancers")
        );
        assert_eq!(
            node_unfit(&node(excluded), true),
            Some("excluded from load balancers")
        );
        // Being scaled down: its VIPs move while it still serves.
        let mut scaled_down = ready.clone();
        scaled_down["spec"] = serde_json::json!({"taints": [{"key": TAINT_TO_BE_DELETED, "value": "1700000000", "effect": "NoSchedule"}]});
        assert_eq!(
            node_unfit(&node(scaled_down), true),
            Some("being removed by the cluster autoscaler")
        );
        // The control plane lost its kubelet: unfit, unless its agent is heard directly.
        let mut unknown = ready.clone();
        unknown["status"]["conditions"][0]["status"] = "Unknown".into();
        assert_eq!(node_unfit(&node(unknown.clone()), false), Some("not Ready"));
        assert_eq!(node_unfit(&node(unknown), true), None);
        // The kubelet says not ready: unfit either way.
        let mut not_ready = ready.clone();
        not_ready["status"]["conditions"][0]["status"] = "False".into();
        assert_eq!(
            node_unfit(&node(not_ready.clone()), true),
            Some("not Ready")
        );
        assert_eq!(
            node_unfit(&node(serde_json::json!({"metadata": {"name": "n"}})), true),
            Some("not Ready")
        );
    }

    #[test]
    fn ready_endpoints_by_node() {
        let slice =
            |namespace: &str, service: &str, endpoints: serde_json::Value| -> EndpointSlice {
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("{service}-x"), "namespace": namespace,
                                 "labels": {LABEL_SERVICE_NAME: service}},
                    "addressType": "IPv4",
                    "endpoints": endpoints,
                }))
                .unwrap()
            };
        let slices = [
            slice(
                "ns",
                "web",
                serde_json::json!([
                    {"addresses": ["10.244.1.2"], "nodeName": "n1"},
                    {"addresses": ["10.244.2.2"], "nodeName": "n2", "conditions": {"ready": false}},
                    {"addresses": ["10.244.3.2"], "nodeName": "n3", "conditions": {"ready": true}},
                    {"addresses": ["10.244.4.2"]},
                ]),
            ),
            slice(
                "other",
                "web",
                serde_json::json!([{"addresses": ["10.244.5.2"], "nodeName": "n5"}]),
            ),
            slice(
                "ns",
                "db",
                serde_json::json!([{"addresses": ["10.244.6.2"], "nodeName": "n6"}]),
            ),
        ];
        assert_eq!(
            nodes_with_ready_endpoints("ns", "web", &slices),
            set(&["n1", "n3"])
        );
    }

    #[test]
    fn only_the_nodes_a_pool_selects_announce_its_vips() {
        // 10.90.0.1's pool selects n2 and n3; 10.90.1.1's selects none of the live nodes.
        let services = vec![
            served("default/a", &["10.90.0.1"], None),
            served("default/b", &["10.90.1.1"], None),
            served("default/c", &["10.90.2.1"], Some(&["n1", "n3"])),
        ];
        let nodes = set(&["n1", "n2", "n3"]);
        let may = |vip: IpAddr, node: &str| match vip.to_string().as_str() {
            "10.90.0.1" => node != "n1",
            "10.90.1.1" => node == "n9",
            _ => node == "n2" || node == "n3",
        };
        for routed in [false, true] {
            let plan = plan("n1", &services, &nodes, |_| routed, may, |_| false);
            let announcer = |vip: &str| plan.announcers[&vip.parse::<IpAddr>().unwrap()].clone();
            assert!(
                matches!(announcer("10.90.0.1").as_deref(), Some("n2" | "n3")),
                "routed {routed}"
            );
            assert_eq!(announcer("10.90.1.1"), None, "routed {routed}");
            // ETP Local and the pool's selector together: n3 only.
            assert_eq!(
                announcer("10.90.2.1").as_deref(),
                Some("n3"),
                "routed {routed}"
            );
            assert!(plan.mine.is_empty(), "routed {routed}");
        }
    }

    #[test]
    fn metallb_s_pools_elect_as_metallb_s_speakers_do() {
        // The orders below computed apart (Python: sha256(b"node#ip"), lowest first).
        let nodes = set(&["n1", "n2", "n3"]);
        for (ip, order) in [
            ("10.89.0.128", ["n3", "n2", "n1"]),
            ("10.89.0.130", ["n1", "n3", "n2"]),
            ("fd00:89::300", ["n2", "n3", "n1"]),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(
                metallb_announcer(ip, nodes.iter().map(String::as_str)),
                Some(order[0])
            );
            let without_first = nodes.iter().map(String::as_str).filter(|n| *n != order[0]);
            assert_eq!(metallb_announcer(ip, without_first), Some(order[1]), "{ip}");
        }
        // A dual-stack Service's two VIPs go where its first address is elected (10.89.0.130: n1),
        // although its IPv6 address alone would elect n2.
        let services = vec![served("ns/dual", &["10.89.0.130", "fd00:89::300"], None)];
        let plan = plan("n1", &services, &nodes, |_| false, |_, _| true, |_| true);
        assert_eq!(
            plan.mine["ns/dual"],
            vec![
                "10.89.0.130".parse::<IpAddr>().unwrap(),
                "fd00:89::300".parse::<IpAddr>().unwrap()
            ]
        );
    }

    #[test]
    fn a_routed_vip_is_announced_by_every_fit_node() {
        let services = vec![
            served("default/web", &["10.90.0.1"], None),
            served("default/local", &["10.90.0.2"], Some(&["n2", "n3"])),
        ];
        let nodes = set(&["n1", "n2", "n3"]);
        for me in ["n1", "n2", "n3"] {
            let plan = plan(me, &services, &nodes, |_| true, |_, _| true, |_| false);
            assert_eq!(
                plan.mine["default/web"],
                vec!["10.90.0.1".parse::<IpAddr>().unwrap()],
                "{me}"
            );
            assert_eq!(plan.mine.contains_key("default/local"), me != "n1", "{me}");
            let announcers = &plan.announcers;
            assert_eq!(
                announcers[&"10.90.0.1".parse::<IpAddr>().unwrap()].as_deref(),
                Some(me)
            );
            let local = announcers[&"10.90.0.2".parse::<IpAddr>().unwrap()].as_deref();
            assert_eq!(local, Some(if me == "n1" { "n2" } else { me }));
        }
        let nobody = plan(
            "n1",
            &services,
            &set(&["n1"]),
            |_| true,
            |_, _| true,
            |_| false,
        );
        assert_eq!(
            nobody.announcers[&"10.90.0.2".parse::<IpAddr>().unwrap()],
            None
        );
    }
}
