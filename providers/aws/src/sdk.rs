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
    metrics::{counter::Counter, family::Family},
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

impl Clients {
    /// The clients for `sdk`, with the cloud-config's `[ServiceOverride]` endpoints for the region.
    /// Retries are off in the SDK: [`Calls::call`] does them, so they can be counted.
    pub fn new(sdk: &SdkConfig, config: &Config) -> Result<Self> {
        let region = sdk.region().ok_or(Error::NoRegion)?.to_string();
        let over = |service| config.service_override(service, &region);
        let ec2 = {
            let mut b =
                aws_sdk_ec2::config::Builder::from(sdk).retry_config(RetryConfig::disabled());
            if let Some(o) = over(OverriddenService::Ec2) {
                b = b
                    .endpoint_url(o.url.clone())
                    .region(Region::new(o.signing_region.clone()));
            }
            aws_sdk_ec2::Client::from_conf(b.build())
        };
        let elb = {
            let mut b = aws_sdk_elasticloadbalancing::config::Builder::from(sdk)
                .retry_config(RetryConfig::disabled());
            if let Some(o) = over(OverriddenService::Elb) {
                b = b
                    .endpoint_url(o.url.clone())
                    .region(Region::new(o.signing_region.clone()));
            }
            aws_sdk_elasticloadbalancing::Client::from_conf(b.build())
        };
        let elbv2 = {
            let mut b = aws_sdk_elasticloadbalancingv2::config::Builder::from(sdk)
                .retry_config(RetryConfig::disabled());
            if let Some(o) = over(OverriddenService::ElbV2) {
                b = b
                    .endpoint_url(o.url.clone())
                    .region(Region::new(o.signing_region.clone()));
            }
            aws_sdk_elasticloadbalancingv2::Client::from_conf(b.build())
        };
        Ok(Self {
            ec2,
            elb,
            elbv2,
            region,
        })
    }
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
#[derive(Clone, Default)]
pub struct ApiMetrics {
    requests: Family<Vec<(String, String)>, Counter>,
    throttled: Family<Vec<(String, String)>, Counter>,
    errors: Family<Vec<(String, String)>, Counter>,
    tally: Arc<Mutex<Tally>>,
}

/// The calls made so far, per operation.
#[derive(Default)]
struct Tally {
    requests: BTreeMap<&'static str, u64>,
    throttled: BTreeMap<&'static str, u64>,
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

    fn count_request(&self, operation: &'static str) {
        self.requests.get_or_create(&op_label(operation)).inc();
        if let Ok(mut t) = self.tally.lock() {
            *t.requests.entry(operation).or_default() += 1;
        }
    }

    fn count_throttle(&self, operation: &'static str) {
        self.throttled.get_or_create(&op_label(operation)).inc();
        if let Ok(mut t) = self.tally.lock() {
            *t.throttled.entry(operation).or_default() += 1;
        }
    }

    fn count_error(&self, operation: &'static str, code: Option<&str>) {
        let mut labels = op_label(operation);
        labels.push(("code".to_owned(), code.unwrap_or("transport").to_owned()));
        self.errors.get_or_create(&labels).inc();
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
}

impl Calls {
    /// The call path over `clients`, counting into `metrics`.
    pub fn new(clients: Clients, retry: RetryPolicy, metrics: ApiMetrics) -> Self {
        Self {
            clients,
            retry,
            metrics,
            read_only: false,
        }
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
        R: std::fmt::Debug,
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
        loop {
            self.metrics.count_request(operation);
            let err = match send().await {
                Ok(output) => return Ok(output),
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
            self.metrics.count_error(operation, code.as_deref());
            return Err(Error::api(operation, &err));
        }
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
