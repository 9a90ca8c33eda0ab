//! The client sweep, after YCSB: 1, 2, 4, ..., 64 separate clients on many names, each turn
//! on a name chosen with a Zipf distribution (a few names hot, most cold): acquire, write,
//! release. Per step: turns per second, the latency of a turn (p50/p99/max), and what the
//! store's server processes used meanwhile (CPU time, resident memory), read from `/proc`.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use lock_core::{Holder, LockClient, LockName, LockOptions};
use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};

use super::{
    Stats, histogram, record,
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
/// runtime and its own client from `connect`) take turns on names chosen by Zipf for
/// `run_for` (a third of it in a quick run); only turns done by then count, and the
/// servers' CPU time is read at the start and at that end (not while the clients shut
/// down). `instances` name the store's server
/// instances (see `server_pids`). Blocks the calling thread: call it outside a runtime or
/// from `spawn_blocking`.
///
/// # Errors
/// A client that cannot connect, or a turn's error other than a time-out, as text.
pub fn sweep_step<C, CF>(
    connect: C,
    clients: usize,
    run_for: Duration,
    instances: &[&str],
) -> Result<SweepStep, String>
where
    C: Fn() -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
{
    let prefix = format!("bench/sweep/{:016x}", rand::random::<u64>());
    let names: Arc<Vec<LockName>> = Arc::new(
        (0..SWEEP_NAMES)
            .map(|i| LockName::new(format!("{prefix}/{i}")).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?,
    );
    let zipf = Zipf::new(SWEEP_NAMES as f64, ZIPF_EXPONENT).map_err(|e| e.to_string())?;
    let run_for = crate::selection::run_for(run_for);
    let connect = Arc::new(connect);
    let tally = Arc::new(Mutex::new(Tally::new()?));
    let pids = server_pids(instances);
    let cpu_before = total_cpu(&pids);
    let mut at_end = (None, None);
    let of_clients = tally.clone();
    super::threads::run_clients(
        clients,
        move |_| {
            let connect = connect.clone();
            async move { connect().await }
        },
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
async fn turns(
    client: &LockClient,
    names: &[LockName],
    zipf: Zipf<f64>,
    end: Instant,
    all: &Mutex<Tally>,
) -> Result<(), String> {
    let holder = Holder::new();
    let mut rng = rand::rng();
    let mut mine = Tally::new()?;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        // Zipf draws 1..=n, 1 the most frequent.
        let rank = (zipf.sample(&mut rng) as usize).clamp(1, names.len());
        let name = &names[rank - 1];
        let options = LockOptions::new().ttl(Duration::from_secs(30)).wait(left);
        let started = Instant::now();
        match client.acquire(&holder, name, &options).await {
            Ok(guard) => {
                guard.release().await.map_err(|e| e.to_string())?;
                // A turn done after the step's end is not the step's.
                if Instant::now() <= end {
                    record(&mut mine.latencies, started.elapsed());
                    mine.done += 1;
                }
            }
            Err(lock_core::LockError::Timeout { .. }) => mine.cut_short += 1,
            Err(error @ lock_core::LockError::Unavailable { .. }) => {
                mine.unavailable += 1;
                mine.first_unavailable
                    .get_or_insert_with(|| error.to_string());
            }
            Err(error) => return Err(error.to_string()),
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
    if !crate::selection::workload(crate::selection::SWEEP) {
        return Ok(());
    }
    let steps: &[usize] = if crate::selection::quick() {
        &[1, 4, 16]
    } else {
        &SWEEP_CLIENTS
    };
    for &clients in steps {
        let connect = connect.clone();
        let step =
            tokio::task::spawn_blocking(move || sweep_step(connect, clients, run_for, instances))
                .await
                .map_err(|e| format!("a sweep step panicked: {e}"))??;
        report.sweep_step(&step);
    }
    Ok(())
}
