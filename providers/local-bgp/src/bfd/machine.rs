//! One BFD session's state machine (RFC 5880 §6.8, asynchronous mode), pure: it is told what was
//! received and what time it is, and says what to send and when the session changed. The task in
//! `bfd::run` owns the sockets and the clock.

use std::time::Duration;

use tokio::time::Instant;

use super::packet::{BfdState, ControlPacket, Diagnostic};
use super::{BfdProfile, BfdResume};

/// The slowest a session sends while it is not Up (RFC 5880 §6.8.3: at least one second).
pub(crate) const SLOW_TX: Duration = Duration::from_secs(1);

/// A change of the session's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    pub from: BfdState,
    pub to: BfdState,
}

/// What a received packet did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// The session's state changed.
    pub change: Option<Change>,
    /// A packet should go out now (the state changed, or the other side polls).
    pub send_now: bool,
}

/// One session's variables (RFC 5880 §6.8.1), named as there.
#[derive(Clone, Debug)]
pub(crate) struct Machine {
    profile: BfdProfile,
    pub local_discriminator: u32,
    pub remote_discriminator: u32,
    pub state: BfdState,
    pub remote_state: BfdState,
    pub diagnostic: Diagnostic,
    /// The diagnostic of the other side's last packet.
    pub remote_diagnostic: Diagnostic,
    remote_min_rx: Duration,
    remote_desired_tx: Duration,
    remote_detect_mult: u8,
    remote_demand: bool,
    /// A Poll Sequence runs: our packets carry Poll until one with Final comes.
    polling: bool,
    /// The other side polled: our next packet carries Final.
    owe_final: bool,
    detect_deadline: Option<Instant>,
}

impl Machine {
    pub fn new(profile: BfdProfile, local_discriminator: u32) -> Machine {
        Machine {
            profile,
            local_discriminator,
            remote_discriminator: 0,
            state: BfdState::Down,
            remote_state: BfdState::Down,
            diagnostic: Diagnostic::NONE,
            remote_diagnostic: Diagnostic::NONE,
            // RFC 5880 §6.8.1: 1 µs, until the other side says.
            remote_min_rx: Duration::from_micros(1),
            remote_desired_tx: SLOW_TX,
            remote_detect_mult: 0,
            remote_demand: false,
            polling: false,
            owe_final: false,
            detect_deadline: None,
        }
    }

    /// A session another process ran Up until now (a node agent's predecessor), taken over as it
    /// is: the router sees the same discriminators and no change of state.
    pub fn resumed(profile: BfdProfile, resume: &BfdResume, now: Instant) -> Machine {
        let mut machine = Machine::new(profile, resume.local_discriminator);
        machine.remote_discriminator = resume.remote_discriminator;
        machine.state = BfdState::Up;
        machine.remote_state = BfdState::Up;
        machine.remote_min_rx = resume.remote_min_rx;
        machine.remote_desired_tx = resume.remote_desired_tx;
        machine.remote_detect_mult = resume.remote_detect_mult;
        machine.detect_deadline = Some(now + machine.detection_time());
        machine
    }

    /// What a successor needs to take the session over ([`Machine::resumed`]), while it is Up.
    pub fn resume(&self, local: std::net::SocketAddr, peer: std::net::IpAddr) -> Option<BfdResume> {
        (self.state == BfdState::Up).then_some(BfdResume {
            peer,
            local,
            profile: self.profile,
            local_discriminator: self.local_discriminator,
            remote_discriminator: self.remote_discriminator,
            remote_min_rx: self.remote_min_rx,
            remote_desired_tx: self.remote_desired_tx,
            remote_detect_mult: self.remote_detect_mult,
        })
    }

    /// The interval we ask for between our packets: the profile's once Up, at least a second before.
    fn desired_min_tx(&self) -> Duration {
        if self.state == BfdState::Up {
            self.profile.transmit_interval
        } else {
            self.profile.transmit_interval.max(SLOW_TX)
        }
    }

    /// The session's timers.
    pub fn profile(&self) -> BfdProfile {
        self.profile
    }

    /// Our detection multiplier.
    pub fn detect_multiplier(&self) -> u8 {
        self.profile.detect_multiplier
    }

    /// How long without a packet from the other side before the session is Down (§6.8.4).
    pub fn detection_time(&self) -> Duration {
        self.profile.receive_interval.max(self.remote_desired_tx)
            * u32::from(self.remote_detect_mult)
    }

