//! What can go wrong programming nf_tables: [`NftError`], and the text of an errno in it.

use std::io;

use rustix::io::Errno;

/// What can go wrong programming nf_tables.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NftError {
    /// The input cannot make a batch (an empty or too long name, a zero timeout); nothing was sent.
    #[error("cannot build the nf_tables batch: {0}")]
    Invalid(String),
    /// A netlink socket could not be opened, set up, written or read.
    #[error("netlink socket: {what}: {source}")]
    Socket {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A file of `/proc` that says what the kernel has could not be read.
    #[error("reading {path}: {source}")]
    Proc {
        /// The file.
        path: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a message of the batch, and so the whole batch: nothing of it applies.
    #[error("the kernel refused the nf_tables batch at {message}: {}", errno_text(*.errno))]
    Refused {
        /// What the refused message does ("adding chain ingress ... to table netdev ccm_ho_fwd").
        message: String,
        /// The (positive) errno of the kernel's answer.
        errno: i32,
    },
    /// The kernel did not answer a message (within [`ANSWER_TIMEOUT`]): whether the batch applied
    /// is not known.
    ///
    /// [`ANSWER_TIMEOUT`]: super::socket::ANSWER_TIMEOUT
    #[error("the kernel did not answer {message} of the nf_tables batch")]
    Unanswered {
        /// What the unanswered message does.
        message: String,
    },
    /// The kernel's answer is not netlink as it writes it.
    #[error("a malformed netlink answer: {0}")]
    Malformed(String),
    /// An interface could not be looked up, or is not an Ethernet interface.
    #[error("interface {interface}: {why}")]
    Interface {
        /// Its name.
        interface: String,
        /// What is wrong.
        why: String,
    },
}

/// The text of a (positive) errno, with what is needed when it is a missing privilege.
pub(super) fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    if errno == Errno::PERM.raw_os_error() || errno == Errno::ACCESS.raw_os_error() {
        format!("{text} (CAP_NET_ADMIN is needed)")
    } else {
        text
    }
}
