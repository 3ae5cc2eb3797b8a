//! BFD (RFC 5880, single hop as RFC 5881 has it, asynchronous mode): each peer with a BFD profile
//! exchanges control packets with the router every few hundred milliseconds, so that either side
//! knows within `interval x multiplier` that the other is gone, and the router withdraws our routes
//! then rather than after the BGP hold time. When our side finds the router gone, the peer's BGP
//! session ends at once (RFC 5882 §3.2).
//!
//! [`Bfd`] is the node's endpoint: the sockets that receive on UDP port 3784 (IPv4 and IPv6,
//! packets sent with a TTL of 255 only), and the sessions they hand packets to by the sender's
//! address. Each session sends from a socket of its own (a source port from 49152, TTL 255). Echo
//! mode, demand mode, authentication and multihop BFD (RFC 5883) are not implemented; a profile
//! cannot ask for them.

mod machine;
mod packet;

pub use packet::{BfdState, ControlPacket, Diagnostic, Invalid};

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::RngExt;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::Error;
use machine::{Change, Machine};

/// The UDP port single-hop BFD control packets go to (RFC 5881 §4).
pub const BFD_PORT: u16 = 3784;
/// The TTL single-hop BFD packets are sent with, and the only one taken (RFC 5881 §5).
const TTL: u8 = 255;
/// How many AdminDown packets a session sends as it is stopped.
const ADMIN_DOWN_PACKETS: u32 = 3;

/// A session's timers (MetalLB's `BFDProfile` has the same fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfdProfile {
    /// The shortest interval between the router's packets we ask for.
    pub receive_interval: Duration,
    /// The interval we want between our packets (the router may ask for a longer one).
    pub transmit_interval: Duration,
    /// Packets missed in a row before the other side counts as gone.
    pub detect_multiplier: u8,
    /// Passive: send nothing until the router's first packet.
    pub passive: bool,
}

impl Default for BfdProfile {
    /// MetalLB's defaults: 300 ms each way, 3 packets.
    fn default() -> BfdProfile {
        BfdProfile {
            receive_interval: Duration::from_millis(300),
            transmit_interval: Duration::from_millis(300),
            detect_multiplier: 3,
            passive: false,
        }
    }
}

impl BfdProfile {
    /// The shortest interval a profile may have.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
    /// The longest.
    pub const MAX_INTERVAL: Duration = Duration::from_secs(60);

    /// What is wrong with the profile, in words, if anything (MetalLB's bounds: intervals 10 ms to
    /// 60 s, multiplier 2 to 255).
    pub fn problem(&self) -> Option<String> {
        for (name, interval) in [
            ("receive interval", self.receive_interval),
            ("transmit interval", self.transmit_interval),
        ] {
            if interval < Self::MIN_INTERVAL || interval > Self::MAX_INTERVAL {
                return Some(format!(
                    "BFD {name} {interval:?}: it must be from 10 ms to 60 s"
                ));
            }
        }
        if self.detect_multiplier < 2 {
            return Some(format!(
                "BFD detect multiplier {}: it must be from 2 to 255",
                self.detect_multiplier
            ));
        }
        None
    }
}

/// What a node agent's successor needs to take a BFD session over without the router noticing
/// ([`Bfd::resume`]): the same source address and port, the same discriminators, the router's
/// timers as they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfdResume {
    /// The router's address.
    pub peer: IpAddr,
    /// The session's source address and port.
    pub local: SocketAddr,
    /// Its timers.
    pub profile: BfdProfile,
    /// Our discriminator.
    pub local_discriminator: u32,
    /// The router's.
    pub remote_discriminator: u32,
    /// The shortest interval between our packets the router takes.
    pub remote_min_rx: Duration,
    /// The interval the router wants between its packets.
    pub remote_desired_tx: Duration,
    /// The router's detection multiplier.
    pub remote_detect_mult: u8,
}

/// What a BFD session is doing, for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BfdStatus {
    /// Our state.
    pub state: BfdState,
    /// The router's state, as its last packet said.
    pub remote_state: BfdState,
    /// Why our state last left Up, or did not come up.
    pub diagnostic: Diagnostic,
    /// Since when the session is Up.
    pub up_since: Option<Instant>,
    /// The router took the session down on purpose (AdminDown): not a failure of the path, and
    /// no reason to end the BGP session (RFC 5882 §3.2).
    pub remote_admin_down: bool,
    /// Times the session came Up.
    pub up_events: u64,
    /// Times it went Down from Up.
    pub down_events: u64,
    /// Times it went Down from Up other than by the router's AdminDown: the path or the router
    /// failed.
    pub failures: u64,
    /// Control packets received.
    pub packets_received: u64,
    /// Control packets sent.
    pub packets_sent: u64,
    /// The detection time in force.
    pub detection_time: Option<Duration>,
    /// While Up: what a successor needs to take the session over.
    pub resume: Option<BfdResume>,
}

