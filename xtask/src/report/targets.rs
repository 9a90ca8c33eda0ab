//! The performance targets the project set itself (its contention issue and its report
//! issue), each judged from one compare run as met, missed, or not measured, with the
//! measured ratio.

use comfy_table::Table;
use conformance_tests::bench::{self, FleetRun};

use super::{
    Collected,
    summary::{fleet_run as run, floor_ratio},
};

/// One target of one store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target {
    /// The store.
    pub(crate) store: String,
    /// What is asked.
    pub(crate) goal: String,
    /// What was measured (`None`: this run did not measure it).
    pub(crate) measured: Option<String>,
    /// Whether it is met (`None`: not measured).
    pub(crate) met: Option<bool>,
}

impl Target {
    fn new(store: &str, goal: &str) -> Self {
        Self {
            store: store.to_owned(),
            goal: goal.to_owned(),
            measured: None,
            met: None,
        }
    }

    /// Judged: `measured` shown as text, `met` whether it meets the goal.
    fn judged(mut self, measured: String, met: bool) -> Self {
        self.measured = Some(measured);
        self.met = Some(met);
        self
    }

    /// The verdict as a word.
    pub(crate) fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        }
    }
}

/// The ratio of the line `metric` of `report`.
fn line_ratio(report: &bench::Report, metric: &str) -> Option<f64> {
    report
        .lines
        .iter()
        .find(|l| l.metric == metric)
        .and_then(|l| l.ratio)
}

/// The uncontended rate each store must reach against one raw connection (the inverse of
/// the time ratio), by store label.
const UNCONTENDED: [(&str, f64); 5] = [
    ("redis", 0.95),
    ("mysql-lease", 0.85),
    ("mysql-rowlock", 0.8),
    ("zookeeper", 0.8),
    ("zookeeper-ensemble(3)", 0.8),
];

/// The targets of one store's benchmark report.
fn of_store(report: &bench::Report) -> Vec<Target> {
    let mut targets = of_fleets(report);
    targets.extend(of_floors(report));
    targets.push(of_sweep(report));
    targets.push(of_renewal(report));
    targets
}

/// The renewal target: at most one round trip per 100 held locks per renewal period (the
/// round trips counted as the data segments the client sent, an upper bound), and every
/// renewal answered.
fn of_renewal(report: &bench::Report) -> Target {
    let goal = Target::new(
        &report.store,
        "renewing held locks (10,000): <= 1 round trip per 100 locks per period",
    );
    let Some(renewal) = &report.renewal else {
        return goal;
    };
    let Some(per_100) = renewal.round_trips_per_100() else {
        return goal;
    };
    goal.judged(
        format!(
            "{per_100:.2} per 100 of {} locks, {} failed",
            renewal.locks, renewal.not_renewed
        ),
        per_100 <= 1.0 && renewal.not_renewed == 0,
    )
}

/// The client sweep's target: turns per second grow with clients until the store
/// saturates (read here as: two clients do more than one, and no later step falls below
/// 80 % of the best one before it), and p99 stays within 10x p50 at every step.
fn of_sweep(report: &bench::Report) -> Target {
    let goal = Target::new(
        &report.store,
        "client sweep: turns/s grow until saturation, p99 <= 10x p50",
    );
    let steps = &report.sweep;
    let rate = |clients: usize| {
        steps
            .iter()
            .find(|s| s.clients == clients)
            .map(|s| s.per_second)
    };
    // A quick run has no 2-client step: the growth cannot be judged.
    let (Some(one), Some(two)) = (rate(1), rate(2)) else {
        return goal;
    };
    let mut best = 0.0_f64;
    let mut holds = true;
    for step in steps {
        holds &= step.per_second >= 0.8 * best;
        best = best.max(step.per_second);
    }
    let spread = steps
        .iter()
        .filter(|s| s.turn.samples > 0)
        .map(|s| s.turn.p99.as_secs_f64() / s.turn.p50.as_secs_f64().max(1e-9))
        .fold(0.0_f64, f64::max);
    let rates: Vec<String> = steps
        .iter()
        .map(|s| format!("{:.0}", s.per_second))
        .collect();
    goal.judged(
        format!("{}/s; p99/p50 up to {spread:.1}x", rates.join(", ")),
        two > one && holds && spread <= 10.0,
    )
}

