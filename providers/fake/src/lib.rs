//! `fake`: a scriptable, deterministic in-memory cloud for tests, benchmarks and demos.
//!
//! It is driven by a YAML cloud-config (every key is shown in `cloud-config.example.yaml` beside this
//! crate) that is re-read when the file changes, so a running manager can be shown a changing cloud:
//! instances that appear, shut down or vanish, failures injected per method, latency on every call.
//! What the cloud holds (load balancers, routes, IP assignments, call counts) is written to `stateFile`
//! as JSON, for black-box checks. With `stateFileShared` the file is the cloud itself: read back at
//! start and shared, under a file lock, by every process that names it, so the cloud outlives a
//! manager and replicas see one cloud.
//!
//! Any node not listed under `instances` is a running instance with the `instanceDefaults`, provider ID
//! `fake://<node name>` and one InternalIP derived from its name ([`derived_internal_ip`]). Instances are
//! found by provider ID when the node has one, else by node name.
//!
//! Linking this crate registers the provider under the name `fake`.

mod config;
mod instances;
mod load_balancer;
mod routes;
mod shared_state;
mod state;
mod watcher;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, RwLock},
};

use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, Instances, InstancesV2, LoadBalancer,
    ProviderResult, Routes, Zones, register_provider,
};

pub use config::{
    AddressConfig, AddressType, Config, ConfigError, GoDuration, InstanceConfig, InstanceDefaults,
    InstanceState, IpPool, LoadBalancersConfig, METHODS, RouteConfig, RoutesConfig,
};
pub use instances::derived_internal_ip;
pub use shared_state::StateFileError;
pub use state::{CloudState, LoadBalancerRecord, PortRecord, RouteRecord};

use shared_state::SharedFile;

/// The name the provider registers under, and the scheme of its provider IDs.
pub const PROVIDER_NAME: &str = "fake";

register_provider!(PROVIDER_NAME, new_provider);

/// The registry factory: builds the fake cloud from the `--cloud-config` (its defaults without one).
pub fn new_provider(config: &CloudConfig) -> ProviderResult {
    Ok(Arc::new(FakeCloud::from_cloud_config(config)?))
}

/// The fake cloud. Cheap to clone; clones share one cloud.
#[derive(Clone)]
pub struct FakeCloud {
    inner: Arc<Inner>,
}

struct Inner {
    config: RwLock<Arc<Config>>,
    cloud: Mutex<Mutable>,
    /// Held while the state file is written, so writes land in order; taken before `cloud`, never
    /// while holding it, so cloud calls do not wait for the disk. (Not used with `stateFileShared`.)
    writing: Mutex<()>,
    /// With `stateFileShared`: the shared state file. Its mutex gives this process's threads their
    /// turns at the file lock one at a time; taken before `cloud`.
    shared: Option<Mutex<SharedFile>>,
}

/// The state behind the lock.
struct Mutable {
    state: CloudState,
    /// Call counts changed since the state file was last written.
    dirty: bool,
    /// Whether the state file is shared (`stateFileShared`).
    shared: bool,
    /// With a shared state file: the calls counted here and not yet added to the file, per method and
    /// object (`""` for calls about no one object). Each process adds its own, so the file sums them.
    unsynced: BTreeMap<(&'static str, String), u64>,
    /// The backend list last stored, shared by every load balancer given the same list: the manager
    /// hands most load balancers the same nodes, and 500 copies of 5,000 names would make the fake,
    /// which runs inside the manager under test, the biggest thing in its memory.
    last_backends: Option<Arc<Vec<String>>>,
}

impl Mutable {
    /// `names` as a shared list: the one stored last when equal.
    fn share_backends(&mut self, names: Vec<String>) -> Arc<Vec<String>> {
        match &self.last_backends {
            Some(last) if **last == names => last.clone(),
            _ => {
                let shared = Arc::new(names);
                self.last_backends = Some(shared.clone());
                shared
            }
        }
    }

