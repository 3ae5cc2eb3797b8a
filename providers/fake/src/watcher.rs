//! Re-reads the cloud-config file when it changes, and writes what changed since the last write (call
//! counts, and with `stateFileBatched` everything) to the state file.
//!
//! A plain polling thread: the file is tiny, a read every 200 ms costs nothing, and polling works on
//! every filesystem (including the bind-mounted ConfigMaps and editors that replace files), where
//! inotify-style watchers miss renames and symlink swaps.

use std::{path::PathBuf, sync::Weak, time::Duration};

use crate::{Config, FakeCloud, Inner};

const POLL: Duration = Duration::from_millis(200);

/// Watches `path` (whose contents were `seen` at start) for as long as the cloud lives.
pub(crate) fn spawn(cloud: Weak<Inner>, path: PathBuf, mut seen: Vec<u8>) {
    let spawned = std::thread::Builder::new()
        .name("fake-cloud-watch".to_owned())
        .spawn(move || {
            while let Some(inner) = cloud.upgrade() {
                let cloud = FakeCloud { inner };
                match std::fs::read(&path) {
                    Ok(contents) if contents != seen => {
                        seen = contents;
                        let parsed = std::str::from_utf8(&seen)
                            .map_err(|err| format!("not UTF-8 text: {err}"))
                            .and_then(|text| Config::parse(text, Some(&path)).map_err(|err| err.to_string()));
                        match parsed {
                            Ok(config) => {
                                tracing::info!(path = %path.display(), "fake cloud: cloud-config changed, reloaded");
                                cloud.set_config(config);
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, "fake cloud: ignoring the changed cloud-config, keeping the last good one");
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::debug!(path = %path.display(), error = %err, "fake cloud: cannot read the cloud-config");
                    }
                }
                drop(cloud);
                std::thread::sleep(POLL);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "fake cloud: cannot start the cloud-config watcher; changes will not be seen");
    }
}

/// Writes the state file when something changed since the last write, for as long as the cloud lives.
pub(crate) fn spawn_flusher(cloud: Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("fake-cloud-flush".to_owned())
        .spawn(move || {
            while let Some(inner) = cloud.upgrade() {
                flush_dirty(&FakeCloud { inner });
                std::thread::sleep(POLL);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "fake cloud: cannot start the state-file writer");
    }
}

/// Call counts change on every call; rather than rewrite the file on each, they go out within one poll.
fn flush_dirty(cloud: &FakeCloud) {
    if let Err((path, err)) = cloud.inner.flush(|dirty| dirty) {
        tracing::warn!(path = %path.display(), error = %err, "fake cloud: cannot write the state file");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use cloud_provider::{CloudConfig, CloudProvider};
    use k8s_openapi::api::core::v1::Node;

    use crate::{CloudState, FakeCloud};

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(3),
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[tokio::test]
    async fn a_changed_file_is_reloaded_within_a_second_and_a_broken_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("cloud.yaml");
        let state_path = dir.path().join("state.json");
        std::fs::write(
            &config_path,
            format!("stateFile: {}\n", state_path.display()),
        )
        .unwrap();
        let cloud =
            FakeCloud::from_cloud_config(&CloudConfig::read(&config_path).unwrap()).unwrap();
        let mut node = Node::default();
        node.metadata.name = Some("node-a".into());
        assert!(
            cloud
                .instances_v2()
                .unwrap()
                .instance_exists(&node)
                .await
                .unwrap()
        );

        // The instance vanishes and a blackhole route appears.
        std::fs::write(
            &config_path,
            format!(
                "stateFile: {}\ninstances:\n  node-a: {{state: gone}}\nroutes:\n  initial: [{{name: bh, destinationCIDR: 10.1.0.0/24, blackhole: true}}]\n",
                state_path.display()
            ),
        )
        .unwrap();
        let changed_at = Instant::now();
        wait_for("the reload", || {
            cloud.config().instances.contains_key("node-a")
        });
        assert!(changed_at.elapsed() < std::time::Duration::from_secs(1));
        assert!(
            !cloud
                .instances_v2()
                .unwrap()
                .instance_exists(&node)
                .await
                .unwrap()
        );
        wait_for("the route in the state file", || {
            CloudState::read(&state_path).is_ok_and(|s| s.routes.iter().any(|r| r.name == "bh"))
        });

        // A malformed edit is ignored: the last good config stays.
        std::fs::write(&config_path, "instances: [\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert!(cloud.config().instances.contains_key("node-a"));

        // Call counts reach the state file without any state change.
        wait_for("call counts in the state file", || {
            CloudState::read(&state_path).is_ok_and(|s| s.calls_to("instance_exists") == 2)
        });
    }
}
