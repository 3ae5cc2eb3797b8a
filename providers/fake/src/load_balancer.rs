//! Load balancers of the fake cloud.

use async_trait::async_trait;
use cloud_provider::{
    CloudError, CloudResult, ClusterLoadBalancer, LoadBalancer, LoadBalancerPreview, ServiceRef,
    default_load_balancer_name, service_helpers::service_key,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::Ipv4Addr,
    sync::Arc,
};

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::{CloudState, FakeCloud, LoadBalancerRecord, Mutable, PortRecord, config::IpPool};

fn status_of(record: &LoadBalancerRecord) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(
            record
                .ingress
                .iter()
                .map(|ip| LoadBalancerIngress {
                    ip: Some(ip.clone()),
                    ip_mode: Some("VIP".to_owned()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

fn ports_of(service: &Service) -> Vec<PortRecord> {
    let mut ports: Vec<PortRecord> = service
        .spec
        .as_ref()
        .and_then(|spec| spec.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| PortRecord {
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
            port: p.port,
            node_port: p.node_port.unwrap_or(0),
        })
        .collect();
    ports.sort_by(|a, b| (a.port, &a.protocol).cmp(&(b.port, &b.protocol)));
    ports
}

/// The Service's `spec.loadBalancerIP`, if it asks for one (the field is deprecated upstream but still
/// honoured by most clouds; the fake honours it rather than ignore it).
fn requested_ip(service: &Service) -> CloudResult<Option<std::net::Ipv4Addr>> {
    let Some(field) = service
        .spec
        .as_ref()
        .and_then(|spec| spec.load_balancer_ip.as_deref())
        .filter(|ip| !ip.is_empty())
    else {
        return Ok(None);
    };
    field.parse().map(Some).map_err(|_| {
        CloudError::refused(format!(
            "spec.loadBalancerIP {field:?}: the fake cloud gives IPv4 addresses only"
        ))
    })
}

/// The requested address, if the pool has it free.
fn requested_address(
    requested: &std::net::Ipv4Addr,
    pool: &crate::config::IpPool,
    taken: bool,
) -> CloudResult<std::net::Ipv4Addr> {
    if !pool.contains(*requested) {
        return Err(CloudError::refused(format!(
            "spec.loadBalancerIP {requested} is not in the fake cloud's ipPool {pool}"
        )));
    }
    if taken {
        return Err(CloudError::refused(format!(
            "spec.loadBalancerIP {requested} is taken by another load balancer"
        )));
    }
    Ok(*requested)
}

fn node_names(nodes: &[Arc<Node>]) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

impl FakeCloud {
    fn position(cloud: &Mutable, name: &str) -> Option<usize> {
        cloud
            .state
            .load_balancers
            .iter()
            .position(|lb| lb.name == name)
    }
}

/// A load balancer kept for a Service of this namespace and name (`key`) that went: adopted, with its
/// address, under this Service's load-balancer `name`, unless one of that name exists.
fn adopt_retained(state: &mut CloudState, name: &str, key: &str) {
    if state.load_balancers.iter().any(|lb| lb.name == name) {
        return;
    }
    if let Some(kept) = state
        .load_balancers
        .iter_mut()
        .find(|lb| lb.retained && lb.service == key)
    {
        kept.name = name.to_owned();
        kept.retained = false;
    }
}

/// The existing `record` given the Service `key`'s listeners `ports` and backends `nodes`, and taken
/// back if it was kept when its Service stopped being a LoadBalancer; a `requested` address other
/// than its own is refused, as the fake cannot move a load balancer.
fn take_over(
    record: &mut LoadBalancerRecord,
    requested: Option<Ipv4Addr>,
    key: String,
    ports: Vec<PortRecord>,
    nodes: Arc<Vec<String>>,
) -> CloudResult<LoadBalancerStatus> {
    if let Some(requested) = requested
        && record.ingress != [requested.to_string()]
    {
        return Err(CloudError::refused(format!(
            "spec.loadBalancerIP {requested}: the fake cloud cannot move load balancer \
             {} from {:?}; delete and re-create the Service",
            record.name, record.ingress
        )));
    }
    record.service = key;
    record.ports = ports;
    record.nodes = nodes;
    record.retained = false;
    Ok(status_of(record))
}

/// The address of a new load balancer for the Service `key`: the `requested` one if `pool` has it
/// free, else a free one of `pool` (see [`free_address`]).
fn new_address(
    state: &CloudState,
    key: &str,
    requested: Option<Ipv4Addr>,
    pool: &IpPool,
) -> CloudResult<Ipv4Addr> {
    let taken: HashSet<Ipv4Addr> = state
        .load_balancers
        .iter()
        .flat_map(|lb| lb.ingress.iter().filter_map(|ip| ip.parse().ok()))
        .collect();
    match requested {
        Some(requested) => requested_address(&requested, pool, taken.contains(&requested)),
        None => free_address(&state.ip_assignments, key, pool, &taken)
            .ok_or_else(|| CloudError::other(format!("fake cloud: ipPool {pool} is exhausted"))),
    }
}

/// A free address of `pool` (not in `taken`) for the Service `key`: the one it was given before
/// (`assignments`), so it keeps its IP across a delete and re-create while the IP is free; else the
/// lowest never given to another Service; else the lowest free one.
fn free_address(
    assignments: &BTreeMap<String, Ipv4Addr>,
    key: &str,
    pool: &IpPool,
    taken: &HashSet<Ipv4Addr>,
) -> Option<Ipv4Addr> {
    let in_use = |ip: &Ipv4Addr| taken.contains(ip);
    assignments
        .get(key)
        .copied()
        .filter(|ip| pool.contains(*ip) && !in_use(ip))
        .or_else(|| {
            let assigned: BTreeSet<_> = assignments
                .iter()
                .filter(|(k, _)| *k != key)
                .map(|(_, ip)| *ip)
                .collect();
            pool.addresses()
                .find(|ip| !in_use(ip) && !assigned.contains(ip))
                .or_else(|| pool.addresses().find(|ip| !in_use(ip)))
        })
}

/// Adds `record` to the load balancers, kept sorted by name; its status.
fn add_load_balancer(state: &mut CloudState, record: LoadBalancerRecord) -> LoadBalancerStatus {
    let status = status_of(&record);
    state.load_balancers.push(record);
    state.load_balancers.sort_by(|a, b| a.name.cmp(&b.name));
    status
}

/// What `ensure_load_balancer` would change on `record` (`None`: there is none) to give it `service`'s
/// key and listeners and the backends `nodes`.
fn preview(
    record: Option<&LoadBalancerRecord>,
    service: &str,
    ports: &[PortRecord],
    nodes: Vec<String>,
) -> LoadBalancerPreview {
    let Some(record) = record else {
        return LoadBalancerPreview::Create { backends: nodes };
    };
    let missing = |from: &[String], other: &[String]| -> Vec<String> {
        from.iter()
            .filter(|n| !other.contains(n))
            .cloned()
            .collect()
    };
    let backends_added = missing(&nodes, &record.nodes);
    let backends_removed = missing(&record.nodes, &nodes);
    let mut detail = Vec::new();
    if record.service != service {
        detail.push(format!("service {} -> {service}", record.service));
    }
    if record.ports != ports {
        let show = |ports: &[PortRecord]| {
            ports
                .iter()
                .map(|p| format!("{}/{}->{}", p.port, p.protocol, p.node_port))
                .collect::<Vec<_>>()
                .join(",")
        };
        detail.push(format!(
            "ports [{}] -> [{}]",
            show(&record.ports),
            show(ports)
        ));
    }
    if backends_added.is_empty() && backends_removed.is_empty() && detail.is_empty() {
        return LoadBalancerPreview::UpToDate;
    }
    LoadBalancerPreview::Change {
        backends_added,
        backends_removed,
        detail: detail.join("; "),
    }
}

#[async_trait]
impl LoadBalancer for FakeCloud {
    async fn preview_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerPreview> {
        let key = service_key(service);
        self.enter_for("preview_load_balancer", &key).await?;
        let name = default_load_balancer_name(service);
        self.refresh()?;
        let cloud = self.inner.lock();
        let record = Self::position(&cloud, &name).map(|i| &cloud.state.load_balancers[i]);
        Ok(preview(record, &key, &ports_of(service), node_names(nodes)))
    }

    async fn get_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.enter_for("get_load_balancer", &service_key(service))
            .await?;
        let name = default_load_balancer_name(service);
        self.refresh()?;
        let cloud = self.inner.lock();
        Ok(Self::position(&cloud, &name).map(|i| status_of(&cloud.state.load_balancers[i])))
    }

    async fn ensure_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let config = self
            .enter_for("ensure_load_balancer", &service_key(service))
            .await?;
        let name = default_load_balancer_name(service);
        let key = service_key(service);
        let ports = ports_of(service);
        let nodes = node_names(nodes);
        let requested = requested_ip(service)?;
        self.change(|cloud| {
            let nodes = cloud.share_backends(nodes);
            adopt_retained(&mut cloud.state, &name, &key);
            if let Some(i) = Self::position(cloud, &name) {
                let record = &mut cloud.state.load_balancers[i];
                return take_over(record, requested, key, ports, nodes);
            }
            let pool = config.load_balancers.ip_pool;
            let ip = new_address(&cloud.state, &key, requested, &pool)?;
            cloud.state.ip_assignments.insert(key.clone(), ip);
            Ok(add_load_balancer(
                &mut cloud.state,
                LoadBalancerRecord {
                    name: name.clone(),
                    service: key,
                    ingress: vec![ip.to_string()],
                    ports,
                    nodes,
                    retained: false,
                },
            ))
        })
    }

    async fn update_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.enter_for("update_load_balancer", &service_key(service))
            .await?;
        let name = default_load_balancer_name(service);
        let nodes = node_names(nodes);
        self.change(|cloud| {
            let i = Self::position(cloud, &name).ok_or_else(|| {
                CloudError::other(format!(
                    "fake cloud: no load balancer {name} for service {}",
                    service_key(service)
                ))
            })?;
            cloud.state.load_balancers[i].nodes = cloud.share_backends(nodes);
            Ok(())
        })
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.enter_for("ensure_load_balancer_deleted", &service_key(service))
            .await?;
        let name = default_load_balancer_name(service);
        self.change(|cloud| {
            cloud.state.load_balancers.retain(|lb| lb.name != name);
            Ok(())
        })
    }

    fn retains_load_balancers(&self) -> bool {
        true
    }

    /// Keeps the record, marked retained, with no backend: a Service of the same `namespace/name`
    /// adopts it; listed as retained; `delete_orphaned_load_balancer` releases it.
    async fn retain_load_balancer(&self, _cluster: &str, service: &Service) -> CloudResult<()> {
        self.enter_for("retain_load_balancer", &service_key(service))
            .await?;
        let name = default_load_balancer_name(service);
        self.change(|cloud| {
            if let Some(i) = Self::position(cloud, &name) {
                let record = &mut cloud.state.load_balancers[i];
                record.retained = true;
                record.nodes = Arc::default();
            }
            Ok(())
        })
    }

    /// Every load balancer the fake holds (it holds one cluster's).
    async fn list_load_balancers(&self, _cluster: &str) -> CloudResult<Vec<ClusterLoadBalancer>> {
        self.enter_for("list_load_balancers", "").await?;
        self.refresh()?;
        let cloud = self.inner.lock();
        Ok(cloud
            .state
            .load_balancers
            .iter()
            .map(|lb| {
                let listed = ClusterLoadBalancer::new(&lb.name, ServiceRef::parse(&lb.service));
                if lb.retained {
                    listed.retained()
                } else {
                    listed
                }
            })
            .collect())
    }

    async fn delete_orphaned_load_balancer(
        &self,
        _cluster: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        let object = load_balancer
            .service
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        self.enter_for("delete_orphaned_load_balancer", &object)
            .await?;
        self.change(|cloud| {
            cloud
                .state
                .load_balancers
                .retain(|lb| lb.name != load_balancer.name);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use cloud_provider::{CloudProvider, conformance};

    use super::*;

    #[test]
    fn a_free_address_is_the_services_own_then_a_never_given_one_then_any() {
        let pool: IpPool = "10.0.0.0/29".parse().unwrap();
        let ip = |last: u8| Ipv4Addr::new(10, 0, 0, last);
        let assignments = |entries: &[(&str, u8)]| -> BTreeMap<String, Ipv4Addr> {
            entries
                .iter()
                .map(|(k, last)| (k.to_string(), ip(*last)))
                .collect()
        };
        let taken = |lasts: &[u8]| -> HashSet<Ipv4Addr> { lasts.iter().map(|l| ip(*l)).collect() };
        for (given, in_use, expected) in [
            (assignments(&[]), taken(&[]), Some(ip(1))),
            (assignments(&[("a/web", 4)]), taken(&[]), Some(ip(4))),
            (assignments(&[("a/web", 4)]), taken(&[4]), Some(ip(1))),
            (assignments(&[("a/web", 9)]), taken(&[]), Some(ip(1))),
            (assignments(&[("b/db", 1)]), taken(&[2]), Some(ip(3))),
            (
                assignments(&[("b/1", 1), ("b/2", 2), ("b/3", 3), ("b/4", 4), ("b/5", 5)]),
                taken(&[1, 2, 3, 4]),
                Some(ip(6)),
            ),
            (
                assignments(&[
                    ("b/1", 1),
                    ("b/2", 2),
                    ("b/3", 3),
                    ("b/4", 4),
                    ("b/5", 5),
                    ("b/6", 6),
                ]),
                taken(&[1, 2, 3, 4, 6]),
                Some(ip(5)),
            ),
            (assignments(&[]), taken(&[1, 2, 3, 4, 5, 6]), None),
        ] {
            assert_eq!(
                free_address(&given, "a/web", &pool, &in_use),
                expected,
                "{given:?} {in_use:?}"
            );
        }
    }

    #[test]
    fn a_retained_load_balancer_is_adopted_unless_one_has_the_name() {
        let record = |name: &str, service: &str, retained: bool| LoadBalancerRecord {
            name: name.into(),
            service: service.into(),
            ingress: vec![],
            ports: vec![],
            nodes: Arc::default(),
            retained,
        };
        for (records, expected) in [
            (vec![record("old", "a/web", true)], vec![("new", false)]),
            (vec![record("old", "a/db", true)], vec![("old", true)]),
            (vec![record("old", "a/web", false)], vec![("old", false)]),
            (
                vec![record("new", "a/web", false), record("old", "a/web", true)],
                vec![("new", false), ("old", true)],
            ),
        ] {
            let mut state = CloudState {
                load_balancers: records,
                ..Default::default()
            };
            adopt_retained(&mut state, "new", "a/web");
            let got: Vec<_> = state
                .load_balancers
                .iter()
                .map(|lb| (lb.name.as_str(), lb.retained))
                .collect();
            assert_eq!(got, expected);
        }
    }

    #[tokio::test]
    async fn a_requested_address_is_given_if_the_pool_has_it_free_and_refused_otherwise() {
        let cloud = FakeCloud::from_yaml("loadBalancers: {ipPool: 203.0.113.0/29}").unwrap();
        let lb = cloud.load_balancer().unwrap();
        let nodes = [conformance::backend_node("n1")];
        let asking = |name: &str, uid: &str, ip: &str| {
            let mut service = conformance::load_balancer_service("shop", name, uid);
            service.spec.as_mut().unwrap().load_balancer_ip = Some(ip.to_owned());
            service
        };
        let web = asking("web", "11111111-1111-1111-1111-111111111111", "203.0.113.5");
        let status = lb.ensure_load_balancer("k", &web, &nodes).await.unwrap();
        assert_eq!(
            status.ingress.unwrap()[0].ip.as_deref(),
            Some("203.0.113.5")
        );
        let refusal = |err: CloudError| match err {
            CloudError::Refused { message } => message,
            other => panic!("not a refusal: {other:?}"),
        };
        for (ip, why) in [
            ("203.0.113.5", "is taken"),
            (
                "198.51.100.1",
                "is not in the fake cloud's ipPool 203.0.113.0/29",
            ),
            ("2001:db8::1", "IPv4 addresses only"),
        ] {
            let other = asking("api", "22222222-2222-2222-2222-222222222222", ip);
            let err = lb
                .ensure_load_balancer("k", &other, &nodes)
                .await
                .unwrap_err();
            let message = refusal(err);
            assert!(message.contains(why), "{ip}: {message}");
        }
        // Asking an existing load balancer for another address is refused, not silently ignored.
        let moved = asking("web", "11111111-1111-1111-1111-111111111111", "203.0.113.6");
        let message = refusal(
            lb.ensure_load_balancer("k", &moved, &nodes)
                .await
                .unwrap_err(),
        );
        assert!(message.contains("cannot move"), "{message}");
    }

    #[tokio::test]
    async fn load_balancers_are_listed_and_an_orphan_deleted_by_name() {
        let cloud = FakeCloud::from_yaml("{}").unwrap();
        let lb = cloud.load_balancer().unwrap();
        let web = conformance::load_balancer_service(
            "shop",
            "web",
            "11111111-1111-1111-1111-111111111111",
        );
        lb.ensure_load_balancer("k", &web, &[conformance::backend_node("n1")])
            .await
            .unwrap();
        let listed = lb.list_load_balancers("k").await.unwrap();
        let name = lb.get_load_balancer_name("k", &web);
        assert_eq!(
            listed,
            vec![ClusterLoadBalancer::new(
                &name,
                Some(ServiceRef::new("shop", "web"))
            )]
        );
        lb.delete_orphaned_load_balancer("k", &listed[0])
            .await
            .unwrap();
        assert!(lb.list_load_balancers("k").await.unwrap().is_empty());
        // Already gone: still a success.
        lb.delete_orphaned_load_balancer("k", &listed[0])
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn nothing_changes_once_leadership_lapsed() {
        use cloud_provider::leadership::{Leadership, LeadershipSource};
        struct Lapsed;
        impl LeadershipSource for Lapsed {
            fn lapsed(&self) -> Option<std::time::Duration> {
                Some(std::time::Duration::from_secs(1))
            }
        }
        let cloud = FakeCloud::from_yaml("{}").unwrap();
        let lb = cloud.load_balancer().unwrap();
        let web = conformance::load_balancer_service(
            "shop",
            "web",
            "11111111-1111-1111-1111-111111111111",
        );
        let nodes = [conformance::backend_node("n1")];
        let refused = Leadership::new(std::sync::Arc::new(Lapsed))
            .scope(lb.ensure_load_balancer("k", &web, &nodes))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, CloudError::LeadershipLost { .. }),
            "{refused}"
        );
        assert!(lb.list_load_balancers("k").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn ensure_records_ports_nodes_and_a_stable_ip() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let cloud = FakeCloud::from_yaml(&format!(
            "stateFile: {}\nloadBalancers: {{ipPool: 198.51.100.0/30}}\n",
            state.display()
        ))
        .unwrap();
        let lb = cloud.load_balancer().unwrap();
        let web = conformance::load_balancer_service(
            "shop",
            "web",
            "11111111-1111-1111-1111-111111111111",
        );
        let api = conformance::load_balancer_service(
            "shop",
            "api",
            "22222222-2222-2222-2222-222222222222",
        );
        let nodes = [
            conformance::backend_node("n2"),
            conformance::backend_node("n1"),
        ];
        let status = lb.ensure_load_balancer("k", &web, &nodes).await.unwrap();
        assert_eq!(
            status.ingress.unwrap()[0].ip.as_deref(),
            Some("198.51.100.1")
        );
        lb.ensure_load_balancer("k", &api, &nodes[..1])
            .await
            .unwrap();

        let on_disk = crate::CloudState::read(&state).unwrap();
        let record = on_disk.load_balancer_of("shop/web").unwrap();
        assert_eq!(*record.nodes, vec!["n1", "n2"]);
        assert_eq!(
            record.ports,
            vec![PortRecord {
                protocol: "TCP".into(),
                port: 80,
                node_port: 30080
            }]
        );
        assert_eq!(
            on_disk.load_balancer_of("shop/api").unwrap().ingress,
            vec!["198.51.100.2"]
        );

        // The pool (two addresses) is full; deleting web frees its address, and web gets it back.
        let third = conformance::load_balancer_service(
            "shop",
            "db",
            "33333333-3333-3333-3333-333333333333",
        );
        let err = lb
            .ensure_load_balancer("k", &third, &nodes)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("ipPool 198.51.100.0/30 is exhausted"),
            "{err}"
        );
        lb.ensure_load_balancer_deleted("k", &web).await.unwrap();
        assert!(
            crate::CloudState::read(&state)
                .unwrap()
                .load_balancer_of("shop/web")
                .is_none()
        );
        let again = lb.ensure_load_balancer("k", &web, &nodes).await.unwrap();
        assert_eq!(
            again.ingress.unwrap()[0].ip.as_deref(),
            Some("198.51.100.1")
        );
    }

    #[tokio::test]
    async fn update_changes_only_the_backends_and_needs_a_load_balancer() {
        let cloud = FakeCloud::from_yaml("").unwrap();
        let lb = cloud.load_balancer().unwrap();
        let web = conformance::load_balancer_service(
            "default",
            "web",
            "44444444-4444-4444-4444-444444444444",
        );
        let err = lb.update_load_balancer("k", &web, &[]).await.unwrap_err();
        assert!(err.to_string().contains("no load balancer"), "{err}");
        lb.ensure_load_balancer("k", &web, &[conformance::backend_node("a")])
            .await
            .unwrap();
        lb.update_load_balancer("k", &web, &[conformance::backend_node("b")])
            .await
            .unwrap();
        let snapshot = cloud.snapshot();
        let record = snapshot.load_balancer_of("default/web").unwrap();
        assert_eq!(*record.nodes, vec!["b"]);
        assert_eq!(record.ports.len(), 1);
        assert_eq!(snapshot.calls_to("update_load_balancer"), 2);
    }

    #[tokio::test]
    async fn the_preview_tells_create_change_and_up_to_date_apart_and_changes_nothing() {
        let cloud = FakeCloud::from_yaml("").unwrap();
        let lb = cloud.load_balancer().unwrap();
        let web = conformance::load_balancer_service(
            "default",
            "web",
            "55555555-5555-5555-5555-555555555555",
        );
        let (a, b) = (
            conformance::backend_node("a"),
            conformance::backend_node("b"),
        );
        let preview = lb
            .preview_load_balancer("k", &web, &[b.clone(), a.clone()])
            .await
            .unwrap();
        assert_eq!(
            preview,
            LoadBalancerPreview::Create {
                backends: vec!["a".into(), "b".into()]
            }
        );
        assert!(cloud.snapshot().load_balancers.is_empty());
        lb.ensure_load_balancer("k", &web, std::slice::from_ref(&a))
            .await
            .unwrap();
        assert_eq!(
            lb.preview_load_balancer("k", &web, std::slice::from_ref(&a))
                .await
                .unwrap(),
            LoadBalancerPreview::UpToDate
        );
        assert_eq!(
            lb.preview_load_balancer("k", &web, std::slice::from_ref(&b))
                .await
                .unwrap(),
            LoadBalancerPreview::Change {
                backends_added: vec!["b".into()],
                backends_removed: vec!["a".into()],
                detail: String::new(),
            }
        );
        let mut wider = web.clone();
        if let Some(ports) = wider.spec.as_mut().and_then(|s| s.ports.as_mut()) {
            ports[0].port = 8080;
        }
        let LoadBalancerPreview::Change { detail, .. } =
            lb.preview_load_balancer("k", &wider, &[a]).await.unwrap()
        else {
            panic!("a port change is a change");
        };
        assert_eq!(detail, "ports [80/TCP->30080] -> [8080/TCP->30080]");
        assert_eq!(*cloud.snapshot().load_balancers[0].nodes, vec!["a"]);
    }
}
