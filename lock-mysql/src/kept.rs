//! One connection kept out of the pool between the short statements of an uncontended lock:
//! a lease's acquire and release, a row lock's fence bump.
//!
//! sqlx tests every connection given back to its pool with a ping (its return path does so
//! unconditionally: it flushes whatever a dropped statement left on the connection). That is
//! a round trip per statement: off the caller's path, but not off the server's nor the
//! machine's. One connection per client is therefore kept here, out of the pool
//! ([`PoolConnection::detach`]), for the next such statement: a statement that ends cleanly
//! leaves it here without a ping. A statement that finds it in use takes a pooled connection
//! as before. So a client opens at most one connection more than its pool's size.
//!
//! What sqlx's ping is for is kept:
//! - a statement that did not end cleanly (its future dropped mid-statement, its answer late,
//!   its connection broken) closes the kept connection (see [`Checkout`]'s `Drop`); the next
//!   clean statement on a pooled connection becomes the kept one;
//! - a kept connection idle for [`TRUSTED_IDLE`] or longer (the server may have gone away
//!   meanwhile) is closed, not used: the pool pings its own connections idle that long.

use std::{
    ops::{Deref, DerefMut},
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use sqlx::{
    Connection, MySql, MySqlConnection, MySqlPool,
    mysql::{MySqlArguments, MySqlQueryResult},
    pool::PoolConnection,
    query::Query,
};

use crate::{
    error::{Class, classify},
    sql::within,
};

/// How long a connection may sit idle and still be used without a test: pooled connections
/// idle longer are pinged before use, the kept one is closed (a restarted server leaves dead
/// connections behind; fresher ones answered a statement or a ping less than this ago).
pub(crate) const TRUSTED_IDLE: Duration = Duration::from_secs(1);

/// The kept connection of one client and the pool behind it.
#[derive(Debug)]
pub(crate) struct Kept {
    pool: MySqlPool,
    slot: Mutex<Slot>,
}

#[derive(Debug, Default)]
struct Slot {
    /// The kept connection while nobody uses it, and since when.
    idle: Option<(MySqlConnection, Instant)>,
    /// Whether there is a kept connection (idle here, or in a [`Checkout`]).
    exists: bool,
}

impl Kept {
    /// No kept connection yet: the first clean statement's pooled connection becomes it.
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            slot: Mutex::new(Slot::default()),
        }
    }

    /// The kept connection when it is idle and fresh, else a pooled one (waited for until
    /// `until`). Hand it back with [`Checkout::finish`].
    ///
    /// # Errors
    /// The pool's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn acquire(&self, until: Instant) -> Result<Checkout<'_>, sqlx::Error> {
        let conn = match self.take_idle() {
            Some(kept) => Conn::Kept(kept),
            None => Conn::Pooled(within(until, self.pool.acquire()).await?),
        };
        Ok(Checkout {
            kept: self,
            conn: Some(conn),
        })
    }

    /// Runs `query` on a connection of [`Kept::acquire`], all by `until` (getting the
    /// connection included), as [`crate::sql::execute_within`] does on the pool.
    ///
    /// # Errors
    /// The statement's, the pool's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn execute_within(
        &self,
        until: Instant,
        query: Query<'_, MySql, MySqlArguments>,
    ) -> Result<MySqlQueryResult, sqlx::Error> {
        let mut conn = self.acquire(until).await?;
        let result = within(until, query.execute(&mut *conn)).await;
        conn.finish(&result);
        result
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The idle kept connection, unless it has been idle too long (then it is closed).
    fn take_idle(&self) -> Option<MySqlConnection> {
        let mut slot = self.slot();
        let (conn, since) = slot.idle.take()?;
        if since.elapsed() < TRUSTED_IDLE {
            return Some(conn);
        }
        slot.exists = false;
        drop(slot);
        close(conn);
        None
    }

    /// Hands back a connection whose statement ended cleanly: kept, or (another one is kept)
    /// given back to the pool.
    fn keep(&self, conn: Conn) {
        let mut slot = self.slot();
        match conn {
            Conn::Kept(conn) => slot.idle = Some((conn, Instant::now())),
            Conn::Pooled(pooled) if !slot.exists => {
                slot.exists = true;
                slot.idle = Some((pooled.detach(), Instant::now()));
            }
            Conn::Pooled(pooled) => {
                drop(slot);
                drop(pooled);
            }
        }
    }

    /// A connection whose statement did not end cleanly: closed if it is the kept one (or
    /// broken), else given back to the pool, which tests it.
    fn discard(&self, conn: Conn, broken: bool) {
        match conn {
            Conn::Kept(conn) => {
                self.slot().exists = false;
                close(conn);
            }
            Conn::Pooled(mut pooled) => {
                if broken {
                    pooled.close_on_drop();
                }
                drop(pooled);
            }
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some((conn, _)) = self.slot().idle.take() {
            close(conn);
        }
    }
}

/// Closes `conn`: says goodbye to the server when a runtime is at hand, else drops the socket.
fn close(conn: MySqlConnection) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(TRUSTED_IDLE, conn.close()).await;
        });
    }
}

enum Conn {
    Kept(MySqlConnection),
    Pooled(PoolConnection<MySql>),
}

