//! An NLB's addressing read from the Service: its IP address type, and the Elastic IPs or private
//! addresses its annotations fix.

use super::*;

/// Whether the NLB is dual-stack: `ip-address-type` (`ipv4`, the default, or `dualstack`; any other
/// value is refused). A single-stack IPv6 Service is refused: its node ports listen on the nodes' IPv6
/// addresses, and a load balancer's instance targets here are the nodes' IPv4 ones (upstream builds
/// that load balancer, and no client reaches the Service through it).
pub(super) fn ip_address_type(
    service: &Service,
    kind: Kind,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<bool, Error> {
    let families: Vec<&str> = service
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .map(|f| f.iter().map(String::as_str).collect())
        .unwrap_or_default();
    if families == ["IPv6"] {
        return Err(bad(
            "spec.ipFamilies",
            "a single-stack IPv6 Service cannot be served by a load balancer whose targets are the nodes' IPv4 addresses; make it dual-stack (ipFamilyPolicy: PreferDualStack) with an NLB (type: nlb, ip-address-type: dualstack)".into(),
        ));
    }
    let _ = kind;
    match service_annotation(service, ANNOTATION_IP_ADDRESS_TYPE).map(str::trim) {
        None | Some("") | Some("ipv4") => Ok(false),
        Some("dualstack") => Ok(true),
        Some(other) => Err(bad(
            ANNOTATION_IP_ADDRESS_TYPE,
            format!("{other:?} is neither ipv4 nor dualstack"),
        )),
    }
}

/// The NLB's fixed addresses: `eip-allocations` (`eipalloc-…` IDs, for an internet-facing NLB) and
/// `private-ipv4-addresses` (IPv4 addresses, for an internal one), comma-separated, each without
/// repeats. AWS takes an Elastic IP only on an internet-facing NLB and a private address only on an
/// internal one: the other way round is refused here, by name, rather than by AWS at creation. (Only
/// on NLBs: the annotation table refuses them on a Classic ELB.)
pub(super) fn fixed_addresses(
    service: &Service,
    internal: bool,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<(Vec<String>, Vec<std::net::Ipv4Addr>), Error> {
    let entries = |key: &str| -> Result<Vec<String>, Error> {
        let Some(raw) = service_annotation(service, key) else {
            return Ok(Vec::new());
        };
        let entries: Vec<String> = raw.split(',').map(|e| e.trim().to_owned()).collect();
        if entries.iter().any(String::is_empty) {
            return Err(bad(key, format!("{raw:?} has an empty entry")));
        }
        let mut sorted = entries.clone();
        sorted.sort();
        if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(key, format!("{:?} is listed twice", pair[0])));
        }
        Ok(entries)
    };
    let eips = entries(ANNOTATION_EIP_ALLOCATIONS)?;
    if let Some(e) = eips.iter().find(|e| !e.starts_with("eipalloc-")) {
        return Err(bad(
            ANNOTATION_EIP_ALLOCATIONS,
            format!("{e:?} is not an Elastic IP allocation ID (eipalloc-…)"),
        ));
    }
    if !eips.is_empty() && internal {
        return Err(bad(
            ANNOTATION_EIP_ALLOCATIONS,
            "Elastic IPs are for an internet-facing NLB, and this one is internal; use private-ipv4-addresses".into(),
        ));
    }
    let private = entries(ANNOTATION_PRIVATE_IPV4_ADDRESSES)?
        .iter()
        .map(|a| {
            a.parse::<std::net::Ipv4Addr>().map_err(|_| {
                bad(
                    ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                    format!("{a:?} is not an IPv4 address"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !private.is_empty() && !internal {
        return Err(bad(
            ANNOTATION_PRIVATE_IPV4_ADDRESSES,
            "private IPv4 addresses are for an internal NLB (aws-load-balancer-internal: \"true\"), and this one is internet-facing; use eip-allocations".into(),
        ));
    }
    Ok((eips, private))
}
