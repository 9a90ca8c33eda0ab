//! The row-lock strategy: the hold is an open transaction, on a connection dedicated to it,
//! that holds `SELECT ... FOR UPDATE` on the lock's row.
//!
//! - **Waiting** happens inside InnoDB: a waiter's `SELECT ... FOR UPDATE` queues behind the
//!   holder and returns when the holder's transaction ends (no polling). The wait budget is
//!   enforced to the millisecond although `innodb_lock_wait_timeout` counts whole seconds: the
//!   session timeout is set to the budget rounded up, the query is raced against the budget,
//!   and on expiry the waiting statement is stopped with `KILL QUERY` from the anchor's
//!   connection on MariaDB (see `Anchor::execute_short`; elsewhere, or when it is busy or
//!   down, from the one kept beside the pool or a pooled one); the dedicated connection is then
//!   closed, never reused mid-statement. A wait stopped so answers [`LockError::Timeout`] at
//!   expiry, before the kill: the kill, the drain and the close go on in the background, so a
//!   server slow to kill (a thousand waits ending together) or not answering does not hold
//!   that answer up (see `acquire::Answer`).
//!   A zero budget is `FOR UPDATE NOWAIT`. Of one client's acquisitions of a name only one waits in
//!   InnoDB at a time; the others queue in the client ([`LocalQueue`]).
//! - **Fences** live in a separate `<table>_fences` row bumped by an autocommitted statement on
//!   the anchor's connection on MariaDB (see `Anchor::execute_short`; elsewhere, or when it
//!   is busy or down, the one kept beside the pool or a pooled one) *after* the row lock is
//!   granted, so they follow the order of grants and survive the rollback that ends every hold.
//! - **Who holds it**: once it has the row lock, the holder inserts its token, fence and
//!   connection id as a row of `<table>_holds` inside its transaction and never commits.
//!   Readers at `READ UNCOMMITTED` see it while the hold lasts; the rollback that ends it
//!   erases it. The record is not written into the row waiters queue on: an update that
//!   changes that row's size while waiters queue on it costs InnoDB work for each waiter at
//!   the update and again at the rollback (100 waiting connections: about 57 hand-offs a
//!   second instead of 470, measured with raw connections on this project's machine).
//!   [`inspect`](lock_core::LockBackend::inspect) reports a record only once its fence is
//!   committed in the counter (a record written with a grant whose bump is still running
//!   reads as not held yet, as before the record existed). A committed record is foreign.
//! - **One round trip after the grant**: the grant's reply also carries the committed fence
//!   counter, so the record (with the fence the bump will issue: that counter plus one) goes
//!   out on the hold's connection at the same time as the bump on another. In the rare
//!   case the bump issues another fence (an earlier bump whose client gave up on it landed in
//!   between), the record is corrected before the grant is returned; until then `inspect`
//!   may show the record's fence, lower than the one the holder gets. A counter at its
//!   maximum is [`LockError::Foreign`].
//! - **End of a hold**: release rolls back; a lost connection rolls back on the server. The
//!   dedicated connection's `wait_timeout` is the lease TTL rounded up to whole seconds, so the
//!   server itself ends a hold whose client stopped renewing (the watchdog's renewal is a
//!   statement on that connection), and a renewal on a dead connection reports
//!   [`LossReason::SessionEnded`].
//! - **Cancellation**: the whole acquisition runs in a spawned task that owns the dedicated
//!   connection; a dropped `acquire` future is noticed there and cleaned up in the
//!   background (kill the wait, or roll back a lock granted meanwhile).

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

mod acquire;
mod admin;
mod connections;
mod hold;

use lock_core::{
    Fence, Lease, LockError, LockInfo, LockName,
    backend::{AcquireRequest, Grant, LeaseToken, validate_ttl},
};
use sqlx::{
    MySqlPool, Row,
    mysql::{MySqlConnectOptions, MySqlRow},
};
use tokio::sync::{mpsc, oneshot};

use crate::{
    TableName,
    anchor::{self, Anchor},
    error::Error,
    kept::Kept,
    lease::ANSWER_GRACE,
    local_queue::LocalQueue,
    rows::{HOLD_COLUMNS, HoldRow, HoldState},
    sql::{hex, run_pooled, tagged},
};
use connections::Dedicated;

/// The row-lock strategy over one pool, table and fence table.
#[derive(Clone)]
pub(crate) struct RowLockStrategy {
    shared: Arc<Shared>,
}

impl fmt::Debug for RowLockStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowLockStrategy")
            .field("table", &self.shared.table)
            .field("held", &self.shared.holds().len())
            .field("idle_connections", &self.shared.idle().len())
            .field("names_waited_on", &self.shared.queue.len())
            .finish()
    }
}

