//! The lease strategy: one row per lock with the holder's token, fence and expiry.
//!
//! - **Acquire** is one statement per try: `INSERT ... ON DUPLICATE KEY UPDATE` inserts the
//!   row, or locks the existing one exclusively (the X lock a `SELECT ... FOR UPDATE` takes)
//!   for the statement's transaction and takes it over only if the server finds it released
//!   or expired by `NOW(6)` (and the waiters' queue allows, see [`queue`]), bumping its
//!   fence. A call's first try takes only a new row or one released while nobody queued;
//!   a lease that ran out, or one freed while someone queued, is taken by a later try, after
//!   a queue batch (three round trips), which writes the caller's place only if there is
//!   something to wait for: the lease is held, or someone other than its holder queues (see
//!   [`queue::busy_batch`]). A call's first busy try that may park waits for the lock's
//!   [`gate`] before its queue batch, so that waiters of other clients wait in `GET_LOCK`
//!   rather than in the queue; on MariaDB the call's very first try does not wait for the
//!   lease row's lock (a locked row sends it through the gate at once).
//! - **Outcome**: the server's reply carries the fence the caller now holds, or 0: a new row
//!   gets its fence from `LAST_INSERT_ID(1)` in the inserted values; on an existing row
//!   (whose inserted values were computed all the same) the update sets it again, to
//!   `LAST_INSERT_ID(fence + 1)` when it takes the row over, else to `LAST_INSERT_ID(0)`.
//!   The reply's value is the last one set in the statement: on a takeover the row's fence
//!   read inside the locked statement. It is not the `rows_affected` count that
//!   `CLIENT_FOUND_ROWS` makes ambiguous for upserts; a grant of a new row, or of one
//!   released while nobody queued, is one round trip (fault case
//!   `lease/a_new_row_is_granted_in_one_statement`). Every other outcome (a busy or foreign
//!   row) is judged by reading the row back.
//!   Release and the renewal of one lease work the same way with `LAST_INSERT_ID(fence)`.
//!   Renewals of several leases are batched in one transaction and judged by reading the rows
//!   back in it.
//! - **Clock**: every time comparison and expiry is computed by the server from `NOW(6)`;
//!   the client sends only the TTL as a number of microseconds.
//! - Released rows stay, with token and expiry NULL, so the fence never goes back.

mod acquire;
mod admin;
mod gate;
pub(crate) mod queue;
mod release;
mod renew;
mod waited;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use lock_core::{Lease, LockError, LockInfo, LockName};
use sqlx::{AssertSqlSafe, MySqlPool, mysql::MySqlQueryResult};

use crate::{
    TableName,
    anchor::{self, Anchor},
    error::Error,
    kept::Kept,
    rows::{
        LEASE_COLUMNS, LEASE_RELEASED_ALONE, LEASE_TAKEABLE, LeaseRow, LeaseState, lease_current,
    },
    sql::{fetch_optional_within, hex},
};

/// Leases renewed by one batch at most (a longer list is split): one round trip and five
/// statements per batch (see `renew_batch`), so 10,000 held locks take 20 round trips per
/// renewal period.
const RENEW_BATCH: usize = 500;

