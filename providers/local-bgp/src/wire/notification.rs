//! NOTIFICATION (RFC 4271 §4.5), with every code and subcode a router may send put in words, so that
//! an operator reading our log or event learns what the router objected to without a packet capture.

use std::fmt;

/// A NOTIFICATION: the error code, its subcode and the data the RFC defines for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The error code (1 to 7).
    pub code: u8,
    /// The subcode, 0 where none is defined.
    pub subcode: u8,
    /// What the code says to carry (the offending field, a shutdown message …).
    pub data: Vec<u8>,
}

/// Error codes and subcodes (RFC 4271 §4.5, RFC 4486, RFC 7313, RFC 8203, RFC 9003).
pub mod codes {
    /// Message header error.
    pub const HEADER: u8 = 1;
    /// OPEN message error.
    pub const OPEN: u8 = 2;
    /// UPDATE message error.
    pub const UPDATE: u8 = 3;
    /// Hold timer expired.
    pub const HOLD_TIMER_EXPIRED: u8 = 4;
    /// Finite state machine error.
    pub const FSM: u8 = 5;
    /// Cease.
    pub const CEASE: u8 = 6;
    /// ROUTE-REFRESH message error (RFC 7313).
    pub const ROUTE_REFRESH: u8 = 7;

    /// Subcodes of [`HEADER`].
    pub mod header {
        /// Connection not synchronized (the marker).
        pub const NOT_SYNCHRONIZED: u8 = 1;
        /// Bad message length.
        pub const BAD_LENGTH: u8 = 2;
        /// Bad message type.
        pub const BAD_TYPE: u8 = 3;
    }

    /// Subcodes of [`OPEN`].
    pub mod open {
        /// Unsupported version number.
        pub const UNSUPPORTED_VERSION: u8 = 1;
        /// Bad peer AS.
        pub const BAD_PEER_AS: u8 = 2;
        /// Bad BGP identifier.
        pub const BAD_BGP_IDENTIFIER: u8 = 3;
        /// Unsupported optional parameter.
        pub const UNSUPPORTED_OPTIONAL_PARAMETER: u8 = 4;
        /// Unacceptable hold time.
        pub const UNACCEPTABLE_HOLD_TIME: u8 = 6;
        /// Unsupported capability (RFC 5492).
        pub const UNSUPPORTED_CAPABILITY: u8 = 7;
    }

    /// Subcodes of [`UPDATE`].
    pub mod update {
        /// Malformed attribute list.
        pub const MALFORMED_ATTRIBUTE_LIST: u8 = 1;
        /// Attribute flags error.
        pub const ATTRIBUTE_FLAGS: u8 = 4;
        /// Attribute length error.
        pub const ATTRIBUTE_LENGTH: u8 = 5;
        /// Invalid network field.
        pub const INVALID_NETWORK_FIELD: u8 = 10;
    }

    /// Subcodes of [`CEASE`] (RFC 4486, RFC 8538).
    pub mod cease {
        /// Administrative shutdown.
        pub const ADMINISTRATIVE_SHUTDOWN: u8 = 2;
        /// Peer de-configured.
        pub const PEER_DECONFIGURED: u8 = 3;
        /// Connection collision resolution.
        pub const CONNECTION_COLLISION: u8 = 7;
        /// BFD down (RFC 9384).
        pub const BFD_DOWN: u8 = 10;
    }

    /// Subcodes of [`ROUTE_REFRESH`].
    pub mod route_refresh {
        /// Invalid message length.
        pub const BAD_LENGTH: u8 = 1;
    }
}

