//! Our speaker against BIRD 2 and GoBGP (`hack/routers install`), on loopback as in `frr.rs`: the
//! same table announced from two "nodes" (127.0.0.2 and 127.0.0.3), read back from each router,
//! then a route withdrawn and a node stopped. Needs root (bird).

mod support;

use std::net::Ipv4Addr;

use local_bgp::{Peer, State};
use support::{Bird, GoBgp, NODE_ASN, ROUTER_ASN, eventually, net, node};
use tokio::sync::watch;

async fn each_vip_through_both_nodes_then_withdrawn_then_one_node_gone(
    router: &impl support::Router,
) {
    let name = router.name();
    let table = support::two_vips_and_a_tagged_one();
    let (routes, routes_rx) = watch::channel(table.clone());
    let first = Peer::start(node(router, Ipv4Addr::new(127, 0, 0, 2)), routes_rx.clone()).unwrap();
    let second = Peer::start(node(router, Ipv4Addr::new(127, 0, 0, 3)), routes_rx).unwrap();
    for peer in [&first, &second] {
        let mut status = peer.status();
        eventually(&format!("{name}: the session established"), async || {
            let now = status.borrow_and_update().clone();
            if now.state == State::Established {
                Ok(())
            } else {
                Err(format!("{now:?}\n{}", router.log()))
            }
        })
        .await;
    }
    for (family, prefix, hops) in [
        ("ipv4", "10.96.0.1/32", ["10.0.0.2", "10.0.0.3"]),
        ("ipv4", "10.96.0.2/32", ["10.0.0.2", "10.0.0.3"]),
        ("ipv6", "2001:db8:96::1/128", ["fd00::2", "fd00::3"]),
    ] {
        let expected: Vec<(String, bool)> = hops.iter().map(|h| (h.to_string(), true)).collect();
        eventually(
            &format!("{name}: {prefix} through both nodes"),
            async || {
                let paths = router.paths(family, prefix).await;
                if paths == expected {
                    Ok(())
                } else {
                    Err(format!("{paths:?}"))
                }
            },
        )
        .await;
    }
    assert_eq!(
        router.communities("ipv4", "10.96.0.2/32").await,
        (vec!["64513:100".to_string()], vec!["64513:1:2".to_string()]),
        "{name}"
    );

    let mut fewer = table;
    fewer.remove(&net("10.96.0.1/32"));
    routes.send_replace(fewer);
    eventually(&format!("{name}: 10.96.0.1/32 withdrawn"), async || {
        let paths = router.paths("ipv4", "10.96.0.1/32").await;
        if paths.is_empty() {
            Ok(())
        } else {
            Err(format!("{paths:?}"))
        }
    })
    .await;

    first.stop().await.unwrap();
    eventually(
        &format!("{name}: only the second node's path left"),
        async || {
            let paths = router.paths("ipv6", "2001:db8:96::1/128").await;
            if paths == [("fd00::3".to_string(), true)] {
                Ok(())
            } else {
                Err(format!("{paths:?}"))
            }
        },
    )
    .await;
    second.stop().await.unwrap();
}

#[tokio::test]
async fn bird_routes_each_vip_to_every_node_that_announces_it() {
    let bird = Bird::start(
        ROUTER_ASN,
        &[("127.0.0.2", NODE_ASN), ("127.0.0.3", NODE_ASN)],
    )
    .await;
    each_vip_through_both_nodes_then_withdrawn_then_one_node_gone(&bird).await;
}

#[tokio::test]
async fn gobgp_routes_each_vip_to_every_node_that_announces_it() {
    let gobgp = GoBgp::start(
        ROUTER_ASN,
        &[("127.0.0.2", NODE_ASN), ("127.0.0.3", NODE_ASN)],
    )
    .await;
    each_vip_through_both_nodes_then_withdrawn_then_one_node_gone(&gobgp).await;
}
