//! Optional, off by default: VIPs outside the loopback range put on a network interface of the leader's
//! machine while their load balancer runs, and taken off when it is deleted or the leader steps down, so
//! the next leader can put them on its own machine.
//!
//! Turned on by `loadBalancer.vipInterface` (or `--local-vip-interface`). Loopback VIPs (127.0.0.0/8,
//! `::1`) are never touched: any process can bind them already.
//!
//! The addresses go on and come off through rtnetlink (`RTM_NEWADDR` and `RTM_DELADDR`, what `ip address
//! add|del` sends), which needs `CAP_NET_ADMIN` and no `ip` command, so it works from the distroless image.
//! What the kernel answered is read from the errno, never from a message text: `EEXIST` on an add means
//! the interface has the address already, and it is taken over (so a VIP left behind by a killed leader
//! is taken back, and comes off with its load balancer); `EADDRNOTAVAIL` on a delete means it is gone
//! already, which is what the delete wanted.
//!
//! A VIP put on (or taken over) is announced to the link's neighbours ([`crate::announce`]: gratuitous
//! ARP, unsolicited neighbour advertisement), so they stop sending it to the host that held it before:
//! one round at once, [`announce::ROUNDS`] in all, [`announce::INTERVAL`] apart, the later ones in the
//! background and stopped when the VIP comes off. Announcing needs `CAP_NET_RAW`; without it (or on
//! any other failure) the VIP stays on all the same, the failure is logged once per VIP as a warning,
//! and the add returns it for the caller to report.
//!
//! All netlink work runs in order on one thread of its own (`vip-netlink`, started with the first
//! request), on a small runtime of its own. So a request is carried out even when its caller is dropped
//! half-way (an ensure abandoned after a lost lease), and taking every VIP off can be waited for from
//! synchronous code, also while the manager's runtime shuts down
//! ([`AddressManager::remove_all_now`]). After that, adds are refused until [`AddressManager::resume`]:
//! a VIP put on by an ensure still running after the step-down would stay behind.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    panic::AssertUnwindSafe,
    sync::Mutex,
    time::Duration,
};

use futures::{FutureExt, TryStreamExt};
use rtnetlink::{
    AddressMessageBuilder,
    packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage},
};
use tokio::sync::{mpsc, oneshot};

use crate::{announce, instances::lock, os_error};

/// How long one netlink request may take.
const NETLINK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`AddressManager::remove_all_now`] waits for the VIPs to come off.
const REMOVE_ALL_WAIT: Duration = Duration::from_secs(10);

/// `ENODEV`: the kernel's answer for an interface name it does not know (`std::io::ErrorKind` has no
/// kind for it; the value is the same on every Linux architecture).
const ENODEV: i32 = 19;

/// Adds and removes VIPs on one interface, remembering what it added or took over (and only removing
/// that).
#[derive(Debug)]
pub(crate) struct AddressManager {
    interface: String,
    /// The queue of the `vip-netlink` thread, once started.
    worker: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    /// Sends a round of announcements ([`announce::announce`]; another function in tests).
    announce: announce::Announce,
    /// What the `vip-netlink` thread has put on the interface (or taken over), as of its last job.
    held: std::sync::Arc<Mutex<BTreeSet<IpAddr>>>,
}

/// What a job ended with: for an add, the warning of a VIP put on but not announced.
type Outcome = Result<Option<String>, String>;

/// A request to the `vip-netlink` thread.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// Put the VIP on the interface (refused after `RemoveAll` until `Resume`), and announce it.
    Add(IpAddr),
    /// Put the VIP on the interface as `Add` does, without announcing it (yet).
    PutOn(IpAddr),
    /// Announce a VIP on the interface (as `Add` does after putting it on).
    Announce(IpAddr),
    /// Take it off, if it was added.
    Remove(IpAddr),
    /// Take off every VIP added, and refuse further adds.
    RemoveAll,
    /// Accept adds again (a new leadership).
    Resume,
    /// Stop announcing (the rounds still to come are dropped) and refuse further adds, keeping the
    /// VIPs on the interface: another host serves them now, and this one only finishes its open
    /// connections ([`crate::leader_handoff`]).
    Quiet,
    /// Take over the host addresses the interface has in these ranges (left by an earlier run that did
    /// not clean up), so they come off unless added again.
    Adopt(Vec<crate::AddressRange>),
}

#[derive(Debug)]
struct Job {
    op: Op,
    reply: Reply,
}

/// Where the outcome of a job goes: an awaiting task, or a waiting thread.
#[derive(Debug)]
enum Reply {
    Task(oneshot::Sender<Outcome>),
    Thread(std::sync::mpsc::SyncSender<Outcome>),
    /// The addresses an `Adopt` took over.
    Adopted(oneshot::Sender<Result<Vec<IpAddr>, String>>),
    None,
}

impl Reply {
    fn send(self, result: Outcome) {
        // A caller that went away no longer wants the outcome; the work is done all the same.
        match self {
            Reply::Task(tx) => drop(tx.send(result)),
            Reply::Thread(tx) => drop(tx.try_send(result)),
            Reply::Adopted(_) | Reply::None => {}
        }
    }
}

impl AddressManager {
    pub(crate) fn new(interface: String) -> Self {
        Self {
            interface,
            worker: Mutex::new(None),
            announce: announce::announce,
            held: Default::default(),
        }
    }

    /// This manager, sending its announcements with `announce` (a test's stand-in).
    #[cfg(test)]
    pub(crate) fn with_announcer(mut self, announce: announce::Announce) -> Self {
        self.announce = announce;
        self
    }

    /// The interface the VIPs go on.
    pub(crate) fn interface(&self) -> &str {
        &self.interface
    }

    /// The VIPs on the interface now, as this manager put them there (or took them over).
    pub(crate) fn held(&self) -> BTreeSet<IpAddr> {
        lock(&self.held).clone()
    }

    /// Whether `ip` is one this manager puts on the interface.
    pub(crate) fn manages(ip: IpAddr) -> bool {
        !ip.is_loopback()
    }

    /// Puts `ip` on the interface unless it is loopback or already added by this manager. An address
    /// the interface already has counts as added (and comes off with its load balancer). Either way it
    /// is announced to the link's neighbours; `Ok(Some(warning))` when that failed (the VIP is on all
    /// the same): what was not sent, why, and what follows, for the caller to report.
    pub(crate) async fn add(&self, ip: IpAddr) -> Result<Option<String>, String> {
        if !Self::manages(ip) {
            return Ok(None);
        }
        self.request(Op::Add(ip)).await
    }

