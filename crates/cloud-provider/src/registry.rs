//! The provider registry: a name → factory map, filled at link time by [`register_provider!`] or
//! explicitly by [`Registry::register`].
//!
//! Go providers join upstream's registry from an `init` block when their package is imported. Here a
//! provider crate calls [`register_provider!`] once; every crate linked into the binary then appears in
//! [`Registry::linked`] (through the `inventory` crate), without any edit to `main`.

use std::{
    collections::BTreeMap,
    fmt,
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

    /// The contents as UTF-8 text; `Ok(None)` when no cloud-config was given.
    pub fn text(&self) -> Result<Option<&str>, std::str::Utf8Error> {
        self.contents
            .as_deref()
            .map(std::str::from_utf8)
            .transpose()
    }
}

/// What a factory returns.
pub type ProviderResult = Result<Arc<dyn CloudProvider>, BoxError>;

/// A provider factory as [`register_provider!`] takes it.
pub type ProviderFactoryFn = fn(&CloudConfig) -> ProviderResult;

type Factory = Arc<dyn Fn(&CloudConfig) -> ProviderResult + Send + Sync>;

/// A link-time registration; made by [`register_provider!`].
#[derive(Debug)]
pub struct Registration {
    name: &'static str,
    factory: ProviderFactoryFn,
}

impl Registration {
    /// A registration of `factory` under `name`.
    pub const fn new(name: &'static str, factory: ProviderFactoryFn) -> Self {
        Self { name, factory }
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
#[macro_export]
macro_rules! register_provider {
    ($name:expr, $factory:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::Registration::new($name, $factory)
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

    /// Every provider registered with [`register_provider!`] by the crates linked into this binary.
    /// Fails if two of them claim the same name.
    pub fn linked() -> Result<Self, RegistryError> {
        let mut registry = Self::new();
        for registration in inventory::iter::<Registration> {
            registry.register(registration.name, registration.factory)?;
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
