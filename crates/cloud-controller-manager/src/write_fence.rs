//! The leader's write fence: once this replica's leadership may have ended, its API clients refuse to
//! send writes.
//!
//! What it guarantees, exactly: **no write is started after the renew deadline**. A write started
//! before it can still arrive after a standby took over: its bytes may sit in a frozen process's socket
//! or in a network that delivers them late (issue #32 saw 1 to 11 such writes in 4 of 7 runs). So the
//! writes that can race a takeover carry a precondition: node and Service status patches, finalizer,
//! taint and initialization writes name the `resourceVersion` they were planned from, and a late one
//! fails (409) when the object changed since, as it has if the new leader wrote it. Events carry none
//! (a late event is a duplicate report, not a wrong state).
//!
//! Leadership is valid until the renew deadline has passed since the start of the last successful
//! renewal (the start, not the answer: the server may have stored the renewal any time in between). A
//! standby takes the Lease only after it has seen no renewal for the lease duration, which is longer
//! than the renew deadline, so the two replicas' write windows never overlap. The fence sits innermost
//! in each client's stack, after the rate limiter, so a write that waited for a token is checked when it
//! is about to be sent. Reads (GET, including watches) are always allowed: they change nothing.
//!
//! Upstream client-go has no such fence (it relies on the process exiting on `OnStoppedLeading`);
//! kube-rs has none either, hence this small tower layer.

use parking_lot::Mutex;
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::{Method, Request};
use tower::{BoxError, Layer, Service};

/// Until when this replica may write. Shared by the elector (which extends it) and every client of the
/// controllers (which check it).
#[derive(Clone, Debug)]
pub struct WriteFence {
    valid_until: Arc<Mutex<Option<Instant>>>,
    enforced: bool,
}

/// A closed fence: no writes until leadership is acquired.
impl Default for WriteFence {
    fn default() -> Self {
        Self {
            valid_until: Arc::default(),
            enforced: true,
        }
    }
}

/// A write refused because leadership may have ended.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to send {method} {path}: leadership may have ended {ago:?} ago (lease not renewed within the renew deadline)"
)]
pub struct FencedWrite {
    method: Method,
    path: String,
    ago: Duration,
}

impl WriteFence {
    /// A fence that always lets writes through, for a manager without leader election.
    pub fn unenforced() -> Self {
        Self {
            enforced: false,
            ..Self::default()
        }
    }

    /// Writes are allowed until `until` (a successful renewal moves it forward).
    pub fn allow_until(&self, until: Instant) {
        *self.lock() = Some(until);
    }

    /// Writes are refused from now on.
    pub fn close(&self) {
        *self.lock() = Some(Instant::now());
    }

    /// When writes stop unless leadership is renewed (`None` before leadership was ever acquired).
    pub fn valid_until(&self) -> Option<Instant> {
        *self.lock()
    }

    /// Resolves once the fence is closed (never for an unenforced one), with how long ago it closed:
    /// the manager drops a cloud call in flight at that moment (see `cloud_metrics`).
    pub async fn closed(&self) -> Duration {
        if !self.enforced {
            return std::future::pending().await;
        }
        loop {
            match self.closed_for() {
                Some(ago) => return ago,
                // A renewal may have moved the deadline meanwhile: look again when this one passes.
                None => match self.valid_until() {
                    Some(until) => tokio::time::sleep_until(until.into()).await,
                    None => return Duration::ZERO,
                },
            }
        }
    }

    /// How long ago the fence closed, or `None` while writes are allowed.
    pub fn closed_for(&self) -> Option<Duration> {
        if !self.enforced {
            return None;
        }
        let now = Instant::now();
        match self.valid_until() {
            Some(until) if until > now => None,
            Some(until) => Some(now - until),
            None => Some(Duration::ZERO),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Option<Instant>> {
        self.valid_until.lock()
    }
}

/// A provider's `cloud_provider::leadership::check` consults the fence.
impl cloud_provider::leadership::LeadershipSource for WriteFence {
    fn lapsed(&self) -> Option<Duration> {
        self.closed_for()
    }
}

fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

impl<S> Layer<S> for WriteFence {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fenced {
            inner,
            fence: self.clone(),
        }
    }
}

/// A client service behind the fence.
#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: WriteFence,
}

impl<S, B> Service<Request<B>> for Fenced<S>
where
    S: Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if !is_read(request.method())
            && let Some(ago) = self.fence.closed_for()
        {
            let refused = FencedWrite {
                method: request.method().clone(),
                path: request.uri().path().to_owned(),
                ago,
            };
            tracing::error!("{refused}");
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        let call = self.inner.call(request);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    async fn send(fence: &WriteFence, method: Method) -> Result<(), BoxError> {
        let inner = tower::service_fn(|_: Request<()>| async { Ok::<_, Infallible>(()) });
        let mut service = fence.layer(inner);
        std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
        let request = Request::builder()
            .method(method)
            .uri("/api/v1/nodes/a")
            .body(())
            .unwrap();
        service.call(request).await
    }

    #[tokio::test]
    async fn writes_pass_only_while_leadership_is_valid_and_reads_always() {
        let fence = WriteFence::default();
        // Never acquired: no writes.
        assert!(send(&fence, Method::PATCH).await.is_err());
        assert!(send(&fence, Method::GET).await.is_ok());

        fence.allow_until(Instant::now() + Duration::from_secs(60));
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(send(&fence, method).await.is_ok());
        }

        fence.close();
        let err = send(&fence, Method::PUT).await.unwrap_err().to_string();
        assert!(
            err.starts_with("refusing to send PUT /api/v1/nodes/a: leadership may have ended"),
            "{err}"
        );
        assert!(send(&fence, Method::GET).await.is_ok());
        assert!(send(&fence, Method::HEAD).await.is_ok());

        let open = WriteFence::unenforced();
        assert!(send(&open, Method::DELETE).await.is_ok());
    }

    #[tokio::test]
    async fn closed_resolves_at_the_deadline_as_renewals_move_it() {
        let fence = WriteFence::default();
        let started = Instant::now();
        fence.allow_until(started + Duration::from_millis(60));
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.closed().await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        fence.allow_until(started + Duration::from_millis(150)); // a renewal
        waiting.await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        let unenforced = WriteFence::unenforced();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), unenforced.closed())
                .await
                .is_err(),
            "an unenforced fence never closes"
        );
    }

    #[tokio::test]
    async fn the_fence_closes_by_itself_at_the_deadline() {
        let fence = WriteFence::default();
        fence.allow_until(Instant::now() + Duration::from_millis(50));
        assert!(send(&fence, Method::POST).await.is_ok());
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(send(&fence, Method::POST).await.is_err());
    }
}