/// The `SET STATEMENT` setting of a statement that does not wait for a row's lock (MariaDB).
const NOWAIT: &str = "innodb_lock_wait_timeout = 0";

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
    /// Permits to park a waiter on a pooled connection (half the pool: none for a pool of one).
    parking: Arc<tokio::sync::Semaphore>,
    /// The user lock parked waiters wait on (see [`crate::anchor`]); its connection, or the
    /// one kept out of the pool beside it, runs the tries and lone releases.
    anchor: Arc<Anchor>,
    /// The leases taken after waiting, whose release hands over at once.
    waited: Arc<waited::Waited>,
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
    /// A try of a caller that may have a place in the queue: takes a row that is free (or
    /// expired) if nobody queues ahead of the caller.
    acquire: Arc<str>,
    /// What each `?` of `acquire` stands for, in order.
    acquire_args: Vec<Arg>,
    /// The first try of an `acquire` call (it has no place): takes only a row released while
    /// nobody queued ([`LEASE_RELEASED_ALONE`]), or inserts a new one. It does not read the
    /// queue: a statement that reads a second table costs the server about twice as much
    /// (measured: 350-450 against 690-740 µs, on this server, each followed by a release).
    acquire_first: Arc<str>,
    /// What each `?` of `acquire_first` stands for, in order.
    acquire_first_args: Vec<Arg>,
    /// `acquire_first` that does not wait for the row's lock (`SET STATEMENT
    /// innodb_lock_wait_timeout = 0 FOR ..`, MariaDB; a locked row answers error 1205 at
    /// once): the call's very first try (see `acquire.rs`).
    acquire_first_nowait: Arc<str>,
    /// Release when nobody queues ([`queue::release_alone`]).
    release_alone: Arc<str>,
    read: Arc<str>,
    renew: Arc<str>,
}

