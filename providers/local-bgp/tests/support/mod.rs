//! Real routers for the interop tests, each on loopback in a directory of its own: FRR's bgpd
//! (Debian's `frr`, the router MetalLB's own e2e tests use). `hack/routers install` installs them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

const BGPD: &str = "/usr/lib/frr/bgpd";

/// The routers' AS, and the "nodes'".
pub const ROUTER_ASN: u32 = 64512;
pub const NODE_ASN: u32 = 64513;

pub fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

/// The table the interop tests announce: an IPv4 VIP, one with a community and a large community
/// (64513:100, 64513:1:2), and an IPv6 VIP.
pub fn two_vips_and_a_tagged_one() -> local_bgp::Routes {
    let tagged = local_bgp::Path {
        communities: vec![(64513 << 16) | 100],
        large_communities: vec![[64513, 1, 2]],
        ..local_bgp::Path::default()
    };
    [
        (net("10.96.0.1/32"), local_bgp::Path::default()),
        (net("10.96.0.2/32"), tagged),
        (net("2001:db8:96::1/128"), local_bgp::Path::default()),
    ]
    .into()
}

/// A "node" at `source` (127.0.0.x) peering with `router`. A router refuses a loopback next hop (a
/// martian): the "nodes" name addresses of a network of theirs (10.0.0.x, fd00::x), as a node behind
/// a NAT or with several interfaces would.
pub fn node(router: &impl Router, source: std::net::Ipv4Addr) -> local_bgp::PeerConfig {
    use std::net::{IpAddr, Ipv4Addr};
    let last = source.octets()[3];
    local_bgp::PeerConfig {
        port: router.port(),
        source: Some(IpAddr::V4(source)),
        next_hop_v4: Some(Ipv4Addr::new(10, 0, 0, last)),
        next_hop_v6: Some(format!("fd00::{last}").parse().unwrap()),
        ..local_bgp::PeerConfig::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            ROUTER_ASN,
            NODE_ASN,
            source,
        )
    }
}

/// Installs the routers if missing (`hack/routers install`, once per test binary) and returns
/// the directory of GoBGP's binaries.
pub fn routers() -> &'static PathBuf {
    static GOBGP_BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    GOBGP_BIN.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/routers");
        let output = std::process::Command::new(&script)
            .arg("install")
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(output.status.success(), "hack/routers install failed");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let dir = stdout
            .lines()
            .find_map(|l| l.strip_prefix("GOBGP_BIN="))
            .unwrap_or_else(|| panic!("hack/routers install said {stdout:?}"));
        PathBuf::from(dir)
    })
}

