//! Contention across separate clients: each client is an OS thread with its own Tokio runtime
//! and its own backend (connections, session), as separate processes would have, all taking
//! one lock in turn. Measures what a service fleet sees: throughput, hand-off to *another*
//! client (re-takes by the same client reported apart), and fairness across clients; and,
//! for this library and the peers alike, holds seen to overlap (see [`Fleet::overlaps`] for
//! what that check can see).

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use lock_core::{LockClient, LockName, LockOptions};
use serde::{Deserialize, Serialize};

use super::{
    Stats,
    contender::{Contender, Ours},
    histogram, record, stats,
};

/// What one run of [`separate_clients`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fleet {
    /// How many clients contended.
    pub clients: usize,
    /// How long each client held the lock per turn.
    #[serde(default)]
    pub hold: Duration,
    /// Acquisitions in the whole run.
    pub acquisitions: usize,
    /// Acquisitions per second.
    pub per_second: f64,
    /// From a client's release to the next acquisition by *another* client.
    pub handoff: Stats,
    /// How many acquisitions followed the same client's own release.
    pub self_retakes: usize,
    /// The fewest acquisitions of one client.
    pub min: usize,
    /// The most acquisitions of one client.
    pub max: usize,
    /// Jain's fairness index of acquisitions per client: 1 when equal, 1/n when one client
    /// took everything.
    pub jain: f64,
    /// Turns that failed with an error (the store did not answer in time, ...); the client
    /// went on trying.
    pub failures: usize,
    /// The first failed turn's error, if any turn failed.
    pub first_failure: Option<String>,
    /// Acquisitions that returned before the release of an earlier hold had even begun: two
    /// holds at once, mutual exclusion broken (every client is in this process, so their
    /// instants compare). A correct lock grants only after a release reached the store, which
    /// is after it began, as long as no lease expires during a hold (the runs hold 1 ms or 0
    /// under a 30 s TTL). A run of this library with any fails in [`fleet_report`]. Not seen:
    /// turns whose release failed (counted in `failures` only, as such a hold may have been
    /// lost, and then overtaken, before its release), and overlaps shorter than the clock's
    /// reading of a hold (with hold 0, a few microseconds).
    #[serde(default)]
    pub overlaps: usize,
    /// Operations the store's servers counted during the run, per acquisition (see
    /// [`counted`](super::counted)), when counted.
    pub operations_per_acquisition: Option<f64>,
    /// The most sessions (connections) open on the store's servers during the run, above
    /// those open before it, per client, when counted.
    pub sessions_per_client: Option<f64>,
    /// The steady second half of the run, which [`counted`](super::counted) counts
    /// operations over.
    #[serde(skip)]
    pub second_half: Option<SecondHalf>,
}

/// The steady second half of a fleet run: from its middle to the end of its turns. The first
/// half has every client's first tries and subscriptions; at the end every client still
/// waiting gives up at once and cleans up (1,000 of them outweigh the hand-offs of the half).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecondHalf {
    /// The middle of the run.
    pub middle: Instant,
    /// When the clients stop taking turns.
    pub end: Instant,
    /// When each acquisition of the run returned, in order.
    pub acquired: Vec<Instant>,
}

/// One acquisition: by which client, when `acquire` returned, when the release began.
#[derive(Debug, Clone, Copy)]
struct Turn {
    client: usize,
    acquired: Instant,
    released: Instant,
}

