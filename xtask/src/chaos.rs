//! `cargo xtask chaos`: the fault campaign (the `chaos` binary of `lock-chaos`), with the
//! services up.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::services;

/// How cargo runs the campaign: `cargo` with these, then `chaos run`'s own arguments.
pub(crate) const CHAOS_RUN: [&str; 8] = [
    "run",
    "--quiet",
    "-p",
    "lock-chaos",
    "--bin",
    "chaos",
    "--",
    "run",
];

/// Runs `chaos run <args>` (stores, `--duration`, `--seed`, ...; see `chaos run --help`).
pub(crate) fn run(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    services::up(false)?;
    let status = Command::new(crate::test_cmd::cargo())
        .args(CHAOS_RUN)
        .args(args)
        .current_dir(&root)
        .envs(services::env_vars())
        .status()
        .context("running the chaos campaign")?;
    if !status.success() {
        bail!("the chaos campaign failed ({status})");
    }
    Ok(())
}
