//! Addresses kept for Services that went (`ccm.rs/load-balancer-retain: "true"`), recorded in the
//! ConfigMap `kube-system/local-retained-addresses` so they outlive the manager, a restart and a change
//! of leader: one data key per Service, `<namespace>.<name>` (neither may hold a dot), whose value is its
//! addresses, comma-separated.
//!
//! The ConfigMap is the record: the leader reserves every address it lists (no other Service gets it),
//! a Service of that namespace and name adopts them (and its key goes), and an operator releases them by
//! removing the key:
//!
//! ```sh
//! kubectl -n kube-system get configmap local-retained-addresses -o yaml          # list
//! kubectl -n kube-system patch configmap local-retained-addresses --type=json \
//!   -p '[{"op": "remove", "path": "/data/shop.web"}]'                          # release shop/web's
//! ```
//!
//! The manager watches it, so a release takes effect within a second. It ships empty with the local
//! overlays (`deploy/components/local-pools`), with the right to read and patch this one ConfigMap; a
//! cluster without it has its Services' retain annotations refused, by name.

use std::{collections::BTreeMap, net::IpAddr};

use cloud_provider::{Supervisor, supervise::Ends};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use crate::{EVENT_NAMESPACE, Error, LocalCloud};

/// The ConfigMap's name (in `kube-system`).
pub const CONFIG_MAP: &str = "local-retained-addresses";

/// The data key of the Service `namespace/name`.
pub(crate) fn data_key(service_key: &str) -> String {
    service_key.replacen('/', ".", 1)
}

/// The `namespace/name` of a data key, if it is one.
fn service_key(data_key: &str) -> Option<String> {
    let (namespace, name) = data_key.split_once('.')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('.'))
        .then(|| format!("{namespace}/{name}"))
}

/// The value that records `ips`.
pub(crate) fn value(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The kept addresses by `namespace/name`, and what is wrong with the entries that are not read
/// (named, so an operator's typo is said, never silently dropped).
pub(crate) fn parse(
    data: &BTreeMap<String, String>,
) -> (BTreeMap<String, Vec<IpAddr>>, Vec<String>) {
    let mut kept = BTreeMap::new();
    let mut wrong = Vec::new();
    for (key, value) in data {
        let Some(service) = service_key(key) else {
            wrong.push(format!("key {key:?} is not <namespace>.<name>"));
            continue;
        };
        let ips: Result<Vec<IpAddr>, _> = value
            .split(',')
            .map(str::trim)
            .filter(|ip| !ip.is_empty())
            .map(str::parse)
            .collect();
        match ips {
            Ok(ips) if !ips.is_empty() => {
                kept.insert(service, ips);
            }
            Ok(_) => wrong.push(format!("{key}: no address")),
            Err(err) => wrong.push(format!(
                "{key}: {value:?} is not a list of addresses: {err}"
            )),
        }
    }
    (kept, wrong)
}

fn api(client: Client) -> Api<ConfigMap> {
    Api::namespaced(client, EVENT_NAMESPACE)
}

fn missing(service: &str) -> Error {
    Error::Service {
        service: service.to_owned(),
        message: format!(
            "ccm.rs/load-balancer-retain: the ConfigMap {EVENT_NAMESPACE}/{CONFIG_MAP}, where kept \
             addresses are recorded, does not exist: apply deploy/components/local-pools (the local \
             overlays have it), or remove the annotation"
        ),
    }
}

/// Records (`Some`) or forgets (`None`) the addresses kept for `service` (`namespace/name`).
pub(crate) async fn write(
    client: Client,
    service: &str,
    ips: Option<&[IpAddr]>,
) -> Result<(), Error> {
    let patch = json!({ "data": { data_key(service): ips.map(value) } });
    match api(client)
        .patch(CONFIG_MAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(missing(service)),
        Err(source) => Err(Error::Kube {
            what: format!(
                "local cloud: recording the addresses kept for {service} in {CONFIG_MAP}"
            ),
            source,
        }),
    }
}

/// The kept addresses as the ConfigMap has them now (none without it).
pub(crate) async fn read(client: Client) -> Result<BTreeMap<String, Vec<IpAddr>>, Error> {
    let found = api(client)
        .get_opt(CONFIG_MAP)
        .await
        .map_err(|source| Error::Kube {
            what: format!("local cloud: reading the kept addresses ({CONFIG_MAP})"),
            source,
        })?;
    Ok(kept_in(found.as_ref()))
}

fn kept_in(config_map: Option<&ConfigMap>) -> BTreeMap<String, Vec<IpAddr>> {
    let data = config_map.and_then(|c| c.data.clone()).unwrap_or_default();
    let (kept, wrong) = parse(&data);
    for why in wrong {
        tracing::warn!(config_map = CONFIG_MAP, %why, "an entry of the kept addresses is not read");
    }
    kept
}

/// Follows the ConfigMap until the leading manager stops (`supervisor`'s shutdown), giving the cloud
/// what it lists each time it changes: an operator's release takes effect at once.
pub(crate) fn spawn(cloud: LocalCloud, client: Client, supervisor: &Supervisor) {
    supervisor.spawn("kept addresses", Ends::AtShutdown, move || {
        let (cloud, client) = (cloud.clone(), client.clone());
        async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
            let mut events = std::pin::pin!(
                watcher(api(client), config).backoff(cloud_provider::watch_retry_backoff())
            );
            // A failure is said once until the watch works again: without the ConfigMap's Role
            // (deploy/components/local-pools) it fails at every retry.
            let mut failing = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(
                        watcher::Event::Apply(config_map) | watcher::Event::InitApply(config_map),
                    ) => {
                        failing = false;
                        cloud.keep_only(&kept_in(Some(&config_map)));
                    }
                    Ok(watcher::Event::Delete(_)) => cloud.keep_only(&BTreeMap::new()),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => failing = false,
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(
                            error = %err,
                            "watching {EVENT_NAMESPACE}/{CONFIG_MAP} (the kept addresses) failed; retrying, said once until it works"
                        );
                    }
                    Err(err) => tracing::debug!(error = %err, "watching {CONFIG_MAP} failed again"),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_and_the_wrong_ones_named() {
        let data: BTreeMap<String, String> = [
            ("shop.web", "10.0.0.7"),
            ("shop.dual", "10.0.0.8, fd00::8"),
            ("bad", "10.0.0.9"),
            ("shop.empty", ""),
            ("shop.typo", "10.0.0.x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let (kept, wrong) = parse(&data);
        assert_eq!(
            kept,
            [
                (
                    "shop/dual".to_owned(),
                    vec!["10.0.0.8".parse().unwrap(), "fd00::8".parse().unwrap()]
                ),
                ("shop/web".to_owned(), vec!["10.0.0.7".parse().unwrap()]),
            ]
            .into()
        );
        assert_eq!(wrong.len(), 3, "{wrong:?}");
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("\"bad\" is not <namespace>.<name>"))
        );
        assert!(wrong.iter().any(|w| w.contains("shop.typo")));
    }

    #[test]
    fn keys_and_values_round_trip() {
        let ips: Vec<IpAddr> = vec!["10.0.0.8".parse().unwrap(), "fd00::8".parse().unwrap()];
        assert_eq!(data_key("shop/web"), "shop.web");
        let data = [(data_key("shop/web"), value(&ips))].into_iter().collect();
        assert_eq!(parse(&data).0, [("shop/web".to_owned(), ips)].into());
    }
}
