//! Every call is bounded in time:
//!
//! - a lease `acquire` whose row a foreign transaction keeps locked answers `Timeout` at its
//!   wait budget (300 ms), not at the pool's `innodb_lock_wait_timeout` (5 s);
//! - on a half-open connection (a proxy that stops forwarding and keeps the sockets open),
//!   `release`, `extend` and `inspect` of both strategies answer within
//!   `MySqlConfig::statement_timeout`;
//! - a grant that comes back after its own local deadline (its statement, or the row lock's
//!   fence bump, waited longer than the TTL) is never handed out as a success that
//!   `is_held()` already denies.
//!
//! Needs `LOCK_TEST_MYSQL_URL`.

mod support;

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use conformance_tests::{Cases, Failure, Outcome, ensure};
use lock_core::{LockClient, LockError, LockName, LockOptions};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy};
use sqlx::AssertSqlSafe;
use support::{MySqlStore, hex, proxy::Proxy};

fn main() -> ExitCode {
    Cases::<Failure>::new("bounds")
        .limit(Duration::from_secs(120))
        .case(
            "lease/acquire_bounded_by_budget_under_a_foreign_row_lock",
            || Box::pin(lease_acquire_bounded_by_budget()),
        )
        .case("lease/user_calls_bounded_on_a_half_open_connection", || {
            Box::pin(user_calls_bounded(Strategy::Lease))
        })
        .case(
            "row_lock/user_calls_bounded_on_a_half_open_connection",
            || Box::pin(user_calls_bounded(Strategy::RowLock)),
        )
        .case("lease/grant_past_its_deadline_is_not_a_success", || {
            Box::pin(lease_grant_past_deadline())
        })
        .case("row_lock/grant_past_its_deadline_is_not_a_success", || {
            Box::pin(row_lock_grant_past_deadline())
        })
        .finally(support::drop_tables_after_cases)
        .main()
}

fn name(tag: &str) -> Result<LockName, Failure> {
    Ok(LockName::new(format!(
        "bounds/{tag}/{:016x}",
        rand::random::<u64>()
    ))?)
}

async fn client(config: &MySqlConfig) -> Result<LockClient, Failure> {
    Ok(LockClient::new(MySqlBackend::connect(config).await?))
}

fn err(e: impl std::fmt::Display) -> Failure {
    Failure(e.to_string())
}

/// An administrator's open transaction holding `name`'s row with `FOR UPDATE`.
async fn lock_row_foreign(
    store: &MySqlStore,
    name: &LockName,
) -> Result<sqlx::MySqlConnection, Failure> {
    let mut admin = support::admin_conn().await.map_err(Failure)?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; SELECT * FROM `{}` WHERE name = X'{}' FOR UPDATE",
        store.config().table_name(),
        hex(name.as_str())
    )))
    .execute(&mut admin)
    .await
    .map_err(err)?;
    Ok(admin)
}

/// A foreign transaction keeps the lease row locked (`FOR UPDATE`): acquires with budgets of
/// 300 ms and 0 answer `Timeout` (busy) within the budget plus 200 ms.
async fn lease_acquire_bounded_by_budget() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = name("foreign-lock")?;
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    // The row exists (released), as for any lock used before.
    a.lock_with(&name, &options).await?.release().await?;
    let mut admin = lock_row_foreign(&store, &name).await?;
    let outcome = async {
        for budget in [Duration::from_millis(300), Duration::ZERO] {
            let start = Instant::now();
            let result = a.lock_with(&name, &options.clone().wait(budget)).await;
            let took = start.elapsed();
            ensure!(
                matches!(result, Err(LockError::Timeout { .. })),
                "budget {budget:?}: {result:?} after {took:?}, expected Timeout"
            );
            ensure!(
                took <= budget + Duration::from_millis(200),
                "budget {budget:?}: Timeout only after {took:?}"
            );
        }
        Ok(())
    }
    .await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    outcome?;
    let after = a.try_lock_with(&name, &options).await?;
    ensure!(after.is_some(), "the lock is not free once the row is");
    Ok(())
}

