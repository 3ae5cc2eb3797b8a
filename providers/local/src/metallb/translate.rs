//! From MetalLB's objects to `local`'s pools, peers and BFD profiles: pure, table-tested.
//!
//! Each object is read into the cloud-config's own shape and then through the cloud-config's own
//! types, so a MetalLB object is checked exactly as the same setting in the cloud-config would be.

use std::{
    collections::{BTreeMap, BTreeSet},
    str::FromStr,
};

use serde_json::{Value, json};

use super::{
    Kind, Object, Refusal,
    spec::{
        BfdProfileSpec, BgpAdvertisementSpec, BgpPeerSpec, CommunitySpec, IpAddressPoolSpec,
        L2AdvertisementSpec,
    },
};
use crate::{
    config::{
        AddressPool, AddressRange, Announce, BfdProfile, BgpPeer, Community, Config,
        LoadBalancerMode, PoolBgp, bgp_pool_problem,
    },
    selector::LabelSelector,
};

/// A `BGPAdvertisement` selecting a pool: the object, the nodes it selects, what it advertises.
type BgpChoice<'a> = (&'a Object, Vec<LabelSelector>, PoolBgp);

/// What MetalLB's objects make out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// The pools, one per `IPAddressPool` taken, announced as its advertisements say.
    pub pools: Vec<AddressPool>,
    /// The routers, one per `BGPPeer` taken.
    pub peers: Vec<BgpPeer>,
    /// The BFD profiles, one per `BFDProfile` taken.
    pub bfd_profiles: Vec<BfdProfile>,
    /// Every object or field not taken, and why.
    pub refusals: Vec<Refusal>,
}

/// Reads `objects` (MetalLB's namespace's) beside the cloud-config `file`. When the file defines
/// pools of its own (other than the default one), they stay in force and every `IPAddressPool` is
/// refused; its BGP peers and BFD profiles are kept, and a MetalLB object of the same name refused.
/// In leader mode every object is refused: the leading manager announces every VIP itself, and
/// MetalLB's advertisements, peers and node selectors mean nothing there.
pub fn translate(objects: &[Object], file: &Config) -> Translation {
    let file_pools = file.address_pools != Config::default().address_pools;
    let agents = file.load_balancer.mode == LoadBalancerMode::Agents;
    let file_bgp = &file.load_balancer.bgp;
    let mut out = Translation::default();
    let mut sorted: Vec<&Object> = objects.iter().collect();
    sorted.sort_by(|a, b| (a.kind, &a.created, &a.name).cmp(&(b.kind, &b.created, &b.name)));
    let of = |kind: Kind| sorted.iter().copied().filter(move |o| o.kind == kind);
    if !agents {
        for object in &sorted {
            out.refuse(
                object,
                "local reads MetalLB's objects with loadBalancer.mode: agents only (in leader mode \
                 the leading manager announces every VIP itself): set mode: agents, or write the \
                 pools in the cloud-config",
            );
        }
        return out;
    }

    let aliases = out.communities(of(Kind::Community));
    out.take_bfd_profiles(of(Kind::BfdProfile), &file_bgp.bfd_profiles);
    let profiles: Vec<BfdProfile> = file_bgp
        .bfd_profiles
        .iter()
        .chain(&out.bfd_profiles)
        .cloned()
        .collect();
    out.take_peers(of(Kind::BgpPeer), &file_bgp.peers, &profiles);
    let pool_labels = out.take_pools(of(Kind::IpAddressPool), file_pools);

    let mut l2 = out.l2_advertisements(of(Kind::L2Advertisement), &pool_labels);
    let all_peers: Vec<BgpPeer> = file_bgp.peers.iter().chain(&out.peers).cloned().collect();
    let peer_names: BTreeSet<&str> = all_peers.iter().map(|p| p.name.as_str()).collect();
    let mut bgp = out.bgp_advertisements(
        of(Kind::BgpAdvertisement),
        &pool_labels,
        &aliases,
        &peer_names,
    );

    let mut refusals = Vec::new();
    for pool in &mut out.pools {
        let l2 = l2.remove(&pool.name).unwrap_or_default();
        let bgp = bgp.remove(&pool.name).unwrap_or_default();
        refusals.extend(announce(pool, &l2, &bgp, &all_peers));
    }
    out.refusals.extend(refusals);
    out.refusals.sort();
    out
}

/// The L2 advertisements that select a pool: each object and the nodes it selects.
type L2Choice<'a> = (&'a Object, Vec<LabelSelector>);

