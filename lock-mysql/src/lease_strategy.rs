//! The lease strategy: one row per lock with the holder's token, fence and expiry.
//!
//! - **Acquire** is one statement: `INSERT ... ON DUPLICATE KEY UPDATE` inserts the row, or
//!   locks the existing one exclusively (the X lock a `SELECT ... FOR UPDATE` takes) for the
//!   statement's transaction and takes it over only if the server finds it released or
//!   expired by `NOW(6)`, bumping its fence.
//! - **Outcome**: when it takes a row over, the statement also evaluates
//!   `LAST_INSERT_ID(fence + 1)` on that row, so the server's reply carries the fence it now
//!   holds; a statement that took nothing carries 0 (the value is per statement, set only when
//!   the expression runs). This is a value read from the row inside the locked statement, not
//!   the `rows_affected` count that `CLIENT_FOUND_ROWS` makes ambiguous for upserts. Every
//!   other outcome (a new row, a busy or foreign one) is judged by reading the row back.
//!   Release and the renewal of one lease work the same way with `LAST_INSERT_ID(fence)`.
//!   Renewals of several leases are batched in one transaction and judged by reading the rows
//!   back in it.
//! - **Clock**: every time comparison and expiry is computed by the server from `NOW(6)`;
//!   the client sends only the TTL as a number of microseconds.
//! - Released rows stay, with token and expiry NULL, so the fence never goes back.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
    time::Instant,
};

use lock_core::{
    Fence, Lease, LockError, LockInfo, LockName,
    backend::{AcquireRequest, Attempt, Grant, LeaseToken, poll_until_acquired, validate_ttl},
};
use sqlx::{AssertSqlSafe, MySqlPool, Row, mysql::MySqlQueryResult};

use crate::{
    TableName,
    error::{Class, classify, lock_error},
    lease_queue,
    lock_row::{
        LEASE_COLUMNS, LEASE_TAKEABLE, LeaseRow, LeaseState, lease_current, lease_token_is_ours,
    },
    script::{
        broken, execute_within, fetch_optional_within, hex, retry_broken, retry_deadlocks, run,
        run_pooled, tagged, within,
    },
};

/// Leases renewed by one batch at most (a longer list is split).
const RENEW_BATCH: usize = 100;

/// The least time one acquire try gets (a zero budget is one try, and a try needs a round
/// trip): the statement is stopped on the server after this long.
pub(crate) const MIN_TRY: Duration = Duration::from_millis(100);

/// How long after its own time limit a statement's answer may take to arrive before the
/// connection counts as gone.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_millis(250);

/// The lease strategy over one pool and table.
#[derive(Debug, Clone)]
pub(crate) struct LeaseStrategy {
    pool: MySqlPool,
    table: TableName,
    sql: Arc<Statements>,
    limits: Limits,
    /// Permits to park a waiter on a pooled connection (half the pool, at least one).
    parking: Arc<tokio::sync::Semaphore>,
}

/// How long statements may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The bound of calls without a wait budget ([`crate::MySqlConfig::statement_timeout`]).
    pub(crate) statement: Duration,
    /// The pooled sessions' `innodb_lock_wait_timeout`: the longest a statement waits for a
    /// row on its own.
    pub(crate) lock_wait: Duration,
    /// Whether the server is MariaDB (`SET STATEMENT max_statement_time = ... FOR`), else
    /// MySQL (the `SET_VAR(innodb_lock_wait_timeout = ...)` hint, whole seconds).
    pub(crate) mariadb: bool,
}

/// The statements of one table, built once (and prepared once per connection by sqlx).
#[derive(Debug)]
struct Statements {
    acquire: Arc<str>,
    /// Release when nobody queues ([`lease_queue::release_alone`]).
    release_alone: Arc<str>,
    /// What each `?` of `acquire` stands for, in order.
    acquire_args: Vec<Arg>,
    read: Arc<str>,
    renew: Arc<str>,
}

