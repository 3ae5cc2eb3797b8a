//! The cloud-config's pools as objects an operator can see: one `LocalPool` (`local.ccm.rs/v1alpha1`,
//! cluster-scoped, `kubectl get localpools`) per pool in force, holding the pool as configured and how
//! full it is ([`crate::pool_usage`]), with a condition `Exhausted`; a Warning event `PoolExhausted`
//! when one runs out. The leading manager writes them (server-side apply, only when something changed)
//! and deletes those of pools that are gone. Pools read from MetalLB's objects are shown in their
//! `IPAddressPool`s' status instead (`metallb::watch`), and have no `LocalPool`.
//!
//! [`object`] is pure; `spawn` runs the loop. Without the CRD (`deploy/components/local-pools`) the
//! loop logs once that the pools are not published, and looks again every 30 s.

use std::{collections::BTreeMap, time::Duration};

use cloud_provider::{Supervisor, supervise::Ends};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    },
};
use serde_json::{Value, json};

use crate::{
    CloudEvent, LocalCloud,
    config::{AddressPool, Announce},
    pool_usage::PoolUsage,
};

/// The API group of [`KIND`].
pub const GROUP: &str = "local.ccm.rs";
/// The kind of the pools' objects.
pub const KIND: &str = "LocalPool";
/// The label on every `LocalPool` the manager writes.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "cloud-provider-local");
/// How many Services a `LocalPool` names (`status.serviceCount` counts them all).
const MAX_SERVICES: usize = 100;
/// How often the pools are looked at.
const INTERVAL: Duration = Duration::from_secs(2);
/// How often a cluster without the CRD is looked at again.
const RECHECK: Duration = Duration::from_secs(30);

/// The reason of the Warning event on a pool that ran out of the addresses of a family.
pub const EVENT_POOL_EXHAUSTED: &str = "PoolExhausted";

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, "v1alpha1", KIND),
        "localpools",
    )
}

/// The `LocalPool` of `pool` with `usage`; `since`: when its `Exhausted` condition last changed, if it
/// did not now (from the object as it is).
pub fn object(pool: &AddressPool, usage: &PoolUsage, since: Option<&str>, now: &str) -> Value {
    let announce = match pool.announce {
        Announce::L2 => "l2",
        Announce::Bgp => "bgp",
        Announce::None => "none",
    };
    let exhausted = usage.exhausted();
    let mut spec = json!({
        "source": "cloud-config",
        "addresses": pool.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "autoAssign": pool.auto_assign,
        "announce": announce,
        "namespaces": pool.namespaces,
    });
    if let Some(priority) = pool.priority {
        spec["priority"] = json!(priority);
    }
    json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": KIND,
        "metadata": {"name": pool.name, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "spec": spec,
        "status": {
            "assignedIPv4": usage.assigned_v4,
            "assignedIPv6": usage.assigned_v6,
            "availableIPv4": usage.available_v4,
            "availableIPv6": usage.available_v6,
            "serviceCount": usage.services.len(),
            "services": usage.services.iter().take(MAX_SERVICES).collect::<Vec<_>>(),
            "conditions": [{
                "type": "Exhausted",
                "status": if exhausted { "True" } else { "False" },
                "reason": if exhausted { "NoFreeAddress" } else { "FreeAddresses" },
                "message": if exhausted {
                    "no free address of a family the pool has: a Service that needs one gets none from it"
                } else {
                    "addresses of every family the pool has are free"
                },
                "lastTransitionTime": since.unwrap_or(now),
            }],
        },
    })
}

/// Whether `object` (a pool's `LocalPool` as it is) says the pool is exhausted, and since when.
fn exhausted_of(object: &DynamicObject) -> Option<(bool, String)> {
    let condition = object
        .data
        .get("status")?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type") == Some(&json!("Exhausted")))?;
    Some((
        condition.get("status")? == "True",
        condition.get("lastTransitionTime")?.as_str()?.to_owned(),
    ))
}

/// Runs the loop until the leading manager stops (`supervisor`'s shutdown, from `initialize`).
pub(crate) fn spawn(cloud: LocalCloud, client: Client, supervisor: &Supervisor) {
    supervisor.spawn("LocalPool objects", Ends::AtShutdown, move || {
        let (cloud, client) = (cloud.clone(), client.clone());
        async move { publish(&cloud, client).await }
    });
}