struct Shared {
    pool: MySqlPool,
    connect: MySqlConnectOptions,
    connect_timeout: Duration,
    table: TableName,
    /// The fence bump, prepared once per connection it runs on.
    bump: Arc<str>,
    /// The renewal's read of the holder's token, prepared once per dedicated connection.
    held: Arc<str>,
    /// Live holds of this client, by owner token.
    holds: Mutex<HashMap<LeaseToken, Arc<Held>>>,
    /// Dedicated connections kept open for the next hold.
    idle: Mutex<Vec<Dedicated>>,
    /// Which of this client's acquisitions of a name waits in InnoDB (one at a time).
    queue: LocalQueue,
    max_idle: usize,
    /// The server's session settings for dedicated connections (idle-transaction killers and
    /// statement time limits off), or empty.
    session_setup: String,
    /// The bound of calls without a wait budget.
    statement_timeout: Duration,
    /// The user lock parked holds wait on.
    anchor: Arc<Anchor>,
}

/// One hold: its lock, fence and the task owning the connection whose open transaction is the
/// hold (see [`hold`]). Dropping the last handle rolls the hold back.
struct Held {
    name: LockName,
    fence: Fence,
    commands: mpsc::Sender<hold::Command>,
}

/// How a row-lock strategy opens and bounds its dedicated connections.
pub(crate) struct Settings {
    pub(crate) connect: MySqlConnectOptions,
    pub(crate) connect_timeout: Duration,
    /// Dedicated connections kept open for reuse, at most.
    pub(crate) max_idle: usize,
    /// The server's session settings for dedicated connections, or empty.
    pub(crate) session_setup: String,
    /// The bound of calls without a wait budget.
    pub(crate) statement_timeout: Duration,
}

impl RowLockStrategy {
    /// Raises the client's [anchor](crate::anchor) on `conn` (one of the pool's, detached
    /// from it) before any hold parks (see there why).
    pub(crate) async fn raise_anchor(&self, conn: sqlx::pool::PoolConnection<sqlx::MySql>) {
        self.shared.anchor.raise_on(conn).await;
    }

    /// The strategy on `pool` and `table`, its anchor raised as `anchor` says.
    pub(crate) fn new(
        pool: MySqlPool,
        table: TableName,
        settings: Settings,
        anchor: anchor::Settings,
    ) -> Self {
        let Settings {
            connect,
            connect_timeout,
            max_idle,
            session_setup,
            statement_timeout,
        } = settings;
        // The connection kept out of the pool for the fence bump and the kill of a parked
        // chunk when the anchor's is busy or down (see `Anchor::execute_short`).
        let kept = Arc::new(Kept::new(pool.clone()));
        let anchor = Arc::new(Anchor::new(anchor, kept));
        Self {
            shared: Arc::new(Shared {
                pool,
                connect,
                connect_timeout,
                bump: format!(
                    "INSERT INTO {} (name, fence) VALUES (?, LAST_INSERT_ID(1)) \
                     ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)",
                    table.fences().quoted()
                )
                .into(),
                held: format!(
                    "SELECT token FROM {} WHERE name = ?",
                    table.holds().quoted()
                )
                .into(),
                table,
                holds: Mutex::new(HashMap::new()),
                idle: Mutex::new(Vec::new()),
                queue: LocalQueue::default(),
                max_idle,
                session_setup,
                statement_timeout,
                anchor,
            }),
        }
    }

    /// Acquires in a spawned task that owns the dedicated connection, so that dropping this
    /// future cleans up in the background instead of abandoning a connection mid-statement.
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(LockError::unsupported(
                "acquiring a row lock outside a Tokio runtime (the wait runs in a spawned task)",
            ));
        };
        let (tx, mut rx) = oneshot::channel();
        let (out_of_time_tx, out_of_time) = oneshot::channel();
        let shared = self.shared.clone();
        let task_request = request.clone();
        let answer = acquire::Answer::new(tx, out_of_time_tx);
        runtime.spawn(async move { shared.acquire_task(task_request, answer).await });
        let answer = tokio::select! {
            biased;
            answer = &mut rx => answer,
            // The budget ran out mid-wait: Timeout, whatever the kill that follows finds (the
            // task rolls back a grant that lands meanwhile, as for a caller that left).
            Ok(()) = out_of_time => return Err(request.timeout_error()),
        };
        match answer {
            Ok(Ok(pending)) => Ok(pending.claim()),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(LockError::backend_msg(format!(
                "the task acquiring `{}` ended without an answer",
                request.name()
            ))),
        }
    }

    /// Confirms the hold's connection is alive and still holds the row, and sets its
    /// server-side idle limit to `ttl` (the hold's task does it, see [`hold`]).
    pub(crate) async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        validate_ttl(ttl)?;
        self.shared
            .ask(lease, |reply| hold::Command::Renew { ttl, reply })
            .await
            .map(|sent| Grant::new(lease.clone().with_ttl(ttl), sent))
    }

    /// Ends the hold: rolls its transaction back (waiters wake) and keeps the connection for
    /// the next hold.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.shared
            .ask(lease, |reply| hold::Command::Release { reply })
            .await
    }

    /// Reads the row as the holder wrote it (`READ UNCOMMITTED`) and as committed: a hold
    /// shows only in the former; anything committed besides an empty row is foreign.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        let h = self.shared.table.holds().quoted();
        let n = hex(name.as_str().as_bytes());
        let f = self.shared.table.fences().quoted();
        let sql = format!(
            "ROLLBACK; SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION READ ONLY; \
             SELECT 'current', {HOLD_COLUMNS} FROM {h} WHERE name = {n}; COMMIT; \
             SELECT 'committed', {HOLD_COLUMNS} FROM {h} WHERE name = {n}; \
             SELECT 'counter', fence FROM {f} WHERE name = {n}"
        );
        let rows = run_pooled(
            &self.shared.pool,
            sql,
            Instant::now() + self.shared.statement_timeout,
        )
        .await
        .map_err(|e| LockError::from(Error::new(format!("inspecting `{name}`"), e)))?;
        let read = |tag| {
            tagged(&rows, tag)
                .next()
                .map(|row| HoldRow::read(row, 1))
                .transpose()
                .map_err(|e| LockError::from(Error::new(format!("reading the row of `{name}`"), e)))
        };
        if let Some(committed) = read("committed")? {
            committed.judge_committed(&self.shared.table, name)?;
        }
        let Some(current) = read("current")? else {
            return Ok(None);
        };
        let counter = fence_counter(&rows)
            .transpose()
            .map_err(|e| {
                LockError::from(Error::new(
                    format!("reading the fence counter of `{name}`"),
                    e,
                ))
            })?
            .unwrap_or(0);
        Ok(match current.judge_current(&self.shared.table, name)? {
            // A record whose fence is above the committed counter belongs to a grant whose
            // bump has not committed yet (and may fail): not a hold yet.
            HoldState::Held { fence, .. } if fence.get() > counter => None,
            HoldState::Free => None,
            HoldState::Held { token, fence } => {
                Some(LockInfo::new(name.clone(), token, fence, None))
            }
        })
    }
}

