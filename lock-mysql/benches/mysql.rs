//! Benchmark (not a test) of both MySQL strategies against the raw floor measured in the same
//! run, on the same pool and table. Each ratio is the median of rounds that measure the lock
//! and its floor back to back, so load drifting on the machine affects both sides alike.
//!
//! - uncontended acquire + release cycle vs the floor: an autocommitted `INSERT` + `DELETE` of
//!   one row, the two alternating op by op, on the backend's pool (target for the lease
//!   strategy: at most 1.3x) and on one connection of its own (targets: the lease at least
//!   0.85x of its rate, the row lock 0.8x); the row lock also against a bare row-lock cycle
//!   by hand with its fence bump, and that cycle with the bump against without it (no
//!   targets, see `mysql/row_floor.rs`);
//! - 16 tasks over 4 clients on one lock: hand-off latency (from the start of a release to the
//!   next holder's acquire returning) p50/p99 vs one raw commit (an autocommitted `UPDATE`),
//!   and acquisitions per second (target for the row-lock strategy: p50 at most 3x);
//! - the peer `distributed-lock-mysql` (MySQL's named locks) through the same workloads:
//!   its uncontended cycle against the floor on one connection (right after ours), its
//!   separate clients (each of its runs right before ours of the same shape, see `fleets`)
//!   and its client sweep (before ours);
//! - separate clients (see `conformance_tests::bench::fleet_report`), and for the row lock the
//!   100-client run against InnoDB's own queue of 100 raw connections on one row (target: time
//!   per acquisition at most 1.25x, that is at least 0.8x of the raw rate), and against the
//!   same queue with a fence bump per grant (no target: the part of the gap that durable
//!   fences cost, see `mysql/row_floor.rs`), both measured before the fleets;
//! - the client sweep on many names (`conformance_tests::bench::sweep_report`);
//! - the renewal cost of locks held by one client (`conformance_tests::bench::renewal_report`):
//!   10,000 on the lease table, 100 on the row lock (a connection per lock).
//!
//! Run with `cargo bench -p lock-mysql` (servers from `cargo xtask services up`, variables from
//! `cargo xtask services env`); `cargo xtask compare` runs it too.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "mysql/peer.rs"]
mod peer;

#[path = "mysql/row_floor.rs"]
mod row_floor;

use std::{process::ExitCode, sync::Mutex, time::Duration};

use conformance_tests::bench::{self, Report};
use lock_core::{LockClient, LockOptions};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy};
use row_floor::{BareCycle, Fence, raw_row_queue};
use sqlx::AssertSqlSafe;

const TASKS: usize = 16;
const CLIENTS: usize = 4;
/// Rounds of each ratio (the harness takes a tenth in a quick run).
const ROUNDS: usize = 10;

/// Operations per round.
const PER_ROUND: usize = 200;

fn main() -> ExitCode {
    conformance_tests::main_with(async {
        let outcome = run().await;
        let cleanup = support::drop_run_tables().await;
        outcome
            .and(cleanup)
            .map_err(|error| format!("benchmark failed: {error}"))
    })
}

/// The pool of each separate client: for the lease, two connections, the least with which a
/// waiter parks (half the pool parks, so renewals always find a connection); with the
/// client's anchor its parks wait on, which took the connection kept beside the pool and runs
/// its tries and lone releases, three sessions (four when a statement finds the anchor's
/// busy; the peer's clients hold two); for the row lock one, beside the connection of its hold
/// or wait (its target: at most one connection per waiting client): the pool's first
/// connection becomes the client's anchor, which its holds park on and which runs its bumps
/// and kills, so a row-lock client holds two sessions. 1,000 lease clients so take 3,000 to
/// 4,000 connections: the servers of `cargo xtask services up` take 5,000.
fn fleet_pool(strategy: Strategy) -> u32 {
    match strategy {
        Strategy::RowLock => 1,
        _ => 2,
    }
}

/// How long each run of separate clients lasts.
const FLEET_TIME: Duration = Duration::from_secs(3);

/// How long each step of the client sweep lasts.
const SWEEP_TIME: Duration = Duration::from_secs(1);

