//! What a backend learns about its server when it connects, and the session settings it derives
//! from that: which product it is (MariaDB or MySQL), whether a commit is durable (what strict
//! fences rely on), and which server-side killers of idle transactions and long statements
//! exist there, so the connections that hold row locks can turn them off.
//!
//! - **Idle transactions**: a row-lock hold is an open (write) transaction on an otherwise idle
//!   connection. MariaDB's `idle_transaction_timeout`, `idle_write_transaction_timeout` and
//!   `idle_readonly_transaction_timeout` would end it before the lease's local deadline; they
//!   are session variables, so every dedicated connection sets them to 0 (off). Percona
//!   Server's `innodb_kill_idle_transaction` is global only: a server with it on is refused for
//!   the row-lock strategy ([`Server::check_row_lock`]).
//! - **Statement time limits**: MariaDB's `max_statement_time` and MySQL's
//!   `max_execution_time` would cut a row-lock wait short of its budget; every session of this
//!   crate turns them off and bounds its statements itself.
//! - **Durability**: a fence is a committed counter. With `innodb_flush_log_at_trx_commit`
//!   other than 1 the last commits before a crash can be lost, so a fence could be issued
//!   twice: the backend then declares [`Fencing::BestEffort`].

use std::time::Duration;

use lock_core::{Fencing, LockError};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row, mysql::MySqlConnectOptions};

use crate::error::Error;

/// The session variables that end idle transactions or cut statements short, where they exist.
const SESSION_KILLERS: &[&str] = &[
    "idle_transaction_timeout",
    "idle_write_transaction_timeout",
    "idle_readonly_transaction_timeout",
    "max_statement_time",
    "max_execution_time",
];

/// Percona Server's global idle-transaction killer (no session form).
const GLOBAL_KILLER: &str = "innodb_kill_idle_transaction";

/// The durability setting strict fences rely on.
const FLUSH: &str = "innodb_flush_log_at_trx_commit";

/// The server as found at connect time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// `VERSION()`.
    pub(crate) version: String,
    /// Whether it is MariaDB (else MySQL or a fork of it).
    pub(crate) mariadb: bool,
    /// `innodb_flush_log_at_trx_commit`, if the server reported it.
    flush_at_commit: Option<String>,
    /// Percona's `innodb_kill_idle_transaction` (seconds), if the variable exists.
    kill_idle_transaction: Option<String>,
    /// The [`SESSION_KILLERS`] this server has.
    killers: Vec<&'static str>,
}

impl Server {
    /// Reads the server's product and variables over a connection of its own.
    pub(crate) async fn probe(
        options: &MySqlConnectOptions,
        connect_timeout: Duration,
        url: &str,
    ) -> Result<Self, LockError> {
        let what = format!("connecting to {url}");
        let mut conn = tokio::time::timeout(connect_timeout, options.connect())
            .await
            .map_err(|_| {
                LockError::unavailable_msg(format!("{what}: no answer within {connect_timeout:?}"))
            })?
            .map_err(|e| LockError::from(Error::new(&what, e)))?;
        let names: Vec<String> = SESSION_KILLERS
            .iter()
            .chain([GLOBAL_KILLER, FLUSH].iter())
            .map(|v| format!("'{v}'"))
            .collect();
        let sql = format!(
            "SELECT 'version', VERSION(); \
             SHOW GLOBAL VARIABLES WHERE Variable_name IN ({})",
            names.join(", ")
        );
        let read = async {
            let rows = sqlx::raw_sql(AssertSqlSafe(sql))
                .fetch_all(&mut conn)
                .await?;
            let mut version = String::new();
            let mut variables = Vec::new();
            for row in &rows {
                let first: String = row.try_get(0)?;
                let second: String = row.try_get(1)?;
                if first == "version" && version.is_empty() {
                    version = second;
                } else {
                    variables.push((first.to_ascii_lowercase(), second));
                }
            }
            Ok::<_, sqlx::Error>((version, variables))
        };
        let read = tokio::time::timeout(connect_timeout, read).await;
        let _ = tokio::time::timeout(connect_timeout, conn.close()).await;
        let (version, variables) = read
            .map_err(|_| {
                LockError::unavailable_msg(format!(
                    "{what}: the server did not describe itself within {connect_timeout:?}"
                ))
            })?
            .map_err(|e| {
                LockError::from(Error::new(
                    format!("reading the server's variables ({url})"),
                    e,
                ))
            })?;
        Ok(Self::from_variables(version, &variables))
    }