    /// Counts a call of `method` about `object` (`""`: about no one object) and returns its number
    /// among the calls of `method` about `object`, which the failure draw uses.
    fn count_call(&mut self, method: &'static str, object: &str) -> u64 {
        self.dirty = true;
        if self.shared {
            *self
                .unsynced
                .entry((method, object.to_owned()))
                .or_default() += 1;
        }
        let total = bump(&mut self.state.calls, method, 1);
        if object.is_empty() {
            return total;
        }
        let per_object = match self.state.calls_per_object.get_mut(method) {
            Some(per_object) => per_object,
            None => self
                .state
                .calls_per_object
                .entry(method.to_owned())
                .or_default(),
        };
        bump(per_object, object, 1)
    }

    /// Replaces the state with `state` as read from the shared file, plus the calls this process
    /// counted and has not written yet.
    fn load(&mut self, mut state: CloudState) {
        for ((method, object), n) in &self.unsynced {
            bump(&mut state.calls, method, *n);
            if !object.is_empty() {
                bump(
                    state
                        .calls_per_object
                        .entry((*method).to_owned())
                        .or_default(),
                    object,
                    *n,
                );
            }
        }
        // Identical backend lists share one allocation again.
        self.last_backends = None;
        for i in 0..state.load_balancers.len() {
            let nodes = std::mem::take(&mut state.load_balancers[i].nodes);
            let nodes = Arc::try_unwrap(nodes).unwrap_or_else(|shared| (*shared).clone());
            state.load_balancers[i].nodes = self.share_backends(nodes);
        }
        self.state = state;
    }

    /// After a write of the shared file that held `written` of the unsynced calls: they are in the file.
    fn synced(&mut self, written: &BTreeMap<(&'static str, String), u64>) {
        for (key, n) in written {
            if let Some(left) = self.unsynced.get_mut(key) {
                *left -= (*n).min(*left);
                if *left == 0 {
                    self.unsynced.remove(key);
                }
            }
        }
        self.dirty = !self.unsynced.is_empty();
    }
}

/// Adds `n` to `map[key]`, allocating the key only the first time; returns the new count.
fn bump(map: &mut BTreeMap<String, u64>, key: &str, n: u64) -> u64 {
    let count = match map.get_mut(key) {
        Some(count) => count,
        None => map.entry(key.to_owned()).or_default(),
    };
    *count += n;
    *count
}

/// Adds the routes listed under `routes.initial` that `previous` did not list (all of them when the
/// cloud starts) and the cloud does not hold yet.
fn add_initial_routes(cloud: &mut Mutable, config: &Config, previous: Option<&Config>) {
    for route in &config.routes.initial {
        let known_before =
            previous.is_some_and(|p| p.routes.initial.iter().any(|r| r.name == route.name));
        if !known_before && !cloud.state.routes.iter().any(|r| r.name == route.name) {
            cloud.state.routes.push(RouteRecord {
                name: route.name.clone(),
                target_node: route.target_node.clone(),
                destination_cidr: route.destination_cidr.clone(),
                blackhole: route.blackhole,
            });
        }
    }
    cloud.state.routes.sort_by(|a, b| a.name.cmp(&b.name));
}

/// Why the fake cloud could not start, or could not take a new config.
#[derive(Debug, thiserror::Error)]
pub enum FakeCloudError {
    /// The cloud-config is not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cloud-config is not UTF-8.
    #[error("cloud-config{} is not UTF-8 text: {source}", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    NotText {
        /// Where the invalid byte is.
        source: std::str::Utf8Error,
        /// The file, when known.
        path: Option<PathBuf>,
    },
    /// The state file cannot be written.
    #[error("cannot write the fake cloud's stateFile {path}: {source}")]
    StateFile {
        /// The `stateFile` path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The shared state file (`stateFileShared`) cannot be read, locked or written, or is malformed.
    #[error(transparent)]
    SharedStateFile(#[from] StateFileError),
    /// A new config cannot apply to the running cloud (it changes what is fixed at start).
    #[error("cannot apply the changed cloud-config to the running fake cloud: {message}")]
    Reload {
        /// Why not.
        message: String,
    },
}

impl FakeCloud {
    /// A fake cloud from a parsed config. It is not re-read from anywhere. With `stateFileShared`, the
    /// cloud is the one the state file holds (an empty one when the file does not exist).
    pub fn new(config: Config) -> Result<Self, FakeCloudError> {
        config.validate(None)?;
        let shared = match (&config.state_file, config.state_file_shared) {
            (Some(path), true) => Some(Mutex::new(SharedFile::open(path)?)),
            _ => None,
        };
        let cloud = Self {
            inner: Arc::new(Inner {
                config: RwLock::new(Arc::new(Config::default())),
                cloud: Mutex::new(Mutable {
                    state: CloudState::default(),
                    dirty: false,
                    shared: shared.is_some(),
                    unsynced: BTreeMap::new(),
                    last_backends: None,
                }),
                writing: Mutex::new(()),
                shared,
            }),
        };
        if let Some(shared) = &cloud.inner.shared {
            cloud.inner.start_shared(shared, &config)?;
            cloud.inner.set_config(config);
        } else {
            add_initial_routes(&mut cloud.inner.lock(), &config, None);
            cloud.inner.set_config(config);
            cloud
                .write_state_file()
                .map_err(|(path, source)| FakeCloudError::StateFile { path, source })?;
        }
        watcher::spawn_flusher(Arc::downgrade(&cloud.inner));
        Ok(cloud)
    }

    /// A fake cloud from YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, FakeCloudError> {
        Self::new(Config::parse(text, None)?)
    }

    /// A fake cloud from the manager's `--cloud-config`; when it came from a file, the file is watched and
    /// re-read within a second of a change (a malformed edit is logged and the last good config kept).
    pub fn from_cloud_config(config: &CloudConfig) -> Result<Self, FakeCloudError> {
        let path = config.path().map(ToOwned::to_owned);
        let text = config
            .text()
            .map_err(|source| FakeCloudError::NotText {
                source,
                path: path.clone(),
            })?
            .unwrap_or_default();
        let cloud = Self::new(Config::parse(text, path.as_deref())?)?;
        watcher::spawn(Arc::downgrade(&cloud.inner), config);
        Ok(cloud)
    }

    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        self.inner.config()
    }

