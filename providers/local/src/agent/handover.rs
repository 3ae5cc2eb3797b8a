//! The hand-over between an agent and the one that replaces it on the same node (a rolling update of
//! the DaemonSet with `maxSurge`: the new pod starts while the old one runs), so that an upgrade cuts
//! no connection.
//!
//! The running agent listens on a Unix socket (`--handover-socket`, on a hostPath both pods mount).
//! An agent that starts connects to it first: if someone answers, it is a successor, and it waits.
//! When the old agent is told to stop (SIGTERM, once the new pod is ready), it sends the successor,
//! over that connection, its listening sockets (the data plane's, [`local_data_plane::HandedSocket`])
//! and its membership socket (`SCM_RIGHTS`), waits for the successor's word that it took them, and
//! exits *without* taking its VIPs off the interface, deleting its heartbeat or leaving the
//! membership: the successor adopts the VIPs it finds on the interface, accepts from the same
//! sockets (so nothing waiting to be accepted is refused), renews the same heartbeat and rejoins the
//! membership at the same address as a newer self. The old agent meanwhile lets the connections it
//! accepted finish, within the data plane's drain time.
//!
//! Messages are `SOCK_SEQPACKET` (one message per send, descriptors attached to it), JSON. The
//! socket file is the agent's user's alone (mode 0600, in a directory only root writes), and a
//! successor refuses one of another user. `std` and tokio have no `SCM_RIGHTS` nor
//! `SOCK_SEQPACKET`: `rustix` gives both without `unsafe`.

use std::{
    io::{IoSlice, IoSliceMut},
    mem::MaybeUninit,
    net::SocketAddr,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use local_data_plane::{HandedSocket, Protocol};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};
use tokio::{io::Interest, net::UnixStream};
use tokio_util::sync::CancellationToken;

use crate::Error;

/// Descriptors per message (the kernel takes at most 253, `SCM_MAX_FD`).
const FDS_PER_MESSAGE: usize = 200;

/// The largest message (200 listeners' descriptions fit many times over).
const MESSAGE_BYTES: usize = 64 * 1024;

/// How long the old agent waits for the successor's word that it took everything.
const TAKEN_WITHIN: Duration = Duration::from_secs(5);

/// What the old agent hands over.
#[derive(Debug, Default)]
pub(crate) struct Handed {
    /// The data plane's listening sockets.
    pub listeners: Vec<HandedSocket>,
    /// The membership protocol's socket.
    pub membership: Option<OwnedFd>,
    /// The BFD sessions that are Up, for the successor to take over as they are (the routers see no
    /// change; a new session would first say Down, which ends their BGP sessions).
    pub bfd: Vec<local_bgp::BfdResume>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
enum Message {
    /// Listening sockets, their descriptors attached in this order.
    Listeners { sockets: Vec<Listener> },
    /// The membership socket, attached.
    Membership,
    /// The BFD sessions, described (sent only when there are some, so that a successor of an older
    /// version is not sent what it does not know).
    Bfd { sessions: Vec<HandedBfd> },
    /// Everything was sent.
    Done,
    /// The successor's answer: everything was taken.
    Taken,
}

#[derive(Debug, Serialize, Deserialize)]
struct Listener {
    protocol: String,
    addr: SocketAddr,
}

/// A BFD session as [`local_bgp::BfdResume`] has it, intervals in microseconds.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct HandedBfd {
    peer: std::net::IpAddr,
    local: SocketAddr,
    receive_interval_us: u64,
    transmit_interval_us: u64,
    detect_multiplier: u8,
    passive: bool,
    local_discriminator: u32,
    remote_discriminator: u32,
    remote_min_rx_us: u64,
    remote_desired_tx_us: u64,
    remote_detect_mult: u8,
}

fn micros(interval: Duration) -> u64 {
    u64::try_from(interval.as_micros()).unwrap_or(u64::MAX)
}

