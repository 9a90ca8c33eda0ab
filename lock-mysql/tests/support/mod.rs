//! What the MySQL test binaries share: the server from `LOCK_TEST_MYSQL_URL`, per-run tables,
//! and the conformance suite's [`TestStore`] with its administrator's tools.
//!
//! Each test process works in its own tables (`t<pid>_lease`, `t<pid>_rows`), dropped when it
//! ends, so runs never see each other's rows. A holder process started by the conformance
//! runner uses its parent's tables.

// Each test binary uses part of this module.
#![allow(dead_code, unreachable_pub)]

pub mod admin;
pub mod proxy;
pub mod wire;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use conformance_tests::{
    CaseFuture, Failure, TestStore,
    faults::{env_var, poll_every},
};
use lock_core::{LockAdmin, LockClient, LockError, LockName};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy, TableName};
use sqlx::{
    AssertSqlSafe, ConnectOptions, MySqlConnection, MySqlPool, Row,
    mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPoolOptions},
};

/// The variable naming the test server.
pub const URL_VAR: &str = "LOCK_TEST_MYSQL_URL";

/// The test server's URL, or the error every MySQL test reports without it.
pub fn url() -> Result<String, String> {
    env_var(URL_VAR).map_err(|Failure(why)| why)
}

/// This run's table for `strategy` (the parent's, in a conformance holder process).
///
/// # Errors
/// When the name is not a valid table name. Never another table instead: the run's tables
/// are dropped at the end, and falling back to, say, the library's default table would drop
/// a user's locks.
pub fn run_table(strategy: Strategy) -> Result<TableName, String> {
    let pid = if std::env::var_os(conformance_tests::HOLDER_STORE_VAR).is_some() {
        std::os::unix::process::parent_id()
    } else {
        std::process::id()
    };
    let suffix = match strategy {
        Strategy::Lease => "lease",
        _ => "rows",
    };
    TableName::new(format!("t{pid}_{suffix}")).map_err(|e| format!("this run's table: {e}"))
}

/// The config of this run's clients.
pub fn config(strategy: Strategy) -> Result<MySqlConfig, String> {
    store_url(strategy)?
        .parse()
        .map_err(|e: LockError| format!("this run's store URL: {e}"))
}

/// This run's store URL for `strategy`: the server's URL with the strategy, this run's table
/// and the suite's pool settings in its query, as `distributed_lock::connect` takes it.
///
/// # Errors
/// When the variable is not set or the table name is not valid.
pub fn store_url(strategy: Strategy) -> Result<String, String> {
    let url = url()?;
    let separator = if url.contains('?') { '&' } else { '?' };
    Ok(format!(
        "{url}{separator}strategy={strategy}&table={}&pool_size=4&connect_timeout_ms=3000",
        run_table(strategy)?
    ))
}

fn admin_options() -> Result<MySqlConnectOptions, String> {
    url()?
        .parse()
        .map_err(|e| format!("{URL_VAR} is not a MySQL URL: {e}"))
}

/// The administrator's session: it waits for row locks longer than the library's clients.
async fn admin_setup(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 10, lock_wait_timeout = 10")
        .execute(conn)
        .await
        .map(drop)
}

fn no_answer(e: sqlx::Error) -> String {
    format!("the MySQL server at {URL_VAR} does not answer: {e}")
}

/// A pool for the administrator's statements (outside the library).
pub async fn admin_pool() -> Result<MySqlPool, String> {
    MySqlPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .after_connect(|conn, _| Box::pin(admin_setup(conn)))
        .connect_with(admin_options()?)
        .await
        .map_err(no_answer)
}

/// One administrator's connection of its own (for a transaction held across statements; closing
/// it rolls back whatever it holds).
pub async fn admin_conn() -> Result<MySqlConnection, String> {
    let mut conn = admin_options()?.connect().await.map_err(no_answer)?;
    admin_setup(&mut conn).await.map_err(no_answer)?;
    Ok(conn)
}

