//! The row lock's acquisition: the task that owns the dedicated connection while it waits
//! in InnoDB's queue, takes the row, bumps the fence and records the hold, and cleans up when
//! its caller has left.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use lock_core::{
    Fence, Lease, LockError, LockName,
    backend::{AcquireRequest, Grant, LeaseToken, end_signal, local_deadline},
};
use sqlx::{AssertSqlSafe, mysql::MySqlRow};
use tokio::sync::oneshot;

use super::{
    Held, Shared,
    connections::{Dedicated, Stop},
    fence_counter, hold,
};
use crate::{
    config::ceil_secs,
    error::{Class, Error, classify, server_code},
    local_queue::Place,
    rows::{HOLD_COLUMNS, HoldRow},
    sql::{Deadlocks, hex, is_timed_out, retry_deadlocks, run, tagged},
};

/// How long creating a name's row may take even when the wait budget is spent.
const CREATE_GRACE: Duration = Duration::from_secs(1);

/// Where the acquisition task answers its caller: the answer, and a word sent the moment
/// the wait budget runs out while a statement waits (see [`Shared::wait`]), before that
/// statement is killed.
///
/// The answer after a wait stopped by the budget is [`LockError::Timeout`] whatever the kill
/// finds (a grant that lands just before the kill is rolled back with the connection), so the
/// caller answers at once on that word and leaves the kill, the drain and the close to the
/// task. A server slow to kill (a thousand waits ending together) or not answering does not
/// hold up the answer to such a wait. (The other steps, a connect or the steps after a
/// grant, are bounded as before, and lock-core cuts an answer a second after the budget.)
///
/// The task's clean-up runs while the client's runtime does: a runtime shut down right
/// after the answer drops the task, its connection closes without the kill, and the server
/// ends the orphaned wait at its `innodb_lock_wait_timeout` (the budget rounded up to whole
/// seconds), rolling back a grant that lands meanwhile.
pub(super) struct Answer {
    tx: oneshot::Sender<Result<PendingGrant, LockError>>,
    out_of_time: Option<oneshot::Sender<()>>,
}

impl Answer {
    /// Answers on `tx`; tells `out_of_time` when the budget ran out mid-wait.
    pub(super) fn new(
        tx: oneshot::Sender<Result<PendingGrant, LockError>>,
        out_of_time: oneshot::Sender<()>,
    ) -> Self {
        Self {
            tx,
            out_of_time: Some(out_of_time),
        }
    }

    /// Resolves when the caller has left (dropped its future, or answered on
    /// [`Answer::out_of_time`]).
    pub(super) async fn closed(&mut self) {
        self.tx.closed().await;
    }

    /// Whether the caller has left.
    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The wait budget ran out while a statement waited: the caller may answer Timeout now.
    pub(super) fn out_of_time(&mut self) {
        if let Some(out_of_time) = self.out_of_time.take() {
            let _ = out_of_time.send(());
        }
    }
}

/// A failed acquisition step.
pub(super) enum Failed {
    /// Give up with this error (the connection has been dealt with).
    Error(LockError),
    /// The budget ran out or the caller left.
    Stopped(Stop),
    /// Granted, but only after the grant's own local deadline (the fence bump waited longer
    /// than the TTL): rolled back; try again if the budget allows.
    Late,
}

/// A failed step of an acquisition, and what to do with its connection.
struct Step {
    exit: Exit,
    failed: Failed,
}

/// What becomes of the connection after a failed step.
enum Exit {
    /// Roll back and keep it for the next hold.
    Rollback,
    /// Close it (it may be mid-statement, or broken).
    Close,
}

impl Step {
    fn rollback(failed: Failed) -> Self {
        Self {
            exit: Exit::Rollback,
            failed,
        }
    }

    fn close(failed: Failed) -> Self {
        Self {
            exit: Exit::Close,
            failed,
        }
    }
}

impl Shared {
    /// The task behind `acquire`: answers on `tx`, and cleans up if nobody listens.
    pub(super) async fn acquire_task(self: Arc<Self>, request: AcquireRequest, mut tx: Answer) {
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
        let _ = tx.tx.send(answer);
    }

