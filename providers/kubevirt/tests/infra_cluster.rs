//! The `kubevirt` provider against two real API servers: the test control plane as the tenant cluster
//! and a second one as the infra cluster (KubeVirt's VMI resource from `hack/kubevirt/crds.yaml`, VMIs
//! and infra Nodes made by the test, the provider's identity limited to `deploy/kubevirt/infra-rbac.yaml`).
//! The real manager runs in-process on the tenant side; the test plays the infra cluster's
//! load-balancer implementation (it gives the infra Service its address) and its endpoint-slice
//! controller on the tenant side (it writes the tenant Service's EndpointSlices).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use cloud_provider::{CloudConfig, CloudProvider};
use cloud_provider_kubevirt::KubevirtCloud;
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use manager_testkit::ManagerUnderTest;
use serde_json::json;
use test_control_plane::{
    apply_manifest, control_plane, infra_control_plane, kubelet_node, unique_name, workspace_root,
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The manager acts on every node of the tenant cluster: one test at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());
const WAIT: Duration = Duration::from_secs(30);
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
const CLUSTER: &str = "kubernetes";

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(WAIT, what, check).await
}

async fn eventually_within<T, F, Fut>(wait: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    manager_testkit::eventually(what, wait, check).await
}

async fn infra() -> Client {
    infra_control_plane().admin_client().await
}

async fn tenant() -> Client {
    control_plane().admin_client().await
}

fn vmis(client: Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client,
        namespace,
        &cloud_provider_kubevirt::vmi::api_resource(),
    )
}

/// An infra namespace with the VMI resource, the provider's Role (bound to the `ccm.kubeconfig` user as
/// well as to its ServiceAccount) and two infra nodes in two zones.
struct InfraBed {
    namespace: String,
    config: tempfile::NamedTempFile,
}

async fn infra_bed(extra_config: &str, rbac: bool) -> InfraBed {
    let client = infra().await;
    let crds = std::fs::read_to_string(workspace_root().join("hack/kubevirt/crds.yaml")).unwrap();
    apply_manifest(&client, &crds, false).await;
    let namespace = unique_name("kv");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    if rbac {
        let rbac =
            std::fs::read_to_string(workspace_root().join("deploy/kubevirt/infra-rbac.yaml"))
                .unwrap()
                .replace("NAMESPACE", &namespace);
        apply_manifest(&client, &rbac, false).await;
        let as_user = format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: ccm-user, namespace: {namespace}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: kubevirt-ccm}}\n\
             subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: 'system:cloud-controller-manager'}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: kubevirt-ccm-nodes-user}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kubevirt-ccm-nodes}}\n\
             subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: 'system:cloud-controller-manager'}}]\n"
        );
        apply_manifest(&client, &as_user, false).await;
    }
    for (node, zone) in [("infra-a", "zone-a"), ("infra-b", "zone-b")] {
        let object = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": zone,
            }},
        });
        Api::<Node>::all(client.clone())
            .patch(
                node,
                &PatchParams::apply("kubevirt-test").force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap();
    }
    // The CRD is served once a list works.
    eventually("the VMI resource to be served", || {
        let api = vmis(client.clone(), &namespace);
        async move { api.list(&ListParams::default()).await.ok() }
    })
    .await;
    let mut config = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut config,
        format!(
            "kubeconfig: {}\nnamespace: {namespace}\n{extra_config}",
            infra_control_plane().ccm_kubeconfig().display()
        )
        .as_bytes(),
    )
    .unwrap();
    InfraBed { namespace, config }
}

impl InfraBed {
    fn cloud(&self) -> KubevirtCloud {
        let config = CloudConfig::read(self.config.path()).unwrap();
        let parsed = cloud_provider_kubevirt::Config::parse(
            config.text().unwrap().unwrap_or_default(),
            "test",
        )
        .unwrap();
        KubevirtCloud::new(parsed).unwrap()
    }