impl Translation {
    /// Takes the `BFDProfile`s, but none named as one of the cloud-config's `file_profiles`.
    fn take_bfd_profiles<'a>(
        &mut self,
        objects: impl Iterator<Item = &'a Object>,
        file_profiles: &[BfdProfile],
    ) {
        for object in objects {
            if file_profiles.iter().any(|p| p.name == object.name) {
                self.refuse(object, "the cloud-config's loadBalancer.bgp.bfdProfiles has a profile of this name, which stays in force");
                continue;
            }
            match bfd_profile(object) {
                Ok(profile) => self.bfd_profiles.push(profile),
                Err(why) => self.refuse(object, &why),
            }
        }
    }

    /// Takes the `BGPPeer`s, but none named as one of the cloud-config's `file_peers`; `profiles` are
    /// the BFD profiles a peer may name.
    fn take_peers<'a>(
        &mut self,
        objects: impl Iterator<Item = &'a Object>,
        file_peers: &[BgpPeer],
        profiles: &[BfdProfile],
    ) {
        for object in objects {
            if file_peers.iter().any(|p| p.name == object.name) {
                self.refuse(object, "the cloud-config's loadBalancer.bgp.peers has a peer of this name, which stays in force");
                continue;
            }
            match bgp_peer(object, profiles) {
                Ok(peer) => self.peers.push(peer),
                Err(why) => self.refuse(object, &why),
            }
        }
    }

    /// Takes the `IPAddressPool`s (none when the cloud-config has pools of its own), oldest first, and
    /// refuses one whose addresses overlap an older one's. Answers each pool's labels, by name, for the
    /// advertisements' pool selectors.
    fn take_pools<'a>(
        &mut self,
        objects: impl Iterator<Item = &'a Object>,
        file_pools: bool,
    ) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut pool_labels = BTreeMap::new();
        for object in objects {
            if file_pools {
                self.refuse(
                    object,
                    "the cloud-config defines addressPools of its own, which stay in force: MetalLB's \
                     pools and the cloud-config's are not read together (remove the cloud-config's \
                     addressPools to read MetalLB's)",
                );
                continue;
            }
            let pool = match address_pool(object) {
                Ok(pool) => pool,
                Err(why) => {
                    self.refuse(object, &why);
                    continue;
                }
            };
            if let Some((mine, theirs, other)) = self.overlap(&pool) {
                self.refuse(
                    object,
                    &format!(
                        "spec.addresses: {mine} overlaps {theirs} of IPAddressPool {other:?} \
                         (older): an address belongs to one pool only"
                    ),
                );
                continue;
            }
            pool_labels.insert(pool.name.clone(), object.labels.clone());
            self.pools.push(pool);
        }
        pool_labels
    }

    /// The first range of `pool` that overlaps a pool taken already: (its range, the taken range, the
    /// taken pool's name).
    fn overlap(&self, pool: &AddressPool) -> Option<(String, String, String)> {
        self.pools.iter().find_map(|taken| {
            pool.addresses.iter().find_map(|r| {
                taken
                    .addresses
                    .iter()
                    .find(|t| t.overlaps(r))
                    .map(|t| (r.to_string(), t.to_string(), taken.name.clone()))
            })
        })
    }

    /// Which `L2Advertisement`s select each pool, by pool name.
    fn l2_advertisements<'a>(
        &mut self,
        objects: impl Iterator<Item = &'a Object>,
        pool_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> BTreeMap<String, Vec<L2Choice<'a>>> {
        let mut l2: BTreeMap<String, Vec<L2Choice>> = BTreeMap::new();
        for object in objects {
            match l2_advertisement(object, pool_labels) {
                Ok((pools, nodes)) => {
                    for pool in pools {
                        l2.entry(pool).or_default().push((object, nodes.clone()));
                    }
                }
                Err(why) => self.refuse(object, &why),
            }
        }
        l2
    }

    /// Which `BGPAdvertisement`s select each pool, by pool name.
    fn bgp_advertisements<'a>(
        &mut self,
        objects: impl Iterator<Item = &'a Object>,
        pool_labels: &BTreeMap<String, BTreeMap<String, String>>,
        aliases: &BTreeMap<String, Community>,
        peer_names: &BTreeSet<&str>,
    ) -> BTreeMap<String, Vec<BgpChoice<'a>>> {
        let mut bgp: BTreeMap<String, Vec<BgpChoice>> = BTreeMap::new();
        for object in objects {
            match bgp_advertisement(object, pool_labels, aliases, peer_names) {
                Ok((pools, nodes, advertised)) => {
                    for pool in pools {
                        bgp.entry(pool).or_default().push((
                            object,
                            nodes.clone(),
                            advertised.clone(),
                        ));
                    }
                }
                Err(why) => self.refuse(object, &why),
            }
        }
        bgp
    }
}

/// Sets how `pool` is announced from the advertisements that select it (layer 2 when any L2 one does,
/// else BGP as the oldest BGP one says, else not at all) and on which nodes; answers the refusals.
fn announce(
    pool: &mut AddressPool,
    l2: &[L2Choice],
    bgp: &[BgpChoice],
    all_peers: &[BgpPeer],
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    let refuse = |why: String| Refusal {
        kind: Kind::IpAddressPool,
        name: pool.name.clone(),
        message: why,
    };
    if let (Some((l2_ad, _)), Some((bgp_ad, _, _))) = (l2.first(), bgp.first()) {
        refusals.push(refuse(format!(
            "it is announced both by L2Advertisement {:?} and by BGPAdvertisement {:?}: local \
             announces a pool one way, and announces this one by layer 2 (keep one kind of \
             advertisement for it)",
            l2_ad.name, bgp_ad.name
        )));
    }
    if !l2.is_empty() {
        pool.announce = Announce::L2;
        pool.node_selectors = union(l2.iter().map(|(_, nodes)| nodes).collect());
    } else if let Some((first, _, advertised)) = bgp.first() {
        pool.announce = Announce::Bgp;
        let same: Vec<&BgpChoice> = bgp.iter().filter(|(_, _, a)| a == advertised).collect();
        for (other, _, _) in bgp.iter().filter(|(_, _, a)| a != advertised) {
            refusals.push(refuse(format!(
                "BGPAdvertisement {:?} advertises it with other peers, communities, local \
                 preference or aggregation than BGPAdvertisement {:?} (older): local advertises \
                 a pool one way, as the older one says (merge them)",
                other.name, first.name
            )));
        }
        if let Some(problem) = bgp_pool_problem(pool, advertised, all_peers) {
            refusals.push(Refusal {
                kind: Kind::BgpAdvertisement,
                name: first.name.clone(),
                message: format!(
                    "for IPAddressPool {:?}: {}",
                    pool.name,
                    problem.trim_start_matches("bgp.")
                ),
            });
            pool.announce = Announce::None;
            return refusals;
        }
        pool.node_selectors = union(same.iter().map(|(_, nodes, _)| nodes).collect());
        pool.bgp = Some(advertised.clone());
    } else {
        pool.announce = Announce::None;
    }
    refusals
}