/// A free TCP port on 127.0.0.1 (bound and let go: the router binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `check` every 100 ms for up to 30 s; fails with the last thing it said.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if tokio::time::Instant::now() > deadline => panic!("{what}: still {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Runs a vtysh command against the FRR daemons whose sockets are in `dir` (`daemon`: one of them
/// only); the output of a command ending in ` json` is parsed.
pub async fn vtysh_at(dir: &Path, daemon: Option<&str>, command: &str) -> Result<Value, String> {
    let mut vtysh = Command::new("vtysh");
    vtysh.args(["--vty_socket", &dir.display().to_string()]);
    if let Some(daemon) = daemon {
        vtysh.args(["-d", daemon]);
    }
    let output = vtysh
        .args(["-c", command])
        .output()
        .await
        .map_err(|e| format!("vtysh: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "vtysh -c {command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    if command.ends_with(" json") {
        serde_json::from_str(&text).map_err(|e| format!("vtysh -c {command:?}: {e}: {text}"))
    } else {
        Ok(Value::String(text.into_owned()))
    }
}

/// An FRR bgpd on 127.0.0.1:`port`, without zebra (routes are not put in a kernel table; what it
/// learnt is read with vtysh).
pub struct Frr {
    pub port: u16,
    pub asn: u32,
    dir: tempfile::TempDir,
    child: Option<Child>,
    config: String,
}

impl Frr {
    /// Starts bgpd in AS `asn` with `config` as the body of its `router bgp` section (neighbours,
    /// address families).
    pub async fn start(asn: u32, router_config: &str) -> Frr {
        routers();
        assert!(
            Path::new(BGPD).exists(),
            "{BGPD} is missing after hack/routers install"
        );
        let dir = tempfile::tempdir().unwrap();
        // bgpd drops to user frr for its vty socket; the directory must let it.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let config = format!(
            "frr defaults datacenter\nhostname interop\nlog stdout informational\n\
             router bgp {asn}\n bgp router-id 10.255.0.1\n no bgp ebgp-requires-policy\n{router_config}\n"
        );
        let mut frr = Frr {
            port: free_port(),
            asn,
            dir,
            child: None,
            config,
        };
        frr.spawn();
        eventually("bgpd's vty socket", async || {
            frr.vtysh("show bgp summary json").await.map(|_| ())
        })
        .await;
        frr
    }

    fn spawn(&mut self) {
        let path = self.dir.path();
        std::fs::write(path.join("bgpd.conf"), &self.config).unwrap();
        let log = std::fs::File::create(path.join("bgpd.log")).unwrap();
        let child = Command::new(BGPD)
            .args(["-f", &path.join("bgpd.conf").display().to_string()])
            .args(["-i", &path.join("bgpd.pid").display().to_string()])
            .args(["--vty_socket", &path.display().to_string()])
            .args(["-Z", "-S", "-l", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Kills bgpd (SIGKILL: no NOTIFICATION, the TCP connection reset).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
        let _ = std::fs::remove_file(self.dir.path().join("bgpd.vty"));
    }

    /// Starts bgpd again, with the same configuration and port.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn();
        eventually("bgpd's vty socket", async || {
            self.vtysh("show bgp summary json").await.map(|_| ())
        })
        .await;
    }

    /// Runs a vtysh command against this bgpd; JSON output is parsed.
    pub async fn vtysh(&self, command: &str) -> Result<Value, String> {
        vtysh_at(self.dir.path(), None, command).await
    }

    /// The paths bgpd has for `prefix` in `family` (`ipv4` or `ipv6`) unicast: each path's next hop,
    /// and whether it is one of the best paths (ECMP).
    pub async fn paths(&self, family: &str, prefix: &str) -> Vec<(String, bool)> {
        let table = self
            .vtysh(&format!("show bgp {family} unicast json"))
            .await
            .unwrap_or_default();
        let Some(paths) = table["routes"][prefix].as_array() else {
            return Vec::new();
        };
        let mut out: Vec<(String, bool)> = paths
            .iter()
            .map(|p| {
                let hop = p["nexthops"][0]["ip"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let used = p["bestpath"].as_bool().unwrap_or(false)
                    || p["multipath"].as_bool().unwrap_or(false);
                (hop, used)
            })
            .collect();
        out.sort();
        out
    }

    /// One path of `prefix` in full (communities, large communities, local preference …).
    pub async fn route(&self, family: &str, prefix: &str) -> Value {
        self.vtysh(&format!("show bgp {family} unicast {prefix} json"))
            .await
            .unwrap_or_default()
    }

    /// The state of the session with `neighbour` as bgpd sees it.
    pub async fn neighbour_state(&self, neighbour: &str) -> String {
        let summary = self
            .vtysh("show bgp summary json")
            .await
            .unwrap_or_default();
        summary["ipv4Unicast"]["peers"][neighbour]["state"]
            .as_str()
            .unwrap_or("unknown")
            .to_string()
    }

    /// bgpd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bgpd.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// A running router the tests read back, whichever it is.
pub trait Router {
    /// The port it takes BGP sessions on, at 127.0.0.1.
    fn port(&self) -> u16;
    /// Its name, for messages.
    fn name(&self) -> &'static str;
    /// The paths it has for `prefix` (`family`: `ipv4` or `ipv6`): each one's next hop, and whether
    /// it is used (best or multipath), sorted.
    async fn paths(&self, family: &str, prefix: &str) -> Vec<(String, bool)>;
    /// The standard and large communities of its first path of `prefix`, as it prints them.
    async fn communities(&self, family: &str, prefix: &str) -> (Vec<String>, Vec<String>);
    /// Its log so far.
    fn log(&self) -> String;
}

impl Router for Frr {
    fn port(&self) -> u16 {
        self.port
    }
    fn name(&self) -> &'static str {
        "FRR"
    }
    async fn paths(&self, family: &str, prefix: &str) -> Vec<(String, bool)> {
        Frr::paths(self, family, prefix).await
    }
    async fn communities(&self, family: &str, prefix: &str) -> (Vec<String>, Vec<String>) {
        let route = self.route(family, prefix).await;
        let path = &route["paths"][0];
        let split = |v: &Value| -> Vec<String> {
            v["string"]
                .as_str()
                .map(|s| s.split(' ').map(String::from).collect())
                .unwrap_or_default()
        };
        (split(&path["community"]), split(&path["largeCommunity"]))
    }
    fn log(&self) -> String {
        Frr::log(self)
    }
}

/// BIRD 2 (Debian's `bird2`), listening on 127.0.0.1:`port` (and the wildcard address: BIRD binds
/// its port on every address), one passive `protocol bgp` per neighbour, importing everything into
/// its tables (no kernel protocol: nothing reaches the machine's routes).
pub struct Bird {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl Bird {
    /// Starts bird in AS `asn` with one passive session per `(address, asn)`.
    pub async fn start(asn: u32, neighbours: &[(&str, u32)]) -> Bird {
        routers();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = "router id 10.255.0.1;\nlog stderr all;\nprotocol device {}\n".to_string();
        for (i, (address, peer_asn)) in neighbours.iter().enumerate() {
            // multihop: the next hops our "nodes" announce are not on a network bird is connected
            // to (it would refuse them as a direct peer's); they stay unresolved, which it shows.
            config += &format!(
                "protocol bgp node{i} {{\n  local 127.0.0.1 port {port} as {asn};\n  neighbor {address} as {peer_asn};\n  \
                 passive on;\n  multihop;\n  ipv4 {{ import all; export none; }};\n  ipv6 {{ import all; export none; }};\n}}\n"
            );
        }
        let path = dir.path();
        std::fs::write(path.join("bird.conf"), config).unwrap();
        let log = std::fs::File::create(path.join("bird.log")).unwrap();
        let child = Command::new("bird")
            .args(["-f", "-c", &path.join("bird.conf").display().to_string()])
            .args(["-s", &path.join("bird.ctl").display().to_string()])
            .args(["-P", &path.join("bird.pid").display().to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let bird = Bird { port, dir, child };
        eventually("bird's control socket", async || {
            bird.birdc("show status").await.map(|_| ())
        })
        .await;
        bird
    }

    /// Runs a birdc command.
    pub async fn birdc(&self, command: &str) -> Result<String, String> {
        let output = Command::new("birdc")
            .args([
                "-s",
                &self.dir.path().join("bird.ctl").display().to_string(),
            ])
            .args(command.split(' '))
            .output()
            .await
            .map_err(|e| format!("birdc: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() && !text.contains("Unable to connect") {
            Ok(text)
        } else {
            Err(format!(
                "birdc {command}: {text}{}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Each route of `prefix` as bird prints it with `all`: (the route's first line, its attribute lines).
    async fn routes(&self, prefix: &str) -> Vec<(String, Vec<String>)> {
        let text = self
            .birdc(&format!("show route {prefix} all"))
            .await
            .unwrap_or_default();
        let mut routes: Vec<(String, Vec<String>)> = Vec::new();
        for line in text.lines() {
            if line.contains(" [node") {
                routes.push((line.to_string(), Vec::new()));
            } else if let Some(route) = routes.last_mut() {
                route.1.push(line.trim().to_string());
            }
        }
        routes
    }
}

impl Router for Bird {
    fn port(&self) -> u16 {
        self.port
    }
    fn name(&self) -> &'static str {
        "BIRD"
    }
    async fn paths(&self, _family: &str, prefix: &str) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = self
            .routes(prefix)
            .await
            .into_iter()
            .map(|(head, attributes)| {
                let hop = attributes
                    .iter()
                    .find_map(|a| a.strip_prefix("BGP.next_hop: "))
                    .map(|h| h.split(' ').next().unwrap_or_default().to_string())
                    .unwrap_or_default();
                // bird marks its primary route with '*' and uses one per prefix (ECMP only where a
                // kernel protocol merges paths): each route it holds counts as used here.
                let _primary = head.contains(" * ");
                (hop, true)
            })
            .collect();
        out.sort();
        out
    }
    async fn communities(&self, _family: &str, prefix: &str) -> (Vec<String>, Vec<String>) {
        let routes = self.routes(prefix).await;
        let Some((_, attributes)) = routes.first() else {
            return Default::default();
        };
        let list = |name: &str| -> Vec<String> {
            attributes
                .iter()
                .find_map(|a| a.strip_prefix(name))
                .map(|v| {
                    // "(64513,100) (64513,101)" or "(64513, 1, 2)": one entry per parenthesis.
                    v.split(')')
                        .filter_map(|p| p.trim().strip_prefix('('))
                        .map(|p| p.replace(' ', "").replace(',', ":"))
                        .collect()
                })
                .unwrap_or_default()
        };
        (list("BGP.community: "), list("BGP.large_community: "))
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bird.log")).unwrap_or_default()
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// GoBGP's gobgpd (built from its Go module by `hack/routers install`), on 127.0.0.1:`port`, its
/// gRPC API on another port of 127.0.0.1 for the `gobgp` CLI; one passive neighbour per node.
pub struct GoBgp {
    pub port: u16,
    api_port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl GoBgp {
    /// Starts gobgpd in AS `asn` with one passive session per `(address, asn)`.
    pub async fn start(asn: u32, neighbours: &[(&str, u32)]) -> GoBgp {
        let bin = routers();
        let dir = tempfile::tempdir().unwrap();
        let (port, api_port) = (free_port(), free_port());
        let mut config = format!(
            "[global.config]\n  as = {asn}\n  router-id = \"10.255.0.1\"\n  port = {port}\n  \
             local-address-list = [\"127.0.0.1\"]\n[global.use-multiple-paths.config]\n  enabled = true\n"
        );
        for (address, peer_asn) in neighbours {
            config += &format!(
                "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{address}\"\n    peer-as = {peer_asn}\n  \
                 [neighbors.transport.config]\n    passive-mode = true\n  \
                 [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n  \
                 [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv6-unicast\"\n"
            );
        }
        let path = dir.path();
        std::fs::write(path.join("gobgpd.toml"), config).unwrap();
        let log = std::fs::File::create(path.join("gobgpd.log")).unwrap();
        let child = Command::new(bin.join("gobgpd"))
            .args([
                "-f",
                &path.join("gobgpd.toml").display().to_string(),
                "-t",
                "toml",
                "-p",
            ])
            .arg(format!("--api-hosts=127.0.0.1:{api_port}"))
            .args(["--pprof-disable", "--metrics-path="])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let gobgp = GoBgp {
            port,
            api_port,
            dir,
            child,
        };
        eventually("gobgpd's API", async || {
            gobgp.cli(&["-j", "neighbor"]).await.map(|_| ())
        })
        .await;
        gobgp
    }

    /// Runs the gobgp CLI against this gobgpd; its output parsed as JSON.
    pub async fn cli(&self, args: &[&str]) -> Result<Value, String> {
        let output = Command::new(routers().join("gobgp"))
            .args(["-u", "127.0.0.1", "-p", &self.api_port.to_string()])
            .args(args)
            .output()
            .await
            .map_err(|e| format!("gobgp: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "gobgp {args:?}: {text}{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        serde_json::from_str(&text).map_err(|e| format!("gobgp {args:?}: {e}: {text}"))
    }

    async fn destination(&self, family: &str, prefix: &str) -> Vec<Value> {
        let rib = self
            .cli(&["-j", "global", "rib", "-a", family])
            .await
            .unwrap_or_default();
        rib[prefix].as_array().cloned().unwrap_or_default()
    }
}

impl Router for GoBgp {
    fn port(&self) -> u16 {
        self.port
    }
    fn name(&self) -> &'static str {
        "GoBGP"
    }
    async fn paths(&self, family: &str, prefix: &str) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = self
            .destination(family, prefix)
            .await
            .iter()
            .map(|path| {
                let hop = path["attrs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find_map(|a| a["nexthop"].as_str().or_else(|| a["nexthops"][0].as_str()))
                    .unwrap_or_default()
                    .to_string();
                // With use-multiple-paths every path of equal rank is used; gobgp marks the best.
                (hop, true)
            })
            .collect();
        out.sort();
        out
    }
    async fn communities(&self, family: &str, prefix: &str) -> (Vec<String>, Vec<String>) {
        let paths = self.destination(family, prefix).await;
        let Some(attrs) = paths.first().and_then(|p| p["attrs"].as_array()) else {
            return Default::default();
        };
        let mut standard = Vec::new();
        let mut large = Vec::new();
        for attr in attrs {
            if let Some(list) = attr["communities"].as_array() {
                standard.extend(
                    list.iter()
                        .filter_map(|c| c.as_u64())
                        .map(|c| format!("{}:{}", c >> 16, c & 0xffff)),
                );
            }
            if let Some(list) = attr["value"].as_array().filter(|_| attr["type"] == 32) {
                large.extend(
                    list.iter()
                        .map(|c| format!("{}:{}:{}", c["ASN"], c["LocalData1"], c["LocalData2"])),
                );
            }
        }
        (standard, large)
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gobgpd.log")).unwrap_or_default()
    }
}

impl Drop for GoBgp {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
