//! The client sweep, after YCSB: 1, 2, 4, ..., 64 separate clients on many names, each turn
//! on a name chosen with a Zipf distribution (a few names hot, most cold): acquire, write,
//! release. Per step: turns per second, the latency of a turn (p50/p99/max), and what the
//! store's server processes used meanwhile (CPU time, resident memory), read from `/proc`.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use lock_core::{LockClient, LockName, LockOptions};
use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};

use super::{
    Stats,
    contender::{Contender, Ours, TurnError},
    histogram, record,
    server_process::{rss_kib, server_pids, total_cpu},
    stats,
};

/// The clients of the sweep's steps.
pub const SWEEP_CLIENTS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// How many names the turns choose from.
pub const SWEEP_NAMES: usize = 1_000;

/// The Zipf exponent of the choice of name (YCSB's default).
pub const ZIPF_EXPONENT: f64 = 0.99;

/// One step of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepStep {
    /// The peer library (name and version) whose step this is, or `None` for this library.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Separate clients.
    pub clients: usize,
    /// Turns done (acquire, write, release).
    pub turns: usize,
    /// Turns per second.
    pub per_second: f64,
    /// The latency of a turn, from the acquire call to the release's return.
    pub turn: Stats,
    /// Acquisitions whose wait the step's end cut short (each waits at most until then;
    /// not counted in `turns`).
    pub cut_short: usize,
    /// Acquisitions the store answered `Unavailable` (retry): not counted in `turns`; the
    /// client tries again, as a user's would.
    #[serde(default)]
    pub unavailable: usize,
    /// The first of them, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_unavailable: Option<String>,
    /// CPU time the store's server processes used during the step, per second of it (1.0
    /// is one core busy), when their processes were found.
    pub server_cores: Option<f64>,
    /// The server processes' resident memory at the step's end, in KiB, when found.
    pub server_rss_kib: Option<u64>,
}

