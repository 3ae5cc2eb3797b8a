//! Load balancers: a tenant LoadBalancer Service becomes a `type: LoadBalancer` Service in the infra
//! namespace (upstream's name, labels, copied annotations and fields), whose ports send to the tenant's
//! node ports and whose address the tenant Service reports.
//!
//! [`desired`] is the infra Service a tenant Service asks for (pure), [`plan`] what to change on the one
//! that exists (pure, table-tested), and [`LoadBalancers`] the small executor that reads, writes and
//! waits for the infra cluster's address.

use std::{collections::BTreeMap, time::Duration};

use cloud_provider::{
    CloudError, CloudResult, ClusterLoadBalancer, LoadBalancerPreview, ServiceRef,
};
use k8s_openapi::{
    api::core::v1::{
        ClientIPConfig, LoadBalancerStatus, Service, ServicePort, ServiceSpec,
        SessionAffinityConfig,
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
    jiff::Timestamp,
};
use serde_json::{Map, Value, json};

use crate::{Error, config::LoadBalancerConfig, infra::Infra};

/// The infra Service's label with the tenant Service's name.
pub const TENANT_SERVICE_NAME_LABEL: &str = "cluster.x-k8s.io/tenant-service-name";
/// The infra Service's label with the tenant Service's namespace.
pub const TENANT_SERVICE_NAMESPACE_LABEL: &str = "cluster.x-k8s.io/tenant-service-namespace";
/// The infra Service's (and the tenant VMIs') label with the tenant cluster's name.
pub const TENANT_CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The VMIs' label the infra Service selects workers by (`worker`).
pub const TENANT_NODE_ROLE_LABEL: &str = "cluster.x-k8s.io/role";

/// The infra Service a tenant Service asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Its name (the tenant Service's default load-balancer name).
    pub name: String,
    /// Ours and `infraLabels`.
    pub labels: BTreeMap<String, String>,
    /// The tenant Service's annotations.
    pub annotations: BTreeMap<String, String>,
    /// One per tenant port: same name, protocol and port, to the tenant node port.
    pub ports: Vec<ServicePort>,
    /// The tenant's `externalTrafficPolicy`.
    pub external_traffic_policy: Option<String>,
    /// The VMIs of the cluster's workers; `None` in selectorless or mirrored-endpoints mode.
    pub selector: Option<BTreeMap<String, String>>,
    /// The tenant's `externalIPs` (upstream copies them at creation only; we keep them in step).
    pub external_ips: Option<Vec<String>>,
    /// The tenant's `loadBalancerIP` (upstream: at creation only; we keep it in step).
    pub load_balancer_ip: Option<String>,
    /// The tenant's `loadBalancerSourceRanges`, for the infra load balancer to enforce (upstream drops
    /// them, so a tenant's allow-list silently allowed everyone).
    pub source_ranges: Option<Vec<String>>,
    /// The tenant's `sessionAffinity` (`None` or `ClientIP`): a client keeps its VMI as it keeps its pod
    /// (upstream drops it).
    pub session_affinity: String,
    /// The tenant's ClientIP timeout, with `ClientIP`.
    pub session_affinity_timeout: Option<i32>,
    /// The tenant's `ipFamilyPolicy`: a dual-stack tenant Service asks the infra cluster for both
    /// families (its `ipFamilies` are not copied: the infra cluster picks its own primary family).
    pub ip_family_policy: Option<String>,
}

