//! An agent as a member of the membership protocol: its node's name, the address it listens on, and
//! a number that grows each time it rejoins (after a restart, or after the others declared it down),
//! so that its new self wins over what the others remember of the old one.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// One agent's identity in the membership protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Peer {
    /// The Node's name.
    pub node: String,
    /// Where its membership socket listens (the node's InternalIP).
    pub addr: SocketAddr,
    /// Grows at each rejoin (the process's start time in milliseconds, then one more per rejoin).
    pub bump: u64,
}

impl foca::Identity for Peer {
    type Addr = SocketAddr;

    /// Declared down by the others (a false suspicion, a partition that healed): rejoin as a newer
    /// self at once.
    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Two identities at one address: the newer self wins.
    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.bump > adversary.bump
    }
}

#[cfg(test)]
mod tests {
    use foca::Identity;

    use super::*;

    #[test]
    fn a_renewed_peer_wins_over_its_older_self() {
        let old = Peer {
            node: "n1".into(),
            addr: "10.0.0.1:10265".parse().unwrap(),
            bump: 7,
        };
        let new = old.renew().unwrap();
        assert_eq!((new.node.as_str(), new.addr, new.bump), ("n1", old.addr, 8));
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
    }
}
