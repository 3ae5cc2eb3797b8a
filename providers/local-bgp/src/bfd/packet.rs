//! BFD control packets (RFC 5880 §4.1), without authentication: the 24-byte mandatory section.

use std::fmt;
use std::time::Duration;

/// The length of a control packet without authentication.
pub const LEN: usize = 24;

/// A session's state, as control packets carry it (RFC 5880 §4.1, "Sta").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum BfdState {
    /// Held down by its operator.
    AdminDown,
    /// Not established, or lost.
    #[default]
    Down,
    /// The other side is heard; waiting for it to hear us.
    Init,
    /// Both sides hear each other.
    Up,
}

impl BfdState {
    fn from_bits(bits: u8) -> BfdState {
        match bits & 0b11 {
            0 => BfdState::AdminDown,
            1 => BfdState::Down,
            2 => BfdState::Init,
            _ => BfdState::Up,
        }
    }

    fn bits(self) -> u8 {
        match self {
            BfdState::AdminDown => 0,
            BfdState::Down => 1,
            BfdState::Init => 2,
            BfdState::Up => 3,
        }
    }

    /// The state's name in RFC 5880.
    pub fn name(self) -> &'static str {
        match self {
            BfdState::AdminDown => "AdminDown",
            BfdState::Down => "Down",
            BfdState::Init => "Init",
            BfdState::Up => "Up",
        }
    }
}

impl fmt::Display for BfdState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a session last left Up, or did not come up (RFC 5880 §4.1, "Diag").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Diagnostic(pub u8);

impl Diagnostic {
    /// No diagnostic.
    pub const NONE: Diagnostic = Diagnostic(0);
    /// Nothing heard for the detection time.
    pub const DETECTION_TIME_EXPIRED: Diagnostic = Diagnostic(1);
    /// The other side said its session is down.
    pub const NEIGHBOR_SIGNALED_DOWN: Diagnostic = Diagnostic(3);
    /// Held down by its operator.
    pub const ADMINISTRATIVELY_DOWN: Diagnostic = Diagnostic(7);
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            0 => "no diagnostic",
            1 => "control detection time expired",
            2 => "echo function failed",
            3 => "neighbor signaled session down",
            4 => "forwarding plane reset",
            5 => "path down",
            6 => "concatenated path down",
            7 => "administratively down",
            8 => "reverse concatenated path down",
            _ => return write!(f, "diagnostic {}", self.0),
        })
    }
}

/// One control packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPacket {
    /// Why the sender's session last changed.
    pub diagnostic: Diagnostic,
    /// The sender's state.
    pub state: BfdState,
    /// Poll: the sender changed its intervals and asks for a packet with Final.
    pub poll: bool,
    /// Final: the answer to a Poll.
    pub final_: bool,
    /// Control plane independent: the sender's BFD survives its control plane's restart.
    pub control_plane_independent: bool,
    /// The sender wants demand mode.
    pub demand: bool,
    /// The sender's detection multiplier.
    pub detect_mult: u8,
    /// The sender's discriminator for the session.
    pub my_discriminator: u32,
    /// The receiver's discriminator, or 0 while the sender does not know it.
    pub your_discriminator: u32,
    /// The shortest interval the sender wants between the packets it sends.
    pub desired_min_tx: Duration,
    /// The shortest interval the sender can take between the packets it receives (0: send none).
    pub required_min_rx: Duration,
    /// The shortest interval between echo packets the sender can take (0: no echo).
    pub required_min_echo_rx: Duration,
}

/// Why a received packet was dropped (RFC 5880 §6.8.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Shorter than a control packet.
    #[error("{0} bytes, shorter than a control packet")]
    Short(usize),
    /// Not version 1.
    #[error("version {0}, not 1")]
    Version(u8),
    /// The length field is wrong.
    #[error("length field {field} with {received} bytes received")]
    Length {
        /// The length the packet says.
        field: u8,
        /// The bytes that came.
        received: usize,
    },
    /// Authenticated (we do not do authentication).
    #[error("authenticated, which is not configured")]
    Authenticated,
    /// Detection multiplier 0.
    #[error("detection multiplier 0")]
    ZeroMultiplier,
    /// The Multipoint bit set.
    #[error("multipoint bit set")]
    Multipoint,
    /// My Discriminator 0.
    #[error("its discriminator is 0")]
    ZeroDiscriminator,
    /// Your Discriminator 0 while the sender is neither Down nor AdminDown.
    #[error("no discriminator for us in state {0}")]
    NoYourDiscriminator(BfdState),
}

fn micros(bytes: &[u8]) -> Duration {
    Duration::from_micros(u64::from(u32::from_be_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3],
    ])))
}

fn micros_field(interval: Duration) -> [u8; 4] {
    u32::try_from(interval.as_micros())
        .unwrap_or(u32::MAX)
        .to_be_bytes()
}

impl ControlPacket {
    /// The packet's bytes.
    pub fn encode(&self) -> [u8; LEN] {
        let mut bytes = [0u8; LEN];
        bytes[0] = (1 << 5) | (self.diagnostic.0 & 0x1f);
        bytes[1] = (self.state.bits() << 6)
            | (u8::from(self.poll) << 5)
            | (u8::from(self.final_) << 4)
            | (u8::from(self.control_plane_independent) << 3)
            | (u8::from(self.demand) << 1);
        bytes[2] = self.detect_mult;
        bytes[3] = LEN as u8;
        bytes[4..8].copy_from_slice(&self.my_discriminator.to_be_bytes());
        bytes[8..12].copy_from_slice(&self.your_discriminator.to_be_bytes());
        bytes[12..16].copy_from_slice(&micros_field(self.desired_min_tx));
        bytes[16..20].copy_from_slice(&micros_field(self.required_min_rx));
        bytes[20..24].copy_from_slice(&micros_field(self.required_min_echo_rx));
        bytes
    }

