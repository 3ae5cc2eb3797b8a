//! The serving certificate from `--tls-cert-file`/`--tls-private-key-file`, reloaded when the files
//! change (upstream: k8s.io/apiserver `dynamiccertificates.DynamicCertKeyPairContent`): edited in place,
//! replaced by a rename, or swapped in by a Secret volume update (the kubelet re-points a `..data`
//! symlink) or cert-manager. New TLS connections get the new pair; connections already open keep theirs.
//!
//! A new pair is used only when it parses and the key matches the certificate; otherwise the error is
//! logged and the pair in force stays, as upstream does. The files are read when they change and, as
//! upstream's resync does, once a minute regardless.
//!
//! Why polling rather than inotify: a Secret volume never writes the files the flags name. The kubelet
//! writes a new directory and renames a `..data` symlink over the old one, so an inotify watch on the
//! file (or its directory) sees nothing, or loses its inode and must be re-established (upstream's
//! fsnotify code re-adds watches after every remove/rename event, and resyncs every minute because that
//! is still racy). A `stat` of two files once a second follows symlinks, sees renames (new inode) and
//! in-place writes (size, mtime, ctime), costs next to nothing, and needs no extra crate or descriptors.

use parking_lot::RwLock;
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use rustls::{
    Error as TlsError, InconsistentKeys,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio_util::sync::CancellationToken;

/// How often the files are checked for a change.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How often the files are read even when nothing about them seems to have changed (upstream's
/// dynamiccertificates resync period), for changes a `stat` cannot see (same size, same timestamps).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(60);

/// The two files of a serving certificate, as the flags name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKeyFiles {
    /// `--tls-cert-file`: the certificate, then any intermediates, PEM.
    pub cert_file: PathBuf,
    /// `--tls-private-key-file`: the key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// The bytes of both files, to tell a real change from a touch.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKeyContent {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl fmt::Debug for CertKeyContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("CertKeyContent")
            .field("cert_len", &self.cert.len())
            .field("key_len", &self.key.len())
            .finish()
    }
}

impl CertKeyFiles {
    /// Reads both files.
    pub fn read(&self) -> Result<CertKeyContent, String> {
        let cert = std::fs::read(&self.cert_file)
            .map_err(|err| format!("--tls-cert-file {}: {err}", self.cert_file.display()))?;
        let key = std::fs::read(&self.key_file)
            .map_err(|err| format!("--tls-private-key-file {}: {err}", self.key_file.display()))?;
        Ok(CertKeyContent { cert, key })
    }

    /// Parses `content` (read from these files) into a pair rustls can serve: at least one certificate,
    /// a private key `provider` supports, and the key must belong to the first certificate.
    pub fn parse(
        &self,
        content: &CertKeyContent,
        provider: &CryptoProvider,
    ) -> Result<CertifiedKey, String> {
        let cert_err =
            |err: &dyn fmt::Display| format!("--tls-cert-file {}: {err}", self.cert_file.display());
        let key_err = |err: &dyn fmt::Display| {
            format!("--tls-private-key-file {}: {err}", self.key_file.display())
        };
        let certs = CertificateDer::pem_slice_iter(&content.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| cert_err(&err))?;
        if certs.is_empty() {
            return Err(cert_err(&"no PEM CERTIFICATE block"));
        }
        let key = PrivateKeyDer::from_pem_slice(&content.key).map_err(|err| key_err(&err))?;
        let key = provider
            .key_provider
            .load_private_key(key)
            .map_err(|err| key_err(&err))?;
        let certified = CertifiedKey::new(certs, key);
        match certified.keys_match() {
            // rustls cannot tell for some key types; the handshake would then fail, as Go's would not
            // have let it load. Every key type the ring provider loads can be checked.
            Ok(()) | Err(TlsError::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
            Err(TlsError::InconsistentKeys(InconsistentKeys::KeyMismatch)) => Err(format!(
                "--tls-private-key-file {} does not match the certificate in --tls-cert-file {}",
                self.key_file.display(),
                self.cert_file.display()
            )),
            Err(err) => Err(cert_err(&err)),
        }
    }

    /// Reads and parses both files.
    pub fn load(
        &self,
        provider: &CryptoProvider,
    ) -> Result<(CertifiedKey, CertKeyContent), String> {
        let content = self.read()?;
        let certified = self.parse(&content, provider)?;
        Ok((certified, content))
    }
}

/// What `stat` says about a file (following symlinks): a change in any of these is worth a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    inode: (u64, u64, i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            // Device and inode change on a rename over the file or a symlink swap; ctime changes on any
            // write, even one that keeps size and mtime.
            #[cfg(unix)]
            inode: {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
            },
        })
    }
}

