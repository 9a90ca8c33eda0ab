//! One connection kept out of the pool between the short statements of an uncontended lock: a
//! lease's tries and lone release, a row lock's fence bump and the kill that ends a hold's
//! parked statement when the anchor's connection, which runs those first, is busy or down
//! (see [`crate::anchor`]).
//!
//! sqlx tests every connection given back to its pool with a ping (its return path does so
//! unconditionally: it flushes whatever a dropped statement left on the connection). That is
//! a round trip per statement: off the caller's path, but not off the server's nor the
//! machine's. One connection per client is therefore kept here, out of the pool
//! ([`PoolConnection::detach`]), for the next such statement: a statement that ends cleanly
//! leaves it here without a ping. A statement that finds it in use takes a pooled connection
//! as before. So a client opens at most one connection more than its pool's size here (and,
//! on MariaDB, one for its [anchor](crate::anchor), also taken out of the pool; a raise takes
//! the kept connection when it is idle, and no other is kept until a statement finds the
//! anchor's lent and ends cleanly on a pooled one).
//!
//! What the pool does for its own connections is done here too:
//! - a statement dropped midway leaves the kept connection to a ping in the background, which
//!   waits for the statement to end (for at most [`DRAIN_FOR`]); it is kept again if the ping
//!   answers, closed otherwise, and meanwhile statements take pooled connections;
//! - a statement whose connection broke (or whose answer was late) closes it;
//! - a kept connection idle for [`TRUSTED_IDLE`] or longer is pinged before use (the server
//!   may have gone away meanwhile) and replaced by a pooled one if the ping fails;
//! - one kept for [`MAX_LIFETIME`] is closed and replaced;
//! - one whose ping before use is dropped midway is closed (see [`Pinging`]).

