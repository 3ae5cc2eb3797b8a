//! Kubernetes' syntax rules for label keys and values (apimachinery's `validation.IsQualifiedName` and
//! `IsValidLabelValue`), for flags that name them: errors that say what is wrong before the API server
//! or a selector would.

/// A Kubernetes qualified name (`[prefix/]name`): the name at most 63 characters of letters, digits,
/// `-`, `_` and `.`, beginning and ending with a letter or digit; the prefix a DNS subdomain (at most 253
/// characters of lower-case letters, digits, `-` and `.`, each label beginning and ending with a letter
/// or digit). The API server's rule for label keys and `loadBalancerClass`.
pub(crate) fn check_qualified_name(value: &str) -> Result<(), String> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if name.is_empty() || name.len() > 63 {
        return Err("the name (after any '/') must be 1 to 63 characters".into());
    }
    if !name.starts_with(alnum) || !name.ends_with(alnum) {
        return Err("the name must begin and end with a letter or digit".into());
    }
    if !name
        .chars()
        .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
    {
        return Err("the name may hold only letters, digits, '-', '_' and '.'".into());
    }
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err(
                "the prefix (before the '/') must be a DNS subdomain: lower-case letters, digits, '-' and '.'"
                    .into(),
            );
        }
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of letters, digits, `-`, `_` and `.`, beginning and
/// ending with a letter or digit.
pub(crate) fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if value.len() > 63 {
        return Err("a label value must be at most 63 characters".into());
    }
    if !value.starts_with(alnum) || !value.ends_with(alnum) {
        return Err("a label value must begin and end with a letter or digit".into());
    }
    if !value
        .chars()
        .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
    {
        return Err("a label value may hold only letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}
