//! The UDP data plane's memory over many short flows (issue #32: a 64 KiB buffer per flow, kept by the
//! allocator after the flows ended, took the process from 32 MB to about 400 MB for good). A file of
//! its own, so the process's resident size is this test's alone. `hack/test` also runs it for the
//! shipped image's target (x86_64-unknown-linux-musl), where it checks that the memory goes back.

mod support;

use std::time::Duration;

use local_data_plane::DataPlane;
use support::*;
use tokio::net::UdpSocket;

/// This process's resident set, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_goes_back_once_24000_one_datagram_flows_have_expired() {
    // hack/test runs this test on musl (the shipped image's allocator) beside the glibc build, in
    // another lane at the same time: each build on addresses of its own.
    let t = if cfg!(target_env = "musl") { 48 } else { 41 };
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

    // 24,000 senders, 1,000 at a time (in bursts of 100, within what a socket's receive buffer
    // holds), each one datagram and its answer.
    let mut before = 0;
    let mut peak = 0;
    let mut answered = 0;
    for round in 0..24 {
        let mut senders = Vec::with_capacity(1000);
        for _ in 0..10 {
            let mut burst = Vec::with_capacity(100);
            for _ in 0..100 {
                let socket = UdpSocket::bind((client_ip(t, 1), 0)).await.expect("bind");
                socket.send_to(b"ping", (vip(t), 5353)).await.expect("send");
                burst.push(socket);
            }
            for socket in &burst {
                let mut buf = [0u8; 64];
                if tokio::time::timeout(Duration::from_millis(500), socket.recv_from(&mut buf))
                    .await
                    .is_ok_and(|r| r.is_ok())
                {
                    answered += 1;
                }
            }
            senders.extend(burst);
        }
        drop(senders);
        peak = peak.max(rss_kib());
        if round == 0 {
            // After the first round: the runtime, the listener and the flow table have their size.
            tokio::time::sleep(Duration::from_secs(2)).await;
            before = rss_kib();
        }
    }
    assert!(answered >= 23_000, "{answered} of 24,000 answered");
    // Every flow expires (idle 500 ms) and its task ends.
    assert!(
        eventually(Duration::from_secs(10), || plane
            .state("lb")
            .is_some_and(|s| s.listeners[0].active_connections == 0))
        .await,
        "the flows expired"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib();
    println!(
        "udp memory: {before} KiB after the first 1,000 flows, {peak} KiB at most, {after} KiB once all 24,000 expired ({answered} answered)"
    );
    // A flow costs its socket, its task and its table entry, not a datagram buffer: 8,192 flows at
    // once (a listener's cap) stay far below what 64 KiB each would take (512 MiB).
    assert!(
        peak <= before + 64 * 1024,
        "resident memory grew from {before} KiB to {peak} KiB with 8,192 flows open"
    );
    // The memory goes back once they end. Measured with the allocator the shipped image links (musl's,
    // `hack/test` runs this file for that target): glibc's keeps freed memory in its arenas.
    if cfg!(target_env = "musl") {
        assert!(
            after <= before + before / 10,
            "resident memory {after} KiB once the flows ended, against {before} KiB after the first round"
        );
    }
    plane.shutdown().await;
}
