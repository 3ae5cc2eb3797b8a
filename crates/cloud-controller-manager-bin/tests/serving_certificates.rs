//! The serving certificate from `--tls-cert-file`/`--tls-private-key-file` is reloaded when the files
//! change, as upstream's dynamiccertificates does: rewritten in place, replaced by a rename, or swapped in
//! the way the kubelet updates a Secret volume. Unusable files leave the current pair in force and the
//! manager running. Each test runs the real binary and checks the certificate new TLS connections get.

mod support;

use std::{
    io::Write as _,
    net::TcpStream,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use support::{SERIAL, eventually, free_port, https_get, replica::Replica};
use test_control_plane::control_plane;

const WAIT: Duration = Duration::from_secs(30);
const RELOADED: &str = "Loaded a new cert/key pair";
const REJECTED: &str = "cannot load the changed serving certificate; keeping the current one";

/// A certificate and its key, PEM, and the certificate's DER to compare with what is served.
struct Pair {
    cert: String,
    key: String,
    der: Vec<u8>,
}

fn pair() -> Pair {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    Pair {
        cert: generated.cert.pem(),
        key: generated.signing_key.serialize_pem(),
        der: generated.cert.der().to_vec(),
    }
}

/// Accepts whatever certificate the server shows (the test compares it afterwards) but still checks
/// the handshake signature, so the server proves it holds the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The certificate a new TLS connection to `127.0.0.1:<port>` gets (DER), after a full handshake.
fn served_certificate_blocking(port: u16) -> Result<Vec<u8>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap().to_owned();
    let mut tls =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut socket = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut socket).map_err(|e| e.to_string())?;
    }
    let served = tls
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.to_vec())
        .ok_or("the server showed no certificate")?;
    tls.send_close_notify();
    let _ = tls.complete_io(&mut socket);
    Ok(served)
}

async fn served_certificate(port: u16) -> Result<Vec<u8>, String> {
    tokio::task::spawn_blocking(move || served_certificate_blocking(port))
        .await
        .unwrap()
}

/// Writes `content` over `path` in place (same inode: truncate, then write).
fn write_in_place(path: &Path, content: &str) {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    file.write_all(content.as_bytes()).unwrap();
    file.sync_all().unwrap();
}