/// Takes an abandoned `acquire` call's place out of the queue, in the background, when the
/// call is dropped before it answered (see [`LeaseStrategy::leave`]).
struct PlaceGuard<'a> {
    strategy: &'a LeaseStrategy,
    name: &'a LockName,
    token: &'a LeaseToken,
    queued: &'a AtomicBool,
    armed: bool,
}

impl Drop for PlaceGuard<'_> {
    fn drop(&mut self) {
        if !self.armed || !self.queued.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the place lapses.
            return;
        };
        let (pool, until) = (self.strategy.pool.clone(), self.strategy.statement_until());
        let sql = lease_queue::leave_batch(
            &self.strategy.table,
            self.name.as_str().as_bytes(),
            self.token.as_str().as_bytes(),
        );
        let name = self.name.clone();
        drop(runtime.spawn(async move {
            if let Err(error) = run_pooled(&pool, sql, until).await {
                tracing::debug!(lock = %name, %error, "leaving the waiters' queue failed; the place lapses");
            }
        }));
    }
}

/// The outcome of one acquire try.
enum Try {
    Granted(Grant),
    /// Busy; the holder's time left, when known.
    Busy(Option<Duration>),
    /// Busy; the caller parked until woken or its park ended: try again at once.
    Parked,
    /// Busy, and the caller is first in line: try again soon (or, if the holder's time left is
    /// shorter, then).
    First(Option<Duration>),
}

/// What a placeholder of the acquire statement stands for.
#[derive(Debug, Clone, Copy)]
enum Arg {
    /// The lock name's bytes.
    Name,
    /// The caller's token.
    Token,
    /// The TTL in microseconds.
    Ttl,
}

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = table.quoted();
        // Free, and nobody queues ahead of the caller (see `lease_queue`; its condition's
        // placeholders are name, token, token).
        let takeable = format!(
            "({LEASE_TAKEABLE}) AND {}",
            lease_queue::allowed(&table.queue())
        );
        let takeable_args = [Arg::Name, Arg::Token, Arg::Token];
        // The first assignment decides on the row as it was; the others follow it whichever
        // order the server evaluates assignments in (MariaDB's SIMULTANEOUS_ASSIGNMENT mode
        // included): `token = ?` is true afterwards only if the row was taken.
        let taken = format!("({takeable}) OR token = ?");
        let taken_args = [&takeable_args[..], &[Arg::Token]].concat();
        let acquire_args = [
            &[Arg::Name, Arg::Token, Arg::Ttl][..],
            &takeable_args,
            &[Arg::Token],
            &taken_args,
            &taken_args,
            &[Arg::Ttl],
            &taken_args,
        ]
        .concat();
        Self {
            acquire: format!(
                "INSERT INTO {t} (name, token, fence, expires_at, acquired_at) \
                 VALUES (?, ?, 1, NOW(6) + INTERVAL ? MICROSECOND, NOW(6)) \
                 ON DUPLICATE KEY UPDATE \
                 token = IF({takeable}, ?, token), \
                 fence = IF({taken}, LAST_INSERT_ID(fence + 1), fence), \
                 expires_at = IF({taken}, NOW(6) + INTERVAL ? MICROSECOND, expires_at), \
                 acquired_at = IF({taken}, NOW(6), acquired_at)"
            )
            .into(),
            acquire_args,
            release_alone: lease_queue::release_alone(table).into(),
            read: format!("SELECT {LEASE_COLUMNS} FROM {t} WHERE name = ?").into(),
            renew: format!(
                "UPDATE {t} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND, \
                 fence = LAST_INSERT_ID(fence) \
                 WHERE name = ? AND {}",
                lease_current("?", "?")
            )
            .into(),
        }
    }
}

impl LeaseStrategy {
    pub(crate) fn new(pool: MySqlPool, table: TableName, limits: Limits) -> Self {
        let parking = (pool.options().get_max_connections() / 2).max(1);
        Self {
            parking: Arc::new(tokio::sync::Semaphore::new(parking as usize)),
            pool,
            sql: Arc::new(Statements::new(&table)),
            table,
            limits,
        }
    }

