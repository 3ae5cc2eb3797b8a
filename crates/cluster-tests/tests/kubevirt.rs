//! The `kubevirt` provider on `hack/cluster`, with ccm-rs on both layers and traffic end to end, on the
//! bed `hack/kubevirt-bed` builds (its header says what runs where): hack/cluster is the tenant cluster
//! (its nodes play the VMIs), a second API server the infra cluster, whose load balancer is our manager
//! with the `local` provider and whose NodePorts a real kube-proxy serves on this host. A client on the
//! host reaches the echo pods through: the infra VIP (local's data plane) -> the infra NodePort
//! (kube-proxy) -> a VMI, i.e. a tenant node, at the tenant NodePort -> the tenant's kube-proxy -> a pod.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use cluster_tests::{
    LONG, Namespace, answers, cluster, echo_app, eventually, http_get, ingress, load_balancer, run,
    wait_rollout, workspace_root,
};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, ListParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

const CLASS: &str = "ccm.rs/kubevirt";
const INFRA_NAMESPACE: &str = "tenant-1";

/// A process stopped (SIGSTOP) until this is dropped (SIGCONT), also when the test fails.
struct Stopped(String);

impl Stopped {
    fn process(pid_file: &Path) -> Self {
        let pid = std::fs::read_to_string(pid_file)
            .unwrap_or_else(|err| panic!("{}: {err}", pid_file.display()))
            .trim()
            .to_owned();
        run(&["kill", "-STOP", &pid]).expect("kill -STOP");
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = run(&["kill", "-CONT", &self.0]);
    }
}

/// A tenant Node the test made, deleted when dropped.
struct TenantNode(&'static str);

impl Drop for TenantNode {
    fn drop(&mut self) {
        let _ = cluster().kubectl_output(&["delete", "node", self.0, "--wait=false"], None);
    }
}

/// The bed, taken down when dropped (also when the test fails).
struct Bed(PathBuf);

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = Command::new(workspace_root().join("hack/kubevirt-bed"))
            .args(["down", "--dir"])
            .arg(&self.0)
            .output();
    }
}

async fn client_for(kubeconfig: &Path) -> Client {
    let parsed = Kubeconfig::read_from(kubeconfig).expect("the infra kubeconfig");
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

/// What the infra cluster's load balancer last logged about its backends (health changes, warnings such
/// as a failed connect), for a failed request to say why the VIP refused it.
fn infra_backend_log(bed: &Path) -> String {
    let log = std::fs::read_to_string(bed.join("logs/infra-manager.log")).unwrap_or_default();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("backend health changed"))
        .collect();
    format!(
        "the infra load balancer's last words on its backends:\n{}",
        lines[lines.len().saturating_sub(10)..].join("\n")
    )
}

fn vmis(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    );
    Api::namespaced_with(client.clone(), INFRA_NAMESPACE, &resource)
}

