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

use std::{collections::HashMap, sync::Arc, time::Duration, time::Instant};

use lock_core::{
    AcquireRequest, Attempt, Fence, Grant, Lease, LeaseToken, LockError, LockInfo, LockName,
    poll_until_acquired, validate_ttl,
};
use sqlx::{AssertSqlSafe, MySqlPool, Row, mysql::MySqlQueryResult};

use crate::{
    TableName,
    error::{Class, classify, lock_error},
    lock_row::{
        LEASE_COLUMNS, LEASE_TAKEABLE, LeaseRow, LeaseState, lease_current, lease_token_is_ours,
    },
    script::{
        broken, execute_within, fetch_optional_within, hex, retry_broken, retry_deadlocks,
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
    read: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
}

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = table.quoted();
        // The first assignment decides on the row as it was; the others follow it whichever
        // order the server evaluates assignments in (MariaDB's SIMULTANEOUS_ASSIGNMENT mode
        // included): `token = ?` is true afterwards only if the row was taken.
        let taken = format!("({LEASE_TAKEABLE}) OR token = ?");
        Self {
            acquire: format!(
                "INSERT INTO {t} (name, token, fence, expires_at, acquired_at) \
                 VALUES (?, ?, 1, NOW(6) + INTERVAL ? MICROSECOND, NOW(6)) \
                 ON DUPLICATE KEY UPDATE \
                 token = IF({LEASE_TAKEABLE}, ?, token), \
                 fence = IF({taken}, LAST_INSERT_ID(fence + 1), fence), \
                 expires_at = IF({taken}, NOW(6) + INTERVAL ? MICROSECOND, expires_at), \
                 acquired_at = IF({taken}, NOW(6), acquired_at)"
            )
            .into(),
            read: format!("SELECT {LEASE_COLUMNS} FROM {t} WHERE name = ?").into(),
            renew: format!(
                "UPDATE {t} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND, \
                 fence = LAST_INSERT_ID(fence) \
                 WHERE name = ? AND {}",
                lease_current("?", "?")
            )
            .into(),
            release: format!(
                "UPDATE {t} SET token = NULL, expires_at = NULL, fence = LAST_INSERT_ID(fence) \
                 WHERE name = ? AND {}",
                lease_current("?", "?")
            )
            .into(),
        }
    }
}

impl LeaseStrategy {
    pub(crate) fn new(pool: MySqlPool, table: TableName, limits: Limits) -> Self {
        Self {
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
        let values = [&n, &k, &ttl, &k, &k, &k, &ttl, &k];
        let mut sql = String::new();
        for (i, part) in self.sql.acquire.split('?').enumerate() {
            sql.push_str(part);
            if let Some(value) = values.get(i) {
                sql.push_str(value);
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
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        poll_until_acquired(request, || self.try_once(request)).await
    }

    /// One try: insert the row, or take it over if it is released or expired. The try ends by
    /// the wait budget (at least [`MIN_TRY`]): a row another transaction keeps locked makes it
    /// busy then, whatever `innodb_lock_wait_timeout` says.
    async fn try_once(&self, request: &AcquireRequest) -> Result<Attempt, LockError> {
        let name = request.name();
        let token = LeaseToken::random();
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
                let query = sqlx::query(AssertSqlSafe(self.sql.acquire.clone()))
                    .bind(name.as_str().as_bytes())
                    .bind(k)
                    .bind(ttl)
                    .bind(k)
                    .bind(k)
                    .bind(k)
                    .bind(ttl)
                    .bind(k);
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
                return Ok(Attempt::Busy { expires_in: None });
            }
            Err(error) => return Err(lock_error(&format!("acquiring `{name}`"), error)),
        };
        let grant = if taken > 0 {
            Lease::new(name.clone(), token, Fence::new(taken), request.ttl())
        } else {
            // Nothing taken over: either the row was new (and is ours), or it is someone else's.
            let state = self.read(name, until).await?;
            if let Some(foreign) = state
                .as_ref()
                .and_then(|state| state.exhausted(&self.table, name))
            {
                return Err(foreign);
            }
            match state {
                Some(LeaseState::Held {
                    token: held,
                    fence,
                    remaining_us,
                }) if held == token && remaining_us > 0 => {
                    Lease::new(name.clone(), token, fence, request.ttl())
                }
                Some(LeaseState::Held { remaining_us, .. }) => {
                    return Ok(Attempt::Busy {
                        expires_in: Some(Duration::from_micros(
                            u64::try_from(remaining_us).unwrap_or(0),
                        )),
                    });
                }
                // Released or removed in between: try again at once.
                _ => {
                    return Ok(Attempt::Busy {
                        expires_in: Some(Duration::ZERO),
                    });
                }
            }
        };
        if Instant::now() >= lock_core::local_deadline(sent, request.ttl()) {
            // The answer came too late to be of use: the caller's hold would be over before it
            // began. Give the row back and try again (or time out).
            tracing::debug!(lock = %name, "a grant came back past its local deadline; releasing it");
            let _ = self.release(&grant).await;
            return Ok(Attempt::Busy {
                expires_in: Some(Duration::ZERO),
            });
        }
        Ok(Attempt::Acquired(Grant::new(grant, sent)))
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

    /// Releases `lease` if it is current; the server's reply carries the released fence.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let name = lease.name();
        if !lease_token_is_ours(lease.token()) {
            return Err(LockError::not_held(name));
        }
        let until = self.statement_until();
        let release = || {
            retry_deadlocks(|| {
                let query = sqlx::query(AssertSqlSafe(self.sql.release.clone()))
                    .bind(name.as_str().as_bytes())
                    .bind(lease.token().as_str().as_bytes())
                    .bind(lease.fence().get());
                execute_within(&self.pool, until, query)
            })
        };
        let what = format!("releasing `{name}`");
        // Pooled connections closed since their last use (a restart) fail at once and are
        // closed: the release runs again on another (at most once per pooled connection). If
        // a later try finds the lease gone, an earlier one may have released it before its
        // answer was lost: the first error stands (nothing is claimed).
        let mut tries = self.pool.options().get_max_connections();
        let mut first: Option<sqlx::Error> = None;
        let done = loop {
            match release().await {
                Err(error) if tries > 0 && broken(&error) => {
                    tries -= 1;
                    first.get_or_insert(error);
                }
                Ok(done) if !changed_current(&done, lease) && first.is_some() => {
                    break Err(first.take().unwrap_or_else(crate::script::timed_out));
                }
                other => break other,
            }
        }
        .map_err(|e| lock_error(&what, e))?;
        if changed_current(&done, lease) {
            Ok(())
        } else {
            Err(LockError::not_held(name))
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
