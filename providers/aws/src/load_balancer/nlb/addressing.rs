//! Where an NLB answers: its subnet mappings (with the Elastic IPs or private addresses its
//! annotations fix), its IP address type, and the refusal of a fixed address the NLB was not made with.

use super::*;

/// An existing NLB's fixed addresses against the annotations: AWS sets them at creation only, so an
/// NLB without the Elastic IPs or private addresses the Service asks for is an error that says so (upstream
/// ignores the annotations after creation). Without the annotations, whatever the NLB has is kept.
pub(super) fn check_fixed_addresses(lb: &Elbv2LoadBalancer, spec: &LbSpec) -> Result<()> {
    let addresses = || {
        lb.availability_zones()
            .iter()
            .flat_map(|z| z.load_balancer_addresses().iter())
    };
    let mut eips: Vec<String> = addresses()
        .filter_map(|a| a.allocation_id().map(str::to_owned))
        .collect();
    let mut private: Vec<String> = addresses()
        .filter_map(|a| a.private_ipv4_address().map(str::to_owned))
        .collect();
    eips.sort();
    private.sort();
    let mut wanted_eips = spec.eip_allocations.clone();
    wanted_eips.sort();
    let mut wanted_private: Vec<String> = spec
        .private_ipv4_addresses
        .iter()
        .map(|a| a.to_string())
        .collect();
    wanted_private.sort();
    for (field, wanted, has) in [
        (spec::ANNOTATION_EIP_ALLOCATIONS, wanted_eips, eips),
        (
            spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
            wanted_private,
            private,
        ),
    ] {
        if !wanted.is_empty() && wanted != has {
            return Err(Error::Service {
                service: spec.service_name.clone(),
                field: field.to_owned(),
                message: format!(
                    "NLB {} has [{}], and AWS fixes an NLB's addresses when it is created: delete and re-create the Service to get [{}], or set the annotation to what the NLB has",
                    spec.name,
                    has.join(", "),
                    wanted.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// The NLB's IP address type: `dualstack` or `ipv4`.
pub(super) fn ip_address_type(spec: &LbSpec) -> IpAddressType {
    if spec.dual_stack {
        IpAddressType::Dualstack
    } else {
        IpAddressType::Ipv4
    }
}

impl LoadBalancers {
    /// The subnet mappings of a new NLB with fixed addresses (none without `eip-allocations` and
    /// `private-ipv4-addresses`): one address per subnet, as upstream requires. Elastic IPs go to the
    /// subnets in order (zones by name, or the `subnets` annotation's IDs sorted); each private address
    /// to the subnet whose CIDR holds it, so their order does not matter (upstream pairs them by order,
    /// and AWS refuses an address outside its subnet).
    pub(super) async fn subnet_mappings(
        &self,
        spec: &LbSpec,
        subnets: &[String],
    ) -> Result<Vec<SubnetMapping>> {
        if spec.eip_allocations.is_empty() && spec.private_ipv4_addresses.is_empty() {
            return Ok(Vec::new());
        }
        let bad = |field: &str, message: String| Error::Service {
            service: spec.service_name.clone(),
            field: field.to_owned(),
            message,
        };
        for (field, count) in [
            (spec::ANNOTATION_EIP_ALLOCATIONS, spec.eip_allocations.len()),
            (
                spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                spec.private_ipv4_addresses.len(),
            ),
        ] {
            if count != 0 && count != subnets.len() {
                return Err(bad(
                    field,
                    format!(
                        "{count} given for {} subnets ({}); the NLB needs exactly one per subnet",
                        subnets.len(),
                        subnets.join(", ")
                    ),
                ));
            }
        }
        let mut private: Vec<Option<std::net::Ipv4Addr>> = vec![None; subnets.len()];
        if !spec.private_ipv4_addresses.is_empty() {
            let blocks = self.subnet_cidr_blocks(subnets).await?;
            let cidr_of = |id: &str| -> Option<ipnet::Ipv4Net> {
                blocks
                    .iter()
                    .find(|(subnet, _)| subnet == id)
                    .and_then(|(_, cidr)| cidr.parse().ok())
            };
            for address in &spec.private_ipv4_addresses {
                let Some(index) = subnets
                    .iter()
                    .position(|id| cidr_of(id).is_some_and(|net| net.contains(address)))
                else {
                    return Err(bad(
                        spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                        format!(
                            "{address} is in none of the NLB's subnets ({})",
                            subnets.join(", ")
                        ),
                    ));
                };
                if let Some(other) = private[index] {
                    return Err(bad(
                        spec::ANNOTATION_PRIVATE_IPV4_ADDRESSES,
                        format!(
                            "{other} and {address} are both in subnet {}; the NLB takes one address per subnet",
                            subnets[index]
                        ),
                    ));
                }
                private[index] = Some(*address);
            }
        }
        Ok(subnets
            .iter()
            .enumerate()
            .map(|(i, id)| {
                SubnetMapping::builder()
                    .subnet_id(id)
                    .set_allocation_id(spec.eip_allocations.get(i).cloned())
                    .set_private_ipv4_address(private[i].map(|a| a.to_string()))
                    .build()
            })
            .collect())
    }

    /// An existing NLB's IP address type follows `ip-address-type` (`SetIpAddressType`; AWS refuses
    /// `dualstack` when a subnet of the NLB has no IPv6 CIDR, and the sync fails with its message).
    pub(super) async fn sync_ip_address_type(
        &self,
        lb: &Elbv2LoadBalancer,
        spec: &LbSpec,
    ) -> Result<()> {
        let wanted = ip_address_type(spec);
        // AWS reports `ipv4` for an NLB created without a type; moto may report none.
        let current = lb.ip_address_type().cloned().unwrap_or(IpAddressType::Ipv4);
        if current == wanted
            || self.previewed(|| {
                format!(
                    "the IP address type would change from {} to {}",
                    current.as_str(),
                    wanted.as_str()
                )
            })
        {
            return Ok(());
        }
        let elbv2 = &self.calls.clients.elbv2;
        let arn = lb.load_balancer_arn().unwrap_or_default();
        self.calls
            .call("elbv2:SetIpAddressType", || {
                elbv2
                    .set_ip_address_type()
                    .load_balancer_arn(arn)
                    .ip_address_type(wanted.clone())
                    .send()
            })
            .await?;
        Ok(())
    }
}