type Inbox = mpsc::Sender<(ControlPacket, Instant)>;
type Sessions = Arc<Mutex<HashMap<IpAddr, Inbox>>>;

struct Inner {
    port: u16,
    sessions: Sessions,
    receivers: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for receiver in &self.receivers {
            receiver.abort();
        }
    }
}

/// The node's BFD endpoint: it receives every session's packets and hands them on by the sender's
/// address. Clones share it; its receiving tasks end with the last clone.
#[derive(Clone)]
pub struct Bfd {
    inner: Arc<Inner>,
}

impl Bfd {
    /// Whether a receiving task ended (a bug: it panicked): the endpoint hears nothing more, and a
    /// new one must be bound.
    pub fn has_failed(&self) -> bool {
        self.inner.receivers.iter().any(JoinHandle::is_finished)
    }

    /// Binds UDP port 3784 on every IPv4 and IPv6 address of the host (IPv6 only where the host has
    /// it), on the current tokio runtime.
    pub fn bind() -> Result<Bfd, Error> {
        Bfd::bind_port(BFD_PORT)
    }

    /// Binds another port, for tests that run both ends on one host: sessions send to the same
    /// port.
    pub fn bind_port(port: u16) -> Result<Bfd, Error> {
        let sessions = Sessions::default();
        let mut receivers = Vec::new();
        for any in [
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        ] {
            let address = SocketAddr::new(any, port);
            let socket = match receiving_socket(address) {
                Ok(socket) => socket,
                // A host without IPv6 has IPv4 BFD only.
                Err(error) if any.is_ipv6() && error.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                    continue;
                }
                Err(source) => {
                    for receiver in &receivers {
                        JoinHandle::abort(receiver);
                    }
                    return Err(Error::BfdBind { address, source });
                }
            };
            // Watched: `Bfd::has_failed` sees a receiver that ended (a panic): the agent binds the
            // endpoint again.
            receivers.push(tokio::spawn(
                receive(socket, sessions.clone())
                    .instrument(tracing::info_span!("bfd_receive", %address)),
            ));
        }
        Ok(Bfd {
            inner: Arc::new(Inner {
                port,
                sessions,
                receivers,
            }),
        })
    }

    /// Starts a session with the router at `peer`, sending from `source` (the kernel's choice when
    /// unset), on the current tokio runtime. One session per router address.
    pub fn session(
        &self,
        peer: IpAddr,
        source: Option<IpAddr>,
        profile: BfdProfile,
    ) -> Result<BfdSession, Error> {
        if let Some(what) = profile.problem() {
            return Err(Error::Config {
                peer: peer.to_string(),
                what,
            });
        }
        let socket = sending_socket(peer, source, self.inner.port, None)
            .map_err(|source| Error::BfdSocket { peer, source })?;
        let discriminator = rand::rng().random_range(1..=u32::MAX);
        self.start(peer, socket, Machine::new(profile, discriminator))
    }

    /// Takes over a session a node agent's predecessor ran ([`BfdStatus::resume`]): from the same
    /// address and port (both processes' sockets allow it), with the same discriminators, Up. The
    /// predecessor stops its own without a word ([`BfdSession::stop_for_handover`]).
    pub fn resume(&self, resume: &BfdResume) -> Result<BfdSession, Error> {
        let peer = resume.peer;
        if let Some(what) = resume.profile.problem() {
            return Err(Error::Config {
                peer: peer.to_string(),
                what,
            });
        }
        let socket = sending_socket(
            peer,
            Some(resume.local.ip()),
            self.inner.port,
            Some(resume.local.port()),
        )
        .map_err(|source| Error::BfdSocket { peer, source })?;
        let machine = Machine::resumed(resume.profile, resume, Instant::now());
        self.start(peer, socket, machine)
    }

    fn start(
        &self,
        peer: IpAddr,
        socket: UdpSocket,
        machine: Machine,
    ) -> Result<BfdSession, Error> {
        let profile = machine.profile();
        let (inbox, packets) = mpsc::channel(16);
        {
            let mut sessions = self
                .inner
                .sessions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if sessions.contains_key(&peer) {
                return Err(Error::Config {
                    peer: peer.to_string(),
                    what: "a second BFD session with the same address".to_string(),
                });
            }
            sessions.insert(peer, inbox);
        }
        let (status_tx, status) = watch::channel(BfdStatus::default());
        let stop = CancellationToken::new();
        let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Watched: `BfdSession::has_failed` sees its end (a panic); stopping the session awaits it.
        let task = tokio::spawn(
            run(
                machine,
                socket,
                packets,
                status_tx,
                stop.clone(),
                silent.clone(),
            )
            .instrument(tracing::info_span!("bfd_session", %peer)),
        );
        Ok(BfdSession {
            bfd: self.clone(),
            peer,
            status,
            stop,
            silent,
            profile,
            task: Some(task),
        })
    }
}