    /// Puts `ip` on the interface as [`AddressManager::add`] does, without announcing it: the leader
    /// binds its listeners first, then [`AddressManager::announce`]s it, so that no neighbour is sent
    /// here before this host accepts (the previous holder answers meanwhile).
    pub(crate) async fn put_on(&self, ip: IpAddr) -> Result<(), String> {
        if !Self::manages(ip) {
            return Ok(());
        }
        self.request(Op::PutOn(ip)).await.map(|_| ())
    }

    /// Announces `ip` if [`AddressManager::put_on`] put it on and it was not announced since (and this
    /// manager is not stepping down); `Ok(Some(warning))` when the announcement was not sent, as for
    /// [`AddressManager::add`].
    pub(crate) async fn announce(&self, ip: IpAddr) -> Result<Option<String>, String> {
        if !Self::manages(ip) {
            return Ok(None);
        }
        self.request(Op::Announce(ip)).await
    }

    /// Takes `ip` off the interface if this manager added it; a failure is logged (and the VIP is tried
    /// again when the leader steps down).
    pub(crate) async fn remove(&self, ip: IpAddr) {
        if let Err(err) = self.request(Op::Remove(ip)).await {
            tracing::warn!(%ip, interface = %self.interface, error = %err, "cannot remove the VIP from the interface");
        }
    }

    /// Takes every address this manager added off the interface (the leader steps down), and refuses
    /// adds from then on, until [`AddressManager::resume`]. Blocks the calling thread until that is done
    /// (one netlink round trip per VIP, well under a millisecond each; at most [`REMOVE_ALL_WAIT`]), so
    /// it can run where nothing can be awaited any more: in a task the runtime drops as it shuts down.
    pub(crate) fn remove_all_now(&self) {
        let Some(worker) = lock(&self.worker).clone() else {
            return; // nothing was ever added
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job = Job {
            op: Op::RemoveAll,
            reply: Reply::Thread(tx),
        };
        if worker.send(job).is_err() || rx.recv_timeout(REMOVE_ALL_WAIT).is_err() {
            tracing::warn!(interface = %self.interface, wait = ?REMOVE_ALL_WAIT, "the VIPs may still be on the interface: the netlink thread did not confirm their removal");
        }
    }

    /// Accepts adds again after [`AddressManager::remove_all_now`] (a new leadership of this process).
    pub(crate) fn resume(&self) {
        if let Some(worker) = lock(&self.worker).clone() {
            let _ = worker.send(Job {
                op: Op::Resume,
                reply: Reply::None,
            });
        }
    }

    /// Stops announcing the VIPs (the rounds of announcements still to come are dropped) and refuses
    /// adds, but leaves the VIPs on the interface, until [`AddressManager::remove_all_now`]: a leader
    /// handing its VIPs to the next one keeps their open connections
    /// ([`crate::leader_handoff`]).
    pub(crate) async fn go_quiet(&self) {
        if lock(&self.worker).is_none() {
            return; // nothing was ever added
        }
        if let Err(err) = self.request(Op::Quiet).await {
            tracing::warn!(interface = %self.interface, error = %err, "cannot stop announcing the VIPs");
        }
    }

    /// Takes over the host addresses (`/32`, `/128`) the interface has in `ranges`: a node agent's
    /// start, after a run that was killed with its VIPs on. They are then this manager's: removed by
    /// [`AddressManager::remove`] or at [`AddressManager::remove_all_now`]. Returns them.
    pub(crate) async fn adopt(
        &self,
        ranges: Vec<crate::AddressRange>,
    ) -> Result<Vec<IpAddr>, String> {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            op: Op::Adopt(ranges),
            reply: Reply::Adopted(tx),
        };
        self.worker()?.send(job).map_err(|_| self.worker_gone())?;
        rx.await.map_err(|_| self.worker_gone())?
    }

    /// Runs `op` on the `vip-netlink` thread (started now if need be) and awaits its outcome.
    async fn request(&self, op: Op) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            op,
            reply: Reply::Task(tx),
        };
        self.worker()?.send(job).map_err(|_| self.worker_gone())?;
        rx.await.map_err(|_| self.worker_gone())?
    }

    fn worker_gone(&self) -> String {
        format!(
            "VIPs on interface {}: the netlink thread did not answer (it stopped, or the operation panicked: the log says which)",
            self.interface
        )
    }

    /// The queue of the `vip-netlink` thread, which is started on first use.
    fn worker(&self) -> Result<mpsc::UnboundedSender<Job>, String> {
        let mut worker = lock(&self.worker);
        if let Some(sender) = worker.as_ref() {
            return Ok(sender.clone());
        }
        let (sender, jobs) = mpsc::unbounded_channel();
        let state = Worker {
            interface: self.interface.clone(),
            added: BTreeSet::new(),
            adopted: BTreeSet::new(),
            stopped: false,
            unannounced: BTreeSet::new(),
            announce: self.announce,
            repeats: BTreeMap::new(),
            warned: BTreeSet::new(),
            held: self.held.clone(),
        };
        std::thread::Builder::new()
            .name("vip-netlink".to_owned())
            .spawn(move || state.run(jobs))
            .map_err(|err| format!("cannot start the netlink thread: {err}"))?;
        *worker = Some(sender.clone());
        Ok(sender)
    }
}

/// The state of the `vip-netlink` thread.
struct Worker {
    interface: String,
    /// What this manager put on the interface, or found there and took over.
    added: BTreeSet<IpAddr>,
    /// What `Adopt` found on the interface and no add asked for yet: removed like `added`, and
    /// announced when an add asks for it (its neighbours may know another holder by now).
    adopted: BTreeSet<IpAddr>,
    /// Set by `RemoveAll`: adds are refused until `Resume`.
    stopped: bool,
    /// What `PutOn` put on and no `Announce` announced yet.
    unannounced: BTreeSet<IpAddr>,
    announce: announce::Announce,
    /// The rounds of announcements still to come, by VIP (tasks on this thread's runtime), aborted when
    /// the VIP comes off: a later round would point the neighbours back at this host.
    repeats: BTreeMap<IpAddr, tokio::task::AbortHandle>,
    /// The VIPs whose announcement failed and was logged as a warning (once per VIP; again only after
    /// one was sent).
    warned: BTreeSet<IpAddr>,
    /// `added`, for [`AddressManager::held`]: updated after every job.
    held: std::sync::Arc<Mutex<BTreeSet<IpAddr>>>,
}