impl Shared {
    fn holds(&self) -> MutexGuard<'_, HashMap<LeaseToken, Arc<Held>>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Dedicated>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The hold of `lease`, if this client has it (token, name and fence must all match).
    fn find(&self, lease: &Lease) -> Option<Arc<Held>> {
        self.holds()
            .get(lease.token())
            .filter(|held| held.name == *lease.name() && held.fence == lease.fence())
            .cloned()
    }

    /// Forgets a hold of this client. Dropping its handle makes its task roll it back
    /// (without a runtime the task is gone, and its connection closed with it).
    fn forget(&self, token: &LeaseToken) {
        self.holds().remove(token);
    }

    /// Sends the command `command` makes (with the channel for its answer) to the task
    /// owning the hold of `lease`, and waits for the answer, at most the statement timeout
    /// (the task bounds its own statements by it too). `NotHeld` when this client has no such
    /// hold.
    async fn ask<T>(
        &self,
        lease: &Lease,
        command: impl FnOnce(oneshot::Sender<Result<T, LockError>>) -> hold::Command,
    ) -> Result<T, LockError> {
        let name = lease.name();
        let held = self.find(lease).ok_or_else(|| LockError::not_held(name))?;
        let (reply, answer) = oneshot::channel();
        if held.commands.send(command(reply)).await.is_err() {
            // The task has ended: the hold is over.
            return Err(LockError::not_held(name));
        }
        let limit = self.statement_timeout + self.statement_timeout + ANSWER_GRACE;
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(LockError::not_held(name)),
            Err(_) => Err(LockError::unavailable_msg(format!(
                "`{name}`: the server did not answer within {limit:?}"
            ))),
        }
    }
}

/// The committed fence counter a script read with `SELECT 'counter', <fence> ...`, if it
/// returned that row.
fn fence_counter(rows: &[MySqlRow]) -> Option<Result<u64, sqlx::Error>> {
    tagged(rows, "counter")
        .next()
        .map(|row| row.try_get::<u64, _>(1))
}

#[cfg(test)]
mod tests {
    use lock_core::LockOptions;
    use sqlx::mysql::MySqlPoolOptions;

    use super::*;

    #[test]
    fn acquiring_outside_a_runtime_is_unsupported_not_a_panic() {
        let options: MySqlConnectOptions = "mysql://u:p@127.0.0.1:9/db".parse().unwrap();
        // Lazy, without maintenance: nothing is spawned or connected.
        let pool = MySqlPoolOptions::new()
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(options.clone());
        let strategy = RowLockStrategy::new(
            pool.clone(),
            TableName::new("t").unwrap(),
            Settings {
                connect: options.clone(),
                connect_timeout: Duration::from_secs(1),
                max_idle: 0,
                session_setup: String::new(),
                statement_timeout: Duration::from_secs(1),
            },
            anchor::Settings {
                pool: pool.clone(),
                connect: options,
                setup: String::new(),
                connect_timeout: Duration::from_secs(1),
                statement_timeout: Duration::from_secs(1),
                mariadb: true,
            },
        );
        let request =
            AcquireRequest::new(LockName::new("a").unwrap(), &LockOptions::new()).unwrap();
        let result = futures::executor::block_on(strategy.acquire(&request));
        assert!(
            matches!(result, Err(LockError::Unsupported { .. })),
            "{result:?}"
        );
    }
}
