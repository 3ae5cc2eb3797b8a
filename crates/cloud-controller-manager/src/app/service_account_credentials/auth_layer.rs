//! The tower layer that authenticates a controller's requests with its ServiceAccount's token (upstream
//! wraps the transport of an anonymous config with `ResettableTokenSourceWrapTransport`).
//!
//! kube's own `AuthLayer` refreshes only the tokens a kubeconfig describes (a file, an exec plugin,
//! OIDC), so this layer does it for a [`TokenSource`]. It sits innermost in the client's stack, like the
//! write fence: the token is taken in `poll_ready` (waiting there, as the rate limiter does, when no
//! valid token is at hand) and put on the request in `call`. A 401 answer drops that token from the
//! source. `poll_ready` never fails (an error there would close kube's request buffer for good): a
//! request without a token fails alone, in `call`.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{Request, Response, StatusCode, header::AUTHORIZATION};
use tower::{BoxError, Layer, Service};

use super::token_source::{Current, NoToken, TOKEN_WAIT, TokenSource};

/// Authenticates every request as the source's ServiceAccount; with no source, passes requests as
/// they are (the manager's own identity, from the client's config).
#[derive(Clone, Default)]
pub(crate) struct ServiceAccountAuthLayer {
    source: Option<TokenSource>,
}

impl ServiceAccountAuthLayer {
    /// Requests carry `source`'s token, if any.
    pub(crate) fn new(source: Option<TokenSource>) -> Self {
        Self { source }
    }
}

impl<S> Layer<S> for ServiceAccountAuthLayer {
    type Service = ServiceAccountAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServiceAccountAuth {
            inner,
            source: self.source.clone(),
            waiting: None,
            token: None,
        }
    }
}

type Waiting = Pin<Box<dyn Future<Output = Result<Current, NoToken>> + Send>>;

/// A client service whose requests carry a ServiceAccount's token.
pub(crate) struct ServiceAccountAuth<S> {
    inner: S,
    source: Option<TokenSource>,
    waiting: Option<Waiting>,
    /// The token for the next `call`, taken in `poll_ready`.
    token: Option<Result<Current, NoToken>>,
}

impl<S, B, RB> Service<Request<B>> for ServiceAccountAuth<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if let Some(source) = &self.source
            && self.token.is_none()
        {
            let waiting = self
                .waiting
                .get_or_insert_with(|| Box::pin(source.clone().current(TOKEN_WAIT)));
            let Poll::Ready(token) = waiting.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            self.waiting = None;
            let failed = token.is_err();
            self.token = Some(token);
            if failed {
                // The request fails in `call`, without reaching the inner service.
                return Poll::Ready(Ok(()));
            }
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let Some(source) = self.source.clone() else {
            let call = self.inner.call(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        };
        let token = match self.token.take() {
            Some(Ok(token)) => token,
            Some(Err(no_token)) => {
                tracing::warn!(error = %no_token, path = request.uri().path(), "request not sent");
                return Box::pin(std::future::ready(Err(no_token.into())));
            }
            None => {
                let err = format!(
                    "request to {} sent without poll_ready: no token for {}",
                    request.uri().path(),
                    source.service_account()
                );
                return Box::pin(std::future::ready(Err(err.into())));
            }
        };
        request
            .headers_mut()
            .insert(AUTHORIZATION, token.header.clone());
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await.map_err(Into::into)?;
            if response.status() == StatusCode::UNAUTHORIZED {
                source.invalidate(token.generation);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, sync::Arc, time::Duration};

    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    use super::{
        super::token_source::{Fetch, IssuedToken},
        *,
    };

    /// A source handing out `t1`, `t2`, ...
    async fn source(stop: &CancellationToken) -> TokenSource {
        let issued = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let fetch: Fetch = Arc::new(move || {
            let n = issued.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Box::pin(async move {
                Ok(IssuedToken {
                    token: format!("t{n}"),
                    expiration: Timestamp::now() + SignedDuration::from_hours(1),
                })
            })
        });
        let supervisor = cloud_provider::Supervisor::new(Default::default(), stop.clone());
        TokenSource::start("node-controller", fetch, &supervisor)
            .await
            .unwrap()
    }

    /// A server answering 401 to token `t1` and 200 to the rest, logging the Authorization headers.
    fn server(
        seen: Arc<parking_lot::Mutex<Vec<Option<String>>>>,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send + 'static>
    {
        tower::service_fn(move |request: Request<()>| {
            let auth = request
                .headers()
                .get(AUTHORIZATION)
                .map(|v| v.to_str().unwrap().to_owned());
            seen.lock().push(auth.clone());
            let status = if auth.as_deref() == Some("Bearer t1") {
                401
            } else {
                200
            };
            async move { Ok(Response::builder().status(status).body(()).unwrap()) }
        })
    }

    fn request() -> Request<()> {
        Request::builder()
            .uri("/api/v1/nodes")
            .header(AUTHORIZATION, "Bearer the-managers-own")
            .body(())
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn requests_carry_the_token_and_a_401_brings_a_new_one() {
        let stop = CancellationToken::new();
        let seen = Arc::default();
        let mut service = ServiceAccountAuthLayer::new(Some(source(&stop).await))
            .layer(server(Arc::clone(&seen)));
        let first = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(first.status(), 401);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(second.status(), 200);
        assert_eq!(
            *seen.lock(),
            [Some("Bearer t1".to_owned()), Some("Bearer t2".to_owned())],
            "the ServiceAccount's token replaces any other"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn without_a_source_requests_pass_as_they_are() {
        let seen = Arc::default();
        let mut service = ServiceAccountAuthLayer::new(None).layer(server(Arc::clone(&seen)));
        let answer = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(*seen.lock(), [Some("Bearer the-managers-own".to_owned())]);
    }
}
