//! The node-IPAM controller's configuration (from `--cluster-cidr`, the mask-size flags and
//! `--service-cluster-ip-range`) and the CIDR sets it describes.

use ipnet::IpNet;

use super::allocator::CidrSet;
use crate::cidrs::is_v4;

/// The node-IPAM controller's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The pod CIDRs of the cluster (`--cluster-cidr`): one, or an IPv4 and an IPv6 one.
    pub cluster_cidrs: Vec<IpNet>,
    /// The mask size of a node's CIDR in a single-stack cluster (`--node-cidr-mask-size`); `None`: the
    /// family's own size.
    pub node_mask_size: Option<u8>,
    /// The mask size of a node's IPv4 CIDR (`--node-cidr-mask-size-ipv4`).
    pub node_mask_size_ipv4: u8,
    /// The mask size of a node's IPv6 CIDR (`--node-cidr-mask-size-ipv6`).
    pub node_mask_size_ipv6: u8,
    /// The Services' cluster IP ranges (`--service-cluster-ip-range`), never handed to a node.
    pub service_ranges: Vec<IpNet>,
}

impl Config {
    /// The node CIDR sets this describes, each with the service ranges occupied; an error names the
    /// flag at fault.
    pub fn cidr_sets(&self) -> Result<Vec<CidrSet>, String> {
        let dual = self.cluster_cidrs.len() == 2;
        if dual && self.node_mask_size.is_some() {
            return Err("--node-cidr-mask-size cannot be used with a dual-stack --cluster-cidr; use --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6".to_owned());
        }
        self.cluster_cidrs
            .iter()
            .map(|&cluster| {
                let mask = match (dual, is_v4(&cluster), self.node_mask_size) {
                    (false, _, Some(size)) => size,
                    (_, true, _) => self.node_mask_size_ipv4,
                    (_, false, _) => self.node_mask_size_ipv6,
                };
                let mut set = CidrSet::new(cluster, mask)
                    .map_err(|err| format!("--cluster-cidr {cluster}: {err}"))?;
                for service in &self.service_ranges {
                    set.occupy(service);
                }
                Ok(set)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(cluster: &str, size: u8, services: &str) -> Config {
        let cidrs = |list: &str| -> Vec<IpNet> {
            list.split(',')
                .filter(|c| !c.is_empty())
                .map(|c| c.parse::<IpNet>().unwrap().trunc())
                .collect()
        };
        Config {
            cluster_cidrs: cidrs(cluster),
            node_mask_size: (size != 0).then_some(size),
            node_mask_size_ipv4: 24,
            node_mask_size_ipv6: 64,
            service_ranges: cidrs(services),
        }
    }

    #[test]
    fn mask_sizes_follow_the_stack() {
        let config = options("10.244.0.0/16", 0, "");
        let sets = config.cidr_sets().unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].free(), 256);
        let config = options("10.244.0.0/16", 26, "");
        assert_eq!(config.cidr_sets().unwrap()[0].free(), 1024);
        let config = options("10.244.0.0/16,fd00:10:244::/56", 0, "");
        let sets = config.cidr_sets().unwrap();
        assert_eq!((sets[0].free(), sets[1].free()), (256, 256));
        let config = options("10.244.0.0/16,fd00:10:244::/56", 24, "");
        assert!(
            config
                .cidr_sets()
                .unwrap_err()
                .contains("--node-cidr-mask-size cannot be used")
        );
    }

    #[test]
    fn the_service_range_is_never_handed_out() {
        let config = options("10.0.0.0/16", 0, "10.0.0.0/20");
        let mut sets = config.cidr_sets().unwrap();
        assert_eq!(sets[0].free(), 256 - 16);
        assert_eq!(sets[0].allocate().unwrap().to_string(), "10.0.16.0/24");
    }
}