/// The nodes any of the advertisements selects: every node when one has no selector.
fn union(selectors: Vec<&Vec<LabelSelector>>) -> Vec<LabelSelector> {
    if selectors.iter().any(|s| s.is_empty()) {
        Vec::new()
    } else {
        selectors.into_iter().flatten().cloned().collect()
    }
}

/// [`translate`], keeping each object's last good version: an object refused now (a malformed edit)
/// whose earlier version was taken is read as that version, as a refused cloud-config edit leaves the
/// last good file in force, so that its pool's Services keep their addresses. The refusal is still
/// reported, saying so. `last_good` is updated: the objects taken now, and none that is gone.
pub fn translate_keeping(
    objects: &[Object],
    file: &Config,
    last_good: &mut BTreeMap<(Kind, String), Object>,
) -> Translation {
    let first = translate(objects, file);
    let refused: BTreeSet<(Kind, String)> = first
        .refusals
        .iter()
        .map(|r| (r.kind, r.name.clone()))
        .collect();
    let key = |o: &Object| (o.kind, o.name.clone());
    let kept: BTreeSet<(Kind, String)> = objects
        .iter()
        .filter(|o| refused.contains(&key(o)))
        .filter(|o| {
            last_good
                .get(&key(o))
                .is_some_and(|good| good.spec != o.spec)
        })
        .map(key)
        .collect();
    last_good.retain(|k, _| objects.iter().any(|o| key(o) == *k));
    for object in objects.iter().filter(|o| !refused.contains(&key(o))) {
        last_good.insert(key(object), object.clone());
    }
    if kept.is_empty() {
        return first;
    }
    let effective: Vec<Object> = objects
        .iter()
        .map(|o| match kept.contains(&key(o)) {
            true => last_good[&key(o)].clone(),
            false => o.clone(),
        })
        .collect();
    // The refusals of the objects read as they are now, and those of the edits not taken.
    let mut out = translate(&effective, file);
    out.refusals.extend(
        first
            .refusals
            .into_iter()
            .filter(|r| kept.contains(&(r.kind, r.name.clone())))
            .map(|mut r| {
                r.message.push_str("; its last good version stays in force");
                r
            }),
    );
    out.refusals.sort();
    out
}

impl Translation {
    fn refuse(&mut self, object: &Object, why: &str) {
        self.refusals.push(Refusal {
            kind: object.kind,
            name: object.name.clone(),
            message: why.to_owned(),
        });
    }

    /// The community aliases of the `Community` objects (an alias two objects define: the older's).
    fn communities<'a>(
        &mut self,
        objects: impl Iterator<Item = &'a Object>,
    ) -> BTreeMap<String, Community> {
        let mut aliases = BTreeMap::new();
        for object in objects {
            let read = spec::<CommunitySpec>(object).and_then(|spec| {
                let mut mine = BTreeMap::new();
                for (i, alias) in spec.communities.iter().enumerate() {
                    if alias.name.is_empty() {
                        return Err(format!("spec.communities[{i}].name is empty"));
                    }
                    let value = Community::from_str(&alias.value)
                        .map_err(|why| format!("spec.communities[{i}].value: {why}"))?;
                    if aliases.contains_key(&alias.name) || mine.contains_key(&alias.name) {
                        return Err(format!(
                            "spec.communities[{i}]: the alias {:?} is defined twice",
                            alias.name
                        ));
                    }
                    mine.insert(alias.name.clone(), value);
                }
                Ok(mine)
            });
            match read {
                Ok(mine) => aliases.extend(mine),
                Err(why) => self.refuse(object, &why),
            }
        }
        aliases
    }
}

/// The object's spec in its typed form; `Err` names the field MetalLB does not have either.
fn spec<T: serde::de::DeserializeOwned>(object: &Object) -> Result<T, String> {
    serde_json::from_value(object.spec.clone()).map_err(|e| format!("spec: {e}"))
}

/// A cloud-config value read through the cloud-config's own type (its checks and messages).
fn as_config<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// A list of label selectors; `Err` names the field and entry.
fn selectors(field: &str, values: &[Value]) -> Result<Vec<LabelSelector>, String> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| LabelSelector::from_json(v).map_err(|why| format!("{field}[{i}]: {why}")))
        .collect()
}