impl From<&local_bgp::BfdResume> for HandedBfd {
    fn from(r: &local_bgp::BfdResume) -> Self {
        HandedBfd {
            peer: r.peer,
            local: r.local,
            receive_interval_us: micros(r.profile.receive_interval),
            transmit_interval_us: micros(r.profile.transmit_interval),
            detect_multiplier: r.profile.detect_multiplier,
            passive: r.profile.passive,
            local_discriminator: r.local_discriminator,
            remote_discriminator: r.remote_discriminator,
            remote_min_rx_us: micros(r.remote_min_rx),
            remote_desired_tx_us: micros(r.remote_desired_tx),
            remote_detect_mult: r.remote_detect_mult,
        }
    }
}

impl From<HandedBfd> for local_bgp::BfdResume {
    fn from(h: HandedBfd) -> Self {
        local_bgp::BfdResume {
            peer: h.peer,
            local: h.local,
            profile: local_bgp::BfdProfile {
                receive_interval: Duration::from_micros(h.receive_interval_us),
                transmit_interval: Duration::from_micros(h.transmit_interval_us),
                detect_multiplier: h.detect_multiplier,
                passive: h.passive,
            },
            local_discriminator: h.local_discriminator,
            remote_discriminator: h.remote_discriminator,
            remote_min_rx: Duration::from_micros(h.remote_min_rx_us),
            remote_desired_tx: Duration::from_micros(h.remote_desired_tx_us),
            remote_detect_mult: h.remote_detect_mult,
        }
    }
}

/// What [`open`] found at the socket's path.
pub(crate) enum Opened {
    /// No agent runs on this node: this one listens for its own successor.
    Alone(Point),
    /// An agent runs on this node: this one replaces it once it hands over.
    Replacing(Predecessor),
}

/// Connects to the agent running on this node, if one listens at `path`; else listens there.
pub(crate) fn open(path: &Path) -> Result<Opened, Error> {
    let io = io_error(path);
    let socket = seqpacket().map_err(io("creating a socket"))?;
    let address = SocketAddrUnix::new(path).map_err(|e| io("naming it")(e.into()))?;
    owned_by_me(path)?;
    match rustix::net::connect(&socket, &address) {
        Ok(()) => {
            let socket = stream(socket).map_err(io("registering it"))?;
            Ok(Opened::Replacing(Predecessor {
                socket,
                path: path.to_owned(),
            }))
        }
        // Nobody listens (no file, or the file of an agent that was killed).
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::CONNREFUSED) => {
            Point::bind(path).map(Opened::Alone)
        }
        Err(err) => Err(io("connecting to it")(err.into())),
    }
}

/// Where the running agent's successor connects.
#[derive(Debug)]
pub(crate) struct Point {
    socket: OwnedFd,
    path: PathBuf,
    /// The successors accepted so far, oldest first (those gone are dropped at each look).
    waiting: Vec<OwnedFd>,
}