    /// Replaces the config, as a reload of the file does. Routes listed under `routes.initial` that the
    /// previous config did not list are added to the cloud. A config [`FakeCloud::try_set_config`]
    /// refuses is logged and ignored, as a malformed edit of the file is.
    pub fn set_config(&self, config: Config) {
        if let Err(err) = self.try_set_config(config) {
            tracing::warn!(error = %err, "fake cloud: ignoring the new cloud-config, keeping the one in force");
        }
    }

    /// [`FakeCloud::set_config`], saying why a config is refused: it is invalid, it changes what is fixed
    /// at start (`stateFileShared`, and `stateFile` while shared), or its new routes cannot be written to
    /// the shared state file. (A failed write of an unshared state file is only logged: the file is a
    /// view, the config is in force.)
    pub fn try_set_config(&self, config: Config) -> Result<(), FakeCloudError> {
        config.validate(None)?;
        let previous = self.config();
        previous
            .check_reload(&config)
            .map_err(|message| FakeCloudError::Reload { message })?;
        if let Some(shared) = &self.inner.shared {
            let adds_routes = config.routes.initial.iter().any(|route| {
                !previous
                    .routes
                    .initial
                    .iter()
                    .any(|known| known.name == route.name)
            });
            if adds_routes {
                self.inner.with_shared_file(shared, |cloud| {
                    add_initial_routes(cloud, &config, Some(&previous));
                    Ok::<_, StateFileError>(())
                })?;
            }
            self.inner.set_config(config);
            return Ok(());
        }
        add_initial_routes(&mut self.inner.lock(), &config, Some(&previous));
        self.inner.set_config(config);
        if let Err((path, err)) = self.write_state_file() {
            tracing::warn!(path = %path.display(), error = %err, "fake cloud: cannot write the state file");
        }
        Ok(())
    }

    /// A copy of what the cloud holds now: with a shared state file, as the file holds it, plus the
    /// calls this process counted and has not written yet (call counts are sums over every process).
    pub fn snapshot(&self) -> CloudState {
        if let Err(err) = self.inner.refresh() {
            tracing::warn!(error = %err, "fake cloud: showing the state last read");
        }
        self.inner.lock().state.clone()
    }

    /// Writes the state file now, if one is configured and not shared (a shared one is written by
    /// every change).
    fn write_state_file(&self) -> Result<(), (PathBuf, std::io::Error)> {
        self.inner.flush(|_| true)
    }

