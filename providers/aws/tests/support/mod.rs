//! moto for the `aws` provider's tests: one `moto_server` per test binary on 127.0.0.1 (a free port),
//! installed from PyPI into a cached virtualenv; state reset between tests; SDK configurations with
//! static credentials, an explicit region and moto's endpoint; fixtures made with the Rust SDK.

#![allow(dead_code)] // each test binary uses a different part

pub mod throttle;

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::{Credentials, provider::SharedCredentialsProvider};
use aws_sdk_ec2::types::{
    Filter, InstanceStateName, InstanceType, ResourceType, Tag, TagSpecification,
};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use cloud_provider_aws::{AwsCloud, Config, InstanceInfo, Options, RetryPolicy};

/// The moto version the tests are written against (docs/aws-provider.md, "Testing").
pub const MOTO_VERSION: &str = "5.2.5";
/// The region every test uses.
pub const REGION: &str = "us-west-2";
/// The zone fixtures are placed in.
pub const ZONE: &str = "us-west-2a";
/// The zone ID moto 5.2 gives [`ZONE`] (`DescribeAvailabilityZones`), for the `topology.k8s.aws/zone-id` label.
pub const MOTO_ZONE_ID: &str = "usw2-az2";
/// The cluster ID of the fixtures.
pub const CLUSTER_ID: &str = "ccm-test";
/// An AMI moto knows without `DescribeImages`.
pub const AMI: &str = "ami-12c6146b";

/// Tests in one binary share one moto, so they run one at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The running moto_server of this test binary.
pub struct Moto {
    /// Its port on 127.0.0.1.
    pub port: u16,
    _child: Child,
}

impl Moto {
    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Forgets every resource (`POST /moto-api/reset`).
    pub fn reset(&self) {
        let (status, body) = http(self.port, "POST", "/moto-api/reset");
        assert_eq!(status, 200, "moto reset answered {status}: {body}");
    }
}

fn cache_dir() -> PathBuf {
    match std::env::var_os("CCM_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/ccm-rs"),
    }
}

/// The virtualenv with moto, created (`python3 -m venv`, `pip install moto[...]`) when missing.
fn moto_venv() -> PathBuf {
    let venv = cache_dir().join("moto-venv");
    let server = venv.join("bin/moto_server");
    let marker = venv.join(format!(".moto-{MOTO_VERSION}"));
    if server.exists() && marker.exists() {
        return venv;
    }
    std::fs::create_dir_all(cache_dir()).expect("cache dir created");
    // Test binaries run at once (hack/test's lanes): one installs moto, the others wait for it here (the
    // lock is released when `_lock` is dropped, or the process ends).
    let _lock = std::fs::File::create(cache_dir().join("moto-venv.lock"))
        .and_then(|file| file.lock().map(|()| file))
        .expect("moto-venv.lock taken");
    if server.exists() && marker.exists() {
        return venv;
    }
    let run = |cmd: &mut Command| {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    if !venv.join("bin/pip").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    }
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        &format!("moto[ec2,elbv2,elb,server]=={MOTO_VERSION}"),
    ]));
    std::fs::write(&marker, MOTO_VERSION).expect("marker written");
    venv
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// A minimal HTTP/1.1 request to 127.0.0.1:`port`; returns the status and body.
pub fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to moto");
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("request written");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// This test binary's moto, started on first use. It stops when the test binary exits: it runs under a
/// shell that kills it when its stdin (a pipe from this process) closes.
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| {
        let venv = moto_venv();
        let port = free_port();
        // moto with the gaps bench/aws closes (a default health check on new Classic ELBs, NLB listeners
        // changed to TLS or UDP): see bench/aws/moto_server.py.
        let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/aws/moto_server.py");
        let script = format!(
            "{} {} -H 127.0.0.1 -p {port} >/dev/null 2>&1 & pid=$!; read _; kill $pid",
            venv.join("bin/python").display(),
            wrapper.display()
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("moto_server started");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen on {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Moto {
            port,
            _child: child,
        }
    })
}

/// An SDK configuration for moto: static credentials, the test region, moto's endpoint.
pub fn sdk_config() -> SdkConfig {
    sdk_config_at(&moto().endpoint())
}

/// An SDK configuration for the moto at `endpoint` (a child process reaching its parent's moto).
pub fn sdk_config_at(endpoint: &str) -> SdkConfig {
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "testing", "testing", None, None, "tests",
        )))
        .endpoint_url(endpoint)
        .http_client(cloud_provider_aws::https_client())
        .build()
}

