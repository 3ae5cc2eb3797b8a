//! A mock API server for unit tests of one controller's writes: a [`kube::Client`] whose every request
//! is answered by a closure and logged.

use std::sync::Arc;

/// The requests made: (method, path, JSON body).
pub(crate) type Requests = Arc<parking_lot::Mutex<Vec<(String, String, serde_json::Value)>>>;

/// A client whose API server is `respond` (method, path, body → status, body), with every request
/// logged.
pub(crate) fn mock_client(
    respond: impl Fn(&str, &str, &serde_json::Value) -> (u16, serde_json::Value) + Send + Sync + 'static,
) -> (kube::Client, Requests) {
    mock_server(false, move |method, path, body| {
        let (status, answer) = respond(method, path, body);
        (status, serde_json::to_vec(&answer).unwrap())
    })
}

/// As [`mock_client`], but `respond` sees the query too (`/api/v1/nodes?watch=true&...`, also in the
/// log) and answers with raw bytes (a watch answers with one JSON event per line).
pub(crate) fn mock_client_with_query(
    respond: impl Fn(&str, &str, &serde_json::Value) -> (u16, Vec<u8>) + Send + Sync + 'static,
) -> (kube::Client, Requests) {
    mock_server(true, respond)
}

fn mock_server(
    with_query: bool,
    respond: impl Fn(&str, &str, &serde_json::Value) -> (u16, Vec<u8>) + Send + Sync + 'static,
) -> (kube::Client, Requests) {
    let requests = Requests::default();
    let respond = Arc::new(respond);
    let log = requests.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (respond, log) = (respond.clone(), log.clone());
        async move {
            let method = request.method().to_string();
            let path = match request.uri().path_and_query() {
                Some(full) if with_query => full.as_str().to_owned(),
                _ => request.uri().path().to_owned(),
            };
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let (status, answer) = respond(&method, &path, &body);
            log.lock().push((method, path, body));
            http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(answer))
        }
    });
    (kube::Client::new(service, "default"), requests)
}
