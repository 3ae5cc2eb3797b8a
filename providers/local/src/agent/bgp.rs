//! Announcing by BGP (pools with `announce: bgp`): every node that may serve a VIP holds it on its
//! loopback interface (so that its data plane can listen on it; nothing is told to the link) and
//! advertises a host route to it, with its own address as next hop, to each peer of
//! `loadBalancer.bgp.peers` that selects the node. The routers spread the VIP's traffic over those
//! nodes (ECMP) and drop a node's routes when its session ends.
//!
//! [`BgpAnnouncer`] is the [`Announcer`] of those VIPs; [`Speaker`] runs one session per selected peer
//! (the `local-bgp` crate) and tells each the routes that go to it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use cloud_provider::{
    async_trait,
    prometheus_client::{
        metrics::{counter::Counter, family::Family, gauge::Gauge},
        registry::Registry,
    },
};
use local_bgp::{
    Bfd, BfdSession, BfdState, BfdStatus, Peer, PeerConfig, PeerStatus, Routes, State,
};
use tokio::sync::watch;

use crate::{
    AddressRange, Announce, BgpPeer, Config, addresses::AddressManager, agent::announcer::Announcer,
};

/// The interface BGP VIPs go on: the node's own, never announced to a link.
const LOOPBACK: &str = "lo";

/// The VIPs of BGP pools this node serves: on the loopback interface, and in the routes the
/// [`Speaker`] advertises.
pub(crate) struct BgpAnnouncer {
    loopback: AddressManager,
    vips: watch::Sender<BTreeSet<IpAddr>>,
    peers: watch::Receiver<Vec<String>>,
}

impl BgpAnnouncer {
    /// An announcer whose VIPs the speaker reads from `vips`, and which names the peers in `peers`.
    pub(crate) fn new(
        peers: watch::Receiver<Vec<String>>,
    ) -> (Self, watch::Receiver<BTreeSet<IpAddr>>) {
        let (vips, receiver) = watch::channel(BTreeSet::new());
        (
            Self {
                loopback: AddressManager::new(LOOPBACK.to_owned()),
                vips,
                peers,
            },
            receiver,
        )
    }
}

#[async_trait]
impl Announcer for BgpAnnouncer {
    fn describe(&self) -> String {
        let peers = self.peers.borrow();
        if peers.is_empty() {
            "BGP, with no peer selecting this node".to_owned()
        } else {
            format!("BGP to {}", peers.join(", "))
        }
    }

    /// Puts `ip` on the loopback interface, for the data plane to listen on; the route waits for
    /// [`Announcer::serving`], so that no router sends a connection here before it can be served.
    async fn announce(&self, ip: IpAddr) -> Result<Option<String>, String> {
        self.loopback.add(ip).await?;
        Ok(None)
    }

    async fn serving(&self, ip: IpAddr) -> Option<String> {
        self.vips.send_if_modified(|vips| vips.insert(ip));
        None
    }

    async fn withdraw(&self, ip: IpAddr) {
        // The route first, so that no router sends the VIP here once the data plane lets it go.
        self.vips.send_if_modified(|vips| vips.remove(&ip));
        self.loopback.remove(ip).await;
    }

    fn withdraw_all_now(&self) {
        self.vips.send_if_modified(|vips| {
            let had = !vips.is_empty();
            vips.clear();
            had
        });
        self.loopback.remove_all_now();
    }

    async fn adopt(&self, ranges: Vec<AddressRange>) -> Result<Vec<IpAddr>, String> {
        self.loopback.adopt(ranges).await
    }
}

/// One session with a peer, and the routes it is told.
struct Session {
    settings: BgpPeer,
    /// The timers of its BFD profile, if it names one.
    bfd: Option<local_bgp::BfdProfile>,
    peer: Peer,
    routes: watch::Sender<Routes>,
    /// The counters last put in the metrics.
    counted: local_bgp::Counters,
    /// What the node's events last said of the session.
    reported: Reported,
}

/// What the node's events last said of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Reported {
    #[default]
    Nothing,
    Established,
    Failed(String),
}