/// Replaces `path` by a rename of a new file over it, as cert-manager's and most tools' atomic writes do.
fn write_by_rename(path: &Path, content: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, content).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// The manager binary serving on a free port with `cert`/`key`; no leader election (the Lease is other
/// tests' business).
struct Serving {
    replica: Replica,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Serving {
    async fn start(cert: &Path, key: &Path) -> Self {
        test_control_plane::apply_shipped_rbac().await;
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let args = [
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
            "--leader-elect=false".to_owned(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let replica = Replica::start_with(dir.path(), 0, &control_plane().ccm_kubeconfig(), &args);
        let serving = Self {
            replica,
            port,
            _dir: dir,
        };
        eventually("the secure endpoint", WAIT, || async {
            (https_get(port, "/healthz", None).await.0 == 200).then_some(())
        })
        .await;
        serving
    }

    fn count(&self, line: &str) -> usize {
        self.replica.log().matches(line).count()
    }

    /// Waits until new connections get `der`; returns how long that took.
    async fn wait_served(&self, der: &[u8], what: &str) -> Duration {
        let started = Instant::now();
        eventually(what, WAIT, || async {
            (served_certificate(self.port).await.ok()? == der).then_some(())
        })
        .await;
        started.elapsed()
    }

    /// Waits until the manager has logged one more rejection than `before`.
    async fn wait_rejected(&self, before: usize, what: &str) {
        eventually(what, WAIT, || async {
            (self.count(REJECTED) > before).then_some(())
        })
        .await;
    }

    /// Checks the manager still runs and serves `der` on new connections, with health ok.
    async fn assert_serving(&mut self, der: &[u8], context: &str) {
        assert_eq!(
            self.replica.exited(),
            None,
            "the manager exited {context}:\n{}",
            self.replica.log()
        );
        assert_eq!(
            served_certificate(self.port).await.unwrap(),
            der,
            "{context}: not the expected certificate"
        );
        assert_eq!(
            https_get(self.port, "/healthz", None).await,
            (200, "ok".to_owned()),
            "{context}"
        );
    }
}

#[tokio::test]
async fn the_serving_certificate_follows_its_files_and_unusable_files_keep_the_current_one() {
    let _serial = SERIAL.lock().await;
    let files = tempfile::tempdir().unwrap();
    let (cert, key) = (files.path().join("tls.crt"), files.path().join("tls.key"));
    let first = pair();
    std::fs::write(&cert, &first.cert).unwrap();
    std::fs::write(&key, &first.key).unwrap();
    let mut serving = Serving::start(&cert, &key).await;
    serving.assert_serving(&first.der, "at start").await;

    // Rewritten in place (same inodes).
    let second = pair();
    write_in_place(&cert, &second.cert);
    write_in_place(&key, &second.key);
    let in_place = serving
        .wait_served(&second.der, "the certificate rewritten in place")
        .await;
    eventually("the reload logged at info", WAIT, || async {
        (serving.count(RELOADED) >= 1).then_some(())
    })
    .await;
    serving
        .assert_serving(&second.der, "after an in-place rewrite")
        .await;

    // Replaced by renames over the files (new inodes): key first, then certificate.
    let third = pair();
    write_by_rename(&key, &third.key);
    write_by_rename(&cert, &third.cert);
    let renamed = serving
        .wait_served(&third.der, "the certificate replaced by rename")
        .await;
    serving.assert_serving(&third.der, "after a rename").await;

    // A new certificate whose key never comes: refused, the current pair stays.
    let rejected = serving.count(REJECTED);
    let logged = serving.replica.log().len();
    write_by_rename(&cert, &pair().cert);
    serving
        .wait_rejected(rejected, "the mismatched key to be refused")
        .await;
    let log = serving.replica.log()[logged..].to_owned();
    assert!(
        log.contains("does not match the certificate in --tls-cert-file"),
        "{log}"
    );
    serving
        .assert_serving(&third.der, "after a certificate without its key")
        .await;

    // Garbage: refused with the file named, the current pair stays, the manager keeps running.
    let rejected = serving.count(REJECTED);
    let logged = serving.replica.log().len();
    write_in_place(&cert, "garbage\n");
    write_in_place(&key, "more garbage\n");
    serving
        .wait_rejected(rejected, "the garbage to be refused")
        .await;
    let log = serving.replica.log()[logged..].to_owned();
    assert!(
        log.contains(&format!("--tls-cert-file {}", cert.display())),
        "{log}"
    );
    serving.assert_serving(&third.der, "after garbage").await;

    // A good pair after the garbage is served again.
    let fourth = pair();
    write_by_rename(&key, &fourth.key);
    write_by_rename(&cert, &fourth.cert);
    serving
        .wait_served(&fourth.der, "a good pair after garbage")
        .await;
    serving.assert_serving(&fourth.der, "after recovery").await;
    eprintln!(
        "certificate reload: rewritten in place, served after {in_place:?}; replaced by rename, \
         served after {renamed:?}; the same process throughout"
    );
}

/// A Secret volume as the kubelet writes it: the files are symlinks into `..data`, itself a symlink to
/// a timestamped directory; an update writes a new directory and renames a new `..data` over the old.
struct SecretVolume {
    dir: PathBuf,
    generation: usize,
}

impl SecretVolume {
    fn new(dir: &Path, pair: &Pair) -> Self {
        let mut volume = Self {
            dir: dir.to_owned(),
            generation: 0,
        };
        volume.update(pair);
        for file in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(file), dir.join(file)).unwrap();
        }
        volume
    }

    fn update(&mut self, pair: &Pair) {
        self.generation += 1;
        let data = format!("..2026_11_23_{:02}", self.generation);
        let target = self.dir.join(&data);
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("tls.crt"), &pair.cert).unwrap();
        std::fs::write(target.join("tls.key"), &pair.key).unwrap();
        let staged = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&data, &staged).unwrap();
        std::fs::rename(&staged, self.dir.join("..data")).unwrap();
        if self.generation > 1 {
            let old = format!("..2026_11_23_{:02}", self.generation - 1);
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

#[tokio::test]
async fn a_secret_volume_update_is_served_without_a_restart() {
    let _serial = SERIAL.lock().await;
    let files = tempfile::tempdir().unwrap();
    let first = pair();
    let mut volume = SecretVolume::new(files.path(), &first);
    let mut serving =
        Serving::start(&files.path().join("tls.crt"), &files.path().join("tls.key")).await;
    serving.assert_serving(&first.der, "at start").await;

    let second = pair();
    volume.update(&second);
    let took = serving
        .wait_served(&second.der, "the certificate of the updated Secret")
        .await;
    serving
        .assert_serving(&second.der, "after the Secret update")
        .await;

    let third = pair();
    volume.update(&third);
    serving
        .wait_served(&third.der, "the certificate of the second update")
        .await;
    serving
        .assert_serving(&third.der, "after the second update")
        .await;
    eprintln!("certificate reload: Secret volume update served after {took:?}");
}