    /// The acquire statement for one try with its values written in, stopped by the server
    /// after `limit`: `SET STATEMENT max_statement_time` on MariaDB; on MySQL the row-lock wait
    /// is bounded by `SET_VAR(innodb_lock_wait_timeout)`, whole seconds, rounded up.
    fn bounded_acquire(&self, name: &[u8], token: &[u8], ttl_us: u64, limit: Duration) -> String {
        let (n, k, ttl) = (hex(name), hex(token), ttl_us.to_string());
        let mut sql = String::new();
        for (i, part) in self.sql.acquire.split('?').enumerate() {
            sql.push_str(part);
            if let Some(arg) = self.sql.acquire_args.get(i) {
                sql.push_str(match arg {
                    Arg::Name => &n,
                    Arg::Token => &k,
                    Arg::Ttl => &ttl,
                });
            }
        }
        if self.limits.mariadb {
            format!(
                "SET STATEMENT max_statement_time = {}.{:06} FOR {sql}",
                limit.as_secs(),
                limit.subsec_micros()
            )
        } else {
            let seconds = crate::config::ceil_secs(limit).max(1);
            sql.replacen(
                "INSERT INTO",
                &format!("INSERT /*+ SET_VAR(innodb_lock_wait_timeout = {seconds}) */ INTO"),
                1,
            )
        }
    }

    /// When a call without a wait budget must have its answer.
    fn statement_until(&self) -> Instant {
        Instant::now() + self.limits.statement
    }

