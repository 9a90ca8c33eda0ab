//! Migration between every ordered pair of {memory, redis, redlock, mysql-lease,
//! mysql-row-lock, zookeeper} (memory to memory: two instances): the mixed fleet of `conformance_tests::migration` passes (no
//! overlapping holds, fences rising per name across the flip), a dual acquisition dropped
//! between its two stores gives the first back, and the negative controls are caught: a
//! skipped phase and a fail-over composite overlap; a flip without the generation bump sends
//! fences back wherever the target's own fences start below the source's.
//!
//! Needs the `LOCK_TEST_*` variables (`cargo xtask test` sets them).

#[path = "support/migration_stores.rs"]
mod migration_stores;
mod support;

use std::{process::ExitCode, sync::Arc, time::Duration};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    migration::{
        Stores, dropped_dual_gives_back_from, failover_composite, flip_without_bump, mixed_fleet,
        skipped_phase,
    },
};
use distributed_lock::{LockBackend, migrate::MemoryRecord};
use migration_stores::{pairs, store_backend};

/// When set, the path of a JSON file this test writes: every pair's verdict (for
/// `cargo xtask compare`'s from x to matrix).
const REPORT_VAR: &str = "LOCK_MIGRATION_REPORT";

fn main() -> ExitCode {
    Cases::<Failure>::new("migration")
        .limit(Duration::from_secs(600))
        .case("every_ordered_pair", || Box::pin(every_pair()))
        .main()
}

async fn backend(store: &str, side: &str) -> Result<Arc<dyn LockBackend>, Failure> {
    store_backend(store, side).await.map_err(Failure)
}

async fn stores(from: &str, to: &str) -> Result<Stores, Failure> {
    Ok(Stores {
        from: backend(from, "from").await?,
        to: backend(to, "to").await?,
        record: Arc::new(MemoryRecord::new(0)),
    })
}

async fn pair(from: &str, to: &str) -> Outcome {
    let fleet = mixed_fleet(&stores(from, to).await?, 9).await?;
    ensure!(
        fleet.overlaps == 0 && fleet.regressions == 0,
        "{from} -> {to}: the mixed fleet found {fleet:?}"
    );
    dropped_dual_gives_back_from(&stores(from, to).await?, Duration::from_secs(10)).await?;
    let skipped = skipped_phase(&stores(from, to).await?, 24).await?;
    ensure!(
        skipped.overlaps > 0,
        "{from} -> {to}: a skipped phase went uncaught ({skipped:?})"
    );
    let failover = failover_composite(&stores(from, to).await?, 24).await?;
    ensure!(
        failover.overlaps > 0,
        "{from} -> {to}: a fail-over composite went uncaught ({failover:?})"
    );
    let (unbumped, below) = flip_without_bump(&stores(from, to).await?, 12).await?;
    ensure!(
        !below || unbumped.regressions > 0,
        "{from} -> {to}: a flip without the bump went uncaught ({unbumped:?})"
    );
    println!(
        "  {from} -> {to}: fleet {} sections clean; controls caught (unbumped fences {})",
        fleet.sections,
        if below {
            "went back"
        } else {
            "happened to stay above"
        }
    );
    Ok(())
}

/// Every pair, each to its end (a failing pair does not hide the others); the verdicts go to
/// [`REPORT_VAR`]'s file when it is set.
async fn every_pair() -> Outcome {
    let mut verdicts = Vec::new();
    let mut failed = Vec::new();
    // `cargo xtask compare --only` runs the pairs of the stores it names.
    for (from, to) in pairs()
        .into_iter()
        .filter(|(from, to)| conformance_tests::selection::pair_selected(from, to))
    {
        let outcome = pair(from, to).await;
        if let Err(Failure(why)) = &outcome {
            failed.push(why.clone());
        }
        verdicts.push(serde_json::json!({
            "from": from,
            "to": to,
            "passed": outcome.is_ok(),
            "why": outcome.err().map(|Failure(why)| why),
        }));
    }
    if let Some(path) = std::env::var_os(REPORT_VAR) {
        let json = serde_json::to_string_pretty(&verdicts).map_err(|e| Failure(e.to_string()))?;
        std::fs::write(&path, json).map_err(|e| Failure(format!("writing {path:?}: {e}")))?;
    }
    ensure!(
        failed.is_empty(),
        "{} pairs failed: {failed:?}",
        failed.len()
    );
    Ok(())
}