/// `text`'s bytes as hex digits (`X'<hex>'` in SQL; `LOWER(HEX(column))` reads the same).
pub fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Drops this run's tables (and `<table>_placed`, the record a case may keep of the places
/// written, see [`MySqlStore::record_places`]).
pub async fn drop_run_tables() -> Result<(), String> {
    let admin = admin_pool().await?;
    for strategy in [Strategy::Lease, Strategy::RowLock] {
        let table = run_table(strategy)?;
        let sql = format!(
            "DROP TABLE IF EXISTS `{0}`, `{0}_fences`, `{0}_holds`, `{0}_queue`, `{0}_placed`",
            table.as_str()
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .map_err(|e| format!("dropping the test table `{table}`: {e}"))?;
    }
    admin.close().await;
    Ok(())
}

fn sql_error(what: &str) -> impl Fn(sqlx::Error) -> LockError + '_ {
    move |e| LockError::backend(format!("test store: {what}"), e)
}

/// The conformance suite's view of one strategy on the test server.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    /// The store URL `config` was parsed from.
    url: String,
    config: MySqlConfig,
    table: TableName,
    admin: MySqlPool,
}

impl MySqlStore {
    /// Connects (creating this run's table) or says why it cannot.
    pub async fn new(strategy: Strategy) -> Result<Self, String> {
        let url = store_url(strategy)?;
        let config: MySqlConfig = url
            .parse()
            .map_err(|e: LockError| format!("this run's store URL: {e}"))?;
        let admin = admin_pool().await?;
        // Creates and checks the table, so the administrator's statements find it.
        MySqlBackend::connect(&config)
            .await
            .map_err(|e| format!("the MySQL server at {URL_VAR} does not answer: {e}"))?;
        Ok(Self {
            url,
            table: config.table_name(),
            config,
            admin,
        })
    }

    /// The administrator's pool.
    pub fn admin(&self) -> &MySqlPool {
        &self.admin
    }

    /// From now on, records every place written in the waiters' queue (a trigger on
    /// `<table>_queue` copies each inserted name to `<table>_placed`, in the inserting
    /// statement's transaction), so a case can tell whether a call took a place at all, not
    /// only whether one is left (a place taken and removed in the background is gone by the
    /// time it looks, or not, by chance).
    pub async fn record_places(&self) -> Result<(), String> {
        let t = self.table.as_str();
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS `{t}_placed` (name VARBINARY(255) NOT NULL); \
             CREATE TRIGGER IF NOT EXISTS `{t}_placed` AFTER INSERT ON `{t}_queue` \
             FOR EACH ROW INSERT INTO `{t}_placed` (name) VALUES (NEW.name)"
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.admin)
            .await
            .map(drop)
            .map_err(|e| format!("recording the places written: {e}"))
    }

    /// How many places were written for `name` since [`Self::record_places`].
    pub async fn places_written(&self, name: &LockName) -> Result<i64, String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM `{}_placed` WHERE name = ?",
            self.table.as_str()
        )))
        .bind(name.as_str().as_bytes())
        .fetch_one(&self.admin)
        .await
        .map_err(|e| format!("counting the places written for `{name}`: {e}"))
    }

    /// The config clients are made with.
    pub fn config(&self) -> &MySqlConfig {
        &self.config
    }

    /// The connection id written (uncommitted) by the current row-lock holder of `name`.
    pub async fn holder_connection(&self, name: &LockName) -> Result<Option<u64>, LockError> {
        let sql = format!(
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION READ ONLY; \
             SELECT connection_id FROM `{}_holds` WHERE name = X'{}'; COMMIT",
            self.table,
            hex(name.as_str())
        );
        let mut conn = self
            .admin
            .acquire()
            .await
            .map_err(sql_error("no admin connection"))?;
        let rows = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
            .map_err(sql_error("reading the holder"))?;
        Ok(rows
            .first()
            .map(|row| row.try_get::<Option<u64>, _>(0))
            .transpose()
            .map_err(sql_error("decoding the holder"))?
            .flatten())
    }
}