    /// When the session is Down unless a packet comes first.
    pub fn detect_deadline(&self) -> Option<Instant> {
        self.detect_deadline
    }

    /// The interval between our periodic packets before jitter (§6.8.7), or `None` when we must not
    /// send any: passive until the other side is heard, a peer that wants none (Required Min RX
    /// 0), or demand mode with both sides Up.
    pub fn transmit_interval(&self) -> Option<Duration> {
        if self.profile.passive && self.remote_discriminator == 0 {
            return None;
        }
        if self.remote_min_rx.is_zero() {
            return None;
        }
        if self.remote_demand && self.state == BfdState::Up && self.remote_state == BfdState::Up {
            return None;
        }
        Some(self.desired_min_tx().max(self.remote_min_rx))
    }

    fn set_state(&mut self, to: BfdState, diagnostic: Diagnostic) -> Option<Change> {
        let from = self.state;
        if from == to {
            return None;
        }
        let tx_before = self.desired_min_tx();
        self.state = to;
        if to != BfdState::Up {
            self.diagnostic = diagnostic;
        }
        // §6.8.3: a change of Desired Min TX while Up is announced with a Poll Sequence.
        if to == BfdState::Up && self.desired_min_tx() != tx_before {
            self.polling = true;
        }
        if to != BfdState::Up {
            self.polling = false;
        }
        Some(Change { from, to })
    }

    /// A valid packet from the other side (§6.8.6, after the checks `ControlPacket::decode` makes).
    pub fn receive(&mut self, packet: &ControlPacket, now: Instant) -> Received {
        if packet.your_discriminator != 0 && packet.your_discriminator != self.local_discriminator {
            return Received::default();
        }
        if self.state == BfdState::AdminDown {
            return Received::default();
        }
        self.remote_discriminator = packet.my_discriminator;
        self.remote_state = packet.state;
        self.remote_diagnostic = packet.diagnostic;
        self.remote_demand = packet.demand;
        self.remote_min_rx = packet.required_min_rx;
        self.remote_desired_tx = packet.desired_min_tx;
        self.remote_detect_mult = packet.detect_mult;
        if packet.final_ {
            self.polling = false;
        }
        self.detect_deadline = Some(now + self.detection_time());
        let change = match (self.state, packet.state) {
            (BfdState::Down | BfdState::Init | BfdState::Up, BfdState::AdminDown) => {
                self.set_state(BfdState::Down, Diagnostic::NEIGHBOR_SIGNALED_DOWN)
            }
            (BfdState::Down, BfdState::Down) => self.set_state(BfdState::Init, Diagnostic::NONE),
            (BfdState::Down, BfdState::Init) => self.set_state(BfdState::Up, Diagnostic::NONE),
            (BfdState::Init, BfdState::Init | BfdState::Up) => {
                self.set_state(BfdState::Up, Diagnostic::NONE)
            }
            (BfdState::Up, BfdState::Down) => {
                self.set_state(BfdState::Down, Diagnostic::NEIGHBOR_SIGNALED_DOWN)
            }
            _ => None,
        };
        if packet.poll {
            self.owe_final = true;
        }
        Received {
            change,
            send_now: change.is_some() || packet.poll,
        }
    }

    /// The detection time ran out (§6.8.4): the session is Down, the other side forgotten.
    pub fn expire(&mut self, now: Instant) -> Option<Change> {
        if self.detect_deadline.is_none_or(|deadline| deadline > now) {
            return None;
        }
        self.detect_deadline = None;
        self.remote_discriminator = 0;
        self.remote_state = BfdState::Down;
        self.remote_detect_mult = 0;
        self.remote_desired_tx = SLOW_TX;
        self.remote_demand = false;
        match self.state {
            BfdState::Init | BfdState::Up => {
                self.set_state(BfdState::Down, Diagnostic::DETECTION_TIME_EXPIRED)
            }
            BfdState::Down | BfdState::AdminDown => None,
        }
    }

    /// Takes the session down on purpose (§6.8.16): it says AdminDown until it ends.
    pub fn admin_down(&mut self) -> Option<Change> {
        self.set_state(BfdState::AdminDown, Diagnostic::ADMINISTRATIVELY_DOWN)
    }

