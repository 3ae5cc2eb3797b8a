//! Re-reads the cloud-config file when it changes, and writes what changed since the last write (call
//! counts, and with `stateFileBatched` everything) to the state file.
//!
//! Both poll (the contract's `cloud_provider::watch_cloud_config` for the cloud-config): a read every
//! 200 ms costs nothing and sees the renames and symlink swaps that inotify-style watchers miss. The
//! state file is written every `stateFileFlushInterval` (200 ms by default), when something changed.

use std::{
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::Weak,
};

use cloud_provider::{CloudConfig, panic_message};

use crate::{Config, FakeCloud, Inner};

/// Turns the bytes of the cloud-config file into a config, or says why not.
type Parse = fn(&[u8], &Path) -> Result<Config, String>;

fn parse_file(contents: &[u8], path: &Path) -> Result<Config, String> {
    let text = std::str::from_utf8(contents).map_err(|err| format!("not UTF-8 text: {err}"))?;
    Config::parse(text, Some(path)).map_err(|err| err.to_string())
}

/// Watches the file `config` came from, if any, for as long as the cloud lives.
pub(crate) fn spawn(cloud: Weak<Inner>, config: &CloudConfig) {
    if let Some(path) = config.path() {
        let seen = config.contents().unwrap_or_default().to_vec();
        spawn_with(cloud, path.to_owned(), seen, parse_file);
    }
}

/// [`spawn`] with the parser given (`cloud_provider::watch_cloud_config`: a refused or panicking edit
/// is logged and ignored, and a later one read as usual).
fn spawn_with(cloud: Weak<Inner>, path: PathBuf, seen: Vec<u8>, parse: Parse) {
    let file = path.clone();
    cloud_provider::watch_cloud_config("fake", cloud, path, seen, move |inner, contents| {
        let config = parse(contents, &file)?;
        FakeCloud { inner }
            .try_set_config(config)
            .map_err(|err| err.to_string())
    });
}

/// Writes the state file when something changed since the last write, for as long as the cloud lives.
pub(crate) fn spawn_flusher(cloud: Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("fake-cloud-flush".to_owned())
        .spawn(move || {
            while let Some(inner) = cloud.upgrade() {
                // Call counts change on every call; rather than rewrite the file on each, they go out
                // within one poll. A panic here must not stop later writes either.
                if let Err(panic) =
                    std::panic::catch_unwind(AssertUnwindSafe(|| inner.flush_pending()))
                {
                    tracing::error!(panic = %panic_message(panic.as_ref()), "fake cloud: writing the state file panicked; trying again at the next poll");
                }
                let interval = inner.config().flush_interval();
                drop(inner);
                std::thread::sleep(interval);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "fake cloud: cannot start the state-file writer");
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::Path,
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::Instant,
    };

    use cloud_provider::{CloudConfig, CloudProvider};
    use k8s_openapi::api::core::v1::Node;

    use super::{parse_file, spawn_with};
    use crate::{CloudState, Config, FakeCloud, GoDuration};

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

    /// Replaces the file at once (as editors and ConfigMap updates do), so the watcher never reads
    /// half an edit.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// A cloud whose config file `dir/cloud.yaml` is watched with `parse`.
    fn watched(dir: &Path, parse: super::Parse) -> (FakeCloud, std::path::PathBuf) {
        let path = dir.join("cloud.yaml");
        std::fs::write(&path, "latency: 1ms\n").unwrap();
        let cloud = FakeCloud::new(Config::parse("latency: 1ms\n", None).unwrap()).unwrap();
        spawn_with(
            Arc::downgrade(&cloud.inner),
            path.clone(),
            std::fs::read(&path).unwrap(),
            parse,
        );
        (cloud, path)
    }

    fn latency(cloud: &FakeCloud) -> std::time::Duration {
        cloud.config().latency.0
    }

    static OUT_OF_RANGE_EDITS_READ: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn a_duration_past_gos_range_is_ignored_and_a_later_valid_edit_takes_effect() {
        fn counting(contents: &[u8], path: &Path) -> Result<Config, String> {
            OUT_OF_RANGE_EDITS_READ.fetch_add(1, Ordering::SeqCst);
            parse_file(contents, path)
        }
        let dir = tempfile::tempdir().unwrap();
        let (cloud, path) = watched(dir.path(), counting);

        replace(&path, "latency: 18446744073709551616s\n");
        wait_for("the out-of-range edit to be read", || {
            OUT_OF_RANGE_EDITS_READ.load(Ordering::SeqCst) >= 1
        });
        assert_eq!(latency(&cloud), std::time::Duration::from_millis(1));

        replace(&path, "latency: 7ms\n");
        wait_for("the valid edit", || {
            latency(&cloud) == std::time::Duration::from_millis(7)
        });
    }

    static PANICKING_EDITS_READ: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn a_panic_while_handling_an_edit_does_not_stop_the_watcher() {
        fn panicking(contents: &[u8], path: &Path) -> Result<Config, String> {
            PANICKING_EDITS_READ.fetch_add(1, Ordering::SeqCst);
            if contents.starts_with(b"# boom") {
                panic!("a parser bug");
            }
            parse_file(contents, path)
        }
        let dir = tempfile::tempdir().unwrap();
        let (cloud, path) = watched(dir.path(), panicking);

        replace(&path, "# boom\nlatency: 3ms\n");
        wait_for("the panicking edit to be read", || {
            PANICKING_EDITS_READ.load(Ordering::SeqCst) >= 1
        });
        replace(&path, "latency: 9ms\n");
        wait_for("the valid edit after the panic", || {
            latency(&cloud) == std::time::Duration::from_millis(9)
        });
        assert_eq!(
            PANICKING_EDITS_READ.load(Ordering::SeqCst),
            2,
            "the panicking edit was read again"
        );
    }

    #[test]
    fn an_edit_the_running_cloud_cannot_take_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let config_path = dir.path().join("cloud.yaml");
        let shared = format!("stateFile: {}\nstateFileShared: true\n", state.display());
        std::fs::write(&config_path, &shared).unwrap();
        let cloud =
            FakeCloud::from_cloud_config(&CloudConfig::read(&config_path).unwrap()).unwrap();

        // Unsharing needs a restart; the latency in the same edit is not applied either.
        replace(
            &config_path,
            &format!("stateFile: {}\nlatency: 4ms\n", state.display()),
        );
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert!(cloud.config().state_file_shared);
        assert_eq!(cloud.config().latency, GoDuration::default());

        replace(&config_path, &format!("{shared}latency: 4ms\n"));
        wait_for("the valid edit", || {
            latency(&cloud) == std::time::Duration::from_millis(4)
        });
    }
}