#[async_trait]
impl TestStore for MySqlStore {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(MySqlBackend::connect(&self.config).await?))
    }

    fn url(&self) -> String {
        lock_core::backend::redact_url(&self.url)
    }

    async fn admin(&self) -> Result<Arc<dyn LockAdmin>, LockError> {
        Ok(Arc::new(MySqlBackend::connect(&self.config).await?))
    }

    /// Lease: the administrator clears the row's token and expiry (`DELETE` would also reset
    /// its fence counter). Row lock: the administrator kills the holder's connection (the
    /// connection id the holder recorded), which rolls its transaction back, and deletes the
    /// row (the fence counter is in the `_fences` table).
    async fn revoke(&self, name: &LockName) -> Result<(), LockError> {
        let t = &self.table;
        if self.config.strategy == Strategy::Lease {
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE `{t}` SET token = NULL, expires_at = NULL WHERE name = ?"
            )))
            .bind(name.as_str().as_bytes())
            .execute(&self.admin)
            .await
            .map_err(sql_error("revoking"))?;
            return Ok(());
        }
        if let Some(id) = self.holder_connection(name).await? {
            let killed = sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(&self.admin)
                .await;
            if let Err(error) = killed {
                // 1094: the connection ended meanwhile.
                let gone = error
                    .as_database_error()
                    .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
                    .is_some_and(|e| e.number() == 1094);
                if !gone {
                    return Err(sql_error("killing the holder")(error));
                }
            }
        }
        sqlx::query(AssertSqlSafe(format!("DELETE FROM `{t}` WHERE name = ?")))
            .bind(name.as_str().as_bytes())
            .execute(&self.admin)
            .await
            .map_err(sql_error("deleting the row"))?;
        Ok(())
    }

    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        let t = &self.table;
        let n = hex(name.as_str());
        let mut found = Vec::new();
        if self.config.strategy == Strategy::Lease {
            let sql = format!(
                "SELECT token, expires_at IS NOT NULL, fence FROM `{t}` WHERE name = X'{n}'"
            );
            for row in sqlx::raw_sql(AssertSqlSafe(sql))
                .fetch_all(&self.admin)
                .await
                .map_err(sql_error("reading leftovers"))?
            {
                let token: Option<Vec<u8>> = row.try_get(0).map_err(sql_error("decoding"))?;
                let expires: i64 = row.try_get(1).map_err(sql_error("decoding"))?;
                let fence: u64 = row.try_get(2).map_err(sql_error("decoding"))?;
                if token.is_some() || expires != 0 {
                    found.push(format!(
                        "a row with fence {fence}, token {:?}, expiry set: {}",
                        token.map(|t| String::from_utf8_lossy(&t).into_owned()),
                        expires != 0
                    ));
                }
            }
            return Ok(found);
        }
        let sql = format!(
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION READ ONLY; \
             SELECT 'current', token, connection_id FROM `{t}_holds` WHERE name = X'{n}'; COMMIT; \
             SELECT 'committed', token, fence, acquired_at IS NOT NULL, connection_id FROM `{t}_holds` WHERE name = X'{n}'"
        );
        let mut conn = self
            .admin
            .acquire()
            .await
            .map_err(sql_error("no admin connection"))?;
        for row in sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
            .map_err(sql_error("reading leftovers"))?
        {
            let tag: String = row.try_get(0).map_err(sql_error("decoding"))?;
            if tag == "current" {
                let token: Option<Vec<u8>> = row.try_get(1).map_err(sql_error("decoding"))?;
                let conn: Option<u64> = row.try_get(2).map_err(sql_error("decoding"))?;
                if token.is_some() {
                    found.push(format!("a live hold by connection {conn:?}"));
                }
            } else {
                let token: Option<Vec<u8>> = row.try_get(1).map_err(sql_error("decoding"))?;
                let fence: u64 = row.try_get(2).map_err(sql_error("decoding"))?;
                let acquired: i64 = row.try_get(3).map_err(sql_error("decoding"))?;
                let conn: Option<u64> = row.try_get(4).map_err(sql_error("decoding"))?;
                if token.is_some() || fence != 0 || acquired != 0 || conn.is_some() {
                    found.push(format!(
                        "committed values: token {:?}, fence {fence}, connection {conn:?}",
                        token.map(|t| String::from_utf8_lossy(&t).into_owned())
                    ));
                }
            }
        }
        Ok(found)
    }

    async fn plant_foreign(&self, name: &LockName) -> Result<(), LockError> {
        let t = &self.table;
        let sql = if self.config.strategy == Strategy::Lease {
            format!(
                "INSERT INTO `{t}` (name, token, fence, expires_at, acquired_at) \
                 VALUES (?, 'not-a-lock-mysql-token', 7, NOW(6) + INTERVAL 1 HOUR, NOW(6))"
            )
        } else {
            format!(
                "INSERT INTO `{t}_holds` (name, token, fence, acquired_at, connection_id) \
                 VALUES (?, 'not-a-lock-mysql-token', 7, NOW(6), 0)"
            )
        };
        sqlx::query(AssertSqlSafe(sql))
            .bind(name.as_str().as_bytes())
            .execute(&self.admin)
            .await
            .map_err(sql_error("planting a foreign row"))?;
        Ok(())
    }

    /// Stops the MariaDB server (`mariadb` of `cargo xtask services`).
    async fn begin_outage(&self) -> Result<(), LockError> {
        conformance_tests::Services::from_env()?
            .stop(&["mariadb"])
            .await
    }

    async fn end_outage(&self) -> Result<(), LockError> {
        conformance_tests::Services::from_env()?
            .start(&["mariadb"])
            .await
    }

    fn can_fail(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn can_plant_foreign(&self) -> bool {
        true
    }

    /// The lease's 2 s, the row lock's 1 s. Every lease renewal commits, waiting for the
    /// server's log flush, which a slow disk stalls for most of a second at times: with 1 s,
    /// CI once saw a renewed lease lost in a fault case of the same shape as
    /// `watchdog/keeps_lock_past_ttls` (renewals every third of the TTL). A row-lock renewal
    /// writes nothing.
    fn ttl(&self) -> Duration {
        match self.config.strategy {
            Strategy::Lease => Duration::from_secs(2),
            _ => Duration::from_secs(1),
        }
    }

    /// Half a second, as with a TTL of 1 s: the bounds that add it (an outage's retry within
    /// lock-core's one-second answer grace, a waiter left behind) stay as tight as they were.
    fn margin(&self) -> Duration {
        Duration::from_millis(500)
    }
}

