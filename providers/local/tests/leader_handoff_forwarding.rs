//! The leader hand-off's packet filter ([`nftables`]) on this kernel, between real network stacks:
//! three hosts in network namespaces of their own (a client, the old holder of two VIPs, one IPv4
//! and one IPv6, and the new holder), on a bridge of their own (in a fourth namespace). The client
//! opens connections to the VIPs on the old host; the old host goes quiet, the new one installs its
//! forwarding table, takes the VIPs and announces them; then the connections opened on the old host
//! are still answered by it, new ones by the new host, and only the new host answers for the VIPs.
//!
//! It needs root (network namespaces, `CAP_NET_ADMIN`, `CAP_NET_RAW`), as CI runs the tests, and the
//! `ip` and `nft` commands (only to build the network and look at the tables). Every namespace is
//! removed when the test ends, also when it fails; their names carry the test's process ID.

#[path = "../src/leader_handoff/nftables/mod.rs"]
#[allow(dead_code, reason = "the test uses part of the module")]
mod nftables;

use std::{
    collections::BTreeSet,
    fs::File,
    io::{BufRead, BufReader, ErrorKind, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsFd,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nftables::{Family, Link, Mac, NftError};

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x100);
const PORT: u16 = 7777;
const FORWARD_TABLE: &str = "ccm_ho_fwd";
const QUIET_TABLE: &str = "ccm_ho_quiet";
/// Short, so that the test sees flows outlive it while they are active.
const FLOW_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_FLOWS: u32 = 1024;

/// One host of the test's network: its name (of its namespace's suffix and its bridge port), and the
/// addresses of its `eth0`.
struct Host {
    name: &'static str,
    mac: Mac,
    ip4: Ipv4Addr,
    ip6: Ipv6Addr,
}

const CLIENT: Host = Host {
    name: "client",
    mac: [0x02, 0x77, 0, 0, 0, 0x01],
    ip4: Ipv4Addr::new(10, 77, 0, 1),
    ip6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1),
};

const OLD: Host = Host {
    name: "old",
    mac: [0x02, 0x77, 0, 0, 0, 0x02],
    ip4: Ipv4Addr::new(10, 77, 0, 2),
    ip6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2),
};

const NEW: Host = Host {
    name: "new",
    mac: [0x02, 0x77, 0, 0, 0, 0x03],
    ip4: Ipv4Addr::new(10, 77, 0, 3),
    ip6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 3),
};

