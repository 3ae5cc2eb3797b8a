//! The protobuf reads against the real API server (the test control plane's): a kubelet-sized Node
//! and a load-balancer Service read in protobuf are the same read in JSON, and the caches' list and
//! watch hear every change in protobuf, paged or streamed.

use std::time::Duration;

use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use test_control_plane::{control_plane, kubelet_node, unique_name};

use super::{ProtobufObject, envelope, list_and_watch};
use crate::{cached_node::CachedNode, informers::InitialList};

const WAIT: Duration = Duration::from_secs(30);

async fn client() -> Client {
    control_plane().admin_client().await
}

/// What a kubelet writes into its Node's status, every field set (images included, which the cache
/// drops), and a spec with what the cloud-node controller and IPAM write.
async fn create_full_node(client: &Client, name: &str) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = kubelet_node(name);
    node.metadata.annotations = Some([("example.com/note".to_owned(), "kept".to_owned())].into());
    // An empty value, which Go writes and prost leaves out (no unknown field for all that).
    node.metadata.labels.get_or_insert_default().insert(
        "node-role.kubernetes.io/control-plane".into(),
        String::new(),
    );
    let spec = node.spec.as_mut().unwrap();
    spec.provider_id = Some(format!("fake://{name}"));
    spec.pod_cidr = Some("10.244.7.0/24".into());
    spec.pod_cidrs = Some(vec!["10.244.7.0/24".into(), "fd00:7::/64".into()]);
    spec.taints
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::Taint {
            key: "example.com/dedicated".into(),
            value: None,
            effect: "NoExecute".into(),
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-12-02T10:00:00Z".parse().unwrap(),
            )),
        });
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("the node is created");
    let images: Vec<serde_json::Value> = (0..30)
        .map(|i| serde_json::json!({"names": [format!("registry.example/image-{i}:v1")], "sizeBytes": 1000 + i}))
        .collect();
    let status = serde_json::json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
        "allocatable": {"cpu": "7800m", "memory": "31Gi", "pods": "110"},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-12-02T10:00:01Z", "lastTransitionTime": "2026-12-02T09:00:00Z"},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "",
             "lastHeartbeatTime": "2026-12-02T10:00:01Z", "lastTransitionTime": "2026-12-02T09:00:00Z"},
        ],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1.0",
            "osImage": "Debian", "containerRuntimeVersion": "containerd://2.0", "kubeletVersion": "v1.37.1",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            "swap": {"capacity": 0}},
        "images": images,
        "volumesInUse": ["kubernetes.io/csi/x^vol-1"],
        "volumesAttached": [{"name": "kubernetes.io/csi/x^vol-1", "devicePath": ""}],
        "runtimeHandlers": [{"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": false}}],
        "features": {"supplementalGroupsPolicy": true},
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the node's status is written")
}

/// The object at `path` read with `accept`: whether it came in protobuf, and its body.
async fn get(client: &Client, path: &str, accept: &str) -> (bool, bytes::Bytes) {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::empty())
        .unwrap();
    let response = client.send(request).await.expect("the node is read");
    assert!(response.status().is_success(), "{}", response.status());
    let protobuf = envelope::is_protobuf(response.headers().get(http::header::CONTENT_TYPE));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (protobuf, body)
}

#[tokio::test]
async fn a_node_read_in_protobuf_is_the_node_read_in_json() {
    let client = client().await;
    let name = unique_name("protobuf-node");
    let written = create_full_node(&client, &name).await;
    assert_eq!(
        written
            .status
            .as_ref()
            .unwrap()
            .images
            .as_ref()
            .map(Vec::len),
        Some(30)
    );

    let path = format!("/api/v1/nodes/{name}");
    let (protobuf, body) = get(&client, &path, envelope::PROTOBUF).await;
    assert!(protobuf, "the API server answered in protobuf");
    let object = envelope::unwrap(body).unwrap();
    assert_eq!(object.kind, "Node");
    let from_protobuf = CachedNode::from_protobuf(object.raw).unwrap();

    let (protobuf, body) = get(&client, &path, "application/json").await;
    assert!(!protobuf);
    let from_json: CachedNode = serde_json::from_slice(&body).unwrap();

    assert_eq!(from_protobuf, from_json);
    assert_eq!(from_protobuf.unknown_field(), None);
    let status = from_protobuf.status.as_ref().unwrap();
    assert_eq!(status.images, None, "not cached");
    assert_eq!(from_protobuf.metadata.managed_fields, None, "not cached");
    assert_eq!(status.conditions.as_ref().map(Vec::len), Some(2));
    assert_eq!(
        from_protobuf
            .spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .map(Vec::len),
        Some(2)
    );

    Api::<Node>::all(client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_service_read_in_protobuf_is_the_service_read_in_json() {
    let client = client().await;
    let namespace = unique_name("protobuf-service");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"example.com/note": "kept"},
            "finalizers": ["service.kubernetes.io/load-balancer-cleanup"]},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http", "appProtocol": "http"},
                {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353},
            ],
            "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": ["10.0.0.0/8"],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
            "loadBalancerClass": "example.com/lb",
            "allocateLoadBalancerNodePorts": false,
        },
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let status = serde_json::json!({"status": {
        "loadBalancer": {"ingress": [
            {"ip": "192.0.2.10", "ipMode": "VIP", "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP", "error": "Pending"}]},
            {"hostname": "lb.example.com"},
        ]},
        "conditions": [{"type": "example.com/Ensured", "status": "True", "reason": "Ensured", "message": "",
            "lastTransitionTime": "2026-12-02T10:00:00Z", "observedGeneration": 1}],
    }});
    services
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    let path = format!("/api/v1/namespaces/{namespace}/services/web");
    let (protobuf, body) = get(&client, &path, envelope::PROTOBUF).await;
    assert!(protobuf, "the API server answered in protobuf");
    let object = envelope::unwrap(body).unwrap();
    assert_eq!(object.kind, "Service");
    let mut from_protobuf = Service::from_protobuf(object.raw).unwrap();
    let (_, body) = get(&client, &path, "application/json").await;
    let mut from_json: Service = serde_json::from_slice(&body).unwrap();
    // The cache prunes them from both (`informers::prune_service`).
    crate::informers::prune_service(&mut from_protobuf);
    crate::informers::prune_service(&mut from_json);
    assert_eq!(from_protobuf, from_json);
    let spec = from_protobuf.spec.as_ref().unwrap();
    assert_eq!(spec.ports.as_ref().map(Vec::len), Some(2));
    assert!(spec.health_check_node_port.is_some(), "allocated for Local");

    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    Api::<Namespace>::all(client)
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}

