//! The OPEN exchange (RFC 4271 §8.2.2, OpenSent and OpenConfirm): our OPEN, the router's and its
//! checks, what the two settle (hold time, families), and the KEEPALIVE that confirms them.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use super::connection::Connection;
use super::notify::{hold_timer_expired, notified, unexpected};
use super::{Counters, PeerStatus, State, Stop};
use crate::wire::{self, Capability, Family, GracefulRestart, Message, Notification, Open, codes};
use crate::{Error, PeerConfig};

/// How long we wait for the router's OPEN (RFC 4271 §8.2.2 suggests 4 minutes; a router answers at
/// once, and a dead one should not hold the retry back that long).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Our OPEN. `restarted`: this is the first session since the speaker (re)started, which the
/// graceful restart capability says with its R bit.
fn our_open(config: &PeerConfig, restarted: bool) -> Open {
    let mut capabilities = vec![
        Capability::Multiprotocol(Family::IPV4_UNICAST),
        Capability::Multiprotocol(Family::IPV6_UNICAST),
        Capability::RouteRefresh,
        Capability::FourOctetAs(config.local_asn),
    ];
    if let Some(restart_time) = config.graceful_restart {
        // The F bit: the node forwards (serves) its VIPs across the speaker's restart.
        capabilities.push(Capability::GracefulRestart(GracefulRestart {
            restarting: restarted,
            restart_time,
            families: vec![(Family::IPV4_UNICAST, true), (Family::IPV6_UNICAST, true)],
        }));
    }
    Open {
        asn: config.local_asn,
        hold_time: config.hold_time,
        router_id: config.router_id,
        capabilities,
    }
}

/// What the OPEN exchange settled with the router.
pub(super) struct Negotiated {
    /// The router's BGP identifier.
    pub(super) router_id: Ipv4Addr,
    /// The hold time in force: the smaller of ours and the router's.
    pub(super) hold: Duration,
    /// The families both sides announced.
    pub(super) families: Vec<Family>,
}

/// The OPEN exchange (RFC 4271 §8.2.2, OpenSent and OpenConfirm): our OPEN, the router's (checked),
/// then a KEEPALIVE each way. `None`: we were told to stop meanwhile.
pub(super) async fn open_exchange(
    config: &PeerConfig,
    restarted: bool,
    connection: &mut Connection,
    status: &watch::Sender<PeerStatus>,
    stop: &Stop,
    counters: &mut Counters,
) -> Result<Option<Negotiated>, Error> {
    connection
        .send(&Message::Open(our_open(config, restarted)))
        .await?;
    status.send_modify(|s| s.state = State::OpenSent);
    let Some(theirs) = their_open(connection, stop, counters).await? else {
        return Ok(None);
    };
    check_their_open(config, &theirs, connection, counters).await?;
    connection.context.four_octet_as = theirs.has(|c| matches!(c, Capability::FourOctetAs(_)));
    let negotiated = Negotiated {
        router_id: theirs.router_id,
        hold: Duration::from_secs(u64::from(config.hold_time.min(theirs.hold_time))),
        families: common_families(&our_open(config, restarted), &theirs),
    };
    connection.send(&Message::Keepalive).await?;
    status.send_modify(|s| {
        s.state = State::OpenConfirm;
        s.router_id = Some(negotiated.router_id);
        s.hold_time = Some(negotiated.hold);
        s.families = negotiated.families.clone();
    });
    let Some(()) = their_keepalive(connection, stop, counters, negotiated.hold).await? else {
        return Ok(None);
    };
    Ok(Some(negotiated))
}

/// The router's OPEN, within [`OPEN_TIMEOUT`]; `None`: we were told to stop first. Silence, a
/// NOTIFICATION or another message end the session.
async fn their_open(
    connection: &mut Connection,
    stop: &Stop,
    counters: &mut Counters,
) -> Result<Option<Open>, Error> {
    let message = tokio::select! {
        _ = stop.cancelled() => return Ok(None),
        message = timeout(OPEN_TIMEOUT, connection.next(counters)) => message,
    };
    let Ok(message) = message else {
        return Err(hold_timer_expired(connection, counters, OPEN_TIMEOUT).await);
    };
    match message? {
        Message::Open(open) => Ok(Some(open)),
        Message::Notification(notification) => {
            Err(notified(connection.peer, notification, counters))
        }
        other => Err(unexpected(connection, counters, 1, other.kind(), State::OpenSent).await),
    }
}

/// Refuses the router's OPEN (with a NOTIFICATION) when its AS is not the one configured, or, on
/// iBGP, when it has our BGP identifier.
async fn check_their_open(
    config: &PeerConfig,
    theirs: &Open,
    connection: &mut Connection,
    counters: &mut Counters,
) -> Result<(), Error> {
    let peer = connection.peer;
    if theirs.asn != config.peer_asn {
        let data = u16::try_from(theirs.asn)
            .unwrap_or(wire::AS_TRANS)
            .to_be_bytes()
            .to_vec();
        connection
            .notify(
                Notification {
                    code: codes::OPEN,
                    subcode: codes::open::BAD_PEER_AS,
                    data,
                },
                counters,
            )
            .await;
        return Err(Error::BadPeerAs {
            peer,
            announced: theirs.asn,
            configured: config.peer_asn,
        });
    }
    if !config.is_external() && theirs.router_id == config.router_id {
        let notification = Notification {
            code: codes::OPEN,
            subcode: codes::open::BAD_BGP_IDENTIFIER,
            data: theirs.router_id.octets().to_vec(),
        };
        connection.notify(notification, counters).await;
        return Err(Error::SameRouterId {
            peer,
            router_id: theirs.router_id,
        });
    }
    Ok(())
}

/// The families of our OPEN that the router's announces too, in our order.
fn common_families(ours: &Open, theirs: &Open) -> Vec<Family> {
    let theirs = theirs.families();
    ours.families()
        .into_iter()
        .filter(|f| theirs.contains(f))
        .collect()
}

/// The router's KEEPALIVE that confirms the OPENs, within the hold time ([`OPEN_TIMEOUT`] when it
/// is 0); `None`: we were told to stop first. Silence, a NOTIFICATION or another message end the
/// session.
async fn their_keepalive(
    connection: &mut Connection,
    stop: &Stop,
    counters: &mut Counters,
    hold: Duration,
) -> Result<Option<()>, Error> {
    let deadline = Instant::now() + if hold.is_zero() { OPEN_TIMEOUT } else { hold };
    let message = tokio::select! {
        _ = stop.cancelled() => return Ok(None),
        _ = sleep_until(deadline) => {
            return Err(hold_timer_expired(connection, counters, hold).await);
        }
        message = connection.next(counters) => message?,
    };
    match message {
        Message::Keepalive => Ok(Some(())),
        Message::Notification(notification) => {
            Err(notified(connection.peer, notification, counters))
        }
        other => Err(unexpected(connection, counters, 2, other.kind(), State::OpenConfirm).await),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::config;
    use super::*;

    #[test]
    fn the_families_are_those_both_sides_announced_in_our_order() {
        let ours = our_open(&config(), false);
        let mut theirs = our_open(&config(), false);
        theirs.capabilities = vec![
            Capability::Multiprotocol(Family::IPV6_UNICAST),
            Capability::Multiprotocol(Family::IPV4_UNICAST),
        ];
        assert_eq!(
            common_families(&ours, &theirs),
            vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST]
        );
        // No multiprotocol capability: IPv4 unicast only (RFC 4760 §8).
        theirs.capabilities.clear();
        assert_eq!(common_families(&ours, &theirs), vec![Family::IPV4_UNICAST]);
    }
}