    /// The server described by `VERSION()` and `SHOW GLOBAL VARIABLES` rows.
    pub(crate) fn from_variables(version: String, variables: &[(String, String)]) -> Self {
        let value = |name: &str| {
            variables
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        Self {
            mariadb: version.to_ascii_lowercase().contains("mariadb"),
            flush_at_commit: value(FLUSH),
            kill_idle_transaction: value(GLOBAL_KILLER),
            killers: SESSION_KILLERS
                .iter()
                .copied()
                .filter(|k| value(k).is_some())
                .collect(),
            version,
        }
    }

    /// The fencing this server supports: strict only when every commit is flushed to disk
    /// (`innodb_flush_log_at_trx_commit = 1`), else best effort, with the reason.
    pub(crate) fn fencing(&self) -> (Fencing, Option<String>) {
        match self.flush_at_commit.as_deref() {
            Some("1") => (Fencing::Strict, None),
            Some(other) => (
                Fencing::BestEffort,
                Some(format!(
                    "{FLUSH} is {other}, not 1: a crash can lose the last commits, and with them \
                     the last fences issued, so a fence may be issued twice"
                )),
            ),
            None => (
                Fencing::BestEffort,
                Some(format!(
                    "the server did not report {FLUSH}: commits cannot be shown to be durable"
                )),
            ),
        }
    }

    /// `SET SESSION` of every statement time limit and idle-transaction killer this server has
    /// to 0 (off), or an empty string when it has none.
    pub(crate) fn session_setup(&self) -> String {
        if self.killers.is_empty() {
            return String::new();
        }
        let sets: Vec<String> = self.killers.iter().map(|k| format!("{k} = 0")).collect();
        format!("SET SESSION {}", sets.join(", "))
    }

    /// Refuses the row-lock strategy on a server that kills idle transactions globally
    /// (Percona's `innodb_kill_idle_transaction` above 0): it would end holds behind their
    /// local deadline, and no session can turn it off.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] naming the variable and what to do.
    pub(crate) fn check_row_lock(&self) -> Result<(), LockError> {
        match self.kill_idle_transaction.as_deref() {
            None | Some("0") => Ok(()),
            Some(seconds) => Err(LockError::unsupported(format!(
                "the row-lock strategy on this server ({}): {GLOBAL_KILLER} is {seconds}, so \
                     the server ends a row-lock hold (an idle transaction) after {seconds} s, \
                     before the lease's local deadline, and no session can turn it off; set it \
                     to 0 or use the lease strategy",
                self.version
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn mariadb_turns_off_its_killers() {
        let server = Server::from_variables(
            "10.11.19-MariaDB-0+deb12u1".into(),
            &vars(&[
                ("idle_transaction_timeout", "0"),
                ("idle_write_transaction_timeout", "5"),
                ("idle_readonly_transaction_timeout", "0"),
                ("max_statement_time", "0.000000"),
                ("innodb_flush_log_at_trx_commit", "1"),
            ]),
        );
        assert!(server.mariadb);
        assert_eq!(
            server.session_setup(),
            "SET SESSION idle_transaction_timeout = 0, idle_write_transaction_timeout = 0, \
             idle_readonly_transaction_timeout = 0, max_statement_time = 0"
        );
        assert_eq!(server.fencing(), (Fencing::Strict, None));
        server.check_row_lock().unwrap();
    }

    #[test]
    fn mysql_and_percona() {
        let mysql = Server::from_variables(
            "8.0.36".into(),
            &vars(&[
                ("max_execution_time", "100"),
                ("innodb_flush_log_at_trx_commit", "2"),
            ]),
        );
        assert!(!mysql.mariadb);
        assert_eq!(mysql.session_setup(), "SET SESSION max_execution_time = 0");
        let (fencing, why) = mysql.fencing();
        assert_eq!(fencing, Fencing::BestEffort);
        assert!(why.unwrap().contains("is 2"));
        mysql.check_row_lock().unwrap();
        let percona = Server::from_variables(
            "8.0.36-28".into(),
            &vars(&[("innodb_kill_idle_transaction", "30")]),
        );
        let refused = percona.check_row_lock().unwrap_err();
        assert!(matches!(refused, LockError::Unsupported { .. }));
        assert!(
            refused
                .to_string()
                .contains("innodb_kill_idle_transaction is 30")
        );
        assert_eq!(percona.session_setup(), "");
        assert_eq!(percona.fencing().0, Fencing::BestEffort);
        Server::from_variables(
            "8.0".into(),
            &vars(&[("innodb_kill_idle_transaction", "0")]),
        )
        .check_row_lock()
        .unwrap();
    }
}