/// `namespace/name` of a Service.
pub fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The infra Service `tenant` asks for, named `name`, for `cluster`. A port without a node port is
/// refused: the infra Service can only send to the tenant's node ports.
pub fn desired(
    tenant: &Service,
    name: &str,
    cluster: &str,
    config: &LoadBalancerConfig,
) -> Result<Desired, String> {
    let spec = tenant.spec.clone().unwrap_or_default();
    let mut ports = Vec::new();
    for port in spec.ports.iter().flatten() {
        let Some(node_port) = port.node_port.filter(|p| *p > 0) else {
            return Err(format!(
                "port {} ({}) has no nodePort: the infra Service sends to the tenant's node ports, so spec.allocateLoadBalancerNodePorts: false cannot be served by kubevirt",
                port.name.as_deref().unwrap_or_default(),
                port.port
            ));
        };
        ports.push(ServicePort {
            name: port.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(port.protocol.clone().unwrap_or_else(|| "TCP".into())),
            port: port.port,
            target_port: Some(IntOrString::Int(node_port)),
            ..Default::default()
        });
    }
    let mut labels = BTreeMap::from([
        (
            TENANT_SERVICE_NAME_LABEL.to_owned(),
            tenant.metadata.name.clone().unwrap_or_default(),
        ),
        (
            TENANT_SERVICE_NAMESPACE_LABEL.to_owned(),
            tenant.metadata.namespace.clone().unwrap_or_default(),
        ),
        (TENANT_CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned()),
    ]);
    labels.extend(config.infra_labels.clone());
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let selector = if (config.eps_controller && local) || config.selectorless {
        None
    } else {
        Some(BTreeMap::from([
            (TENANT_NODE_ROLE_LABEL.to_owned(), "worker".to_owned()),
            (TENANT_CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned()),
        ]))
    };
    Ok(Desired {
        name: name.to_owned(),
        labels,
        annotations: tenant.metadata.annotations.clone().unwrap_or_default(),
        ports,
        external_traffic_policy: spec.external_traffic_policy.clone(),
        selector,
        external_ips: spec.external_ips.clone().filter(|ips| !ips.is_empty()),
        load_balancer_ip: spec.load_balancer_ip.clone().filter(|ip| !ip.is_empty()),
        source_ranges: spec
            .load_balancer_source_ranges
            .clone()
            .filter(|r| !r.is_empty()),
        session_affinity: spec
            .session_affinity
            .clone()
            .unwrap_or_else(|| "None".into()),
        session_affinity_timeout: client_ip_timeout(&spec),
        ip_family_policy: spec.ip_family_policy.clone(),
    })
}

/// The ClientIP affinity timeout of a Service with `sessionAffinity: ClientIP` (the API server's
/// default, 10800 s, when it says none).
fn client_ip_timeout(spec: &ServiceSpec) -> Option<i32> {
    (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(10800)
    })
}

fn affinity_config(timeout: Option<i32>) -> Option<SessionAffinityConfig> {
    timeout.map(|seconds| SessionAffinityConfig {
        client_ip: Some(ClientIPConfig {
            timeout_seconds: Some(seconds),
        }),
    })
}

impl Desired {
    /// The Service to create in `namespace`.
    pub fn to_service(&self, namespace: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(namespace.to_owned()),
                labels: Some(self.labels.clone()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(self.ports.clone()),
                external_traffic_policy: self.external_traffic_policy.clone(),
                selector: self.selector.clone(),
                external_ips: self.external_ips.clone(),
                load_balancer_ip: self.load_balancer_ip.clone(),
                load_balancer_source_ranges: self.source_ranges.clone(),
                session_affinity: Some(self.session_affinity.clone()),
                session_affinity_config: affinity_config(self.session_affinity_timeout),
                ip_family_policy: self.ip_family_policy.clone(),
                ..Default::default()
            }),
            status: None,
        }
    }
}

/// A port as compared: name, protocol, port, target port.
fn port_key(port: &ServicePort) -> (String, String, i32, Option<IntOrString>) {
    (
        port.name.clone().unwrap_or_default(),
        port.protocol.clone().unwrap_or_else(|| "TCP".into()),
        port.port,
        port.target_port.clone(),
    )
}

/// What to change on the infra Service that exists so it matches `desired`, as a JSON merge patch
/// (`None`: nothing). Upstream changes only the ports; we also bring back what the provider set and
/// somebody changed (labels, the selector, `externalTrafficPolicy`), keep what the tenant's user set in
/// step (`loadBalancerIP`, `externalIPs`, `loadBalancerSourceRanges`, session affinity,
/// `ipFamilyPolicy`), and pass on the tenant's annotations as they change (adding and changing, never
/// removing what the infra side added).
pub fn plan(desired: &Desired, actual: &Service) -> Option<Value> {
    let spec = actual.spec.clone().unwrap_or_default();
    let mut spec_patch = provider_fields_patch(desired, &spec);
    spec_patch.extend(user_fields_patch(desired, &spec));
    spec_patch.extend(session_affinity_patch(desired, &spec));
    spec_patch.extend(ip_family_policy_patch(desired, &spec));
    merge_patch(metadata_patch(desired, &actual.metadata), spec_patch)
}

