//! The AWS SDK clients: how they are configured (region, endpoints, credentials, HTTPS on rustls + ring),
//! and the one path every call takes, which retries throttling with back-off and counts calls,
//! throttles and errors for `/metrics`.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use aws_config::{BehaviorVersion, Region, SdkConfig, retry::RetryConfig, timeout::TimeoutConfig};
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::{http::SharedHttpClient, result::SdkError};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder},
    metrics::{MetricType, TypedMetric, counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use crate::{
    Error,
    config::{Config, OverriddenService},
    error::Result,
};

/// The clients of the three AWS services the provider calls, for one region.
#[derive(Clone, Debug)]
pub struct Clients {
    /// EC2: instances, VPCs, subnets, security groups, route tables.
    pub ec2: aws_sdk_ec2::Client,
    /// Classic ELB.
    pub elb: aws_sdk_elasticloadbalancing::Client,
    /// ELBv2 (NLB).
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    /// The region the clients call.
    pub region: String,
}

/// The HTTPS client the provider gives the SDK: hyper with rustls on ring (no aws-lc-rs, no native-tls).
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// Timeouts for every call: a slow connect or a hung call fails (and is retried) instead of blocking
/// a controller.
fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(Duration::from_secs(30))
        .build()
}

/// The SDK configuration the way production loads it: the SDK's standard settings (environment,
/// including `AWS_ENDPOINT_URL*`, profiles, the default credential chain), with the cloud-config's
/// region when it names one and `RoleARN` assumed when set.
pub async fn load_sdk_config(config: &Config) -> Result<SdkConfig> {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .timeout_config(timeouts());
    if let Some(region) = config.region() {
        loader = loader.region(Region::new(region));
    }
    let base = loader.load().await;
    let Some(role_arn) = &config.global.role_arn else {
        return Ok(base);
    };
    let region = base.region().cloned().ok_or(Error::NoRegion)?;
    let mut sts_config = base.clone().into_builder();
    if let Some(o) = config.service_override(OverriddenService::Sts, region.as_ref()) {
        sts_config = sts_config
            .endpoint_url(o.url.clone())
            .region(Region::new(o.signing_region.clone()));
    }
    let mut assume = aws_config::sts::AssumeRoleProvider::builder(role_arn.clone())
        .session_name("cloud-controller-manager")
        .configure(&sts_config.build());
    if let Some(source_arn) = &config.global.source_arn {
        // Upstream passes SourceARN as the `aws:SourceArn` context; the SDK's assume-role provider
        // offers it as a session tag, which IAM conditions can match the same way.
        assume = assume.tags([("SourceArn", source_arn.as_str())]);
    }
    let provider = assume.build().await;
    Ok(base
        .into_builder()
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(provider),
        )
        .build())
}

/// The client of the SDK crate `$crate_name` for `$sdk`, with the SDK's retries off and the
/// `[ServiceOverride]` `$over` (endpoint and signing region) when there is one.
macro_rules! client {
    ($crate_name:ident, $sdk:expr, $over:expr) => {{
        let mut b = $crate_name::config::Builder::from($sdk).retry_config(RetryConfig::disabled());
        if let Some(o) = $over {
            b = b
                .endpoint_url(o.url.clone())
                .region(Region::new(o.signing_region.clone()));
        }
        $crate_name::Client::from_conf(b.build())
    }};
}

impl Clients {
    /// The clients for `sdk`, with the cloud-config's `[ServiceOverride]` endpoints for the region.
    /// Retries are off in the SDK: `Calls::call` does them, so they can be counted.
    pub fn new(sdk: &SdkConfig, config: &Config) -> Result<Self> {
        let region = sdk.region().ok_or(Error::NoRegion)?.to_string();
        let over = |service| config.service_override(service, &region);
        Ok(Self {
            ec2: client!(aws_sdk_ec2, sdk, over(OverriddenService::Ec2)),
            elb: client!(
                aws_sdk_elasticloadbalancing,
                sdk,
                over(OverriddenService::Elb)
            ),
            elbv2: client!(
                aws_sdk_elasticloadbalancingv2,
                sdk,
                over(OverriddenService::ElbV2)
            ),
            region,
        })
    }
}

/// An AWS tag (EC2's, ELBv2's) as `(key, value)`: none without a key, an empty value when it has none.
pub fn tag_pair(key: Option<&str>, value: Option<&str>) -> Option<(String, String)> {
    Some((key?.to_owned(), value.unwrap_or_default().to_owned()))
}

