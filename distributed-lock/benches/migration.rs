//! Benchmark (not a test) of `dual` mode, the phase of a migration in which clients lock both
//! stores, for every ordered pair of {memory, redis, redlock, mysql-lease, mysql-rowlock,
//! zookeeper} (as `tests/migration.rs` proves them):
//!
//! - the uncontended acquire + release cycle of a `dual` client against the sum of the two
//!   stores' own cycles (a plain client of each, one cycle of each per sample), timed
//!   alternately in the same run, the median of rounds; 1.0x means dual mode costs what
//!   locking both stores one after the other costs, nothing more;
//! - the hand-off between two `dual` clients (each with its own connections) on one lock: p50
//!   from the start of a release to the next holder's `acquire` returning.
//!
//! `cargo xtask compare` runs it and shows the pairs as a from x to matrix. Run alone with
//! `cargo bench -p distributed-lock --bench migration` (servers from `cargo xtask services up`,
//! variables from `cargo xtask services env`).

#[path = "../tests/support/migration_stores.rs"]
mod migration_stores;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{process::ExitCode, sync::Arc, time::Duration};

use conformance_tests::bench::{self, Report};
use distributed_lock::{
    LockClient, LockName, LockOptions,
    migrate::{MemoryRecord, MigratingBackend, Phase},
};
use migration_stores::{pairs, store_backend};

/// Rounds of the ratio, cycles per round, hand-offs between two `dual` clients (the
/// harness takes a tenth of each in a quick run).
const ROUNDS: usize = 5;
const PER_ROUND: usize = 20;
const HANDOFFS: usize = 60;

fn main() -> ExitCode {
    conformance_tests::main_with(async {
        for (from, to) in pairs() {
            if !conformance_tests::selection::pair_selected(from, to) {
                continue;
            }
            pair(from, to)
                .await
                .map_err(|e| format!("{from} -> {to}: {e}"))?;
        }
        Ok(())
    })
}

/// A `dual` client over its own connections to both stores.
async fn dual(from: &str, to: &str) -> Result<LockClient, String> {
    let record = Arc::new(MemoryRecord::new(0));
    let backend = MigratingBackend::new(
        store_backend(from, "from").await?,
        store_backend(to, "to").await?,
        record,
        Phase::Dual,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(LockClient::new(backend))
}

/// One acquire + release of `name` by `client`.
async fn cycle(client: &LockClient, name: &LockName, options: &LockOptions) -> Result<(), String> {
    let guard = client
        .lock_with(name, options)
        .await
        .map_err(|e| e.to_string())?;
    guard.release().await.map_err(|e| e.to_string())
}

async fn pair(from: &str, to: &str) -> Result<(), String> {
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let (of_from, of_to) = (
        LockClient::new(store_backend(from, "from").await?),
        LockClient::new(store_backend(to, "to").await?),
    );
    let name = |side: &str| {
        LockName::new(format!(
            "bench/migration/{side}/{:016x}",
            rand::random::<u64>()
        ))
        .map_err(|e| e.to_string())
    };
    let (from_name, to_name) = (name("from")?, name("to")?);
    let both = || async {
        cycle(&of_from, &from_name, &options).await?;
        cycle(&of_to, &to_name, &options).await
    };
    let dual_client = dual(from, to).await?;
    let mut report = Report::new(&format!("{from} -> {to}"));
    let ratios = bench::uncontended_rounds(&dual_client, &options, ROUNDS, PER_ROUND, both).await?;
    report.round_ratio("dual cycle / (from cycle + to cycle)", &ratios, None);
    let clients = [dual_client, dual(from, to).await?];
    let contended = bench::contended(&clients, &options, 2, HANDOFFS).await?;
    report.stats("dual hand-off between two clients", &contended.handoff);
    report.number(
        "dual hand-off p50 (ms)",
        contended.handoff.p50.as_secs_f64() * 1e3,
    );
    report.finish().map_err(|e| e.to_string())?;
    Ok(())
}
