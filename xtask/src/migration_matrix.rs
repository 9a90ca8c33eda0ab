//! The from x to matrix of `cargo xtask compare`: for every ordered pair of stores, whether the
//! mixed-fleet migration scenario passed (distributed-lock's `tests/migration.rs`, which
//! writes its verdicts when `LOCK_MIGRATION_REPORT` names a file) and what `dual` mode cost
//! (distributed-lock's `benches/migration.rs`, one benchmark report per pair, named
//! `FROM -> TO`).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use comfy_table::Table;
use conformance_tests::bench;
use serde::Deserialize;

/// The variable naming the file the migration test writes its verdicts to.
pub(crate) const REPORT_VAR: &str = "LOCK_MIGRATION_REPORT";

/// One pair's verdict, as the migration test writes it.
#[derive(Debug, Deserialize)]
struct Verdict {
    from: String,
    to: String,
    passed: bool,
}

/// The migration test, as (package, test target): it writes its verdicts to the file
/// [`REPORT_VAR`] names.
pub(crate) const TEST: (&str, &str) = ("distributed-lock", "migration");

/// Whether a benchmark report is one pair's (`FROM -> TO`).
pub(crate) fn is_pair(report: &bench::Report) -> bool {
    report.store.contains(" -> ")
}

/// The metrics whose denominator is a store's raw floor, as each store's benchmark names it,
/// in the order [`floor_line`] looks for them.
pub(crate) const FLOOR_METRICS: [&str; 4] = [
    "uncontended acquire+release / raw floor of the five servers in parallel (means)",
    "uncontended acquire+release / raw floor (means)",
    "uncontended acquire+release / raw INSERT+DELETE on one connection (means)",
    "cycle / floor, mean",
];

/// The metric of a pair's `dual` cycle against the two stores' own cycles.
const DUAL_CYCLE: &str = "dual cycle / (from cycle + to cycle)";

/// The line of a store's benchmark report whose denominator is its raw floor: the first of
/// [`FLOOR_METRICS`] the report has.
pub(crate) fn floor_line(report: &bench::Report) -> Option<&bench::Line> {
    FLOOR_METRICS
        .iter()
        .find_map(|metric| report.lines.iter().find(|l| l.metric == *metric))
}

/// The raw floor of `store` (a name of the migration test) in its own benchmark's report, in
/// nanoseconds: that report's store label is the name, or the name and a count
/// (`redlock(5)`).
fn floor_of(store: &str, reports: &[bench::Report]) -> Option<u64> {
    let report = reports.iter().find(|r| {
        r.store == store
            || r.store
                .strip_prefix(store)
                .is_some_and(|rest| rest.starts_with('('))
    })?;
    floor_line(report).and_then(|l| l.floor_ns)
}

/// One cell: the verdict; `dual`'s cycle against the two stores' own cycles and against the
/// sum of their raw floors; the hand-off p50.
fn cell(verdict: Option<bool>, pair: Option<&bench::Report>, floors: Option<u64>) -> String {
    let verdict = match verdict {
        Some(true) => "ok",
        Some(false) => "FAIL",
        None => "-",
    };
    let Some(pair) = pair else {
        return verdict.to_string();
    };
    let line = |metric: &str| pair.lines.iter().find(|l| l.metric == metric);
    let own = line(DUAL_CYCLE).and_then(|l| l.ratio);
    let to_floors = line(DUAL_CYCLE)
        .and_then(|l| l.value_ns)
        .zip(floors)
        .map(|(dual, floors)| dual as f64 / floors.max(1) as f64);
    let handoff = line("dual hand-off p50 (ms)").map(|l| l.value.clone());
    let ratio = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |x| format!("{x:.2}x"));
    format!(
        "{verdict} {} {} {}ms",
        ratio(own),
        ratio(to_floors),
        handoff.unwrap_or_else(|| "?".to_string())
    )
}

