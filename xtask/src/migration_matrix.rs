//! The from x to matrix of `cargo xtask compare`: for every ordered pair of stores, whether the
//! mixed-fleet migration scenario passed (distributed-lock's `tests/migration.rs`, which
//! writes its verdicts when `LOCK_MIGRATION_REPORT` names a file) and what `dual` mode cost
//! (distributed-lock's `benches/migration.rs`, one benchmark report per pair, named
//! `FROM -> TO`).

use std::{collections::BTreeMap, ffi::OsStr, path::Path, process::Command};

use anyhow::{Context, Result};
use comfy_table::Table;
use conformance_tests::bench;
use serde::Deserialize;

use crate::services;

/// The variable naming the file the migration test writes its verdicts to.
const REPORT_VAR: &str = "LOCK_MIGRATION_REPORT";

/// One pair's verdict, as the migration test writes it.
#[derive(Debug, Deserialize)]
struct Verdict {
    from: String,
    to: String,
    passed: bool,
}

/// Runs the migration test, writing its verdicts to `file`; whether it passed.
pub(crate) fn run_test(root: &Path, cargo: &OsStr, file: &Path) -> Result<bool> {
    eprintln!("==> migration: cargo test -p distributed-lock --test migration");
    let status = Command::new(cargo)
        .args([
            "test",
            "--quiet",
            "-p",
            "distributed-lock",
            "--test",
            "migration",
        ])
        .current_dir(root)
        .envs(services::env_vars())
        .env(REPORT_VAR, file)
        .status()
        .context("running the migration test")?;
    Ok(status.success())
}

/// Whether a benchmark report is one pair's (`FROM -> TO`).
pub(crate) fn is_pair(report: &bench::Report) -> bool {
    report.store.contains(" -> ")
}

/// The matrix: rows are the store locks move from, columns the store they move to; each cell
/// says whether the mixed fleet passed, `dual`'s cycle against the two stores' own cycles,
/// and the hand-off p50 between two `dual` clients.
pub(crate) fn render(
    verdicts_file: &Path,
    reports: &[bench::Report],
    preset: &str,
) -> Result<String> {
    let verdicts: Vec<Verdict> = if verdicts_file.exists() {
        let text = std::fs::read_to_string(verdicts_file)
            .with_context(|| format!("reading {}", verdicts_file.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("reading {}", verdicts_file.display()))?
    } else {
        Vec::new()
    };
    let passed: BTreeMap<(&str, &str), bool> = verdicts
        .iter()
        .map(|v| ((v.from.as_str(), v.to.as_str()), v.passed))
        .collect();
    let costs: BTreeMap<&str, &bench::Report> = reports
        .iter()
        .filter(|r| is_pair(r))
        .map(|r| (r.store.as_str(), r))
        .collect();
    // The stores in the order the migration test (or else the benchmark) went through them.
    let mut stores: Vec<&str> = Vec::new();
    let sides = verdicts
        .iter()
        .flat_map(|v| [v.from.as_str(), v.to.as_str()])
        .chain(costs.keys().flat_map(|pair| pair.split(" -> ")));
    for store in sides {
        if !stores.contains(&store) {
            stores.push(store);
        }
    }
    let mut table = Table::new();
    table.load_preset(preset);
    let mut header = vec!["from \\ to".to_string()];
    header.extend(stores.iter().map(ToString::to_string));
    table.set_header(header);
    for &from in &stores {
        let mut row = vec![from.to_string()];
        for &to in &stores {
            let verdict = match passed.get(&(from, to)) {
                Some(true) => "ok",
                Some(false) => "FAIL",
                None => "-",
            };
            let cost = costs.get(format!("{from} -> {to}").as_str()).map(|r| {
                let ratio = r.lines.iter().find_map(|l| l.ratio);
                let handoff = r
                    .lines
                    .iter()
                    .find(|l| l.metric == "dual hand-off p50 (ms)")
                    .map(|l| l.value.clone());
                format!(
                    " {} {}ms",
                    ratio.map_or_else(|| "?".to_string(), |x| format!("{x:.2}x")),
                    handoff.unwrap_or_else(|| "?".to_string())
                )
            });
            row.push(format!("{verdict}{}", cost.unwrap_or_default()));
        }
        table.add_row(row);
    }
    Ok(format!(
        "## Migration (from x to)\n\nPer pair: the mixed fleet (ok / FAIL), `dual`'s \
         uncontended cycle against the two stores' own cycles (median of rounds, same run), \
         and the hand-off p50 between two `dual` clients.\n\n{table}"
    ))
}
