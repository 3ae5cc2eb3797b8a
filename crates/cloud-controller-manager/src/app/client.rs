//! The API client: `--kubeconfig` / `--master` / in-cluster config, with the client-side rate limit.

use std::path::PathBuf;

use http::{HeaderValue, header::ACCEPT};
use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use tower_http::set_header::SetRequestHeaderLayer;

use super::{
    options::ClientOptions,
    rate_limit::RateLimitLayer,
    service_account_credentials::{ServiceAccountAuthLayer, TokenSource},
};
use crate::{request_metrics::RequestMetrics, shadow::DryRunLayer, write_fence::WriteFence};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file cannot be read or parsed.
    #[error("cannot load --kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// `--master` is not a URL.
    #[error("invalid --master {master:?}: {source}")]
    Master {
        /// The value given.
        master: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// `--master` is a URL, but not one of an API server.
    #[error("invalid --master {master:?}: {reason}")]
    MasterUrl {
        /// The value given.
        master: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither flag was given and the process does not run in a cluster.
    #[error(
        "neither --kubeconfig nor --master was given, and the in-cluster configuration is not available: {0}"
    )]
    InCluster(#[source] kube::config::InClusterError),
    /// The client stack could not be built (for example a bad certificate in the kubeconfig).
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// The client configuration the flags describe (upstream `clientcmd.BuildConfigFromFlags`).
pub async fn client_config(options: &ClientOptions) -> Result<Config, ClientError> {
    let master = options.master.trim();
    let mut config = if !options.kubeconfig.is_empty() {
        let path = PathBuf::from(&options.kubeconfig);
        let kubeconfig =
            Kubeconfig::read_from(&path).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| ClientError::Kubeconfig { path, source })?
    } else if !master.is_empty() {
        Config::new(master_url(master)?)
    } else {
        Config::incluster().map_err(ClientError::InCluster)?
    };
    if !master.is_empty() {
        config.cluster_url = master_url(master)?;
    }
    set_user_agent(&mut config, None);
    Ok(config)
}

/// client-go's user agent shape, `<binary>/v<version> (<os>/<arch>) ccm-rs[/<controller>]`. The
/// API server names the field manager of a write without one after the part before the first `/`, so
/// managedFields name the binary (`cloud-controller-manager`), as upstream's writes do, instead of
/// `unknown`; the controller's name shows in audit logs, as upstream's `AddUserAgent` puts it there.
pub fn set_user_agent(config: &mut Config, controller: Option<&str>) {
    let binary = std::env::args_os()
        .next()
        .and_then(|argv0| {
            std::path::Path::new(&argv0)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "cloud-controller-manager".to_owned());
    let mut agent = format!(
        "{binary}/v{} ({}/{}) ccm-rs",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    if let Some(controller) = controller {
        agent.push('/');
        agent.push_str(controller);
    }
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    // A name that is not a valid header value (a binary named with control characters) keeps the
    // client's default rather than failing the start.
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
}

/// `config` without any credential (upstream `restclient.AnonymousClientConfig`): the server, how to
/// verify it (CA, server name, insecure flag), the proxy, the timeouts and the user agent stay; the client
/// certificate and key, the bearer token (or token file), basic auth, exec and auth-provider plugins and
/// impersonation go. A controller's client under `--use-service-account-credentials` is built from it, so
/// it presents its ServiceAccount's token and nothing of the manager's.
pub fn anonymous_config(config: &Config) -> Config {
    let mut anonymous = config.clone();
    anonymous.auth_info = kube::config::AuthInfo::default();
    anonymous.headers.retain(|(name, _)| {
        name != http::header::AUTHORIZATION && !name.as_str().starts_with("impersonate-")
    });
    anonymous
}

/// `--master` as the API server's URL: `http://` or `https://`, a host, and nothing the client would
/// choke on later (a URL without a scheme made kube's connector panic; another scheme was retried
/// forever).
fn master_url(master: &str) -> Result<http::Uri, ClientError> {
    let url: http::Uri = master.parse().map_err(|source| ClientError::Master {
        master: master.to_owned(),
        source,
    })?;
    let refuse = |reason: String| ClientError::MasterUrl {
        master: master.to_owned(),
        reason,
    };
    match url.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(refuse(format!(
                "the scheme must be http or https, not {other}"
            )));
        }
        None => {
            return Err(refuse(format!(
                "a URL with a scheme is needed, for example https://{master}"
            )));
        }
    }
    if url.host().is_none_or(str::is_empty) {
        return Err(refuse("the URL has no host".to_owned()));
    }
    if url.query().is_some() {
        return Err(refuse("the URL must not have a query".to_owned()));
    }
    Ok(url)
}