/// One BFD session with a router; it runs until [`BfdSession::stop`] (or is dropped, which ends it
/// without a word to the router).
pub struct BfdSession {
    bfd: Bfd,
    peer: IpAddr,
    status: watch::Receiver<BfdStatus>,
    stop: CancellationToken,
    /// Stop without AdminDown (a hand-over).
    silent: Arc<std::sync::atomic::AtomicBool>,
    profile: BfdProfile,
    task: Option<JoinHandle<()>>,
}

impl BfdSession {
    /// Ends the session without a packet, for a successor that takes it over ([`Bfd::resume`]):
    /// the router hears the same session from it.
    pub async fn stop_for_handover(self) {
        self.silent.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop().await;
    }

    /// The session's status, now and as it changes.
    pub fn status(&self) -> watch::Receiver<BfdStatus> {
        self.status.clone()
    }

    /// Whether the session's task, or its endpoint's, ended although the session was not stopped (a
    /// bug: it panicked).
    pub fn has_failed(&self) -> bool {
        self.task.as_ref().is_some_and(JoinHandle::is_finished) || self.bfd.has_failed()
    }

    /// The session's timers.
    pub fn profile(&self) -> BfdProfile {
        self.profile
    }

    /// Ends the session as RFC 5880 §6.8.16 has it: a few packets saying AdminDown, which the
    /// router takes as no failure of the path (it keeps the BGP session to end it as that says).
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::error!(peer = %self.peer, "the BFD session's task failed: {error}");
        }
    }
}

impl Drop for BfdSession {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.bfd
            .inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.peer);
    }
}

/// A socket on `address` that reports each packet's TTL (hop limit): the kernel has no filter that
/// UDP honours (`IP_MINTTL` is TCP's), so `receive` drops what did not come with 255.
fn receiving_socket(address: SocketAddr) -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{setsockopt, sockopt};
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    if address.is_ipv6() {
        socket.set_only_v6(true)?;
        setsockopt(&socket, sockopt::Ipv6RecvHopLimit, &true)?;
    } else {
        setsockopt(&socket, sockopt::Ipv4RecvTtl, &true)?;
    }
    // A node agent's successor binds the port while the agent it replaces still has it (the
    // hand-over of a rolling update): both may, for that moment.
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    UdpSocket::from_std(socket.into())
}

/// One packet, its sender and the TTL (hop limit) it came with.
fn receive_one(
    socket: &UdpSocket,
    buffer: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<i32>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};
    use std::os::fd::AsRawFd;
    let mut control = nix::cmsg_space!(libc::c_int);
    let mut iov = [std::io::IoSliceMut::new(buffer)];
    let message = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::empty(),
    )?;
    let mut ttl = None;
    for cmsg in message.cmsgs()? {
        match cmsg {
            ControlMessageOwned::Ipv4Ttl(value) | ControlMessageOwned::Ipv6HopLimit(value) => {
                ttl = Some(value);
            }
            _ => {}
        }
    }
    let from = message
        .address
        .and_then(|address| {
            address
                .as_sockaddr_in()
                .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
                .or_else(|| {
                    address
                        .as_sockaddr_in6()
                        .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
                })
        })
        .ok_or_else(|| std::io::Error::other("a packet without a sender's address"))?;
    Ok((message.bytes, from, ttl))
}

