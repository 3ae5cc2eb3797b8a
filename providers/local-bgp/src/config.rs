//! A peer's settings, checked once before any connection is tried.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::Error;
use crate::bfd::BfdProfile;

/// The standard BGP port.
pub const BGP_PORT: u16 = 179;

/// One router to announce routes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// The router's address.
    pub address: IpAddr,
    /// The router's port (179).
    pub port: u16,
    /// The router's AS number.
    pub peer_asn: u32,
    /// Our AS number (the same as `peer_asn` makes the session iBGP).
    pub local_asn: u32,
    /// Our BGP identifier (the node's IPv4 address, as a rule).
    pub router_id: Ipv4Addr,
    /// The hold time we propose, in seconds: 0 (no keepalives) or 3 to 65535. The session uses the
    /// smaller of ours and the router's, and sends a KEEPALIVE every third of it.
    pub hold_time: u16,
    /// The address the connection leaves from (the node's address on the router's network); the
    /// kernel picks one when unset.
    pub source: Option<IpAddr>,
    /// The TTL of our packets to an eBGP peer more than one hop away (eBGP multihop); single-hop
    /// eBGP sends 1, iBGP the system's default.
    pub ebgp_multihop: Option<u8>,
    /// The next hop of IPv4 routes; unset, the connection's own address when it is IPv4.
    pub next_hop_v4: Option<Ipv4Addr>,
    /// The next hop of IPv6 routes; unset, the connection's own address when it is IPv6.
    pub next_hop_v6: Option<Ipv6Addr>,
    /// The first wait before connecting again after a failure; it doubles up to
    /// [`PeerConfig::max_connect_retry`].
    pub connect_retry: Duration,
    /// The longest wait between attempts.
    pub max_connect_retry: Duration,
    /// Graceful restart (RFC 4724): the restart time announced, in seconds (at most 4095), for which
    /// a router keeps our routes after the session closed without a NOTIFICATION
    /// ([`crate::Peer::stop_for_restart`]); `None`: not announced.
    pub graceful_restart: Option<u16>,
    /// This speaker restarted (a node agent that took over from the one before it): its first OPEN
    /// says so (the graceful restart capability's R bit).
    pub restarted: bool,
    /// The TCP MD5 key shared with the router (RFC 2385; 1 to 80 bytes).
    pub password: Option<Password>,
    /// BFD with the router (single hop), with these timers: the session ends as soon as BFD finds
    /// the router gone. Needs [`crate::Peer::start_with_bfd`].
    pub bfd: Option<BfdProfile>,
    /// Passive (RFC 4271 §8.1.1, `PassiveTcpEstablishment`): we never connect; the router connects
    /// to us at this address and port (the node's address and [`BGP_PORT`], as a rule), and a
    /// connection from the router's address becomes the session. `None`: active, as usual.
    pub passive: Option<SocketAddr>,
}

/// A TCP MD5 key; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub Vec<u8>);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Password(<{} bytes>)", self.0.len())
    }
}

impl PeerConfig {
    /// A peer with the usual settings: port 179, hold time 90 s, retries from 1 s to 30 s.
    pub fn new(address: IpAddr, peer_asn: u32, local_asn: u32, router_id: Ipv4Addr) -> PeerConfig {
        PeerConfig {
            address,
            port: BGP_PORT,
            peer_asn,
            local_asn,
            router_id,
            hold_time: 90,
            source: None,
            ebgp_multihop: None,
            next_hop_v4: None,
            next_hop_v6: None,
            connect_retry: Duration::from_secs(1),
            max_connect_retry: Duration::from_secs(30),
            graceful_restart: None,
            restarted: false,
            password: None,
            bfd: None,
            passive: None,
        }
    }

