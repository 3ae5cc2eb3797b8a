//! The agent's command line (`local-agent --help`) and its settings, checked before anything starts.

use std::time::Duration;

use cloud_provider::clap;

use super::{heartbeat, membership};
use crate::{Error, LocalCloud};

/// The `local-agent` command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "local-agent",
    about = "The node agent of the `local` cloud's loadBalancer.mode: agents: elects one node per VIP, \
             puts it on the node's interface, announces it and serves it (docs/local-provider.md)."
)]
pub struct AgentFlags {
    /// The node this agent runs on (the DaemonSet sets it from spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    /// The node's interface the VIPs go on (CAP_NET_ADMIN) and are announced on (CAP_NET_RAW); without
    /// it, the interface that has the node's InternalIP (the first one of the Node's status).
    #[arg(long, value_name = "INTERFACE")]
    pub interface: Option<String>,
    /// The cloud-config the manager reads (the same ConfigMap): its pools, inventory and data-plane
    /// settings. It must say loadBalancer.mode: agents.
    #[arg(long, value_name = "PATH")]
    pub cloud_config: Option<std::path::PathBuf>,
    /// A kubeconfig; without one, the pod's service account (or $KUBECONFIG).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The namespace of the agents' heartbeat Leases.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "kube-system",
        value_name = "NAMESPACE"
    )]
    pub namespace: String,
    /// A node whose agent has not renewed its heartbeat for this long loses its VIPs (whole seconds).
    #[arg(long, default_value = "3s", value_parser = cloud_provider::flag_values::go_duration, value_name = "DURATION")]
    pub heartbeat: Duration,
    /// How often the agent renews its heartbeat (at most half of --heartbeat).
    #[arg(long, default_value = "1s", value_parser = cloud_provider::flag_values::go_duration, value_name = "DURATION")]
    pub renew_interval: Duration,
    /// Serve only Services of this loadBalancerClass (the manager's --load-balancer-class); without it,
    /// the Services without a class.
    #[arg(long, value_name = "CLASS")]
    pub load_balancer_class: Option<String>,
    /// The key of the membership protocol between the agents (a file of at least 16 bytes: the
    /// DaemonSet mounts it from the Secret local-agent-membership). With it, the agents judge each
    /// other's liveness over the node network too, and keep announcing while the API server is away;
    /// without it, a node whose heartbeat cannot be renewed stops announcing.
    #[arg(long, value_name = "PATH")]
    pub membership_key_file: Option<std::path::PathBuf>,
    /// The UDP port of the membership protocol, on the node's InternalIP.
    #[arg(
        long,
        default_value_t = 10265,
        value_name = "PORT",
        requires = "membership_key_file"
    )]
    pub membership_port: u16,
    /// How often each agent probes another one over the membership protocol.
    #[arg(long, default_value = "100ms", value_parser = cloud_provider::flag_values::go_duration, value_name = "DURATION", requires = "membership_key_file")]
    pub membership_probe_interval: Duration,
    /// How long an agent that answers no probe is suspected before it is declared down (and its
    /// VIPs move).
    #[arg(long, default_value = "500ms", value_parser = cloud_provider::flag_values::go_duration, value_name = "DURATION", requires = "membership_key_file")]
    pub membership_suspicion_timeout: Duration,
    /// A Unix socket through which an agent hands its VIPs, listening sockets and membership over to
    /// the agent that replaces it on the same node (a rolling update with maxSurge), so that the
    /// connections open at that moment are not cut: the old agent stops accepting, lets them finish
    /// (the data plane's drainTimeout) and exits, leaving the VIPs on the interface. Both pods mount
    /// its directory (a hostPath only root can write). Without it, an agent that stops takes its
    /// VIPs off and they move to another node.
    #[arg(long, value_name = "PATH")]
    pub handover_socket: Option<std::path::PathBuf>,
    /// Where /metrics (the data plane's, per listener), /healthz and /readyz are served, over plain
    /// HTTP: the node's loopback by default (the agents run on the host network: only the node's own
    /// processes reach it); an address others reach exposes every Service's names and traffic to them
    /// unauthenticated. "0" turns it off.
    #[arg(long, default_value = "127.0.0.1:10264", value_name = "ADDRESS")]
    pub metrics_bind_address: String,
}

