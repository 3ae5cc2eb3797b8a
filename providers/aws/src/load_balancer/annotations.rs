//! Every `service.beta.kubernetes.io/aws-load-balancer-*` annotation a Service carries is either one
//! this provider implements for the Service's kind of load balancer or refused out loud:
//! cloud-provider-aws v1.37 reads 30 of them (`pkg/providers/v1/aws.go`), all implemented here, and a
//! Service that asks for TLS termination, say, must never get a plain TCP listener in silence. A refused annotation fails the Service's sync with a message naming it (a
//! `SyncLoadBalancerFailed` Warning event), and its load balancer is neither created nor changed until
//! the annotation is removed; deleting the Service still deletes it.

use k8s_openapi::api::core::v1::Service;

use super::spec::Kind;
use crate::NlbSecurityGroupMode;

/// The prefix every AWS load-balancer annotation has.
pub const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

/// What this provider does with an annotation (its name after [`PREFIX`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Support {
    /// Implemented for both kinds.
    Both,
    /// Implemented for Classic ELBs; on an NLB refused with this reason.
    ClassicOnly(&'static str),
    /// Implemented for NLBs; on a Classic ELB refused with this reason.
    NlbOnly(&'static str),
    /// Implemented for Classic ELBs, and for NLBs with `NLBSecurityGroupMode = Managed`; on an NLB
    /// without it refused with this reason (upstream ignores it there).
    ClassicOrManagedNlb(&'static str),
}

use Support::*;

/// Why a Classic ELB attribute's annotation is refused on an NLB.
const NO_CLASSIC_ATTRIBUTES: &str = "it sets a Classic ELB attribute, and cloud-provider-aws reads it for Classic ELBs only (an NLB has no such attribute, or upstream leaves it alone)";

/// Every annotation upstream reads, `scheme` (the AWS Load Balancer Controller's spelling of
/// `internal`, which this provider reads too) and `ip-address-type` (the same controller's, for
/// dual-stack NLBs, which upstream lacks).
const KNOWN: &[(&str, Support)] = &[
    ("type", Both),
    ("internal", Both),
    ("scheme", Both),
    ("subnets", Both),
    ("additional-resource-tags", Both),
    ("target-node-labels", Both),
    ("cross-zone-load-balancing-enabled", Both),
    ("healthcheck-protocol", Both),
    ("healthcheck-port", Both),
    ("healthcheck-path", Both),
    ("healthcheck-interval", Both),
    ("healthcheck-timeout", Both),
    ("healthcheck-healthy-threshold", Both),
    ("healthcheck-unhealthy-threshold", Both),
    (
        "security-groups",
        ClassicOrManagedNlb(
            "an NLB has security groups only with NLBSecurityGroupMode = Managed in the cloud-config's [Global] (cloud-provider-aws ignores the annotation without it)",
        ),
    ),
    (
        "extra-security-groups",
        ClassicOnly("BYO extra security group annotation is not supported by NLB (as upstream)"),
    ),
    ("ssl-cert", Both),
    ("ssl-ports", Both),
    ("ssl-negotiation-policy", Both),
    ("backend-protocol", Both),
    (
        "proxy-protocol",
        ClassicOnly(
            "cloud-provider-aws ignores it on an NLB; set target-group-attributes: proxy_protocol_v2.enabled=true instead",
        ),
    ),
    ("access-log-enabled", ClassicOnly(NO_CLASSIC_ATTRIBUTES)),
    (
        "access-log-emit-interval",
        ClassicOnly(NO_CLASSIC_ATTRIBUTES),
    ),
    (
        "access-log-s3-bucket-name",
        ClassicOnly(NO_CLASSIC_ATTRIBUTES),
    ),
    (
        "access-log-s3-bucket-prefix",
        ClassicOnly(NO_CLASSIC_ATTRIBUTES),
    ),
    (
        "connection-draining-enabled",
        ClassicOnly(NO_CLASSIC_ATTRIBUTES),
    ),
    (
        "connection-draining-timeout",
        ClassicOnly(NO_CLASSIC_ATTRIBUTES),
    ),
    (
        "connection-idle-timeout",
        ClassicOnly(NO_CLASSIC_ATTRIBUTES),
    ),
    (
        "target-group-attributes",
        NlbOnly("target group attributes annotation is only supported for NLB"),
    ),
    (
        "ip-address-type",
        NlbOnly("a Classic ELB has IPv4 addresses only; use an NLB (type: nlb) for dual-stack"),
    ),
    (
        "eip-allocations",
        NlbOnly("a Classic ELB's addresses are AWS's to choose"),
    ),
    (
        "private-ipv4-addresses",
        NlbOnly("a Classic ELB's addresses are AWS's to choose"),
    ),
];

/// Why the Service's annotations cannot be honoured: `(annotation, message)` of the first refused
/// one, in name order, or `None` when every annotation is one this provider implements for `kind`
/// (NLBs' security groups as `nlb_groups` has them).
pub fn refused(
    service: &Service,
    kind: Kind,
    nlb_groups: NlbSecurityGroupMode,
) -> Option<(String, String)> {
    let annotations = service.metadata.annotations.as_ref()?;
    annotations.keys().find_map(|key| {
        let name = key.strip_prefix(PREFIX)?;
        let message = match KNOWN.iter().find(|(known, _)| *known == name) {
            None => {
                "not an annotation cloud-provider-aws reads (check its spelling); the load balancer is left as it is until it is removed".to_owned()
            }
            Some((_, Both)) => return None,
            Some((_, ClassicOnly(why))) if kind == Kind::Nlb => {
                format!("not supported on an NLB: {why}")
            }
            Some((_, ClassicOrManagedNlb(why)))
                if kind == Kind::Nlb && nlb_groups == NlbSecurityGroupMode::Unmanaged =>
            {
                format!("not supported on an NLB: {why}")
            }
            Some((_, NlbOnly(why))) if kind == Kind::Classic => {
                format!("not supported on a Classic ELB: {why}")
            }
            Some((_, ClassicOnly(_) | NlbOnly(_) | ClassicOrManagedNlb(_))) => return None,
        };
        Some((key.clone(), message))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(annotations: &[(&str, &str)]) -> Service {
        let mut service = Service::default();
        service.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
                .chain([("other.example.com/x".to_owned(), "y".to_owned())])
                .collect(),
        );
        service
    }

    #[test]
    fn every_annotation_is_implemented_or_refused_by_name() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Kind, Option<(&'a str, &'a str)>);
        use NlbSecurityGroupMode::*;
        let cases: &[Case] = &[
            (&[], Kind::Classic, None),
            (
                &[("type", "nlb"), ("healthcheck-path", "/ready")],
                Kind::Nlb,
                None,
            ),
            (
                &[("ssl-cert", "arn:aws:acm:us-east-1:1:certificate/x")],
                Kind::Classic,
                None,
            ),
            (
                &[("proxy-protocol", "*"), ("ssl-ports", "443")],
                Kind::Nlb,
                Some(("proxy-protocol", "not supported on an NLB")),
            ),
            (
                &[("target-group-attributes", "proxy_protocol_v2.enabled=true")],
                Kind::Classic,
                Some(("target-group-attributes", "not supported on a Classic ELB")),
            ),
            (&[("eip-allocations", "eipalloc-1")], Kind::Nlb, None),
            (
                &[("eip-allocations", "eipalloc-1")],
                Kind::Classic,
                Some(("eip-allocations", "not supported on a Classic ELB")),
            ),
            (
                &[("conection-idle-timeout", "60")],
                Kind::Classic,
                Some((
                    "conection-idle-timeout",
                    "not an annotation cloud-provider-aws reads",
                )),
            ),
            (&[("extra-security-groups", "sg-1")], Kind::Classic, None),
            (
                &[("extra-security-groups", "sg-1")],
                Kind::Nlb,
                Some(("extra-security-groups", "not supported on an NLB")),
            ),
            (
                &[("security-groups", "sg-1")],
                Kind::Nlb,
                Some((
                    "security-groups",
                    "not supported on an NLB: an NLB has security groups only with NLBSecurityGroupMode = Managed",
                )),
            ),
        ];
        for (annotations, kind, expected) in cases {
            let got = refused(&service(annotations), *kind, Unmanaged);
            match (got, expected) {
                (None, None) => {}
                (Some((key, message)), Some((name, start))) => {
                    assert_eq!(key, format!("{PREFIX}{name}"), "{annotations:?}");
                    assert!(message.starts_with(start), "{annotations:?}: {message}");
                }
                (got, _) => panic!("{annotations:?}: {got:?}, expected {expected:?}"),
            }
        }
        // With managed NLB security groups, an NLB takes the groups it is given; extra ones stay
        // refused, as upstream refuses them.
        let byo = service(&[("security-groups", "sg-1")]);
        assert_eq!(refused(&byo, Kind::Nlb, Managed), None);
        assert_eq!(refused(&byo, Kind::Classic, Unmanaged), None);
        let extra = service(&[("extra-security-groups", "sg-1")]);
        assert!(refused(&extra, Kind::Nlb, Managed).is_some());
    }

    #[test]
    fn the_table_names_each_of_upstream_s_30_annotations_once() {
        let mut names: Vec<&str> = KNOWN.iter().map(|(n, _)| *n).collect();
        names.sort();
        names.dedup();
        // Upstream's 30, `scheme` and `ip-address-type`.
        assert_eq!(names.len(), 32);
    }
}
