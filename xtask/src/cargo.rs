//! Running cargo from xtask: which cargo, and without the variables `cargo run` set for xtask.

use std::{ffi::OsString, process::Command};

/// The cargo binary: the one that runs us (`$CARGO`), else `cargo` from `$PATH`.
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// A command that runs [`cargo`] without the variables `cargo run` set for xtask itself
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). Cargo compares a build script's
/// `rerun-if-env-changed` variables with its own environment: ring's build script names
/// `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME`, so a build started from xtask (where they name
/// xtask) and one from a shell (where they are unset) each found ring stale, and rebuilt it
/// and everything above it (rustls, redis, the lock crates: 60 to 110 s each time here).
pub(crate) fn cargo_command() -> Command {
    let mut command = Command::new(cargo());
    without_cargo_run_variables(&mut command);
    command
}

/// Removes from `command`'s environment the variables `cargo run` set for xtask itself (see
/// [`cargo_command`]).
pub(crate) fn without_cargo_run_variables(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(name);
        }
    }
}

/// Whether `name` is one of the variables `cargo run` sets for the program it runs (about
/// that program's package), not one that configures cargo.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_runs_without_the_variables_cargo_run_set_for_xtask() {
        // `cargo test` sets them for this test as `cargo run` does for xtask.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let command = cargo_command();
        let removed: Vec<_> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
        ] {
            assert!(
                removed.iter().any(|r| r == name),
                "{name} kept: {removed:?}"
            );
        }
        // What configures cargo stays.
        assert!(
            !["CARGO_HOME", "CARGO_TARGET_DIR", "CARGO_TERM_COLOR"]
                .iter()
                .any(|name| set_by_cargo_run(name))
        );
    }
}
