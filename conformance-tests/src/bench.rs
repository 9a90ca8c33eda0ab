//! The shared benchmark harness: each backend's `benches/*.rs` measures its raw floor and the
//! lock's cycle and hand-off with these functions, then prints ratios measured in the same run
//! (never absolute numbers compared across runs) and writes a JSON [`Report`] for
//! `cargo xtask compare` when [`BENCH_REPORT_DIR_VAR`] is set.

use std::{
    fmt,
    future::Future,
    path::Path,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use lock_core::{Holder, LockClient, LockName, LockOptions};
use serde::{Deserialize, Serialize};

/// Where JSON benchmark reports go (one file per store), when set.
pub const BENCH_REPORT_DIR_VAR: &str = "LOCK_BENCH_REPORT_DIR";

/// Latency statistics of one measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// How many samples.
    pub samples: usize,
    /// Mean.
    pub mean: Duration,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mean {:?}, p50 {:?}, p99 {:?} ({} samples)",
            self.mean, self.p50, self.p99, self.samples
        )
    }
}

fn histogram() -> Result<Histogram<u64>, String> {
    // Bounded from 1 ns to 1 h: `Histogram::new` starts with a top of 2 and
    // `saturating_record` clamps to the top instead of growing, so every sample read 2 ns.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    // Saturates at the histogram's top instead of failing on an absurd sample.
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

fn stats(h: &Histogram<u64>) -> Stats {
    Stats {
        samples: usize::try_from(h.len()).unwrap_or(usize::MAX),
        mean: Duration::from_nanos(h.mean() as u64),
        p50: Duration::from_nanos(h.value_at_quantile(0.5)),
        p99: Duration::from_nanos(h.value_at_quantile(0.99)),
    }
}

/// Times `n` sequential runs of `op`, after `n / 10` warm-up runs.
///
/// # Errors
/// The first error of `op`.
pub async fn time_op<F, Fut>(n: usize, mut op: F) -> Result<Stats, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    for _ in 0..n / 10 {
        op().await?;
    }
    let mut h = histogram()?;
    for _ in 0..n {
        let start = Instant::now();
        op().await?;
        record(&mut h, start.elapsed());
    }
    Ok(stats(&h))
}

fn bench_name(tag: &str) -> Result<LockName, String> {
    LockName::new(format!("bench/{tag}/{:016x}", rand::random::<u64>())).map_err(|e| e.to_string())
}

/// Times `n` uncontended acquire + release cycles of one lock by one holder (watchdog on, as
/// users run it).
///
/// # Errors
/// The first lock error, as text.
pub async fn uncontended(
    client: &LockClient,
    options: &LockOptions,
    n: usize,
) -> Result<Stats, String> {
    let name = bench_name("uncontended")?;
    let holder = Holder::new();
    time_op(n, || async {
        let guard = client
            .acquire(&holder, &name, options)
            .await
            .map_err(|e| e.to_string())?;
        guard.release().await.map_err(|e| e.to_string())
    })
    .await
}

/// What [`contended`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Contended {
    /// From the start of a release to the moment the next holder's `acquire` returned.
    pub handoff: Stats,
    /// Acquisitions per second over the whole run.
    pub per_second: f64,
}

/// `tasks` tasks (spread over `clients`, each with its own holder) contend for one lock until
/// `acquisitions` acquisitions were made in total; measures hand-off latency and throughput.
///
/// # Errors
/// The first lock error, as text.
pub async fn contended(
    clients: &[LockClient],
    options: &LockOptions,
    tasks: usize,
    acquisitions: usize,
) -> Result<Contended, String> {
    if clients.is_empty() {
        return Err("no clients".into());
    }
    let name = bench_name("contended")?;
    let left = Arc::new(AtomicUsize::new(acquisitions));
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let handoffs = Arc::new(Mutex::new(histogram()?));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let (client, name, options) = (
            clients[i % clients.len()].clone(),
            name.clone(),
            options.clone(),
        );
        let (left, released_at, handoffs) = (left.clone(), released_at.clone(), handoffs.clone());
        set.spawn(async move {
            let holder = Holder::new();
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let guard = client
                    .acquire(&holder, &name, &options)
                    .await
                    .map_err(|e| e.to_string())?;
                let acquired = Instant::now();
                let previous = released_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(released) = previous {
                    let mut h = handoffs.lock().unwrap_or_else(PoisonError::into_inner);
                    record(&mut h, acquired.saturating_duration_since(released));
                }
                *released_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                guard.release().await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    let elapsed = start.elapsed();
    let h = handoffs.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(Contended {
        handoff: stats(&h),
        per_second: acquisitions as f64 / elapsed.as_secs_f64(),
    })
}

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
}

/// A store's benchmark results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The store's label.
    pub store: String,
    /// The lines, in order.
    pub lines: Vec<Line>,
}

impl Report {
    /// An empty report for `store`.
    pub fn new(store: &str) -> Self {
        Self {
            store: store.to_owned(),
            lines: Vec::new(),
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
    }

    /// Adds a rate.
    pub fn rate(&mut self, metric: &str, per_second: f64) {
        self.push(metric, format!("{per_second:.0}/s"), None, None);
    }

    fn push(&mut self, metric: &str, value: String, ratio: Option<f64>, target: Option<f64>) {
        let line = Line {
            metric: metric.to_owned(),
            value,
            ratio,
            target,
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
                "{} = {} [{verdict} target {target}x]",
                line.metric, line.value
            )
        }
        _ => format!("{} = {}", line.metric, line.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::MemoryBackend;

    #[tokio::test]
    async fn samples_keep_their_size() {
        let stats = time_op(5, || async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(())
        })
        .await
        .unwrap();
        assert!(stats.p50 >= Duration::from_millis(2), "{stats}");
        assert!(stats.mean >= Duration::from_millis(2), "{stats}");
    }

    #[tokio::test]
    async fn measures_memory_backend() {
        let client = LockClient::new(MemoryBackend::new());
        let options = LockOptions::new();
        let cycle = uncontended(&client, &options, 50).await.unwrap();
        assert_eq!(cycle.samples, 50);
        assert!(cycle.p50 <= cycle.p99);
        let handoff = contended(&[client], &options, 4, 40).await.unwrap();
        assert!(handoff.handoff.samples >= 39);
        assert!(handoff.per_second > 0.0);
    }
}
