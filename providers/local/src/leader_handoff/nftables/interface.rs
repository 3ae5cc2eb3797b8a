//! The interface the tables are for, as the kernel has it: its index and MAC address
//! (`RTM_GETLINK`) and its link-local IPv6 address; and a MAC address as text.

use std::{io, net::Ipv6Addr};

use rustix::{io::Errno, net::RecvFlags};

use super::{
    NftError,
    decode::{attributes, messages, u16_at, u32_at},
    encode::{Attrs, check_name},
    error::errno_text,
    socket::{ANSWER_TIMEOUT, RECEIVE_BUFFER, netlink_socket, receive, send_all},
    uapi::*,
};

/// An Ethernet (MAC) address.
pub(crate) type Mac = [u8; ETH_ALEN];

pub(crate) fn mac_text(mac: &Mac) -> String {
    mac.iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// An Ethernet interface of the calling thread's network namespace, as [`link`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    /// Its name.
    pub(crate) name: String,
    /// Its index.
    pub(crate) index: u32,
    /// Its MAC address.
    pub(crate) mac: Mac,
}

/// The link-local IPv6 address `interface` has, if any, as the calling thread's network namespace
/// sees it (`/proc/thread-self/net/if_inet6`: one line per address, its 32 hex digits first, its
/// scope fifth, the interface last).
pub(crate) fn link_local(interface: &str) -> Result<Option<Ipv6Addr>, NftError> {
    const PATH: &str = "/proc/thread-self/net/if_inet6";
    /// `IFA_RT_SCOPE_LINK` as the file shows it.
    const SCOPE_LINK: &str = "20";
    let text = match std::fs::read_to_string(PATH) {
        Ok(text) => text,
        // No IPv6 on this host.
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(NftError::Proc { path: PATH, source }),
    };
    Ok(text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 6 || fields[5] != interface || fields[3] != SCOPE_LINK {
            return None;
        }
        u128::from_str_radix(fields[0], 16).ok().map(Ipv6Addr::from)
    }))
}

/// The `RTM_GETLINK` request for the interface `name`.
fn link_request(name: &str) -> Vec<u8> {
    let mut request = Vec::new();
    request.extend_from_slice(&[0; 4]); // The length, below.
    request.extend_from_slice(&RTM_GETLINK.to_ne_bytes());
    request.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    request.extend_from_slice(&1u32.to_ne_bytes()); // Sequence number.
    request.extend_from_slice(&0u32.to_ne_bytes()); // Port ID: the kernel's.
    request.extend_from_slice(&[0; IFINFOMSG_LEN]); // Any family, index 0: by name.
    let mut too_large = false;
    Attrs {
        out: &mut request,
        too_large: &mut too_large,
    }
    .string(IFLA_IFNAME, name);
    let len = u32::try_from(request.len()).unwrap_or(u32::MAX);
    request[..4].copy_from_slice(&len.to_ne_bytes());
    request
}

/// The link `interface` as the kernel's answer `datagram` describes it; `None` when the datagram
/// holds no answer.
fn parse_link(interface: &str, datagram: &[u8]) -> Result<Option<Link>, NftError> {
    let wrong = |why: String| NftError::Interface {
        interface: interface.to_owned(),
        why,
    };
    for message in messages(datagram)? {
        match message.kind {
            NLMSG_ERROR => {
                let errno = u32_at(message.payload, 0)
                    .map(|error| i32::from_ne_bytes(error.to_ne_bytes()).saturating_neg())
                    .ok_or_else(|| {
                        NftError::Malformed(format!(
                            "an error message of {} bytes",
                            message.payload.len()
                        ))
                    })?;
                if errno == 0 {
                    continue;
                }
                if errno == Errno::NODEV.raw_os_error() {
                    return Err(wrong("no such interface".to_owned()));
                }
                return Err(wrong(format!("looking it up: {}", errno_text(errno))));
            }
            RTM_NEWLINK => {
                let (Some(link_type), Some(index)) =
                    (u16_at(message.payload, 2), u32_at(message.payload, 4))
                else {
                    return Err(NftError::Malformed(format!(
                        "a link message of {} bytes",
                        message.payload.len()
                    )));
                };
                let attributes = attributes(message.payload.get(IFINFOMSG_LEN..).unwrap_or(&[]))?;
                let mac = attributes
                    .iter()
                    .find(|(kind, _)| *kind == IFLA_ADDRESS)
                    .and_then(|(_, address)| Mac::try_from(*address).ok());
                let Some(mac) = mac.filter(|_| link_type == ARPHRD_ETHER) else {
                    return Err(wrong(format!(
                        "not an Ethernet interface (link type {link_type})"
                    )));
                };
                return Ok(Some(Link {
                    name: interface.to_owned(),
                    index,
                    mac,
                }));
            }
            _ => {}
        }
    }
    Ok(None)
}

