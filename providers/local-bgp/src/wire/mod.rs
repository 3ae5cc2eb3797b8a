//! BGP-4 messages on the wire (RFC 4271 §4): the header, and the five messages a speaker that
//! announces routes exchanges with a router (OPEN, UPDATE, NOTIFICATION, KEEPALIVE and RFC 2918's
//! ROUTE-REFRESH).
//!
//! Why our own codec: the crates that parse BGP (zettabgp, bgp-rs, netgauze-bgp-pkt) either report a
//! malformed message as an error without the NOTIFICATION code and subcode RFC 4271 §6 says to send
//! back, or come with a dependency tree many times this crate's size. A speaker that only announces
//! host routes needs a small, exact subset, and every malformed input must become the right
//! NOTIFICATION, which is what [`Malformed`] carries.

mod notification;
mod open;
mod update;

pub use notification::{Notification, codes};
pub use open::{AS_TRANS, Capability, GracefulRestart, Open};
pub use update::{AsSegment, Attribute, MAX_BODY, Update};

use std::fmt;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Every message starts with 16 bytes of ones (RFC 4271 §4.1).
const MARKER: [u8; 16] = [0xff; 16];
/// Marker, length (2) and type (1).
pub const HEADER_LEN: usize = 19;
/// The largest message without RFC 8654's extended messages, which we do not announce.
pub const MAX_LEN: usize = 4096;

const OPEN: u8 = 1;
const UPDATE: u8 = 2;
const NOTIFICATION: u8 = 3;
const KEEPALIVE: u8 = 4;
const ROUTE_REFRESH: u8 = 5;

/// An address family and subsequent address family (RFC 4760), as carried in capabilities, route
/// refresh and multiprotocol attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Family {
    /// 1 IPv4, 2 IPv6.
    pub afi: u16,
    /// 1 unicast.
    pub safi: u8,
}

impl Family {
    /// IPv4 unicast.
    pub const IPV4_UNICAST: Family = Family { afi: 1, safi: 1 };
    /// IPv6 unicast.
    pub const IPV6_UNICAST: Family = Family { afi: 2, safi: 1 };

    /// The family of a prefix (always unicast here).
    pub fn of(prefix: &IpNet) -> Family {
        match prefix {
            IpNet::V4(_) => Family::IPV4_UNICAST,
            IpNet::V6(_) => Family::IPV6_UNICAST,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Family::IPV4_UNICAST => f.write_str("IPv4 unicast"),
            Family::IPV6_UNICAST => f.write_str("IPv6 unicast"),
            Family { afi, safi } => write!(f, "AFI {afi} SAFI {safi}"),
        }
    }
}

/// A message, decoded or to encode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// The first message of a session.
    Open(Open),
    /// Routes announced and withdrawn.
    Update(Update),
    /// An error; the sender closes the session after it.
    Notification(Notification),
    /// "Still here", and the answer to an OPEN that was accepted.
    Keepalive,
    /// Asks for every route of a family again (RFC 2918).
    RouteRefresh(Family),
}

impl Message {
    /// The message's name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Open(_) => "OPEN",
            Message::Update(_) => "UPDATE",
            Message::Notification(_) => "NOTIFICATION",
            Message::Keepalive => "KEEPALIVE",
            Message::RouteRefresh(_) => "ROUTE-REFRESH",
        }
    }
}

/// What decoding needs to know of the session: whether both sides announced 4-octet AS numbers
/// (RFC 6793), which changes how AS_PATH is encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// Both sides announced the 4-octet AS number capability.
    pub four_octet_as: bool,
}

/// A message we could not accept: the NOTIFICATION to send back, and what was wrong, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (answered with NOTIFICATION: {notification})")]
pub struct Malformed {
    /// What to send the peer before closing.
    pub notification: Notification,
    /// What was wrong.
    pub reason: String,
}

impl Malformed {
    pub(crate) fn new(code: u8, subcode: u8, data: Vec<u8>, reason: impl Into<String>) -> Self {
        Malformed {
            notification: Notification {
                code,
                subcode,
                data,
            },
            reason: reason.into(),
        }
    }
}

