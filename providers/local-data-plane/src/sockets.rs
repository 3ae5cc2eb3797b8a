//! The sockets listeners serve: the ones handed over by the process before (module `handover`), else
//! new ones.

use std::{io, net::SocketAddr, os::fd::OwnedFd, sync::Arc};

use socket2::{Domain, Socket, Type};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{Protocol, handover, handover::ListeningSocket, tcp, udp};

/// The socket of a listener on `addr`: the one handed over (`inherited`), else a new one.
pub(crate) fn open(
    protocol: Protocol,
    inherited: Option<OwnedFd>,
    addr: SocketAddr,
) -> io::Result<ListeningSocket> {
    Ok(match (protocol, inherited) {
        (Protocol::Tcp, Some(fd)) => {
            ListeningSocket::Tcp(Arc::new(handover::tcp_listener(fd, addr)?))
        }
        (Protocol::Tcp, None) => ListeningSocket::Tcp(Arc::new(tcp::bind(addr)?)),
        (Protocol::Udp, Some(fd)) => {
            ListeningSocket::Udp(Arc::new(handover::udp_socket(fd, addr)?))
        }
        (Protocol::Udp, None) => ListeningSocket::Udp(Arc::new(udp::bind(addr)?)),
    })
}

/// The (non-blocking) listening socket `listener`, registered with `runtime`'s I/O driver, for a relay
/// thread to accept from; the socket itself, not a duplicate of its descriptor. An
/// `AsyncFd` rather than tokio's `TcpListener`, whose `accept` registers each connection with the
/// accepting thread's driver (`tcp::accept`).
pub(crate) fn tcp_listener_on(
    runtime: &tokio::runtime::Handle,
    listener: &Arc<std::net::TcpListener>,
) -> io::Result<AsyncFd<Arc<std::net::TcpListener>>> {
    let _on = runtime.enter();
    // `with_interest` is deprecated for a type whose descriptor could change or close under the
    // `AsyncFd` (tokio#8587); its replacement is `unsafe`, which this workspace forbids. A shared
    // `std::net::TcpListener` keeps one descriptor, open, for as long as a share of it lives: the
    // condition the replacement asks the caller to uphold holds here.
    #[allow(deprecated)]
    AsyncFd::with_interest(listener.clone(), Interest::READABLE)
}

/// A new socket of `addr`'s family, not bound yet; an IPv6 one is IPv6-only, so `[::]` and `0.0.0.0`
/// can coexist.
pub(crate) fn for_address(
    addr: SocketAddr,
    kind: Type,
    protocol: socket2::Protocol,
) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    Ok(socket)
}