/// The matrix: rows are the store locks move from, columns the store they move to; each cell
/// says whether the mixed fleet passed, `dual`'s cycle against the two stores' own cycles and
/// against the sum of their raw floors (each store's own benchmark, same `compare` run), and
/// the hand-off p50 between two `dual` clients. `pairs` are the migration benchmark's
/// reports, `stores` the stores' own; `verdicts` what the migration test wrote (`null` when
/// it wrote nothing).
pub(crate) fn render(
    verdicts: &serde_json::Value,
    pairs: &[bench::Report],
    stores_reports: &[bench::Report],
    preset: &str,
) -> Result<String> {
    let verdicts: Vec<Verdict> = if verdicts.is_null() {
        Vec::new()
    } else {
        Vec::<Verdict>::deserialize(verdicts).context("reading the migration's verdicts")?
    };
    let passed: BTreeMap<(&str, &str), bool> = verdicts
        .iter()
        .map(|v| ((v.from.as_str(), v.to.as_str()), v.passed))
        .collect();
    let costs: BTreeMap<&str, &bench::Report> = pairs
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
            let floors = floor_of(from, stores_reports)
                .zip(floor_of(to, stores_reports))
                .map(|(a, b)| a.saturating_add(b));
            row.push(cell(
                passed.get(&(from, to)).copied(),
                costs.get(format!("{from} -> {to}").as_str()).copied(),
                floors,
            ));
        }
        table.add_row(row);
    }
    Ok(format!(
        "## Migration (from x to)\n\nPer pair: the mixed fleet (ok / FAIL); `dual`'s \
         uncontended cycle against the two stores' own cycles (timed alternately, median of \
         rounds); the same cycle against the sum of the two stores' raw floors (each from its \
         store's benchmark in this run; `-` for memory, which has none); the hand-off p50 \
         between two `dual` clients.\n\n{table}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line: metric, ratio, numerator and denominator (ns), text.
    type Spec<'a> = (&'a str, Option<f64>, Option<u64>, Option<u64>, &'a str);

    fn report(store: &str, lines: &[Spec<'_>]) -> bench::Report {
        bench::Report {
            store: store.to_owned(),
            lines: lines
                .iter()
                .map(|(metric, ratio, value_ns, floor_ns, value)| bench::Line {
                    metric: (*metric).to_owned(),
                    value: (*value).to_owned(),
                    ratio: *ratio,
                    target: None,
                    value_ns: *value_ns,
                    floor_ns: *floor_ns,
                })
                .collect(),
            fleets: Vec::new(),
            sweep: Vec::new(),
            renewal: None,
            peer_renewals: Vec::new(),
        }
    }

    #[test]
    fn a_cell_has_the_verdict_both_ratios_and_the_hand_off() -> Result<()> {
        let verdicts: serde_json::Value = serde_json::from_str(
            r#"[{"from":"redis","to":"redlock","passed":true},
                {"from":"redlock","to":"redis","passed":false}]"#,
        )?;
        let pairs = [report(
            "redis -> redlock",
            &[
                (DUAL_CYCLE, Some(1.02), Some(3_000), Some(2_940), "1.02x"),
                ("dual hand-off p50 (ms)", None, None, None, "2.5"),
            ],
        )];
        let stores = [
            report(
                "redis",
                &[(FLOOR_METRICS[0], Some(1.4), Some(1_400), Some(1_000), "")],
            ),
            report(
                "redlock(5)",
                &[(FLOOR_METRICS[0], Some(5.0), Some(2_500), Some(500), "")],
            ),
        ];
        let text = render(
            &verdicts,
            &pairs,
            &stores,
            comfy_table::presets::ASCII_MARKDOWN,
        )?;
        // 3,000 ns against floors of 1,000 + 500 ns.
        assert!(text.contains("ok 1.02x 2.00x 2.5ms"), "{text}");
        assert!(text.contains("| FAIL "), "{text}");
        Ok(())
    }
}