/// The event a change of a session's status calls for: its type, reason and note. An error is
/// reported once, until the session is established or fails otherwise; an established session once
/// after each failure (and at its first establishment).
fn event_for(
    name: &str,
    address: std::net::SocketAddr,
    status: &PeerStatus,
    reported: &mut Reported,
) -> Option<(&'static str, &'static str, String)> {
    let now = if status.state == State::Established {
        Reported::Established
    } else if let Some(error) = &status.last_error {
        Reported::Failed(error.clone())
    } else {
        return None;
    };
    if now == *reported {
        return None;
    }
    *reported = now.clone();
    Some(match now {
        Reported::Established => (
            "Normal",
            EVENT_SESSION_ESTABLISHED,
            format!("BGP session with peer {name} ({address}) established"),
        ),
        Reported::Failed(error) => (
            "Warning",
            EVENT_SESSION_FAILED,
            format!("peer {name}: {error}"),
        ),
        Reported::Nothing => return None,
    })
}

/// The reason of the Warning event on a Node whose BGP session with a peer failed (a NOTIFICATION,
/// a refused connection, a timeout), with what happened in words.
pub const EVENT_SESSION_FAILED: &str = "BGPSessionFailed";
/// The reason of the Normal event on a Node whose BGP session with a peer is established.
pub const EVENT_SESSION_ESTABLISHED: &str = "BGPSessionEstablished";

/// The sessions of this node with the peers that select it.
pub(crate) struct Speaker {
    node_ipv4: Option<Ipv4Addr>,
    /// This agent took over from the one before it on its node: its first sessions say so.
    restarted: bool,
    sessions: BTreeMap<String, Session>,
    /// The node's BFD endpoint, bound when a peer first asks for BFD (at once when sessions were
    /// handed over).
    bfd: Option<Bfd>,
    /// BFD sessions taken over from the agent this one replaced, by router address, until a peer
    /// with the same BFD timers claims each (the first look stops the others).
    resumed: BTreeMap<IpAddr, BfdSession>,
    /// Peers that cannot be started (no router ID…), with what was logged.
    refused: BTreeMap<String, String>,
    /// Names and addresses of the peers with a session, for the announcer's events.
    peers: watch::Sender<Vec<String>>,
    metrics: BgpMetrics,
}

impl Speaker {
    /// A speaker for a node whose IPv4 InternalIP (its default BGP identifier) is `node_ipv4`;
    /// `restarted`: its agent took over from the one before it (the routers doing graceful restart
    /// kept the node's routes for it).
    /// `handed_bfd`: the BFD sessions the agent it replaced ran, taken over at once (the routers'
    /// detection time is short).
    pub(crate) fn new(
        node_ipv4: Option<Ipv4Addr>,
        restarted: bool,
        metrics: BgpMetrics,
        handed_bfd: Vec<local_bgp::BfdResume>,
    ) -> (Self, watch::Receiver<Vec<String>>) {
        let (peers, receiver) = watch::channel(Vec::new());
        let mut speaker = Self {
            node_ipv4,
            restarted,
            sessions: BTreeMap::new(),
            bfd: None,
            resumed: BTreeMap::new(),
            refused: BTreeMap::new(),
            peers,
            metrics,
        };
        for resume in handed_bfd {
            match speaker.bfd().and_then(|bfd| bfd.resume(&resume)) {
                Ok(session) => {
                    tracing::info!(peer = %resume.peer, "BFD: took the session over from the agent this one replaced");
                    speaker.resumed.insert(resume.peer, session);
                }
                Err(err) => {
                    tracing::warn!(peer = %resume.peer, "BFD: cannot take the session over: {err}")
                }
            }
        }
        (speaker, receiver)
    }

    /// The BFD sessions that are Up, for this agent's successor.
    pub(crate) fn bfd_handover(&self) -> Vec<local_bgp::BfdResume> {
        self.sessions
            .values()
            .filter_map(|s| s.peer.bfd_status()?.borrow().resume)
            .collect()
    }

