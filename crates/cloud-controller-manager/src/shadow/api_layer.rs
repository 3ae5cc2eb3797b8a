//! The dry-run layer on every API client in shadow mode: each POST, PUT, PATCH and DELETE goes out with
//! `dryRun=All`, so the API server validates it (admission and authorization included) and answers as
//! if it applied it, but stores nothing; the write and the answer are recorded in the
//! [`ShadowReport`]. Reads pass untouched, and so do access reviews (TokenReview, SubjectAccessReview),
//! which are questions, not writes.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use axum::body::Body as AnswerBody;
use http::{Method, Request, Response, Uri};
use kube::client::Body;
use serde_json::Value;
use tower::{BoxError, Layer, Service};

use super::report::{ApiWrite, ObjectKey, ShadowReport};

/// The largest answer to a write the layer reads (an answer is one object).
const LARGEST_ANSWER: usize = 16 << 20;

/// Resources whose "create" asks a question and stores nothing.
const REVIEWS: &[&str] = &[
    "tokenreviews",
    "subjectaccessreviews",
    "selfsubjectaccessreviews",
    "localsubjectaccessreviews",
    "selfsubjectrulesreviews",
    "selfsubjectreviews",
];

/// Makes every write of a client a recorded dry run.
#[derive(Clone)]
pub struct DryRunLayer {
    report: ShadowReport,
}

impl DryRunLayer {
    /// Records into `report`.
    pub fn new(report: ShadowReport) -> Self {
        Self { report }
    }
}

impl<S> Layer<S> for DryRunLayer {
    type Service = DryRun<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DryRun {
            inner,
            report: self.report.clone(),
        }
    }
}

/// A client service whose writes are dry runs.
#[derive(Clone)]
pub struct DryRun<S> {
    inner: S,
    report: ShadowReport,
}

/// What a request path names: the object key (the name may come from the body, for a create).
#[derive(Debug, PartialEq, Eq)]
struct PathParts {
    api_version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
}

/// `/api/v1/...` or `/apis/<group>/<version>/...`, then `namespaces/<ns>/` and
/// `<resource>[/<name>[/<subresource>]]`.
fn parse_path(path: &str) -> Option<PathParts> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ((*version).to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, rest) = rest.split_first()?;
    Some(PathParts {
        api_version,
        namespace,
        resource: (*resource).to_owned(),
        name: rest.first().map(|s| (*s).to_owned()),
        subresource: rest.get(1).map(|s| (*s).to_owned()),
    })
}

/// `uri` with `dryRun=All` added to its query.
fn with_dry_run(uri: &Uri) -> Result<Uri, http::Error> {
    let path = uri.path();
    let query = match uri.query() {
        Some(q) if !q.is_empty() => format!("{q}&dryRun=All"),
        _ => "dryRun=All".to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(format!("{path}?{query}").parse()?);
    Ok(Uri::from_parts(parts)?)
}

fn json_or_text(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

type Answer = Response<AnswerBody>;

impl<S, RB> Service<Request<Body>> for DryRun<S>
where
    S: Service<Request<Body>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Answer;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let method = request.method().clone();
        let parts = parse_path(request.uri().path());
        let is_write = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
        let review = parts
            .as_ref()
            .is_some_and(|p| REVIEWS.contains(&p.resource.as_str()));
        if !is_write || review {
            let call = self.inner.call(request);
            return Box::pin(async move {
                let answer = call.await.map_err(Into::into)?;
                Ok(answer.map(AnswerBody::new))
            });
        }
        let path = request.uri().path().to_owned();
        match with_dry_run(request.uri()) {
            Ok(uri) => *request.uri_mut() = uri,
            Err(err) => {
                // Never send a write that is not a dry run.
                let refused = format!("dry run: cannot add dryRun=All to {path}: {err}");
                tracing::error!("{refused}");
                return Box::pin(std::future::ready(Err(refused.into())));
            }
        }
        // Bodies the client builds are in memory; one that is not is recorded as unknown.
        let body = request.body().try_clone();
        let call = self.inner.call(request);
        let report = self.report.clone();
        Box::pin(async move {
            let body = match body {
                Some(body) => json_or_text(&body.collect_bytes().await.unwrap_or_default()),
                None => Value::String("(streamed body)".to_owned()),
            };
            let answer = call.await.map_err(Into::into)?;
            let (head, answer_body) = answer.into_parts();
            let bytes = axum::body::to_bytes(AnswerBody::new(answer_body), LARGEST_ANSWER).await?;
            let answer_json = json_or_text(&bytes);
            record(
                &report,
                parts,
                &method,
                path,
                body,
                head.status.as_u16(),
                answer_json,
            );
            Ok(Response::from_parts(head, AnswerBody::from(bytes)))
        })
    }
}

fn record(
    report: &ShadowReport,
    parts: Option<PathParts>,
    method: &Method,
    path: String,
    body: Value,
    status: u16,
    answer: Value,
) {
    let key = match parts {
        // Not an object path (a non-resource URL): still a would-be write, under its path.
        None => ObjectKey {
            api_version: String::new(),
            resource: path.clone(),
            namespace: None,
            name: String::new(),
            subresource: None,
        },
        Some(parts) if parts.resource == "events" => {
            report.record_event(parts.namespace.as_deref(), &body);
            return;
        }
        Some(parts) => {
            let name = parts
                .name
                .or_else(|| {
                    let metadata = body.get("metadata")?;
                    metadata
                        .get("name")
                        .or_else(|| metadata.get("generateName"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            ObjectKey {
                api_version: parts.api_version,
                resource: parts.resource,
                namespace: parts.namespace,
                name,
                subresource: parts.subresource,
            }
        }
    };
    report.record_write(
        key,
        ApiWrite {
            verb: method.to_string(),
            path,
            body,
            status,
            answer,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_object_and_subresource() {
        assert_eq!(
            parse_path("/api/v1/nodes/n1/status"),
            Some(PathParts {
                api_version: "v1".into(),
                namespace: None,
                resource: "nodes".into(),
                name: Some("n1".into()),
                subresource: Some("status".into()),
            })
        );
        let service = parse_path("/api/v1/namespaces/shop/services/web").unwrap();
        assert_eq!(service.namespace.as_deref(), Some("shop"));
        assert_eq!(service.resource, "services");
        assert_eq!(service.name.as_deref(), Some("web"));
        let events = parse_path("/apis/events.k8s.io/v1/namespaces/shop/events").unwrap();
        assert_eq!(events.api_version, "events.k8s.io/v1");
        assert_eq!((events.resource.as_str(), events.name), ("events", None));
        let namespace = parse_path("/api/v1/namespaces/shop").unwrap();
        assert_eq!(namespace.resource, "namespaces");
        assert_eq!(namespace.name.as_deref(), Some("shop"));
        assert_eq!(parse_path("/healthz"), None);
    }

    #[test]
    fn dry_run_is_added_to_the_query() {
        let uri: Uri = "https://h:6443/api/v1/nodes/a?fieldManager=ccm"
            .parse()
            .unwrap();
        assert_eq!(
            with_dry_run(&uri).unwrap().to_string(),
            "https://h:6443/api/v1/nodes/a?fieldManager=ccm&dryRun=All"
        );
        let uri: Uri = "/api/v1/nodes/a".parse().unwrap();
        assert_eq!(
            with_dry_run(&uri).unwrap().to_string(),
            "/api/v1/nodes/a?dryRun=All"
        );
    }
}
