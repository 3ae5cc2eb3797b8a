//! Writes that must not overwrite concurrent changes: a write (a JSON merge patch, or a PUT) carrying the
//! object's `resourceVersion`, re-planned from a fresh read on conflict (upstream retries its Node and Service
//! updates the same way, 20 steps from 50 ms).

use std::{fmt::Debug, future::Future, time::Duration};

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use serde_json::Value;

const ATTEMPTS: u32 = 20;
const FIRST_DELAY: Duration = Duration::from_millis(50);

/// `patch` with `metadata.resourceVersion` set: the API server applies it only to that version of the
/// object (409 otherwise), so a write planned from an older state, or one a deposed leader sent before
/// its renew deadline and the network delivered late, fails instead of overwriting what came after.
pub fn with_resource_version(mut patch: Value, resource_version: &str) -> Value {
    if let Some(object) = patch.as_object_mut() {
        let metadata = object
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert(
                "resourceVersion".to_owned(),
                Value::String(resource_version.to_owned()),
            );
        }
    }
    patch
}

/// Where a patch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The object itself.
    Object,
    /// Its `status` subresource (which also takes metadata such as finalizers).
    Status,
}

/// Patches `object` with what `plan` returns for its current state and `resourceVersion`; `plan`
/// returning `None` means nothing to write. Returns the updated object, or `None` when there was nothing
/// to do (or the object is gone).
pub async fn patch_with_retry<K, F>(
    api: &Api<K>,
    object: &K,
    target: Target,
    plan: F,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    F: Fn(&K, &str) -> Option<Value>,
{
    let name = object.name_any();
    write_with_retry(api, object, |current| {
        let resource_version = current.resource_version().unwrap_or_default();
        let patch = plan(current, &resource_version)?;
        let name = &name;
        Some(async move {
            let params = PatchParams::default();
            match target {
                Target::Object => api.patch(name, &params, &Patch::Merge(&patch)).await,
                Target::Status => api.patch_status(name, &params, &Patch::Merge(&patch)).await,
            }
        })
    })
    .await
}

/// Makes the write `write` returns for the object's current state (`None`: nothing to write), which
/// must carry that state's `resourceVersion`; on a conflict, re-reads the object and asks again. Returns
/// the updated object, or `None` when there was nothing to do (or the object is gone).
pub async fn write_with_retry<K, F, Fut>(
    api: &Api<K>,
    object: &K,
    write: F,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    F: Fn(&K) -> Option<Fut>,
    Fut: Future<Output = Result<K, kube::Error>>,
{
    let name = object.name_any();
    let mut current = object.clone();
    let mut delay = FIRST_DELAY;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(written) = write(&current) else {
            return Ok(None);
        };
        match written.await {
            Ok(updated) => return Ok(Some(updated)),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => {
                tracing::debug!(object = %name, attempt, "changed meanwhile; re-reading and re-planning");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                match api.get_opt(&name).await? {
                    Some(fresh) => current = fresh,
                    None => return Ok(None),
                }
            }
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_resource_version_joins_the_patch_s_metadata() {
        let table = [
            (
                json!({ "status": { "addresses": [] } }),
                json!({ "metadata": { "resourceVersion": "7" }, "status": { "addresses": [] } }),
            ),
            (
                json!({ "metadata": { "labels": { "a": "b" } } }),
                json!({ "metadata": { "labels": { "a": "b" }, "resourceVersion": "7" } }),
            ),
            (
                json!({ "metadata": { "resourceVersion": "6" } }),
                json!({ "metadata": { "resourceVersion": "7" } }),
            ),
        ];
        for (patch, want) in table {
            assert_eq!(with_resource_version(patch.clone(), "7"), want, "{patch}");
        }
    }
}
