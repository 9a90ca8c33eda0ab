//! The lease's waiters' queue: a waiter that died first in line stalls the lease only for its
//! turn, a released holder's own place stops no one, and places locked behind the first
//! waiter do not hold it up.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::{
    LockBackend, LockClient, LockGuard, LockName, LockOptions, backend::AcquireRequest,
};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy};
use sqlx::AssertSqlSafe;

use super::{
    client, spawn_acquire,
    support::{
        self, MySqlStore, hex,
        proxy::{Proxy, Recording, upstream},
    },
    until_waiting,
};

/// The queue's cases, added to `cases`.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("lease/a_dead_waiter_stalls_the_lease_briefly", || {
            Box::pin(lease_dead_waiter())
        })
        .case("lease/forced_release_cuts_a_dead_waiters_place", || {
            Box::pin(lease_forced_release_cuts_a_dead_waiters_place())
        })
        .case("lease/own_place_blocks_nobody_after_release", || {
            Box::pin(lease_own_place_after_release())
        })
        .case("lease/a_new_row_is_granted_in_one_statement", || {
            Box::pin(lease_new_row_in_one_statement())
        })
        .case("lease/own_place_blocks_nobody_after_expiry", || {
            Box::pin(lease_own_place_after_expiry())
        })
        .case("lease/a_locked_head_stalls_no_newcomer", || {
            Box::pin(lease_locked_head_stalls_no_newcomer())
        })
        .case("lease/a_locked_place_behind_stalls_no_waiter", || {
            Box::pin(lease_locked_place_behind())
        })
        .case(
            "lease/a_lapsing_place_ahead_stalls_only_until_it_lapses",
            || Box::pin(lease_lapsing_place_ahead()),
        )
}

/// A waiter that died while first in line (a place planted for a minute, with a turn of
/// 300 ms) gets the lease handed to it at the release, and stalls the next waiter only for
/// its turn: the next waiter is served after the turn, not before (the order held) and not
/// much after (at most one park of the next waiter more).
pub(super) async fn lease_dead_waiter() -> Outcome {
    const TURN: Duration = Duration::from_millis(300);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("dead-waiter")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    plant_place(&store, &name, "0123456789abcdef0123456789abcdef", TURN).await?;
    let waiter = spawn_acquire(&b, &name, long.clone().wait(Duration::from_secs(10)));
    until_waiting(&store, &name).await?;
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

/// An operator's forced release hands the lease to a dead waiter (a place planted with a turn
/// of 300 ms) from a process that ends right after (`lockctl release --force` does: its
/// runtime ends with its command): the dead waiter's place must be cut to its turn by then,
/// or it stalls the lock for the place's life rather than the turn. (6fe9500 moved the cut to
/// a batch run in the background after the wake-up: lost with the runtime, the place kept
/// its minute. That split is undone; the release batch cuts the place again.)
pub(super) async fn lease_forced_release_cuts_a_dead_waiters_place() -> Outcome {
    const TURN: Duration = Duration::from_millis(300);
    const DEAD: &str = "0123456789abcdef0123456789abcdef";
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let holder = client(store.config()).await?;
    let name = unique_name("forced-dead-waiter")?;
    let held = holder
        .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .map_err(err)?;
    plant_place(&store, &name, DEAD, TURN).await?;
    let (config, forced_name) = (store.config().clone(), name.clone());
    // The operator's process: a runtime of its own that ends with the command.
    let forced = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)?;
        runtime.block_on(async {
            let admin = MySqlBackend::connect(&config).await.map_err(err)?;
            lock_core::LockAdmin::force_release(&admin, &forced_name)
                .await
                .map_err(err)
        })
    })
    .join()
    .map_err(|_| Failure("the operator's thread panicked".into()))??;
    ensure!(forced.is_some(), "the forced release found nothing held");
    let left: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), until_at) FROM `{}_queue` \
         WHERE name = ? AND token = '{DEAD}'",
        store.config().table_name().as_str()
    )))
    .bind(name.as_str().as_bytes())
    .fetch_optional(store.admin())
    .await
    .map_err(err)?;
    ensure!(
        left.is_some_and(|us| us <= TURN.as_micros() as i64),
        "after a forced release handed the lease to a dead waiter, its place was not cut to its turn of {TURN:?}: {left:?} µs left"
    );
    drop(held);
    Ok(())
}

/// Plants a place in `name`'s waiters' queue for `token`, arrived a second ago and kept for a
/// minute, with a turn of `turn` (over a place `token` may still have: a holder that queued
/// before its grant takes its place out in the background).
pub(super) async fn plant_place(
    store: &MySqlStore,
    name: &LockName,
    token: &str,
    turn: Duration,
) -> Outcome {
    plant_place_for(store, name, token, turn, Duration::from_secs(60)).await
}