    /// Starts the sessions of the peers that select a node labelled `labels` and stops the others
    /// (a peer whose settings changed starts again).
    pub(crate) async fn select(&mut self, config: &Config, labels: &BTreeMap<String, String>) {
        let bgp = &config.load_balancer.bgp;
        let wanted: BTreeMap<&str, (&BgpPeer, Option<local_bgp::BfdProfile>)> = bgp
            .peers
            .iter()
            .filter(|p| p.selects(labels))
            .map(|p| (p.name.as_str(), (p, bgp.bfd_of(p))))
            .collect();
        // A BFD endpoint whose receiving task ended (it panicked) hears nothing more: a new one is
        // bound for the sessions that start again below.
        if self.bfd.as_ref().is_some_and(Bfd::has_failed) {
            tracing::error!("BFD: the node's endpoint stopped receiving (a bug): binding it again");
            self.bfd = None;
        }
        // A session whose task ended (it panicked) is stopped, which logs the panic, and started
        // again below, like one whose settings changed.
        let gone: Vec<String> = self
            .sessions
            .iter()
            .filter(|(name, session)| {
                wanted.get(name.as_str()) != Some(&(&session.settings, session.bfd))
                    || session.peer.has_failed()
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(session) = self.sessions.remove(&name) {
                tracing::info!(peer = %name, "BGP: this node no longer peers with it (or its settings changed): ending the session");
                self.metrics.forget(&session.peer);
                stop(session.peer).await;
            }
        }
        self.refused
            .retain(|name, _| wanted.contains_key(name.as_str()));
        for (name, (settings, bfd)) in &wanted {
            if self.sessions.contains_key(*name) {
                continue;
            }
            match settings.session(self.node_ipv4, *bfd) {
                Ok(peer_config) => {
                    let restarted = self.restarted;
                    self.start(
                        settings,
                        local_bgp::PeerConfig {
                            restarted,
                            ..peer_config
                        },
                    )
                }
                Err(why) => {
                    if self.refused.get(*name) != Some(&why) {
                        tracing::error!(peer = %name, "BGP: cannot peer: {why}");
                        self.refused.insert((*name).to_owned(), why);
                    }
                }
            }
        }
        // BFD sessions taken over that no peer claimed (its settings changed meanwhile): ended.
        for (_, session) in std::mem::take(&mut self.resumed) {
            session.stop().await;
        }
        // No peer asks for BFD (any more, or the agent this one replaced had it): the node's UDP port
        // 3784 goes back, so that another BFD daemon (FRR's bfdd, say) can take it.
        if self.bfd.is_some() && self.sessions.values().all(|s| s.bfd.is_none()) {
            tracing::info!("BFD: no peer asks for it: releasing the node's UDP port 3784");
            self.bfd = None;
        }
        let names: Vec<String> = self
            .sessions
            .iter()
            .map(|(name, s)| format!("{name} ({})", s.peer.config().socket_address()))
            .collect();
        self.peers.send_if_modified(|peers| {
            let changed = *peers != names;
            *peers = names;
            changed
        });
    }

    /// Tells each session the routes of `vips` that go to it (nothing is sent when nothing changed),
    /// updates the metrics, and reports each session that failed or came up since the last look
    /// (`report(type, reason, note)`: an event on the node).
    pub(crate) fn advertise(
        &mut self,
        config: &Config,
        vips: &BTreeSet<IpAddr>,
        report: impl Fn(&'static str, &'static str, &str),
    ) {
        for (name, session) in &mut self.sessions {
            let routes = routes_for(name, session.settings.peer_address, config, vips);
            session.routes.send_if_modified(|sent| {
                let changed = *sent != routes;
                *sent = routes;
                changed
            });
            let status = session.peer.status().borrow().clone();
            let address = session.peer.config().socket_address();
            if let Some((type_, reason, note)) =
                event_for(name, address, &status, &mut session.reported)
            {
                report(type_, reason, &note);
            }
            self.metrics
                .observe(&session.peer, &status, &mut session.counted);
            if let Some(bfd) = session.peer.bfd_status() {
                self.metrics.observe_bfd(&session.peer, &bfd.borrow());
            }
        }
    }

    /// The node's BFD endpoint, bound at the first call.
    fn bfd(&mut self) -> Result<&Bfd, local_bgp::Error> {
        if self.bfd.is_none() {
            self.bfd = Some(Bfd::bind()?);
        }
        Ok(self.bfd.as_ref().expect("bound above"))
    }

    fn start(&mut self, settings: &BgpPeer, config: PeerConfig) {
        let (routes, receiver) = watch::channel(Routes::new());
        let bfd = config.bfd;
        let resumed = self
            .resumed
            .remove(&config.address)
            .filter(|session| Some(session.profile()) == bfd);
        let started = match (bfd, resumed) {
            (Some(_), Some(session)) => Peer::start_with_bfd_session(config, receiver, session),
            (Some(_), None) => self
                .bfd()
                .and_then(|endpoint| Peer::start_with_bfd(config, receiver, endpoint)),
            (None, _) => Peer::start(config, receiver),
        };
        match started {
            Ok(peer) => {
                tracing::info!(peer = %settings.name, address = %peer.config().socket_address(), "BGP: peering");
                self.sessions.insert(
                    settings.name.clone(),
                    Session {
                        settings: settings.clone(),
                        bfd,
                        peer,
                        routes,
                        counted: Default::default(),
                        reported: Reported::Nothing,
                    },
                );
            }
            Err(err) => {
                let why = err.to_string();
                if self.refused.get(&settings.name) != Some(&why) {
                    tracing::error!(peer = %settings.name, "BGP: cannot peer: {why}");
                    self.refused.insert(settings.name.clone(), why);
                }
            }
        }
    }

    /// Ends every session with a NOTIFICATION (Cease): each router drops this node's routes at once.
    /// `for_restart` (the agent hands over to its successor): without one, so that the routers that
    /// do graceful restart keep this node's routes for the successor.
    pub(crate) async fn stop(self, for_restart: bool) {
        for (_, session) in self.sessions {
            self.metrics.forget(&session.peer);
            let address = session.peer.config().socket_address();
            let stopped = if for_restart {
                session.peer.stop_for_restart().await
            } else {
                session.peer.stop().await
            };
            if let Err(err) = stopped {
                tracing::error!(peer = %address, "BGP: {err}");
            }
        }
    }
}

async fn stop(peer: Peer) {
    let address = peer.config().socket_address();
    if let Err(err) = peer.stop().await {
        tracing::error!(peer = %address, "BGP: {err}");
    }
}

/// The routes peer `name` (at `address`) is told: a host route per VIP of its address's family (a
/// session's own address is the next hop, so an IPv4 session carries IPv4 routes) of a pool that
/// announces by BGP to it.
fn routes_for(name: &str, address: IpAddr, config: &Config, vips: &BTreeSet<IpAddr>) -> Routes {
    vips.iter()
        .filter(|ip| ip.is_ipv4() == address.is_ipv4())
        .filter_map(|ip| {
            let pool = config.pool_of(*ip)?;
            if pool.announce != Announce::Bgp {
                return None;
            }
            let bgp = pool.bgp.clone().unwrap_or_default();
            if !bgp.peers.is_empty() && !bgp.peers.iter().any(|p| p == name) {
                return None;
            }
            // Several VIPs of an aggregated pool make one route.
            Some((bgp.prefix_of(*ip), bgp.path()))
        })
        .collect()
}

/// The BGP metrics, with MetalLB's names and its `peer` label (`address:port`), so that its
/// dashboards and alerts read ours.
#[derive(Debug, Clone, Default)]
pub struct BgpMetrics {
    session_up: Family<Vec<(String, String)>, Gauge>,
    announced: Family<Vec<(String, String)>, Gauge>,
    updates: Family<Vec<(String, String)>, Counter>,
    notifications_sent: Family<Vec<(String, String)>, Gauge>,
    updates_received: Family<Vec<(String, String)>, Gauge>,
    bfd_session_up: Family<Vec<(String, String)>, Gauge>,
    bfd_packets_in: Family<Vec<(String, String)>, Gauge>,
    bfd_packets_out: Family<Vec<(String, String)>, Gauge>,
    bfd_up_events: Family<Vec<(String, String)>, Gauge>,
    bfd_down_events: Family<Vec<(String, String)>, Gauge>,
}

/// Sets the series of `label` to `value` (the largest gauge value when it does not fit).
fn set_gauge(
    family: &Family<Vec<(String, String)>, Gauge>,
    label: &Vec<(String, String)>,
    value: u64,
) {
    family
        .get_or_create(label)
        .set(i64::try_from(value).unwrap_or(i64::MAX));
}

impl BgpMetrics {
    fn label(peer: &Peer) -> Vec<(String, String)> {
        vec![(
            "peer".to_owned(),
            peer.config().socket_address().to_string(),
        )]
    }

