//! The lease strategy's gate: a per-lock user lock (`GET_LOCK`) that waiters of other
//! clients wait on before they take a place in the waiters' queue (see [`super::queue`]), so
//! that a thousand waiters arriving at once cost the server a statement each, not a queue
//! batch and a park refresh a second each.
//!
//! - **Who waits on it**: a call whose first try found the lease busy and that may park (it
//!   takes one of the client's park permits, see [`super::LeaseStrategy::new`]) waits in
//!   `GET_LOCK` on a pooled connection, up to its wait budget, before its queue batch. The
//!   server grants a user lock to the sessions waiting for it in the order they asked, so the
//!   gate keeps the waiters' arrival order. Calls that cannot park (no permit: a pool of one,
//!   or half the pool parked already) and calls with no wait budget (one try) do not wait on
//!   it; they queue as before (see [`super::queue`]), beside the gate's holder.
//! - **Its holder** writes its place in the queue at once (even when the lease is free: a
//!   place keeps a lease released meanwhile from newcomers' first tries, see
//!   [`super::queue::busy_batch`]), parks on the gate's connection (it needs no other: a
//!   waiting client uses one connection) and gives the gate back once granted, or when it
//!   gives up, in the background. So, as a rule, one gate waiter per lock is in the table's
//!   queue; the others wait in `GET_LOCK`, which costs the server nothing while they wait.
//! - **A holder that dies** (its connection ends) gives the gate back with its session. **A
//!   holder that is paused** (a stopped process) would keep it: the gate's connection runs
//!   with an idle limit (`wait_timeout`, set before the wait, so it also covers a waiter
//!   paused while it waits), the longest the holder sleeps between tries
//!   ([`super::queue::place_for`]), rounded up to whole seconds: the server ends a session
//!   idle that long, and the gate goes to the next waiter. The holder's tries and queue
//!   batches run on other connections, so one that waits longer than that (a try
//!   waiting for a row a long transaction keeps locked) loses the gate too. A waiter so cut
//!   off, or whose gate connection fails, goes on waiting in the queue without it (the
//!   queue, not the gate, decides who may take the lease; a lost gate costs order, never
//!   exclusion). The connection's own idle limit comes back when the gate is given back.
//! - **A call dropped** while it waits for the gate, or holds it, closes the gate's
//!   connection: the wait ends with it (a connection returned to the pool mid-wait would
//!   take the gate later for nobody), and a gate held goes back.
//! - **Its name** is `lock-mysql/gate/` and the SHA-1 of the database, the table and the
//!   lock's name, computed by the server (user lock names are at most 64 characters, and
//!   every client must name a lock's gate alike).

use std::time::{Duration, Instant};

use lock_core::LockName;
use sqlx::{AssertSqlSafe, MySql, Row, mysql::MySqlRow, pool::PoolConnection};
use tokio::sync::OwnedSemaphorePermit;

use super::ANSWER_GRACE;
use crate::{
    TableName,
    sql::{hex, run, tagged, within},
};

/// What a gate's name starts with.
const GATE: &str = "lock-mysql/gate/";

/// The gate of one `acquire` call, held: its connection (which parks, see
/// [`super::LeaseStrategy::park`]) and the park permit it took. Dropped without
/// [`Gate::leave`] (the call dropped, while it waits for the gate too, or its connection
/// failed), its connection is closed, which gives the gate back or ends the wait.
#[derive(Debug)]
pub(crate) struct Gate {
    conn: Option<PoolConnection<MySql>>,
    _permit: OwnedSemaphorePermit,
    /// The SQL expression of the gate's name.
    name: String,
}

/// The gate an `acquire` call holds, if any (the call's tries take it out and put it back),
/// and whether the call went for it already: a call waits for its gate at most once (one
/// that lost it, or passed it, queues without it from then on).
#[derive(Debug, Default)]
pub(crate) struct Slot {
    gate: std::sync::Mutex<Option<Gate>>,
    tried: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Gate>> {
        self.gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the call went for its gate already (see [`enter`]).
    pub(crate) fn tried(&self) -> bool {
        self.tried.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the gate out.
    pub(crate) fn take(&self) -> Option<Gate> {
        self.lock().take()
    }

    /// Gives the gate back, if held (see [`Gate::leave`]).
    pub(crate) fn leave(&self) {
        if let Some(gate) = self.take() {
            gate.leave();
        }
    }

    /// Whether the call holds its gate.
    pub(crate) fn held(&self) -> bool {
        self.lock().is_some()
    }

    /// Keeps `gate` (the call holds at most one).
    fn put(&self, gate: Gate) {
        *self.lock() = Some(gate);
    }

    /// The gate taken out for a while: put back when the borrow ends.
    pub(crate) fn borrow(&self) -> Borrowed<'_> {
        Borrowed {
            slot: self,
            gate: self.take(),
        }
    }
}

/// A gate taken out of its [`Slot`], put back when dropped (unless its connection
/// [broke](Borrowed::broken)).
pub(crate) struct Borrowed<'a> {
    slot: &'a Slot,
    gate: Option<Gate>,
}