    /// Takes the row lock on a dedicated connection, bumps the fence, records the hold.
    async fn lock_row(
        self: &Arc<Self>,
        request: &AcquireRequest,
        tx: &mut Answer,
    ) -> Result<Grant, Failed> {
        let name = request.name();
        // Kept until the connection is dealt with, unless `record_hold` gives it up first.
        let mut place = Some(self.take_turn(request, tx).await?);
        let (mut dedicated, fresh) = self.checkout().await.map_err(Failed::Error)?;
        let token = LeaseToken::random();
        let steps = async {
            let expected = self
                .wait_for_row(&mut dedicated, fresh, request, tx)
                .await?;
            self.record_hold(&mut dedicated, name, &token, expected, &mut place)
                .await
        };
        let (fence, valid_from) = match steps.await {
            Ok(recorded) => recorded,
            Err(Step { exit, failed }) => {
                match exit {
                    Exit::Rollback => self.rollback_and_keep(dedicated).await,
                    Exit::Close => self.discard(dedicated),
                }
                return Err(failed);
            }
        };
        if Instant::now() >= local_deadline(valid_from, request.ttl()) {
            // The grant came too late to be of use (its local deadline has passed): give the
            // lock back rather than hand out a hold that is over before it begins.
            tracing::debug!(lock = %name, "a grant came back past its local deadline; rolling back");
            self.rollback_and_keep(dedicated).await;
            return Err(Failed::Late);
        }
        let hold = hold::Hold {
            name: name.clone(),
            token,
            valid_from,
            ttl: request.ttl(),
        };
        Ok(self.start_hold(hold, fence, dedicated))
    }

    /// Runs `sql` on `dedicated`, racing it against `deadline` (unless `nowait`) and the
    /// caller of `acquire` leaving. When either wins, the statement is killed (tried until
    /// the connect time-out) and, when the kill went through, its answer drained, so the
    /// connection is never reused mid-statement: the caller of `wait` then closes it. When
    /// the deadline wins, `tx` is told so first ([`Answer::out_of_time`]): the caller of
    /// `acquire` answers Timeout without waiting for the kill.
    pub(super) async fn wait(
        &self,
        dedicated: &mut Dedicated,
        sql: String,
        deadline: Instant,
        nowait: bool,
        tx: &mut Answer,
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
        if stop == Stop::Deadline {
            tx.out_of_time();
        }
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

    /// Waits for this client's turn to wait in InnoDB for the name: only one acquisition of
    /// a client waits there per name; the others wait here.
    async fn take_turn(
        &self,
        request: &AcquireRequest,
        tx: &mut Answer,
    ) -> Result<Place<'_>, Failed> {
        let mut place = self.queue.join(request.name());
        if request.deadline() <= Instant::now() {
            return if place.try_turn() {
                Ok(place)
            } else {
                Err(Failed::Stopped(Stop::Deadline))
            };
        }
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
        Ok(place)
    }

    /// Waits in InnoDB's queue for the name's row (creating the row on first use). Returns
    /// the fence the bump after the grant is expected to issue.
    async fn wait_for_row(
        &self,
        dedicated: &mut Dedicated,
        mut fresh: bool,
        request: &AcquireRequest,
        tx: &mut Answer,
    ) -> Result<u64, Step> {
        let name = request.name();
        // Deadlocks cannot happen on one row; retrying only guards against a surprise.
        let mut deadlocks = Deadlocks::default();
        loop {
            let remaining = request.deadline().saturating_duration_since(Instant::now());
            let nowait = remaining.is_zero();
            let seconds = ceil_secs(remaining).max(1);
            let sql = self.row_wait_sql(dedicated, request, nowait, seconds);
            let error = match self
                .wait(dedicated, sql, request.deadline(), nowait, tx)
                .await
            {
                Ok(rows) => {
                    if !nowait {
                        dedicated.lock_wait = seconds;
                    }
                    if tagged(&rows, "row").next().is_some() {
                        return self.judge_grant(&rows, name);
                    }
                    self.create_row(dedicated, request, tx).await?;
                    continue;
                }
                Err((Some(stop), _)) => return Err(Step::close(Failed::Stopped(stop))),
                Err((None, error)) => error,
            };
            match classify(&error) {
                // A server-side time limit (turned off on this session, but a server may
                // enforce one anyway): the wait ended without the lock, like a lock-wait
                // timeout.
                Class::LockWait | Class::StatementTimeout => {
                    if !nowait {
                        dedicated.lock_wait = seconds;
                    }
                    return Err(Step::rollback(Failed::Stopped(Stop::Deadline)));
                }
                Class::Deadlock if deadlocks.retry(&error) => {}
                Class::Connection if !fresh => {
                    // An idle connection the server closed meanwhile: use a new one.
                    let new = self
                        .connect()
                        .await
                        .map_err(|e| Step::close(Failed::Error(e)))?;
                    self.discard(std::mem::replace(dedicated, new));
                    fresh = true;
                }
                _ => {
                    let what = format!("waiting for the row of `{name}`");
                    return Err(Step::close(Failed::Error(LockError::from(Error::new(
                        &what, error,
                    )))));
                }
            }
        }
    }

