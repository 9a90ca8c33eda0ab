//! `cargo xtask compare`: runs the conformance suite against every backend of the workspace,
//! the benchmarks and the migration test, and writes what each store passes, declares and
//! measured as a report (see [`crate::report`]): `target/compare/report.html`, `report.md`
//! and `report.json`, with a summary on the terminal.
//!
//! It builds every test binary it runs in one cargo build and every benchmark in another (see
//! [`crate::built`]), then runs each executable as a step, as cargo would run it (in its
//! package's directory, `CARGO_MANIFEST_DIR` naming it).
//!
//! Each backend's conformance test binary writes a JSON report per store when
//! `LOCK_CONFORMANCE_REPORT_DIR` is set, each benchmark one per store when
//! `LOCK_BENCH_REPORT_DIR` is; the migration's from x to matrix comes from
//! [`crate::migration_matrix`], the fault campaign's figures from the latest campaign.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};
use conformance_tests::{
    REPORT_DIR_VAR, SuiteReport,
    bench::{self, BENCH_REPORT_DIR_VAR},
    selection,
};

use crate::{report::Collected, services, steps::Steps};

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

/// The parts of the comparison that can be chosen.
pub(crate) const WORKLOADS: [&str; 6] = [
    "conformance",
    selection::UNCONTENDED,
    selection::CLIENTS,
    selection::SWEEP,
    selection::RENEWAL,
    "migration",
];

/// The stores the suites and benchmarks know, by the names `--only` takes.
pub(crate) const STORES: [&str; 8] = [
    "memory",
    "redis",
    "redis-cluster",
    "redlock",
    "mysql-lease",
    "mysql-rowlock",
    "zookeeper",
    "zookeeper-ensemble",
];

/// The options of `cargo xtask compare`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct CompareArgs {
    /// A run of a few minutes: one conformance scenario per store (enough for the
    /// capabilities), a tenth of the benchmarks' rounds, of the runs of separate clients the
    /// first (16 clients holding 1 ms) and of the sweep 1, 4 and 16 clients, a third as long,
    /// a tenth of the renewal workload's held locks, and no migration unless `--workload`
    /// names it.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Only these stores (comma-separated): memory, redis, redis-cluster, redlock,
    /// mysql-lease, mysql-rowlock, zookeeper, zookeeper-ensemble.
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Only these parts (comma-separated): conformance, uncontended (one client against
    /// the raw floor), clients (separate clients on one lock, peers beside), sweep (1 to 64
    /// clients on many names), renewal (10,000 locks held by one client, renewed period
    /// after period), migration.
    #[arg(long, value_delimiter = ',')]
    pub(crate) workload: Vec<String>,
    /// Of the runs of separate clients on one lock (workload `clients`), only those with
    /// these numbers of clients (comma-separated: 2, 16, 100, 1000).
    #[arg(long, value_delimiter = ',')]
    pub(crate) clients: Vec<usize>,
}

impl CompareArgs {
    /// The names given that are not known, as an error naming the known ones.
    fn check(&self) -> Result<()> {
        if let Some(store) = self.only.iter().find(|s| !STORES.contains(&s.as_str())) {
            bail!("no store `{store}`; stores: {}", STORES.join(", "));
        }
        if let Some(name) = self
            .workload
            .iter()
            .find(|w| !WORKLOADS.contains(&w.as_str()))
        {
            bail!("no workload `{name}`; workloads: {}", WORKLOADS.join(", "));
        }
        let mut sizes: Vec<usize> = Vec::new();
        for (clients, _) in conformance_tests::bench::FLEET_RUNS {
            if !sizes.contains(&clients) {
                sizes.push(clients);
            }
        }
        if let Some(size) = self.clients.iter().find(|n| !sizes.contains(n)) {
            let known: Vec<String> = sizes.iter().map(ToString::to_string).collect();
            bail!("no run of {size} clients; runs: {}", known.join(", "));
        }
        Ok(())
    }

    /// Whether the part `name` runs.
    fn runs(&self, name: &str) -> bool {
        self.workload.is_empty() || self.workload.iter().any(|w| w == name)
    }

    /// The environment the suites and benchmarks read it from (see
    /// `conformance_tests::selection`).
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if !self.only.is_empty() {
            env.push((selection::ONLY_VAR, self.only.join(",")));
        }
        if !self.workload.is_empty() {
            env.push((selection::WORKLOAD_VAR, self.workload.join(",")));
        }
        if !self.clients.is_empty() {
            let sizes: Vec<String> = self.clients.iter().map(ToString::to_string).collect();
            env.push((selection::FLEET_SIZES_VAR, sizes.join(",")));
        }
        if self.quick {
            env.push((selection::QUICK_VAR, "1".to_string()));
        }
        env
    }
}