impl Borrowed<'_> {
    /// Whether there is a gate.
    pub(crate) fn is_some(&self) -> bool {
        self.gate.is_some()
    }

    /// The connection a park runs on: the gate's, else one from `pool` (by `until`) kept in
    /// `pooled`; `None` when the pool has none in time.
    pub(crate) async fn park_conn<'s>(
        &'s mut self,
        pooled: &'s mut Option<PoolConnection<MySql>>,
        pool: &sqlx::MySqlPool,
        until: Instant,
    ) -> Option<&'s mut PoolConnection<MySql>> {
        if let Some(conn) = self.gate.as_mut().and_then(|gate| gate.conn.as_mut()) {
            return Some(conn);
        }
        let conn = within(until, pool.acquire()).await.ok()?;
        Some(pooled.insert(conn))
    }

    /// The park's connection failed: closes `pooled`, or drops the gate when the park ran on
    /// its connection (closing that gives the gate back).
    pub(crate) fn broken(&mut self, pooled: &mut Option<PoolConnection<MySql>>) {
        match pooled.as_mut() {
            Some(conn) => conn.close_on_drop(),
            None => self.gate = None,
        }
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            self.slot.put(gate);
        }
    }
}

/// How [`enter`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entered {
    /// The gate is the caller's (kept in its slot).
    Held,
    /// The budget ran out waiting for it.
    TimedOut,
    /// The caller does not wait on the gate (no park permit free, no connection in time,
    /// or the wait failed): it queues without it.
    Passed,
}

/// The SQL expression naming the gate of `name` on `table`.
fn name_expr(table: &TableName, name: &[u8]) -> String {
    format!(
        "CONCAT('{GATE}', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', '{}', '/', {})))",
        table.quoted().replace('\'', "''"),
        hex(name)
    )
}

/// The idle limit of a gate's connection, in whole seconds: `idle` rounded up, at least 1.
fn idle_secs(idle: Duration) -> u64 {
    crate::config::ceil_secs(idle).max(1)
}

/// The statement that waits for the gate: sets the idle limit (keeping the old one in a
/// session variable), then waits up to `wait` (on MySQL, which counts `GET_LOCK`'s time-out in
/// whole seconds, `wait` rounded up: the client ends the wait at the budget). Answers
/// `'gate'` with 1 (taken), 0 (timed out) or NULL (an error, or killed).
fn enter_sql(gate: &str, wait: Duration, idle: Duration, mariadb: bool) -> String {
    let wait = if mariadb {
        format!("{}.{:06}", wait.as_secs(), wait.subsec_micros())
    } else {
        crate::config::ceil_secs(wait).to_string()
    };
    format!(
        "SET @lm_idle = @@SESSION.wait_timeout, SESSION wait_timeout = {}; \
         SELECT 'gate', CAST(GET_LOCK({gate}, {wait}) AS SIGNED)",
        idle_secs(idle)
    )
}

/// The `'gate'` answer among `rows`: 1 (taken), 0, or `None` (none, or NULL).
fn gate_answer(rows: &[MySqlRow]) -> Option<i64> {
    tagged(rows, "gate")
        .next()
        .and_then(|row| row.try_get::<Option<i64>, _>(1).ok().flatten())
}

/// The statement that gives the gate back and the connection its idle limit.
fn leave_sql(gate: &str) -> String {
    format!("DO RELEASE_LOCK({gate}); SET SESSION wait_timeout = @lm_idle")
}

