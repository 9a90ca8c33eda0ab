//! `cargo xtask chaos`: the fault campaign (the `chaos` binary of `lock-chaos`), with the
//! services up.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::services;

/// Runs `chaos run <args>` (stores, `--duration`, `--seed`, ...; see `chaos run --help`).
pub(crate) fn run(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    services::up(false)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "run",
            "--quiet",
            "-p",
            "lock-chaos",
            "--bin",
            "chaos",
            "--",
            "run",
        ])
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