/// Makes the released lease row of `name` one freed while someone queued (`acquired_at`
/// kept, as a waiter that leaves frees a lease handed to it), where a row released while
/// nobody queued goes to whoever comes first (see `lease::acquire`): then the places planted
/// ahead of a newcomer count.
pub(super) async fn freed_while_queued(store: &MySqlStore, name: &LockName) -> Outcome {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE `{}` SET acquired_at = NOW(6) WHERE name = ? AND token IS NULL",
        store.config().table_name().as_str()
    )))
    .bind(name.as_str().as_bytes())
    .execute(store.admin())
    .await
    .map_err(|e| Failure(format!("marking the lease freed while someone queued: {e}")))?;
    Ok(())
}

/// [`plant_place`], the place kept for `lasts`.
async fn plant_place_for(
    store: &MySqlStore,
    name: &LockName,
    token: &str,
    turn: Duration,
    lasts: Duration,
) -> Outcome {
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
    let plant = format!(
        "INSERT INTO {queue} (name, token, arrived_at, until_at, turn_us) \
         VALUES (X'{}', '{token}', NOW(6) - INTERVAL 1 SECOND, NOW(6) + INTERVAL {lasts} MICROSECOND, {turn}) \
         ON DUPLICATE KEY UPDATE arrived_at = VALUES(arrived_at), until_at = VALUES(until_at), \
         turn_us = VALUES(turn_us)",
        hex(name.as_str()),
        turn = turn.as_micros(),
        lasts = lasts.as_micros()
    );
    sqlx::raw_sql(AssertSqlSafe(plant))
        .execute(store.admin())
        .await
        .map_err(|e| Failure(format!("planting a place: {e}")))?;
    Ok(())
}

/// A foreign transaction, on the administrator's pool, that keeps locked the rows its
/// statements (each a `SELECT ... FOR UPDATE`, run in turn) lock, until
/// [`ForeignLocks::rollback`]: a refresh or a renewal in flight, held for longer.
pub(super) struct ForeignLocks(sqlx::pool::PoolConnection<sqlx::MySql>);

impl ForeignLocks {
    /// Starts the transaction and runs `locks`; `what` names the rows in an error.
    pub(super) async fn take(
        store: &MySqlStore,
        what: &str,
        locks: &[String],
    ) -> Result<Self, Failure> {
        let mut conn = store.admin().acquire().await.map_err(err)?;
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        for lock in locks {
            sqlx::raw_sql(AssertSqlSafe(lock.clone()))
                .execute(&mut *conn)
                .await
                .map_err(|e| Failure(format!("locking {what}: {e}")))?;
        }
        Ok(Self(conn))
    }

    /// Starts the transaction and locks the lease row of `name` (`FOR UPDATE`).
    pub(super) async fn lease_row(store: &MySqlStore, name: &LockName) -> Result<Self, Failure> {
        let table = format!("`{}`", store.config().table_name().as_str());
        Self::take(
            store,
            "the lease row",
            &[format!(
                "SELECT token FROM {table} WHERE name = X'{}' FOR UPDATE",
                hex(name.as_str())
            )],
        )
        .await
    }

    /// Ends the transaction, and with it the locks.
    pub(super) async fn rollback(mut self) -> Outcome {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *self.0)
            .await
            .map_err(err)?;
        Ok(())
    }
}

