//! The checks of the conformance suite, one function each.

use std::{future::Future, pin::Pin};

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node};

use super::{Fixtures, Outcome};
use crate::{CloudError, CloudProvider, ProviderId, Route, get_instance_provider_id};

/// Said after a failure about the existing node, which may be the fixture's fault.
const EXISTING_FIXTURE: &str =
    "(if it is not the provider: Fixtures::existing_node must name a node whose instance runs)";

type CheckFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;
type Check = for<'a> fn(&'a dyn CloudProvider, &'a Fixtures) -> CheckFuture<'a>;

/// Why a check stopped early.
enum Stop {
    Skip(String),
    Fail(String),
}

type CheckResult = Result<(), Stop>;

macro_rules! check {
    ($f:ident) => {
        (stringify!($f), |cloud, fixtures| {
            Box::pin(async move {
                match $f(cloud, fixtures).await {
                    Ok(()) => Outcome::Passed,
                    Err(Stop::Skip(why)) => Outcome::Skipped(why),
                    Err(Stop::Fail(why)) => Outcome::Failed(why),
                }
            })
        })
    };
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Stop::Fail(format!($($msg)+)));
        }
    };
}

/// Every check, in the order they run.
pub(super) const ALL: &[(&str, Check)] = &[
    check!(provider_name_is_usable_in_provider_ids),
    check!(instances_v2_reports_existing_and_missing_instances),
    check!(instances_v2_metadata_has_a_provider_id_of_this_provider),
    check!(instances_v2_metadata_of_a_missing_instance_is_not_found),
    check!(instances_report_existing_and_missing_instances),
    check!(instances_provider_id_has_this_providers_prefix),
    check!(instances_v2_report_a_shut_down_instance),
    check!(instances_report_a_shut_down_instance),
    check!(zones_know_the_existing_node),
    check!(clusters_list_and_name_a_master),
    check!(load_balancer_does_not_exist_before_ensure),
    check!(load_balancer_ensure_is_idempotent_and_get_agrees),
    check!(load_balancer_update_and_delete_are_idempotent),
    check!(load_balancer_serves_local_traffic_policy_and_source_ranges),
    check!(load_balancer_is_listed_and_deleted_as_an_orphan),
    check!(load_balancer_kept_is_adopted_by_the_next_service_of_its_name),
    check!(routes_round_trip),
];

fn call<T>(what: &str, result: Result<T, CloudError>) -> Result<T, Stop> {
    result.map_err(|err| Stop::Fail(format!("{what} failed: {err}")))
}

/// `ensure_load_balancer`, called again while it answers [`CloudError::RetryAfter`] (a load balancer
/// still provisioning, as the trait allows), after the delay it asks for, for up to a minute.
async fn ensure_ready(
    lb: &dyn crate::LoadBalancer,
    cluster_name: &str,
    service: &k8s_openapi::api::core::v1::Service,
    nodes: &[std::sync::Arc<Node>],
) -> Result<k8s_openapi::api::core::v1::LoadBalancerStatus, CloudError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match lb.ensure_load_balancer(cluster_name, service, nodes).await {
            Err(err) if std::time::Instant::now() < deadline => match err.retry_delay() {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Err(err),
            },
            other => return other,
        }
    }
}

fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn skip(part: &str) -> CheckResult {
    Err(Stop::Skip(format!("the provider does not offer {part}")))
}

async fn provider_name_is_usable_in_provider_ids(
    cloud: &dyn CloudProvider,
    _: &Fixtures,
) -> CheckResult {
    let name = cloud.provider_name();
    ensure!(!name.is_empty(), "provider_name() is empty");
    ensure!(
        !name.contains("://") && !name.contains(char::is_whitespace),
        "provider_name() {name:?} cannot prefix a provider ID"
    );
    Ok(())
}

async fn instances_v2_reports_existing_and_missing_instances(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances_v2() else {
        return skip("InstancesV2");
    };
    let exists = call(
        "instance_exists(existing node)",
        instances.instance_exists(&f.existing_node).await,
    )?;
    ensure!(
        exists,
        "instance_exists({:?}) = false for a node whose instance exists {EXISTING_FIXTURE}",
        name(&f.existing_node)
    );
    let shutdown = call(
        "instance_shutdown(existing node)",
        instances.instance_shutdown(&f.existing_node).await,
    )?;
    ensure!(
        !shutdown,
        "instance_shutdown({:?}) = true for a running instance {EXISTING_FIXTURE}",
        name(&f.existing_node)
    );
    // A missing instance is "does not exist", never an error: the lifecycle controller relies on it.
    let missing = call(
        "instance_exists(missing node)",
        instances.instance_exists(&f.missing_node).await,
    )?;
    ensure!(
        !missing,
        "instance_exists({:?}) = true for a node without an instance",
        name(&f.missing_node)
    );
    Ok(())
}

