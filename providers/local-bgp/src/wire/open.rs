//! OPEN (RFC 4271 §4.2) and the capabilities a speaker that announces routes uses (RFC 5492):
//! multiprotocol (RFC 4760), route refresh (RFC 2918), graceful restart (RFC 4724) and 4-octet AS
//! numbers (RFC 6793). Capabilities we do not know are kept as they came, never refused.

use std::net::Ipv4Addr;

use super::{Family, Malformed, codes};

/// The AS number an OPEN carries in its 2-octet field for a 4-octet one (RFC 6793).
pub const AS_TRANS: u16 = 23456;

const CAPABILITIES: u8 = 2;
const MULTIPROTOCOL: u8 = 1;
const ROUTE_REFRESH: u8 = 2;
const GRACEFUL_RESTART: u8 = 64;
const FOUR_OCTET_AS: u8 = 65;

/// An OPEN message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Open {
    /// The sender's AS number: from the 4-octet AS capability when there is one, else the 2-octet
    /// field.
    pub asn: u32,
    /// The hold time the sender proposes, in seconds (0, or at least 3).
    pub hold_time: u16,
    /// The sender's BGP identifier.
    pub router_id: Ipv4Addr,
    /// The capabilities, in the order they came.
    pub capabilities: Vec<Capability>,
}

/// A capability (RFC 5492).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capability {
    /// The sender exchanges routes of this family.
    Multiprotocol(Family),
    /// The sender answers ROUTE-REFRESH.
    RouteRefresh,
    /// The sender keeps routes across a restart.
    GracefulRestart(GracefulRestart),
    /// The sender's 4-octet AS number.
    FourOctetAs(u32),
    /// Any other, kept as it came.
    Other {
        /// The capability code.
        code: u8,
        /// Its value.
        value: Vec<u8>,
    },
}

/// The graceful restart capability (RFC 4724 §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GracefulRestart {
    /// The R bit: the sender has just restarted.
    pub restarting: bool,
    /// How long, in seconds (up to 4095), the receiver should keep the sender's routes after the
    /// session goes down.
    pub restart_time: u16,
    /// The families whose routes are kept, each with the F bit (forwarding kept across the restart).
    pub families: Vec<(Family, bool)>,
}

impl Open {
    /// Whether the sender announced a capability for which `matches` is true.
    pub fn has(&self, matches: impl Fn(&Capability) -> bool) -> bool {
        self.capabilities.iter().any(matches)
    }

    /// The families the sender announced. Without any multiprotocol capability, a speaker exchanges
    /// IPv4 unicast only (RFC 4760 §8).
    pub fn families(&self) -> Vec<Family> {
        let families: Vec<Family> = self
            .capabilities
            .iter()
            .filter_map(|c| match c {
                Capability::Multiprotocol(family) => Some(*family),
                _ => None,
            })
            .collect();
        if families.is_empty() {
            vec![Family::IPV4_UNICAST]
        } else {
            families
        }
    }

    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.push(4);
        let two_octet = u16::try_from(self.asn).unwrap_or(AS_TRANS);
        out.extend_from_slice(&two_octet.to_be_bytes());
        out.extend_from_slice(&self.hold_time.to_be_bytes());
        out.extend_from_slice(&self.router_id.octets());
        let mut capabilities = Vec::new();
        for capability in &self.capabilities {
            let start = capabilities.len();
            capabilities.extend_from_slice(&[0, 0]);
            let code = match capability {
                Capability::Multiprotocol(family) => {
                    capabilities.extend_from_slice(&family.afi.to_be_bytes());
                    capabilities.push(0);
                    capabilities.push(family.safi);
                    MULTIPROTOCOL
                }
                Capability::RouteRefresh => ROUTE_REFRESH,
                Capability::GracefulRestart(gr) => {
                    let flags: u16 = if gr.restarting { 0x8000 } else { 0 };
                    capabilities
                        .extend_from_slice(&(flags | (gr.restart_time & 0x0fff)).to_be_bytes());
                    for (family, forwarding) in &gr.families {
                        capabilities.extend_from_slice(&family.afi.to_be_bytes());
                        capabilities.push(family.safi);
                        capabilities.push(if *forwarding { 0x80 } else { 0 });
                    }
                    GRACEFUL_RESTART
                }
                Capability::FourOctetAs(asn) => {
                    capabilities.extend_from_slice(&asn.to_be_bytes());
                    FOUR_OCTET_AS
                }
                Capability::Other { code, value } => {
                    capabilities.extend_from_slice(value);
                    *code
                }
            };
            capabilities[start] = code;
            capabilities[start + 1] = (capabilities.len() - start - 2) as u8;
        }
        if capabilities.is_empty() {
            out.push(0);
        } else {
            out.push(capabilities.len() as u8 + 2);
            out.push(CAPABILITIES);
            out.push(capabilities.len() as u8);
            out.extend_from_slice(&capabilities);
        }
    }

    pub(super) fn decode(body: &[u8]) -> Result<Open, Malformed> {
        if body[0] != 4 {
            return Err(Malformed::new(
                codes::OPEN,
                codes::open::UNSUPPORTED_VERSION,
                4u16.to_be_bytes().to_vec(),
                format!("an OPEN of BGP version {} (we speak 4)", body[0]),
            ));
        }
        let two_octet = u16::from_be_bytes([body[1], body[2]]);
        let hold_time = u16::from_be_bytes([body[3], body[4]]);
        let router_id = Ipv4Addr::new(body[5], body[6], body[7], body[8]);
        if hold_time == 1 || hold_time == 2 {
            return Err(Malformed::new(
                codes::OPEN,
                codes::open::UNACCEPTABLE_HOLD_TIME,
                Vec::new(),
                format!("an OPEN with a hold time of {hold_time} s (0 or at least 3)"),
            ));
        }
        if router_id.is_unspecified() {
            return Err(Malformed::new(
                codes::OPEN,
                codes::open::BAD_BGP_IDENTIFIER,
                Vec::new(),
                "an OPEN with BGP identifier 0.0.0.0",
            ));
        }
        let (parameters, extended) = optional_parameters(&body[9..])?;
        let capabilities = decode_parameters(parameters, extended)?;
        let asn = capabilities
            .iter()
            .find_map(|c| match c {
                Capability::FourOctetAs(asn) => Some(*asn),
                _ => None,
            })
            .unwrap_or(u32::from(two_octet));
        Ok(Open {
            asn,
            hold_time,
            router_id,
            capabilities,
        })
    }
}

