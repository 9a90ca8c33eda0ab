//! `cargo xtask chaos`: the fault campaign (the `chaos` binary of `lock-chaos`), with the
//! services up.

use std::path::Path;

use anyhow::{Context, Result, bail};
use comfy_table::Table;
use serde_json::Value;

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
    let status = crate::cargo::cargo_command()
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

/// The latest campaign's summaries per store (those `chaos run` wrote into `dir`; none when
/// no campaign ran yet), sorted by store. They are read as JSON values, so `xtask` needs no
/// build of the campaign.
pub(crate) fn load_latest(dir: &Path) -> Result<Vec<Value>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut summaries = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let history = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".history.json"));
        if path.extension().is_some_and(|e| e == "json") && !history {
            let text = std::fs::read_to_string(&path)?;
            let value: Value = serde_json::from_str(&text)
                .with_context(|| format!("reading {}", path.display()))?;
            summaries.push(value);
        }
    }
    summaries.sort_by_key(|s| s["store"].as_str().unwrap_or_default().to_owned());
    Ok(summaries)
}

/// Whether a campaign's summary passed: it lists no violation (a summary without the list
/// did not pass).
pub(crate) fn passed(summary: &Value) -> bool {
    summary["violations"].as_array().is_some_and(Vec::is_empty)
}

/// The campaign's figures per store (`summaries` as [`load_latest`] read them), as a table in
/// `preset`; `None` when there are none.
pub(crate) fn render(summaries: &[Value], preset: &str) -> Option<String> {
    if summaries.is_empty() {
        return None;
    }
    let mut table = Table::new();
    table.load_preset(preset);
    table.set_header([
        "store",
        "fencing strict",
        "seconds (seed)",
        "acquisitions",
        "overlaps (trusted)",
        "stale writes",
        "fence regressions",
        "stuck gaps",
        "panics",
        "faults",
        "verdict",
    ]);
    for s in summaries {
        let f = &s["findings"];
        let n = |key: &str| f[key].as_u64().unwrap_or_default().to_string();
        table.add_row([
            s["store"].as_str().unwrap_or_default().to_owned(),
            s["strict"].as_bool().unwrap_or_default().to_string(),
            format!(
                "{:.0} ({})",
                s["seconds"].as_f64().unwrap_or_default(),
                s["seed"].as_u64().unwrap_or_default()
            ),
            n("acquisitions"),
            format!("{} ({})", n("overlaps"), n("trusted_overlaps")),
            n("stale_writes"),
            n("fence_regressions"),
            n("stuck_gaps"),
            n("panics"),
            n("faults"),
            if passed(s) {
                "pass".into()
            } else {
                "FAIL".into()
            },
        ]);
    }
    Some(format!(
        "## Fault campaign (the latest `cargo xtask chaos` or `cargo xtask test`)\n\n{table}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_summaries_become_a_table() {
        let dir = std::env::temp_dir().join(format!("xtask-chaos-{}", std::process::id()));
        assert!(load_latest(&dir).unwrap().is_empty());
        assert!(render(&[], "||  |-|||          ").is_none());
        std::fs::create_dir_all(&dir).unwrap();
        let summary = r#"{"store":"redis","seed":1,"seconds":20.0,"strict":true,"faults":{},
            "findings":{"acquisitions":344,"overlaps":189,"trusted_overlaps":0,"stale_writes":2,
            "fence_regressions":0,"stuck_gaps":0,"panics":0,"faults":14},
            "violations":["2 stale writes accepted"]}"#;
        std::fs::write(dir.join("redis.json"), summary).unwrap();
        // A history beside it is not a summary.
        std::fs::write(dir.join("redis.history.json"), r#"{"sections":[]}"#).unwrap();
        let summaries = load_latest(&dir).unwrap();
        let table = render(&summaries, comfy_table::presets::ASCII_MARKDOWN).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(table.contains("| redis "), "{table}");
        assert!(table.contains("344"), "{table}");
        assert!(table.contains("189 (0)"), "{table}");
        assert!(table.contains("FAIL"), "{table}");
        // The header, its rule and one row: the history made none.
        assert_eq!(
            table.lines().filter(|l| l.starts_with('|')).count(),
            3,
            "{table}"
        );
    }
}