/// How throttled and transient failures are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in all (the first included).
    pub max_attempts: u32,
    /// The first back-off; it doubles per attempt.
    pub base_delay: Duration,
    /// The longest back-off.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
        }
    }
}

/// Error codes AWS uses for throttling (EC2's `RequestLimitExceeded`, ELB's `Throttling`, …).
pub fn is_throttling(code: &str) -> bool {
    matches!(
        code,
        "RequestLimitExceeded"
            | "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "SlowDown"
            | "EC2ThrottledException"
            | "BandwidthLimitExceeded"
    )
}

/// Error codes of failures on AWS's side that a retry may cure.
fn is_transient(code: &str) -> bool {
    matches!(
        code,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable"
    )
}

/// The provider's metrics (calls, throttles and errors per AWS operation) and a tally of the same for
/// tests and benchmarks. Cheap to clone; clones share the counters.
#[derive(Clone)]
pub struct ApiMetrics {
    requests: Family<Vec<(String, String)>, Counter>,
    throttled: Family<Vec<(String, String)>, Counter>,
    errors: Family<Vec<(String, String)>, Counter>,
    budget_waits: Family<Vec<(String, String)>, Counter>,
    upstream: UpstreamMetrics,
    tally: Arc<Mutex<Tally>>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            throttled: Family::default(),
            errors: Family::default(),
            budget_waits: Family::default(),
            upstream: UpstreamMetrics {
                duration: Family::new_with_constructor(|| Histogram::new(DEFAULT_BUCKETS)),
                errors: Family::default(),
                throttled: Family::default(),
                response_status: Family::default(),
            },
            tally: Arc::default(),
        }
    }
}

/// cloud-provider-aws's metrics, with its names and labels, so its dashboards and alerts work here:
/// `cloudprovider_aws_api_request_duration_seconds{request}` (successful calls),
/// `cloudprovider_aws_api_request_errors{request}` (failed calls, a counter without `_total`, as
/// upstream's legacy one), `cloudprovider_aws_api_throttled_requests_total{operation_name}` and
/// `cloudprovider_aws_api_response_status_total{service,operation,status_code}` (calls that failed with
/// an HTTP status of 400 or more, once per call after its retries, as upstream's middleware counts them;
/// `service` is the aws-sdk-go-v2 service ID: `EC2`, `Elastic Load Balancing`,
/// `Elastic Load Balancing v2`).
/// `request` is upstream's name for the calls it records (`describe_instance`,
/// `describe_security_groups`, `describe_route_tables`, `describe_network_interfaces`, `create_tags`,
/// `delete_tags`) and the snake-case operation for the others (`elb_`/`elbv2_` before a load-balancer
/// call whose name both services share).
#[derive(Clone)]
struct UpstreamMetrics {
    duration: Family<Vec<(String, String)>, Histogram>,
    errors: Family<Vec<(String, String)>, LegacyCounter>,
    throttled: Family<Vec<(String, String)>, Counter>,
    response_status: Family<Vec<(String, String)>, Counter>,
}

/// Prometheus's default buckets (`prometheus.DefBuckets`), which upstream's histogram uses.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A counter exposed under its name as given, without the `_total` that prometheus-client adds to
/// every counter: upstream's `cloudprovider_aws_api_request_errors` has none, and dashboards query
/// that name. prometheus-client has no such type, hence this one (typed `unknown` in the exposition).
#[derive(Debug, Default)]
struct LegacyCounter(std::sync::atomic::AtomicU64);