use std::{
    ops::{Deref, DerefMut},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use sqlx::{
    Connection, Execute, Executor, MySql, MySqlConnection, MySqlPool, mysql::MySqlQueryResult,
    pool::PoolConnection,
};

use crate::{
    error::{Class, classify},
    sql::within,
};

/// How long a connection may sit idle and still be used without a test: pooled connections
/// idle longer are pinged before use, and so is the kept one (a restarted server leaves dead
/// connections behind; fresher ones answered a statement or a ping less than this ago).
pub(crate) const TRUSTED_IDLE: Duration = Duration::from_secs(1);

/// The longest the kept connection is used: sqlx's pools close their connections at this age
/// by default (`max_lifetime`), so that load balancers and failovers see them move.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// How long the ping after a statement dropped midway may wait for that statement to end.
pub(crate) const DRAIN_FOR: Duration = Duration::from_secs(30);

/// The kept connection of one client and the pool behind it.
#[derive(Debug)]
pub(crate) struct Kept {
    pool: MySqlPool,
    slot: Arc<Mutex<Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// The kept connection while nobody uses it.
    idle: Option<Idle>,
    /// Whether there is a kept connection (idle here, in a [`Checkout`], or being drained).
    exists: bool,
}

#[derive(Debug)]
struct Idle {
    conn: MySqlConnection,
    /// Since when it has been idle.
    since: Instant,
    /// When it became the kept connection.
    kept_from: Instant,
}

impl Kept {
    /// No kept connection yet: the first clean statement's pooled connection becomes it.
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            slot: Arc::default(),
        }
    }

    /// The kept connection when it is idle (pinged first when it has been idle for
    /// [`TRUSTED_IDLE`]), else a pooled one (waited for until `until`). Hand it back with
    /// [`Checkout::finish`].
    ///
    /// # Errors
    /// The pool's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn acquire(&self, until: Instant) -> Result<Checkout<'_>, sqlx::Error> {
        if let Some(idle) = self.take_idle() {
            let kept_from = idle.kept_from;
            let conn = if idle.since.elapsed() < TRUSTED_IDLE {
                Some(idle.conn)
            } else {
                Pinging::new(self, idle.conn).answered(until).await
            };
            if let Some(conn) = conn {
                return Ok(Checkout {
                    kept: self,
                    conn: Some(Conn::Kept(conn, kept_from)),
                });
            }
            // Dead (a restart, the server's idle limit): the pool's connection instead.
        }
        let pooled = within(until, self.pool.acquire()).await?;
        Ok(Checkout {
            kept: self,
            conn: Some(Conn::Pooled(pooled)),
        })
    }

    /// Runs `query` (a prepared query or raw SQL) on a connection of [`Kept::acquire`], all by
    /// `until` (getting the connection included), as [`crate::sql::execute_within`] does on
    /// the pool.
    ///
    /// # Errors
    /// The statement's, the pool's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn execute_within<'q>(
        &self,
        until: Instant,
        query: impl Execute<'q, MySql> + 'q,
    ) -> Result<MySqlQueryResult, sqlx::Error> {
        let mut conn = self.acquire(until).await?;
        let result = within(until, (&mut *conn).execute(query)).await;
        conn.finish(&result);
        result
    }

    /// The idle kept connection for the client's anchor (see [`crate::anchor`]), which keeps
    /// it from now: no connection is kept here until a later statement that finds the anchor's
    /// lent ends cleanly on a pooled one. `None` when none is idle (or it is past
    /// [`MAX_LIFETIME`]).
    pub(crate) fn take_for_anchor(&self) -> Option<MySqlConnection> {
        let idle = self.take_idle()?;
        lock(&self.slot).exists = false;
        Some(idle.conn)
    }

    /// The idle kept connection, unless there is none or it is past [`MAX_LIFETIME`] (then
    /// it is closed).
    fn take_idle(&self) -> Option<Idle> {
        let mut slot = lock(&self.slot);
        let idle = slot.idle.take()?;
        if idle.kept_from.elapsed() < MAX_LIFETIME {
            return Some(idle);
        }
        slot.exists = false;
        drop(slot);
        close(idle.conn);
        None
    }

    /// Hands back a connection whose statement ended cleanly: kept, or (another one is kept)
    /// given back to the pool.
    fn keep(&self, conn: Conn) {
        let mut slot = lock(&self.slot);
        let now = Instant::now();
        match conn {
            Conn::Kept(conn, kept_from) => {
                slot.idle = Some(Idle {
                    conn,
                    since: now,
                    kept_from,
                });
            }
            Conn::Pooled(pooled) if !slot.exists => {
                slot.exists = true;
                slot.idle = Some(Idle {
                    conn: pooled.detach(),
                    since: now,
                    kept_from: now,
                });
            }
            Conn::Pooled(pooled) => {
                drop(slot);
                drop(pooled);
            }
        }
    }

    /// A connection that broke, or whose answer came too late: closed, not reused (a pooled
    /// one when the pool gets it back).
    fn discard(&self, conn: Conn) {
        match conn {
            Conn::Kept(conn, _) => {
                lock(&self.slot).exists = false;
                drop(conn);
            }
            Conn::Pooled(mut pooled) => {
                pooled.close_on_drop();
                drop(pooled);
            }
        }
    }

    /// A connection whose statement was dropped midway: a pooled one goes back to the pool,
    /// which pings it; the kept one is pinged here, in the background (see the module docs).
    fn drain(&self, conn: Conn) {
        let Conn::Kept(conn, kept_from) = conn else {
            // Back to the pool, which pings it.
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            lock(&self.slot).exists = false;
            return;
        };
        let slot = self.slot.clone();
        runtime.spawn(async move {
            let mut conn = conn;
            let answered = tokio::time::timeout(DRAIN_FOR, conn.ping()).await;
            if Arc::strong_count(&slot) == 1 {
                // Its client is gone meanwhile.
                if matches!(answered, Ok(Ok(()))) {
                    let _ = tokio::time::timeout(TRUSTED_IDLE, conn.close()).await;
                }
                return;
            }
            let mut slot = lock(&slot);
            if matches!(answered, Ok(Ok(()))) {
                slot.idle = Some(Idle {
                    conn,
                    since: Instant::now(),
                    kept_from,
                });
            } else {
                slot.exists = false;
            }
        });
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(idle) = lock(&self.slot).idle.take() {
            close(idle.conn);
        }
    }
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Closes `conn`: says goodbye to the server when a runtime is at hand, else drops the socket.
pub(crate) fn close(conn: MySqlConnection) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(TRUSTED_IDLE, conn.close()).await;
        });
    }
}

/// The kept connection while its ping is out: dropped before the answer came, it closes the
/// connection rather than drain it. sqlx does not track a ping it sent as it tracks a
/// statement, so a connection whose ping was dropped midway would leave that ping's answer
/// unread, and each later statement would read the answer meant for the one before it.
struct Pinging<'a> {
    kept: &'a Kept,
    /// `Some` until the ping answered or failed.
    conn: Option<MySqlConnection>,
}