/// Decodes the first message in `buf`: `Ok(None)` while `buf` holds less than a whole message, else
/// the message and how many bytes it took.
pub fn decode(buf: &[u8], context: Context) -> Result<Option<(Message, usize)>, Malformed> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[..16] != MARKER {
        return Err(Malformed::new(
            codes::HEADER,
            codes::header::NOT_SYNCHRONIZED,
            Vec::new(),
            "a message header without the all-ones marker",
        ));
    }
    let length = usize::from(u16::from_be_bytes([buf[16], buf[17]]));
    let kind = buf[18];
    let min = match kind {
        OPEN => 29,
        UPDATE => 23,
        NOTIFICATION => 21,
        KEEPALIVE => 19,
        ROUTE_REFRESH => 23,
        other => {
            return Err(Malformed::new(
                codes::HEADER,
                codes::header::BAD_TYPE,
                vec![other],
                format!("a message of unknown type {other}"),
            ));
        }
    };
    if length < min || length > MAX_LEN || (kind == KEEPALIVE && length != 19) {
        return Err(Malformed::new(
            codes::HEADER,
            codes::header::BAD_LENGTH,
            (length as u16).to_be_bytes().to_vec(),
            format!("a message of type {kind} with length {length}"),
        ));
    }
    if buf.len() < length {
        return Ok(None);
    }
    let body = &buf[HEADER_LEN..length];
    let message = match kind {
        OPEN => Message::Open(Open::decode(body)?),
        UPDATE => Message::Update(Update::decode(body, context)?),
        NOTIFICATION => Message::Notification(Notification::decode(body)),
        KEEPALIVE => Message::Keepalive,
        _ => {
            if body.len() != 4 {
                return Err(Malformed::new(
                    codes::ROUTE_REFRESH,
                    codes::route_refresh::BAD_LENGTH,
                    body.to_vec(),
                    format!("a ROUTE-REFRESH of {} bytes", length),
                ));
            }
            Message::RouteRefresh(Family {
                afi: u16::from_be_bytes([body[0], body[1]]),
                safi: body[3],
            })
        }
    };
    Ok(Some((message, length)))
}

/// The length of the whole UPDATE at the start of `buf`, when its header is sound and all of it is
/// there: what to skip when its body cannot be parsed.
pub fn update_length(buf: &[u8]) -> Option<usize> {
    let length = usize::from(u16::from_be_bytes([*buf.get(16)?, *buf.get(17)?]));
    (buf[..16] == MARKER
        && *buf.get(18)? == UPDATE
        && (23..=MAX_LEN).contains(&length)
        && buf.len() >= length)
        .then_some(length)
}

/// Encodes a message, header included.
///
/// An UPDATE larger than [`MAX_LEN`] cannot be sent: [`Update`]s are built to fit
/// ([`update::MAX_BODY`]), and this panics in debug builds if one does not.
pub fn encode(message: &Message, context: Context) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MARKER);
    out.extend_from_slice(&[0, 0]);
    match message {
        Message::Open(open) => {
            out.push(OPEN);
            open.encode(&mut out);
        }
        Message::Update(update) => {
            out.push(UPDATE);
            update.encode(&mut out, context);
        }
        Message::Notification(notification) => {
            out.push(NOTIFICATION);
            notification.encode(&mut out);
        }
        Message::Keepalive => out.push(KEEPALIVE),
        Message::RouteRefresh(family) => {
            out.push(ROUTE_REFRESH);
            out.extend_from_slice(&family.afi.to_be_bytes());
            out.push(0);
            out.push(family.safi);
        }
    }
    debug_assert!(
        out.len() <= MAX_LEN,
        "a {} of {} bytes",
        message.kind(),
        out.len()
    );
    let length = (out.len() as u16).to_be_bytes();
    out[16..18].copy_from_slice(&length);
    out
}

/// Appends a prefix as NLRI: its length in bits, then as few bytes of it as hold those bits.
fn put_prefix(out: &mut Vec<u8>, prefix: &IpNet) {
    let bits = prefix.prefix_len();
    out.push(bits);
    let bytes = usize::from(bits).div_ceil(8);
    match prefix {
        IpNet::V4(net) => out.extend_from_slice(&net.network().octets()[..bytes]),
        IpNet::V6(net) => out.extend_from_slice(&net.network().octets()[..bytes]),
    }
}

