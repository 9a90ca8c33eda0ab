//! `lockctl bench`: a quick run against the store a URL names: one client alone (the
//! uncontended acquire+release cycle), then CLIENTS separate clients (each with its own
//! connections) taking and releasing one lock. For comparisons between stores, with floors
//! and peers, `cargo xtask compare` is the tool; this answers "how does my store do from
//! here".

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use distributed_lock::{LockBackend, LockClient, LockOptions, StoreConfig};
use hdrhistogram::Histogram;

use crate::Failed;

/// What one phase measured.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Phase {
    /// Separate clients.
    pub(crate) clients: usize,
    /// Acquisitions per second, all clients together.
    pub(crate) per_second: f64,
    /// Acquire-and-release cycle (waiting included), median and 99th percentile, µs.
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    /// Acquisitions of the client that got the fewest, and of the one that got the most.
    pub(crate) min: u64,
    pub(crate) max: u64,
    /// Jain's fairness index of the acquisitions per client (1: all equal).
    pub(crate) jain: f64,
}

fn histogram() -> Result<Histogram<u64>, Failed> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| Failed(e.to_string()))
}

/// One client's loop until `until`: its cycle times.
async fn cycles(
    client: LockClient,
    name: String,
    until: Instant,
) -> Result<Histogram<u64>, Failed> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10));
    let mut times = histogram()?;
    while Instant::now() < until {
        let start = Instant::now();
        let guard = client.lock_with(name.as_str(), &options).await?;
        guard.release().await?;
        let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        times.saturating_record(us.max(1));
    }
    Ok(times)
}

async fn phase(config: &StoreConfig, clients: usize, length: Duration) -> Result<Phase, Failed> {
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        let backend: Arc<dyn LockBackend> = config.backend().await?;
        connected.push(LockClient::new(backend));
    }
    let name = format!("lockctl-bench/{:016x}", std::process::id());
    let start = Instant::now();
    let until = start + length;
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|client| tokio::spawn(cycles(client, name.clone(), until)))
        .collect();
    let mut all = histogram()?;
    let mut counts = Vec::with_capacity(clients);
    for task in tasks {
        let times = task
            .await
            .map_err(|e| Failed(format!("a benchmark client failed: {e}")))??;
        counts.push(times.len());
        all.add(&times).map_err(|e| Failed(e.to_string()))?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let total: u64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    Ok(Phase {
        clients,
        per_second: total as f64 / elapsed,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        min: counts.iter().copied().min().unwrap_or(0),
        max: counts.iter().copied().max().unwrap_or(0),
        jain: if squares > 0.0 {
            (total as f64).powi(2) / (counts.len() as f64 * squares)
        } else {
            0.0
        },
    })
}

/// Runs both phases: one client alone for half of `length`, then `clients` for `length`.
pub(crate) async fn run(
    config: &StoreConfig,
    clients: usize,
    length: Duration,
) -> Result<[Phase; 2], Failed> {
    if clients == 0 || length.is_zero() {
        return Err(Failed(
            "bench needs at least one client and one second".into(),
        ));
    }
    let alone = phase(config, 1, length / 2).await?;
    let contended = phase(config, clients, length).await?;
    Ok([alone, contended])
}