/// The spec fields the provider sets, where `spec` differs from `desired`: the ports, the
/// `externalTrafficPolicy` (when the tenant has one) and the selector.
fn provider_fields_patch(desired: &Desired, spec: &ServiceSpec) -> Map<String, Value> {
    let mut patch = Map::new();
    let actual_ports: Vec<_> = spec.ports.iter().flatten().map(port_key).collect();
    let desired_ports: Vec<_> = desired.ports.iter().map(port_key).collect();
    if actual_ports != desired_ports {
        patch.insert(
            "ports".into(),
            serde_json::to_value(&desired.ports).unwrap_or(Value::Null),
        );
    }
    if desired.external_traffic_policy.is_some()
        && spec.external_traffic_policy != desired.external_traffic_policy
    {
        patch.insert(
            "externalTrafficPolicy".into(),
            json!(desired.external_traffic_policy),
        );
    }
    let actual_selector = spec.selector.clone().filter(|s| !s.is_empty());
    if actual_selector != desired.selector {
        patch.insert("selector".into(), json!(desired.selector));
    }
    patch
}

/// What the tenant's user set, kept in step where `spec` differs from `desired`: `externalIPs`,
/// `loadBalancerIP` and `loadBalancerSourceRanges` (a value removed on the tenant is removed here:
/// JSON null; an empty one is none).
fn user_fields_patch(desired: &Desired, spec: &ServiceSpec) -> Map<String, Value> {
    let mut patch = Map::new();
    let listed = |v: &Option<Vec<String>>| v.clone().filter(|l| !l.is_empty());
    if listed(&spec.external_ips) != desired.external_ips {
        patch.insert("externalIPs".into(), json!(desired.external_ips));
    }
    if spec.load_balancer_ip.clone().filter(|ip| !ip.is_empty()) != desired.load_balancer_ip {
        patch.insert("loadBalancerIP".into(), json!(desired.load_balancer_ip));
    }
    if listed(&spec.load_balancer_source_ranges) != desired.source_ranges {
        patch.insert(
            "loadBalancerSourceRanges".into(),
            json!(desired.source_ranges),
        );
    }
    patch
}

/// `sessionAffinity` and its config together, when either differs from `desired` (no affinity is
/// `None`).
fn session_affinity_patch(desired: &Desired, spec: &ServiceSpec) -> Map<String, Value> {
    let mut patch = Map::new();
    let affinity = spec
        .session_affinity
        .clone()
        .unwrap_or_else(|| "None".into());
    if affinity != desired.session_affinity
        || client_ip_timeout(spec) != desired.session_affinity_timeout
    {
        patch.insert("sessionAffinity".into(), json!(desired.session_affinity));
        patch.insert(
            "sessionAffinityConfig".into(),
            json!(affinity_config(desired.session_affinity_timeout)),
        );
    }
    patch
}

/// The tenant's `ipFamilyPolicy`, when it has one and `spec` differs; going back to `SingleStack`
/// also drops the second of `spec`'s families.
fn ip_family_policy_patch(desired: &Desired, spec: &ServiceSpec) -> Map<String, Value> {
    let mut patch = Map::new();
    if let Some(policy) = &desired.ip_family_policy
        && spec.ip_family_policy.as_ref() != Some(policy)
    {
        patch.insert("ipFamilyPolicy".into(), json!(policy));
        // Back to one family, the API server wants the second one dropped in the same write.
        let families = spec.ip_families.clone().unwrap_or_default();
        if policy == "SingleStack" && families.len() > 1 {
            patch.insert("ipFamilies".into(), json!(&families[..1]));
        }
    }
    patch
}

/// The labels and annotations `desired` adds to or changes on `metadata` (never removing any).
fn metadata_patch(desired: &Desired, metadata: &ObjectMeta) -> Map<String, Value> {
    let mut patch = Map::new();
    if let Some(labels) = changed_entries(&desired.labels, metadata.labels.as_ref()) {
        patch.insert("labels".into(), labels);
    }
    if let Some(annotations) = changed_entries(&desired.annotations, metadata.annotations.as_ref())
    {
        patch.insert("annotations".into(), annotations);
    }
    patch
}

/// The entries of `wanted` that `have` lacks or has with another value, as a JSON object; `None`
/// when there are none.
fn changed_entries(
    wanted: &BTreeMap<String, String>,
    have: Option<&BTreeMap<String, String>>,
) -> Option<Value> {
    let changed: Map<String, Value> = wanted
        .iter()
        .filter(|(k, v)| have.and_then(|h| h.get(*k)) != Some(*v))
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    (!changed.is_empty()).then_some(Value::Object(changed))
}

/// The merge patch of the metadata and spec changes, each section only when it has any; `None` when
/// neither has.
fn merge_patch(
    metadata_patch: Map<String, Value>,
    spec_patch: Map<String, Value>,
) -> Option<Value> {
    if spec_patch.is_empty() && metadata_patch.is_empty() {
        return None;
    }
    let mut patch = Map::new();
    if !metadata_patch.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata_patch));
    }
    if !spec_patch.is_empty() {
        patch.insert("spec".into(), Value::Object(spec_patch));
    }
    Some(Value::Object(patch))
}

