//! Our speaker against FRR's bgpd, a real router (Debian's `frr`; `hack/routers install`), on
//! loopback: each test's bgpd listens on a port of its own on 127.0.0.1, and our "nodes" connect from
//! 127.0.0.2 and 127.0.0.3. Needs root (bgpd).

mod support;

use std::net::Ipv4Addr;
use std::time::Duration;

use local_bgp::{Path, Peer, PeerConfig, PeerStatus, Routes, State};
use support::{Frr, NODE_ASN, ROUTER_ASN, eventually, net};
use tokio::sync::watch;

/// A "node" at `source` (`127.0.0.x`) peering with `frr`.
fn node(frr: &Frr, source: &str) -> PeerConfig {
    support::node(frr, source.parse().unwrap())
}

fn neighbours(sources: &[&str]) -> String {
    let mut config = String::new();
    for source in sources {
        config += &format!(
            " neighbor {source} remote-as {NODE_ASN}\n neighbor {source} disable-connected-check\n"
        );
    }
    config += " address-family ipv6 unicast\n";
    for source in sources {
        config += &format!("  neighbor {source} activate\n");
    }
    config += " exit-address-family\n";
    config
}

async fn established(peer: &Peer) -> PeerStatus {
    let mut status = peer.status();
    eventually("the session is established", async || {
        let now = status.borrow_and_update().clone();
        if now.state == State::Established {
            Ok(now)
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn frr_routes_each_vip_to_every_node_that_announces_it_and_forgets_what_is_withdrawn() {
    let frr = Frr::start(ROUTER_ASN, &neighbours(&["127.0.0.2", "127.0.0.3"])).await;
    let table = support::two_vips_and_a_tagged_one();
    let (routes, routes_rx) = watch::channel(table.clone());
    let first = Peer::start(node(&frr, "127.0.0.2"), routes_rx.clone()).unwrap();
    let second = Peer::start(node(&frr, "127.0.0.3"), routes_rx).unwrap();
    established(&first).await;
    let status = established(&second).await;
    assert_eq!(status.router_id, Some(Ipv4Addr::new(10, 255, 0, 1)));

    // Each VIP with one path per node, both used (ECMP).
    for (family, prefix, hops) in [
        ("ipv4", "10.96.0.1/32", ["10.0.0.2", "10.0.0.3"]),
        ("ipv4", "10.96.0.2/32", ["10.0.0.2", "10.0.0.3"]),
        ("ipv6", "2001:db8:96::1/128", ["fd00::2", "fd00::3"]),
    ] {
        let expected: Vec<(String, bool)> = hops.iter().map(|h| (h.to_string(), true)).collect();
        eventually(&format!("{prefix} through both nodes"), async || {
            let paths = frr.paths(family, prefix).await;
            if paths == expected {
                Ok(())
            } else {
                Err(format!("{paths:?}"))
            }
        })
        .await;
    }
    let route = frr.route("ipv4", "10.96.0.2/32").await;
    let path = &route["paths"][0];
    assert_eq!(path["community"]["string"], "64513:100", "{route}");
    assert_eq!(path["largeCommunity"]["string"], "64513:1:2", "{route}");
    assert_eq!(path["aspath"]["string"], "64513", "{route}");

    // A VIP gone is withdrawn from the router; nothing else is sent again.
    let updates_before = first.status().borrow().counters.updates_sent;
    let mut fewer = table.clone();
    fewer.remove(&net("10.96.0.1/32"));
    routes.send_replace(fewer.clone());
    eventually("10.96.0.1/32 withdrawn", async || {
        let paths = frr.paths("ipv4", "10.96.0.1/32").await;
        if paths.is_empty() {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
    assert_eq!(
        first.status().borrow().counters.updates_sent,
        updates_before + 1
    );
    routes.send_replace(fewer);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        first.status().borrow().counters.updates_sent,
        updates_before + 1,
        "no change, no UPDATE"
    );

    // A node that stops tells the router, which drops its paths at once.
    first.stop().await.unwrap();
    eventually("only the second node's path is left", async || {
        let paths = frr.paths("ipv4", "10.96.0.2/32").await;
        if paths == [("10.0.0.3".to_string(), true)] {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
    assert!(
        frr.log().contains("Administrative Shutdown") || frr.log().contains("Administratively"),
        "{}",
        frr.log()
    );
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_route_refresh_from_the_router_is_answered_with_the_table() {
    let frr = Frr::start(ROUTER_ASN, &neighbours(&["127.0.0.2"])).await;
    let (_routes, routes_rx) =
        watch::channel(Routes::from([(net("10.96.1.1/32"), Path::default())]));
    let peer = Peer::start(node(&frr, "127.0.0.2"), routes_rx).unwrap();
    established(&peer).await;
    eventually("the route", async || {
        let paths = frr.paths("ipv4", "10.96.1.1/32").await;
        if paths.len() == 1 {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
    frr.vtysh("clear bgp ipv4 unicast 127.0.0.2 soft in")
        .await
        .unwrap();
    let mut status = peer.status();
    eventually("the refresh answered", async || {
        let now = status.borrow_and_update().clone();
        if now.counters.route_refreshes >= 1 {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    assert_eq!(frr.paths("ipv4", "10.96.1.1/32").await.len(), 1);
    assert_eq!(
        peer.status().borrow().state,
        State::Established,
        "the session stays up"
    );
    peer.stop().await.unwrap();
}

#[tokio::test]
async fn a_wrong_asn_on_either_side_is_said_out_loud_and_retried() {
    let frr = Frr::start(ROUTER_ASN, &neighbours(&["127.0.0.2", "127.0.0.3"])).await;
    let (_routes, routes_rx) = watch::channel(Routes::new());
    // We expect the router in another AS than its own: we refuse its OPEN.
    let expects_other = Peer::start(
        PeerConfig {
            peer_asn: 64999,
            ..node(&frr, "127.0.0.2")
        },
        routes_rx.clone(),
    )
    .unwrap();
    // We announce another AS than the router expects of us: it refuses ours.
    let announces_other = Peer::start(
        PeerConfig {
            local_asn: 64998,
            ..node(&frr, "127.0.0.3")
        },
        routes_rx,
    )
    .unwrap();
    for (peer, says) in [
        (
            &expects_other,
            "BGP peer 127.0.0.1:".to_string()
                + &frr.port.to_string()
                + " announces AS 64512, configured as AS 64999",
        ),
        (
            &announces_other,
            "sent a NOTIFICATION: OPEN message error: bad peer AS".to_string(),
        ),
    ] {
        let mut status = peer.status();
        eventually(&says, async || {
            let now = status.borrow_and_update().clone();
            match &now.last_error {
                Some(error) if error.contains(&says) => Ok(()),
                _ => Err(format!("{now:?}")),
            }
        })
        .await;
    }
    assert_ne!(frr.neighbour_state("127.0.0.2").await, "Established");
    expects_other.stop().await.unwrap();
    announces_other.stop().await.unwrap();
}

#[tokio::test]
async fn a_router_that_goes_away_is_reconnected_when_it_is_back() {
    let mut frr = Frr::start(ROUTER_ASN, &neighbours(&["127.0.0.2"])).await;
    let (_routes, routes_rx) =
        watch::channel(Routes::from([(net("10.96.2.1/32"), Path::default())]));
    let peer = Peer::start(
        PeerConfig {
            connect_retry: Duration::from_millis(200),
            max_connect_retry: Duration::from_secs(1),
            ..node(&frr, "127.0.0.2")
        },
        routes_rx,
    )
    .unwrap();
    established(&peer).await;
    frr.kill().await;
    let mut status = peer.status();
    eventually("the session seen down", async || {
        let now = status.borrow_and_update().clone();
        if now.state != State::Established && now.last_error.is_some() {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    frr.restart().await;
    established(&peer).await;
    eventually("the route back in the new bgpd", async || {
        let paths = frr.paths("ipv4", "10.96.2.1/32").await;
        if paths.len() == 1 {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
    assert_eq!(peer.status().borrow().counters.established, 2);
    peer.stop().await.unwrap();
}

#[tokio::test]
async fn with_graceful_restart_the_router_keeps_the_routes_while_the_node_restarts() {
    let frr = Frr::start(ROUTER_ASN, &neighbours(&["127.0.0.2"])).await;
    let (_routes, routes_rx) =
        watch::channel(Routes::from([(net("10.96.3.1/32"), Path::default())]));
    let config = PeerConfig {
        graceful_restart: Some(120),
        ..node(&frr, "127.0.0.2")
    };
    let peer = Peer::start(config.clone(), routes_rx.clone()).unwrap();
    established(&peer).await;
    eventually("the route", async || {
        let paths = frr.paths("ipv4", "10.96.3.1/32").await;
        if paths.len() == 1 {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
    let stale = async || {
        let route = frr.route("ipv4", "10.96.3.1/32").await;
        route["paths"][0]["stale"].as_bool().unwrap_or(false)
    };
    assert!(!stale().await);

    // The speaker goes away without a NOTIFICATION: the router keeps the route, stale.
    peer.stop_for_restart().await.unwrap();
    eventually("the router sees the session down", async || {
        let state = frr.neighbour_state("127.0.0.2").await;
        if state != "Established" {
            Ok(())
        } else {
            Err(state)
        }
    })
    .await;
    for _ in 0..10 {
        assert_eq!(
            frr.paths("ipv4", "10.96.3.1/32").await.len(),
            1,
            "{}",
            frr.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(stale().await, "{}", frr.route("ipv4", "10.96.3.1/32").await);

    // The restarted speaker sends it again, and its End-of-RIB: no longer stale.
    let again = Peer::start(
        PeerConfig {
            restarted: true,
            ..config
        },
        routes_rx,
    )
    .unwrap();
    established(&again).await;
    eventually("the route refreshed", async || {
        if frr.paths("ipv4", "10.96.3.1/32").await.len() == 1 && !stale().await {
            Ok(())
        } else {
            Err(frr.route("ipv4", "10.96.3.1/32").await.to_string())
        }
    })
    .await;
    again.stop().await.unwrap();
    eventually("a stop with a Cease drops it at once", async || {
        let paths = frr.paths("ipv4", "10.96.3.1/32").await;
        if paths.is_empty() {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_tcp_md5_password_is_used_and_a_wrong_one_is_said_out_loud() {
    let mut config = neighbours(&["127.0.0.2", "127.0.0.3"]);
    config += " neighbor 127.0.0.2 password s3cret\n neighbor 127.0.0.3 password s3cret\n";
    let frr = Frr::start(ROUTER_ASN, &config).await;
    let (_routes, routes_rx) =
        watch::channel(Routes::from([(net("10.96.4.1/32"), Path::default())]));
    let signed = Peer::start(
        PeerConfig {
            password: Some(local_bgp::Password(b"s3cret".to_vec())),
            ..node(&frr, "127.0.0.2")
        },
        routes_rx.clone(),
    )
    .unwrap();
    established(&signed).await;
    eventually("the route", async || {
        let paths = frr.paths("ipv4", "10.96.4.1/32").await;
        if paths.len() == 1 {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
    let wrong = Peer::start(
        PeerConfig {
            password: Some(local_bgp::Password(b"guess".to_vec())),
            ..node(&frr, "127.0.0.3")
        },
        routes_rx,
    )
    .unwrap();
    let mut status = wrong.status();
    eventually("the wrong password reported", async || {
        let now = status.borrow_and_update().clone();
        match &now.last_error {
            Some(error) if error.contains("with a TCP MD5 password") => Ok(()),
            _ => Err(format!("{now:?}")),
        }
    })
    .await;
    assert_ne!(frr.neighbour_state("127.0.0.3").await, "Established");
    signed.stop().await.unwrap();
    wrong.stop().await.unwrap();
}

/// A passive "node" at 127.0.0.4 listening on a port of its own, and FRR told to connect to it there
/// (every second until it can), both with `password` if any.
async fn passive_node_and_frr(
    password: Option<&str>,
) -> (Peer, Frr, std::net::SocketAddr, watch::Sender<Routes>) {
    use std::net::{IpAddr, SocketAddr};
    let source = Ipv4Addr::new(127, 0, 0, 4);
    let listen = SocketAddr::new(IpAddr::V4(source), support::free_port());
    let (routes, routes_rx) = watch::channel(support::two_vips_and_a_tagged_one());
    let config = PeerConfig {
        source: Some(IpAddr::V4(source)),
        next_hop_v4: Some(Ipv4Addr::new(10, 0, 0, 4)),
        next_hop_v6: Some("fd00::4".parse().unwrap()),
        password: password.map(|p| local_bgp::Password(p.as_bytes().to_vec())),
        passive: Some(listen),
        ..PeerConfig::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            ROUTER_ASN,
            NODE_ASN,
            source,
        )
    };
    // Listening before FRR's first try.
    let peer = Peer::start(config, routes_rx).unwrap();
    eventually("the peer waits for the router", async || {
        let state = peer.status().borrow().state;
        if state == State::Active {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    let mut router = format!(
        "{} neighbor {source} port {}\n neighbor {source} timers connect 1\n",
        neighbours(&["127.0.0.4"]),
        listen.port()
    );
    if let Some(password) = password {
        router += &format!(" neighbor {source} password {password}\n");
    }
    let frr = Frr::start(ROUTER_ASN, &router).await;
    (peer, frr, listen, routes)
}

async fn vip_through_the_passive_node(frr: &Frr) {
    eventually("10.96.0.1/32 through the passive node", async || {
        let paths = frr.paths("ipv4", "10.96.0.1/32").await;
        if paths == [("10.0.0.4".to_string(), true)] {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;
}

/// A passive peer (RFC 4271 §8.1.1) never connects: FRR connects to it, at the address and port it
/// listens on, and that connection becomes the session, with the routes. A connection from an address
/// that is no passive peer's is closed at once, and so is a second one from the router while its
/// session runs. FRR killed and started again connects again and has the routes back.
#[tokio::test]
async fn a_passive_peer_takes_the_routers_connection() {
    use std::net::SocketAddr;
    use tokio::io::AsyncReadExt;

    let (peer, mut frr, listen, _routes) = passive_node_and_frr(None).await;
    let status = established(&peer).await;
    assert_eq!(status.counters.established, 1);
    vip_through_the_passive_node(&frr).await;

    // Someone else, and the router again while its session runs: each closed without a word, and
    // the session goes on.
    for from in ["127.0.0.9", "127.0.0.1"] {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(from.parse().unwrap(), 0))
            .unwrap();
        let mut stream = socket.connect(listen).await.unwrap();
        let mut buffer = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
            .await
            .unwrap_or_else(|_| panic!("a connection from {from} is closed at once"));
        assert_eq!(read.unwrap_or(0), 0, "a connection from {from} is closed");
    }
    assert_eq!(peer.status().borrow().state, State::Established);

    // FRR gone and back: it connects again.
    frr.kill().await;
    frr.restart().await;
    eventually("the session established again", async || {
        let now = peer.status().borrow().clone();
        if now.state == State::Established && now.counters.established == 2 {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    vip_through_the_passive_node(&frr).await;
    peer.stop().await.unwrap();
}

/// A passive peer with a TCP MD5 password: the key is on the listening socket, so the router's signed
/// connection is accepted and becomes the session (and an unsigned one from the router's address is
/// dropped by the kernel).
#[tokio::test]
async fn a_passive_peer_with_a_tcp_md5_password() {
    let (peer, frr, _listen, _routes) = passive_node_and_frr(Some("s3cret")).await;
    established(&peer).await;
    vip_through_the_passive_node(&frr).await;
    peer.stop().await.unwrap();
}