/// The interface `interface` of the calling thread's network namespace (through `RTM_GETLINK`, so
/// that it is the namespace's own also where `/sys` is another's): its index and MAC address; an
/// error when there is none of that name, or it is not an Ethernet interface.
pub(crate) fn link(interface: &str) -> Result<Link, NftError> {
    check_name("interface", interface, IFNAME_MAX)?;
    let socket = netlink_socket(None)?;
    send_all(
        &socket,
        &link_request(interface),
        "asking for the interface",
    )?;
    let mut buffer = vec![0; RECEIVE_BUFFER];
    loop {
        let Some(received) = receive(&socket, &mut buffer, RecvFlags::empty())? else {
            return Err(NftError::Interface {
                interface: interface.to_owned(),
                why: format!("the kernel did not answer within {ANSWER_TIMEOUT:?}"),
            });
        };
        if let Some(link) = parse_link(interface, &buffer[..received])? {
            return Ok(link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{OURS, answer};
    use super::*;

    /// The kernel's `RTM_NEWLINK` answer for an interface.
    fn newlink(link_type: u16, index: u32, address: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&[0, 0]);
        payload.extend_from_slice(&link_type.to_ne_bytes());
        payload.extend_from_slice(&index.to_ne_bytes());
        payload.extend_from_slice(&[0; 8]);
        let mut too_large = false;
        let mut attrs = Attrs {
            out: &mut payload,
            too_large: &mut too_large,
        };
        attrs.u32(13, 1500); // IFLA_MTU, whatever its byte order.
        attrs.bytes(IFLA_ADDRESS, address);
        attrs.string(IFLA_IFNAME, "eth0");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
        bytes.extend_from_slice(&[0; 10]);
        bytes.extend(payload);
        bytes
    }

    #[test]
    fn a_link_is_read_from_the_kernels_answer() {
        assert_eq!(
            parse_link("eth0", &newlink(ARPHRD_ETHER, 7, &OURS)).unwrap(),
            Some(Link {
                name: "eth0".to_owned(),
                index: 7,
                mac: OURS
            })
        );
        for (answer, expected) in [
            (
                newlink(772, 1, &[0; 6]),
                "not an Ethernet interface (link type 772)",
            ),
            (
                newlink(ARPHRD_ETHER, 1, &[1, 2]),
                "not an Ethernet interface",
            ),
            (answer(1, 19), "eth0: no such interface"),
            (answer(1, 1), "CAP_NET_ADMIN is needed"),
        ] {
            let err = parse_link("eth0", &answer).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
        assert_eq!(parse_link("eth0", &[]).unwrap(), None);
        let request = link_request("eth0");
        let read = messages(&request).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].kind, RTM_GETLINK);
        let attrs = attributes(&read[0].payload[IFINFOMSG_LEN..]).unwrap();
        assert_eq!(attrs, [(IFLA_IFNAME, &b"eth0\0"[..])]);
    }
}