/// The targets of the runs of separate clients.
fn of_fleets(report: &bench::Report) -> Vec<Target> {
    let store = report.store.as_str();
    let mut targets = Vec::new();
    let sixteen = run(report, 16, 1);
    let fair = Target::new(
        store,
        "16 clients, hold 1 ms: Jain >= 0.95, none under half the mean",
    );
    targets.push(match sixteen {
        Some(r) => {
            let mean = r.fleet.acquisitions as f64 / r.fleet.clients.max(1) as f64;
            let measured = format!(
                "Jain {:.2}, fewest {} (mean {mean:.0})",
                r.fleet.jain, r.fleet.min
            );
            let met = r.fleet.jain >= 0.95 && r.fleet.min as f64 >= mean / 2.0;
            fair.judged(measured, met)
        }
        None => fair,
    });
    let handoff = Target::new(
        store,
        "16 clients, hold 1 ms: hand-off p50 <= 2 raw round trips",
    );
    targets.push(match sixteen.filter(|r| r.fleet.handoff.samples > 0) {
        Some(r) => {
            let ratio = r.fleet.handoff.p50.as_secs_f64() / r.round_trip.as_secs_f64().max(1e-9);
            handoff.judged(format!("{ratio:.2}x"), ratio <= 2.0)
        }
        None => handoff,
    });
    for peer in report.fleets.iter().filter(|r| r.peer.is_some()) {
        let name = peer.peer.as_deref().unwrap_or_default();
        let goal = Target::new(
            store,
            &format!("{} clients: acquisitions/s >= {name}'s", peer.fleet.clients),
        );
        // Ours in the same shape of run (clients and hold) as the peer's.
        let hold_ms = u64::try_from(peer.fleet.hold.as_millis()).unwrap_or(u64::MAX);
        let ours = run(report, peer.fleet.clients, hold_ms).map(|r| r.fleet.per_second);
        targets.push(match ours {
            Some(ours) => {
                let ratio = ours / peer.fleet.per_second.max(f64::MIN_POSITIVE);
                goal.judged(
                    format!(
                        "{ours:.0}/s vs {:.0}/s ({ratio:.2}x)",
                        peer.fleet.per_second
                    ),
                    ratio >= 1.0,
                )
            }
            None => goal,
        });
    }
    if matches!(store, "redis" | "zookeeper") {
        let goal = Target::new(store, "100 clients: within 20 % of the 16-client rate");
        targets.push(match (sixteen, run(report, 100, 1)) {
            (Some(a), Some(b)) => {
                let ratio = b.fleet.per_second / a.fleet.per_second.max(f64::MIN_POSITIVE);
                goal.judged(format!("{ratio:.2}x"), ratio >= 0.8)
            }
            _ => goal,
        });
    }
    let ops = Target::new(
        store,
        "1,000 clients: operations per hand-off within 20 % of 16's",
    );
    let per = |r: Option<&FleetRun>| r.and_then(|r| r.fleet.operations_per_acquisition);
    targets.push(match (per(sixteen), per(run(report, 1_000, 1))) {
        (Some(a), Some(b)) => {
            let ratio = b / a.max(f64::MIN_POSITIVE);
            ops.judged(format!("{b:.1} vs {a:.1} ({ratio:.2}x)"), ratio <= 1.2)
        }
        _ => ops,
    });
    targets
}

/// The target `goal` of `store` on a rate: met when the inverse of the time ratio `time`
/// (ours over the floor's) is at least `at_least`.
fn rate_target(store: &str, goal: &str, time: Option<f64>, at_least: f64) -> Target {
    let goal = Target::new(store, goal);
    match time {
        Some(time) => {
            let rate = 1.0 / time.max(f64::MIN_POSITIVE);
            goal.judged(format!("{rate:.2}x"), rate >= at_least)
        }
        None => goal,
    }
}

/// The targets against a raw floor.
fn of_floors(report: &bench::Report) -> Vec<Target> {
    let store = report.store.as_str();
    let mut targets = Vec::new();
    if store == "mysql-rowlock" {
        targets.push(rate_target(
            store,
            "100 clients: >= 0.8x a raw FOR UPDATE queue",
            line_ratio(
                report,
                "100 clients: time per acquisition / raw FOR UPDATE queue",
            ),
            0.8,
        ));
    }
    if let Some(&(_, goal_rate)) = UNCONTENDED.iter().find(|(s, _)| *s == store) {
        targets.push(rate_target(
            store,
            &format!("uncontended: >= {goal_rate}x the rate of one raw connection"),
            floor_ratio(report),
            goal_rate,
        ));
    }
    if store.starts_with("redlock") {
        targets.push(rate_target(
            store,
            "uncontended: >= 0.9x of five servers in parallel",
            line_ratio(
                report,
                "uncontended acquire+release / raw floor of the five servers in parallel (means)",
            ),
            0.9,
        ));
    }
    targets
}

/// Every target of the run, store by store.
pub(crate) fn all(collected: &Collected) -> Vec<Target> {
    collected.benches.iter().flat_map(of_store).collect()
}

/// How many targets were met, and how many were measured.
pub(crate) fn tally(targets: &[Target]) -> (usize, usize) {
    let measured = targets.iter().filter(|t| t.met.is_some()).count();
    let met = targets.iter().filter(|t| t.met == Some(true)).count();
    (met, measured)
}