/// The provider under test on this binary's moto, with quick retries.
pub fn cloud(config_text: &str) -> AwsCloud {
    cloud_at(&moto().endpoint(), config_text)
}

/// The provider under test on the moto at `endpoint`, with quick retries.
pub fn cloud_at(endpoint: &str, config_text: &str) -> AwsCloud {
    let config = Config::parse(config_text, "test.conf").expect("valid cloud-config");
    AwsCloud::new(
        config,
        Options {
            sdk_config: Some(sdk_config_at(endpoint)),
            retry: RetryPolicy {
                max_attempts: 6,
                base_delay: Duration::from_millis(20),
                max_delay: Duration::from_millis(200),
            },
            ..Options::default()
        },
    )
}

/// The default cloud-config of the tests. The previews are not rationed
/// (`DriftCheckCallsPerSecond = 0`): at the default budget the preview tests would spend a minute
/// waiting for tokens, and the budget has a test of its own (which sets it again: a later line wins).
pub fn default_config() -> String {
    format!(
        "[Global]\nZone = {ZONE}\nKubernetesClusterID = {CLUSTER_ID}\nDriftCheckCallsPerSecond = 0\n"
    )
}

/// [`default_config`] with one AWS service (`ec2`, `elasticloadbalancingv2`, ...) reached through a
/// proxy on `port` (a `[ServiceOverride]`); the others go to moto.
pub fn config_through(service: &str, port: u16) -> String {
    format!(
        "{}[ServiceOverride \"1\"]\nService = {service}\nRegion = {REGION}\nURL = http://127.0.0.1:{port}\nSigningRegion = {REGION}\n",
        default_config()
    )
}

/// An EC2 client on moto, for fixtures and checks.
pub fn ec2() -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(&sdk_config())
}

/// A VPC with one subnet in [`ZONE`], both tagged for the cluster.
pub struct Network {
    /// The VPC.
    pub vpc_id: String,
    /// The subnet.
    pub subnet_id: String,
    /// The nodes' security group, tagged for the cluster.
    pub node_sg: String,
}

fn cluster_tag() -> Tag {
    Tag::builder()
        .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
        .value("owned")
        .build()
}

fn tagged(resource: ResourceType, extra: &[(&str, &str)]) -> TagSpecification {
    let mut spec = TagSpecification::builder()
        .resource_type(resource)
        .tags(cluster_tag());
    for (k, v) in extra {
        spec = spec.tags(Tag::builder().key(*k).value(*v).build());
    }
    spec.build()
}

/// Creates the cluster's network.
pub async fn network() -> Network {
    let ec2 = ec2();
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .tag_specifications(tagged(ResourceType::Vpc, &[]))
        .send()
        .await
        .expect("VPC created");
    let vpc_id = vpc
        .vpc()
        .and_then(|v| v.vpc_id())
        .expect("VPC ID")
        .to_owned();
    let subnet = ec2
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.0.1.0/24")
        .availability_zone(ZONE)
        .tag_specifications(tagged(
            ResourceType::Subnet,
            &[("kubernetes.io/role/elb", "1")],
        ))
        .send()
        .await
        .expect("subnet created");
    let subnet_id = subnet
        .subnet()
        .and_then(|s| s.subnet_id())
        .expect("subnet ID")
        .to_owned();
    let sg = ec2
        .create_security_group()
        .group_name("nodes")
        .description("the cluster's nodes")
        .vpc_id(&vpc_id)
        .tag_specifications(tagged(ResourceType::SecurityGroup, &[]))
        .send()
        .await
        .expect("node security group created");
    let node_sg = sg.group_id().expect("group ID").to_owned();
    Network {
        vpc_id,
        subnet_id,
        node_sg,
    }
}

/// Starts `count` `t3.medium` instances with the cluster tag in the network's subnet.
pub async fn run_instances(net: &Network, count: i32) -> Vec<InstanceInfo> {
    run_instances_of(net, count, InstanceType::T3Medium).await
}