impl Point {
    /// Listens at `path` (replacing the file of an agent that is gone, or that handed over).
    pub(crate) fn bind(path: &Path) -> Result<Self, Error> {
        let io = io_error(path);
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io("removing the old socket file")(err)),
        }
        let socket = seqpacket().map_err(io("creating a socket"))?;
        let address = SocketAddrUnix::new(path).map_err(|e| io("naming it")(e.into()))?;
        rustix::net::bind(&socket, &address).map_err(|e| io("binding it")(e.into()))?;
        // Only this user connects (connecting needs write permission on the file).
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(io("making it this user's alone"))?;
        rustix::net::listen(&socket, 16).map_err(|e| io("listening on it")(e.into()))?;
        Ok(Self {
            socket,
            path: path.to_owned(),
            waiting: Vec::new(),
        })
    }

    /// Accepts the successors that connected since the last look and forgets those that went away
    /// (a successor that crashed and restarts connects again each time: unaccepted, its old
    /// connections would fill the queue). Called at each of the agent's looks; takes no time.
    pub(crate) fn look(&mut self) {
        loop {
            match rustix::net::accept_with(
                &self.socket,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            ) {
                Ok(successor) => {
                    tracing::info!(
                        "an agent that replaces this one connected: it gets the hand-over when this one stops"
                    );
                    self.waiting.push(successor);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
        }
        self.waiting.retain(|successor| {
            let mut byte = [0u8; 1];
            // Nothing to read and still open: it waits. A close (or a message: none is due) is no
            // successor that waits.
            matches!(
                rustix::net::recv(
                    successor,
                    &mut byte,
                    rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT
                ),
                Err(rustix::io::Errno::AGAIN)
            )
        });
    }

    /// The successors that wait, the newest first.
    pub(crate) fn successors(&mut self) -> Vec<OwnedFd> {
        self.look();
        let mut waiting = std::mem::take(&mut self.waiting);
        waiting.reverse();
        waiting
    }

    /// Hands `handed` over to the first of `successors` that takes it.
    pub(crate) async fn hand_over(
        &self,
        successors: Vec<OwnedFd>,
        handed: &Handed,
    ) -> Result<(), Error> {
        let mut last = protocol(&self.path, "no successor waits".to_owned());
        for successor in successors {
            match self.hand_over_to(successor, handed).await {
                Ok(()) => return Ok(()),
                Err(err) => {
                    tracing::warn!(error = %err, "a successor did not take the hand-over");
                    last = err;
                }
            }
        }
        Err(last)
    }

    async fn hand_over_to(&self, successor: OwnedFd, handed: &Handed) -> Result<(), Error> {
        let io = io_error(&self.path);
        let successor = stream(successor).map_err(io("registering a successor"))?;
        for chunk in handed.listeners.chunks(FDS_PER_MESSAGE) {
            let message = Message::Listeners {
                sockets: chunk
                    .iter()
                    .map(|s| Listener {
                        protocol: s.protocol.to_string(),
                        addr: s.addr,
                    })
                    .collect(),
            };
            let fds: Vec<BorrowedFd<'_>> = chunk.iter().map(|s| s.fd.as_fd()).collect();
            send(&successor, &message, &fds, &self.path).await?;
        }
        if let Some(membership) = &handed.membership {
            send(
                &successor,
                &Message::Membership,
                &[membership.as_fd()],
                &self.path,
            )
            .await?;
        }
        if !handed.bfd.is_empty() {
            let sessions = handed.bfd.iter().map(HandedBfd::from).collect();
            send(&successor, &Message::Bfd { sessions }, &[], &self.path).await?;
        }
        send(&successor, &Message::Done, &[], &self.path).await?;
        match tokio::time::timeout(TAKEN_WITHIN, receive(&successor, &self.path)).await {
            Ok(Ok(Some((Message::Taken, _)))) => Ok(()),
            Ok(Ok(other)) => Err(protocol(
                &self.path,
                format!("the successor answered {other:?} instead of taken"),
            )),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(protocol(
                &self.path,
                format!("the successor did not answer within {TAKEN_WITHIN:?}"),
            )),
        }
    }
}

/// The running agent, as its successor sees it.
pub(crate) struct Predecessor {
    socket: UnixStream,
    path: PathBuf,
}

impl Predecessor {
    /// Waits until the running agent hands over (`Some`), stops without handing over or was killed
    /// (`None`), or `shutdown`.
    pub(crate) async fn wait(self, shutdown: &CancellationToken) -> Result<Option<Handed>, Error> {
        let mut handed = Handed::default();
        loop {
            let received = tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                received = receive(&self.socket, &self.path) => received?,
            };
            let Some((message, mut fds)) = received else {
                return Ok(None);
            };
            match message {
                Message::Listeners { sockets } => {
                    if fds.len() != sockets.len() {
                        return Err(protocol(
                            &self.path,
                            format!(
                                "{} listeners described, {} sockets attached",
                                sockets.len(),
                                fds.len()
                            ),
                        ));
                    }
                    for (listener, fd) in sockets.into_iter().zip(fds) {
                        let protocol = match listener.protocol.as_str() {
                            "TCP" => Protocol::Tcp,
                            "UDP" => Protocol::Udp,
                            other => {
                                return Err(protocol(
                                    &self.path,
                                    format!("a listener of protocol {other:?}"),
                                ));
                            }
                        };
                        handed.listeners.push(HandedSocket {
                            protocol,
                            addr: listener.addr,
                            fd,
                        });
                    }
                }
                Message::Membership => match (fds.pop(), fds.is_empty()) {
                    (Some(fd), true) => handed.membership = Some(fd),
                    _ => {
                        return Err(protocol(
                            &self.path,
                            "the membership message must carry one socket".to_owned(),
                        ));
                    }
                },
                Message::Bfd { sessions } => {
                    handed
                        .bfd
                        .extend(sessions.into_iter().map(local_bgp::BfdResume::from));
                }
                Message::Done => {
                    send(&self.socket, &Message::Taken, &[], &self.path).await?;
                    return Ok(Some(handed));
                }
                Message::Taken => {
                    return Err(protocol(
                        &self.path,
                        "the running agent said taken".to_owned(),
                    ));
                }
            }
        }
    }
}