    fn observe(&self, peer: &Peer, status: &PeerStatus, counted: &mut local_bgp::Counters) {
        let label = Self::label(peer);
        set_gauge(
            &self.session_up,
            &label,
            u64::from(status.state == State::Established),
        );
        set_gauge(&self.announced, &label, status.announced as u64);
        set_gauge(
            &self.notifications_sent,
            &label,
            status.counters.notifications_sent,
        );
        set_gauge(
            &self.updates_received,
            &label,
            status.counters.updates_received,
        );
        // The peer's counters only grow (its task keeps them across reconnections).
        let sent = status.counters.updates_sent;
        self.updates
            .get_or_create(&label)
            .inc_by(sent.saturating_sub(counted.updates_sent));
        *counted = status.counters.clone();
    }

    /// MetalLB's BFD metrics are labelled with the peer's address alone.
    fn bfd_label(peer: &Peer) -> Vec<(String, String)> {
        vec![("peer".to_owned(), peer.config().address.to_string())]
    }

    fn observe_bfd(&self, peer: &Peer, status: &BfdStatus) {
        let label = Self::bfd_label(peer);
        set_gauge(
            &self.bfd_session_up,
            &label,
            u64::from(status.state == BfdState::Up),
        );
        set_gauge(&self.bfd_packets_in, &label, status.packets_received);
        set_gauge(&self.bfd_packets_out, &label, status.packets_sent);
        set_gauge(&self.bfd_up_events, &label, status.up_events);
        set_gauge(&self.bfd_down_events, &label, status.down_events);
    }

