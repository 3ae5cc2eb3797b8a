//! Re-reads the cloud-config file when it changes.
//!
//! The contract's polling watcher (`cloud_provider::watch_cloud_config`). A malformed edit is ignored (the last good config stays), logged as an error and, once `initialize`
//! gave the cloud a client, recorded as a Warning event `CloudConfigRejected` in `kube-system`; a later
//! edit is read as usual. Nothing else stops.

use std::sync::Weak;

use cloud_provider::CloudConfig;

use crate::{Config, Inner, LocalCloud};

/// Watches the file `config` came from, if any, for as long as the cloud lives
/// (`cloud_provider::watch_cloud_config`): a good edit is put in force, a refused one is also reported
/// as an event.
pub(crate) fn spawn(cloud: Weak<Inner>, config: &CloudConfig) {
    let Some(path) = config.path() else {
        return;
    };
    let (file, seen) = (
        path.to_owned(),
        config.contents().unwrap_or_default().to_vec(),
    );
    cloud_provider::watch_cloud_config(
        "local",
        cloud,
        file.clone(),
        seen,
        move |inner, contents| {
            let cloud = LocalCloud { inner };
            let parsed = match std::str::from_utf8(contents) {
                Ok(text) => Config::parse(text, Some(&file)).map_err(|e| e.to_string()),
                Err(err) => Err(format!(
                    "cloud-config {} is not UTF-8 text: {err}",
                    file.display()
                )),
            };
            match parsed {
                Ok(config) => {
                    cloud.set_config(config);
                    Ok(())
                }
                Err(err) => {
                    cloud.report_rejected_config(&format!(
                    "the changed cloud-config was refused; the last good one stays in force: {err}"
                ));
                    Err(err)
                }
            }
        },
    );
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