async fn run() -> Result<(), String> {
    for (strategy, label) in [
        (Strategy::Lease, "mysql-lease"),
        (Strategy::RowLock, "mysql-rowlock"),
    ] {
        if !conformance_tests::selection::selected(label) {
            continue;
        }
        let config = support::config(strategy)?.pool_size(8);
        let backend = MySqlBackend::connect(&config)
            .await
            .map_err(|e| e.to_string())?;
        let client = LockClient::new(backend.clone());
        let mut clients = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            clients.push(LockClient::new(
                MySqlBackend::connect(&config)
                    .await
                    .map_err(|e| e.to_string())?,
            ));
        }
        let raw = Raw::new(&backend, strategy).await?;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30));
        let mut report = Report::new(label);
        if conformance_tests::selection::workload(conformance_tests::selection::UNCONTENDED) {
            uncontended(&mut report, (strategy, &backend), &client, &options, &raw).await?;
            handoff(&mut report, strategy, &clients, &options, &raw).await?;
        }
        fleets(&mut report, strategy, &config, &backend, &raw).await?;
        // The peer's sweep, then ours, whose clients are as the fleets' (see `fleet_pool`).
        bench::peer_sweep_report(
            &mut report,
            peer::PEER,
            peer::connect(&support::url()?),
            SWEEP_TIME,
            &["mariadb"],
        )
        .await;
        bench::sweep_report(
            &mut report,
            bench::each_own(
                config.clone().pool_size(fleet_pool(strategy)),
                |config| async move { MySqlBackend::connect(&config).await },
            ),
            SWEEP_TIME,
            &["mariadb"],
        )
        .await?;
        // The row lock holds each lock on a connection of its own, renewed by a statement
        // on it: a hundred show that cost as well as ten thousand (the server takes 5,000
        // connections).
        let held = match strategy {
            Strategy::RowLock => bench::RENEWAL_LOCKS / 100,
            _ => bench::RENEWAL_LOCKS,
        };
        bench::renewal_report(
            &mut report,
            &backend,
            &Counters(backend.pool().clone()),
            held,
            &["mariadb"],
        )
        .await?;
        raw.finish().await?;
        report.finish().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The uncontended cycle against the raw floor, on the pool and on one connection.
async fn uncontended(
    report: &mut Report,
    (strategy, backend): (Strategy, &MySqlBackend),
    client: &LockClient,
    options: &LockOptions,
    raw: &Raw,
) -> Result<(), String> {
    let cycle =
        bench::uncontended_rounds(client, options, ROUNDS, PER_ROUND, || raw.insert_delete())
            .await?;
    report.round_ratio(
        "uncontended acquire+release / raw INSERT+DELETE on the pool (means)",
        &cycle,
        (strategy == Strategy::Lease).then_some(1.3),
    );
    // Against one raw connection of its own: what a hand-written client pays. Targets:
    // the lease at least 0.85x of that rate, the row lock 0.8x.
    let single = bench::uncontended_rounds(client, options, ROUNDS, PER_ROUND, || {
        raw.insert_delete_single()
    })
    .await?;
    report.round_ratio(
        ONE_CONNECTION,
        &single,
        Some(match strategy {
            Strategy::RowLock => 1.0 / 0.8,
            _ => 1.0 / 0.85,
        }),
    );
    if strategy == Strategy::RowLock {
        // Against the bare row-lock cycle by hand with its fence bump, and that cycle with the
        // bump against without it (no targets): what the fence costs by itself, beside what
        // the rest of ours costs.
        let url = support::url()?;
        let bumped = BareCycle::new(&url, backend, Fence::Bumped).await?;
        let bare = BareCycle::new(&url, backend, Fence::None).await?;
        let ours = bench::uncontended_rounds(client, options, ROUNDS, PER_ROUND, || bumped.cycle())
            .await?;
        report.round_ratio(
            "uncontended acquire+release / bare row-lock cycle by hand with a fence bump \
             (FOR UPDATE, the bump on a second connection, ROLLBACK; means)",
            &ours,
            None,
        );
        let (bumped, bare) = (&bumped, &bare);
        let fence = bench::round_ratios(ROUNDS, || async move {
            let (with, without) =
                bench::time_pairs(PER_ROUND, || bumped.cycle(), || bare.cycle()).await?;
            Ok((with.mean, without.mean))
        })
        .await?;
        report.round_ratio(
            "bare row-lock cycle by hand: with the fence bump / without (means)",
            &fence,
            None,
        );
    }
    peer::uncontended(
        report,
        &support::url()?,
        (|| raw.insert_delete_single(), ONE_CONNECTION),
    )
    .await;
    Ok(())
}

