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
    targets.extend(of_peers(report));
    targets
}

/// The targets against the peers (libraries a user would otherwise pick) on the same
/// servers in the same run: per run of separate clients, at least the peer's acquisitions/s
/// in the same shape of run (clients and hold); the uncontended cycle no slower than the
/// peer's against the same floor; the client sweep's best turns/s at least the peer's. A
/// peer's workload that failed (a `...: failed` line of the report) is a target not measured,
/// with the peer's error as what was measured.
fn of_peers(report: &bench::Report) -> Vec<Target> {
    let mut targets = peer_fleets(report);
    targets.extend(peer_cycles(report));
    targets.extend(peer_sweeps(report));
    targets
}

/// The error of the line `metric: failed` of `report`, when it has one.
fn failure<'r>(report: &'r bench::Report, metric: &str) -> Option<&'r str> {
    let failed = format!("{metric}: failed");
    report
        .lines
        .iter()
        .find(|l| l.metric == failed)
        .map(|l| l.value.as_str())
}

/// The peers' names in the report's failed lines that end with `suffix` (`...: failed`).
fn failed_peers<'r>(report: &'r bench::Report, suffix: &str) -> Vec<&'r str> {
    report
        .lines
        .iter()
        .filter_map(|l| l.metric.strip_suffix(suffix))
        .collect()
}

/// Not measured: the peer's workload failed with `error`.
fn peer_failed(goal: Target, error: &str) -> Target {
    Target {
        measured: Some(format!("the peer's run failed: {error}")),
        ..goal
    }
}