async fn instances_v2_metadata_has_a_provider_id_of_this_provider(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances_v2() else {
        return skip("InstancesV2");
    };
    let metadata = call(
        "instance_metadata(existing node)",
        instances.instance_metadata(&f.existing_node).await,
    )?;
    let Some(metadata) = metadata else {
        return Err(Stop::Fail(format!(
            "instance_metadata({:?}) returned no metadata",
            name(&f.existing_node)
        )));
    };
    let id = ProviderId::parse_for(cloud.provider_name(), &metadata.provider_id)
        .map_err(|err| Stop::Fail(format!("instance_metadata().provider_id: {err}")))?;
    // The same node asked again must give the same, stable ID.
    let again = call(
        "instance_metadata(existing node) again",
        instances.instance_metadata(&f.existing_node).await,
    )?;
    ensure!(
        again.as_ref().map(|m| m.provider_id.as_str()) == Some(metadata.provider_id.as_str()),
        "provider ID changed between calls: {id} then {:?}",
        again.map(|m| m.provider_id)
    );
    // A node that already carries its provider ID is found by it.
    let mut with_id = f.existing_node.clone();
    with_id
        .spec
        .get_or_insert_with(Default::default)
        .provider_id = Some(metadata.provider_id.clone());
    let by_id = call(
        "instance_exists(node with providerID)",
        instances.instance_exists(&with_id).await,
    )?;
    ensure!(
        by_id,
        "instance_exists() = false for a node whose spec.providerID is {id}"
    );
    Ok(())
}

async fn instances_v2_metadata_of_a_missing_instance_is_not_found(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances_v2() else {
        return skip("InstancesV2");
    };
    match instances.instance_metadata(&f.missing_node).await {
        Err(CloudError::InstanceNotFound) | Ok(None) => Ok(()),
        Ok(Some(m)) => Err(Stop::Fail(format!(
            "instance_metadata({:?}) returned metadata ({}) for a node without an instance",
            name(&f.missing_node),
            m.provider_id
        ))),
        Err(err) => Err(Stop::Fail(format!(
            "instance_metadata(missing node) must fail with InstanceNotFound, not: {err}"
        ))),
    }
}

async fn instances_report_existing_and_missing_instances(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances() else {
        return skip("Instances");
    };
    let id = call(
        "instance_id(existing node)",
        instances.instance_id(name(&f.existing_node)).await,
    )?;
    ensure!(
        !id.is_empty(),
        "instance_id({:?}) is empty",
        name(&f.existing_node)
    );
    match instances.instance_id(name(&f.missing_node)).await {
        Err(CloudError::InstanceNotFound) => {}
        other => {
            return Err(Stop::Fail(format!(
                "instance_id(missing node) must fail with InstanceNotFound, got {other:?}"
            )));
        }
    }
    let addresses = call(
        "node_addresses(existing node)",
        instances.node_addresses(name(&f.existing_node)).await,
    )?;
    ensure!(
        !addresses.is_empty(),
        "node_addresses({:?}) is empty",
        name(&f.existing_node)
    );
    call(
        "instance_type(existing node)",
        instances.instance_type(name(&f.existing_node)).await,
    )?;
    Ok(())
}

async fn instances_provider_id_has_this_providers_prefix(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances() else {
        return skip("Instances");
    };
    let provider_id = call(
        "get_instance_provider_id(existing node)",
        get_instance_provider_id(cloud, name(&f.existing_node)).await,
    )?;
    ProviderId::parse_for(cloud.provider_name(), &provider_id)
        .map_err(|err| Stop::Fail(format!("provider ID from instance_id(): {err}")))?;
    let exists = call(
        "instance_exists_by_provider_id(existing)",
        instances.instance_exists_by_provider_id(&provider_id).await,
    )?;
    ensure!(
        exists,
        "instance_exists_by_provider_id({provider_id:?}) = false for an existing instance"
    );
    let shutdown = match instances
        .instance_shutdown_by_provider_id(&provider_id)
        .await
    {
        Err(CloudError::NotImplemented) => false,
        other => call("instance_shutdown_by_provider_id", other)?,
    };
    ensure!(
        !shutdown,
        "instance_shutdown_by_provider_id({provider_id:?}) = true for a running instance"
    );
    let by_id = call(
        "node_addresses_by_provider_id(existing)",
        instances.node_addresses_by_provider_id(&provider_id).await,
    )?;
    let by_name = call(
        "node_addresses(existing)",
        instances.node_addresses(name(&f.existing_node)).await,
    )?;
    ensure!(
        by_id == by_name,
        "addresses by provider ID {by_id:?} differ from addresses by name {by_name:?}"
    );
    Ok(())
}

