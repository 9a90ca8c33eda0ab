//! The executables of one cargo build: `cargo xtask compare` builds every test binary it runs
//! in one `cargo test --workspace --no-run` and every benchmark in one `cargo bench
//! --workspace --no-run`, then runs the executables itself.
//!
//! Why: cargo resolves features per invocation. `cargo bench -p lock-redis` builds tokio
//! without `fs` (which sqlx enables for the MySQL crates) and `cargo bench -p
//! distributed-lock` with it, and the two builds of `redis`, `tokio-rustls` and `lock-redis`
//! replaced one another in `target/`: each compare rebuilt them twice (80 s and 58 s here), and
//! the test builds did the same. One `--workspace` build resolves features once, as `cargo
//! xtask test` (`cargo test --workspace`) does, so the builds are shared.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// One executable of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Built {
    /// The directory of its package's `Cargo.toml` (where cargo runs it).
    pub(crate) package_dir: PathBuf,
    /// Its target's name (`conformance`, `redis`, ...).
    pub(crate) target: String,
    /// The executable.
    pub(crate) executable: PathBuf,
}

/// The arguments of one build of `targets` of `kind` (`test` or `bench`) across the
/// workspace, its messages as JSON on standard output (diagnostics rendered as text).
pub(crate) fn build_args(kind: &str, targets: &[&str]) -> Vec<String> {
    let mut args = vec![
        kind.to_owned(),
        "--workspace".to_owned(),
        "--no-run".to_owned(),
        "--message-format=json-render-diagnostics".to_owned(),
    ];
    for target in targets {
        args.push(format!("--{kind}"));
        args.push((*target).to_owned());
    }
    args
}

/// The executables cargo's JSON messages in `log` (a build's output, text lines among them)
/// name, of targets of `kind` (`test` or `bench`).
pub(crate) fn executables(log: &str, kind: &str) -> Vec<Built> {
    log.lines()
        .filter(|line| line.starts_with('{'))
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| {
            message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == kind))
        })
        .filter_map(|message| {
            Some(Built {
                package_dir: Path::new(message["manifest_path"].as_str()?)
                    .parent()?
                    .to_path_buf(),
                target: message["target"]["name"].as_str()?.to_owned(),
                executable: PathBuf::from(message["executable"].as_str()?),
            })
        })
        .collect()
}

/// The executable of `package`'s target `target` (the package's directory is `package`
/// under `root`, as in this workspace).
///
/// # Errors
/// When the build made none.
pub(crate) fn find<'b>(
    built: &'b [Built],
    root: &Path,
    package: &str,
    target: &str,
) -> Result<&'b Built> {
    let dir = root.join(package);
    match built
        .iter()
        .find(|b| b.package_dir == dir && b.target == target)
    {
        Some(found) => Ok(found),
        None => bail!("the build made no `{target}` of {package}"),
    }
}

/// Reads the log of a build at `path` for its executables of `kind`.
///
/// # Errors
/// When the log cannot be read.
pub(crate) fn from_log(path: &Path, kind: &str) -> Result<Vec<Built>> {
    let log =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(executables(&log, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executables_of_the_kind_asked_are_found_among_other_lines() {
        let log = r#"   Compiling lock-redis v0.1.0 (/w/lock-redis)
{"reason":"compiler-artifact","manifest_path":"/w/lock-redis/Cargo.toml","target":{"name":"lock_redis","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","manifest_path":"/w/lock-redis/Cargo.toml","target":{"name":"conformance","kind":["test"]},"executable":"/w/target/debug/deps/conformance-1"}
{"reason":"compiler-artifact","manifest_path":"/w/lock-mysql/Cargo.toml","target":{"name":"conformance","kind":["test"]},"executable":"/w/target/debug/deps/conformance-2"}
{"reason":"compiler-artifact","manifest_path":"/w/lock-redis/Cargo.toml","target":{"name":"redis","kind":["bench"]},"executable":"/w/target/release/deps/redis-3"}
{"reason":"build-finished","success":true}
warning: something
"#;
        let tests = executables(log, "test");
        assert_eq!(tests.len(), 2);
        let root = Path::new("/w");
        let mysql = find(&tests, root, "lock-mysql", "conformance").unwrap();
        assert_eq!(
            mysql.executable,
            PathBuf::from("/w/target/debug/deps/conformance-2")
        );
        assert_eq!(mysql.package_dir, PathBuf::from("/w/lock-mysql"));
        assert!(find(&tests, root, "lock-redis", "redis").is_err());
        let benches = executables(log, "bench");
        assert_eq!(benches.len(), 1);
        assert_eq!(benches[0].target, "redis");
    }

    #[test]
    fn one_build_names_every_target() {
        assert_eq!(
            build_args("bench", &["redis", "mysql"]),
            [
                "bench",
                "--workspace",
                "--no-run",
                "--message-format=json-render-diagnostics",
                "--bench",
                "redis",
                "--bench",
                "mysql"
            ]
        );
    }
}