/// The next event of `events` that concerns `name` (or ends the initial list), within [`WAIT`].
async fn next_about(
    events: &mut (impl Stream<Item = Result<watcher::Event<CachedNode>, watcher::Error>> + Unpin),
    name: &str,
) -> watcher::Event<CachedNode> {
    tokio::time::timeout(WAIT, async {
        loop {
            let event = events
                .next()
                .await
                .expect("the watch goes on")
                .expect("no error");
            let about = match &event {
                watcher::Event::Apply(n)
                | watcher::Event::Delete(n)
                | watcher::Event::InitApply(n) => n.metadata.name.as_deref() == Some(name),
                watcher::Event::Init | watcher::Event::InitDone => true,
            };
            if about {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("an event about {name} within {WAIT:?}"))
}

fn summary(event: &watcher::Event<CachedNode>) -> String {
    match event {
        watcher::Event::Init => "init".into(),
        watcher::Event::InitDone => "init done".into(),
        watcher::Event::InitApply(n) => format!("listed {}", n.metadata.name.as_deref().unwrap()),
        watcher::Event::Apply(n) => format!(
            "applied {} {}",
            n.metadata.name.as_deref().unwrap(),
            n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .unwrap_or("-")
        ),
        watcher::Event::Delete(n) => format!("deleted {}", n.metadata.name.as_deref().unwrap()),
    }
}

#[tokio::test]
async fn the_node_cache_lists_and_watches_every_change_in_protobuf() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for initial_list in [InitialList::ListThenWatch, InitialList::Streaming] {
        let listed = unique_name("protobuf-listed");
        create_full_node(&client, &listed).await;
        let mut events = Box::pin(list_and_watch::<CachedNode>(client.clone(), initial_list));
        let mut seen = Vec::new();
        loop {
            let event = next_about(&mut events, &listed).await;
            seen.push(summary(&event));
            if matches!(event, watcher::Event::InitDone) {
                break;
            }
        }
        assert_eq!(
            seen,
            ["init", &format!("listed {listed}"), "init done"],
            "{initial_list:?}"
        );

        let watched = unique_name("protobuf-watched");
        create_full_node(&client, &watched).await;
        // The create, then the status write.
        for _ in 0..2 {
            assert_eq!(
                summary(&next_about(&mut events, &watched).await),
                format!("applied {watched} fake://{watched}"),
                "{initial_list:?}"
            );
        }
        nodes
            .delete(&watched, &DeleteParams::default())
            .await
            .unwrap();
        assert_eq!(
            summary(&next_about(&mut events, &watched).await),
            format!("deleted {watched}"),
            "{initial_list:?}"
        );
        nodes
            .delete(&listed, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// The requests the cache makes came back in protobuf: a page of the list and a watch.
#[tokio::test]
async fn the_api_server_answers_the_caches_requests_in_protobuf() {
    let client = client().await;
    let request = kube::core::Request::new("/api/v1/nodes");
    let page = super::list_watch::tests_support::list_page::<CachedNode>(&client, &request)
        .await
        .unwrap();
    assert!(page, "the list page came in protobuf");
    let framing = super::list_watch::tests_support::watch_framing::<CachedNode>(&client, &request)
        .await
        .unwrap();
    assert_eq!(framing, super::frames::Framing::LengthPrefixed);
}
