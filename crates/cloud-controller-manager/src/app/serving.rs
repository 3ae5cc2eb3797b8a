//! The secure endpoint (`--secure-port`, default 10258): HTTPS with a certificate from
//! `--tls-cert-file`/`--tls-private-key-file` (reloaded when the files change; see
//! [`super::certificate_reload`]) or a self-signed one made in memory; `/healthz`,
//! `/livez`, `/readyz` open (`--authorization-always-allow-paths`), everything else, `/metrics`
//! included, for callers the API server authenticates and authorizes.

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    sync::Arc,
};

use axum::{
    Router,
    extract::{Query, State},
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use hyper_util::rt::TokioTimer;
use rustls::{pki_types::PrivateKeyDer, sign::CertifiedKey};

use super::{
    certificate_reload::{CertKeyFiles, CertificateReloader, DynamicServingCertificate},
    connection_guard::{ConnectionLimits, GuardedAcceptor, HEADER_READ_TIMEOUT, stopped_at},
    delegated_auth::{Decision, DelegatedAuth, RequestAttributes},
    health::Health,
    options::ServingOptions,
};
use crate::{metrics::Metrics, shadow::ShadowView};

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// The port is taken or the address is not local.
    #[error("cannot listen on {address} (--bind-address/--secure-port): {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The certificate or key cannot be used.
    #[error("cannot use the serving certificate: {0}")]
    Tls(String),
}

/// What the handler needs.
pub struct ServerState {
    /// The health checks.
    pub health: Arc<Health>,
    /// The metrics.
    pub metrics: Metrics,
    /// The reviewer.
    pub auth: DelegatedAuth,
    /// Paths open to anyone.
    pub always_allow: Vec<String>,
    /// Shadow mode's report (`/dry-run`), with `--dry-run`.
    pub dry_run: Option<Arc<ShadowView>>,
}

/// The serving certificate: from `--tls-cert-file`/`--tls-private-key-file`, with the reloader that
/// watches them, or self-signed in memory (nothing is written to disk, so a read-only root filesystem
/// is enough).
fn serving_certificate(
    options: &ServingOptions,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<(Arc<DynamicServingCertificate>, Option<CertificateReloader>), ServingError> {
    if !options.tls_cert_file.is_empty() {
        let files = CertKeyFiles {
            cert_file: PathBuf::from(&options.tls_cert_file),
            key_file: PathBuf::from(&options.tls_private_key_file),
        };
        let reloader =
            CertificateReloader::load(files, provider.clone()).map_err(ServingError::Tls)?;
        return Ok((reloader.serving(), Some(reloader)));
    }
    // Upstream generates one in memory too (pair name "cloud-controller-manager").
    let names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "cloud-controller-manager".to_owned(),
    ];
    let generated = rcgen::generate_simple_self_signed(names)
        .map_err(|err| ServingError::Tls(err.to_string()))?;
    let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|err| ServingError::Tls(err.to_owned()))?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|err| ServingError::Tls(err.to_string()))?;
    let certified = CertifiedKey::new(vec![generated.cert.der().clone()], key);
    Ok((Arc::new(DynamicServingCertificate::new(certified)), None))
}

fn tls_config(
    options: &ServingOptions,
) -> Result<(rustls::ServerConfig, Option<CertificateReloader>), ServingError> {
    let mut provider = super::tls_curves::provider();
    options.tls_curve_preferences.restrict(&mut provider);
    let provider = Arc::new(provider);
    let (certificate, reloader) = serving_certificate(options, &provider)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| ServingError::Tls(err.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, reloader))
}