/// The error of an OPEN whose lengths do not add up (a message header error: Bad Message Length).
fn bad_length(reason: String) -> Malformed {
    Malformed::new(codes::HEADER, codes::header::BAD_LENGTH, Vec::new(), reason)
}

/// An OPEN's optional parameters, from their length on (`data`), and whether they have 2-octet
/// lengths (RFC 9072's extended form: a first parameter of type 255 after a length of 255).
fn optional_parameters(data: &[u8]) -> Result<(&[u8], bool), Malformed> {
    let declared = usize::from(data[0]);
    let mut rest = &data[1..];
    let extended = declared == 255 && rest.first() == Some(&255);
    let declared = if extended {
        if rest.len() < 3 {
            return Err(bad_length(
                "an OPEN's extended optional parameters are cut short".into(),
            ));
        }
        let length = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
        rest = &rest[3..];
        length
    } else {
        declared
    };
    if rest.len() != declared {
        return Err(bad_length(format!(
            "an OPEN says {declared} bytes of optional parameters and carries {}",
            rest.len()
        )));
    }
    Ok((rest, extended))
}

/// The capabilities in an OPEN's optional parameters (with 2-octet lengths when `extended`); any
/// other parameter is refused.
fn decode_parameters(mut rest: &[u8], extended: bool) -> Result<Vec<Capability>, Malformed> {
    let mut capabilities = Vec::new();
    let header = if extended { 3 } else { 2 };
    while !rest.is_empty() {
        if rest.len() < header {
            return Err(bad_length(
                "an OPEN's optional parameter is cut short".into(),
            ));
        }
        let kind = rest[0];
        let length = if extended {
            usize::from(u16::from_be_bytes([rest[1], rest[2]]))
        } else {
            usize::from(rest[1])
        };
        let Some(value) = rest.get(header..header + length) else {
            return Err(bad_length(format!(
                "an OPEN's optional parameter of type {kind} says {length} bytes and has {}",
                rest.len() - header
            )));
        };
        if kind != CAPABILITIES {
            return Err(Malformed::new(
                codes::OPEN,
                codes::open::UNSUPPORTED_OPTIONAL_PARAMETER,
                Vec::new(),
                format!("an OPEN with optional parameter type {kind} (only capabilities, 2)"),
            ));
        }
        decode_capabilities(value, &mut capabilities)?;
        rest = &rest[header + length..];
    }
    Ok(capabilities)
}