/// The pair served to new TLS connections; the reloader swaps it.
pub struct DynamicServingCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl fmt::Debug for DynamicServingCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicServingCertificate")
            .finish_non_exhaustive()
    }
}

impl DynamicServingCertificate {
    /// Serves `certified` until [`DynamicServingCertificate::set`] replaces it.
    pub fn new(certified: CertifiedKey) -> Self {
        Self {
            current: RwLock::new(Arc::new(certified)),
        }
    }

    /// The pair in force.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().clone()
    }

    /// Serves `certified` to every new connection.
    pub fn set(&self, certified: CertifiedKey) {
        *self.current.write() = Arc::new(certified);
    }
}

impl ResolvesServerCert for DynamicServingCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// What one check did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// Neither file changed (or they changed back to what is served).
    Unchanged,
    /// A new pair is served.
    Reloaded,
    /// The files changed but cannot be used; the pair in force stays. Logged once per change.
    Rejected(String),
    /// The same unusable content as the last rejection: not logged again.
    StillRejected,
}

/// Watches the files and swaps in a new pair when they change.
pub struct CertificateReloader {
    files: CertKeyFiles,
    provider: Arc<CryptoProvider>,
    serving: Arc<DynamicServingCertificate>,
    stamps: (Option<FileStamp>, Option<FileStamp>),
    loaded: CertKeyContent,
    rejected: Option<Result<CertKeyContent, String>>,
    last_read: Instant,
}

