//! Client-side rate limiting of API requests (`--kube-api-qps`, `--kube-api-burst`).
//!
//! kube-rs has no client-side limiter (client-go's token bucket lives in its REST client). `governor`
//! provides the token bucket; this file is only the tower glue that waits for a token in `poll_ready`,
//! so requests queue in kube's buffer instead of reaching the server.

use std::{
    future::Future,
    num::NonZeroU32,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower::{Layer, Service};

/// A token bucket shared by every request of one client.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// `qps` requests per second on average, `burst` at once. `None` when `qps` is 0 or less (no limit),
    /// or so large (over 10^9) that a token would come more often than every nanosecond. A rate so small
    /// that the bucket would take longer to refill than a `u64` of nanoseconds is clamped to that
    /// (the flags refuse such values before they get here).
    pub fn new(qps: f32, burst: u32) -> Option<Self> {
        if qps.is_nan() || qps <= 0.0 {
            return None;
        }
        let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
        let longest = Duration::from_nanos(u64::MAX / 2 / u64::from(burst.get()));
        let period = Duration::try_from_secs_f64(1.0 / f64::from(qps))
            .unwrap_or(longest)
            .min(longest);
        let quota = Quota::with_period(period)?.allow_burst(burst);
        Some(Self {
            limiter: Arc::new(RateLimiter::direct(quota)),
        })
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            waiting: None,
            permitted: false,
        }
    }
}

/// The rate-limited service.
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    permitted: bool,
}

impl<S, Req> Service<Req> for RateLimit<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.permitted {
            let limiter = &self.limiter;
            let waiting = self.waiting.get_or_insert_with(|| {
                let limiter = limiter.clone();
                Box::pin(async move { limiter.until_ready().await })
            });
            if waiting.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.waiting = None;
            self.permitted = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.permitted = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, time::Instant};

    use tower::{ServiceBuilder, ServiceExt, service_fn};

    use super::*;

    #[test]
    fn tiny_and_huge_rates_neither_panic() {
        for (qps, burst) in [
            (1e-30_f32, 400),
            (f32::MIN_POSITIVE, u32::MAX),
            (1e-9, 1),
            (f32::INFINITY, 400),
        ] {
            let _ = RateLimitLayer::new(qps, burst);
        }
        assert!(
            RateLimitLayer::new(1e-30, 400).is_some(),
            "clamped, still a limit"
        );
        assert!(
            RateLimitLayer::new(f32::INFINITY, 400).is_none(),
            "no limit"
        );
    }

    #[test]
    fn zero_or_negative_qps_means_no_limit() {
        assert!(RateLimitLayer::new(0.0, 10).is_none());
        assert!(RateLimitLayer::new(-1.0, 10).is_none());
        assert!(RateLimitLayer::new(f32::NAN, 10).is_none());
        assert!(RateLimitLayer::new(5.0, 0).is_some());
    }

    #[tokio::test]
    async fn requests_beyond_the_burst_wait_for_tokens() {
        let layer = RateLimitLayer::new(20.0, 5).unwrap();
        let mut service = ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
        let started = Instant::now();
        for n in 0..5 {
            assert_eq!(service.ready().await.unwrap().call(n).await.unwrap(), n);
        }
        assert!(
            started.elapsed() < Duration::from_millis(40),
            "the burst went through at once"
        );
        for n in 0..4 {
            service.ready().await.unwrap().call(n).await.unwrap();
        }
        // Four more tokens at 20 per second take about 200 ms.
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "{:?}",
            started.elapsed()
        );
    }
}
