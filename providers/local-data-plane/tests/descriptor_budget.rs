//! One client cannot take every `local` load balancer down by holding connections (issue #32: under a
//! 1,024 open-files limit, 600 idle connections to one VIP made every Service stop serving). A file of
//! its own: it lowers this process's open-files limit to 1,024 for real (`prlimit`).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use local_data_plane::DataPlane;
use support::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Whether the connection is relayed to a backend: the test backends send their id first; a refused
/// connection is reset instead.
async fn relayed(stream: &mut TcpStream) -> bool {
    let mut id = [0u8; ID_LEN];
    matches!(
        tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut id)).await,
        Ok(Ok(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_every_connection_it_can_leaves_other_clients_and_services_serving() {
    let status = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg("--nofile=1024:1024")
        .status()
        .expect("prlimit runs");
    assert!(status.success(), "prlimit --nofile=1024 failed");
    let t = 42;
    tcp_echo(node_ip(t, 1), "n1").await;
    // The data plane reads the (now 1,024) limit: 448 descriptors per listener, 224 per client
    // address, i.e. 112 connections from one address.
    let plane = DataPlane::new(fast_settings());
    for (name, port) in [("abused", 8080), ("other", 8081)] {
        plane
            .apply(spec(
                name,
                vec![tcp_listener(vip(t), port)],
                vec![backend("n1", node_ip(t, 1))],
            ))
            .await
            .expect("apply");
    }
    let abused = SocketAddr::new(vip(t), 8080);
    let other = SocketAddr::new(vip(t), 8081);

    // The abuser: as many idle connections as it can get, from one address, until 20 in a row fail.
    let mut held = Vec::new();
    let (mut refused, mut in_a_row) = (0, 0);
    while in_a_row < 20 {
        let mut stream = connect_from(client_ip(t, 1), abused).await.ok();
        let served = match stream.as_mut() {
            Some(stream) => relayed(stream).await,
            None => false,
        };
        match stream {
            Some(stream) if served => {
                held.push(stream);
                in_a_row = 0;
            }
            _ => {
                refused += 1;
                in_a_row += 1;
            }
        }
    }
    println!("abuser: {} connections held, {refused} refused", held.len());
    assert_eq!(held.len(), 112, "one address's share of one listener");

    // Everyone else is served: another client of the same Service, and clients of another Service.
    for _ in 0..20 {
        let mut stream = connect_from(client_ip(t, 2), abused)
            .await
            .expect("connect");
        assert!(
            relayed(&mut stream).await,
            "another client of the abused Service"
        );
        let mut stream = connect_from(client_ip(t, 3), other).await.expect("connect");
        assert!(relayed(&mut stream).await, "a client of another Service");
    }
    // The abuser's connections given back, its address is served again.
    drop(held);
    assert!(
        eventually(Duration::from_secs(5), || plane
            .state("abused")
            .is_some_and(|s| s.listeners[0].active_connections <= 1))
        .await
    );
    let mut stream = connect_from(client_ip(t, 1), abused)
        .await
        .expect("connect");
    assert!(
        relayed(&mut stream).await,
        "the abuser's address once it let go"
    );
    plane.shutdown().await;
}