/// Starts `count` instances of `instance_type` in the cluster's subnet and security group.
pub async fn run_instances_of(
    net: &Network,
    count: i32,
    instance_type: InstanceType,
) -> Vec<InstanceInfo> {
    let out = ec2()
        .run_instances()
        .image_id(AMI)
        .instance_type(instance_type)
        .min_count(count)
        .max_count(count)
        .subnet_id(&net.subnet_id)
        .security_group_ids(&net.node_sg)
        .tag_specifications(tagged(ResourceType::Instance, &[]))
        .send()
        .await
        .expect("instances started");
    let ids: Vec<String> = out
        .instances()
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_owned))
        .collect();
    describe(&ids).await
}

/// A route table in the cluster's VPC, tagged for the cluster (so the provider finds it without
/// `RouteTableID`); its ID.
pub async fn cluster_route_table(net: &Network) -> String {
    ec2()
        .create_route_table()
        .vpc_id(&net.vpc_id)
        .tag_specifications(tagged(ResourceType::RouteTable, &[]))
        .send()
        .await
        .expect("route table created")
        .route_table()
        .and_then(|t| t.route_table_id())
        .expect("route table ID")
        .to_owned()
}

/// The (destination CIDR, instance ID) of every route to an instance in this table.
pub async fn instance_routes(table_id: &str) -> Vec<(String, String)> {
    let described = ec2()
        .describe_route_tables()
        .route_table_ids(table_id)
        .send()
        .await
        .expect("route table described");
    let mut routes: Vec<(String, String)> = described
        .route_tables()
        .iter()
        .flat_map(|t| t.routes())
        .filter_map(|r| {
            Some((
                r.destination_cidr_block()?.to_owned(),
                r.instance_id()?.to_owned(),
            ))
        })
        .collect();
    routes.sort();
    routes
}

/// The instances with these IDs, as EC2 describes them now, in the order given.
pub async fn describe(ids: &[String]) -> Vec<InstanceInfo> {
    let out = ec2()
        .describe_instances()
        .filters(
            Filter::builder()
                .name("instance-id")
                .set_values(Some(ids.to_vec()))
                .build(),
        )
        .send()
        .await
        .expect("instances described");
    let found: Vec<InstanceInfo> = out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(InstanceInfo::from_ec2)
        .collect();
    ids.iter()
        .map(|id| {
            found
                .iter()
                .find(|i| &i.id == id)
                .cloned()
                .expect("instance described")
        })
        .collect()
}

/// Stops an instance and waits until EC2 says it is stopped.
pub async fn stop(id: &str) {
    ec2()
        .stop_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("instance stopped");
    wait_state(id, InstanceStateName::Stopped).await;
}

/// Terminates an instance and waits until EC2 says it is terminated.
pub async fn terminate(id: &str) {
    ec2()
        .terminate_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("instance terminated");
    wait_state(id, InstanceStateName::Terminated).await;
}

