//! `cargo xtask test`: the rust-version check, services up, then fmt, clippy, docs (warnings
//! denied), packaging of the library crates, and the test suite.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo::cargo_command, services};

/// Options of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// Print the steps (with their environment) instead of running them.
    #[arg(long)]
    dry_run: bool,
}

/// One cargo invocation of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    /// Short name printed in the header and the summary.
    pub(crate) name: &'static str,
    /// Arguments after `cargo`.
    pub(crate) args: Vec<&'static str>,
    /// Variables set for this step only.
    pub(crate) env: Vec<(&'static str, &'static str)>,
}

/// The cargo steps, in order.
pub(crate) fn steps() -> Vec<Step> {
    vec![
        Step {
            name: "fmt",
            args: vec!["fmt", "--all", "--", "--check"],
            env: Vec::new(),
        },
        Step {
            name: "clippy",
            args: vec![
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
            env: Vec::new(),
        },
        Step {
            name: "doc",
            args: vec!["doc", "--workspace", "--no-deps"],
            env: vec![("RUSTDOCFLAGS", "-D warnings")],
        },
        Step {
            name: "package",
            // Every library crate packages: metadata, files, versioned path dependencies
            // (`--allow-dirty`: a developer's uncommitted work is packaged as it is). Not
            // verified by building here: cargo reuses the sources it unpacked from an earlier
            // package of the same version (in CARGO_HOME), so a second run would build
            // stale copies of the workspace's own crates.
            args: vec![
                "package",
                "--workspace",
                "--exclude",
                "xtask",
                "--allow-dirty",
                "--no-verify",
                "--quiet",
            ],
            env: Vec::new(),
        },
        Step {
            name: "test",
            args: vec!["test", "--workspace"],
            env: Vec::new(),
        },
        // The fault campaign, short and seeded: 20 s per store; fails on a stale write or a
        // fence regression where fencing is strict, a stuck lock or a panic.
        Step {
            name: "chaos",
            args: [
                &crate::chaos::CHAOS_RUN[..],
                &["--duration", "20", "--seed", "1"],
            ]
            .concat(),
            env: Vec::new(),
        },
    ]
}

/// The command for `step`: run in the workspace root with the service variables set and
/// stdio inherited.
pub(crate) fn command(step: &Step, root: &Path) -> Command {
    let mut cmd = cargo_command();
    cmd.args(&step.args)
        .current_dir(root)
        .envs(services::env_vars())
        .envs(step.env.iter().copied());
    cmd
}

/// Prints the wall time of each finished step and the total.
fn summary(times: &[(&str, Duration, bool)], total: Duration) {
    eprintln!("==> summary");
    for (name, took, ok) in times {
        let verdict = if *ok { "ok" } else { "FAILED" };
        eprintln!("    {name:<10} {:>8.1}s  {verdict}", took.as_secs_f64());
    }
    eprintln!("    {:<10} {:>8.1}s", "total", total.as_secs_f64());
}

/// Runs the pipeline, stopping at the first failing step.
pub(crate) fn run(args: &TestArgs) -> Result<()> {
    let root = crate::workspace_root();
    if args.dry_run {
        eprintln!("==> services up");
        for step in steps() {
            let cmd = command(&step, &root);
            let envs: Vec<String> = cmd
                .get_envs()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        k.to_string_lossy(),
                        v.map(|v| v.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    )
                })
                .collect();
            eprintln!("==> {}", step.name);
            println!(
                "(cd {} && {} {} {})",
                root.display(),
                envs.join(" "),
                cmd.get_program().to_string_lossy(),
                step.args.join(" ")
            );
        }
        return Ok(());
    }

    let begun = Instant::now();
    let mut times: Vec<(&str, Duration, bool)> = Vec::new();

    eprintln!("==> rust-version");
    let t = Instant::now();
    let msrv = crate::msrv::check(&root);
    times.push(("msrv", t.elapsed(), msrv.is_ok()));
    if let Err(err) = msrv {
        summary(&times, begun.elapsed());
        return Err(err);
    }

    eprintln!("==> services up");
    let t = Instant::now();
    let up = services::up(false);
    times.push(("services", t.elapsed(), up.is_ok()));
    if let Err(err) = up {
        summary(&times, begun.elapsed());
        return Err(err);
    }

    for step in steps() {
        eprintln!("==> {} (cargo {})", step.name, step.args.join(" "));
        let t = Instant::now();
        let status = command(&step, &root)
            .status()
            .with_context(|| format!("running cargo {}", step.args.join(" ")))?;
        let took = t.elapsed();
        times.push((step.name, took, status.success()));
        eprintln!(
            "<== {} {} ({:.1}s)",
            step.name,
            if status.success() { "ok" } else { "FAILED" },
            took.as_secs_f64()
        );
        if !status.success() {
            summary(&times, begun.elapsed());
            bail!("step `{}` failed ({status})", step.name);
        }
    }
    summary(&times, begun.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_fmt_clippy_doc_package_test_chaos() {
        let lines: Vec<String> = steps().iter().map(|s| s.args.join(" ")).collect();
        assert_eq!(
            lines,
            [
                "fmt --all -- --check",
                "clippy --workspace --all-targets -- -D warnings",
                "doc --workspace --no-deps",
                "package --workspace --exclude xtask --allow-dirty --no-verify --quiet",
                "test --workspace",
                "run --quiet -p lock-chaos --bin chaos -- run --duration 20 --seed 1",
            ]
        );
    }

    #[test]
    fn commands_carry_the_service_env() {
        let root = crate::workspace_root();
        let cmd = command(&steps()[4], &root);
        let names: Vec<String> = cmd
            .get_envs()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for (name, _) in services::env_vars() {
            assert!(names.contains(&name), "{name} missing");
        }
        assert_eq!(cmd.get_current_dir(), Some(root.as_path()));
    }
}
