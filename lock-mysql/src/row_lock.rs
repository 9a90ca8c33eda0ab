//! The row-lock strategy: the hold is an open transaction, on a connection dedicated to it,
//! that holds `SELECT ... FOR UPDATE` on the lock's row.
//!
//! - **Waiting** happens inside InnoDB: a waiter's `SELECT ... FOR UPDATE` queues behind the
//!   holder and returns when the holder's transaction ends (no polling). The wait budget is
//!   enforced to the millisecond although `innodb_lock_wait_timeout` counts whole seconds: the
//!   session timeout is set to the budget rounded up, the query is raced against the budget,
//!   and on expiry the waiting statement is stopped with `KILL QUERY` from a pooled
//!   connection; the dedicated connection is then closed, never reused mid-statement. A zero
//!   budget is `FOR UPDATE NOWAIT`. Of one client's acquisitions of a name only one waits in
//!   InnoDB at a time; the others queue in the client ([`LocalQueue`]).
//! - **Fences** live in a separate `<table>_fences` row bumped by an autocommitted statement on
//!   a pooled connection *after* the row lock is granted, so they follow the order of grants
//!   and survive the rollback that ends every hold.
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
//!   out on the hold's connection at the same time as the bump on a pooled one. In the rare
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

mod hold;

use lock_core::{
    Fence, Lease, LockError, LockInfo, LockName,
    backend::{AcquireRequest, Grant, LeaseToken, end_signal, validate_ttl},
};
use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection, MySqlConnection, MySqlPool, Row,
    mysql::{MySqlConnectOptions, MySqlRow},
};
use tokio::sync::{mpsc, oneshot};

use crate::{
    TableName,
    config::ceil_secs,
    error::{Class, classify, lock_error, server_code},
    lease_strategy::ANSWER_GRACE,
    local_queue::LocalQueue,
    lock_row::{HOLD_COLUMNS, HoldRow, HoldState},
    script::{
        Deadlocks, execute_within, hex, is_timed_out, retry_deadlocks, run, run_pooled, tagged,
    },
};

/// How long creating a name's row may take even when the wait budget is spent.
const CREATE_GRACE: Duration = Duration::from_secs(1);

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
    /// The fence bump, prepared once per pooled connection.
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
}

/// A connection outside the pool, for one hold or one wait at a time.
struct Dedicated {
    conn: MySqlConnection,
    /// Its `CONNECTION_ID()`, for `KILL QUERY`.
    id: u64,
    /// Its `innodb_lock_wait_timeout`, in seconds.
    lock_wait: u64,
    /// Its `wait_timeout` (seconds of silence after which the server closes it), once set
    /// for a hold; kept afterwards, so an idle connection may be closed by the server and is
    /// then replaced on its next use.
    wait_timeout: Option<u64>,
}

impl Dedicated {
    /// `SET SESSION wait_timeout = <ttl>; ` if the session does not have it yet.
    fn wait_timeout_for(&mut self, ttl: Duration) -> String {
        let seconds = ceil_secs(ttl).max(1);
        if self.wait_timeout == Some(seconds) {
            return String::new();
        }
        self.wait_timeout = Some(seconds);
        format!("SET SESSION wait_timeout = {seconds}; ")
    }
}

/// One hold: its lock, fence and the task owning the connection whose open transaction is the
/// hold (see [`hold`]). Dropping the last handle rolls the hold back.
struct Held {
    name: LockName,
    fence: Fence,
    commands: mpsc::Sender<hold::Command>,
}

/// Why a wait was stopped before the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The wait budget ran out.
    Deadline,
    /// The caller dropped the `acquire` future.
    Cancelled,
}

/// A failed acquisition step.
enum Failed {
    /// Give up with this error (the connection has been dealt with).
    Error(LockError),
    /// The budget ran out or the caller left.
    Stopped(Stop),
    /// Granted, but only after the grant's own local deadline (the fence bump waited longer
    /// than the TTL): rolled back; try again if the budget allows.
    Late,
}