/// What a request that names no media type of its own accepts (a get, list or watch of an object, a
/// create, a delete): JSON without `metadata.managedFields` (KEP-5958, gate `ManagedFieldsOptOut`, alpha in
/// 1.38). An API server with the gate leaves the field out of what it sends, which saves its
/// serialization and the bytes on the wire (the manager reads no managed fields: its caches drop them
/// after decoding anyway, and its writes never send them, so the stored ones stay). One without the gate,
/// or older than 1.38, ignores the parameter (an unrecognized media-type parameter), so it is sent to
/// every API server. A request that names its own media type (a patch, a metadata-only list) keeps it.
pub(crate) const ACCEPT_WITHOUT_MANAGED_FIELDS: &str =
    "application/json;drop=metadata.managedFields";

/// A client for `config`, limited to `--kube-api-qps` / `--kube-api-burst`, recording every request in
/// `metrics` (requests waiting for a rate-limit token are not yet counted), and sending writes only
/// while `fence` (the leader's; [`WriteFence::unenforced`] without leader election) allows them, and,
/// with `dry_run` (shadow mode), only as recorded dry runs. With `token`, every request carries that
/// ServiceAccount's token (`config` is then an [`anonymous_config`]).
pub(crate) fn build_client(
    config: Config,
    options: &ClientOptions,
    metrics: &RequestMetrics,
    fence: &WriteFence,
    dry_run: Option<&DryRunLayer>,
    token: Option<&TokenSource>,
) -> Result<Client, ClientError> {
    let host = format!(
        "{}{}",
        config.cluster_url.host().unwrap_or_default(),
        config
            .cluster_url
            .port()
            .map(|p| format!(":{p}"))
            .unwrap_or_default()
    );
    // Innermost first: the ServiceAccount's token is put on a request, and the fence checked (and the dry
    // run made), when it is about to be sent, after any wait for a rate-limit token.
    let base = ClientBuilder::try_from(config)
        .map_err(ClientError::Build)?
        .with_layer(&ServiceAccountAuthLayer::new(token.cloned()))
        .with_layer(&SetRequestHeaderLayer::if_not_present(
            ACCEPT,
            HeaderValue::from_static(ACCEPT_WITHOUT_MANAGED_FIELDS),
        ));
    let metrics = metrics.layer(&host);
    let limit = RateLimitLayer::new(options.kube_api_qps, options.kube_api_burst);
    Ok(match (dry_run, limit) {
        (Some(dry_run), Some(limit)) => base
            .with_layer(dry_run)
            .with_layer(fence)
            .with_layer(&metrics)
            .with_layer(&limit)
            .build(),
        (Some(dry_run), None) => base
            .with_layer(dry_run)
            .with_layer(fence)
            .with_layer(&metrics)
            .build(),
        (None, Some(limit)) => base
            .with_layer(fence)
            .with_layer(&metrics)
            .with_layer(&limit)
            .build(),
        (None, None) => base.with_layer(fence).with_layer(&metrics).build(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The media type each kind of request reaches the API server with through the manager's client
    /// (`build_client`), as a listener on loopback receives it.
    #[tokio::test]
    async fn requests_without_a_media_type_ask_for_json_without_managed_fields() {
        use k8s_openapi::api::core::v1::Node;
        use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchParams};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Answers every request 500 after its head (and closes), reporting its method and Accept.
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1
                {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let method = head.split(' ').next().unwrap_or_default().to_owned();
                let accept = head
                    .lines()
                    .find_map(|l| l.strip_prefix("accept: "))
                    .unwrap_or_default()
                    .to_owned();
                let _ = tx.send((method, accept));
                let _ = stream
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            }
        });
        let options = ClientOptions {
            kubeconfig: String::new(),
            master: String::new(),
            kube_api_qps: 0.0,
            kube_api_burst: 0,
            kube_api_content_type: Default::default(),
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let client = build_client(
            Config::new(url.parse().unwrap()),
            &options,
            &RequestMetrics::register(&mut registry),
            &WriteFence::unenforced(),
            None,
            None,
        )
        .unwrap();
        let nodes: Api<Node> = Api::all(client);
        let _ = nodes.list(&ListParams::default()).await;
        let _ = nodes.watch(&WatchParams::default(), "1").await;
        let _ = nodes.get("a").await;
        let _ = nodes.create(&PostParams::default(), &Node::default()).await;
        let _ = nodes.list_metadata(&ListParams::default()).await;
        let _ = nodes
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({})),
            )
            .await;
        server.abort();
        let mut seen = Vec::new();
        while let Ok(request) = rx.try_recv() {
            seen.push(request);
        }
        // A failed request may be sent again: each kind once in order is what matters.
        seen.dedup();
        let without = ACCEPT_WITHOUT_MANAGED_FIELDS.to_owned();
        let pair = |m: &str, a: &str| (m.to_owned(), a.to_owned());
        assert_eq!(
            seen,
            [
                pair("GET", &without),
                pair("POST", &without),
                pair(
                    "GET",
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
                ),
                pair("PATCH", "application/json"),
            ],
            "list, watch and get (one GET each, the same media type), create, metadata list, patch"
        );
    }

    #[test]
    fn the_user_agent_names_the_binary_first_and_the_controller_last() {
        let mut config = Config::new(master_url("https://127.0.0.1:6443").unwrap());
        set_user_agent(&mut config, None);
        set_user_agent(&mut config, Some("cloud-node-controller"));
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(name, _)| name == http::header::USER_AGENT)
            .map(|(_, value)| value.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(agents.len(), 1, "{agents:?}");
        let binary = std::env::current_exe().unwrap();
        let binary = binary.file_name().unwrap().to_string_lossy();
        // The API server's field manager for a write is the part before the first `/`.
        assert_eq!(agents[0].split('/').next().unwrap(), binary);
        assert!(
            agents[0].ends_with(&format!(
                "/v{} ({}/{}) ccm-rs/cloud-node-controller",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::env::consts::ARCH
            )),
            "{}",
            agents[0]
        );
    }

    #[test]
    fn the_anonymous_config_keeps_the_server_and_its_ca_and_drops_every_credential() {
        let mut config = Config::new(master_url("https://10.0.0.1:6443").unwrap());
        config.root_cert = Some(vec![b"ca".to_vec()]);
        config.tls_server_name = Some("kubernetes".to_owned());
        config.auth_info = kube::config::AuthInfo {
            token: Some("the-managers-token".to_owned().into()),
            token_file: Some("/var/run/secrets/token".to_owned()),
            client_certificate_data: Some("cert".to_owned()),
            client_key_data: Some("key".to_owned().into()),
            username: Some("admin".to_owned()),
            password: Some("secret".to_owned().into()),
            impersonate: Some("someone".to_owned()),
            ..Default::default()
        };
        config.headers.push((
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer x"),
        ));
        config.headers.push((
            http::HeaderName::from_static("impersonate-user"),
            http::HeaderValue::from_static("someone"),
        ));
        set_user_agent(&mut config, Some("service-lb-controller"));
        let anonymous = anonymous_config(&config);
        assert_eq!(anonymous.cluster_url, config.cluster_url);
        assert_eq!(anonymous.root_cert, config.root_cert);
        assert_eq!(anonymous.tls_server_name, config.tls_server_name);
        assert_eq!(anonymous.accept_invalid_certs, config.accept_invalid_certs);
        let auth = &anonymous.auth_info;
        assert!(
            auth.token.is_none()
                && auth.token_file.is_none()
                && auth.client_certificate_data.is_none()
                && auth.client_key_data.is_none()
                && auth.username.is_none()
                && auth.password.is_none()
                && auth.impersonate.is_none()
                && auth.exec.is_none()
                && auth.auth_provider.is_none(),
            "{auth:?}"
        );
        let headers: Vec<&str> = anonymous.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(headers, ["user-agent"]);
    }

    #[test]
    fn master_urls_need_an_http_scheme_and_a_host() {
        for good in [
            "https://127.0.0.1:6443",
            "http://localhost:8080",
            "https://api.example.com",
            "https://[::1]:6443/prefix",
        ] {
            assert!(master_url(good).is_ok(), "{good}");
        }
        let message = |bad: &str| master_url(bad).unwrap_err().to_string();
        assert_eq!(
            message("localhost:6443"),
            r#"invalid --master "localhost:6443": a URL with a scheme is needed, for example https://localhost:6443"#
        );
        assert_eq!(
            message("ftp://localhost:6443"),
            r#"invalid --master "ftp://localhost:6443": the scheme must be http or https, not ftp"#
        );
        assert!(message("https://").starts_with(r#"invalid --master "https://""#));
        assert!(message("https://h:1/?a=b").contains("query"));
        assert!(message("/just/a/path").contains("scheme"));
        assert!(message("http://exa mple").starts_with(r#"invalid --master "http://exa mple""#));
    }
}