/// Jain's fairness index of `counts`.
pub fn jain(counts: &[usize]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// `clients` separate clients (each an OS thread with its own current-thread runtime and its
/// own client from `connect`) take one lock in turn for `run_for`, holding it `hold` each
/// time; every client waits with the budget that is left. Blocks the calling thread: call it
/// outside a runtime or from `block_in_place`.
///
/// # Errors
/// The first error of a client (connecting, acquiring or releasing), as text.
pub fn separate_clients<C, CF>(
    connect: C,
    clients: usize,
    hold: Duration,
    run_for: Duration,
    options: &LockOptions,
) -> Result<Fleet, String>
where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
{
    let options = options.clone();
    let connect = Arc::new(connect);
    fleet(
        move || {
            let (connect, options) = (connect.clone(), options.clone());
            async move { Ok(Ours::new(connect().await?, options)) }
        },
        clients,
        hold,
        run_for,
    )
}

/// Like [`separate_clients`], for any [`Contender`]: `connect` makes each client's contender,
/// which all take one lock. A quick run lasts a third of `run_for` (see
/// [`crate::selection::run_for`]).
///
/// # Errors
/// The first error of a client, as text.
pub fn fleet<C, CF, T>(
    connect: C,
    clients: usize,
    hold: Duration,
    run_for: Duration,
) -> Result<Fleet, String>
where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    T: Contender,
{
    let run_for = crate::selection::run_for(run_for);
    let name = LockName::new(format!("bench/fleet/{:016x}", rand::random::<u64>()))
        .map_err(|e| e.to_string())?;
    let turns = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(Mutex::new((0usize, None::<String>)));
    let (turns_of, failures_of) = (turns.clone(), failures.clone());
    let began = super::threads::run_clients(
        clients,
        move |_| connect(),
        move |id, contender, began| {
            let (turns, failures, name) = (turns_of.clone(), failures_of.clone(), name.clone());
            async move {
                let end = began + run_for;
                take_turns(id, &contender, &name, hold, end, &turns, &failures).await
            }
        },
        |_| {},
    )?;
    let elapsed = began.elapsed();
    let mut turns = std::mem::take(&mut *turns.lock().unwrap_or_else(PoisonError::into_inner));
    turns.sort_by_key(|turn| turn.acquired);
    let (middle, end) = (began + run_for / 2, began + run_for);
    let (failures, first_failure) =
        std::mem::take(&mut *failures.lock().unwrap_or_else(PoisonError::into_inner));
    let mut fleet = summarize(clients, hold, &turns, elapsed, failures)?;
    fleet.first_failure = first_failure;
    fleet.second_half = Some(SecondHalf {
        middle,
        end,
        acquired: turns.iter().map(|turn| turn.acquired).collect(),
    });
    Ok(fleet)
}

/// How many failed turns one client tolerates before the run fails.
const MAX_FAILURES: usize = 100;

/// One client's loop: turns on `name` until `end`; a failed turn is counted and the client
/// goes on.
async fn take_turns<T: Contender>(
    id: usize,
    contender: &T,
    name: &LockName,
    hold: Duration,
    end: Instant,
    turns: &Mutex<Vec<Turn>>,
    failures: &Mutex<(usize, Option<String>)>,
) -> Result<(), String> {
    let mut mine = Vec::new();
    let mut failed = 0;
    let mut first = None;
    loop {
        match contender.turn(name, end, hold).await {
            Ok(Some((acquired, released))) => mine.push(Turn {
                client: id,
                acquired,
                released,
            }),
            Ok(None) => break,
            Err(error) => {
                failed += 1;
                let error = error.to_string();
                first.get_or_insert_with(|| error.clone());
                if failed > MAX_FAILURES {
                    return Err(format!(
                        "client {id}: {failed} failed turns, the last: {error}"
                    ));
                }
            }
        }
    }
    turns
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend(mine);
    let mut all = failures.lock().unwrap_or_else(PoisonError::into_inner);
    all.0 += failed;
    if all.1.is_none() {
        all.1 = first;
    }
    Ok(())
}

fn summarize(
    clients: usize,
    hold: Duration,
    turns: &[Turn],
    elapsed: Duration,
    failures: usize,
) -> Result<Fleet, String> {
    let mut handoffs = histogram()?;
    let mut self_retakes = 0;
    let overlaps = overlaps(turns);
    for pair in turns.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        if before.client == after.client {
            self_retakes += 1;
        } else {
            record(
                &mut handoffs,
                after.acquired.saturating_duration_since(before.released),
            );
        }
    }
    let mut counts = vec![0usize; clients];
    for turn in turns {
        counts[turn.client] += 1;
    }
    Ok(Fleet {
        clients,
        hold,
        acquisitions: turns.len(),
        per_second: turns.len() as f64 / elapsed.as_secs_f64().max(f64::MIN_POSITIVE),
        handoff: stats(&handoffs),
        self_retakes,
        min: counts.iter().copied().min().unwrap_or(0),
        max: counts.iter().copied().max().unwrap_or(0),
        jain: jain(&counts),
        failures,
        first_failure: None,
        overlaps,
        operations_per_acquisition: None,
        sessions_per_client: None,
        second_half: None,
    })
}