/// One step: `clients` separate clients (each an OS thread with its own current-thread
/// runtime and its own [`Contender`] from `connect`) take turns on names chosen by Zipf for
/// `run_for` (a third of it in a quick run); only turns done by then count, and the
/// servers' CPU time is read at the start and at that end (not while the clients shut
/// down). `instances` name the store's server
/// instances (see `server_pids`). Blocks the calling thread: call it outside a runtime or
/// from `spawn_blocking`.
///
/// # Errors
/// A client that cannot connect, or a turn's error other than an `Unavailable` answer, as
/// text.
pub fn sweep_step<C, CF, T>(
    connect: C,
    clients: usize,
    run_for: Duration,
    instances: &[&str],
) -> Result<SweepStep, String>
where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    T: Contender,
{
    let prefix = format!("bench/sweep/{:016x}", rand::random::<u64>());
    let names: Arc<Vec<LockName>> = Arc::new(
        (0..SWEEP_NAMES)
            .map(|i| LockName::new(format!("{prefix}/{i}")).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?,
    );
    let zipf = Zipf::new(SWEEP_NAMES as f64, ZIPF_EXPONENT).map_err(|e| e.to_string())?;
    let run_for = crate::selection::run_for(run_for);
    let tally = Arc::new(Mutex::new(Tally::new()?));
    let pids = server_pids(instances);
    let cpu_before = total_cpu(&pids);
    let mut at_end = (None, None);
    let of_clients = tally.clone();
    super::threads::run_clients(
        clients,
        move |_| connect(),
        move |_, client, began| {
            let (names, tally) = (names.clone(), of_clients.clone());
            async move { turns(&client, &names, zipf, began + run_for, &tally).await }
        },
        |began| {
            std::thread::sleep((began + run_for).saturating_duration_since(Instant::now()));
            at_end = (
                total_cpu(&pids),
                (!pids.is_empty())
                    .then(|| pids.iter().map(|&pid| rss_kib(pid)).sum::<Option<u64>>())
                    .flatten(),
            );
        },
    )?;
    let (cpu_after, rss) = at_end;
    let tally = std::mem::replace(
        &mut *tally.lock().unwrap_or_else(PoisonError::into_inner),
        Tally::new()?,
    );
    let server_cores = cpu_before
        .zip(cpu_after)
        .filter(|_| !pids.is_empty())
        .map(|(before, after)| after.saturating_sub(before).as_secs_f64() / run_for.as_secs_f64());
    Ok(SweepStep {
        peer: None,
        clients,
        turns: tally.done,
        per_second: tally.done as f64 / run_for.as_secs_f64().max(f64::MIN_POSITIVE),
        turn: stats(&tally.latencies),
        cut_short: tally.cut_short,
        unavailable: tally.unavailable,
        first_unavailable: tally.first_unavailable,
        server_cores,
        server_rss_kib: rss,
    })
}

/// What the clients of one step counted.
struct Tally {
    /// The latency of each turn done.
    latencies: hdrhistogram::Histogram<u64>,
    /// Turns done.
    done: usize,
    /// Acquisitions cut short by the step's end.
    cut_short: usize,
    /// Acquisitions answered `Unavailable`, and the first of them.
    unavailable: usize,
    first_unavailable: Option<String>,
}

impl Tally {
    fn new() -> Result<Self, String> {
        Ok(Self {
            latencies: histogram()?,
            done: 0,
            cut_short: 0,
            unavailable: 0,
            first_unavailable: None,
        })
    }

    /// Adds `other`'s counts.
    fn add(&mut self, other: Self) -> Result<(), String> {
        self.latencies
            .add(&other.latencies)
            .map_err(|e| e.to_string())?;
        self.done += other.done;
        self.cut_short += other.cut_short;
        self.unavailable += other.unavailable;
        if self.first_unavailable.is_none() {
            self.first_unavailable = other.first_unavailable;
        }
        Ok(())
    }
}

/// One client's turns until `end`: a Zipf-chosen name, acquire (waiting at most until
/// `end`), write (the caller's work: nothing here, the lock's cost is what is measured),
/// release.
async fn turns<T: Contender>(
    client: &T,
    names: &[LockName],
    zipf: Zipf<f64>,
    end: Instant,
    all: &Mutex<Tally>,
) -> Result<(), String> {
    let mut rng = rand::rng();
    let mut mine = Tally::new()?;
    while Instant::now() < end {
        // Zipf draws 1..=n, 1 the most frequent.
        let rank = (zipf.sample(&mut rng) as usize).clamp(1, names.len());
        let name = &names[rank - 1];
        let started = Instant::now();
        match client.turn(name, end, Duration::ZERO).await {
            // A turn done after the step's end is not the step's.
            Ok(Some(_)) if Instant::now() <= end => {
                record(&mut mine.latencies, started.elapsed());
                mine.done += 1;
            }
            Ok(Some(_)) => {}
            Ok(None) => mine.cut_short += 1,
            Err(TurnError::Unavailable(error)) => {
                mine.unavailable += 1;
                mine.first_unavailable.get_or_insert(error);
            }
            Err(TurnError::Failed(error)) => return Err(error),
        }
    }
    all.lock().unwrap_or_else(PoisonError::into_inner).add(mine)
}

/// The sweep's steps against the store `connect` reaches (see [`SWEEP_CLIENTS`]; 1, 4 and
/// 16 clients a third as long in a quick run), each added to `report` (see
/// [`super::Report::sweep_step`]); nothing when the `sweep` workload is left out (see
/// [`crate::selection::WORKLOAD_VAR`]). `instances` name the store's server instances.
///
/// # Errors
/// The first error of a step, as text.
pub async fn sweep_report<C, CF>(
    report: &mut super::Report,
    connect: C,
    run_for: Duration,
    instances: &'static [&'static str],
) -> Result<(), String>
where
    C: Fn() -> CF + Clone + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
{
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let connect = Arc::new(connect);
    let ours = move || {
        let (connect, options) = (connect.clone(), options.clone());
        async move { Ok(Ours::new(connect().await?, options)) }
    };
    for &clients in chosen_steps() {
        let step = run_step(ours.clone(), clients, run_for, instances).await?;
        report.sweep_step(&step);
    }
    Ok(())
}

/// The sweep of `peer`, a library a user would otherwise pick, beside ours: the same steps
/// (see [`sweep_report`]), each client's [`Contender`] made by `connect`. A step that fails
/// does not stop the benchmark: it is the peer's finding, added to `report` as a line with
/// its error (and no later step runs, as more clients would fail the same way).
pub async fn peer_sweep_report<C, CF, T>(
    report: &mut super::Report,
    peer: &str,
    connect: C,
    run_for: Duration,
    instances: &'static [&'static str],
) where
    C: Fn() -> CF + Clone + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    T: Contender,
{
    for &clients in chosen_steps() {
        match run_step(connect.clone(), clients, run_for, instances).await {
            Ok(step) => report.sweep_step(&SweepStep {
                peer: Some(peer.to_owned()),
                ..step
            }),
            Err(error) => {
                let label = format!("{peer}, sweep, {clients} clients on many names");
                report.failed(&label, &error);
                return;
            }
        }
    }
}

