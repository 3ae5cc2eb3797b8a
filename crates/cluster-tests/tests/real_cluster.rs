//! The manager on a real cluster (`hack/cluster`): nodes registered by real kubelets, Services carried
//! by real kube-proxies to real pods, the manager running as a Pod from the image `hack/image` builds.
//! Run by `hack/test-cluster` (see the crate's documentation).

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use cluster_tests::{
    LONG, ManagerForm, answers, cluster, deploy, echo_app, eventually, host_neighbour, http_get,
    ingress, load_balancer, manager_lease_holder, node_mac, steady_answers, udp_ask, wait_rollout,
};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::{Api, api::ListParams};
use serde_json::Value;
use tokio::sync::Mutex;

/// One test at a time: they share the cluster (and stop its nodes).
static SERIAL: Mutex<()> = Mutex::const_new(());

/// The pods of `app` by name, with their nodes.
async fn pods_of(namespace: &str, app: &str) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(cluster().client().await, namespace);
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            )
        })
        .collect()
}

/// The node whose kubelet-registered name is the Lease holder's host name (hostNetwork pods have
/// their node's host name).
async fn leader_node() -> String {
    let client = cluster().client().await;
    let holder = eventually("the Lease is held", LONG, || {
        let client = client.clone();
        async move { manager_lease_holder(&client).await }
    })
    .await;
    let node = holder.split('_').next().unwrap_or_default().to_owned();
    assert!(
        cluster().nodes().contains(&node),
        "the Lease holder {holder} is not a manager on a node of the cluster"
    );
    node
}

fn audit_entries() -> Vec<Value> {
    let text = std::fs::read_to_string(cluster().audit_log()).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Who wrote (successfully) `resource[/subresource]` named `name`, per the API server's audit log.
fn writers_of(resource: &str, subresource: Option<&str>, name: &str) -> BTreeSet<String> {
    audit_entries()
        .into_iter()
        .filter(|e| {
            e["objectRef"]["resource"] == resource
                && e["objectRef"]["subresource"].as_str() == subresource
                && e["objectRef"]["name"] == name
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
        })
        .filter_map(|e| e["user"]["username"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn nodes_registered_by_real_kubelets_are_initialized_by_the_manager_pod() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Deployment).await;
    let client = c.client().await;

    // The manager runs from the image, as Pods on the two control-plane nodes, and one holds the Lease.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let managers = pods
        .list(&ListParams::default().labels("k8s-app=cloud-controller-manager"))
        .await
        .unwrap()
        .items;
    let placed: BTreeSet<String> = managers
        .iter()
        .filter(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        placed,
        BTreeSet::from(["ccm-node-1".to_owned(), "ccm-node-2".to_owned()]),
        "one Running manager on each control-plane node"
    );
    for pod in &managers {
        let image = &pod.spec.as_ref().unwrap().containers[0].image;
        assert_eq!(
            image.as_deref().map(|i| i.rsplit_once(':').map(|(r, _)| r)),
            Some(Some("docker.io/ccm-rs/cloud-controller-manager")),
            "the manager runs from the hack/image image"
        );
    }
    let leader = leader_node().await;
    assert!(leader == "ccm-node-1" || leader == "ccm-node-2", "{leader}");

    // Every node: initialized from what its kubelet reported.
    let nodes: Api<Node> = Api::all(client.clone());
    for name in c.nodes() {
        let node = nodes.get(&name).await.unwrap();
        let spec = node.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.provider_id.as_deref(),
            Some(format!("local://{name}").as_str())
        );
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("local.ccm.rs/source").map(String::as_str),
            Some("adopted"),
            "{name}: {labels:?}"
        );
        assert_eq!(
            labels
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str),
            Some("local")
        );
        let taints = spec.taints.unwrap_or_default();
        assert!(
            !taints
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"),
            "{name} still carries the uninitialized taint: {taints:?}"
        );
        let addresses: Vec<(String, String)> = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            addresses,
            [
                ("InternalIP".to_owned(), c.node_ip(&name).to_string()),
                ("Hostname".to_owned(), name.clone())
            ],
            "{name}: the kubelet's --node-ip as InternalIP, its host name"
        );
        let pod_cidr = spec.pod_cidr.unwrap_or_default();
        assert!(
            pod_cidr.starts_with("10.244.") && pod_cidr.ends_with("/24"),
            "{name}: a pod CIDR from --cluster-cidr, allocated by the manager: {pod_cidr:?}"
        );
        // The writes came from the manager Pod's own identity (its ServiceAccount's token, in-cluster
        // configuration), not from an administrator.
        let writers = writers_of("nodes", None, &name);
        assert!(
            writers.contains("system:serviceaccount:kube-system:cloud-controller-manager")
                || writers.contains("system:serviceaccount:kube-system:node-controller"),
            "{name} was written by {writers:?}"
        );
    }

    // The scheduler places pods on the initialized nodes: one per node.
    let ns = deploy("placed", &[echo_app("echo", 3, true, None)]).await;
    let on: BTreeSet<String> = pods_of(ns.name(), "echo")
        .await
        .into_iter()
        .map(|(_, node)| node)
        .collect();
    assert_eq!(on, c.nodes().into_iter().collect(), "one pod on each node");
}

