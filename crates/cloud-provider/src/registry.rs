//! The provider registry: a name → factory map, filled at link time by [`register_provider!`] or
//! explicitly by [`Registry::register`].
//!
//! Go providers join upstream's registry from an `init` block when their package is imported. Here a
//! provider crate calls [`register_provider!`] once; every crate linked into the binary then appears in
//! [`Registry::linked`] (through the `inventory` crate), without any edit to `main`.

use std::{
    collections::BTreeMap,
    fmt,
    num::NonZeroU32,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{CloudProvider, error::BoxError};

/// The `--cloud-config` a factory receives: the file's contents, and the path they came from so a
/// provider may watch it.
#[derive(Debug, Clone, Default)]
pub struct CloudConfig {
    path: Option<PathBuf>,
    contents: Option<Vec<u8>>,
    flags: Option<clap::ArgMatches>,
}

impl CloudConfig {
    /// No `--cloud-config` was given: the provider runs on its defaults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Contents read from `path` (or from nowhere in particular, with `path` `None`).
    pub fn from_bytes(path: Option<PathBuf>, contents: impl Into<Vec<u8>>) -> Self {
        Self {
            path,
            contents: Some(contents.into()),
            flags: None,
        }
    }

    /// Reads the file at `path`.
    pub fn read(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref();
        let contents = std::fs::read(path)?;
        Ok(Self::from_bytes(Some(path.to_owned()), contents))
    }

    /// The path of the file, when there is one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The file's contents; `None` when no cloud-config was given.
    pub fn contents(&self) -> Option<&[u8]> {
        self.contents.as_deref()
    }

    /// The same config with the parsed command line, from which [`CloudConfig::flags`] reads the
    /// provider's own flags. The manager calls this; tests may too.
    pub fn with_flags(mut self, matches: clap::ArgMatches) -> Self {
        self.flags = Some(matches);
        self
    }

    /// The provider's own flags (registered with `register_provider!(name, factory, flags = T)`), as
    /// given on the command line or defaulted. Without a command line (a config built by a test), every
    /// flag has its default.
    pub fn flags<T: clap::Args>(&self) -> Result<T, BoxError> {
        match &self.flags {
            Some(matches) => read_flags(matches),
            None => {
                let defaults = T::augment_args(clap::Command::new("provider"))
                    .try_get_matches_from(["provider"])?;
                Ok(T::from_arg_matches(&defaults)?)
            }
        }
    }

    /// How errors name the file: its path, or `<cloud-config>` for contents from nowhere in particular.
    pub fn source_name(&self) -> String {
        self.path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<cloud-config>".to_owned())
    }

    /// The contents as UTF-8 text; `Ok(None)` when no cloud-config was given.
    pub fn text(&self) -> Result<Option<&str>, std::str::Utf8Error> {
        self.contents
            .as_deref()
            .map(std::str::from_utf8)
            .transpose()
    }
}

/// Reads `T` from `matches`, or says that `T`'s flags are not on the command line (clap panics on an
/// unknown argument id).
pub fn read_flags<T: clap::Args>(matches: &clap::ArgMatches) -> Result<T, BoxError> {
    let flags = T::augment_args(clap::Command::new("flags"));
    if let Some(arg) = flags
        .get_arguments()
        .find(|arg| matches.try_contains_id(arg.get_id().as_str()).is_err())
    {
        return Err(format!(
            "{} (flag --{}) is not on the command line: register the type with register_provider!(.., flags = {0}) or ControllerSpec::with_flags",
            std::any::type_name::<T>(),
            arg.get_long().unwrap_or(arg.get_id().as_str()),
        )
        .into());
    }
    Ok(T::from_arg_matches(matches)?)
}

/// What a factory returns.
pub type ProviderResult = Result<Arc<dyn CloudProvider>, BoxError>;

/// A provider factory as [`register_provider!`](crate::register_provider) takes it.
pub type ProviderFactoryFn = fn(&CloudConfig) -> ProviderResult;
/// Adds a provider's own flags to the manager's command line: `<T as clap::Args>::augment_args`.
pub type AddFlagsFn = fn(clap::Command) -> clap::Command;

type Factory = Arc<dyn Fn(&CloudConfig) -> ProviderResult + Send + Sync>;

/// A link-time registration; made by [`register_provider!`](crate::register_provider).
#[derive(Debug)]
pub struct Registration {
    name: &'static str,
    factory: ProviderFactoryFn,
    flags: Option<AddFlagsFn>,
    runtime_event_interval: Option<NonZeroU32>,
}

impl Registration {
    /// A registration of `factory` under `name`.
    pub const fn new(name: &'static str, factory: ProviderFactoryFn) -> Self {
        Self {
            name,
            factory,
            flags: None,
            runtime_event_interval: None,
        }
    }

    /// A registration of `factory` under `name`, with flags of its own that `flags` adds.
    pub const fn with_flags(
        name: &'static str,
        factory: ProviderFactoryFn,
        flags: AddFlagsFn,
    ) -> Self {
        Self {
            name,
            factory,
            flags: Some(flags),
            runtime_event_interval: None,
        }
    }

    /// This registration, asking the manager to build its async runtime with `interval` as tokio's
    /// `event_interval` (how many tasks each worker polls between two looks at the I/O driver) when
    /// this provider runs: for a provider whose process relays traffic itself, as `local`'s data plane
    /// does. Without it the runtime keeps tokio's default, 61. An interval of 0 (tokio divides by it)
    /// does not compile in [`register_provider!`](crate::register_provider), whose registration is a
    /// constant.
    pub const fn with_runtime_event_interval(mut self, interval: u32) -> Self {
        self.runtime_event_interval = match NonZeroU32::new(interval) {
            Some(interval) => Some(interval),
            None => panic!("runtime_event_interval must be above 0"),
        };
        self
    }
}

inventory::collect!(Registration);

/// Registers a provider factory under a name for every binary this crate is linked into.
///
/// ```
/// use std::sync::Arc;
/// use cloud_provider::{CloudConfig, CloudProvider, ProviderResult, register_provider};
///
/// struct Tiny;
/// impl CloudProvider for Tiny {
///     fn provider_name(&self) -> &str { "tiny" }
/// }
///
/// fn new_tiny(_config: &CloudConfig) -> ProviderResult {
///     Ok(Arc::new(Tiny))
/// }
///
/// register_provider!("tiny", new_tiny);
///
/// let registry = cloud_provider::Registry::linked().unwrap();
/// assert!(registry.contains("tiny"));
/// ```
///
/// A provider with flags of its own names a `clap::Args` type: its flags join the manager's command line,
/// shown in `--help` under the provider's heading, and the factory reads them with
/// [`CloudConfig::flags`]. Prefix their names with the provider's (`--tiny-region`): the manager refuses
/// to start when two linked providers claim one flag.
///
/// ```
/// use std::sync::Arc;
/// use cloud_provider::{CloudConfig, CloudProvider, ProviderResult, clap, register_provider};
///
/// #[derive(Debug, clap::Args)]
/// struct TinyFlags {
///     /// The region every instance is in.
///     #[arg(long, default_value = "tiny-1")]
///     tiny_region: String,
/// }
///
/// struct Tiny(String);
/// impl CloudProvider for Tiny {
///     fn provider_name(&self) -> &str { "tiny-flags" }
/// }
///
/// fn new_tiny(config: &CloudConfig) -> ProviderResult {
///     let flags: TinyFlags = config.flags()?;
///     Ok(Arc::new(Tiny(flags.tiny_region)))
/// }
///
/// register_provider!("tiny-flags", new_tiny, flags = TinyFlags);
/// ```
///
/// A provider whose process relays traffic itself can ask for the manager's runtime to look at its
/// I/O driver more often than tokio's default (every 61 tasks), with `runtime_event_interval = N` last
/// (see [`Registration::with_runtime_event_interval`]):
///
/// ```
/// # use std::sync::Arc;
/// # use cloud_provider::{CloudConfig, CloudProvider, ProviderResult, register_provider};
/// # struct Relay;
/// # impl CloudProvider for Relay { fn provider_name(&self) -> &str { "relay" } }
/// fn new_relay(_config: &CloudConfig) -> ProviderResult {
///     Ok(Arc::new(Relay))
/// }
///
/// register_provider!("relay", new_relay, runtime_event_interval = 31);
///
/// let registry = cloud_provider::Registry::linked().unwrap();
/// assert_eq!(registry.runtime_event_interval("relay"), Some(31));
/// ```
///
/// An interval of 0 is refused when the crate compiles (tokio would divide by it):
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use cloud_provider::{CloudConfig, CloudProvider, ProviderResult, register_provider};
/// # struct Relay;
/// # impl CloudProvider for Relay { fn provider_name(&self) -> &str { "relay" } }
/// # fn new_relay(_config: &CloudConfig) -> ProviderResult { Ok(Arc::new(Relay)) }
/// register_provider!("relay", new_relay, runtime_event_interval = 0);
/// ```
#[macro_export]
macro_rules! register_provider {
    ($name:expr, $factory:expr $(, runtime_event_interval = $interval:expr)? $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::Registration::new($name, $factory)
                $(.with_runtime_event_interval($interval))?
        }
    };
    (
        $name:expr,
        $factory:expr,
        flags = $flags:ty
        $(, runtime_event_interval = $interval:expr)?
        $(,)?
    ) => {
        $crate::__private::inventory::submit! {
            $crate::Registration::with_flags(
                $name,
                $factory,
                <$flags as $crate::clap::Args>::augment_args,
            )
            $(.with_runtime_event_interval($interval))?
        }
    };
}

