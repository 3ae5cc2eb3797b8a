//! The one error type of the crate.

use std::fmt;
use std::io;

use crate::spec::ListenerSpec;

/// Why [`DataPlane::apply`](crate::DataPlane::apply) did not get everything running.
///
/// Listeners that could be bound are serving even when this is returned: a failure of one listener
/// never stops the others of this or any other load balancer.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Some listeners could not be bound; each is named with its reason. The other listeners of the
    /// spec are serving. Applying the same spec again retries the failed ones.
    #[error("load balancer {load_balancer}: {} listener(s) could not be bound: {}", failures.len(), DisplayFailures(failures))]
    Listeners {
        /// The load balancer's name.
        load_balancer: String,
        /// One entry per listener that is not serving.
        failures: Vec<ListenerFailure>,
    },
    /// The spec cannot be run at all (nothing was changed).
    #[error("load balancer {load_balancer}: invalid spec: {reason}")]
    InvalidSpec {
        /// The load balancer's name.
        load_balancer: String,
        /// What is wrong.
        reason: String,
    },
}

/// One listener that is not serving, and why.
#[derive(Debug)]
pub struct ListenerFailure {
    /// The listener as given in the spec.
    pub listener: ListenerSpec,
    /// The reason, classified.
    pub reason: BindFailure,
    /// The operating system's error.
    pub error: io::Error,
}

impl fmt::Display for ListenerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.listener, self.reason, self.error)
    }
}

/// Why a listener could not be bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindFailure {
    /// Another socket (of this or another process) holds the port.
    PortInUse,
    /// The port is privileged and this process may not bind it.
    PermissionDenied,
    /// The VIP is not an address of this machine.
    AddressNotLocal,
    /// Anything else.
    Other,
}

impl BindFailure {
    pub(crate) fn classify(error: &io::Error) -> Self {
        match error.kind() {
            io::ErrorKind::AddrInUse => BindFailure::PortInUse,
            io::ErrorKind::PermissionDenied => BindFailure::PermissionDenied,
            io::ErrorKind::AddrNotAvailable => BindFailure::AddressNotLocal,
            _ => BindFailure::Other,
        }
    }
}

impl fmt::Display for BindFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BindFailure::PortInUse => "port already in use",
            BindFailure::PermissionDenied => "permission denied (privileged port?)",
            BindFailure::AddressNotLocal => "address is not local to this machine",
            BindFailure::Other => "cannot bind",
        })
    }
}

struct DisplayFailures<'a>(&'a [ListenerFailure]);

impl fmt::Display for DisplayFailures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}
