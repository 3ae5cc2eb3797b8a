//! `--tls-curve-preferences` (k8s.io/apiserver v0.37.1's secure serving): the key exchanges the secure
//! port allows, as numeric Go `crypto/tls` CurveID values, which are the TLS named-group code points.
//! As in Go, the order of the list is ignored (the TLS stack keeps its own preference order) and an
//! empty list means the defaults.
//!
//! This manager's TLS stack (rustls with ring) offers 29 (X25519), 23 (P-256) and 24 (P-384). A curve
//! Go knows but this stack cannot offer (25, P-521; the hybrid post-quantum 4587, 4588, 4589) is
//! refused by name, as are upstream's own refusals (out of range, duplicates, IDs Go does not know).

use rustls::{NamedGroup, crypto::CryptoProvider};

/// Go's CurveID names (crypto/tls, Go 1.26), by ID.
const GO_CURVES: &[(u16, &str)] = &[
    (23, "P-256"),
    (24, "P-384"),
    (25, "P-521"),
    (29, "X25519"),
    (4587, "SecP256r1MLKEM768"),
    (4588, "X25519MLKEM768"),
    (4589, "SecP384r1MLKEM1024"),
];

fn go_name(id: u16) -> Option<&'static str> {
    GO_CURVES.iter().find(|(i, _)| *i == id).map(|(_, n)| *n)
}

/// The provider the secure port is served with.
pub(crate) fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The curves `--tls-curve-preferences` allows; empty: the TLS stack's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsCurves(Vec<NamedGroup>);

impl TlsCurves {
    /// Parses the flag: comma-separated Go CurveIDs, each one this manager's TLS stack offers.
    pub fn parse(text: &str) -> Result<Self, String> {
        let offered: Vec<NamedGroup> = provider().kx_groups.iter().map(|g| g.name()).collect();
        let offered_text = || {
            GO_CURVES
                .iter()
                .filter(|(id, _)| offered.contains(&NamedGroup::from(*id)))
                .map(|(id, name)| format!("{id} ({name})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut groups = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let id: i64 = item
                .parse()
                .map_err(|_| format!("{item:?} is not a number (a Go crypto/tls CurveID)"))?;
            let id = u16::try_from(id).ok().filter(|id| *id > 0).ok_or_else(|| {
                format!("curve preference {id} is out of range (must be 1-65535)")
            })?;
            let group = NamedGroup::from(id);
            if groups.contains(&group) {
                return Err(format!("duplicate curve preference {id}"));
            }
            let Some(name) = go_name(id) else {
                return Err(format!(
                    "curve preference {id} is not a Go crypto/tls CurveID (this manager offers {})",
                    offered_text()
                ));
            };
            if !offered.contains(&group) {
                return Err(format!(
                    "curve preference {id} ({name}) is not offered by this manager's TLS stack (rustls with ring); it offers {}",
                    offered_text()
                ));
            }
            groups.push(group);
        }
        // The order means nothing (as in Go): kept sorted, so equal sets compare equal.
        groups.sort_by_key(|g| u16::from(*g));
        Ok(Self(groups))
    }

    /// Keeps only the allowed key exchanges in `provider`, in its own order (Go ignores the list's
    /// order too); nothing when the flag is empty.
    pub fn restrict(&self, provider: &mut CryptoProvider) {
        if !self.0.is_empty() {
            provider.kx_groups.retain(|g| self.0.contains(&g.name()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restricted(text: &str) -> Vec<NamedGroup> {
        let mut provider = provider();
        TlsCurves::parse(text).unwrap().restrict(&mut provider);
        provider.kx_groups.iter().map(|g| g.name()).collect()
    }

    #[test]
    fn the_curves_the_stack_offers_restrict_the_key_exchanges_in_its_own_order() {
        let all = restricted("");
        assert_eq!(
            all,
            [
                NamedGroup::X25519,
                NamedGroup::secp256r1,
                NamedGroup::secp384r1
            ]
        );
        assert_eq!(restricted("23"), [NamedGroup::secp256r1]);
        assert_eq!(
            restricted("24, 29"),
            [NamedGroup::X25519, NamedGroup::secp384r1]
        );
        assert_eq!(restricted("24,23,29"), all);
        assert_eq!(TlsCurves::parse(",").unwrap(), TlsCurves::default());
    }

    #[test]
    fn what_it_cannot_honour_is_refused_by_name() {
        for (text, why) in [
            ("25", "curve preference 25 (P-521) is not offered"),
            (
                "29,4588",
                "curve preference 4588 (X25519MLKEM768) is not offered",
            ),
            ("4587", "(SecP256r1MLKEM768) is not offered"),
            ("30", "curve preference 30 is not a Go crypto/tls CurveID"),
            ("0", "curve preference 0 is out of range"),
            ("70000", "curve preference 70000 is out of range"),
            ("-1", "out of range"),
            ("23,23", "duplicate curve preference 23"),
            ("P-256", "\"P-256\" is not a number"),
        ] {
            let err = TlsCurves::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let err = TlsCurves::parse("25").unwrap_err();
        assert!(
            err.contains("it offers 23 (P-256), 24 (P-384), 29 (X25519)"),
            "{err}"
        );
    }
}
