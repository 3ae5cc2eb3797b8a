//! Kubernetes' syntax rules for label keys and values and for namespace names (apimachinery's
//! `validation.IsQualifiedName`, `IsValidLabelValue` and `IsDNS1123Label`), for flags and cloud-configs
//! that name them: errors that say what is wrong before the API server or a selector would.

/// A Kubernetes qualified name (`[prefix/]name`): the name at most 63 characters of letters, digits,
/// `-`, `_` and `.`, beginning and ending with a letter or digit; the prefix a DNS subdomain (at most 253
/// characters of lower-case letters, digits, `-` and `.`, each label beginning and ending with a letter
/// or digit). The API server's rule for label keys and `loadBalancerClass`.
pub fn check_qualified_name(value: &str) -> Result<(), String> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if name.is_empty() || name.len() > 63 {
        return Err("the name (after any '/') must be 1 to 63 characters".into());
    }
    check_label_characters(name, "the name")?;
    if let Some(prefix) = prefix
        && (prefix.is_empty()
            || prefix.len() > 253
            || !prefix.split('.').all(|l| check_dns_label(l).is_ok()))
    {
        return Err(
            "the prefix (before the '/') must be a DNS subdomain: lower-case letters, digits, '-' and '.'"
                .into(),
        );
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of letters, digits, `-`, `_` and `.`, beginning and
/// ending with a letter or digit.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err("a label value must be at most 63 characters".into());
    }
    check_label_characters(value, "a label value")
}

/// `text` (not empty) begins and ends with a letter or digit and holds only letters, digits, `-`, `_`
/// and `.`; `subject` names it in the error.
fn check_label_characters(text: &str, subject: &str) -> Result<(), String> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !text.starts_with(alnum) || !text.ends_with(alnum) {
        return Err(format!(
            "{subject} must begin and end with a letter or digit"
        ));
    }
    if !text
        .chars()
        .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{subject} may hold only letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// A DNS-1123 label, as a namespace's name: at most 63 characters of lower-case letters, digits and `-`,
/// beginning and ending with a letter or digit.
pub fn check_dns_label(value: &str) -> Result<(), String> {
    let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if value.is_empty() || value.len() > 63 {
        return Err("it must be 1 to 63 characters".into());
    }
    if !value.starts_with(lower_alnum) || !value.ends_with(lower_alnum) {
        return Err("it must begin and end with a lower-case letter or digit".into());
    }
    if !value.chars().all(|c| lower_alnum(c) || c == '-') {
        return Err("it may hold only lower-case letters, digits and '-'".into());
    }
    Ok(())
}

/// A DNS-1123 subdomain, as most objects' names (a Node's, a Lease's): at most 253 characters, DNS-1123
/// labels joined by `.`.
pub fn check_dns_subdomain(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > 253 {
        return Err("it must be 1 to 253 characters".into());
    }
    for label in value.split('.') {
        if label.is_empty() {
            return Err("its parts between '.' cannot be empty".into());
        }
        check_dns_label(label).map_err(|why| format!("{label:?}: {why}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keys_and_values() {
        let long = "x".repeat(64);
        let long = long.as_str();
        for ok in ["app", "example.com/tier", "a-b_c.d", "k8s.io/x"] {
            assert_eq!(check_qualified_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "Example.com/x", "a/", "/a", long] {
            assert!(check_qualified_name(bad).is_err(), "{bad}");
        }
        for ok in ["", "v1", "a.b-c_d"] {
            assert_eq!(check_label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-v", "v!", long] {
            assert!(check_label_value(bad).is_err(), "{bad}");
        }
        for ok in ["default", "kube-system", "a1"] {
            assert_eq!(check_dns_label(ok), Ok(()), "{ok}");
        }
        for ok in ["node-1", "node-1.example.com"] {
            assert_eq!(check_dns_subdomain(ok), Ok(()), "{ok}");
        }
        let very_long = "a".repeat(254);
        for bad in ["", "a..b", "Node", ".a", very_long.as_str()] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad}");
        }
        for bad in ["", "Default", "a.b", "-a", "a-", long] {
            assert!(check_dns_label(bad).is_err(), "{bad}");
        }
    }
}
