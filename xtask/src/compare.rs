//! `cargo xtask compare`: runs the conformance suite against every backend of the workspace
//! and prints, side by side, what each store passes and what it declares.
//!
//! Each backend's conformance test binary writes a JSON report per store when
//! `LOCK_CONFORMANCE_REPORT_DIR` is set; this command runs them all, then renders the
//! scenario x store matrix and the capabilities table to the terminal and to
//! `target/compare/report.md`, with the benchmarks' figures, the migration's from x to matrix
//! ([`crate::migration_matrix`]) and the latest fault campaign's figures.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};
use comfy_table::{Table, presets};
use conformance_tests::{
    REPORT_DIR_VAR, SuiteReport, Verdict,
    bench::{self, BENCH_REPORT_DIR_VAR},
};
use lock_core::Capabilities;

use crate::services;

/// The benchmarks, as (package, bench target); each writes one JSON report per store.
const BENCHES: &[(&str, &str)] = &[
    ("lock-redis", "redis"),
    ("lock-mysql", "mysql"),
    ("lock-zookeeper", "zookeeper"),
    // `dual` mode per ordered pair of stores (the from x to matrix).
    ("distributed-lock", "migration"),
];

/// The conformance test binaries, as (package, test target), in column order.
const SUITES: &[(&str, &str)] = &[
    ("conformance-tests", "memory"),
    ("lock-redis", "conformance"),
    ("lock-mysql", "conformance"),
    ("lock-zookeeper", "conformance"),
];

/// Runs the comparison.
pub(crate) fn run() -> Result<()> {
    let root = crate::workspace_root();
    services::up(false)?;
    let out = root.join("target/compare");
    let runs = out.join("runs");
    if runs.exists() {
        std::fs::remove_dir_all(&runs).with_context(|| format!("clearing {}", runs.display()))?;
    }
    std::fs::create_dir_all(&runs)?;
    let cargo = crate::test_cmd::cargo();
    let mut failed_suites = Vec::new();
    for (package, target) in SUITES {
        eprintln!("==> conformance: cargo test -p {package} --test {target}");
        let status = Command::new(&cargo)
            .args(["test", "--quiet", "-p", package, "--test", target])
            .current_dir(&root)
            .envs(services::env_vars())
            .env(REPORT_DIR_VAR, &runs)
            .status()
            .with_context(|| format!("running the {package} conformance suite"))?;
        if !status.success() {
            failed_suites.push(format!("{package}/{target}"));
        }
    }
    let verdicts = out.join("migration.json");
    if verdicts.exists() {
        std::fs::remove_file(&verdicts)
            .with_context(|| format!("clearing {}", verdicts.display()))?;
    }
    if !crate::migration_matrix::run_test(&root, &cargo, &verdicts)? {
        failed_suites.push("distributed-lock/migration".to_string());
    }
    let benches = out.join("benches");
    if benches.exists() {
        std::fs::remove_dir_all(&benches)
            .with_context(|| format!("clearing {}", benches.display()))?;
    }
    for (package, target) in BENCHES {
        eprintln!("==> benchmark: cargo bench -p {package} --bench {target}");
        let status = Command::new(&cargo)
            .args(["bench", "--quiet", "-p", package, "--bench", target])
            .current_dir(&root)
            .envs(services::env_vars())
            .env(BENCH_REPORT_DIR_VAR, &benches)
            .status()
            .with_context(|| format!("running the {package} benchmark"))?;
        if !status.success() {
            failed_suites.push(format!("{package} bench {target}"));
        }
    }
    let reports = load(&runs)?;
    let all = load_benches(&benches)?;
    let (pairs, perf): (Vec<_>, Vec<_>) =
        all.into_iter().partition(crate::migration_matrix::is_pair);
    let chaos_dir = root.join("target/chaos");
    let mut markdown = format!(
        "{}\n{}\n\n{}\n",
        render(&reports),
        render_benches(&perf, presets::ASCII_MARKDOWN),
        crate::migration_matrix::render(&verdicts, &pairs, &perf, presets::ASCII_MARKDOWN)?
    );
    if let Some(chaos) = crate::chaos::render_latest(&chaos_dir, presets::ASCII_MARKDOWN)? {
        markdown.push_str(&format!("\n{chaos}\n"));
    }
    println!("{}", render_with(&reports, presets::UTF8_FULL_CONDENSED));
    println!("{}", render_benches(&perf, presets::UTF8_FULL_CONDENSED));
    println!(
        "{}",
        crate::migration_matrix::render(&verdicts, &pairs, &perf, presets::UTF8_FULL_CONDENSED)?
    );
    if let Some(chaos) = crate::chaos::render_latest(&chaos_dir, presets::UTF8_FULL_CONDENSED)? {
        println!("{chaos}");
    }
    std::fs::write(out.join("report.md"), &markdown)?;
    eprintln!("wrote {}", out.join("report.md").display());
    if !failed_suites.is_empty() {
        bail!("failing conformance suites: {}", failed_suites.join(", "));
    }
    Ok(())
}

