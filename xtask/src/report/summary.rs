//! What the terminal shows at the end of `cargo xtask compare`: one row per store and a
//! five-line summary, no line wider than [`TERMINAL_WIDTH`] columns (the full tables are in
//! the report's files).

use std::time::Duration;

use comfy_table::{ContentArrangement, Table, presets};
use conformance_tests::bench::{self, FleetRun};
use lock_core::Fencing;

use super::Collected;

/// The widest a line printed to the terminal may be.
pub(crate) const TERMINAL_WIDTH: usize = 100;

/// How many lines [`lines`] gives.
pub(crate) const LINES: usize = 5;

/// The run of this library (not a peer's) with `clients` separate clients holding `hold_ms`.
pub(crate) fn fleet_run(report: &bench::Report, clients: usize, hold_ms: u64) -> Option<&FleetRun> {
    report.fleets.iter().find(|r| {
        r.peer.is_none()
            && r.fleet.clients == clients
            && r.fleet.hold == Duration::from_millis(hold_ms)
    })
}

/// The run of this library's separate clients the summary compares stores on: 16 clients
/// holding 1 ms each turn.
pub(crate) fn headline(report: &bench::Report) -> Option<&FleetRun> {
    fleet_run(report, 16, 1)
}

/// A store's uncontended cycle against its raw floor (see
/// [`crate::migration_matrix::floor_line`]).
pub(crate) fn floor_ratio(report: &bench::Report) -> Option<f64> {
    crate::migration_matrix::floor_line(report).and_then(|l| l.ratio)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One row per store: conformance, fencing, waiter order, the uncontended ratio to the floor,
/// the 16-client run (acquisitions/s, hand-off p50 to another client, Jain's index) and the
/// fault campaign's verdict, under a line that says so.
pub(crate) fn overview(collected: &Collected) -> String {
    let mut table = Table::new();
    table.load_preset(presets::UTF8_FULL_CONDENSED);
    table.set_content_arrangement(ContentArrangement::Dynamic);
    table.set_width(u16::try_from(TERMINAL_WIDTH).unwrap_or(u16::MAX));
    table.set_header([
        "store",
        "scenarios",
        "fencing",
        "order",
        "x floor",
        "acq/s",
        "hand-off",
        "Jain",
        "chaos",
    ]);
    // Every store a suite or a benchmark reported on (a run may have only one of them).
    let mut stores: Vec<&str> = collected.suites.iter().map(|s| s.store.as_str()).collect();
    for bench in &collected.benches {
        if !stores.contains(&bench.store.as_str()) {
            stores.push(&bench.store);
        }
    }
    for store in stores {
        let suite = collected.suites.iter().find(|s| s.store == store);
        let bench = collected.bench(store);
        let run = bench.and_then(headline);
        let caps = suite.and_then(|s| s.capabilities.as_ref());
        let dash = || "-".to_string();
        let chaos = collected.chaos(store).map_or_else(dash, |c| {
            if crate::chaos::passed(c) {
                "pass"
            } else {
                "FAIL"
            }
            .to_string()
        });
        table.add_row([
            store.to_string(),
            suite.map_or_else(dash, |s| {
                format!("{}/{}", s.passed(), s.passed() + s.failed())
            }),
            caps.map_or_else(dash, |c| format!("{:?}", c.fencing)),
            caps.map_or_else(dash, |c| format!("{:?}", c.order)),
            bench
                .and_then(floor_ratio)
                .map_or_else(dash, |r| format!("{r:.2}x")),
            run.map_or_else(dash, |r| format!("{:.0}", r.fleet.per_second)),
            run.map_or_else(dash, |r| ms(r.fleet.handoff.p50)),
            run.map_or_else(dash, |r| format!("{:.2}", r.fleet.jain)),
            chaos,
        ]);
    }
    format!(
        "Per store: scenarios passed, fencing, waiter order, uncontended cycle / raw floor;\n\
         16 separate clients holding 1 ms: acquisitions/s, hand-off p50, Jain; fault campaign.\n\
         {table}"
    )
}

/// The five-line summary: fastest hand-off, most acquisitions (and the fastest peer's), closest to
/// its floor, strictest fencing, and the fault campaign.
pub(crate) fn lines(collected: &Collected) -> [String; LINES] {
    [
        handoff_line(collected),
        rate_line(collected),
        floor_line(collected),
        fencing_line(collected),
        chaos_line(collected),
    ]
    .map(|line| super::fit(&line))
}

/// Each store's headline run (see [`headline`]).
fn headlines(collected: &Collected) -> Vec<(&str, &FleetRun)> {
    collected
        .benches
        .iter()
        .filter_map(|b| headline(b).map(|r| (b.store.as_str(), r)))
        .collect()
}

fn handoff_line(collected: &Collected) -> String {
    let fastest = headlines(collected)
        .into_iter()
        .filter(|(_, r)| r.fleet.handoff.samples > 0)
        .min_by_key(|(_, r)| r.fleet.handoff.p50)
        .map_or_else(
            || "no run".to_string(),
            |(store, r)| {
                format!(
                    "{store}, p50 {} ({} hand-offs)",
                    ms(r.fleet.handoff.p50),
                    r.fleet.handoff.samples
                )
            },
        );
    format!("fastest hand-off to another client (16 clients, hold 1 ms): {fastest}")
}

fn rate_line(collected: &Collected) -> String {
    let most = headlines(collected)
        .into_iter()
        .max_by(|a, b| a.1.fleet.per_second.total_cmp(&b.1.fleet.per_second))
        .map_or_else(
            || "no run".to_string(),
            |(store, r)| format!("{store} {:.0}/s", r.fleet.per_second),
        );
    // The fastest peer in the same shape of run (16 clients holding 1 ms; the report lists
    // every peer run), its rate before its name: a line too long for the terminal is cut in
    // the name, never in a number.
    let peer = collected
        .benches
        .iter()
        .flat_map(|b| b.fleets.iter().map(move |r| (b.store.as_str(), r)))
        .filter(|(_, r)| r.fleet.clients == 16 && r.fleet.hold == Duration::from_millis(1))
        .filter_map(|(store, r)| Some((r.peer.as_deref()?, store, r.fleet.per_second)))
        .max_by(|a, b| a.2.total_cmp(&b.2));
    let mut line = format!("most acquisitions (16 clients, hold 1 ms): {most}");
    if let Some((peer, store, per_second)) = peer {
        line.push_str(&format!(
            "; fastest peer {per_second:.0}/s ({peer} on {store})"
        ));
    }
    line
}

fn floor_line(collected: &Collected) -> String {
    let floors: Vec<(&str, f64)> = collected
        .benches
        .iter()
        .filter_map(|b| floor_ratio(b).map(|r| (b.store.as_str(), r)))
        .collect();
    let show = |found: Option<&(&str, f64)>| {
        found.map_or_else(|| "no run".to_string(), |(s, r)| format!("{s} {r:.2}x"))
    };
    format!(
        "uncontended cycle vs raw floor: closest {}, farthest {}",
        show(floors.iter().min_by(|a, b| a.1.total_cmp(&b.1))),
        show(floors.iter().max_by(|a, b| a.1.total_cmp(&b.1)))
    )
}

fn fencing_line(collected: &Collected) -> String {
    if collected.suites.is_empty() {
        return "strictest fencing: not known (the conformance suites did not run)".to_string();
    }
    let strict: Vec<&str> = collected
        .suites
        .iter()
        .filter(|s| s.store != "memory")
        .filter(|s| {
            s.capabilities
                .as_ref()
                .is_some_and(|c| c.fencing == Fencing::Strict)
        })
        .map(|s| s.store.as_str())
        .collect();
    if strict.is_empty() {
        "strictest fencing: none is Strict".to_string()
    } else {
        format!("strictest fencing: Strict on {}", strict.join(", "))
    }
}

fn chaos_line(collected: &Collected) -> String {
    if collected.chaos.is_empty() {
        return "fault campaign: no campaign recorded".to_string();
    }
    let passed = collected
        .chaos
        .iter()
        .filter(|c| crate::chaos::passed(c))
        .count();
    let acquisitions: u64 = collected
        .chaos
        .iter()
        .map(|c| c["findings"]["acquisitions"].as_u64().unwrap_or(0))
        .sum();
    format!(
        "fault campaign: {passed} of {} stores pass ({acquisitions} acquisitions under faults)",
        collected.chaos.len()
    )
}