impl<'a> Pinging<'a> {
    fn new(kept: &'a Kept, conn: MySqlConnection) -> Self {
        Self {
            kept,
            conn: Some(conn),
        }
    }

    /// The connection if its ping answered by `until`; otherwise it is closed (any failure).
    async fn answered(mut self, until: Instant) -> Option<MySqlConnection> {
        let conn = self.conn.as_mut()?;
        if within(until, conn.ping()).await.is_ok() {
            return self.conn.take();
        }
        None
    }
}

impl Drop for Pinging<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            lock(&self.kept.slot).exists = false;
            drop(conn);
        }
    }
}

enum Conn {
    /// The kept connection, and when it became the kept one.
    Kept(MySqlConnection, Instant),
    Pooled(PoolConnection<MySql>),
}

/// A connection from [`Kept::acquire`]: the kept one or a pooled one. Dropped without
/// [`Checkout::finish`] (its statement's future was dropped), it is drained (see
/// [`Kept::drain`]).
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
            Err(error) if classify(error) == Class::Connection => self.kept.discard(conn),
            _ => self.kept.keep(conn),
        }
    }
}

impl Deref for Checkout<'_> {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        match self.conn.as_ref() {
            Some(Conn::Kept(conn, _)) => conn,
            Some(Conn::Pooled(pooled)) => pooled,
            None => unreachable!("a checkout holds its connection until it is dropped"),
        }
    }
}