#[tokio::test]
async fn a_tenant_service_is_reachable_through_the_infra_clusters_load_balancer() {
    let c = cluster();
    c.ensure_manager(cluster_tests::ManagerForm::Deployment)
        .await;
    let dir = c.dir().join("kubevirt-bed");
    let _bed = Bed(dir.clone());
    run(&[
        workspace_root().join("hack/kubevirt-bed").to_str().unwrap(),
        "up",
        "--dir",
        dir.to_str().unwrap(),
        "--cluster",
        c.dir().to_str().unwrap(),
    ])
    .expect("hack/kubevirt-bed up");
    let infra = client_for(&dir.join("infra/admin.kubeconfig")).await;
    let vmi_api = vmis(&infra);

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
    // Every pod answering, not only the first to be ready: the infra kube-proxy sends to each tenant node
    // as soon as the mirrored slice lists it, and the freezes below must not meet one that its own
    // kube-proxy does not serve yet (a refused connection seen once).
    let pods = eventually(
        "all three echo pods answering through the infra VIP",
        LONG,
        || async move {
            let names: BTreeSet<String> = answers(address, 30).await.ok()?.into_iter().collect();
            (names.len() == 3).then_some(names)
        },
    )
    .await;
    assert_eq!(pods.len(), 3);

    // While the infra cluster's API server answers nothing (SIGSTOP), and then the tenant's, the VIP
    // keeps answering: no part of the data path waits on either.
    // The tenant's freeze stays under what its node lifecycle tolerates: hack/cluster's
    // kube-controller-manager marks a node NotReady (and its pods unready, so the tenant's kube-proxy
    // refuses the NodePort) once it has seen no lease renewal for 20 s, and a kubelet renews every 10 s:
    // a freeze of 10 s or more can end in Kubernetes' own reaction to a control plane that was away
    // (a 24 s freeze marks every node NotReady at the thaw; CI once saw the VIP refused a moment after
    // this test's 11 s one), which is not what is tested here. The infra cluster has no node lifecycle
    // (no kube-controller-manager).
    for (what, pid_file, requests) in [
        ("infra", dir.join("infra/run/kube-apiserver.pid"), 40),
        ("tenant", c.dir().join("cp/run/kube-apiserver.pid"), 20),
    ] {
        let _frozen = Stopped::process(&pid_file);
        for i in 0..requests {
            http_get(address, "/").await.unwrap_or_else(|err| {
                panic!(
                    "request {i} with the {what} API server frozen failed: {err}; {}",
                    infra_backend_log(&dir)
                )
            });
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

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
    for i in 0..20 {
        http_get(address, "/").await.unwrap_or_else(|err| {
            panic!(
                "request {i} with one VMI down failed: {err}; {}",
                infra_backend_log(&dir)
            )
        });
    }

    // A node of the kubevirt cloud: registered with its provider ID (as a kubelet started with
    // --provider-id=kubevirt://<vmi> would be), so the cluster's own manager leaves it alone. The
    // kubevirt manager initializes it from its VMI, and taints it when the VMI fails.
    let extra = "vm-extra";
    vmi_api
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": extra, "annotations": {"kubevirt.io/instancetype-name": "u1.large"}},
                "spec": {"domain": {"devices": {}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    vmi_api
        .patch_status(
            extra,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "nodeName": "infra-host",
                "interfaces": [{"name": "default", "ipAddress": "10.89.0.99", "ipAddresses": ["10.89.0.99"]}]}})),
        )
        .await
        .unwrap();
    let _extra_node = TenantNode(extra);
    c.kubectl(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {extra}, labels: {{kubernetes.io/hostname: {extra}}}}}\n\
             spec:\n  providerID: kubevirt://{extra}\n  taints: [{{key: node.cloudprovider.kubernetes.io/uninitialized, value: 'true', effect: NoSchedule}}]\n"
        )),
    );
    let tenant_nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client().await);
    let set_ready = |ready: &'static str| {
        let nodes = tenant_nodes.clone();
        async move {
            nodes
                .patch_status(
                    extra,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": ready,
                        "reason": "Test", "message": "set by the test",
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
                )
                .await
                .unwrap();
        }
    };
    set_ready("True").await;
    let initialized = eventually("the kubevirt node initialized from its VMI", LONG, || {
        let nodes = tenant_nodes.clone();
        async move {
            let node = nodes.get(extra).await.ok()?;
            let taints = node.spec.as_ref()?.taints.clone().unwrap_or_default();
            (!taints
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"))
            .then_some(node)
        }
    })
    .await;
    let labels = initialized.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("u1.large")
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("zone-a")
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/region")
            .map(String::as_str),
        Some("region-1")
    );
    let addresses: Vec<(String, String)> = initialized
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".to_owned(), "10.89.0.99".to_owned())),
        "{addresses:?}"
    );
    vmi_api
        .patch_status(
            extra,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    set_ready("False").await;
    eventually("the shutdown taint on the failed VMI's node", LONG, || {
        let nodes = tenant_nodes.clone();
        async move {
            let node = nodes.get(extra).await.ok()?;
            node.spec?
                .taints?
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/shutdown")
                .then_some(())
        }
    })
    .await;

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
