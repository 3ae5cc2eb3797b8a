//! Sending a batch to nf_tables and reading the kernel's acknowledgements of its messages
//! ([`apply`]).

use rustix::net::{RecvFlags, netlink};

use super::{
    Batch, NftError,
    decode::answers,
    socket::{RECEIVE_BUFFER, grow_buffer, netlink_socket, receive, send_all},
};

/// Room in the socket's receive buffer for the answer to one message (an acknowledgement takes a few
/// hundred bytes of the buffer; an error repeats the message).
const ANSWER_ROOM: usize = 2048;

/// Room beyond the batch (send) or the answers (receive) in a socket's buffer.
const SOCKET_BUFFER_SLACK: usize = 64 * 1024;

/// Whether the answers to `batch` are all in: each message between its begin and end answered, or
/// the begin or end refused (the batch as a whole: then the others may not be answered).
fn complete(batch: &Batch, answers: &[(u32, i32)]) -> bool {
    let last = u32::try_from(batch.len().saturating_sub(1)).unwrap_or(u32::MAX);
    if answers
        .iter()
        .any(|&(seq, errno)| errno != 0 && (seq == 0 || seq == last))
    {
        return true;
    }
    (1..last).all(|seq| answers.iter().any(|&(answered, _)| answered == seq))
}

/// What the answers say of `batch`: the first message refused (in the batch's order), or the first
/// message not answered, or that it applied.
fn outcome(batch: &Batch, answers: &[(u32, i32)]) -> Result<(), NftError> {
    if let Some(&(seq, errno)) = answers
        .iter()
        .filter(|(_, errno)| *errno != 0)
        .min_by_key(|(seq, _)| *seq)
    {
        return Err(NftError::Refused {
            message: batch.name(seq),
            errno,
        });
    }
    let last = u32::try_from(batch.len().saturating_sub(1)).unwrap_or(u32::MAX);
    if let Some(seq) = (1..last).find(|seq| !answers.iter().any(|(answered, _)| answered == seq)) {
        return Err(NftError::Unanswered {
            message: batch.name(seq),
        });
    }
    Ok(())
}

/// Sends `batch` to nf_tables in the calling thread's network namespace and reads the kernel's
/// answer to each of its messages: `Ok` when it applied (the kernel acknowledged every message), the
/// first message it refused otherwise (then nothing of the batch applied). A few system calls, well
/// under a millisecond; it blocks (only a kernel that does not answer makes it wait, up to
/// [`ANSWER_TIMEOUT`]). Needs `CAP_NET_ADMIN`.
///
/// [`ANSWER_TIMEOUT`]: super::socket::ANSWER_TIMEOUT
pub(crate) fn apply(batch: &Batch) -> Result<(), NftError> {
    let socket = netlink_socket(Some(netlink::NETFILTER))?;
    grow_buffer(&socket, true, batch.bytes.len() + SOCKET_BUFFER_SLACK);
    grow_buffer(
        &socket,
        false,
        batch.len() * ANSWER_ROOM + SOCKET_BUFFER_SLACK,
    );
    send_all(&socket, &batch.bytes, "sending the nf_tables batch")?;
    let mut buffer = vec![0; RECEIVE_BUFFER];
    let mut answered = Vec::new();
    // Until every message is answered (the kernel writes the answers while it reads the batch, so
    // they are all there), then whatever else is there without waiting.
    let mut flags = RecvFlags::empty();
    loop {
        if flags.is_empty() && complete(batch, &answered) {
            flags = RecvFlags::DONTWAIT;
        }
        let Some(received) = receive(&socket, &mut buffer, flags)? else {
            break;
        };
        answered.extend(answers(&buffer[..received])?);
    }
    outcome(batch, &answered)
}

#[cfg(test)]
mod tests {
    use super::super::{
        forward_old_flows_batch,
        tests::{OLD, TIMEOUT, VIP4, answer, eth0},
    };
    use super::*;

    #[test]
    fn the_answers_say_which_message_was_refused() {
        let batch = forward_old_flows_batch("ccm_ho_fwd", &eth0(), &[(VIP4, OLD)], TIMEOUT, 65_535)
            .unwrap();
        let all_acked: Vec<(u32, i32)> = (1..9).map(|seq| (seq, 0)).collect();
        assert!(complete(&batch, &all_acked));
        assert!(outcome(&batch, &all_acked).is_ok());

        // Two answers in one datagram: the chain refused (ENOENT, a missing device), then a rule.
        let mut datagram = answer(5, 2);
        datagram.extend(answer(6, 22));
        let mut answered = answers(&datagram).unwrap();
        assert_eq!(answered, [(5, 2), (6, 22)]);
        answered.extend((1..5).chain(7..9).map(|seq| (seq, 0)));
        assert!(complete(&batch, &answered));
        let err = outcome(&batch, &answered).unwrap_err();
        assert!(
            matches!(&err, NftError::Refused { message, errno: 2 } if message.contains("chain ingress (hook ingress on eth0, priority -500)")),
            "{err}"
        );
        assert!(
            err.to_string().contains("No such file or directory"),
            "{err}"
        );

        // The batch as a whole (no CAP_NET_ADMIN: the kernel answers its begin only).
        let answered = answers(&answer(0, 1)).unwrap();
        assert!(complete(&batch, &answered));
        let err = outcome(&batch, &answered).unwrap_err();
        assert!(
            err.to_string().contains("the batch as a whole")
                && err.to_string().contains("CAP_NET_ADMIN is needed"),
            "{err}"
        );

        // A message not answered.
        let some: Vec<(u32, i32)> = (1..8).map(|seq| (seq, 0)).collect();
        assert!(!complete(&batch, &some));
        let err = outcome(&batch, &some).unwrap_err();
        assert!(
            matches!(&err, NftError::Unanswered { message } if message.contains("rule 3")),
            "{err}"
        );
        // Acknowledgements of the begin and end (kernels since 6.10 send them) change nothing.
        let mut with_controls = all_acked.clone();
        with_controls.extend([(0, 0), (9, 0)]);
        assert!(outcome(&batch, &with_controls).is_ok());
    }
}