impl DerefMut for Checkout<'_> {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        match self.conn.as_mut() {
            Some(Conn::Kept(conn, _)) => conn,
            Some(Conn::Pooled(pooled)) => pooled,
            None => unreachable!("a checkout holds its connection until it is dropped"),
        }
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.kept.drain(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against the test server (`LOCK_TEST_MYSQL_URL`, set by `cargo xtask services env`), as
    //! the crate's integration tests.
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

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// Runs `sql` on a checkout of `kept`: the connection's id, and the statement's outcome.
    async fn id_after(kept: &Kept, sql: &'static str) -> (u64, Result<(), sqlx::Error>) {
        let mut conn = kept.acquire(soon()).await.expect("a connection");
        let id: u64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
            .fetch_one(&mut *conn)
            .await
            .expect("its id");
        let result = sqlx::raw_sql(sql).execute(&mut *conn).await.map(drop);
        conn.finish(&result);
        (id, result)
    }

    /// The id of the connection a clean statement ran on.
    async fn clean(kept: &Kept) -> u64 {
        let (id, done) = id_after(kept, "DO 1").await;
        done.expect("DO 1");
        id
    }

    /// Kills the session `id` from a connection of its own.
    async fn kill(id: u64) {
        let url = std::env::var("LOCK_TEST_MYSQL_URL").expect("LOCK_TEST_MYSQL_URL");
        let mut admin = MySqlConnection::connect(&url).await.expect("a connection");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .execute(&mut admin)
            .await
            .expect("the kill");
    }

    #[tokio::test]
    async fn a_connection_that_ends_cleanly_is_kept_out_of_the_pool() {
        let kept = kept().await;
        let first = clean(&kept).await;
        // Detached: the pool holds no connection now, and is free to open one.
        assert_eq!(
            kept.pool.size(),
            0,
            "the pool still counts the kept connection"
        );
        for _ in 0..3 {
            let next = clean(&kept).await;
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
        assert_eq!(
            clean(&kept).await,
            first,
            "a server's error cost the kept connection"
        );
    }

    #[tokio::test]
    async fn a_statement_dropped_midway_is_drained_then_kept() {
        let kept = kept().await;
        let first = clean(&kept).await;
        let mut conn = kept.acquire(soon()).await.expect("a connection");
        let sleeping = sqlx::raw_sql("DO SLEEP(2)").execute(&mut *conn);
        let stopped = tokio::time::timeout(Duration::from_millis(50), sleeping).await;
        assert!(
            stopped.is_err(),
            "a half-second sleep answered within 50 ms"
        );
        drop(conn);
        // While the ping waits for the sleep, statements take the pool's connection.
        let meanwhile = clean(&kept).await;
        assert_ne!(
            meanwhile, first,
            "a connection mid-statement was used again"
        );
        // Once the sleep ended and the ping answered, it is the kept connection again.
        let deadline = Instant::now() + Duration::from_secs(5);
        while clean(&kept).await != first {
            assert!(
                Instant::now() < deadline,
                "the drained connection was not kept again within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_broken_connection_is_not_kept() {
        let kept = kept().await;
        let first = clean(&kept).await;
        kill(first).await;
        // The killed connection, used untested (it answered less than TRUSTED_IDLE ago, as a
        // pooled one would be), fails; or, on a slow machine, a ping finds it dead and the
        // pool's answers.
        let mut conn = kept.acquire(soon()).await.expect("a connection");
        let result = sqlx::raw_sql("DO 1").execute(&mut *conn).await.map(drop);
        conn.finish(&result);
        let next = clean(&kept).await;
        assert_ne!(next, first, "the killed connection was kept");
    }

    #[tokio::test]
    async fn one_idle_past_the_trusted_time_is_pinged_and_kept() {
        let kept = kept().await;
        let first = clean(&kept).await;
        // The time under test: the kept connection's idle time, not a wait for an event.
        tokio::time::sleep(TRUSTED_IDLE + Duration::from_millis(20)).await;
        assert_eq!(
            clean(&kept).await,
            first,
            "a live idle connection was replaced"
        );
    }

    /// A relay to the test server that holds the server's answers back while `hold` is true.
    async fn relay(upstream: (String, u16)) -> (u16, tokio::sync::watch::Sender<bool>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("its address").port();
        let (hold, held) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(upstream.clone())
                    .await
                    .expect("the test server");
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
                });
                let mut held = held.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                        if held.wait_for(|hold| !*hold).await.is_err()
                            || to_client.write_all(&buf[..n]).await.is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        (port, hold)
    }

    /// A ping dropped after it was sent and before its answer came (sqlx does not track
    /// pings as it tracks statements): the connection must not be used again, or each later
    /// statement would read the answer meant for the one before it.
    #[tokio::test]
    async fn a_ping_dropped_midway_takes_the_connection_with_it() {
        let url = std::env::var("LOCK_TEST_MYSQL_URL").expect("LOCK_TEST_MYSQL_URL");
        let options: sqlx::mysql::MySqlConnectOptions = url.parse().expect("the URL");
        let upstream = (options.get_host().to_owned(), options.get_port());
        let (port, hold) = relay(upstream).await;
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect_with(options.host("127.0.0.1").port(port))
            .await
            .expect("the test server, relayed");
        let kept = Kept::new(pool);
        clean(&kept).await;
        // The time under test: the kept connection's idle time, after which it is pinged.
        tokio::time::sleep(TRUSTED_IDLE + Duration::from_millis(20)).await;
        hold.send_replace(true);
        let dropped = tokio::time::timeout(Duration::from_millis(100), kept.acquire(soon())).await;
        assert!(
            dropped.is_err(),
            "the ping answered while the relay held answers back"
        );
        hold.send_replace(false);
        // Until the slot settles: the connection gone, or (a drain in the guard's place) back.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let settled = {
                let slot = lock(&kept.slot);
                !slot.exists || slot.idle.is_some()
            };
            if settled {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the slot did not settle within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for round in 0..5 {
            let mut conn = kept.acquire(soon()).await.expect("a connection");
            let read = sqlx::query_scalar::<_, i64>("SELECT 7")
                .fetch_one(&mut *conn)
                .await;
            let ok = matches!(read, Ok(7));
            conn.finish(&read);
            assert!(ok, "round {round}: SELECT 7 read {read:?}");
        }
        // The closed connection's place was freed: a pooled one became the kept one.
        assert_eq!(
            kept.pool.size(),
            0,
            "no connection was kept after the dropped ping"
        );
    }

    #[tokio::test]
    async fn one_the_server_closed_while_idle_is_replaced_unseen() {
        let kept = kept().await;
        let first = clean(&kept).await;
        kill(first).await;
        tokio::time::sleep(TRUSTED_IDLE + Duration::from_millis(20)).await;
        let (next, done) = id_after(&kept, "DO 1").await;
        done.expect("a statement after the kept connection was killed while idle");
        assert_ne!(next, first, "a killed connection was used");
    }
}
