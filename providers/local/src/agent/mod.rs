//! The node agent (`local-agent`, a DaemonSet from the manager's image) of `loadBalancer.mode:
//! agents`: the manager assigns each Service its VIPs and writes its status; on every node an agent
//! watches those Services, the Nodes, the EndpointSlices and the other agents' heartbeats, elects one
//! node per VIP (module `plan`), and, on the node elected, puts the VIP on the node's interface, announces
//! it to the link (gratuitous ARP, unsolicited neighbour advertisement) and serves it: with the `local`
//! data plane (health checks, source ranges, PROXY protocol, per-listener metrics; `ipMode: Proxy`),
//! or, for `local.ccm.rs/data-path: kube-proxy`, by leaving the traffic to kube-proxy (`ipMode: VIP`).
//!
//! A node whose agent stops renewing its heartbeat (module `heartbeat`: 3 s by default) loses its VIPs to
//! the next node of each VIP's order; every other VIP stays where it is, with its connections. An
//! agent that stops cleanly takes its VIPs off and deletes its heartbeat, so they move at once; one
//! that was killed finds its VIPs still on the interface when it starts again, takes them over, and
//! removes those it no longer announces.
//!
//! The announcer is one part (the trait `announcer::Announcer`): layer 2 (the VIP on the interface and
//! its announcements) for the pools with `announce: l2`, BGP (module `bgp`: the VIP on the loopback
//! interface and a host route to it advertised to the node's peers) for those with `announce: bgp`,
//! which every fit node announces rather than one; the serving does not depend on it.

mod announcer;
mod bgp;
mod flags;
mod handover;
mod health;
pub(crate) mod heartbeat;
mod judge;
mod look;
mod membership;
mod metrics;
mod own_node;
pub(crate) mod plan;
pub(crate) mod presence;
mod start;
mod stop;
mod wake;
mod watches;

pub use bgp::{BgpMetrics, EVENT_SESSION_ESTABLISHED, EVENT_SESSION_FAILED};
pub use flags::{AgentFlags, AgentSettings, MembershipFlags};
pub use health::AgentHealth;
pub use metrics::AgentMetrics;

use std::sync::Arc;

use kube::Client;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{Error, LocalCloud};

use self::look::Agent;

/// The reason of the Normal event on a Service whose VIP a node starts announcing.
pub const EVENT_VIP_ANNOUNCED: &str = "VIPAnnounced";

/// Runs the agent until `shutdown`; then takes the VIPs off, deletes the heartbeat and drains the
/// data plane. `cloud` is the `local` cloud of the cloud-config the manager reads (its pools, its
/// inventory, the data plane's settings), which must say `loadBalancer.mode: agents`.
pub async fn run(
    cloud: LocalCloud,
    client: Client,
    settings: AgentSettings,
    metrics: AgentMetrics,
    health: AgentHealth,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    settings.check()?;
    start::check_cloud(&cloud, &settings)?;
    let changed = Arc::new(Notify::new());
    let Some(mut started) = start::start(
        &cloud, &client, &settings, &metrics, &health, &changed, &shutdown,
    )
    .await?
    else {
        return Ok(());
    };
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = started.mirrors.ready() => tracing::info!(node = %settings.node_name, interface = %started.interface, "local-agent: watching; announcing the VIPs this node is elected for"),
    }
    let mut agent = Agent::new(
        cloud.clone(),
        settings.clone(),
        started.announcers,
        metrics,
        health.clone(),
        started.membership,
    );
    let failure = look::until_stopped(
        &mut agent,
        look::Looking {
            mirrors: &started.mirrors,
            lease_view: &started.lease_view,
            renewed: &started.renewed,
            changed: &changed,
            health: &health,
            shutdown: &shutdown,
            beating: &started.beating,
        },
        &mut started.point,
    )
    .await;
    stop::finish(agent, &cloud, started.point, failure, started.beating).await
}

#[cfg(test)]
mod tests {
    use super::{flags::tests::settings, *};

    /// An agent refuses to start where it would serve beside the leader, or beat where the manager
    /// does not look; it says so before any call to the API server (none answers here).
    #[tokio::test]
    async fn an_agent_the_cloud_config_does_not_expect_refuses_to_start() {
        let nowhere =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let start = |yaml: &str, namespace: &str| {
            let cloud = LocalCloud::new(crate::Config::parse(yaml, None).unwrap(), None);
            let settings = AgentSettings {
                namespace: namespace.into(),
                ..settings()
            };
            run(
                cloud,
                nowhere.clone(),
                settings,
                AgentMetrics::default(),
                AgentHealth::default(),
                CancellationToken::new(),
            )
        };
        let cases = [
            ("{}", "kube-system", "loadBalancer.mode is leader"),
            (
                "loadBalancer: {mode: agents}",
                "lb-system",
                "this agent's heartbeats would go to namespace \"lb-system\" (--namespace, or the pod's namespace), where the manager does not look for them: the cloud-config's loadBalancer.agentNamespace is \"kube-system\"",
            ),
            (
                "loadBalancer: {mode: agents, agentNamespace: lb-system}",
                "kube-system",
                "loadBalancer.agentNamespace is \"lb-system\"",
            ),
        ];
        for (yaml, namespace, why) in cases {
            let err = start(yaml, namespace).await.unwrap_err().to_string();
            assert!(err.contains(why), "{yaml}, {namespace}: {err}");
        }
    }
}
