//! Kubernetes label selectors (`matchLabels` and `matchExpressions`), as the cloud-config's pools and
//! peers and MetalLB's objects write them: checked when read (keys, values, operators), then matched
//! with kube's [`Selector`].

use std::{collections::BTreeMap, fmt};

use kube::core::{Expression, Selector, SelectorExt};
use serde::{Deserialize, Deserializer};

/// A label selector: every `matchLabels` pair and every `matchExpressions` requirement must hold. An
/// empty one selects everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    /// Its requirements, in the order written.
    expressions: Vec<Expression>,
}

/// A `matchExpressions` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Requirement {
    key: String,
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

/// A selector as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
struct Written {
    match_labels: Option<BTreeMap<String, String>>,
    match_expressions: Option<Vec<Requirement>>,
}

impl LabelSelector {
    /// The selector of `matchLabels` pairs only.
    pub fn from_labels(labels: BTreeMap<String, String>) -> Self {
        LabelSelector {
            expressions: labels
                .into_iter()
                .map(|(k, v)| Expression::Equal(k, v))
                .collect(),
        }
    }

    /// Whether objects labelled `labels` are selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.expressions.iter().all(|e| e.matches(labels))
    }

    /// Whether it selects everything.
    pub fn selects_all(&self) -> bool {
        self.expressions.is_empty()
    }

    /// The label keys it reads.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.expressions.iter().map(|e| match e {
            Expression::In(k, _)
            | Expression::NotIn(k, _)
            | Expression::Equal(k, _)
            | Expression::NotEqual(k, _)
            | Expression::Exists(k)
            | Expression::DoesNotExist(k) => k.as_str(),
        })
    }

    /// kube's selector, for a watch's label filter.
    pub fn to_selector(&self) -> Selector {
        let mut selector = Selector::default();
        selector.extend(self.expressions.iter().cloned());
        selector
    }

    /// A selector from its written form; `Err` names what is wrong (`matchLabels ...` or
    /// `matchExpressions[i] ...`).
    fn from_written(written: Written) -> Result<Self, String> {
        let check = |key: &str, value: Option<&str>| {
            cloud_provider::labels::check_qualified_name(key)
                .map_err(|why| format!("label key {key:?}: {why}"))?;
            if let Some(value) = value {
                cloud_provider::labels::check_label_value(value)
                    .map_err(|why| format!("label value {value:?} (key {key:?}): {why}"))?;
            }
            Ok::<(), String>(())
        };
        let mut expressions = Vec::new();
        for (key, value) in written.match_labels.unwrap_or_default() {
            check(&key, Some(&value)).map_err(|why| format!("matchLabels: {why}"))?;
            expressions.push(Expression::Equal(key, value));
        }
        for (i, r) in written
            .match_expressions
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let at = format!("matchExpressions[{i}]");
            check(&r.key, None).map_err(|why| format!("{at}: {why}"))?;
            let values = r.values.unwrap_or_default();
            for value in &values {
                check(&r.key, Some(value)).map_err(|why| format!("{at}: {why}"))?;
            }
            let expression = match (r.operator.as_str(), values.is_empty()) {
                ("In", false) => Expression::In(r.key, values.into_iter().collect()),
                ("NotIn", false) => Expression::NotIn(r.key, values.into_iter().collect()),
                ("Exists", true) => Expression::Exists(r.key),
                ("DoesNotExist", true) => Expression::DoesNotExist(r.key),
                ("In" | "NotIn", true) => {
                    return Err(format!("{at}: operator {} needs values", r.operator));
                }
                ("Exists" | "DoesNotExist", false) => {
                    return Err(format!("{at}: operator {} takes no values", r.operator));
                }
                (other, _) => {
                    return Err(format!(
                        "{at}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                    ));
                }
            };
            expressions.push(expression);
        }
        Ok(LabelSelector { expressions })
    }

    /// A selector from a Kubernetes object's JSON; `Err` names what is wrong.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, String> {
        let written: Written = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
        Self::from_written(written)
    }
}

impl<'de> Deserialize<'de> for LabelSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let written = Written::deserialize(d)?;
        Self::from_written(written).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.expressions.is_empty() {
            return f.write_str("(everything)");
        }
        let parts: Vec<String> = self.expressions.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// Whether any of `selectors` selects `labels` (none: everything is selected), as MetalLB's lists of
/// selectors and the cloud-config's `nodeSelectors` read.
pub fn any_selects(selectors: &[LabelSelector], labels: &BTreeMap<String, String>) -> bool {
    selectors.is_empty() || selectors.iter().any(|s| s.matches(labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_match_as_kubernetes_does() {
        let cases = [
            (json!({}), vec![], true),
            (json!({"matchLabels": {"a": "1"}}), vec![("a", "1")], true),
            (json!({"matchLabels": {"a": "1"}}), vec![("a", "2")], false),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}),
                vec![("a", "2")],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}),
                vec![],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}),
                vec![("b", "")],
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
                vec![("b", "")],
                true,
            ),
            (
                json!({"matchLabels": {"zone": "a"}, "matchExpressions": [{"key": "role", "operator": "Exists"}]}),
                vec![("zone", "a")],
                false,
            ),
        ];
        for (written, on, selected) in cases {
            let selector = LabelSelector::from_json(&written).unwrap();
            assert_eq!(
                selector.matches(&labels(&on)),
                selected,
                "{written} on {on:?}"
            );
        }
    }

    #[test]
    fn bad_selectors_are_named() {
        let cases = [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Has"}]}),
                "matchExpressions[0]: operator \"Has\" is not one of",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "matchExpressions[0]: operator In needs values",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "operator Exists takes no values",
            ),
            (
                json!({"matchLabels": {"a b": "1"}}),
                "matchLabels: label key \"a b\"",
            ),
            (json!({"matchLabels": {"a": "-x-"}}), "label value \"-x-\""),
            (json!({"matchFields": {}}), "unknown field `matchFields`"),
        ];
        for (written, wanted) in cases {
            let err = LabelSelector::from_json(&written).unwrap_err();
            assert!(err.contains(wanted), "{written}: {err}");
        }
    }

    #[test]
    fn none_selects_everything_and_any_one_suffices() {
        let a = LabelSelector::from_labels(labels(&[("a", "1")]));
        let b = LabelSelector::from_labels(labels(&[("b", "1")]));
        assert!(any_selects(&[], &labels(&[])));
        assert!(any_selects(&[a.clone(), b], &labels(&[("b", "1")])));
        assert!(!any_selects(&[a], &labels(&[("b", "1")])));
    }
}