impl Notification {
    pub(super) fn decode(body: &[u8]) -> Notification {
        Notification {
            code: body[0],
            subcode: body[1],
            data: body[2..].to_vec(),
        }
    }

    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.code);
        out.push(self.subcode);
        out.extend_from_slice(&self.data);
    }

    /// A Cease with a subcode and no data.
    pub fn cease(subcode: u8) -> Notification {
        Notification {
            code: codes::CEASE,
            subcode,
            data: Vec::new(),
        }
    }

    /// The error code and subcode in words, as RFC 4271 and its updates name them.
    pub fn meaning(&self) -> &'static str {
        match (self.code, self.subcode) {
            (1, 1) => "message header error: connection not synchronized",
            (1, 2) => "message header error: bad message length",
            (1, 3) => "message header error: bad message type",
            (1, _) => "message header error",
            (2, 1) => "OPEN message error: unsupported version number",
            (2, 2) => {
                "OPEN message error: bad peer AS (the AS number we announce is not the one the router expects of us)"
            }
            (2, 3) => "OPEN message error: bad BGP identifier",
            (2, 4) => "OPEN message error: unsupported optional parameter",
            (2, 6) => "OPEN message error: unacceptable hold time",
            (2, 7) => "OPEN message error: unsupported capability",
            (2, 11) => "OPEN message error: role mismatch",
            (2, _) => "OPEN message error",
            (3, 1) => "UPDATE message error: malformed attribute list",
            (3, 2) => "UPDATE message error: unrecognized well-known attribute",
            (3, 3) => "UPDATE message error: missing well-known attribute",
            (3, 4) => "UPDATE message error: attribute flags error",
            (3, 5) => "UPDATE message error: attribute length error",
            (3, 6) => "UPDATE message error: invalid ORIGIN attribute",
            (3, 8) => "UPDATE message error: invalid NEXT_HOP attribute",
            (3, 9) => "UPDATE message error: optional attribute error",
            (3, 10) => "UPDATE message error: invalid network field",
            (3, 11) => "UPDATE message error: malformed AS_PATH",
            (3, _) => "UPDATE message error",
            (4, _) => "hold timer expired (the router heard nothing from us for its hold time)",
            (5, 1) => "finite state machine error: unexpected message in OpenSent",
            (5, 2) => "finite state machine error: unexpected message in OpenConfirm",
            (5, 3) => "finite state machine error: unexpected message in Established",
            (5, _) => "finite state machine error",
            (6, 1) => "cease: maximum number of prefixes reached",
            (6, 2) => "cease: administrative shutdown",
            (6, 3) => "cease: peer de-configured (the router has no neighbor for this address)",
            (6, 4) => "cease: administrative reset",
            (6, 5) => "cease: connection rejected (the router refuses sessions from this address)",
            (6, 6) => "cease: other configuration change",
            (6, 7) => "cease: connection collision resolution",
            (6, 8) => "cease: out of resources",
            (6, 9) => "cease: hard reset",
            (6, 10) => "cease: BFD down",
            (6, _) => "cease",
            (7, 1) => "ROUTE-REFRESH message error: invalid message length",
            (7, _) => "ROUTE-REFRESH message error",
            _ => "unknown error code",
        }
    }

    /// The shutdown communication of an administrative shutdown or reset (RFC 9003), if any.
    pub fn shutdown_message(&self) -> Option<String> {
        if self.code != codes::CEASE || !matches!(self.subcode, 2 | 4) {
            return None;
        }
        let (&len, rest) = self.data.split_first()?;
        let text = rest.get(..usize::from(len))?;
        Some(String::from_utf8_lossy(text).into_owned())
    }
}

impl fmt::Display for Notification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}/{})", self.meaning(), self.code, self.subcode)?;
        if let Some(message) = self.shutdown_message().filter(|m| !m.is_empty()) {
            write!(f, ", saying {message:?}")?;
        } else if !self.data.is_empty() {
            write!(f, ", data")?;
            for byte in self.data.iter().take(16) {
                write!(f, " {byte:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_says_what_it_means() {
        let bad_as = Notification {
            code: 2,
            subcode: 2,
            data: vec![0xfd, 0xe9],
        };
        assert_eq!(
            bad_as.to_string(),
            "OPEN message error: bad peer AS (the AS number we announce is not the one the router \
             expects of us) (2/2), data fd e9"
        );
        let mut data = vec![11];
        data.extend_from_slice(b"maintenance");
        let shutdown = Notification {
            code: 6,
            subcode: 2,
            data,
        };
        assert_eq!(
            shutdown.to_string(),
            "cease: administrative shutdown (6/2), saying \"maintenance\""
        );
        assert_eq!(
            Notification {
                code: 99,
                subcode: 0,
                data: vec![]
            }
            .meaning(),
            "unknown error code"
        );
    }

    #[test]
    fn a_shutdown_message_longer_than_its_data_is_left_out() {
        let truncated = Notification {
            code: 6,
            subcode: 2,
            data: vec![20, b'a'],
        };
        assert_eq!(truncated.shutdown_message(), None);
        assert_eq!(
            truncated.to_string(),
            "cease: administrative shutdown (6/2), data 14 61"
        );
    }
}
