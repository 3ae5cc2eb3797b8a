//! `--cluster-cidr`-style CIDR lists: one CIDR, or an IPv4 and an IPv6 one (dual-stack), as upstream
//! parses them for the route and node-IPAM controllers.

use ipnet::IpNet;

/// Parses a comma-separated CIDR list for `flag`: one CIDR, or one IPv4 and one IPv6. An empty list is an
/// error (the controllers that need it cannot run without it).
pub fn parse_cidr_list(flag: &str, value: &str) -> Result<Vec<IpNet>, String> {
    if value.trim().is_empty() {
        return Err(format!(
            "{flag} is empty; it must be set (e.g. 10.244.0.0/16, or 10.244.0.0/16,fd00:10:244::/56)"
        ));
    }
    let cidrs = value
        .split(',')
        .map(|part| {
            part.trim()
                .parse::<IpNet>()
                .map_err(|_| format!("{flag}: {part:?} is not a CIDR"))
                .map(|net| net.trunc())
        })
        .collect::<Result<Vec<_>, _>>()?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if is_v4(a) != is_v4(b) => Ok(cidrs),
        [_, _] => Err(format!(
            "{flag}: two CIDRs must be one IPv4 and one IPv6, got {value:?}"
        )),
        _ => Err(format!(
            "{flag}: at most two CIDRs (one IPv4, one IPv6), got {value:?}"
        )),
    }
}

/// Whether a network is IPv4.
pub fn is_v4(net: &IpNet) -> bool {
    matches!(net, IpNet::V4(_))
}

/// Whether `cidr` (a route's destination) lies in `cluster`: its first or last address is contained.
pub fn overlaps(cluster: &IpNet, cidr: &IpNet) -> bool {
    cluster.contains(&cidr.network()) || cluster.contains(&cidr.broadcast())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_dual_stack_lists() {
        assert_eq!(
            parse_cidr_list("--cluster-cidr", "10.244.0.0/16")
                .unwrap()
                .len(),
            1
        );
        let dual = parse_cidr_list("--cluster-cidr", "10.244.0.0/16, fd00:10:244::/56").unwrap();
        assert_eq!(dual.len(), 2);
        assert!(is_v4(&dual[0]) && !is_v4(&dual[1]));
        // Host bits are dropped, as Go's ParseCIDR does.
        assert_eq!(
            parse_cidr_list("--cluster-cidr", "10.244.3.7/16").unwrap()[0].to_string(),
            "10.244.0.0/16"
        );
    }

    #[test]
    fn bad_lists_name_the_flag() {
        for (value, needle) in [
            ("", "--cluster-cidr is empty"),
            ("10.244.0.0", "is not a CIDR"),
            ("10.0.0.0/8,10.1.0.0/16", "one IPv4 and one IPv6"),
            ("10.0.0.0/8,fd00::/48,10.1.0.0/16", "at most two"),
        ] {
            let err = parse_cidr_list("--cluster-cidr", value).unwrap_err();
            assert!(
                err.contains(needle) && err.contains("--cluster-cidr"),
                "{value:?}: {err}"
            );
        }
    }

    #[test]
    fn overlap_uses_first_or_last_address() {
        let cluster: IpNet = "10.244.0.0/16".parse().unwrap();
        assert!(overlaps(&cluster, &"10.244.7.0/24".parse().unwrap()));
        // A wider range whose first and last addresses lie outside does not count (upstream's rule).
        assert!(!overlaps(&cluster, &"10.0.0.0/8".parse().unwrap()));
        assert!(!overlaps(&cluster, &"10.99.0.0/24".parse().unwrap()));
    }
}