impl Worker {
    /// Carries out the jobs in order until every sender is gone (the cloud was dropped).
    fn run(mut self, mut jobs: mpsc::UnboundedReceiver<Job>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(err) => {
                let message = format!("cannot start the netlink thread's runtime: {err}");
                while let Some(job) = jobs.blocking_recv() {
                    job.reply.send(Err(message.clone()));
                }
                return;
            }
        };
        runtime.block_on(async {
            while let Some(Job { op, reply }) = jobs.recv().await {
                // A panic in one operation (a bug) fails that operation only (its reply is dropped,
                // and its caller told), not the thread every VIP goes through: the state it keeps
                // (which VIPs this process put on) must outlive it.
                let handled = AssertUnwindSafe(self.handle(op, reply)).catch_unwind().await;
                if let Err(panic) = handled {
                    let message = cloud_provider::panic_message(panic.as_ref());
                    tracing::error!(interface = %self.interface, "an operation on the VIPs panicked (a bug): {message}");
                }
            }
        });
    }

    /// Runs one job and replies to it.
    async fn handle(&mut self, op: Op, reply: Reply) {
        let result = match op {
            Op::Add(ip) => self.add(ip, true).await,
            Op::PutOn(ip) => {
                let new = !self.added.contains(&ip);
                let result = self.add(ip, false).await;
                if new && self.added.contains(&ip) {
                    self.unannounced.insert(ip);
                }
                result
            }
            Op::Announce(ip) => Ok(
                if self.unannounced.remove(&ip) && self.added.contains(&ip) && !self.stopped {
                    self.announce(ip)
                } else {
                    None
                },
            ),
            Op::Remove(ip) => self.remove(ip).await.map(|()| None),
            Op::RemoveAll => {
                self.remove_all().await;
                Ok(None)
            }
            Op::Resume => {
                self.stopped = false;
                Ok(None)
            }
            Op::Quiet => {
                self.stopped = true;
                for (_, repeat) in std::mem::take(&mut self.repeats) {
                    repeat.abort();
                }
                Ok(None)
            }
            Op::Adopt(ranges) => {
                let adopted = self.adopt(&ranges).await;
                if let Reply::Adopted(tx) = reply {
                    drop(tx.send(adopted));
                }
                return;
            }
        };
        lock(&self.held).clone_from(&self.added);
        reply.send(result);
    }

    /// Puts `ip` on the interface, then announces it if `announce`.
    async fn add(&mut self, ip: IpAddr, announce: bool) -> Outcome {
        if self.added.contains(&ip) {
            return Ok(None);
        }
        if !self.stopped && self.adopted.remove(&ip) {
            tracing::info!(%ip, interface = %self.interface, "VIP left on the interface by an earlier run: kept, and announced");
            self.added.insert(ip);
            return Ok(announce.then(|| self.announce(ip)).flatten());
        }
        let interface = self.interface.as_str();
        let fail = |what: String| format!("putting the VIP {ip} on interface {interface}: {what}");
        if self.stopped {
            return Err(fail(
                "this manager is stepping down (its VIPs were taken off)".to_owned(),
            ));
        }
        let netlink = Netlink::open().map_err(fail)?;
        let index = netlink
            .index_of(interface)
            .await
            .map_err(fail)?
            .ok_or_else(|| fail(format!("no interface named {interface}")))?;
        match netlink.add(index, ip).await {
            Ok(Added::New) => {
                tracing::info!(%ip, %interface, "VIP added to the interface");
            }
            Ok(Added::AlreadyThere) => {
                tracing::info!(%ip, %interface, "VIP already on the interface: taken over (it comes off with its load balancer)");
            }
            Err(Failure::NoAnswer(what)) => {
                // The kernel may have added it: it comes off with the rest.
                self.added.insert(ip);
                return Err(fail(what));
            }
            Err(Failure::Refused(what)) => return Err(fail(what)),
        }
        self.added.insert(ip);
        Ok(announce.then(|| self.announce(ip)).flatten())
    }

    /// Announces `ip`, just put on the interface or taken over: one round now, the others in the
    /// background until done or `ip` comes off. The warning when the round was not sent.
    fn announce(&mut self, ip: IpAddr) -> Option<String> {
        let interface = self.interface.as_str();
        match (self.announce)(interface, ip) {
            Ok(announce::Sent::Announced) => {
                tracing::debug!(%ip, %interface, "VIP announced to the link's neighbours");
                self.warned.remove(&ip);
                // Unsupervised: repeats of what was just sent, seconds long (it sleeps, sends);
                // a panic loses only those. Aborted when the VIP comes off.
                let repeat =
                    tokio::spawn(announce::repeat(self.announce, interface.to_owned(), ip));
                if let Some(earlier) = self.repeats.insert(ip, repeat.abort_handle()) {
                    earlier.abort();
                }
                None
            }
            Ok(announce::Sent::NoLinkLayer) => {
                tracing::debug!(%ip, %interface, "the interface has no link-layer address: nothing to announce");
                None
            }
            Err(not_sent) => {
                let warning = not_sent.warning();
                if self.warned.insert(ip) {
                    tracing::warn!(%ip, %interface, "{warning}");
                } else {
                    tracing::debug!(%ip, %interface, "{warning}");
                }
                Some(warning)
            }
        }
    }

    async fn adopt(&mut self, ranges: &[crate::AddressRange]) -> Result<Vec<IpAddr>, String> {
        let interface = self.interface.as_str();
        let fail = |what: String| format!("listing the addresses of interface {interface}: {what}");
        let netlink = Netlink::open().map_err(fail)?;
        let Some(index) = netlink.index_of(interface).await.map_err(fail)? else {
            return Err(fail(format!("no interface named {interface}")));
        };
        let found = netlink.host_addresses(index).await.map_err(fail)?;
        let adopted: Vec<IpAddr> = found
            .into_iter()
            .filter(|ip| ranges.iter().any(|r| r.contains(*ip)))
            .collect();
        for ip in &adopted {
            if !self.added.contains(ip) {
                tracing::info!(%ip, %interface, "an address of the pools was on the interface already: taken over (it comes off unless this node announces it)");
                self.adopted.insert(*ip);
            }
        }
        Ok(adopted)
    }

    async fn remove(&mut self, ip: IpAddr) -> Result<(), String> {
        if let Some(repeat) = self.repeats.remove(&ip) {
            repeat.abort();
        }
        self.unannounced.remove(&ip);
        if !self.added.contains(&ip) && !self.adopted.contains(&ip) {
            return Ok(());
        }
        let interface = self.interface.as_str();
        let fail = |what: String| format!("taking the VIP {ip} off interface {interface}: {what}");
        let netlink = Netlink::open().map_err(fail)?;
        match netlink.index_of(interface).await.map_err(fail)? {
            None => {
                tracing::info!(%ip, %interface, "the interface is gone, and the VIP with it");
            }
            Some(index) => match netlink.delete(index, ip).await {
                Ok(Removed::Now) => {
                    tracing::info!(%ip, %interface, "VIP removed from the interface");
                }
                Ok(Removed::NotThere) => {
                    tracing::info!(%ip, %interface, "VIP was not on the interface any more");
                }
                Err(Failure::NoAnswer(what) | Failure::Refused(what)) => return Err(fail(what)),
            },
        }
        self.added.remove(&ip);
        self.adopted.remove(&ip);
        Ok(())
    }

    async fn remove_all(&mut self) {
        self.stopped = true;
        let all: Vec<IpAddr> = self.added.union(&self.adopted).copied().collect();
        for ip in all {
            if let Err(err) = self.remove(ip).await {
                tracing::warn!(%ip, interface = %self.interface, error = %err, "cannot remove the VIP from the interface");
            }
        }
    }
}

