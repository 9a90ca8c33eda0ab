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

use std::{fmt::Write as _, future::Future};

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

/// How many times a batch rolled back by a deadlock is run again.
const DEADLOCK_RETRIES: usize = 3;

/// Runs `op` again (up to [`DEADLOCK_RETRIES`] times) when InnoDB rolled its statement back
/// as a deadlock victim (1213): nothing of it remains, so running it again is safe.
pub(crate) async fn retry_deadlocks<T, F, Fut>(mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(error) if classify(&error) == Class::Deadlock && attempt < DEADLOCK_RETRIES => {
                attempt += 1;
                tracing::debug!(%error, attempt, "deadlock victim; running the statement again");
            }
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
    let mut attempt = 0;
    loop {
        let mut conn = pool.acquire().await?;
        match run(&mut conn, AssertSqlSafe(sql.clone())).await {
            Ok(rows) => return Ok(rows),
            Err(error) => {
                let class = classify(&error);
                if class == Class::Connection
                    || sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err()
                {
                    conn.close_on_drop();
                }
                attempt += 1;
                if class != Class::Deadlock || attempt > DEADLOCK_RETRIES {
                    return Err(error);
                }
                tracing::debug!(%error, attempt, "deadlock victim; running the batch again");
            }
        }
    }
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
