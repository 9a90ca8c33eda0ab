//! The statement a row-lock hold keeps parked on its connection: a `KILL QUERY` that stops it
//! for a renewal must never leave the connection waiting for an answer, and the anchor it
//! waits on may die without the hold going unwatched.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::LockOptions;
use lock_mysql::{MySqlConfig, Strategy};
use sqlx::AssertSqlSafe;

use super::{
    acquired, admin_conn, client, spawn_acquire,
    support::{
        self, MySqlStore, hex,
        proxy::{Proxy, upstream},
    },
};

/// A renewal stops the hold's parked statement with `KILL QUERY`, just as the sleep ends by
/// itself when the watchdog renews on time (a 1.5 s TTL parks ~0.5 s and renews after
/// ~0.5 s). A kill landing between two statements of a batch makes MariaDB end the batch
/// without the rest of its answer, though its last answer said more would follow; the
/// client then waited for it until the server's idle limit (1 s in a lease's last second)
/// closed the connection, and the live holder lost its lock ("the session holding the lock
/// ended"; seen in CI). The proxy here plays that answer on every park; the hold must come
/// through two TTLs of renewals, an extension and the release.
pub(super) async fn killed_between_statements() -> Outcome {
    let url = support::url().map_err(Failure)?;
    let proxy = Proxy::cutting_parks(upstream(&url).map_err(Failure)?)
        .await
        .map_err(Failure)?;
    MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?; // creates this run's table
    let config = support::config(Strategy::RowLock).map_err(Failure)?;
    let mut proxied = MySqlConfig::new(proxy.url(&url).map_err(Failure)?)
        .strategy(Strategy::RowLock)
        .pool_size(2);
    proxied.table = config.table.clone();
    let holder = client(&proxied).await?;
    let name = unique_name("park-cut")?;
    let ttl = Duration::from_millis(1500);
    let held = holder
        .lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .map_err(err)?;
    let lost = tokio::time::timeout(ttl * 2, held.lost()).await;
    ensure!(
        lost.is_err(),
        "a live, renewing holder lost its lock: {:?}",
        lost.ok()
    );
    held.extend(ttl).await.map_err(err)?;
    ensure!(held.is_held(), "the hold ended after its extension");
    held.release().await.map_err(err)?;
    Ok(())
}

/// The anchor holds park on (a user lock on a connection of the client's own) is killed by an
/// operator while a hold is parked on it: the hold keeps its lock through two TTLs of
/// renewals, a new anchor (another name) comes up, and the hold is still watched: when its
/// own connection is killed, a waiter's grant finds the old holder's `is_held()` already
/// false.
pub(super) async fn anchor_killed() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (holder, waiter) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("anchor-killed")?;
    let ttl = Duration::from_millis(1500);
    let options = LockOptions::new().ttl(ttl);
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let id = holder_connection(&store, &name).await?;
    let first = parked_anchor(store.admin(), id, None).await?;
    kill_anchor(store.admin(), &first).await?;
    let lost = tokio::time::timeout(ttl * 2, held.lost()).await;
    ensure!(
        lost.is_err(),
        "the hold lost its lock when the anchor was killed: {:?}",
        lost.ok()
    );
    // A new anchor (another name) comes up, and the hold parks on it.
    parked_anchor(store.admin(), id, Some(&first)).await?;
    let next = spawn_acquire(
        &waiter,
        &name,
        options.clone().wait(Duration::from_secs(10)),
    );
    support::until_waiting(store.admin(), &name)
        .await
        .map_err(Failure)?;
    sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
        .execute(store.admin())
        .await
        .map_err(err)?;
    let next = acquired(next).await?;
    ensure!(
        !held.is_held(),
        "after the anchor was replaced, the old holder's is_held() was still true when the \
         next holder was granted"
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// The anchor's connection, which also runs the client's fence bumps and kills, is killed by
/// an operator while the client holds nothing (so no parked statement notices): the next
/// acquisition's bump finds it gone and runs again on the connection kept beside the pool, the
/// hold parks on a new anchor (another name), and its extension (a kill of its parked
/// statement) and release go through.
pub(super) async fn anchor_killed_while_idle() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let holder = client(store.config()).await?;
    let name = unique_name("anchor-killed-idle")?;
    let ttl = Duration::from_secs(3);
    let options = LockOptions::new().ttl(ttl).watchdog(false);
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let id = holder_connection(&store, &name).await?;
    let first = parked_anchor(store.admin(), id, None).await?;
    held.release().await.map_err(err)?;
    kill_anchor(store.admin(), &first).await?;
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let id = holder_connection(&store, &name).await?;
    parked_anchor(store.admin(), id, Some(&first)).await?;
    held.extend(ttl).await.map_err(err)?;
    ensure!(held.is_held(), "the hold ended after its extension");
    held.release().await.map_err(err)?;
    Ok(())
}