/// The fields a patch changes, in words (for the preview and the log).
pub fn describe(patch: &Value) -> String {
    let mut fields = Vec::new();
    for (section, value) in patch.as_object().into_iter().flatten() {
        for key in value.as_object().into_iter().flatten().map(|(k, _)| k) {
            fields.push(format!("{section}.{key}"));
        }
    }
    fields.join(", ")
}

/// What the infra Service's status means for the tenant.
#[derive(Debug, Clone, PartialEq)]
pub enum Readiness {
    /// It has an address: publish this.
    Ready(LoadBalancerStatus),
    /// No address yet: look again after the poll interval.
    Waiting,
    /// No address for longer than `creationPollTimeout`.
    TimedOut(Duration),
}

/// Whether `infra` has an address, `age` after it was created.
pub fn readiness(infra: &Service, age: Duration, timeout: Duration) -> Readiness {
    let status = infra
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone())
        .unwrap_or_default();
    if status.ingress.as_ref().is_some_and(|i| !i.is_empty()) {
        Readiness::Ready(status)
    } else if age > timeout {
        Readiness::TimedOut(age)
    } else {
        Readiness::Waiting
    }
}

/// The executor.
pub struct LoadBalancers<'a> {
    /// The infra cluster.
    pub infra: &'a Infra,
    /// The settings.
    pub config: &'a LoadBalancerConfig,
}

