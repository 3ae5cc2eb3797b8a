//! The range allocator: a cluster CIDR cut into node CIDRs of one size, each given out at most once
//! (upstream's `cidrset`).

use ipnet::IpNet;

/// How many more bits a node CIDR may have than the cluster CIDR (upstream's limit: 65,536 node CIDRs).
const MAX_EXTRA_BITS: u8 = 16;

/// The node CIDRs of one cluster CIDR.
#[derive(Debug, Clone)]
pub struct CidrSet {
    cluster: IpNet,
    mask: u8,
    used: Vec<bool>,
    /// How many of `used` are `false`.
    free: usize,
    /// Where the next search starts, so released CIDRs are not handed out again at once.
    next: usize,
}

/// No node CIDR is left in a cluster CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no /{mask} node CIDR left in {cluster} ({total} in all)")]
pub struct Exhausted {
    /// The cluster CIDR that is full.
    pub cluster: IpNet,
    /// The node CIDRs' prefix length.
    pub mask: u8,
    /// How many node CIDRs it has in all.
    pub total: usize,
}

/// One node CIDR from each of `sets` (a node's CIDRs, one per family), or none at all: when one set is
/// full, nothing is taken and the error names it.
pub fn take_one_each(sets: &mut [CidrSet]) -> Result<Vec<IpNet>, Exhausted> {
    if let Some(full) = sets.iter().find(|set| set.free() == 0) {
        return Err(full.exhausted());
    }
    Ok(sets
        .iter_mut()
        .map(|set| {
            set.allocate()
                .expect("a set with a free node CIDR allocates")
        })
        .collect())
}

/// Whether every one of `sets` has a node CIDR free (a node could get its CIDRs).
pub fn has_room(sets: &[CidrSet]) -> bool {
    sets.iter().all(|set| set.free() > 0)
}

impl CidrSet {
    /// The cluster CIDR.
    #[cfg(test)]
    pub fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// Node CIDRs of prefix length `mask` in `cluster`.
    pub fn new(cluster: IpNet, mask: u8) -> Result<Self, String> {
        let cluster = cluster.trunc();
        if mask < cluster.prefix_len() || mask > cluster.max_prefix_len() {
            return Err(format!(
                "node CIDR mask size /{mask} does not fit the cluster CIDR {cluster}"
            ));
        }
        let extra = mask - cluster.prefix_len();
        if extra > MAX_EXTRA_BITS {
            return Err(format!(
                "node CIDR mask size /{mask} makes 2^{extra} node CIDRs out of {cluster}; at most 2^{MAX_EXTRA_BITS} are allowed"
            ));
        }
        Ok(Self {
            cluster,
            mask,
            used: vec![false; 1usize << extra],
            free: 1usize << extra,
            next: 0,
        })
    }

    /// How many node CIDRs are free.
    pub fn free(&self) -> usize {
        self.free
    }

    /// The error saying this set is full.
    pub fn exhausted(&self) -> Exhausted {
        Exhausted {
            cluster: self.cluster,
            mask: self.mask,
            total: self.used.len(),
        }
    }

    fn offset(&self, ip: std::net::IpAddr) -> Option<u128> {
        match (self.cluster, ip) {
            (IpNet::V4(net), std::net::IpAddr::V4(ip)) => {
                Some(u128::from(u32::from(ip)).checked_sub(u128::from(u32::from(net.network())))?)
            }
            (IpNet::V6(net), std::net::IpAddr::V6(ip)) => {
                u128::from(ip).checked_sub(u128::from(net.network()))
            }
            _ => None,
        }
    }

    fn index_of(&self, ip: std::net::IpAddr) -> Option<usize> {
        if !self.cluster.contains(&ip) {
            return None;
        }
        let host_bits = u32::from(self.cluster.max_prefix_len() - self.mask);
        // 128 host bits (an IPv6 /0 cut into one /0): every address is in CIDR 0.
        usize::try_from(self.offset(ip)?.checked_shr(host_bits).unwrap_or(0)).ok()
    }

    fn cidr_at(&self, index: usize) -> IpNet {
        let host_bits = u32::from(self.cluster.max_prefix_len() - self.mask);
        let offset = (index as u128).checked_shl(host_bits).unwrap_or(0);
        match self.cluster {
            IpNet::V4(net) => {
                let ip = std::net::Ipv4Addr::from(u32::from(net.network()) + offset as u32);
                IpNet::new(ip.into(), self.mask).expect("the mask fits the family")
            }
            IpNet::V6(net) => {
                let ip = std::net::Ipv6Addr::from(u128::from(net.network()) + offset);
                IpNet::new(ip.into(), self.mask).expect("the mask fits the family")
            }
        }
    }

    /// The next free node CIDR, or `None` when the range is exhausted.
    pub fn allocate(&mut self) -> Option<IpNet> {
        if self.free == 0 {
            return None;
        }
        let count = self.used.len();
        let index = (0..count)
            .map(|i| (self.next + i) % count)
            .find(|i| !self.used[*i])?;
        self.used[index] = true;
        self.free -= 1;
        self.next = (index + 1) % count;
        Some(self.cidr_at(index))
    }

    /// Marks every node CIDR that `cidr` overlaps as used (a node's existing CIDR, or the service range).
    /// Returns `false` when `cidr` lies outside this set.
    pub fn occupy(&mut self, cidr: &IpNet) -> bool {
        self.mark(cidr, true)
    }

    /// Frees the node CIDRs `cidr` covers.
    pub fn release(&mut self, cidr: &IpNet) -> bool {
        self.mark(cidr, false)
    }