async fn zones_know_the_existing_node(cloud: &dyn CloudProvider, f: &Fixtures) -> CheckResult {
    let Some(zones) = cloud.zones() else {
        return skip("Zones");
    };
    let zone = call(
        "get_zone_by_node_name(existing)",
        zones.get_zone_by_node_name(name(&f.existing_node)).await,
    )?;
    ensure!(
        !zone.failure_domain.is_empty(),
        "get_zone_by_node_name() returned an empty failure domain"
    );
    if cloud.instances().is_some() {
        let provider_id = call(
            "get_instance_provider_id(existing node)",
            get_instance_provider_id(cloud, name(&f.existing_node)).await,
        )?;
        let by_id = call(
            "get_zone_by_provider_id(existing)",
            zones.get_zone_by_provider_id(&provider_id).await,
        )?;
        ensure!(
            by_id == zone,
            "zone by provider ID {by_id:?} differs from zone by name {zone:?}"
        );
    }
    Ok(())
}

fn has_ingress(status: &LoadBalancerStatus) -> bool {
    status.ingress.as_ref().is_some_and(|ingress| {
        ingress
            .iter()
            .any(|i| i.ip.is_some() || i.hostname.is_some())
    })
}

async fn load_balancer_does_not_exist_before_ensure(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(lb) = cloud.load_balancer() else {
        return skip("LoadBalancer");
    };
    let got = call(
        "get_load_balancer(before ensure)",
        lb.get_load_balancer(&f.cluster_name, &f.service).await,
    )?;
    ensure!(
        got.is_none(),
        "get_load_balancer() reports a load balancer before any was ensured: {got:?}"
    );
    let name = lb.get_load_balancer_name(&f.cluster_name, &f.service);
    ensure!(!name.is_empty(), "get_load_balancer_name() is empty");
    ensure!(
        name == lb.get_load_balancer_name(&f.cluster_name, &f.service),
        "get_load_balancer_name() is not deterministic"
    );
    Ok(())
}

async fn load_balancer_ensure_is_idempotent_and_get_agrees(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(lb) = cloud.load_balancer() else {
        return skip("LoadBalancer");
    };
    let first = call(
        "ensure_load_balancer",
        ensure_ready(lb, &f.cluster_name, &f.service, &f.backend_nodes).await,
    )?;
    ensure!(
        has_ingress(&first),
        "ensure_load_balancer() returned a status without ingress: {first:?}"
    );
    let second = call(
        "ensure_load_balancer (again)",
        ensure_ready(lb, &f.cluster_name, &f.service, &f.backend_nodes).await,
    )?;
    ensure!(
        first == second,
        "a second ensure_load_balancer() changed the status: {first:?} then {second:?}"
    );
    let got = call(
        "get_load_balancer(after ensure)",
        lb.get_load_balancer(&f.cluster_name, &f.service).await,
    )?;
    ensure!(
        got.as_ref() == Some(&first),
        "get_load_balancer() = {got:?} after ensure returned {first:?}"
    );
    Ok(())
}

