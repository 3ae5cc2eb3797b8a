//! Reading netlink: the messages of a datagram, the attributes of a message, and the kernel's
//! answers (its errors and acknowledgements) among the messages.

use super::{NftError, uapi::*};

/// One netlink message of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Message<'a> {
    pub(super) kind: u16,
    pub(super) flags: u16,
    pub(super) seq: u32,
    /// What follows the header.
    pub(super) payload: &'a [u8],
}

pub(super) fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The messages of a datagram.
pub(super) fn messages(datagram: &[u8]) -> Result<Vec<Message<'_>>, NftError> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let malformed = || {
            NftError::Malformed(format!(
                "a message header that does not fit the {} bytes left",
                rest.len()
            ))
        };
        let len = u32_at(rest, 0)
            .and_then(|len| usize::try_from(len).ok())
            .filter(|len| (NLMSG_HDRLEN..=rest.len()).contains(len))
            .ok_or_else(malformed)?;
        let (Some(kind), Some(flags), Some(seq)) =
            (u16_at(rest, 4), u16_at(rest, 6), u32_at(rest, 8))
        else {
            return Err(malformed());
        };
        messages.push(Message {
            kind,
            flags,
            seq,
            payload: &rest[NLMSG_HDRLEN..len],
        });
        rest = rest.get(len.next_multiple_of(NLA_ALIGNTO)..).unwrap_or(&[]);
    }
    Ok(messages)
}

/// The attributes in `bytes`: type (without the flag bits) and payload.
pub(super) fn attributes(mut bytes: &[u8]) -> Result<Vec<(u16, &[u8])>, NftError> {
    let mut attributes = Vec::new();
    while bytes.len() >= NLA_HDRLEN {
        let (Some(len), Some(kind)) = (u16_at(bytes, 0), u16_at(bytes, 2)) else {
            break;
        };
        let len = usize::from(len);
        if len < NLA_HDRLEN || len > bytes.len() {
            return Err(NftError::Malformed(format!(
                "an attribute of {len} bytes where {} are left",
                bytes.len()
            )));
        }
        attributes.push((kind & !NLA_TYPE_FLAGS, &bytes[NLA_HDRLEN..len]));
        bytes = bytes
            .get(len.next_multiple_of(NLA_ALIGNTO)..)
            .unwrap_or(&[]);
    }
    Ok(attributes)
}

/// The kernel's answers in `datagram`: for each `NLMSG_ERROR`, the sequence number it answers and
/// its errno (positive; 0 is an acknowledgement). Other messages are skipped.
pub(super) fn answers(datagram: &[u8]) -> Result<Vec<(u32, i32)>, NftError> {
    let mut answers = Vec::new();
    for message in messages(datagram)? {
        if message.kind != NLMSG_ERROR {
            continue;
        }
        let error = u32_at(message.payload, 0)
            .map(|error| i32::from_ne_bytes(error.to_ne_bytes()))
            .ok_or_else(|| {
                NftError::Malformed(format!(
                    "an error message of {} bytes",
                    message.payload.len()
                ))
            })?;
        answers.push((message.seq, error.saturating_neg()));
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::super::tests::answer;
    use super::*;

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        for datagram in [
            &[1u8, 2, 3][..],
            &[8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &[200, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &answer(1, 0)[..20],
        ] {
            let result = answers(datagram);
            assert!(matches!(result, Err(NftError::Malformed(_))), "{result:?}");
        }
        // An answer that is not an error message is skipped.
        let mut done = answer(1, 0);
        done[4..6].copy_from_slice(&3u16.to_ne_bytes());
        assert_eq!(answers(&done).unwrap(), []);
    }
}