    /// The router's socket address.
    pub fn socket_address(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// Whether the router is in another AS.
    pub fn is_external(&self) -> bool {
        self.peer_asn != self.local_asn
    }

    /// Checks every setting, naming the first that is wrong.
    pub fn validate(&self) -> Result<(), Error> {
        let problem = self
            .session_problem()
            .or_else(|| self.transport_problem())
            .or_else(|| self.graceful_restart_problem())
            .or_else(|| self.password_problem())
            .or_else(|| self.bfd_problem())
            .or_else(|| self.passive_problem())
            .or_else(|| self.retry_problem());
        match problem {
            Some(what) => Err(Error::Config {
                peer: self.socket_address().to_string(),
                what,
            }),
            None => Ok(()),
        }
    }

    /// What is wrong with the session's own settings, if anything: the router's address and port,
    /// the AS numbers, the router ID, the hold time.
    fn session_problem(&self) -> Option<String> {
        if self.address.is_unspecified() || self.address.is_multicast() {
            return Some(format!(
                "address {} is not a router's address",
                self.address
            ));
        }
        if self.port == 0 {
            return Some("port 0".into());
        }
        for (name, asn) in [("peer ASN", self.peer_asn), ("local ASN", self.local_asn)] {
            // 0 is reserved (RFC 7607) and 23456 stands for a 4-octet AS (RFC 6793).
            if asn == 0 || asn == u32::from(crate::wire::AS_TRANS) {
                return Some(format!(
                    "{name} {asn} is reserved (RFC 7607, RFC 6793): use your AS number"
                ));
            }
        }
        if self.router_id.is_unspecified() {
            return Some("router ID 0.0.0.0 (use the node's IPv4 address)".into());
        }
        if matches!(self.hold_time, 1 | 2) {
            return Some(format!(
                "hold time {} s: 0 (no keepalives) or at least 3 s",
                self.hold_time
            ));
        }
        None
    }

    /// What is wrong with how our packets leave, if anything: the source address's family, the
    /// eBGP multihop TTL.
    fn transport_problem(&self) -> Option<String> {
        if let Some(source) = self.source
            && source.is_ipv4() != self.address.is_ipv4()
        {
            return Some(format!(
                "source address {source} is not of the peer's family"
            ));
        }
        if self.ebgp_multihop == Some(0) {
            return Some("eBGP multihop TTL 0 (1 to 255)".into());
        }
        if self.ebgp_multihop.is_some() && !self.is_external() {
            return Some("eBGP multihop on an iBGP peer (same AS): leave it out".into());
        }
        None
    }

    /// What is wrong with the graceful restart time, if anything: it has 12 bits.
    fn graceful_restart_problem(&self) -> Option<String> {
        self.graceful_restart.filter(|t| *t > 4095).map(|time| {
            format!("graceful restart time {time} s: at most 4095 s (12 bits, RFC 4724)")
        })
    }

    /// What is wrong with the TCP MD5 password, if anything: its length.
    fn password_problem(&self) -> Option<String> {
        let Password(key) = self.password.as_ref()?;
        (key.is_empty() || key.len() > crate::md5::MAX_KEY_LEN).then(|| {
            format!(
                "a TCP MD5 password of {} bytes: 1 to {} bytes",
                key.len(),
                crate::md5::MAX_KEY_LEN
            )
        })
    }

    /// What is wrong with BFD, if anything: a multihop peer, or the profile's timers.
    fn bfd_problem(&self) -> Option<String> {
        let profile = self.bfd.as_ref()?;
        if self.ebgp_multihop.is_some() {
            return Some(
                "BFD with an eBGP multihop peer: multihop BFD (RFC 5883) is not implemented".into(),
            );
        }
        profile.problem()
    }

    /// What is wrong with the passive peer's listening address, if anything: port 0, or another
    /// family than the router's (unless it is `[::]`, which takes both).
    fn passive_problem(&self) -> Option<String> {
        let listen = self.passive?;
        if listen.port() == 0 {
            return Some(format!("passive on {listen}: port 0"));
        }
        if listen.is_ipv4() != self.address.is_ipv4()
            && !matches!(listen.ip(), IpAddr::V6(v6) if v6.is_unspecified())
        {
            return Some(format!(
                "passive on {listen}: not of the peer's family (listen on [::] for both)"
            ));
        }
        None
    }

    /// What is wrong with the connect retry waits, if anything: the first must be above 0 and at
    /// most the longest.
    fn retry_problem(&self) -> Option<String> {
        (self.connect_retry.is_zero() || self.max_connect_retry < self.connect_retry).then(|| {
            format!(
                "connect retry {:?} must be above 0 and at most the maximum {:?}",
                self.connect_retry, self.max_connect_retry
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerConfig {
        PeerConfig::new(
            "192.168.0.1".parse().unwrap(),
            64512,
            64513,
            Ipv4Addr::new(192, 168, 0, 2),
        )
    }

    #[test]
    fn each_wrong_setting_is_named() {
        let cases: Vec<(PeerConfig, &str)> = vec![
            (
                PeerConfig {
                    address: "0.0.0.0".parse().unwrap(),
                    ..peer()
                },
                "address 0.0.0.0 is not a router's address",
            ),
            (PeerConfig { port: 0, ..peer() }, "port 0"),
            (
                PeerConfig {
                    passive: Some("192.168.0.2:0".parse().unwrap()),
                    ..peer()
                },
                "passive on 192.168.0.2:0: port 0",
            ),
            (
                PeerConfig {
                    passive: Some("[fd00::2]:179".parse().unwrap()),
                    ..peer()
                },
                "passive on [fd00::2]:179: not of the peer's family",
            ),
            (
                PeerConfig {
                    peer_asn: 0,
                    ..peer()
                },
                "peer ASN 0 is reserved",
            ),
            (
                PeerConfig {
                    local_asn: 23456,
                    ..peer()
                },
                "local ASN 23456 is reserved",
            ),
            (
                PeerConfig {
                    router_id: Ipv4Addr::UNSPECIFIED,
                    ..peer()
                },
                "router ID 0.0.0.0",
            ),
            (
                PeerConfig {
                    hold_time: 2,
                    ..peer()
                },
                "hold time 2 s",
            ),
            (
                PeerConfig {
                    source: Some("::1".parse().unwrap()),
                    ..peer()
                },
                "source address ::1 is not of the peer's family",
            ),
            (
                PeerConfig {
                    ebgp_multihop: Some(0),
                    ..peer()
                },
                "eBGP multihop TTL 0",
            ),
            (
                PeerConfig {
                    ebgp_multihop: Some(2),
                    local_asn: 64512,
                    ..peer()
                },
                "eBGP multihop on an iBGP peer",
            ),
            (
                PeerConfig {
                    connect_retry: Duration::ZERO,
                    ..peer()
                },
                "connect retry 0ns must be above 0",
            ),
            (
                PeerConfig {
                    bfd: Some(BfdProfile::default()),
                    ebgp_multihop: Some(2),
                    ..peer()
                },
                "multihop BFD (RFC 5883) is not implemented",
            ),
            (
                PeerConfig {
                    bfd: Some(BfdProfile {
                        detect_multiplier: 1,
                        ..BfdProfile::default()
                    }),
                    ..peer()
                },
                "BFD detect multiplier 1: it must be from 2 to 255",
            ),
            (
                PeerConfig {
                    bfd: Some(BfdProfile {
                        transmit_interval: Duration::from_millis(5),
                        ..BfdProfile::default()
                    }),
                    ..peer()
                },
                "BFD transmit interval 5ms: it must be from 10 ms to 60 s",
            ),
        ];
        for (config, expected) in cases {
            let error = config.validate().unwrap_err().to_string();
            let peer = format!("BGP peer {}: ", config.socket_address());
            assert!(error.starts_with(&peer), "{error}");
            assert!(
                error.contains(expected),
                "{error} does not say {expected:?}"
            );
        }
        peer().validate().unwrap();
        let secret = PeerConfig {
            password: Some(Password(b"secret".to_vec())),
            ..peer()
        };
        assert!(
            !format!("{secret:?}").contains("secret\""),
            "the key is never printed"
        );
        PeerConfig {
            hold_time: 0,
            ..peer()
        }
        .validate()
        .unwrap();
    }
}
