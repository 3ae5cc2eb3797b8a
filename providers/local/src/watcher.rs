//! Re-reads the cloud-config file when it changes.
//!
//! A polling thread, as the fake cloud's: the file is small, a read every 200 ms costs nothing, and
//! polling sees the renames and symlink swaps of editors and mounted ConfigMaps that inotify misses.
//! A malformed edit is ignored (the last good config stays), logged as an error and, once `initialize`
//! gave the cloud a client, recorded as a Warning event `CloudConfigRejected` in `kube-system`; a later
//! edit is read as usual. Nothing else stops.

use std::{
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::Weak,
    time::Duration,
};

use crate::{Config, Inner, LocalCloud};

const POLL: Duration = Duration::from_millis(200);

/// Watches `path` (whose contents were `seen` at start) for as long as the cloud lives.
pub(crate) fn spawn(cloud: Weak<Inner>, path: PathBuf, mut seen: Vec<u8>) {
    let spawned = std::thread::Builder::new()
        .name("local-cloud-watch".to_owned())
        .spawn(move || {
            while let Some(inner) = cloud.upgrade() {
                let cloud = LocalCloud { inner };
                let polled =
                    std::panic::catch_unwind(AssertUnwindSafe(|| poll(&cloud, &path, &mut seen)));
                if polled.is_err() {
                    tracing::error!(path = %path.display(), "local cloud: handling the changed cloud-config panicked; keeping the last good config");
                }
                drop(cloud);
                std::thread::sleep(POLL);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "local cloud: cannot start the cloud-config watcher; changes will not be seen");
    }
}

/// One look at the file: a changed one is parsed and, when good, put in force.
fn poll(cloud: &LocalCloud, path: &Path, seen: &mut Vec<u8>) {
    match std::fs::read(path) {
        Ok(contents) if contents != *seen => {
            *seen = contents;
            let parsed = match std::str::from_utf8(seen) {
                Ok(text) => Config::parse(text, Some(path)).map_err(|e| e.to_string()),
                Err(err) => Err(format!(
                    "cloud-config {} is not UTF-8 text: {err}",
                    path.display()
                )),
            };
            match parsed {
                Ok(config) => {
                    cloud.set_config(config);
                    tracing::info!(path = %path.display(), "local cloud: cloud-config changed, reloaded");
                }
                Err(err) => {
                    tracing::error!(error = %err, "local cloud: ignoring the changed cloud-config, keeping the last good one");
                    cloud.report_rejected_config(&format!(
                        "the changed cloud-config was refused; the last good one stays in force: {err}"
                    ));
                }
            }
        }
        Ok(_) => {}
        Err(err) => {
            tracing::debug!(path = %path.display(), error = %err, "local cloud: cannot read the cloud-config");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use cloud_provider::CloudConfig;

    use crate::LocalCloud;

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn replace(path: &std::path::Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[tokio::test]
    async fn a_changed_file_is_reloaded_and_a_broken_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cloud.yaml");
        std::fs::write(&path, "machines:\n  a: {}\n").unwrap();
        let cloud = LocalCloud::from_cloud_config(&CloudConfig::read(&path).unwrap()).unwrap();
        assert!(cloud.config().machines.contains_key("a"));

        replace(&path, "machines:\n  b: {}\n");
        wait_for("the reload", || cloud.config().machines.contains_key("b"));

        replace(&path, "machines: [\n");
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert!(
            cloud.config().machines.contains_key("b"),
            "the last good config stays"
        );

        replace(&path, "machines:\n  c: {}\n");
        wait_for("a good edit after a bad one", || {
            cloud.config().machines.contains_key("c")
        });
    }

    #[test]
    fn a_malformed_file_at_start_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cloud.yaml");
        std::fs::write(&path, "machines:\n  a:\n    zone: [\n").unwrap();
        let err = LocalCloud::from_cloud_config(&CloudConfig::read(&path).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("line"),
            "{err}"
        );
    }
}