    /// A VMI `name` on `infra_node`, `Running`, with these addresses on its `default` interface.
    async fn vmi(&self, name: &str, infra_node: &str, addresses: &[&str], hostname: Option<&str>) {
        let api = vmis(infra().await, &self.namespace);
        let mut object = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": self.namespace,
                "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/role": "worker"},
                "annotations": {"kubevirt.io/instancetype-name": "u1.medium"}},
            "spec": {"domain": {"devices": {}}},
        });
        if let Some(hostname) = hostname {
            object["spec"]["hostname"] = json!(hostname);
        }
        api.create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
        self.set_vmi_status(
            name,
            json!({"phase": "Running", "nodeName": infra_node, "interfaces": [
                {"name": "default", "ipAddress": addresses[0], "ipAddresses": addresses},
            ]}),
        )
        .await;
    }

    async fn set_vmi_status(&self, name: &str, status: serde_json::Value) {
        vmis(infra().await, &self.namespace)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap();
    }

    async fn set_phase(&self, name: &str, phase: &str) {
        self.set_vmi_status(name, json!({"phase": phase})).await;
    }

    async fn services(&self) -> Api<Service> {
        Api::namespaced(infra().await, &self.namespace)
    }

    async fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(infra().await, &self.namespace)
    }
}

/// The real manager in-process on the tenant cluster, with the `kubevirt` provider of `bed`.
async fn start_manager(bed: &InfraBed, controllers: &str) -> ManagerUnderTest {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_ansi(false)
        .with_env_filter("info")
        .try_init();
    test_control_plane::apply_shipped_rbac().await;
    let tenant_rbac =
        std::fs::read_to_string(workspace_root().join("deploy/kubevirt/tenant-rbac.yaml")).unwrap();
    apply_manifest(&tenant().await, &tenant_rbac, false).await;
    let config = format!("--cloud-config={}", bed.config.path().display());
    let controllers = format!("--controllers={controllers}");
    let args = [
        config.as_str(),
        controllers.as_str(),
        "--node-monitor-period=200ms",
        "--node-status-update-frequency=500ms",
    ];
    ManagerUnderTest::start_linked("kubevirt", &args).await
}

