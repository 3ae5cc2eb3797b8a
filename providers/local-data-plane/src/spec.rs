//! What the data plane is asked to run ([`LoadBalancerSpec`]), how ([`Settings`]), and what it reports
//! back ([`LoadBalancerState`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Process-wide settings of a [`DataPlane`](crate::DataPlane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// How often and how strictly backends are health-checked (when a load balancer has a
    /// [`HealthCheck`]).
    pub health_check: HealthCheckTiming,
    /// How long established connections of a closed listener may go on before they are cut.
    pub drain_timeout: Duration,
    /// A UDP flow (one client address) with no datagram either way for this long is forgotten and its
    /// upstream socket closed.
    pub udp_idle_timeout: Duration,
    /// How long a connection to a backend may take before the next healthy backend is tried.
    pub connect_timeout: Duration,
    /// A relayed TCP connection with no byte either way for this long is closed (both sides); `None`
    /// (the default) leaves idle connections open, as long as keepalive finds both peers alive.
    pub tcp_idle_timeout: Option<Duration>,
    /// The open-files limit the data plane shares its descriptors out from (see the crate's docs):
    /// `None` reads the process's soft `RLIMIT_NOFILE` when the data plane is created.
    pub open_files_limit: Option<u64>,
    /// How many threads accept and relay TCP connections, each with a runtime of its own on which a
    /// connection stays for its whole life; `None` (the default): one per core the process may use
    /// (its CPU affinity and cgroup quota, as `std::thread::available_parallelism` reads them), at most
    /// [`DEFAULT_MAX_RELAY_THREADS`](crate::DEFAULT_MAX_RELAY_THREADS).
    pub relay_threads: Option<std::num::NonZeroUsize>,
}

impl Default for Settings {
    /// 2 s / 1 s / 2 healthy / 3 unhealthy health checks, 10 s drain, 60 s UDP idle, 3 s connect.
    fn default() -> Self {
        Settings {
            health_check: HealthCheckTiming::default(),
            drain_timeout: Duration::from_secs(10),
            udp_idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(3),
            tcp_idle_timeout: None,
            open_files_limit: None,
            relay_threads: None,
        }
    }
}

/// Timing of the HTTP health checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckTiming {
    /// Time between two checks of one backend.
    pub interval: Duration,
    /// A check that has no answer after this long fails.
    pub timeout: Duration,
    /// Consecutive successes that bring an unhealthy backend back.
    pub healthy_threshold: u32,
    /// Consecutive failures after which a backend gets no new connections.
    pub unhealthy_threshold: u32,
}

impl Default for HealthCheckTiming {
    fn default() -> Self {
        HealthCheckTiming {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
        }
    }
}

/// One load balancer: its listeners (VIP, port, protocol) and the backends they forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerSpec {
    /// Unique name (the provider's load-balancer name); used in logs and metric labels.
    pub name: String,
    /// One listener per (VIP, port, protocol).
    pub listeners: Vec<ListenerSpec>,
    /// All eligible nodes' addresses, both families; a listener uses the backends of its VIP's family
    /// (the other family's only when none has the VIP's), at the listener's [`ListenerSpec::node_port`].
    pub backends: Vec<Backend>,
    /// `None`: every backend is healthy.
    pub health_check: Option<HealthCheck>,
    /// `sessionAffinity: ClientIP` with its timeout: a client IP sticks to one backend while that
    /// backend is healthy and the client opened a connection (or sent a datagram) within the timeout.
    pub session_affinity: Option<Duration>,
    /// Empty: everyone may connect. Otherwise other sources are refused (TCP: closed at accept; UDP:
    /// dropped).
    pub source_ranges: Vec<ipnet::IpNet>,
    /// Send a PROXY protocol v2 header to the backend before any data (TCP listeners only).
    pub proxy_protocol: bool,
}

/// One listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerSpec {
    /// The address clients connect to; must be an address of this machine.
    pub vip: IpAddr,
    /// The port clients connect to.
    pub port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The port on each backend that traffic goes to.
    pub node_port: u16,
}

impl ListenerSpec {
    /// The socket address the listener binds.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.vip, self.port)
    }

    /// What identifies a listener: (VIP, port, protocol).
    pub(crate) fn key(&self) -> ListenerKey {
        ListenerKey {
            addr: self.socket_addr(),
            protocol: self.protocol,
        }
    }
}

impl fmt::Display for ListenerSpec {
    /// `10.0.0.1:80/TCP`, `[fd00::1]:53/UDP`: the form used in errors, logs and metric labels.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.socket_addr(), self.protocol)
    }
}

/// (VIP, port, protocol): what makes a listener unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ListenerKey {
    pub(crate) addr: SocketAddr,
    pub(crate) protocol: Protocol,
}

/// Transport protocol of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP: every accepted connection is relayed to one backend.
    Tcp,
    /// UDP: every client address gets its own upstream socket to one backend.
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        })
    }
}

/// One node that can receive traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Backend {
    /// Node name (logs, metric labels, state).
    pub node: String,
    /// The node's address (an InternalIP); traffic goes to `address:node_port`.
    pub address: IpAddr,
}

/// An HTTP health check: `GET http://<backend address>:<port><path>`, healthy iff the status is 200.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthCheck {
    /// The port checked on every backend (e.g. the Service's `healthCheckNodePort`).
    pub port: u16,
    /// The request path, e.g. `/healthz`.
    pub path: String,
}

/// What is running for one load balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerState {
    /// The load balancer's name.
    pub name: String,
    /// The listeners that are bound and serving.
    pub listeners: Vec<ListenerState>,
    /// The listeners of the last applied spec that could not be bound, with the reason.
    pub failed_listeners: Vec<(ListenerSpec, String)>,
}

/// One bound listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerState {
    /// What it was asked to be.
    pub spec: ListenerSpec,
    /// The address it is bound to.
    pub local_addr: SocketAddr,
    /// Its backends (the spec's backends of the VIP's family, else of the other, at the node port).
    pub backends: Vec<BackendState>,
    /// Connections (TCP) or flows (UDP) open now.
    pub active_connections: u64,
}

/// One backend of a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendState {
    /// Node name.
    pub node: String,
    /// `address:node_port`.
    pub address: SocketAddr,
    /// Whether it gets new connections (always true without a health check).
    pub healthy: bool,
    /// Connections (TCP) or flows (UDP) this listener has open to it now.
    pub active_connections: u64,
}