    /// Counts the call, waits the configured latency and decides whether the call fails. Returns the
    /// config in force for the rest of the call.
    async fn enter(&self, method: &'static str) -> CloudResult<Arc<Config>> {
        self.enter_for(method, "").await
    }

    /// [`FakeCloud::enter`] for a call about one object (a Service's `namespace/name`): whether it fails
    /// depends on the seed and how often this object was asked, not on what else runs meanwhile.
    async fn enter_for(&self, method: &'static str, object: &str) -> CloudResult<Arc<Config>> {
        let config = self.config();
        let call = self.inner.lock().count_call(method, object);
        if !config.latency.0.is_zero() {
            tokio::time::sleep(config.latency.0).await;
        }
        // A provider's bug, on purpose (`panicFirstCalls`); no lock is held here.
        assert!(
            !config.panics_on(method, call),
            "fake cloud: injected panic in {method} (call {call} about {object:?})"
        );
        let rate = config.failure_rate(method);
        if rate > 0.0
            && draw(
                config.seed ^ instances::fnv1a64(object.as_bytes()),
                method,
                call,
            ) < rate
        {
            let message =
                format!("fake cloud: injected failure in {method} (call {call}, rate {rate})");
            return Err(match config.retry_after {
                Some(delay) => CloudError::retry_after(message, delay.0),
                None => CloudError::other(message),
            });
        }
        Ok(config)
    }

    /// Runs `change` on the cloud state and writes the state file (or, with `stateFileBatched`, leaves
    /// it to the background writer). With a shared state file, `change` runs under the file lock on the
    /// state as the file holds it, and the file is written before the lock is released.
    ///
    /// Refused with `LeadershipLost` once the manager's leadership lapsed, as a real provider checks
    /// between steps: a leader that froze during a call's latency and resumed after a takeover changes
    /// nothing.
    fn change<T>(&self, change: impl FnOnce(&mut Mutable) -> CloudResult<T>) -> CloudResult<T> {
        cloud_provider::leadership::check()?;
        if let Some(shared) = &self.inner.shared {
            return self.inner.with_shared_file(shared, change);
        }
        let result = {
            let mut cloud = self.inner.lock();
            let result = change(&mut cloud)?;
            cloud.dirty = true;
            result
        };
        if !self.config().state_file_batched
            && let Err((path, err)) = self.inner.flush(|_| true)
        {
            tracing::warn!(path = %path.display(), error = %err, "fake cloud: cannot write the state file");
        }
        Ok(result)
    }

    /// Brings the state up to what other processes wrote to a shared state file (nothing to do without
    /// one), for a call that reads the state.
    fn refresh(&self) -> CloudResult<()> {
        Ok(self.inner.refresh()?)
    }
}

impl Drop for Inner {
    /// What the background writer had not written yet (call counts, batched changes) goes out now.
    fn drop(&mut self) {
        if self.shared.is_some() {
            self.flush_pending();
            return;
        }
        let path = self.config().state_file.clone();
        let cloud = self.cloud.get_mut().unwrap_or_else(|e| e.into_inner());
        if cloud.dirty
            && let Some(path) = path
            && let Err(err) = cloud.state.write(&path)
        {
            tracing::warn!(path = %path.display(), error = %err, "fake cloud: cannot write the state file");
        }
    }
}

impl Inner {
    fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_config(&self, config: Config) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    fn lock(&self) -> MutexGuard<'_, Mutable> {
        // A panic while holding the lock cannot leave the state half-changed in a way that matters for
        // a fake; keep serving.
        self.cloud.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes a snapshot of the state to the state file when one is configured and `wanted` says so
    /// (given whether anything changed since the last write). The snapshot is taken under the state lock
    /// (cheap: backend lists are shared), the file written after releasing it. Not for a shared file.
    fn flush(&self, wanted: impl FnOnce(bool) -> bool) -> Result<(), (PathBuf, std::io::Error)> {
        let Some(path) = self.config().state_file.clone() else {
            return Ok(());
        };
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = {
            let mut cloud = self.lock();
            if !wanted(cloud.dirty) {
                return Ok(());
            }
            cloud.dirty = false;
            cloud.state.clone()
        };
        snapshot.write(&path).map_err(|err| (path, err))
    }