/// How an add ended well.
#[derive(Debug, PartialEq, Eq)]
enum Added {
    New,
    /// `EEXIST`: the interface had the address already.
    AlreadyThere,
}

/// How a delete ended well.
#[derive(Debug, PartialEq, Eq)]
enum Removed {
    Now,
    /// `EADDRNOTAVAIL`: the interface did not have the address.
    NotThere,
}

/// How a request failed.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The kernel refused it (or it was never sent): nothing changed.
    Refused(String),
    /// No answer in time: it may have been carried out.
    NoAnswer(String),
}

/// A netlink connection of its own, driven by a task on the current runtime; the task ends when this is
/// dropped.
struct Netlink(rtnetlink::Handle);

impl Netlink {
    fn open() -> Result<Self, String> {
        let (connection, handle, _) = rtnetlink::new_connection()
            .map_err(|err| format!("cannot open a netlink socket: {err}"))?;
        // Watched: the connection serves this `Netlink` only (one per operation) and ends when it is
        // dropped; should it die first, this operation's requests fail or time out, and say so.
        tokio::spawn(connection);
        Ok(Self(handle))
    }

    /// The index of interface `name`; `None` when there is no such interface.
    async fn index_of(&self, name: &str) -> Result<Option<u32>, String> {
        let mut links = self.0.link().get().match_name(name.to_owned()).execute();
        match tokio::time::timeout(NETLINK_TIMEOUT, links.try_next()).await {
            Err(_) => Err(format!(
                "looking the interface up: no answer within {NETLINK_TIMEOUT:?}"
            )),
            Ok(Ok(link)) => Ok(link.map(|link| link.header.index)),
            Ok(Err(err)) if errno(&err) == Some(ENODEV) => Ok(None),
            Ok(Err(err)) => Err(format!("looking the interface up: {}", describe(&err))),
        }
    }

    /// The host addresses (`/32`, `/128`) of interface `index`.
    async fn host_addresses(&self, index: u32) -> Result<Vec<IpAddr>, String> {
        let list = self
            .0
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect::<Vec<AddressMessage>>();
        let messages = tokio::time::timeout(NETLINK_TIMEOUT, list)
            .await
            .map_err(|_| format!("no answer within {NETLINK_TIMEOUT:?}"))?
            .map_err(|err| describe(&err))?;
        Ok(messages
            .iter()
            .filter(|m| m.header.index == index)
            .filter_map(|m| {
                let ip = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let ip = ip.or_else(|| {
                    m.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                })?;
                (m.header.prefix_len == host_prefix(ip)).then_some(ip)
            })
            .collect())
    }

    async fn add(&self, index: u32, ip: IpAddr) -> Result<Added, Failure> {
        let mut request = self.0.address().add(index, ip, host_prefix(ip));
        *request.message_mut() = address_message(index, ip, true);
        match tokio::time::timeout(NETLINK_TIMEOUT, request.execute()).await {
            Err(_) => Err(Failure::NoAnswer(format!(
                "no answer within {NETLINK_TIMEOUT:?}"
            ))),
            Ok(answer) => add_answer(answer),
        }
    }

    async fn delete(&self, index: u32, ip: IpAddr) -> Result<Removed, Failure> {
        let request = self.0.address().del(address_message(index, ip, false));
        match tokio::time::timeout(NETLINK_TIMEOUT, request.execute()).await {
            Err(_) => Err(Failure::NoAnswer(format!(
                "no answer within {NETLINK_TIMEOUT:?}"
            ))),
            Ok(answer) => delete_answer(answer),
        }
    }
}

/// The name of the interface that has `ip` (the node's own address, for a node agent started without
/// `--interface`); `None` when no interface has it.
pub(crate) async fn interface_with(ip: IpAddr) -> Result<Option<String>, String> {
    let netlink = Netlink::open()?;
    let list = netlink
        .0
        .address()
        .get()
        .execute()
        .try_collect::<Vec<AddressMessage>>();
    let messages = tokio::time::timeout(NETLINK_TIMEOUT, list)
        .await
        .map_err(|_| format!("listing the addresses: no answer within {NETLINK_TIMEOUT:?}"))?
        .map_err(|err| format!("listing the addresses: {}", describe(&err)))?;
    let Some(index) = messages
        .iter()
        .find(|m| {
            m.attributes.iter().any(|a| {
                matches!(a, AddressAttribute::Local(x) | AddressAttribute::Address(x) if *x == ip)
            })
        })
        .map(|m| m.header.index)
    else {
        return Ok(None);
    };
    let mut links = netlink.0.link().get().match_index(index).execute();
    let link = tokio::time::timeout(NETLINK_TIMEOUT, links.try_next())
        .await
        .map_err(|_| format!("looking interface {index} up: no answer within {NETLINK_TIMEOUT:?}"))?
        .map_err(|err| format!("looking interface {index} up: {}", describe(&err)))?;
    Ok(link.and_then(|link| {
        link.attributes.into_iter().find_map(|a| match a {
            rtnetlink::packet_route::link::LinkAttribute::IfName(name) => Some(name),
            _ => None,
        })
    }))
}

