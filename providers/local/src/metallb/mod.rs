//! MetalLB's objects (`metallb.io`: `IPAddressPool`, `L2Advertisement`, `BGPAdvertisement`,
//! `BGPPeer`, `BFDProfile`, `Community`) read as `local`'s configuration, so that a MetalLB user
//! switches without rewriting a pool.
//!
//! [`translate`] is pure: the objects of MetalLB's namespace in, the pools, BGP peers and BFD profiles
//! they make out, and a refusal for every object (or field of one) `local` does not take, which the
//! watcher (`watch`) records as a Warning event on the object. An object refused is left out; the
//! others are served. Where the semantics differ from MetalLB's, `docs/local-provider.md` ("Coming
//! from MetalLB") says how.

mod spec;
mod translate;
pub(crate) mod watch;

pub use translate::{Translation, translate, translate_keeping};

use std::collections::BTreeMap;

/// MetalLB's API group.
pub const GROUP: &str = "metallb.io";

/// The namespace MetalLB's objects are read from by default (MetalLB's own).
pub const DEFAULT_NAMESPACE: &str = "metallb-system";

/// The reason of the Warning event on a MetalLB object (or a Service's MetalLB annotation) that
/// `local` does not take, naming the field.
pub const EVENT_REFUSED: &str = "MetalLBObjectRefused";

/// A kind of MetalLB object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `IPAddressPool`.
    IpAddressPool,
    /// `L2Advertisement`.
    L2Advertisement,
    /// `BGPAdvertisement`.
    BgpAdvertisement,
    /// `BGPPeer`.
    BgpPeer,
    /// `BFDProfile`.
    BfdProfile,
    /// `Community`.
    Community,
}

impl Kind {
    /// Every kind, in the order they are read.
    pub const ALL: [Kind; 6] = [
        Kind::Community,
        Kind::BfdProfile,
        Kind::BgpPeer,
        Kind::IpAddressPool,
        Kind::L2Advertisement,
        Kind::BgpAdvertisement,
    ];

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::IpAddressPool => "IPAddressPool",
            Kind::L2Advertisement => "L2Advertisement",
            Kind::BgpAdvertisement => "BGPAdvertisement",
            Kind::BgpPeer => "BGPPeer",
            Kind::BfdProfile => "BFDProfile",
            Kind::Community => "Community",
        }
    }

    /// The version read (the CRDs' storage version).
    pub fn version(self) -> &'static str {
        match self {
            Kind::BgpPeer => "v1beta2",
            _ => "v1beta1",
        }
    }

    /// The resource's plural.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::IpAddressPool => "ipaddresspools",
            Kind::L2Advertisement => "l2advertisements",
            Kind::BgpAdvertisement => "bgpadvertisements",
            Kind::BgpPeer => "bgppeers",
            Kind::BfdProfile => "bfdprofiles",
            Kind::Community => "communities",
        }
    }
}

/// One MetalLB object, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Its labels (advertisements select pools by them).
    pub labels: BTreeMap<String, String>,
    /// When it was created (RFC 3339), which orders objects that conflict: the older one wins.
    pub created: String,
    /// Its `spec`, as written.
    pub spec: serde_json::Value,
}

/// An object, or a part of one, that `local` does not take: the message names the field and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refusal {
    /// The object's kind.
    pub kind: Kind,
    /// The object's name.
    pub name: String,
    /// What is refused, and why.
    pub message: String,
}