    /// Writes what changed since the last write and was not written yet (call counts; with
    /// `stateFileBatched`, everything), logging a failure.
    fn flush_pending(&self) {
        match &self.shared {
            Some(shared) => {
                if self.lock().unsynced.is_empty() {
                    return;
                }
                if let Err(err) = self.with_shared_file(shared, |_| Ok::<_, StateFileError>(())) {
                    tracing::warn!(error = %err, "fake cloud: cannot add the call counts to the shared state file");
                }
            }
            None => {
                if let Err((path, err)) = self.flush(|dirty| dirty) {
                    tracing::warn!(path = %path.display(), error = %err, "fake cloud: cannot write the state file");
                }
            }
        }
    }

    /// The cloud's start on a shared state file: the state the file holds, or, when there is no file
    /// yet, a new cloud (with the `routes.initial` of `config`) written to it.
    fn start_shared(
        &self,
        shared: &Mutex<SharedFile>,
        config: &Config,
    ) -> Result<(), StateFileError> {
        let mut file = shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut turn = file.exclusive()?;
        match turn.read_if_changed()?.flatten() {
            Some(state) => self.lock().load(state),
            None => {
                let snapshot = {
                    let mut cloud = self.lock();
                    add_initial_routes(&mut cloud, config, None);
                    cloud.state.clone()
                };
                turn.write(&snapshot)?;
            }
        }
        Ok(())
    }

    /// With the shared state file locked exclusively: loads what another process wrote since this one
    /// last read or wrote it, runs `change`, and when it succeeds writes the state (with the calls this
    /// process counted) back. A failed `change` writes nothing.
    fn with_shared_file<T, E: From<StateFileError>>(
        &self,
        shared: &Mutex<SharedFile>,
        change: impl FnOnce(&mut Mutable) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut file = shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut turn = file.exclusive()?;
        let changed = turn.read_if_changed()?;
        let (result, snapshot, written) = {
            let mut cloud = self.lock();
            if let Some(state) = changed {
                cloud.load(state.unwrap_or_default());
            }
            let result = change(&mut cloud)?;
            (result, cloud.state.clone(), cloud.unsynced.clone())
        };
        turn.write(&snapshot)?;
        self.lock().synced(&written);
        Ok(result)
    }

    /// Loads what other processes wrote to the shared state file since this one last read or wrote it.
    fn refresh(&self) -> Result<(), StateFileError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let mut file = shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut turn = file.shared()?;
        if let Some(state) = turn.read_if_changed()? {
            self.lock().load(state.unwrap_or_default());
        }
        Ok(())
    }
}

