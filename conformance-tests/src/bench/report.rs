//! [`Report`]: what one store's benchmark measured, as lines for the terminal and JSON for
//! `cargo xtask compare`.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use super::{BENCH_REPORT_DIR_VAR, Fleet, Renewal, RoundRatios, Stats, SweepStep};

/// One line of a benchmark report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// What was measured.
    pub metric: String,
    /// The measurement, as text.
    pub value: String,
    /// The ratio to the raw floor of the same run, when the line is a ratio.
    pub ratio: Option<f64>,
    /// The target ratio, when there is one.
    pub target: Option<f64>,
    /// A ratio's numerator, in nanoseconds (the lock's figure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_ns: Option<u64>,
    /// A ratio's denominator, in nanoseconds (the floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_ns: Option<u64>,
}

/// A store's benchmark results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The store's label.
    pub store: String,
    /// The lines, in order.
    pub lines: Vec<Line>,
    /// The runs of separate clients, as numbers (their lines are in `lines` too), for plots.
    #[serde(default)]
    pub fleets: Vec<FleetRun>,
    /// The client sweep's steps (see [`super::sweep_report`]), as numbers (and in `lines`).
    #[serde(default)]
    pub sweep: Vec<SweepStep>,
    /// The renewal cost (see [`super::renewal_report`]), as numbers (and in `lines`).
    #[serde(default)]
    pub renewal: Option<Renewal>,
    /// The renewal cost of peer libraries on the same servers (see
    /// [`super::peer_renewal_report`]), by peer, as numbers (and in `lines`).
    #[serde(default)]
    pub peer_renewals: Vec<(String, Renewal)>,
}

/// One run of separate clients in a [`Report`]: by this library or by a peer library on the
/// same server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetRun {
    /// The peer library (name and version), or `None` for this library.
    pub peer: Option<String>,
    /// One raw round trip of the store, measured in the same run.
    pub round_trip: Duration,
    /// What the run measured.
    pub fleet: Fleet,
}

impl Report {
    /// An empty report for `store`.
    pub fn new(store: &str) -> Self {
        Self {
            store: store.to_owned(),
            lines: Vec::new(),
            fleets: Vec::new(),
            sweep: Vec::new(),
            renewal: None,
            peer_renewals: Vec::new(),
        }
    }

    /// Adds latency statistics.
    pub fn stats(&mut self, metric: &str, stats: &Stats) {
        self.push(metric, stats.to_string(), None, None);
    }

    /// Adds `value / floor` as a ratio, with an optional target (printed, never asserted).
    pub fn ratio(&mut self, metric: &str, value: Duration, floor: Duration, target: Option<f64>) {
        let ratio = value.as_secs_f64() / floor.as_secs_f64().max(f64::MIN_POSITIVE);
        let text = format!("{:.2}x ({value:?} / {floor:?})", ratio);
        self.push(metric, text, Some(ratio), target);
        self.set_terms(value, floor);
    }

    /// Records the last line's numerator and denominator.
    fn set_terms(&mut self, value: Duration, floor: Duration) {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if let Some(line) = self.lines.last_mut() {
            line.value_ns = Some(nanos(value));
            line.floor_ns = Some(nanos(floor));
        }
    }

    /// Adds the median of per-round ratios, with its spread and an optional target.
    pub fn round_ratio(&mut self, metric: &str, ratios: &RoundRatios, target: Option<f64>) {
        let text = format!(
            "{:.2}x median of rounds (range {:.2}x..{:.2}x; median {:?} / {:?})",
            ratios.median, ratios.min, ratios.max, ratios.value, ratios.floor
        );
        self.push(metric, text, Some(ratios.median), target);
        self.set_terms(ratios.value, ratios.floor);
    }

    /// Adds a plain number (a count per something), with one decimal.
    pub fn number(&mut self, metric: &str, value: f64) {
        self.push(metric, format!("{value:.1}"), None, None);
    }

    /// Adds a rate.
    pub fn rate(&mut self, metric: &str, per_second: f64) {
        self.push(metric, format!("{per_second:.0}/s"), None, None);
    }

    /// Adds the line `metric` of something that failed with `error` (a peer library's run,
    /// which is its finding and does not stop the benchmark).
    pub fn failed(&mut self, metric: &str, error: &str) {
        self.push(&format!("{metric}: failed"), error.to_owned(), None, None);
    }