/// A session's own socket: from `source` (or the kernel's choice) and a port from 49152 (RFC 5881
/// §4: one per session), TTL 255, connected to the router's port.
fn sending_socket(
    peer: IpAddr,
    source: Option<IpAddr>,
    port: u16,
    local_port: Option<u16>,
) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let target = SocketAddr::new(peer, port);
    let socket = Socket::new(
        Domain::for_address(target),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    match peer {
        IpAddr::V4(_) => socket.set_ttl_v4(u32::from(TTL))?,
        IpAddr::V6(_) => socket.set_unicast_hops_v6(u32::from(TTL))?,
    }
    // A node agent's successor takes the session over from the same port ([`Bfd::resume`]).
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    let ip = source.unwrap_or(match peer {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    });
    if let Some(local_port) = local_port {
        socket.bind(&SocketAddr::new(ip, local_port).into())?;
        socket.connect(&target.into())?;
        return UdpSocket::from_std(socket.into());
    }
    let mut rng = rand::rng();
    let mut last = None;
    for _ in 0..64 {
        let candidate = SocketAddr::new(ip, rng.random_range(49152..=65535));
        match socket.bind(&candidate.into()) {
            Ok(()) => {
                last = None;
                break;
            }
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => last = Some(error),
            Err(error) => return Err(error),
        }
    }
    if let Some(error) = last {
        return Err(error);
    }
    socket.connect(&target.into())?;
    UdpSocket::from_std(socket.into())
}