/// Per run of separate clients of a peer: ours in the same shape at least as many
/// acquisitions/s.
fn peer_fleets(report: &bench::Report) -> Vec<Target> {
    let store = report.store.as_str();
    let goal = |clients: usize, hold_ms: u128, name: &str| {
        Target::new(
            store,
            &format!("{clients} clients, hold {hold_ms} ms: acquisitions/s >= {name}'s"),
        )
    };
    let mut targets = Vec::new();
    for peer in report.fleets.iter().filter(|r| r.peer.is_some()) {
        let name = peer.peer.as_deref().unwrap_or_default();
        let hold_ms = u64::try_from(peer.fleet.hold.as_millis()).unwrap_or(u64::MAX);
        let goal = goal(peer.fleet.clients, peer.fleet.hold.as_millis(), name);
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
    for (clients, hold) in bench::FLEET_RUNS {
        let label = format!(", {clients} clients, hold {hold:?}");
        for name in failed_peers(report, &format!("{label}: failed")) {
            let error = failure(report, &format!("{name}{label}")).unwrap_or_default();
            targets.push(peer_failed(goal(clients, hold.as_millis(), name), error));
        }
    }
    targets
}

/// Per peer with an uncontended cycle against our floor: ours no slower against it.
fn peer_cycles(report: &bench::Report) -> Vec<Target> {
    let store = report.store.as_str();
    let Some(ours) = crate::migration_matrix::floor_line(report) else {
        return Vec::new();
    };
    let goal = |name: &str| {
        Target::new(
            store,
            &format!("uncontended cycle: no slower than {name}'s (same floor)"),
        )
    };
    let suffix = format!(": {}", ours.metric);
    let mut targets = Vec::new();
    for line in &report.lines {
        let (Some(name), Some(theirs)) = (line.metric.strip_suffix(&suffix), line.ratio) else {
            continue;
        };
        targets.push(match ours.ratio {
            Some(mine) => goal(name).judged(
                format!("{mine:.2}x vs {theirs:.2}x of the floor"),
                mine <= theirs,
            ),
            None => goal(name),
        });
    }
    for name in failed_peers(report, &format!("{suffix}: failed")) {
        let error = failure(report, &format!("{name}{suffix}")).unwrap_or_default();
        targets.push(peer_failed(goal(name), error));
    }
    targets
}

/// Per peer with a client sweep: ours at least as many turns/s at its best step.
fn peer_sweeps(report: &bench::Report) -> Vec<Target> {
    let store = report.store.as_str();
    let goal = |name: &str| Target::new(store, &format!("client sweep: best turns/s >= {name}'s"));
    let best = |peer: Option<&str>| {
        report
            .sweep
            .iter()
            .filter(|s| s.peer.as_deref() == peer)
            .map(|s| s.per_second)
            .reduce(f64::max)
    };
    let mut peers: Vec<&str> = Vec::new();
    for name in report.sweep.iter().filter_map(|s| s.peer.as_deref()) {
        if !peers.contains(&name) {
            peers.push(name);
        }
    }
    let mut targets = Vec::new();
    for &name in &peers {
        targets.push(match (best(None), best(Some(name))) {
            (Some(ours), Some(theirs)) => {
                let ratio = ours / theirs.max(f64::MIN_POSITIVE);
                goal(name).judged(
                    format!("{ours:.0}/s vs {theirs:.0}/s ({ratio:.2}x)"),
                    ratio >= 1.0,
                )
            }
            _ => goal(name),
        });
    }
    // A peer whose first step failed has no step: its sweep is not measured.
    for clients in bench::SWEEP_CLIENTS {
        let label = format!(", sweep, {clients} clients on many names");
        for name in failed_peers(report, &format!("{label}: failed")) {
            if !peers.contains(&name) {
                let error = failure(report, &format!("{name}{label}")).unwrap_or_default();
                targets.push(peer_failed(goal(name), error));
            }
        }
    }
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
    let steps: Vec<&bench::SweepStep> = report.sweep.iter().filter(|s| s.peer.is_none()).collect();
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
    for step in &steps {
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
    let thousand = run(report, 1_000, 1);
    targets.push(match (per(sixteen), per(thousand)) {
        (Some(a), Some(b)) => {
            let ratio = b / a.max(f64::MIN_POSITIVE);
            ops.judged(format!("{b:.1} vs {a:.1} ({ratio:.2}x)"), ratio <= 1.2)
        }
        // Operations counted, but no acquisition to spread them over (none at all, or none in
        // the counted second half of the run).
        _ if thousand.is_some_and(|r| {
            r.fleet.operations_per_acquisition.is_none()
                && (r.fleet.acquisitions == 0 || r.fleet.sessions_per_client.is_some())
        }) =>
        {
            let all = thousand.map_or(0, |r| r.fleet.acquisitions);
            ops.judged(
                format!("no acquisition in the run's second half ({all} in all)"),
                false,
            )
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
        // 368/s against rslock's 447/s in that run.
        let peer = find("redis", "16 clients, hold 1 ms: acquisitions/s >= rslock");
        assert_eq!(peer.met, Some(false), "{peer:?}");
        assert!(peer.measured.unwrap().contains("0.82x"));
        // With 1,000 clients, 350/s against rslock's 165/s.
        let thousand = find("redis", "1000 clients, hold 1 ms: acquisitions/s >= rslock");
        assert_eq!(thousand.met, Some(true), "{thousand:?}");
        // Every shape of run has its target against the peer, on both stores.
        for store in ["redis", "mysql-rowlock"] {
            let against_peer = targets
                .iter()
                .filter(|t| t.store == store && t.goal.contains("acquisitions/s >= "))
                .count();
            assert_eq!(against_peer, bench::FLEET_RUNS.len(), "{store}");
        }
        // Jain 1.00, fewest 69 of a mean of 69.
        assert_eq!(find("redis", "16 clients, hold 1 ms: Jain").met, Some(true));
        // 2.00x the raw queue's time per acquisition: 0.50x its rate.
        let queue = find("mysql-rowlock", "100 clients:");
        assert_eq!(queue.measured.as_deref(), Some("0.50x"));
        assert_eq!(queue.met, Some(false));
        // 0.20 round trips per 100 locks per period.
        assert_eq!(find("redis", "renewing").met, Some(true));
        let (met, measured) = tally(&targets);
        assert!(0 < met && met < measured && measured <= targets.len());
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
            peer: None,
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
        assert_eq!(judge(quick.clone(), &mut report), None);
        // A peer's steps are not ours: a peer that collapses does not fail our target.
        let mut with_peer = vec![step(1, 100.0, 3), step(2, 180.0, 3)];
        with_peer.extend(
            [step(1, 500.0, 3), step(2, 10.0, 300)].map(|s| bench::SweepStep {
                peer: Some("p 1.0".into()),
                ..s
            }),
        );
        assert_eq!(judge(with_peer, &mut report), Some(true));
    }

    /// A run of 1,000 clients that granted nothing misses the operations target (it has no
    /// operations per hand-off to compare, and is not "not measured").
    #[test]
    fn a_thousand_clients_granting_nothing_miss_the_operations_target() {
        let ms = std::time::Duration::from_millis;
        let fleet = |clients, acquisitions, operations| bench::Fleet {
            clients,
            hold: ms(1),
            acquisitions,
            per_second: acquisitions as f64,
            handoff: bench::Stats {
                samples: acquisitions,
                mean: ms(1),
                p50: ms(1),
                p99: ms(1),
                max: ms(1),
            },
            self_retakes: 0,
            min: 0,
            max: 0,
            jain: 1.0,
            failures: 0,
            first_failure: None,
            overlaps: 0,
            operations_per_acquisition: operations,
            sessions_per_client: None,
            second_half: None,
        };
        let judged_beside = |sixteen: bench::Fleet, thousand: bench::Fleet| {
            let mut report = bench::Report::new("mysql-lease");
            for fleet in [sixteen, thousand] {
                report.fleets.push(FleetRun {
                    peer: None,
                    round_trip: ms(1),
                    fleet,
                });
            }
            of_fleets(&report)
                .into_iter()
                .find(|t| t.goal.starts_with("1,000 clients: operations"))
                .map(|t| (t.measured, t.met))
        };
        let judged = |thousand| judged_beside(fleet(16, 500, Some(40.0)), thousand);
        assert_eq!(
            judged(fleet(1000, 0, None)),
            Some((
                Some("no acquisition in the run's second half (0 in all)".to_string()),
                Some(false)
            ))
        );
        // Counted (sessions too), with acquisitions in the first half only: missed, not "not
        // measured" (the lease's 1,000-client run of a compare: 2 acquisitions).
        let early = bench::Fleet {
            sessions_per_client: Some(2.15),
            ..fleet(1000, 2, None)
        };
        assert_eq!(
            judged(early),
            Some((
                Some("no acquisition in the run's second half (2 in all)".to_string()),
                Some(false)
            ))
        );
        // Not counted on this store: not measured.
        assert_eq!(judged(fleet(1000, 2, None)), Some((None, None)));
        // A healthy 1,000-client run beside a 16-client run without the figure (missing,
        // failed, or granting nothing): not measured, not missed (a helper's review).
        let healthy = bench::Fleet {
            sessions_per_client: Some(2.0),
            ..fleet(1000, 300, Some(44.0))
        };
        assert_eq!(
            judged_beside(fleet(16, 0, None), healthy),
            Some((None, None))
        );
        assert_eq!(
            judged(fleet(1000, 300, Some(44.0))),
            Some((Some("44.0 vs 40.0 (1.10x)".to_string()), Some(true)))
        );
    }

    #[test]
    fn ours_is_judged_against_each_peer_in_the_same_shapes() {
        let mut report = bench::Report::new("redis");
        let floor = "uncontended acquire+release / raw floor (means)";
        let ms = std::time::Duration::from_millis;
        report.ratio(floor, ms(3), ms(2), None);
        report.ratio(&format!("p 1.0: {floor}"), ms(2), ms(2), None);
        report.ratio(&format!("q 2.0: {floor}"), ms(4), ms(2), None);
        // Not a peer's line on our floor: no target.
        report.ratio(&format!("p 1.0: {floor} and more"), ms(1), ms(2), None);
        report.sweep = vec![step(1, 100.0, 3), step(2, 300.0, 3)];
        report.sweep.extend(
            [step(1, 200.0, 3), step(2, 250.0, 3)].map(|s| bench::SweepStep {
                peer: Some("p 1.0".into()),
                ..s
            }),
        );
        let targets = of_peers(&report);
        let goals: Vec<(&str, Option<bool>)> =
            targets.iter().map(|t| (t.goal.as_str(), t.met)).collect();
        assert_eq!(
            goals,
            [
                (
                    "uncontended cycle: no slower than p 1.0's (same floor)",
                    Some(false)
                ),
                (
                    "uncontended cycle: no slower than q 2.0's (same floor)",
                    Some(true)
                ),
                ("client sweep: best turns/s >= p 1.0's", Some(true)),
            ]
        );
        assert_eq!(
            targets[0].measured.as_deref(),
            Some("1.50x vs 1.00x of the floor")
        );
        assert_eq!(
            targets[2].measured.as_deref(),
            Some("300/s vs 250/s (1.20x)")
        );

        // A peer whose workloads failed: each a target not measured, with the error.
        report.failed(&format!("r 3.0: {floor}"), "refused");
        report.failed("r 3.0, 1000 clients, hold 1ms", "too many connections");
        report.failed("r 3.0, sweep, 1 clients on many names", "timed out");
        // A later step of a peer with steps: its sweep is judged on the steps it has.
        report.failed("p 1.0, sweep, 4 clients on many names", "gone");
        let failed: Vec<(String, Option<String>, Option<bool>)> = of_peers(&report)
            .into_iter()
            .filter(|t| t.goal.contains("r 3.0"))
            .map(|t| (t.goal, t.measured, t.met))
            .collect();
        let not_measured = |goal: &str, error: &str| {
            (
                goal.to_string(),
                Some(format!("the peer's run failed: {error}")),
                None,
            )
        };
        assert_eq!(
            failed,
            [
                not_measured(
                    "1000 clients, hold 1 ms: acquisitions/s >= r 3.0's",
                    "too many connections"
                ),
                not_measured(
                    "uncontended cycle: no slower than r 3.0's (same floor)",
                    "refused"
                ),
                not_measured("client sweep: best turns/s >= r 3.0's", "timed out"),
            ]
        );
        assert_eq!(
            of_peers(&report)
                .iter()
                .filter(|t| t.goal == "client sweep: best turns/s >= p 1.0's")
                .count(),
            1
        );
    }
}
