//! A provider's extension points on the real API server: flags of its own that reach its factory, and a
//! controller of its own that `--controllers` selects, that uses the manager's caches and client, that
//! `/healthz` lists, and that the manager awaits at shutdown.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cloud_controller_manager::{
    ControllerSpec, Manager,
    controllers::{ControllerContext, ControllerTask},
    informers::wait_for_cache_sync,
};
use cloud_provider::{
    CloudConfig, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, LoadBalancer,
    ProviderResult, Registry, async_trait, clap, node_address,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use support::{
    SERIAL, create_node, delete_nodes, ensure_namespace, eventually, free_port, get_node,
    https_get, load_balancer_service, services, status_ip,
};
use test_control_plane::{control_plane, kubelet_node, unique_name};
use tokio_util::sync::CancellationToken;

/// The provider's flags.
#[derive(Debug, Clone, clap::Args)]
struct ZoneFlags {
    /// The zone of every instance.
    #[arg(long, default_value = "zone-default")]
    zoned_zone: String,
}

/// A cloud in which every node is an instance in the zone the flag names.
struct Zoned {
    zone: String,
}

#[async_trait]
impl InstancesV2 for Zoned {
    async fn instance_exists(&self, _: &Node) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        Ok(Some(InstanceMetadata {
            provider_id: format!("zoned://{}", node.name_any()),
            instance_type: "small".into(),
            zone: self.zone.clone(),
            region: "region-z".into(),
            node_addresses: vec![node_address("Hostname", node.name_any())],
            ..Default::default()
        }))
    }
}