async fn set_ready(name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({ "status": { "conditions": [{
        "type": "Ready", "status": status, "reason": "Test", "message": "set by the test",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    Api::<Node>::all(tenant().await)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("node status patched");
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn tenant_nodes_initialize_from_their_vmis_and_follow_them() {
    let _serial = SERIAL.lock().await;
    let bed = infra_bed("", true).await;
    // Three nodes, one per look-up: by name (dual-stack), by hostname, by the instance-id label.
    let by_name = unique_name("vm");
    let by_hostname = unique_name("host");
    let hostname_vmi = unique_name("vmi");
    let labelled = unique_name("node");
    let labelled_vmi = unique_name("vmi");
    bed.vmi(&by_name, "infra-a", &["10.89.7.11", "fd00:89:7::11"], None)
        .await;
    bed.vmi(
        &hostname_vmi,
        "infra-b",
        &["10.89.7.12"],
        Some(&by_hostname),
    )
    .await;
    bed.vmi(&labelled_vmi, "infra-a", &["10.89.7.13"], None)
        .await;

    let manager = start_manager(&bed, "cloud-node,cloud-node-lifecycle").await;
    let nodes: Api<Node> = Api::all(tenant().await);
    for name in [&by_name, &by_hostname, &labelled] {
        let mut node = kubelet_node(name);
        if name == &labelled {
            node.metadata.labels.get_or_insert_default().insert(
                "node.kubernetes.io/instance-id".into(),
                labelled_vmi.clone(),
            );
        }
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    for (name, vmi, zone, expected) in [
        (
            &by_name,
            &by_name,
            "zone-a",
            vec![
                ("InternalIP", "10.89.7.11"),
                ("InternalIP", "fd00:89:7::11"),
                ("Hostname", by_name.as_str()),
            ],
        ),
        (
            &by_hostname,
            &hostname_vmi,
            "zone-b",
            vec![
                ("InternalIP", "10.89.7.12"),
                ("Hostname", by_hostname.as_str()),
            ],
        ),
        (
            &labelled,
            &labelled_vmi,
            "zone-a",
            vec![
                ("InternalIP", "10.89.7.13"),
                ("Hostname", labelled.as_str()),
            ],
        ),
    ] {
        // The manager writes the provider ID (a PUT of the node) and then, off the initializing
        // worker, the addresses (its status): wait for both, then check what they are.
        let node = eventually(&format!("node {name} initialized with addresses"), || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(name).await.ok()?;
                let initialized = node.spec.as_ref()?.provider_id.is_some();
                let addressed = addresses(&node).iter().any(|(t, _)| t == "InternalIP");
                (initialized && addressed).then_some(node)
            }
        })
        .await;
        assert_eq!(
            node.spec.as_ref().unwrap().provider_id.as_deref(),
            Some(format!("kubevirt://{vmi}").as_str())
        );
        assert_eq!(
            label(&node, "node.kubernetes.io/instance-type"),
            Some("u1.medium")
        );
        assert_eq!(label(&node, "topology.kubernetes.io/zone"), Some(zone));
        assert_eq!(
            label(&node, "topology.kubernetes.io/region"),
            Some("region-1")
        );
        let expected: Vec<(String, String)> = expected
            .into_iter()
            .map(|(t, a)| (t.to_owned(), a.to_owned()))
            .collect();
        assert_eq!(addresses(&node), expected, "{name}");
        assert!(
            !taint_keys(&node)
                .contains(&"node.cloudprovider.kubernetes.io/uninitialized".to_owned())
        );
    }

    // A VMI in phase Unknown (its infra node is down): neither the shutdown taint nor a deletion.
    set_ready(&labelled, false).await;
    bed.set_phase(&labelled_vmi, "Unknown").await;
    // The VMI of the first node fails: its NotReady node gets the shutdown taint.
    set_ready(&by_name, false).await;
    bed.set_phase(&by_name, "Failed").await;
    eventually("the shutdown taint on the failed VMI's node", || {
        let nodes = nodes.clone();
        let name = by_name.clone();
        async move {
            let node = nodes.get(&name).await.ok()?;
            taint_keys(&node)
                .contains(&SHUTDOWN_TAINT.to_owned())
                .then_some(())
        }
    })
    .await;
    // The hostname node's VMI is deleted: its NotReady node is deleted.
    set_ready(&by_hostname, false).await;
    vmis(infra().await, &bed.namespace)
        .delete(&hostname_vmi, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the node of the deleted VMI to be deleted", || {
        let nodes = nodes.clone();
        let name = by_hostname.clone();
        async move { nodes.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    // By now the Unknown VMI's node has been looked at many times (200 ms monitor period).
    let unknown = nodes
        .get(&labelled)
        .await
        .expect("the Unknown VMI's node stays");
    assert!(
        !taint_keys(&unknown).contains(&SHUTDOWN_TAINT.to_owned()),
        "phase Unknown is not a shutdown"
    );

    manager.stop().await;
    for name in [&by_name, &labelled] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
}

fn lb_service(name: &str, etp: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"example.com/owner": "team-a"}},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp,
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .unwrap()
}

fn node_port(service: &Service, index: usize) -> i32 {
    service.spec.as_ref().unwrap().ports.as_ref().unwrap()[index]
        .node_port
        .unwrap()
}

/// A namespace of the test's own in the tenant cluster.
async fn tenant_namespace(prefix: &str) -> String {
    let namespace = unique_name(prefix);
    Api::<Namespace>::all(tenant().await)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    namespace
}

/// The infra Service `name`, once it exists.
async fn wait_infra_service(api: &Api<Service>, name: &str) -> Service {
    eventually(&format!("the infra Service {name}"), || async move {
        api.get_opt(name).await.ok()?
    })
    .await
}

/// Plays the infra cluster's load-balancer implementation for one Service: gives it `ip`.
async fn give_address(api: &Api<Service>, name: &str, ip: &str) {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})),
    )
    .await
    .unwrap();
}

/// Waits until the tenant Service `name` reports `ip`.
async fn tenant_address(services: &Api<Service>, name: &str, ip: &str) {
    eventually(
        &format!("the tenant Service {name} at {ip}"),
        || async move {
            let ingress = services
                .get(name)
                .await
                .ok()?
                .status?
                .load_balancer?
                .ingress?;
            (ingress.first()?.ip.as_deref() == Some(ip)).then_some(())
        },
    )
    .await;
}

/// Waits until none of the infra Services `names` exists.
async fn infra_services_gone(api: &Api<Service>, names: &[&str]) {
    eventually("the infra Services deleted", || async move {
        for name in names {
            api.get_opt(name).await.ok()?.is_none().then_some(())?;
        }
        Some(())
    })
    .await;
}

#[tokio::test]
async fn load_balancers_are_infra_services_and_mirror_local_endpoints() {
    let _serial = SERIAL.lock().await;
    let bed = infra_bed(
        "loadBalancer:\n  creationPollInterval: 1\n  enableEPSController: true\n",
        true,
    )
    .await;
    let node_a = unique_name("vm");
    let node_b = unique_name("vm");
    bed.vmi(&node_a, "infra-a", &["10.89.8.11"], None).await;
    bed.vmi(&node_b, "infra-b", &["10.89.8.12"], None).await;
    let namespace = tenant_namespace("shop").await;
    let tenant = tenant().await;
    let manager = start_manager(&bed, "service").await;
    let services: Api<Service> = Api::namespaced(tenant.clone(), &namespace);
    let web = services
        .create(&PostParams::default(), &lb_service("web", "Cluster"))
        .await
        .unwrap();
    let infra_name = cloud_provider::default_load_balancer_name(&web);
    let infra_services = bed.services().await;
    let infra_service = wait_infra_service(&infra_services, &infra_name).await;
    let labels = infra_service.metadata.labels.clone().unwrap();
    assert_eq!(labels["cluster.x-k8s.io/tenant-service-name"], "web");
    assert_eq!(
        labels["cluster.x-k8s.io/tenant-service-namespace"],
        namespace
    );
    assert_eq!(labels["cluster.x-k8s.io/cluster-name"], CLUSTER);
    assert_eq!(
        infra_service.metadata.annotations.as_ref().unwrap()["example.com/owner"],
        "team-a"
    );
    let spec = infra_service.spec.clone().unwrap();
    assert_eq!(
        spec.selector,
        Some(BTreeMap::from([
            ("cluster.x-k8s.io/role".to_owned(), "worker".to_owned()),
            (
                "cluster.x-k8s.io/cluster-name".to_owned(),
                CLUSTER.to_owned()
            ),
        ]))
    );
    let port = &spec.ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 80);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(node_port(&web, 0)))
    );
    // The tenant waits for the infra address; the infra's load-balancer implementation (the test) gives
    // one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pending = services.get("web").await.unwrap();
    assert!(
        pending
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_none()
    );
    give_address(&infra_services, &infra_name, "192.0.2.40").await;
    tenant_address(&services, "web", "192.0.2.40").await;
    // Quiet: a new manager's first look at a load balancer that is as it should be writes nothing to the
    // infra cluster (nor to the tenant's Service).
    manager.stop().await;
    let before = infra_services.get(&infra_name).await.unwrap();
    let tenant_before = services.get("web").await.unwrap();
    let manager = start_manager(&bed, "service").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        infra_services
            .get(&infra_name)
            .await
            .unwrap()
            .metadata
            .resource_version,
        before.metadata.resource_version,
        "a sync that finds nothing to change writes nothing to the infra Service"
    );
    assert_eq!(
        services.get("web").await.unwrap().metadata.resource_version,
        tenant_before.metadata.resource_version,
        "nor to the tenant's"
    );
    // A new port reaches the infra Service.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"},
            ]}})),
        )
        .await
        .unwrap();
    let web = services.get("web").await.unwrap();
    eventually("the infra Service's second port", || {
        let api = infra_services.clone();
        let name = infra_name.clone();
        let wanted = node_port(&web, 1);
        async move {
            let ports = api.get(&name).await.ok()?.spec?.ports?;
            (ports.len() == 2
                && ports[1].port == 443
                && ports[1].target_port
                    == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(wanted)))
            .then_some(())
        }
    })
    .await;

    // externalTrafficPolicy: Local with the mirroring controller: no selector, and the infra slices
    // follow the tenant's endpoints from node to node.
    let local = services
        .create(&PostParams::default(), &lb_service("local", "Local"))
        .await
        .unwrap();
    let local_infra = cloud_provider::default_load_balancer_name(&local);
    let created = wait_infra_service(&infra_services, &local_infra).await;
    assert_eq!(created.spec.unwrap().selector, None);
    let tenant_slices: Api<EndpointSlice> = Api::namespaced(tenant.clone(), &namespace);
    let tenant_slice = |node: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "local-abc", "labels": {"kubernetes.io/service-name": "local"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": node,
                "conditions": {"ready": true, "serving": true, "terminating": false}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }))
        .unwrap()
    };
    tenant_slices
        .create(&PostParams::default(), &tenant_slice(&node_a))
        .await
        .unwrap();
    let infra_slices = bed.slices().await;
    let mirrored = |address: &'static str, ready: bool| {
        let api = infra_slices.clone();
        let name = local_infra.clone();
        move || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let list = api
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={name}")),
                    )
                    .await
                    .ok()?;
                let endpoints: Vec<_> = list
                    .items
                    .iter()
                    .flat_map(|s| s.endpoints.iter().flatten())
                    .collect();
                (endpoints.len() == 1
                    && endpoints[0].addresses == vec![address.to_owned()]
                    && endpoints[0].conditions.as_ref()?.ready == Some(ready))
                .then_some(list.items)
            }
        }
    };
    let slices = eventually(
        "the infra slice with node A's VMI",
        mirrored("10.89.8.11", true),
    )
    .await;
    let slice = &slices[0];
    assert_eq!(
        slice.metadata.labels.as_ref().unwrap()["endpointslice.kubernetes.io/managed-by"],
        "kubevirt-eps-controller"
    );
    assert_eq!(
        slice.ports.as_ref().unwrap()[0].port,
        Some(node_port(&local, 0))
    );
    assert_eq!(
        slice.endpoints.as_ref().unwrap()[0].node_name.as_deref(),
        Some("infra-a")
    );
    // The pod moves to node B.
    tenant_slices
        .replace("local-abc", &PostParams::default(), &{
            let mut moved = tenant_slice(&node_b);
            moved.metadata.resource_version = tenant_slices
                .get("local-abc")
                .await
                .unwrap()
                .metadata
                .resource_version;
            moved
        })
        .await
        .unwrap();
    let settled = eventually(
        "the infra slice with node B's VMI",
        mirrored("10.89.8.12", true),
    )
    .await;
    // Quiet: with nothing to change, the next looks write nothing (the tenant's status write and the
    // infra Services' own updates wake the loop meanwhile).
    services
        .patch(
            "local",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = infra_slices
        .get(settled[0].metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version, settled[0].metadata.resource_version,
        "a look that finds nothing to do writes nothing"
    );
    // Node B's VMI fails: its endpoint is no longer ready.
    bed.set_phase(&node_b, "Failed").await;
    eventually("node B's endpoint not ready", mirrored("10.89.8.12", false)).await;

    // Deleting the tenant Services deletes the infra Services; the mirrored slices go with theirs.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    services
        .delete("local", &DeleteParams::default())
        .await
        .unwrap();
    infra_services_gone(&infra_services, &[&infra_name, &local_infra]).await;
    eventually("the mirrored slices deleted", || {
        let api = infra_slices.clone();
        let name = local_infra.clone();
        async move {
            api.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;
    manager.stop().await;
    let _ = Api::<Namespace>::all(tenant)
        .delete(&namespace, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn what_is_wrong_is_said() {
    let _serial = SERIAL.lock().await;
    // A kubeconfig that is not there stops the provider at start, naming it.
    let missing = cloud_provider_kubevirt::new_provider(&CloudConfig::from_bytes(
        None,
        "kubeconfig: /nonexistent/infra.kubeconfig\n",
    ))
    .err()
    .expect("refused");
    assert!(
        missing
            .to_string()
            .contains("/nonexistent/infra.kubeconfig"),
        "{missing}"
    );

    // An infra cluster that has not granted the provider's Role: each call says so.
    let bed = infra_bed("", false).await;
    let cloud = Arc::new(bed.cloud());
    let stop = CancellationToken::new();
    cloud
        .initialize(cloud_provider::InitializeContext {
            client: tenant().await,
            supervisor: cloud_provider::Supervisor::new(Default::default(), stop.clone()),
            shutdown: stop.clone(),
            api_outage: cloud_provider::ApiOutage::never(),
            cluster_name: CLUSTER.into(),
        })
        .await
        .expect("a refusing infra cluster does not stop the manager");
    let node = kubelet_node("vm-denied");
    let denied = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&node)
        .await
        .expect_err("forbidden");
    let message = denied.to_string();
    assert!(
        message.contains("lacks this permission") && message.contains(&bed.namespace),
        "{message}"
    );

    // A VMI without a `default` interface.
    let granted = infra_bed("", true).await;
    let cloud = Arc::new(granted.cloud());
    cloud
        .initialize(cloud_provider::InitializeContext {
            client: tenant().await,
            supervisor: cloud_provider::Supervisor::new(Default::default(), stop.clone()),
            shutdown: stop.clone(),
            api_outage: cloud_provider::ApiOutage::never(),
            cluster_name: CLUSTER.into(),
        })
        .await
        .unwrap();
    let name = unique_name("vm");
    granted.vmi(&name, "infra-a", &["10.89.9.1"], None).await;
    granted
        .set_vmi_status(
            &name,
            json!({"interfaces": [{"name": "secondary", "ipAddress": "192.168.5.5"}]}),
        )
        .await;
    let err = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&kubelet_node(&name))
        .await
        .expect_err("no default interface");
    assert!(
        err.to_string()
            .contains("has no interface named \"default\""),
        "{err}"
    );
    // A node that has no VMI at all is "not found" (the framework's InstanceNotFound).
    let none = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&kubelet_node("no-such-vmi"))
        .await
        .expect_err("not found");
    assert!(none.is_instance_not_found(), "{none}");
    stop.cancel();
}

/// Plays the infra cluster's load-balancer implementation until `stop`: every infra Service of `bed`
/// without an address gets 192.0.2.50.
async fn give_addresses(bed: &InfraBed, stop: CancellationToken) {
    let api = bed.services().await;
    while !stop.is_cancelled() {
        for service in api.list(&ListParams::default()).await.unwrap().items {
            let has = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty());
            if !has {
                let _ = api
                    .patch_status(
                        service.metadata.name.as_deref().unwrap(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.50"}]}}})),
                    )
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_kubevirt_provider_passes_the_conformance_suite() {
    use cloud_provider::conformance::{Fixtures, run};
    let _serial = SERIAL.lock().await;
    let bed = infra_bed("loadBalancer:\n  creationPollInterval: 1\n", true).await;
    let (running, stopped) = (unique_name("vm"), unique_name("vm"));
    bed.vmi(&running, "infra-a", &["10.89.10.1"], None).await;
    bed.vmi(&stopped, "infra-b", &["10.89.10.2"], None).await;
    bed.set_phase(&stopped, "Succeeded").await;
    let cloud = bed.cloud();
    let stop = CancellationToken::new();
    cloud
        .initialize(cloud_provider::InitializeContext {
            client: tenant().await,
            supervisor: cloud_provider::Supervisor::new(Default::default(), stop.clone()),
            shutdown: stop.clone(),
            api_outage: cloud_provider::ApiOutage::never(),
            cluster_name: CLUSTER.into(),
        })
        .await
        .unwrap();
    let addresses = tokio::spawn({
        let bed = InfraBed {
            namespace: bed.namespace.clone(),
            config: tempfile::NamedTempFile::new().unwrap(),
        };
        let stop = stop.clone();
        async move { give_addresses(&bed, stop).await }
    });
    let fixtures = Fixtures::new(&running, &unique_name("absent"))
        .with_shutdown_node(&stopped)
        .with_backend_nodes(&[&running]);
    let report = run(&cloud, &fixtures).await;
    stop.cancel();
    addresses.await.unwrap();
    report.assert_passed();
    assert!(
        report
            .passed()
            .iter()
            .any(|r| r.name == "load_balancer_is_listed_and_deleted_as_an_orphan"),
        "the sweep's contract is checked, not skipped: {:?}",
        report.results
    );
}

#[tokio::test]
async fn an_infra_api_server_that_is_away_delays_the_work_and_loses_none() {
    let _serial = SERIAL.lock().await;
    let bed = infra_bed("loadBalancer:\n  creationPollInterval: 1\n", true).await;
    let namespace = tenant_namespace("away").await;
    let tenant = tenant().await;
    let manager = start_manager(&bed, "service").await;
    // The infra API server answers nothing (SIGSTOP) while a tenant Service is created.
    let frozen = infra_control_plane().freeze_api_server();
    let services: Api<Service> = Api::namespaced(tenant.clone(), &namespace);
    let web = services
        .create(&PostParams::default(), &lb_service("web", "Cluster"))
        .await
        .unwrap();
    // The manager says so on the Service (a Warning event) and keeps the work.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(tenant.clone(), &namespace);
    // Each call to the frozen server fails after the infra client's 15 s timeout; the manager's start
    // (its provider's first look at the infra cluster) may be one of them.
    eventually_within(
        Duration::from_secs(90),
        "a Warning event on the Service while the infra API server is away",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("SyncLoadBalancerFailed")
                            && e.message
                                .as_deref()
                                .is_some_and(|m| m.contains("infra API server"))
                    })
                    .then_some(())
            }
        },
    )
    .await;
    drop(frozen);
    // Back: the infra Service is created, gets its address, and the tenant reports it.
    let infra_name = cloud_provider::default_load_balancer_name(&web);
    let infra_services = bed.services().await;
    wait_infra_service(&infra_services, &infra_name).await;
    give_address(&infra_services, &infra_name, "192.0.2.41").await;
    tenant_address(&services, "web", "192.0.2.41").await;
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    infra_services_gone(&infra_services, &[&infra_name]).await;
    manager.stop().await;
    let _ = Api::<Namespace>::all(tenant)
        .delete(&namespace, &DeleteParams::default())
        .await;
}
