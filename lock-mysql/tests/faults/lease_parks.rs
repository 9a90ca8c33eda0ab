//! The lease's parked waiters: a waiter whose park ran its whole length parks again at once,
//! without trying for the lease and queueing again, and still wakes when the holder's lease
//! runs out.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::LockOptions;
use lock_mysql::{MySqlConfig, Strategy};
use sqlx::AssertSqlSafe;

use super::{
    client, spawn_acquire,
    support::{
        self, MySqlStore, admin, hex,
        proxy::{Proxy, Recording, upstream},
    },
    until_waiting,
};

/// What a waiter's statements are, told apart by their text.
const PARK: &str = "lock-mysql park";
const QUEUE_BATCH: &str = "'ahead'";

/// A waiter behind a holder of 30 s whose parks run their whole second parks again on the
/// same connection, its place kept alive by the park's own batch: between its first park and
/// the release it sends no try and no queue batch. (Before, every park was followed by a try
/// and a queue batch: a dozen statements per waiter per second, and with a thousand waiters
/// the server answered none in time: 0 acquisitions in 3 s.)
pub(super) async fn lease_parked_waiter_parks_again() -> Outcome {
    const PARKS: usize = 3;
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let url = support::url().map_err(Failure)?;
    let recording = Recording::default();
    let proxy = Proxy::recording(upstream(&url).map_err(Failure)?, &recording)
        .await
        .map_err(Failure)?;
    let mut proxied = MySqlConfig::new(&proxy.url(&url).map_err(Failure)?)
        .strategy(Strategy::Lease)
        .pool_size(2);
    proxied.table = store.config().table.clone();
    let (holder, waiter) = (client(store.config()).await?, client(&proxied).await?);
    let name = unique_name("parks-again")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let waiting = spawn_acquire(&waiter, &name, long.clone().wait(Duration::from_secs(20)));
    until_waiting(&store, &name).await?;
    // Until the waiter has sent its third park (each lasts up to a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    let count = |texts: &[String], what: &str| texts.iter().filter(|t| t.contains(what)).count();
    loop {
        let (texts, _) = recording.commands();
        if count(&texts, PARK) >= PARKS {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the waiter sent {} parks in 10 s",
            count(&texts, PARK)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (texts, _) = recording.commands();
    held.release().await.map_err(err)?;
    let next = waiting.await.map_err(err)?.map_err(err)?;
    let (parks, batches) = (count(&texts, PARK), count(&texts, QUEUE_BATCH));
    ensure!(
        batches == 1,
        "a waiter that parked {parks} times behind one hold queued {batches} times (once expected: a park that ran its length parks again)"
    );
    ensure!(
        next.fence().get() > 1,
        "the waiter's fence {} is not above the holder's",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// A waiter parked behind a holder that died (a lease row planted for 2.5 s) parks again
/// after its first whole park, and that park ends when the lease runs out: the waiter takes
/// the lock soon after the expiry, not a park later.
pub(super) async fn lease_parked_waiter_wakes_at_expiry() -> Outcome {
    const LEFT: Duration = Duration::from_millis(2500);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let waiter = client(store.config()).await?;
    let name = unique_name("parks-to-expiry")?;
    let table = format!("`{}`", store.config().table_name().as_str());
    let planted = Instant::now();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {table} (name, token, fence, expires_at, acquired_at) \
         VALUES (X'{}', 'abcdefabcdefabcdefabcdefabcdefab', 1, NOW(6) + INTERVAL {} MICROSECOND, NOW(6))",
        hex(name.as_str()),
        LEFT.as_micros()
    )))
    .execute(store.admin())
    .await
    .map_err(|e| Failure(format!("planting a lease: {e}")))?;
    let next = waiter
        .lock_with(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(10)),
        )
        .await
        .map_err(err)?;
    let waited = planted.elapsed();
    let bound = LEFT + Duration::from_millis(300);
    ensure!(
        waited >= LEFT && waited <= bound,
        "the waiter took a lease planted for {LEFT:?} (its holder dead) {waited:?} after (bound {bound:?})"
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// A parked waiter leaves the lease row's lock alone while the holder holds: a foreign
/// transaction keeps the lease row locked (as a renewal in flight would, for longer) across
/// more than one whole park of the waiter, and no statement of the waiter waits for that
/// lock. A thousand parked waiters must not queue on the one row every acquisition and
/// release writes. (Before, each whole park was followed by a try, whose statement waits for
/// the row; and a park reading the lease with `SET @v = (SELECT ...)`, which MariaDB runs as
/// a locking read, waited too.)
pub(super) async fn lease_parked_waiter_leaves_the_lease_row_alone() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (holder, waiter) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("parks-lock-nothing")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let waiting = spawn_acquire(&waiter, &name, long.clone().wait(Duration::from_secs(20)));
    until_waiting(&store, &name).await?;
    let table = format!("`{}`", store.config().table_name().as_str());
    let n = hex(name.as_str());
    let mut foreign = store.admin().acquire().await.map_err(err)?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; SELECT token FROM {table} WHERE name = X'{n}' FOR UPDATE"
    )))
    .execute(&mut *foreign)
    .await
    .map_err(|e| Failure(format!("locking the lease row: {e}")))?;
    // Longer than a park (a second): the waiter's next park, or try, comes meanwhile.
    let watched = Instant::now();
    let mut waited_for_the_row = None;
    while watched.elapsed() < Duration::from_millis(1600) && waited_for_the_row.is_none() {
        // Lock waits are seen by a user with the PROCESS privilege: root. A lock requested
        // and waited for on this run's lease table (named after the test process).
        let sql = format!(
            "SELECT CONCAT(l.lock_mode, ' ', l.lock_index, ': ', LEFT(COALESCE(t.trx_query, ''), 100)) \
             FROM information_schema.INNODB_LOCK_WAITS w \
             JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id \
             JOIN information_schema.INNODB_TRX t ON t.trx_id = w.requesting_trx_id \
             WHERE l.lock_table LIKE '%`{}`' LIMIT 1",
            store.config().table_name().as_str()
        );
        let seen = tokio::task::spawn_blocking(move || admin::root_sql(&sql))
            .await
            .map_err(err)?
            .map_err(Failure)?;
        waited_for_the_row = Some(seen).filter(|query| !query.is_empty());
        // InnoDB refreshes what these tables show only when they were not read for 100 ms.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *foreign)
        .await
        .map_err(err)?;
    drop(foreign);
    held.release().await.map_err(err)?;
    let next = waiting.await.map_err(err)?.map_err(err)?;
    next.release().await.map_err(err)?;
    if let Some(query) = waited_for_the_row {
        return Err(Failure(format!(
            "a parked waiter waited for the lease row's lock while the holder held: {query}"
        )));
    }
    Ok(())
}
