//! Stand-ins for nodes: TCP and UDP echo servers that say who they are, and a switchable `/healthz`.
//! Every test uses its own 127.T.0.0/16 (T = the test's number), so tests run in parallel without
//! sharing an address: VIPs are 127.T.0.x, backends 127.T.1.x, clients 127.T.2.x.

#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use local_data_plane::{
    Backend, DataPlane, HealthCheck, HealthCheckTiming, ListenerSpec, LoadBalancerSpec, Protocol,
    Settings,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

/// The port every test backend listens on (the "NodePort").
pub const NODE_PORT: u16 = 30080;
/// The port every test backend answers health checks on.
pub const HEALTH_PORT: u16 = 30081;
/// Length of the id a TCP backend sends first on every connection.
pub const ID_LEN: usize = 8;

pub fn vip(test: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, test, 0, 1))
}

pub fn node_ip(test: u8, n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, test, 1, n))
}

pub fn client_ip(test: u8, n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, test, 2, n))
}

/// Fails the test if `future` takes longer than `limit` (nothing in these tests may hang).
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: no result within {limit:?}"),
    }
}

/// Short health checks: a backend is out after 2 failed checks 50 ms apart, back after 2 good ones.
pub fn fast_settings() -> Settings {
    Settings {
        health_check: HealthCheckTiming {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(300),
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        },
        drain_timeout: Duration::from_millis(500),
        udp_idle_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        tcp_idle_timeout: None,
        open_files_limit: None,
        relay_threads: None,
    }
}

pub fn tcp_listener(vip: IpAddr, port: u16) -> ListenerSpec {
    ListenerSpec {
        vip,
        port,
        protocol: Protocol::Tcp,
        node_port: NODE_PORT,
    }
}

pub fn udp_listener(vip: IpAddr, port: u16) -> ListenerSpec {
    ListenerSpec {
        vip,
        port,
        protocol: Protocol::Udp,
        node_port: NODE_PORT,
    }
}

pub fn backend(node: &str, address: IpAddr) -> Backend {
    Backend {
        node: node.to_string(),
        address,
    }
}

pub fn spec(name: &str, listeners: Vec<ListenerSpec>, backends: Vec<Backend>) -> LoadBalancerSpec {
    LoadBalancerSpec {
        name: name.to_string(),
        listeners,
        backends,
        health_check: None,
        session_affinity: None,
        source_ranges: Vec::new(),
        proxy_protocol: false,
    }
}

pub fn healthz() -> Option<HealthCheck> {
    Some(HealthCheck {
        port: HEALTH_PORT,
        path: "/healthz".to_string(),
    })
}

/// A TCP server at `addr:NODE_PORT` that first sends `id` (padded to [`ID_LEN`]) and then echoes.
pub async fn tcp_echo(addr: IpAddr, id: &str) -> SocketAddr {
    tcp_echo_on(addr, NODE_PORT, id).await
}

/// [`tcp_echo`] on another port.
pub async fn tcp_echo_on(addr: IpAddr, port: u16, id: &str) -> SocketAddr {
    let listener = TcpListener::bind((addr, port))
        .await
        .expect("bind echo server");
    let local = listener.local_addr().expect("local addr");
    let id = format!("{id:<ID_LEN$}").into_bytes();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let id = id.clone();
            tokio::spawn(async move {
                if stream.write_all(&id).await.is_err() {
                    return;
                }
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    local
}

/// A UDP server at `addr:NODE_PORT` that answers every datagram with `id:` and the datagram.
pub async fn udp_echo(addr: IpAddr, id: &str) -> SocketAddr {
    let socket = UdpSocket::bind((addr, NODE_PORT))
        .await
        .expect("bind udp echo");
    let local = socket.local_addr().expect("local addr");
    let prefix = format!("{id}:").into_bytes();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
            let mut reply = prefix.clone();
            reply.extend_from_slice(&buf[..len]);
            let _ = socket.send_to(&reply, peer).await;
        }
    });
    local
}

/// An HTTP server at `addr:HEALTH_PORT` answering `/healthz` with 200 while the switch is on, else 503.
pub async fn health_server(addr: IpAddr, healthy: bool) -> Arc<AtomicBool> {
    let switch = Arc::new(AtomicBool::new(healthy));
    let listener = TcpListener::bind((addr, HEALTH_PORT))
        .await
        .expect("bind health server");
    let on = switch.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let on = on.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let mut len = 0;
                while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") && len < buf.len() {
                    match stream.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => len += n,
                    }
                }
                let ok = buf[..len].starts_with(b"GET /healthz ") && on.load(Ordering::SeqCst);
                let response: &[u8] = if ok {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                } else {
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
                };
                let _ = stream.write_all(response).await;
            });
        }
    });
    switch
}

/// A TCP connection to `to` from the address `from` (port chosen by the system).
pub async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if from.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Connects from `from` through `to` and returns the id of the backend that answered.
pub async fn which_backend(from: IpAddr, to: SocketAddr) -> String {
    let mut stream = within(Duration::from_secs(5), "connect", connect_from(from, to))
        .await
        .expect("connect through the VIP");
    read_id(&mut stream).await
}

pub async fn read_id(stream: &mut TcpStream) -> String {
    let mut id = [0u8; ID_LEN];
    within(
        Duration::from_secs(5),
        "backend id",
        stream.read_exact(&mut id),
    )
    .await
    .expect("read backend id");
    String::from_utf8_lossy(&id).trim_end().to_string()
}

/// Sends `data` and reads back as many bytes (the echo).
pub async fn round_trip(stream: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    within(Duration::from_secs(5), "write", stream.write_all(data))
        .await
        .expect("write");
    let mut back = vec![0u8; data.len()];
    within(Duration::from_secs(5), "echo", stream.read_exact(&mut back))
        .await
        .expect("read echo");
    back
}

/// True if the connection is closed (EOF or reset) within `limit`, without any byte received.
pub async fn closed_promptly(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(limit, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// Polls `condition` every 10 ms for up to `limit`.
pub async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the backend at `address` is healthy in the state of `name` (first listener).
pub fn backend_healthy(plane: &DataPlane, name: &str, address: IpAddr) -> Option<bool> {
    let state = plane.state(name)?;
    let listener = state.listeners.first()?;
    listener
        .backends
        .iter()
        .find(|b| b.address.ip() == address)
        .map(|b| b.healthy)
}