#[tokio::test]
async fn a_load_balancer_in_front_of_a_deployment_is_answered_by_pods_on_every_node() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Deployment).await;
    let ns = deploy(
        "spread",
        &[
            echo_app("echo", 3, true, None),
            load_balancer("web", "echo", "", ""),
            load_balancer("web-proxied", "echo", "", "local.ccm.rs/proxy-protocol: v2"),
        ],
    )
    .await;
    let pods: BTreeSet<String> = pods_of(ns.name(), "echo")
        .await
        .into_iter()
        .map(|(pod, _)| pod)
        .collect();
    let (vip, mode) = ingress(ns.name(), "web").await;
    assert!(
        vip.to_string().starts_with("10.89.0."),
        "a VIP from the pool on the bridge: {vip}"
    );
    assert_eq!(
        mode, "Proxy",
        "the data plane carries the traffic: kube-proxy must leave the VIP alone"
    );

    // From the host: every pod answers, so the traffic spreads over the three nodes.
    let http = SocketAddr::new(vip, 80);
    let seen = eventually("every pod answers through the VIP", LONG, || async move {
        let names: BTreeSet<String> = answers(http, 30).await.ok()?.into_iter().collect();
        (names.len() == 3).then_some(names)
    })
    .await;
    assert_eq!(seen, pods);

    // UDP too: each new client socket is a new flow, balanced anew.
    let udp = SocketAddr::new(vip, 81);
    let mut udp_seen = BTreeSet::new();
    for _ in 0..30 {
        let name = udp_ask(udp, "hostname").await.expect("a UDP answer");
        assert!(pods.contains(&name), "{name} is not a pod of the app");
        udp_seen.insert(name);
    }
    assert!(udp_seen.len() >= 2, "UDP answered only by {udp_seen:?}");
    assert_eq!(
        udp_ask(udp, "ping-through-the-vip").await.unwrap(),
        "ping-through-the-vip"
    );

    // From every node, each of which runs kube-proxy (the leader's node too, where the VIP is local):
    // both Services answer through their VIPs, with PROXY protocol or without.
    let (proxied_vip, proxied_mode) = ingress(ns.name(), "web-proxied").await;
    assert_eq!(proxied_mode, "Proxy");
    for node in c.nodes() {
        for address in [vip, proxied_vip] {
            let url = format!("http://{address}:80/");
            let answer = eventually(&format!("{url} from {node}"), LONG, || {
                let (node, url) = (node.clone(), url.clone());
                async move { c.curl_on_node(&node, &url).ok() }
            })
            .await;
            assert!(pods.contains(&answer), "{node}: {url} answered {answer:?}");
        }
    }
    // From the host through the PROXY-protocol Service: the pod learns the host's address.
    let client_ip = eventually("the PROXY-protocol VIP answers", LONG, || async move {
        http_get(SocketAddr::new(proxied_vip, 80), "/clientip")
            .await
            .ok()
    })
    .await;
    assert!(
        client_ip.starts_with(&format!("{}:", c.host_ip())) && client_ip.contains("proxy protocol"),
        "the pod saw {client_ip:?}"
    );
}