/// The acquire statement that takes an existing row when `takeable` (an SQL condition on the
/// row, whose placeholders stand for `takeable_args`) holds, with what its placeholders stand
/// for. A new row is the caller's with fence 1; the reply carries the fence taken, or 0.
///
/// The first assignment decides on the row as it was; the others follow it whichever order
/// the server evaluates assignments in (MariaDB's SIMULTANEOUS_ASSIGNMENT mode included):
/// `token = ?` is true afterwards only if the row was taken.
fn acquire_statement(t: &str, takeable: &str, takeable_args: &[Arg]) -> (String, Vec<Arg>) {
    let taken = format!("({takeable}) OR token = ?");
    let taken_args = [takeable_args, &[Arg::Token]].concat();
    let args = [
        &[Arg::Name, Arg::Token, Arg::Ttl][..],
        takeable_args,
        &[Arg::Token],
        &taken_args,
        &taken_args,
        &[Arg::Ttl],
        &taken_args,
    ]
    .concat();
    let sql = format!(
        "INSERT INTO {t} (name, token, fence, expires_at, acquired_at) \
         VALUES (?, ?, LAST_INSERT_ID(1), NOW(6) + INTERVAL ? MICROSECOND, NOW(6)) \
         ON DUPLICATE KEY UPDATE \
         token = IF({takeable}, ?, token), \
         fence = IF({taken}, LAST_INSERT_ID(fence + 1), fence + LAST_INSERT_ID(0)), \
         expires_at = IF({taken}, NOW(6) + INTERVAL ? MICROSECOND, expires_at), \
         acquired_at = IF({taken}, NOW(6), acquired_at)"
    );
    (sql, args)
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
        // Free, and nobody queues ahead of the caller (see `queue`; its condition's
        // placeholders are name, token, token, token).
        let takeable = format!("({LEASE_TAKEABLE}) AND {}", queue::allowed(table));
        let (acquire, acquire_args) = acquire_statement(
            &t,
            &takeable,
            &[Arg::Name, Arg::Token, Arg::Token, Arg::Token],
        );
        let (acquire_first, acquire_first_args) =
            acquire_statement(&t, &format!("({LEASE_RELEASED_ALONE})"), &[]);
        Self {
            acquire: acquire.into(),
            acquire_args,
            acquire_first_nowait: format!("SET STATEMENT {NOWAIT} FOR {acquire_first}").into(),
            acquire_first: acquire_first.into(),
            acquire_first_args,
            release_alone: queue::release_alone(table).into(),
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

    /// The acquire statement of a `first` try (see [`Statements::acquire_first`]; `nowait`:
    /// [`Statements::acquire_first_nowait`]) or of a later one, with what its placeholders
    /// stand for.
    fn acquire(&self, first: bool, nowait: bool) -> (&Arc<str>, &[Arg]) {
        match (first, nowait) {
            (true, true) => (&self.acquire_first_nowait, &self.acquire_first_args),
            (true, false) => (&self.acquire_first, &self.acquire_first_args),
            _ => (&self.acquire, &self.acquire_args),
        }
    }
}

impl LeaseStrategy {
    pub(crate) fn new(
        pool: MySqlPool,
        table: TableName,
        limits: Limits,
        anchor: anchor::Settings,
    ) -> Self {
        // At most half the pool parks, so renewals and releases of the client's other locks
        // always find a connection: a pool of one connection never parks (its waiters poll).
        let parking = pool.options().get_max_connections() / 2;
        Self {
            parking: Arc::new(tokio::sync::Semaphore::new(parking as usize)),
            pool: pool.clone(),
            sql: Arc::new(Statements::new(&table)),
            table,
            limits,
            // The connection kept beside the pool runs tries and lone releases until the
            // anchor is up (at the first park), which then takes it (see `crate::anchor`).
            anchor: Arc::new(Anchor::new(anchor, Arc::new(Kept::new(pool)))),
            waited: Arc::default(),
        }
    }

    /// The acquire statement for one try with its values written in, stopped by the server
    /// after `limit`: `SET STATEMENT max_statement_time` on MariaDB; on MySQL the row-lock wait
    /// is bounded by `SET_VAR(innodb_lock_wait_timeout)`, whole seconds, rounded up.
    fn bounded_acquire(
        &self,
        (first, nowait): (bool, bool),
        (name, token): (&[u8], &[u8]),
        ttl_us: u64,
        limit: Duration,
    ) -> String {
        let (n, k, ttl) = (hex(name), hex(token), ttl_us.to_string());
        let (statement, args) = self.sql.acquire(first, false);
        let mut sql = String::new();
        for (i, part) in statement.split('?').enumerate() {
            sql.push_str(part);
            if let Some(arg) = args.get(i) {
                sql.push_str(match arg {
                    Arg::Name => &n,
                    Arg::Token => &k,
                    Arg::Ttl => &ttl,
                });
            }
        }
        if self.limits.mariadb {
            format!(
                "SET STATEMENT max_statement_time = {}.{:06}{} FOR {sql}",
                limit.as_secs(),
                limit.subsec_micros(),
                if first && nowait {
                    format!(", {NOWAIT}")
                } else {
                    String::new()
                }
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

    /// The judged row of `name`, `None` when there is none; read by `until`.
    async fn read(&self, name: &LockName, until: Instant) -> Result<Option<LeaseState>, LockError> {
        let what = || format!("reading the row of `{name}`");
        let query =
            || sqlx::query(AssertSqlSafe(self.sql.read.clone())).bind(name.as_str().as_bytes());
        let row = fetch_optional_within(&self.pool, until, query)
            .await
            .map_err(|e| LockError::from(Error::new(what(), e)))?;
        row.map(|row| {
            LeaseRow::read(&row, 0)
                .map_err(|e| LockError::from(Error::new(what(), e)))?
                .judge(&self.table, name)
        })
        .transpose()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Half the pool parks, rounded down: a pool of one connection never parks, so a waiter
    /// never takes the connection the client's renewals and releases need.
    #[tokio::test]
    async fn half_the_pool_parks() {
        let limits = Limits {
            statement: Duration::from_secs(1),
            lock_wait: Duration::from_secs(1),
            mariadb: true,
        };
        for (size, parks) in [(1, 0), (2, 1), (3, 1), (8, 4)] {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(size)
                .connect_lazy("mysql://nobody@127.0.0.1:1/none")
                .unwrap();
            let anchor = anchor::Settings {
                pool: pool.clone(),
                connect: "mysql://nobody@127.0.0.1:1/none".parse().unwrap(),
                setup: String::new(),
                connect_timeout: Duration::from_secs(1),
                statement_timeout: Duration::from_secs(1),
                mariadb: true,
            };
            let strategy = LeaseStrategy::new(pool, TableName::new("t").unwrap(), limits, anchor);
            assert_eq!(
                strategy.parking.available_permits(),
                parks,
                "pool of {size}"
            );
        }
    }
}
