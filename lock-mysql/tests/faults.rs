//! Faults specific to MySQL/MariaDB, run one after another (some restart the server):
//!
//! - `KILL CONNECTION` of a holder's connection: row lock: `lost()` fires and a waiter gets the
//!   lock at once; lease: the lock survives until its TTL (and, renewed, beyond);
//! - a row locked by a long foreign transaction (lock-wait timeout 1205) and a renewal batch
//!   chosen as a deadlock victim (1213): classified, retried where safe;
//! - wait budgets below a second on the row-lock strategy: on time, and no statement is left
//!   waiting on the server; a waiting `acquire` dropped mid-wait leaves nothing behind;
//! - one client's waiters for a name: only one waits in InnoDB, the others (and their budgets)
//!   in the client; a fence issued by someone else between a grant and its bump is recorded
//!   as the fence the holder really got;
//! - an unreachable server and a refused login: typed errors;
//! - a server restart while locks are held and waited for: typed errors, then recovery with
//!   no manual clean-up;
//! - the client clock: every statement the library sends is captured on the wire, and none
//!   carries a time computed by the client: expiry is `NOW(6) + INTERVAL <ttl>` on the server;
//!   and clients run under `faketime` 10 minutes behind and ahead never get a lock another
//!   holds, while a killed holder's lease still ends after its TTL by the server's clock.
//!
//! Needs `LOCK_TEST_MYSQL_URL`, `LOCK_TEST_SERVICES_DIR` and `LOCK_TEST_FAKETIME` (`cargo
//! xtask test` sets them; `cargo xtask services up` installs `faketime`);
//! without them every case fails. Arguments filter cases by substring.

mod support;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use conformance_tests::{Cases, Failure, Outcome, ensure};
use lock_core::{
    Holder, LockBackend, LockClient, LockError, LockGuard, LockName, LockOptions, LossReason,
};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy};
use sqlx::{AssertSqlSafe, MySqlConnection};
use support::{MySqlStore, hex};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// The client-to-server bytes of one connection.
type Stream = Arc<Mutex<Vec<u8>>>;

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(SKEWED_ROLE_VAR) {
        return skewed::child(&role);
    }
    Cases::<Failure>::new("faults")
        .limit(Duration::from_secs(120))
        .case("row_lock/kill_holder_connection", || {
            Box::pin(row_lock_kill_holder())
        })
        .case("lease/kill_holder_connection", || {
            Box::pin(lease_kill_holder())
        })
        .case("lease/row_locked_by_long_transaction", || {
            Box::pin(lease_lock_wait_timeout())
        })
        .case("lease/a_dead_waiter_stalls_the_lease_briefly", || {
            Box::pin(lease_dead_waiter())
        })
        .case("lease/own_place_blocks_nobody_after_release", || {
            Box::pin(lease_own_place_after_release())
        })
        .case("lease/a_locked_place_behind_stalls_no_waiter", || {
            Box::pin(lease_locked_place_behind())
        })
        .case("lease/renewal_batch_deadlock_is_retried", || {
            Box::pin(lease_deadlock_retried())
        })
        .case("row_lock/sub_second_budgets", || {
            Box::pin(row_lock_sub_second_budgets())
        })
        .case("row_lock/dropped_waiter_leaves_nothing", || {
            Box::pin(row_lock_dropped_waiter())
        })
        .case("row_lock/one_waiter_per_name_per_client", || {
            Box::pin(row_lock_one_waiter_per_client())
        })
        .case("row_lock/fence_bumped_between_grant_and_bump", || {
            Box::pin(row_lock_fence_bumped_in_between())
        })
        .case("row_lock/fence_counter_at_maximum_is_foreign", || {
            Box::pin(row_lock_fence_at_maximum())
        })
        .case("errors/unreachable_and_refused", || {
            Box::pin(unreachable_and_refused())
        })
        .case("restart/held_and_waited_locks", || {
            Box::pin(restart_with_locks())
        })
        .case("clock/client_sends_no_time", || {
            Box::pin(client_sends_no_time())
        })
        .case("clock/skewed_clients_never_double_grant", || {
            Box::pin(skewed::never_double_grant())
        })
        .case("clock/source_never_reads_the_wall_clock", || {
            Box::pin(source_never_reads_wall_clock())
        })
        .finally(support::drop_tables_after_cases)
        .main()
}

/// A waiter: `client` acquires `name` for a new holder in the background.
fn spawn_acquire(
    client: &LockClient,
    name: &LockName,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.lock_with(&name, &options).await })
}

fn name(tag: &str) -> Result<LockName, Failure> {
    LockName::new(format!("faults/{tag}/{:016x}", rand::random::<u64>())).map_err(err)
}

fn err(e: impl std::fmt::Display) -> Failure {
    Failure(e.to_string())
}

async fn client(config: &MySqlConfig) -> Result<LockClient, Failure> {
    Ok(LockClient::new(
        MySqlBackend::connect(config).await.map_err(err)?,
    ))
}

async fn admin_conn() -> Result<MySqlConnection, Failure> {
    support::admin_conn().await.map_err(Failure)
}

async fn kill_connection(id: u64) -> Outcome {
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
        .execute(&mut admin)
        .await
        .map_err(|e| Failure(format!("KILL CONNECTION {id}: {e}")))?;
    Ok(())
}

/// How many statements mentioning `name` run on the server now (besides the probe).
async fn statements_on(admin: &mut MySqlConnection, name: &LockName) -> Result<i64, Failure> {
    statements_mentioning(admin, &hex(name.as_str())).await
}

/// How many statements whose text contains `text` run on the server now, besides the probe.
async fn statements_mentioning(admin: &mut MySqlConnection, text: &str) -> Result<i64, Failure> {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE ID <> CONNECTION_ID() AND INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'",
    )
    .bind(format!("%{text}%"))
    .fetch_one(admin)
    .await
    .map_err(err)
}

/// Polls the statements on `name` every 10 ms, at most `polls` times, until `done` holds for
/// their count; fails with `fail(count)` otherwise.
async fn until_statements(
    name: &LockName,
    polls: usize,
    done: impl Fn(i64) -> bool,
    fail: impl FnOnce(i64) -> String,
) -> Outcome {
    let mut admin = admin_conn().await?;
    let mut count = statements_on(&mut admin, name).await?;
    for _ in 0..polls {
        if done(count) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        count = statements_on(&mut admin, name).await?;
    }
    ensure!(done(count), "{}", fail(count));
    Ok(())
}

/// Waits until a statement mentioning `name` (other than this probe) is waiting on the server.
async fn until_waiting(name: &LockName) -> Outcome {
    until_statements(
        name,
        200,
        |n| n > 0,
        |_| format!("no statement on `{name}` started waiting within 2 s"),
    )
    .await
}

/// Waits up to a second for no statement on `name` to run on the server.
async fn until_no_statement(name: &LockName) -> Outcome {
    until_statements(
        name,
        100,
        |n| n == 0,
        |n| format!("{n} statements on `{name}` still run on the server"),
    )
    .await
}

