//! The `kubevirt` provider on `hack/cluster`, with ccm-rs on both layers and traffic end to end.
//!
//! hack/cluster is the tenant cluster: its nodes play the VMIs. A second API server (hack/control-plane)
//! is the infra cluster, with KubeVirt's VMI resource (`hack/kubevirt/crds.yaml`), one `Running` VMI per
//! tenant node carrying the node's real address, and one infra node (this host, 10.89.0.1). On the host
//! run, against the infra API server, a real kube-proxy (nftables, its NodePorts on 10.89.0.1 only) and
//! our manager with the `local` provider (the infra cluster's load balancer: VIPs on 127.241.0.0/24);
//! against the tenant API server, our manager with the `kubevirt` provider for Services of class
//! `ccm.rs/kubevirt` (selectorless, with the mirroring controller). A client on the host then reaches the
//! echo pods through: the infra VIP (local's data plane) -> the infra NodePort (kube-proxy) -> a VMI, i.e.
//! a tenant node, at the tenant NodePort -> the tenant's kube-proxy -> a pod.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use cluster_tests::{
    LONG, Namespace, cluster, echo_app, eventually, http_get, ingress, load_balancer, run,
    steady_answers, wait_rollout, workspace_root,
};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

const CLASS: &str = "ccm.rs/kubevirt";
const INFRA_NAMESPACE: &str = "tenant-1";
const INFRA_NODE: &str = "infra-host";

/// A process of the test, stopped (SIGTERM, then SIGKILL after 10 s) when dropped.
struct Process {
    child: Child,
}

