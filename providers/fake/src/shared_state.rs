//! The state file as the cloud itself (`stateFileShared`): several processes (manager replicas, a
//! restarted manager) use one file, and each change is made under an exclusive lock on a lock file
//! beside it (`<stateFile>.lock`), on the state as the file holds it.
//!
//! The lock file also holds a revision, a counter every writer bumps. A process remembers the revision
//! and the state file's identity (size, modification time, inode) it last read or wrote; when either
//! differs, another process (or a person) changed the file and it is read again. The revision catches
//! writes the file's identity cannot tell apart (a reused inode within one clock tick); the identity
//! catches edits and removals by hand. Readers take the lock shared, so they never see a revision
//! without the state written with it.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::CloudState;

/// Why the shared state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The state file or its lock file cannot be read, written or locked.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "read the fake cloud's stateFile".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The state file is not a state file the fake cloud wrote.
    #[error(
        "the fake cloud's stateFile {path} is malformed: {message} (it must be a JSON object as the \
         fake cloud writes it; delete the file to start an empty cloud)"
    )]
    Malformed {
        /// The state file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
}

impl From<StateFileError> for cloud_provider::CloudError {
    fn from(err: StateFileError) -> Self {
        cloud_provider::CloudError::other(format!("fake cloud: {err}"))
    }
}

/// How the files looked when this process last read or wrote the state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    /// The lock file's revision (`None`: empty or not a number, e.g. a new lock file).
    revision: Option<u64>,
    /// The state file's identity (`None`: no state file).
    identity: Option<Identity>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    len: u64,
    modified: Option<SystemTime>,
    /// Device and inode: each write renames a new file over the old one.
    inode: Option<(u64, u64)>,
}

/// One process's handle on a shared state file.
#[derive(Debug)]
pub(crate) struct SharedFile {
    path: PathBuf,
    lock_path: PathBuf,
    lock: File,
    /// What the state in memory was read from or written as; `None` until then, and after a failed
    /// write, so the next turn reads the file again.
    seen: Option<Stamp>,
}

impl SharedFile {
    /// Opens (creating it if needed) the lock file of the state file at `path`. The state file itself
    /// is read at the first turn.
    pub(crate) fn open(path: &Path) -> Result<Self, StateFileError> {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let lock = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|source| StateFileError::Io {
                action: "open the fake cloud's state lock file",
                path: lock_path.clone(),
                source,
            })?;
        Ok(Self {
            path: path.to_owned(),
            lock_path,
            lock,
            seen: None,
        })
    }

    /// Takes the lock exclusively, for a change; it is released when the guard is dropped.
    pub(crate) fn exclusive(&mut self) -> Result<Exclusive<'_>, StateFileError> {
        self.lock.lock().map_err(|source| self.lock_error(source))?;
        Ok(Exclusive(Held::new(self)?))
    }

    /// Takes the lock shared, to see what other processes changed; released when the guard is dropped.
    pub(crate) fn shared(&mut self) -> Result<Shared<'_>, StateFileError> {
        self.lock
            .lock_shared()
            .map_err(|source| self.lock_error(source))?;
        Ok(Shared(Held::new(self)?))
    }

    fn lock_error(&self, source: std::io::Error) -> StateFileError {
        StateFileError::Io {
            action: "lock the fake cloud's state lock file",
            path: self.lock_path.clone(),
            source,
        }
    }

    fn stamp(&mut self) -> Result<Stamp, StateFileError> {
        let mut text = String::new();
        let read = (&self.lock)
            .seek(SeekFrom::Start(0))
            .and_then(|_| (&self.lock).read_to_string(&mut text));
        // Not text or not a number: no revision; the next write gives it one.
        if let Err(source) = read
            && source.kind() != std::io::ErrorKind::InvalidData
        {
            return Err(StateFileError::Io {
                action: "read the fake cloud's state lock file",
                path: self.lock_path.clone(),
                source,
            });
        }
        Ok(Stamp {
            revision: text.trim().parse().ok(),
            identity: identity(&self.path)?,
        })
    }

    /// The state as the file holds it (`None`: no file, an empty cloud), remembered as seen.
    fn read(&mut self, stamp: &Stamp) -> Result<Option<CloudState>, StateFileError> {
        let state = read_state(&self.path)?;
        self.seen = Some(stamp.clone());
        Ok(state)
    }
}

/// The lock held; released on drop.
struct Turn<'a> {
    file: &'a mut SharedFile,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Err(err) = self.file.lock.unlock() {
            // Closing the file would release it; the handle lives as long as the cloud, so say so.
            tracing::warn!(path = %self.file.lock_path.display(), error = %err, "fake cloud: cannot unlock the state lock file");
        }
    }
}

/// The lock held, with the file's stamp when it was taken.
struct Held<'a> {
    turn: Turn<'a>,
    stamp: Stamp,
}

impl<'a> Held<'a> {
    /// The lock just taken on `file` (released again should its stamp not be read).
    fn new(file: &'a mut SharedFile) -> Result<Self, StateFileError> {
        let turn = Turn { file };
        let stamp = turn.file.stamp()?;
        Ok(Self { turn, stamp })
    }

    /// The state as the file holds it (`None`: no file) when it changed since this process last read or
    /// wrote it (or always, the first time); `Ok(None)` when it did not.
    fn read_if_changed(&mut self) -> Result<Option<Option<CloudState>>, StateFileError> {
        if self.turn.file.seen.as_ref() == Some(&self.stamp) {
            return Ok(None);
        }
        self.turn.file.read(&self.stamp).map(Some)
    }
}