/// Waits for the gate of `name` on `table` until `deadline` on a connection of `pool`, with a
/// park permit of `parking`, and keeps it in `slot`; the gate's connection is idle at most
/// `idle` at a time while the gate is held. `mariadb`: the server is MariaDB.
pub(crate) async fn enter(
    (pool, parking): (&sqlx::MySqlPool, &std::sync::Arc<tokio::sync::Semaphore>),
    (table, name): (&TableName, &LockName),
    (deadline, idle): (Instant, Duration),
    (slot, mariadb): (&Slot, bool),
) -> Entered {
    slot.tried.store(true, std::sync::atomic::Ordering::Relaxed);
    let Ok(permit) = parking.clone().try_acquire_owned() else {
        return Entered::Passed;
    };
    let until = deadline.max(Instant::now() + super::MIN_TRY) + ANSWER_GRACE;
    let Ok(conn) = within(until, pool.acquire()).await else {
        return Entered::Passed;
    };
    // A gate from the start: dropped on any path but the two below (a call dropped during
    // the wait included), it closes its connection, so no wait goes on for nobody on a
    // connection back in the pool.
    let mut gate = Gate {
        conn: Some(conn),
        _permit: permit,
        name: name_expr(table, name.as_str().as_bytes()),
    };
    let wait = deadline.saturating_duration_since(Instant::now());
    let sql = enter_sql(&gate.name, wait, idle, mariadb);
    match gate.run(sql, until).await {
        Ok(rows) => match gate_answer(&rows) {
            Some(1) => {
                slot.put(gate);
                Entered::Held
            }
            Some(0) => {
                // Nothing taken; the connection goes back with its idle limit.
                let restore = "SET SESSION wait_timeout = @lm_idle".to_owned();
                if gate
                    .run(restore, Instant::now() + ANSWER_GRACE)
                    .await
                    .is_ok()
                {
                    drop(gate.conn.take());
                }
                Entered::TimedOut
            }
            _ => Entered::Passed,
        },
        // No answer by the end of the budget: a busy server answering many waits that ended
        // at once. The call is over either way.
        Err(_) if Instant::now() >= deadline => Entered::TimedOut,
        Err(error) => {
            tracing::debug!(lock = %name, %error, "waiting for the gate failed; queueing without it");
            Entered::Passed
        }
    }
}

impl Gate {
    /// Runs `sql` on the gate's connection, its answer awaited until `until`.
    async fn run(&mut self, sql: String, until: Instant) -> Result<Vec<MySqlRow>, sqlx::Error> {
        let conn = self.conn.as_mut().ok_or(sqlx::Error::PoolClosed)?;
        within(until, run(conn, AssertSqlSafe(sql))).await
    }

    /// Gives the gate back in the background (the caller does not wait for it), and its
    /// connection its idle limit; a connection that fails to is closed (which gives the gate
    /// back too). The park permit goes back at once (the caller may park on another
    /// connection).
    pub(crate) fn leave(mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let sql = leave_sql(&self.name);
        drop(self);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nothing to run the statement on: closing the connection gives the gate back.
            conn.close_on_drop();
            return;
        };
        drop(runtime.spawn(async move {
            let until = Instant::now() + ANSWER_GRACE;
            if within(until, run(&mut conn, AssertSqlSafe(sql)))
                .await
                .is_err()
            {
                conn.close_on_drop();
            }
        }));
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.close_on_drop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_name_fits_a_user_lock_name() {
        // User lock names are at most 64 characters: the prefix and 40 hex digits.
        assert!(GATE.len() + 40 <= 64);
        let t = TableName::new("t").unwrap();
        let sql = name_expr(&t, b"it's");
        assert!(sql.contains("'`t`'"), "{sql}");
        assert!(sql.contains("X'69742773'"), "{sql}");
    }

    #[test]
    fn mysql_waits_whole_seconds() {
        let wait = Duration::from_millis(1_500);
        let mariadb = enter_sql("g", wait, Duration::from_secs(2), true);
        assert!(mariadb.contains("GET_LOCK(g, 1.500000)"), "{mariadb}");
        let mysql = enter_sql("g", wait, Duration::from_secs(2), false);
        assert!(mysql.contains("GET_LOCK(g, 2)"), "{mysql}");
    }

    #[test]
    fn the_idle_limit_is_set_before_the_wait() {
        // A waiter paused while it waits must lose the gate too, once it has it.
        let sql = enter_sql(
            "g",
            Duration::from_secs(1),
            Duration::from_millis(2_500),
            true,
        );
        let (idle, wait) = (sql.find("wait_timeout = 3;"), sql.find("GET_LOCK(g, "));
        assert!(idle.is_some() && idle < wait, "{sql}");
    }

    #[test]
    fn the_idle_limit_is_whole_seconds_rounded_up() {
        assert_eq!(idle_secs(Duration::from_millis(2_000)), 2);
        assert_eq!(idle_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(idle_secs(Duration::ZERO), 1);
    }
}