/// The metric of the uncontended cycle against the raw floor on one connection of its own.
const ONE_CONNECTION: &str =
    "uncontended acquire+release / raw INSERT+DELETE on one connection (means)";

/// One client's tasks handing the lock to each other, against one raw commit.
async fn handoff(
    report: &mut Report,
    strategy: Strategy,
    clients: &[LockClient],
    options: &LockOptions,
    raw: &Raw,
) -> Result<(), String> {
    let measured = Mutex::new(Vec::new());
    let (rounds_ref, options_ref, clients_ref, raw_ref) = (&measured, options, clients, raw);
    let handoff = bench::round_ratios(ROUNDS, || async move {
        let commit = bench::time_op(PER_ROUND, || raw_ref.commit()).await?;
        let contended = bench::contended(clients_ref, options_ref, TASKS, PER_ROUND).await?;
        rounds_ref
            .lock()
            .map_err(|e| e.to_string())?
            .push((contended.handoff, contended.per_second));
        Ok((contended.handoff.p50, commit.p50))
    })
    .await?;
    report.round_ratio(
        "16-task hand-off p50 / one raw commit p50",
        &handoff,
        (strategy == Strategy::RowLock).then_some(3.0),
    );
    let mut rounds = measured.into_inner().map_err(|e| e.to_string())?;
    rounds.sort_by_key(|(stats, _)| stats.p50);
    if let Some((stats, _)) = rounds.get(rounds.len() / 2) {
        report.stats("16-task hand-off (median round)", stats);
    }
    let mut rates: Vec<f64> = rounds.iter().map(|(_, rate)| *rate).collect();
    rates.sort_by(f64::total_cmp);
    if let Some(rate) = rates.get(rates.len() / 2) {
        report.rate("16-task acquisitions (median of rounds)", *rate);
    }
    Ok(())
}

/// Fleets of separate clients (each with a pool of its own, see [`fleet_pool`]); for the row
/// lock, its 100 clients beside InnoDB's own queue of 100 raw connections.
async fn fleets(
    report: &mut Report,
    strategy: Strategy,
    config: &MySqlConfig,
    backend: &MySqlBackend,
    raw: &Raw,
) -> Result<(), String> {
    let rtt = bench::steady_p50(PER_ROUND, || raw.commit()).await?;
    // Each fleet client has its own backend with a pool of its own (plus, on the
    // row lock, the dedicated connection of its hold or wait).
    let fleet_config = config.clone().pool_size(fleet_pool(strategy));
    let counters = Counters(backend.pool().clone());
    // The row lock against InnoDB's own queue: the same number of clients, each an OS thread
    // with its own connection, taking one row with `SELECT ... FOR UPDATE`, holding it as long
    // and rolling back. Time per acquisition, ours over raw (target 1.25x: at least 0.8x of
    // the raw rate). Then the same queue with a fence bump per grant (no target): what issuing
    // fences that survive the rollback costs by itself, beside what the rest of ours costs.
    // Both measured before the fleets: after their 1,000-client runs the server may still be
    // recovering.
    let queues = if strategy == Strategy::RowLock
        && bench::chosen_runs().contains(&(QUEUE_CLIENTS, QUEUE_HOLD))
    {
        let mut queues = Vec::new();
        for (fence, what, target) in [
            (Fence::None, "", Some(1.25)),
            (Fence::Bumped, " with a fence bump per grant", None),
        ] {
            let rate = tokio::task::block_in_place(|| {
                raw_row_queue(
                    &support::url()?,
                    backend,
                    (QUEUE_CLIENTS, fence),
                    QUEUE_HOLD,
                    FLEET_TIME,
                )
            })?;
            queues.push((rate, what, target));
        }
        queues
    } else {
        Vec::new()
    };
    // Beside ours, the peer on the same server (named locks of `distributed-lock-mysql`), each
    // of its runs right before ours of the same shape, the 1,000-client runs last: a run
    // right after a 1,000-client run measures a server still recovering (the peer took 7
    // acquisitions/s right after our 1,000 clients, 429/s without them).
    let runs = bench::fleet_report_beside(
        report,
        bench::each_own(fleet_config, |config| async move {
            MySqlBackend::connect(&config).await
        }),
        (peer::PEER, peer::connect(&support::url()?)),
        rtt,
        FLEET_TIME,
        &counters,
    )
    .await?;
    for fleet in runs.iter().filter(|fleet| fleet.clients == QUEUE_CLIENTS) {
        for &(rate, what, target) in &queues {
            report.rate(
                &format!("{QUEUE_CLIENTS} raw connections queueing on one row{what}: acquisitions"),
                rate,
            );
            report.ratio(
                &format!(
                    "{QUEUE_CLIENTS} clients: time per acquisition / raw FOR UPDATE queue{what}"
                ),
                per_acquisition(fleet.per_second),
                per_acquisition(rate),
                target,
            );
        }
    }
    Ok(())
}

