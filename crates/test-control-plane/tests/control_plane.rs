//! The test control plane is a real API server: objects round-trip through etcd, and RBAC holds.

use k8s_openapi::api::{authentication::v1::SelfSubjectReview, core::v1::Node};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use test_control_plane::{control_plane, kubelet_node, unique_name};

#[tokio::test]
async fn a_node_registered_like_an_external_cloud_kubelet_reads_back() {
    let client = control_plane().admin_client().await;
    let nodes: Api<Node> = Api::all(client);
    let name = unique_name("cp-node");
    nodes
        .create(&PostParams::default(), &kubelet_node(&name))
        .await
        .unwrap();

    let read = nodes.get(&name).await.unwrap();
    let taints = read.spec.unwrap().taints.unwrap();
    assert_eq!(
        taints.len(),
        1,
        "the API server kept only our taint: {taints:?}"
    );
    assert_eq!(
        taints[0].key,
        "node.cloudprovider.kubernetes.io/uninitialized"
    );
    assert_eq!(taints[0].effect, "NoSchedule");
    // Status set at create time is kept for Nodes (the registry strategy allows it).
    let conditions = read.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    assert!(read.metadata.uid.is_some() && read.metadata.resource_version.is_some());

    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn the_ccm_identity_is_authenticated_and_held_to_rbac() {
    let plane = control_plane();
    let ccm = plane.ccm_client().await;
    let review: Api<SelfSubjectReview> = Api::all(ccm.clone());
    let me = review
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = me.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:cloud-controller-manager")
    );

    // RBAC is on: the CCM user may not read Secrets (no role it is ever bound to here grants that;
    // other tests bind it to deploy/rbac.yaml, so Nodes are not the probe).
    let err = Api::<k8s_openapi::api::core::v1::Secret>::all(ccm)
        .list(&Default::default())
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 Forbidden, got {other}"),
    }
}