fn mac_text(mac: &Mac) -> String {
    mac.iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs a command (words split on spaces), panicking with its error output when it fails.
fn run(command: &str) -> String {
    let words: Vec<&str> = command.split(' ').collect();
    let output = Command::new(words[0])
        .args(&words[1..])
        .output()
        .unwrap_or_else(|err| panic!("{command}: {err}"));
    assert!(
        output.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The network namespaces, deleted when this is dropped (also after a failed assertion): the bridge
/// and the veth pairs go with them.
struct Lab {
    prefix: String,
}

impl Lab {
    /// The network of the test `tag` (one letter: the tests of this file run at once).
    fn build(tag: &str) -> Lab {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root (network namespaces, CAP_NET_ADMIN, CAP_NET_RAW); run it as root, as CI does"
        );
        let lab = Lab {
            prefix: format!("ccmho{}{tag}", std::process::id() % 100_000),
        };
        // What an earlier run with this process ID left, if it was killed.
        lab.remove();
        let switch = lab.switch();
        run(&format!("ip netns add {switch}"));
        run(&format!("ip -n {switch} link add br0 type bridge"));
        run(&format!("ip -n {switch} link set br0 up"));
        for host in [&CLIENT, &OLD, &NEW] {
            let ns = lab.ns(host);
            run(&format!("ip netns add {ns}"));
            // No duplicate address detection: the addresses are usable at once.
            run(&format!(
                "ip netns exec {ns} sysctl -q -w net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0"
            ));
            run(&format!(
                "ip -n {switch} link add {} type veth peer name eth0 netns {ns}",
                host.name
            ));
            run(&format!(
                "ip -n {switch} link set {} master br0 up",
                host.name
            ));
            run(&format!(
                "ip -n {ns} link set eth0 address {}",
                mac_text(&host.mac)
            ));
            run(&format!("ip -n {ns} address add {}/24 dev eth0", host.ip4));
            run(&format!(
                "ip -n {ns} address add {}/64 dev eth0 nodad",
                host.ip6
            ));
            run(&format!("ip -n {ns} link set lo up"));
            run(&format!("ip -n {ns} link set eth0 up"));
        }
        lab
    }

    fn switch(&self) -> String {
        format!("{}-switch", self.prefix)
    }

    fn ns(&self, host: &Host) -> String {
        format!("{}-{}", self.prefix, host.name)
    }

    fn remove(&self) {
        for ns in [
            self.switch(),
            self.ns(&CLIENT),
            self.ns(&OLD),
            self.ns(&NEW),
        ] {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }

    /// Puts the VIPs on `host`'s `eth0`.
    fn add_vips(&self, host: &Host) {
        let ns = self.ns(host);
        run(&format!("ip -n {ns} address add {VIP4}/32 dev eth0"));
        run(&format!("ip -n {ns} address add {VIP6}/128 dev eth0 nodad"));
    }

    /// The MAC address `host` has for `ip` in its neighbour table, if any.
    fn neighbour(&self, host: &Host, ip: IpAddr) -> Option<String> {
        let shown = run(&format!("ip -n {} neigh show {ip} dev eth0", self.ns(host)));
        let mut words = shown.split_whitespace();
        words.find(|word| *word == "lladdr")?;
        words.next().map(str::to_owned)
    }

    /// `nft list ...` in `host`'s namespace.
    fn nft_list(&self, host: &Host, what: &str) -> String {
        run(&format!("ip netns exec {} nft list {what}", self.ns(host)))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Moves the calling thread into the network namespace `ns` (made by `ip netns add`).
fn enter(ns: &str) {
    let file = File::open(format!("/var/run/netns/{ns}"))
        .unwrap_or_else(|err| panic!("network namespace {ns}: {err}"));
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .unwrap_or_else(|err| panic!("entering the network namespace {ns}: {err}"));
}

/// Runs `f` on a thread of its own in the network namespace `ns`: the sockets it opens are that
/// namespace's.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter(ns);
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A TCP server on every address of a host, port [`PORT`], one thread per connection, answering each
/// line with the line prefixed by the host's name.
struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    fn start(lab: &Lab, host: &'static Host) -> EchoServer {
        // `[::]` takes IPv4 too (as `::ffff:a.b.c.d`).
        let listener = in_netns(&lab.ns(host), || {
            TcpListener::bind((Ipv6Addr::UNSPECIFIED, PORT)).unwrap()
        });
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        std::thread::spawn(move || echo(stream, host.name));
                    }
                    Err(err) if err.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(err) => panic!("{}: accept: {err}", host.name),
                }
            }
        });
        EchoServer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn echo(stream: TcpStream, host: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|read| read > 0) {
        if writer
            .write_all(format!("{host}: {line}").as_bytes())
            .is_err()
        {
            return;
        }
        line.clear();
    }
}

/// A connection of the client's to a VIP.
struct Connection {
    name: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    asked: usize,
}