/// A thousand waiters refresh their places all the time; a try must not lock places it does
/// not need. Here a foreign transaction keeps the places of two waiters *behind* the first
/// one locked (as a refresh in flight would, for longer) when the lease expires (a holder that
/// died: a lease row planted for 500 ms): the first waiter's try reads the queue only up to
/// its own place, so it takes the lease soon after. (Before, the acquire statement's queue
/// condition read, and locked, every place of the name, and waited for that lock past the
/// waiter's budget.)
pub(super) async fn lease_locked_place_behind() -> Outcome {
    const LEFT: Duration = Duration::from_millis(500);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let b = client(store.config()).await?;
    let name = unique_name("locked-place")?;
    let table = format!("`{}`", store.config().table_name().as_str());
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
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
    until_waiting(&store, &name).await?;
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
    let locks = behind.map(|token| {
        format!("SELECT token FROM {queue} WHERE name = X'{n}' AND token = '{token}' FOR UPDATE")
    });
    let foreign = ForeignLocks::take(&store, "a place behind", &locks).await?;
    let next = waiter.await.map_err(err)?;
    let waited = planted.elapsed();
    foreign.rollback().await?;
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

/// Every waiter's try reads the head of the queue; none may lock the head's place while it is
/// live (a thousand waiters locking one row in turn, each for a durable commit, collapsed the
/// lease: 1,000 clients took no lock in 3 s, 860 sessions waited on the head's row, and the
/// server, at 193 % CPU, took minutes to get through them). Here a foreign
/// transaction keeps the live head's place locked (as a refresh in flight would, for longer)
/// while a newcomer queues behind a held lease: its place must be written at once. (Before,
/// the try's "delete the head if it lapsed" locked the head's row whether it lapsed or not,
/// and the newcomer waited for the foreign lock.)
pub(super) async fn lease_locked_head_stalls_no_newcomer() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("locked-head")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    let head = "0123456789abcdef0123456789abcdef";
    plant_place(&store, &name, head, Duration::from_millis(300)).await?;
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
    let n = hex(name.as_str());
    let foreign = ForeignLocks::take(
        &store,
        "the head's place",
        &[format!(
            "SELECT token FROM {queue} WHERE name = X'{n}' AND token = '{head}' FOR UPDATE"
        )],
    )
    .await?;
    let waiter = spawn_acquire(&b, &name, long.clone().wait(Duration::from_secs(10)));
    let started = Instant::now();
    let mut places = 0;
    while started.elapsed() < Duration::from_millis(500) && places < 2 {
        places = sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {queue} WHERE name = X'{n}'"
        )))
        .fetch_one(store.admin())
        .await
        .map_err(err)?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    foreign.rollback().await?;
    waiter.abort();
    held.release().await.map_err(err)?;
    ensure!(
        places == 2,
        "a newcomer had no place 500 ms after it came while the live head's place was locked: its try waited for the head's row"
    );
    Ok(())
}

/// A holder that queued before its grant takes its place out in the background; its release
/// may land first. The place must then stop no one: after the release a newcomer's single
/// try gets the lease (the holder's own place is planted, as if its removal were late; the
/// released lease is marked freed while someone queued, so that the newcomer's try reads the
/// queue: a lease released while nobody queued is taken without reading it).
pub(super) async fn lease_own_place_after_release() -> Outcome {
    let own = OwnPlace::new("own-place").await?;
    own.held.release().await.map_err(err)?;
    // So that the newcomer's try is one that reads the queue.
    freed_while_queued(&own.store, &own.name).await?;
    let next = own
        .next
        .try_lock_with(&own.name, &own.options)
        .await
        .map_err(err)?;
    ensure!(
        next.is_some(),
        "after its holder released it, a single try found the lease busy: the released holder's own place in the queue stood in the way"
    );
    if let Some(next) = next {
        next.release().await.map_err(err)?;
    }
    Ok(())
}

/// A holder whose own place is in the queue (planted, as if its removal in the background
/// were late), and another client.
struct OwnPlace {
    store: MySqlStore,
    /// The other client.
    next: LockClient,
    name: LockName,
    options: LockOptions,
    held: LockGuard,
}

impl OwnPlace {
    /// A lease of 30 s on a new name tagged `tag`, taken over from a released row (in one
    /// statement, with no place of its own whose removal could race the planted one).
    async fn new(tag: &str) -> Result<Self, Failure> {
        let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
        let (a, next) = (client(store.config()).await?, client(store.config()).await?);
        let name = unique_name(tag)?;
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        a.lock_with(&name, &options)
            .await
            .map_err(err)?
            .release()
            .await
            .map_err(err)?;
        let held = a.lock_with(&name, &options).await.map_err(err)?;
        let token = held.lease().token().as_str().to_owned();
        plant_place(&store, &name, &token, Duration::from_millis(300)).await?;
        Ok(Self {
            store,
            next,
            name,
            options,
            held,
        })
    }
}

