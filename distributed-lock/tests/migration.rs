//! Migration between every ordered pair of {memory, redis, redlock, mysql-lease,
//! mysql-row-lock, zookeeper} (memory to memory: two instances): the mixed fleet of `conformance_tests::migration` passes (no
//! overlapping holds, fences rising per name across the flip), a dual acquisition dropped
//! between its two stores gives the first back, and the negative controls are caught: a
//! skipped phase and a fail-over composite overlap; a flip without the generation bump sends
//! fences back wherever the target's own fences start below the source's.
//!
//! Needs the `LOCK_TEST_*` variables (`cargo xtask test` sets them).

mod support;

use support::hosts;

use std::{process::ExitCode, sync::Arc, time::Duration};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::env_var,
    migration::{
        Stores, dropped_dual_gives_back_from, failover_composite, flip_without_bump, mixed_fleet,
        skipped_phase,
    },
};
use distributed_lock::{LockBackend, StoreConfig, migrate::MemoryRecord};

const STORES: [&str; 6] = [
    "memory",
    "redis",
    "redlock",
    "mysql-lease",
    "mysql-rowlock",
    "zookeeper",
];

fn main() -> ExitCode {
    Cases::<Failure>::new("migration")
        .limit(Duration::from_secs(600))
        .case("every_ordered_pair", || Box::pin(every_pair()))
        .main()
}

/// The URL of `store` for this run (`side` keeps the two sides of a memory pair apart).
fn url(store: &str, side: &str) -> Result<String, Failure> {
    Ok(match store {
        "memory" => format!("memory://migration-{side}"),
        "redis" => format!("{}?prefix=migration", env_var("LOCK_TEST_REDIS_URL")?),
        "redlock" => format!(
            "redlock://{}?prefix=migration&node_timeout_ms=200",
            hosts(&env_var("LOCK_TEST_REDLOCK_URLS")?)
        ),
        "mysql-lease" => format!("{}?table=migration_leases", env_var("LOCK_TEST_MYSQL_URL")?),
        "mysql-rowlock" => format!(
            "{}?strategy=row-lock&table=migration_row_locks",
            env_var("LOCK_TEST_MYSQL_URL")?
        ),
        "zookeeper" => format!("zk://{}/migration", env_var("LOCK_TEST_ZK_ADDR")?),
        other => return Err(Failure(format!("no store `{other}`"))),
    })
}

async fn backend(store: &str, side: &str) -> Result<Arc<dyn LockBackend>, Failure> {
    let config: StoreConfig = url(store, side)?.parse()?;
    let backend: Arc<dyn LockBackend> = config.backend().await?;
    Ok(backend)
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

async fn every_pair() -> Outcome {
    for from in STORES {
        for to in STORES {
            // Two in-process instances make a pair of their own; a server with itself does not.
            if from != to || from == "memory" {
                pair(from, to).await?;
            }
        }
    }
    Ok(())
}