#[tokio::test]
async fn external_traffic_policy_local_sends_only_to_the_node_with_a_ready_endpoint() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Deployment).await;
    let target = "ccm-node-3";
    let ns = deploy(
        "local-policy",
        &[
            echo_app("echo", 1, false, Some(target)),
            load_balancer("web", "echo", "externalTrafficPolicy: Local", ""),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    let services: Api<Service> = Api::namespaced(c.client().await, ns.name());
    let service = services.get("web").await.unwrap();
    let health_port = service
        .spec
        .unwrap()
        .health_check_node_port
        .expect("a healthCheckNodePort") as u16;

    // kube-proxy's own health check node port: 200 where an endpoint is, 503 elsewhere (once each
    // kube-proxy has seen the endpoint).
    let expected: Vec<(String, u16)> = c
        .nodes()
        .into_iter()
        .map(|node| {
            let code = if node == target { 200 } else { 503 };
            (node, code)
        })
        .collect();
    let mut last = Vec::new();
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        last.clear();
        for (node, _) in &expected {
            let address = SocketAddr::new(c.node_ip(node), health_port);
            let code = match http_get(address, "/healthz").await {
                Ok(_) => 200,
                Err(err) if err.contains("503") => 503,
                Err(_) => 0,
            };
            last.push((node.clone(), code));
        }
        if last == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health check node port {health_port}: expected {expected:?}, kube-proxy answers {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // kube-proxy drops NodePort traffic on nodes without an endpoint, so requests that all succeed went
    // to the one node with the pod only.
    let answered =
        steady_answers("20 requests in a row succeed", SocketAddr::new(vip, 80), 20).await;
    assert_eq!(answered.len(), 1, "{answered:?}");

    // The pod sees the load balancer's connection (the leader's node address), as docs/local-provider.md
    // says: with externalTrafficPolicy Local kube-proxy keeps the source, and the data plane is the source.
    let leader = leader_node().await;
    let seen = http_get(SocketAddr::new(vip, 80), "/clientip")
        .await
        .unwrap();
    assert!(
        seen.starts_with(&format!("{}:", c.node_ip(&leader))),
        "the pod saw {seen:?}; the leader is {leader}"
    );
}

#[tokio::test]
async fn traffic_goes_on_through_a_deleted_pod_a_stopped_kubelet_and_a_stopped_node() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Deployment).await;
    let client = c.client().await;
    let ns = deploy(
        "failures",
        &[
            echo_app("echo", 3, true, None),
            load_balancer("web", "echo", "", ""),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    let http = SocketAddr::new(vip, 80);
    steady_answers("the VIP answers", http, 10).await;
    let victim = "ccm-node-3";
    assert_ne!(leader_node().await, victim);

    // A pod deleted: the others answer, then its replacement.
    let (deleted, _) = pods_of(ns.name(), "echo")
        .await
        .into_iter()
        .find(|(_, node)| node == victim)
        .expect("a pod on the victim node");
    c.kubectl(
        &["-n", ns.name(), "delete", "pod", &deleted, "--wait=false"],
        None,
    );
    let after = eventually(
        "the deleted pod no longer answers and 20 requests in a row succeed",
        LONG,
        || {
            let deleted = deleted.clone();
            async move {
                let names: BTreeSet<String> = answers(http, 20).await.ok()?.into_iter().collect();
                (!names.contains(&deleted)).then_some(names)
            }
        },
    )
    .await;
    assert!(!after.is_empty());
    wait_rollout(ns.name(), "echo").await;

    // The victim's kubelet stopped: the node goes NotReady, traffic goes on, and the lifecycle
    // controller leaves it alone (an adopted machine that still exists and is not shut down is neither
    // deleted nor tainted, as docs/local-provider.md says).
    c.script("stop", &["--node", victim, "--component", "kubelet"]);
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(&format!("{victim} goes NotReady"), LONG, || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(victim).await.ok()?;
            let ready = node
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status != "True").then_some(())
        }
    })
    .await;
    steady_answers("20 requests in a row succeed with a kubelet down", http, 20).await;
    // Three lifecycle passes (--node-monitor-period 5s).
    tokio::time::sleep(Duration::from_secs(16)).await;
    let node = nodes
        .get_opt(victim)
        .await
        .unwrap()
        .expect("the NotReady node is not deleted: its machine exists");
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        !taints
            .iter()
            .any(|t| t.key == "node.cloudprovider.kubernetes.io/shutdown"),
        "{taints:?}"
    );
    c.script("start", &["--node", victim, "--component", "kubelet"]);

    // The whole node stopped (its containers, containerd, kubelet and kube-proxy, and its link): the
    // load balancer's health checks take it out, and the other nodes' pods answer.
    c.script("stop", &["--node", victim]);
    let survivors = steady_answers("20 requests in a row succeed with a node down", http, 20).await;
    let on_victim: BTreeSet<String> = pods_of(ns.name(), "echo")
        .await
        .into_iter()
        .filter(|(_, node)| node == victim)
        .map(|(pod, _)| pod)
        .collect();
    assert!(
        survivors.is_disjoint(&on_victim),
        "{survivors:?} includes a pod of the stopped node {on_victim:?}"
    );
    c.script("start", &["--node", victim]);
    eventually(&format!("{victim} is Ready again"), LONG, || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(victim).await.ok()?;
            let ready = node
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "True").then_some(())
        }
    })
    .await;
    wait_rollout(ns.name(), "echo").await;
    let back = eventually("pods on every node answer again", LONG, || async move {
        let names: BTreeSet<String> = answers(http, 30).await.ok()?.into_iter().collect();
        (names.len() == 3).then_some(names)
    })
    .await;
    assert_eq!(back.len(), 3);
}

