//! The lone release: a lease taken without waiting is given back by one statement that frees
//! it only while nobody queues (`release_alone`), and wakes nobody. A waiter that queued and
//! parked while that statement was on its way must still get the lease within a short park.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{err, poll_every, unique_name},
};
use lock_core::{LockError, LockOptions};
use lock_mysql::Strategy;
use sqlx::{AssertSqlSafe, MySqlConnection};

use super::{
    acquired, admin_conn, client, spawn_acquire,
    support::{
        self, MySqlStore, hex,
        proxy::{Needle, Proxy, upstream},
    },
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case(
            "lease/a_lone_release_wakes_a_waiter_parked_before_its_commit",
            || Box::pin(lone_release_wakes_a_waiter_parked_before_its_commit()),
        )
        .case("lease/a_lone_release_whose_answer_is_lost_says_so", || {
            Box::pin(lone_release_whose_answer_is_lost())
        })
}

/// A lone release that the server ran, but whose answer was lost with its connection, says so (an
/// error), not that the lease was lost or not held: it was held, and is free now. The client waited
/// once first, so that its anchor is up and the release runs on the anchor's connection; a proxy
/// resets that connection just after passing the release on. Running the statement again elsewhere
/// then found nothing to release, and the release said `Lost` (`NotHeld`).
async fn lone_release_whose_answer_is_lost() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let url = support::url().map_err(Failure)?;
    let needle = Needle::default();
    let proxy = Proxy::cutting_after(upstream(&url).map_err(Failure)?, &needle)
        .await
        .map_err(Failure)?;
    let mut proxied = store.config().clone();
    proxied.url = proxy.url(&store.config().url).map_err(Failure)?;
    let (a, b) = (client(&proxied).await?, client(store.config()).await?);
    let (waited_name, alone_name) = (
        unique_name("lost-answer-waited")?,
        unique_name("lost-answer-alone")?,
    );
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .watchdog(false);
    // A wait that parks raises the anchor.
    let other = b.lock_with(&waited_name, &options).await.map_err(err)?;
    let waiter = spawn_acquire(
        &a,
        &waited_name,
        options.clone().wait(Duration::from_secs(20)),
    );
    until_parked_on_an_anchor(&store, &waited_name).await?;
    other.release().await.map_err(err)?;
    let granted = acquired(waiter).await?;
    granted.release().await.map_err(err)?;
    let held = a.lock_with(&alone_name, &options).await.map_err(err)?;
    needle.arm(held.lease().token().as_str().as_bytes());
    let released = held.release().await;
    ensure!(!needle.armed(), "the release never reached the proxy");
    ensure!(
        !matches!(released, Ok(()) | Err(LockError::Lost { .. })),
        "a release whose answer was lost said {released:?}"
    );
    // It was released: another client takes it at once.
    let next = b
        .lock_with(&alone_name, &options.clone().wait(Duration::ZERO))
        .await
        .map_err(|e| Failure(format!("the lock after the lost answer: {e}")))?;
    next.release().await.map_err(err)?;
    Ok(())
}

/// Until a lease waiter of `name` parks on an anchor (its park names the lock, then waits in
/// `GET_LOCK('lock-mysql/park/..')`), up to 5 s (its first park may be in `SLEEP`, while the
/// anchor is raised).
async fn until_parked_on_an_anchor(store: &MySqlStore, name: &lock_core::LockName) -> Outcome {
    let parked = format!("{}%GET_LOCK('lock-mysql/park/", hex(name.as_str()));
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(5),
        "a park on the anchor",
        async || {
            Ok(support::statements_mentioning(store.admin(), &parked)
                .await
                .map_err(Failure)?
                > 0)
        },
    )
    .await
}

/// How soon after the release answered the waiter must hold the lock: well under a park
/// (a second), which is how long the waiter slept before.
const BOUND: Duration = Duration::from_millis(400);