/// A waiter that died while first in line (a place planted for a minute, with a turn of
/// 300 ms) gets the lease handed to it at the release, and stalls the next waiter only for
/// its turn: the next waiter is served after the turn, not before (the order held) and not
/// much after (at most one park of the next waiter more).
async fn lease_dead_waiter() -> Outcome {
    const TURN: Duration = Duration::from_millis(300);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = name("dead-waiter")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    plant_place(&store, &name, "0123456789abcdef0123456789abcdef", TURN).await?;
    let waiter = spawn_acquire(&b, &name, long.clone().wait(Duration::from_secs(10)));
    until_waiting(&name).await?;
    let released = Instant::now();
    let before = held.fence();
    held.release().await.map_err(err)?;
    let next = waiter
        .await
        .map_err(err)?
        .map_err(|e| Failure(format!("the waiter behind the dead one failed: {e}")))?;
    let waited = released.elapsed();
    ensure!(
        waited >= TURN.mul_f64(0.9),
        "the waiter behind the dead one got the lease {waited:?} after the release, before the dead waiter's turn of {TURN:?} ran out"
    );
    let bound = TURN + Duration::from_secs(1) + Duration::from_millis(500);
    ensure!(
        waited <= bound,
        "a dead waiter stalled the lease {waited:?} (bound {bound:?})"
    );
    ensure!(
        next.fence().get() >= before.get() + 2,
        "fence {} after {before}: the hand-off to the dead waiter took no fence",
        next.fence(),
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// Plants a place in `name`'s waiters' queue for `token`, arrived a second ago and kept for a
/// minute, with a turn of `turn` (over a place `token` may still have: a holder that queued
/// before its grant takes its place out in the background).
async fn plant_place(store: &MySqlStore, name: &LockName, token: &str, turn: Duration) -> Outcome {
    let queue = format!("`{}_queue`", store.config().table().as_str());
    let plant = format!(
        "INSERT INTO {queue} (name, token, arrived_at, until_at, turn_us) \
         VALUES (X'{}', '{token}', NOW(6) - INTERVAL 1 SECOND, NOW(6) + INTERVAL 1 MINUTE, {turn}) \
         ON DUPLICATE KEY UPDATE arrived_at = VALUES(arrived_at), until_at = VALUES(until_at), \
         turn_us = VALUES(turn_us)",
        hex(name.as_str()),
        turn = turn.as_micros()
    );
    sqlx::raw_sql(AssertSqlSafe(plant))
        .execute(store.admin())
        .await
        .map_err(|e| Failure(format!("planting a place: {e}")))?;
    Ok(())
}

/// A thousand waiters refresh their places all the time; a try must not lock places it does
/// not need. Here a foreign transaction keeps the places of two waiters *behind* the first
/// one locked (as a refresh in flight would, for longer) when the lease expires (a holder that
/// died: a lease row planted for 500 ms): the first waiter's try reads the queue only up to
/// its own place, so it takes the lease soon after. (Before, the acquire statement's queue
/// condition read, and locked, every place of the name, and waited for that lock past the
/// waiter's budget.)
async fn lease_locked_place_behind() -> Outcome {
    const LEFT: Duration = Duration::from_millis(500);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let b = client(store.config()).await?;
    let name = name("locked-place")?;
    let table = format!("`{}`", store.config().table().as_str());
    let queue = format!("`{}_queue`", store.config().table().as_str());
    let n = hex(name.as_str());
    let planted = Instant::now();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {table} (name, token, fence, expires_at, acquired_at) \
         VALUES (X'{n}', 'abcdefabcdefabcdefabcdefabcdefab', 1, NOW(6) + INTERVAL {} MICROSECOND, NOW(6))",
        LEFT.as_micros()
    )))
    .execute(store.admin())
    .await
    .map_err(|e| Failure(format!("planting a lease: {e}")))?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let waiter = spawn_acquire(&b, &name, long.clone().wait(Duration::from_secs(4)));
    until_waiting(&name).await?;
    // Two places behind, with the lowest and the highest token, so a scan of the queue in key
    // order meets one of them before or after the waiter's own.
    let behind = [
        "00000000000000000000000000000000",
        "fedcba9876543210fedcba9876543210",
    ];
    for token in behind {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO {queue} (name, token, arrived_at, until_at, turn_us) \
             VALUES (X'{n}', '{token}', NOW(6) + INTERVAL 1 MINUTE, NOW(6) + INTERVAL 2 MINUTE, 300000)"
        )))
        .execute(store.admin())
        .await
        .map_err(|e| Failure(format!("planting a place behind: {e}")))?;
    }
    // Each place locked by its key: one `FOR UPDATE` over both would read the queue along
    // `by_arrival` and lock the waiter's own place too.
    let mut foreign = store.admin().acquire().await.map_err(err)?;
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut *foreign)
        .await
        .map_err(err)?;
    for token in behind {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT token FROM {queue} WHERE name = X'{n}' AND token = '{token}' FOR UPDATE"
        )))
        .execute(&mut *foreign)
        .await
        .map_err(|e| Failure(format!("locking a place behind: {e}")))?;
    }
    let next = waiter.await.map_err(err)?;
    let waited = planted.elapsed();
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *foreign)
        .await
        .map_err(err)?;
    drop(foreign);
    let next = next.map_err(|e| {
        Failure(format!(
            "the first waiter did not get the expired lease while a place behind it was locked: {e}"
        ))
    })?;
    let bound = LEFT + Duration::from_secs(1);
    ensure!(
        waited <= bound,
        "the first waiter got the lease {waited:?} after it was planted for {LEFT:?} (bound {bound:?}): it waited for a lock on a place behind it"
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// A holder that queued before its grant takes its place out in the background; its release
/// may land first. The place must then stop no one: after the release a newcomer's single
/// try gets the lease (the holder's own place is planted, as if its removal were late).
async fn lease_own_place_after_release() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = name("own-place")?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.lock_with(&name, &options).await.map_err(err)?;
    let token = held.lease().token().as_str().to_owned();
    plant_place(&store, &name, &token, Duration::from_millis(300)).await?;
    held.release().await.map_err(err)?;
    let next = b.try_lock_with(&name, &options).await.map_err(err)?;
    ensure!(
        next.is_some(),
        "after its holder released it, a single try found the lease busy: the released holder's own place in the queue stood in the way"
    );
    if let Some(next) = next {
        next.release().await.map_err(err)?;
    }
    Ok(())
}

