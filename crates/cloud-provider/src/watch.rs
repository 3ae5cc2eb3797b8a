//! Re-reading a cloud-config file when it changes, for providers whose config may change at runtime.
//!
//! A plain polling thread: a cloud-config is small, a read every 200 ms costs nothing, and polling sees
//! what inotify-style watchers miss (editors that replace the file, the symlink swap of a mounted
//! ConfigMap). The watcher never dies of a bad edit: an edit the provider refuses is logged and
//! ignored, a panic while handling one (which no input should cause) is caught and logged too, and a
//! later edit is read as usual.

use std::{
    any::Any,
    panic::AssertUnwindSafe,
    path::PathBuf,
    sync::{Arc, Weak},
    time::Duration,
};

/// How often the file is read.
pub const POLL: Duration = Duration::from_millis(200);

/// Watches `path`, whose contents were `seen` when the provider read it, for as long as `owner` (the
/// provider's state) lives. Each time the contents change, `apply` gets the owner and the new bytes; it
/// puts them in force, or returns why not (the last good config then stays, and the error is logged
/// naming `provider` and the file). A watcher that cannot start is logged; the provider runs on.
pub fn watch_cloud_config<T, F>(
    provider: &'static str,
    owner: Weak<T>,
    path: PathBuf,
    mut seen: Vec<u8>,
    mut apply: F,
) where
    T: Send + Sync + 'static,
    F: FnMut(Arc<T>, &[u8]) -> Result<(), String> + Send + 'static,
{
    let spawned = std::thread::Builder::new()
        .name(format!("{provider}-cloud-config"))
        .spawn(move || {
            while let Some(owner) = owner.upgrade() {
                match std::fs::read(&path) {
                    Ok(contents) if contents != seen => {
                        // `seen` is updated first, so an edit that panics is not retried.
                        seen = contents;
                        let applied =
                            std::panic::catch_unwind(AssertUnwindSafe(|| apply(owner, &seen)));
                        match applied {
                            Ok(Ok(())) => tracing::info!(
                                provider,
                                path = %path.display(),
                                "cloud-config changed, reloaded"
                            ),
                            Ok(Err(err)) => tracing::error!(
                                provider,
                                path = %path.display(),
                                error = %err,
                                "ignoring the changed cloud-config, keeping the last good one"
                            ),
                            Err(panic) => tracing::error!(
                                provider,
                                path = %path.display(),
                                panic = %panic_message(panic.as_ref()),
                                "handling the changed cloud-config panicked; ignoring that edit, keeping the last good config"
                            ),
                        }
                    }
                    Ok(_) => drop(owner),
                    Err(err) => {
                        drop(owner);
                        tracing::debug!(provider, path = %path.display(), error = %err, "cannot read the cloud-config");
                    }
                }
                std::thread::sleep(POLL);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(provider, error = %err, "cannot start the cloud-config watcher; changes will not be seen");
    }
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn changes_are_applied_refusals_and_panics_survived_and_it_ends_with_its_owner() {
        let dir = std::env::temp_dir().join(format!("ccm-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cloud-config");
        std::fs::write(&path, "one").unwrap();
        let owner = Arc::new(Mutex::new(String::from("one")));
        watch_cloud_config(
            "test",
            Arc::downgrade(&owner),
            path.clone(),
            b"one".to_vec(),
            |owner: Arc<Mutex<String>>, contents: &[u8]| {
                let text = String::from_utf8_lossy(contents).into_owned();
                if text == "panic" {
                    panic!("a bug in the provider");
                }
                if text == "bad" {
                    return Err("line 1: bad".to_owned());
                }
                *owner.lock().unwrap() = text;
                Ok(())
            },
        );
        let value = || owner.lock().unwrap().clone();
        std::fs::write(&path, "two").unwrap();
        wait_for("two", || value() == "two");
        std::fs::write(&path, "bad").unwrap();
        std::thread::sleep(POLL * 3);
        assert_eq!(value(), "two", "a refused edit keeps the last good one");
        std::fs::write(&path, "panic").unwrap();
        std::thread::sleep(POLL * 3);
        std::fs::write(&path, "three").unwrap();
        wait_for("three after a panic", || value() == "three");
        let weak = Arc::downgrade(&owner);
        drop(owner);
        std::thread::sleep(POLL * 3);
        assert!(
            weak.upgrade().is_none(),
            "the watcher holds no owner between polls"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
