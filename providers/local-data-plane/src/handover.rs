//! Listening sockets passed from one process to the next (a rolling update of the node agents): the
//! new process accepts from the very sockets the old one listened on, so the kernel's queue of
//! connections waiting to be accepted carries over and nothing is refused between the two. How the
//! descriptors travel between the processes is the caller's (a Unix socket's `SCM_RIGHTS`).

use std::{
    io,
    net::SocketAddr,
    os::fd::{AsFd, OwnedFd},
    sync::Arc,
};

use tokio::net::UdpSocket;

use crate::Protocol;

/// One listening socket handed over: its address and protocol (what a listener is keyed by), and a
/// descriptor of it.
#[derive(Debug)]
pub struct HandedSocket {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The address it is bound to (VIP and port).
    pub addr: SocketAddr,
    /// The socket.
    pub fd: OwnedFd,
}

/// A running listener's share of its socket. A TCP one is shared with its accept loop, which runs on
/// one relay thread and registers it with that thread's driver (`sockets::tcp_listener_on`).
#[derive(Debug)]
pub(crate) enum ListeningSocket {
    Tcp(Arc<std::net::TcpListener>),
    Udp(Arc<UdpSocket>),
}

impl ListeningSocket {
    /// The address it is bound to.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            ListeningSocket::Tcp(socket) => socket.local_addr(),
            ListeningSocket::Udp(socket) => socket.local_addr(),
        }
    }

    /// A new descriptor of the same socket.
    pub(crate) fn duplicate(&self) -> io::Result<OwnedFd> {
        match self {
            ListeningSocket::Tcp(socket) => socket.as_fd().try_clone_to_owned(),
            ListeningSocket::Udp(socket) => socket.as_fd().try_clone_to_owned(),
        }
    }
}

/// A TCP listener from a descriptor handed over (non-blocking); refused unless it is a TCP socket
/// listening on `addr`.
pub(crate) fn tcp_listener(fd: OwnedFd, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = adopted(fd, addr, socket2::Type::STREAM, "no listening TCP socket")?;
    Ok(socket.into())
}

/// A UDP socket from a descriptor handed over; refused unless it is a UDP socket bound to `addr`.
pub(crate) fn udp_socket(fd: OwnedFd, addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = adopted(fd, addr, socket2::Type::DGRAM, "no UDP socket")?;
    UdpSocket::from_std(socket.into())
}

/// The socket of a descriptor handed over, made non-blocking; refused (the socket handed over is
/// `not_it`) unless it is of type `kind` (a stream one listening) and bound to `addr`.
fn adopted(
    fd: OwnedFd,
    addr: SocketAddr,
    kind: socket2::Type,
    not_it: &str,
) -> io::Result<socket2::Socket> {
    let socket = socket2::Socket::from(fd);
    if socket.r#type()? != kind || (kind == socket2::Type::STREAM && !socket.is_listener()?) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the socket handed over is {not_it}"),
        ));
    }
    bound_to(&socket, addr)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn bound_to(socket: &socket2::Socket, addr: SocketAddr) -> io::Result<()> {
    let bound = socket.local_addr()?.as_socket();
    if bound != Some(addr) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the socket handed over for {addr} is bound to {bound:?}"),
        ));
    }
    Ok(())
}
