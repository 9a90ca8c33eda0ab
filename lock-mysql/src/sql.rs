//! Running SQL: single statements take bound parameters (sqlx prepares them once per
//! connection); statement batches ("scripts") send several statements in one round trip,
//! with their values written as hex or integer literals.
//!
//! A transaction of several statements would cost a round trip per statement with bound
//! parameters; sent as one multi-statement batch it costs one, and the server runs it to the
//! end even if the client stops reading (a dropped future cannot leave it half-way). The only
//! values spliced into a script are identifiers validated by [`TableName`](crate::TableName),
//! byte strings written as `X'<hex digits>'`, and integers, so nothing from a caller can change
//! the statement's meaning.

use std::{fmt::Write as _, future::Future, sync::Arc, time::Instant};

use sqlx::{
    AssertSqlSafe, MySql, MySqlConnection, MySqlPool, Row, SqlSafeStr,
    mysql::{MySqlArguments, MySqlQueryResult, MySqlRow},
    pool::PoolConnection,
    query::Query,
};

use crate::error::{Class, classify};

/// `bytes` as a MySQL hex literal, `X'6162'`; the empty string is `X''`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2 + 3);
    out.push_str("X'");
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
    out
}

/// Runs `sql` (one or more statements: a `&'static str`, or a built script wrapped in
/// [`AssertSqlSafe`]) on `conn` and returns the rows of every statement, in order.
pub(crate) async fn run(
    conn: &mut MySqlConnection,
    sql: impl SqlSafeStr,
) -> Result<Vec<MySqlRow>, sqlx::Error> {
    sqlx::raw_sql(sql).fetch_all(conn).await
}

/// The error of a call that ran out of time waiting for the server: classified as a lost
/// connection (the connection it used is closed, never reused mid-statement).
pub(crate) fn timed_out() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from the server in time (the connection was closed)",
    ))
}

/// Whether `error` is [`timed_out`]'s.
pub(crate) fn is_timed_out(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut)
}

/// `future`, or [`timed_out`] at `until`.
pub(crate) async fn within<T>(
    until: Instant,
    future: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout_at(until.into(), future)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// Runs `query` on a pooled connection, all by `until` (getting the connection included); a
/// connection left mid-statement or broken is closed, not returned to the pool.
pub(crate) async fn execute_within(
    pool: &MySqlPool,
    until: Instant,
    query: Query<'_, MySql, MySqlArguments>,
) -> Result<MySqlQueryResult, sqlx::Error> {
    let mut conn = within(until, pool.acquire()).await?;
    let result = within(until, query.execute(&mut *conn)).await;
    close_if_broken(&mut conn, &result);
    result
}

/// As [`execute_within`], for a read (run again, see [`retry_broken`]) that returns at most one
/// row.
pub(crate) async fn fetch_optional_within<'q>(
    pool: &MySqlPool,
    until: Instant,
    query: impl Fn() -> Query<'q, MySql, MySqlArguments>,
) -> Result<Option<MySqlRow>, sqlx::Error> {
    retry_broken(pool, || async {
        let mut conn = within(until, pool.acquire()).await?;
        let result = within(until, query().fetch_optional(&mut *conn)).await;
        close_if_broken(&mut conn, &result);
        result
    })
    .await
}

/// Closes a pooled connection (when it is given back) whose statement failed with a
/// connection error, so the pool does not hand it out again.
pub(crate) fn close_if_broken<T>(
    conn: &mut PoolConnection<MySql>,
    result: &Result<T, sqlx::Error>,
) {
    if result
        .as_ref()
        .is_err_and(|e| classify(e) == Class::Connection)
    {
        conn.close_on_drop();
    }
}

/// Whether `error` is a connection that broke (not one that ran out of time): the statement
/// is worth another try on another pooled connection if running it twice is harmless.
pub(crate) fn broken(error: &sqlx::Error) -> bool {
    classify(error) == Class::Connection && !is_timed_out(error)
}

/// Runs `op` (harmless to run twice: a read, a renewal) again while it fails on a broken
/// pooled connection, at most once per connection the pool may hold: after a server restart
/// every pooled connection used in the last second (so not pinged before use) is dead, and
/// each one fails at once and is closed.
pub(crate) async fn retry_broken<T, F, Fut>(pool: &MySqlPool, mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = pool.options().get_max_connections();
    loop {
        match op().await {
            Err(error) if tries > 0 && broken(&error) => tries -= 1,
            other => return other,
        }
    }
}

