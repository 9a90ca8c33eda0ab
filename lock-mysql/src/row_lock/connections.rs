//! The row lock's dedicated connections: one per hold or wait, outside the pool, kept for
//! the next hold when clean, closed otherwise.

use std::time::{Duration, Instant};

use lock_core::LockError;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, Row};

use super::Shared;
use crate::{
    config::ceil_secs,
    error::{Error, server_code},
    sql::{connect_within, run, tagged},
};

/// Why a wait was stopped before the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The wait budget ran out.
    Deadline,
    /// The caller dropped the `acquire` future.
    Cancelled,
}

/// A connection outside the pool, for one hold or one wait at a time.
pub(super) struct Dedicated {
    pub(super) conn: MySqlConnection,
    /// Its `CONNECTION_ID()`, for `KILL QUERY`.
    pub(super) id: u64,
    /// Its `innodb_lock_wait_timeout`, in seconds.
    pub(super) lock_wait: u64,
    /// Its `wait_timeout` (seconds of silence after which the server closes it), once set
    /// for a hold; kept afterwards, so an idle connection may be closed by the server and is
    /// then replaced on its next use.
    pub(super) wait_timeout: Option<u64>,
}

impl Dedicated {
    /// `SET SESSION wait_timeout = <ttl>; ` if the session does not have it yet.
    pub(super) fn wait_timeout_for(&mut self, ttl: Duration) -> String {
        let seconds = ceil_secs(ttl).max(1);
        if self.wait_timeout == Some(seconds) {
            return String::new();
        }
        self.wait_timeout = Some(seconds);
        format!("SET SESSION wait_timeout = {seconds}; ")
    }
}

impl Shared {
    /// Keeps a clean connection (no transaction, default timeouts) for reuse, or closes it.
    pub(super) fn keep(&self, dedicated: Dedicated) {
        let mut idle = self.idle();
        if idle.len() < self.max_idle {
            idle.push(dedicated);
        } else {
            drop(idle);
            self.discard(dedicated);
        }
    }

    /// Closes a connection politely in the background (or at once, by dropping it, without a
    /// runtime): the server rolls back whatever it held.
    pub(super) fn discard(&self, dedicated: Dedicated) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), dedicated.conn.close()).await;
                });
            }
            Err(_) => drop(dedicated),
        }
    }

    /// A dedicated connection: an idle one (`false`) or a new one (`true`).
    pub(super) async fn checkout(&self) -> Result<(Dedicated, bool), LockError> {
        if let Some(dedicated) = self.idle().pop() {
            return Ok((dedicated, false));
        }
        Ok((self.connect().await?, true))
    }

    pub(super) async fn connect(&self) -> Result<Dedicated, LockError> {
        let what = "opening a connection for a row lock";
        let mut conn = connect_within(&self.connect, self.connect_timeout, what).await?;
        // The hold is an idle transaction: no server-side idle killer or statement time limit
        // may end it (or a wait) behind the client's back.
        let setup = if self.session_setup.is_empty() {
            String::new()
        } else {
            format!("{}; ", self.session_setup)
        };
        let rows = run(
            &mut conn,
            AssertSqlSafe(format!(
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; {setup}\
                 SELECT 'id', CAST(CONNECTION_ID() AS UNSIGNED), CAST(@@SESSION.innodb_lock_wait_timeout AS UNSIGNED)"
            )),
        )
        .await
        .map_err(|e| LockError::from(Error::new(what, e)))?;
        let row = tagged(&rows, "id").next().ok_or_else(|| {
            LockError::backend_msg(format!("{what}: CONNECTION_ID() returned nothing"))
        })?;
        let id: u64 = row
            .try_get(1)
            .map_err(|e| LockError::from(Error::new(what, e)))?;
        let lock_wait: u64 = row
            .try_get(2)
            .map_err(|e| LockError::from(Error::new(what, e)))?;
        Ok(Dedicated {
            conn,
            id,
            lock_wait,
            wait_timeout: None,
        })
    }

    /// Stops the statement running on connection `id` (a waiting `SELECT ... FOR UPDATE`, a
    /// parked chunk), trying until `until`. False when that could not be done.
    pub(super) async fn kill_query(&self, id: u64, until: Instant) -> bool {
        let kill = || sqlx::raw_sql(AssertSqlSafe(format!("KILL QUERY {id}")));
        match self.anchor.execute_short(until, kill).await {
            Ok(_) => true,
            // 1094: unknown thread id: the connection is gone, and its wait with it.
            Err(error) => server_code(&error) == Some(1094),
        }
    }

    /// Rolls back and keeps the connection, or closes it if the rollback fails.
    pub(super) async fn rollback_and_keep(&self, mut dedicated: Dedicated) {
        match run(&mut dedicated.conn, "ROLLBACK").await {
            Ok(_) => self.keep(dedicated),
            Err(_) => self.discard(dedicated),
        }
    }
}