fn decode_capabilities(mut data: &[u8], out: &mut Vec<Capability>) -> Result<(), Malformed> {
    let malformed = |reason: String| {
        // RFC 5492 names no subcode for a malformed capability; routers send 2/0 (OPEN error).
        Malformed::new(codes::OPEN, 0, Vec::new(), reason)
    };
    while !data.is_empty() {
        if data.len() < 2 || data.len() < 2 + usize::from(data[1]) {
            return Err(malformed(format!(
                "an OPEN's capability is cut short ({} bytes left)",
                data.len()
            )));
        }
        let (code, value) = (data[0], &data[2..2 + usize::from(data[1])]);
        data = &data[2 + value.len()..];
        let capability = match code {
            MULTIPROTOCOL if value.len() == 4 => Capability::Multiprotocol(Family {
                afi: u16::from_be_bytes([value[0], value[1]]),
                safi: value[3],
            }),
            ROUTE_REFRESH if value.is_empty() => Capability::RouteRefresh,
            FOUR_OCTET_AS if value.len() == 4 => Capability::FourOctetAs(u32::from_be_bytes([
                value[0], value[1], value[2], value[3],
            ])),
            GRACEFUL_RESTART if value.len() >= 2 && (value.len() - 2) % 4 == 0 => {
                let head = u16::from_be_bytes([value[0], value[1]]);
                Capability::GracefulRestart(GracefulRestart {
                    restarting: head & 0x8000 != 0,
                    restart_time: head & 0x0fff,
                    families: value[2..]
                        .chunks_exact(4)
                        .map(|c| {
                            (
                                Family {
                                    afi: u16::from_be_bytes([c[0], c[1]]),
                                    safi: c[2],
                                },
                                c[3] & 0x80 != 0,
                            )
                        })
                        .collect(),
                })
            }
            MULTIPROTOCOL | ROUTE_REFRESH | FOUR_OCTET_AS | GRACEFUL_RESTART => {
                return Err(malformed(format!(
                    "an OPEN's capability {code} has a value of {} bytes",
                    value.len()
                )));
            }
            _ => Capability::Other {
                code,
                value: value.to_vec(),
            },
        };
        out.push(capability);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Context, Message, decode, encode};
    use super::*;

    fn open(asn: u32) -> Open {
        Open {
            asn,
            hold_time: 90,
            router_id: Ipv4Addr::new(10, 0, 0, 1),
            capabilities: vec![
                Capability::Multiprotocol(Family::IPV4_UNICAST),
                Capability::Multiprotocol(Family::IPV6_UNICAST),
                Capability::RouteRefresh,
                Capability::GracefulRestart(GracefulRestart {
                    restarting: true,
                    restart_time: 120,
                    families: vec![(Family::IPV4_UNICAST, true), (Family::IPV6_UNICAST, false)],
                }),
                Capability::FourOctetAs(asn),
                Capability::Other {
                    code: 70,
                    value: vec![],
                },
            ],
        }
    }

    #[test]
    fn an_open_round_trips_and_a_4_octet_asn_rides_in_its_capability() {
        for asn in [64512, 4_200_000_000] {
            let bytes = encode(&Message::Open(open(asn)), Context::default());
            let expected_two_octet = if asn > 65535 { AS_TRANS } else { asn as u16 };
            assert_eq!(
                u16::from_be_bytes([bytes[20], bytes[21]]),
                expected_two_octet
            );
            let (decoded, used) = decode(&bytes, Context::default()).unwrap().unwrap();
            assert_eq!(used, bytes.len());
            assert_eq!(decoded, Message::Open(open(asn)));
        }
    }

    #[test]
    fn an_open_without_multiprotocol_speaks_ipv4_unicast() {
        let open = Open {
            capabilities: vec![],
            ..open(1)
        };
        assert_eq!(open.families(), vec![Family::IPV4_UNICAST]);
        let bytes = encode(&Message::Open(open.clone()), Context::default());
        assert_eq!(bytes.len(), 29);
        assert_eq!(
            decode(&bytes, Context::default()).unwrap().unwrap().0,
            Message::Open(open)
        );
    }

    #[test]
    fn bad_opens_get_the_notification_rfc_4271_names() {
        let good = encode(&Message::Open(open(64512)), Context::default());
        let with = |at: usize, value: &[u8]| {
            let mut bytes = good.clone();
            bytes[at..at + value.len()].copy_from_slice(value);
            bytes
        };
        for (bytes, code, subcode) in [
            (
                with(19, &[3]),
                codes::OPEN,
                codes::open::UNSUPPORTED_VERSION,
            ),
            (
                with(22, &[0, 2]),
                codes::OPEN,
                codes::open::UNACCEPTABLE_HOLD_TIME,
            ),
            (
                with(24, &[0, 0, 0, 0]),
                codes::OPEN,
                codes::open::BAD_BGP_IDENTIFIER,
            ),
            (
                with(29, &[9]),
                codes::OPEN,
                codes::open::UNSUPPORTED_OPTIONAL_PARAMETER,
            ),
            (with(28, &[200]), codes::HEADER, codes::header::BAD_LENGTH),
            (with(31, &[1, 9]), codes::OPEN, 0),
        ] {
            let error = decode(&bytes, Context::default()).unwrap_err();
            assert_eq!(
                (error.notification.code, error.notification.subcode),
                (code, subcode),
                "{}",
                error.reason
            );
        }
    }

    #[test]
    fn extended_optional_parameters_are_read() {
        // RFC 9072: non-extended length 255, type 255, then a 2-octet length; each parameter with a
        // 2-octet length.
        let mut body = vec![4, 0xfc, 0x00, 0, 90, 10, 0, 0, 1, 255, 255, 0, 9, 2, 0, 6];
        body.extend_from_slice(&[65, 4, 0, 0, 0xfc, 0x00]);
        let mut bytes = vec![0xff; 16];
        bytes.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
        bytes.push(1);
        bytes.extend_from_slice(&body);
        let Message::Open(open) = decode(&bytes, Context::default()).unwrap().unwrap().0 else {
            panic!("not an OPEN")
        };
        assert_eq!(open.capabilities, vec![Capability::FourOctetAs(64512)]);
    }
}
