//! Address pools: the ranges a pool gives VIPs out of (CIDRs or `first-last` ranges of either family),
//! which Services and nodes it serves, and the checks a Service's asked-for address meets.

use super::*;

/// A named pool of VIPs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressPool {
    /// The pool's name, for the `local.ccm.rs/address-pool` annotation.
    pub name: String,
    /// CIDRs (`127.240.0.0/16`, `fd00:10::/120`) or ranges (`127.0.10.1-127.0.10.50`), IPv4 or IPv6.
    pub addresses: Vec<AddressRange>,
    /// Whether Services that name no pool get addresses from it (default `true`); `false` keeps it for
    /// Services that name it or request one of its addresses.
    #[serde(default = "yes")]
    pub auto_assign: bool,
    /// The namespaces whose Services may take addresses from the pool; empty (the default): every
    /// namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// The labels a Service must carry to take addresses from the pool; none (the default): every
    /// Service. A Kubernetes label selector (`matchLabels`, `matchExpressions`).
    #[serde(default)]
    pub service_selector: Option<LabelSelector>,
    /// More selectors of Services, any one of which suffices (MetalLB's `serviceSelectors`); with
    /// `serviceSelector` too, a Service must match it and one of these.
    #[serde(default)]
    pub service_selectors: Vec<LabelSelector>,
    /// Selectors of namespaces by their labels: a Service in a namespace one of them selects may take
    /// addresses from the pool as if the namespace were listed in `namespaces` (MetalLB's
    /// `namespaceSelectors`).
    #[serde(default)]
    pub namespace_selectors: Vec<LabelSelector>,
    /// The nodes that may announce the pool's VIPs (layer 2: be elected; BGP: advertise them): those
    /// any one of these selects; none (the default): every node. MetalLB's `L2Advertisement` and
    /// `BGPAdvertisement` `nodeSelectors`.
    #[serde(default)]
    pub node_selectors: Vec<LabelSelector>,
    /// Never gives out an IPv4 address ending in `.0` or `.255`, which some old routers drop (MetalLB's
    /// `avoidBuggyIPs`, default `false`).
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Where the pool ranks when a Service that names no pool is given an address: pools with a
    /// priority (1 or more; 0 is refused) first, the lowest number first, then the pools without one; in
    /// the file's order among equals (MetalLB's `serviceAllocation.priority`, with the file's order where
    /// MetalLB breaks ties by its own rules).
    #[serde(default)]
    pub priority: Option<u32>,
    /// Whether Services of different namespaces may share one of its addresses with the same
    /// `local.ccm.rs/allow-shared-ip` key (default `false`: a key spans one namespace, so a tenant
    /// cannot join another tenant's address by guessing or learning its key).
    #[serde(default)]
    pub cross_namespace_sharing: bool,
    /// How the pool's VIPs reach the network: `l2` (the default) or `bgp` (node agents only).
    #[serde(default)]
    pub announce: Announce,
    /// With `announce: bgp`: which peers the VIPs go to, and their communities and local preference.
    #[serde(default)]
    pub bgp: Option<PoolBgp>,
    /// Set for the pools read from MetalLB's objects, never from the file: layer 2 elects the node
    /// that announces a VIP as MetalLB's speakers do (`agent::plan::metallb_announcer`).
    #[serde(skip)]
    pub(crate) metallb_election: bool,
}