/// Row lock: killing the holder's connection rolls its transaction back: the waiter queued in
/// InnoDB gets the lock at once, with a larger fence, and the holder's `lost()` fires.
async fn row_lock_kill_holder() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = name("kill-row")?;
    let ttl = Duration::from_secs(2);
    let options = LockOptions::new().ttl(ttl).wait(Duration::ZERO);
    let held = a.lock_with(&name, &options).await.map_err(err)?;
    let waiter = spawn_acquire(&b, &name, options.clone().wait(Duration::from_secs(20)));
    until_waiting(&name).await?;
    let id = store
        .holder_connection(&name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("the holder recorded no connection id".into()))?;
    kill_connection(id).await?;
    let killed = Instant::now();
    let next = waiter
        .await
        .map_err(err)?
        .map_err(|e| Failure(format!("the waiter failed: {e}")))?;
    let handed = killed.elapsed();
    ensure!(
        handed <= Duration::from_millis(500),
        "the waiter got the lock {handed:?} after the holder's connection was killed"
    );
    ensure!(
        next.fence() > held.fence(),
        "fence {} after {}",
        next.fence(),
        held.fence()
    );
    let reason = tokio::time::timeout(ttl, held.lost())
        .await
        .map_err(|_| Failure(format!("lost() did not fire within {ttl:?} of the kill")))?;
    ensure!(reason == LossReason::SessionEnded, "lost() said {reason:?}");
    ensure!(!held.is_held(), "is_held() after the connection was killed");
    let late = held.release().await;
    ensure!(
        matches!(late, Err(LockError::Lost { .. })),
        "release after the kill: {late:?}"
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// The connection id of the only connection of a one-connection pool.
async fn pool_connection_id(backend: &MySqlBackend) -> Result<u64, Failure> {
    let mut last = String::new();
    for _ in 0..3 {
        match sqlx::query_scalar::<_, u64>("SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
            .fetch_one(backend.pool())
            .await
        {
            Ok(id) => return Ok(id),
            // A connection killed earlier is found dead on first use and replaced.
            Err(e) => last = e.to_string(),
        }
    }
    Err(Failure(last))
}

/// Lease: the hold does not live in a connection. Killed, its holder's connection takes
/// nothing with it: the lease lasts until its TTL (watchdog off) or for as long as the
/// watchdog renews it through a new connection.
async fn lease_kill_holder() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let single = store.config().clone().pool_size(1);
    let backend = MySqlBackend::connect(&single).await.map_err(err)?;
    let a = LockClient::new(backend.clone());
    let b = client(store.config()).await?;
    let ttl = Duration::from_secs(2);

    let name1 = name("kill-lease")?;
    let start = Instant::now();
    let held = a
        .lock_with(&name1, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(err)?;
    kill_connection(pool_connection_id(&backend).await?).await?;
    let busy = b
        .try_lock_with(&name1, &LockOptions::new().ttl(ttl))
        .await
        .map_err(err)?;
    ensure!(
        busy.is_none(),
        "the lease ended with its holder's connection"
    );
    let info = b.inspect(&name1).await.map_err(err)?;
    ensure!(
        info.is_some_and(|i| i.token == *held.lease().token()),
        "inspect does not show the holder after the kill"
    );
    let next = b
        .lock_with(&name1, &LockOptions::new().ttl(ttl).wait(ttl * 3))
        .await
        .map_err(err)?;
    let took = start.elapsed();
    ensure!(
        took >= ttl.mul_f64(0.95),
        "the lease ended after {took:?}, before its {ttl:?} TTL"
    );
    ensure!(
        took <= ttl + Duration::from_millis(800),
        "the lease ended only after {took:?}"
    );
    ensure!(
        next.fence() > held.fence(),
        "fence {} after {}",
        next.fence(),
        held.fence()
    );
    next.release().await.map_err(err)?;
    drop(held);

    let name2 = name("kill-lease-renewed")?;
    let ttl = Duration::from_secs(1);
    let renewed = a
        .lock_with(&name2, &LockOptions::new().ttl(ttl))
        .await
        .map_err(err)?;
    kill_connection(pool_connection_id(&backend).await?).await?;
    let start = Instant::now();
    while start.elapsed() < ttl * 3 {
        ensure!(
            renewed.is_held(),
            "lost {:?} after its connection was killed",
            start.elapsed()
        );
        tokio::time::sleep(ttl / 4).await;
    }
    let busy = b
        .try_lock_with(&name2, &LockOptions::new().ttl(ttl))
        .await
        .map_err(err)?;
    ensure!(
        busy.is_none(),
        "another client got a lease the watchdog kept renewing"
    );
    renewed.release().await.map_err(err)?;
    Ok(())
}

/// A foreign transaction keeps the lease row locked past `innodb_lock_wait_timeout` (1205):
/// a renewal reports `Unavailable` (retryable) and changes nothing; a waiter keeps polling
/// within its budget and gets the lock once the row is free and the lease expired.
async fn lease_lock_wait_timeout() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let mut config = store.config().clone();
    config.lock_wait_timeout = Duration::from_secs(1);
    let (a, b) = (client(&config).await?, client(&config).await?);
    let name = name("lock-wait")?;
    let ttl = Duration::from_secs(2);
    let start = Instant::now();
    let held = a
        .lock_with(&name, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(err)?;
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; SELECT fence FROM `{}` WHERE name = X'{}' FOR UPDATE",
        config.table(),
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
    let next = waiter
        .await
        .map_err(err)?
        .map_err(|e| Failure(format!("the waiter failed: {e}")))?;
    ensure!(
        start.elapsed() >= ttl,
        "the waiter got the lock before the TTL"
    );
    ensure!(
        next.fence() > held.fence(),
        "fence {} after {}",
        next.fence(),
        held.fence()
    );
    next.release().await.map_err(err)?;
    drop(held);
    Ok(())
}

/// A renewal batch chosen as a deadlock victim (1213) is run again and succeeds.
async fn lease_deadlock_retried() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let config = store.config().clone();
    let table = config.table();
    let backend = MySqlBackend::connect(&config).await.map_err(err)?;
    let a = LockClient::new(backend.clone());
    let base = name("deadlock")?;
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
    until_waiting(&y).await?;
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
    let results = batch.await.map_err(err)?;
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

/// Row lock: an `acquire` future dropped while it waits in InnoDB leaves no statement and no
/// transaction behind: once the holder releases, a third client gets the lock at once, with
/// the next fence (the dropped waiter took none).
async fn row_lock_dropped_waiter() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b, c) = (
        client(store.config()).await?,
        client(store.config()).await?,
        client(store.config()).await?,
    );
    let name = name("dropped-waiter")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    let (waiter, wait) = (Holder::new(), long.clone().wait(Duration::from_secs(10)));
    let mut waiting = Box::pin(b.acquire(&waiter, &name, &wait));
    tokio::select! {
        got = &mut waiting => return Err(Failure(format!("the waiter got a held lock: {got:?}"))),
        queued = until_waiting(&name) => queued?,
    }
    // Dropped while its statement waits in InnoDB.
    drop(waiting);
    until_no_statement(&name).await?;
    let held_fence = held.fence().get();
    held.release().await.map_err(err)?;
    let next = c
        .lock_with(&name, &long.clone().wait(Duration::from_secs(2)))
        .await
        .map_err(err)?;
    ensure!(
        next.fence().get() == held_fence + 1,
        "fence {} after {held_fence}: the dropped waiter took one",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: budgets below `innodb_lock_wait_timeout`'s one-second grain end on time, the
/// killed waits leave no statement behind, and the client works normally afterwards.
async fn row_lock_sub_second_budgets() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = name("budgets")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    for ms in [0, 50, 120, 400, 1300] {
        let budget = Duration::from_millis(ms);
        let start = Instant::now();
        let result = b.lock_with(&name, &long.clone().wait(budget)).await;
        let took = start.elapsed();
        ensure!(
            matches!(result, Err(LockError::Timeout { .. })),
            "budget {budget:?}: {result:?}, expected Timeout"
        );
        ensure!(
            took >= budget.mul_f64(0.9),
            "budget {budget:?}: gave up after {took:?}"
        );
        ensure!(
            took <= budget + Duration::from_millis(150),
            "budget {budget:?}: Timeout only after {took:?}"
        );
        until_no_statement(&name)
            .await
            .map_err(|Failure(why)| Failure(format!("budget {budget:?}: {why}")))?;
    }
    held.release().await.map_err(err)?;
    let after = b
        .try_lock_with(&name, &long)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("the lock was not free after release".into()))?;
    after.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: of one client's seven acquisitions of a held name, only the first waits in
/// InnoDB (the server never runs more than one statement on the name while five more wait
/// out their budgets; without the client's queue all six would wait there); the others wait
/// in the client, where their budgets hold as they do on the server, and a zero-budget try
/// answers busy at once. The first then gets the lock when the holder releases, with the
/// next fence.
async fn row_lock_one_waiter_per_client() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = name("one-waiter")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    let mut admin = admin_conn().await?;
    let first = spawn_acquire(&b, &name, long.clone().wait(Duration::from_secs(20)));
    until_waiting(&name).await?;
    let budget = Duration::from_millis(300);
    let start = Instant::now();
    let others: Vec<_> = (0..5)
        .map(|_| spawn_acquire(&b, &name, long.clone().wait(budget)))
        .collect();
    // Watches the server while the five wait out their budgets.
    let mut most = 0;
    while !others.iter().all(|other| other.is_finished()) {
        most = most.max(statements_on(&mut admin, &name).await?);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure!(
        most == 1,
        "up to {most} statements waited on the server for one client's acquisitions; expected 1"
    );
    for (i, other) in others.into_iter().enumerate() {
        let result = other.await.map_err(err)?;
        ensure!(
            matches!(result, Err(LockError::Timeout { .. })),
            "waiter {i} behind the first: {result:?}, expected Timeout"
        );
    }
    let took = start.elapsed();
    ensure!(
        took >= budget.mul_f64(0.9) && took <= budget + Duration::from_millis(150),
        "five {budget:?} budgets in the client's queue ended after {took:?}"
    );
    let tried = Instant::now();
    let busy = b.try_lock_with(&name, &long).await;
    ensure!(
        matches!(busy, Ok(None)),
        "a zero-budget try while the first waits: {busy:?}, expected busy"
    );
    ensure!(
        tried.elapsed() <= Duration::from_millis(100),
        "the zero-budget try answered after {:?}",
        tried.elapsed()
    );
    let held_fence = held.fence().get();
    held.release().await.map_err(err)?;
    let next = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .map_err(|_| Failure("the first waiter did not get the released lock within 5 s".into()))?
        .map_err(err)?
        .map_err(|e| Failure(format!("the first waiter failed: {e}")))?;
    ensure!(
        next.fence().get() == held_fence + 1,
        "fence {} after {held_fence}",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: a fence issued by someone else after a grant read the counter and before its own
/// bump (here, an administrator's bump committed while the holder's waits for its row) makes
/// the bump issue a larger fence than the one the grant recorded; the record is corrected, so
/// the guard and `inspect` show the fence the holder really got. While the bump waits,
/// `inspect` shows no holder: the recorded fence is not issued yet.
async fn row_lock_fence_bumped_in_between() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = name("fence-between")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10));
    // Creates the lock row and the counter row (fence 1).
    let first = a.lock_with(&name, &options).await.map_err(err)?;
    let first_fence = first.fence().get();
    first.release().await.map_err(err)?;
    let fences = format!("`{}_fences`", store.config().table().as_str());
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; UPDATE {fences} SET fence = fence + 1 WHERE name = X'{}'",
        hex(name.as_str())
    )))
    .execute(&mut admin)
    .await
    .map_err(err)?;
    let mut probe = admin_conn().await?;
    let acquiring = spawn_acquire(&a, &name, options.clone());
    // The grant has read the committed counter once its bump (the only statement naming this
    // run's fence table besides the probe) runs, waiting for the counter row.
    let mut polls = 0;
    while statements_mentioning(&mut probe, &fences).await? == 0 {
        polls += 1;
        ensure!(
            polls < 200 && !acquiring.is_finished(),
            "the holder's bump never waited for the counter row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The grant's record is written, but its fence is not issued yet: not a hold yet.
    let early = a.backend().inspect(&name).await.map_err(err)?;
    ensure!(
        early.is_none(),
        "inspect shows {early:?} while the holder's fence bump has not committed"
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let guard = acquiring
        .await
        .map_err(err)?
        .map_err(|e| Failure(format!("the acquire failed: {e}")))?;
    let fence = guard.fence().get();
    ensure!(
        fence == first_fence + 2,
        "fence {fence} after {first_fence} and the administrator's bump"
    );
    let info = a
        .backend()
        .inspect(&name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("inspect shows no holder".into()))?;
    ensure!(
        info.fence.get() == fence,
        "inspect shows fence {}, the guard has {fence}",
        info.fence
    );
    guard.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: a fence counter at its maximum (no fence left to issue) is a `Foreign` row, not
/// a server error: the acquire changes nothing, and the lock is free for the next try.
async fn row_lock_fence_at_maximum() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = name("fence-max")?;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let first = a.lock_with(&name, &options).await.map_err(err)?;
    first.release().await.map_err(err)?;
    let fences = format!("`{}_fences`", store.config().table().as_str());
    let mut admin = admin_conn().await?;
    let set = |fence: &str| {
        format!(
            "UPDATE {fences} SET fence = {fence} WHERE name = X'{}'",
            hex(name.as_str())
        )
    };
    sqlx::raw_sql(AssertSqlSafe(set("18446744073709551615")))
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let refused = a.lock_with(&name, &options).await;
    ensure!(
        matches!(&refused, Err(LockError::Foreign { found, .. }) if found.contains("maximum")),
        "acquire with the fence counter at its maximum: {refused:?}, expected Foreign"
    );
    sqlx::raw_sql(AssertSqlSafe(set("7")))
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let next = a.lock_with(&name, &options).await.map_err(err)?;
    ensure!(
        next.fence().get() == 8,
        "fence {} after the counter was set to 7",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// A server nobody listens on is `Unavailable` (retryable) within the connect timeout; a
/// refused login is a `Backend` error (retrying will not help).
async fn unreachable_and_refused() -> Outcome {
    // A port just bound and released: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(err)?
        .port();
    let timeout = Duration::from_secs(1);
    let down = MySqlConfig::new(format!("mysql://lock:x@127.0.0.1:{port}/locktest"))
        .connect_timeout(timeout);
    let start = Instant::now();
    let result = MySqlBackend::connect(&down).await;
    let took = start.elapsed();
    ensure!(
        matches!(&result, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "an unreachable server gave {result:?}"
    );
    ensure!(
        took <= timeout + Duration::from_millis(500),
        "took {took:?}"
    );
    let mut url = url::Url::parse(&support::url().map_err(Failure)?).map_err(err)?;
    url.set_password(Some("wrong-password"))
        .map_err(|()| Failure("cannot set a password".into()))?;
    let refused =
        MySqlBackend::connect(&MySqlConfig::new(url.as_str()).connect_timeout(timeout)).await;
    ensure!(
        matches!(&refused, Err(LockError::Backend { .. })),
        "a refused login gave {refused:?}"
    );
    let shown = refused.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(
        !shown.contains("wrong-password"),
        "the error shows the password: {shown}"
    );
    Ok(())
}

fn service_script(which: &str) -> Result<PathBuf, Failure> {
    let dir = std::env::var_os("LOCK_TEST_SERVICES_DIR").ok_or_else(|| {
        Failure("LOCK_TEST_SERVICES_DIR is not set; run `cargo xtask test`".into())
    })?;
    let path = PathBuf::from(dir).join("mariadb").join(which);
    ensure!(path.exists(), "{} does not exist", path.display());
    Ok(path)
}

async fn run_script(path: &PathBuf) -> Outcome {
    let status = tokio::process::Command::new("sh")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .status()
        .await
        .map_err(|e| Failure(format!("running {}: {e}", path.display())))?;
    ensure!(status.success(), "{} failed: {status}", path.display());
    Ok(())
}

/// Locks held and waited for on both strategies while MariaDB stops and starts again.
async fn restart_with_locks() -> Outcome {
    let (stop, start) = (service_script("stop")?, service_script("start")?);
    let lease_store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let row_store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let short = |c: &MySqlConfig| c.clone().connect_timeout(Duration::from_secs(2));
    let (la, lb) = (
        client(&short(lease_store.config())).await?,
        client(&short(lease_store.config())).await?,
    );
    let (ra, rb) = (
        client(&short(row_store.config())).await?,
        client(&short(row_store.config())).await?,
    );
    let (ln, rn) = (name("restart-lease")?, name("restart-row")?);
    let ttl = Duration::from_secs(3);
    let options = LockOptions::new().ttl(ttl);
    let lg = la.lock_with(&ln, &options).await.map_err(err)?;
    let rg = ra.lock_with(&rn, &options).await.map_err(err)?;
    // The rule for every store: a retryable failure is retried inside the wait budget and
    // returned when the budget runs out; so both waiters ride out the outage until their
    // budget ends, then report `Unavailable`.
    let budget = Duration::from_secs(2);
    let wait = options.clone().wait(budget);
    let lw = spawn_acquire(&lb, &ln, wait.clone());
    let rw = spawn_acquire(&rb, &rn, wait);
    until_waiting(&rn).await?;

    run_script(&stop).await?;
    let stopped = Instant::now();
    let outage = async {
        let waited = tokio::time::timeout(budget * 3, rw)
            .await
            .map_err(|_| Failure("the row-lock waiter hung after the server stopped".into()))?
            .map_err(err)?;
        ensure!(
            matches!(&waited, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
            "the row-lock waiter got {waited:?}, expected Unavailable"
        );
        let polled = tokio::time::timeout(budget * 3, lw)
            .await
            .map_err(|_| Failure("the lease waiter hung after the server stopped".into()))?
            .map_err(err)?;
        ensure!(
            matches!(&polled, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
            "the lease waiter got {polled:?}, expected Unavailable"
        );
        ensure!(
            stopped.elapsed() <= budget + Duration::from_secs(1),
            "the waiters reported the outage {:?} after it began, past their {budget:?} budget",
            stopped.elapsed()
        );
        let reason = tokio::time::timeout(ttl + Duration::from_secs(1), rg.lost())
            .await
            .map_err(|_| {
                Failure(
                    "the row-lock holder's lost() did not fire while the server was down".into(),
                )
            })?;
        ensure!(
            reason == LossReason::SessionEnded,
            "row-lock lost() said {reason:?}"
        );
        let began = Instant::now();
        let fresh = lb
            .lock_with(
                &name("restart-down")?,
                &options.clone().wait(Duration::ZERO),
            )
            .await;
        ensure!(
            matches!(&fresh, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
            "a one-try acquire while the server is down gave {fresh:?}"
        );
        ensure!(
            began.elapsed() <= Duration::from_secs(4),
            "it took {:?}",
            began.elapsed()
        );
        Ok::<(), Failure>(())
    }
    .await;
    // Start the server again whatever happened above.
    let restarted = run_script(&start).await;
    outage?;
    restarted?;

    // Recovery with the same clients and no clean-up: the server rolled the row lock back.
    let next_row = rb
        .lock_with(&rn, &options.clone().wait(Duration::from_secs(5)))
        .await
        .map_err(|e| Failure(format!("the row lock after the restart: {e}")))?;
    ensure!(
        next_row.fence() > rg.fence(),
        "fence {} after {}",
        next_row.fence(),
        rg.fence()
    );
    let late = rg.release().await;
    ensure!(
        matches!(late, Err(LockError::Lost { .. })),
        "the old row-lock guard released: {late:?}"
    );
    next_row.release().await.map_err(err)?;
    let lease_fence = lg.fence();
    // The lease survived in the table: its holder either renewed it after the restart (and
    // releases it now) or lost it at its local deadline (and it expires at its TTL).
    match lg.release().await {
        Ok(()) | Err(LockError::Lost { .. }) => {}
        Err(other) => {
            return Err(Failure(format!(
                "releasing the lease after the restart: {other}"
            )));
        }
    }
    let next_lease = lb
        .lock_with(&ln, &options.clone().wait(ttl + Duration::from_secs(2)))
        .await
        .map_err(|e| Failure(format!("the lease after the restart: {e}")))?;
    ensure!(
        next_lease.fence() > lease_fence,
        "fence {} after {lease_fence}",
        next_lease.fence()
    );
    next_lease.release().await.map_err(err)?;
    ensure!(
        ra.inspect(&rn).await.map_err(err)?.is_none(),
        "the row lock shows held"
    );
    Ok(())
}

/// Everything the client sends, per connection, through a recording TCP proxy.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<Stream>>>);

impl Recording {
    /// Every command the client sent: statement texts (`COM_QUERY`, `COM_STMT_PREPARE`) and
    /// the payloads of `COM_STMT_EXECUTE`, which carry the bound parameter values.
    fn commands(&self) -> (Vec<String>, Vec<Vec<u8>>) {
        let streams = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        let (mut texts, mut executes) = (Vec::new(), Vec::new());
        for stream in streams {
            let bytes = stream.lock().map(|b| b.clone()).unwrap_or_default();
            let mut at = 0;
            while at + 4 <= bytes.len() {
                let len = usize::from(bytes[at])
                    | usize::from(bytes[at + 1]) << 8
                    | usize::from(bytes[at + 2]) << 16;
                let seq = bytes[at + 3];
                let payload = &bytes[(at + 4).min(bytes.len())..(at + 4 + len).min(bytes.len())];
                if seq == 0 {
                    match payload.first() {
                        Some(0x03 | 0x16) => {
                            texts.push(String::from_utf8_lossy(&payload[1..]).into_owned());
                        }
                        Some(0x17) => executes.push(payload[1..].to_vec()),
                        _ => {}
                    }
                }
                at += 4 + len;
            }
        }
        (texts, executes)
    }
}

/// Current time in seconds, milliseconds, microseconds and nanoseconds, each with a day's
/// window around it.
fn now_windows() -> [(u128, u128); 4] {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let day = 86_400u128;
    [
        (now.as_secs().into(), day),
        (now.as_millis(), day * 1_000),
        (now.as_micros(), day * 1_000_000),
        (now.as_nanos(), day * 1_000_000_000),
    ]
}

/// Why the bound parameters of one `COM_STMT_EXECUTE` carry a time, if they do: any 4- or
/// 8-byte little-endian integer near the current time, or a date written as text.
fn client_time_in_parameters(payload: &[u8]) -> Option<String> {
    let near = now_windows();
    for width in [4usize, 8] {
        for window in payload.windows(width) {
            let mut value = 0u128;
            for (i, b) in window.iter().enumerate() {
                value |= u128::from(*b) << (8 * i);
            }
            if near.iter().any(|(t, w)| value.abs_diff(*t) <= *w) {
                return Some(format!(
                    "a bound {width}-byte integer {value}, a time near now"
                ));
            }
        }
    }
    date_literal(payload).then(|| "a date written as text".to_owned())
}

/// Whether `bytes` contain `dddd-dd-dd`.
fn date_literal(bytes: &[u8]) -> bool {
    bytes.windows(10).any(|w| {
        let d = |i: usize| w[i].is_ascii_digit();
        d(0) && d(1) && d(2) && d(3) && w[4] == b'-' && d(5) && d(6) && w[7] == b'-' && d(8) && d(9)
    })
}

async fn proxy(upstream: SocketAddr, recording: Recording) -> Result<SocketAddr, Failure> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let log = Arc::new(Mutex::new(Vec::new()));
            if let Ok(mut all) = recording.0.lock() {
                all.push(log.clone());
            }
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = client_rx.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut log) = log.lock() {
                        log.extend_from_slice(&buf[..n]);
                    }
                    if server_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = server_tx.shutdown().await;
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                let _ = client_tx.shutdown().await;
            });
        }
    });
    Ok(addr)
}

/// Whether `operand` (upper case, what follows `column =` or a comparison) is a time the
/// server computes: `NOW(6)`, `NOW(6) + INTERVAL <ttl> MICROSECOND` (spliced or bound),
/// `NULL`, the column itself, or an `IF(condition, a, b)` of such.
fn server_time(operand: &str, column: &str, ttls_us: &[u64]) -> bool {
    if let Some(rest) = operand.strip_prefix("IF(") {
        let args = top_level_args(rest);
        return args.len() == 3
            && server_time(args[1], column, ttls_us)
            && server_time(args[2], column, ttls_us);
    }
    // A lease handed to the next waiter lasts that waiter's turn: a duration it stored in
    // its place (`turn_us`), read into `@lm_turn` on the server.
    let with_ttl = operand.starts_with("NOW(6) + INTERVAL ? MICROSECOND")
        || operand.starts_with("NOW(6) + INTERVAL @LM_TURN MICROSECOND")
        || ttls_us
            .iter()
            .any(|us| operand.starts_with(&format!("NOW(6) + INTERVAL {us} MICROSECOND")));
    let plain_now = operand.starts_with("NOW(6)")
        && !operand.starts_with("NOW(6) +")
        && !operand.starts_with("NOW(6) -");
    let itself = operand.strip_prefix(column).is_some_and(|rest| {
        rest.trim_start().is_empty() || rest.trim_start().starts_with([',', ')'])
    });
    with_ttl || plain_now || itself || operand.starts_with("NULL")
}

/// The comma-separated arguments of a call whose opening parenthesis precedes `rest`.
fn top_level_args(rest: &str) -> Vec<&str> {
    let (mut depth, mut start, mut args) = (0usize, 0, Vec::new());
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                args.push(rest[start..i].trim());
                return args;
            }
            ')' => depth -= 1,
            ',' if depth == 0 => {
                args.push(rest[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    args
}

/// Why `sql` carries a time the client computed, if it does.
fn client_time_in(sql: &str, ttls_us: &[u64]) -> Option<String> {
    let upper = sql.to_ascii_uppercase();
    for function in [
        "CURRENT_TIMESTAMP",
        "SYSDATE",
        "UTC_TIMESTAMP",
        "FROM_UNIXTIME",
        "CURDATE",
        "CURTIME",
        "LOCALTIME",
        "TIMESTAMP =",
        "@@TIMESTAMP",
        "SET TIMESTAMP",
    ] {
        if upper.contains(function) {
            return Some(format!("uses {function}"));
        }
    }
    for (i, _) in upper.match_indices("UNIX_TIMESTAMP(") {
        if !upper[i..].starts_with("UNIX_TIMESTAMP(EXPIRES_AT)") {
            return Some("converts something other than the stored expiry to epoch time".into());
        }
    }
    // Every comparison or assignment of a time column is against NOW(6) or NULL.
    for column in ["EXPIRES_AT", "ACQUIRED_AT"] {
        for (i, _) in upper.match_indices(column) {
            let rest = upper[i + column.len()..].trim_start();
            let operand = ["<=", ">=", "=", "<", ">"]
                .iter()
                .find_map(|op| rest.strip_prefix(op))
                .map(str::trim_start);
            if let Some(operand) = operand
                && !server_time(operand, column, ttls_us)
            {
                return Some(format!("sets or compares {column} with {operand:.40}"));
            }
        }
    }
    // No date literal and no number near the current time in s, ms, µs or ns.
    if date_literal(sql.as_bytes()) {
        return Some("contains a date literal".into());
    }
    let near = now_windows();
    let mut in_hex = false;
    let mut number = String::new();
    let mut prev = ' ';
    for c in sql.chars().chain(std::iter::once(' ')) {
        if !in_hex && c == '\'' && prev == 'X' {
            in_hex = true;
        } else if in_hex && c == '\'' {
            in_hex = false;
        } else if !in_hex
            && c.is_ascii_digit()
            && (!number.is_empty() || !prev.is_ascii_alphanumeric())
        {
            number.push(c);
        } else {
            if let Ok(n) = number.parse::<u128>()
                && near.iter().any(|(t, window)| n.abs_diff(*t) <= *window)
            {
                return Some(format!("contains the number {n}, a time near now"));
            }
            number.clear();
        }
        prev = c;
    }
    None
}

/// Both strategies through a proxy that records what the client sends: acquisitions,
/// contention, renewals, extension, release and inspection. No statement carries a time the
/// client computed; every expiry is `NOW(6) + INTERVAL <ttl>` evaluated by the server, and
/// every expiry comparison is against the server's `NOW(6)`. So a client whose clock is
/// minutes off sends exactly the same statements as one whose clock is right, and cannot
/// cause a double grant. (This proves it from the traffic; `skewed_clients_never_double_grant`
/// runs clients whose clock is minutes off.)
async fn client_sends_no_time() -> Outcome {
    let mut url = url::Url::parse(&support::url().map_err(Failure)?).map_err(err)?;
    let upstream: SocketAddr = format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(3306)
    )
    .parse()
    .map_err(err)?;
    let recording = Recording::default();
    let addr = proxy(upstream, recording.clone()).await?;
    url.set_port(Some(addr.port()))
        .map_err(|()| Failure("cannot set the port".into()))?;
    url.query_pairs_mut().append_pair("ssl-mode", "disabled");
    let ttls = [Duration::from_millis(1500), Duration::from_secs(4)];
    let ttls_us: Vec<u64> = ttls.iter().map(|t| t.as_micros() as u64).collect();
    let mut acquisitions = 0;
    for strategy in [Strategy::Lease, Strategy::RowLock] {
        MySqlStore::new(strategy).await.map_err(Failure)?; // creates this run's table directly
        let config = support::config(strategy).map_err(Failure)?;
        let mut proxied = MySqlConfig::new(url.as_str())
            .strategy(strategy)
            .pool_size(2);
        proxied.table = config.table.clone();
        let (a, b) = (client(&proxied).await?, client(&proxied).await?);
        let name = name("clock")?;
        let options = LockOptions::new().ttl(ttls[0]);
        let held = a.lock_with(&name, &options).await.map_err(err)?;
        let waiter = spawn_acquire(&b, &name, options.clone().wait(Duration::from_secs(5)));
        tokio::time::sleep(ttls[0]).await; // the watchdog renews meanwhile
        held.extend(ttls[1]).await.map_err(err)?;
        b.inspect(&name).await.map_err(err)?;
        held.release().await.map_err(err)?;
        let next = waiter.await.map_err(err)?.map_err(err)?;
        next.release().await.map_err(err)?;
        acquisitions += 2;
    }
    let (statements, executes) = recording.commands();
    let granting = statements
        .iter()
        .filter(|s| s.contains("INTERVAL") || s.contains("FOR UPDATE"))
        .count();
    ensure!(
        granting >= 2 && executes.len() >= acquisitions,
        "captured {} statements ({granting} granting) and {} executions: the proxy saw too little",
        statements.len(),
        executes.len()
    );
    for sql in &statements {
        if let Some(why) = client_time_in(sql, &ttls_us) {
            return Err(Failure(format!(
                "the client sent a time of its own ({why}): {sql:.300}"
            )));
        }
    }
    for payload in &executes {
        if let Some(why) = client_time_in_parameters(payload) {
            return Err(Failure(format!(
                "the client bound a time of its own ({why})"
            )));
        }
    }
    // The parameters are really seen: the TTLs travel as bound microseconds.
    let bound_ttl = ttls_us.iter().any(|us| {
        let le = us.to_le_bytes();
        executes.iter().any(|p| p.windows(8).any(|w| w == le))
    });
    ensure!(
        bound_ttl,
        "no bound TTL seen in {} executions",
        executes.len()
    );
    // The checker itself catches a client-computed expiry.
    let bad = "UPDATE t SET expires_at = '2026-11-21 10:00:00.000000' WHERE name = X'61'";
    ensure!(
        client_time_in(bad, &ttls_us).is_some(),
        "the checker misses a date literal"
    );
    let epoch = format!(
        "UPDATE t SET expires_at = FROM_UNIXTIME({})",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    );
    ensure!(
        client_time_in(&epoch, &ttls_us).is_some(),
        "the checker misses an epoch time"
    );
    let shifted = "UPDATE t SET expires_at = NOW(6) + INTERVAL 999 MICROSECOND";
    ensure!(
        client_time_in(shifted, &ttls_us).is_some(),
        "the checker misses a foreign interval"
    );
    let bound_if = "UPDATE t SET expires_at = IF(token = ?, ?, expires_at) WHERE name = ?";
    ensure!(
        client_time_in(bound_if, &ttls_us).is_some(),
        "the checker misses a bound expiry inside IF()"
    );
    let mut bound = vec![0u8; 9];
    bound.extend_from_slice(&(now_windows()[2].0 as u64).to_le_bytes());
    ensure!(
        client_time_in_parameters(&bound).is_some(),
        "the checker misses a bound epoch in microseconds"
    );
    Ok(())
}

/// The library's source never reads the wall clock: times come from the server, and the
/// client keeps only monotonic instants for its own deadlines.
async fn source_never_reads_wall_clock() -> Outcome {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(err)?;
        read += 1;
        for clock in [
            "SystemTime::now",
            "Utc::now",
            "Local::now",
            "OffsetDateTime::now",
            "chrono::",
        ] {
            ensure!(!text.contains(clock), "{} uses {clock}", path.display());
        }
    }
    ensure!(
        read >= 5,
        "read only {read} source files in {}",
        dir.display()
    );
    Ok(())
}

/// Set in a child process of this binary (run under `faketime`): its role, `hold` or `try`.
const SKEWED_ROLE_VAR: &str = "LOCK_FAULTS_SKEWED_ROLE";
/// The lock name and lease table the child uses (its parent's).
const SKEWED_NAME_VAR: &str = "LOCK_FAULTS_SKEWED_NAME";
const SKEWED_TABLE_VAR: &str = "LOCK_FAULTS_SKEWED_TABLE";

/// Lease clients whose clock is 10 minutes off, in child processes of this binary run under
/// `faketime`: the child reports its wall clock, so the test proves the skew took effect.
mod skewed {
    use std::{
        io::Write as _,
        process::{ExitCode, Stdio},
        time::{Duration, Instant, SystemTime},
    };

    use conformance_tests::{Failure, Outcome, ensure};
    use lock_core::{LockClient, LockError, LockName, LockOptions};
    use lock_mysql::{MySqlBackend, MySqlConfig, Strategy, TableName};
    use tokio::{
        io::{AsyncBufReadExt, BufReader},
        process::{Child, ChildStdout, Command},
    };

    use super::{SKEWED_NAME_VAR, SKEWED_ROLE_VAR, SKEWED_TABLE_VAR, err, support};

    /// The lease TTL of every client here.
    const TTL: Duration = Duration::from_secs(2);
    /// How far off the children's clocks are.
    const SKEW_SECS: i64 = 600;

    fn options() -> LockOptions {
        LockOptions::new().ttl(TTL).wait(Duration::ZERO)
    }

    fn wall_secs() -> i64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    }

    /// The child: `hold` acquires (watchdog on), prints `HELD <fence> <pid> <wall clock>` and
    /// holds until its stdin closes; `try` tries once and prints `BUSY <wall clock>` or
    /// `GOT <fence> <wall clock>`.
    pub(super) fn child(role: &str) -> ExitCode {
        let result = conformance_tests::runtime().and_then(|runtime| {
            runtime.block_on(async {
                let name = std::env::var(SKEWED_NAME_VAR).map_err(|e| e.to_string())?;
                let table = std::env::var(SKEWED_TABLE_VAR).map_err(|e| e.to_string())?;
                let config = MySqlConfig::new(support::url()?)
                    .strategy(Strategy::Lease)
                    .with_table(TableName::new(table).map_err(|e| e.to_string())?);
                let backend = MySqlBackend::connect(&config)
                    .await
                    .map_err(|e| e.to_string())?;
                let client = LockClient::new(backend);
                let name = LockName::new(name).map_err(|e| e.to_string())?;
                let got = client
                    .try_lock_with(&name, &options())
                    .await
                    .map_err(|e| e.to_string())?;
                let mut out = std::io::stdout();
                let line = match (&got, role) {
                    (Some(guard), "hold") => format!(
                        "HELD {} {} {}",
                        guard.fence(),
                        std::process::id(),
                        wall_secs()
                    ),
                    (Some(guard), _) => format!("GOT {} {}", guard.fence(), wall_secs()),
                    (None, _) => format!("BUSY {}", wall_secs()),
                };
                writeln!(out, "{line}").map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
                if let Some(guard) = got {
                    if role == "hold" {
                        // Until the parent closes stdin (or kills this process).
                        let _ = tokio::task::spawn_blocking(|| {
                            std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())
                        })
                        .await;
                    }
                    guard.release().await.map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        });
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("skewed client: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// A child of this binary under `faketime` with its clock `skew_secs` off.
    struct Skewed {
        child: Child,
        lines: tokio::io::Lines<BufReader<ChildStdout>>,
    }

    impl Skewed {
        fn spawn(
            role: &str,
            skew_secs: i64,
            name: &LockName,
            table: &TableName,
        ) -> Result<Self, Failure> {
            let faketime = std::env::var("LOCK_TEST_FAKETIME").map_err(|_| {
                Failure("LOCK_TEST_FAKETIME is not set; run `cargo xtask test`".into())
            })?;
            let exe = std::env::current_exe().map_err(err)?;
            // Only the wall clock is off (the monotonic clock, which Instant and the timers
            // read, stays right, as on a real machine), in libfaketime's thread-safe variant.
            let mut child = Command::new(&faketime)
                .args(["-m", "--exclude-monotonic", "-f"])
                .arg(format!("{skew_secs:+}s"))
                .arg(exe)
                .env(SKEWED_ROLE_VAR, role)
                .env(SKEWED_NAME_VAR, name.as_str())
                .env(SKEWED_TABLE_VAR, table.as_str())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| Failure(format!("running {faketime}: {e}")))?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| Failure("no stdout from the child".into()))?;
            Ok(Self {
                child,
                lines: BufReader::new(stdout).lines(),
            })
        }

        /// The child's report, its words split; fails if its wall clock is not `skew_secs` off.
        async fn report(&mut self, skew_secs: i64) -> Result<Vec<String>, Failure> {
            let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
                .await
                .map_err(|_| Failure("the skewed client did not answer within 20 s".into()))?
                .map_err(err)?
                .ok_or_else(|| Failure("the skewed client exited without a report".into()))?;
            let words: Vec<String> = line.split_whitespace().map(String::from).collect();
            let clock: i64 = words
                .last()
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| Failure(format!("the skewed client said {line:?}")))?;
            let off = clock - wall_secs();
            ensure!(
                (off - skew_secs).abs() <= 30,
                "the child's clock is {off} s off, not {skew_secs} s: faketime did not take effect"
            );
            Ok(words)
        }

        async fn finish(mut self) -> Outcome {
            drop(self.child.stdin.take());
            let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
                .await
                .map_err(|_| Failure("the skewed client did not exit".into()))?
                .map_err(err)?;
            ensure!(status.success(), "the skewed client ended with {status}");
            Ok(())
        }
    }

    /// One try by a client `skew_secs` off: its first word (`BUSY` or `GOT`).
    async fn try_once(
        skew_secs: i64,
        name: &LockName,
        table: &TableName,
    ) -> Result<String, Failure> {
        let mut taker = Skewed::spawn("try", skew_secs, name, table)?;
        let words = taker.report(skew_secs).await?;
        taker.finish().await?;
        Ok(words.first().cloned().unwrap_or_default())
    }

    /// A holder 10 minutes behind keeps the lock from a client with a right clock past its
    /// TTL (the watchdog renews by the server's clock); a taker 10 minutes ahead finds it
    /// busy; killed, the skewed holder's lease ends after its TTL by the server's clock, not
    /// 10 minutes later; then a holder with a right clock is not taken from by a taker 10
    /// minutes ahead, which gets the lock once it is released.
    pub(super) async fn never_double_grant() -> Outcome {
        let store = support::MySqlStore::new(Strategy::Lease)
            .await
            .map_err(Failure)?;
        let table = store.config().table();
        let name = super::name("skewed")?;
        let client = super::client(store.config()).await?;

        let mut holder = Skewed::spawn("hold", -SKEW_SECS, &name, &table)?;
        let held = holder.report(-SKEW_SECS).await?;
        ensure!(
            held.first().map(String::as_str) == Some("HELD"),
            "the holder said {held:?}"
        );
        let pid: i32 = held
            .get(2)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| Failure(format!("no pid in {held:?}")))?;
        let held_fence: u64 = held
            .get(1)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| Failure(format!("no fence in {held:?}")))?;
        // Waiting out twice the TTL: the holder's lease is renewed, not expired.
        let waited = client.lock_with(&name, &options().wait(TTL * 2)).await;
        ensure!(
            matches!(waited, Err(LockError::Timeout { .. })),
            "a client with a right clock, waiting {:?}, got {waited:?} from a holder 10 minutes behind",
            TTL * 2
        );
        let taken = try_once(SKEW_SECS, &name, &table).await?;
        ensure!(taken == "BUSY", "a taker 10 minutes ahead said {taken}");

        // Killed without releasing: the lease ends TTL after its last renewal, by the server.
        let killed = Instant::now();
        let kill = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .map_err(err)?;
        ensure!(kill.success(), "kill -KILL {pid}: {kill}");
        let _ = holder.child.wait().await;
        let next = client
            .lock_with(&name, &options().wait(TTL * 3))
            .await
            .map_err(|e| Failure(format!("after the skewed holder was killed: {e}")))?;
        let after = killed.elapsed();
        ensure!(
            after <= TTL + Duration::from_secs(1),
            "the killed skewed holder's lease ended {after:?} after the kill (TTL {TTL:?})"
        );
        ensure!(
            next.fence().get() > held_fence,
            "fence {} after {held_fence}",
            next.fence()
        );

        let taken = try_once(SKEW_SECS, &name, &table).await?;
        ensure!(
            taken == "BUSY",
            "a taker 10 minutes ahead said {taken} while the lock was held"
        );
        next.release().await.map_err(err)?;
        let taken = try_once(SKEW_SECS, &name, &table).await?;
        ensure!(
            taken == "GOT",
            "a taker 10 minutes ahead said {taken} for a free lock"
        );
        Ok(())
    }
}