impl LegacyCounter {
    fn inc(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl TypedMetric for LegacyCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for LegacyCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> std::result::Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Upstream's `request` label for `operation` (see [`UpstreamMetrics`]).
fn upstream_request(operation: &str) -> String {
    let (service, name) = match operation.split_once(':') {
        Some((service, name)) => (Some(service), name),
        None => (None, operation),
    };
    // Upstream's one irregular name; its others are the snake-case operation, as below.
    if name == "DescribeInstances" {
        return "describe_instance".to_owned();
    }
    let mut out = String::new();
    if let Some(service) = service.filter(|s| *s != "ec2") {
        out.push_str(service);
        out.push('_');
    }
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Upstream's `operation_name` label: the SDK's operation name.
fn upstream_operation(operation: &str) -> &str {
    operation
        .split_once(':')
        .map_or(operation, |(_, name)| name)
}

/// The calls made so far, per operation.
#[derive(Default)]
struct Tally {
    requests: BTreeMap<&'static str, u64>,
    throttled: BTreeMap<&'static str, u64>,
    budget_waits: BTreeMap<&'static str, u64>,
}

fn op_label(operation: &str) -> Vec<(String, String)> {
    vec![("operation".to_owned(), operation.to_owned())]
}

impl ApiMetrics {
    /// Adds `aws_api_requests_total`, `aws_api_throttled_total` and `aws_api_errors_total` (by
    /// `operation`, and `code` for errors) to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "aws_api_requests",
            "AWS API requests sent, by operation (each retry counts)",
            self.requests.clone(),
        );
        registry.register(
            "aws_api_throttled",
            "AWS API requests refused by throttling (RequestLimitExceeded, Throttling), by operation; each was retried with back-off",
            self.throttled.clone(),
        );
        registry.register(
            "aws_api_errors",
            "AWS API calls that failed after their retries, by operation and error code",
            self.errors.clone(),
        );
        registry.register(
            "aws_drift_check_budget_waits",
            "Calls of the drift check or of shadow-mode previews that waited for the budget ([Global] DriftCheckCallsPerSecond), by AWS service",
            self.budget_waits.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_request_duration_seconds",
            "Latency of AWS API calls",
            self.upstream.duration.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_request_errors",
            "AWS API errors",
            self.upstream.errors.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_throttled_requests",
            "AWS API throttled requests",
            self.upstream.throttled.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_response_status",
            "AWS API error response status code counts (terminal, after retries are exhausted)",
            self.upstream.response_status.clone(),
        );
    }

    /// Requests sent so far, per operation.
    pub fn requests(&self) -> BTreeMap<&'static str, u64> {
        self.tally
            .lock()
            .map(|t| t.requests.clone())
            .unwrap_or_default()
    }

    /// Throttled requests so far, per operation.
    pub fn throttled(&self) -> BTreeMap<&'static str, u64> {
        self.tally
            .lock()
            .map(|t| t.throttled.clone())
            .unwrap_or_default()
    }

    /// Preview calls that waited for the budget so far, per AWS service.
    pub fn budget_waits(&self) -> BTreeMap<&'static str, u64> {
        self.tally
            .lock()
            .map(|t| t.budget_waits.clone())
            .unwrap_or_default()
    }

    fn count_budget_wait(&self, service: &'static str) {
        self.budget_waits
            .get_or_create(&vec![("service".to_owned(), service.to_owned())])
            .inc();
        if let Ok(mut t) = self.tally.lock() {
            *t.budget_waits.entry(service).or_default() += 1;
        }
    }

    fn count_request(&self, operation: &'static str) {
        self.requests.get_or_create(&op_label(operation)).inc();
        if let Ok(mut t) = self.tally.lock() {
            *t.requests.entry(operation).or_default() += 1;
        }
    }

    fn count_throttle(&self, operation: &'static str) {
        self.throttled.get_or_create(&op_label(operation)).inc();
        self.upstream
            .throttled
            .get_or_create(&vec![(
                "operation_name".to_owned(),
                upstream_operation(operation).to_owned(),
            )])
            .inc();
        if let Ok(mut t) = self.tally.lock() {
            *t.throttled.entry(operation).or_default() += 1;
        }
    }

    fn count_succeeded(&self, operation: &'static str, took: Duration) {
        self.upstream
            .duration
            .get_or_create(&vec![("request".to_owned(), upstream_request(operation))])
            .observe(took.as_secs_f64());
    }

    /// A call that failed after its retries: `service` is the aws-sdk-go-v2 service ID
    /// ([`service_id`]), `status` the HTTP status when AWS answered.
    fn count_error(
        &self,
        service: &'static str,
        operation: &'static str,
        code: Option<&str>,
        status: Option<u16>,
    ) {
        self.upstream
            .errors
            .get_or_create(&vec![("request".to_owned(), upstream_request(operation))])
            .inc();
        if let Some(status) = status.filter(|s| *s >= 400) {
            let name = operation.rsplit(':').next().unwrap_or(operation);
            self.upstream
                .response_status
                .get_or_create(&vec![
                    ("service".to_owned(), service.to_owned()),
                    ("operation".to_owned(), name.to_owned()),
                    ("status_code".to_owned(), status.to_string()),
                ])
                .inc();
        }
        let mut labels = op_label(operation);
        labels.push(("code".to_owned(), code.unwrap_or("transport").to_owned()));
        self.errors.get_or_create(&labels).inc();
    }
}