/// A grant of a lock whose row does not exist yet takes one statement: the insert's reply says
/// it took the row; so does the grant of a lease released while nobody queued, with a
/// statement that does not read the queue. Before, the reply carried nothing for a new row,
/// and the grant was judged by a queue batch (a second round trip) that took a place in the
/// waiters' queue, removed in the background after the grant (a third); a removal that came
/// after the lease was over left the place in the next acquirer's way
/// (`lease/own_place_blocks_nobody_after_expiry`).
/// The commands the client sends for the grant are read off a recording proxy.
pub(super) async fn lease_new_row_in_one_statement() -> Outcome {
    let url = support::url().map_err(Failure)?;
    let recording = Recording::default();
    let proxy = Proxy::recording(upstream(&url).map_err(Failure)?, &recording)
        .await
        .map_err(Failure)?;
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let mut config = MySqlConfig::new(proxy.url(&url).map_err(Failure)?)
        .strategy(Strategy::Lease)
        .pool_size(1); // few connections (one pooled, one kept): the recording is small
    config.table = store.config().table.clone();
    let backend = MySqlBackend::connect(&config).await.map_err(err)?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::ZERO);
    // Warm up: the pool's connection is made and set up.
    backend
        .inspect(&unique_name("new-row-warm-up")?)
        .await
        .map_err(err)?;
    let before = recording.commands().0.len();
    let name = unique_name("new-row")?;
    let request = AcquireRequest::new(name.clone(), &options).map_err(err)?;
    let grant = backend.acquire(&request).await.map_err(err)?;
    let sent: Vec<String> = recording.commands().0.split_off(before);
    ensure!(
        grant.lease.fence().get() == 1,
        "the first grant of `{name}` has fence {}, expected 1",
        grant.lease.fence()
    );
    ensure!(
        sent.len() == 1,
        "the grant of a new row sent {} statements (expected 1, the acquire): {sent:?}",
        sent.len()
    );
    // A lease released while nobody queued: the next grant is one statement too, and one
    // that does not read the waiters' queue (a second table costs the server about twice
    // as much).
    backend.release(&grant.lease).await.map_err(err)?;
    let before = recording.commands().0.len();
    let again = backend.acquire(&request).await.map_err(err)?;
    let sent: Vec<String> = recording.commands().0.split_off(before);
    ensure!(
        again.lease.fence().get() == 2,
        "the grant after the release has fence {}, expected 2",
        again.lease.fence()
    );
    ensure!(
        sent.len() == 1 && !sent.iter().any(|s| s.contains("_queue")),
        "the grant of a lease released while nobody queued sent {} statements (expected 1, \
         not reading the waiters' queue): {sent:?}",
        sent.len()
    );
    backend.release(&again.lease).await.map_err(err)?;
    Ok(())
}

/// The same after the holder's lease ran out (by the server clock, set by hand): a newcomer's
/// single try takes the expired lease though the holder's own place is still in the queue
/// (planted, as if its removal in the background were late: a holder that queued and got the
/// lease, then died or was paused before the removal ran). Before, the place counted as a
/// waiter ahead of the newcomer: busy for up to the place's life (seen in `outcomes` as an
/// expired lease that a single try found held, 9 times in 120 runs under load, when the
/// removal of a new row's place came after the expiry).
pub(super) async fn lease_own_place_after_expiry() -> Outcome {
    let own = OwnPlace::new("own-place-expired").await?;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE `{}` SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE name = ?",
        own.store.config().table_name().as_str()
    )))
    .bind(own.name.as_str().as_bytes())
    .execute(own.store.admin())
    .await
    .map_err(|e| Failure(format!("expiring the lease: {e}")))?;
    let next = own
        .next
        .try_lock_with(&own.name, &own.options)
        .await
        .map_err(err)?;
    ensure!(
        next.as_ref()
            .is_some_and(|next| next.fence() > own.held.fence()),
        "after its holder's lease ran out, a single try found the lease busy: the holder's own place in the queue stood in the way"
    );
    if let Some(next) = next {
        next.release().await.map_err(err)?;
    }
    Ok(())
}

/// A place that lapses (its waiter died, or left while its place was being written) stops
/// others only until it lapses. Here a free lease has a place ahead of the newcomer that
/// lapses 1.3 s later: the newcomer, whose budget is 1.5 s, must take the lease then. (Before,
/// its park slept a whole second whatever lapsed meanwhile, its next try still found the
/// place, and its next park ran past its budget: "stayed taken 1.50 s after a dropped
/// acquire", seen 3 times in 15 runs of `cancel/dropped_acquire_leaves_nothing`.)
pub(super) async fn lease_lapsing_place_ahead() -> Outcome {
    const LAPSES: Duration = Duration::from_millis(1300);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (a, c) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("lapsing-place")?;
    let options = LockOptions::new().ttl(Duration::from_secs(1));
    // A lease row freed while someone queued (without one, the newcomer's insert would take
    // the lock whatever the queue says; so would its first try of a lease released while
    // nobody queued).
    a.lock_with(&name, &options)
        .await
        .map_err(err)?
        .release()
        .await
        .map_err(err)?;
    freed_while_queued(&store, &name).await?;
    let planted = Instant::now();
    plant_place_for(
        &store,
        &name,
        "0123456789abcdef0123456789abcdef",
        LAPSES,
        LAPSES,
    )
    .await?;
    let budget = Duration::from_millis(1500);
    let next = c
        .lock_with(&name, &options.clone().wait(budget))
        .await
        .map_err(|e| {
            Failure(format!(
                "a place that lapsed {LAPSES:?} after it was planted kept the free lease from a waiter with a budget of {budget:?}: {e}"
            ))
        })?;
    let took = planted.elapsed();
    let bound = LAPSES + Duration::from_millis(150);
    ensure!(
        took <= bound,
        "the waiter got the lease {took:?} after a place ahead that lapsed at {LAPSES:?} was planted (bound {bound:?})"
    );
    next.release().await.map_err(err)?;
    Ok(())
}
