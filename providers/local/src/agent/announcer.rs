//! How a node tells the network that it holds a VIP now. The agent elects and serves; an [`Announcer`]
//! only makes the network send the VIP's traffic to this node, and stops. Layer 2 is the one there is
//! ([`AddressManager`]: the VIP on the interface, gratuitous ARP / unsolicited neighbour advertisement);
//! a BGP announcer (a route to the VIP advertised to the node's peers) would be another implementation
//! of this trait, beside it, with nothing else of the agent changed.

use std::net::IpAddr;

use cloud_provider::async_trait;

use crate::{AddressRange, addresses::AddressManager};

/// Makes the network deliver a VIP's traffic to this node.
#[async_trait]
pub(crate) trait Announcer: Send + Sync {
    /// What it announces on, for logs and events (`interface eth0`).
    fn describe(&self) -> String;

    /// Makes `ip` this node's; an announcer that must not draw traffic before the data plane serves it
    /// (layer 2: the neighbours; BGP: the route) tells the network in [`Announcer::serving`].
    /// `Ok(Some(warning))`: the VIP is this node's, but not every neighbour was told (what was not
    /// sent, and why).
    async fn announce(&self, ip: IpAddr) -> Result<Option<String>, String>;

    /// The data plane serves `ip` now (its listeners are bound and its backends' health known), or
    /// kube-proxy does: an announcer that can wait for that (BGP: the route) tells the network now.
    /// Called after every successful apply; idempotent.
    /// `Some(warning)`: the VIP is served here, but not every neighbour was told (what was not sent,
    /// and why).
    async fn serving(&self, _ip: IpAddr) -> Option<String> {
        None
    }

    /// Stops announcing `ip` (failures are logged).
    async fn withdraw(&self, ip: IpAddr);

    /// Stops announcing everything, before the process exits: blocks the calling thread until done.
    fn withdraw_all_now(&self);

    /// Takes over what an earlier run of this agent left announced within `ranges` (killed before it
    /// could withdraw): withdrawn by [`Announcer::withdraw`] unless announced again. Returns it.
    async fn adopt(&self, ranges: Vec<AddressRange>) -> Result<Vec<IpAddr>, String>;
}

/// Layer 2: the VIP on the node's interface, announced to the link's neighbours.
#[async_trait]
impl Announcer for AddressManager {
    fn describe(&self) -> String {
        format!("interface {}", self.interface())
    }

    /// Only puts the VIP on: the neighbours are told once the data plane (or kube-proxy) serves it
    /// ([`Announcer::serving`]), so that none is sent here before this node accepts (the previous
    /// holder, handing the VIP over, answers until then).
    async fn announce(&self, ip: IpAddr) -> Result<Option<String>, String> {
        self.put_on(ip).await.map(|()| None)
    }

    /// Tells the link's neighbours, the first time after the VIP was put on.
    async fn serving(&self, ip: IpAddr) -> Option<String> {
        match AddressManager::announce(self, ip).await {
            Ok(warning) => warning,
            Err(err) => Some(format!(
                "{ip} not announced to the link's neighbours: {err}"
            )),
        }
    }

    async fn withdraw(&self, ip: IpAddr) {
        self.remove(ip).await;
    }

    fn withdraw_all_now(&self) {
        self.remove_all_now();
    }

    async fn adopt(&self, ranges: Vec<AddressRange>) -> Result<Vec<IpAddr>, String> {
        AddressManager::adopt(self, ranges).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        addresses::test_interface::TestInterface,
        announce::{self, capture::Capture},
    };

    /// Layer 2 in an agent: `announce` puts the VIP on and tells no neighbour (the previous holder still
    /// answers); `serving` (the data plane serves it now) sends the gratuitous ARP rounds, once however
    /// often a look calls it. On a veth pair, heard on its other end: needs root, as CI runs.
    #[tokio::test]
    async fn layer_2_tells_the_neighbours_only_once_the_vip_is_served() {
        let link = TestInterface::create_veth("v");
        let capture = Capture::on(link.peer(), link.mac());
        let manager = AddressManager::new(link.name().to_owned());
        let vip: IpAddr = "198.51.100.210".parse().unwrap();

        assert_eq!(Announcer::announce(&manager, vip).await, Ok(None));
        assert!(link.has(vip), "the VIP is not on the interface");
        tokio::time::sleep(2 * announce::INTERVAL).await;
        assert_eq!(
            capture.about(vip).len(),
            0,
            "the neighbours were told before the VIP was served"
        );

        assert_eq!(Announcer::serving(&manager, vip).await, None);
        assert_eq!(
            capture.wait_for(vip, 6, Duration::from_secs(5)).len(),
            6,
            "three rounds of a gratuitous ARP request and reply once served"
        );
        // The next look serves it again: nothing more is sent.
        assert_eq!(Announcer::serving(&manager, vip).await, None);
        tokio::time::sleep(3 * announce::INTERVAL).await;
        assert_eq!(
            capture.about(vip).len(),
            6,
            "announced again when served again"
        );

        Announcer::withdraw(&manager, vip).await;
        assert_eq!(link.addresses(), []);
    }
}