/// Receives control packets and hands each to the session of its sender.
async fn receive(socket: UdpSocket, sessions: Sessions) {
    let mut buffer = [0u8; 128];
    loop {
        let received = socket
            .async_io(tokio::io::Interest::READABLE, || {
                receive_one(&socket, &mut buffer)
            })
            .await;
        let (length, from, ttl) = match received {
            Ok(received) => received,
            Err(error) => {
                warn!("receiving BFD packets: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let now = Instant::now();
        if ttl != Some(i32::from(TTL)) {
            debug!(%from, ?ttl, "dropped a BFD packet: not sent with TTL 255 (RFC 5881 §5)");
            continue;
        }
        let packet = match ControlPacket::decode(&buffer[..length]) {
            Ok(packet) => packet,
            Err(invalid) => {
                debug!(%from, "dropped a BFD packet: {invalid}");
                continue;
            }
        };
        let inbox = sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&from.ip())
            .cloned();
        match inbox {
            // A full inbox: the session is behind; the packet would be stale anyway.
            Some(inbox) => {
                let _ = inbox.try_send((packet, now));
            }
            None => debug!(%from, "a BFD packet from an address with no session"),
        }
    }
}

/// Jitter (RFC 5880 §6.8.7): each interval 75% to 100% of the period, 90% at most with a
/// multiplier of 1.
fn jittered(interval: Duration, detect_multiplier: u8) -> Duration {
    let top = if detect_multiplier == 1 { 0.9 } else { 1.0 };
    interval.mul_f64(rand::rng().random_range(0.75..=top))
}

/// Runs one session until `stop`: sends on its schedule and when the machine asks, takes the
/// router's packets, and notices silence.
async fn run(
    mut machine: Machine,
    socket: UdpSocket,
    mut packets: mpsc::Receiver<(ControlPacket, Instant)>,
    status: watch::Sender<BfdStatus>,
    stop: CancellationToken,
    silent: Arc<std::sync::atomic::AtomicBool>,
) {
    let local = socket.local_addr().ok();
    let peer = socket.peer_addr().ok().map(|a| a.ip());
    let multiplier = machine.detect_multiplier();
    let mut next_send = Instant::now();
    let mut sent = 0u64;
    let mut received = 0u64;
    loop {
        let mut send_now = false;
        let mut change = None;
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            packet = packets.recv() => {
                let Some((packet, at)) = packet else { break };
                received += 1;
                let outcome = machine.receive(&packet, at);
                change = outcome.change;
                send_now = outcome.send_now;
            }
            () = sleep_until(machine.detect_deadline().unwrap_or_else(far_future)), if machine.detect_deadline().is_some() => {
                change = machine.expire(Instant::now());
            }
            () = sleep_until(next_send) => {
                send_now = machine.transmit_interval().is_some();
                if !send_now {
                    // Nothing to send on a schedule now: look again after a second.
                    next_send = Instant::now() + machine::SLOW_TX;
                }
            }
        }
        if send_now {
            send(&socket, &mut machine, &mut sent).await;
            if let Some(interval) = machine.transmit_interval() {
                next_send = Instant::now() + jittered(interval, multiplier);
            }
        }
        if let Some(change) = change {
            log_change(&machine, change);
        }
        let counts = Counts { received, sent };
        let endpoints = local.zip(peer);
        status.send_if_modified(|s| {
            let next = next_status(s, &machine, change, counts, endpoints);
            let changed = *s != next;
            *s = next;
            changed
        });
    }
    if silent.load(std::sync::atomic::Ordering::SeqCst) {
        debug!("BFD session handed over: stopped without a word");
        return;
    }
    say_admin_down(&socket, &mut machine, &mut sent).await;
    status.send_modify(|s| {
        s.state = BfdState::AdminDown;
        s.up_since = None;
        s.packets_sent = sent;
    });
}

/// Logs a change of the session's state: coming Up and leaving Up louder than the rest.
fn log_change(machine: &Machine, Change { from, to }: Change) {
    if to == BfdState::Up {
        info!(detection_time = ?machine.detection_time(), "BFD session Up");
    } else if from == BfdState::Up {
        warn!(diagnostic = %machine.diagnostic, "BFD session {to} (was Up)");
    } else {
        debug!(%from, %to, "BFD session state");
    }
}

/// The control packets a session received and sent so far.
#[derive(Clone, Copy)]
struct Counts {
    received: u64,
    sent: u64,
}

/// The session's status after a turn of its loop: `previous` with the machine's state, the `change`
/// counted, and, while Up, what a successor needs to take over from `endpoints` (our address and
/// port, the router's address).
fn next_status(
    previous: &BfdStatus,
    machine: &Machine,
    change: Option<Change>,
    counts: Counts,
    endpoints: Option<(SocketAddr, IpAddr)>,
) -> BfdStatus {
    let came_up = matches!(
        change,
        Some(Change {
            to: BfdState::Up,
            ..
        })
    );
    let went_down = matches!(
        change,
        Some(Change {
            from: BfdState::Up,
            ..
        })
    );
    let remote_admin_down = machine.remote_state == BfdState::AdminDown;
    BfdStatus {
        state: machine.state,
        remote_state: machine.remote_state,
        diagnostic: machine.diagnostic,
        up_since: match change {
            Some(_) if came_up => Some(Instant::now()),
            Some(_) => None,
            None => previous.up_since,
        },
        remote_admin_down,
        up_events: previous.up_events + u64::from(came_up),
        down_events: previous.down_events + u64::from(went_down),
        failures: previous.failures + u64::from(went_down && !remote_admin_down),
        packets_received: counts.received,
        packets_sent: counts.sent,
        detection_time: (machine.state == BfdState::Up).then(|| machine.detection_time()),
        resume: endpoints.and_then(|(local, peer)| machine.resume(local, peer)),
    }
}

/// Says AdminDown as the session stops (§6.8.16): a few packets, a transmit interval apart (at
/// most 100 ms).
async fn say_admin_down(socket: &UdpSocket, machine: &mut Machine, sent: &mut u64) {
    machine.admin_down();
    let gap = machine
        .transmit_interval()
        .unwrap_or(Duration::from_millis(100))
        .min(Duration::from_millis(100));
    for n in 0..ADMIN_DOWN_PACKETS {
        if n > 0 {
            tokio::time::sleep(gap).await;
        }
        send(socket, machine, sent).await;
    }
}

async fn send(socket: &UdpSocket, machine: &mut Machine, sent: &mut u64) {
    let bytes = machine.packet().encode();
    match socket.send(&bytes).await {
        Ok(_) => *sent += 1,
        // A router that is not there yet refuses (ICMP unreachable): the next packet tries again.
        Err(error) => debug!("sending a BFD packet: {error}"),
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn going_down_from_up_is_a_failure_unless_the_router_said_admin_down() {
        let counts = Counts {
            received: 2,
            sent: 3,
        };
        let mut machine = Machine::new(BfdProfile::default(), 1);
        machine.state = BfdState::Up;
        let came_up = Some(Change {
            from: BfdState::Init,
            to: BfdState::Up,
        });
        let up = next_status(&BfdStatus::default(), &machine, came_up, counts, None);
        assert!(up.up_since.is_some());
        assert_eq!((up.up_events, up.down_events, up.failures), (1, 0, 0));
        assert_eq!((up.packets_received, up.packets_sent), (2, 3));
        assert_eq!(
            next_status(&up, &machine, None, counts, None).up_since,
            up.up_since
        );

        machine.state = BfdState::Down;
        let went_down = Some(Change {
            from: BfdState::Up,
            to: BfdState::Down,
        });
        let failed = next_status(&up, &machine, went_down, counts, None);
        assert_eq!(failed.up_since, None);
        assert_eq!(
            (failed.up_events, failed.down_events, failed.failures),
            (1, 1, 1)
        );
        machine.remote_state = BfdState::AdminDown;
        let stopped = next_status(&up, &machine, went_down, counts, None);
        assert!(stopped.remote_admin_down);
        assert_eq!(
            (stopped.up_events, stopped.down_events, stopped.failures),
            (1, 1, 0)
        );
    }
}
