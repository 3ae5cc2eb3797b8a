//! The cloud-side state of the fake cloud, and the JSON state file that shows it.

use std::{
    collections::BTreeMap,
    io::Write,
    net::Ipv4Addr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::{Deserialize, Serialize};

/// What the fake cloud holds. Serialized as the state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudState {
    /// Load balancers, sorted by name.
    pub load_balancers: Vec<LoadBalancerRecord>,
    /// Routes, sorted by name.
    pub routes: Vec<RouteRecord>,
    /// How often each method was called (failed calls included).
    pub calls: BTreeMap<String, u64>,
    /// How often each method was called about each object (a Service's `namespace/name` for
    /// load-balancer calls), by method; calls about no one object are only in `calls`. Injected
    /// failures are drawn from these counts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub calls_per_object: BTreeMap<String, BTreeMap<String, u64>>,
    /// The ingress IP the cloud keeps for each Service (`namespace/name`) it ever gave one, also after
    /// its load balancer is deleted, so the Service gets the same IP back while the IP is free.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ip_assignments: BTreeMap<String, Ipv4Addr>,
}

/// A load balancer in the fake cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerRecord {
    /// Its cloud-side name (the default load-balancer name of the Service).
    pub name: String,
    /// The Service, as `namespace/name`.
    pub service: String,
    /// Ingress IPs.
    pub ingress: Vec<String>,
    /// Listeners.
    pub ports: Vec<PortRecord>,
    /// Backend node names, sorted. Shared between load balancers with the same backends.
    pub nodes: Arc<Vec<String>>,
    /// Kept for `service` after it went (`ccm.rs/load-balancer-retain`), for a later Service of that
    /// namespace and name to adopt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retained: bool,
}

/// A listener of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRecord {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port.
    pub port: i32,
    /// The node port traffic goes to.
    pub node_port: i32,
}

/// A route in the fake cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRecord {
    /// Its cloud-side name.
    pub name: String,
    /// The node it sends traffic to.
    pub target_node: String,
    /// The CIDR it covers.
    #[serde(rename = "destinationCIDR")]
    pub destination_cidr: String,
    /// Whether it is a blackhole route.
    pub blackhole: bool,
}

impl CloudState {
    /// Reads a state file, as the fake cloud wrote it.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let text = std::fs::read(path)?;
        serde_json::from_slice(&text)
            .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidData, err))
    }

    /// Writes the state file atomically (a temporary file renamed over it), so readers never see half.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        // Unique per write, so two clouds of one process never share a temporary file.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let tmp = path.with_extension(format!(
            "tmp-{}-{}",
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        {
            // Buffered: serde_json writes token by token, which unbuffered is a syscall per name.
            let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            serde_json::to_writer_pretty(&mut file, self).map_err(std::io::Error::other)?;
            file.write_all(b"\n")?;
            file.flush()?;
        }
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// The load balancer of a Service (`namespace/name`), if any.
    pub fn load_balancer_of(&self, service: &str) -> Option<&LoadBalancerRecord> {
        self.load_balancers.iter().find(|lb| lb.service == service)
    }

    /// How often `method` was called.
    pub fn calls_to(&self, method: &str) -> u64 {
        self.calls.get(method).copied().unwrap_or(0)
    }

    /// How often `method` was called about `object` (a Service's `namespace/name`).
    pub fn calls_about(&self, method: &str, object: &str) -> u64 {
        self.calls_per_object
            .get(method)
            .and_then(|per_object| per_object.get(object))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let state = CloudState {
            load_balancers: vec![LoadBalancerRecord {
                name: "aabc".into(),
                service: "default/web".into(),
                ingress: vec!["203.0.113.1".into()],
                ports: vec![PortRecord {
                    protocol: "TCP".into(),
                    port: 80,
                    node_port: 30080,
                }],
                nodes: Arc::new(vec!["n1".into()]),
                retained: true,
            }],
            routes: vec![RouteRecord {
                name: "r".into(),
                target_node: "n1".into(),
                destination_cidr: "10.244.0.0/24".into(),
                blackhole: false,
            }],
            calls: BTreeMap::from([("ensure_load_balancer".into(), 2)]),
            calls_per_object: BTreeMap::from([(
                "ensure_load_balancer".into(),
                BTreeMap::from([("default/web".into(), 2)]),
            )]),
            ip_assignments: BTreeMap::from([("default/web".into(), Ipv4Addr::new(203, 0, 113, 1))]),
        };
        state.write(&path).unwrap();
        assert_eq!(CloudState::read(&path).unwrap(), state);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["loadBalancers"][0]["ports"][0]["nodePort"], 30080);
        assert_eq!(json["routes"][0]["destinationCIDR"], "10.244.0.0/24");
        assert_eq!(json["ipAssignments"]["default/web"], "203.0.113.1");
        assert_eq!(state.calls_to("ensure_load_balancer"), 2);
        assert_eq!(state.calls_about("ensure_load_balancer", "default/web"), 2);
        assert_eq!(state.calls_about("ensure_load_balancer", "default/api"), 0);
        assert_eq!(state.load_balancer_of("default/web").unwrap().name, "aabc");
    }
}