impl AgentFlags {
    /// The settings of [`run`](super::run).
    pub fn settings(&self) -> AgentSettings {
        AgentSettings {
            node_name: self.node_name.clone(),
            interface: self.interface.clone(),
            namespace: self.namespace.clone(),
            heartbeat: self.heartbeat,
            renew_interval: self.renew_interval,
            load_balancer_class: self.load_balancer_class.clone(),
            handover_socket: self.handover_socket.clone(),
            membership: self
                .membership_key_file
                .as_ref()
                .map(|key_file| MembershipFlags {
                    key_file: key_file.clone(),
                    port: self.membership_port,
                    probe_interval: self.membership_probe_interval,
                    suspicion_timeout: self.membership_suspicion_timeout,
                }),
        }
    }

    /// The `local` cloud of `--cloud-config` (its defaults without one, which `run` refuses: they say
    /// `mode: leader`).
    pub fn cloud(&self) -> Result<LocalCloud, Error> {
        let config = match &self.cloud_config {
            Some(path) => cloud_provider::CloudConfig::read(path).map_err(|err| Error::Config {
                path: Some(path.display().to_string()),
                message: format!("cannot read it: {err}"),
            })?,
            None => cloud_provider::CloudConfig::none(),
        };
        LocalCloud::from_cloud_config(&config)
    }
}

/// A node agent's settings.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The node this agent runs on (the Node's name).
    pub node_name: String,
    /// The node's interface the VIPs go on and are announced on; `None`: the one that has the node's
    /// InternalIP.
    pub interface: Option<String>,
    /// The namespace of the agents' heartbeat Leases.
    pub namespace: String,
    /// A heartbeat older than this is a node gone (the Lease's `leaseDurationSeconds`, whole seconds).
    pub heartbeat: Duration,
    /// How often the agent renews its heartbeat.
    pub renew_interval: Duration,
    /// The `loadBalancerClass` of the Services served (the manager's `--load-balancer-class`); `None`:
    /// the classless ones.
    pub load_balancer_class: Option<String>,
    /// The membership protocol between the agents; `None`: off (the Leases alone decide).
    pub membership: Option<MembershipFlags>,
    /// The Unix socket of the hand-over to a successor on this node; `None`: no hand-over (an agent
    /// that stops takes its VIPs off).
    pub handover_socket: Option<std::path::PathBuf>,
}

/// The membership protocol's settings, as given.
#[derive(Debug, Clone)]
pub struct MembershipFlags {
    /// The file with the shared key.
    pub key_file: std::path::PathBuf,
    /// The UDP port, on the node's InternalIP (0: any free port, for tests).
    pub port: u16,
    /// How often each agent probes another one.
    pub probe_interval: Duration,
    /// How long an agent that answers no probe is suspected before it is declared down.
    pub suspicion_timeout: Duration,
}

impl MembershipFlags {
    /// The key, read from its file (a trailing newline is not part of it).
    pub(super) fn key(&self) -> Result<Vec<u8>, Error> {
        let path = self.key_file.display();
        let mut key = std::fs::read(&self.key_file).map_err(|err| {
            Error::Flag(format!(
                "--membership-key-file {path}: cannot read it: {err} (the DaemonSet mounts it from \
                 the Secret local-agent-membership: create it as docs/local-provider.md says)"
            ))
        })?;
        while key.last().is_some_and(u8::is_ascii_whitespace) {
            key.pop();
        }
        if key.len() < membership::MIN_KEY_LEN {
            return Err(Error::Flag(format!(
                "--membership-key-file {path}: the key has {} bytes; at least {} are needed \
                 (openssl rand -hex 32 makes one)",
                key.len(),
                membership::MIN_KEY_LEN
            )));
        }
        Ok(key)
    }
}