/// A connection from [`Kept::acquire`]: the kept one or a pooled one. Dropped without
/// [`Checkout::finish`] (its statement's future was dropped), it counts as not ended cleanly.
pub(crate) struct Checkout<'a> {
    kept: &'a Kept,
    /// Always `Some` until given back.
    conn: Option<Conn>,
}

impl Checkout<'_> {
    /// Hands the connection back after its statement gave `result`: kept when the statement
    /// ended cleanly (an answer, or an error of the server's that leaves the session as it
    /// was); otherwise (a broken connection, no answer in time) not reused.
    pub(crate) fn finish<T>(mut self, result: &Result<T, sqlx::Error>) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        match result {
            Err(error) if classify(error) == Class::Connection => self.kept.discard(conn, true),
            _ => self.kept.keep(conn),
        }
    }
}

impl Deref for Checkout<'_> {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        match self.conn.as_ref() {
            Some(Conn::Kept(conn)) => conn,
            Some(Conn::Pooled(pooled)) => pooled,
            None => unreachable!("a checkout holds its connection until it is dropped"),
        }
    }
}

impl DerefMut for Checkout<'_> {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        match self.conn.as_mut() {
            Some(Conn::Kept(conn)) => conn,
            Some(Conn::Pooled(pooled)) => pooled,
            None => unreachable!("a checkout holds its connection until it is dropped"),
        }
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.kept.discard(conn, false);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against the test server (`LOCK_TEST_MYSQL_URL`, set by `cargo xtask services env`).
    use sqlx::mysql::MySqlPoolOptions;

    use super::*;

    async fn kept() -> Kept {
        let url = std::env::var("LOCK_TEST_MYSQL_URL")
            .expect("LOCK_TEST_MYSQL_URL (cargo xtask services up; services env)");
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("the test server");
        Kept::new(pool)
    }

    /// Runs `sql` on a checkout of `kept`: the connection's id, or the statement's error.
    async fn id_after(kept: &Kept, sql: &'static str) -> (u64, Result<(), sqlx::Error>) {
        let until = Instant::now() + Duration::from_secs(10);
        let mut conn = kept.acquire(until).await.expect("a connection");
        let id: u64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
            .fetch_one(&mut *conn)
            .await
            .expect("its id");
        let result = sqlx::raw_sql(sql).execute(&mut *conn).await.map(drop);
        conn.finish(&result);
        (id, result)
    }

    #[tokio::test]
    async fn a_connection_that_ends_cleanly_is_kept_out_of_the_pool() {
        let kept = kept().await;
        let (first, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        // Detached: the pool holds no connection now, and is free to open one.
        assert_eq!(
            kept.pool.size(),
            0,
            "the pool still counts the kept connection"
        );
        for _ in 0..3 {
            let (next, done) = id_after(&kept, "DO 1").await;
            done.expect("DO 1");
            assert_eq!(
                next, first,
                "the next statement did not run on the kept connection"
            );
        }
        assert_eq!(kept.pool.size(), 0, "a statement took a pooled connection");
    }

    #[tokio::test]
    async fn an_error_of_the_server_keeps_it() {
        let kept = kept().await;
        let (first, failed) = id_after(&kept, "SELECT * FROM no_such_table_here").await;
        assert!(failed.is_err(), "a missing table did not fail");
        let (next, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        assert_eq!(next, first, "a server's error cost the kept connection");
    }

    #[tokio::test]
    async fn a_statement_dropped_midway_closes_it() {
        let kept = kept().await;
        let (first, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        let mut conn = kept.acquire(Instant::now()).await.expect("a connection");
        let sleeping = sqlx::raw_sql("DO SLEEP(5)").execute(&mut *conn);
        let stopped = tokio::time::timeout(Duration::from_millis(50), sleeping).await;
        assert!(
            stopped.is_err(),
            "a five-second sleep answered within 50 ms"
        );
        drop(conn);
        let (next, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        assert_ne!(
            next, first,
            "a connection left mid-statement was used again"
        );
    }

    #[tokio::test]
    async fn a_broken_connection_is_not_kept() {
        let kept = kept().await;
        let (first, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        let until = Instant::now() + Duration::from_secs(10);
        let mut other = kept.pool.acquire().await.expect("a pooled connection");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {first}")))
            .execute(&mut *other)
            .await
            .expect("the kill");
        drop(other);
        let mut conn = kept.acquire(until).await.expect("the kept connection");
        let result = sqlx::raw_sql("DO 1").execute(&mut *conn).await.map(drop);
        assert!(result.is_err(), "a killed connection answered");
        conn.finish(&result);
        let (next, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1 after the broken connection");
        assert_ne!(next, first, "the killed connection was kept");
    }

    #[tokio::test]
    async fn one_idle_too_long_is_closed_not_used() {
        let kept = kept().await;
        let (first, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        // The time under test: the kept connection's idle time, not a wait for an event.
        tokio::time::sleep(TRUSTED_IDLE + Duration::from_millis(20)).await;
        let (next, done) = id_after(&kept, "DO 1").await;
        done.expect("DO 1");
        assert_ne!(
            next, first,
            "a connection idle past TRUSTED_IDLE was used untested"
        );
    }
}