    fn forget(&self, peer: &Peer) {
        let label = Self::label(peer);
        self.session_up.get_or_create(&label).set(0);
        self.announced.get_or_create(&label).set(0);
        if peer.bfd_status().is_some() {
            self.bfd_session_up
                .get_or_create(&Self::bfd_label(peer))
                .set(0);
        }
    }

    /// Registers them under MetalLB's names (`metallb_bgp_updates_total` is the counter
    /// `metallb_bgp_updates`: the exposition adds `_total`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "metallb_bgp_session_up",
            "BGP session state (1 is up, 0 is down)",
            self.session_up.clone(),
        );
        registry.register(
            "metallb_bgp_announced_prefixes_total",
            "Number of prefixes currently being advertised on the BGP session",
            self.announced.clone(),
        );
        registry.register(
            "metallb_bgp_updates",
            "Number of BGP UPDATE messages sent",
            self.updates.clone(),
        );
        registry.register(
            "metallb_bgp_notifications_sent",
            "Number of BGP NOTIFICATION messages sent since the agent started",
            self.notifications_sent.clone(),
        );
        registry.register(
            "metallb_bgp_updates_total_received",
            "Number of BGP UPDATE messages received since the agent started",
            self.updates_received.clone(),
        );
        registry.register(
            "metallb_bfd_session_up",
            "BFD session state (1 is up, 0 is down)",
            self.bfd_session_up.clone(),
        );
        registry.register(
            "metallb_bfd_control_packet_input",
            "Number of received BFD control packets",
            self.bfd_packets_in.clone(),
        );
        registry.register(
            "metallb_bfd_control_packet_output",
            "Number of sent BFD control packets",
            self.bfd_packets_out.clone(),
        );
        registry.register(
            "metallb_bfd_session_up_events",
            "Number of times the BFD session came up",
            self.bfd_up_events.clone(),
        );
        registry.register(
            "metallb_bfd_session_down_events",
            "Number of times the BFD session went down from up",
            self.bfd_down_events.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, None).unwrap()
    }

    #[test]
    fn a_session_s_failures_and_recovery_are_each_reported_once() {
        let address = "10.0.0.1:179".parse().unwrap();
        let mut reported = Reported::default();
        let status = |state: State, error: Option<&str>| PeerStatus {
            state,
            last_error: error.map(str::to_owned),
            ..PeerStatus::default()
        };
        let mut events = Vec::new();
        for status in [
            status(State::Connect, None),
            status(State::Idle, Some("cannot connect: refused")),
            status(State::Connect, Some("cannot connect: refused")),
            status(State::Idle, Some("sent a NOTIFICATION: bad peer AS")),
            status(State::Established, None),
            status(State::Established, None),
            status(State::Idle, Some("closed the connection")),
        ] {
            if let Some((type_, reason, note)) = event_for("tor-a", address, &status, &mut reported)
            {
                events.push(format!("{type_} {reason}: {note}"));
            }
        }
        assert_eq!(
            events,
            [
                "Warning BGPSessionFailed: peer tor-a: cannot connect: refused",
                "Warning BGPSessionFailed: peer tor-a: sent a NOTIFICATION: bad peer AS",
                "Normal BGPSessionEstablished: BGP session with peer tor-a (10.0.0.1:179) established",
                "Warning BGPSessionFailed: peer tor-a: closed the connection",
            ]
        );
    }

    /// Whether UDP port 3784 is free on 0.0.0.0 (a socket without `SO_REUSEPORT` can bind it).
    fn bfd_port_free() -> bool {
        std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, local_bgp::bfd::BFD_PORT))
            .is_ok()
    }

    #[tokio::test]
    async fn a_speaker_gives_the_bfd_port_back_when_no_peer_asks_for_bfd() {
        if !bfd_port_free() {
            eprintln!("skipped: UDP port 3784 is taken on this host");
            return;
        }
        // The peers' router is this host, on a port nobody listens on: the sessions only try.
        let peer = |bfd: &str| {
            config(&format!(
                "loadBalancer:\n  mode: agents\n  bgp:\n    bfdProfiles: [{{name: fast}}]\n    peers:\n      - {{name: a, peerAddress: 127.0.0.1, peerPort: 9, peerASN: 1, myASN: 2{bfd}}}\n"
            ))
        };
        let labels = BTreeMap::new();
        let (mut speaker, _peers) = Speaker::new(
            Some("127.0.0.1".parse().unwrap()),
            false,
            BgpMetrics::default(),
            Vec::new(),
        );
        speaker.select(&peer(", bfdProfile: fast"), &labels).await;
        assert!(!bfd_port_free(), "a peer with BFD binds the port");
        speaker.select(&peer(""), &labels).await;
        // The receiving tasks end at their next poll.
        for _ in 0..100 {
            if bfd_port_free() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the port is still bound with no peer asking for BFD");
    }

    #[test]
    fn each_peer_is_told_the_vips_of_the_pools_that_go_to_it() {
        let config = config(
            "loadBalancer:\n  mode: agents\n  bgp:\n    peers:\n      - {name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}\n      - {name: b, peerAddress: 10.0.0.2, peerASN: 1, myASN: 2}\n      - {name: c, peerAddress: 'fd00::2', peerASN: 1, myASN: 2}\n\
             addressPools:\n  - {name: both, addresses: [10.90.0.0/24], announce: bgp, bgp: {communities: ['1:2']}}\n  - {name: only-b, addresses: [10.91.0.0/24], announce: bgp, bgp: {peers: [b]}}\n  - {name: l2, addresses: [10.92.0.0/24]}\n  - {name: six, addresses: ['fd00:90::/120'], announce: bgp}\n",
        );
        let vips: BTreeSet<IpAddr> = [
            "10.90.0.1",
            "10.91.0.1",
            "10.92.0.1",
            "10.93.0.1",
            "fd00:90::1",
        ]
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let tagged = local_bgp::Path {
            communities: vec![(1 << 16) | 2],
            ..Default::default()
        };
        assert_eq!(
            routes_for("a", a, &config, &vips),
            Routes::from([("10.90.0.1/32".parse().unwrap(), tagged.clone())])
        );
        assert_eq!(
            routes_for("b", b, &config, &vips),
            Routes::from([
                ("10.90.0.1/32".parse().unwrap(), tagged),
                ("10.91.0.1/32".parse().unwrap(), local_bgp::Path::default()),
            ])
        );
    }

    #[test]
    fn an_aggregated_pool_s_vips_make_one_route_per_aggregate() {
        let config = config(
            "loadBalancer:\n  mode: agents\n  bgp:\n    peers:\n      - {name: a, peerAddress: 10.0.0.1, peerASN: 1, myASN: 2}\n      - {name: a6, peerAddress: 'fd00::1', peerASN: 1, myASN: 2}\n\
             addressPools:\n  - {name: agg, addresses: [10.94.0.0/23, 'fd00:94::/64'], announce: bgp, bgp: {aggregationLength: 24, aggregationLengthV6: 120}}\n",
        );
        let vips: BTreeSet<IpAddr> = [
            "10.94.0.1",
            "10.94.0.2",
            "10.94.1.9",
            "fd00:94::1",
            "fd00:94::2",
        ]
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
        let routes = |name: &str, address: &str| -> Vec<String> {
            routes_for(name, address.parse().unwrap(), &config, &vips)
                .keys()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(routes("a", "10.0.0.1"), ["10.94.0.0/24", "10.94.1.0/24"]);
        assert_eq!(routes("a6", "fd00::1"), ["fd00:94::/120"]);
    }
}