/// A deterministic draw in [0, 1) for the `call`-th call of `method` (splitmix64 over the seed, an FNV
/// hash of the method name and the call number), so a run with the same seed fails the same calls.
fn draw(seed: u64, method: &str, call: u64) -> f64 {
    let mut x =
        seed ^ instances::fnv1a64(method.as_bytes()) ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl CloudProvider for FakeCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    /// `fake://…`, and any ID a configured instance carries (`providerID:`, whatever its scheme).
    fn owns_provider_id(&self, provider_id: &str) -> bool {
        provider_id
            .strip_prefix(PROVIDER_NAME)
            .is_some_and(|rest| rest.starts_with("://"))
            || self
                .config()
                .instances
                .values()
                .any(|i| i.provider_id.as_deref() == Some(provider_id))
    }

    fn has_cluster_id(&self) -> bool {
        self.config().has_cluster_id
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.config()
            .load_balancers
            .enabled
            .then_some(self as &dyn LoadBalancer)
    }

    fn instances(&self) -> Option<&dyn Instances> {
        (!self.config().instances_v2).then_some(self as &dyn Instances)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.config()
            .instances_v2
            .then_some(self as &dyn InstancesV2)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        (!self.config().instances_v2).then_some(self as &dyn Zones)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.config().routes.enabled.then_some(self as &dyn Routes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_spread() {
        assert_eq!(draw(1, "create_route", 5), draw(1, "create_route", 5));
        assert_ne!(draw(1, "create_route", 5), draw(2, "create_route", 5));
        let below = (1..=10_000)
            .filter(|n| draw(0, "ensure_load_balancer", *n) < 0.3)
            .count();
        assert!(
            (2_700..3_300).contains(&below),
            "{below} of 10000 draws below 0.3"
        );
    }

    #[test]
    fn switches_choose_the_offered_parts() {
        let cloud = FakeCloud::from_yaml("").unwrap();
        assert!(
            cloud.instances_v2().is_some()
                && cloud.instances().is_none()
                && cloud.zones().is_none()
        );
        assert!(
            cloud.load_balancer().is_some()
                && cloud.routes().is_some()
                && cloud.clusters().is_none()
        );
        assert!(cloud.has_cluster_id());
        let legacy = FakeCloud::from_yaml(
            "instancesV2: false\nhasClusterID: false\nloadBalancers: {enabled: false}\nroutes: {enabled: false}\n",
        )
        .unwrap();
        assert!(
            legacy.instances_v2().is_none()
                && legacy.instances().is_some()
                && legacy.zones().is_some()
        );
        assert!(legacy.load_balancer().is_none() && legacy.routes().is_none());
        assert!(!legacy.has_cluster_id());
    }

    #[tokio::test]
    async fn injected_failures_are_counted_and_reported() {
        let cloud = FakeCloud::from_yaml("failureRate:\n  list_routes: 1\n").unwrap();
        let routes = cloud.routes().unwrap();
        let err = routes.list_routes("k").await.unwrap_err();
        assert!(
            err.to_string().contains("injected failure in list_routes"),
            "{err}"
        );
        assert_eq!(cloud.snapshot().calls_to("list_routes"), 1);
        let err = routes.create_route("k", "uid", &Default::default()).await;
        assert!(!matches!(&err, Err(e) if e.to_string().contains("injected")));
    }

    #[tokio::test]
    async fn injected_failures_can_ask_for_a_retry_after_a_delay() {
        let cloud =
            FakeCloud::from_yaml("failureRate: {list_routes: 1}\nretryAfter: 2s\n").unwrap();
        let err = cloud.routes().unwrap().list_routes("k").await.unwrap_err();
        assert_eq!(err.retry_delay(), Some(std::time::Duration::from_secs(2)));
    }

    #[tokio::test]
    async fn latency_is_added_to_every_call() {
        let cloud = FakeCloud::from_yaml("latency: 30ms\n").unwrap();
        let started = std::time::Instant::now();
        cloud.routes().unwrap().list_routes("k").await.unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(30));
    }

    #[tokio::test]
    async fn batched_state_file_writes_land_within_a_poll_and_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let cloud = FakeCloud::from_yaml(&format!(
            "stateFile: {}\nstateFileBatched: true\nroutes: {{initial: []}}\n",
            path.display()
        ))
        .unwrap();
        let route = cloud_provider::Route {
            name: "r1".into(),
            target_node: "n1".into(),
            destination_cidr: "10.1.0.0/24".into(),
            ..Default::default()
        };
        cloud
            .routes()
            .unwrap()
            .create_route("k", "uid", &route)
            .await
            .unwrap();
        let has_route = || CloudState::read(&path).is_ok_and(|s| s.routes.len() == 1);
        let started = std::time::Instant::now();
        while !has_route() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(3),
                "the batched write never landed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }

        // Counted but not yet written when the cloud goes away: written on drop.
        // (The background writer may hold the cloud for a moment, so the drop can land on its thread;
        // either way well within its 200 ms poll.)
        cloud.routes().unwrap().list_routes("k").await.unwrap();
        drop(cloud);
        let dropped = std::time::Instant::now();
        while CloudState::read(&path).unwrap().calls_to("list_routes") != 1 {
            assert!(
                dropped.elapsed() < std::time::Duration::from_millis(100),
                "the counts were not written on drop"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn a_bad_state_file_path_is_a_clear_error() {
        let err = FakeCloud::from_yaml("stateFile: /nonexistent-dir/x/state.json\n")
            .err()
            .unwrap();
        assert!(
            err.to_string().starts_with(
                "cannot write the fake cloud's stateFile /nonexistent-dir/x/state.json"
            )
        );
    }
}