/// The prefix length of `ip` as a host address: `/32` or `/128`.
fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// The message that adds (`adding`) or deletes `ip` as a host address on interface `index`, as `ip
/// address add|del <ip>/32|128 dev <interface>` sends it. An IPv6 address is added with `IFA_F_NODAD`
/// (iproute2's `nodad`): duplicate address detection would keep it "tentative", and unbindable, for a
/// second or more after it is added.
fn address_message(index: u32, ip: IpAddr, adding: bool) -> AddressMessage {
    let prefix = host_prefix(ip);
    match ip {
        IpAddr::V4(ip) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(ip, prefix)
            .build(),
        IpAddr::V6(ip) => {
            let mut message = AddressMessageBuilder::<Ipv6Addr>::new()
                .index(index)
                .address(ip, prefix)
                .build();
            if adding {
                message.header.flags = AddressHeaderFlags::Nodad;
            }
            message
        }
    }
}

/// The errno the kernel answered a request with, if it answered with one.
fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(message) => message.code.map(|code| code.get().abs()),
        _ => None,
    }
}

/// What went wrong, in words: for a kernel answer the errno's meaning and number (the C library's text
/// for it, not a message of the kernel's), with what to do about a permission error.
fn describe(err: &rtnetlink::Error) -> String {
    match errno(err) {
        Some(code) => os_error::describe(&io::Error::from_raw_os_error(code), "CAP_NET_ADMIN"),
        None => err.to_string(),
    }
}

/// The outcome of an add, from the kernel's answer: `EEXIST` means the address is there already.
fn add_answer(answer: Result<(), rtnetlink::Error>) -> Result<Added, Failure> {
    outcome(
        answer,
        Added::New,
        (io::ErrorKind::AlreadyExists, Added::AlreadyThere),
    )
}

/// The outcome of a delete, from the kernel's answer: `EADDRNOTAVAIL` means the address is not there.
fn delete_answer(answer: Result<(), rtnetlink::Error>) -> Result<Removed, Failure> {
    outcome(
        answer,
        Removed::Now,
        (io::ErrorKind::AddrNotAvailable, Removed::NotThere),
    )
}

/// `done` when the kernel did it; `(kind, as_was)`: an error of that kind means it was so already.
fn outcome<T>(
    answer: Result<(), rtnetlink::Error>,
    done: T,
    (kind, as_was): (io::ErrorKind, T),
) -> Result<T, Failure> {
    match answer {
        Ok(()) => Ok(done),
        Err(err) => match errno(&err).map(|code| io::Error::from_raw_os_error(code).kind()) {
            Some(found) if found == kind => Ok(as_was),
            _ => Err(Failure::Refused(describe(&err))),
        },
    }
}

/// A throw-away interface for tests that put real addresses on one.
#[cfg(test)]
pub(crate) mod test_interface {
    use std::net::IpAddr;

    use futures::TryStreamExt;
    use rtnetlink::{
        LinkBridge, LinkDummy, LinkUnspec, LinkVeth,
        packet_route::{
            address::{AddressAttribute, AddressFlags},
            link::LinkAttribute,
        },
    };

    /// An interface of the host's network namespace named `ccmt<pid % 10000><suffix>`, deleted (with
    /// its addresses) when this is dropped, also when an assertion failed. A `dummy` interface, or a
    /// bridge without ports where the kernel has no dummy driver (as CI's machine); or one end of a
    /// veth pair, whose other end hears what is sent on it ([`TestInterface::create_veth`]). Creating
    /// it needs root (`CAP_NET_ADMIN`): a test that is not root fails and says so.
    pub(crate) struct TestInterface {
        name: String,
        index: u32,
        /// The other end of a veth pair (deleted with this end).
        peer: Option<String>,
    }