impl Process {
    fn start(what: &str, log: &Path, command: &mut Command) -> Self {
        let log_file = std::fs::File::create(log).expect("a log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("the log file again"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {what}: {err}"));
        Self { child }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The infra API server, taken down when dropped.
struct InfraPlane(PathBuf);

impl Drop for InfraPlane {
    fn drop(&mut self) {
        let _ = Command::new(workspace_root().join("hack/control-plane"))
            .args(["down", "--dir"])
            .arg(&self.0)
            .output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// kube-proxy's nftables tables on the host, deleted when dropped (kube-proxy leaves them behind).
struct KubeProxyTables;

impl Drop for KubeProxyTables {
    fn drop(&mut self) {
        for family in ["ip", "ip6"] {
            let _ = Command::new("nft")
                .args(["delete", "table", family, "kube-proxy"])
                .output();
        }
    }
}

async fn client_for(kubeconfig: &Path) -> Client {
    let parsed = Kubeconfig::read_from(kubeconfig).expect("the infra kubeconfig");
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

fn vmis(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    );
    Api::namespaced_with(client.clone(), INFRA_NAMESPACE, &resource)
}

/// The manager built with every provider (`hack/test-cluster` builds it; `cargo test --all-features`
/// does too).
fn manager_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let binary = target.join("debug/cloud-controller-manager");
    assert!(
        binary.exists(),
        "{} is missing: cargo build --all-features -p cloud-controller-manager-bin (hack/test-cluster does)",
        binary.display()
    );
    binary
}

#[tokio::test]
async fn a_tenant_service_is_reachable_through_the_infra_clusters_load_balancer() {
    let c = cluster();
    c.ensure_manager(cluster_tests::ManagerForm::Deployment)
        .await;
    let work = c.dir().join("kubevirt");
    std::fs::create_dir_all(&work).unwrap();
    let logs = c.dir().join("logs");

    // The infra cluster: an API server with the VMI resource, one infra node (this host), one VMI per
    // tenant node.
    let plane_dir = work.join("infra");
    run(&[
        workspace_root()
            .join("hack/control-plane")
            .to_str()
            .unwrap(),
        "up",
        "--dir",
        plane_dir.to_str().unwrap(),
    ])
    .expect("the infra API server starts");
    let _plane = InfraPlane(plane_dir.clone());
    let infra_kubeconfig = plane_dir.join("admin.kubeconfig");
    run(&[
        "kubectl",
        "--kubeconfig",
        infra_kubeconfig.to_str().unwrap(),
        "apply",
        "-f",
        workspace_root()
            .join("hack/kubevirt/crds.yaml")
            .to_str()
            .unwrap(),
    ])
    .expect("the VMI resource");
    let infra = client_for(&infra_kubeconfig).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(infra.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": INFRA_NAMESPACE}})).unwrap(),
        )
        .await
        .unwrap();
    let infra_nodes: Api<Node> = Api::all(infra.clone());
    infra_nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": INFRA_NODE, "labels": {
                "topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": "zone-a"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    infra_nodes
        .patch_status(
            INFRA_NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": c.host_ip().to_string()}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "the host",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let vmi_api = eventually("the VMI resource served", LONG, || {
        let api = vmis(&infra);
        async move { api.list(&ListParams::default()).await.ok().map(|_| api) }
    })
    .await;
    for node in c.nodes() {
        vmi_api
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "metadata": {"name": node, "labels": {"cluster.x-k8s.io/role": "worker",
                        "cluster.x-k8s.io/cluster-name": "tenant-1"}},
                    "spec": {"domain": {"devices": {}}}}))
                .unwrap(),
            )
            .await
            .unwrap();
        vmi_api
            .patch_status(
                &node,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"phase": "Running", "nodeName": INFRA_NODE,
                    "interfaces": [{"name": "default", "ipAddress": c.node_ip(&node).to_string(),
                        "ipAddresses": [c.node_ip(&node).to_string()]}]}}),
                ),
            )
            .await
            .unwrap();
    }

    // The infra cluster's kube-proxy, on this host: NodePorts on the bridge address only, the machine's
    // conntrack settings left alone.
    let bins = run(&[
        workspace_root().join("hack/cluster").to_str().unwrap(),
        "bin-dir",
    ])
    .expect("hack/cluster bin-dir");
    let proxy_config = work.join("kube-proxy.yaml");
    std::fs::write(
        &proxy_config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             clientConnection: {{kubeconfig: {}}}\nhostnameOverride: {INFRA_NODE}\nmode: nftables\n\
             bindAddress: {host}\nhealthzBindAddress: 127.0.0.1:10356\nmetricsBindAddress: 127.0.0.1:10349\n\
             nodePortAddresses: [{host}/32]\n\
             conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}\noomScoreAdj: 0\n",
            infra_kubeconfig.display(),
            host = c.host_ip(),
        ),
    )
    .unwrap();
    let _tables = KubeProxyTables;
    let _kube_proxy = Process::start(
        "the infra kube-proxy",
        &logs.join("kubevirt-infra-kube-proxy.log"),
        Command::new(Path::new(&bins).join("kube-proxy"))
            .arg(format!("--config={}", proxy_config.display()))
            .arg("--v=1"),
    );

    // The infra cluster's load balancer: our manager with the `local` provider, leader mode, loopback
    // VIPs.
    let binary = manager_binary();
    let local_config = work.join("infra-local.yaml");
    std::fs::write(
        &local_config,
        "unlistedNodes: adopt\nmachines: {}\naddressPools:\n  - name: infra\n    addresses: [127.241.0.0/24]\n\
         loadBalancer:\n  healthCheck: {interval: 1s, timeout: 500ms, healthyThreshold: 1, unhealthyThreshold: 2}\n",
    )
    .unwrap();
    let _infra_manager = Process::start(
        "the infra cluster's manager (local)",
        &logs.join("kubevirt-infra-manager.log"),
        Command::new(&binary).args([
            "--cloud-provider=local",
            &format!("--cloud-config={}", local_config.display()),
            &format!("--kubeconfig={}", infra_kubeconfig.display()),
            "--controllers=cloud-node,service",
            "--leader-elect=false",
            "--secure-port=0",
        ]),
    );

    // The tenant's manager for class ccm.rs/kubevirt.
    let kubevirt_config = work.join("tenant-kubevirt.yaml");
    std::fs::write(
        &kubevirt_config,
        format!(
            "kubeconfig: {}\nnamespace: {INFRA_NAMESPACE}\nloadBalancer:\n  creationPollInterval: 1\n  selectorless: true\n  enableEPSController: true\ninstancesV2:\n  enabled: false\n",
            infra_kubeconfig.display()
        ),
    )
    .unwrap();
    let _tenant_manager = Process::start(
        "the tenant's manager (kubevirt)",
        &logs.join("kubevirt-tenant-manager.log"),
        Command::new(&binary).args([
            "--cloud-provider=kubevirt",
            &format!("--cloud-config={}", kubevirt_config.display()),
            &format!("--kubeconfig={}", c.admin_kubeconfig().display()),
            "--controllers=service",
            &format!("--load-balancer-class={CLASS}"),
            "--cluster-name=tenant-1",
            "--leader-elect=false",
            "--secure-port=0",
        ]),
    );

    // The tenant's Service, of the class.
    let ns = Namespace::new("kubevirt");
    c.kubectl(
        &["-n", ns.name(), "apply", "-f", "-"],
        Some(
            &[
                echo_app("echo", 3, true, None),
                load_balancer("web", "echo", &format!("loadBalancerClass: {CLASS}"), ""),
            ]
            .join("---\n"),
        ),
    );
    wait_rollout(ns.name(), "echo").await;
    let (vip, _) = ingress(ns.name(), "web").await;
    assert!(
        matches!(vip, IpAddr::V4(v4) if v4.octets()[..3] == [127, 241, 0]),
        "the tenant Service reports the infra VIP, not {vip}"
    );
    let address = SocketAddr::new(vip, 80);
    let pods = steady_answers("the echo pods answering through the infra VIP", address, 20).await;
    assert!(!pods.is_empty());

    // What the infra cluster has: the Service (no selector) and the mirrored slice with every VMI.
    let infra_services: Api<Service> = Api::namespaced(infra.clone(), INFRA_NAMESPACE);
    let found = infra_services
        .list(&ListParams::default().labels(&format!(
            "cluster.x-k8s.io/tenant-service-name=web,cluster.x-k8s.io/tenant-service-namespace={}",
            ns.name()
        )))
        .await
        .unwrap()
        .items;
    assert_eq!(found.len(), 1, "one infra Service for the tenant's");
    let infra_name = found[0].metadata.name.clone().unwrap();
    assert_eq!(found[0].spec.as_ref().unwrap().selector, None);
    let slices: Api<EndpointSlice> = Api::namespaced(infra.clone(), INFRA_NAMESPACE);
    let ready_addresses = |slices: Api<EndpointSlice>, name: String| async move {
        let list = slices
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
            .await
            .ok()?;
        let mut ready: Vec<String> = list
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .flat_map(|e| e.addresses.clone())
            .collect();
        ready.sort();
        Some(ready)
    };
    let all: Vec<String> = {
        let mut all: Vec<String> = c.nodes().iter().map(|n| c.node_ip(n).to_string()).collect();
        all.sort();
        all
    };
    eventually("every VMI ready in the infra slice", LONG, || {
        let (slices, name, all) = (slices.clone(), infra_name.clone(), all.clone());
        async move { (ready_addresses(slices, name).await? == all).then_some(()) }
    })
    .await;

    // A VMI fails: its endpoint leaves the infra Service, and the VIP keeps answering.
    let failed = c.nodes()[0].clone();
    vmi_api
        .patch_status(
            &failed,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    let failed_ip = c.node_ip(&failed).to_string();
    eventually("the failed VMI's endpoint not ready", LONG, || {
        let (slices, name, failed_ip) = (slices.clone(), infra_name.clone(), failed_ip.clone());
        async move {
            let ready = ready_addresses(slices, name).await?;
            (!ready.contains(&failed_ip) && !ready.is_empty()).then_some(())
        }
    })
    .await;
    for _ in 0..20 {
        http_get(address, "/")
            .await
            .expect("the VIP answers with one VMI down");
    }

    // Deleting the tenant Service deletes the infra Service (and so the VIP).
    c.kubectl(
        &["-n", ns.name(), "delete", "service", "web", "--wait=true"],
        None,
    );
    eventually("the infra Service deleted", LONG, || {
        let (api, name) = (infra_services.clone(), infra_name.clone());
        async move { api.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    drop(ns);
}