    /// The packet to send now. Final answers a Poll; Poll goes out while ours runs, never both in
    /// one packet (§6.8.7).
    pub fn packet(&mut self) -> ControlPacket {
        let final_ = std::mem::take(&mut self.owe_final);
        ControlPacket {
            diagnostic: self.diagnostic,
            state: self.state,
            poll: self.polling && !final_,
            final_,
            // Our BFD lives in the node agent, with the BGP speaker: it shares its fate (§4.1).
            control_plane_independent: false,
            demand: false,
            detect_mult: self.profile.detect_multiplier,
            my_discriminator: self.local_discriminator,
            your_discriminator: self.remote_discriminator,
            desired_min_tx: self.desired_min_tx(),
            required_min_rx: self.profile.receive_interval,
            required_min_echo_rx: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u32 = 11;
    const ROUTER: u32 = 22;

    fn profile() -> BfdProfile {
        BfdProfile {
            receive_interval: Duration::from_millis(300),
            transmit_interval: Duration::from_millis(300),
            detect_multiplier: 3,
            passive: false,
        }
    }

    fn from_router(state: BfdState, yours: u32) -> ControlPacket {
        ControlPacket {
            diagnostic: Diagnostic::NONE,
            state,
            poll: false,
            final_: false,
            control_plane_independent: false,
            demand: false,
            detect_mult: 3,
            my_discriminator: ROUTER,
            your_discriminator: yours,
            desired_min_tx: Duration::from_millis(200),
            required_min_rx: Duration::from_millis(250),
            required_min_echo_rx: Duration::ZERO,
        }
    }

    fn up(now: Instant) -> Machine {
        let mut machine = Machine::new(profile(), ME);
        machine.receive(&from_router(BfdState::Down, 0), now);
        machine.receive(&from_router(BfdState::Up, ME), now);
        assert_eq!(machine.state, BfdState::Up);
        machine
    }

    /// RFC 5880 §6.8.6's table: our state, the packet's, where we go.
    #[test]
    fn the_three_way_handshake_and_its_ends() {
        use BfdState::*;
        let cases = [
            (Down, Down, Init, Diagnostic::NONE),
            (Down, Init, Up, Diagnostic::NONE),
            (Down, Up, Down, Diagnostic::NONE),
            (Init, Down, Init, Diagnostic::NONE),
            (Init, Init, Up, Diagnostic::NONE),
            (Init, Up, Up, Diagnostic::NONE),
            (Up, Init, Up, Diagnostic::NONE),
            (Up, Up, Up, Diagnostic::NONE),
            (Up, Down, Down, Diagnostic::NEIGHBOR_SIGNALED_DOWN),
            (Up, AdminDown, Down, Diagnostic::NEIGHBOR_SIGNALED_DOWN),
            (Init, AdminDown, Down, Diagnostic::NEIGHBOR_SIGNALED_DOWN),
            (AdminDown, Up, AdminDown, Diagnostic::ADMINISTRATIVELY_DOWN),
        ];
        let now = Instant::now();
        for (ours, theirs, next, diagnostic) in cases {
            let mut machine = Machine::new(profile(), ME);
            machine.state = ours;
            if ours == AdminDown {
                machine.diagnostic = Diagnostic::ADMINISTRATIVELY_DOWN;
            }
            let yours = if matches!(theirs, Down | AdminDown) {
                0
            } else {
                ME
            };
            let received = machine.receive(&from_router(theirs, yours), now);
            assert_eq!(machine.state, next, "{ours} + {theirs}");
            assert_eq!(machine.diagnostic, diagnostic, "{ours} + {theirs}");
            assert_eq!(received.change.is_some(), ours != next, "{ours} + {theirs}");
            assert_eq!(received.send_now, ours != next, "{ours} + {theirs}");
        }
    }

    #[test]
    fn a_packet_for_another_session_is_ignored() {
        let mut machine = Machine::new(profile(), ME);
        let received = machine.receive(&from_router(BfdState::Init, ME + 1), Instant::now());
        assert_eq!(received, Received::default());
        assert_eq!(machine.remote_discriminator, 0);
    }

    #[test]
    fn slow_until_up_then_the_profile_s_rate_announced_by_a_poll() {
        let now = Instant::now();
        let mut machine = Machine::new(profile(), ME);
        let first = machine.packet();
        assert_eq!(first.desired_min_tx, SLOW_TX);
        assert_eq!(first.your_discriminator, 0);
        assert_eq!(machine.transmit_interval(), Some(SLOW_TX));

        machine.receive(&from_router(BfdState::Down, 0), now);
        machine.receive(&from_router(BfdState::Up, ME), now);
        // Up: the profile's 300 ms, the router's 250 ms required RX is below it.
        assert_eq!(
            machine.transmit_interval(),
            Some(Duration::from_millis(300))
        );
        let poll = machine.packet();
        assert!(poll.poll && !poll.final_);
        assert_eq!(poll.desired_min_tx, Duration::from_millis(300));
        assert!(machine.packet().poll, "the poll goes on until Final");
        let mut answer = from_router(BfdState::Up, ME);
        answer.final_ = true;
        machine.receive(&answer, now);
        assert!(!machine.packet().poll);
    }

    #[test]
    fn a_poll_is_answered_at_once_with_final_and_never_both() {
        let now = Instant::now();
        let mut machine = up(now);
        let mut poll = from_router(BfdState::Up, ME);
        poll.poll = true;
        let received = machine.receive(&poll, now);
        assert!(received.send_now);
        let answer = machine.packet();
        assert!(answer.final_ && !answer.poll, "{answer:?}");
        assert!(!machine.packet().final_, "one Final per Poll");
    }

    #[test]
    fn detection_time_is_their_multiplier_times_the_slower_interval() {
        let now = Instant::now();
        let machine = up(now);
        // max(our 300 ms receive, their 200 ms transmit) x their 3.
        assert_eq!(machine.detection_time(), Duration::from_millis(900));
        assert_eq!(
            machine.detect_deadline(),
            Some(now + Duration::from_millis(900))
        );
    }

    #[test]
    fn silence_for_the_detection_time_takes_the_session_down() {
        let now = Instant::now();
        let mut machine = up(now);
        assert_eq!(machine.expire(now + Duration::from_millis(899)), None);
        assert_eq!(
            machine.expire(now + Duration::from_millis(900)),
            Some(Change {
                from: BfdState::Up,
                to: BfdState::Down
            })
        );
        assert_eq!(machine.diagnostic, Diagnostic::DETECTION_TIME_EXPIRED);
        assert_eq!(machine.remote_discriminator, 0, "§6.8.1: forgotten");
        let packet = machine.packet();
        assert_eq!(packet.desired_min_tx, SLOW_TX, "slow again while Down");
        assert!(!packet.poll);
        assert_eq!(machine.expire(now + Duration::from_secs(5)), None);
    }

    #[test]
    fn when_not_to_send() {
        let now = Instant::now();
        let mut passive = Machine::new(
            BfdProfile {
                passive: true,
                ..profile()
            },
            ME,
        );
        assert_eq!(passive.transmit_interval(), None, "passive: until heard");
        passive.receive(&from_router(BfdState::Down, 0), now);
        assert!(passive.transmit_interval().is_some());

        let mut quiet = up(now);
        let mut wants_none = from_router(BfdState::Up, ME);
        wants_none.required_min_rx = Duration::ZERO;
        quiet.receive(&wants_none, now);
        assert_eq!(quiet.transmit_interval(), None);

        let mut slow_receiver = up(now);
        let mut slow = from_router(BfdState::Up, ME);
        slow.required_min_rx = Duration::from_secs(2);
        slow_receiver.receive(&slow, now);
        assert_eq!(
            slow_receiver.transmit_interval(),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn a_resumed_session_goes_on_where_its_predecessor_was() {
        let now = Instant::now();
        let before = up(now);
        let local = "10.0.0.1:50000".parse().unwrap();
        let resume = before.resume(local, "10.0.0.2".parse().unwrap()).unwrap();
        let mut after = Machine::resumed(profile(), &resume, now);
        let packet = after.packet();
        assert_eq!(packet.state, BfdState::Up);
        assert_eq!(
            (packet.my_discriminator, packet.your_discriminator),
            (ME, ROUTER)
        );
        assert!(!packet.poll, "nothing changed for the router");
        assert_eq!(after.transmit_interval(), before.transmit_interval());
        assert_eq!(after.detect_deadline(), Some(now + before.detection_time()));
        let received = after.receive(&from_router(BfdState::Up, ME), now);
        assert_eq!(received.change, None);
        assert_eq!(
            Machine::new(profile(), ME).resume(local, resume.peer),
            None,
            "not Up"
        );
    }

    #[test]
    fn admin_down_is_said_and_packets_change_nothing_then() {
        let now = Instant::now();
        let mut machine = up(now);
        assert!(machine.admin_down().is_some());
        let packet = machine.packet();
        assert_eq!(packet.state, BfdState::AdminDown);
        assert_eq!(packet.diagnostic, Diagnostic::ADMINISTRATIVELY_DOWN);
        machine.receive(&from_router(BfdState::Up, ME), now);
        assert_eq!(machine.state, BfdState::AdminDown);
    }
}
