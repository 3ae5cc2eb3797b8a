//! BFD with a real router: FRR's bfdd and bgpd (Debian's `frr`, zebra between them) in a network
//! namespace of their own, our speaker on the host side of a veth pair. BFD's port (3784) is a
//! fixed one, so the router cannot share the host's namespace with us, and the tests take turns
//! with the host's port.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use local_bgp::{Bfd, BfdProfile, BfdState, Peer, PeerConfig, Routes};
use serde_json::Value;
use support::{NODE_ASN, ROUTER_ASN, eventually, net, routers, vtysh_at};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// One test at a time holds the host's BFD port.
static HOST_PORT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn run(command: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(command[0])
        .args(&command[1..])
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// FRR (zebra, bfdd, bgpd) in the namespace `lbgp-bfd-N`, reached over a veth pair:
/// 10.251.N.1 and fd00:251:N::1 on the host, 10.251.N.2 and fd00:251:N::2 in the namespace.
struct Router {
    netns: String,
    host_link: String,
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
    n: u8,
}

impl Router {
    async fn start(n: u8, profile: &str) -> Router {
        routers();
        let netns = format!("lbgp-bfd-{n}");
        let host_link = format!("lbgp-bfd{n}");
        let _ = run(&["ip", "netns", "del", &netns]);
        let _ = run(&["ip", "link", "del", &host_link]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let mut router = Router {
            netns: netns.clone(),
            host_link: host_link.clone(),
            dir,
            daemons: Vec::new(),
            n,
        };
        for command in [
            format!("ip netns add {netns}"),
            format!("ip link add {host_link} type veth peer name eth0 netns {netns}"),
            // No duplicate address detection on the link-local addresses either: bgpd waits for
            // one before it takes an IPv6 session.
            format!("sysctl -q -w net.ipv6.conf.{host_link}.accept_dad=0"),
            format!("ip netns exec {netns} sysctl -q -w net.ipv6.conf.eth0.accept_dad=0"),
            format!("ip address add 10.251.{n}.1/30 dev {host_link}"),
            format!("ip address add fd00:251:{n}::1/126 dev {host_link} nodad"),
            format!("ip link set {host_link} up"),
            format!("ip -n {netns} address add 10.251.{n}.2/30 dev eth0"),
            format!("ip -n {netns} address add fd00:251:{n}::2/126 dev eth0 nodad"),
            format!("ip -n {netns} link set lo up"),
            format!("ip -n {netns} link set eth0 up"),
        ] {
            run(&command.split(' ').collect::<Vec<_>>()).unwrap();
        }
        let bgpd = format!(
            "frr defaults datacenter\nhostname bfd-router\nlog stdout informational\n\
             router bgp {ROUTER_ASN}\n bgp router-id 10.251.{n}.2\n no bgp ebgp-requires-policy\n\
             \x20neighbor 10.251.{n}.1 remote-as {NODE_ASN}\n neighbor 10.251.{n}.1 bfd profile node\n\
             \x20neighbor fd00:251:{n}::1 remote-as {NODE_ASN}\n neighbor fd00:251:{n}::1 bfd profile node\n\
             \x20address-family ipv6 unicast\n  neighbor fd00:251:{n}::1 activate\n exit-address-family\n"
        );
        let bfdd = format!(
            "hostname bfd-router\nlog stdout informational\nbfd\n profile node\n{profile}\n"
        );
        std::fs::write(router.dir.path().join("bgpd.conf"), bgpd).unwrap();
        std::fs::write(router.dir.path().join("bfdd.conf"), bfdd).unwrap();
        std::fs::write(
            router.dir.path().join("zebra.conf"),
            "hostname bfd-router\n",
        )
        .unwrap();
        for daemon in ["zebra", "bfdd", "bgpd"] {
            router.spawn(daemon);
            // bfdd and bgpd connect to zebra's socket at start.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        eventually("bgpd's vty socket", async || {
            router
                .vtysh("bgpd", "show bgp summary json")
                .await
                .map(|_| ())
        })
        .await;
        router
    }

    fn spawn(&mut self, daemon: &str) {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let log = std::fs::File::create(self.dir.path().join(format!("{daemon}.log"))).unwrap();
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                &self.netns,
                &format!("/usr/lib/frr/{daemon}"),
            ])
            .args([
                "-f",
                &path(&format!("{daemon}.conf")),
                "-i",
                &path(&format!("{daemon}.pid")),
            ])
            .args(["-z", &path("zserv.api"), "--vty_socket", &path("")]);
        match daemon {
            "bfdd" => {
                command.args(["--bfdctl", &path("bfdd.sock")]);
            }
            "bgpd" => {
                command.arg("-S");
            }
            _ => {}
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.daemons.push(child);
    }

    async fn vtysh(&self, daemon: &str, command: &str) -> Result<Value, String> {
        vtysh_at(self.dir.path(), Some(daemon), command).await
    }

    /// bfdd's view of its session with `peer`: its status (`up`, `down` …) and the remote's
    /// discriminator.
    async fn bfd_peer(&self, peer: &str) -> Value {
        let peers = self
            .vtysh("bfdd", "show bfd peers json")
            .await
            .unwrap_or_default();
        peers
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["peer"].as_str() == Some(peer))
            .cloned()
            .unwrap_or_default()
    }

    async fn neighbour_state(&self, family: &str, neighbour: &str) -> String {
        let summary = self
            .vtysh("bgpd", "show bgp summary json")
            .await
            .unwrap_or_default();
        summary[format!("{family}Unicast")]["peers"][neighbour]["state"]
            .as_str()
            .unwrap_or("unknown")
            .to_string()
    }

    async fn has_route(&self, family: &str, prefix: &str) -> bool {
        let table = self
            .vtysh("bgpd", &format!("show bgp {family} unicast json"))
            .await
            .unwrap_or_default();
        table["routes"][prefix]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    }

    /// Drops, in the router's namespace, what `rule` matches in the chain `hook` (`input`,
    /// `output`), until `let_through`.
    fn drop_in(&self, hook: &str, rule: &str) {
        let rules = format!(
            "table inet lbgp_bfd {{\n chain {hook} {{\n  type filter hook {hook} priority 0;\n  {rule} drop\n }}\n}}\n"
        );
        let file = self.dir.path().join("drop.nft");
        std::fs::write(&file, rules).unwrap();
        run(&[
            "ip",
            "netns",
            "exec",
            &self.netns,
            "nft",
            "-f",
            &file.display().to_string(),
        ])
        .unwrap();
    }

    fn let_through(&self) {
        run(&[
            "ip",
            "netns",
            "exec",
            &self.netns,
            "nft",
            "delete",
            "table",
            "inet",
            "lbgp_bfd",
        ])
        .unwrap();
    }

    fn logs(&self) -> String {
        ["bfdd", "bgpd"]
            .iter()
            .map(|d| {
                format!(
                    "--- {d}\n{}",
                    std::fs::read_to_string(self.dir.path().join(format!("{d}.log")))
                        .unwrap_or_default()
                )
            })
            .collect()
    }

    fn node(&self, ipv6: bool, profile: BfdProfile) -> PeerConfig {
        let n = self.n;
        let (router, source): (IpAddr, IpAddr) = if ipv6 {
            (
                format!("fd00:251:{n}::2").parse().unwrap(),
                format!("fd00:251:{n}::1").parse().unwrap(),
            )
        } else {
            (
                IpAddr::V4(Ipv4Addr::new(10, 251, n, 2)),
                IpAddr::V4(Ipv4Addr::new(10, 251, n, 1)),
            )
        };
        PeerConfig {
            source: Some(source),
            hold_time: 30,
            bfd: Some(profile),
            graceful_restart: Some(120),
            connect_retry: Duration::from_millis(200),
            max_connect_retry: Duration::from_secs(1),
            ..PeerConfig::new(router, ROUTER_ASN, NODE_ASN, Ipv4Addr::new(10, 251, n, 1))
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        for daemon in &mut self.daemons {
            let _ = daemon.start_kill();
        }
        let _ = run(&["ip", "netns", "del", &self.netns]);
        let _ = run(&["ip", "link", "del", &self.host_link]);
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

fn fast() -> BfdProfile {
    BfdProfile {
        receive_interval: Duration::from_millis(100),
        transmit_interval: Duration::from_millis(100),
        detect_multiplier: 3,
        passive: false,
    }
}

const FAST_FRR: &str = "  detect-multiplier 3\n  receive-interval 100\n  transmit-interval 100";

fn vip_routes() -> watch::Sender<Routes> {
    watch::Sender::new(
        [
            (net("10.96.1.1/32"), local_bgp::Path::default()),
            (net("2001:db8:96::1/128"), local_bgp::Path::default()),
        ]
        .into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bfd_comes_up_with_frr_over_ipv4_and_ipv6_and_a_silent_node_is_dropped_within_its_detection_time()
 {
    let _port = HOST_PORT.lock().await;
    let router = Router::start(1, FAST_FRR).await;
    let bfd = Bfd::bind().unwrap();
    let routes = vip_routes();
    let v4 = Peer::start_with_bfd(router.node(false, fast()), routes.subscribe(), &bfd).unwrap();
    let v6 = Peer::start_with_bfd(router.node(true, fast()), routes.subscribe(), &bfd).unwrap();

    eventually(
        "BGP and BFD up on both sessions, on both sides",
        async || {
            for (family, peer) in [("ipv4", "10.251.1.1"), ("ipv6", "fd00:251:1::1")] {
                let state = router.neighbour_state(family, peer).await;
                let status = router.bfd_peer(peer).await["status"].clone();
                if state != "Established" || status != "up" {
                    return Err(format!("{peer}: BGP {state}, BFD {status}"));
                }
            }
            for peer in [&v4, &v6] {
                let ours = peer.bfd_status().unwrap().borrow().clone();
                if ours.state != BfdState::Up {
                    return Err(format!("ours: {ours:?}"));
                }
            }
            Ok(())
        },
    )
    .await;
    let frr_view = router.bfd_peer("10.251.1.1").await;
    // The router runs at the intervals both sides asked for once Up (the Poll Sequence went through).
    assert_eq!(frr_view["transmit-interval"], 100, "{frr_view}");
    assert_eq!(frr_view["remote-receive-interval"], 100, "{frr_view}");
    assert_eq!(frr_view["remote-detect-multiplier"], 3, "{frr_view}");
    let ours = v4.bfd_status().unwrap().borrow().clone();
    assert_eq!(ours.detection_time, Some(Duration::from_millis(300)));
    assert!(router.has_route("ipv4", "10.96.1.1/32").await);

    // The node goes silent, as a dead one does: the router drops the session and our routes when
    // BFD misses 3 packets of 100 ms, long before the 30 s hold time.
    router.drop_in("input", "iifname eth0");
    let silent = Instant::now();
    eventually("the router drops the node's routes", async || {
        if router.has_route("ipv4", "10.96.1.1/32").await {
            Err("still routed".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    eprintln!(
        "routes withdrawn {:?} after the node went silent (BFD 100 ms x 3, hold time 30 s)",
        silent.elapsed()
    );
    let neighbour = router
        .vtysh("bgpd", "show bgp neighbors 10.251.1.1 json")
        .await
        .unwrap();
    let reset = neighbour["10.251.1.1"]["lastResetDueTo"].clone();
    // FRR records the reset as "BFD down received", or, when it got to send its NOTIFICATION,
    // as that: a Cease with the subcode BFD Down (RFC 9384).
    assert!(
        reset.as_str().is_some_and(|why| why.contains("BFD"))
            || router
                .logs()
                .contains("sent to neighbor 10.251.1.1 6/10 (Cease/BFD Down)"),
        "the router reset the session for {reset}, not for BFD\n{}",
        router.logs()
    );

    // Heard again: BFD and the session come back, the routes with them.
    router.let_through();
    eventually("the routes are back", async || {
        if router.has_route("ipv4", "10.96.1.1/32").await
            && router.has_route("ipv6", "2001:db8:96::1/128").await
        {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    v4.stop().await.unwrap();
    v6.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_gone_silent_ends_our_session_at_once() {
    let _port = HOST_PORT.lock().await;
    let router = Router::start(2, FAST_FRR).await;
    let bfd = Bfd::bind().unwrap();
    let routes = vip_routes();
    let peer = Peer::start_with_bfd(router.node(false, fast()), routes.subscribe(), &bfd).unwrap();
    let mut status = peer.status();
    eventually("BGP established", async || {
        match status.borrow_and_update().state {
            local_bgp::State::Established => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually("BFD up", async || {
        match peer.bfd_status().unwrap().borrow().state {
            BfdState::Up => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The router goes silent to BFD only (its packets to our port 3784 are dropped; BGP still
    // passes): our side ends the session itself.
    router.drop_in("output", "udp dport 3784");
    eventually("our session ended by BFD", async || {
        let status = peer.status().borrow().clone();
        match &status.last_error {
            Some(error) if error.contains("BFD session down") => Ok(()),
            other => Err(format!("{:?} {other:?}", status.state)),
        }
    })
    .await;
    let error = peer.status().borrow().last_error.clone().unwrap();
    assert!(error.contains("control detection time expired"), "{error}");
    let bfd_status = peer.bfd_status().unwrap().borrow().clone();
    assert_eq!(bfd_status.failures, 1, "{bfd_status:?}");
    router.let_through();
    peer.stop().await.unwrap();
}

/// A node agent's rolling update under graceful restart, as the agents do it: the successor starts
/// while the old speaker still runs, takes its BFD session over (same discriminators, same port:
/// [`Bfd::resume`]) and opens its own BGP session; the old one then closes its BGP session without a
/// NOTIFICATION and stops its BFD session without a word. The router's BFD session never leaves Up,
/// and the route never leaves its table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_under_graceful_restart_keeps_bfd_up_and_the_routes() {
    let _port = HOST_PORT.lock().await;
    let router = Router::start(3, FAST_FRR).await;
    let routes = vip_routes();
    let old_bfd = Bfd::bind().unwrap();
    let config = router.node(false, fast());
    let before = Peer::start_with_bfd(config.clone(), routes.subscribe(), &old_bfd).unwrap();
    eventually("BGP and BFD up", async || {
        let state = router.neighbour_state("ipv4", "10.251.3.1").await;
        let bfd = router.bfd_peer("10.251.3.1").await["status"].clone();
        if state == "Established" && bfd == "up" && router.has_route("ipv4", "10.96.1.1/32").await {
            Ok(())
        } else {
            Err(format!("BGP {state}, BFD {bfd}"))
        }
    })
    .await;
    let remote_id = router.bfd_peer("10.251.3.1").await["remote-id"].clone();

    // The router's table and BFD session, sampled every 50 ms through the hand-over.
    let watching = tokio::spawn({
        let vty = router.dir.path().to_path_buf();
        async move {
            let (mut missing, mut bfd_not_up) = (0, Vec::new());
            let until = Instant::now() + Duration::from_secs(6);
            while Instant::now() < until {
                let ask = async |daemon: &str, command: &str| -> Value {
                    vtysh_at(&vty, Some(daemon), command)
                        .await
                        .unwrap_or_default()
                };
                let route = ask("bgpd", "show bgp ipv4 unicast 10.96.1.1/32 json").await;
                if route["paths"].as_array().is_none_or(|p| p.is_empty()) {
                    missing += 1;
                }
                let peers = ask("bfdd", "show bfd peers json").await;
                let status = peers
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["peer"] == "10.251.3.1")
                    .map(|p| p["status"].to_string());
                if status.as_deref() != Some("\"up\"") {
                    bfd_not_up.push(status);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (missing, bfd_not_up)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resume = before
        .bfd_status()
        .unwrap()
        .borrow()
        .resume
        .expect("an Up session can be resumed");
    let new_bfd = Bfd::bind().unwrap();
    let after = Peer::start_with_bfd_session(
        PeerConfig {
            restarted: true,
            ..config
        },
        routes.subscribe(),
        new_bfd.resume(&resume).unwrap(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    before.stop_for_restart().await.unwrap();
    drop(old_bfd);
    let (missing, bfd_not_up) = watching.await.unwrap();
    assert_eq!(
        missing,
        0,
        "the route went missing {missing} times\n{}",
        router.logs()
    );
    assert!(
        bfd_not_up.is_empty(),
        "the router's BFD session left Up: {bfd_not_up:?}\n{}",
        router.logs()
    );
    let frr = router.bfd_peer("10.251.3.1").await;
    assert_eq!(frr["remote-id"], remote_id, "the same session: {frr}");
    assert_eq!(frr["status"], "up", "{frr}");
    assert_eq!(after.bfd_status().unwrap().borrow().state, BfdState::Up);
    eventually(
        "the restarted speaker's session established",
        async || match router.neighbour_state("ipv4", "10.251.3.1").await.as_str() {
            "Established" => Ok(()),
            other => Err(other.to_string()),
        },
    )
    .await;
    after.stop().await.unwrap();
}