/// The server's own counts: `Questions` (statements clients sent) and `Threads_connected`.
struct Counters(sqlx::MySqlPool);

impl Counters {
    async fn status(&self, name: &str) -> Result<u64, String> {
        let (value,): (String,) = sqlx::query_as(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?",
        )
        .bind(name)
        .fetch_one(&self.0)
        .await
        .map_err(|e| e.to_string())?;
        value.parse().map_err(|e| format!("{name} = {value}: {e}"))
    }
}

impl bench::ServerCounters for Counters {
    fn operations_are(&self) -> &'static str {
        "statements"
    }

    async fn operations(&self) -> Result<u64, String> {
        self.status("Questions").await
    }

    async fn sessions(&self) -> Result<u64, String> {
        self.status("Threads_connected").await
    }
}

/// The clients and hold of the fleet run compared with a raw row queue.
const QUEUE_CLIENTS: usize = 100;
const QUEUE_HOLD: Duration = Duration::from_millis(1);

/// The time one acquisition takes at `per_second`.
fn per_acquisition(per_second: f64) -> Duration {
    Duration::from_secs_f64(1.0 / per_second.max(f64::MIN_POSITIVE))
}

/// The raw operations on the backend's own pool, as prepared statements, on a table of its
/// own with a `(name, fence)` row: the lease table, or the row lock's `<table>_fences` (its
/// lock table has only `name`).
struct Raw {
    pool: sqlx::MySqlPool,
    /// One connection of its own, outside any pool: the floor without a pool's checkout.
    single: tokio::sync::Mutex<sqlx::MySqlConnection>,
    insert: String,
    delete: String,
    update: String,
    name: Vec<u8>,
    row: Vec<u8>,
}

impl Raw {
    async fn new(backend: &MySqlBackend, strategy: Strategy) -> Result<Self, String> {
        use sqlx::Connection;
        let table = match strategy {
            Strategy::RowLock => format!("{}_fences", backend.table().as_str()),
            _ => backend.table().as_str().to_owned(),
        };
        let single = sqlx::MySqlConnection::connect(&support::url()?)
            .await
            .map_err(|e| e.to_string())?;
        let raw = Self {
            pool: backend.pool().clone(),
            single: tokio::sync::Mutex::new(single),
            insert: format!("INSERT INTO `{table}` (name, fence) VALUES (?, 0)"),
            delete: format!("DELETE FROM `{table}` WHERE name = ?"),
            update: format!("UPDATE `{table}` SET fence = fence + 1 WHERE name = ?"),
            name: format!("bench/floor/{:016x}", rand::random::<u64>()).into_bytes(),
            row: format!("bench/commit/{:016x}", rand::random::<u64>()).into_bytes(),
        };
        raw.execute(&raw.insert, &raw.row).await?;
        Ok(raw)
    }

    async fn execute(&self, sql: &str, name: &[u8]) -> Result<(), String> {
        sqlx::query(AssertSqlSafe(sql))
            .bind(name)
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The floor of a cycle: an autocommitted `INSERT` and `DELETE` of one row.
    async fn insert_delete(&self) -> Result<(), String> {
        self.execute(&self.insert, &self.name).await?;
        self.execute(&self.delete, &self.name).await
    }

    /// The same floor on one connection of its own (prepared statements, cached on it).
    async fn insert_delete_single(&self) -> Result<(), String> {
        let mut conn = self.single.lock().await;
        for sql in [&self.insert, &self.delete] {
            sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(&self.name)
                .execute(&mut *conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// One raw commit: an autocommitted `UPDATE` of one row.
    async fn commit(&self) -> Result<(), String> {
        self.execute(&self.update, &self.row).await
    }

    async fn finish(&self) -> Result<(), String> {
        self.execute(&self.delete, &self.row).await
    }
}
