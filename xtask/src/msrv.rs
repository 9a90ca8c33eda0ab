//! The declared `rust-version` holds: no dependency needs a newer compiler than the workspace
//! declares, and the compiler running the tests is not older than it.
//!
//! Only one toolchain can be installed on the machines this project runs on, so the check
//! reads what each package declares (`cargo metadata`) instead of building with the oldest
//! compiler.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

/// A `major.minor[.patch]` version, compared numerically.
type Version = (u64, u64, u64);

fn parse(text: &str) -> Option<Version> {
    let mut parts = text.trim().split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

fn show((major, minor, patch): Version) -> String {
    format!("{major}.{minor}.{patch}")
}

/// Checks the workspace's declared `rust-version` against its dependencies' and the running
/// compiler's.
pub(crate) fn check(root: &Path) -> Result<()> {
    let out = crate::cargo::cargo_command()
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .map(|m| m.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let version_of = |p: &serde_json::Value| p["rust_version"].as_str().and_then(parse);
    let declared = packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
        .filter_map(version_of)
        .min()
        .context("no workspace member declares a rust-version")?;
    let needed = packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| !members.contains(&id)))
        .filter_map(|p| Some((version_of(p)?, p["name"].as_str()?.to_string())))
        .max();
    if let Some((needed, by)) = needed
        && needed > declared
    {
        bail!(
            "the workspace declares rust-version {} but the dependency `{by}` needs {}; raise \
             [workspace.package] rust-version",
            show(declared),
            show(needed)
        );
    }
    let rustc = Command::new("rustc").arg("--version").output()?;
    let text = String::from_utf8_lossy(&rustc.stdout);
    let running = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| parse(v.split('-').next().unwrap_or(v)))
        .with_context(|| format!("reading the rustc version from {text:?}"))?;
    if running < declared {
        bail!(
            "rustc {} is older than the declared rust-version {}",
            show(running),
            show(declared)
        );
    }
    eprintln!(
        "rust-version {}: every dependency builds with it; rustc {}",
        show(declared),
        show(running)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(parse("1.94"), Some((1, 94, 0)));
        assert_eq!(parse("1.94.0"), Some((1, 94, 0)));
        assert!(parse("1.100").unwrap() > parse("1.94.1").unwrap());
        assert_eq!(parse("one.two"), None);
    }

    #[test]
    fn the_workspace_declares_what_its_dependencies_need() {
        check(&crate::workspace_root()).unwrap();
    }
}