/// How many statements whose text contains `name`'s hex run on the server now, besides the
/// probe itself.
pub async fn statements_on(admin: &MySqlPool, name: &LockName) -> Result<i64, String> {
    statements_mentioning(admin, &hex(name.as_str())).await
}

/// How many statements whose text contains `text` run on the server now, besides the probe.
pub async fn statements_mentioning(admin: &MySqlPool, text: &str) -> Result<i64, String> {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE ID <> CONNECTION_ID() AND INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'",
    )
    .bind(format!("%{text}%"))
    .fetch_one(admin)
    .await
    .map_err(|e| format!("reading the process list: {e}"))
}

/// Polls the statements on `name` every 5 ms until `done` holds for their count, for `limit`
/// at most; the error says what did not happen and the last count.
async fn until_statements(
    admin: &MySqlPool,
    name: &LockName,
    limit: Duration,
    what: &str,
    done: impl Fn(i64) -> bool,
) -> Result<(), String> {
    let mut count = 0;
    let polled = poll_every(Duration::from_millis(5), limit, what, async || {
        count = statements_on(admin, name).await.map_err(Failure)?;
        Ok(done(count))
    })
    .await;
    polled.map_err(|Failure(why)| format!("{why} ({count} statements on `{name}` run)"))
}

/// Waits (2 s at most) until a statement on `name` runs on the server: a waiter has entered
/// InnoDB's queue.
pub async fn until_waiting(admin: &MySqlPool, name: &LockName) -> Result<(), String> {
    let what = format!("a statement on `{name}` waiting on the server");
    until_statements(admin, name, Duration::from_secs(2), &what, |n| n > 0).await
}

/// Waits (`limit` at most) until no statement whose text contains `text` runs on the server.
pub async fn until_no_statement_mentioning(
    admin: &MySqlPool,
    text: &str,
    limit: Duration,
) -> Result<(), String> {
    let what = format!("the statements mentioning {text} ending");
    let mut count = 0;
    poll_every(Duration::from_millis(5), limit, &what, async || {
        count = statements_mentioning(admin, text).await.map_err(Failure)?;
        Ok(count == 0)
    })
    .await
    .map_err(|Failure(why)| format!("{why} ({count} still run)"))
}

/// Waits (1 s at most) until no statement on `name` runs on the server.
pub async fn until_no_statement(admin: &MySqlPool, name: &LockName) -> Result<(), String> {
    let what = format!("the statements on `{name}` ending");
    until_statements(admin, name, Duration::from_secs(1), &what, |n| n == 0).await
}

/// The clean-up after a binary's cases (`Cases::finally`): drops this run's tables (nothing
/// to do without a server: every case has failed already).
pub fn drop_tables_after_cases() -> CaseFuture<Failure> {
    Box::pin(async {
        if url().is_ok() {
            drop_run_tables().await.map_err(Failure)
        } else {
            Ok(())
        }
    })
}