/// The number of lines the audit log has now: entries after it are what happens next.
fn audit_mark() -> usize {
    std::fs::read_to_string(cluster().audit_log())
        .map(|t| t.lines().count())
        .unwrap_or_default()
}

/// Who wrote `resource[/subresource]` named `name` (successfully) after `mark`, per the audit log.
fn writers_since(
    mark: usize,
    resource: &str,
    subresource: Option<&str>,
    name: &str,
) -> BTreeSet<String> {
    let text = std::fs::read_to_string(cluster().audit_log()).unwrap_or_default();
    text.lines()
        .skip(mark)
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| {
            e["objectRef"]["resource"] == resource
                && e["objectRef"]["subresource"].as_str() == subresource
                && e["objectRef"]["name"] == name
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
        })
        .filter_map(|e| e["user"]["username"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until `node` is Ready (and initialized by a manager).
async fn wait_node_ready(node: &str) {
    let nodes: Api<Node> = Api::all(cluster().client().await);
    eventually(&format!("{node} is initialized and Ready"), LONG, || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(node).await.ok()?;
            node.spec.as_ref()?.provider_id.as_ref()?;
            let ready = node
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "True").then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn the_daemonset_form_writes_with_each_controllers_own_service_account() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::DaemonSet).await;
    let client = c.client().await;

    // Upstream's example's shape: one pod per control-plane node, from the image, with the flag.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let managers: Vec<Pod> = pods
        .list(&ListParams::default().labels("k8s-app=cloud-controller-manager"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let placed: BTreeSet<String> = managers
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        placed,
        BTreeSet::from(["ccm-node-1".to_owned(), "ccm-node-2".to_owned()])
    );
    for pod in &managers {
        assert_eq!(
            pod.metadata.owner_references.as_ref().unwrap()[0].kind,
            "DaemonSet"
        );
        let args = pod.spec.as_ref().unwrap().containers[0]
            .args
            .clone()
            .unwrap_or_default();
        assert!(
            args.iter()
                .any(|a| a == "--use-service-account-credentials=true"),
            "{args:?}"
        );
    }
    leader_node().await;

    // A machine that leaves and joins again: its Node is deleted, its kubelet registers it anew, and
    // the DaemonSet's manager initializes it and allocates its pod CIDR, writing as node-controller.
    let mark = audit_mark();
    let victim = "ccm-node-3";
    c.script("stop", &["--node", victim]);
    c.kubectl(
        &[
            "delete",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={victim}"),
            "--force",
            "--grace-period=0",
        ],
        None,
    );
    c.kubectl(&["delete", "node", victim, "--wait=true"], None);
    c.script("start", &["--node", victim]);
    wait_node_ready(victim).await;
    let writers = writers_since(mark, "nodes", None, victim);
    assert!(
        writers.contains("system:serviceaccount:kube-system:node-controller"),
        "{victim} was initialized by {writers:?}"
    );
    assert!(
        !writers
            .iter()
            .any(|w| w == "system:serviceaccount:kube-system:cloud-controller-manager"),
        "the manager's own identity wrote the node: {writers:?}"
    );

    // A new load balancer: its status is written as service-controller, and it answers.
    let ns = deploy(
        "daemonset",
        &[
            echo_app("echo", 2, true, None),
            load_balancer("web", "echo", "", ""),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    steady_answers("the VIP answers", SocketAddr::new(vip, 80), 10).await;
    let writers = writers_since(mark, "services", Some("status"), "web");
    assert_eq!(
        writers,
        BTreeSet::from(["system:serviceaccount:kube-system:service-controller".to_owned()]),
        "the Service's status was written by {writers:?}"
    );
}

#[tokio::test]
async fn the_helm_chart_installs_the_manager() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Helm).await;
    let client = c.client().await;
    let status = std::process::Command::new(cluster_tests::workspace_root().join("hack/helm"))
        .args([
            "status",
            "cloud-controller-manager",
            "--namespace",
            "kube-system",
            "--kubeconfig",
        ])
        .arg(c.admin_kubeconfig())
        .output()
        .unwrap();
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && status_text.contains("STATUS: deployed"),
        "{status_text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let running = pods
        .list(&ListParams::default().labels("k8s-app=cloud-controller-manager"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .count();
    assert_eq!(running, 2, "the chart's Deployment runs two replicas");
    leader_node().await;
    let ns = deploy(
        "helm",
        &[
            echo_app("echo", 2, true, None),
            load_balancer("web", "echo", "", ""),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    let http = SocketAddr::new(vip, 80);
    // Both pods answer, once every kube-proxy has the second endpoint.
    eventually("both pods answer through the VIP", LONG, || async move {
        let names: BTreeSet<String> = answers(http, 20).await.ok()?.into_iter().collect();
        (names.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_vips_move_with_the_lease_and_neighbours_follow_at_once() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Deployment).await;
    let client = c.client().await;
    let ns = deploy(
        "failover",
        &[
            echo_app("echo", 3, true, None),
            load_balancer("web", "echo", "", ""),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    let http = SocketAddr::new(vip, 80);
    steady_answers("the VIP answers", http, 10).await;
    let old = leader_node().await;
    let (mac, _) = host_neighbour(vip).expect("the host has resolved the VIP");
    assert_eq!(
        mac,
        node_mac(&old),
        "the host reaches the VIP at the leader's node"
    );

    // The leader's pod deleted (SIGTERM): it releases the Lease and hands its VIPs off; the other
    // replica takes the Lease, puts the VIP on its node and announces it, and the old leader stops
    // answering for it, drains its connections and takes it off. The leader's node is cordoned
    // first, or the Deployment's replacement pod, started there at once, may win the Lease and the VIP
    // would not move.
    let uncordoned = Uncordon::cordon(&old);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let leader_pod = pods
        .list(&ListParams::default().labels("k8s-app=cloud-controller-manager"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(old.as_str()))
        .and_then(|p| p.metadata.name)
        .expect("the leader's pod");
    let deleted_at = std::time::Instant::now();
    c.kubectl(
        &[
            "-n",
            "kube-system",
            "delete",
            "pod",
            &leader_pod,
            "--wait=false",
        ],
        None,
    );
    let new = eventually("another replica leads", LONG, || {
        let client = client.clone();
        let old = old.clone();
        async move {
            let holder = manager_lease_holder(&client).await?;
            let node = holder.split('_').next()?.to_owned();
            (node != old).then_some(node)
        }
    })
    .await;
    // The host learns the new holder from the announcement (the old leader serves until then, and
    // answers no neighbour for the VIP afterwards): its entry names the new node's MAC (with the old
    // MAC it would go on sending to the old node, which only finishes its open connections).
    let new_mac = node_mac(&new);
    eventually(
        &format!("the host's neighbour entry for {vip} names {new}"),
        LONG,
        || async {
            let (mac, _) = host_neighbour(vip)?;
            (mac == new_mac).then_some(())
        },
    )
    .await;
    steady_answers("the VIP answers from the new leader", http, 10).await;
    println!(
        "the VIP answered from {new} {:.1}s after the leader's pod on {old} was deleted",
        deleted_at.elapsed().as_secs_f64()
    );
    let (mac, state) = host_neighbour(vip).expect("the host's entry for the VIP");
    assert_eq!(
        mac, new_mac,
        "the host's neighbour entry for {vip} ({state}) went back to the old leader"
    );
    // The old leader keeps the VIP (answering no neighbour for it) while its connections drain
    // (hack/cluster's drainTimeout: 5 s), then takes it off.
    eventually(
        &format!("{vip} off the old leader's node"),
        LONG,
        || async {
            let on_old = c.exec_on_node(&old, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
            (!String::from_utf8_lossy(&on_old.stdout).contains(&format!(" {vip}/"))).then_some(())
        },
    )
    .await;
    // The Deployment replaces the deleted pod; the cluster is as the test found it.
    drop(uncordoned);
    c.kubectl(
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/cloud-controller-manager",
            "--timeout=120s",
        ],
        None,
    );
}

/// A node cordoned until this is dropped (also when an assertion failed: the next test's pods need
/// every node).
struct Uncordon(String);

impl Uncordon {
    fn cordon(node: &str) -> Self {
        cluster().kubectl(&["cordon", node], None);
        Uncordon(node.to_owned())
    }
}

impl Drop for Uncordon {
    fn drop(&mut self) {
        cluster().kubectl_output(&["uncordon", &self.0], None);
    }
}

/// The addresses `kube-system/local-retained-addresses` keeps for `namespace/name` (`None`: none).
fn kept_for(namespace: &str, name: &str) -> Option<String> {
    let path = format!("{{.data.{namespace}\\.{name}}}");
    let out = cluster().kubectl(
        &[
            "-n",
            "kube-system",
            "get",
            "configmap",
            "local-retained-addresses",
            "-o",
            &format!("jsonpath={path}"),
        ],
        None,
    );
    let out = out.trim();
    (!out.is_empty()).then(|| out.to_owned())
}

/// Issue #51 item 2 on the real cluster: a Service with `ccm.rs/load-balancer-retain: "true"` keeps its
/// VIP when it is deleted (recorded in `kube-system/local-retained-addresses`, not served, given to no
/// other Service), and the next Service of its name gets that VIP back, with traffic through it to the
/// pods again; its record goes.
#[tokio::test]
async fn a_kept_vip_is_served_again_by_the_next_service_of_its_name() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.ensure_manager(ManagerForm::Deployment).await;
    let ns = deploy(
        "kept",
        &[
            echo_app("echo", 2, true, None),
            load_balancer("web", "echo", "", r#"ccm.rs/load-balancer-retain: "true""#),
        ],
    )
    .await;
    let (vip, _) = ingress(ns.name(), "web").await;
    let http = SocketAddr::new(vip, 80);
    let pods: BTreeSet<String> = pods_of(ns.name(), "echo")
        .await
        .into_iter()
        .map(|(pod, _)| pod)
        .collect();
    let before = steady_answers("the VIP answers", http, 10).await;
    assert!(before.is_subset(&pods), "{before:?} not of {pods:?}");

    c.kubectl(
        &["-n", ns.name(), "delete", "service", "web", "--wait=true"],
        None,
    );
    let kept = eventually("the VIP recorded as kept", LONG, || async {
        kept_for(ns.name(), "web")
    })
    .await;
    assert_eq!(kept, vip.to_string());
    eventually("the kept VIP no longer served", LONG, || async {
        http_get(http, "/").await.is_err().then_some(())
    })
    .await;

    // Another Service meanwhile: not the kept VIP.
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(&load_balancer("other", "echo", "", "")),
    );
    let (other, _) = ingress(ns.name(), "other").await;
    assert_ne!(other, vip, "the kept VIP went to another Service");

    // The next Service of the name (not asking to keep it) gets it back, and serves.
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(&load_balancer("web", "echo", "", "")),
    );
    let (again, _) = ingress(ns.name(), "web").await;
    assert_eq!(again, vip, "the same VIP");
    let after = steady_answers("the VIP answers again", http, 10).await;
    assert!(after.is_subset(&pods), "{after:?} not of {pods:?}");
    eventually("the record gone", LONG, || async {
        kept_for(ns.name(), "web").is_none().then_some(())
    })
    .await;
}