    fn mark(&mut self, cidr: &IpNet, used: bool) -> bool {
        let cidr = cidr.trunc();
        let clamp_first = if self.cluster.contains(&cidr.network()) {
            cidr.network()
        } else {
            self.cluster.network()
        };
        let clamp_last = if self.cluster.contains(&cidr.broadcast()) {
            cidr.broadcast()
        } else {
            self.cluster.broadcast()
        };
        if !(self.cluster.contains(&cidr.network())
            || self.cluster.contains(&cidr.broadcast())
            || cidr.contains(&self.cluster))
        {
            return false;
        }
        let (Some(first), Some(last)) = (self.index_of(clamp_first), self.index_of(clamp_last))
        else {
            return false;
        };
        for slot in &mut self.used[first..=last] {
            if *slot != used {
                *slot = used;
                if used {
                    self.free -= 1;
                } else {
                    self.free += 1;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn allocates_distinct_cidrs_until_exhausted() {
        let mut set = CidrSet::new(net("10.244.0.0/22"), 24).unwrap();
        let got: Vec<String> = (0..4)
            .map(|_| set.allocate().unwrap().to_string())
            .collect();
        assert_eq!(
            got,
            [
                "10.244.0.0/24",
                "10.244.1.0/24",
                "10.244.2.0/24",
                "10.244.3.0/24"
            ]
        );
        assert_eq!(set.allocate(), None);
        assert!(set.release(&net("10.244.1.0/24")));
        assert_eq!(set.allocate(), Some(net("10.244.1.0/24")));
    }

    /// A whole address space as one node CIDR, or cut into more CIDRs than the shift width: once a
    /// shift overflow (a panic in debug builds).
    #[test]
    fn whole_address_spaces_neither_overflow_nor_panic() {
        let mut whole = CidrSet::new(net("::/0"), 0).unwrap();
        assert_eq!(whole.allocate(), Some(net("::/0")));
        assert!(whole.release(&net("::/0")));
        assert!(whole.occupy(&net("::/0")));
        let mut v4 = CidrSet::new(net("0.0.0.0/0"), 0).unwrap();
        assert_eq!(v4.allocate(), Some(net("0.0.0.0/0")));
        let err = CidrSet::new(net("::/0"), 128).unwrap_err();
        assert_eq!(
            err,
            "node CIDR mask size /128 makes 2^128 node CIDRs out of ::/0; at most 2^16 are allowed"
        );
    }

    #[test]
    fn released_cidrs_are_not_reused_at_once() {
        let mut set = CidrSet::new(net("10.0.0.0/16"), 24).unwrap();
        let first = set.allocate().unwrap();
        set.release(&first);
        assert_ne!(set.allocate(), Some(first));
    }

    #[test]
    fn existing_and_service_ranges_are_occupied() {
        let mut set = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        assert!(set.occupy(&net("10.0.0.0/24")));
        assert!(set.occupy(&net("10.0.2.0/23"))); // covers two node CIDRs
        assert_eq!(set.free(), 1);
        assert_eq!(set.allocate(), Some(net("10.0.1.0/24")));
        assert!(!set.occupy(&net("192.168.0.0/24")), "outside the range");
        assert!(!set.occupy(&net("fd00::/64")), "another family");
    }

    #[test]
    fn the_free_count_follows_every_change() {
        let mut set = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        let count = |set: &CidrSet| set.used.iter().filter(|u| !**u).count();
        assert!(set.occupy(&net("10.0.0.0/23")));
        assert!(
            set.occupy(&net("10.0.1.0/24")),
            "occupied twice counts once"
        );
        assert_eq!((set.free(), count(&set)), (2, 2));
        set.allocate();
        assert!(
            set.release(&net("10.0.3.0/24")),
            "releasing a free one counts nothing"
        );
        assert_eq!((set.free(), count(&set)), (1, 1));
        assert!(set.release(&net("10.0.0.0/22")));
        assert_eq!((set.free(), count(&set)), (4, 4));
    }

    #[test]
    fn one_cidr_per_set_or_none_at_all() {
        let mut sets = vec![
            CidrSet::new(net("10.0.0.0/23"), 24).unwrap(),
            CidrSet::new(net("fd00::/63"), 64).unwrap(),
        ];
        assert!(sets[1].occupy(&net("fd00::/64")));
        assert!(has_room(&sets));
        assert_eq!(
            take_one_each(&mut sets),
            Ok(vec![net("10.0.0.0/24"), net("fd00:0:0:1::/64")])
        );
        assert!(!has_room(&sets));
        let err = take_one_each(&mut sets).unwrap_err();
        assert_eq!(err.cluster, net("fd00::/63"));
        assert_eq!(
            err.to_string(),
            "no /64 node CIDR left in fd00::/63 (2 in all)"
        );
        assert_eq!(sets[0].free(), 1, "the IPv4 set gave nothing");
    }

    #[test]
    fn ipv6_and_limits() {
        let mut set = CidrSet::new(net("fd00:10:244::/56"), 64).unwrap();
        assert_eq!(set.allocate(), Some(net("fd00:10:244::/64")));
        assert_eq!(set.allocate(), Some(net("fd00:10:244:1::/64")));
        assert_eq!(set.free(), 254);
        assert!(CidrSet::new(net("10.0.0.0/16"), 8).is_err());
        assert!(
            CidrSet::new(net("10.0.0.0/8"), 30)
                .unwrap_err()
                .contains("at most 2^16")
        );
        assert!(CidrSet::new(net("10.0.0.0/8"), 33).is_err());
    }
}