async fn send(
    socket: &UnixStream,
    message: &Message,
    fds: &[BorrowedFd<'_>],
    path: &Path,
) -> Result<(), Error> {
    let data = serde_json::to_vec(message).map_err(|err| protocol(path, err.to_string()))?;
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    loop {
        socket
            .writable()
            .await
            .map_err(io_error(path)("waiting to send"))?;
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(protocol(
                path,
                "too many sockets for one message".to_owned(),
            ));
        }
        match socket.try_io(Interest::WRITABLE, || {
            rustix::net::sendmsg(
                socket,
                &[IoSlice::new(&data)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(std::io::Error::from)
        }) {
            Ok(_) => return Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(io_error(path)("sending")(err)),
        }
    }
}

/// The next message and its descriptors; `None` when the other end closed.
async fn receive(
    socket: &UnixStream,
    path: &Path,
) -> Result<Option<(Message, Vec<OwnedFd>)>, Error> {
    let mut data = vec![0u8; MESSAGE_BYTES];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(253))];
    loop {
        socket
            .readable()
            .await
            .map_err(io_error(path)("waiting to receive"))?;
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = socket.try_io(Interest::READABLE, || {
            rustix::net::recvmsg(
                socket,
                &mut [IoSliceMut::new(&mut data)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)
        });
        let received = match received {
            Ok(received) => received,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            // The other end closed before accepting (an agent killed while its successor waited).
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
            Err(err) => return Err(io_error(path)("receiving")(err)),
        };
        let mut fds = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if received
            .flags
            .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
        {
            return Err(protocol(path, "a message was truncated".to_owned()));
        }
        if received.bytes == 0 {
            return Ok(None);
        }
        let message = serde_json::from_slice(&data[..received.bytes])
            .map_err(|err| protocol(path, format!("a message that is not ours: {err}")))?;
        return Ok(Some((message, fds)));
    }
}

/// A connected `SOCK_SEQPACKET` socket on the runtime: tokio's `UnixStream` only waits for
/// readiness here, every send and receive is `sendmsg`/`recvmsg` (one message each).
fn stream(socket: OwnedFd) -> std::io::Result<UnixStream> {
    UnixStream::from_std(std::os::unix::net::UnixStream::from(socket))
}

fn seqpacket() -> std::io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Refuses a socket file of another user: its listener would be no agent of ours. (The running
/// agent's file is mode 0600, so only its user connects; `SO_PEERCRED` cannot be read across the
/// pods' PID namespaces, where the peer's PID is 0.)
fn owned_by_me(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let owner = match std::fs::metadata(path) {
        Ok(metadata) => metadata.uid(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_error(path)("reading its owner")(err)),
    };
    let me = rustix::process::geteuid().as_raw();
    if owner != me {
        return Err(protocol(
            path,
            format!("the socket belongs to uid {owner}, this agent runs as uid {me}"),
        ));
    }
    Ok(())
}

fn io_error(path: &Path) -> impl Fn(&'static str) -> Box<dyn FnOnce(std::io::Error) -> Error> {
    let path = path.display().to_string();
    move |what| {
        let path = path.clone();
        Box::new(move |source| Error::HandoverIo { path, what, source })
    }
}

fn protocol(path: &Path, why: String) -> Error {
    Error::Handover {
        path: path.display().to_string(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn opened(path: &Path) -> Opened {
        open(path).expect("open")
    }

    /// The address a socket is bound to (`getsockname`, whatever its type).
    fn local_addr(fd: &OwnedFd) -> SocketAddr {
        std::net::UdpSocket::from(fd.try_clone().unwrap())
            .local_addr()
            .unwrap()
    }

    /// The first agent listens; the next one connects and waits; when the first hands over, the
    /// successor holds the very sockets (same addresses), and binds the path for its own successor.
    #[tokio::test]
    async fn the_successor_receives_the_listening_and_membership_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let Opened::Alone(mut point) = opened(&path) else {
            panic!("nobody runs yet")
        };
        let Opened::Replacing(predecessor) = opened(&path) else {
            panic!("the first agent runs")
        };
        let shutdown = CancellationToken::new();
        let waiting = tokio::spawn(async move { predecessor.wait(&shutdown).await });

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let membership = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addrs = (
            tcp.local_addr().unwrap(),
            udp.local_addr().unwrap(),
            membership.local_addr().unwrap(),
        );
        let bfd = local_bgp::BfdResume {
            peer: "10.89.0.250".parse().unwrap(),
            local: "10.89.0.11:49200".parse().unwrap(),
            profile: local_bgp::BfdProfile::default(),
            local_discriminator: 7,
            remote_discriminator: 9,
            remote_min_rx: Duration::from_millis(300),
            remote_desired_tx: Duration::from_millis(250),
            remote_detect_mult: 3,
        };
        let handed = Handed {
            listeners: vec![
                HandedSocket {
                    protocol: Protocol::Tcp,
                    addr: addrs.0,
                    fd: tcp.into(),
                },
                HandedSocket {
                    protocol: Protocol::Udp,
                    addr: addrs.1,
                    fd: udp.into(),
                },
            ],
            membership: Some(membership.into()),
            bfd: vec![bfd],
        };
        let successors = point.successors();
        assert_eq!(successors.len(), 1);
        point
            .hand_over(successors, &handed)
            .await
            .expect("handed over");
        let received = waiting.await.unwrap().expect("no error").expect("handed");
        let listeners: Vec<_> = received
            .listeners
            .iter()
            .map(|s| (s.protocol, s.addr, local_addr(&s.fd)))
            .collect();
        assert_eq!(
            listeners,
            [
                (Protocol::Tcp, addrs.0, addrs.0),
                (Protocol::Udp, addrs.1, addrs.1)
            ]
        );
        assert_eq!(local_addr(received.membership.as_ref().unwrap()), addrs.2);
        assert_eq!(received.bfd, [bfd], "the BFD sessions, as they were");
        // The successor listens for its own successor at the same path.
        let _next_point = Point::bind(&path).unwrap();
        assert!(matches!(opened(&path), Opened::Replacing(_)));
    }

    /// An agent killed (its listening socket gone, its file left) is no predecessor: the next one
    /// listens in its place. One that goes away while a successor waits lets it start afresh.
    #[tokio::test]
    async fn a_predecessor_gone_leaves_its_successor_to_start_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let Opened::Alone(point) = opened(&path) else {
            panic!()
        };
        drop(point);
        assert!(path.exists(), "the file of a killed agent stays");
        let Opened::Alone(point) = opened(&path) else {
            panic!("a file nobody listens on is no predecessor")
        };
        let Opened::Replacing(predecessor) = opened(&path) else {
            panic!()
        };
        drop(point);
        let shutdown = CancellationToken::new();
        let outcome = tokio::time::timeout(Duration::from_secs(5), predecessor.wait(&shutdown))
            .await
            .expect("the wait ends");
        assert!(matches!(outcome, Ok(None)), "{outcome:?}");
    }

    /// Of two successors, the newest goes away as the hand-over starts: the other one gets it.
    #[tokio::test]
    async fn a_successor_gone_is_skipped_for_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let Opened::Alone(mut point) = opened(&path) else {
            panic!()
        };
        let Opened::Replacing(first) = opened(&path) else {
            panic!()
        };
        let Opened::Replacing(gone) = opened(&path) else {
            panic!()
        };
        let successors = point.successors();
        assert_eq!(successors.len(), 2);
        drop(gone);
        let shutdown = CancellationToken::new();
        let waiting = tokio::spawn(async move { first.wait(&shutdown).await });
        point
            .hand_over(successors, &Handed::default())
            .await
            .expect("the waiting successor takes it");
        let received = waiting.await.unwrap().unwrap().unwrap();
        assert!(received.listeners.is_empty() && received.membership.is_none());
    }

    /// A successor that crashes and restarts connects again each time: the running agent forgets
    /// the connections of those gone at each look, so the queue never fills, and only the one that
    /// waits is a successor.
    #[tokio::test]
    async fn successors_that_crash_and_restart_do_not_fill_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let Opened::Alone(mut point) = opened(&path) else {
            panic!()
        };
        for _ in 0..40 {
            let Opened::Replacing(crashed) = opened(&path) else {
                panic!("the running agent still takes successors")
            };
            drop(crashed);
            point.look();
        }
        let Opened::Replacing(_waiting) = opened(&path) else {
            panic!()
        };
        assert_eq!(point.successors().len(), 1);
    }

    /// Whatever else comes through the socket is refused with the reason, and a successor that is
    /// stopped while it waits touches nothing.
    #[tokio::test]
    async fn a_message_that_is_not_ours_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let Opened::Alone(mut point) = opened(&path) else {
            panic!()
        };
        let Opened::Replacing(predecessor) = opened(&path) else {
            panic!()
        };
        let successor = stream(point.successors().pop().unwrap()).unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Two listeners described, one socket attached.
        let message = Message::Listeners {
            sockets: vec![
                Listener {
                    protocol: "TCP".into(),
                    addr: "127.0.0.1:1".parse().unwrap(),
                },
                Listener {
                    protocol: "TCP".into(),
                    addr: "127.0.0.1:2".parse().unwrap(),
                },
            ],
        };
        send(&successor, &message, &[socket.as_fd()], &path)
            .await
            .unwrap();
        let err = predecessor
            .wait(&CancellationToken::new())
            .await
            .expect_err("refused");
        assert!(
            err.to_string()
                .contains("2 listeners described, 1 sockets attached"),
            "{err}"
        );

        let Opened::Replacing(predecessor) = opened(&path) else {
            panic!()
        };
        let successor = stream(point.successors().pop().unwrap()).unwrap();
        successor.writable().await.unwrap();
        successor
            .try_io(Interest::WRITABLE, || {
                rustix::net::send(&successor, b"{not json", SendFlags::NOSIGNAL)
                    .map_err(std::io::Error::from)
            })
            .unwrap();
        let err = predecessor
            .wait(&CancellationToken::new())
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("not ours"), "{err}");

        let Opened::Replacing(predecessor) = opened(&path) else {
            panic!()
        };
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        assert!(matches!(predecessor.wait(&shutdown).await, Ok(None)));
    }
}
