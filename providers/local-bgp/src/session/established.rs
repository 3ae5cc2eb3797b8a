//! An established session (RFC 4271 §8.2.2, Established): the whole table and End-of-RIB, then the
//! routes as they change, KEEPALIVEs, the hold timer and BFD, and the router's messages (a
//! ROUTE-REFRESH is answered).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::connection::Connection;
use super::notify::{hold_timer_expired, notified, stopping, unexpected};
use super::{Counters, Ended, PeerStatus, State, Stop};
use crate::Error;
use crate::bfd::BfdStatus;
use crate::plan::{Routes, Session};
use crate::wire::{Family, Message, Notification, Update, codes};

/// Puts the counters in the status when they changed (so that watchers wake only then).
fn publish_counters(status: &watch::Sender<PeerStatus>, counters: &Counters) {
    status.send_if_modified(|s| {
        let changed = s.counters != *counters;
        if changed {
            s.counters = counters.clone();
        }
        changed
    });
}

/// Sends the End-of-RIB marker of `family` (RFC 4724 §2).
async fn send_end_of_rib(
    connection: &mut Connection,
    family: Family,
    counters: &mut Counters,
) -> Result<(), Error> {
    connection
        .send(&Message::Update(Update::end_of_rib(family)))
        .await?;
    counters.updates_sent += 1;
    Ok(())
}

/// An established session: what it carries and how, the routes the router has from us, the hold
/// time in force.
pub(super) struct Established {
    pub(super) session: Session,
    pub(super) sent: Routes,
    pub(super) hold: Duration,
}

impl Established {
    /// Sends the whole table, then End-of-RIB for each family.
    pub(super) async fn announce_whole_table(
        &mut self,
        connection: &mut Connection,
        routes: &mut watch::Receiver<Routes>,
        status: &watch::Sender<PeerStatus>,
        counters: &mut Counters,
    ) -> Result<(), Error> {
        announce(
            &self.session,
            &mut self.sent,
            routes,
            connection,
            status,
            counters,
        )
        .await?;
        for family in &self.session.families {
            send_end_of_rib(connection, *family, counters).await?;
        }
        Ok(())
    }

    /// Keeps the session until it fails or `stop`: announces the routes as they change, sends
    /// KEEPALIVEs, minds the hold timer and BFD, and answers the router's messages.
    pub(super) async fn keep_up(
        &mut self,
        connection: &mut Connection,
        routes: &mut watch::Receiver<Routes>,
        status: &watch::Sender<PeerStatus>,
        stop: &Stop,
        mut bfd: Option<watch::Receiver<BfdStatus>>,
        counters: &mut Counters,
    ) -> Result<Ended, Error> {
        let peer = connection.peer;
        let hold = self.hold;
        let keepalive_every = if hold.is_zero() {
            Duration::MAX
        } else {
            hold / 3
        };
        let mut next_keepalive = Instant::now() + keepalive_every.min(Duration::from_secs(86400));
        let mut routes_open = true;
        let mut deadline = Instant::now() + hold;
        // BFD failures before this session do not end it; one while it runs does (RFC 5882 §3.2).
        let bfd_failures = bfd
            .as_mut()
            .map_or(0, |bfd| bfd.borrow_and_update().failures);
        loop {
            publish_counters(status, counters);
            tokio::select! {
                _ = stop.cancelled() => return stopping(connection, stop, counters).await,
                changed = routes.changed(), if routes_open => {
                    if changed.is_err() {
                        // Nobody will change the routes any more: keep announcing the last ones.
                        routes_open = false;
                        continue;
                    }
                    announce(&self.session, &mut self.sent, routes, connection, status, counters).await?;
                }
                _ = sleep_until(next_keepalive), if !hold.is_zero() => {
                    connection.send(&Message::Keepalive).await?;
                    next_keepalive = Instant::now() + keepalive_every;
                }
                _ = sleep_until(deadline), if !hold.is_zero() => {
                    return Err(hold_timer_expired(connection, counters, hold).await);
                }
                Some(bfd) = bfd_changed(&mut bfd) => {
                    if bfd.failures > bfd_failures {
                        connection.notify(Notification::cease(codes::cease::BFD_DOWN), counters).await;
                        return Err(Error::BfdDown { peer, diagnostic: bfd.diagnostic });
                    }
                }
                message = connection.next(counters) => {
                    deadline = Instant::now() + hold;
                    self.answer(message?, connection, counters).await?;
                }
            }
        }
    }

    /// Takes a message from the router: KEEPALIVEs only count for the hold timer, UPDATEs are
    /// counted and not used, a ROUTE-REFRESH is answered; a NOTIFICATION or an OPEN ends the session.
    async fn answer(
        &self,
        message: Message,
        connection: &mut Connection,
        counters: &mut Counters,
    ) -> Result<(), Error> {
        match message {
            Message::Keepalive => Ok(()),
            Message::Update(_) => {
                counters.updates_received += 1;
                Ok(())
            }
            Message::RouteRefresh(family) => self.refresh(family, connection, counters).await,
            Message::Notification(notification) => {
                Err(notified(connection.peer, notification, counters))
            }
            Message::Open(_) => {
                Err(unexpected(connection, counters, 3, "OPEN", State::Established).await)
            }
        }
    }

    /// Answers a ROUTE-REFRESH (RFC 2918): the routes of `family` the router has from us, again,
    /// then the family's End-of-RIB if the session carries it.
    async fn refresh(
        &self,
        family: Family,
        connection: &mut Connection,
        counters: &mut Counters,
    ) -> Result<(), Error> {
        debug!(peer = %connection.peer, %family, "route refresh");
        counters.route_refreshes += 1;
        let of_family: Routes = self
            .sent
            .iter()
            .filter(|(p, _)| Family::of(p) == family)
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        for update in self.session.plan(&Routes::new(), &of_family) {
            connection.send(&Message::Update(update)).await?;
            counters.updates_sent += 1;
        }
        if self.session.families.contains(&family) {
            send_end_of_rib(connection, family, counters).await?;
        }
        Ok(())
    }
}

/// The BFD session's status when it changes; never, without BFD or once it is gone.
async fn bfd_changed(bfd: &mut Option<watch::Receiver<BfdStatus>>) -> Option<BfdStatus> {
    let Some(receiver) = bfd else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        *bfd = None;
        return None;
    }
    Some(receiver.borrow_and_update().clone())
}

/// Brings the router from `sent` to the routes wanted now, and says so in the status.
async fn announce(
    session: &Session,
    sent: &mut Routes,
    routes: &mut watch::Receiver<Routes>,
    connection: &mut Connection,
    status: &watch::Sender<PeerStatus>,
    counters: &mut Counters,
) -> Result<(), Error> {
    let (wanted, unannounced) = session.announceable(&routes.borrow_and_update());
    for update in session.plan(sent, &wanted) {
        connection.send(&Message::Update(update)).await?;
        counters.updates_sent += 1;
    }
    for refused in &unannounced {
        warn!(peer = %connection.peer, prefix = %refused.prefix, "not announced: {}", refused.reason);
    }
    *sent = wanted;
    status.send_modify(|s| {
        s.announced = sent.len();
        s.unannounced = unannounced;
        s.counters = counters.clone();
    });
    Ok(())
}