/// The scenario a quick run's suites run (each store's report still carries its URL and
/// capabilities).
const QUICK_SCENARIO: &str = "exclusion/try_acquire_excludes";

/// Runs the comparison.
pub(crate) fn run(args: &CompareArgs) -> Result<()> {
    args.check()?;
    let root = crate::workspace_root();
    services::up(false)?;
    let out = root.join("target/compare");
    // This run's outputs, emptied first: the suites' reports, the benchmarks' reports, the
    // migration test's verdicts.
    let (runs, benches, verdicts) = (
        out.join("runs"),
        out.join("benches"),
        out.join("migration.json"),
    );
    for dir in [&runs, &benches] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir)?;
    }
    if verdicts.exists() {
        std::fs::remove_file(&verdicts)
            .with_context(|| format!("clearing {}", verdicts.display()))?;
    }
    let failed_steps = run_steps(args, &root, &out, (&runs, &benches, &verdicts))?;
    let all = load_benches(&benches)?;
    let (pairs, benches): (Vec<_>, Vec<_>) =
        all.into_iter().partition(crate::migration_matrix::is_pair);
    let chaos_dir = root.join("target/chaos");
    let migration = if verdicts.exists() {
        serde_json::from_str(&std::fs::read_to_string(&verdicts)?)
            .with_context(|| format!("reading {}", verdicts.display()))?
    } else {
        serde_json::Value::Null
    };
    let collected = Collected {
        suites: load(&runs)?,
        benches,
        pairs,
        migration,
        chaos: crate::chaos::load_latest(&chaos_dir)?,
    };
    let page = collected.write(&out)?;
    println!("{}", collected.terminal());
    println!(
        "\nThe whole report: {}\n(also report.md and report.json beside it)",
        page.strip_prefix(&root).unwrap_or(&page).display()
    );
    if !failed_steps.is_empty() {
        bail!(
            "{} step(s) failed or did not run (the FAIL lines above name their logs): {}",
            failed_steps.len(),
            failed_steps.join("; ")
        );
    }
    Ok(())
}

/// Runs the chosen suites (writing into `runs`), the migration test (its verdicts into
/// `verdicts`) and the benchmarks (into `benches`), each as a step (see [`Steps`]) after one
/// build of all the test binaries and one of all the benchmarks (see [`crate::built`]); the
/// steps that failed.
fn run_steps(
    args: &CompareArgs,
    root: &Path,
    out: &Path,
    (runs, benches, verdicts): (&Path, &Path, &Path),
) -> Result<Vec<String>> {
    // A quick run leaves the migration out unless it is asked for by name.
    let migration = if args.quick {
        args.workload.iter().any(|w| w == "migration")
    } else {
        args.runs("migration")
    };
    let (suites, benches_run) = (
        args.runs("conformance"),
        args.runs(selection::UNCONTENDED)
            || args.runs(selection::CLIENTS)
            || args.runs(selection::SWEEP)
            || args.runs(selection::RENEWAL),
    );
    let tests: Vec<(&str, &str)> = SUITES
        .iter()
        .filter(|_| suites)
        .chain(migration.then_some(&crate::migration_matrix::TEST))
        .copied()
        .collect();
    let bench_runs: Vec<(&str, &str)> = BENCHES
        .iter()
        .filter(|(package, _)| {
            // `dual` mode per pair of stores belongs to the migration.
            if *package == "distributed-lock" {
                migration
            } else {
                benches_run
            }
        })
        .copied()
        .collect();
    let logs = out.join("logs");
    let total = [&tests, &bench_runs]
        .iter()
        .map(|runs| runs.len() + usize::from(!runs.is_empty()))
        .sum();
    let steps = Steps::new(total, &logs)?;
    let mut failed = Vec::new();
    for (kind, chosen) in [("test", &tests), ("bench", &bench_runs)] {
        if chosen.is_empty() {
            continue;
        }
        let targets: Vec<&str> = chosen.iter().map(|(_, target)| *target).collect();
        let name = format!("build: every {kind} binary in one cargo build");
        let mut build = crate::cargo::cargo_command();
        build
            .args(crate::built::build_args(kind, &targets))
            .current_dir(root);
        if !steps.run(&name, &format!("build-{kind}"), &mut build)? {
            // Nothing of this kind can run: each of its steps is reported as not run.
            failed.push(name);
            for (package, target) in chosen.iter() {
                failed.push(format!(
                    "not run (the build failed): {package} --{kind} {target}"
                ));
            }
            continue;
        }
        let built = crate::built::from_log(&logs.join(format!("build-{kind}.log")), kind)?;
        for &(package, target) in chosen.iter() {
            let exe = match crate::built::find(&built, root, package, target) {
                Ok(exe) => exe,
                Err(error) => {
                    failed.push(format!("not run: {error}"));
                    continue;
                }
            };
            let (name, file, mut command) = step_of(
                args,
                exe,
                kind,
                (package, target),
                (runs, benches, verdicts),
            );
            if !steps.run(&name, &file, &mut command)? {
                failed.push(name);
            }
        }
    }
    steps.finish();
    Ok(failed)
}

