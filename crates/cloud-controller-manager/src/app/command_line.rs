//! The whole command line: the manager's flags ([`Options`]), the flags linked providers add, and the
//! binary's own name and version.

use std::collections::BTreeMap;

use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};
use cloud_provider::Registry;

use super::{
    Options,
    controller_table::{ControllerSpec, controllers_help},
};

/// A parsed command line: the manager's flags, and the raw matches from which providers and added
/// controllers read their own.
#[derive(Debug, Clone)]
pub struct CommandLine {
    /// The manager's flags.
    pub options: Options,
    /// Everything given, providers' flags included.
    pub matches: ArgMatches,
}

impl From<Options> for CommandLine {
    /// The manager's flags alone (no provider's flags can then be read: use
    /// [`crate::Manager::parse_from`] for those).
    fn from(options: Options) -> Self {
        Self {
            options,
            matches: ArgMatches::default(),
        }
    }
}

/// What `--help` and `--version` call the binary.
#[derive(Debug, Clone)]
pub struct BinaryIdentity {
    /// The binary's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// One line on what it is.
    pub about: Option<String>,
}

/// Two linked providers or added controllers, or one of them and the manager, claim one flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{adder} adds the flag --{flag}, which {owner} already has; rename it (prefix it with the provider's or controller's name)"
)]
pub struct FlagClash {
    /// The provider or controller whose flag clashes, e.g. `provider "acme"`.
    pub adder: String,
    /// The flag.
    pub flag: String,
    /// Who has it already: "the manager" or another provider.
    pub owner: String,
}

/// The manager's command: [`Options`], with the `--controllers` help generated from `controllers`, each
/// linked provider's flags under a heading of its own, and the binary's identity.
pub fn command(
    registry: &Registry,
    controllers: &[ControllerSpec],
    identity: Option<&BinaryIdentity>,
) -> Result<Command, FlagClash> {
    // Upstream's flags this manager does not implement, hidden, so each is refused by name with why.
    let mut command = super::upstream_flags::add(
        Options::command().mut_arg("controllers", |arg| arg.help(controllers_help(controllers))),
    );
    if let Some(identity) = identity {
        command = command
            .name(identity.name.clone())
            .bin_name(identity.name.clone())
            .version(identity.version.clone());
        if let Some(about) = &identity.about {
            command = command.about(about.clone());
        }
    }
    let about = command.get_about().cloned();
    let long_about = command.get_long_about().cloned();
    let mut owners: BTreeMap<String, String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .map(|long| (long.to_owned(), "the manager".to_owned()))
        .collect();
    let providers = registry.flags().map(|(name, add)| {
        (
            format!("provider {name:?}"),
            format!("Provider {name}"),
            add,
        )
    });
    let controllers = controllers.iter().filter_map(|spec| {
        let name = spec.name().name;
        spec.flags().map(|add| {
            (
                format!("controller {name:?}"),
                format!("Controller {name}"),
                add,
            )
        })
    });
    for (adder, heading, add_flags) in providers.chain(controllers).collect::<Vec<_>>() {
        let added = add_flags(Command::new("flags"));
        for long in added.get_arguments().filter_map(|arg| arg.get_long()) {
            if let Some(owner) = owners.get(long) {
                return Err(FlagClash {
                    adder,
                    flag: long.to_owned(),
                    owner: owner.clone(),
                });
            }
            owners.insert(long.to_owned(), adder.clone());
        }
        command = add_flags(command.next_help_heading(heading));
    }
    // A derived `Args` struct's doc comment becomes the command's description when it is added: the
    // binary keeps its own.
    command = match about {
        Some(about) => command.about(about),
        None => command.about(None::<&str>),
    };
    command = match long_about {
        Some(long_about) => command.long_about(long_about),
        None => command.long_about(None::<&str>),
    };
    Ok(command.next_help_heading(None::<&str>))
}

/// Parses `args` (the binary's name first) with [`command`].
pub fn parse_from<I, T>(
    registry: &Registry,
    controllers: &[ControllerSpec],
    identity: Option<&BinaryIdentity>,
    args: I,
) -> Result<CommandLine, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = command(registry, controllers, identity)
        .map_err(|clash| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, clash))?;
    let matches = command.try_get_matches_from_mut(args)?;
    let options = Options::from_arg_matches(&matches).map_err(|err| err.format(&mut command))?;
    Ok(CommandLine { options, matches })
}
