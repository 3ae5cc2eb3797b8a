//! OS errors in words, for the messages a refused kernel call leaves.

use std::io;

/// What went wrong, in words: the errno's meaning (the C library's text, not a message of the kernel's)
/// and number, or, for a permission error, that `capability` is needed; an error without an errno as
/// it says itself.
pub(crate) fn describe(error: &io::Error, capability: &str) -> String {
    let text = error.to_string();
    let Some(code) = error.raw_os_error() else {
        return text;
    };
    let meaning = text
        .strip_suffix(&format!(" (os error {code})"))
        .unwrap_or(&text);
    if error.kind() == io::ErrorKind::PermissionDenied {
        format!("{meaning} ({capability} is needed)")
    } else {
        format!("{meaning} (errno {code})")
    }
}
