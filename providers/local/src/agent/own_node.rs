//! What the agent learns of its own node from the API server as it starts: the node's InternalIP, the
//! interface that has it, and the membership protocol's address on it.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use super::{MembershipFlags, membership::MembershipSettings};
use crate::Error;

/// The membership protocol's settings: its address on the node's InternalIP, and its size.
pub(super) async fn membership_settings(
    client: &Client,
    node: &str,
    flags: &MembershipFlags,
) -> Result<MembershipSettings, Error> {
    let key = flags.key()?;
    let ip = node_internal_ip(client, node).await?;
    let expected_members = Api::<Node>::all(client.clone())
        .list_metadata(&Default::default())
        .await
        .map_err(|source| Error::Kube {
            what: "local-agent: listing the Nodes (to size the membership protocol)".to_owned(),
            source,
        })?
        .items
        .len();
    tracing::info!(probe_interval = ?flags.probe_interval, suspicion_timeout = ?flags.suspicion_timeout, "membership settings");
    Ok(MembershipSettings {
        key,
        bind: std::net::SocketAddr::new(ip, flags.port),
        probe_interval: flags.probe_interval,
        suspicion_timeout: flags.suspicion_timeout,
        expected_members,
    })
}

/// The InternalIP of Node `name` (the first one its status lists).
pub(super) async fn node_internal_ip(client: &Client, name: &str) -> Result<IpAddr, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await.map_err(|source| Error::Kube {
        what: format!("local-agent: reading Node {name}"),
        source,
    })?;
    crate::instances::first_internal_ip(&node).ok_or_else(|| {
        Error::Flag(format!(
            "Node {name} has no InternalIP yet (the membership protocol listens on it)"
        ))
    })
}

/// The interface that has the InternalIP of Node `name` (the first one its status lists).
pub(super) async fn node_interface(client: &Client, name: &str) -> Result<String, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await.map_err(|source| Error::Kube {
        what: format!(
            "local-agent: reading Node {name} (to find its interface; or give --interface)"
        ),
        source,
    })?;
    let Some(ip) = crate::instances::first_internal_ip(&node) else {
        return Err(Error::Flag(format!(
            "Node {name} has no InternalIP yet to find its interface by: give --interface"
        )));
    };
    match crate::addresses::interface_with(ip).await {
        Ok(Some(interface)) => {
            tracing::info!(%ip, %interface, "the VIPs go on the interface of the node's InternalIP");
            Ok(interface)
        }
        Ok(None) => Err(Error::Flag(format!(
            "no interface of this host has the node's InternalIP {ip} (is the agent on the host network?): give --interface"
        ))),
        Err(err) => Err(Error::Flag(format!(
            "finding the interface of the node's InternalIP {ip}: {err}; give --interface"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_interface_of_an_address_is_found_through_netlink() {
        let lo = crate::addresses::interface_with("127.0.0.1".parse().unwrap()).await;
        assert_eq!(lo, Ok(Some("lo".to_owned())));
        // TEST-NET-3: no interface has it.
        let none = crate::addresses::interface_with("203.0.113.77".parse().unwrap()).await;
        assert_eq!(none, Ok(None));
    }
}