impl CloudProvider for Zoned {
    fn provider_name(&self) -> &str {
        "zoned"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

fn new_zoned(config: &CloudConfig) -> ProviderResult {
    let flags: ZoneFlags = config.flags()?;
    Ok(Arc::new(Zoned {
        zone: flags.zoned_zone,
    }))
}

/// The controller's flags.
#[derive(Debug, Clone, clap::Args)]
struct GreeterFlags {
    /// The value of the annotation the greeter puts on every node.
    #[arg(long, default_value = "hello")]
    greeter_value: String,
}

const GREETED: &str = "greeter.example.com/greeting";

/// Set once the greeter has finished its shutdown work.
static GREETER_FINISHED: AtomicBool = AtomicBool::new(false);

/// A controller of the provider's own: annotates every node in the shared cache; at shutdown it takes
/// half a second to finish, which the manager must wait for.
fn start_greeter(ctx: ControllerContext, flags: GreeterFlags) -> Option<ControllerTask> {
    // Asked for before the task is returned: the manager starts it, whatever else runs.
    let nodes = ctx.informers.nodes();
    Some(Box::pin(async move {
        let store = nodes.store();
        let api: Api<Node> = Api::all(ctx.client.clone());
        if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
            return Ok(());
        }
        loop {
            for node in store.state() {
                if node.annotations().get(GREETED) != Some(&flags.greeter_value) {
                    let patch =
                        json!({ "metadata": { "annotations": { GREETED: flags.greeter_value } } });
                    api.patch(
                        &node.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .map_err(|err| err.to_string())?;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = ctx.shutdown.cancelled() => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        GREETER_FINISHED.store(true, Ordering::SeqCst);
        Ok(())
    }))
}

fn manager() -> Manager {
    let mut registry = Registry::new();
    registry.register("zoned", new_zoned).unwrap();
    registry.register_flags("zoned", <ZoneFlags as clap::Args>::augment_args);
    Manager::with_registry(registry).with_controller(
        ControllerSpec::new(
            "node-greeter",
            |cfg| cfg.flags::<GreeterFlags>().map(Some),
            start_greeter,
        )
        .with_flags::<GreeterFlags>(),
    )
}

async fn run(
    args: &[&str],
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), cloud_controller_manager::ManagerError>>,
    u16,
) {
    run_manager(manager(), args).await
}

/// Runs `manager` with `args` (on the zoned cloud, without leader election, as the shipped RBAC's user,
/// unless they say otherwise), serving on a free port.
async fn run_manager(
    manager: Manager,
    args: &[&str],
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), cloud_controller_manager::ManagerError>>,
    u16,
) {
    test_control_plane::apply_shipped_rbac().await;
    let port = free_port();
    let kubeconfig = control_plane().ccm_kubeconfig();
    let mut argv = vec![
        "cloud-controller-manager".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
    ];
    // The zoned cloud without leader election, as the shipped RBAC's user, unless `args` say otherwise.
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    for (flag, default) in [
        ("--cloud-provider=", "--cloud-provider=zoned"),
        ("--leader-elect=", "--leader-elect=false"),
        ("--kubeconfig=", kubeconfig.as_str()),
    ] {
        if !args.iter().any(|a| a.starts_with(flag)) {
            argv.push(default.to_owned());
        }
    }
    argv.extend(args.iter().map(|a| a.to_string()));
    let command_line = manager.parse_from(argv).expect("valid flags");
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move { manager.run(command_line, token).await });
    (shutdown, task, port)
}

#[tokio::test]
async fn a_providers_flags_and_controller_run_with_the_managers() {
    let _serial = SERIAL.lock().await;
    delete_nodes(&["greeted-1"]).await;
    GREETER_FINISHED.store(false, Ordering::SeqCst);
    let (shutdown, task, port) = run(&["--zoned-zone=zone-z", "--greeter-value=hi"]).await;
    create_node(&kubelet_node("greeted-1")).await;

    // The provider's flag reached its factory: the node is in the zone it names.
    eventually(
        "the node initialized in zone-z",
        Duration::from_secs(30),
        || async {
            let node = get_node("greeted-1").await?;
            (node
                .labels()
                .get("topology.kubernetes.io/zone")
                .map(String::as_str)
                == Some("zone-z"))
            .then_some(())
        },
    )
    .await;
    // The controller's flag reached it, and it wrote through the manager's client.
    eventually("the greeting", Duration::from_secs(30), || async {
        let node = get_node("greeted-1").await?;
        (node.annotations().get(GREETED).map(String::as_str) == Some("hi")).then_some(())
    })
    .await;
    // /healthz lists it among the running controllers.
    let (code, body) = https_get(port, "/healthz?verbose", None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]node-greeter ok"), "{body}");

    // At shutdown the manager waits for its in-flight work.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
    assert!(
        GREETER_FINISHED.load(Ordering::SeqCst),
        "the manager returned before the controller finished"
    );
    delete_nodes(&["greeted-1"]).await;
}

#[tokio::test]
async fn controllers_turns_a_providers_controller_off() {
    let _serial = SERIAL.lock().await;
    delete_nodes(&["ungreeted-1"]).await;
    let (shutdown, task, port) = run(&["--controllers=*,-node-greeter"]).await;
    create_node(&kubelet_node("ungreeted-1")).await;
    // Default flags: the default zone; and the greeter never runs.
    eventually("the node initialized", Duration::from_secs(30), || async {
        let node = get_node("ungreeted-1").await?;
        (node
            .labels()
            .get("topology.kubernetes.io/zone")
            .map(String::as_str)
            == Some("zone-default"))
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = get_node("ungreeted-1").await.unwrap();
    assert_eq!(node.annotations().get(GREETED), None);
    let (_, body) = https_get(port, "/healthz?verbose", None).await;
    assert!(!body.contains("node-greeter"), "{body}");
    assert!(body.contains("[+]cloud-node-controller ok"), "{body}");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
    delete_nodes(&["ungreeted-1"]).await;
}

#[tokio::test]
async fn a_providers_controller_alone_gets_the_node_cache_it_asks_for() {
    let _serial = SERIAL.lock().await;
    let name = unique_name("greeted-alone");
    let (shutdown, task, port) = run(&["--controllers=node-greeter"]).await;
    create_node(&kubelet_node(&name)).await;
    // No built-in controller runs, so nothing else asked for the Node cache.
    eventually("the greeting", Duration::from_secs(20), || async {
        let node = get_node(&name).await?;
        (node.annotations().get(GREETED).map(String::as_str) == Some("hello")).then_some(())
    })
    .await;
    let (_, body) = https_get(port, "/healthz?verbose", None).await;
    assert!(body.contains("[+]node-greeter ok"), "{body}");
    assert!(!body.contains("cloud-node-controller"), "{body}");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
    delete_nodes(&[&name]).await;
}

const CHECKED: &str = "checker.example.com/checked";

/// A controller of the provider's own on the manager's work-queue runner, with a metric of its own: it
/// marks every node, and its reconcile panics on the node named `poison-*`.
fn start_checker(ctx: ControllerContext, _: ()) -> Option<ControllerTask> {
    use cloud_controller_manager::{
        controllers::{Next, run_on_work_queue},
        informers::CachedNode,
    };
    use cloud_provider::prometheus_client::metrics::counter::Counter;
    let nodes = ctx.informers.nodes();
    let changes = nodes.subscribe();
    let checked = Counter::<u64>::default();
    ctx.metrics.register_with(|registry| {
        registry.register("node_checker_checked", "Nodes marked.", checked.clone())
    });
    Some(Box::pin(async move {
        if !wait_for_cache_sync(&ctx.shutdown, [nodes.synced()]).await {
            return Ok(());
        }
        let api: Api<Node> = Api::all(ctx.client.clone());
        let reconcile = move |node: Arc<CachedNode>, checked: Arc<Counter<u64>>| {
            let api = api.clone();
            async move {
                let name = node.name_any();
                if name.starts_with("poison-") {
                    panic!("the checker cannot handle {name}");
                }
                if node.annotations().get(CHECKED).is_none() {
                    let patch = json!({ "metadata": { "annotations": { CHECKED: "yes" } } });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    checked.inc();
                }
                Ok::<_, kube::Error>(Next::AwaitChange)
            }
        };
        run_on_work_queue(
            &ctx,
            changes,
            nodes.store(),
            2,
            reconcile,
            |_, _, _| Next::RequeueAfter(Duration::from_secs(1)),
            Arc::new(checked),
        )
        .await;
        Ok(())
    }))
}

/// A provider's controller on the manager's work-queue runner: a reconcile that panics on one node is
/// retried on its back-off, counted in `workqueue_panics_total{name="node-checker"}` and told in an event
/// on that node, while the other nodes are handled; the controller's own metric is served with the
/// manager's.
#[tokio::test]
async fn a_providers_controller_on_the_work_queue_survives_a_panicking_key() {
    let _serial = SERIAL.lock().await;
    test_control_plane::apply_shipped_rbac().await;
    let good = [unique_name("checked-a"), unique_name("checked-b")];
    let poison = unique_name("poison");
    for name in good.iter().chain([&poison]) {
        create_node(&kubelet_node(name)).await;
    }
    let manager = manager().with_controller(ControllerSpec::new(
        "node-checker",
        |_| Ok(Some(())),
        start_checker,
    ));
    let metrics = manager.metrics().clone();
    let (shutdown, task, _port) = run_manager(manager, &["--controllers=node-checker"]).await;

    for name in &good {
        eventually("the good nodes marked", Duration::from_secs(30), || async {
            let node = get_node(name).await?;
            node.annotations().get(CHECKED).map(|_| ())
        })
        .await;
    }
    // Retried after 5 s: a second panic.
    let text = eventually(
        "the poison key retried",
        Duration::from_secs(30),
        || async {
            let text = metrics.encode();
            let panics = text.lines().find_map(|l| {
                l.strip_prefix(r#"workqueue_panics_total{name="node-checker"} "#)?
                    .parse::<u64>()
                    .ok()
            })?;
            (panics >= 2).then_some(text)
        },
    )
    .await;
    assert!(text.contains("node_checker_checked_total"), "{text}");
    assert!(
        text.contains(r#"workqueue_adds_total{name="node-checker"}"#),
        "{text}"
    );
    eventually("the panic's event", Duration::from_secs(30), || async {
        let events = support::events_for(&poison, "ReconcilePanicked").await;
        events.first().and_then(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("the checker cannot handle"))
                .then_some(())
        })
    })
    .await;
    assert_eq!(
        get_node(&poison).await.unwrap().annotations().get(CHECKED),
        None
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
    let mut all: Vec<&str> = good.iter().map(String::as_str).collect();
    all.push(&poison);
    delete_nodes(&all).await;
}

/// A cloud with load balancers that offers only what the trait requires: no listing (so no sweep of
/// orphaned load balancers) and no preview (so no drift check).
struct BasicLoadBalancers {
    zoned: Zoned,
}

#[async_trait]
impl InstancesV2 for BasicLoadBalancers {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.zoned.instance_exists(node).await
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.zoned.instance_shutdown(node).await
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.zoned.instance_metadata(node).await
    }
}

fn ingress() -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some("192.0.2.10".into()),
            ..Default::default()
        }]),
    }
}