/// The state file locked for a change.
pub(crate) struct Exclusive<'a>(Held<'a>);

impl Exclusive<'_> {
    /// As [`Held::read_if_changed`].
    pub(crate) fn read_if_changed(&mut self) -> Result<Option<Option<CloudState>>, StateFileError> {
        self.0.read_if_changed()
    }

    /// Writes `state` as the new revision: the revision first, then the state file (atomically), so a
    /// writer that dies in between leaves a new revision on the old state, which readers just read again.
    pub(crate) fn write(&mut self, state: &CloudState) -> Result<(), StateFileError> {
        let file = &mut *self.0.turn.file;
        file.seen = None;
        let revision = self.0.stamp.revision.unwrap_or(0).wrapping_add(1);
        let lock_io = |source| StateFileError::Io {
            action: "write the fake cloud's state lock file",
            path: file.lock_path.clone(),
            source,
        };
        file.lock.set_len(0).map_err(lock_io)?;
        (&file.lock)
            .seek(SeekFrom::Start(0))
            .and_then(|_| (&file.lock).write_all(format!("{revision}\n").as_bytes()))
            .map_err(lock_io)?;
        state
            .write(&file.path)
            .map_err(|source| StateFileError::Io {
                action: "write the fake cloud's stateFile",
                path: file.path.clone(),
                source,
            })?;
        self.0.stamp = Stamp {
            revision: Some(revision),
            identity: identity(&file.path)?,
        };
        file.seen = Some(self.0.stamp.clone());
        Ok(())
    }
}

/// The state file locked for reading.
pub(crate) struct Shared<'a>(Held<'a>);

impl Shared<'_> {
    /// As [`Held::read_if_changed`].
    pub(crate) fn read_if_changed(&mut self) -> Result<Option<Option<CloudState>>, StateFileError> {
        self.0.read_if_changed()
    }
}

fn identity(path: &Path) -> Result<Option<Identity>, StateFileError> {
    match std::fs::metadata(path) {
        Ok(metadata) => Ok(Some(Identity {
            len: metadata.len(),
            modified: metadata.modified().ok(),
            inode: inode(&metadata),
        })),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateFileError::Io {
            action: "read the fake cloud's stateFile",
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(unix)]
fn inode(metadata: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((metadata.dev(), metadata.ino()))
}

#[cfg(not(unix))]
fn inode(_metadata: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// Reads a state file: `None` when there is none; a clear error naming the file when it is not one.
pub(crate) fn read_state(path: &Path) -> Result<Option<CloudState>, StateFileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateFileError::Io {
                action: "read the fake cloud's stateFile",
                path: path.to_owned(),
                source,
            });
        }
    };
    let malformed = |message: String| StateFileError::Malformed {
        path: path.to_owned(),
        message,
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(malformed("the file is empty".to_owned()));
    }
    let mut state: CloudState =
        serde_json::from_slice(&bytes).map_err(|err| malformed(err.to_string()))?;
    state.load_balancers.sort_by(|a, b| a.name.cmp(&b.name));
    state.routes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with_route(name: &str) -> CloudState {
        CloudState {
            routes: vec![crate::RouteRecord {
                name: name.into(),
                target_node: "n1".into(),
                destination_cidr: "10.1.0.0/24".into(),
                blackhole: false,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_change_by_another_handle_is_seen_and_an_unchanged_file_is_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut a = SharedFile::open(&path).unwrap();
        let mut b = SharedFile::open(&path).unwrap();
        assert!(dir.path().join("state.json.lock").exists());

        // The first look always reads; no file is an empty cloud.
        assert_eq!(
            a.exclusive().unwrap().read_if_changed().unwrap(),
            Some(None)
        );
        {
            let mut turn = a.exclusive().unwrap();
            assert_eq!(turn.read_if_changed().unwrap(), None);
            turn.write(&state_with_route("r1")).unwrap();
        }
        assert_eq!(a.shared().unwrap().read_if_changed().unwrap(), None);
        assert_eq!(
            b.shared().unwrap().read_if_changed().unwrap(),
            Some(Some(state_with_route("r1")))
        );
        b.exclusive()
            .unwrap()
            .write(&state_with_route("r2"))
            .unwrap();
        assert_eq!(
            a.shared().unwrap().read_if_changed().unwrap(),
            Some(Some(state_with_route("r2")))
        );
        assert_eq!(std::fs::read_to_string(&b.lock_path).unwrap(), "2\n");

        // A removal by hand is an empty cloud, though no revision changed.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(a.shared().unwrap().read_if_changed().unwrap(), Some(None));
    }

    #[test]
    fn a_malformed_or_empty_state_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{\"loadBalancers\": 5}").unwrap();
        let err = read_state(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "the fake cloud's stateFile {} is malformed: invalid type: integer `5`, expected a sequence at line 1 column 19",
                path.display()
            )),
            "{err}"
        );
        std::fs::write(&path, "\n").unwrap();
        let err = read_state(&path).unwrap_err().to_string();
        assert!(err.contains("is malformed: the file is empty"), "{err}");
        assert!(
            err.contains("delete the file to start an empty cloud"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_directory_is_named_in_the_error() {
        let err = SharedFile::open(Path::new("/nonexistent-dir/x/state.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "cannot open the fake cloud's state lock file /nonexistent-dir/x/state.json.lock:"
            ),
            "{err}"
        );
    }
}
