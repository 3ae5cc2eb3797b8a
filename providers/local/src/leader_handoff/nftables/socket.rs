//! Netlink sockets in the calling thread's network namespace: opening one, sizing its buffers,
//! sending a datagram, receiving one.

use std::{os::fd::OwnedFd, time::Duration};

use rustix::{
    io::Errno,
    net::{
        AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType,
        netlink::SocketAddrNetlink,
        sockopt::{self, Timeout},
    },
};

use super::NftError;

/// How long [`apply`] and [`link`] wait for the kernel's answers (which it writes while it reads the
/// request, so they are there at once; this only bounds a kernel that behaves otherwise).
///
/// [`apply`]: super::apply
/// [`link`]: super::link
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest datagram the kernel sends us here (an error repeats the refused message: a few
/// kilobytes at most; a link's description is a few kilobytes too).
pub(super) const RECEIVE_BUFFER: usize = 64 * 1024;

fn socket_error(what: &'static str) -> impl FnOnce(Errno) -> NftError {
    move |errno| NftError::Socket {
        what,
        source: errno.into(),
    }
}

/// A netlink socket of `protocol` (`None`: `NETLINK_ROUTE`) in the calling thread's network
/// namespace, bound to a port the kernel picks, whose reads wait at most [`ANSWER_TIMEOUT`].
pub(super) fn netlink_socket(protocol: Option<rustix::net::Protocol>) -> Result<OwnedFd, NftError> {
    let socket = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        protocol,
    )
    .map_err(socket_error("opening it"))?;
    rustix::net::bind(&socket, &SocketAddrNetlink::new(0, 0))
        .map_err(socket_error("binding it"))?;
    sockopt::set_socket_timeout(&socket, Timeout::Recv, Some(ANSWER_TIMEOUT))
        .map_err(socket_error("setting its receive timeout"))?;
    Ok(socket)
}

/// Makes a socket buffer hold at least `size` bytes: beyond the system's limit where the caller may
/// (`CAP_NET_ADMIN`), else up to it. The kernel refuses a datagram larger than the send buffer, and
/// drops answers that do not fit the receive buffer (which [`apply`] then reports).
///
/// [`apply`]: super::apply
pub(super) fn grow_buffer(socket: &OwnedFd, send: bool, size: usize) {
    let current = if send {
        sockopt::socket_send_buffer_size(socket)
    } else {
        sockopt::socket_recv_buffer_size(socket)
    };
    if current.is_ok_and(|current| current >= size) {
        return;
    }
    // The kernel doubles what it is given (for its bookkeeping), and reports the doubled size.
    let forced = if send {
        sockopt::set_socket_send_buffer_size_force(socket, size)
    } else {
        sockopt::set_socket_recv_buffer_size_force(socket, size)
    };
    if forced.is_err() {
        // Up to the system's limit; a send that still does not fit fails, and says so.
        let _ = if send {
            sockopt::set_socket_send_buffer_size(socket, size)
        } else {
            sockopt::set_socket_recv_buffer_size(socket, size)
        };
    }
}

pub(super) fn send_all(socket: &OwnedFd, bytes: &[u8], what: &'static str) -> Result<(), NftError> {
    let sent = rustix::net::sendto(
        socket,
        bytes,
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )
    .map_err(socket_error(what))?;
    if sent != bytes.len() {
        return Err(NftError::Socket {
            what,
            source: std::io::Error::other(format!("{sent} of {} bytes sent", bytes.len())),
        });
    }
    Ok(())
}

/// Receives one datagram into `buffer`: its length, or `None` when none came (within the timeout,
/// or at once with `DONTWAIT`).
pub(super) fn receive(
    socket: &OwnedFd,
    buffer: &mut [u8],
    flags: RecvFlags,
) -> Result<Option<usize>, NftError> {
    loop {
        match rustix::net::recv(socket, &mut *buffer, flags | RecvFlags::TRUNC) {
            Ok((_, full)) if full > buffer.len() => {
                return Err(NftError::Malformed(format!(
                    "an answer of {full} bytes, larger than the {} expected at most",
                    buffer.len()
                )));
            }
            Ok((received, _)) => return Ok(Some(received)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(None),
            Err(errno) => return Err(socket_error("receiving the kernel's answers")(errno)),
        }
    }
}