    /// One address of an interface, as the kernel lists it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Listed {
        pub(crate) ip: IpAddr,
        pub(crate) prefix: u8,
        pub(crate) nodad: bool,
    }

    /// Runs `f` with a netlink handle of its own, on a thread and runtime of its own (so it works from
    /// synchronous code, from `Drop`, and from within a test's runtime).
    pub(crate) fn with_netlink<T, F, Fut>(f: F) -> T
    where
        T: Send,
        F: FnOnce(rtnetlink::Handle) -> Fut + Send,
        Fut: Future<Output = T>,
    {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    runtime.block_on(async {
                        let (connection, handle, _) = rtnetlink::new_connection().unwrap();
                        tokio::spawn(connection);
                        f(handle).await
                    })
                })
                .join()
                .unwrap()
        })
    }

    fn is_permission_error(err: &rtnetlink::Error) -> bool {
        super::errno(err).is_some_and(|code| {
            std::io::Error::from_raw_os_error(code).kind() == std::io::ErrorKind::PermissionDenied
        })
    }

    fn not_created(name: &str, err: &rtnetlink::Error) -> ! {
        if is_permission_error(err) {
            panic!(
                "this test needs root (CAP_NET_ADMIN in the host network namespace): it creates the network interface {name} and puts test addresses on it; run it as root, as CI does ({err})"
            )
        }
        panic!("cannot create the test interface {name}: {err}")
    }

    impl TestInterface {
        pub(crate) fn create(suffix: &str) -> Self {
            let name = format!("ccmt{}{suffix}", std::process::id() % 10_000);
            let created = with_netlink(|handle| {
                let name = name.clone();
                async move {
                    // One left by an earlier run that was killed (and had this process ID).
                    if let Ok(Some(link)) = handle
                        .link()
                        .get()
                        .match_name(name.clone())
                        .execute()
                        .try_next()
                        .await
                    {
                        let _ = handle.link().del(link.header.index).execute().await;
                    }
                    let dummy = handle
                        .link()
                        .add(LinkDummy::new(&name).up().build())
                        .execute()
                        .await;
                    match dummy {
                        Err(err) if !is_permission_error(&err) => {
                            // No dummy driver in this kernel: a bridge without ports serves as well.
                            handle
                                .link()
                                .add(LinkBridge::new(&name).up().build())
                                .execute()
                                .await
                        }
                        other => other,
                    }?;
                    let link = handle
                        .link()
                        .get()
                        .match_name(name.clone())
                        .execute()
                        .try_next()
                        .await?
                        .expect("the interface just created");
                    Ok::<_, rtnetlink::Error>(link.header.index)
                }
            });
            match created {
                Ok(index) => Self {
                    name,
                    index,
                    peer: None,
                },
                Err(err) => not_created(&name, &err),
            }
        }

        /// A veth pair, both ends up: this end `ccmt<pid % 10000><suffix>`, the other (its
        /// [`TestInterface::peer`]) the same name and `p`.
        pub(crate) fn create_veth(suffix: &str) -> Self {
            let name = format!("ccmt{}{suffix}", std::process::id() % 10_000);
            let peer = format!("{name}p");
            let created = with_netlink(|handle| {
                let (name, peer) = (name.clone(), peer.clone());
                async move {
                    // A pair left by an earlier run that was killed (and had this process ID).
                    for stale in [&name, &peer] {
                        if let Ok(Some(link)) = handle
                            .link()
                            .get()
                            .match_name(stale.clone())
                            .execute()
                            .try_next()
                            .await
                        {
                            let _ = handle.link().del(link.header.index).execute().await;
                        }
                    }
                    handle
                        .link()
                        .add(LinkVeth::new(&name, &peer).up().build())
                        .execute()
                        .await?;
                    handle
                        .link()
                        .set(LinkUnspec::new_with_name(&peer).up().build())
                        .execute()
                        .await?;
                    let link = handle
                        .link()
                        .get()
                        .match_name(name.clone())
                        .execute()
                        .try_next()
                        .await?
                        .expect("the interface just created");
                    Ok::<_, rtnetlink::Error>(link.header.index)
                }
            });
            match created {
                Ok(index) => Self {
                    name,
                    index,
                    peer: Some(peer),
                },
                Err(err) => not_created(&name, &err),
            }
        }

        pub(crate) fn name(&self) -> &str {
            &self.name
        }

        /// The other end of a veth pair.
        pub(crate) fn peer(&self) -> &str {
            self.peer.as_deref().expect("a veth pair")
        }

        /// The interface's MAC address.
        pub(crate) fn mac(&self) -> [u8; 6] {
            let index = self.index;
            let link = with_netlink(|handle| async move {
                handle
                    .link()
                    .get()
                    .match_index(index)
                    .execute()
                    .try_next()
                    .await
            })
            .unwrap()
            .expect("the test interface");
            link.attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::Address(mac) => mac.as_slice().try_into().ok(),
                    _ => None,
                })
                .expect("an Ethernet address")
        }

        /// The interface's addresses (IPv6 link-local ones left out).
        pub(crate) fn addresses(&self) -> Vec<Listed> {
            let index = self.index;
            with_netlink(|handle| async move {
                let messages: Vec<_> = handle
                    .address()
                    .get()
                    .set_link_index_filter(index)
                    .execute()
                    .try_collect()
                    .await
                    .unwrap();
                messages
                    .into_iter()
                    .filter_map(|message| {
                        let ip = message.attributes.iter().find_map(|a| match a {
                            AddressAttribute::Local(ip) => Some(*ip),
                            _ => None,
                        });
                        let ip = ip.or_else(|| {
                            message.attributes.iter().find_map(|a| match a {
                                AddressAttribute::Address(ip) => Some(*ip),
                                _ => None,
                            })
                        })?;
                        let nodad = message.attributes.iter().any(|a| {
                            matches!(a, AddressAttribute::Flags(f) if f.contains(AddressFlags::Nodad))
                        });
                        let link_local = matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
                        (!link_local).then_some(Listed {
                            ip,
                            prefix: message.header.prefix_len,
                            nodad,
                        })
                    })
                    .collect()
            })
        }

        /// Whether the interface has `ip` (with any prefix).
        pub(crate) fn has(&self, ip: IpAddr) -> bool {
            self.addresses().iter().any(|a| a.ip == ip)
        }

        /// Puts `ip` on the interface as a host address, as someone else would.
        pub(crate) fn put(&self, ip: IpAddr) {
            let index = self.index;
            with_netlink(|handle| async move {
                handle
                    .address()
                    .add(index, ip, super::host_prefix(ip))
                    .execute()
                    .await
            })
            .unwrap();
        }

        /// Takes `ip` off the interface, as someone else would.
        pub(crate) fn take_off(&self, ip: IpAddr) {
            let index = self.index;
            with_netlink(|handle| async move {
                handle
                    .address()
                    .del(super::address_message(index, ip, false))
                    .execute()
                    .await
            })
            .unwrap();
        }
    }

    impl Drop for TestInterface {
        fn drop(&mut self) {
            let index = self.index;
            let deleted =
                with_netlink(|handle| async move { handle.link().del(index).execute().await });
            if let Err(err) = deleted {
                eprintln!("cannot delete the test interface {}: {err}", self.name);
            }
        }
    }
}

/// A stand-in for [`announce::announce`] that fails as it does without `CAP_NET_RAW`.
#[cfg(test)]
pub(crate) fn announce_without_cap_net_raw(
    interface: &str,
    ip: IpAddr,
) -> Result<announce::Sent, announce::NotSent> {
    Err(announce::NotSent::new(
        ip,
        interface,
        &io::Error::from_raw_os_error(1),
    ))
}

#[cfg(test)]
mod tests {
    use std::{
        num::NonZeroI32,
        sync::Arc,
        time::{Duration, Instant},
    };

    use rtnetlink::packet_core::ErrorMessage;

    use super::{test_interface::TestInterface, *};
    use crate::announce::capture::{Capture, Heard};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// The kernel's answer `-errno`.
    fn answer(errno: i32) -> Result<(), rtnetlink::Error> {
        let mut message = ErrorMessage::default();
        message.code = NonZeroI32::new(-errno);
        Err(rtnetlink::Error::NetlinkError(message))
    }