#[async_trait]
impl LoadBalancer for BasicLoadBalancers {
    async fn get_load_balancer(
        &self,
        _: &str,
        _: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        Ok(Some(ingress()))
    }
    async fn ensure_load_balancer(
        &self,
        _: &str,
        _: &Service,
        _: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        Ok(ingress())
    }
    async fn update_load_balancer(&self, _: &str, _: &Service, _: &[Arc<Node>]) -> CloudResult<()> {
        Ok(())
    }
    async fn ensure_load_balancer_deleted(&self, _: &str, _: &Service) -> CloudResult<()> {
        Ok(())
    }
}

impl CloudProvider for BasicLoadBalancers {
    fn provider_name(&self) -> &str {
        "zoned"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

/// The service controller's orphan sweep and drift check end by design when the cloud cannot list or
/// preview its load balancers: that is no failure of the controller (its health check stays ok), unlike
/// a background loop that panics or ends otherwise (`controllers::background_loop`).
#[tokio::test]
async fn a_sweep_and_a_drift_check_the_cloud_cannot_do_leave_the_controller_healthy() {
    let _serial = SERIAL.lock().await;
    let mut registry = Registry::new();
    registry
        .register("zoned", |_: &CloudConfig| -> ProviderResult {
            Ok(Arc::new(BasicLoadBalancers {
                zoned: Zoned {
                    zone: "zone-b".into(),
                },
            }))
        })
        .unwrap();
    let (shutdown, task, port) = run_manager(
        Manager::with_registry(registry),
        &[
            "--controllers=service",
            "--orphaned-load-balancer-sweep-period=1s",
            "--load-balancer-drift-period=1s",
        ],
    )
    .await;
    let namespace = unique_name("basic-lb");
    ensure_namespace(&namespace).await;
    let api = services(&namespace).await;
    api.create(&Default::default(), &load_balancer_service("web", &[80]))
        .await
        .unwrap();
    eventually(
        "the Service has its ingress",
        Duration::from_secs(30),
        || async { status_ip(&api.get("web").await.ok()?).filter(|ip| ip == "192.0.2.10") },
    )
    .await;
    // Both loops have run (and ended: the cloud can do neither) within a few periods.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (code, body) = https_get(port, "/healthz?verbose", None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]service-lb-controller ok"), "{body}");
    api.delete("web", &Default::default()).await.unwrap();
    eventually("the Service is gone", Duration::from_secs(30), || async {
        api.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
}

/// What [`HandsOff::hand_off`] saw, and when its background work stopped.
#[derive(Debug, Default)]
struct HandOffSeen {
    /// Whether `hand_off` ran.
    called: bool,
    /// Whether `InitializeContext::shutdown` was cancelled when it ran.
    shutdown_cancelled_then: bool,
    /// The Lease's holder when it ran.
    holder_then: Option<String>,
    /// The provider's shutdown token, from `initialize`.
    shutdown: Option<CancellationToken>,
}

static HAND_OFF_SEEN: std::sync::Mutex<Option<HandOffSeen>> = std::sync::Mutex::new(None);
static HAND_OFF_LEASE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// A provider whose process carries traffic that it hands to the next leader on a graceful stop.
struct HandsOff;

#[async_trait]
impl CloudProvider for HandsOff {
    fn provider_name(&self) -> &str {
        "hands-off"
    }
    async fn initialize(&self, ctx: cloud_provider::InitializeContext) -> CloudResult<()> {
        HAND_OFF_SEEN
            .lock()
            .unwrap()
            .get_or_insert_with(Default::default)
            .shutdown = Some(ctx.shutdown);
        Ok(())
    }
    fn hands_off_traffic(&self) -> bool {
        true
    }
    async fn hand_off(&self) {
        let lease_name = HAND_OFF_LEASE.lock().unwrap().clone();
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(support::admin().await, "kube-system");
        let holder = leases
            .get(&lease_name)
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty());
        let mut seen = HAND_OFF_SEEN.lock().unwrap();
        let seen = seen.get_or_insert_with(Default::default);
        seen.called = true;
        seen.holder_then = holder;
        seen.shutdown_cancelled_then = seen
            .shutdown
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled);
    }
}

/// A provider that hands its traffic off (`hands_off_traffic`): on a graceful stop the manager lets
/// the controllers finish, releases the Lease, then calls `hand_off` while the provider's background
/// work still runs (its `InitializeContext::shutdown` not yet cancelled), and cancels that only after.
#[tokio::test]
async fn a_graceful_stop_hands_off_after_the_lease_is_released_and_before_the_provider_stops() {
    let _serial = SERIAL.lock().await;
    let lease = unique_name("hands-off");
    *HAND_OFF_LEASE.lock().unwrap() = lease.clone();
    let mut registry = Registry::new();
    registry
        .register("hands-off", |_: &CloudConfig| -> ProviderResult {
            Ok(Arc::new(HandsOff))
        })
        .unwrap();
    let lease_flag = format!("--leader-elect-resource-name={lease}");
    // As the admin: the shipped RBAC's user may hold only the default Lease, which other tests use.
    let admin_flag = format!(
        "--kubeconfig={}",
        control_plane().admin_kubeconfig().display()
    );
    let (shutdown, task, _) = run_manager(
        Manager::with_registry(registry),
        &[
            "--cloud-provider=hands-off",
            "--leader-elect=true",
            &lease_flag,
            &admin_flag,
            "--controllers=service",
        ],
    )
    .await;
    eventually(
        "the provider is initialized (as leader)",
        Duration::from_secs(30),
        || async {
            assert!(!task.is_finished(), "the manager stopped before it led");
            HAND_OFF_SEEN
                .lock()
                .unwrap()
                .as_ref()
                .and_then(|s| s.shutdown.clone())
        },
    )
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the manager stops")
        .expect("no panic")
        .expect("no error");
    let seen = HAND_OFF_SEEN.lock().unwrap().take().unwrap();
    assert!(seen.called, "hand_off ran");
    assert_eq!(seen.holder_then, None, "the Lease was released before it");
    assert!(
        !seen.shutdown_cancelled_then,
        "the provider's background work still ran during it"
    );
    assert!(
        seen.shutdown.as_ref().unwrap().is_cancelled(),
        "and stopped once the manager returned"
    );
}