fn bfd_profile(object: &Object) -> Result<BfdProfile, String> {
    let spec: BfdProfileSpec = spec(object)?;
    let mut value = json!({"name": object.name});
    for (key, field) in [
        ("receiveInterval", spec.receive_interval),
        ("transmitInterval", spec.transmit_interval),
        ("detectMultiplier", spec.detect_multiplier),
        ("echoInterval", spec.echo_interval),
        ("minimumTtl", spec.minimum_ttl),
    ] {
        if let Some(n) = field {
            value[key] = json!(n);
        }
    }
    for (key, field) in [
        ("echoMode", spec.echo_mode),
        ("passiveMode", spec.passive_mode),
    ] {
        if let Some(b) = field {
            value[key] = json!(b);
        }
    }
    let profile: BfdProfile = as_config(value).map_err(|why| format!("spec.{why}"))?;
    profile.validate().map_err(|why| {
        // The cloud-config's message names `loadBalancer.bgp.bfdProfiles "name"`.
        why.split_once(": ")
            .map(|(_, rest)| format!("spec.{rest}"))
            .unwrap_or(why)
    })?;
    Ok(profile)
}

/// A `BGPPeer` as the cloud-config's peer: read through the cloud-config's own type and checks, its
/// BFD profile one of `profiles`; every MetalLB field `local` does not implement refused by name.
fn bgp_peer(object: &Object, profiles: &[BfdProfile]) -> Result<BgpPeer, String> {
    let spec: BgpPeerSpec = spec(object)?;
    refuse_unimplemented_peer_fields(&spec)?;
    let Some(address) = &spec.peer_address else {
        return Err("spec.peerAddress is missing".to_owned());
    };
    let hold = spec.hold_time.clone().unwrap_or_else(|| "90s".to_owned());
    check_keepalive(&spec, &hold)?;
    if let Some(profile) = &spec.bfd_profile
        && !profiles.iter().any(|p| &p.name == profile)
    {
        return Err(format!(
            "spec.bfdProfile {profile:?}: no BFDProfile of that name was taken"
        ));
    }
    let value = peer_config(object, &spec, address, &hold);
    let peer: BgpPeer = as_config(value).map_err(|why| format!("spec: {why}"))?;
    let bfd = peer.bfd_profile.as_ref().and_then(|name| {
        profiles
            .iter()
            .find(|p| &p.name == name)
            .map(BfdProfile::timers)
    });
    peer.validate(bfd).map_err(|why| {
        why.split_once(": ")
            .map(|(_, rest)| format!("spec: {rest}"))
            .unwrap_or(why)
    })?;
    Ok(peer)
}

/// The first field of a `BGPPeer` that asks for what `local` does not implement, refused by name.
fn refuse_unimplemented_peer_fields(spec: &BgpPeerSpec) -> Result<(), String> {
    let refused = [
        (
            spec.dynamic_asn.is_some(),
            "spec.dynamicASN: the router's AS number is read from spec.peerASN only (dynamic AS \
             numbers are not implemented)",
        ),
        (
            spec.interface.is_some(),
            "spec.interface: BGP unnumbered (peering over an interface's link-local address) is \
             not implemented: give spec.peerAddress",
        ),
        (
            spec.vrf.is_some(),
            "spec.vrf: sessions in a VRF are not implemented (sessions leave from the node's \
             default routing table)",
        ),
        (
            spec.disable_mp,
            "spec.disableMP: each session carries the routes of its own address's family; \
             disableMP: true is not implemented",
        ),
        (
            spec.dual_stack_address_family,
            "spec.dualStackAddressFamily: each session carries the routes of its own address's \
             family (one session per family); dual-stack sessions are not implemented",
        ),
        (
            spec.connect_time.is_some(),
            "spec.connectTime: the speaker retries a session on its own schedule (1 s, doubling \
             to 30 s); connectTime is not implemented",
        ),
    ];
    if let Some((_, why)) = refused.iter().find(|(set, _)| *set) {
        return Err((*why).to_owned());
    }
    Ok(())
}

/// A keepalive time is a third of the hold time: the only one the speaker sends.
fn check_keepalive(spec: &BgpPeerSpec, hold: &str) -> Result<(), String> {
    if let Some(keepalive) = &spec.keepalive_time {
        let hold_d = crate::config::GoDuration::from_str(hold)
            .map_err(|why| format!("spec.holdTime: {why}"))?;
        let keep_d = crate::config::GoDuration::from_str(keepalive)
            .map_err(|why| format!("spec.keepaliveTime: {why}"))?;
        if keep_d.0 != hold_d.0 / 3 {
            return Err(format!(
                "spec.keepaliveTime {keepalive}: the speaker sends keepalives every third of the \
                 hold time ({hold} / 3); another keepalive time is not implemented"
            ));
        }
    }
    Ok(())
}

/// The cloud-config's peer entry for a `BGPPeer`: its fields under the cloud-config's names, for the
/// cloud-config's own type to read and check.
fn peer_config(object: &Object, spec: &BgpPeerSpec, address: &str, hold: &str) -> Value {
    let mut value = json!({
        "name": object.name,
        "peerAddress": address,
        "peerASN": spec.peer_asn,
        "myASN": spec.my_asn,
        "holdTime": hold,
        "ebgpMultiHop": spec.ebgp_multi_hop,
        "enableGracefulRestart": spec.enable_graceful_restart,
        "nodeSelectors": spec.node_selectors,
    });
    if let Some(port) = spec.peer_port {
        value["peerPort"] = json!(port);
    }
    if let Some(source) = &spec.source_address {
        value["sourceAddress"] = json!(source);
    }
    if let Some(id) = &spec.router_id {
        value["routerID"] = json!(id);
    }
    if let Some(password) = spec.password.as_ref().filter(|p| !p.is_empty()) {
        value["password"] = json!(password);
    }
    if spec.password_secret.as_ref().is_some_and(|s| {
        s.values()
            .any(|v| v.as_str().is_some_and(|s| !s.is_empty()))
    }) {
        value["passwordSecret"] = json!({});
    }
    if let Some(profile) = &spec.bfd_profile {
        value["bfdProfile"] = json!(profile);
    }
    value
}

