//! The `kubevirt` provider on `hack/cluster`, with ccm-rs on both layers and traffic end to end, on the
//! bed `hack/kubevirt-bed` builds (its header says what runs where): hack/cluster is the tenant cluster
//! (its nodes play the VMIs), a second API server the infra cluster, whose load balancer is our manager
//! with the `local` provider and whose NodePorts a real kube-proxy serves on this host. A client on the
//! host reaches the echo pods through: the infra VIP (local's data plane) -> the infra NodePort
//! (kube-proxy) -> a VMI, i.e. a tenant node, at the tenant NodePort -> the tenant's kube-proxy -> a pod.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
};

use cluster_tests::{
    LONG, Namespace, cluster, echo_app, eventually, http_get, ingress, load_balancer, run,
    steady_answers, wait_rollout, workspace_root,
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