/// Through a proxy that then blackholes every connection: `inspect`, `extend` and `release`
/// each answer (an error) within the 500 ms statement timeout plus a margin.
async fn user_calls_bounded(strategy: Strategy) -> Outcome {
    let store = MySqlStore::new(strategy).await.map_err(Failure)?;
    let url = support::url().map_err(Failure)?;
    let proxy = Proxy::start(support::proxy::upstream(&url).map_err(Failure)?)
        .await
        .map_err(Failure)?;
    let mut config = store.config().clone();
    config.url = proxy.url(&url).map_err(Failure)?;
    config.statement_timeout = Duration::from_millis(500);
    let a = client(&config).await?;
    let name = name("half-open")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .watchdog(false);
    let held = a.lock_with(&name, &options).await?;
    proxy.blackhole();
    let limit = Duration::from_millis(500) + Duration::from_millis(500);
    let outer = Duration::from_secs(5);

    let start = Instant::now();
    let inspected = tokio::time::timeout(outer, a.inspect(&name))
        .await
        .map_err(|_| Failure(format!("inspect did not return within {outer:?}")))?;
    let took = start.elapsed();
    ensure!(
        inspected.is_err() && took <= limit,
        "inspect on a half-open connection: {inspected:?} after {took:?}"
    );

    let start = Instant::now();
    let extended = tokio::time::timeout(outer, held.extend(Duration::from_secs(20)))
        .await
        .map_err(|_| Failure(format!("extend did not return within {outer:?}")))?;
    let took = start.elapsed();
    ensure!(
        extended.is_err() && took <= limit,
        "extend on a half-open connection: {extended:?} after {took:?}"
    );

    let start = Instant::now();
    let released = tokio::time::timeout(outer, held.release())
        .await
        .map_err(|_| Failure(format!("release did not return within {outer:?}")))?;
    let took = start.elapsed();
    ensure!(
        released.is_err() && took <= limit,
        "release on a half-open connection: {released:?} after {took:?}"
    );
    Ok(())
}

/// Lease: a foreign transaction keeps the free row locked for 1.5 s while an acquire with a
/// 1 s TTL (and a 5 s budget) waits: the statement that finally takes the row comes back past
/// its local deadline. The caller must get a guard that holds, or an error.
async fn lease_grant_past_deadline() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = name("late-lease")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(5));
    a.lock_with(&name, &options).await?.release().await?;
    let mut admin = lock_row_foreign(&store, &name).await?;
    let acquiring = {
        let (a, name, options) = (a.clone(), name.clone(), options.clone());
        tokio::spawn(async move { a.lock_with(&name, &options).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let got = acquiring.await.map_err(err)?;
    if let Ok(guard) = &got {
        ensure!(
            guard.is_held(),
            "acquire returned a guard whose is_held() is already false (the grant came back past its local deadline)"
        );
    }
    Ok(())
}

/// Row lock: the fence bump after a grant waits 1.8 s for the counter row (an administrator's
/// open transaction holds it), longer than the 1.5 s TTL (the hold's connection, idle meanwhile,
/// lives: its idle limit is the TTL rounded up, 2 s). The caller must get a guard that holds,
/// or an error.
async fn row_lock_grant_past_deadline() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = name("late-row")?;
    let options = LockOptions::new()
        .ttl(Duration::from_millis(1500))
        .wait(Duration::from_secs(5));
    a.lock_with(&name, &options).await?.release().await?;
    let mut admin = support::admin_conn().await.map_err(Failure)?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; UPDATE `{}_fences` SET fence = fence + 1 WHERE name = X'{}'",
        store.config().table_name().as_str(),
        hex(name.as_str())
    )))
    .execute(&mut admin)
    .await
    .map_err(err)?;
    let acquiring = {
        let (a, name, options) = (a.clone(), name.clone(), options.clone());
        tokio::spawn(async move { a.lock_with(&name, &options).await })
    };
    tokio::time::sleep(Duration::from_millis(1800)).await;
    sqlx::raw_sql("COMMIT")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let got = acquiring.await.map_err(err)?;
    if let Ok(guard) = &got {
        ensure!(
            guard.is_held(),
            "acquire returned a guard whose is_held() is already false (the grant came back past its local deadline)"
        );
    }
    Ok(())
}
