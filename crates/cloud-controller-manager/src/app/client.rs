//! The API client: `--kubeconfig` / `--master` / in-cluster config, with the client-side rate limit.

use std::path::PathBuf;

use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::{options::ClientOptions, rate_limit::RateLimitLayer, request_metrics::RequestMetrics};

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
        let url = master.parse().map_err(|source| ClientError::Master {
            master: master.to_owned(),
            source,
        })?;
        Config::new(url)
    } else {
        Config::incluster().map_err(ClientError::InCluster)?
    };
    if !master.is_empty() {
        config.cluster_url = master.parse().map_err(|source| ClientError::Master {
            master: master.to_owned(),
            source,
        })?;
    }
    Ok(config)
}

/// A client for `config`, limited to `--kube-api-qps` / `--kube-api-burst`, recording every request in
/// `metrics` (requests waiting for a rate-limit token are not yet counted).
pub fn build_client(
    config: Config,
    options: &ClientOptions,
    metrics: &RequestMetrics,
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
    let builder = ClientBuilder::try_from(config)
        .map_err(ClientError::Build)?
        .with_layer(&metrics.layer(&host));
    Ok(
        match RateLimitLayer::new(options.kube_api_qps, options.kube_api_burst) {
            Some(limit) => builder.with_layer(&limit).build(),
            None => builder.build(),
        },
    )
}
