//! A flood of HTTPS requests at the manager's secure port, as a hostile client sends them: many
//! kept-alive TLS connections from several loopback addresses, each request with a new path, half of
//! them with a new bearer token. Faster than curl (which opens a connection per request here): a
//! request costs the manager a TLS record and an HTTP parse, not a handshake.
//!
//! The responses are read by their `Content-Length` (the manager always sends one).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpSocket,
};

/// Accepts any certificate: the flood does not care who answers.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// What the flood got back.
#[derive(Debug, Default)]
pub struct FloodResult {
    /// Responses by status code.
    pub codes: BTreeMap<u16, u64>,
    /// Connections that failed (refused, reset, closed by the server) and were opened again.
    pub reconnects: u64,
    /// How long it ran.
    pub elapsed: Duration,
}

impl FloodResult {
    /// Responses per second.
    pub fn rate(&self) -> f64 {
        self.codes.values().sum::<u64>() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Floods `127.0.0.1:port` for `duration` over `per_source` connections from each of `sources`.
pub async fn flood(
    port: u16,
    sources: &[IpAddr],
    per_source: usize,
    duration: Duration,
) -> FloodResult {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for source in sources {
        for _ in 0..per_source {
            let (connector, counter, source) = (connector.clone(), counter.clone(), *source);
            tasks.spawn(async move {
                let mut result = FloodResult::default();
                while Instant::now() < deadline {
                    if connection(&connector, source, port, &counter, deadline, &mut result)
                        .await
                        .is_err()
                    {
                        result.reconnects += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                result
            });
        }
    }
    let mut total = FloodResult::default();
    while let Some(done) = tasks.join_next().await {
        let done = done.expect("a flood task panicked");
        for (code, n) in done.codes {
            *total.codes.entry(code).or_default() += n;
        }
        total.reconnects += done.reconnects;
    }
    total.elapsed = started.elapsed();
    total
}

/// One kept-alive connection, sending requests one after another until the deadline or an error.
async fn connection(
    connector: &tokio_rustls::TlsConnector,
    source: IpAddr,
    port: u16,
    counter: &AtomicU64,
    deadline: Instant,
    result: &mut FloodResult,
) -> std::io::Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let tcp = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await?;
    let name = ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await?;
    let mut stream = BufReader::new(tls);
    while Instant::now() < deadline {
        let i = counter.fetch_add(1, Ordering::Relaxed);
        let token = if i % 2 == 1 {
            format!("Authorization: Bearer flood-{i}\r\n")
        } else {
            String::new()
        };
        let request = format!("GET /flood/{i} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{token}\r\n");
        stream.get_mut().write_all(request.as_bytes()).await?;
        // Status line, headers, then Content-Length bytes of body.
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let code: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let mut length = 0usize;
        let mut close = false;
        loop {
            line.clear();
            if stream.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let lower = header.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            if lower == "connection: close" {
                close = true;
            }
        }
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await?;
        *result.codes.entry(code).or_default() += 1;
        if close {
            return Ok(());
        }
    }
    Ok(())
}