/// Reads the prefixes of one family packed one after another (NLRI, withdrawn routes).
fn prefixes(mut data: &[u8], afi: u16, what: &str) -> Result<Vec<IpNet>, Malformed> {
    let bad = |reason: String| {
        Malformed::new(
            codes::UPDATE,
            codes::update::INVALID_NETWORK_FIELD,
            Vec::new(),
            reason,
        )
    };
    let mut out = Vec::new();
    while let Some((&bits, rest)) = data.split_first() {
        let bytes = usize::from(bits).div_ceil(8);
        let max = if afi == 1 { 32 } else { 128 };
        if bits > max || rest.len() < bytes {
            return Err(bad(format!(
                "{what}: a prefix of {bits} bits with {} bytes left",
                rest.len()
            )));
        }
        let prefix = if afi == 1 {
            let mut octets = [0; 4];
            octets[..bytes].copy_from_slice(&rest[..bytes]);
            IpNet::V4(Ipv4Net::new(octets.into(), bits).map_err(|e| bad(format!("{what}: {e}")))?)
        } else {
            let mut octets = [0; 16];
            octets[..bytes].copy_from_slice(&rest[..bytes]);
            IpNet::V6(Ipv6Net::new(octets.into(), bits).map_err(|e| bad(format!("{what}: {e}")))?)
        };
        out.push(prefix.trunc());
        data = &rest[bytes..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keepalive_is_a_bare_header() {
        let bytes = encode(&Message::Keepalive, Context::default());
        assert_eq!(bytes.len(), 19);
        assert_eq!(
            decode(&bytes, Context::default()),
            Ok(Some((Message::Keepalive, 19)))
        );
    }

    #[test]
    fn half_a_message_asks_for_more() {
        let bytes = encode(
            &Message::RouteRefresh(Family::IPV6_UNICAST),
            Context::default(),
        );
        for cut in 0..bytes.len() {
            assert_eq!(
                decode(&bytes[..cut], Context::default()),
                Ok(None),
                "{cut} bytes"
            );
        }
        assert_eq!(
            decode(&bytes, Context::default()),
            Ok(Some((Message::RouteRefresh(Family::IPV6_UNICAST), 23)))
        );
    }

    #[test]
    fn header_errors_name_the_notification_rfc_4271_asks_for() {
        let mut bad_marker = encode(&Message::Keepalive, Context::default());
        bad_marker[3] = 0;
        let mut bad_type = encode(&Message::Keepalive, Context::default());
        bad_type[18] = 9;
        let mut bad_length = encode(&Message::Keepalive, Context::default());
        bad_length[17] = 20;
        let mut too_long = encode(&Message::Keepalive, Context::default());
        too_long[16..18].copy_from_slice(&5000u16.to_be_bytes());
        for (bytes, subcode, data) in [
            (bad_marker, codes::header::NOT_SYNCHRONIZED, vec![]),
            (bad_type, codes::header::BAD_TYPE, vec![9]),
            (bad_length, codes::header::BAD_LENGTH, vec![0, 20]),
            (
                too_long,
                codes::header::BAD_LENGTH,
                5000u16.to_be_bytes().to_vec(),
            ),
        ] {
            let error = decode(&bytes, Context::default()).unwrap_err();
            assert_eq!(
                error.notification,
                Notification {
                    code: codes::HEADER,
                    subcode,
                    data
                },
                "{}",
                error.reason
            );
        }
    }

    #[test]
    fn prefixes_take_as_few_bytes_as_their_length_needs() {
        for (prefix, bytes) in [
            ("10.1.2.3/32", vec![32, 10, 1, 2, 3]),
            ("10.1.0.0/16", vec![16, 10, 1]),
            ("10.128.0.0/9", vec![9, 10, 128]),
            ("0.0.0.0/0", vec![0]),
            ("2001:db8::1/128", {
                let mut v = vec![128];
                v.extend_from_slice(
                    &"2001:db8::1"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets(),
                );
                v
            }),
        ] {
            let prefix: IpNet = prefix.parse().unwrap();
            let mut out = Vec::new();
            put_prefix(&mut out, &prefix);
            assert_eq!(out, bytes, "{prefix}");
            let afi = Family::of(&prefix).afi;
            assert_eq!(prefixes(&out, afi, "test"), Ok(vec![prefix]));
        }
    }

    #[test]
    fn a_prefix_longer_than_its_family_or_its_bytes_is_malformed() {
        for (bytes, afi) in [
            (vec![33, 1, 2, 3, 4, 5], 1),
            (vec![24, 10, 1], 1),
            (vec![129], 2),
        ] {
            let error = prefixes(&bytes, afi, "NLRI").unwrap_err();
            assert_eq!(error.notification.code, codes::UPDATE);
            assert_eq!(
                error.notification.subcode,
                codes::update::INVALID_NETWORK_FIELD
            );
        }
    }
}
