//! The data plane on loopback: echo servers on distinct 127.x addresses stand in for nodes.

mod support;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use local_data_plane::{ApplyError, BindFailure, DataPlane, Protocol, Settings};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_bytes_flow_through_the_vip_both_ways() {
    let t = 10;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");

    let mut stream = TcpStream::connect((vip(t), 8080))
        .await
        .expect("connect to the VIP");
    assert_eq!(read_id(&mut stream).await, "n1");
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut read, mut write) = stream.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        write.write_all(&sent).await.expect("write");
        write.shutdown().await.expect("half-close");
    });
    let mut back = Vec::new();
    within(5 * SECOND, "echo of 1 MB", read.read_to_end(&mut back))
        .await
        .expect("read");
    writer.await.expect("writer");
    assert_eq!(back, data, "the echo through the VIP is the data sent");

    let state = plane.state("lb").expect("state");
    assert_eq!(state.listeners.len(), 1);
    assert_eq!(state.listeners[0].local_addr, SocketAddr::new(vip(t), 8080));
    assert!(state.failed_listeners.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_datagrams_flow_both_ways_and_replies_come_from_the_vip() {
    let t = 11;
    udp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    plane
        .apply(spec(
            "lb",
            vec![udp_listener(vip(t), 5353)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");

    let client = UdpSocket::bind((client_ip(t, 1), 0))
        .await
        .expect("bind client");
    let mut buf = [0u8; 2048];
    for i in 0..5 {
        let msg = format!("hello {i}");
        client
            .send_to(msg.as_bytes(), (vip(t), 5353))
            .await
            .expect("send");
        let (len, from) = within(2 * SECOND, "udp reply", client.recv_from(&mut buf))
            .await
            .expect("recv");
        assert_eq!(
            from,
            SocketAddr::new(vip(t), 5353),
            "reply comes from the VIP"
        );
        assert_eq!(&buf[..len], format!("n1:{msg}").as_bytes());
    }
    let state = plane.state("lb").expect("state");
    assert_eq!(
        state.listeners[0].active_connections, 1,
        "one flow for one client address"
    );

    // The flow is forgotten after the idle timeout (500 ms here).
    assert!(
        eventually(3 * SECOND, || plane
            .state("lb")
            .is_some_and(|s| s.listeners[0].active_connections == 0))
        .await,
        "idle UDP flow is closed"
    );
    // And a new datagram opens a new one.
    client
        .send_to(b"again", (vip(t), 5353))
        .await
        .expect("send");
    let (len, _) = within(2 * SECOND, "udp reply", client.recv_from(&mut buf))
        .await
        .expect("recv");
    assert_eq!(&buf[..len], b"n1:again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_sticks_one_client_to_one_backend_and_spreads_clients() {
    let t = 12;
    for n in 1..=3 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
    }
    let plane = DataPlane::new(fast_settings());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        (1..=3)
            .map(|n| backend(&format!("n{n}"), node_ip(t, n)))
            .collect(),
    );
    lb.session_affinity = Some(Duration::from_secs(600));
    plane.apply(lb).await.expect("apply");
    let to = SocketAddr::new(vip(t), 8080);

    // Many connections from one client land on one backend.
    let mut seen = HashSet::new();
    for _ in 0..20 {
        seen.insert(which_backend(client_ip(t, 1), to).await);
    }
    assert_eq!(
        seen.len(),
        1,
        "one client IP sticks to one backend, saw {seen:?}"
    );

    // Different client IPs spread over the backends, and each sticks.
    let mut per_client = HashMap::new();
    for c in 2..=10 {
        let first = which_backend(client_ip(t, c), to).await;
        for _ in 0..3 {
            assert_eq!(
                which_backend(client_ip(t, c), to).await,
                first,
                "client {c} sticks"
            );
        }
        per_client.insert(c, first);
    }
    let backends: HashSet<_> = per_client.values().collect();
    assert_eq!(
        backends.len(),
        3,
        "nine clients spread over all three backends: {per_client:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_affinity_connections_are_spread_round_robin() {
    let t = 13;
    for n in 1..=3 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
    }
    let plane = DataPlane::new(fast_settings());
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            (1..=3)
                .map(|n| backend(&format!("n{n}"), node_ip(t, n)))
                .collect(),
        ))
        .await
        .expect("apply");
    let mut counts: HashMap<String, u32> = HashMap::new();
    for _ in 0..30 {
        *counts
            .entry(which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await)
            .or_default() += 1;
    }
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(
        counts.values().all(|c| *c == 10),
        "round robin gives each backend a third: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_outside_the_source_ranges_are_refused_for_tcp_and_dropped_for_udp() {
    let t = 14;
    tcp_echo(node_ip(t, 1), "n1").await;
    udp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080), udp_listener(vip(t), 8080)],
        vec![backend("n1", node_ip(t, 1))],
    );
    lb.source_ranges = vec![format!("127.{t}.2.0/30").parse().expect("cidr")]; // clients .0-.3
    plane.apply(lb).await.expect("apply");
    let to = SocketAddr::new(vip(t), 8080);

    assert_eq!(
        which_backend(client_ip(t, 1), to).await,
        "n1",
        "a source inside the range gets through"
    );
    for _ in 0..3 {
        // The reset can come before connect() returns: both mean refused.
        if let Ok(mut outside) = connect_from(client_ip(t, 9), to).await {
            assert!(
                closed_promptly(&mut outside, 2 * SECOND).await,
                "a source outside the range is closed at accept, without reaching a backend"
            );
        }
    }

    let inside = UdpSocket::bind((client_ip(t, 2), 0)).await.expect("bind");
    let outside = UdpSocket::bind((client_ip(t, 9), 0)).await.expect("bind");
    let mut buf = [0u8; 64];
    outside.send_to(b"x", to).await.expect("send");
    inside.send_to(b"y", to).await.expect("send");
    let (len, _) = within(
        2 * SECOND,
        "reply to the inside client",
        inside.recv_from(&mut buf),
    )
    .await
    .expect("recv");
    assert_eq!(&buf[..len], b"n1:y");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), outside.recv_from(&mut buf))
            .await
            .is_err(),
        "the outside client's datagram is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failing_its_health_check_gets_no_new_connections_and_comes_back_when_healthy() {
    let t = 15;
    let mut switches = Vec::new();
    for n in 1..=3 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
        switches.push(health_server(node_ip(t, n), true).await);
    }
    let settings = fast_settings();
    let plane = DataPlane::new(settings.clone());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        (1..=3)
            .map(|n| backend(&format!("n{n}"), node_ip(t, n)))
            .collect(),
    );
    lb.health_check = healthz();
    plane.apply(lb).await.expect("apply");
    let to = SocketAddr::new(vip(t), 8080);
    let mut seen = HashSet::new();
    for _ in 0..6 {
        seen.insert(which_backend(client_ip(t, 1), to).await);
    }
    assert_eq!(seen.len(), 3, "all healthy: all get traffic");

    // n2 starts failing: out within interval × unhealthy threshold (+ one check's time).
    switches[1].store(false, Ordering::SeqCst);
    let timing = &settings.health_check;
    let bound = timing.interval * (timing.unhealthy_threshold + 1) + timing.timeout;
    assert!(
        eventually(bound, || backend_healthy(&plane, "lb", node_ip(t, 2))
            == Some(false))
        .await,
        "n2 is marked unhealthy within {bound:?}"
    );
    for _ in 0..12 {
        assert_ne!(
            which_backend(client_ip(t, 1), to).await,
            "n2",
            "an unhealthy backend gets no new connection"
        );
    }

    // n2 recovers: back after healthy_threshold good checks.
    switches[1].store(true, Ordering::SeqCst);
    let bound = timing.interval * (timing.healthy_threshold + 1) + timing.timeout;
    assert!(
        eventually(bound, || backend_healthy(&plane, "lb", node_ip(t, 2))
            == Some(true))
        .await,
        "n2 is healthy again within {bound:?}"
    );
    let mut seen = HashSet::new();
    for _ in 0..6 {
        seen.insert(which_backend(client_ip(t, 1), to).await);
    }
    assert!(
        seen.contains("n2"),
        "the recovered backend gets connections again: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_backends_answering_200_get_traffic_from_the_first_connection_on() {
    let t = 16;
    for n in 1..=4 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
        health_server(node_ip(t, n), n % 2 == 1).await; // n1, n3 healthy; n2, n4 answer 503
    }
    let plane = DataPlane::new(fast_settings());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        (1..=4)
            .map(|n| backend(&format!("n{n}"), node_ip(t, n)))
            .collect(),
    );
    lb.health_check = healthz();
    plane.apply(lb).await.expect("apply");
    let mut seen = HashSet::new();
    for _ in 0..20 {
        seen.insert(which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await);
    }
    assert_eq!(seen, HashSet::from(["n1".to_string(), "n3".to_string()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_healthy_backend_connections_are_closed_promptly_not_left_hanging() {
    let t = 17;
    for n in 1..=2 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
        health_server(node_ip(t, n), false).await;
    }
    // A third backend has no health server at all (connection refused).
    tcp_echo(node_ip(t, 3), "n3").await;
    let plane = DataPlane::new(fast_settings());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        (1..=3)
            .map(|n| backend(&format!("n{n}"), node_ip(t, n)))
            .collect(),
    );
    lb.health_check = healthz();
    plane.apply(lb).await.expect("apply");
    for _ in 0..5 {
        match connect_from(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await {
            Err(_) => {} // refused: fine too
            Ok(mut stream) => assert!(
                closed_promptly(&mut stream, SECOND).await,
                "with no healthy backend the connection is closed at once"
            ),
        }
    }
    let state = plane.state("lb").expect("state");
    assert!(state.listeners[0].backends.iter().all(|b| !b.healthy));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_established_connection_survives_a_change_of_the_backend_set() {
    let t = 18;
    for n in 1..=2 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
    }
    let plane = DataPlane::new(fast_settings());
    let to = SocketAddr::new(vip(t), 8080);
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut stream = TcpStream::connect(to).await.expect("connect");
    assert_eq!(read_id(&mut stream).await, "n1");
    assert_eq!(round_trip(&mut stream, b"before").await, b"before");

    // n1 leaves the backend set; n2 comes in.
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n2", node_ip(t, 2))],
        ))
        .await
        .expect("apply with other backends");
    assert_eq!(
        which_backend(client_ip(t, 1), to).await,
        "n2",
        "new connections go to the new set"
    );
    // Well past the drain time: the established connection is still relayed to n1.
    tokio::time::sleep(fast_settings().drain_timeout * 2).await;
    assert_eq!(round_trip(&mut stream, b"after").await, b"after");
    let state = plane.state("lb").expect("state");
    assert_eq!(state.listeners[0].active_connections, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_an_unchanged_spec_changes_nothing() {
    let t = 19;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    let lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        vec![backend("n1", node_ip(t, 1))],
    );
    plane.apply(lb.clone()).await.expect("apply");
    let mut stream = TcpStream::connect((vip(t), 8080)).await.expect("connect");
    assert_eq!(read_id(&mut stream).await, "n1");
    let before = plane.state("lb");
    for _ in 0..3 {
        plane.apply(lb.clone()).await.expect("apply again");
    }
    assert_eq!(plane.state("lb"), before);
    assert_eq!(round_trip(&mut stream, b"still here").await, b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_closes_the_port_at_once_and_drains_established_connections() {
    let t = 20;
    tcp_echo(node_ip(t, 1), "n1").await;
    let settings = Settings {
        drain_timeout: Duration::from_millis(800),
        ..fast_settings()
    };
    let plane = DataPlane::new(settings);
    let to = SocketAddr::new(vip(t), 8080);
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut established = TcpStream::connect(to).await.expect("connect");
    assert_eq!(read_id(&mut established).await, "n1");

    let removing = tokio::spawn({
        let plane = plane.clone();
        async move {
            let started = tokio::time::Instant::now();
            plane.remove("lb").await;
            started.elapsed()
        }
    });
    assert!(
        eventually(SECOND / 2, || plane.state("lb").is_none()).await,
        "the load balancer is gone from the state"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(to).await.is_err(),
        "new connections are refused while draining"
    );
    assert_eq!(
        round_trip(&mut established, b"draining").await,
        b"draining",
        "an established connection goes on during the drain"
    );
    let took = within(3 * SECOND, "remove", removing)
        .await
        .expect("remove task");
    assert!(
        closed_promptly(&mut established, SECOND).await,
        "after the drain time the established connection is cut"
    );
    assert!(
        took < Duration::from_secs(2),
        "remove returns after the drain time, took {took:?}"
    );
    assert!(
        TcpStream::connect(to).await.is_err(),
        "the port stays closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_returns_as_soon_as_connections_finish() {
    let t = 21;
    tcp_echo(node_ip(t, 1), "n1").await;
    let settings = Settings {
        drain_timeout: Duration::from_secs(30),
        ..fast_settings()
    };
    let plane = DataPlane::new(settings);
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut stream = TcpStream::connect((vip(t), 8080)).await.expect("connect");
    assert_eq!(read_id(&mut stream).await, "n1");
    let removing = tokio::spawn({
        let plane = plane.clone();
        async move { plane.remove("lb").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);
    within(
        5 * SECOND,
        "remove after the last connection closed",
        removing,
    )
    .await
    .expect("remove task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_cannot_be_bound_is_an_apply_error_naming_it_while_the_other_listener_serves() {
    let t = 22;
    tcp_echo(node_ip(t, 1), "n1").await;
    let _taken = TcpListener::bind((vip(t), 8081))
        .await
        .expect("take the port");
    let plane = DataPlane::new(fast_settings());
    let not_local: IpAddr = "192.0.2.1".parse().expect("ip");
    let lb = spec(
        "lb",
        vec![
            tcp_listener(vip(t), 8080),
            tcp_listener(vip(t), 8081),
            tcp_listener(not_local, 8080),
        ],
        vec![backend("n1", node_ip(t, 1))],
    );
    let error = plane
        .apply(lb.clone())
        .await
        .expect_err("two listeners cannot be bound");
    let message = error.to_string();
    let ApplyError::Listeners {
        load_balancer,
        failures,
    } = error
    else {
        panic!("expected a listener error, got {message}");
    };
    assert_eq!(load_balancer, "lb");
    let failed: HashMap<_, _> = failures
        .iter()
        .map(|f| (f.listener.socket_addr(), f.reason))
        .collect();
    assert_eq!(
        failed,
        HashMap::from([
            (SocketAddr::new(vip(t), 8081), BindFailure::PortInUse),
            (
                SocketAddr::new(not_local, 8080),
                BindFailure::AddressNotLocal
            ),
        ])
    );
    assert!(
        message.contains(&format!("127.{t}.0.1:8081/TCP")),
        "{message}"
    );
    assert!(message.contains("192.0.2.1:8080/TCP"), "{message}");

    // The listener that could be bound serves.
    assert_eq!(
        which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await,
        "n1"
    );
    let state = plane.state("lb").expect("state");
    assert_eq!(state.listeners.len(), 1);
    assert_eq!(state.failed_listeners.len(), 2);

    // Once the port is free, the same spec binds it.
    drop(_taken);
    let lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080), tcp_listener(vip(t), 8081)],
        vec![backend("n1", node_ip(t, 1))],
    );
    plane.apply(lb).await.expect("the freed port binds");
    assert_eq!(
        which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8081)).await,
        "n1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_listener_of_one_load_balancer_leaves_other_load_balancers_serving() {
    let t = 23;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    plane
        .apply(spec(
            "a",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply a");
    // b asks for a's port.
    let error = plane
        .apply(spec(
            "b",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect_err("b cannot have a's port");
    assert!(
        matches!(error, ApplyError::Listeners { ref failures, .. } if failures[0].reason == BindFailure::PortInUse)
    );
    assert_eq!(
        which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await,
        "n1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_leaves_the_spec_closes_while_the_others_stay() {
    let t = 24;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    let backends = vec![backend("n1", node_ip(t, 1))];
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080), tcp_listener(vip(t), 8081)],
            backends.clone(),
        ))
        .await
        .expect("apply");
    plane
        .apply(spec("lb", vec![tcp_listener(vip(t), 8080)], backends))
        .await
        .expect("apply without 8081");
    assert!(
        within(2 * SECOND, "port close", async {
            loop {
                if TcpStream::connect((vip(t), 8081)).await.is_err() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    );
    assert_eq!(
        which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await,
        "n1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_v2_header_names_the_client_and_the_vip() {
    let t = 25;
    let backend_listener = TcpListener::bind((node_ip(t, 1), NODE_PORT))
        .await
        .expect("bind backend");
    let plane = DataPlane::new(fast_settings());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        vec![backend("n1", node_ip(t, 1))],
    );
    lb.proxy_protocol = true;
    plane.apply(lb).await.expect("apply");

    let mut client = connect_from(client_ip(t, 7), SocketAddr::new(vip(t), 8080))
        .await
        .expect("connect");
    let client_addr = client.local_addr().expect("client addr");
    client.write_all(b"payload").await.expect("write");
    let (mut upstream, _) = within(2 * SECOND, "backend accept", backend_listener.accept())
        .await
        .expect("accept");
    let mut header = [0u8; 28];
    within(2 * SECOND, "header", upstream.read_exact(&mut header))
        .await
        .expect("read header");

    assert_eq!(
        &header[..12],
        b"\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A",
        "signature"
    );
    assert_eq!(header[12], 0x21, "version 2, command PROXY");
    assert_eq!(header[13], 0x11, "TCP over IPv4");
    assert_eq!(
        u16::from_be_bytes([header[14], header[15]]),
        12,
        "address block length"
    );
    assert_eq!(
        &header[16..20],
        &[127, t, 2, 7],
        "source address: the client"
    );
    assert_eq!(
        &header[20..24],
        &[127, t, 0, 1],
        "destination address: the VIP"
    );
    assert_eq!(
        u16::from_be_bytes([header[24], header[25]]),
        client_addr.port(),
        "source port"
    );
    assert_eq!(
        u16::from_be_bytes([header[26], header[27]]),
        8080,
        "destination port"
    );
    let mut payload = [0u8; 7];
    within(2 * SECOND, "payload", upstream.read_exact(&mut payload))
        .await
        .expect("payload");
    assert_eq!(&payload, b"payload", "the client's bytes follow the header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_listeners_use_ipv6_backends_and_ipv4_ones_when_no_node_has_ipv6() {
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let t = 26;
    // Node ports unique to this test (there is only one IPv6 loopback address).
    let node_port = 31_626;
    let listener = TcpListener::bind((v6, node_port))
        .await
        .expect("bind v6 backend");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.write_all(b"v6      ").await;
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let udp = UdpSocket::bind((v6, node_port)).await.expect("bind v6 udp");
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((len, peer)) = udp.recv_from(&mut buf).await {
            let _ = udp.send_to(&buf[..len], peer).await;
        }
    });
    let plane = DataPlane::new(fast_settings());
    let mut tcp = tcp_listener(v6, 31_627);
    tcp.node_port = node_port;
    let mut udp_l = udp_listener(v6, 31_627);
    udp_l.node_port = node_port;
    let mut lb = spec(
        "lb6",
        vec![tcp, udp_l],
        // An IPv4 backend too: IPv6 listeners must not use it.
        vec![backend("v4", node_ip(t, 1)), backend("v6", v6)],
    );
    lb.proxy_protocol = false;
    plane.apply(lb).await.expect("apply");
    let state = plane.state("lb6").expect("state");
    for listener in &state.listeners {
        assert_eq!(listener.backends.len(), 1);
        assert_eq!(listener.backends[0].address, SocketAddr::new(v6, node_port));
    }

    let mut stream = TcpStream::connect((v6, 31_627))
        .await
        .expect("connect over IPv6");
    assert_eq!(read_id(&mut stream).await, "v6");
    assert_eq!(round_trip(&mut stream, b"over ipv6").await, b"over ipv6");
    let client = UdpSocket::bind((v6, 0)).await.expect("bind");
    client.send_to(b"dgram6", (v6, 31_627)).await.expect("send");
    let mut buf = [0u8; 64];
    let (len, from) = within(2 * SECOND, "udp6", client.recv_from(&mut buf))
        .await
        .expect("recv");
    assert_eq!(&buf[..len], b"dgram6");
    assert_eq!(from, SocketAddr::new(v6, 31_627));

    // Nodes with IPv4 addresses only (a dual-stack Service on IPv4 nodes): the IPv6 listener forwards
    // to their IPv4 node ports.
    let v4_node = node_ip(t, 2);
    let v4_port = tcp_echo_on(v4_node, 31_628, "v4").await.port();
    let mut tcp = tcp_listener(v6, 31_627);
    tcp.node_port = v4_port;
    let mut lb = spec("lb6", vec![tcp], vec![backend("v4", v4_node)]);
    lb.proxy_protocol = false;
    plane.apply(lb).await.expect("apply");
    let state = plane.state("lb6").expect("state");
    assert_eq!(
        state.listeners[0].backends[0].address,
        SocketAddr::new(v4_node, v4_port)
    );
    let mut stream = TcpStream::connect((v6, 31_627))
        .await
        .expect("connect over IPv6");
    assert_eq!(read_id(&mut stream).await, "v4");
    assert_eq!(round_trip(&mut stream, b"6 to 4").await, b"6 to 4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_encode_with_the_expected_names_and_labels() {
    let t = 27;
    tcp_echo(node_ip(t, 1), "n1").await;
    health_server(node_ip(t, 1), true).await;
    let plane = DataPlane::new(fast_settings());
    let mut registry = prometheus_client::registry::Registry::default();
    plane.register_metrics(&mut registry);
    let mut lb = spec(
        "web",
        vec![tcp_listener(vip(t), 8080)],
        vec![backend("n1", node_ip(t, 1))],
    );
    lb.health_check = healthz();
    plane.apply(lb).await.expect("apply");
    let mut stream = TcpStream::connect((vip(t), 8080)).await.expect("connect");
    assert_eq!(read_id(&mut stream).await, "n1");
    assert_eq!(round_trip(&mut stream, b"12345").await, b"12345");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let listener = format!("listener=\"127.{t}.0.1:8080/TCP\"");
    let lb_labels = format!("{{load_balancer=\"web\",{listener}}}");
    for expected in [
        format!("local_lb_connections_total{lb_labels} 1"),
        format!("local_lb_active_connections{lb_labels} 1"),
        format!("local_lb_bytes_in_total{lb_labels} 5"),
        format!("local_lb_bytes_out_total{lb_labels} 13"), // the 8-byte id + the echo
        format!("local_lb_backend_connect_errors_total{lb_labels} 0"),
        format!(
            "local_lb_refused_connections_total{{load_balancer=\"web\",{listener},reason=\"source_range\"}} 0"
        ),
        format!(
            "local_lb_backend_healthy{{load_balancer=\"web\",{listener},backend=\"127.{t}.1.1:{NODE_PORT}\",node=\"n1\"}} 1"
        ),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    assert!(
        text.contains("# TYPE local_lb_connections counter"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE local_lb_backend_healthy gauge"),
        "{text}"
    );
    // Nothing panicked: both kinds of restarted task are listed, at zero.
    for kind in ["accept_loop", "health_checks"] {
        let expected = format!("local_lb_task_restarts_total{{task=\"{kind}\"}} 0");
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }

    drop(stream);
    plane.remove("web").await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        !text.contains("load_balancer=\"web\""),
        "a removed load balancer's series are gone:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_of_the_same_target_are_shared_across_load_balancers() {
    let t = 28;
    tcp_echo(node_ip(t, 1), "n1").await;
    let switch = health_server(node_ip(t, 1), true).await;
    let plane = DataPlane::new(fast_settings());
    for (name, port) in [("a", 8080), ("b", 8081)] {
        let mut lb = spec(
            name,
            vec![tcp_listener(vip(t), port)],
            vec![backend("n1", node_ip(t, 1))],
        );
        lb.health_check = healthz();
        plane.apply(lb).await.expect("apply");
    }
    switch.store(false, Ordering::SeqCst);
    assert!(
        eventually(2 * SECOND, || {
            backend_healthy(&plane, "a", node_ip(t, 1)) == Some(false)
                && backend_healthy(&plane, "b", node_ip(t, 1)) == Some(false)
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_every_load_balancer() {
    let t = 29;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    for (name, port) in [("a", 8080), ("b", 8081)] {
        plane
            .apply(spec(
                name,
                vec![tcp_listener(vip(t), port)],
                vec![backend("n1", node_ip(t, 1))],
            ))
            .await
            .expect("apply");
    }
    within(3 * SECOND, "shutdown", plane.shutdown()).await;
    assert!(plane.names().is_empty());
    for port in [8080, 8081] {
        assert!(
            TcpStream::connect((vip(t), port)).await.is_err(),
            "port {port} closed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_are_refused_without_changing_anything() {
    let plane = DataPlane::new(fast_settings());
    let t = 30;
    let twice = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080), tcp_listener(vip(t), 8080)],
        vec![],
    );
    assert!(matches!(
        plane.apply(twice).await,
        Err(ApplyError::InvalidSpec { .. })
    ));
    let mut bad_path = spec("lb", vec![tcp_listener(vip(t), 8080)], vec![]);
    bad_path.health_check = Some(local_data_plane::HealthCheck {
        port: 1,
        path: "/x\r\nHost: evil".into(),
    });
    assert!(matches!(
        plane.apply(bad_path).await,
        Err(ApplyError::InvalidSpec { .. })
    ));
    assert!(
        plane.state("lb").is_none() || plane.state("lb").is_some_and(|s| s.listeners.is_empty())
    );
    // Same port, two protocols: fine.
    let both = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080), udp_listener(vip(t), 8080)],
        vec![],
    );
    plane
        .apply(both)
        .await
        .expect("TCP and UDP may share a port");
    let state = plane.state("lb").expect("state");
    let protocols: HashSet<Protocol> = state.listeners.iter().map(|l| l.spec.protocol).collect();
    assert_eq!(protocols.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_port_change_moves_new_connections_without_rebinding_or_cutting() {
    let t = 31;
    tcp_echo_on(node_ip(t, 1), NODE_PORT, "old").await;
    tcp_echo_on(node_ip(t, 1), NODE_PORT + 1, "new").await;
    let plane = DataPlane::new(fast_settings());
    let to = SocketAddr::new(vip(t), 8080);
    let mut listener = tcp_listener(vip(t), 8080);
    plane
        .apply(spec(
            "lb",
            vec![listener],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut established = TcpStream::connect(to).await.expect("connect");
    assert_eq!(read_id(&mut established).await, "old");

    listener.node_port = NODE_PORT + 1;
    plane
        .apply(spec(
            "lb",
            vec![listener],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply with another node port");
    assert_eq!(which_backend(client_ip(t, 1), to).await, "new");
    assert_eq!(round_trip(&mut established, b"kept").await, b"kept");
    let state = plane.state("lb").expect("state");
    assert_eq!(state.listeners[0].spec.node_port, NODE_PORT + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_taken_out_and_put_back_binds_again_at_once() {
    let t = 32;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    let backends = vec![backend("n1", node_ip(t, 1))];
    let both = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080), udp_listener(vip(t), 8080)],
        backends.clone(),
    );
    plane.apply(both.clone()).await.expect("apply");
    // An open connection keeps draining in the background; the port is free all the same.
    let mut established = TcpStream::connect((vip(t), 8080)).await.expect("connect");
    assert_eq!(read_id(&mut established).await, "n1");
    plane
        .apply(spec("lb", vec![], backends.clone()))
        .await
        .expect("apply without listeners");
    plane.apply(both).await.expect("the same ports bind again");
    assert_eq!(
        which_backend(client_ip(t, 1), SocketAddr::new(vip(t), 8080)).await,
        "n1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_moves_off_a_backend_that_becomes_unhealthy_and_sticks_again() {
    let t = 33;
    let mut switches = HashMap::new();
    for n in 1..=3 {
        tcp_echo(node_ip(t, n), &format!("n{n}")).await;
        switches.insert(format!("n{n}"), health_server(node_ip(t, n), true).await);
    }
    let plane = DataPlane::new(fast_settings());
    let mut lb = spec(
        "lb",
        vec![tcp_listener(vip(t), 8080)],
        (1..=3)
            .map(|n| backend(&format!("n{n}"), node_ip(t, n)))
            .collect(),
    );
    lb.health_check = healthz();
    lb.session_affinity = Some(Duration::from_secs(600));
    plane.apply(lb).await.expect("apply");
    let to = SocketAddr::new(vip(t), 8080);
    let first = which_backend(client_ip(t, 1), to).await;

    switches[&first].store(false, Ordering::SeqCst);
    let ip = node_ip(t, first[1..].parse().expect("node number"));
    assert!(
        eventually(2 * SECOND, || backend_healthy(&plane, "lb", ip)
            == Some(false))
        .await
    );
    let second = which_backend(client_ip(t, 1), to).await;
    assert_ne!(
        second, first,
        "affinity never sends a client to an unhealthy backend"
    );
    for _ in 0..5 {
        assert_eq!(
            which_backend(client_ip(t, 1), to).await,
            second,
            "and sticks to the new one"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_v2_header_over_ipv6() {
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let node_port = 31_633;
    let backend_listener = TcpListener::bind((v6, node_port))
        .await
        .expect("bind backend");
    let plane = DataPlane::new(fast_settings());
    let mut listener = tcp_listener(v6, 31_634);
    listener.node_port = node_port;
    let mut lb = spec("lb6", vec![listener], vec![backend("v6", v6)]);
    lb.proxy_protocol = true;
    plane.apply(lb).await.expect("apply");

    let client = TcpStream::connect((v6, 31_634)).await.expect("connect");
    let client_port = client.local_addr().expect("addr").port();
    let (mut upstream, _) = within(2 * SECOND, "accept", backend_listener.accept())
        .await
        .expect("accept");
    let mut header = [0u8; 52];
    within(2 * SECOND, "header", upstream.read_exact(&mut header))
        .await
        .expect("read header");
    assert_eq!(&header[..12], b"\r\n\r\n\0\r\nQUIT\n", "signature");
    assert_eq!(header[12], 0x21, "version 2, command PROXY");
    assert_eq!(header[13], 0x21, "TCP over IPv6");
    assert_eq!(
        u16::from_be_bytes([header[14], header[15]]),
        36,
        "address block length"
    );
    assert_eq!(
        &header[16..32],
        &Ipv6Addr::LOCALHOST.octets(),
        "source address"
    );
    assert_eq!(
        &header[32..48],
        &Ipv6Addr::LOCALHOST.octets(),
        "destination address"
    );
    assert_eq!(u16::from_be_bytes([header[48], header[49]]), client_port);
    assert_eq!(u16::from_be_bytes([header[50], header[51]]), 31_634);
}

/// A UDP flow that keeps sending never goes idle: it must still leave a backend that turns unhealthy
/// (or leaves the set), and stop when its source is no longer allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_udp_flow_leaves_an_unhealthy_backend_and_a_tightened_source_range() {
    let t = 40;
    udp_echo(node_ip(t, 1), "n1").await;
    udp_echo(node_ip(t, 2), "n2").await;
    let n1_health = health_server(node_ip(t, 1), true).await;
    let _n2_health = health_server(node_ip(t, 2), true).await;
    let settings = fast_settings();
    let plane = DataPlane::new(settings.clone());
    let mut lb = spec(
        "lb",
        vec![udp_listener(vip(t), 5353)],
        vec![backend("n1", node_ip(t, 1)), backend("n2", node_ip(t, 2))],
    );
    lb.health_check = healthz();
    plane.apply(lb.clone()).await.expect("apply");

    let client = UdpSocket::bind((client_ip(t, 1), 0))
        .await
        .expect("bind client");
    let mut buf = [0u8; 2048];
    let mut ask = async |msg: &str| -> Option<String> {
        client.send_to(msg.as_bytes(), (vip(t), 5353)).await.ok()?;
        let (len, _) = tokio::time::timeout(SECOND, client.recv_from(&mut buf))
            .await
            .ok()?
            .ok()?;
        let reply = String::from_utf8_lossy(&buf[..len]).into_owned();
        Some(reply.split(':').next().unwrap_or_default().to_owned())
    };
    // Find which backend the flow went to; make that one unhealthy if it is n1, else remove n2.
    let first = ask("hello").await.expect("a reply");
    if first == "n1" {
        n1_health.store(false, Ordering::SeqCst);
        assert!(
            eventually(3 * SECOND, || backend_healthy(&plane, "lb", node_ip(t, 1))
                == Some(false))
            .await
        );
    } else {
        lb.backends.retain(|b| b.node != "n2");
        plane.apply(lb.clone()).await.expect("apply without n2");
    }
    // The flow never went idle, yet its next datagram goes to the other backend.
    let next = ask("again").await.expect("a reply");
    assert_ne!(
        next, first,
        "an active flow stayed on a backend that is gone or unhealthy"
    );

    // A source range that no longer includes the client ends its flow.
    lb.source_ranges = vec!["192.0.2.0/24".parse().unwrap()];
    lb.backends = vec![backend("n1", node_ip(t, 1)), backend("n2", node_ip(t, 2))];
    n1_health.store(true, Ordering::SeqCst);
    plane.apply(lb).await.expect("apply with source ranges");
    assert_eq!(
        ask("after").await,
        None,
        "a refused source still got a reply"
    );
}

/// Both sides of a relayed connection probe their peer (keepalive after 60 s idle, 10 s apart), so a
/// client that vanished without a FIN or reset is closed within about 2 minutes, not kept for good with
/// its two descriptors (issue #32): the client's side from its first moment (it has the listener's
/// options), the backend's once the connection is a second old. Read from the kernel's own view of the
/// sockets (`ss`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_of_a_relayed_connection_have_keepalive() {
    let t = 43;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(fast_settings());
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut stream = TcpStream::connect((vip(t), 8080))
        .await
        .expect("connect to the VIP");
    assert_eq!(read_id(&mut stream).await, "n1");
    let client = stream.local_addr().unwrap();

    // The backend's side gets keepalive after the connection's first second.
    let backend = format!("{}:{NODE_PORT}", node_ip(t, 1));
    let sockets = within(5 * SECOND, "keepalive toward the backend", async {
        loop {
            let sockets = established_sockets();
            if socket_toward(&sockets, &backend).is_some_and(|l| l.contains("keepalive")) {
                return sockets;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let line = |local: &str, peer: &str| {
        sockets
            .lines()
            .find(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                fields.len() >= 4 && fields[2] == local && fields[3] == peer
            })
            .map(str::to_owned)
    };
    // The proxy's side toward the client: local VIP:8080, peer the client.
    let toward_client = line(&format!("{}:8080", vip(t)), &client.to_string())
        .unwrap_or_else(|| panic!("no socket for the client's connection in:\n{sockets}"));
    assert!(toward_client.contains("keepalive"), "{toward_client}");
    // The client's own socket (not the proxy's) has none: the check tells them apart.
    let own = line(&client.to_string(), &format!("{}:8080", vip(t))).expect("the client's socket");
    assert!(!own.contains("keepalive"), "{own}");
    drop(stream);
    plane.shutdown().await;
}

/// `ss -tnoH state established`: one line per socket, with `timer:(keepalive,…)` when keepalive is on.
fn established_sockets() -> String {
    let output = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established"])
        .output()
        .expect("ss runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The line of the (first) socket whose peer is `peer`.
fn socket_toward<'a>(sockets: &'a str, peer: &str) -> Option<&'a str> {
    sockets.lines().find(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        fields.len() >= 4 && fields[3] == peer
    })
}

/// Clients whose connections waited in the queue of a listening socket handed over by a process that
/// set no options on it, each with its bytes already sent: the data plane takes them in one go, reads
/// each client's bytes before connecting to a backend, and sends the PROXY header and the bytes
/// together; the first backend refuses, so half of them go to the second with nothing lost. Their
/// client's side gets keepalive all the same (set on each connection, as it could not come from the
/// listener), and the backend's side after a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_clients_with_bytes_sent_reach_the_backend_that_answers_with_their_header() {
    let t = 49;
    // n1 refuses (nothing listens there); n2 reads what each connection brings.
    let answering = TcpListener::bind((node_ip(t, 2), NODE_PORT))
        .await
        .expect("bind backend");
    let tcp = SocketAddr::new(vip(t), 8080);
    let predecessor = std::net::TcpListener::bind(tcp).expect("bind the listener handed over");
    let mut clients = Vec::new();
    for n in 0..4u8 {
        let mut client = connect_from(client_ip(t, 1), tcp)
            .await
            .expect("connect to the queue");
        client
            .write_all(format!("client-{n}").as_bytes())
            .await
            .expect("write");
        clients.push(client);
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let plane = taking_over_with_proxy_header(
        tcp,
        predecessor,
        vec![backend("n1", node_ip(t, 1)), backend("n2", node_ip(t, 2))],
        Some(&mut registry),
    )
    .await;

    let mut arrived = HashMap::new();
    let mut upstreams = Vec::new();
    for _ in 0..clients.len() {
        let (upstream, port, bytes) = next_relayed_with_header(&answering, 8).await;
        arrived.insert(String::from_utf8_lossy(&bytes).into_owned(), port);
        upstreams.push(upstream);
    }
    let sent: HashMap<String, u16> = clients
        .iter()
        .enumerate()
        .map(|(n, c)| (format!("client-{n}"), c.local_addr().unwrap().port()))
        .collect();
    assert_eq!(
        arrived, sent,
        "each client's bytes right after the header naming it"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let refused: u64 = text
        .lines()
        .find(|l| l.starts_with("local_lb_backend_connect_errors_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no connect errors counted in:\n{text}"));
    assert!(
        (1..=4).contains(&refused),
        "the connections that tried n1 first were refused there ({refused})"
    );

    let sockets = established_sockets();
    for client in &clients {
        let peer = client.local_addr().unwrap().to_string();
        let proxy_side = socket_toward(&sockets, &peer)
            .unwrap_or_else(|| panic!("no socket toward {peer} in:\n{sockets}"));
        assert!(proxy_side.contains("keepalive"), "{proxy_side}");
    }
    let toward_backend = format!("{}:{NODE_PORT}", node_ip(t, 2));
    within(5 * SECOND, "keepalive toward the backend", async {
        loop {
            let sockets = established_sockets();
            let toward: Vec<&str> = sockets
                .lines()
                .filter(|l| l.split_whitespace().nth(3) == Some(toward_backend.as_str()))
                .collect();
            if toward.len() == clients.len() && toward.iter().all(|l| l.contains("keepalive")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop((clients, upstreams));
    plane.shutdown().await;
}

/// A data plane that takes over `predecessor`, the listening socket of `tcp` an earlier process
/// handed over (with the connections queued on it), and serves it as load balancer `lb` for `backends`
/// with a PROXY v2 header; its metrics in `registry` when given, registered before it serves.
async fn taking_over_with_proxy_header(
    tcp: SocketAddr,
    predecessor: std::net::TcpListener,
    backends: Vec<local_data_plane::Backend>,
    registry: Option<&mut prometheus_client::registry::Registry>,
) -> DataPlane {
    let plane = DataPlane::new(fast_settings());
    plane.inherit(vec![local_data_plane::HandedSocket {
        protocol: Protocol::Tcp,
        addr: tcp,
        fd: predecessor.into(),
    }]);
    if let Some(registry) = registry {
        plane.register_metrics(registry);
    }
    let mut lb = spec("lb", vec![tcp_listener(tcp.ip(), tcp.port())], backends);
    lb.proxy_protocol = true;
    plane.apply(lb).await.expect("apply");
    plane
}

/// The next connection the proxy makes to `backend`, the client's source port its PROXY v2 header
/// (IPv4) names, and the `len` bytes after the header.
async fn next_relayed_with_header(backend: &TcpListener, len: usize) -> (TcpStream, u16, Vec<u8>) {
    let (mut upstream, _) = within(2 * SECOND, "the backend accepts", backend.accept())
        .await
        .expect("accept");
    let mut opening = vec![0u8; 28 + len];
    within(
        2 * SECOND,
        "header and bytes",
        upstream.read_exact(&mut opening),
    )
    .await
    .expect("read");
    let port = u16::from_be_bytes([opening[24], opening[25]]);
    (upstream, port, opening.split_off(28))
}

/// A client that resets its connection while it waits in the queue is closed without a backend
/// being bothered: the reset is reported once, on the first read, and is not taken for an end of data
/// (which would connect to the backend, send it the PROXY header and half-close it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_in_the_queue_reaches_no_backend() {
    let t = 50;
    let backend_listener = TcpListener::bind((node_ip(t, 1), NODE_PORT))
        .await
        .expect("bind backend");
    let tcp = SocketAddr::new(vip(t), 8080);
    let predecessor = std::net::TcpListener::bind(tcp).expect("bind the listener handed over");
    let resetting = connect_from(client_ip(t, 1), tcp)
        .await
        .expect("connect to the queue");
    socket2::SockRef::from(&resetting)
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(resetting);
    let mut staying = connect_from(client_ip(t, 2), tcp)
        .await
        .expect("connect to the queue");
    staying.write_all(b"hello").await.expect("write");
    let plane =
        taking_over_with_proxy_header(tcp, predecessor, vec![backend("n1", node_ip(t, 1))], None)
            .await;

    // Only the client that stayed reaches the backend.
    let (upstream, port, bytes) = next_relayed_with_header(&backend_listener, 5).await;
    assert_eq!(
        port,
        staying.local_addr().unwrap().port(),
        "the header names the client that stayed"
    );
    assert_eq!(bytes, b"hello");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), backend_listener.accept())
            .await
            .is_err(),
        "the reset client's connection went to the backend"
    );
    drop((staying, upstream));
    plane.shutdown().await;
}

/// With `tcp_idle_timeout`, a relayed connection with no byte either way for that long is closed (and
/// counted), while one that keeps talking stays open; without it, an idle connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_idle_timeout_and_a_busy_one_is_not() {
    let t = 44;
    tcp_echo(node_ip(t, 1), "n1").await;
    let idle_timeout = Duration::from_millis(600);
    let plane = DataPlane::new(Settings {
        tcp_idle_timeout: Some(idle_timeout),
        ..fast_settings()
    });
    let mut registry = prometheus_client::registry::Registry::default();
    plane.register_metrics(&mut registry);
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut idle = TcpStream::connect((vip(t), 8080)).await.expect("connect");
    assert_eq!(read_id(&mut idle).await, "n1");
    let mut busy = TcpStream::connect((vip(t), 8080)).await.expect("connect");
    assert_eq!(read_id(&mut busy).await, "n1");
    let started = std::time::Instant::now();
    // The busy one talks every 200 ms for 1.8 s, three idle timeouts.
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            round_trip(&mut busy, b"x").await,
            b"x",
            "the busy connection stays open"
        );
    }
    assert!(
        closed_promptly(&mut idle, Duration::from_millis(100)).await,
        "the idle connection is closed"
    );
    eprintln!(
        "idle timeout {idle_timeout:?}: idle connection closed, busy one open after {:?}",
        started.elapsed()
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let expected = format!(
        "local_lb_idle_timeouts_total{{load_balancer=\"lb\",listener=\"127.{t}.0.1:8080/TCP\"}} 1"
    );
    assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    drop(busy);
    plane.shutdown().await;

    // Without the setting an idle connection stays open.
    let plane = DataPlane::new(fast_settings());
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8081)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");
    let mut idle = TcpStream::connect((vip(t), 8081)).await.expect("connect");
    assert_eq!(read_id(&mut idle).await, "n1");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(round_trip(&mut idle, b"still").await, b"still");
    plane.shutdown().await;
}

/// A rolling update of the process that runs the data plane: the old one hands its listening sockets
/// over, the new one accepts from them, and the old one drains. No connection is refused at any point
/// (a client connects all along), the connection the old one accepted goes on until it ends, and a
/// UDP client keeps getting answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_accepts_from_the_sockets_handed_over_while_the_old_drains() {
    let t = 45;
    tcp_echo(node_ip(t, 1), "n1").await;
    udp_echo(node_ip(t, 1), "n1").await;
    let settings = Settings {
        drain_timeout: Duration::from_secs(3),
        ..fast_settings()
    };
    let lb = || {
        spec(
            "lb",
            vec![tcp_listener(vip(t), 8080), udp_listener(vip(t), 8053)],
            vec![backend("n1", node_ip(t, 1))],
        )
    };
    let tcp = SocketAddr::new(vip(t), 8080);
    let udp = SocketAddr::new(vip(t), 8053);
    let old = DataPlane::new(settings.clone());
    old.apply(lb()).await.expect("apply on the old");
    let mut long_lived = TcpStream::connect(tcp).await.expect("connect");
    assert_eq!(read_id(&mut long_lived).await, "n1");

    // A client connecting all along: every connection must get its echo.
    let stop = tokio_util::sync::CancellationToken::new();
    let client = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.is_cancelled() {
                match TcpStream::connect(tcp).await {
                    Ok(mut stream) => match within(SECOND, "an echo", async {
                        read_id(&mut stream).await;
                        round_trip(&mut stream, b"ping").await
                    })
                    .await
                    {
                        data if data == b"ping" => ok += 1,
                        data => failed.push(format!("echo {data:?}")),
                    },
                    Err(err) => failed.push(err.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (ok, failed)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let handed = old.hand_over().expect("the sockets to hand over");
    assert_eq!(
        handed
            .iter()
            .map(|h| (h.addr, h.protocol))
            .collect::<Vec<_>>(),
        [(udp, Protocol::Udp), (tcp, Protocol::Tcp)]
    );
    let new = DataPlane::new(settings);
    new.inherit(handed);
    new.apply(lb()).await.expect("apply on the new");
    assert_eq!(
        new.close_inherited(),
        0,
        "every socket handed over is taken"
    );
    let old_stopping = tokio::spawn({
        let old = old.clone();
        async move { old.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        round_trip(&mut long_lived, b"still here").await,
        b"still here",
        "the old process's connection goes on while it drains"
    );
    let datagram = UdpSocket::bind((client_ip(t, 1), 0)).await.expect("bind");
    datagram.send_to(b"hello", udp).await.expect("send");
    let mut buf = [0u8; 64];
    let (len, from) = within(SECOND, "a UDP answer", datagram.recv_from(&mut buf))
        .await
        .expect("recv");
    assert_eq!((&buf[..len], from), (&b"n1:hello"[..], udp));
    drop(long_lived);
    within(3 * SECOND, "the old drains", old_stopping)
        .await
        .expect("old shutdown");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let (ok, failed) = client.await.expect("client");
    assert!(
        failed.is_empty(),
        "{} of {} connections failed: {failed:?}",
        failed.len(),
        ok + failed.len()
    );
    assert!(ok > 10, "the client connected all along ({ok})");
    let state = new.state("lb").expect("the new serves");
    assert_eq!(state.listeners.len(), 2);
    assert!(state.failed_listeners.is_empty());
}

/// A socket handed over for another address, or of the wrong kind, is refused by the listener that
/// would take it, which says why; the listener binds nothing else in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_handed_over_for_another_address_is_refused_with_the_reason() {
    let t = 46;
    let wrong = std::net::UdpSocket::bind((vip(t), 0)).expect("bind");
    let plane = DataPlane::new(fast_settings());
    plane.inherit(vec![local_data_plane::HandedSocket {
        protocol: Protocol::Tcp,
        addr: SocketAddr::new(vip(t), 8080),
        fd: wrong.into(),
    }]);
    let err = plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect_err("a UDP socket is no TCP listener");
    assert!(err.to_string().contains("no listening TCP socket"), "{err}");
}

/// On three relay threads, the connections handed to another thread than the one that accepted them
/// (the least loaded takes each: six of nine here) carry bytes as the ones kept do; dropping the data
/// plane stops its threads, which closes the listener and every connection on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_spread_over_relay_threads_carry_bytes_and_stop_with_the_data_plane() {
    let t = 47;
    tcp_echo(node_ip(t, 1), "n1").await;
    let plane = DataPlane::new(Settings {
        relay_threads: std::num::NonZeroUsize::new(3),
        ..fast_settings()
    });
    plane
        .apply(spec(
            "lb",
            vec![tcp_listener(vip(t), 8080)],
            vec![backend("n1", node_ip(t, 1))],
        ))
        .await
        .expect("apply");

    let mut streams = Vec::new();
    for _ in 0..9 {
        let mut stream = TcpStream::connect((vip(t), 8080))
            .await
            .expect("connect to the VIP");
        assert_eq!(read_id(&mut stream).await, "n1");
        streams.push(stream);
    }
    for (i, stream) in streams.iter_mut().enumerate() {
        let data = format!("connection {i}").into_bytes();
        assert_eq!(round_trip(stream, &data).await, data, "connection {i}");
    }
    let state = plane.state("lb").expect("state");
    assert_eq!(state.listeners[0].active_connections, 9);

    drop(plane);
    assert!(
        TcpStream::connect((vip(t), 8080)).await.is_err(),
        "the listener is closed with the data plane"
    );
    for (i, stream) in streams.iter_mut().enumerate() {
        assert!(
            closed_promptly(stream, SECOND).await,
            "connection {i} is closed with the data plane"
        );
    }
}
