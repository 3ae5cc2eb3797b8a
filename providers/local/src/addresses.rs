//! Optional, off by default: VIPs outside the loopback range put on a network interface of the leader's
//! machine (with `ip address add`, which needs `CAP_NET_ADMIN`) while their load balancer runs, and taken
//! off when it is deleted or the leader steps down, so the next leader can put them on its own machine.
//!
//! Turned on by `loadBalancer.vipInterface`. Loopback VIPs (127.0.0.0/8, `::1`) are never touched: any
//! process can bind them already.

use std::{collections::BTreeSet, net::IpAddr, path::PathBuf, sync::Mutex};

use crate::instances::lock;

/// Adds and removes VIPs on one interface, remembering what it added (and only removing that).
#[derive(Debug)]
pub(crate) struct AddressManager {
    interface: String,
    /// The `ip` command (iproute2).
    command: PathBuf,
    added: Mutex<BTreeSet<IpAddr>>,
}

/// The arguments of `ip` that add (`add`) or remove (`del`) `ip` on `interface`, as a host address.
/// An IPv6 address is added with `nodad`: duplicate address detection would keep it "tentative", and
/// unbindable, for a second or more after it is added.
pub(crate) fn ip_arguments(action: &str, ip: IpAddr, interface: &str) -> Vec<String> {
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    let mut args = vec![
        "address".to_owned(),
        action.to_owned(),
        format!("{ip}/{prefix}"),
        "dev".to_owned(),
        interface.to_owned(),
    ];
    if action == "add" && ip.is_ipv6() {
        args.push("nodad".to_owned());
    }
    args
}

/// How long one `ip` command may take.
const IP_COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl AddressManager {
    pub(crate) fn new(interface: String, command: PathBuf) -> Self {
        Self {
            interface,
            command,
            added: Mutex::new(BTreeSet::new()),
        }
    }

    /// The interface the VIPs go on.
    pub(crate) fn interface(&self) -> &str {
        &self.interface
    }

    /// Whether `ip` is one this manager puts on the interface.
    pub(crate) fn manages(ip: IpAddr) -> bool {
        !ip.is_loopback()
    }

    async fn run(&self, action: &str, ip: IpAddr) -> Result<(), String> {
        let args = ip_arguments(action, ip, &self.interface);
        // The C locale, so "File exists" is matched whatever the host's language.
        let output = tokio::process::Command::new(&self.command)
            .args(&args)
            .env("LC_ALL", "C")
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(IP_COMMAND_TIMEOUT, output)
            .await
            .map_err(|_| {
                format!(
                    "{} {} did not finish within {IP_COMMAND_TIMEOUT:?}",
                    self.command.display(),
                    args.join(" ")
                )
            })?
            .map_err(|err| format!("cannot run {}: {err}", self.command.display()))?;
        if output.status.success() {
            return Ok(());
        }
        Err(format!(
            "{} {} failed ({}): {}",
            self.command.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }

    /// Puts `ip` on the interface unless it is loopback or already added by this manager. An address
    /// the interface already has ("File exists") counts as added.
    pub(crate) async fn add(&self, ip: IpAddr) -> Result<(), String> {
        if !Self::manages(ip) || lock(&self.added).contains(&ip) {
            return Ok(());
        }
        match self.run("add", ip).await {
            Ok(()) => {}
            Err(err) if err.contains("File exists") => {}
            Err(err) => {
                return Err(format!(
                    "putting the VIP {ip} on interface {}: {err}",
                    self.interface
                ));
            }
        }
        tracing::info!(%ip, interface = %self.interface, "VIP added to the interface");
        lock(&self.added).insert(ip);
        Ok(())
    }

    /// Takes `ip` off the interface if this manager added it; a failure is logged.
    pub(crate) async fn remove(&self, ip: IpAddr) {
        if !lock(&self.added).remove(&ip) {
            return;
        }
        match self.run("del", ip).await {
            Ok(()) => {
                tracing::info!(%ip, interface = %self.interface, "VIP removed from the interface");
            }
            Err(err) => {
                tracing::warn!(%ip, interface = %self.interface, error = %err, "cannot remove the VIP from the interface");
            }
        }
    }

    /// Takes every address this manager added off the interface (the leader steps down).
    pub(crate) async fn remove_all(&self) {
        let all: Vec<IpAddr> = lock(&self.added).iter().copied().collect();
        for ip in all {
            self.remove(ip).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_addresses_of_both_families() {
        assert_eq!(
            ip_arguments("add", "192.0.2.7".parse().unwrap(), "eth0").join(" "),
            "address add 192.0.2.7/32 dev eth0"
        );
        assert_eq!(
            ip_arguments("del", "2001:db8::7".parse().unwrap(), "br0").join(" "),
            "address del 2001:db8::7/128 dev br0"
        );
        assert_eq!(
            ip_arguments("add", "2001:db8::7".parse().unwrap(), "br0").join(" "),
            "address add 2001:db8::7/128 dev br0 nodad"
        );
        assert!(!AddressManager::manages("127.240.0.1".parse().unwrap()));
        assert!(!AddressManager::manages("::1".parse().unwrap()));
        assert!(AddressManager::manages("192.0.2.7".parse().unwrap()));
    }

    /// A stand-in for `ip` that records its arguments (and fails for one address).
    fn recording_ip(dir: &std::path::Path) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let log = dir.join("calls");
        let script = dir.join("ip");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\ncase \"$3\" in 192.0.2.66/32) echo 'RTNETLINK answers: Operation not permitted' >&2; exit 2;; esac\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (script, log)
    }

    #[tokio::test]
    async fn adds_once_removes_what_it_added_and_reports_failures() {
        let dir = tempfile::tempdir().unwrap();
        let (script, log) = recording_ip(dir.path());
        let manager = AddressManager::new("test0".to_owned(), script);
        let vip: IpAddr = "192.0.2.1".parse().unwrap();
        manager.add(vip).await.unwrap();
        manager.add(vip).await.unwrap();
        manager.add("127.240.0.1".parse().unwrap()).await.unwrap();
        let err = manager
            .add("192.0.2.66".parse().unwrap())
            .await
            .unwrap_err();
        assert!(
            err.contains("192.0.2.66") && err.contains("Operation not permitted"),
            "{err}"
        );
        manager.add("2001:db8::1".parse().unwrap()).await.unwrap();
        manager.remove("192.0.2.99".parse().unwrap()).await;
        manager.remove_all().await;
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            calls.lines().collect::<Vec<_>>(),
            [
                "address add 192.0.2.1/32 dev test0",
                "address add 192.0.2.66/32 dev test0",
                "address add 2001:db8::1/128 dev test0 nodad",
                "address del 192.0.2.1/32 dev test0",
                "address del 2001:db8::1/128 dev test0",
            ]
        );
    }
}