/// The clients of the sweep's steps: none when the `sweep` workload is left out (see
/// [`crate::selection::WORKLOAD_VAR`]), 1, 4 and 16 in a quick run, else [`SWEEP_CLIENTS`].
fn chosen_steps() -> &'static [usize] {
    if !crate::selection::workload(crate::selection::SWEEP) {
        &[]
    } else if crate::selection::quick() {
        &[1, 4, 16]
    } else {
        &SWEEP_CLIENTS
    }
}

/// [`sweep_step`] on a blocking thread of the runtime.
async fn run_step<C, CF, T>(
    connect: C,
    clients: usize,
    run_for: Duration,
    instances: &'static [&'static str],
) -> Result<SweepStep, String>
where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    T: Contender,
{
    tokio::task::spawn_blocking(move || sweep_step(connect, clients, run_for, instances))
        .await
        .map_err(|e| format!("a sweep step panicked: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{TurnError, each_own};
    use lock_core::MemoryBackend;

    /// How long a step of these tests lasts: long enough that its client's thread starts
    /// before the step's end even on a loaded machine (with 50 ms, a run of `cargo xtask
    /// test` saw a step end before its first turn), short for a test. A step whose turns
    /// fail ends at the first failure.
    const STEP: Duration = Duration::from_millis(1_000);

    /// A peer whose every turn fails with `error`, counting its turns.
    struct Failing {
        error: TurnError,
        turns: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Contender for Failing {
        async fn turn(&self, _: &LockName, _: Instant, _: Duration) -> super::super::Turn {
            let turns = self.turns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // A few answers of `error`, then turns run out as the step's end would make them.
            if turns < 3 {
                Err(self.error.clone())
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok(None)
            }
        }
    }

    /// A peer's client connecting at once.
    type Connected = std::future::Ready<Result<Failing, String>>;

    /// A `connect` of [`Failing`] peers answering `error`, and their count of turns.
    fn failing(
        error: TurnError,
    ) -> (
        impl Fn() -> Connected + Clone + Send + Sync + 'static,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        let turns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = turns.clone();
        let connect = move || {
            std::future::ready(Ok(Failing {
                error: error.clone(),
                turns: counted.clone(),
            }))
        };
        (connect, turns)
    }

    #[test]
    fn a_step_of_ours_counts_turns_and_their_latency() {
        let connect = each_own(MemoryBackend::new(), |shared| async move {
            Ok::<_, lock_core::LockError>(shared)
        });
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        let ours = move || {
            let (connect, options) = (connect.clone(), options.clone());
            async move { Ok(Ours::new(connect().await?, options)) }
        };
        let step = sweep_step(ours, 4, STEP, &[]).unwrap();
        assert_eq!((step.peer.as_deref(), step.clients), (None, 4));
        assert!(step.turns > 10, "{step:?}");
        assert_eq!(step.turn.samples, step.turns, "{step:?}");
        assert_eq!(step.unavailable, 0, "{step:?}");
        assert_eq!(step.server_cores, None, "no server processes named");
    }

    #[test]
    fn unavailable_answers_are_counted_and_other_errors_end_the_step() {
        let (peer, _) = failing(TurnError::Unavailable("busy".into()));
        let step = sweep_step(peer, 1, STEP, &[]).unwrap();
        assert_eq!((step.unavailable, step.turns), (3, 0), "{step:?}");
        assert_eq!(step.first_unavailable.as_deref(), Some("busy"));

        let (peer, turns) = failing(TurnError::Failed("broken".into()));
        let error = sweep_step(peer, 1, STEP, &[]).unwrap_err();
        assert_eq!(error, "broken");
        assert_eq!(turns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_peer_step_that_fails_is_a_line_and_ends_the_peer_sweep() {
        let (peer, turns) = failing(TurnError::Failed("no route".into()));
        let mut report = super::super::Report::new("s");
        peer_sweep_report(&mut report, "p 1.0", peer, STEP, &[]).await;
        assert!(report.sweep.is_empty());
        let metrics: Vec<(&str, &str)> = report
            .lines
            .iter()
            .map(|l| (l.metric.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            metrics,
            [("p 1.0, sweep, 1 clients on many names: failed", "no route")]
        );
        assert_eq!(turns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