impl AgentSettings {
    /// What is wrong with these settings, if anything.
    pub fn check(&self) -> Result<(), Error> {
        let flag = |m: String| Err(Error::Flag(m));
        if self.node_name.trim().is_empty() {
            return flag("--node-name is empty (the DaemonSet sets it from spec.nodeName)".into());
        }
        if let Err(why) =
            cloud_provider::labels::check_dns_subdomain(&heartbeat::lease_name(&self.node_name))
        {
            return flag(format!(
                "--node-name {:?}: its heartbeat Lease's name is not valid: {why}",
                self.node_name
            ));
        }
        if self.interface.as_ref().is_some_and(|i| i.trim().is_empty()) {
            return flag(
                "--interface is empty (leave it out to use the interface of the node's InternalIP)"
                    .into(),
            );
        }
        if self.heartbeat < Duration::from_secs(1) || self.heartbeat.subsec_nanos() != 0 {
            return flag(format!(
                "--heartbeat {:?}: whole seconds, at least 1s (a Lease's duration is in seconds)",
                self.heartbeat
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval * 2 > self.heartbeat {
            return flag(format!(
                "--renew-interval {:?} must be above 0 and at most half of --heartbeat {:?} (one lost \
                 renewal must not make the node look gone)",
                self.renew_interval, self.heartbeat
            ));
        }
        if let Some(m) = &self.membership {
            if m.probe_interval < Duration::from_millis(30) {
                return flag(format!(
                    "--membership-probe-interval {:?}: at least 30ms (a probe waits a third of it \
                     for its answer)",
                    m.probe_interval
                ));
            }
            if m.suspicion_timeout < m.probe_interval {
                return flag(format!(
                    "--membership-suspicion-timeout {:?} must be at least \
                     --membership-probe-interval {:?} (a suspected agent needs that long to say it \
                     is alive)",
                    m.suspicion_timeout, m.probe_interval
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::agent) fn settings() -> AgentSettings {
        AgentSettings {
            node_name: "node-1".into(),
            interface: None,
            namespace: "kube-system".into(),
            heartbeat: Duration::from_secs(3),
            renew_interval: Duration::from_secs(1),
            load_balancer_class: None,
            membership: None,
            handover_socket: None,
        }
    }

    #[test]
    fn bad_flags_are_named() {
        assert!(settings().check().is_ok());
        let cases: Vec<(AgentSettings, &str)> = vec![
            (
                AgentSettings {
                    node_name: " ".into(),
                    ..settings()
                },
                "--node-name is empty",
            ),
            (
                AgentSettings {
                    node_name: "Node_1".into(),
                    ..settings()
                },
                "--node-name \"Node_1\": its heartbeat Lease's name is not valid",
            ),
            (
                AgentSettings {
                    interface: Some(String::new()),
                    ..settings()
                },
                "--interface is empty",
            ),
            (
                AgentSettings {
                    heartbeat: Duration::from_millis(2500),
                    ..settings()
                },
                "whole seconds, at least 1s",
            ),
            (
                AgentSettings {
                    renew_interval: Duration::from_secs(2),
                    ..settings()
                },
                "at most half of --heartbeat",
            ),
        ];
        for (bad, expected) in cases {
            let err = bad.check().unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
    }

    /// A membership setting without the key is refused, not ignored; a key file that cannot be read or
    /// is too short is named with what to do.
    #[test]
    fn membership_settings_need_a_key_and_a_good_one() {
        use cloud_provider::clap::Parser;
        for flag in [
            "--membership-port=10266",
            "--membership-probe-interval=100ms",
            "--membership-suspicion-timeout=1s",
        ] {
            let err = AgentFlags::try_parse_from(["local-agent", "--node-name=n", flag])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--membership-key-file"), "{flag}: {err}");
        }
        let flags = AgentFlags::try_parse_from([
            "local-agent",
            "--node-name=n",
            "--membership-key-file=/nonexistent/key",
            "--membership-port=10266",
        ])
        .unwrap();
        let membership = flags.settings().membership.unwrap();
        assert_eq!(membership.port, 10266);
        let err = membership.key().unwrap_err().to_string();
        assert!(
            err.starts_with("--membership-key-file /nonexistent/key: cannot read it"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("key");
        std::fs::write(&short, "too short\n").unwrap();
        let err = MembershipFlags {
            key_file: short.clone(),
            ..membership.clone()
        }
        .key()
        .unwrap_err()
        .to_string();
        assert!(err.contains("the key has 9 bytes; at least 16"), "{err}");
        std::fs::write(&short, "0123456789abcdef0123456789abcdef\n").unwrap();
        let key = MembershipFlags {
            key_file: short,
            ..membership
        }
        .key()
        .unwrap();
        assert_eq!(key.len(), 32, "the trailing newline is not part of the key");
    }
}