    #[test]
    fn host_addresses_of_both_families() {
        let v4 = address_message(7, ip("192.0.2.7"), true);
        assert_eq!(
            (v4.header.index, v4.header.prefix_len, v4.header.flags),
            (7, 32, AddressHeaderFlags::empty())
        );
        let v6 = address_message(3, ip("2001:db8::7"), true);
        assert_eq!(
            (v6.header.index, v6.header.prefix_len, v6.header.flags),
            (3, 128, AddressHeaderFlags::Nodad),
            "IPv6 VIPs are added with nodad"
        );
        let v6 = address_message(3, ip("2001:db8::7"), false);
        assert_eq!(v6.header.flags, AddressHeaderFlags::empty());
        assert!(!AddressManager::manages(ip("127.240.0.1")));
        assert!(!AddressManager::manages(ip("::1")));
        assert!(AddressManager::manages(ip("192.0.2.7")));
    }

    #[test]
    fn answers_are_read_from_the_errno() {
        // EEXIST (17) on an add: there already (what iproute2 prints as "File exists" or, newer,
        // "Address already assigned"); EADDRNOTAVAIL (99) on a delete: not there.
        assert_eq!(add_answer(Ok(())), Ok(Added::New));
        assert_eq!(add_answer(answer(17)), Ok(Added::AlreadyThere));
        assert_eq!(delete_answer(Ok(())), Ok(Removed::Now));
        assert_eq!(delete_answer(answer(99)), Ok(Removed::NotThere));
        // Not the other way round.
        assert!(matches!(add_answer(answer(99)), Err(Failure::Refused(_))));
        assert!(matches!(
            delete_answer(answer(17)),
            Err(Failure::Refused(_))
        ));
        assert_eq!(
            add_answer(answer(1)),
            Err(Failure::Refused(
                "Operation not permitted (CAP_NET_ADMIN is needed)".to_owned()
            ))
        );
        assert_eq!(
            delete_answer(answer(13)),
            Err(Failure::Refused(
                "Permission denied (CAP_NET_ADMIN is needed)".to_owned()
            ))
        );
        assert_eq!(
            describe(&answer(22).unwrap_err()),
            "Invalid argument (errno 22)"
        );
        assert_eq!(errno(&answer(ENODEV).unwrap_err()), Some(ENODEV));
        assert_eq!(errno(&rtnetlink::Error::RequestFailed), None);
    }

    /// On a real interface (so this needs root, as CI runs): VIPs of both families go on and come off,
    /// an address the interface had already is taken over and comes off too, removing what is not there
    /// is no error, an unknown interface is named, and after `remove_all_now` adds are refused until
    /// `resume`. The addresses are from TEST-NET-2 (198.51.100.0/24) and 2001:db8::/32: 192.0.2.0/24 is
    /// the network of CI's own machine (its gateway is 192.0.2.1).
    #[tokio::test]
    async fn vips_go_on_a_real_interface_and_come_off() {
        let interface = TestInterface::create("a");
        let manager = AddressManager::new(interface.name().to_owned());
        let (v4, v6) = (ip("198.51.100.65"), ip("2001:db8::65"));

        manager.add(v4).await.unwrap();
        manager.add(v4).await.unwrap();
        manager.add(v6).await.unwrap();
        manager.add(ip("127.240.0.1")).await.unwrap();
        let mut listed = interface.addresses();
        listed.sort_by_key(|a| a.ip);
        assert_eq!(
            listed,
            [
                test_interface::Listed {
                    ip: v4,
                    prefix: 32,
                    nodad: false
                },
                test_interface::Listed {
                    ip: v6,
                    prefix: 128,
                    nodad: true
                },
            ],
            "loopback VIPs are not put on the interface"
        );

        // Left behind by a killed leader: taken over without an error, and removed with the rest.
        let leftover = ip("198.51.100.66");
        interface.put(leftover);
        manager.add(leftover).await.unwrap();
        // Gone already (someone else removed it): no error.
        let vanished = ip("198.51.100.67");
        manager.add(vanished).await.unwrap();
        interface.take_off(vanished);
        manager.request(Op::Remove(vanished)).await.unwrap();
        // Never added: nothing is done.
        manager
            .request(Op::Remove(ip("198.51.100.99")))
            .await
            .unwrap();

        manager.remove(v6).await;
        assert!(!interface.has(v6));
        assert!(interface.has(v4) && interface.has(leftover));

        // The leader steps down: every VIP comes off, and adds are refused from then on.
        manager.remove_all_now();
        assert_eq!(interface.addresses(), []);
        let err = manager.add(v4).await.unwrap_err();
        assert!(
            err.contains("198.51.100.65") && err.contains("stepping down"),
            "{err}"
        );
        assert!(!interface.has(v4));
        manager.resume();
        manager.add(v4).await.unwrap();
        assert!(interface.has(v4));
        manager.remove(v4).await;
        assert_eq!(interface.addresses(), []);

        // An interface that is not there.
        let missing = format!("ccmt{}none", std::process::id() % 10_000);
        let err = AddressManager::new(missing.clone())
            .add(v4)
            .await
            .unwrap_err();
        assert_eq!(
            err,
            format!(
                "putting the VIP 198.51.100.65 on interface {missing}: no interface named {missing}"
            )
        );
    }

