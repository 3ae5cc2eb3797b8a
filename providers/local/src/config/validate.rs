//! The checks of a whole config that no single value can make: pools that overlap or have no room,
//! selectors and modes that contradict each other, BGP peers and pools that do not fit together.

use super::*;

/// What is wrong with announcing `pool` by BGP as `bgp` says to `peers` (the routers in force), in
/// words, if anything: peers it names that are not there, a family of its addresses no peer of its
/// carries, an aggregate reaching outside it, a local preference no iBGP peer receives.
pub(crate) fn bgp_pool_problem(
    pool: &AddressPool,
    bgp: &PoolBgp,
    peers: &[BgpPeer],
) -> Option<String> {
    for peer in &bgp.peers {
        if !peers.iter().any(|p| &p.name == peer) {
            return Some(format!(
                "bgp.peers names {peer:?}, which is no peer of loadBalancer.bgp.peers ({})",
                peers
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    // A peer is told the VIPs of its own address's family: each family of the pool needs a peer of
    // that family, or its VIPs would go nowhere.
    let pool_peers: Vec<&BgpPeer> = peers
        .iter()
        .filter(|p| bgp.peers.is_empty() || bgp.peers.contains(&p.name))
        .collect();
    for (v4, family) in [(true, "IPv4"), (false, "IPv6")] {
        let has_family = pool.addresses.iter().any(|r| r.first().is_ipv4() == v4);
        if has_family && !pool_peers.iter().any(|p| p.peer_address.is_ipv4() == v4) {
            return Some(format!(
                "it has {family} addresses, but none of its BGP peers has an {family} address: a \
                 peer is told the VIPs of its own address's family (the session's address is their \
                 next hop); add an {family} peer or remove those addresses"
            ));
        }
    }
    if let Some(problem) = bgp.aggregation_problem(&pool.addresses) {
        return Some(problem);
    }
    let ibgp = pool_peers.iter().any(|p| p.peer_asn == p.my_asn);
    if bgp.local_pref.is_some() && !ibgp {
        return Some(
            "bgp.localPref goes to iBGP peers only (peerASN equal to myASN), and every peer of \
             the pool is eBGP: remove it"
                .to_owned(),
        );
    }
    None
}

impl Config {
    /// What the types alone cannot check: pool names are unique and pools do not overlap, timeouts fit
    /// their intervals, IP-typed addresses are IPs.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_pools()?;
        self.validate_bgp()?;
        self.validate_no_overlap()?;
        self.validate_load_balancer()?;
        if self.kubelet_probe.enabled && self.kubelet_probe.timeout.0.is_zero() {
            return Err("kubeletProbe.timeout must be above 0".to_owned());
        }
        self.validate_machines()
    }

    /// Each pool on its own: a unique, non-empty name, node selectors only in agents mode, a priority
    /// that reads one way, namespaces that are names.
    fn validate_pools(&self) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for pool in &self.address_pools {
            if pool.name.is_empty() {
                return Err("addressPools: a pool has an empty name".to_owned());
            }
            if !names.insert(pool.name.as_str()) {
                return Err(format!("addressPools: two pools are named {:?}", pool.name));
            }
            if !pool.node_selectors.is_empty()
                && self.load_balancer.mode != LoadBalancerMode::Agents
            {
                return Err(format!(
                    "addressPools: pool {:?}: nodeSelectors choose the node agents that announce \
                     its VIPs, and needs loadBalancer.mode: agents (in leader mode the leading \
                     manager announces every VIP)",
                    pool.name
                ));
            }
            if pool.priority == Some(0) {
                // MetalLB reads 0 as "no priority" (last); here it would be the first: refused rather
                // than read one way when the file's author meant the other.
                return Err(format!(
                    "addressPools: pool {:?}: priority 0 is ambiguous (MetalLB takes 0 for no \
                     priority, tried last): give 1 or more (1 is tried first), or leave it out",
                    pool.name
                ));
            }
            for namespace in &pool.namespaces {
                cloud_provider::labels::check_dns_label(namespace).map_err(|why| {
                    format!(
                        "addressPools: pool {:?}: {namespace:?} is not a namespace's name: {why}",
                        pool.name
                    )
                })?;
            }
        }
        Ok(())
    }

    /// No address belongs to two pools.
    fn validate_no_overlap(&self) -> Result<(), String> {
        let ranges: Vec<(&str, &AddressRange)> = self
            .address_pools
            .iter()
            .flat_map(|p| p.addresses.iter().map(move |r| (p.name.as_str(), r)))
            .collect();
        for (i, (pool_a, a)) in ranges.iter().enumerate() {
            for (pool_b, b) in &ranges[i + 1..] {
                if a.overlaps(b) {
                    return Err(format!(
                        "addressPools: {a} (pool {pool_a:?}) overlaps {b} (pool {pool_b:?}); an \
                         address can belong to one pool only"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The `loadBalancer` section: timings above 0, and the settings that belong to one mode only.
    fn validate_load_balancer(&self) -> Result<(), String> {
        let timing = &self.load_balancer.health_check;
        if timing.interval.0.is_zero() || timing.timeout.0.is_zero() {
            return Err(
                "loadBalancer.healthCheck: interval and timeout must be above 0".to_owned(),
            );
        }
        if self.load_balancer.connect_timeout.0.is_zero()
            || self.load_balancer.udp_idle_timeout.0.is_zero()
        {
            return Err(
                "loadBalancer: connectTimeout and udpIdleTimeout must be above 0".to_owned(),
            );
        }
        if self
            .load_balancer
            .vip_interface
            .as_ref()
            .is_some_and(|i| i.trim().is_empty())
        {
            return Err("loadBalancer.vipInterface cannot be empty".to_owned());
        }
        if self.load_balancer.mode == LoadBalancerMode::Agents
            && self.load_balancer.vip_interface.is_some()
        {
            return Err("loadBalancer.vipInterface is the leader mode's: with mode: agents, the \
                 manager puts no VIP on any interface and each node agent takes its own (local-agent \
                 --interface); remove vipInterface"
                .to_owned());
        }
        if self.load_balancer.metallb.objects == MetallbObjects::Read
            && self.load_balancer.mode != LoadBalancerMode::Agents
        {
            return Err(
                "loadBalancer.metallb.objects: read is the agents mode's (mode: agents): in \
                 leader mode the leading manager announces every VIP itself, and MetalLB's objects \
                 are not read"
                    .to_owned(),
            );
        }
        cloud_provider::labels::check_dns_label(&self.load_balancer.metallb.namespace).map_err(
            |why| {
                format!(
                    "loadBalancer.metallb.namespace {:?}: {why}",
                    self.load_balancer.metallb.namespace
                )
            },
        )?;
        if let Some(namespace) = &self.load_balancer.agent_namespace {
            if self.load_balancer.mode != LoadBalancerMode::Agents {
                return Err(
                    "loadBalancer.agentNamespace is the agents mode's (mode: agents): in \
                     leader mode no node agent runs; remove agentNamespace"
                        .to_owned(),
                );
            }
            cloud_provider::labels::check_dns_label(namespace).map_err(|why| {
                format!(
                    "loadBalancer.agentNamespace: {namespace:?} is not a namespace's name: {why}"
                )
            })?;
        }
        Ok(())
    }

    /// The machines' addresses: none empty, and those typed as IPs are IPs.
    fn validate_machines(&self) -> Result<(), String> {
        for (name, machine) in &self.machines {
            for address in &machine.addresses {
                let is_ip = matches!(
                    address.type_,
                    AddressType::InternalIp | AddressType::ExternalIp
                );
                if is_ip && address.address.parse::<IpAddr>().is_err() {
                    return Err(format!(
                        "machines.{name}.addresses: {:?} is not an IP address (type {})",
                        address.address,
                        address.type_.as_str()
                    ));
                }
                if address.address.is_empty() {
                    return Err(format!("machines.{name}.addresses: an address is empty"));
                }
            }
        }
        Ok(())
    }

    /// The BGP peers, and the pools that announce by BGP.
    fn validate_bgp(&self) -> Result<(), String> {
        let peers = &self.load_balancer.bgp.peers;
        let profile_names = self.validate_bfd_profiles()?;
        self.validate_peers(&profile_names)?;
        passive_peers_share_port_179(peers)?;
        if !peers.is_empty() && self.load_balancer.mode != LoadBalancerMode::Agents {
            return Err(
                "loadBalancer.bgp is the agents mode's (mode: agents): the node agents \
                 speak BGP, the leading manager does not; remove bgp or set mode: agents"
                    .to_owned(),
            );
        }
        for pool in &self.address_pools {
            self.validate_announce(pool)?;
        }
        Ok(())
    }

    /// The BFD profiles, each valid and named once; answers their names.
    fn validate_bfd_profiles(&self) -> Result<BTreeSet<&str>, String> {
        let profiles = &self.load_balancer.bgp.bfd_profiles;
        let mut profile_names = BTreeSet::new();
        for profile in profiles {
            profile.validate()?;
            if !profile_names.insert(profile.name.as_str()) {
                return Err(format!(
                    "loadBalancer.bgp.bfdProfiles: two profiles are named {:?}",
                    profile.name
                ));
            }
        }
        Ok(profile_names)
    }

    /// The BGP peers, each valid, named once, and naming a BFD profile of `profile_names` if any.
    fn validate_peers(&self, profile_names: &BTreeSet<&str>) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for peer in &self.load_balancer.bgp.peers {
            if let Some(profile) = &peer.bfd_profile
                && !profile_names.contains(profile.as_str())
            {
                return Err(format!(
                    "loadBalancer.bgp.peers {:?}: bfdProfile {profile:?} is no profile of \
                     loadBalancer.bgp.bfdProfiles ({})",
                    peer.name,
                    if profile_names.is_empty() {
                        "it has none".to_owned()
                    } else {
                        profile_names.iter().copied().collect::<Vec<_>>().join(", ")
                    }
                ));
            }
            peer.validate(self.load_balancer.bgp.bfd_of(peer))?;
            if !names.insert(peer.name.as_str()) {
                return Err(format!(
                    "loadBalancer.bgp.peers: two peers are named {:?}",
                    peer.name
                ));
            }
        }
        Ok(())
    }

    /// How `pool` announces fits the mode and its `bgp` block.
    fn validate_announce(&self, pool: &AddressPool) -> Result<(), String> {
        let peers = &self.load_balancer.bgp.peers;
        let name = &pool.name;
        match (pool.announce, &pool.bgp) {
            (Announce::L2, Some(_)) => Err(format!(
                "addressPools: pool {name:?} has a bgp block but announces by layer 2: set \
                 announce: bgp, or remove the block"
            )),
            (Announce::None, Some(_)) => Err(format!(
                "addressPools: pool {name:?} has a bgp block but announces none: set \
                 announce: bgp, or remove the block"
            )),
            (Announce::None, None) if self.load_balancer.mode != LoadBalancerMode::Agents => {
                Err(format!(
                    "addressPools: pool {name:?}: announce: none needs loadBalancer.mode: \
                     agents (in leader mode the leading manager announces every VIP)"
                ))
            }
            (Announce::L2, None) | (Announce::None, None) => Ok(()),
            (Announce::Bgp, _) if self.load_balancer.mode != LoadBalancerMode::Agents => {
                Err(format!(
                    "addressPools: pool {name:?}: announce: bgp needs loadBalancer.mode: agents \
                     (the node agents speak BGP)"
                ))
            }
            (Announce::Bgp, _) if peers.is_empty() => Err(format!(
                "addressPools: pool {name:?}: announce: bgp, but loadBalancer.bgp.peers is \
                 empty: nobody to announce to"
            )),
            (Announce::Bgp, bgp) => {
                let bgp = bgp.clone().unwrap_or_default();
                match bgp_pool_problem(pool, &bgp, peers) {
                    Some(problem) => Err(format!("addressPools: pool {name:?}: {problem}")),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A node's passive peers listen on one port 179: on every address, or on their own. The kernel lets no
/// socket have [::]:179 beside one on a single address (the second would never bind).
fn passive_peers_share_port_179(peers: &[BgpPeer]) -> Result<(), String> {
    let passive: Vec<&BgpPeer> = peers.iter().filter(|p| p.passive).collect();
    if let (Some(everywhere), Some(one)) = (
        passive.iter().find(|p| p.source_address.is_none()),
        passive.iter().find(|p| p.source_address.is_some()),
    ) {
        return Err(format!(
            "loadBalancer.bgp.peers {:?} and {:?}: both passive, one listening on every address \
             (no sourceAddress) and one on {} (its sourceAddress): port 179 cannot be both; give \
             every passive peer a sourceAddress, or none",
            everywhere.name,
            one.name,
            one.source_address
                .map(|a| a.to_string())
                .unwrap_or_default()
        ));
    }
    Ok(())
}
