//! How a session ends with a NOTIFICATION: the one we send when the hold timer expires, when a
//! message comes out of place, or (a Cease) when we are told to stop, and the router's; each gives the
//! error, or the end, the session returns.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::connection::Connection;
use super::{Counters, Ended, State, Stop};
use crate::Error;
use crate::wire::{Notification, codes};

/// Ends a session we were told to stop: with a Cease, unless it stops for a restart.
pub(super) async fn stopping(
    connection: &mut Connection,
    stop: &Stop,
    counters: &mut Counters,
) -> Result<Ended, Error> {
    if stop.for_restart.load(Ordering::SeqCst) {
        tracing::info!(peer = %connection.peer, "closing the BGP session for a restart (no NOTIFICATION: a router doing graceful restart keeps the routes)");
    } else {
        connection
            .notify(
                Notification::cease(codes::cease::ADMINISTRATIVE_SHUTDOWN),
                counters,
            )
            .await;
    }
    Ok(Ended::Stopped)
}

/// Tells the router its hold timer expired; the error that ends the session.
pub(super) async fn hold_timer_expired(
    connection: &mut Connection,
    counters: &mut Counters,
    hold: Duration,
) -> Error {
    let notification = Notification {
        code: codes::HOLD_TIMER_EXPIRED,
        subcode: 0,
        data: vec![],
    };
    connection.notify(notification, counters).await;
    Error::HoldTimerExpired {
        peer: connection.peer,
        hold,
    }
}

/// Tells the router its `message` does not belong in `state` (a finite state machine error with
/// `subcode`, RFC 6608); the error that ends the session.
pub(super) async fn unexpected(
    connection: &mut Connection,
    counters: &mut Counters,
    subcode: u8,
    message: &'static str,
    state: State,
) -> Error {
    let notification = Notification {
        code: codes::FSM,
        subcode,
        data: vec![],
    };
    connection.notify(notification, counters).await;
    Error::Unexpected {
        peer: connection.peer,
        message,
        state: state.name(),
    }
}

/// Counts the router's NOTIFICATION; the error that ends the session.
pub(super) fn notified(
    peer: SocketAddr,
    notification: Notification,
    counters: &mut Counters,
) -> Error {
    counters.notifications_received += 1;
    Error::Notified { peer, notification }
}
