//! Counts and times every API request the manager makes (upstream's client-go REST metrics), and keeps
//! a running count of writes so "a reconcile with nothing to do makes no write" can be checked.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Instant,
};

use http::{Method, Request, Response};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};
use tower::{Layer, Service};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: String,
    host: String,
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    host: String,
    verb: String,
}

/// The request metrics.
#[derive(Clone)]
pub struct RequestMetrics {
    total: Family<RequestLabels, Counter>,
    duration: Family<DurationLabels, Histogram>,
    writes: Arc<AtomicU64>,
}

impl RequestMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let total = Family::<RequestLabels, Counter>::default();
        let duration = Family::<DurationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ])
        });
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            total.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            duration.clone(),
        );
        Self {
            total,
            duration,
            writes: Arc::default(),
        }
    }

    /// How many writes (POST, PUT, PATCH, DELETE) the manager has sent since it started.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// The layer that records into these metrics; `host` is the API server's (requests carry only a
    /// path at this point of kube's stack).
    pub fn layer(&self, host: &str) -> RequestMetricsLayer {
        RequestMetricsLayer {
            metrics: self.clone(),
            host: host.to_owned(),
        }
    }
}

/// Records every request passing through.
#[derive(Clone)]
pub struct RequestMetricsLayer {
    metrics: RequestMetrics,
    host: String,
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RecordRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RecordRequests {
            inner,
            metrics: self.metrics.clone(),
            host: self.host.clone(),
        }
    }
}

/// The recording service.
pub struct RecordRequests<S> {
    inner: S,
    metrics: RequestMetrics,
    host: String,
}

impl<S, B, RB> Service<Request<B>> for RecordRequests<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().clone();
        let host = self.host.clone();
        if matches!(
            method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        ) {
            self.metrics.writes.fetch_add(1, Ordering::Relaxed);
        }
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            metrics
                .duration
                .get_or_create(&DurationLabels {
                    host: host.clone(),
                    verb: method.to_string(),
                })
                .observe(started.elapsed().as_secs_f64());
            metrics
                .total
                .get_or_create(&RequestLabels {
                    code,
                    host,
                    method: method.to_string(),
                })
                .inc();
            result
        })
    }
}