async fn load_balancer_update_and_delete_are_idempotent(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(lb) = cloud.load_balancer() else {
        return skip("LoadBalancer");
    };
    call(
        "ensure_load_balancer",
        ensure_ready(lb, &f.cluster_name, &f.service, &f.backend_nodes).await,
    )?;
    // Fewer backends when there are several; else the same ones again (an update must accept both).
    let fewer = match f.backend_nodes.len() {
        0 | 1 => &f.backend_nodes[..],
        n => &f.backend_nodes[..n - 1],
    };
    call(
        "update_load_balancer",
        lb.update_load_balancer(&f.cluster_name, &f.service, fewer)
            .await,
    )?;
    call(
        "update_load_balancer (again)",
        lb.update_load_balancer(&f.cluster_name, &f.service, fewer)
            .await,
    )?;
    ensure!(
        call(
            "get_load_balancer(after update)",
            lb.get_load_balancer(&f.cluster_name, &f.service).await
        )?
        .is_some(),
        "the load balancer vanished after update_load_balancer()"
    );
    call(
        "ensure_load_balancer_deleted",
        lb.ensure_load_balancer_deleted(&f.cluster_name, &f.service)
            .await,
    )?;
    let got = call(
        "get_load_balancer(after delete)",
        lb.get_load_balancer(&f.cluster_name, &f.service).await,
    )?;
    ensure!(
        got.is_none(),
        "get_load_balancer() = {got:?} after ensure_load_balancer_deleted()"
    );
    match lb
        .ensure_load_balancer_deleted(&f.cluster_name, &f.service)
        .await
    {
        Ok(()) => Ok(()),
        Err(CloudError::ImplementedElsewhere) => Err(Stop::Fail(
            "ensure_load_balancer_deleted() must never return ImplementedElsewhere".to_owned(),
        )),
        Err(err) => Err(Stop::Fail(format!(
            "deleting a load balancer that is already gone must succeed, got: {err}"
        ))),
    }
}

/// The sweep's contract: an ensured load balancer is listed under the name `get_load_balancer_name`
/// gives, and deleting it as an orphan makes it gone (twice is fine). Skipped when the provider does
/// not list its load balancers.
async fn load_balancer_is_listed_and_deleted_as_an_orphan(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(lb) = cloud.load_balancer() else {
        return skip("LoadBalancer");
    };
    let name = lb.get_load_balancer_name(&f.cluster_name, &f.service);
    let before = match lb.list_load_balancers(&f.cluster_name).await {
        Err(CloudError::NotImplemented) => return skip("list_load_balancers"),
        other => call("list_load_balancers", other)?,
    };
    ensure!(
        !before.iter().any(|l| l.name == name),
        "list_load_balancers() lists {name} before it was ensured"
    );
    call(
        "ensure_load_balancer",
        ensure_ready(lb, &f.cluster_name, &f.service, &f.backend_nodes).await,
    )?;
    let listed = call(
        "list_load_balancers",
        lb.list_load_balancers(&f.cluster_name).await,
    )?;
    let Some(ours) = listed.iter().find(|l| l.name == name) else {
        let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
        return Err(Stop::Fail(format!(
            "list_load_balancers() after ensure_load_balancer() lacks {name} (get_load_balancer_name): {names:?}"
        )));
    };
    for _ in 0..2 {
        call(
            "delete_orphaned_load_balancer",
            lb.delete_orphaned_load_balancer(&f.cluster_name, ours)
                .await,
        )?;
    }
    let got = call(
        "get_load_balancer(after delete_orphaned_load_balancer)",
        lb.get_load_balancer(&f.cluster_name, &f.service).await,
    )?;
    ensure!(
        got.is_none(),
        "get_load_balancer() = {got:?} after delete_orphaned_load_balancer()"
    );
    Ok(())
}

/// For a provider that keeps load balancers (`retains_load_balancers`): one kept for the fixture's
/// Service is listed as retained (when the provider lists), and a new Service of the same namespace and
/// name (another UID) adopts it with the same address.
async fn load_balancer_kept_is_adopted_by_the_next_service_of_its_name(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(lb) = cloud.load_balancer() else {
        return skip("LoadBalancer");
    };
    if !lb.retains_load_balancers() {
        return skip("kept load balancers (retains_load_balancers)");
    }
    let first = call(
        "ensure_load_balancer",
        ensure_ready(lb, &f.cluster_name, &f.service, &f.backend_nodes).await,
    )?;
    call(
        "retain_load_balancer",
        lb.retain_load_balancer(&f.cluster_name, &f.service).await,
    )?;
    let meta = &f.service.metadata;
    let (namespace, name) = (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
    );
    match lb.list_load_balancers(&f.cluster_name).await {
        Err(CloudError::NotImplemented) => {}
        listed => {
            let listed = call("list_load_balancers", listed)?;
            let kept = listed.iter().find(|l| {
                l.service
                    .as_ref()
                    .is_some_and(|s| s.namespace == namespace && s.name == name)
            });
            ensure!(
                kept.is_some_and(|l| l.retained),
                "after retain_load_balancer(), list_load_balancers() does not mark {namespace}/{name}'s as retained: {kept:?}"
            );
        }
    }
    let mut next = f.service.clone();
    next.metadata.uid = Some("5d0c3f7e-2a61-4d8e-9b47-0c1f6a3e8b25".to_owned());
    let adopted = call(
        "ensure_load_balancer(a new Service of the same name)",
        ensure_ready(lb, &f.cluster_name, &next, &f.backend_nodes).await,
    );
    let deleted = lb
        .ensure_load_balancer_deleted(&f.cluster_name, &next)
        .await;
    let adopted = adopted?;
    call("ensure_load_balancer_deleted", deleted)?;
    ensure!(
        adopted.ingress == first.ingress,
        "a new Service of the same name got {:?}, not the kept {:?}",
        adopted.ingress,
        first.ingress
    );
    Ok(())
}