impl AddressPool {
    /// Why the pool does not serve a Service in `namespace` (labelled `namespace_labels`) with
    /// `labels` (`None`: it does).
    pub fn refuses(
        &self,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> Option<String> {
        let scoped = !self.namespaces.is_empty() || !self.namespace_selectors.is_empty();
        if scoped
            && !self.namespaces.iter().any(|n| n == namespace)
            && !self
                .namespace_selectors
                .iter()
                .any(|s| s.matches(namespace_labels))
        {
            let mut scope: Vec<String> = self.namespaces.clone();
            scope.extend(
                self.namespace_selectors
                    .iter()
                    .map(|s| format!("namespaces labelled {s}")),
            );
            return Some(format!(
                "pool {:?} serves the namespaces {} only",
                self.name,
                scope.join(", ")
            ));
        }
        if let Some(selector) = &self.service_selector
            && !selector.matches(labels)
        {
            return Some(format!(
                "pool {:?} serves Services labelled {selector} only",
                self.name
            ));
        }
        if !any_selects(&self.service_selectors, labels) {
            let wanted: Vec<String> = self
                .service_selectors
                .iter()
                .map(|s| format!("({s})"))
                .collect();
            return Some(format!(
                "pool {:?} serves Services labelled {} only",
                self.name,
                wanted.join(" or ")
            ));
        }
        None
    }

    /// Whether the pool may give out `ip` (`avoidBuggyIPs` keeps IPv4 `.0` and `.255` back).
    pub fn gives_out(&self, ip: IpAddr) -> bool {
        !(self.avoid_buggy_ips && matches!(ip, IpAddr::V4(v4) if matches!(v4.octets()[3], 0 | 255)))
    }

    /// Whether a node labelled `labels` may announce the pool's VIPs (`nodeSelectors`).
    pub fn announced_by(&self, labels: &BTreeMap<String, String>) -> bool {
        any_selects(&self.node_selectors, labels)
    }

    /// Every label key the pool's Service selectors read.
    pub fn service_label_keys(&self) -> impl Iterator<Item = &str> {
        self.service_selector
            .iter()
            .chain(&self.service_selectors)
            .flat_map(LabelSelector::keys)
    }
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    first: IpAddr,
    last: IpAddr,
}

impl AddressRange {
    /// The addresses from `first` to `last` (inclusive); `None` if their families differ or
    /// `first > last`.
    pub fn new(first: IpAddr, last: IpAddr) -> Option<Self> {
        (first.is_ipv4() == last.is_ipv4() && first <= last).then_some(Self { first, last })
    }

    /// The lowest address.
    pub fn first(&self) -> IpAddr {
        self.first
    }

    /// The highest address.
    pub fn last(&self) -> IpAddr {
        self.last
    }

    /// The block the range covers as a CIDR would (with the network and broadcast addresses a CIDR
    /// pool does not hand out, and the IPv6 subnet-router anycast address), or the range itself
    /// when it is no such block.
    pub fn span(&self) -> (IpAddr, IpAddr) {
        let v4 = self.first.is_ipv4();
        let (first, last) = (to_u128(self.first), to_u128(self.last));
        let widened = if v4 {
            first.checked_sub(1).zip(last.checked_add(1))
        } else {
            first.checked_sub(1).map(|f| (f, last))
        };
        if let Some((low, high)) = widened {
            let size = high - low + 1;
            let aligned = size.is_power_of_two() && low % size == 0;
            let in_family = !v4 || high <= u128::from(u32::MAX);
            if aligned && in_family && size >= 4 {
                return (from_u128(low, v4), from_u128(high, v4));
            }
        }
        (self.first, self.last)
    }

    /// Whether `ip` lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.first.is_ipv4() && self.first <= ip && ip <= self.last
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.first.is_ipv4() == other.first.is_ipv4()
            && self.first <= other.last
            && other.first <= self.last
    }

    /// The addresses, lowest first (lazily: an IPv6 /64 is fine).
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + use<> {
        let (first, last, v4) = (
            to_u128(self.first),
            to_u128(self.last),
            self.first.is_ipv4(),
        );
        (first..=last).map(move |n| from_u128(n, v4))
    }
}

pub(super) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

pub(super) fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 {
        // In range by construction: both ends are IPv4.
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    } else {
        IpAddr::V6(n.into())
    }
}

impl FromStr for AddressRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let bad = |why: &str| {
            format!(
                "invalid address range {text:?}: {why} (expected a CIDR such as 127.240.0.0/16 or \
                 fd00::/120, or a range such as 127.0.10.1-127.0.10.50)"
            )
        };
        if let Some((first, last)) = text.split_once('-') {
            let first: IpAddr = first
                .trim()
                .parse()
                .map_err(|_| bad("the start is not an IP address"))?;
            let last: IpAddr = last
                .trim()
                .parse()
                .map_err(|_| bad("the end is not an IP address"))?;
            return Self::new(first, last).ok_or_else(|| {
                bad("the two ends must be of one family, the start not above the end")
            });
        }
        let net: ipnet::IpNet = text.parse().map_err(|_| bad("not a CIDR or range"))?;
        let (mut first, mut last) = (to_u128(net.network()), to_u128(net.broadcast()));
        // The network and broadcast addresses of an IPv4 subnet, and the subnet-router anycast
        // address of an IPv6 one, are not handed out.
        match net {
            ipnet::IpNet::V4(v4) if v4.prefix_len() < 31 => {
                first += 1;
                last -= 1;
            }
            ipnet::IpNet::V6(v6) if v6.prefix_len() < 127 => first += 1,
            _ => {}
        }
        let v4 = net.addr().is_ipv4();
        Ok(Self {
            first: from_u128(first, v4),
            last: from_u128(last, v4),
        })
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl<'de> Deserialize<'de> for AddressRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}
