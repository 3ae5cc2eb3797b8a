//! The membership packets' envelope: every datagram the agents exchange is sealed with HMAC-SHA256
//! under the key of the membership Secret, and carries its sender's session, a counter and the time it
//! was sent, so that a packet without the key, altered, replayed or malformed is dropped (and counted)
//! before the membership protocol reads a byte of it.
//!
//! ```text
//! magic "LCA1" | session u64 | counter u64 | sent (unix ms) u64 | payload ... | HMAC-SHA256 (32)
//! ```
//!
//! Replays: a packet older than [`MAX_AGE`] (or sent that far in the future: the nodes' clocks may
//! disagree by that much at most) is dropped; within that window, each session's counters are
//! remembered ([`WINDOW`] behind its highest one, as IPsec's anti-replay window does), and a counter
//! seen before or older than the window is dropped. The MAC is checked first, so a forged packet cannot
//! move a session's window.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ring::hmac;

const MAGIC: &[u8; 4] = b"LCA1";
const HEADER: usize = 4 + 8 + 8 + 8;
const TAG: usize = 32;

/// How far from this node's clock a packet's send time may be.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(30);

/// How many counters behind a session's highest one are still taken (once each).
pub(crate) const WINDOW: u64 = 64;

/// How many senders' sessions are remembered: past it, the one heard from least recently is
/// forgotten (a packet of it is then only as fresh as [`MAX_AGE`] allows).
const MAX_SESSIONS: usize = 4096;

/// The shortest key taken: 16 bytes (128 bits).
pub(crate) const MIN_KEY_LEN: usize = 16;

/// Why a packet was dropped (the `reason` label of the drop counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Dropped {
    /// Too short, or not our magic.
    Malformed,
    /// The MAC does not match: another key, or altered.
    BadMac,
    /// Sent more than [`MAX_AGE`] before (or after) this node's clock.
    Stale,
    /// Its session's counter was seen already, or is older than the window.
    Replayed,
}

impl Dropped {
    /// Every reason, so that the counter starts with a zero for each (an alert's `increase` sees the
    /// first drop).
    pub(crate) const ALL: [Self; 4] = [Self::Malformed, Self::BadMac, Self::Stale, Self::Replayed];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::BadMac => "bad_mac",
            Self::Stale => "stale",
            Self::Replayed => "replayed",
        }
    }
}

/// One session's anti-replay state.
#[derive(Debug, Clone, Copy)]
struct Seen {
    highest: u64,
    /// Bit `i`: counter `highest - i` was taken.
    bits: u64,
    /// The packet's own send time when last heard (to forget the least recent first).
    last: u64,
}

/// Seals this node's packets and opens the others'.
pub(crate) struct Envelope {
    key: hmac::Key,
    session: u64,
    counter: u64,
    sessions: HashMap<u64, Seen>,
}