    /// The wait and, in the same round trip once granted, any committed record (there is
    /// none unless someone else wrote it) and the fence the bump after the grant will issue:
    /// the committed counter plus one, read without a lock (a shared lock on the counter row
    /// would block that bump until the hold ends).
    fn row_wait_sql(
        &self,
        dedicated: &mut Dedicated,
        request: &AcquireRequest,
        nowait: bool,
        seconds: u64,
    ) -> String {
        let (t, f, h) = (
            self.table.quoted(),
            self.table.fences().quoted(),
            self.table.holds().quoted(),
        );
        let n = hex(request.name().as_str().as_bytes());
        let mut sql = dedicated.wait_timeout_for(request.ttl());
        if !nowait && dedicated.lock_wait != seconds {
            sql.push_str(&format!(
                "SET SESSION innodb_lock_wait_timeout = {seconds}; "
            ));
        }
        sql.push_str(&format!(
            "ROLLBACK; START TRANSACTION; \
             SELECT 'row', name FROM {t} WHERE name = {n} FOR UPDATE{}; \
             SELECT 'committed', {HOLD_COLUMNS} FROM {h} WHERE name = {n}; \
             SELECT 'counter', CAST(COALESCE(MAX(fence), 0) AS UNSIGNED) FROM {f} WHERE name = {n}",
            if nowait { " NOWAIT" } else { "" },
        ));
        sql
    }

    /// First use of the name: creates its row (committed, empty) so the next try can queue
    /// on it. The insert waits only if someone created and locked the row since the read
    /// before; even a zero budget gives it [`CREATE_GRACE`] to finish.
    async fn create_row(
        &self,
        dedicated: &mut Dedicated,
        request: &AcquireRequest,
        tx: &mut Answer,
    ) -> Result<(), Step> {
        let t = self.table.quoted();
        let name = request.name();
        let n = hex(name.as_str().as_bytes());
        let create = format!("ROLLBACK; INSERT IGNORE INTO {t} (name) VALUES ({n})");
        let until = request.deadline().max(Instant::now() + CREATE_GRACE);
        match self.wait(dedicated, create, until, false, tx).await {
            Ok(_) => Ok(()),
            Err((Some(stop), _)) => Err(Step::close(Failed::Stopped(stop))),
            Err((None, error)) => {
                let what = format!("creating the row of `{name}`");
                Err(Step::close(Failed::Error(LockError::from(Error::new(
                    &what, error,
                )))))
            }
        }
    }

    /// Judges what the granted wait read: a committed record is foreign; the fence counter
    /// gives the fence the bump is expected to issue (a counter at its maximum is foreign).
    fn judge_grant(&self, rows: &[MySqlRow], name: &LockName) -> Result<u64, Step> {
        let read_failed = |what: &str, error| {
            let what = format!("{what} of `{name}`");
            Step::close(Failed::Error(LockError::from(Error::new(&what, error))))
        };
        let committed = tagged(rows, "committed")
            .next()
            .map(|row| HoldRow::read(row, 1))
            .transpose()
            .map_err(|e| read_failed("reading the record", e))?;
        if let Some(record) = committed {
            record
                .judge_committed(&self.table.holds(), name)
                .map_err(|foreign| Step::rollback(Failed::Error(foreign)))?;
        }
        let counter = fence_counter(rows)
            .ok_or_else(|| {
                Step::close(Failed::Error(LockError::backend_msg(format!(
                    "granting `{name}`: the server returned no fence counter"
                ))))
            })?
            .map_err(|e| read_failed("reading the fence counter", e))?;
        counter.checked_add(1).ok_or_else(|| {
            Step::rollback(Failed::Error(LockError::foreign(
                name.to_string(),
                format!(
                    "the row of table `{}` has its fence at the maximum ({counter})",
                    self.table.fences()
                ),
            )))
        })
    }

