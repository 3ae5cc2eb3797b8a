//! New sockets for listeners, TCP's and UDP's alike.

use std::{io, net::SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// A new socket of `addr`'s family, not bound yet; an IPv6 one is IPv6-only, so `[::]` and `0.0.0.0`
/// can coexist.
pub(crate) fn for_address(addr: SocketAddr, kind: Type, protocol: Protocol) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    Ok(socket)
}