/// The fixture's Service as the helpers in `service_helpers` read it in the cases they exist for:
/// `externalTrafficPolicy: Local` with a health-check node port, source ranges, and the API server's
/// defaulted `spec.ipFamilies` (IPv4 unless the fixture chose).
fn local_policy_service(f: &Fixtures) -> k8s_openapi::api::core::v1::Service {
    let mut service = f.service.clone();
    let meta = &mut service.metadata;
    meta.name = meta.name.as_ref().map(|name| format!("{name}-local"));
    // A UID of its own: a load balancer of its own.
    meta.uid = Some("0f3c7a52-93be-4c3e-8d7a-5b1e2c9d4f60".to_owned());
    let spec = service.spec.get_or_insert_with(Default::default);
    spec.external_traffic_policy = Some("Local".to_owned());
    spec.health_check_node_port = Some(32123);
    spec.load_balancer_source_ranges = Some(vec!["10.0.0.0/8".to_owned()]);
    if spec.ip_families.is_none() {
        spec.ip_families = Some(vec!["IPv4".to_owned()]);
        spec.ip_family_policy = Some("SingleStack".to_owned());
    }
    service
}

async fn load_balancer_serves_local_traffic_policy_and_source_ranges(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(lb) = cloud.load_balancer() else {
        return skip("LoadBalancer");
    };
    let service = local_policy_service(f);
    let families = crate::service_helpers::ip_families(&service)
        .map_err(|err| Stop::Fail(format!("the fixture's Service: {err}")))?;
    let status = call(
        "ensure_load_balancer(externalTrafficPolicy: Local, source ranges)",
        ensure_ready(lb, &f.cluster_name, &service, &f.backend_nodes).await,
    )?;
    ensure!(
        has_ingress(&status),
        "ensure_load_balancer() returned a status without ingress for a Service with externalTrafficPolicy: Local: {status:?}"
    );
    for ingress in status.ingress.iter().flatten() {
        if let Some(ip) = &ingress.ip {
            let ip: std::net::IpAddr = ip
                .parse()
                .map_err(|_| Stop::Fail(format!("ingress ip {ip:?} is not an IP address")))?;
            let family = crate::service_helpers::IpFamily::of(ip);
            ensure!(
                families.contains(&family),
                "ingress ip {ip} is {}, but the Service asks for {families:?} (spec.ipFamilies)",
                family.as_str()
            );
        }
        if let Some(mode) = &ingress.ip_mode {
            ensure!(
                mode == "VIP" || mode == "Proxy",
                "ingress ipMode {mode:?} is neither VIP nor Proxy"
            );
            ensure!(
                ingress.ip.is_some(),
                "ingress ipMode {mode:?} is set without an ip (the API server refuses that)"
            );
        }
    }
    call(
        "ensure_load_balancer_deleted(externalTrafficPolicy: Local)",
        lb.ensure_load_balancer_deleted(&f.cluster_name, &service)
            .await,
    )?;
    let got = call(
        "get_load_balancer(after delete)",
        lb.get_load_balancer(&f.cluster_name, &service).await,
    )?;
    ensure!(
        got.is_none(),
        "get_load_balancer() = {got:?} after ensure_load_balancer_deleted()"
    );
    Ok(())
}

/// Skips a shut-down check when the fixtures name no shut-down node.
fn shutdown_fixture(f: &Fixtures) -> Result<&Node, Stop> {
    f.shutdown_node.as_ref().ok_or_else(|| {
        Stop::Skip("the fixtures name no shut-down node (Fixtures::with_shutdown_node)".to_owned())
    })
}