/// Binds and starts serving; `Ok(None)` when `--secure-port=0`. Binding happens here, so a taken port
/// is an error at start, not a log line later.
pub fn start(
    options: &ServingOptions,
    state: Arc<ServerState>,
    supervisor: &cloud_provider::Supervisor,
) -> Result<Option<SocketAddr>, ServingError> {
    if options.secure_port == 0 {
        return Ok(None);
    }
    let address = SocketAddr::new(options.bind_address, options.secure_port);
    let listener =
        TcpListener::bind(address).map_err(|source| ServingError::Bind { address, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServingError::Bind { address, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServingError::Bind { address, source })?;
    let (config, reloader) = tls_config(options)?;
    let config = RustlsConfig::from_config(Arc::new(config));
    let shutdown = supervisor.shutdown().clone();
    if let Some(reloader) = reloader {
        // New connections get the files' current pair; the watch ends with the manager. A reload that
        // panicked took the reloader's state with it: the process is to restart (`/healthz` fails).
        let ends = cloud_provider::supervise::Ends::AtShutdown;
        let reloading = reloader.run(shutdown.clone());
        supervisor.spawn_once("serving certificate reload", ends, reloading);
    }
    let handle = stopped_at(&shutdown);
    let dry_run = state.dry_run.is_some();
    let app = Router::new().fallback(handle_request).with_state(state);
    // TLS over the connection guard: the caps and the idle timeout (connection_guard), then hyper's
    // header-read timeout.
    let acceptor =
        RustlsAcceptor::new(config).acceptor(GuardedAcceptor::new(ConnectionLimits::default()));
    let mut server = axum_server::from_tcp(listener)
        .map_err(|source| ServingError::Bind { address, source })?
        .acceptor(acceptor)
        .handle(handle);
    server
        .http_builder()
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    // Supervised: a panic of the server, or its end while the manager is not stopping, fails
    // `/healthz` and is counted (the kubelet's probe fails anyway once the port closes; the supervisor
    // says why). Under a stop token of its own, cancelled once it has returned after the shutdown: the
    // supervisor's own token would drop it at the shutdown, before its open requests had their 5 s.
    let served = tokio_util::sync::CancellationToken::new();
    let serving = {
        let served = served.clone();
        async move {
            if let Err(err) = server.serve(app.into_make_service()).await {
                tracing::error!(error = %err, "the secure endpoint stopped");
            }
            if shutdown.is_cancelled() {
                served.cancel();
            }
        }
    };
    let ends = cloud_provider::supervise::Ends::AtShutdown;
    supervisor
        .stopping_with(served)
        .spawn_once("secure endpoint", ends, serving);
    tracing::info!(address = %local, dry_run, "serving /healthz, /livez, /readyz and /metrics (and /dry-run in shadow mode) over HTTPS");
    Ok(Some(local))
}

fn always_allowed(path: &str, allow: &[String]) -> bool {
    allow.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == p,
    })
}

/// Whether the endpoint answers `method` on `path` with content (`/metrics`, `/dry-run` in shadow mode,
/// a health endpoint or one of its checks): the requests whose authorization is reviewed per path; every
/// other request shares one review per user (see `delegated_auth`).
fn serves(state: &ServerState, method: &Method, path: &str) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    if path == "/metrics" || (path == "/dry-run" && state.dry_run.is_some()) {
        return true;
    }
    let (endpoint, subpath) = health_endpoint(path);
    matches!(endpoint, "healthz" | "livez" | "readyz")
        && state.health.answer(endpoint, subpath, false, &[]).is_some()
}

/// A health path's endpoint and check (`/readyz/leaderElection` is `("readyz", "leaderElection")`).
fn health_endpoint(path: &str) -> (&str, &str) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    )
}