/// What the drift check's and shadow mode's previews may ask of each AWS API (EC2, ELB, ELBv2) a
/// second (`DriftCheckCallsPerSecond`): one token bucket per API, as AWS throttles each API's calls
/// of an account and region with a bucket of its own. A preview's call waits for a token; syncs never
/// wait. `governor` holds the buckets.
pub struct PreviewBudget {
    per_api: [(&'static str, governor::DefaultDirectRateLimiter); 3],
}

impl PreviewBudget {
    /// `calls_per_second` to each API, in bursts of at most as many; `None` (no limit) for 0.
    pub fn new(calls_per_second: u32) -> Option<Arc<Self>> {
        let rate = std::num::NonZeroU32::new(calls_per_second)?;
        let bucket = || governor::RateLimiter::direct(governor::Quota::per_second(rate));
        Some(Arc::new(Self {
            per_api: [
                ("EC2", bucket()),
                ("Elastic Load Balancing", bucket()),
                ("Elastic Load Balancing v2", bucket()),
            ],
        }))
    }

    /// Waits for a token of `service`'s bucket (an aws-sdk-go-v2 service ID, [`service_id`]); answers
    /// whether it had to wait.
    async fn take(&self, service: &str) -> bool {
        let Some((_, bucket)) = self.per_api.iter().find(|(id, _)| *id == service) else {
            return false;
        };
        if bucket.check().is_ok() {
            return false;
        }
        bucket.until_ready().await;
        true
    }
}

/// The clients plus the call path: retries with back-off and counts.
#[derive(Clone)]
pub struct Calls {
    /// The SDK clients.
    pub clients: Clients,
    retry: RetryPolicy,
    metrics: ApiMetrics,
    read_only: bool,
    /// The previews' budget, taken by a read-only call path's calls.
    preview_budget: Option<Arc<PreviewBudget>>,
}

impl Calls {
    /// The call path over `clients`, counting into `metrics`.
    pub fn new(clients: Clients, retry: RetryPolicy, metrics: ApiMetrics) -> Self {
        Self {
            clients,
            retry,
            metrics,
            read_only: false,
            preview_budget: None,
        }
    }

    /// In a read-only call path with a budget, waits for a token of `service`'s bucket (an aws-sdk-go-v2
    /// service ID: `EC2`, `Elastic Load Balancing`, `Elastic Load Balancing v2`); otherwise returns at
    /// once.
    async fn wait_for_preview_budget(&self, service: &'static str) {
        if self.read_only
            && let Some(budget) = &self.preview_budget
            && budget.take(service).await
        {
            self.metrics.count_budget_wait(service);
        }
    }

    /// The same call path whose read-only form ([`Calls::read_only`]) keeps to `budget`.
    pub fn with_preview_budget(mut self, budget: Option<Arc<PreviewBudget>>) -> Self {
        self.preview_budget = budget;
        self
    }

    /// The same call path refusing every operation but `Describe*` (for previews).
    pub fn read_only(&self) -> Self {
        Self {
            read_only: true,
            ..self.clone()
        }
    }

    /// Runs one AWS operation: throttling, transient AWS errors and transport failures are retried with
    /// exponential back-off (with jitter) up to the policy's attempts; each request and each throttle
    /// is counted.
    pub async fn call<T, E, R, F, Fut>(&self, operation: &'static str, mut send: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, SdkError<E, R>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug + HttpStatus,
    {
        if self.read_only && !operation.contains("Describe") {
            return Err(Error::Setup(format!(
                "AWS {operation} refused: a preview makes only Describe calls"
            )));
        }
        // Each write is a step the manager's leadership must still cover (a leader that froze and
        // resumed after a takeover makes no further change).
        if !operation.contains("Describe")
            && let Err(cloud_provider::CloudError::LeadershipLost { lapsed }) =
                cloud_provider::leadership::check()
        {
            return Err(Error::LeadershipLost(lapsed));
        }
        let mut delay = self.retry.base_delay;
        let mut attempt = 1;
        let started = std::time::Instant::now();
        loop {
            self.wait_for_preview_budget(service_id::<E>()).await;
            self.metrics.count_request(operation);
            let err = match send().await {
                Ok(output) => {
                    self.metrics.count_succeeded(operation, started.elapsed());
                    return Ok(output);
                }
                Err(err) => err,
            };
            let code = err.code().map(str::to_owned);
            let throttled = code.as_deref().is_some_and(is_throttling);
            if throttled {
                self.metrics.count_throttle(operation);
            }
            let retryable = throttled
                || code.as_deref().is_some_and(is_transient)
                || matches!(
                    err,
                    SdkError::DispatchFailure(_) | SdkError::TimeoutError(_)
                );
            if retryable && attempt < self.retry.max_attempts {
                tracing::debug!(
                    operation,
                    code = code.as_deref().unwrap_or(""),
                    attempt,
                    ?delay,
                    "retrying AWS call"
                );
                tokio::time::sleep(jitter(delay)).await;
                delay = (delay * 2).min(self.retry.max_delay);
                attempt += 1;
                continue;
            }
            let status = err.raw_response().map(HttpStatus::status_code);
            self.metrics
                .count_error(service_id::<E>(), operation, code.as_deref(), status);
            return Err(Error::api(operation, &err));
        }
    }
}

/// The aws-sdk-go-v2 service ID (upstream's `service` label) of an operation, from the crate its error
/// type comes from (an operation's name alone does not tell: `CreateLoadBalancerListeners` is Classic
/// ELB's, `CreateTargetGroup` ELBv2's, and both are called without a prefix).
fn service_id<E>() -> &'static str {
    let name = std::any::type_name::<E>();
    if name.contains("aws_sdk_elasticloadbalancingv2::") {
        "Elastic Load Balancing v2"
    } else if name.contains("aws_sdk_elasticloadbalancing::") {
        "Elastic Load Balancing"
    } else if name.contains("aws_sdk_sts::") {
        "STS"
    } else {
        "EC2"
    }
}

/// The HTTP status of a raw response the SDK hands back with an error (its `HttpResponse`), for
/// `cloudprovider_aws_api_response_status_total`; a trait so tests can call with their own type.
pub trait HttpStatus {
    /// The response's HTTP status code.
    fn status_code(&self) -> u16;
}

impl HttpStatus for aws_smithy_runtime_api::http::Response {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

/// `delay` scaled by a factor in [0.5, 1.0), so replicas throttled together do not retry together.
fn jitter(delay: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A random per-call value without a RNG dependency: std's randomly keyed hasher.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(delay.as_nanos() as u64);
    let fraction = (hasher.finish() % 1000) as f64 / 2000.0;
    delay.mul_f64(0.5 + fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_s_metric_names_and_labels_are_served() {
        let metrics = ApiMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.count_succeeded("DescribeInstances", Duration::from_millis(20));
        metrics.count_succeeded("elbv2:DescribeLoadBalancers", Duration::from_millis(20));
        metrics.count_error(
            "EC2",
            "DescribeSecurityGroups",
            Some("UnauthorizedOperation"),
            Some(403),
        );
        metrics.count_error(
            "Elastic Load Balancing",
            "CreateLoadBalancerListeners",
            Some("DuplicateListener"),
            Some(400),
        );
        metrics.count_error(
            "Elastic Load Balancing v2",
            "elbv2:DescribeListeners",
            None,
            None,
        );
        assert_eq!(
            service_id::<aws_sdk_elasticloadbalancing::operation::create_load_balancer_listeners::CreateLoadBalancerListenersError>(),
            "Elastic Load Balancing"
        );
        assert_eq!(
            service_id::<aws_sdk_elasticloadbalancingv2::operation::create_target_group::CreateTargetGroupError>(),
            "Elastic Load Balancing v2"
        );
        assert_eq!(
            service_id::<aws_sdk_ec2::operation::describe_instances::DescribeInstancesError>(),
            "EC2"
        );
        metrics.count_throttle("elb:DescribeLoadBalancers");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"cloudprovider_aws_api_request_duration_seconds_count{request="describe_instance"} 1"#,
            r#"cloudprovider_aws_api_request_duration_seconds_count{request="elbv2_describe_load_balancers"} 1"#,
            "# TYPE cloudprovider_aws_api_request_errors unknown",
            r#"cloudprovider_aws_api_request_errors{request="describe_security_groups"} 1"#,
            r#"cloudprovider_aws_api_request_errors{request="create_load_balancer_listeners"} 1"#,
            r#"cloudprovider_aws_api_throttled_requests_total{operation_name="DescribeLoadBalancers"} 1"#,
            r#"cloudprovider_aws_api_response_status_total{service="EC2",operation="DescribeSecurityGroups",status_code="403"} 1"#,
            r#"cloudprovider_aws_api_response_status_total{service="Elastic Load Balancing",operation="CreateLoadBalancerListeners",status_code="400"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }

    #[test]
    fn throttling_codes_are_recognised() {
        assert!(is_throttling("RequestLimitExceeded"));
        assert!(is_throttling("Throttling"));
        assert!(!is_throttling("InvalidInstanceID.NotFound"));
    }

    #[test]
    fn jitter_stays_within_half_and_full_delay() {
        for _ in 0..100 {
            let d = jitter(Duration::from_millis(1000));
            assert!(
                d >= Duration::from_millis(500) && d < Duration::from_millis(1000),
                "{d:?}"
            );
        }
    }
}
