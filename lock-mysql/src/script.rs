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

use std::{fmt::Write as _, future::Future, sync::Arc};

use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool, Row, SqlSafeStr, mysql::MySqlRow};

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

/// Runs `sql` on a pooled connection, again when InnoDB rolled it back as a deadlock victim.
///
/// A failing statement stops the batch and can leave its transaction open (a lock-wait
/// timeout rolls back only the statement), so after an error the connection is rolled back,
/// or closed if that fails, before it goes back to the pool. A batch dropped half-way still
/// runs to its end on the server; sqlx drains its replies before reusing the connection and
/// closes the connection if one of them is an error.
pub(crate) async fn run_pooled(
    pool: &MySqlPool,
    sql: String,
) -> Result<Vec<MySqlRow>, sqlx::Error> {
    // Shared by the attempts rather than copied for each.
    let sql: Arc<str> = sql.into();
    retry_deadlocks(|| {
        let sql = sql.clone();
        async move {
            let mut conn = pool.acquire().await?;
            let result = run(&mut conn, AssertSqlSafe(sql)).await;
            if let Err(error) = &result
                && (classify(error) == Class::Connection
                    || sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err())
            {
                conn.close_on_drop();
            }
            result
        }
    })
    .await
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