    /// On a veth pair (so this needs root, as CI runs): a VIP put on one end is announced, as heard on
    /// the other end, three times, 500 ms apart: for IPv4 a gratuitous ARP request and reply from the
    /// end's MAC, for IPv6 an unsolicited neighbour advertisement with the override flag. So is an
    /// address the interface had already (taken over); a VIP that comes off is announced no more, and
    /// one added again while on is not announced again.
    #[tokio::test]
    async fn vips_put_on_an_interface_are_announced_to_its_neighbours() {
        let link = TestInterface::create_veth("n");
        let mac = link.mac();
        let capture = Capture::on(link.peer(), mac);
        let manager = AddressManager::new(link.name().to_owned());
        let (v4, v6) = (ip("198.51.100.200"), ip("2001:db8::200"));
        let added = Instant::now();
        assert_eq!(manager.add(v4).await, Ok(None));
        assert_eq!(manager.add(v6).await, Ok(None));
        assert!(link.has(v4) && link.has(v6));

        let heard = capture.wait_for(v4, 6, Duration::from_secs(5));
        let (IpAddr::V4(v4_octets), IpAddr::V6(v6_octets)) = (v4, v6) else {
            unreachable!()
        };
        let request = Heard::Arp {
            operation: 1,
            ethernet_source: mac,
            ethernet_destination: [0xff; 6],
            sender_mac: mac,
            sender_ip: v4_octets,
            target_mac: [0xff; 6],
            target_ip: v4_octets,
        };
        let reply = Heard::Arp {
            operation: 2,
            ethernet_source: mac,
            ethernet_destination: [0xff; 6],
            sender_mac: mac,
            sender_ip: v4_octets,
            target_mac: mac,
            target_ip: v4_octets,
        };
        assert_eq!(
            heard,
            [&request, &reply, &request, &reply, &request, &reply].map(Clone::clone),
            "three rounds of a gratuitous ARP request and reply"
        );
        let advertisement = Heard::NeighbourAdvertisement {
            ethernet_source: mac,
            ethernet_destination: [0x33, 0x33, 0, 0, 0, 1],
            source: v6_octets,
            destination: "ff02::1".parse().unwrap(),
            hop_limit: 255,
            router: false,
            solicited: false,
            override_: true,
            target: v6_octets,
            target_link_layer_address: Some(mac),
        };
        assert_eq!(
            capture.wait_for(v6, 3, Duration::from_secs(5)),
            [&advertisement, &advertisement, &advertisement].map(Clone::clone),
            "three unsolicited neighbour advertisements"
        );
        // The first round at once, the others 500 ms apart (with room for a loaded machine: the
        // capture's clock reads when its thread gets the frame).
        let times: Vec<Instant> = capture.about(v4).iter().map(|(at, _)| *at).collect();
        assert!(
            times[0] - added < Duration::from_secs(1),
            "the first round came {:?} after the add",
            times[0] - added
        );
        let spread = times[5] - times[0];
        assert!(
            spread >= Duration::from_millis(700) && spread < Duration::from_secs(3),
            "the rounds spread over {spread:?}"
        );

        // On already: not announced again.
        assert_eq!(manager.add(v4).await, Ok(None));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(capture.about(v4).len(), 6);

        // Left behind by a killed leader and taken over: announced.
        let leftover = ip("198.51.100.201");
        link.put(leftover);
        assert_eq!(manager.add(leftover).await, Ok(None));
        assert_eq!(
            capture.wait_for(leftover, 2, Duration::from_secs(5)).len(),
            2,
            "the VIP taken over was not announced"
        );

        // Off again at once: the first round only, no later one pointing the neighbours back here.
        let brief = ip("198.51.100.202");
        assert_eq!(manager.add(brief).await, Ok(None));
        manager.remove(brief).await;
        tokio::time::sleep(2 * announce::INTERVAL + Duration::from_millis(500)).await;
        assert_eq!(
            capture.about(brief).len(),
            2,
            "a VIP that came off was announced again"
        );
        // Nor after the leader stepped down.
        manager.remove_all_now();
        manager.resume();
        assert_eq!(manager.add(brief).await, Ok(None));
        manager.remove_all_now();
        tokio::time::sleep(2 * announce::INTERVAL + Duration::from_millis(500)).await;
        assert_eq!(capture.about(brief).len(), 4);
        assert_eq!(link.addresses(), []);
    }

    /// Without `CAP_NET_RAW` (a stand-in announcer fails as the kernel does), a VIP still goes on, and
    /// the add returns the warning, each time the VIP is put on. Needs root: a real interface.
    #[tokio::test]
    async fn a_vip_not_announced_is_on_all_the_same_and_the_add_says_why() {
        let interface = TestInterface::create("w");
        let manager = AddressManager::new(interface.name().to_owned())
            .with_announcer(announce_without_cap_net_raw);
        let vip = ip("198.51.100.203");
        let warning = manager.add(vip).await.unwrap();
        assert_eq!(
            warning.as_deref(),
            Some(
                format!(
                    "gratuitous ARP for 198.51.100.203 on {} not sent: Operation not permitted (CAP_NET_RAW is needed); neighbours keep the previous holder's MAC until their caches expire",
                    interface.name()
                )
                .as_str()
            )
        );
        assert!(interface.has(vip));
        assert_eq!(manager.add(vip).await, Ok(None), "on already: nothing sent");
        manager.remove(vip).await;
        assert!(!interface.has(vip));
        assert_eq!(manager.add(vip).await, Ok(warning), "put on again");
        manager.remove_all_now();
        assert_eq!(interface.addresses(), []);
    }

    /// The warning is logged once per VIP (later failures at debug level), and again only after an
    /// announcement of that VIP was sent.
    #[test]
    fn a_failed_announcement_is_logged_as_a_warning_once_per_vip() {
        #[derive(Clone, Default)]
        struct Log(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Log {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let log = Log::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        fn announced(_: &str, _: IpAddr) -> Result<announce::Sent, announce::NotSent> {
            Ok(announce::Sent::NoLinkLayer)
        }
        let mut worker = Worker {
            interface: "eth9".to_owned(),
            added: BTreeSet::new(),
            adopted: BTreeSet::new(),
            stopped: false,
            unannounced: BTreeSet::new(),
            announce: announce_without_cap_net_raw,
            repeats: BTreeMap::new(),
            warned: BTreeSet::new(),
            held: Default::default(),
        };
        let (a, b) = (ip("198.51.100.204"), ip("2001:db8::204"));
        tracing::subscriber::with_default(subscriber, || {
            assert!(worker.announce(a).is_some());
            assert!(worker.announce(a).is_some());
            assert!(worker.announce(b).is_some());
        });
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let warnings: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ")).collect();
        assert_eq!(warnings.len(), 2, "{text}");
        assert!(
            warnings[0].contains("gratuitous ARP for 198.51.100.204 on eth9 not sent: Operation not permitted (CAP_NET_RAW is needed); neighbours keep the previous holder's MAC until their caches expire"),
            "{text}"
        );
        assert!(
            warnings[1]
                .contains("unsolicited neighbour advertisement for 2001:db8::204 on eth9 not sent"),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| l.contains("DEBUG")).count(),
            1,
            "{text}"
        );
        // Not warned again until one is sent (no link layer counts as nothing to send).
        worker.announce = announced;
        assert!(worker.announce(a).is_none());
        assert!(worker.warned.contains(&a), "nothing was sent yet");
    }
}
