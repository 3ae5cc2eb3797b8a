//! Writes to Nodes that must not overwrite concurrent changes: a JSON merge patch carrying the node's
//! `resourceVersion`, re-planned from a fresh read on conflict (upstream retries its Node updates the
//! same way, 20 steps from 50 ms).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::Value;

const ATTEMPTS: u32 = 20;
const FIRST_DELAY: Duration = Duration::from_millis(50);

/// Patches `node` with what `plan` returns for it; `plan` returning `None` means nothing to write.
/// Returns the updated node, or `None` when there was nothing to do.
pub async fn patch_node<F>(
    api: &Api<Node>,
    node: &Node,
    plan: F,
) -> Result<Option<Node>, kube::Error>
where
    F: Fn(&Node, &str) -> Option<Value>,
{
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut current = node.clone();
    let mut delay = FIRST_DELAY;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let resource_version = current
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let Some(patch) = plan(&current, &resource_version) else {
            return Ok(None);
        };
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => return Ok(Some(updated)),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => {
                tracing::debug!(node = %name, attempt, "node changed meanwhile; re-reading and re-planning");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                current = api.get(&name).await?;
            }
            Err(err) => return Err(err),
        }
    }
}
