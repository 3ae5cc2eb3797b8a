//! Tests only: upstream's Go source, read from the Go module cache (`go env GOMODCACHE`), so a test can
//! check our names and values against the constants upstream's code holds rather than a copied list.
//! A module missing from the cache is fetched with `go mod download` from a throwaway module; without
//! the `go` command the caller skips, loudly.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The Go module cache, or `None` (said on stderr) when there is no `go` command.
fn module_cache() -> Option<PathBuf> {
    let output = match Command::new("go").args(["env", "GOMODCACHE"]).output() {
        Ok(output) => output,
        Err(err) => {
            eprintln!(
                "\n!!! SKIPPED: no `go` command ({err}): upstream's source cannot be read, so this check of our names against upstream's did not run\n"
            );
            return None;
        }
    };
    assert!(output.status.success(), "go env GOMODCACHE: {output:?}");
    let path = String::from_utf8(output.stdout).expect("GOMODCACHE is UTF-8");
    Some(PathBuf::from(path.trim()))
}

/// Downloads `module@version` into the cache from a throwaway module (files may land even when `go`
/// complains, e.g. of a newer `go` line in the module's go.mod).
fn download(module: &str, version: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("go.mod"), "module throwaway\n\ngo 1.21\n")
        .expect("write go.mod");
    let output = Command::new("go")
        .args(["mod", "download", "-json", &format!("{module}@{version}")])
        .current_dir(dir.path())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go mod download");
    if !output.status.success() {
        eprintln!(
            "go mod download {module}@{version}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The text of `path` in upstream's `module@version`: `None` only when there is no `go` command.
/// Panics (fails the test) when the module cannot be had.
pub fn read(module: &str, version: &str, path: &str) -> Option<String> {
    let cache = module_cache()?;
    let file = cache.join(format!("{module}@{version}")).join(path);
    if !file.is_file() {
        download(module, version);
    }
    Some(read_file(&file))
}

fn read_file(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap_or_else(|err| panic!("reading upstream's {}: {err}", file.display()))
}

/// The string literal assigned to `name` in Go source (`name = "value"`, or `name: "value"` in a
/// composite literal), first occurrence.
pub fn string_constant<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    source.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(name)?;
        let rest = rest.trim_start();
        let rest = rest
            .strip_prefix('=')
            .or_else(|| rest.strip_prefix(':'))?
            .trim_start();
        let rest = rest.strip_prefix('"')?;
        rest.find('"').map(|end| &rest[..end])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_constants_are_found_in_go_source() {
        let source = "const (\n\tsubsystem = \"route_controller\"\n\toutcomeNoop    = \"noop\"\n)\nvar x = &Opts{\n\tName:           \"route_sync_total\",\n}";
        assert_eq!(
            string_constant(source, "subsystem"),
            Some("route_controller")
        );
        assert_eq!(string_constant(source, "outcomeNoop"), Some("noop"));
        assert_eq!(string_constant(source, "Name"), Some("route_sync_total"));
        assert_eq!(string_constant(source, "outcomeChanged"), None);
    }
}