impl Envelope {
    /// An envelope for a process whose session is `session` (random at each start).
    pub(crate) fn new(key: &[u8], session: u64) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            session,
            counter: 0,
            sessions: HashMap::new(),
        }
    }

    /// `payload`, sealed, as sent at `now`.
    pub(crate) fn seal(&mut self, payload: &[u8], now: SystemTime) -> Vec<u8> {
        self.counter += 1;
        let mut out = Vec::with_capacity(HEADER + payload.len() + TAG);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.session.to_be_bytes());
        out.extend_from_slice(&self.counter.to_be_bytes());
        out.extend_from_slice(&unix_millis(now).to_be_bytes());
        out.extend_from_slice(payload);
        let tag = hmac::sign(&self.key, &out);
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// The payload of `packet`, received at `now`, or why it is dropped.
    pub(crate) fn open<'a>(
        &mut self,
        packet: &'a [u8],
        now: SystemTime,
    ) -> Result<&'a [u8], Dropped> {
        if packet.len() < HEADER + TAG || &packet[..4] != MAGIC {
            return Err(Dropped::Malformed);
        }
        let (signed, tag) = packet.split_at(packet.len() - TAG);
        hmac::verify(&self.key, signed, tag).map_err(|_| Dropped::BadMac)?;
        let word = |at: usize| {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(&packet[at..at + 8]);
            u64::from_be_bytes(bytes)
        };
        let (session, counter, sent) = (word(4), word(12), word(20));
        let here = unix_millis(now);
        let max_age = u64::try_from(MAX_AGE.as_millis()).unwrap_or(u64::MAX);
        if here.abs_diff(sent) > max_age {
            return Err(Dropped::Stale);
        }
        self.accept(session, counter, sent)?;
        Ok(&signed[HEADER..])
    }

    /// Takes `counter` of `session` once, within the window.
    fn accept(&mut self, session: u64, counter: u64, sent: u64) -> Result<(), Dropped> {
        if !self.sessions.contains_key(&session) && self.sessions.len() >= MAX_SESSIONS {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, seen)| seen.last)
                .map(|(session, _)| *session);
            if let Some(oldest) = oldest {
                self.sessions.remove(&oldest);
            }
        }
        let seen = self.sessions.entry(session).or_insert(Seen {
            highest: counter,
            bits: 0,
            last: sent,
        });
        if counter > seen.highest {
            let shift = counter - seen.highest;
            seen.bits = if shift >= WINDOW {
                0
            } else {
                seen.bits << shift
            };
            seen.highest = counter;
        }
        let behind = seen.highest - counter;
        if behind >= WINDOW || seen.bits & (1 << behind) != 0 {
            return Err(Dropped::Replayed);
        }
        seen.bits |= 1 << behind;
        seen.last = seen.last.max(sent);
        Ok(())
    }
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_sealed_packet_opens_once_with_the_same_key_only() {
        let now = SystemTime::now();
        let mut alice = Envelope::new(KEY, 1);
        let mut bob = Envelope::new(KEY, 2);
        let packet = alice.seal(b"ping", now);
        assert_eq!(bob.open(&packet, now), Ok(&b"ping"[..]));
        // The same packet again: a replay.
        assert_eq!(bob.open(&packet, now), Err(Dropped::Replayed));
        // Another key.
        let mut eve = Envelope::new(b"another key, 32 bytes long......", 3);
        let forged = eve.seal(b"ping", now);
        assert_eq!(bob.open(&forged, now), Err(Dropped::BadMac));
        // One bit changed anywhere.
        for at in [5, 13, 21, HEADER, packet.len() - 1] {
            let mut altered = alice.seal(b"ping", now);
            altered[at] ^= 1;
            assert_eq!(bob.open(&altered, now), Err(Dropped::BadMac), "byte {at}");
        }
        // Not ours, or cut short.
        assert_eq!(bob.open(b"", now), Err(Dropped::Malformed));
        assert_eq!(bob.open(&packet[..HEADER], now), Err(Dropped::Malformed));
        let mut other_magic = packet.clone();
        other_magic[0] = b'X';
        assert_eq!(bob.open(&other_magic, now), Err(Dropped::Malformed));
    }

    #[test]
    fn packets_out_of_time_are_stale() {
        let now = SystemTime::now();
        let mut alice = Envelope::new(KEY, 1);
        let mut bob = Envelope::new(KEY, 2);
        let old = alice.seal(b"x", now - MAX_AGE - Duration::from_secs(1));
        assert_eq!(bob.open(&old, now), Err(Dropped::Stale));
        let ahead = alice.seal(b"x", now + MAX_AGE + Duration::from_secs(1));
        assert_eq!(bob.open(&ahead, now), Err(Dropped::Stale));
        // Within the clocks' allowance, either way.
        let skewed = alice.seal(b"x", now + MAX_AGE - Duration::from_secs(1));
        assert!(bob.open(&skewed, now).is_ok());
    }

    #[test]
    fn packets_out_of_order_are_taken_once_within_the_window() {
        let now = SystemTime::now();
        let mut alice = Envelope::new(KEY, 1);
        let mut bob = Envelope::new(KEY, 2);
        let packets: Vec<Vec<u8>> = (0..100).map(|_| alice.seal(b"x", now)).collect();
        // The newest first, then some older ones out of order.
        assert!(bob.open(&packets[99], now).is_ok());
        assert!(bob.open(&packets[50], now).is_ok());
        assert!(bob.open(&packets[98], now).is_ok());
        assert_eq!(bob.open(&packets[50], now), Err(Dropped::Replayed));
        // 64 behind the newest: out of the window.
        assert_eq!(bob.open(&packets[99 - 64], now), Err(Dropped::Replayed));
        assert!(bob.open(&packets[99 - 63], now).is_ok());
        // A new session of the same sender (restarted) starts its own window.
        let mut restarted = Envelope::new(KEY, 7);
        assert!(bob.open(&restarted.seal(b"x", now), now).is_ok());
    }

    #[test]
    fn many_senders_are_remembered_up_to_a_bound() {
        let now = SystemTime::now();
        let mut bob = Envelope::new(KEY, 0);
        for session in 1..=(MAX_SESSIONS as u64 + 10) {
            let mut sender = Envelope::new(KEY, session);
            assert!(bob.open(&sender.seal(b"x", now), now).is_ok());
        }
        assert_eq!(bob.sessions.len(), MAX_SESSIONS);
    }

    /// The parser's fuzz run: 100,000 inputs (random bytes, and sealed packets cut or with random bytes
    /// changed), none of which may panic; only the untouched sealed ones open.
    #[test]
    fn no_input_makes_the_parser_panic() {
        let now = SystemTime::now();
        let mut alice = Envelope::new(KEY, 1);
        let mut bob = Envelope::new(KEY, 2);
        // xorshift64*: deterministic, so that a failure can be replayed.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let mut opened = 0;
        for i in 0..100_000u32 {
            let len = usize::try_from(next() % 200).unwrap();
            let mut input: Vec<u8> = if i % 2 == 0 {
                (0..len).map(|_| next().to_le_bytes()[0]).collect()
            } else {
                alice.seal(&vec![0xab; len], now)
            };
            match i % 6 {
                1 => {} // untouched: opens
                3 => input.truncate(len % (input.len() + 1)),
                5 if !input.is_empty() => {
                    let at = usize::try_from(next()).unwrap() % input.len();
                    input[at] ^= 1 << (next() % 8);
                }
                _ => {}
            }
            if bob.open(&input, now).is_ok() {
                opened += 1;
                assert_eq!(i % 6, 1, "input {i} opened although it was changed");
            }
        }
        assert!(opened > 16_000, "{opened}");
    }
}