async fn publish(cloud: &LocalCloud, client: Client) {
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    let mut told_missing = false;
    loop {
        match step(cloud, &api).await {
            Ok(()) => {
                told_missing = false;
                tokio::time::sleep(INTERVAL).await;
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                if !told_missing {
                    tracing::info!(
                        "the LocalPool CRD (deploy/components/local-pools) is not installed: the pools are not published as objects; looking again every {RECHECK:?}"
                    );
                    told_missing = true;
                }
                tokio::time::sleep(RECHECK).await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "publishing the pools as LocalPool objects failed; trying again");
                tokio::time::sleep(INTERVAL).await;
            }
        }
    }
}

/// One look: every pool's `LocalPool` applied when it differs, those of pools gone deleted.
async fn step(cloud: &LocalCloud, api: &Api<DynamicObject>) -> Result<(), kube::Error> {
    let existing: BTreeMap<String, DynamicObject> = api
        .list(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
        .await?
        .items
        .into_iter()
        .filter_map(|o| Some((o.metadata.name.clone()?, o)))
        .collect();
    let config = cloud.config();
    let usage: BTreeMap<String, PoolUsage> = if config.metallb_pools {
        BTreeMap::new()
    } else {
        cloud
            .pool_usage()
            .into_iter()
            .map(|u| (u.name.clone(), u))
            .collect()
    };
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
        .to_string();
    for pool in config
        .address_pools
        .iter()
        .filter(|p| usage.contains_key(&p.name))
    {
        let usage = &usage[&pool.name];
        let was = existing.get(&pool.name).and_then(exhausted_of);
        let since = was
            .as_ref()
            .filter(|(exhausted, _)| *exhausted == usage.exhausted())
            .map(|(_, since)| since.as_str());
        let wanted = object(pool, usage, since, &now);
        let current = existing.get(&pool.name);
        let same = current.is_some_and(|o| {
            o.data.get("spec") == wanted.get("spec") && o.data.get("status") == wanted.get("status")
        });
        if !same {
            api.patch(
                &pool.name,
                &PatchParams::apply("cloud-provider-local").force(),
                &Patch::Apply(&wanted),
            )
            .await?;
        }
        if usage.exhausted() && !was.is_some_and(|(exhausted, _)| exhausted) {
            cloud.record_warning(
                CloudEvent {
                    namespace: "default",
                    name_prefix: format!("{}.exhausted-", pool.name),
                    regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
                        api_version: Some(format!("{GROUP}/v1alpha1")),
                        kind: Some(KIND.to_owned()),
                        name: Some(pool.name.clone()),
                        ..Default::default()
                    }),
                    reason: EVENT_POOL_EXHAUSTED,
                    action: "AssignAddress",
                },
                &usage.exhausted_note(&format!("pool {:?}", pool.name)),
            );
        }
    }
    for name in existing.keys().filter(|n| !usage.contains_key(*n)) {
        api.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::Config;

    #[test]
    fn a_pool_s_object_says_what_it_is_and_how_full() {
        let config = Config::parse(
            "addressPools: [{name: web, addresses: [10.0.0.0/30], priority: 2, namespaces: [shop]}]\n",
            None,
        )
        .unwrap();
        let pool = &config.address_pools[0];
        let usage = PoolUsage {
            name: "web".into(),
            assigned_v4: 2,
            available_v4: 0,
            services: BTreeSet::from(["shop/a".to_owned(), "shop/b".to_owned()]),
            ..PoolUsage::default()
        };
        let object = object(pool, &usage, None, "2026-11-29T00:00:00Z");
        assert_eq!(
            object["spec"],
            json!({"source": "cloud-config", "addresses": ["10.0.0.1-10.0.0.2"], "autoAssign": true,
                   "announce": "l2", "namespaces": ["shop"], "priority": 2})
        );
        assert_eq!(object["status"]["serviceCount"], 2);
        assert_eq!(object["status"]["conditions"][0]["status"], "True");
        assert_eq!(
            object["status"]["conditions"][0]["lastTransitionTime"],
            "2026-11-29T00:00:00Z"
        );
        // A condition that did not change keeps its time.
        let kept = super::object(
            pool,
            &usage,
            Some("2026-01-01T00:00:00Z"),
            "2026-11-29T00:00:00Z",
        );
        assert_eq!(
            kept["status"]["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
    }
}
