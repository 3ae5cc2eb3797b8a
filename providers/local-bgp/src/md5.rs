//! TCP MD5 signatures (RFC 2385) on a session's socket: the kernel signs every segment to the peer
//! with the key and drops the peer's segments that are not signed with it (Linux `TCP_MD5SIG`).
//!
//! Why `unsafe` here, the only place in the crate: no maintained crate sets `TCP_MD5SIG` (socket2,
//! nix and rustix have no safe setter for it), so the one `setsockopt` call is ours. The option's
//! value is built as bytes in the kernel's layout (`struct tcp_md5sig`, `include/uapi/linux/tcp.h`),
//! with no pointer but the one the call takes.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

/// The longest key the kernel takes (`TCP_MD5SIG_MAXKEYLEN`).
pub const MAX_KEY_LEN: usize = 80;

/// `sizeof(struct tcp_md5sig)`: a `sockaddr_storage` (128), flags, prefix length, key length,
/// interface index (8), the key (80).
const OPTION_LEN: usize = 216;

/// The option's bytes for `peer` and `key` (at most [`MAX_KEY_LEN`] bytes).
fn option(peer: IpAddr, key: &[u8]) -> [u8; OPTION_LEN] {
    let mut value = [0u8; OPTION_LEN];
    // sockaddr_in / sockaddr_in6, port 0: the family in the machine's byte order, the address in
    // the network's.
    match peer {
        IpAddr::V4(v4) => {
            value[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            value[4..8].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            value[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            value[8..24].copy_from_slice(&v6.octets());
        }
    }
    // tcpm_flags 0, tcpm_prefixlen 0 (this address only), tcpm_keylen, tcpm_ifindex 0 (any).
    value[130..132].copy_from_slice(&(key.len() as u16).to_ne_bytes());
    value[136..136 + key.len()].copy_from_slice(key);
    value
}

/// Signs the socket's segments to `peer` with `key`; before `connect` (or on a listening socket: the
/// connections it accepts from `peer` are signed).
pub(crate) fn set(socket: &impl AsFd, peer: IpAddr, key: &[u8]) -> io::Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a TCP MD5 key of {} bytes (1 to {MAX_KEY_LEN})", key.len()),
        ));
    }
    setsockopt(socket, &option(peer, key))
}

/// Takes `peer`'s key off the socket (a listening socket that several peers share): a key of length
/// 0 deletes it.
pub(crate) fn remove(socket: &impl AsFd, peer: IpAddr) -> io::Result<()> {
    setsockopt(socket, &option(peer, &[]))
}

fn setsockopt(socket: &impl AsFd, value: &[u8; OPTION_LEN]) -> io::Result<()> {
    let fd = socket.as_fd().as_raw_fd();
    // SAFETY: `value` is a live, initialized buffer of `OPTION_LEN` bytes for the whole call, which
    // only reads it; `fd` is a socket this process owns (borrowed for the call).
    #[allow(unsafe_code)]
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            value.as_ptr().cast(),
            OPTION_LEN as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_has_the_kernel_s_layout() {
        let value = option("10.1.2.3".parse().unwrap(), b"secret");
        assert_eq!(&value[..2], &(libc::AF_INET as u16).to_ne_bytes());
        assert_eq!(&value[4..8], &[10, 1, 2, 3]);
        assert_eq!(&value[130..132], &6u16.to_ne_bytes());
        assert_eq!(&value[136..142], b"secret");
        let value = option("fd00::1".parse().unwrap(), b"k");
        assert_eq!(&value[..2], &(libc::AF_INET6 as u16).to_ne_bytes());
        assert_eq!(value[23], 1);
    }

    #[test]
    fn the_kernel_takes_it_and_refuses_a_bad_key() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set(&socket, "127.0.0.2".parse().unwrap(), b"secret").unwrap();
        let error = set(&socket, "127.0.0.2".parse().unwrap(), &[b'x'; 81]).unwrap_err();
        assert!(error.to_string().contains("81 bytes"), "{error}");
    }
}