/// Reads every report in `dir`: the memory reference column first, then by store label.
fn load(dir: &Path) -> Result<Vec<SuiteReport>> {
    let mut reports = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            let report: SuiteReport = serde_json::from_str(&text)
                .with_context(|| format!("reading {}", path.display()))?;
            reports.push(report);
        }
    }
    reports.sort_by_key(|r| (r.store != "memory", r.store.clone()));
    Ok(reports)
}

/// Reads every benchmark report in `dir` (none when the directory is missing).
fn load_benches(dir: &Path) -> Result<Vec<bench::Report>, anyhow::Error> {
    let mut reports = Vec::new();
    if !dir.exists() {
        return Ok(reports);
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            let report: bench::Report = serde_json::from_str(&text)
                .with_context(|| format!("reading {}", path.display()))?;
            reports.push(report);
        }
    }
    reports.sort_by(|a, b| a.store.cmp(&b.store));
    Ok(reports)
}

fn render_benches(reports: &[bench::Report], preset: &str) -> String {
    let mut table = Table::new();
    table.load_preset(preset);
    table.set_header([
        "store",
        "metric",
        "measured (ratios: same run, same machine)",
        "target",
    ]);
    for report in reports {
        for line in &report.lines {
            let target = match (line.ratio, line.target) {
                (Some(ratio), Some(target)) if ratio <= target => format!("<= {target}x: met"),
                (Some(_), Some(target)) => format!("<= {target}x: NOT met"),
                _ => String::new(),
            };
            table.add_row([report.store.as_str(), &line.metric, &line.value, &target]);
        }
    }
    format!("## Performance\n\n{table}")
}

fn render(reports: &[SuiteReport]) -> String {
    format!(
        "# Lock store comparison\n\nGenerated by `cargo xtask compare`.\n\n{}\n",
        render_with(reports, presets::ASCII_MARKDOWN)
    )
}

fn render_with(reports: &[SuiteReport], preset: &str) -> String {
    let mut matrix = Table::new();
    matrix.load_preset(preset);
    let mut header = vec!["scenario".to_string(), "covers".to_string()];
    header.extend(reports.iter().map(|r| r.store.clone()));
    matrix.set_header(header);
    for scenario in conformance_tests::all_scenarios() {
        let mut row = vec![scenario.name.to_string(), scenario.covers.to_string()];
        for report in reports {
            let cell = report
                .results
                .iter()
                .find(|r| r.scenario == scenario.name)
                .map_or_else(|| "-".to_string(), |r| cell(r.verdict, r.millis));
            row.push(cell);
        }
        matrix.add_row(row);
    }
    let mut totals = vec!["total".to_string(), String::new()];
    totals.extend(reports.iter().map(|r| {
        let mut t = format!(
            "{} pass, {} fail, {} n/a",
            r.passed(),
            r.failed(),
            r.not_applicable()
        );
        if let Some(error) = &r.error {
            t.push_str(&format!(" ({error})"));
        }
        t
    }));
    matrix.add_row(totals);

    let mut caps = Table::new();
    caps.load_preset(preset);
    let mut header = vec!["capability".to_string()];
    header.extend(reports.iter().map(|r| r.store.clone()));
    caps.set_header(header);
    let properties: [(&str, Show); 9] = [
        ("fencing", |c| format!("{:?}", c.fencing)),
        ("expiry", |c| format!("{:?}", c.expiry)),
        ("wake-up", |c| format!("{:?}", c.wakeup)),
        ("waiter order", |c| format!("{:?}", c.order)),
        ("clock", |c| format!("{:?}", c.clock)),
        ("portable lease", |c| c.portable_lease.to_string()),
        ("failover", |c| format!("{:?}", c.failover)),
        ("replica acks", |c| c.replica_acks.to_string()),
        ("batched renewals", |c| c.batched_renewals.to_string()),
    ];
    let mut urls = vec!["URL".to_string()];
    urls.extend(reports.iter().map(|r| {
        if r.url.is_empty() {
            "-".to_string()
        } else {
            r.url.clone()
        }
    }));
    caps.add_row(urls);
    for (label, show) in properties {
        let mut row = vec![label.to_string()];
        row.extend(reports.iter().map(|r| {
            r.capabilities
                .as_ref()
                .map_or_else(|| "?".to_string(), show)
        }));
        caps.add_row(row);
    }
    format!("## Conformance\n\n{matrix}\n\n## Capabilities\n\n{caps}")
}

/// Renders one capability of a store.
type Show = fn(&Capabilities) -> String;

fn cell(verdict: Verdict, millis: u64) -> String {
    match verdict {
        Verdict::Pass => format!("pass ({millis} ms)"),
        Verdict::Fail => "FAIL".to_string(),
        Verdict::NotApplicable => "n/a".to_string(),
    }
}