/// How many of `turns` (sorted by `acquired`) were acquired before the latest `released` of
/// the turns acquired before them: the start of a turn's release is the earliest the store
/// can have freed the lock.
fn overlaps(turns: &[Turn]) -> usize {
    let mut latest_release: Option<Instant> = None;
    let mut overlaps = 0;
    for turn in turns {
        if latest_release.is_some_and(|release| turn.acquired < release) {
            overlaps += 1;
        }
        latest_release = latest_release.max(Some(turn.released));
    }
    overlaps
}

/// A fleet's `connect`: each client gets its own backend, made by `connect` from a clone of
/// `config` (for [`separate_clients`] and [`fleet_report`]).
pub fn each_own<Config, Connect, Connecting, Backend>(
    config: Config,
    connect: Connect,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<LockClient, String>> + Send>>
+ Clone
+ Send
+ Sync
+ 'static
where
    Config: Clone + Send + Sync + 'static,
    Connect: Fn(Config) -> Connecting + Copy + Send + Sync + 'static,
    Connecting: Future<Output = Result<Backend, lock_core::LockError>> + Send + 'static,
    Backend: lock_core::LockBackend,
{
    move || {
        let connecting = connect(config.clone());
        Box::pin(async move {
            connecting
                .await
                .map(LockClient::new)
                .map_err(|e| e.to_string())
        })
    }
}

/// The fleet runs every store's benchmark makes: 16 clients holding 1 ms and holding 0, and
/// 2, 100 and 1,000 clients holding 1 ms (hand-off against 1, 15, 99 and 999 waiters),
/// `run_for` each. In a run of a few seconds most of the
/// 1,000 clients get the lock once or never: that run is for the rate and the operations per
/// acquisition, not for fairness.
pub const FLEET_RUNS: [(usize, Duration); 5] = [
    (16, Duration::from_millis(1)),
    (16, Duration::ZERO),
    (2, Duration::from_millis(1)),
    (100, Duration::from_millis(1)),
    (1_000, Duration::from_millis(1)),
];

/// The runs of [`FLEET_RUNS`] this benchmark makes: none when the `clients` workload is left
/// out (see [`crate::selection::WORKLOAD_VAR`]), the first only in a quick run (see
/// [`crate::selection::QUICK_VAR`]; [`fleet`] makes it a third as long), else all; of those,
/// the sizes [`crate::selection::FLEET_SIZES_VAR`] names when it is set. A benchmark that
/// measures a floor for one of them looks here first, so it can measure the floor before the
/// runs (after the 1,000-client runs the server may still be recovering).
pub fn chosen_runs() -> Vec<(usize, Duration)> {
    let runs = if !crate::selection::workload(crate::selection::CLIENTS) {
        &FLEET_RUNS[..0]
    } else if crate::selection::quick() {
        &FLEET_RUNS[..1]
    } else {
        &FLEET_RUNS[..]
    };
    runs.iter()
        .copied()
        .filter(|&(clients, _)| crate::selection::fleet_size(clients))
        .collect()
}

/// Runs [`FLEET_RUNS`] against the store `connect` reaches, `run_for` each, counting what the
/// store's servers did with `counters` (see [`counted`](super::counted)), and adds each run to
/// `report` (see [`Report::fleet`](super::Report::fleet)). Runs on a multi-thread runtime
/// (the benchmarks' [`crate::runtime`]).
///
/// Returns the runs, in the order of [`FLEET_RUNS`] (the first only in a quick run, see
/// [`crate::selection::QUICK_VAR`]; none when the `clients` workload is left out, see
/// [`crate::selection::WORKLOAD_VAR`]), for ratios a store's benchmark adds.
///
/// # Errors
/// The first error of a run, as text.
pub async fn fleet_report<C, CF, S>(
    report: &mut super::Report,
    connect: C,
    round_trip: Duration,
    run_for: Duration,
    counters: &S,
) -> Result<Vec<Fleet>, String>
where
    C: Fn() -> CF + Clone + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
    S: super::ServerCounters,
{
    let mut runs = Vec::new();
    for shape in chosen_runs() {
        runs.push(
            our_run(
                report,
                connect.clone(),
                shape,
                (round_trip, run_for),
                counters,
            )
            .await?,
        );
    }
    Ok(runs)
}

/// Like [`fleet_report`], with the runs of `peer`, a library a user would otherwise pick,
/// beside ours: before each of our runs, the peer's run of the same shape (clients and hold),
/// each of its clients made by `peer_connect`, counted and added to `report` as ours are (see
/// [`Report::peer_fleet`](super::Report::peer_fleet)). Run in pairs, each of our runs follows
/// the peer's of the same shape, and the largest runs (1,000 clients), whose servers take a
/// while to recover, come last for both. Neither overlapping holds nor a run that fails stop
/// the benchmark when they are the peer's: they are its findings, reported (a failed run as a
/// line with its error, as is a run whose servers' counters could not be read).
///
/// # Errors
/// The first error of one of our runs, as text.
pub async fn fleet_report_beside<C, CF, P, PF, T, S>(
    report: &mut super::Report,
    connect: C,
    (peer, peer_connect): (&str, P),
    round_trip: Duration,
    run_for: Duration,
    counters: &S,
) -> Result<Vec<Fleet>, String>
where
    C: Fn() -> CF + Clone + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
    P: Fn() -> PF + Clone + Send + Sync + 'static,
    PF: Future<Output = Result<T, String>>,
    T: Contender,
    S: super::ServerCounters,
{
    let mut runs = Vec::new();
    for shape in chosen_runs() {
        let timing = (round_trip, run_for);
        peer_run(
            report,
            (peer, peer_connect.clone()),
            shape,
            timing,
            counters,
        )
        .await;
        runs.push(our_run(report, connect.clone(), shape, timing, counters).await?);
    }
    Ok(runs)
}

/// One run of this library's clients of `shape` (clients, hold), added to `report`.
async fn our_run<C, CF, S>(
    report: &mut super::Report,
    connect: C,
    (clients, hold): (usize, Duration),
    (round_trip, run_for): (Duration, Duration),
    counters: &S,
) -> Result<Fleet, String>
where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
    S: super::ServerCounters,
{
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let fleet = super::counted(counters, clients, move || {
        separate_clients(connect, clients, hold, run_for, &options)
    })
    .await?;
    let label = format!("{clients} clients, hold {hold:?}");
    report.fleet(&label, &fleet, round_trip);
    if fleet.overlaps > 0 {
        return Err(format!(
            "{label}: {} acquisitions returned while another client's hold had not begun \
             its release: mutual exclusion broken",
            fleet.overlaps
        ));
    }
    operations_line(report, &label, &fleet, counters);
    Ok(fleet)
}

/// One run of `peer`'s clients of `shape` (clients, hold), added to `report`, or a line with
/// its error when it fails.
async fn peer_run<C, CF, T, S>(
    report: &mut super::Report,
    (peer, connect): (&str, C),
    (clients, hold): (usize, Duration),
    (round_trip, run_for): (Duration, Duration),
    counters: &S,
) where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    T: Contender,
    S: super::ServerCounters,
{
    let label = format!("{peer}, {clients} clients, hold {hold:?}");
    match super::counted(counters, clients, move || {
        fleet(connect, clients, hold, run_for)
    })
    .await
    {
        Ok(fleet) => {
            report.peer_fleet(peer, &label, &fleet, round_trip);
            operations_line(report, &label, &fleet, counters);
        }
        Err(error) => report.failed(&label, &error),
    }
}

/// The line of the servers' operations per acquisition of the run `label`, when counted.
fn operations_line<S: super::ServerCounters>(
    report: &mut super::Report,
    label: &str,
    fleet: &Fleet,
    counters: &S,
) {
    if let Some(operations) = fleet.operations_per_acquisition {
        report.number(
            &format!(
                "{label}: server {} per acquisition (second half of the run)",
                counters.operations_are()
            ),
            operations,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::MemoryBackend;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain(&[20, 0, 0, 0]) - 0.25).abs() < 1e-9);
    }

    fn turn(client: usize, acquired_ms: u64, released_ms: u64, base: Instant) -> Turn {
        Turn {
            client,
            acquired: base + Duration::from_millis(acquired_ms),
            released: base + Duration::from_millis(released_ms),
        }
    }

    #[test]
    fn holds_that_overlap_are_counted() {
        let base = Instant::now();
        // In turn: each acquired after the release before it began.
        let in_turn = [
            turn(0, 0, 2, base),
            turn(1, 3, 5, base),
            turn(0, 6, 6, base),
        ];
        assert_eq!(overlaps(&in_turn), 0);
        // Client 1 acquired while client 0 held (0..10); client 2 while 0 still held too, and
        // after 1 had begun releasing: two overlaps, as the latest release counts.
        let two = [
            turn(0, 0, 10, base),
            turn(1, 4, 6, base),
            turn(2, 8, 9, base),
        ];
        assert_eq!(overlaps(&two), 2);
        let fleet = summarize(3, Duration::ZERO, &two, Duration::from_secs(1), 0).unwrap();
        assert_eq!(fleet.overlaps, 2);
    }

    /// Servers that count nothing.
    struct NoCounts;

    impl crate::bench::ServerCounters for NoCounts {
        fn operations_are(&self) -> &'static str {
            "operations"
        }

        async fn operations(&self) -> Result<u64, String> {
            Ok(0)
        }

        async fn sessions(&self) -> Result<u64, String> {
            Ok(0)
        }
    }

    /// A peer that cannot connect.
    struct Unreachable;

    impl Contender for Unreachable {
        async fn turn(&self, _: &LockName, _: Instant, _: Duration) -> super::super::Turn {
            Ok(None)
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_peer_runs_before_ours_shape_by_shape_and_its_failures_are_lines() {
        let mut report = crate::bench::Report::new("s");
        let ours = each_own(MemoryBackend::new(), |shared| async move {
            Ok::<_, lock_core::LockError>(shared)
        });
        let peer = || async { Err::<Unreachable, _>("connection refused".to_string()) };
        let runs = fleet_report_beside(
            &mut report,
            ours,
            ("p 1.0", peer),
            Duration::from_millis(1),
            Duration::from_millis(30),
            &NoCounts,
        )
        .await
        .unwrap();
        let shapes = chosen_runs();
        assert_eq!(runs.len(), shapes.len());
        assert!(report.fleets.iter().all(|run| run.peer.is_none()));
        // Per shape: the peer's failed run, then our run's lines, in the order of the shapes.
        let mut expected = Vec::new();
        for (clients, hold) in shapes {
            expected.push(format!("p 1.0, {clients} clients, hold {hold:?}: failed"));
            expected.push(format!("{clients} clients, hold {hold:?}: acquisitions"));
        }
        let shown: Vec<&str> = report
            .lines
            .iter()
            .map(|l| l.metric.as_str())
            .filter(|metric| metric.ends_with(": failed") || metric.ends_with(": acquisitions"))
            .collect();
        assert_eq!(shown, expected);
        assert!(
            report
                .lines
                .iter()
                .filter(|l| l.metric.ends_with(": failed"))
                .all(|l| l.value == "connection refused")
        );
    }

    #[test]
    fn separate_clients_take_turns_and_are_counted() {
        let fleet = separate_clients(
            each_own(MemoryBackend::new(), |shared| async move {
                Ok::<_, lock_core::LockError>(shared)
            }),
            4,
            Duration::from_millis(1),
            Duration::from_millis(300),
            &LockOptions::new(),
        )
        .unwrap();
        assert_eq!(fleet.clients, 4);
        assert!(fleet.acquisitions > 10, "{fleet:?}");
        assert!(fleet.min <= fleet.max && fleet.max <= fleet.acquisitions);
        assert!(fleet.jain > 0.0 && fleet.jain <= 1.0 + 1e-9, "{fleet:?}");
        assert_eq!(fleet.overlaps, 0, "{fleet:?}");
        assert_eq!(
            fleet.handoff.samples + fleet.self_retakes + 1,
            fleet.acquisitions,
            "{fleet:?}"
        );
    }
}