/// The step that runs `exe`, the executable of `package`'s target `target` of `kind` (`test`
/// or `bench`), as cargo would (in its package's directory), with the services' variables,
/// the selection, and where it writes its report: its name, its log's file name, its command.
fn step_of(
    args: &CompareArgs,
    exe: &crate::built::Built,
    kind: &str,
    (package, target): (&str, &str),
    (runs, benches, verdicts): (&Path, &Path, &Path),
) -> (String, String, Command) {
    let mut command = Command::new(&exe.executable);
    // xtask's own package variables (from `cargo run`) are not the target's: cargo sets
    // `CARGO_MANIFEST_DIR` to the target's package when it runs one.
    crate::cargo::without_cargo_run_variables(&mut command);
    command
        .current_dir(&exe.package_dir)
        .env("CARGO_MANIFEST_DIR", &exe.package_dir)
        .envs(services::env_vars())
        .envs(args.env());
    let (name, file) = match (kind, (package, target) == crate::migration_matrix::TEST) {
        ("test", true) => {
            command.env(crate::migration_matrix::REPORT_VAR, verdicts);
            (
                "migration: ordered pairs of the chosen stores".to_string(),
                "migration".to_string(),
            )
        }
        ("test", false) => {
            command.env(REPORT_DIR_VAR, runs);
            if args.quick {
                command.arg(QUICK_SCENARIO);
            }
            (
                format!("conformance: {package} --test {target}"),
                format!("conformance-{package}"),
            )
        }
        _ => {
            command.env(BENCH_REPORT_DIR_VAR, benches);
            (
                format!("benchmark: {package} --bench {target}"),
                format!("bench-{package}-{target}"),
            )
        }
    };
    (name, file, command)
}

/// Reads every JSON file in `dir` as a `T` (none when the directory is missing).
fn load_json<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<Vec<T>> {
    let mut all = Vec::new();
    if !dir.exists() {
        return Ok(all);
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            all.push(
                serde_json::from_str(&text)
                    .with_context(|| format!("reading {}", path.display()))?,
            );
        }
    }
    Ok(all)
}

/// Reads every suite report in `dir`: the memory reference column first, then by store.
fn load(dir: &Path) -> Result<Vec<SuiteReport>> {
    let mut reports: Vec<SuiteReport> = load_json(dir)?;
    reports.sort_by_key(|r| (r.store != "memory", r.store.clone()));
    Ok(reports)
}

/// Reads every benchmark report in `dir`, by store.
fn load_benches(dir: &Path) -> Result<Vec<bench::Report>> {
    let mut reports: Vec<bench::Report> = load_json(dir)?;
    reports.sort_by(|a, b| a.store.cmp(&b.store));
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(only: &[&str], workload: &[&str], clients: &[usize]) -> CompareArgs {
        CompareArgs {
            only: only.iter().map(ToString::to_string).collect(),
            workload: workload.iter().map(ToString::to_string).collect(),
            clients: clients.to_vec(),
            ..CompareArgs::default()
        }
    }

    #[test]
    fn unknown_names_and_sizes_are_errors_naming_the_known_ones() {
        let store = args(&["postgres"], &[], &[])
            .check()
            .unwrap_err()
            .to_string();
        assert!(store.contains("no store `postgres`") && store.contains("mysql-lease"));
        let workload = args(&[], &["latency"], &[])
            .check()
            .unwrap_err()
            .to_string();
        assert!(workload.contains("no workload `latency`") && workload.contains("sweep"));
        let size = args(&[], &[], &[16, 50]).check().unwrap_err().to_string();
        assert_eq!(size, "no run of 50 clients; runs: 16, 2, 100, 1000");
        assert!(args(&["redis"], &["clients"], &[16, 1000]).check().is_ok());
    }

    #[test]
    fn client_sizes_reach_the_benchmarks() {
        let env = args(&[], &["clients"], &[100, 1000]).env();
        assert!(env.contains(&(selection::FLEET_SIZES_VAR, "100,1000".to_string())));
        assert!(
            !args(&[], &[], &[])
                .env()
                .iter()
                .any(|(var, _)| *var == selection::FLEET_SIZES_VAR)
        );
    }
}