/// A shut-down instance still exists (its node is tainted, not deleted) and is reported shut down.
async fn instances_v2_report_a_shut_down_instance(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances_v2() else {
        return skip("InstancesV2");
    };
    let node = shutdown_fixture(f)?;
    let exists = call(
        "instance_exists(shut-down node)",
        instances.instance_exists(node).await,
    )?;
    ensure!(
        exists,
        "instance_exists({:?}) = false for a shut-down instance: the lifecycle controller would delete its node (if it is not the provider: Fixtures::shutdown_node must name a stopped instance)",
        name(node)
    );
    let shutdown = call(
        "instance_shutdown(shut-down node)",
        instances.instance_shutdown(node).await,
    )?;
    ensure!(
        shutdown,
        "instance_shutdown({:?}) = false for a shut-down instance",
        name(node)
    );
    Ok(())
}

/// The legacy Instances API reports a shut-down instance by provider ID as existing and shut down.
async fn instances_report_a_shut_down_instance(
    cloud: &dyn CloudProvider,
    f: &Fixtures,
) -> CheckResult {
    let Some(instances) = cloud.instances() else {
        return skip("Instances");
    };
    let node = shutdown_fixture(f)?;
    let provider_id = match get_instance_provider_id(cloud, name(node)).await {
        Err(CloudError::NotImplemented) => {
            return Err(Stop::Skip(
                "instance_id() is not implemented, so there is no provider ID to ask about"
                    .to_owned(),
            ));
        }
        other => call("instance_id(shut-down node)", other)?,
    };
    let exists = call(
        "instance_exists_by_provider_id(shut-down node)",
        instances.instance_exists_by_provider_id(&provider_id).await,
    )?;
    ensure!(
        exists,
        "instance_exists_by_provider_id({provider_id:?}) = false for a shut-down instance"
    );
    let shutdown = call(
        "instance_shutdown_by_provider_id(shut-down node)",
        instances
            .instance_shutdown_by_provider_id(&provider_id)
            .await,
    )?;
    ensure!(
        shutdown,
        "instance_shutdown_by_provider_id({provider_id:?}) = false for a shut-down instance"
    );
    Ok(())
}

/// A cloud that offers Clusters lists them, and names a master for each it lists.
async fn clusters_list_and_name_a_master(cloud: &dyn CloudProvider, _: &Fixtures) -> CheckResult {
    let Some(clusters) = cloud.clusters() else {
        return skip("Clusters");
    };
    let names = call("list_clusters", clusters.list_clusters().await)?;
    for cluster in &names {
        ensure!(
            !cluster.is_empty(),
            "list_clusters() returned an empty name"
        );
        let master = call(
            &format!("master({cluster:?})"),
            clusters.master(cluster).await,
        )?;
        ensure!(
            !master.is_empty(),
            "master({cluster:?}) is empty for a cluster list_clusters() returned"
        );
    }
    Ok(())
}

fn find<'a>(routes: &'a [Route], wanted: &Route) -> Option<&'a Route> {
    routes.iter().find(|r| {
        r.destination_cidr == wanted.destination_cidr && r.target_node == wanted.target_node
    })
}

async fn routes_round_trip(cloud: &dyn CloudProvider, f: &Fixtures) -> CheckResult {
    let Some(routes) = cloud.routes() else {
        return skip("Routes");
    };
    let before = call("list_routes", routes.list_routes(&f.cluster_name).await)?;
    ensure!(
        find(&before, &f.route).is_none(),
        "the fixture route {:?} already exists",
        f.route.destination_cidr
    );
    call(
        "create_route",
        routes
            .create_route(&f.cluster_name, "conformance-node-uid", &f.route)
            .await,
    )?;
    let listed = call(
        "list_routes(after create)",
        routes.list_routes(&f.cluster_name).await,
    )?;
    let Some(created) = find(&listed, &f.route).cloned() else {
        return Err(Stop::Fail(format!(
            "list_routes() does not show the created route to {} via {}",
            f.route.destination_cidr, f.route.target_node
        )));
    };
    ensure!(
        !created.blackhole,
        "a freshly created route is listed as a blackhole"
    );
    call(
        "delete_route",
        routes.delete_route(&f.cluster_name, &created).await,
    )?;
    let after = call(
        "list_routes(after delete)",
        routes.list_routes(&f.cluster_name).await,
    )?;
    ensure!(
        find(&after, &f.route).is_none(),
        "list_routes() still shows the deleted route {}",
        created.name
    );
    ensure!(
        after.len() == before.len(),
        "the round trip changed other routes: {} before, {} after",
        before.len(),
        after.len()
    );
    Ok(())
}