/// A fence bump on the anchor's connection whose answer does not come in time (its counter row
/// locked by another transaction past the statement bound) fails the acquisition, and its
/// connection is drained in the background, not closed: the anchor lives on, and once the row
/// is free the next hold parks on the same anchor. (Closing it would free the anchor's user
/// lock and send every parked hold of the client to `SLEEP`, the slow kills the anchor is
/// there to avoid.) Twice: once the row is freed while the late bump still waits (it then
/// commits), once the late bump ends in the server's lock-wait error (1205) first, which the
/// drain's first ping reads.
pub(super) async fn anchor_outlives_a_late_bump() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let mut config = store
        .config()
        .clone()
        .statement_timeout(Duration::from_millis(500));
    config.lock_wait_timeout = Duration::from_secs(1);
    let holder = client(&config).await?;
    let name = unique_name("anchor-late-bump")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .watchdog(false)
        .wait(Duration::ZERO);
    // Creates the counter row.
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let id = holder_connection(&store, &name).await?;
    let first = parked_anchor(store.admin(), id, None).await?;
    held.release().await.map_err(err)?;
    let fences = format!("`{}_fences`", store.config().table_name().as_str());
    let mut admin = admin_conn().await?;
    for ends_in_error in [false, true] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "START TRANSACTION; SELECT fence FROM {fences} WHERE name = X'{}' FOR UPDATE",
            hex(name.as_str())
        )))
        .execute(&mut admin)
        .await
        .map_err(err)?;
        let late = holder.lock_with(&name, &options).await;
        if ends_in_error {
            // The late bump waits out its session's lock-wait bound (1 s) and fails there.
            support::until_no_statement_mentioning(store.admin(), &fences, Duration::from_secs(5))
                .await
                .map_err(Failure)?;
        }
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut admin)
            .await
            .map_err(err)?;
        ensure!(
            late.is_err(),
            "an acquisition whose fence bump waited past its bound succeeded: {late:?}"
        );
        let held = holder.lock_with(&name, &options).await.map_err(err)?;
        let id = holder_connection(&store, &name).await?;
        let anchor = parked_anchor(store.admin(), id, None).await?;
        ensure!(
            anchor == first,
            "after a late bump (ending in an error: {ends_in_error}) the hold parks on the \
             anchor {anchor}, not on {first}"
        );
        held.release().await.map_err(err)?;
    }
    Ok(())
}

/// Kills the connection holding the anchor `name` (as an operator would).
async fn kill_anchor(admin: &sqlx::MySqlPool, name: &str) -> Outcome {
    let anchor_id: Option<u64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT CAST(IS_USED_LOCK('{name}') AS UNSIGNED)"
    )))
    .fetch_one(admin)
    .await
    .map_err(err)?;
    let anchor_id = anchor_id.ok_or_else(|| Failure(format!("nobody holds the anchor {name}")))?;
    sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {anchor_id}")))
        .execute(admin)
        .await
        .map_err(err)?;
    Ok(())
}

/// The connection id the holder of `name` recorded.
async fn holder_connection(store: &MySqlStore, name: &lock_core::LockName) -> Result<u64, Failure> {
    store
        .holder_connection(name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("the holder recorded no connection id".into()))
}

/// The anchor the hold on connection `id` is parked on now (other than `not`), read from its
/// parked statement on the server; waits for one up to 10 s.
async fn parked_anchor(
    admin: &sqlx::MySqlPool,
    id: u64,
    not: Option<&str>,
) -> Result<String, Failure> {
    const MARK: &str = "GET_LOCK('lock-mysql/park/";
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let infos: Vec<String> = sqlx::query_scalar(
            "SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO IS NOT NULL",
        )
        .bind(id)
        .fetch_all(admin)
        .await
        .map_err(err)?;
        let found = infos.iter().find_map(|info| {
            let start = info.find(MARK)? + "GET_LOCK('".len();
            let end = start + info[start..].find('\'')?;
            Some(info[start..end].to_owned())
        });
        match found {
            Some(name) if Some(name.as_str()) != not => return Ok(name),
            _ if tokio::time::Instant::now() >= until => {
                return Err(Failure(format!(
                    "connection {id} parked on no anchor (other than {not:?}) within 10 s"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