/// The targets as a table in `preset`.
pub(crate) fn render(targets: &[Target], preset: &str) -> String {
    let mut table = Table::new();
    table.load_preset(preset);
    table.set_header(["store", "target", "measured", "verdict"]);
    for t in targets {
        table.add_row([
            t.store.as_str(),
            t.goal.as_str(),
            t.measured.as_deref().unwrap_or("-"),
            t.verdict(),
        ]);
    }
    let (met, measured) = tally(targets);
    format!(
        "## Targets\n\n{met} of {measured} measured targets met; {} not measured by this run.\n\n{table}",
        targets.len() - measured
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_run_is_judged() {
        let collected = super::super::tests::recorded();
        let targets = all(&collected);
        let find = |store: &str, start: &str| {
            targets
                .iter()
                .find(|t| t.store == store && t.goal.starts_with(start))
                .unwrap()
                .clone()
        };
        // 366/s against rslock's 433/s in that run.
        let peer = find("redis", "16 clients: acquisitions/s >= rslock");
        assert_eq!(peer.met, Some(false), "{peer:?}");
        assert!(peer.measured.unwrap().contains("0.85x"));
        // Jain 1.00, fewest 68 of a mean of 69.
        assert_eq!(find("redis", "16 clients, hold 1 ms: Jain").met, Some(true));
        // 2.04x the raw queue's time per acquisition: 0.49x its rate.
        let queue = find("mysql-rowlock", "100 clients");
        assert_eq!(queue.measured.as_deref(), Some("0.49x"));
        assert_eq!(queue.met, Some(false));
        // That run had no renewal workload.
        assert_eq!(find("redis", "renewing").verdict(), "not measured");
        let (met, measured) = tally(&targets);
        assert!(met < measured && measured < targets.len());
    }

    fn renewal(round_trips: Option<f64>, not_renewed: usize) -> bench::Renewal {
        let period = std::time::Duration::from_millis(20);
        bench::Renewal {
            locks: 10_000,
            period: bench::Stats {
                samples: 5,
                mean: period,
                p50: period,
                p99: period,
                max: period,
            },
            round_trips,
            operations: 20_000.0,
            operations_are: "commands".into(),
            server_cpu: None,
            not_renewed,
        }
    }

    #[test]
    fn renewal_is_met_at_one_round_trip_per_hundred_locks_all_renewed() {
        let judged = |round_trips, not_renewed| {
            let mut report = bench::Report::new("redis");
            report.renewal = Some(renewal(round_trips, not_renewed));
            of_renewal(&report)
        };
        assert_eq!(judged(Some(100.0), 0).met, Some(true));
        let many = judged(Some(101.0), 0);
        assert_eq!(many.met, Some(false));
        assert_eq!(
            many.measured.as_deref(),
            Some("1.01 per 100 of 10000 locks, 0 failed")
        );
        assert_eq!(judged(Some(1.0), 3).met, Some(false));
        assert_eq!(judged(None, 0).met, None);
        assert_eq!(of_renewal(&bench::Report::new("redis")).met, None);
    }

    /// A sweep step of `clients` at `rate` turns/s with p50 1 ms and p99 `p99_ms`.
    fn step(clients: usize, rate: f64, p99_ms: u64) -> bench::SweepStep {
        let ms = std::time::Duration::from_millis;
        bench::SweepStep {
            clients,
            turns: 100,
            per_second: rate,
            turn: bench::Stats {
                samples: 100,
                mean: ms(1),
                p50: ms(1),
                p99: ms(p99_ms),
                max: ms(p99_ms),
            },
            cut_short: 0,
            unavailable: 0,
            first_unavailable: None,
            server_cores: None,
            server_rss_kib: None,
        }
    }

    #[test]
    fn the_sweep_grows_until_it_saturates_without_collapse_or_a_long_tail() {
        let mut report = bench::Report::new("s");
        let judge = |steps: Vec<bench::SweepStep>, report: &mut bench::Report| {
            report.sweep = steps;
            of_sweep(report).met
        };
        let good = vec![
            step(1, 100.0, 3),
            step(2, 180.0, 3),
            step(4, 300.0, 4),
            step(8, 290.0, 5),
        ];
        assert_eq!(judge(good.clone(), &mut report), Some(true));
        // Two clients no faster than one.
        let flat = vec![step(1, 100.0, 3), step(2, 90.0, 3), step(4, 95.0, 3)];
        assert_eq!(judge(flat, &mut report), Some(false));
        // A collapse after the peak (below 80 % of the best before it).
        let mut collapse = good.clone();
        collapse.push(step(16, 200.0, 5));
        assert_eq!(judge(collapse, &mut report), Some(false));
        // A long tail at one step.
        let mut tail = good;
        tail[2] = step(4, 300.0, 11);
        assert_eq!(judge(tail, &mut report), Some(false));
        // A quick run's steps (1, 4, 16): not judged.
        let quick = vec![step(1, 100.0, 3), step(4, 300.0, 3), step(16, 400.0, 3)];
        assert_eq!(judge(quick, &mut report), None);
    }
}