/// MetalLB's addresses: a CIDR is every address of its block (MetalLB gives out a block's network
/// and broadcast addresses too, unlike the cloud-config's CIDRs), a range is `first-last` (spaces
/// around the dash allowed).
fn metallb_range(text: &str) -> Result<AddressRange, String> {
    if text.contains('-') {
        return AddressRange::from_str(text);
    }
    let net: ipnet::IpNet = text
        .trim()
        .parse()
        .map_err(|_| format!("invalid CIDR {text:?}"))?;
    AddressRange::new(net.network(), net.broadcast())
        .ok_or_else(|| format!("invalid CIDR {text:?}"))
}

fn address_pool(object: &Object) -> Result<AddressPool, String> {
    let spec: IpAddressPoolSpec = spec(object)?;
    if spec.addresses.is_empty() {
        return Err("spec.addresses is empty".to_owned());
    }
    let mut addresses: Vec<AddressRange> = Vec::new();
    for (i, text) in spec.addresses.iter().enumerate() {
        let range = metallb_range(text).map_err(|why| format!("spec.addresses[{i}]: {why}"))?;
        if let Some(other) = addresses.iter().find(|r| r.overlaps(&range)) {
            return Err(format!(
                "spec.addresses[{i}]: {text} overlaps {other}, an earlier entry"
            ));
        }
        addresses.push(range);
    }
    let allocation = spec.service_allocation.unwrap_or_default();
    let priority = match allocation.priority {
        0 => None,
        p if p > 0 => Some(u32::try_from(p).unwrap_or(u32::MAX)),
        p => {
            return Err(format!(
                "spec.serviceAllocation.priority {p}: 0 (none) or more"
            ));
        }
    };
    for (i, namespace) in allocation.namespaces.iter().enumerate() {
        cloud_provider::labels::check_dns_label(namespace).map_err(|why| {
            format!("spec.serviceAllocation.namespaces[{i}] {namespace:?}: {why}")
        })?;
    }
    Ok(AddressPool {
        name: object.name.clone(),
        addresses,
        auto_assign: spec.auto_assign.unwrap_or(true),
        namespaces: allocation.namespaces,
        service_selector: None,
        service_selectors: selectors(
            "spec.serviceAllocation.serviceSelectors",
            &allocation.service_selectors,
        )?,
        namespace_selectors: selectors(
            "spec.serviceAllocation.namespaceSelectors",
            &allocation.namespace_selectors,
        )?,
        node_selectors: Vec::new(),
        avoid_buggy_ips: spec.avoid_buggy_ips,
        priority,
        // MetalLB's sharing keys span namespaces.
        cross_namespace_sharing: true,
        announce: Announce::None,
        bgp: None,
        metallb_election: true,
    })
}

/// The names of the objects taken, for a message: `a, b`, or `none is`.
fn taken<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "none is".to_owned()
    } else {
        names.join(", ")
    }
}