/// A release that freed the lease after it had read an empty queue, but committed only after
/// a waiter's place was, and after that waiter parked on seeing the lease still held, woke
/// nobody: the waiter slept its park out (a second) with the lease free.
///
/// The case plays that order with InnoDB's own locks, taken by two transactions of its own at
/// `REPEATABLE READ`: one locks the gap of the queue where the waiter's place goes, so the
/// waiter, past its try, waits to write its place; the other locks the `NULL` entries of an
/// index on `token` that the case adds to its table, so the release, which sets the token to
/// `NULL`, waits to write that index after its `WHERE` (which read the queue, empty) and
/// before its commit, with the lease row locked. Then the first ends: the waiter writes its
/// place and parks; then the second: the release commits.
/// The waiter must hold the lock within [`BOUND`] of the release's answer. (The second
/// transaction locks every `NULL` token of this run's table, which the other cases share:
/// the cases of this binary run one at a time.) Before the fix the
/// waiter took it 1.0 s after, in 3 runs of 3; with it, 17 to 19 ms after in 6 runs (its
/// park found the lease row being written and lasted at most 20 ms).
async fn lone_release_wakes_a_waiter_parked_before_its_commit() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let table = store.config().table_name().as_str().to_owned();
    let mut places = admin_conn().await?;
    let mut tokens = admin_conn().await?;
    run(
        &mut tokens,
        &format!("ALTER TABLE `{table}` ADD KEY IF NOT EXISTS lone_release_pause (token)"),
    )
    .await?;
    let outcome = played(&store, &table, (&mut places, &mut tokens)).await;
    // Whatever happened, later cases on this table must run unhindered.
    let ended = run(&mut places, "ROLLBACK")
        .await
        .and(run(&mut tokens, "ROLLBACK").await);
    let dropped = run(
        &mut tokens,
        &format!("ALTER TABLE `{table}` DROP KEY IF EXISTS lone_release_pause"),
    )
    .await;
    outcome.and(ended).and(dropped)
}

/// The case, once the table has its index on `token`: `places` and `tokens` are the two
/// connections whose transactions hold the waiter and the release back.
async fn played(
    store: &MySqlStore,
    table: &str,
    (places, tokens): (&mut MySqlConnection, &mut MySqlConnection),
) -> Outcome {
    let holder = client(store.config()).await?;
    let waiter = client(store.config()).await?;
    let name = unique_name("lone-release")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    // Taken without waiting: its release is the lone one.
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let locking = "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION";
    run(
        places,
        &format!(
            "{locking}; SELECT COUNT(*) FROM `{table}_queue` WHERE name = X'{}' FOR UPDATE",
            hex(name.as_str())
        ),
    )
    .await?;
    run(
        tokens,
        &format!(
            "{locking}; SELECT COUNT(*) FROM `{table}` FORCE INDEX (lone_release_pause) \
             WHERE token IS NULL FOR UPDATE"
        ),
    )
    .await?;
    let admin = store.admin();
    let waiting = spawn_acquire(&waiter, &name, long.clone().wait(Duration::from_secs(20)));
    until_held_back(
        admin,
        &format!("INSERT INTO `{table}_queue`"),
        "the waiter's place",
    )
    .await?;
    let releasing = tokio::spawn(held.release());
    until_held_back(
        admin,
        &format!("UPDATE `{table}` SET token = NULL"),
        "the release",
    )
    .await?;
    run(places, "ROLLBACK").await?;
    // The waiter parked behind the release (its park's statement waits).
    let parked = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE STATE IN ('User lock', 'User sleep') AND INFO LIKE '%lock-mysql park %' \
         AND INFO LIKE '%`{table}`%'"
    );
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(5),
        "the waiter parking",
        async || Ok(count(admin, &parked).await? > 0),
    )
    .await?;
    run(tokens, "ROLLBACK").await?;
    releasing
        .await
        .map_err(|e| Failure(format!("the release's task: {e}")))?
        .map_err(|e| Failure(format!("the lone release: {e}")))?;
    let released = Instant::now();
    let next = waiting
        .await
        .map_err(|e| Failure(format!("the waiter's task: {e}")))?
        .map_err(|e| Failure(format!("the waiter: {e}")))?;
    let took = released.elapsed();
    next.release()
        .await
        .map_err(|e| Failure(format!("the waiter's release: {e}")))?;
    ensure!(
        took <= BOUND,
        "the waiter took the lock {took:?} after the lone release answered (bound {BOUND:?}): \
         nothing woke it"
    );
    Ok(())
}

/// Waits until a statement starting with `text` has run for 100 ms: held back by one of the
/// case's transactions (unhindered, it takes well under a millisecond).
async fn until_held_back(admin: &sqlx::MySqlPool, text: &str, what: &str) -> Outcome {
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE '{}%' AND TIME_MS >= 100",
        text.replace('\'', "''")
    );
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(5),
        &format!("{what} waiting for the case's transaction"),
        async || Ok(count(admin, &sql).await? > 0),
    )
    .await
}

async fn run(conn: &mut MySqlConnection, sql: &str) -> Outcome {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| Failure(format!("{sql}: {e}")))
}

async fn count(admin: &sqlx::MySqlPool, sql: &str) -> Result<i64, Failure> {
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .fetch_one(admin)
        .await
        .map_err(|e| Failure(format!("{sql}: {e}")))
}
