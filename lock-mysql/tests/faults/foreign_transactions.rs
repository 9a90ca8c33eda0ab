//! Foreign transactions on the lease table: a row locked past the lock-wait timeout (1205),
//! a renewal batch chosen as a deadlock victim (1213), and a release stopped before its commit.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, fail, poll_every, unique_name},
};
use lock_core::{LockBackend, LockClient, LockError, LockName, LockOptions};
use lock_mysql::{MySqlBackend, Strategy};
use sqlx::AssertSqlSafe;

use super::{
    acquired, admin_conn, client, handed_on, spawn_acquire,
    support::{MySqlStore, hex},
    until_waiting,
};

/// A foreign transaction keeps the lease row locked past `innodb_lock_wait_timeout` (1205):
/// a renewal reports `Unavailable` (retryable) and changes nothing; a waiter keeps polling
/// within its budget and gets the lock once the row is free and the lease expired.
pub(super) async fn lease_lock_wait_timeout() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let mut config = store.config().clone();
    config.lock_wait_timeout = Duration::from_secs(1);
    let (a, b) = (client(&config).await?, client(&config).await?);
    let name = unique_name("lock-wait")?;
    let ttl = Duration::from_secs(2);
    let start = Instant::now();
    let held = a
        .lock_with(&name, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(err)?;
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; SELECT fence FROM `{}` WHERE name = X'{}' FOR UPDATE",
        config.table_name(),
        hex(name.as_str())
    )))
    .execute(&mut admin)
    .await
    .map_err(err)?;
    let renewed = a.renew_lease(&held.lease(), ttl).await;
    ensure!(
        matches!(&renewed, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "a renewal blocked past the lock-wait timeout returned {renewed:?}, expected Unavailable"
    );
    let waiter = spawn_acquire(
        &b,
        &name,
        LockOptions::new().ttl(ttl).wait(Duration::from_secs(8)),
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let next = acquired(waiter).await?;
    ensure!(
        start.elapsed() >= ttl,
        "the waiter got the lock before the TTL"
    );
    handed_on(held, next).await?;
    Ok(())
}

/// A renewal batch chosen as a deadlock victim (1213) is run again and succeeds.
pub(super) async fn lease_deadlock_retried() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let config = store.config().clone();
    let table = config.table_name();
    let backend = MySqlBackend::connect(&config).await.map_err(err)?;
    let a = LockClient::new(backend.clone());
    let base = unique_name("deadlock")?;
    // The batch locks rows in name order: x before y.
    let (x, y) = (
        LockName::new(format!("{base}/x")).map_err(err)?,
        LockName::new(format!("{base}/y")).map_err(err)?,
    );
    let options = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .watchdog(false);
    let gx = a.lock_with(&x, &options).await.map_err(err)?;
    let gy = a.lock_with(&y, &options).await.map_err(err)?;
    let mut admin = admin_conn().await?;
    // The administrator's transaction writes rows first, so InnoDB picks the batch (one row
    // changed) as the victim; then it locks y.
    let mut setup = String::from("START TRANSACTION; ");
    for i in 0..5 {
        setup.push_str(&format!(
            "INSERT INTO `{table}` (name, fence) VALUES (X'{}', 0); ",
            hex(&format!("{base}/weight{i}"))
        ));
    }
    setup.push_str(&format!(
        "SELECT fence FROM `{table}` WHERE name = X'{}' FOR UPDATE",
        hex(y.as_str())
    ));
    sqlx::raw_sql(AssertSqlSafe(setup))
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let leases = vec![gx.lease(), gy.lease()];
    let batch = tokio::spawn({
        let backend = backend.clone();
        async move { backend.renew_many(&leases).await }
    });
    until_waiting(&store, &y).await?;
    // Now the batch holds x and waits for y: asking for x closes the cycle.
    let closing = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT fence FROM `{table}` WHERE name = X'{}' FOR UPDATE",
        hex(x.as_str())
    )))
    .execute(&mut admin)
    .await;
    ensure!(
        closing.is_ok(),
        "the administrator's transaction was the deadlock victim ({closing:?}); the batch's retry was not exercised"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let results = batch
        .await
        .map_err(err)?
        .map_err(fail("the retried batch failed as a whole"))?;
    ensure!(results.len() == 2, "{} results for 2 leases", results.len());
    for result in results {
        ensure!(
            result.is_ok(),
            "a renewal of the retried batch failed: {result:?}"
        );
    }
    gx.release().await.map_err(err)?;
    gy.release().await.map_err(err)?;
    Ok(())
}

/// A release that hands over (someone queues) is one transaction; a foreign transaction that
/// keeps the lease row locked past the lock-wait timeout stops it before its `COMMIT`. The
/// release fails, and its connection goes back to the pool rolled back: the next statement
/// on it (the same client's acquire of another lock, on a pool of one connection) commits on
/// its own, rather than inside the stopped release's open transaction, unseen by the server's
/// other sessions until that connection commits by chance.
pub(super) async fn a_stopped_release_leaves_no_open_transaction() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let mut config = store.config().clone();
    config.lock_wait_timeout = Duration::from_secs(1);
    let waiting = client(&config).await?;
    config.pool_size = 1;
    let holder = client(&config).await?;
    let table = config.table_name();
    let (name, other) = (unique_name("stopped-release")?, unique_name("after-it")?);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .watchdog(false);
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let waiter = spawn_acquire(
        &waiting,
        &name,
        options.clone().wait(Duration::from_secs(20)),
    );
    let places = format!(
        "SELECT COUNT(*) FROM `{table}_queue` WHERE name = X'{}'",
        hex(name.as_str())
    );
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(5),
        "the waiter's place",
        async || {
            let places: i64 = sqlx::query_scalar(AssertSqlSafe(places.clone()))
                .fetch_one(store.admin())
                .await
                .map_err(err)?;
            Ok(places == 1)
        },
    )
    .await?;
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; SELECT fence FROM `{table}` WHERE name = X'{}' FOR UPDATE",
        hex(name.as_str())
    )))
    .execute(&mut admin)
    .await
    .map_err(err)?;
    let released = holder.release_lease(&held.lease()).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    ensure!(
        matches!(&released, Err(LockError::Unavailable { .. })),
        "a release stopped by a row kept locked past the lock-wait timeout returned \
         {released:?}, expected Unavailable"
    );
    let after = holder
        .lock_with(&other, &options.clone().wait(Duration::ZERO))
        .await
        .map_err(fail("the holder's next acquire"))?;
    let seen: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{table}` WHERE name = X'{}' AND token IS NOT NULL",
        hex(other.as_str())
    )))
    .fetch_one(store.admin())
    .await
    .map_err(err)?;
    ensure!(
        seen == 1,
        "the grant of `{other}` is not visible to another session: it ran inside the stopped \
         release's transaction"
    );
    after.release().await.map_err(err)?;
    held.release().await.map_err(err)?;
    waiter
        .await
        .map_err(err)?
        .map_err(fail("the waiter"))?
        .release()
        .await
        .map_err(err)?;
    Ok(())
}