/// The pools an advertisement selects ([`pools_selected`]) and its `spec.nodeSelectors`.
fn pools_and_nodes(
    pool_names: &[String],
    pool_selectors: &[Value],
    node_selectors: &[Value],
    pool_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<(Vec<String>, Vec<LabelSelector>), String> {
    let pools = pools_selected(pool_names, pool_selectors, pool_labels)?;
    let nodes = selectors("spec.nodeSelectors", node_selectors)?;
    Ok((pools, nodes))
}

/// The pools an advertisement selects: those it names, those its selectors select (by the pools'
/// labels), or every pool when it does neither. A name of no pool taken is refused.
fn pools_selected(
    names: &[String],
    selector_values: &[Value],
    pool_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<Vec<String>, String> {
    let chosen = selectors("spec.ipAddressPoolSelectors", selector_values)?;
    for name in names {
        if !pool_labels.contains_key(name) {
            return Err(format!(
                "spec.ipAddressPools: {name:?} is no IPAddressPool taken ({})",
                taken(pool_labels.keys().map(String::as_str))
            ));
        }
    }
    let all = names.is_empty() && chosen.is_empty();
    Ok(pool_labels
        .iter()
        .filter(|(name, labels)| {
            all || names.contains(name) || chosen.iter().any(|s| s.matches(labels))
        })
        .map(|(name, _)| name.clone())
        .collect())
}

fn l2_advertisement(
    object: &Object,
    pool_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<(Vec<String>, Vec<LabelSelector>), String> {
    let spec: L2AdvertisementSpec = spec(object)?;
    if !spec.interfaces.is_empty() {
        return Err(format!(
            "spec.interfaces {:?}: each node agent announces on its one interface (local-agent \
             --interface, or the interface of its node's address); choosing interfaces per \
             advertisement is not implemented",
            spec.interfaces
        ));
    }
    pools_and_nodes(
        &spec.ip_address_pools,
        &spec.ip_address_pool_selectors,
        &spec.node_selectors,
        pool_labels,
    )
}

fn bgp_advertisement(
    object: &Object,
    pool_labels: &BTreeMap<String, BTreeMap<String, String>>,
    aliases: &BTreeMap<String, Community>,
    peers: &BTreeSet<&str>,
) -> Result<(Vec<String>, Vec<LabelSelector>, PoolBgp), String> {
    let spec: BgpAdvertisementSpec = spec(object)?;
    let (pools, nodes) = pools_and_nodes(
        &spec.ip_address_pools,
        &spec.ip_address_pool_selectors,
        &spec.node_selectors,
        pool_labels,
    )?;
    let mut communities = Vec::new();
    for (i, text) in spec.communities.iter().enumerate() {
        let community = match aliases.get(text) {
            Some(c) => *c,
            None => Community::from_str(text).map_err(|why| {
                format!("spec.communities[{i}]: {why}, nor an alias of a Community object")
            })?,
        };
        communities.push(community);
    }
    for peer in &spec.peers {
        if !peers.contains(peer.as_str()) {
            return Err(format!(
                "spec.peers: {peer:?} is no BGPPeer taken ({})",
                taken(peers.iter().copied())
            ));
        }
    }
    let defaults = PoolBgp::default();
    let length = |field: &str, value: Option<i64>, default: u8, bits: u8| match value {
        None => Ok(default),
        Some(n) => u8::try_from(n)
            .ok()
            .filter(|n| *n <= bits)
            .ok_or_else(|| format!("spec.{field} {n}: from 0 to {bits}")),
    };
    let advertised = PoolBgp {
        peers: spec.peers.clone(),
        communities,
        local_pref: (spec.local_pref != 0).then_some(spec.local_pref),
        aggregation_length: length(
            "aggregationLength",
            spec.aggregation_length,
            defaults.aggregation_length,
            32,
        )?,
        aggregation_length_v6: length(
            "aggregationLengthV6",
            spec.aggregation_length_v6,
            defaults.aggregation_length_v6,
            128,
        )?,
    };
    // Aggregates that reach outside a pool are refused by the pool's check later; here, each pool.
    Ok((pools, nodes, advertised))
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn object(kind: Kind, name: &str, created: &str, spec: Value) -> Object {
        Object {
            kind,
            name: name.to_owned(),
            labels: BTreeMap::new(),
            created: created.to_owned(),
            spec,
        }
    }

    fn agents() -> Config {
        Config::parse("loadBalancer: {mode: agents}\n", None).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// A MetalLB setup of three pools (one scoped to namespaces, one not auto-assigned, one IPv6),
    /// layer 2 for two, BGP for one.
    fn setup() -> Vec<Object> {
        let mut labelled = object(
            Kind::IpAddressPool,
            "v6",
            "2026-01-03T00:00:00Z",
            json!({"addresses": ["fd00:89::/124"]}),
        );
        labelled.labels.insert("family".into(), "v6".into());
        vec![
            object(
                Kind::IpAddressPool,
                "main",
                "2026-01-01T00:00:00Z",
                json!({"addresses": ["10.89.0.0/30", "10.89.1.10 - 10.89.1.12"], "avoidBuggyIPs": true,
                       "serviceAllocation": {"priority": 5, "namespaces": ["shop"],
                                             "namespaceSelectors": [{"matchLabels": {"team": "a"}}],
                                             "serviceSelectors": [{"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}]}}),
            ),
            object(
                Kind::IpAddressPool,
                "reserved",
                "2026-01-02T00:00:00Z",
                json!({"addresses": ["10.89.2.0/29"], "autoAssign": false}),
            ),
            labelled,
            object(
                Kind::L2Advertisement,
                "l2",
                "2026-01-01T00:00:00Z",
                json!({"ipAddressPools": ["main", "reserved"],
                       "nodeSelectors": [{"matchLabels": {"lb": "yes"}}]}),
            ),
            object(
                Kind::L2Advertisement,
                "l2-more",
                "2026-01-02T00:00:00Z",
                json!({"ipAddressPools": ["reserved"]}),
            ),
            object(
                Kind::BfdProfile,
                "fast",
                "2026-01-01T00:00:00Z",
                json!({"receiveInterval": 100, "transmitInterval": 100}),
            ),
            object(
                Kind::BgpPeer,
                "tor",
                "2026-01-01T00:00:00Z",
                json!({"myASN": 64512, "peerASN": 64513, "peerAddress": "fd00:1::1",
                       "holdTime": "30s", "keepaliveTime": "10s", "bfdProfile": "fast",
                       "nodeSelectors": [{"matchLabels": {"rack": "1"}}]}),
            ),
            object(
                Kind::Community,
                "names",
                "2026-01-01T00:00:00Z",
                json!({"communities": [{"name": "office", "value": "64512:7"}]}),
            ),
            object(
                Kind::BgpAdvertisement,
                "v6",
                "2026-01-01T00:00:00Z",
                json!({"ipAddressPoolSelectors": [{"matchLabels": {"family": "v6"}}],
                       "communities": ["office", "no-export"], "peers": ["tor"],
                       "aggregationLengthV6": 124}),
            ),
        ]
    }

    #[test]
    fn a_metallb_setup_is_read_as_its_objects_say() {
        let out = translate(&setup(), &agents());
        assert_eq!(out.refusals, vec![], "{:#?}", out.refusals);
        let names: Vec<&str> = out.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["main", "reserved", "v6"]);
        let [main, reserved, v6] = &out.pools[..] else {
            unreachable!()
        };
        // A CIDR is every address of its block, as MetalLB gives them out.
        assert!(main.addresses[0].contains(ip("10.89.0.0")));
        assert!(main.addresses[1].contains(ip("10.89.1.12")));
        assert!(main.avoid_buggy_ips && !main.gives_out(ip("10.89.0.0")));
        assert_eq!(main.priority, Some(5));
        assert!(main.cross_namespace_sharing);
        let none = BTreeMap::new();
        let web: BTreeMap<String, String> = [("tier".to_owned(), "web".to_owned())].into();
        let team_a: BTreeMap<String, String> = [("team".to_owned(), "a".to_owned())].into();
        assert_eq!(main.refuses("shop", &none, &web), None);
        assert_eq!(main.refuses("other", &team_a, &web), None);
        assert!(main.refuses("other", &none, &web).is_some());
        assert!(main.refuses("shop", &none, &none).is_some());
        assert_eq!(main.announce, Announce::L2);
        let lb: BTreeMap<String, String> = [("lb".to_owned(), "yes".to_owned())].into();
        assert!(main.announced_by(&lb) && !main.announced_by(&none));
        // Two advertisements, one without node selectors: every node.
        assert!(!reserved.auto_assign && reserved.announced_by(&none));
        assert_eq!(v6.announce, Announce::Bgp);
        let bgp = v6.bgp.as_ref().unwrap();
        assert_eq!(bgp.peers, ["tor"]);
        assert_eq!(
            bgp.communities,
            [
                Community::Standard((64512 << 16) | 7),
                Community::Standard(0xFFFF_FF01)
            ]
        );
        assert_eq!(bgp.aggregation_length_v6, 124);
        assert_eq!(out.peers.len(), 1);
        assert_eq!(out.peers[0].bfd_profile.as_deref(), Some("fast"));
        assert_eq!(out.bfd_profiles[0].receive_interval, 100);
    }

    #[test]
    fn what_local_does_not_take_is_refused_by_name_and_the_rest_is_served() {
        let cases: Vec<(Object, &str)> = vec![
            (
                object(
                    Kind::IpAddressPool,
                    "typo",
                    "2026-02-01T00:00:00Z",
                    json!({"addresses": ["10.1.0.0/24"], "autoassign": true}),
                ),
                "spec: unknown field `autoassign`",
            ),
            (
                object(
                    Kind::IpAddressPool,
                    "bad",
                    "2026-02-01T00:00:00Z",
                    json!({"addresses": ["10.1.0.0/33"]}),
                ),
                "spec.addresses[0]: invalid CIDR \"10.1.0.0/33\"",
            ),
            (
                object(
                    Kind::IpAddressPool,
                    "late",
                    "2026-02-01T00:00:00Z",
                    json!({"addresses": ["10.89.0.2/32"]}),
                ),
                "spec.addresses: 10.89.0.2-10.89.0.2 overlaps 10.89.0.0-10.89.0.3 of IPAddressPool \"main\"",
            ),
            (
                object(
                    Kind::IpAddressPool,
                    "sel",
                    "2026-02-01T00:00:00Z",
                    json!({"addresses": ["10.1.0.0/24"], "serviceAllocation": {"serviceSelectors": [{"matchExpressions": [{"key": "a", "operator": "Has"}]}]}}),
                ),
                "spec.serviceAllocation.serviceSelectors[0]: matchExpressions[0]: operator \"Has\"",
            ),
            (
                object(
                    Kind::L2Advertisement,
                    "nic",
                    "2026-02-01T00:00:00Z",
                    json!({"interfaces": ["eth1"]}),
                ),
                "spec.interfaces [\"eth1\"]: each node agent announces on its one interface",
            ),
            (
                object(
                    Kind::L2Advertisement,
                    "ghost",
                    "2026-02-01T00:00:00Z",
                    json!({"ipAddressPools": ["nope"]}),
                ),
                "spec.ipAddressPools: \"nope\" is no IPAddressPool taken",
            ),
            (
                object(
                    Kind::BgpPeer,
                    "vrf",
                    "2026-02-01T00:00:00Z",
                    json!({"myASN": 1, "peerASN": 2, "peerAddress": "10.0.0.1", "vrf": "red"}),
                ),
                "spec.vrf: sessions in a VRF are not implemented",
            ),
            (
                object(
                    Kind::BgpPeer,
                    "secret",
                    "2026-02-01T00:00:00Z",
                    json!({"myASN": 1, "peerASN": 2, "peerAddress": "10.0.0.1", "passwordSecret": {"name": "s"}}),
                ),
                "passwordSecret: the node agents read no Secret",
            ),
            (
                object(
                    Kind::BgpPeer,
                    "keep",
                    "2026-02-01T00:00:00Z",
                    json!({"myASN": 1, "peerASN": 2, "peerAddress": "10.0.0.1", "keepaliveTime": "20s"}),
                ),
                "spec.keepaliveTime 20s: the speaker sends keepalives every third of the hold time",
            ),
            (
                object(
                    Kind::BgpPeer,
                    "nobfd",
                    "2026-02-01T00:00:00Z",
                    json!({"myASN": 1, "peerASN": 2, "peerAddress": "10.0.0.1", "bfdProfile": "slow"}),
                ),
                "spec.bfdProfile \"slow\": no BFDProfile of that name was taken",
            ),
            (
                object(
                    Kind::BfdProfile,
                    "echo",
                    "2026-02-01T00:00:00Z",
                    json!({"echoMode": true}),
                ),
                "echoMode: echo mode is not implemented",
            ),
            (
                object(
                    Kind::BfdProfile,
                    "short",
                    "2026-02-01T00:00:00Z",
                    json!({"receiveInterval": 5}),
                ),
                "spec.receiveInterval 5: milliseconds, from 10 to 60000",
            ),
            (
                object(
                    Kind::Community,
                    "badc",
                    "2026-02-01T00:00:00Z",
                    json!({"communities": [{"name": "x", "value": "1:2:3"}]}),
                ),
                "spec.communities[0].value: community \"1:2:3\"",
            ),
            (
                object(
                    Kind::BgpAdvertisement,
                    "nopeer",
                    "2026-02-01T00:00:00Z",
                    json!({"ipAddressPools": ["v6"], "peers": ["edge"]}),
                ),
                "spec.peers: \"edge\" is no BGPPeer taken (tor)",
            ),
            (
                object(
                    Kind::BgpAdvertisement,
                    "both",
                    "2026-02-01T00:00:00Z",
                    json!({"ipAddressPools": ["main"], "peers": ["tor"]}),
                ),
                "it is announced both by L2Advertisement \"l2\" and by BGPAdvertisement \"both\"",
            ),
        ];
        for (bad, wanted) in cases {
            let mut objects = setup();
            objects.push(bad.clone());
            let out = translate(&objects, &agents());
            let said: Vec<String> = out
                .refusals
                .iter()
                .map(|r| format!("{} {}: {}", r.kind.name(), r.name, r.message))
                .collect();
            assert!(
                said.iter().any(|s| s.contains(wanted)),
                "{} {}: {said:#?} lacks {wanted}",
                bad.kind.name(),
                bad.name
            );
            // The rest is served as before.
            for name in ["main", "reserved", "v6"] {
                assert!(
                    out.pools.iter().any(|p| p.name == name),
                    "{wanted}: {name} lost"
                );
            }
            assert!(out.pools.iter().all(|p| p.name != bad.name), "{wanted}");
        }
    }

    #[test]
    fn the_cloud_config_s_pools_and_leader_mode_refuse_metallb_s_objects() {
        let with_pools = Config::parse(
            "loadBalancer: {mode: agents}\naddressPools: [{name: mine, addresses: [10.7.0.0/24]}]\n",
            None,
        )
        .unwrap();
        let out = translate(&setup(), &with_pools);
        assert!(out.pools.is_empty());
        let refused: BTreeSet<&str> = out
            .refusals
            .iter()
            .filter(|r| r.message.contains("the cloud-config defines addressPools"))
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(refused, BTreeSet::from(["main", "reserved", "v6"]));
        // Its peers are still read (the file has none).
        assert_eq!(out.peers.len(), 1);

        let out = translate(&setup(), &Config::default());
        assert!(out.pools.is_empty() && out.peers.is_empty());
        assert_eq!(out.refusals.len(), setup().len());
        assert!(
            out.refusals
                .iter()
                .all(|r| r.message.contains("mode: agents only"))
        );
    }

    #[test]
    fn a_malformed_edit_keeps_the_last_good_version() {
        let mut last_good = BTreeMap::new();
        let good = translate_keeping(&setup(), &agents(), &mut last_good);
        assert!(good.refusals.is_empty());
        // `main` edited with a bad CIDR: refused, and its last good version stays in force.
        let mut edited = setup();
        edited[0].spec = json!({"addresses": ["10.89.0.0/33"]});
        let out = translate_keeping(&edited, &agents(), &mut last_good);
        assert_eq!(out.pools, good.pools);
        assert_eq!(out.refusals.len(), 1);
        assert!(
            out.refusals[0]
                .message
                .ends_with("its last good version stays in force"),
            "{:?}",
            out.refusals
        );
        // Deleted, it goes; made again as malformed, nothing is kept for it.
        let without: Vec<Object> = setup().into_iter().skip(1).collect();
        let out = translate_keeping(&without, &agents(), &mut last_good);
        assert!(out.pools.iter().all(|p| p.name != "main"));
        let out = translate_keeping(&edited, &agents(), &mut last_good);
        assert!(out.pools.iter().all(|p| p.name != "main"));
        assert!(!out.refusals[0].message.contains("last good"));
    }

    #[test]
    fn a_pool_without_an_advertisement_is_given_out_unannounced() {
        let objects = vec![object(
            Kind::IpAddressPool,
            "quiet",
            "2026-01-01T00:00:00Z",
            json!({"addresses": ["10.9.0.0/24"]}),
        )];
        let out = translate(&objects, &agents());
        assert_eq!(out.pools[0].announce, Announce::None);
        assert!(out.refusals.is_empty());
    }

    #[test]
    fn differing_bgp_advertisements_of_a_pool_keep_the_older() {
        let mut objects = setup();
        objects.push(object(
            Kind::BgpAdvertisement,
            "v6-late",
            "2026-03-01T00:00:00Z",
            json!({"ipAddressPools": ["v6"], "localPref": 50, "peers": ["tor"]}),
        ));
        let out = translate(&objects, &agents());
        let v6 = out.pools.iter().find(|p| p.name == "v6").unwrap();
        assert_eq!(v6.bgp.as_ref().unwrap().aggregation_length_v6, 124);
        assert!(out.refusals.iter().any(|r| {
            r.name == "v6"
                && r.message
                    .contains("BGPAdvertisement \"v6-late\" advertises it with other")
        }));
    }
}
