//! The manager in-process on the `local` cloud against the test control plane, and stand-ins for the
//! nodes: echo servers on 127.x addresses playing the NodePorts, and HTTP health endpoints playing
//! kube-proxy's `:10256/healthz` or a Service's `healthCheckNodePort`.
//!
//! (The manager under test, `eventually` and the node and event helpers are `manager-testkit`'s.)

#![allow(dead_code)] // each test binary uses a different part

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cloud_provider_local::{Config, LocalCloud};
use k8s_openapi::api::{
    core::v1::{Node, NodeAddress, Service},
    events::v1::Event,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, UdpSocket},
};
use tokio_util::sync::CancellationToken;

use manager_testkit::ManagerUnderTest;
#[allow(unused_imports)] // each test binary uses a different part
pub use manager_testkit::{
    SERIAL, admin, delete_nodes, events_in, eventually, get_node, nodes, set_ready,
};

/// A manager running in this process on a `local` cloud the test holds.
pub struct RunningManager {
    pub cloud: LocalCloud,
    /// The manager's metrics: what its `/metrics` serves.
    pub metrics: cloud_controller_manager::metrics::Metrics,
    manager: ManagerUnderTest,
}

impl RunningManager {
    /// Starts a manager on a `local` cloud with `cloud_yaml`, and `args` added to the defaults of
    /// these tests (no leader election, no serving port, a 1 s lifecycle pass).
    pub async fn start(cloud_yaml: &str, args: &[&str]) -> Self {
        let cloud = LocalCloud::new(
            Config::parse(cloud_yaml, None).expect("valid local cloud config"),
            None,
        );
        Self::start_on(cloud, args).await
    }

    /// Starts a manager on a `local` cloud read from (and watching) the file `path`.
    pub async fn start_from_file(path: &std::path::Path, args: &[&str]) -> Self {
        let config = cloud_provider::CloudConfig::read(path).expect("the cloud-config is readable");
        let cloud = LocalCloud::from_cloud_config(&config).expect("valid local cloud config");
        Self::start_on(cloud, args).await
    }

    async fn start_on(cloud: LocalCloud, args: &[&str]) -> Self {
        let mut argv = vec!["--node-monitor-period=1s"];
        argv.extend(args);
        let manager = ManagerUnderTest::start("local", Arc::new(cloud.clone()), &argv).await;
        Self {
            cloud,
            metrics: manager.metrics.clone(),
            manager,
        }
    }

    /// Replaces the cloud's config, as an edit of the cloud-config file does.
    pub fn set_cloud(&self, yaml: &str) {
        self.cloud
            .set_config(Config::parse(yaml, None).expect("valid local cloud config"));
    }

    /// Whether the manager still runs (it has not returned, with or without an error).
    pub fn is_running(&self) -> bool {
        self.manager.is_running()
    }

    /// Stops the manager (its data plane shuts down with it) and checks it stopped without error.
    pub async fn stop(self) {
        self.manager.stop().await;
    }
}

/// Registers a Node as a kubelet with `--cloud-provider=external` would, with these InternalIPs.
pub async fn create_node(name: &str, internal_ips: &[&str]) -> Node {
    let mut node = test_control_plane::kubelet_node(name);
    let addresses = node
        .status
        .as_mut()
        .unwrap()
        .addresses
        .get_or_insert_with(Vec::new);
    for ip in internal_ips {
        addresses.insert(
            0,
            NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            },
        );
    }
    nodes()
        .await
        .create(&PostParams::default(), &node)
        .await
        .expect("node created")
}

/// The events in `namespace` with `reason`, about any object or none.
pub async fn events_in_namespace(namespace: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(admin().await, namespace);
    events
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Creates a namespace unless it exists (never deleted: no namespace controller runs).
pub async fn ensure_namespace(name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(admin().await);
    if namespaces
        .get_opt(name)
        .await
        .expect("namespace read")
        .is_none()
    {
        let namespace: Namespace =
            serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace created");
    }
}

/// The Services API of a namespace.
pub async fn services(namespace: &str) -> Api<Service> {
    Api::namespaced(admin().await, namespace)
}

/// Creates a Service from JSON (namespace taken from the API).
pub async fn create_service(namespace: &str, service: serde_json::Value) -> Service {
    let service: Service = serde_json::from_value(service).expect("a Service");
    services(namespace)
        .await
        .create(&PostParams::default(), &service)
        .await
        .expect("service created")
}

/// Deletes every Service of the namespace and waits until they are gone (the manager must run, to
/// remove its finalizer).
pub async fn delete_services(namespace: &str) {
    let api = services(namespace).await;
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    eventually("the Services to be gone", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        }
    })
    .await;
}

/// A `type: LoadBalancer` Service with ports `(port, protocol, nodePort)`.
pub fn lb_service(name: &str, ports: &[(u16, &str, u16)]) -> serde_json::Value {
    json!({
        "metadata": { "name": name },
        "spec": {
            "type": "LoadBalancer",
            "selector": { "app": name },
            "ports": ports.iter().map(|(p, proto, np)| json!({
                "name": format!("{}-{p}", proto.to_lowercase()), "port": p, "targetPort": 8080,
                "protocol": proto, "nodePort": np
            })).collect::<Vec<_>>(),
        }
    })
}

/// The ingress IPs of a Service's status.
pub fn status_ips(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// Waits for the Service's first ingress IP.
pub async fn wait_for_vip(namespace: &str, name: &str) -> IpAddr {
    let api = services(namespace).await;
    eventually(
        &format!("an ingress IP for {namespace}/{name}"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                let service = api.get_opt(name).await.ok()??;
                status_ips(&service).first().copied()
            }
        },
    )
    .await
}