impl RowLockStrategy {
    pub(crate) fn new(
        pool: MySqlPool,
        connect: MySqlConnectOptions,
        connect_timeout: Duration,
        table: TableName,
        max_idle: usize,
        session_setup: String,
        statement_timeout: Duration,
    ) -> Self {
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
            }),
        }
    }

    /// Acquires in a spawned task that owns the dedicated connection, so that dropping this
    /// future cleans up in the background instead of abandoning a connection mid-statement.
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(LockError::Unsupported {
                what:
                    "acquiring a row lock outside a Tokio runtime (the wait runs in a spawned task)"
                        .into(),
            });
        };
        let (tx, rx) = oneshot::channel();
        let shared = self.shared.clone();
        let task_request = request.clone();
        runtime.spawn(async move { shared.acquire_task(task_request, tx).await });
        match rx.await {
            Ok(Ok(pending)) => Ok(pending.claim()),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(LockError::Backend {
                message: format!(
                    "the task acquiring `{}` ended without an answer",
                    request.name()
                ),
                source: None,
            }),
        }
    }

    /// Confirms the hold's connection is alive and still holds the row, and sets its
    /// server-side idle limit to `ttl` (the hold's task does it, see [`hold`]).
    pub(crate) async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        validate_ttl(ttl)?;
        let name = lease.name();
        let held = self
            .shared
            .find(lease)
            .ok_or_else(|| LockError::not_held(name))?;
        let (reply, answer) = oneshot::channel();
        self.shared
            .ask(&held, hold::Command::Renew { ttl, reply }, answer, name)
            .await
            .map(|sent| Grant::new(lease.clone().with_ttl(ttl), sent))
    }

    /// Renews each lease on its own connection, all at once.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Grant, LockError>> {
        futures::future::join_all(leases.iter().map(|lease| self.renew(lease, lease.ttl()))).await
    }

    /// Ends the hold: rolls its transaction back (waiters wake) and keeps the connection for
    /// the next hold.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let name = lease.name();
        let held = self
            .shared
            .find(lease)
            .ok_or_else(|| LockError::not_held(name))?;
        let (reply, answer) = oneshot::channel();
        self.shared
            .ask(&held, hold::Command::Release { reply }, answer, name)
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
        .map_err(|e| lock_error(&format!("inspecting `{name}`"), e))?;
        let read = |tag| {
            tagged(&rows, tag)
                .next()
                .map(|row| HoldRow::read(row, 1))
                .transpose()
                .map_err(|e| lock_error(&format!("reading the row of `{name}`"), e))
        };
        if let Some(committed) = read("committed")? {
            committed.judge_committed(&self.shared.table, name)?;
        }
        let Some(current) = read("current")? else {
            return Ok(None);
        };
        let counter = fence_counter(&rows)
            .transpose()
            .map_err(|e| lock_error(&format!("reading the fence counter of `{name}`"), e))?
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

    fn forget(&self, token: &LeaseToken) {
        self.holds().remove(token);
    }

    /// Sends `command` to the task owning `held` and waits for its answer, at most the
    /// statement timeout (the task bounds its own statements by it too).
    async fn ask<T>(
        &self,
        held: &Held,
        command: hold::Command,
        answer: oneshot::Receiver<Result<T, LockError>>,
        name: &LockName,
    ) -> Result<T, LockError> {
        if held.commands.send(command).await.is_err() {
            // The task has ended: the hold is over.
            return Err(LockError::not_held(name));
        }
        let limit = self.statement_timeout + self.statement_timeout + ANSWER_GRACE;
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(LockError::not_held(name)),
            Err(_) => Err(LockError::Unavailable {
                message: format!("`{name}`: the server did not answer within {limit:?}"),
                source: None,
            }),
        }
    }

    /// Keeps a clean connection (no transaction, default timeouts) for reuse, or closes it.
    fn keep(&self, dedicated: Dedicated) {
        let mut idle = self.idle();
        if idle.len() < self.max_idle {
            idle.push(dedicated);
        } else {
            drop(idle);
            self.discard(dedicated);
        }
    }

    /// Closes a connection politely in the background (or at once, by dropping it, without a
    /// runtime): the server rolls back whatever it held.
    fn discard(&self, dedicated: Dedicated) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), dedicated.conn.close()).await;
                });
            }
            Err(_) => drop(dedicated),
        }
    }

    /// A dedicated connection: an idle one (`false`) or a new one (`true`).
    async fn checkout(&self) -> Result<(Dedicated, bool), LockError> {
        if let Some(dedicated) = self.idle().pop() {
            return Ok((dedicated, false));
        }
        Ok((self.connect().await?, true))
    }

    async fn connect(&self) -> Result<Dedicated, LockError> {
        let what = "opening a connection for a row lock";
        let mut conn = tokio::time::timeout(self.connect_timeout, self.connect.connect())
            .await
            .map_err(|_| LockError::Unavailable {
                message: format!("{what}: no answer within {:?}", self.connect_timeout),
                source: None,
            })?
            .map_err(|e| lock_error(what, e))?;
        // The hold is an idle transaction: no server-side idle killer or statement time limit
        // may end it (or a wait) behind the client's back.
        let setup = if self.session_setup.is_empty() {
            String::new()
        } else {
            format!("{}; ", self.session_setup)
        };
        let rows = run(
            &mut conn,
            AssertSqlSafe(format!(
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; {setup}\
                 SELECT 'id', CAST(CONNECTION_ID() AS UNSIGNED), CAST(@@SESSION.innodb_lock_wait_timeout AS UNSIGNED)"
            )),
        )
        .await
        .map_err(|e| lock_error(what, e))?;
        let row = tagged(&rows, "id")
            .next()
            .ok_or_else(|| LockError::Backend {
                message: format!("{what}: CONNECTION_ID() returned nothing"),
                source: None,
            })?;
        let id: u64 = row.try_get(1).map_err(|e| lock_error(what, e))?;
        let lock_wait: u64 = row.try_get(2).map_err(|e| lock_error(what, e))?;
        Ok(Dedicated {
            conn,
            id,
            lock_wait,
            wait_timeout: None,
        })
    }

    /// Stops the statement running on connection `id` (a waiting `SELECT ... FOR UPDATE`, a
    /// parked chunk), trying until `until`. False when that could not be done.
    async fn kill_query(&self, id: u64, until: Instant) -> bool {
        let kill = sqlx::raw_sql(AssertSqlSafe(format!("KILL QUERY {id}"))).execute(&self.pool);
        match tokio::time::timeout_at(until.into(), kill).await {
            Ok(Ok(_)) => true,
            // 1094: unknown thread id: the connection is gone, and its wait with it.
            Ok(Err(error)) => server_code(&error) == Some(1094),
            Err(_) => false,
        }
    }

    /// The task behind `acquire`: answers on `tx`, and cleans up if nobody listens.
    async fn acquire_task(
        self: Arc<Self>,
        request: AcquireRequest,
        mut tx: oneshot::Sender<Result<PendingGrant, LockError>>,
    ) {
        let answer = loop {
            break match self.lock_row(&request, &mut tx).await {
                Ok(grant) => Ok(PendingGrant {
                    grant,
                    shared: self.clone(),
                    claimed: false,
                }),
                Err(Failed::Error(error)) => Err(error),
                Err(Failed::Late) if Instant::now() < request.deadline() => continue,
                Err(Failed::Stopped(Stop::Deadline) | Failed::Late) => Err(request.timeout_error()),
                Err(Failed::Stopped(Stop::Cancelled)) => return,
            };
        };
        // If the caller left meanwhile, the answer comes back and a grant in it is released
        // as it drops.
        let _ = tx.send(answer);
    }

    /// Takes the row lock on a dedicated connection, bumps the fence, records the hold.
    async fn lock_row(
        self: &Arc<Self>,
        request: &AcquireRequest,
        tx: &mut oneshot::Sender<Result<PendingGrant, LockError>>,
    ) -> Result<Grant, Failed> {
        let name = request.name();
        // Only one acquisition of this client waits in InnoDB for a name; the others wait for
        // their turn here.
        let mut place = self.queue.join(name);
        if request.deadline() <= Instant::now() {
            if !place.try_turn() {
                return Err(Failed::Stopped(Stop::Deadline));
            }
        } else {
            let deadline = tokio::time::sleep_until(request.deadline().into());
            tokio::select! {
                biased;
                () = place.turn() => {}
                () = deadline => return Err(Failed::Stopped(Stop::Deadline)),
                () = tx.closed() => return Err(Failed::Stopped(Stop::Cancelled)),
            }
            // The turn may come to a caller that has just left.
            if tx.is_closed() {
                return Err(Failed::Stopped(Stop::Cancelled));
            }
        }
        let (mut dedicated, mut fresh) = self.checkout().await.map_err(Failed::Error)?;
        let t = self.table.quoted();
        let f = self.table.fences().quoted();
        let h = self.table.holds().quoted();
        let n = hex(name.as_str().as_bytes());
        let token = LeaseToken::random();
        // Deadlocks cannot happen on one row; retrying only guards against a surprise.
        let mut deadlocks = Deadlocks::default();
        let expected = loop {
            let remaining = request.deadline().saturating_duration_since(Instant::now());
            let nowait = remaining.is_zero();
            let mut sql = dedicated.wait_timeout_for(request.ttl());
            let seconds = ceil_secs(remaining).max(1);
            if !nowait && dedicated.lock_wait != seconds {
                sql.push_str(&format!(
                    "SET SESSION innodb_lock_wait_timeout = {seconds}; "
                ));
            }
            // The wait and, in the same round trip once granted, any committed record (there
            // is none unless someone else wrote it) and the fence the bump after the grant
            // will issue: the committed counter plus one, read without a lock (a shared lock
            // on the counter row would block that bump until the hold ends).
            sql.push_str(&format!(
                "ROLLBACK; START TRANSACTION; \
                 SELECT 'row', name FROM {t} WHERE name = {n} FOR UPDATE{}; \
                 SELECT 'committed', {HOLD_COLUMNS} FROM {h} WHERE name = {n}; \
                 SELECT 'counter', CAST(COALESCE(MAX(fence), 0) AS UNSIGNED) FROM {f} WHERE name = {n}",
                if nowait { " NOWAIT" } else { "" },
            ));
            let result = self
                .wait(&mut dedicated, sql, request.deadline(), nowait, tx)
                .await;
            let rows = match result {
                Ok(rows) => {
                    if !nowait {
                        dedicated.lock_wait = seconds;
                    }
                    rows
                }
                Err((Some(stop), _)) => {
                    self.discard(dedicated);
                    return Err(Failed::Stopped(stop));
                }
                Err((None, error)) => match classify(&error) {
                    // A server-side time limit (turned off on this session, but a server may
                    // enforce one anyway): the wait ended without the lock, like a lock-wait
                    // timeout.
                    Class::LockWait | Class::StatementTimeout => {
                        if !nowait {
                            dedicated.lock_wait = seconds;
                        }
                        self.rollback_and_keep(dedicated).await;
                        return Err(Failed::Stopped(Stop::Deadline));
                    }
                    Class::Deadlock if deadlocks.retry(&error) => continue,
                    Class::Connection if !fresh => {
                        // An idle connection the server closed meanwhile: use a new one.
                        self.discard(dedicated);
                        dedicated = self.connect().await.map_err(Failed::Error)?;
                        fresh = true;
                        continue;
                    }
                    _ => {
                        self.discard(dedicated);
                        return Err(Failed::Error(lock_error(
                            &format!("waiting for the row of `{name}`"),
                            error,
                        )));
                    }
                },
            };
            if tagged(&rows, "row").next().is_none() {
                // First use of the name: create its row (committed, empty), then queue on
                // it. The insert waits only if someone created and locked the row since
                // the read above; even a zero budget gives it CREATE_GRACE to finish.
                let create = format!("ROLLBACK; INSERT IGNORE INTO {t} (name) VALUES ({n})");
                let until = request.deadline().max(Instant::now() + CREATE_GRACE);
                match self.wait(&mut dedicated, create, until, false, tx).await {
                    Ok(_) => continue,
                    Err((Some(stop), _)) => {
                        self.discard(dedicated);
                        return Err(Failed::Stopped(stop));
                    }
                    Err((None, error)) => {
                        self.discard(dedicated);
                        return Err(Failed::Error(lock_error(
                            &format!("creating the row of `{name}`"),
                            error,
                        )));
                    }
                }
            }
            let committed = tagged(&rows, "committed")
                .next()
                .map(|row| HoldRow::read(row, 1))
                .transpose();
            match committed {
                Ok(None) => {}
                Ok(Some(record)) => {
                    if let Err(foreign) = record.judge_committed(&self.table.holds(), name) {
                        self.rollback_and_keep(dedicated).await;
                        return Err(Failed::Error(foreign));
                    }
                }
                Err(error) => {
                    self.discard(dedicated);
                    return Err(Failed::Error(lock_error(
                        &format!("reading the record of `{name}`"),
                        error,
                    )));
                }
            }
            match fence_counter(&rows) {
                Some(Ok(counter)) => match counter.checked_add(1) {
                    Some(expected) => break expected,
                    None => {
                        self.rollback_and_keep(dedicated).await;
                        return Err(Failed::Error(LockError::Foreign {
                            name: name.to_string(),
                            found: format!(
                                "the row of table `{}` has its fence at the maximum ({counter})",
                                self.table.fences()
                            ),
                        }));
                    }
                },
                Some(Err(error)) => {
                    self.discard(dedicated);
                    return Err(Failed::Error(lock_error(
                        &format!("reading the fence counter of `{name}`"),
                        error,
                    )));
                }
                None => {
                    self.discard(dedicated);
                    return Err(Failed::Error(LockError::Backend {
                        message: format!("granting `{name}`: the server returned no fence counter"),
                        source: None,
                    }));
                }
            }
        };
        // The row lock is ours: take the next fence and, at the same time, record the hold in
        // the row (inside the transaction) with the fence the bump is expected to issue. The
        // record is the last statement on the hold's connection, so the server's idle clock
        // (`wait_timeout`) starts after `valid_from` and the lease's local deadline is never
        // later than the server ending the hold.
        let valid_from = Instant::now();
        let record = format!(
            "INSERT INTO {h} (name, token, fence, acquired_at, connection_id) \
             VALUES ({n}, {}, {expected}, NOW(6), CONNECTION_ID())",
            hex(token.as_str().as_bytes()),
        );
        let (bumped, recorded) = futures::join!(
            self.bump_fence(name),
            run(&mut dedicated.conn, AssertSqlSafe(record))
        );
        let fence = match bumped {
            Ok(fence) => fence,
            Err(error) => {
                self.rollback_and_keep(dedicated).await;
                return Err(Failed::Error(error));
            }
        };
        // Out of InnoDB's queue: the next of this client's waiters may enter it.
        drop(place);
        let mut recorded = recorded.map(drop);
        if recorded.is_ok() && fence.get() != expected {
            // Another bump landed between the read and ours (one whose client gave up
            // waiting for its answer): correct the record.
            let correct = format!("UPDATE {h} SET fence = {} WHERE name = {n}", fence.get());
            recorded = run(&mut dedicated.conn, AssertSqlSafe(correct))
                .await
                .map(drop);
        }
        if let Err(error) = recorded {
            // 1062: a record was committed for the name after the read above (no hold of
            // this library commits one).
            if server_code(&error) == Some(1062) {
                self.rollback_and_keep(dedicated).await;
                return Err(Failed::Error(LockError::Foreign {
                    name: name.to_string(),
                    found: format!(
                        "table `{}` has a committed record for the name; this library never commits a hold",
                        self.table.holds()
                    ),
                }));
            }
            self.discard(dedicated);
            return Err(Failed::Error(lock_error(
                &format!("recording the hold of `{name}`"),
                error,
            )));
        }
        if Instant::now() >= lock_core::backend::local_deadline(valid_from, request.ttl()) {
            // The grant came too late to be of use (its local deadline has passed): give the
            // lock back rather than hand out a hold that is over before it begins.
            tracing::debug!(lock = %name, "a grant came back past its local deadline; rolling back");
            self.rollback_and_keep(dedicated).await;
            return Err(Failed::Late);
        }
        let (notifier, signal) = end_signal();
        let commands = hold::spawn(
            self.clone(),
            hold::Hold {
                name: name.clone(),
                token: token.clone(),
                valid_from,
                ttl: request.ttl(),
            },
            dedicated,
            notifier,
        );
        self.holds().insert(
            token.clone(),
            Arc::new(Held {
                name: name.clone(),
                fence,
                commands,
            }),
        );
        let lease = Lease::new(name.clone(), token, fence, request.ttl());
        Ok(Grant::new(lease, valid_from).with_end(signal))
    }

    /// Runs `sql` on `dedicated`, racing it against `deadline` (unless `nowait`) and the
    /// caller leaving. When either wins, the statement is killed and its answer drained, so
    /// the connection is never left mid-statement; the caller then closes it.
    async fn wait(
        &self,
        dedicated: &mut Dedicated,
        sql: String,
        deadline: Instant,
        nowait: bool,
        tx: &mut oneshot::Sender<Result<PendingGrant, LockError>>,
    ) -> Result<Vec<MySqlRow>, (Option<Stop>, sqlx::Error)> {
        let id = dedicated.id;
        let query = run(&mut dedicated.conn, AssertSqlSafe(sql));
        tokio::pin!(query);
        let deadline = tokio::time::sleep_until(deadline.into());
        tokio::pin!(deadline);
        let stop = tokio::select! {
            biased;
            result = &mut query => return result.map_err(|e| (None, e)),
            () = &mut deadline, if !nowait => Stop::Deadline,
            () = tx.closed() => Stop::Cancelled,
        };
        if self
            .kill_query(id, Instant::now() + self.connect_timeout)
            .await
        {
            // Interrupted (1317), or granted just before the kill: either way the caller
            // closes the connection, which rolls back anything it holds.
            let _ = tokio::time::timeout(self.connect_timeout, query).await;
        }
        Err((
            Some(stop),
            sqlx::Error::Protocol(format!("wait stopped: {stop:?}")),
        ))
    }

    /// Rolls back and keeps the connection, or closes it if the rollback fails.
    async fn rollback_and_keep(&self, mut dedicated: Dedicated) {
        match run(&mut dedicated.conn, "ROLLBACK").await {
            Ok(_) => self.keep(dedicated),
            Err(_) => self.discard(dedicated),
        }
    }

    /// Issues the next fence for `name`: an autocommitted bump of its counter row, whose new
    /// value the server returns with the statement (`LAST_INSERT_ID(expr)`).
    async fn bump_fence(&self, name: &LockName) -> Result<Fence, LockError> {
        let what = format!("issuing a fence for `{name}`");
        let until = Instant::now() + self.statement_timeout;
        let bump = || {
            retry_deadlocks(|| {
                let query =
                    sqlx::query(AssertSqlSafe(self.bump.clone())).bind(name.as_str().as_bytes());
                execute_within(&self.pool, until, query)
            })
        };
        // Pooled connections the server closed since their last use (a restart) fail at once;
        // each is closed, and a later try gets a live one (at most one try per pooled
        // connection more). A bump that committed but lost its answer only skips a fence:
        // fences grow, and the record takes the fence issued.
        let mut tries = self.pool.options().get_max_connections();
        let done = loop {
            match bump().await {
                Err(error)
                    if tries > 0
                        && classify(&error) == Class::Connection
                        && !is_timed_out(&error) =>
                {
                    tries -= 1;
                }
                other => break other,
            }
        }
        .map_err(|e| lock_error(&what, e))?;
        match done.last_insert_id() {
            0 => Err(LockError::Backend {
                message: format!("{what}: the server returned no fence"),
                source: None,
            }),
            fence => Ok(Fence::new(fence)),
        }
    }

    /// Ends a hold whose grant nobody received: dropping its handle makes its task roll it
    /// back (without a runtime the task is gone, and its connection closed with it).
    fn abandon(&self, token: &LeaseToken) {
        self.holds().remove(token);
    }
}

/// The committed fence counter a script read with `SELECT 'counter', <fence> ...`, if it
/// returned that row.
fn fence_counter(rows: &[MySqlRow]) -> Option<Result<u64, sqlx::Error>> {
    tagged(rows, "counter")
        .next()
        .map(|row| row.try_get::<u64, _>(1))
}

/// A grant on its way to the caller: released in the background if it is dropped unclaimed
/// (the caller's `acquire` future was dropped just as the lock was granted).
struct PendingGrant {
    grant: Grant,
    shared: Arc<Shared>,
    claimed: bool,
}

impl PendingGrant {
    /// The grant, now the caller's: dropping this no longer releases it.
    fn claim(mut self) -> Grant {
        self.claimed = true;
        self.grant.clone()
    }
}

impl Drop for PendingGrant {
    fn drop(&mut self) {
        if !self.claimed {
            let lease = &self.grant.lease;
            tracing::debug!(lock = %lease.name(), "acquire dropped as the lock was granted; releasing");
            self.shared.abandon(lease.token());
        }
    }
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
            pool,
            options,
            Duration::from_secs(1),
            TableName::new("t").unwrap(),
            0,
            String::new(),
            Duration::from_secs(1),
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
