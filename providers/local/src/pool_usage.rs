//! How full each pool is: addresses given out and free, by family, and the Services holding them. Pure;
//! the manager writes it where an operator looks (the status of MetalLB's `IPAddressPool`, for the
//! pools read from MetalLB's objects: `metallb::watch`).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use crate::config::{AddressPool, AddressRange, Config};

/// One pool's usage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// The pool's name.
    pub name: String,
    /// IPv4 addresses given out (a shared one once).
    pub assigned_v4: u64,
    /// IPv6 addresses given out.
    pub assigned_v6: u64,
    /// IPv4 addresses it may still give out (without those `avoidBuggyIPs` keeps back).
    pub available_v4: u64,
    /// IPv6 addresses it may still give out (at most `u64::MAX`).
    pub available_v6: u64,
    /// The Services (`namespace/name`) holding its addresses.
    pub services: BTreeSet<String>,
}

impl PoolUsage {
    /// The note of the `PoolExhausted` event about it; `what`: how the pool is named (`pool "web"`).
    pub fn exhausted_note(&self, what: &str) -> String {
        format!(
            "{what} has no free address of a family it has ({} IPv4 and {} IPv6 addresses given \
             out, {} and {} free): a Service that needs one gets none from it",
            self.assigned_v4, self.assigned_v6, self.available_v4, self.available_v6
        )
    }

    /// Whether it has addresses of a family and none of that family is free.
    pub fn exhausted(&self) -> bool {
        (self.available_v4 == 0 && self.assigned_v4 > 0)
            || (self.available_v6 == 0 && self.assigned_v6 > 0)
    }
}

/// How many addresses of `range` the pool may give out.
fn size(pool: &AddressPool, range: &AddressRange) -> u64 {
    let (first, last) = (to_u128(range.first()), to_u128(range.last()));
    let all = (last - first).saturating_add(1);
    let buggy = match range.first() {
        IpAddr::V4(_) if pool.avoid_buggy_ips => {
            // The addresses ending in .0 or .255: those congruent to 0 or 255 modulo 256.
            let upto = |n: i128, r: i128| if n < r { 0 } else { (n - r) / 256 + 1 };
            let (a, b) = (first as i128, last as i128);
            [0, 255]
                .iter()
                .map(|r| upto(b, *r) - upto(a - 1, *r))
                .sum::<i128>() as u128
        }
        _ => 0,
    };
    u64::try_from(all - buggy).unwrap_or(u64::MAX)
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The usage of every pool of `config`, given who holds which address (`owners`: VIP → Services).
pub fn usage(config: &Config, owners: &BTreeMap<IpAddr, BTreeSet<String>>) -> Vec<PoolUsage> {
    config
        .address_pools
        .iter()
        .map(|pool| {
            let mut out = PoolUsage {
                name: pool.name.clone(),
                ..PoolUsage::default()
            };
            let (mut total_v4, mut total_v6) = (0u64, 0u64);
            for range in &pool.addresses {
                let n = size(pool, range);
                match range.first() {
                    IpAddr::V4(_) => total_v4 = total_v4.saturating_add(n),
                    IpAddr::V6(_) => total_v6 = total_v6.saturating_add(n),
                }
            }
            for (ip, holders) in owners {
                if !pool.addresses.iter().any(|r| r.contains(*ip)) || !pool.gives_out(*ip) {
                    continue;
                }
                match ip {
                    IpAddr::V4(_) => out.assigned_v4 += 1,
                    IpAddr::V6(_) => out.assigned_v6 += 1,
                }
                out.services.extend(holders.iter().cloned());
            }
            out.available_v4 = total_v4.saturating_sub(out.assigned_v4);
            out.available_v6 = total_v6.saturating_sub(out.assigned_v6);
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(pairs: &[(&str, &str)]) -> BTreeMap<IpAddr, BTreeSet<String>> {
        let mut out: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
        for (ip, service) in pairs {
            out.entry(ip.parse().unwrap())
                .or_default()
                .insert((*service).to_owned());
        }
        out
    }

    #[test]
    fn usage_counts_by_family_once_per_shared_address() {
        let config = Config::parse(
            "loadBalancer: {mode: agents}\naddressPools:\n  - {name: a, addresses: [10.0.0.0/30, 'fd00::/126']}\n  - {name: b, addresses: [10.0.1.0-10.0.2.255], avoidBuggyIPs: true}\n",
            None,
        )
        .unwrap();
        let held = owners(&[
            ("10.0.0.1", "ns/x"),
            ("10.0.0.1", "ns/y"),
            ("fd00::1", "ns/x"),
            ("10.0.1.7", "ns/z"),
            ("10.9.9.9", "ns/elsewhere"),
        ]);
        let usage = usage(&config, &held);
        // The cloud-config's /30 gives out .1 and .2; the IPv6 /126 ::1 to ::3.
        assert_eq!(
            usage[0],
            PoolUsage {
                name: "a".into(),
                assigned_v4: 1,
                assigned_v6: 1,
                available_v4: 1,
                available_v6: 2,
                services: ["ns/x".to_owned(), "ns/y".to_owned()].into(),
            }
        );
        // 512 addresses, less 10.0.1.0, .1.255, .2.0 and .2.255.
        assert_eq!((usage[1].assigned_v4, usage[1].available_v4), (1, 507));
        assert!(!usage[0].exhausted());
        let full = owners(&[("10.0.0.1", "ns/x"), ("10.0.0.2", "ns/y")]);
        assert!(super::usage(&config, &full)[0].exhausted());
        // A pool with no address of a family is not exhausted for it.
        assert!(!super::usage(&config, &full)[1].exhausted());
    }
}