/// A node stand-in: a TCP echo server and a UDP echo server on `address:node_port` that first say
/// which node they are, and an HTTP health endpoint on `address:health_port` whose answer the test
/// switches between 200 and 503.
pub struct FakeNode {
    pub name: String,
    pub address: IpAddr,
    healthy: Health,
    stop: CancellationToken,
}

/// What a node's health endpoints answer: all of them sick, or some ports sick.
#[derive(Clone, Default)]
struct Health {
    all_sick: Arc<AtomicBool>,
    sick_ports: Arc<std::sync::Mutex<std::collections::BTreeSet<u16>>>,
}

impl Health {
    fn is_healthy(&self, port: u16) -> bool {
        !self.all_sick.load(Ordering::SeqCst)
            && !self
                .sick_ports
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&port)
    }
}

impl FakeNode {
    /// Starts the servers. `node_ports` are served over TCP and UDP; each `health_ports` entry answers
    /// `GET /healthz`.
    pub async fn start(
        name: &str,
        address: &str,
        node_ports: &[u16],
        health_ports: &[u16],
    ) -> Self {
        let address: IpAddr = address.parse().unwrap();
        let healthy = Health::default();
        let stop = CancellationToken::new();
        for port in node_ports {
            let tcp = TcpListener::bind((address, *port))
                .await
                .unwrap_or_else(|e| panic!("bind {address}:{port}/TCP: {e}"));
            tokio::spawn(tcp_echo(tcp, name.to_owned(), stop.clone()));
            let udp = UdpSocket::bind((address, *port))
                .await
                .unwrap_or_else(|e| panic!("bind {address}:{port}/UDP: {e}"));
            tokio::spawn(udp_echo(udp, name.to_owned(), stop.clone()));
        }
        for port in health_ports {
            let http = TcpListener::bind((address, *port))
                .await
                .unwrap_or_else(|e| panic!("bind {address}:{port} (health): {e}"));
            tokio::spawn(health_server(http, *port, healthy.clone(), stop.clone()));
        }
        Self {
            name: name.to_owned(),
            address,
            healthy,
            stop,
        }
    }

    /// Makes every health endpoint answer 200 (`true`) or 503.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.all_sick.store(!healthy, Ordering::SeqCst);
    }

    /// Makes the health endpoint on `port` alone answer 200 (`true`) or 503.
    pub fn set_port_healthy(&self, port: u16, healthy: bool) {
        let mut sick = self
            .healthy
            .sick_ports
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if healthy {
            sick.remove(&port);
        } else {
            sick.insert(port);
        }
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn tcp_echo(listener: TcpListener, name: String, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let name = name.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            if stream
                .write_all(format!("{name}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            let mut buf = vec![0u8; 4096];
            loop {
                let n = tokio::select! {
                    _ = stop.cancelled() => return,
                    n = stream.read(&mut buf) => n,
                };
                match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

async fn udp_echo(socket: UdpSocket, name: String, stop: CancellationToken) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let received = tokio::select! {
            _ = stop.cancelled() => return,
            r = socket.recv_from(&mut buf) => r,
        };
        if let Ok((n, from)) = received {
            let mut reply = format!("{name}:").into_bytes();
            reply.extend_from_slice(&buf[..n]);
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

async fn health_server(listener: TcpListener, port: u16, healthy: Health, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let healthy = healthy.clone();
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let ok = healthy.is_healthy(port) && request.starts_with(b"GET /healthz");
            let response = if ok {
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            } else {
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nsick"
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Connects to `vip:port` over TCP and returns the node that answered, with the open stream.
pub async fn connect(vip: IpAddr, port: u16) -> std::io::Result<(String, TcpStream)> {
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        TcpStream::connect(SocketAddr::new(vip, port)),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let name = read_line(&mut stream).await?;
    Ok((name, stream))
}

/// Like [`connect`], binding the client to `source` first.
pub async fn connect_from(
    source: IpAddr,
    vip: IpAddr,
    port: u16,
) -> std::io::Result<(String, TcpStream)> {
    let socket = match source {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0))?;
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        socket.connect(SocketAddr::new(vip, port)),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let name = read_line(&mut stream).await?;
    Ok((name, stream))
}

/// Reads one line (the node's name), failing after 5 s or at end of stream.
pub async fn read_line(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 5 s"))??;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before a line",
            ));
        }
        if byte[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
    }
}

/// Sends `payload` through the connection and checks it comes back.
pub async fn echo(stream: &mut TcpStream, payload: &[u8]) -> std::io::Result<()> {
    stream.write_all(payload).await?;
    let mut back = vec![0u8; payload.len()];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no echo in 5 s"))??;
    assert_eq!(back, payload, "the echo differs");
    Ok(())
}

/// The nodes that answer `count` new TCP connections to `vip:port` (from the default source).
pub async fn answering_nodes(vip: IpAddr, port: u16, count: usize) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..count {
        match connect(vip, port).await {
            Ok((name, _)) => names.push(name),
            Err(err) => names.push(format!("error: {err}")),
        }
    }
    names
}

/// One UDP round trip through `vip:port` from `source`: the answer.
pub async fn udp_round_trip(
    source: IpAddr,
    vip: IpAddr,
    port: u16,
    payload: &[u8],
) -> std::io::Result<String> {
    let socket = UdpSocket::bind(SocketAddr::new(source, 0)).await?;
    socket.send_to(payload, SocketAddr::new(vip, port)).await?;
    let mut buf = vec![0u8; 65_536];
    let (n, _) = tokio::time::timeout(Duration::from_secs(3), socket.recv_from(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no UDP answer in 3 s"))??;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}