    pub(crate) fn push(
        &mut self,
        metric: &str,
        value: String,
        ratio: Option<f64>,
        target: Option<f64>,
    ) {
        let line = Line {
            metric: metric.to_owned(),
            value,
            ratio,
            target,
            value_ns: None,
            floor_ns: None,
        };
        println!("{}: {}", self.store, render_line(&line));
        self.lines.push(line);
    }

    /// Writes the report to [`BENCH_REPORT_DIR_VAR`] when it is set.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn finish(&self) -> std::io::Result<()> {
        let Some(dir) = std::env::var_os(BENCH_REPORT_DIR_VAR) else {
            return Ok(());
        };
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(format!("{}.json", self.store)), json)
    }
}

/// A line as text: metric, value, and the target verdict when there is one.
pub fn render_line(line: &Line) -> String {
    match (line.ratio, line.target) {
        (Some(ratio), Some(target)) => {
            let verdict = if ratio <= target { "within" } else { "ABOVE" };
            format!(
                "{} = {} [{verdict} target {}x]",
                line.metric,
                line.value,
                factor(target)
            )
        }
        _ => format!("{} = {}", line.metric, line.value),
    }
}

/// A target factor as text: at most three decimals, no trailing zeros (`2`, `1.25`, `1.111`
/// for 1/0.9), one more than the ratios beside it show, so a ratio just above a target never
/// reads as equal to it.
pub fn factor(target: f64) -> String {
    let text = format!("{target:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl Report {
    /// Adds the lines of one [`Fleet`] run labelled `label`, with its hand-off p50 as a ratio
    /// to `round_trip` (one raw round trip of the store measured in the same run).
    pub fn fleet(&mut self, label: &str, fleet: &Fleet, round_trip: Duration) {
        self.fleet_of(None, label, fleet, round_trip);
    }

    /// Like [`Self::fleet`], for the run of `peer`, a library a user would otherwise pick, on
    /// the same server; `label` names the peer too.
    pub fn peer_fleet(&mut self, peer: &str, label: &str, fleet: &Fleet, round_trip: Duration) {
        self.fleet_of(Some(peer), label, fleet, round_trip);
    }

    /// Adds one step of the client sweep.
    pub fn sweep_step(&mut self, step: &SweepStep) {
        self.sweep.push(step.clone());
        let label = match &step.peer {
            Some(peer) => format!("{peer}, sweep, {} clients on many names", step.clients),
            None => format!("sweep, {} clients on many names", step.clients),
        };
        self.rate(&format!("{label}: turns"), step.per_second);
        self.push(
            &format!("{label}: turn (acquire + release)"),
            format!(
                "p50 {:?}, p99 {:?}, max {:?} ({} turns; {} waits cut by the step's end, {} \
                 answered unavailable)",
                step.turn.p50,
                step.turn.p99,
                step.turn.max,
                step.turn.samples,
                step.cut_short,
                step.unavailable
            ),
            None,
            None,
        );
        if let Some(first) = &step.first_unavailable {
            self.push(
                &format!("{label}: first unavailable answer"),
                first.clone(),
                None,
                None,
            );
        }
        let cores = step
            .server_cores
            .map_or_else(|| "?".to_string(), |c| format!("{c:.2}"));
        let rss = step
            .server_rss_kib
            .map_or_else(|| "?".to_string(), |kib| (kib / 1024).to_string());
        self.push(
            &format!("{label}: servers"),
            format!("{cores} cores, {rss} MiB resident"),
            None,
            None,
        );
    }

    /// Adds the renewal cost.
    pub fn renewal(&mut self, renewal: &Renewal) {
        self.renewal = Some(renewal.clone());
        let label = format!("renewing {} held locks", renewal.locks);
        self.renewal_lines(&label, "one batch of every lock", renewal);
    }

    /// Adds the renewal cost of the peer library `peer` on the same servers (see
    /// [`super::peer_renewal_report`]): the lines of [`Report::renewal`], after the peer's
    /// name.
    pub fn peer_renewal(&mut self, peer: &str, renewal: &Renewal) {
        self.peer_renewals.push((peer.to_owned(), renewal.clone()));
        let label = format!("{peer}: renewing {} held locks", renewal.locks);
        self.renewal_lines(&label, "every lock renewed once, all at once", renewal);
    }

    /// The lines of a renewal cost, each metric after `label`; `period` says what one period
    /// sends.
    fn renewal_lines(&mut self, label: &str, period: &str, renewal: &Renewal) {
        self.push(
            &format!("{label}: one period ({period})"),
            renewal.period.to_string(),
            None,
            None,
        );
        let trips = renewal.round_trips.map_or_else(
            || "? (ss could not tell)".to_string(),
            |trips| {
                format!(
                    "{trips:.1} per period, {:.2} per 100 locks",
                    trips * 100.0 / renewal.locks.max(1) as f64
                )
            },
        );
        self.push(
            &format!("{label}: round trips at most (data segments sent)"),
            trips,
            None,
            None,
        );
        let cpu = renewal
            .server_cpu
            .map_or_else(|| "?".to_string(), |cpu| format!("{cpu:?}"));
        self.push(
            &format!("{label}: servers per period"),
            format!(
                "{:.0} {}, {cpu} of CPU; {} renewals failed",
                renewal.operations, renewal.operations_are, renewal.not_renewed
            ),
            None,
            None,
        );
    }

    fn fleet_of(&mut self, peer: Option<&str>, label: &str, fleet: &Fleet, round_trip: Duration) {
        self.fleets.push(FleetRun {
            peer: peer.map(str::to_owned),
            round_trip,
            fleet: fleet.clone(),
        });
        self.rate(&format!("{label}: acquisitions"), fleet.per_second);
        let handoff = format!("{label}: hand-off to another client p50 / raw round trip");
        if fleet.handoff.samples == 0 {
            // Nothing to set against the floor, and no target met.
            let value = "not measured: no hand-off to another client".to_owned();
            self.push(&handoff, value, None, None);
        } else {
            self.ratio(&handoff, fleet.handoff.p50, round_trip, Some(2.0));
        }
        self.push(
            &format!("{label}: hand-off to another client"),
            format!(
                "p50 {:?}, p99 {:?}, max {:?} ({} hand-offs; {} re-takes by the same client)",
                fleet.handoff.p50,
                fleet.handoff.p99,
                fleet.handoff.max,
                fleet.handoff.samples,
                fleet.self_retakes
            ),
            None,
            None,
        );
        self.push(
            &format!("{label}: fairness"),
            format!(
                "per client min {} / max {} of {}, Jain {:.2}, {} failed turns, {} overlapping holds",
                fleet.min, fleet.max, fleet.acquisitions, fleet.jain, fleet.failures, fleet.overlaps
            ),
            None,
            None,
        );
        if let Some(failure) = &fleet.first_failure {
            self.push(
                &format!("{label}: first failed turn"),
                failure.clone(),
                None,
                None,
            );
        }
        if let Some(sessions) = fleet.sessions_per_client {
            self.push(
                &format!("{label}: sessions per client (most open during the run)"),
                format!("{sessions:.2}"),
                None,
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run in which no client handed the lock to another has no hand-off to set against
    /// the floor: its line states that, with no ratio and no target verdict (a run of 1,000
    /// lease clients that granted nothing printed "0.00x (0ns / ..) [within target 2x]").
    #[test]
    fn a_run_without_hand_offs_claims_no_target() {
        let none = Stats {
            samples: 0,
            mean: Duration::ZERO,
            p50: Duration::ZERO,
            p99: Duration::ZERO,
            max: Duration::ZERO,
        };
        let fleet = Fleet {
            clients: 1000,
            hold: Duration::from_millis(1),
            acquisitions: 0,
            per_second: 0.0,
            handoff: none,
            self_retakes: 0,
            min: 0,
            max: 0,
            jain: 0.0,
            failures: 830,
            first_failure: None,
            overlaps: 0,
            operations_per_acquisition: None,
            sessions_per_client: None,
            second_half: None,
        };
        let mut report = Report::new("s");
        report.fleet("1000 clients", &fleet, Duration::from_micros(850));
        let handoff = report
            .lines
            .iter()
            .find(|line| line.metric.contains("hand-off to another client p50"))
            .expect("a hand-off line");
        assert_eq!((handoff.ratio, handoff.target), (None, None));
        assert_eq!(
            render_line(handoff),
            "1000 clients: hand-off to another client p50 / raw round trip = \
             not measured: no hand-off to another client"
        );
    }

    #[test]
    fn factors_show_at_most_three_decimals() {
        assert_eq!(factor(2.0), "2");
        assert_eq!(factor(1.25), "1.25");
        assert_eq!(factor(1.0 / 0.9), "1.111");
        assert_eq!(factor(1.5), "1.5");
        assert_eq!(factor(1.05), "1.05");
    }
}