async fn wait_state(id: &str, state: InstanceStateName) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = describe(&[id.to_owned()]).await;
        if now[0].state == state.as_str() {
            return;
        }
        assert!(Instant::now() < deadline, "{id} did not reach {state:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An ELBv2 client on moto.
pub fn elbv2() -> aws_sdk_elasticloadbalancingv2::Client {
    aws_sdk_elasticloadbalancingv2::Client::new(&sdk_config())
}

/// A Classic ELB client on moto.
pub fn elb() -> aws_sdk_elasticloadbalancing::Client {
    aws_sdk_elasticloadbalancing::Client::new(&sdk_config())
}

/// A `type: LoadBalancer` Service with ports 80 → 30080 and 443 → 30443.
pub fn lb_service(
    name: &str,
    uid: &str,
    annotations: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Service {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    let mut s = Service::default();
    s.metadata.name = Some(name.to_owned());
    s.metadata.namespace = Some("default".to_owned());
    s.metadata.uid = Some(uid.to_owned());
    s.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    s.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".to_owned()),
        ports: Some(vec![
            ServicePort {
                port: 80,
                node_port: Some(30080),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ServicePort {
                port: 443,
                node_port: Some(30443),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    });
    s
}

/// A backend Node for an instance, shared as the manager shares its cached nodes: named by its
/// private DNS name, with its provider ID.
pub fn instance_node(instance: &InstanceInfo) -> std::sync::Arc<k8s_openapi::api::core::v1::Node> {
    let mut n = k8s_openapi::api::core::v1::Node::default();
    n.metadata.name = Some(instance.private_dns.clone());
    n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some(instance.provider_id()),
        ..Default::default()
    });
    std::sync::Arc::new(n)
}

/// Every load balancer, target group and security group that carries the cluster's tag, and every
/// security-group rule a load balancer added (rules from another group, or described
/// `kubernetes.io/rule/...`), as readable strings.
pub async fn cluster_resources() -> Vec<String> {
    let tag = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    let mut out = Vec::new();
    let v2 = elbv2();
    let lbs = v2
        .describe_load_balancers()
        .send()
        .await
        .expect("NLBs listed");
    let tgs = v2
        .describe_target_groups()
        .send()
        .await
        .expect("target groups listed");
    let arns: Vec<String> = lbs
        .load_balancers()
        .iter()
        .filter_map(|l| l.load_balancer_arn().map(str::to_owned))
        .chain(
            tgs.target_groups()
                .iter()
                .filter_map(|g| g.target_group_arn().map(str::to_owned)),
        )
        .collect();
    for chunk in arns.chunks(20) {
        let tags = match v2
            .describe_tags()
            .set_resource_arns(Some(chunk.to_vec()))
            .send()
            .await
        {
            Ok(tags) => tags,
            Err(e) if deleted_since_listed(e.code()) => {
                out.push(format!("elbv2 deleted while listed: {chunk:?}"));
                continue;
            }
            Err(e) => panic!("NLB tags: {e:?}"),
        };
        for d in tags.tag_descriptions() {
            if d.tags().iter().any(|t| t.key() == Some(tag.as_str())) {
                out.push(format!("elbv2 {}", d.resource_arn().unwrap_or_default()));
            }
        }
    }
    let classic = elb()
        .describe_load_balancers()
        .send()
        .await
        .expect("ELBs listed");
    let names: Vec<String> = classic
        .load_balancer_descriptions()
        .iter()
        .filter_map(|l| l.load_balancer_name().map(str::to_owned))
        .collect();
    for chunk in names.chunks(20) {
        let tags = match elb()
            .describe_tags()
            .set_load_balancer_names(Some(chunk.to_vec()))
            .send()
            .await
        {
            Ok(tags) => tags,
            Err(e) if deleted_since_listed(e.code()) => {
                out.push(format!("elb deleted while listed: {chunk:?}"));
                continue;
            }
            Err(e) => panic!("ELB tags: {e:?}"),
        };
        for d in tags.tag_descriptions() {
            if d.tags().iter().any(|t| t.key() == tag) {
                out.push(format!(
                    "elb {}",
                    d.load_balancer_name().unwrap_or_default()
                ));
            }
        }
    }
    let groups = ec2()
        .describe_security_groups()
        .send()
        .await
        .expect("groups listed");
    for g in groups.security_groups() {
        let id = g.group_id().unwrap_or_default();
        if g.tags().iter().any(|t| t.key() == Some(tag.as_str())) && g.group_name() != Some("nodes")
        {
            out.push(format!(
                "security group {id} {}",
                g.group_name().unwrap_or_default()
            ));
        }
        for p in g.ip_permissions() {
            // A VPC's default group refers to itself; only rules from another group count.
            if p.user_id_group_pairs()
                .iter()
                .any(|u| u.group_id() != Some(id))
            {
                out.push(format!("rule in {id} from {:?}", p.user_id_group_pairs()));
            }
            for r in p.ip_ranges() {
                if r.description()
                    .is_some_and(|d| d.starts_with("kubernetes.io/rule/"))
                {
                    out.push(format!("rule in {id}: {:?}", r.description()));
                }
            }
        }
    }
    out
}

/// Whether a tag lookup failed because a load balancer or target group listed a moment before was
/// deleted in between (the manager deletes while tests poll). The caller reports it as a resource
/// still there, so an `eventually` looks again instead of failing.
fn deleted_since_listed(code: Option<&str>) -> bool {
    matches!(code, Some("LoadBalancerNotFound" | "TargetGroupNotFound"))
}

/// The AWS writes (anything but Describe*) the cloud made since `before`.
pub fn writes_since(
    cloud: &AwsCloud,
    before: &std::collections::BTreeMap<&'static str, u64>,
) -> Vec<String> {
    cloud
        .api_metrics()
        .requests()
        .into_iter()
        .filter(|(op, n)| !op.contains("Describe") && before.get(op).copied().unwrap_or(0) != *n)
        .map(|(op, _)| op.to_owned())
        .collect()
}