/// How many times an operation InnoDB rolled back as a deadlock victim is run again.
const DEADLOCK_RETRIES: usize = 3;

/// The deadlock retries of one operation. A deadlock victim (1213) has its statement (its whole
/// transaction, for a batch) rolled back: nothing of it remains, so running it again is safe.
#[derive(Debug, Default)]
pub(crate) struct Deadlocks(usize);

impl Deadlocks {
    /// Whether to run the operation again after `error`: true (and counted) for a deadlock
    /// while retries are left.
    pub(crate) fn retry(&mut self, error: &sqlx::Error) -> bool {
        if classify(error) != Class::Deadlock || self.0 >= DEADLOCK_RETRIES {
            return false;
        }
        self.0 += 1;
        tracing::debug!(%error, retry = self.0, "deadlock victim; running it again");
        true
    }
}

/// Runs `op`, again while it fails as a deadlock victim (see [`Deadlocks`]).
pub(crate) async fn retry_deadlocks<T, F, Fut>(mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut deadlocks = Deadlocks::default();
    loop {
        match op().await {
            Err(error) if deadlocks.retry(&error) => {}
            other => return other,
        }
    }
}

/// After `error` on `conn`: runs `settle` (`ROLLBACK`, or `DO 0` where no transaction can be
/// open) by `until`, and closes the connection when the error was the connection's or
/// `settle` fails, so that no connection goes back to the pool mid-statement or inside a
/// transaction a failed batch left open.
pub(crate) async fn settle_or_close(
    conn: &mut PoolConnection<MySql>,
    error: &sqlx::Error,
    settle: &'static str,
    until: Instant,
) {
    if classify(error) == Class::Connection
        || within(until, sqlx::raw_sql(settle).execute(&mut **conn))
            .await
            .is_err()
    {
        conn.close_on_drop();
    }
}

/// Runs `sql` (harmless to run twice: reads, renewals) on a pooled connection, again when InnoDB
/// rolled it back as a deadlock victim or the connection was broken ([`retry_broken`]), all by
/// `until` (a connection left mid-statement is closed).
///
/// A failing statement stops the batch and can leave its transaction open (a lock-wait
/// timeout rolls back only the statement), so after an error the connection is rolled back,
/// or closed if that fails, before it goes back to the pool. A batch dropped half-way still
/// runs to its end on the server; sqlx drains its replies before reusing the connection and
/// closes the connection if one of them is an error.
pub(crate) async fn run_pooled(
    pool: &MySqlPool,
    sql: String,
    until: Instant,
) -> Result<Vec<MySqlRow>, sqlx::Error> {
    // Shared by the attempts rather than copied for each.
    let sql: Arc<str> = sql.into();
    retry_broken(pool, || {
        retry_deadlocks(|| {
            let sql = sql.clone();
            async move {
                let mut conn = within(until, pool.acquire()).await?;
                let result = within(until, run(&mut conn, AssertSqlSafe(sql))).await;
                if let Err(error) = &result {
                    settle_or_close(&mut conn, error, "ROLLBACK", until).await;
                }
                result
            }
        })
    })
    .await
}

/// Opens a connection outside the pool within `bound` (`what` names the step in an error):
/// an anchor's, or a row-lock hold's.
pub(crate) async fn connect_within(
    options: &sqlx::mysql::MySqlConnectOptions,
    bound: std::time::Duration,
    what: &str,
) -> Result<sqlx::MySqlConnection, lock_core::LockError> {
    use sqlx::ConnectOptions as _;
    tokio::time::timeout(bound, options.connect())
        .await
        .map_err(|_| {
            lock_core::LockError::unavailable_msg(format!("{what}: no answer within {bound:?}"))
        })?
        .map_err(|e| lock_core::LockError::from(crate::error::Error::new(what, e)))
}

/// The rows of `rows` whose first column is `tag` (each SELECT of a script starts with a
/// string literal naming it).
pub(crate) fn tagged<'r>(rows: &'r [MySqlRow], tag: &'r str) -> impl Iterator<Item = &'r MySqlRow> {
    rows.iter()
        .filter(move |row| row.try_get::<String, _>(0).is_ok_and(|t| t == tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_literals() {
        assert_eq!(hex(b""), "X''");
        assert_eq!(hex(b"a/B"), "X'612f42'");
        assert_eq!(hex("ü".as_bytes()), "X'c3bc'");
        assert_eq!(
            hex(b"'; DROP TABLE x; --"),
            "X'273b2044524f50205441424c4520783b202d2d'"
        );
    }
}
