//! The initialization write. A PUT of the node's metadata and spec, as upstream's `Update`: for the API
//! server it is the cheapest write of a Node (a JSON merge patch makes it encode the stored Node to JSON,
//! merge and decode again, about 15 % of its CPU in our benchmark). It carries the node's
//! `resourceVersion`, and is planned again from a fresh read on a conflict.
//!
//! A PUT replaces what it does not carry. The status is not among that (the API server keeps a Node's
//! status on a PUT of the Node, and its managed fields when the PUT carries none), but a field of the
//! metadata or spec that the API server has and our types lack would be erased: a node with such a field
//! ([`CachedNode::unknown_field`]) gets the merge patch instead, which carries only what changes.

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};

use super::plan::Initialization;
use crate::{controllers::patch::write_with_retry, informers::CachedNode};

/// Writes the initialization `plan` returns for the node's current state (`None`: nothing to do), and
/// returns the initialized node (`None` when there was nothing to do, or the node is gone).
pub(super) async fn initialize(
    api: &Api<CachedNode>,
    client: &kube::Client,
    node: &CachedNode,
    plan: impl Fn(&Node) -> Option<Initialization>,
) -> Result<Option<CachedNode>, kube::Error> {
    let name = node.name_any();
    write_with_retry(api, node, |current| {
        let plan = plan(current)?;
        let name = &name;
        let write = match current.unknown_field() {
            None => Write::Put(Box::new(plan.apply(current))),
            Some(field) => {
                tracing::debug!(
                    %field,
                    "the node has a field this build does not know; initializing it with a merge patch"
                );
                Write::Patch(plan.patch(&current.resource_version().unwrap_or_default()))
            }
        };
        Some(async move {
            match write {
                Write::Put(body) => put(client, name, &body).await,
                Write::Patch(patch) => {
                    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                }
            }
        })
    })
    .await
}

enum Write {
    Put(Box<Node>),
    Patch(serde_json::Value),
}

/// PUT `body` (a [`Node`]) and decode the answer as a [`CachedNode`], without its images.
async fn put(client: &kube::Client, name: &str, body: &Node) -> Result<CachedNode, kube::Error> {
    let bytes = serde_json::to_vec(body).map_err(kube::Error::SerdeError)?;
    let mut request = kube::core::Request::new(CachedNode::url_path(&(), None))
        .replace(name, &PostParams::default(), bytes)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("replace");
    client.request::<CachedNode>(request).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::mock_api::mock_client;

    /// A cached, uninitialized node decoded from the API server's JSON, with `extra` merged into its
    /// spec.
    fn cached(extra: serde_json::Value) -> CachedNode {
        let mut spec = json!({
            "taints": [{ "key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule" }],
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "n1", "resourceVersion": "7", "labels": { "team": "a" } },
            "spec": spec,
            "status": { "images": [{ "names": ["app:v1"], "sizeBytes": 1 }] },
        }))
        .unwrap()
    }

    fn plan(_: &Node) -> Option<Initialization> {
        Some(Initialization {
            provider_id: Some("fake://n1".into()),
            labels: [("topology.kubernetes.io/zone".to_owned(), "z".to_owned())].into(),
            taints: vec![],
            kept_labels: vec![],
        })
    }

    /// Runs the initialization against a mock API server that accepts any write; the requests made.
    async fn initialize_against_mock(node: &CachedNode) -> Vec<(String, serde_json::Value)> {
        let (client, requests) = mock_client(|_, _, body| (200, body.clone()));
        let api = Api::all(client.clone());
        let written = initialize(&api, &client, node, plan).await.unwrap();
        assert!(written.is_some());
        let requests = requests.lock();
        requests
            .iter()
            .map(|(method, path, body)| {
                assert_eq!(path, "/api/v1/nodes/n1");
                (method.clone(), body.clone())
            })
            .collect()
    }

    #[tokio::test]
    async fn a_node_of_known_fields_is_put_with_its_resource_version_and_without_status() {
        let requests = initialize_against_mock(&cached(json!({}))).await;
        let [(method, body)] = &requests[..] else {
            panic!("one write: {requests:?}")
        };
        assert_eq!(method, "PUT");
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["metadata"]["labels"]["team"], "a");
        assert_eq!(
            body["metadata"]["labels"]["topology.kubernetes.io/zone"],
            "z"
        );
        assert_eq!(body["spec"]["providerID"], "fake://n1");
        assert_eq!(
            body["spec"]["taints"],
            json!([]),
            "the uninitialized taint is removed"
        );
        assert!(body.get("status").is_none(), "{body}");
    }

    /// A field the API server has and this build's types lack would be erased by a PUT: such a node is
    /// written with a merge patch, which leaves every field it does not name as the server has it.
    #[tokio::test]
    async fn a_node_with_a_field_unknown_to_our_types_is_merge_patched_without_it() {
        let node = cached(json!({ "futureField": { "keep": "me" } }));
        assert_eq!(node.unknown_field(), Some("spec.futureField"));
        let requests = initialize_against_mock(&node).await;
        let [(method, body)] = &requests[..] else {
            panic!("one write: {requests:?}")
        };
        assert_eq!(method, "PATCH");
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["providerID"], "fake://n1");
        assert!(
            !body.to_string().contains("futureField") && body["spec"].get("futureField").is_none(),
            "the patch leaves the unknown field alone: {body}"
        );
        assert!(
            body["metadata"]["labels"].get("team").is_none(),
            "only what changes: {body}"
        );
    }
}