impl Connection {
    fn open(lab: &Lab, vip: IpAddr, name: &str) -> Connection {
        let address = SocketAddr::new(vip, PORT);
        let stream = in_netns(&lab.ns(&CLIENT), || {
            TcpStream::connect_timeout(&address, Duration::from_secs(5))
        })
        .unwrap_or_else(|err| panic!("{name}: connecting to {address}: {err}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Connection {
            name: name.to_owned(),
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
            asked: 0,
        }
    }

    /// One round trip: the name of the host that answered.
    fn ask(&mut self) -> String {
        self.asked += 1;
        let question = format!("{} {}", self.name, self.asked);
        writeln!(self.writer, "{question}")
            .unwrap_or_else(|err| panic!("{question}: sending: {err}"));
        let mut answer = String::new();
        let read = self
            .reader
            .read_line(&mut answer)
            .unwrap_or_else(|err| panic!("{question}: no answer: {err}"));
        assert!(read > 0, "{question}: the connection was closed");
        let (host, echoed) = answer
            .trim_end()
            .split_once(": ")
            .unwrap_or_else(|| panic!("{question}: a strange answer {answer:?}"));
        assert_eq!(echoed, question);
        host.to_owned()
    }

    /// `rounds` round trips, each answered by `host`.
    fn assert_answered_by(&mut self, host: &Host, rounds: usize) {
        for _ in 0..rounds {
            assert_eq!(self.ask(), host.name, "{} {}", self.name, self.asked);
        }
    }
}

/// The ICMPv6 checksum of `message` from `source` to `destination` (RFC 4443 §2.3).
fn icmpv6_checksum(source: Ipv6Addr, destination: Ipv6Addr, message: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let length = (message.len() as u32).to_be_bytes();
    for part in [
        &source.octets()[..],
        &destination.octets()[..],
        &length[..],
        &[0, 0, 0, 58][..],
        message,
    ] {
        for word in part.chunks(2) {
            sum += u32::from(word[0]) << 8 | u32::from(*word.get(1).unwrap_or(&0));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet frame carrying an ARP packet for IPv4 over Ethernet.
fn arp(
    destination: Mac,
    operation: u16,
    sender: (Mac, Ipv4Addr),
    target: (Mac, Ipv4Addr),
) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&destination);
    frame.extend_from_slice(&sender.0);
    frame.extend_from_slice(&0x0806u16.to_be_bytes());
    frame.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    frame.extend_from_slice(&operation.to_be_bytes());
    frame.extend_from_slice(&sender.0);
    frame.extend_from_slice(&sender.1.octets());
    frame.extend_from_slice(&target.0);
    frame.extend_from_slice(&target.1.octets());
    frame
}

/// An Ethernet frame carrying an ICMPv6 neighbour discovery message (hop limit 255): `kind` (135
/// solicitation, 136 advertisement), `flags` (the first byte after the checksum), the target, and
/// one link-layer address option (`option` 1 source, 2 target) with `from`.
fn neighbour_discovery(
    to: (Mac, Ipv6Addr),
    from: (Mac, Ipv6Addr),
    kind: u8,
    flags: u8,
    target: Ipv6Addr,
    option: u8,
) -> Vec<u8> {
    let mut message = vec![kind, 0, 0, 0, flags, 0, 0, 0];
    message.extend_from_slice(&target.octets());
    message.extend_from_slice(&[option, 1]);
    message.extend_from_slice(&from.0);
    let checksum = icmpv6_checksum(from.1, to.1, &message);
    message[2..4].copy_from_slice(&checksum.to_be_bytes());
    let mut frame = Vec::new();
    frame.extend_from_slice(&to.0);
    frame.extend_from_slice(&from.0);
    frame.extend_from_slice(&0x86ddu16.to_be_bytes());
    frame.extend_from_slice(&[0x60, 0, 0, 0]);
    frame.extend_from_slice(&(message.len() as u16).to_be_bytes());
    frame.extend_from_slice(&[58, 255]);
    frame.extend_from_slice(&from.1.octets());
    frame.extend_from_slice(&to.1.octets());
    frame.extend(message);
    frame
}

/// An `AF_PACKET` channel on `eth0` of the calling thread's namespace.
fn channel() -> (
    Box<dyn pnet_datalink::DataLinkSender>,
    Box<dyn pnet_datalink::DataLinkReceiver>,
) {
    let eth0 = pnet_datalink::interfaces()
        .into_iter()
        .find(|link| link.name == "eth0")
        .expect("eth0");
    let config = pnet_datalink::Config {
        read_timeout: Some(Duration::from_millis(20)),
        ..Default::default()
    };
    match pnet_datalink::channel(&eth0, config) {
        Ok(pnet_datalink::Channel::Ethernet(sender, receiver)) => (sender, receiver),
        Ok(_) => panic!("not an Ethernet channel"),
        Err(err) => panic!("an AF_PACKET socket on eth0 (CAP_NET_RAW): {err}"),
    }
}

/// Announces the VIPs from `host` as a new holder does: a gratuitous ARP request, an unsolicited
/// neighbour advertisement with the override flag.
fn announce(lab: &Lab, host: &Host) {
    let all_nodes = ([0x33, 0x33, 0, 0, 0, 1], "ff02::1".parse().unwrap());
    let frames = [
        arp([0xff; 6], 1, (host.mac, VIP4), ([0xff; 6], VIP4)),
        neighbour_discovery(all_nodes, (host.mac, VIP6), 136, 0x20, VIP6, 2),
    ];
    in_netns(&lab.ns(host), || {
        let (mut sender, _) = channel();
        for frame in &frames {
            sender.send_to(frame, None).unwrap().unwrap();
        }
    });
}

/// The MAC addresses that answer the client's neighbour solicitation for `vip` (an ARP request, or a
/// neighbour solicitation to the VIP's solicited-node group) within half a second.
fn who_answers(lab: &Lab, vip: IpAddr) -> BTreeSet<String> {
    let request = match vip {
        IpAddr::V4(vip) => arp([0xff; 6], 1, (CLIENT.mac, CLIENT.ip4), ([0; 6], vip)),
        IpAddr::V6(vip) => {
            let o = vip.octets();
            let group: Ipv6Addr = format!("ff02::1:ff{:02x}:{:02x}{:02x}", o[13], o[14], o[15])
                .parse()
                .unwrap();
            let group_mac = [0x33, 0x33, 0xff, o[13], o[14], o[15]];
            neighbour_discovery((group_mac, group), (CLIENT.mac, CLIENT.ip6), 135, 0, vip, 1)
        }
    };
    in_netns(&lab.ns(&CLIENT), || {
        let (mut sender, mut receiver) = channel();
        sender.send_to(&request, None).unwrap().unwrap();
        let mut answered = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            let Ok(frame) = receiver.next() else {
                continue;
            };
            let answer = match vip {
                // An ARP reply whose sender IP is the VIP.
                IpAddr::V4(vip) => {
                    frame.get(12..14) == Some(&[0x08, 0x06])
                        && frame.get(20..22) == Some(&[0, 2])
                        && frame.get(28..32) == Some(&vip.octets())
                }
                // A neighbour advertisement whose target is the VIP.
                IpAddr::V6(vip) => {
                    frame.get(12..14) == Some(&[0x86, 0xdd])
                        && frame.get(20) == Some(&58)
                        && frame.get(54) == Some(&136)
                        && frame.get(62..78) == Some(&vip.octets())
                }
            };
            if answer {
                let mut mac = [0; 6];
                mac.copy_from_slice(&frame[6..12]);
                answered.insert(mac_text(&mac));
            }
        }
        answered
    })
}

fn set(macs: &[&Mac]) -> BTreeSet<String> {
    macs.iter().map(|mac| mac_text(mac)).collect()
}

/// Waits up to `timeout` for `condition`.
fn eventually(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connections_opened_on_the_old_host_survive_the_hand_over() {
    let started = Instant::now();
    let lab = Lab::build("h");
    let _old_server = EchoServer::start(&lab, &OLD);
    let _new_server = EchoServer::start(&lab, &NEW);
    lab.add_vips(&OLD);
    let (vip4, vip6) = (IpAddr::V4(VIP4), IpAddr::V6(VIP6));

    // Before: the old host holds the VIPs.
    let mut old4 = Connection::open(&lab, vip4, "old-4");
    let mut old6 = Connection::open(&lab, vip6, "old-6");
    old4.assert_answered_by(&OLD, 2);
    old6.assert_answered_by(&OLD, 2);
    assert_eq!(who_answers(&lab, vip4), set(&[&OLD.mac]));
    assert_eq!(who_answers(&lab, vip6), set(&[&OLD.mac]));

    // The old host goes quiet; the new one looks its interface up and forwards the old flows.
    let link_local = in_netns(&lab.ns(&OLD), || nftables::link_local("eth0"))
        .unwrap()
        .expect("the old host has a link-local address");
    assert!(link_local.is_unicast_link_local(), "{link_local}");
    let quiet =
        nftables::quiet_neighbour_answers_batch(QUIET_TABLE, &[vip4, vip6], Some(link_local))
            .unwrap();
    in_netns(&lab.ns(&OLD), || nftables::apply(&quiet)).unwrap();
    let old_link = in_netns(&lab.ns(&OLD), || nftables::link("eth0")).unwrap();
    let new_link = in_netns(&lab.ns(&NEW), || nftables::link("eth0")).unwrap();
    assert_eq!(old_link.mac, OLD.mac);
    assert_eq!(new_link.mac, NEW.mac);
    assert_eq!(new_link.name, "eth0");
    let holders = [(vip4, old_link.mac), (vip6, old_link.mac)];
    let forward = |timeout| {
        nftables::forward_old_flows_batch(FORWARD_TABLE, &new_link, &holders, timeout, MAX_FLOWS)
            .unwrap()
    };
    let install = forward(FLOW_TIMEOUT);
    in_netns(&lab.ns(&NEW), || nftables::apply(&install)).unwrap();
    // Installing again replaces the table (in one transaction).
    in_netns(&lab.ns(&NEW), || nftables::apply(&install)).unwrap();

    // A batch the kernel refuses names the message, and changes nothing: the table installed stays.
    let refused = forward(Duration::from_millis(u64::MAX));
    let err = in_netns(&lab.ns(&NEW), || nftables::apply(&refused)).unwrap_err();
    assert!(
        matches!(&err, NftError::Refused { message, errno } if message.contains("adding set seen4") && *errno == 34),
        "{err}"
    );
    eprintln!("a refused batch: {err}");
    assert!(
        lab.nft_list(&NEW, "tables")
            .contains("table netdev ccm_ho_fwd")
    );
    let ruleset = lab.nft_list(&NEW, "ruleset");
    eprintln!("the new host's ruleset:\n{ruleset}");
    for expected in [
        "type ipv4_addr . inet_service . ipv4_addr . inet_service",
        "type ipv6_addr . inet_service . ipv6_addr . inet_service",
        "flags dynamic,timeout",
        "timeout 2s",
        "type filter hook ingress device \"eth0\" priority -500; policy accept;",
        "ip daddr 10.77.0.100 ip saddr . tcp sport . ip daddr . tcp dport @seen4 update @seen4 { ip saddr . tcp sport . ip daddr . tcp dport } accept",
        "ip daddr 10.77.0.100 meta l4proto tcp ether saddr set 02:77:00:00:00:03 ether daddr set 02:77:00:00:00:02 fwd to \"eth0\"",
        "ip6 daddr fd77::100 meta l4proto tcp ether saddr set 02:77:00:00:00:03 ether daddr set 02:77:00:00:00:02 fwd to \"eth0\"",
    ] {
        assert!(
            ruleset.contains(expected),
            "{expected:?} not in the ruleset"
        );
    }
    let ruleset = lab.nft_list(&OLD, "ruleset");
    eprintln!("the old host's ruleset:\n{ruleset}");
    assert!(ruleset.contains("arp operation request arp daddr ip 10.77.0.100 drop"));
    assert!(ruleset.contains("table ip6 ccm_ho_quiet"));

    // The new host takes the VIPs and announces them: the client's neighbour entries follow.
    lab.add_vips(&NEW);
    announce(&lab, &NEW);
    let new_mac = mac_text(&NEW.mac);
    eventually(
        "the client learns the new host's MAC",
        Duration::from_secs(3),
        || {
            lab.neighbour(&CLIENT, vip4).as_ref() == Some(&new_mac)
                && lab.neighbour(&CLIENT, vip6).as_ref() == Some(&new_mac)
        },
    );

    // The connections opened on the old host: through the new host, still answered by the old one.
    old4.assert_answered_by(&OLD, 5);
    old6.assert_answered_by(&OLD, 5);
    // New connections: the new host's.
    let mut new4 = Connection::open(&lab, vip4, "new-4");
    let mut new6 = Connection::open(&lab, vip6, "new-6");
    new4.assert_answered_by(&NEW, 5);
    new6.assert_answered_by(&NEW, 5);
    // Only the new host answers for the VIPs now.
    assert_eq!(who_answers(&lab, vip4), set(&[&NEW.mac]));
    assert_eq!(who_answers(&lab, vip6), set(&[&NEW.mac]));
    // Flows stay where they began for longer than the flow timeout while they are active (each
    // packet of a flow that began here refreshes its entry).
    let deadline = Instant::now() + FLOW_TIMEOUT + Duration::from_secs(1);
    while Instant::now() < deadline {
        old4.assert_answered_by(&OLD, 1);
        old6.assert_answered_by(&OLD, 1);
        new4.assert_answered_by(&NEW, 1);
        new6.assert_answered_by(&NEW, 1);
        std::thread::sleep(Duration::from_millis(250));
    }
    // The old host has to ask for the client's MAC address again while it answers from the VIP: it
    // asks from 0.0.0.0, so the client learns nothing from the question (asked from the VIP, the
    // client would take the old host for the VIP's holder again).
    // The same for IPv6, from its link-local address.
    run(&format!("ip -n {} neigh flush dev eth0", lab.ns(&OLD)));
    old4.assert_answered_by(&OLD, 2);
    old6.assert_answered_by(&OLD, 2);
    for client in [IpAddr::V4(CLIENT.ip4), IpAddr::V6(CLIENT.ip6)] {
        assert!(
            lab.neighbour(&OLD, client).is_some(),
            "the old host asked for the client's {client} again"
        );
    }
    // The client never went back to the old host's MAC.
    assert_eq!(lab.neighbour(&CLIENT, vip4), Some(new_mac.clone()));
    assert_eq!(lab.neighbour(&CLIENT, vip6), Some(new_mac));

    // Removing: every table goes, and removing what is not there is no error.
    for _ in 0..2 {
        let forward = nftables::delete_table_batch(Family::Netdev, FORWARD_TABLE).unwrap();
        in_netns(&lab.ns(&NEW), || nftables::apply(&forward)).unwrap();
        let quiet = nftables::quiet_neighbour_answers_batch(QUIET_TABLE, &[], None).unwrap();
        in_netns(&lab.ns(&OLD), || nftables::apply(&quiet)).unwrap();
    }
    assert_eq!(lab.nft_list(&NEW, "tables"), "");
    assert_eq!(lab.nft_list(&OLD, "tables"), "");
    eprintln!("the test took {:?}", started.elapsed());
}

/// An interface that is not there, or not Ethernet, is named in the error.
#[test]
fn a_link_that_is_missing_or_not_ethernet_is_an_error() {
    let lab = Lab::build("l");
    in_netns(&lab.ns(&CLIENT), || {
        let missing = nftables::link("nosuch0").unwrap_err();
        assert_eq!(missing.to_string(), "interface nosuch0: no such interface");
        let loopback = nftables::link("lo").unwrap_err();
        assert!(
            loopback.to_string().contains("not an Ethernet interface"),
            "{loopback}"
        );
        let eth0: Link = nftables::link("eth0").unwrap();
        assert_eq!(eth0.mac, CLIENT.mac);
    });
}