impl fmt::Debug for CertificateReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateReloader")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl CertificateReloader {
    /// Loads the pair (an error names the flag and file) and returns the reloader with the certificate
    /// it serves. The files are stamped before they are read, so a write racing with the first read is
    /// seen by the first check.
    pub fn load(files: CertKeyFiles, provider: Arc<CryptoProvider>) -> Result<Self, String> {
        let stamps = (
            FileStamp::of(&files.cert_file),
            FileStamp::of(&files.key_file),
        );
        let (certified, loaded) = files.load(&provider)?;
        Ok(Self {
            serving: Arc::new(DynamicServingCertificate::new(certified)),
            files,
            provider,
            stamps,
            loaded,
            rejected: None,
            last_read: Instant::now(),
        })
    }

    /// The certificate resolver to put in the TLS config.
    pub fn serving(&self) -> Arc<DynamicServingCertificate> {
        self.serving.clone()
    }

    /// Checks the files once: reads them if their stamps changed or a resync is due, and serves a new
    /// pair if their content changed and is usable. Blocking (file I/O).
    pub fn check(&mut self) -> CheckOutcome {
        let stamps = (
            FileStamp::of(&self.files.cert_file),
            FileStamp::of(&self.files.key_file),
        );
        let resync = self.last_read.elapsed() >= RESYNC_INTERVAL;
        if stamps == self.stamps && !resync {
            return CheckOutcome::Unchanged;
        }
        self.stamps = stamps;
        self.last_read = Instant::now();
        let content = match self.files.read() {
            Ok(content) => content,
            Err(err) => return self.reject(Err(err.clone()), err),
        };
        if content == self.loaded {
            self.rejected = None;
            return CheckOutcome::Unchanged;
        }
        match self.files.parse(&content, &self.provider) {
            Ok(certified) => {
                self.serving.set(certified);
                self.loaded = content;
                self.rejected = None;
                CheckOutcome::Reloaded
            }
            Err(err) => self.reject(Ok(content), err),
        }
    }

    fn reject(&mut self, what: Result<CertKeyContent, String>, err: String) -> CheckOutcome {
        if self.rejected.as_ref() == Some(&what) {
            return CheckOutcome::StillRejected;
        }
        self.rejected = Some(what);
        CheckOutcome::Rejected(err)
    }

    /// Checks the files every [`CHECK_INTERVAL`] until `shutdown` is cancelled, logging each reload (info)
    /// and each unusable change (error).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate; the files were just loaded
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            // Off the async workers: a stat or read of a file on a slow volume must not stall serving.
            let checked = tokio::task::spawn_blocking(move || {
                let outcome = self.check();
                (self, outcome)
            })
            .await;
            let outcome;
            (self, outcome) = match checked {
                Ok(checked) => checked,
                Err(err) => {
                    tracing::error!(error = %err, "the serving certificate check failed; certificates are no longer reloaded");
                    return;
                }
            };
            let (cert, key) = (
                self.files.cert_file.display(),
                self.files.key_file.display(),
            );
            match outcome {
                CheckOutcome::Reloaded => tracing::info!(
                    name = "serving-cert",
                    cert = %cert,
                    key = %key,
                    "Loaded a new cert/key pair"
                ),
                CheckOutcome::Rejected(err) => tracing::error!(
                    name = "serving-cert",
                    error = %err,
                    "cannot load the changed serving certificate; keeping the current one"
                ),
                CheckOutcome::Unchanged | CheckOutcome::StillRejected => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    struct Pair {
        cert: String,
        key: String,
        der: Vec<u8>,
    }

    fn pair(name: &str) -> Pair {
        let generated = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        Pair {
            cert: generated.cert.pem(),
            key: generated.signing_key.serialize_pem(),
            der: generated.cert.der().to_vec(),
        }
    }

    fn write(dir: &Path, pair: &Pair) -> CertKeyFiles {
        let files = CertKeyFiles {
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
        };
        std::fs::write(&files.cert_file, &pair.cert).unwrap();
        std::fs::write(&files.key_file, &pair.key).unwrap();
        files
    }

    fn served(reloader: &CertificateReloader) -> Vec<u8> {
        reloader.serving().current().cert[0].to_vec()
    }

    /// Forces the next check to read the files (a test may rewrite them within one timestamp tick).
    fn expire(reloader: &mut CertificateReloader) {
        reloader.stamps = (None, None);
    }

    #[test]
    fn a_changed_pair_is_served_and_an_unusable_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (pair("a"), pair("b"), pair("c"));
        let files = write(dir.path(), &a);
        let mut reloader = CertificateReloader::load(files.clone(), provider()).unwrap();
        assert_eq!(served(&reloader), a.der);
        assert_eq!(reloader.check(), CheckOutcome::Unchanged);

        write(dir.path(), &b);
        expire(&mut reloader);
        assert_eq!(reloader.check(), CheckOutcome::Reloaded);
        assert_eq!(served(&reloader), b.der);

        // A certificate with another pair's key: refused, logged once, the old pair stays.
        std::fs::write(&files.cert_file, &c.cert).unwrap();
        expire(&mut reloader);
        let CheckOutcome::Rejected(err) = reloader.check() else {
            panic!("a mismatched key was accepted")
        };
        assert!(err.contains("does not match the certificate"), "{err}");
        assert!(err.contains("tls.key") && err.contains("tls.crt"), "{err}");
        expire(&mut reloader);
        assert_eq!(reloader.check(), CheckOutcome::StillRejected);
        assert_eq!(served(&reloader), b.der);

        // Garbage: refused with the file named.
        std::fs::write(&files.cert_file, "garbage").unwrap();
        expire(&mut reloader);
        let CheckOutcome::Rejected(err) = reloader.check() else {
            panic!("garbage was accepted")
        };
        assert!(err.starts_with("--tls-cert-file "), "{err}");
        assert_eq!(served(&reloader), b.der);

        // Its key arrives: now the pair is whole.
        std::fs::write(&files.cert_file, &c.cert).unwrap();
        std::fs::write(&files.key_file, &c.key).unwrap();
        expire(&mut reloader);
        assert_eq!(reloader.check(), CheckOutcome::Reloaded);
        assert_eq!(served(&reloader), c.der);
    }

    #[test]
    fn a_rename_over_the_files_is_seen_without_forcing() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (pair("a"), pair("b"));
        let files = write(dir.path(), &a);
        let mut reloader = CertificateReloader::load(files.clone(), provider()).unwrap();
        let staging = tempfile::tempdir_in(dir.path()).unwrap();
        let staged = write(staging.path(), &b);
        std::fs::rename(&staged.cert_file, &files.cert_file).unwrap();
        std::fs::rename(&staged.key_file, &files.key_file).unwrap();
        // The inodes changed, so the stamps differ even within one timestamp tick.
        assert_eq!(reloader.check(), CheckOutcome::Reloaded);
        assert_eq!(served(&reloader), b.der);
        // Touching the files without changing them reloads nothing.
        std::fs::write(&files.cert_file, &b.cert).unwrap();
        expire(&mut reloader);
        assert_eq!(reloader.check(), CheckOutcome::Unchanged);
    }

    #[test]
    fn a_missing_file_is_an_error_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let files = write(dir.path(), &pair("a"));
        let mut reloader = CertificateReloader::load(files.clone(), provider()).unwrap();
        std::fs::remove_file(&files.key_file).unwrap();
        let CheckOutcome::Rejected(err) = reloader.check() else {
            panic!("a missing key was accepted")
        };
        assert!(err.starts_with("--tls-private-key-file "), "{err}");
        let missing = CertKeyFiles {
            cert_file: dir.path().join("nope.crt"),
            key_file: files.key_file,
        };
        let err = CertificateReloader::load(missing, provider())
            .expect_err("a missing file fails the start");
        assert!(err.starts_with("--tls-cert-file "), "{err}");
    }
}