/// Why a provider could not be registered or created.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two providers claim one name.
    #[error("cloud provider {0:?} was registered twice")]
    Duplicate(String),
    /// `--cloud-provider` was empty.
    #[error("--cloud-provider cannot be empty (known providers: {})", list(.known))]
    Empty {
        /// The registered names.
        known: Vec<String>,
    },
    /// `--cloud-provider=external` names no provider: this binary is the external provider.
    #[error("--cloud-provider=external names no provider; this manager is the external cloud provider, so name the one to run (known providers: {})", list(.known))]
    External {
        /// The registered names.
        known: Vec<String>,
    },
    /// No provider has this name.
    #[error("unknown cloud provider {name:?} (known providers: {})", list(.known))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The registered names.
        known: Vec<String>,
    },
    /// The factory failed, for example on a malformed cloud-config.
    #[error("could not init cloud provider {name:?}: {source}")]
    Init {
        /// The provider's name.
        name: String,
        /// What the factory said.
        #[source]
        source: BoxError,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Provider factories by name.
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<String, Factory>,
    flags: BTreeMap<String, AddFlagsFn>,
    runtime_event_intervals: BTreeMap<String, NonZeroU32>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("providers", &self.names())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every provider registered with [`register_provider!`](crate::register_provider) by the crates linked into this binary.
    /// Fails if two of them claim the same name.
    pub fn linked() -> Result<Self, RegistryError> {
        let mut registry = Self::new();
        for registration in inventory::iter::<Registration> {
            registry.register(registration.name, registration.factory)?;
            if let Some(flags) = registration.flags {
                registry.flags.insert(registration.name.to_owned(), flags);
            }
            if let Some(interval) = registration.runtime_event_interval {
                registry.set_runtime_event_interval(registration.name, interval);
            }
        }
        Ok(registry)
    }

    /// Adds a factory under `name`; a name that is already taken is rejected.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        factory: impl Fn(&CloudConfig) -> ProviderResult + Send + Sync + 'static,
    ) -> Result<&mut Self, RegistryError> {
        let name = name.into();
        if self.factories.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        self.factories.insert(name, Arc::new(factory));
        Ok(self)
    }

    /// Adds a factory under `name`, in place of any registered under that name (with its flags and
    /// runtime event interval).
    pub fn replace(
        &mut self,
        name: impl Into<String>,
        factory: impl Fn(&CloudConfig) -> ProviderResult + Send + Sync + 'static,
    ) -> &mut Self {
        let name = name.into();
        self.flags.remove(&name);
        self.runtime_event_intervals.remove(&name);
        self.factories.insert(name, Arc::new(factory));
        self
    }

    /// Gives the provider `name` flags of its own, added to the command line by `flags`
    /// (`<T as clap::Args>::augment_args`).
    pub fn register_flags(&mut self, name: &str, flags: AddFlagsFn) -> &mut Self {
        self.flags.insert(name.to_owned(), flags);
        self
    }

    /// The providers with flags of their own, and what adds them, sorted by name.
    pub fn flags(&self) -> impl Iterator<Item = (&str, AddFlagsFn)> {
        self.flags
            .iter()
            .map(|(name, flags)| (name.as_str(), *flags))
    }

    /// Asks for the manager's runtime to be built with `interval` as tokio's `event_interval` when the
    /// provider `name` runs (see [`Registration::with_runtime_event_interval`]).
    pub fn set_runtime_event_interval(&mut self, name: &str, interval: NonZeroU32) -> &mut Self {
        self.runtime_event_intervals
            .insert(name.to_owned(), interval);
        self
    }

    /// The event interval the provider `name` asked the manager's runtime to run with, if any.
    pub fn runtime_event_interval(&self, name: &str) -> Option<u32> {
        self.runtime_event_intervals.get(name).map(|n| n.get())
    }

    /// Whether a provider of this name is registered (upstream `IsCloudProvider`).
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.factories.keys().cloned().collect()
    }

    /// Creates the provider `name` from its cloud-config.
    pub fn init(
        &self,
        name: &str,
        config: &CloudConfig,
    ) -> Result<Arc<dyn CloudProvider>, RegistryError> {
        if name.is_empty() {
            return Err(RegistryError::Empty {
                known: self.names(),
            });
        }
        let factory = self.factories.get(name).ok_or_else(|| {
            if name == "external" {
                RegistryError::External {
                    known: self.names(),
                }
            } else {
                RegistryError::Unknown {
                    name: name.to_owned(),
                    known: self.names(),
                }
            }
        })?;
        factory(config).map_err(|source| RegistryError::Init {
            name: name.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);
    impl CloudProvider for Named {
        fn provider_name(&self) -> &str {
            self.0
        }
    }

    fn linked_test_provider(_: &CloudConfig) -> ProviderResult {
        Ok(Arc::new(Named("linked-test")))
    }
    crate::register_provider!("linked-test", linked_test_provider);

    #[test]
    fn a_linked_crate_registers_without_code_in_main() {
        let registry = Registry::linked().unwrap();
        assert!(registry.contains("linked-test"));
        let cloud = registry.init("linked-test", &CloudConfig::none()).unwrap();
        assert_eq!(cloud.provider_name(), "linked-test");
    }

    #[derive(Debug, clap::Args)]
    struct RegionFlags {
        /// The region.
        #[arg(long, default_value = "r1")]
        flagged_region: String,
    }

    fn flagged(config: &CloudConfig) -> ProviderResult {
        let flags: RegionFlags = config.flags()?;
        Ok(Arc::new(Named(if flags.flagged_region == "r2" {
            "flagged-r2"
        } else {
            "flagged-other"
        })))
    }
    crate::register_provider!("flagged-test", flagged, flags = RegionFlags);

    #[test]
    fn a_providers_flags_reach_its_factory() {
        let registry = Registry::linked().unwrap();
        let (name, add) = registry
            .flags()
            .find(|(name, _)| *name == "flagged-test")
            .expect("the flags are registered with the provider");
        assert_eq!(name, "flagged-test");
        let command = add(clap::Command::new("ccm"));
        let matches = command
            .try_get_matches_from(["ccm", "--flagged-region=r2"])
            .unwrap();
        let config = CloudConfig::none().with_flags(matches);
        let cloud = registry.init("flagged-test", &config).unwrap();
        assert_eq!(cloud.provider_name(), "flagged-r2");
        // Without a parsed command line, the flags have their defaults.
        let cloud = registry.init("flagged-test", &CloudConfig::none()).unwrap();
        assert_eq!(cloud.provider_name(), "flagged-other");
    }

    #[derive(Debug, clap::Args)]
    struct RelayFlags {
        /// The port.
        #[arg(long, default_value = "1")]
        relaying_port: u16,
    }

    fn relaying(_: &CloudConfig) -> ProviderResult {
        Ok(Arc::new(Named("relaying-test")))
    }
    crate::register_provider!(
        "relaying-test",
        relaying,
        flags = RelayFlags,
        runtime_event_interval = 17,
    );

    #[test]
    fn a_runtime_event_interval_is_kept_with_the_provider_and_dropped_when_it_is_replaced() {
        let mut registry = Registry::linked().unwrap();
        assert_eq!(registry.runtime_event_interval("relaying-test"), Some(17));
        assert!(registry.flags().any(|(name, _)| name == "relaying-test"));
        // A provider that asked for nothing keeps tokio's default; an unknown name asks for nothing.
        assert_eq!(registry.runtime_event_interval("linked-test"), None);
        assert_eq!(registry.runtime_event_interval("absent"), None);
        registry.replace("relaying-test", relaying);
        assert_eq!(registry.runtime_event_interval("relaying-test"), None);
        registry.set_runtime_event_interval("relaying-test", NonZeroU32::new(5).unwrap());
        assert_eq!(registry.runtime_event_interval("relaying-test"), Some(5));
    }

    #[derive(Debug, clap::Args)]
    struct Unregistered {
        /// Not on any command line.
        #[arg(long, default_value = "x")]
        unregistered_flag: String,
    }

    #[test]
    fn flags_that_were_never_registered_are_an_error_not_a_panic() {
        let matches = clap::Command::new("ccm").get_matches_from(["ccm"]);
        let err = CloudConfig::none()
            .with_flags(matches)
            .flags::<Unregistered>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("(flag --unregistered-flag) is not on the command line"),
            "{err}"
        );
    }

    #[test]
    fn replace_takes_the_place_of_a_linked_provider() {
        let mut registry = Registry::linked().unwrap();
        registry.replace("flagged-test", |_| Ok(Arc::new(Named("replaced")) as _));
        assert!(registry.flags().all(|(name, _)| name != "flagged-test"));
        let cloud = registry.init("flagged-test", &CloudConfig::none()).unwrap();
        assert_eq!(cloud.provider_name(), "replaced");
    }

    #[test]
    fn a_duplicate_name_is_rejected() {
        let mut registry = Registry::new();
        registry
            .register("a", |_| Ok(Arc::new(Named("a")) as _))
            .unwrap();
        let err = registry
            .register("a", |_| Ok(Arc::new(Named("a")) as _))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"cloud provider "a" was registered twice"#
        );
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let mut registry = Registry::new();
        registry
            .register("b", |_| Ok(Arc::new(Named("b")) as _))
            .unwrap();
        registry
            .register("a", |_| Ok(Arc::new(Named("a")) as _))
            .unwrap();
        let err = registry.init("nope", &CloudConfig::none()).err().unwrap();
        assert_eq!(
            err.to_string(),
            r#"unknown cloud provider "nope" (known providers: a, b)"#
        );
        assert!(matches!(
            registry.init("", &CloudConfig::none()),
            Err(RegistryError::Empty { .. })
        ));
        let external = registry
            .init("external", &CloudConfig::none())
            .err()
            .unwrap();
        assert!(
            external.to_string().contains("known providers: a, b"),
            "{external}"
        );
    }

    #[test]
    fn the_factory_gets_the_config_and_its_errors_are_wrapped() {
        let mut registry = Registry::new();
        registry
            .register("picky", |config: &CloudConfig| match config.text()? {
                Some("ok") => Ok(Arc::new(Named("picky")) as _),
                other => Err(format!("bad config {other:?}").into()),
            })
            .unwrap();
        assert!(
            registry
                .init("picky", &CloudConfig::from_bytes(None, "ok"))
                .is_ok()
        );
        let err = registry.init("picky", &CloudConfig::none()).err().unwrap();
        assert_eq!(
            err.to_string(),
            r#"could not init cloud provider "picky": bad config None"#
        );
    }

    #[test]
    fn cloud_config_reads_a_file() {
        let dir = std::env::temp_dir().join(format!("cloud-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cloud.yaml");
        std::fs::write(&path, "latency: 1ms\n").unwrap();
        let config = CloudConfig::read(&path).unwrap();
        assert_eq!(config.path(), Some(path.as_path()));
        assert_eq!(config.text().unwrap(), Some("latency: 1ms\n"));
        assert!(CloudConfig::read(dir.join("missing.yaml")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
