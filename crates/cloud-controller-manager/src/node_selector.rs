//! `--node-selector`: a label selector in kubectl's `-l` syntax (apimachinery's `labels.Parse`), which
//! nodes a manager owns.
//!
//! Requirements are separated by commas and all must hold: `key=value` (or `==`), `key!=value`,
//! `key in (a,b)`, `key notin (a,b)`, `key` (the label exists), `!key` (it does not), `key>5`, `key<5`
//! (integer values). `!=` and `notin` hold for a node without the label, as in Kubernetes. Keys are
//! qualified names and values label values; anything else is an error that names the requirement.
//!
//! Written here because neither kube nor k8s-openapi parses the string syntax (kube builds selectors
//! from typed expressions only).

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed `--node-selector`; the empty selector matches every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSelector {
    requirements: Vec<Requirement>,
    text: String,
}

impl NodeSelector {
    /// Parses kubectl's syntax; an error names the requirement at fault and why.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(format!(
                    "{text:?}: an empty requirement (two commas in a row?)"
                ));
            }
            requirements.push(parse_requirement(part).map_err(|why| format!("{part:?}: {why}"))?);
        }
        Ok(Self {
            requirements,
            text: text.trim().to_owned(),
        })
    }

    /// Whether a node with these labels matches.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
        self.requirements.iter().all(|r| match r {
            Requirement::In(key, values) => get(key).is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(key, values) => {
                get(key).is_none_or(|v| !values.iter().any(|x| x == v))
            }
            Requirement::Exists(key) => get(key).is_some(),
            Requirement::DoesNotExist(key) => get(key).is_none(),
            Requirement::GreaterThan(key, n) => get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Requirement::LessThan(key, n) => get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }

    /// Whether it matches every node.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The selector as given (for logs).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("{text:?}: a ')' without its '('"))?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: a '(' without its ')'"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Requirement::DoesNotExist(key.to_owned()));
    }
    // Set-based: `key in (…)`, `key notin (…)`.
    for (word, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, rest)) = part.split_once(word) {
            let key = key.trim();
            check_key(key)?;
            let list = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| {
                    format!("the values after {:?} must be in parentheses", word.trim())
                })?;
            let values: Vec<String> = list.split(',').map(|v| v.trim().to_owned()).collect();
            for v in &values {
                check_value(v)?;
            }
            return Ok(if negated {
                Requirement::NotIn(key.to_owned(), values)
            } else {
                Requirement::In(key.to_owned(), values)
            });
        }
    }
    for (op, build) in [
        (
            "!=",
            (|k, v| Requirement::NotIn(k, vec![v])) as fn(String, String) -> Requirement,
        ),
        ("==", |k, v| Requirement::In(k, vec![v])),
        ("=", |k, v| Requirement::In(k, vec![v])),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            let (key, value) = (key.trim(), value.trim());
            check_key(key)?;
            check_value(value)?;
            return Ok(build(key.to_owned(), value.to_owned()));
        }
    }
    for (op, greater) in [(">", true), ("<", false)] {
        if let Some((key, value)) = part.split_once(op) {
            let key = key.trim();
            check_key(key)?;
            let n: i64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{:?} after {op:?} is not an integer", value.trim()))?;
            return Ok(if greater {
                Requirement::GreaterThan(key.to_owned(), n)
            } else {
                Requirement::LessThan(key.to_owned(), n)
            });
        }
    }
    check_key(part)?;
    Ok(Requirement::Exists(part.to_owned()))
}

fn check_key(key: &str) -> Result<(), String> {
    cloud_provider::labels::check_qualified_name(key)
        .map_err(|why| format!("label key {key:?}: {why}"))
}

fn check_value(value: &str) -> Result<(), String> {
    cloud_provider::labels::check_label_value(value)
        .map_err(|why| format!("label value {value:?}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kubectl_syntax_matches_as_kubernetes_does() {
        let fake = labels(&[("cloud", "fake"), ("tier", "3")]);
        let local = labels(&[("cloud", "local")]);
        let table: &[(&str, bool, bool, bool)] = &[
            // (selector, matches fake, matches local, matches a node without labels)
            ("", true, true, true),
            ("cloud=fake", true, false, false),
            ("cloud==fake", true, false, false),
            ("cloud!=fake", false, true, true),
            ("cloud in (fake, local)", true, true, false),
            ("cloud notin (fake)", false, true, true),
            ("cloud", true, true, false),
            ("!cloud", false, false, true),
            ("tier>2", true, false, false),
            ("tier<3", false, false, false),
            ("cloud=fake,tier>2", true, false, false),
            ("cloud in (fake,local),!gpu", true, true, false),
            ("example.com/pool=edge-1", false, false, false),
        ];
        for (text, f, l, none) in table {
            let s = NodeSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(s.matches(Some(&fake)), *f, "{text:?} on fake");
            assert_eq!(s.matches(Some(&local)), *l, "{text:?} on local");
            assert_eq!(s.matches(None), *none, "{text:?} without labels");
        }
        assert!(NodeSelector::parse("").unwrap().is_everything());
    }

    #[test]
    fn malformed_selectors_are_named() {
        for (text, why) in [
            ("cloud=fake,,x", "an empty requirement"),
            ("cloud in fake", "must be in parentheses"),
            ("cloud in (fake", "without its ')'"),
            ("cloud)", "without its '('"),
            ("tier>two", "\"two\" after \">\" is not an integer"),
            ("clo ud=fake", "label key \"clo ud\""),
            ("cloud=fa ke", "label value \"fa ke\""),
            ("cloud=-x", "label value \"-x\""),
            ("Example.com/x=1", "label key"),
        ] {
            let err = NodeSelector::parse(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