    /// A received packet, checked as RFC 5880 §6.8.6 asks before any session looks at it.
    pub fn decode(bytes: &[u8]) -> Result<ControlPacket, Invalid> {
        if bytes.len() < LEN {
            return Err(Invalid::Short(bytes.len()));
        }
        let version = bytes[0] >> 5;
        if version != 1 {
            return Err(Invalid::Version(version));
        }
        let length = bytes[3];
        if usize::from(length) < LEN || usize::from(length) > bytes.len() {
            return Err(Invalid::Length {
                field: length,
                received: bytes.len(),
            });
        }
        let flags = bytes[1];
        if flags & 0b100 != 0 {
            return Err(Invalid::Authenticated);
        }
        if flags & 0b1 != 0 {
            return Err(Invalid::Multipoint);
        }
        if bytes[2] == 0 {
            return Err(Invalid::ZeroMultiplier);
        }
        let packet = ControlPacket {
            diagnostic: Diagnostic(bytes[0] & 0x1f),
            state: BfdState::from_bits(flags >> 6),
            poll: flags & 0b10_0000 != 0,
            final_: flags & 0b1_0000 != 0,
            control_plane_independent: flags & 0b1000 != 0,
            demand: flags & 0b10 != 0,
            detect_mult: bytes[2],
            my_discriminator: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            your_discriminator: u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            desired_min_tx: micros(&bytes[12..16]),
            required_min_rx: micros(&bytes[16..20]),
            required_min_echo_rx: micros(&bytes[20..24]),
        };
        if packet.my_discriminator == 0 {
            return Err(Invalid::ZeroDiscriminator);
        }
        if packet.your_discriminator == 0
            && !matches!(packet.state, BfdState::Down | BfdState::AdminDown)
        {
            return Err(Invalid::NoYourDiscriminator(packet.state));
        }
        Ok(packet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet() -> ControlPacket {
        ControlPacket {
            diagnostic: Diagnostic::DETECTION_TIME_EXPIRED,
            state: BfdState::Up,
            poll: true,
            final_: false,
            control_plane_independent: false,
            demand: false,
            detect_mult: 3,
            my_discriminator: 0x0102_0304,
            your_discriminator: 7,
            desired_min_tx: Duration::from_millis(300),
            required_min_rx: Duration::from_millis(300),
            required_min_echo_rx: Duration::ZERO,
        }
    }

    #[test]
    fn encodes_as_rfc_5880_lays_it_out() {
        let bytes = packet().encode();
        assert_eq!(bytes[0], 0x21, "version 1, diag 1");
        assert_eq!(bytes[1], 0b1110_0000, "state Up, poll");
        assert_eq!(&bytes[2..4], &[3, 24]);
        assert_eq!(&bytes[4..8], &[1, 2, 3, 4]);
        assert_eq!(&bytes[12..16], &300_000u32.to_be_bytes());
        assert_eq!(ControlPacket::decode(&bytes).unwrap(), packet());
    }

    /// A first packet as FRR's bfdd sends one: Down, no discriminator of ours yet, 1 s between packets
    /// until Up (RFC 5880 §6.8.3), echo offered.
    #[test]
    fn decodes_a_packet_frr_sent() {
        let bytes = [
            0x20, 0x40, 0x03, 0x18, 0x8c, 0x2f, 0x1a, 0x5e, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f,
            0x42, 0x40, 0x00, 0x04, 0x93, 0xe0, 0x00, 0x00, 0xc3, 0x50,
        ];
        let packet = ControlPacket::decode(&bytes).unwrap();
        assert_eq!(packet.state, BfdState::Down);
        assert_eq!(packet.your_discriminator, 0);
        assert_eq!(packet.desired_min_tx, Duration::from_secs(1));
        assert_eq!(packet.required_min_rx, Duration::from_millis(300));
        assert_eq!(packet.required_min_echo_rx, Duration::from_millis(50));
    }

    #[test]
    fn refuses_what_rfc_5880_discards() {
        let good = packet().encode();
        let with = |index: usize, value: u8| {
            let mut bytes = good;
            bytes[index] = value;
            ControlPacket::decode(&bytes)
        };
        let cases: Vec<(Result<ControlPacket, Invalid>, Invalid)> = vec![
            (ControlPacket::decode(&good[..20]), Invalid::Short(20)),
            (with(0, 0x41), Invalid::Version(2)),
            (
                with(3, 30),
                Invalid::Length {
                    field: 30,
                    received: 24,
                },
            ),
            (with(1, 0b1100_0100), Invalid::Authenticated),
            (with(1, 0b1100_0001), Invalid::Multipoint),
            (with(2, 0), Invalid::ZeroMultiplier),
        ];
        for (got, want) in cases {
            assert_eq!(got, Err(want));
        }
        let mut zero_mine = good;
        zero_mine[4..8].copy_from_slice(&[0; 4]);
        assert_eq!(
            ControlPacket::decode(&zero_mine),
            Err(Invalid::ZeroDiscriminator)
        );
        let mut up_without_yours = good;
        up_without_yours[8..12].copy_from_slice(&[0; 4]);
        assert_eq!(
            ControlPacket::decode(&up_without_yours),
            Err(Invalid::NoYourDiscriminator(BfdState::Up))
        );
    }

    #[test]
    fn diagnostics_in_words() {
        assert_eq!(
            Diagnostic::DETECTION_TIME_EXPIRED.to_string(),
            "control detection time expired"
        );
        assert_eq!(Diagnostic(30).to_string(), "diagnostic 30");
    }
}