fn text(code: u16, body: String) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn handle_request(
    State(state): State<Arc<ServerState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let path = uri.path();
    if !always_allowed(path, &state.always_allow) {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let verb = method.as_str().to_lowercase();
        let request = RequestAttributes {
            verb: &verb,
            path,
            served: serves(&state, &method, path),
        };
        match state.auth.decide(token, &request).await {
            Decision::Allowed => {}
            Decision::Unauthenticated => return text(401, "Unauthorized".to_owned()),
            Decision::Forbidden(message) => return text(403, message),
            Decision::TooManyRequests => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, "1")],
                    "Too many requests, please try again later.",
                )
                    .into_response();
            }
            Decision::Failed(message) => {
                tracing::warn!(%path, error = %message, "could not authorize a request");
                return text(500, "Internal Server Error".to_owned());
            }
        }
    }
    if method != Method::GET && method != Method::HEAD {
        return text(405, "Method Not Allowed".to_owned());
    }
    if path == "/metrics" {
        return (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            state.metrics.encode(),
        )
            .into_response();
    }
    if path == "/dry-run"
        && let Some(view) = &state.dry_run
    {
        let report = view.render().await;
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string_pretty(&report).unwrap_or_default(),
        )
            .into_response();
    }
    let (endpoint, subpath) = health_endpoint(path);
    if matches!(endpoint, "healthz" | "livez" | "readyz") {
        let verbose = query.iter().any(|(k, _)| k == "verbose");
        let exclude: Vec<String> = query
            .iter()
            .filter(|(k, _)| k == "exclude")
            .map(|(_, v)| v.clone())
            .collect();
        if let Some((code, body)) = state.health.answer(endpoint, subpath, verbose, &exclude) {
            return text(code, body);
        }
    }
    text(404, "404 page not found".to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn always_allowed_paths_are_exact_unless_they_end_in_a_star() {
        let allow = vec!["/healthz".to_owned(), "/debug/*".to_owned()];
        assert!(always_allowed("/healthz", &allow));
        assert!(!always_allowed("/healthz/leaderElection", &allow));
        assert!(always_allowed("/debug/pprof", &allow));
        assert!(!always_allowed("/metrics", &allow));
    }

    #[test]
    fn a_self_signed_certificate_is_made_without_files() {
        let options = ServingOptions {
            secure_port: 1,
            bind_address: "127.0.0.1".parse().unwrap(),
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            authorization_always_allow_paths: vec![],
            tls_curve_preferences: Default::default(),
        };
        assert!(tls_config(&options).is_ok());
        let missing = ServingOptions {
            tls_cert_file: "/nonexistent/tls.crt".into(),
            tls_private_key_file: "/nonexistent/tls.key".into(),
            ..options
        };
        let err = tls_config(&missing).unwrap_err().to_string();
        assert!(
            err.contains("--tls-cert-file /nonexistent/tls.crt"),
            "{err}"
        );
    }

    /// `--tls-curve-preferences` reaches the secure port's TLS configuration.
    #[test]
    fn curve_preferences_restrict_the_served_key_exchanges() {
        let options = ServingOptions {
            secure_port: 1,
            bind_address: "127.0.0.1".parse().unwrap(),
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            authorization_always_allow_paths: vec![],
            tls_curve_preferences: super::super::tls_curves::TlsCurves::parse("24").unwrap(),
        };
        let (config, _) = tls_config(&options).unwrap();
        let groups: Vec<_> = config
            .crypto_provider()
            .kx_groups
            .iter()
            .map(|g| g.name())
            .collect();
        assert_eq!(groups, [rustls::NamedGroup::secp384r1]);
    }

    /// The endpoint runs under the manager's supervisor (counted, its panic or early end failing
    /// `/healthz`), and its graceful stop at shutdown is no failure.
    #[tokio::test]
    async fn the_endpoint_is_supervised_and_its_stop_at_shutdown_is_no_failure() {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let options = ServingOptions {
            secure_port: port,
            bind_address: "127.0.0.1".parse().unwrap(),
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            authorization_always_allow_paths: vec!["/healthz".to_owned()],
            tls_curve_preferences: Default::default(),
        };
        let unreachable = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let state = Arc::new(ServerState {
            health: Arc::new(Health::default()),
            metrics: Metrics::new(),
            auth: DelegatedAuth::new(kube::Client::try_from(unreachable).unwrap()),
            always_allow: options.authorization_always_allow_paths.clone(),
            dry_run: None,
        });
        let shutdown = tokio_util::sync::CancellationToken::new();
        let supervisor = cloud_provider::Supervisor::new(Default::default(), shutdown.clone());
        let address = start(&options, state, &supervisor).unwrap().unwrap();
        assert_eq!(supervisor.running(), ["secure endpoint"]);
        tokio::net::TcpStream::connect(address).await.unwrap();
        shutdown.cancel();
        let stopped = async {
            while !supervisor.running().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), stopped)
            .await
            .expect("the endpoint stops within its 5 s of grace");
        assert_eq!(supervisor.check(), Ok(()));
    }
}