    /// The row lock is ours: takes the next fence and, at the same time, records the hold in
    /// `<table>_holds` (inside the transaction) with the fence the bump is expected to issue,
    /// correcting it if the bump issued another. The record is the last statement on the
    /// hold's connection, so the server's idle clock (`wait_timeout`) starts after
    /// `valid_from` and the lease's local deadline is never later than the server ending the
    /// hold. Returns the fence and `valid_from`.
    async fn record_hold(
        &self,
        dedicated: &mut Dedicated,
        name: &LockName,
        token: &LeaseToken,
        expected: u64,
        place: &mut Option<Place<'_>>,
    ) -> Result<(Fence, Instant), Step> {
        let h = self.table.holds().quoted();
        let n = hex(name.as_str().as_bytes());
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
        let fence = bumped.map_err(|e| Step::rollback(Failed::Error(e)))?;
        // Out of InnoDB's queue: the next of this client's waiters may enter it.
        drop(place.take());
        let mut recorded = recorded.map(drop);
        if recorded.is_ok() && fence.get() != expected {
            // Another bump landed between the read and ours (one whose client gave up
            // waiting for its answer): correct the record.
            let correct = format!("UPDATE {h} SET fence = {} WHERE name = {n}", fence.get());
            recorded = run(&mut dedicated.conn, AssertSqlSafe(correct))
                .await
                .map(drop);
        }
        match recorded {
            Ok(()) => Ok((fence, valid_from)),
            // 1062: a record was committed for the name after the read before (no hold of
            // this library commits one).
            Err(error) if server_code(&error) == Some(1062) => {
                Err(Step::rollback(Failed::Error(LockError::foreign(
                    name.to_string(),
                    format!(
                        "table `{}` has a committed record for the name; this library never commits a hold",
                        self.table.holds()
                    ),
                ))))
            }
            Err(error) => {
                let what = format!("recording the hold of `{name}`");
                Err(Step::close(Failed::Error(LockError::from(Error::new(
                    &what, error,
                )))))
            }
        }
    }

    /// Hands the connection to the hold's task and registers the hold; the grant carries its
    /// end signal.
    fn start_hold(self: &Arc<Self>, hold: hold::Hold, fence: Fence, dedicated: Dedicated) -> Grant {
        let (notifier, signal) = end_signal();
        let (name, token, valid_from, ttl) = (
            hold.name.clone(),
            hold.token.clone(),
            hold.valid_from,
            hold.ttl,
        );
        let commands = hold::spawn(self.clone(), hold, dedicated, notifier);
        self.holds().insert(
            token.clone(),
            Arc::new(Held {
                name: name.clone(),
                fence,
                commands,
            }),
        );
        let lease = Lease::new(name, token, fence, ttl);
        Grant::new(lease, valid_from).with_end(signal)
    }

    /// Issues the next fence for `name`: an autocommitted bump of its counter row, whose new
    /// value the server returns with the statement (`LAST_INSERT_ID(expr)`).
    async fn bump_fence(&self, name: &LockName) -> Result<Fence, LockError> {
        let what = format!("issuing a fence for `{name}`");
        let until = Instant::now() + self.statement_timeout;
        let bump = || {
            retry_deadlocks(|| {
                self.anchor.execute_short(until, || {
                    sqlx::query(AssertSqlSafe(self.bump.clone())).bind(name.as_str().as_bytes())
                })
            })
        };
        // Pooled connections the server closed since their last use (a restart) fail at once;
        // each is closed, and a later try gets a live one (at most one try per pooled
        // connection, and the kept one, more; the anchor's is tried again in `short`). A bump
        // that committed but lost its answer only skips a fence: fences grow, and the record
        // takes the fence issued.
        let mut tries = self.pool.options().get_max_connections() + 1;
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
        .map_err(|e| LockError::from(Error::new(&what, e)))?;
        match done.last_insert_id() {
            0 => Err(LockError::backend_msg(format!(
                "{what}: the server returned no fence"
            ))),
            fence => Ok(Fence::new(fence)),
        }
    }
}

/// A grant on its way to the caller: released in the background if it is dropped unclaimed
/// (the caller's `acquire` future was dropped just as the lock was granted).
pub(super) struct PendingGrant {
    grant: Grant,
    shared: Arc<Shared>,
    claimed: bool,
}

impl PendingGrant {
    /// The grant, now the caller's: dropping this no longer releases it.
    pub(super) fn claim(mut self) -> Grant {
        self.claimed = true;
        self.grant.clone()
    }
}

impl Drop for PendingGrant {
    fn drop(&mut self) {
        if !self.claimed {
            let lease = &self.grant.lease;
            tracing::debug!(lock = %lease.name(), "acquire dropped as the lock was granted; releasing");
            self.shared.forget(lease.token());
        }
    }
}
