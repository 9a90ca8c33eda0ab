//! Benchmark of both MySQL strategies against the raw floor measured in the same run, on the
//! same pool (`cargo bench -p lock-mysql`; not a timed test: targets are printed, never
//! asserted):
//!
//! - the floor: an autocommitted `INSERT` + `DELETE` of one row, and one autocommitted write
//!   (one commit) alone;
//! - uncontended acquire + release cycles of one lock (target for the lease strategy: at most
//!   1.3x the floor);
//! - 16 tasks over 4 clients contending for one lock: hand-off latency (from the start of a
//!   release to the next holder's acquire returning) and acquisitions per second (target for
//!   the row-lock strategy: hand-off p50 at most 3x one raw commit).
//!
//! Needs `LOCK_TEST_MYSQL_URL` (`cargo xtask services env`). Writes JSON reports for
//! `cargo xtask compare` when `LOCK_BENCH_REPORT_DIR` is set.

#[path = "../tests/support/mod.rs"]
mod support;

use std::{process::ExitCode, time::Duration};

use conformance_tests::bench::{self, Report};
use lock_core::{LockClient, LockOptions};
use lock_mysql::{MySqlBackend, Strategy};
use sqlx::AssertSqlSafe;

const CYCLES: usize = 1000;
const TASKS: usize = 16;
const CLIENTS: usize = 4;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start a Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let outcome = run().await;
        let cleanup = support::drop_run_tables().await;
        outcome.and(cleanup)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("benchmark failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    for (strategy, label, handoffs) in [
        (Strategy::Lease, "mysql-lease", 200),
        (Strategy::RowLock, "mysql-rowlock", 2000),
    ] {
        let config = support::config(strategy)?.pool_size(8);
        let backend = MySqlBackend::connect(&config)
            .await
            .map_err(|e| e.to_string())?;
        let client = LockClient::new(backend.clone());
        let mut report = Report::new(label);

        let (floor, commit) = raw_floor(&backend).await?;
        report.stats("raw floor: autocommit INSERT + DELETE", &floor);
        report.stats("raw: one autocommitted write", &commit);

        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30));
        let cycle = bench::uncontended(&client, &options, CYCLES).await?;
        report.stats("uncontended acquire + release", &cycle);
        let lease_target = (strategy == Strategy::Lease).then_some(1.3);
        report.ratio("cycle / floor (p50)", cycle.p50, floor.p50, lease_target);
        report.ratio("cycle / floor (mean)", cycle.mean, floor.mean, None);

        let mut clients = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            clients.push(LockClient::new(
                MySqlBackend::connect(&config)
                    .await
                    .map_err(|e| e.to_string())?,
            ));
        }
        let contended = bench::contended(&clients, &options, TASKS, handoffs).await?;
        report.stats(
            &format!("hand-off, {TASKS} tasks on one lock"),
            &contended.handoff,
        );
        report.rate("acquisitions", contended.per_second);
        let rowlock_target = (strategy == Strategy::RowLock).then_some(3.0);
        report.ratio(
            "hand-off p50 / one raw commit (p50)",
            contended.handoff.p50,
            commit.p50,
            rowlock_target,
        );
        report.finish().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The floor on the backend's own pool and table: an autocommitted `INSERT` + `DELETE` of one
/// row, and one autocommitted `UPDATE` (a single commit).
async fn raw_floor(backend: &MySqlBackend) -> Result<(bench::Stats, bench::Stats), String> {
    let table = backend.table().as_str().to_owned();
    let insert = format!("INSERT INTO `{table}` (name, fence) VALUES (?, 0)");
    let delete = format!("DELETE FROM `{table}` WHERE name = ?");
    let name = format!("bench/floor/{:016x}", rand::random::<u64>()).into_bytes();
    let pool = backend.pool();
    let floor = bench::time_op(CYCLES, || async {
        sqlx::query(AssertSqlSafe(insert.as_str()))
            .bind(&name)
            .execute(pool)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query(AssertSqlSafe(delete.as_str()))
            .bind(&name)
            .execute(pool)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    })
    .await?;
    sqlx::query(AssertSqlSafe(insert.as_str()))
        .bind(&name)
        .execute(pool)
        .await
        .map_err(|e| e.to_string())?;
    let update = format!("UPDATE `{table}` SET fence = fence + 1 WHERE name = ?");
    let commit = bench::time_op(CYCLES, || async {
        sqlx::query(AssertSqlSafe(update.as_str()))
            .bind(&name)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;
    sqlx::query(AssertSqlSafe(delete.as_str()))
        .bind(&name)
        .execute(pool)
        .await
        .map_err(|e| e.to_string())?;
    Ok((floor, commit))
}