impl LoadBalancers<'_> {
    fn desired(&self, cluster: &str, tenant: &Service) -> Result<Desired, Error> {
        let name = cloud_provider::default_load_balancer_name(tenant);
        desired(tenant, &name, cluster, self.config)
            .map_err(|why| Error::Infrastructure(format!("Service {}: {why}", key(tenant))))
    }

    /// Upstream's `GetLoadBalancer`: the infra Service's status, when it exists.
    pub async fn get(&self, tenant: &Service) -> CloudResult<Option<LoadBalancerStatus>> {
        let name = cloud_provider::default_load_balancer_name(tenant);
        Ok(self.infra.service(&name).await?.map(|infra| {
            infra
                .status
                .and_then(|s| s.load_balancer)
                .unwrap_or_default()
        }))
    }

    /// Creates the infra Service or brings it in line, then reports its address once it has one.
    pub async fn ensure(&self, cluster: &str, tenant: &Service) -> CloudResult<LoadBalancerStatus> {
        let desired = self.desired(cluster, tenant)?;
        let infra = match self.infra.service(&desired.name).await? {
            None => {
                tracing::info!(service = %key(tenant), infra_service = %desired.name, "creating the infra Service");
                self.infra
                    .create_service(&desired.to_service(self.infra.namespace()))
                    .await?
            }
            Some(actual) => match plan(&desired, &actual) {
                None => actual,
                Some(patch) => {
                    tracing::info!(service = %key(tenant), infra_service = %desired.name, changes = %describe(&patch), "updating the infra Service");
                    self.infra.patch_service(&desired.name, &patch).await?
                }
            },
        };
        let age = |infra: &Service| {
            infra
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
                .unwrap_or_default()
        };
        let mut infra = infra;
        // An infra cluster's load balancer usually answers within a second or two: look again a few
        // times within one poll interval (0.2 s, then doubling) before handing the Service back to the
        // controller, so a normal provisioning is neither a Warning event nor a held worker (upstream
        // holds it up to the timeout).
        let mut pause = Duration::from_millis(200);
        let mut waited = Duration::ZERO;
        loop {
            match readiness(&infra, age(&infra), self.config.creation_poll_timeout) {
                Readiness::Ready(status) => return Ok(status),
                Readiness::Waiting if waited + pause <= self.config.creation_poll_interval => {
                    tokio::time::sleep(pause).await;
                    waited += pause;
                    pause *= 2;
                    match self.infra.service(&desired.name).await? {
                        Some(again) => infra = again,
                        None => {
                            return Err(Error::Infrastructure(format!(
                                "infra Service {}/{} was deleted while it waited for its address",
                                self.infra.namespace(),
                                desired.name
                            ))
                            .into());
                        }
                    }
                }
                Readiness::Waiting => {
                    return Err(CloudError::retry_after(
                        format!(
                            "infra Service {}/{} has no address yet",
                            self.infra.namespace(),
                            desired.name
                        ),
                        self.config.creation_poll_interval,
                    ));
                }
                Readiness::TimedOut(age) => {
                    return Err(Error::Infrastructure(format!(
                        "infra Service {}/{} has had no address for {}s (loadBalancer.creationPollTimeout is {}s): does a load-balancer implementation serve the infra cluster?",
                        self.infra.namespace(),
                        desired.name,
                        age.as_secs(),
                        self.config.creation_poll_timeout.as_secs()
                    ))
                    .into());
                }
            }
        }
    }

    /// Upstream's `UpdateLoadBalancer` (called when nodes change): the infra Service's backends are
    /// VMIs, so only what [`plan`] finds changed is written; a missing infra Service is an error.
    pub async fn update(&self, cluster: &str, tenant: &Service) -> CloudResult<()> {
        let desired = self.desired(cluster, tenant)?;
        let Some(actual) = self.infra.service(&desired.name).await? else {
            return Err(Error::Infrastructure(format!(
                "Service {}: its infra Service {}/{} does not exist",
                key(tenant),
                self.infra.namespace(),
                desired.name
            ))
            .into());
        };
        if let Some(patch) = plan(&desired, &actual) {
            self.infra.patch_service(&desired.name, &patch).await?;
        }
        Ok(())
    }

    /// Deletes the infra Service (gone already is fine).
    pub async fn delete(&self, tenant: &Service) -> CloudResult<()> {
        let name = cloud_provider::default_load_balancer_name(tenant);
        if self.infra.delete_service(&name).await? {
            tracing::info!(service = %key(tenant), infra_service = %name, "deleted the infra Service");
        }
        Ok(())
    }

    /// What `ensure` would change.
    pub async fn preview(
        &self,
        cluster: &str,
        tenant: &Service,
    ) -> CloudResult<LoadBalancerPreview> {
        let desired = self.desired(cluster, tenant)?;
        Ok(match self.infra.service(&desired.name).await? {
            None => LoadBalancerPreview::Create {
                backends: Vec::new(),
            },
            Some(actual) => match plan(&desired, &actual) {
                None => LoadBalancerPreview::UpToDate,
                Some(patch) => LoadBalancerPreview::Change {
                    backends_added: Vec::new(),
                    backends_removed: Vec::new(),
                    detail: format!("would change {}", describe(&patch)),
                },
            },
        })
    }

    /// The infra Services made for `cluster` (by their cluster-name label), for the orphan sweep.
    pub async fn list(&self, cluster: &str) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let selector = format!("{TENANT_CLUSTER_NAME_LABEL}={cluster},{TENANT_SERVICE_NAME_LABEL}");
        let services = self.infra.services_labelled(&selector).await?;
        Ok(services
            .into_iter()
            .filter_map(|s| {
                let labels = s.metadata.labels.clone().unwrap_or_default();
                let tenant = match (
                    labels.get(TENANT_SERVICE_NAMESPACE_LABEL),
                    labels.get(TENANT_SERVICE_NAME_LABEL),
                ) {
                    (Some(ns), Some(name)) => Some(ServiceRef::new(ns, name)),
                    _ => None,
                };
                Some(ClusterLoadBalancer::new(s.metadata.name?, tenant))
            })
            .collect())
    }

    /// Deletes an infra Service the sweep found without its tenant Service.
    pub async fn delete_orphan(&self, load_balancer: &ClusterLoadBalancer) -> CloudResult<()> {
        self.infra.delete_service(&load_balancer.name).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, ServiceStatus};

    use super::*;

    fn config() -> LoadBalancerConfig {
        LoadBalancerConfig {
            creation_poll_interval: Duration::from_secs(5),
            creation_poll_timeout: Duration::from_secs(300),
            selectorless: false,
            eps_controller: false,
            infra_labels: BTreeMap::new(),
        }
    }

    fn tenant(etp: &str, ports: &[(&str, i32, Option<i32>)]) -> Service {
        let mut service = Service::default();
        service.metadata.name = Some("web".into());
        service.metadata.namespace = Some("shop".into());
        service.metadata.uid = Some("5f1c9a2e-0000-4000-8000-000000000001".into());
        service.metadata.annotations = Some(BTreeMap::from([(
            "example.com/owner".into(),
            "team-a".into(),
        )]));
        service.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            external_traffic_policy: Some(etp.into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(name, port, node_port)| ServicePort {
                        name: Some((*name).into()),
                        port: *port,
                        node_port: *node_port,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        service
    }

    #[test]
    fn the_infra_service_is_upstreams() {
        let desired = desired(
            &tenant(
                "Cluster",
                &[("http", 80, Some(30080)), ("https", 443, Some(30443))],
            ),
            "a5f1c9a2e000040008000000000000",
            "tenant-1",
            &config(),
        )
        .unwrap();
        let service = desired.to_service("infra-ns");
        let spec = service.spec.as_ref().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            spec.ports.as_ref().unwrap()[1].target_port,
            Some(IntOrString::Int(30443))
        );
        assert_eq!(spec.ports.as_ref().unwrap()[1].port, 443);
        assert_eq!(
            spec.selector,
            Some(BTreeMap::from([
                ("cluster.x-k8s.io/role".into(), "worker".into()),
                ("cluster.x-k8s.io/cluster-name".into(), "tenant-1".into()),
            ]))
        );
        assert_eq!(
            service.metadata.labels,
            Some(BTreeMap::from([
                ("cluster.x-k8s.io/tenant-service-name".into(), "web".into()),
                (
                    "cluster.x-k8s.io/tenant-service-namespace".into(),
                    "shop".into()
                ),
                ("cluster.x-k8s.io/cluster-name".into(), "tenant-1".into()),
            ]))
        );
        assert_eq!(
            service.metadata.annotations.unwrap()["example.com/owner"],
            "team-a"
        );
        assert_eq!(service.metadata.namespace.as_deref(), Some("infra-ns"));
        let mut with_check = tenant("Local", &[("http", 80, Some(30080))]);
        with_check.spec.as_mut().unwrap().health_check_node_port = Some(32123);
        let infra = super::desired(&with_check, "a1", "c", &config())
            .unwrap()
            .to_service("infra-ns");
        assert_eq!(
            infra.spec.unwrap().health_check_node_port,
            None,
            "the infra cluster allocates its own"
        );
    }

    #[test]
    fn the_selector_by_mode() {
        // (selectorless, eps controller, externalTrafficPolicy, has a selector)
        for (selectorless, eps, etp, selected) in [
            (false, false, "Cluster", true),
            (false, false, "Local", true),
            (true, false, "Cluster", false),
            (true, false, "Local", false),
            (false, true, "Local", false),
            (false, true, "Cluster", true),
            (true, true, "Cluster", false),
        ] {
            let config = LoadBalancerConfig {
                selectorless,
                eps_controller: eps,
                ..config()
            };
            let desired = desired(
                &tenant(etp, &[("http", 80, Some(30080))]),
                "a1",
                "c",
                &config,
            )
            .unwrap();
            assert_eq!(
                desired.selector.is_some(),
                selected,
                "selectorless {selectorless}, eps {eps}, {etp}"
            );
        }
    }

    #[test]
    fn infra_labels_are_added() {
        let config = LoadBalancerConfig {
            infra_labels: BTreeMap::from([("team".into(), "blue".into())]),
            ..config()
        };
        let desired = desired(
            &tenant("Cluster", &[("http", 80, Some(30080))]),
            "a1",
            "c",
            &config,
        )
        .unwrap();
        assert_eq!(desired.labels["team"], "blue");
        assert_eq!(desired.labels.len(), 4);
    }

    #[test]
    fn a_port_without_a_node_port_is_refused() {
        let err = desired(
            &tenant("Cluster", &[("http", 80, None)]),
            "a1",
            "c",
            &config(),
        )
        .unwrap_err();
        assert!(err.contains("port http (80) has no nodePort"), "{err}");
    }

    fn existing(desired: &Desired) -> Service {
        // As the infra API server returns it: node ports allocated, defaults filled in.
        let mut service = desired.to_service("infra-ns");
        for port in service.spec.as_mut().unwrap().ports.as_mut().unwrap() {
            port.node_port = Some(31000 + port.port);
        }
        let spec = service.spec.as_mut().unwrap();
        spec.session_affinity = Some("None".into());
        spec.ip_family_policy = Some("SingleStack".into());
        spec.ip_families = Some(vec!["IPv4".into()]);
        service
    }

    /// An edit of a tenant Service's spec.
    type SpecEdit = Box<dyn Fn(&mut ServiceSpec)>;

    /// The tenant of [`tenant`] with `edit` applied to its spec.
    fn tenant_with(edit: impl Fn(&mut ServiceSpec)) -> Service {
        let mut service = tenant("Cluster", &[("http", 80, Some(30080))]);
        edit(service.spec.as_mut().unwrap());
        service
    }

    #[test]
    fn what_the_tenants_user_set_is_kept_in_step() {
        let base = desired(&tenant_with(|_| {}), "a1", "c", &config()).unwrap();
        let actual = existing(&base);
        assert_eq!(
            plan(&base, &actual),
            None,
            "the server's defaults are no change"
        );
        // (the tenant's edit, the fields the patch writes)
        let cases: Vec<(SpecEdit, &str)> = vec![
            (
                Box::new(|s| s.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()])),
                "spec.loadBalancerSourceRanges",
            ),
            (
                Box::new(|s| s.load_balancer_ip = Some("192.0.2.7".into())),
                "spec.loadBalancerIP",
            ),
            (
                Box::new(|s| s.external_ips = Some(vec!["198.51.100.1".into()])),
                "spec.externalIPs",
            ),
            (
                Box::new(|s| s.session_affinity = Some("ClientIP".into())),
                "spec.sessionAffinity, spec.sessionAffinityConfig",
            ),
            (
                Box::new(|s| s.ip_family_policy = Some("PreferDualStack".into())),
                "spec.ipFamilyPolicy",
            ),
        ];
        for (edit, fields) in cases {
            let wanted = desired(&tenant_with(edit), "a1", "c", &config()).unwrap();
            let patch = plan(&wanted, &actual).expect(fields);
            assert_eq!(describe(&patch), fields);
            // Created that way, the same tenant is no change (as the API server stores it).
            let mut created = wanted.to_service("infra-ns");
            let spec = created.spec.as_mut().unwrap();
            spec.ip_families = Some(vec!["IPv4".into()]);
            spec.ip_family_policy
                .get_or_insert_with(|| "SingleStack".into());
            assert_eq!(plan(&wanted, &created), None, "{fields}");
        }
        // Removed on the tenant, removed on the infra Service.
        let with_ranges = desired(
            &tenant_with(|s| s.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()])),
            "a1",
            "c",
            &config(),
        )
        .unwrap();
        let patch = plan(&base, &with_ranges.to_service("infra-ns")).unwrap();
        assert_eq!(patch["spec"]["loadBalancerSourceRanges"], Value::Null);
        // Back from dual-stack to one family: the second family goes in the same write.
        let single = desired(
            &tenant_with(|s| s.ip_family_policy = Some("SingleStack".into())),
            "a1",
            "c",
            &config(),
        )
        .unwrap();
        let mut dual = actual.clone();
        let spec = dual.spec.as_mut().unwrap();
        spec.ip_family_policy = Some("PreferDualStack".into());
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        assert_eq!(
            plan(&single, &dual).unwrap()["spec"],
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"]})
        );
    }

    /// What an infra Service for a tenant Service with one HTTP port (node port 30080) looks like.
    fn one_port_http() -> Desired {
        desired(
            &tenant("Cluster", &[("http", 80, Some(30080))]),
            "a1",
            "c",
            &config(),
        )
        .unwrap()
    }

    #[test]
    fn plans() {
        let base = one_port_http();
        let actual = existing(&base);
        // (what the tenant asks now, the patch's fields)
        let cases: Vec<(Desired, Option<&str>)> = vec![
            (base.clone(), None),
            (
                desired(
                    &tenant("Cluster", &[("http", 8080, Some(30080))]),
                    "a1",
                    "c",
                    &config(),
                )
                .unwrap(),
                Some("spec.ports"),
            ),
            (
                desired(
                    &tenant("Cluster", &[("http", 80, Some(30081))]),
                    "a1",
                    "c",
                    &config(),
                )
                .unwrap(),
                Some("spec.ports"),
            ),
            (
                desired(
                    &tenant(
                        "Cluster",
                        &[("http", 80, Some(30080)), ("dns", 53, Some(30053))],
                    ),
                    "a1",
                    "c",
                    &config(),
                )
                .unwrap(),
                Some("spec.ports"),
            ),
            (
                desired(
                    &tenant("Local", &[("http", 80, Some(30080))]),
                    "a1",
                    "c",
                    &config(),
                )
                .unwrap(),
                Some("spec.externalTrafficPolicy"),
            ),
            (
                desired(
                    &tenant("Local", &[("http", 80, Some(30080))]),
                    "a1",
                    "c",
                    &LoadBalancerConfig {
                        eps_controller: true,
                        ..config()
                    },
                )
                .unwrap(),
                Some("spec.externalTrafficPolicy, spec.selector"),
            ),
            (
                Desired {
                    annotations: BTreeMap::from([("example.com/owner".into(), "team-b".into())]),
                    ..base.clone()
                },
                Some("metadata.annotations"),
            ),
        ];
        for (wanted, fields) in cases {
            let patch = plan(&wanted, &actual);
            assert_eq!(
                patch.as_ref().map(describe).as_deref(),
                fields,
                "{wanted:?}"
            );
        }
        // An annotation the infra side added stays (never removed); a label somebody removed comes back.
        let mut edited = actual.clone();
        edited
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("infra.example.com/note".into(), "x".into());
        assert_eq!(plan(&base, &edited), None);
        edited
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(TENANT_CLUSTER_NAME_LABEL);
        assert_eq!(
            plan(&base, &edited),
            Some(json!({"metadata": {"labels": {TENANT_CLUSTER_NAME_LABEL: "c"}}}))
        );
        // The selector removed for mirrored endpoints is a JSON null (a merge patch's removal).
        let local_eps = desired(
            &tenant("Local", &[("http", 80, Some(30080))]),
            "a1",
            "c",
            &LoadBalancerConfig {
                eps_controller: true,
                ..config()
            },
        )
        .unwrap();
        assert_eq!(
            plan(&local_eps, &actual).unwrap()["spec"]["selector"],
            Value::Null
        );
    }

    #[test]
    fn changed_entries_are_the_added_and_changed_ones() {
        let map = |entries: &[(&str, &str)]| -> BTreeMap<String, String> {
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let wanted = map(&[("a", "1"), ("b", "2")]);
        for (have, expected) in [
            (None, Some(json!({"a": "1", "b": "2"}))),
            (Some(map(&[("a", "1"), ("b", "2"), ("c", "3")])), None),
            (Some(map(&[("a", "0")])), Some(json!({"a": "1", "b": "2"}))),
            (Some(map(&[("a", "1")])), Some(json!({"b": "2"}))),
        ] {
            assert_eq!(
                changed_entries(&wanted, have.as_ref()),
                expected,
                "{have:?}"
            );
        }
    }

    #[test]
    fn merge_patches_hold_only_the_sections_that_change() {
        let section = |value: Value| match value {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        for (metadata, spec, expected) in [
            (json!({}), json!({}), None),
            (
                json!({"labels": {"a": "1"}}),
                json!({}),
                Some(json!({"metadata": {"labels": {"a": "1"}}})),
            ),
            (
                json!({}),
                json!({"selector": null}),
                Some(json!({"spec": {"selector": null}})),
            ),
            (
                json!({"labels": {"a": "1"}}),
                json!({"selector": null}),
                Some(json!({"metadata": {"labels": {"a": "1"}}, "spec": {"selector": null}})),
            ),
        ] {
            assert_eq!(
                merge_patch(section(metadata.clone()), section(spec.clone())),
                expected,
                "{metadata} {spec}"
            );
        }
    }

    #[test]
    fn single_stack_again_drops_the_second_family() {
        let base = one_port_http();
        let families = |f: &[&str]| Some(f.iter().map(|f| f.to_string()).collect::<Vec<_>>());
        for (wanted, have, have_families, expected) in [
            (
                None,
                Some("PreferDualStack"),
                families(&["IPv4", "IPv6"]),
                json!({}),
            ),
            (
                Some("SingleStack"),
                Some("SingleStack"),
                families(&["IPv4"]),
                json!({}),
            ),
            (
                Some("SingleStack"),
                Some("PreferDualStack"),
                families(&["IPv6", "IPv4"]),
                json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}),
            ),
            (
                Some("PreferDualStack"),
                None,
                families(&["IPv4"]),
                json!({"ipFamilyPolicy": "PreferDualStack"}),
            ),
        ] {
            let wanted = Desired {
                ip_family_policy: wanted.map(str::to_owned),
                ..base.clone()
            };
            let spec = ServiceSpec {
                ip_family_policy: have.map(str::to_owned),
                ip_families: have_families,
                ..Default::default()
            };
            assert_eq!(
                Value::Object(ip_family_policy_patch(&wanted, &spec)),
                expected,
                "{wanted:?} {have:?}"
            );
        }
    }

    #[test]
    fn readiness_by_status_and_age() {
        let base = one_port_http();
        let mut service = existing(&base);
        let timeout = Duration::from_secs(300);
        assert_eq!(
            readiness(&service, Duration::from_secs(4), timeout),
            Readiness::Waiting
        );
        assert_eq!(
            readiness(&service, Duration::from_secs(301), timeout),
            Readiness::TimedOut(Duration::from_secs(301))
        );
        let status = LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some("192.0.2.10".into()),
                ..Default::default()
            }]),
        };
        service.status = Some(ServiceStatus {
            load_balancer: Some(status.clone()),
            ..Default::default()
        });
        assert_eq!(
            readiness(&service, Duration::from_secs(400), timeout),
            Readiness::Ready(status)
        );
    }
}