    /// Acquires by polling: one statement per try, jittered back-off between tries bounded by
    /// the holder's remaining TTL as the server reports it.
    /// A busy try takes a place in the waiters' queue (see [`lease_queue`]); the first waiter
    /// tries again at short intervals.
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        // One token for every try of this call: it names the call's place in the queue.
        let token = LeaseToken::random();
        let place = lease_queue::place_for(request.backoff().max);
        let turn = lease_queue::turn_for(request.backoff().max);
        let streak = AtomicU32::new(0);
        let queued = AtomicBool::new(false);
        // If this future is dropped while it may have a place, the place (and a lease handed
        // to it meanwhile) goes in the background.
        let mut dropped = PlaceGuard {
            strategy: self,
            name: request.name(),
            token: &token,
            queued: &queued,
            armed: true,
        };
        let result = poll_until_acquired(request, || async {
            let mut outcome = self
                .try_once(request, &token, (place, turn), &queued)
                .await?;
            // After a park (woken, or its time up) try again at once, while the budget lasts.
            while matches!(outcome, Try::Parked) && Instant::now() < request.deadline() {
                outcome = self
                    .try_once(request, &token, (place, turn), &queued)
                    .await?;
            }
            Ok(match outcome {
                Try::Granted(grant) => Attempt::Acquired(grant),
                Try::Parked => Attempt::Busy {
                    expires_in: Some(Duration::ZERO),
                },
                Try::Busy(expires_in) => {
                    streak.store(0, Ordering::Relaxed);
                    Attempt::Busy { expires_in }
                }
                Try::First(expires_in) => {
                    let n = streak.fetch_add(1, Ordering::Relaxed);
                    let soon = lease_queue::first_delay(n);
                    Attempt::Busy {
                        expires_in: Some(expires_in.map_or(soon, |left| left.min(soon))),
                    }
                }
            })
        })
        .await;
        dropped.armed = false;
        if queued.load(Ordering::Relaxed) {
            self.leave(request.name(), &token, result.is_ok()).await;
        }
        result
    }

    /// Takes the place of `token` out of the queue: in the background after a grant (the
    /// grant need not wait for it: while the lease is held the place stands in nobody's way,
    /// and a release that comes first takes it out itself, see
    /// [`lease_queue::release_alone`]), else before answering. A place that cannot be deleted
    /// lapses.
    async fn leave(&self, name: &LockName, token: &LeaseToken, granted: bool) {
        let pool = self.pool.clone();
        let sql = if granted {
            // The lease is the caller's now: only the place goes.
            lease_queue::leave_place(
                &self.table,
                name.as_str().as_bytes(),
                token.as_str().as_bytes(),
            )
        } else {
            lease_queue::leave_batch(
                &self.table,
                name.as_str().as_bytes(),
                token.as_str().as_bytes(),
            )
        };
        let until = self.statement_until();
        let name = name.clone();
        let leave = async move {
            if let Err(error) = run_pooled(&pool, sql, until).await {
                tracing::debug!(lock = %name, %error, "leaving the waiters' queue failed; the place lapses");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if granted => drop(runtime.spawn(leave)),
            _ => leave.await,
        }
    }

    /// One try: insert the row, or take it over if it is released or expired and nobody
    /// queues ahead. The try ends by the wait budget (at least [`MIN_TRY`]): a row another
    /// transaction keeps locked makes it busy then, whatever `innodb_lock_wait_timeout` says.
    /// A busy try takes (or keeps) the caller's place in the queue and tells whether it is
    /// first (`queued` is set once it may have one).
    async fn try_once(
        &self,
        request: &AcquireRequest,
        token: &LeaseToken,
        (place, turn): (Duration, Duration),
        queued: &AtomicBool,
    ) -> Result<Try, LockError> {
        let name = request.name();
        let token = token.clone();
        let ttl = micros(request.ttl());
        let sent = Instant::now();
        let limit = request
            .deadline()
            .saturating_duration_since(sent)
            .max(MIN_TRY);
        // The server stops the statement at `limit`; its answer gets a little longer to come.
        let until = sent + limit + ANSWER_GRACE;
        let server_bound = limit < self.limits.lock_wait;
        let done = retry_deadlocks(|| async {
            let k = token.as_str().as_bytes();
            let mut conn = within(until, self.pool.acquire()).await?;
            let result = if server_bound {
                let sql = self.bounded_acquire(name.as_str().as_bytes(), k, ttl, limit);
                within(until, sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *conn)).await
            } else {
                let mut query = sqlx::query(AssertSqlSafe(self.sql.acquire.clone()));
                for arg in &self.sql.acquire_args {
                    query = match arg {
                        Arg::Name => query.bind(name.as_str().as_bytes()),
                        Arg::Token => query.bind(k),
                        Arg::Ttl => query.bind(ttl),
                    };
                }
                within(until, query.execute(&mut *conn)).await
            };
            if result
                .as_ref()
                .is_err_and(|e| classify(e) == Class::Connection)
            {
                conn.close_on_drop();
            }
            result
        })
        .await;
        let taken = match done {
            Ok(done) => done.last_insert_id(),
            // Someone kept the row locked past the try's limit: busy, try again later.
            Err(error) if matches!(classify(&error), Class::LockWait | Class::StatementTimeout) => {
                return Ok(Try::Busy(None));
            }
            Err(error) => return Err(lock_error(&format!("acquiring `{name}`"), error)),
        };
        let grant = if taken > 0 {
            Lease::new(name.clone(), token, Fence::new(taken), request.ttl())
        } else {
            // Nothing taken over: either the row was new (and is ours), or it is someone
            // else's, or nobody's but someone queues ahead: take a place in the queue.
            queued.store(true, Ordering::Relaxed);
            let (state, ahead) = self.queue_up(name, &token, (place, turn), until).await?;
            // Without a park, the first two poll fast: the second is first once the first is
            // served.
            let first = ahead <= 1;
            let budget = request.deadline().saturating_duration_since(Instant::now());
            if let Some(foreign) = state
                .as_ref()
                .and_then(|state| state.exhausted(&self.table, name))
            {
                return Err(foreign);
            }
            let left =
                |remaining_us: i64| Duration::from_micros(u64::try_from(remaining_us).unwrap_or(0));
            let grant =
                match &state {
                    // A new row: the insert took it (fence 1, the caller's TTL) without a fence
                    // in its reply.
                    Some(LeaseState::Held {
                        token: held,
                        fence,
                        remaining_us,
                    }) if *held == token && fence.get() == 1 && *remaining_us > 0 => Some(
                        Lease::new(name.clone(), token.clone(), *fence, request.ttl()),
                    ),
                    _ => None,
                };
            if let Some(grant) = grant {
                grant
            } else {
                return Ok(match state {
                    // A lease handed to this caller since its try (a fence above 1): it lasts
                    // only the caller's turn. The next try takes it for the caller's TTL, with a
                    // fence of its own.
                    Some(LeaseState::Held { token: held, .. }) if held == token => {
                        Try::Busy(Some(Duration::ZERO))
                    }
                    // Removed in between: try again at once.
                    None => Try::Busy(Some(Duration::ZERO)),
                    Some(LeaseState::Held { remaining_us, .. }) => {
                        let left = left(remaining_us);
                        if self.park(name, &token, left.min(budget)).await {
                            Try::Parked
                        } else if first {
                            Try::First(Some(left))
                        } else {
                            Try::Busy(Some(left))
                        }
                    }
                    // Free, and this caller is next: come again at once.
                    Some(_) if ahead == 0 => Try::Busy(Some(Duration::ZERO)),
                    // Free, but someone else is next: wait for its turn.
                    Some(_) => {
                        if self.park(name, &token, budget).await {
                            Try::Parked
                        } else if first {
                            Try::First(None)
                        } else {
                            Try::Busy(None)
                        }
                    }
                });
            }
        };
        if Instant::now() >= lock_core::backend::local_deadline(sent, request.ttl()) {
            // The answer came too late to be of use: the caller's hold would be over before it
            // began. Give the row back and try again (or time out).
            tracing::debug!(lock = %name, "a grant came back past its local deadline; releasing it");
            let _ = self.release(&grant).await;
            return Ok(Try::Busy(Some(Duration::ZERO)));
        }
        Ok(Try::Granted(Grant::new(grant, sent)))
    }

    /// Parks the caller for at most `at_most` (and [`lease_queue::PARK_MAX`]) on a pooled
    /// connection, until a release hands it the lease and wakes it (see [`lease_queue`]).
    /// False, without waiting, when no park permit is free or there is no time to park.
    async fn park(&self, name: &LockName, token: &LeaseToken, at_most: Duration) -> bool {
        let park = at_most.min(lease_queue::PARK_MAX);
        if park < Duration::from_millis(1) {
            return false;
        }
        let Ok(_permit) = self.parking.clone().try_acquire_owned() else {
            return false;
        };
        let until = Instant::now() + park + ANSWER_GRACE;
        let sql = lease_queue::park_batch(
            &self.table,
            name.as_str().as_bytes(),
            token.as_str().as_bytes(),
            park,
        );
        let Ok(mut conn) = within(until, self.pool.acquire()).await else {
            return false;
        };
        match within(until, run(&mut conn, AssertSqlSafe(sql))).await {
            Ok(_) => {}
            // Woken by the release's `KILL QUERY`.
            Err(error) if classify(&error) == Class::Interrupted => {}
            Err(error) => {
                tracing::debug!(lock = %name, %error, "parking failed; trying again");
                conn.close_on_drop();
            }
        }
        true
    }

    /// A busy try's queue work in one round trip (see [`lease_queue::busy_batch`]): the judged
    /// lease row of `name` (`None` when there is none) and how many waiters are ahead of
    /// `token` (0, 1, or 2 for two or more).
    async fn queue_up(
        &self,
        name: &LockName,
        token: &LeaseToken,
        (place, turn): (Duration, Duration),
        until: Instant,
    ) -> Result<(Option<LeaseState>, i64), LockError> {
        let what = || format!("queueing for `{name}`");
        let sql = lease_queue::busy_batch(
            &self.table,
            name.as_str().as_bytes(),
            token.as_str().as_bytes(),
            place,
            turn,
            LEASE_COLUMNS,
        );
        let rows = retry_deadlocks(|| run_pooled(&self.pool, sql.clone(), until))
            .await
            .map_err(|e| lock_error(&what(), e))?;
        let state = tagged(&rows, "row")
            .next()
            .map(|row| {
                LeaseRow::read(row, 1)
                    .map_err(|e| lock_error(&what(), e))?
                    .judge(&self.table, name)
            })
            .transpose()?;
        let ahead = tagged(&rows, "ahead")
            .next()
            .map(|row| row.try_get::<i64, _>(1))
            .transpose()
            .map_err(|e| lock_error(&what(), e))?
            .unwrap_or(0);
        Ok((state, ahead))
    }

    /// The judged row of `name`, `None` when there is none; read by `until`.
    async fn read(&self, name: &LockName, until: Instant) -> Result<Option<LeaseState>, LockError> {
        let what = || format!("reading the row of `{name}`");
        let query =
            || sqlx::query(AssertSqlSafe(self.sql.read.clone())).bind(name.as_str().as_bytes());
        let row = fetch_optional_within(&self.pool, until, query)
            .await
            .map_err(|e| lock_error(&what(), e))?;
        row.map(|row| {
            LeaseRow::read(&row, 0)
                .map_err(|e| lock_error(&what(), e))?
                .judge(&self.table, name)
        })
        .transpose()
    }

    pub(crate) async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        validate_ttl(ttl)?;
        self.renew_one(lease, ttl).await
    }

    /// Extends `lease` to `ttl` from now if it is current: one prepared statement, whose reply
    /// carries the fence of the row it changed (`LAST_INSERT_ID(fence)`), as release's does.
    /// A lease that is not current (expired, released, taken over, forged, or its row
    /// overwritten by another writer) changes nothing and answers `NotHeld`.
    async fn renew_one(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        let name = lease.name();
        if !lease_token_is_ours(lease.token()) {
            return Err(LockError::not_held(name));
        }
        let sent = Instant::now();
        let until = self.statement_until();
        let renew = || {
            retry_deadlocks(|| {
                let query = sqlx::query(AssertSqlSafe(self.sql.renew.clone()))
                    .bind(micros(ttl))
                    .bind(name.as_str().as_bytes())
                    .bind(lease.token().as_str().as_bytes())
                    .bind(lease.fence().get());
                execute_within(&self.pool, until, query)
            })
        };
        // Pooled connections the server closed since their last use (a restart) fail at once
        // and are closed; a renewal is idempotent, so it runs again on another (at most once
        // per pooled connection).
        let done = retry_broken(&self.pool, renew)
            .await
            .map_err(|e| lock_error(&format!("renewing `{name}`"), e))?;
        if changed_current(&done, lease) {
            Ok(Grant::new(lease.clone().with_ttl(ttl), sent))
        } else {
            Err(LockError::not_held(name))
        }
    }

    /// Renews every lease for its own TTL: one statement for a single lease (the watchdog's
    /// usual batch), else batches of one transaction each.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Grant, LockError>> {
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(RENEW_BATCH) {
            let mut valid = Vec::with_capacity(chunk.len());
            let mut slots = Vec::with_capacity(chunk.len());
            for lease in chunk {
                match validate_ttl(lease.ttl()) {
                    Ok(()) => {
                        slots.push(None);
                        valid.push(lease);
                    }
                    Err(error) => slots.push(Some(Err(error))),
                }
            }
            let mut renewed = match valid.as_slice() {
                [] => Vec::new(),
                [lease] => vec![self.renew_one(lease, lease.ttl()).await],
                many => match self.renew_batch(many).await {
                    Ok(results) => results,
                    // The batch failed as a whole: each lease reports the failure, with its
                    // variant (a refused statement stays a Backend error, not a retryable one).
                    Err(error) => many.iter().map(|_| Err(error.duplicate())).collect(),
                },
            }
            .into_iter();
            for slot in slots {
                out.push(match slot {
                    Some(invalid) => invalid,
                    None => renewed
                        .next()
                        .unwrap_or_else(|| Err(LockError::not_held("renewal batch"))),
                });
            }
        }
        out
    }

    /// One transaction extending each lease (for its own TTL) that is still current, judged as
    /// a single renewal is: each `UPDATE` sets `LAST_INSERT_ID(fence)` on the row it changed
    /// (after resetting it to 0), and the `SELECT LAST_INSERT_ID()` after it reports that
    /// statement's own outcome, decided by the server when it ran (no re-read that a clock
    /// step between statements could mislead).
    async fn renew_batch(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let t = self.table.quoted();
        // Lock rows in one order (by name) so concurrent batches cannot deadlock.
        let mut order: Vec<(usize, &&Lease)> = leases
            .iter()
            .enumerate()
            .filter(|(_, lease)| lease_token_is_ours(lease.token()))
            .collect();
        order.sort_by(|(_, a), (_, b)| a.name().as_str().cmp(b.name().as_str()));
        let mut sql = String::from("START TRANSACTION; ");
        for (i, lease) in &order {
            let current = lease_current(
                &hex(lease.token().as_str().as_bytes()),
                &lease.fence().get().to_string(),
            );
            sql.push_str(&format!(
                "DO LAST_INSERT_ID(0); \
                 UPDATE {t} SET expires_at = NOW(6) + INTERVAL {} MICROSECOND, \
                 fence = LAST_INSERT_ID(fence) WHERE name = {} AND {current}; \
                 SELECT 'renewed', CAST({i} AS UNSIGNED), LAST_INSERT_ID(); ",
                micros(lease.ttl()),
                hex(lease.name().as_str().as_bytes()),
            ));
        }
        sql.push_str("COMMIT");
        let sent = Instant::now();
        let rows = run_pooled(&self.pool, sql, self.statement_until())
            .await
            .map_err(|e| lock_error("renewing leases", e))?;
        let mut fences: HashMap<u64, u64> = HashMap::new();
        for row in tagged(&rows, "renewed") {
            let index: u64 = row
                .try_get(1)
                .map_err(|e| lock_error("reading renewal outcomes", e))?;
            let fence: u64 = row
                .try_get(2)
                .map_err(|e| lock_error("reading renewal outcomes", e))?;
            fences.insert(index, fence);
        }
        Ok(leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let fence = u64::try_from(i).ok().and_then(|i| fences.get(&i));
                if fence.is_some_and(|f| *f > 0 && *f == lease.fence().get()) {
                    Ok(Grant::new(Lease::clone(lease), sent))
                } else {
                    // Released, expired, taken over, or not a lease of this library (a
                    // foreign row, a forged token): not renewed, as a single renewal answers.
                    Err(LockError::not_held(lease.name()))
                }
            })
            .collect())
    }

    /// Releases `lease` if it is current, handing it to the first waiter, if any, and waking
    /// that waiter (see [`lease_queue::release_batch`]); the server's reply carries the
    /// released fence.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let name = lease.name();
        if !lease_token_is_ours(lease.token()) {
            return Err(LockError::not_held(name));
        }
        let until = self.statement_until();
        // Nobody queues (the usual case): one prepared statement.
        let alone = || {
            retry_deadlocks(|| {
                let query = sqlx::query(AssertSqlSafe(self.sql.release_alone.clone()))
                    .bind(name.as_str().as_bytes())
                    .bind(lease.token().as_str().as_bytes())
                    .bind(lease.fence().get())
                    .bind(name.as_str().as_bytes());
                execute_within(&self.pool, until, query)
            })
        };
        // On an error the hand-off batch below decides; if it then finds the lease gone, the
        // statement may have released it before its answer was lost: that error stands.
        let mut first: Option<sqlx::Error> = match alone().await {
            Ok(done) if changed_current(&done, lease) => return Ok(()),
            Ok(_) => None,
            Err(error) => Some(error),
        };
        let sql: Arc<str> = lease_queue::release_batch(
            &self.table,
            name.as_str().as_bytes(),
            lease.token().as_str().as_bytes(),
            lease.fence().get(),
        )
        .into();
        let what = format!("releasing `{name}`");
        // Pooled connections closed since their last use (a restart) fail at once and are
        // closed: the release runs again on another (at most once per pooled connection). If
        // a later try finds the lease gone, an earlier one may have released it before its
        // answer was lost: the first error stands (nothing is claimed).
        let mut tries = self.pool.options().get_max_connections();
        let released = loop {
            match retry_deadlocks(|| self.release_once(sql.clone(), until)).await {
                Err(error) if tries > 0 && broken(&error) => {
                    tries -= 1;
                    first.get_or_insert(error);
                }
                Ok(fence) if fence != Some(lease.fence().get()) && first.is_some() => {
                    break Err(first.take().unwrap_or_else(crate::script::timed_out));
                }
                other => break other,
            }
        }
        .map_err(|e| lock_error(&what, e))?;
        if released == Some(lease.fence().get()) {
            Ok(())
        } else {
            Err(LockError::not_held(name))
        }
    }

    /// Runs one release batch: the fence it released (`None` when the lease was not current).
    /// An error after the `'released'` answer (the wake-up) is logged, not returned: the
    /// release itself is done.
    async fn release_once(
        &self,
        sql: Arc<str>,
        until: Instant,
    ) -> Result<Option<u64>, sqlx::Error> {
        let mut conn = within(until, self.pool.acquire()).await?;
        let mut released: Option<Option<u64>> = None;
        let mut failed = None;
        {
            let mut answers = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&mut *conn);
            loop {
                match within(until, futures::TryStreamExt::try_next(&mut answers)).await {
                    Ok(Some(sqlx::Either::Right(row)))
                        if row
                            .try_get::<String, _>(0)
                            .is_ok_and(|tag| tag == "released") =>
                    {
                        let done: i64 = row.try_get(1)?;
                        let fence: Option<u64> = row.try_get(2)?;
                        released = Some(fence.filter(|_| done > 0));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                }
            }
        }
        match (released, failed) {
            (Some(released), None) => Ok(released),
            (Some(released), Some(error)) => {
                tracing::debug!(%error, "released, but waking the next waiter failed");
                if classify(&error) == Class::Connection
                    || within(until, sqlx::raw_sql("DO 0").execute(&mut *conn))
                        .await
                        .is_err()
                {
                    conn.close_on_drop();
                }
                Ok(released)
            }
            (None, Some(error)) => {
                if classify(&error) == Class::Connection {
                    conn.close_on_drop();
                }
                Err(error)
            }
            (None, None) => Err(sqlx::Error::Protocol(
                "the release batch gave no answer".into(),
            )),
        }
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        Ok(match self.read(name, self.statement_until()).await? {
            Some(LeaseState::Held {
                token,
                fence,
                remaining_us,
            }) if remaining_us > 0 => Some(LockInfo::new(
                name.clone(),
                token,
                fence,
                Some(Duration::from_micros(remaining_us.unsigned_abs())),
            )),
            _ => None,
        })
    }
}

/// Whether a statement setting `fence = LAST_INSERT_ID(fence)` on the row of `lease` if, and
/// only if, it is current changed that row: its reply then carries the lease's fence (fences
/// start at 1); a statement that matched no row carries 0.
fn changed_current(done: &MySqlQueryResult, lease: &Lease) -> bool {
    done.last_insert_id() > 0 && done.last_insert_id() == lease.fence().get()
}

/// A TTL in whole microseconds (TTLs are at most a day: no overflow).
fn micros(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX)
}
