//! The `--controllers` flag: a list of `*`, `name` and `-name` entries (upstream §3.3).

use super::controller_table::ControllerName;

/// A `--controllers` list that named only known controllers, with aliases rewritten to canonical names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    entries: Vec<String>,
}

/// A `--controllers` entry that names no known controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--controllers: {name:?} is not in the list of known controllers ({})", .known.join(", "))]
pub struct UnknownController {
    /// The entry as given (without its `-`).
    pub name: String,
    /// The canonical names and aliases.
    pub known: Vec<String>,
}

impl ControllerSelection {
    /// Parses the values of `--controllers` (each may hold several comma-separated entries) against the
    /// known controllers: aliases are rewritten to canonical names (keeping a leading `-`), and any other
    /// name is an error.
    pub fn parse<S: AsRef<str>>(
        values: &[S],
        known: &[ControllerName],
    ) -> Result<Self, UnknownController> {
        let mut entries = Vec::new();
        for entry in values
            .iter()
            .flat_map(|v| v.as_ref().split(','))
            .map(str::trim)
        {
            if entry.is_empty() {
                continue;
            }
            if entry == "*" {
                entries.push(entry.to_owned());
                continue;
            }
            let (minus, name) = match entry.strip_prefix('-') {
                Some(name) => ("-", name),
                None => ("", entry),
            };
            let canonical =
                known
                    .iter()
                    .find(|c| c.is_named(name))
                    .ok_or_else(|| UnknownController {
                        name: name.to_owned(),
                        known: known
                            .iter()
                            .flat_map(|c| std::iter::once(c.name).chain(c.alias))
                            .map(str::to_owned)
                            .collect(),
                    })?;
            entries.push(format!("{minus}{}", canonical.name));
        }
        Ok(Self { entries })
    }

    /// Whether the controller is enabled: the first entry naming it decides (`name` on, `-name` off);
    /// with none, it is on only if `*` is listed and it is enabled by default.
    pub fn is_enabled(&self, controller: &ControllerName) -> bool {
        let name = controller.name;
        for entry in &self.entries {
            if entry == name {
                return true;
            }
            if entry.strip_prefix('-') == Some(name) {
                return false;
            }
        }
        self.entries.iter().any(|e| e == "*") && controller.enabled_by_default
    }

    /// The enabled controllers among `known`, in their order.
    #[cfg(test)]
    pub fn enabled<'a>(&self, known: &'a [ControllerName]) -> Vec<&'a ControllerName> {
        known.iter().filter(|c| self.is_enabled(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::controller_table::builtin_controllers;

    fn known() -> Vec<ControllerName> {
        builtin_controllers().iter().map(|c| *c.name()).collect()
    }

    fn enabled(values: &[&str]) -> Vec<&'static str> {
        let known = known();
        ControllerSelection::parse(values, &known)
            .unwrap()
            .enabled(&known)
            .into_iter()
            .map(|c| c.name)
            .collect()
    }

    const ALL: [&str; 5] = [
        "cloud-node-controller",
        "cloud-node-lifecycle-controller",
        "service-lb-controller",
        "node-route-controller",
        "node-ipam-controller",
    ];

    #[test]
    fn star_enables_everything() {
        assert_eq!(enabled(&["*"]), ALL);
    }

    #[test]
    fn minus_disables_by_alias_or_name() {
        assert_eq!(enabled(&["*,-route,-nodeipam"]), ALL[..3]);
        assert_eq!(
            enabled(&["*", "-node-route-controller", "-service", "-nodeipam"]),
            ALL[..2]
        );
        assert_eq!(enabled(&["-route,-node-ipam-controller,*"]), ALL[..3]);
        assert_eq!(
            enabled(&["*,-route"]),
            [
                "cloud-node-controller",
                "cloud-node-lifecycle-controller",
                "service-lb-controller",
                "node-ipam-controller"
            ]
        );
    }

    #[test]
    fn names_alone_enable_only_themselves() {
        assert_eq!(enabled(&["cloud-node"]), ["cloud-node-controller"]);
        assert_eq!(
            enabled(&["service-lb-controller, cloud-node-lifecycle"]),
            ["cloud-node-lifecycle-controller", "service-lb-controller"]
        );
        assert!(enabled(&[]).is_empty());
        assert!(enabled(&["-route"]).is_empty());
    }

    #[test]
    fn the_first_mention_wins() {
        assert!(enabled(&["-route,route"]).is_empty());
        assert_eq!(enabled(&["route,-route"]), ["node-route-controller"]);
        assert_eq!(enabled(&["-route,-nodeipam,*,route"]), ALL[..3]);
    }

    #[test]
    fn unknown_names_are_errors_that_list_the_known_ones() {
        let err = ControllerSelection::parse(&["*,-bogus"], &known()).unwrap_err();
        assert_eq!(err.name, "bogus");
        let message = err.to_string();
        assert!(
            message.starts_with("--controllers: \"bogus\" is not in the list of known controllers (cloud-node-controller, cloud-node,"),
            "{message}"
        );
        assert!(ControllerSelection::parse(&["ipam"], &known()).is_err());
    }
}
