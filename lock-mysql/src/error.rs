//! Classification of sqlx and server errors into [`LockError`]: which failures are transient
//! (deadlock 1213, lock-wait timeout 1205, a lost connection) and which are not.

use lock_core::LockError;
use sqlx::mysql::MySqlDatabaseError;

/// What kind of failure a sqlx error is, for the decisions the strategies make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// 1213: InnoDB chose this transaction as a deadlock victim and rolled it all back;
    /// running the same batch again is safe.
    Deadlock,
    /// 1205 (lock wait timeout, also MariaDB's `NOWAIT` failure) or 3572 (MySQL's `NOWAIT`
    /// failure): the row is locked by another transaction. Only the statement was rolled back.
    LockWait,
    /// 1317: the statement was interrupted (`KILL QUERY`).
    Interrupted,
    /// 1969 (MariaDB `max_statement_time`) or 3024 (MySQL `max_execution_time`): the server's
    /// statement time limit stopped the statement (a wait for a row ends without the row).
    StatementTimeout,
    /// The connection or the server went away, or could not be reached: retrying may help.
    Connection,
    /// Anything else: a bug, a privilege or schema problem; retrying will not help.
    Other,
}

/// Server error numbers that mean the connection or server is going away, overloaded (1040)
/// or read-only (1290, 1836): retrying (on another server, after a failover) may help. Their
/// message carries the server's own words, which tell which.
const CONNECTION_ERRORS: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1077, // ER_NORMAL_SHUTDOWN
    1079, // ER_SHUTDOWN_COMPLETE
    1152, // ER_ABORTING_CONNECTION
    1158, // ER_NET_READ_ERROR
    1159, // ER_NET_READ_INTERRUPTED
    1160, // ER_NET_ERROR_ON_WRITE
    1161, // ER_NET_WRITE_INTERRUPTED
    1290, // ER_OPTION_PREVENTS_STATEMENT (read-only server, e.g. a demoted primary)
    1836, // ER_READ_ONLY_MODE
    1927, // MariaDB ER_CONNECTION_KILLED
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
    4031, // MySQL ER_CLIENT_INTERACTION_TIMEOUT: disconnected for inactivity
];

/// The server's error number, if `error` is one the server sent.
pub(crate) fn server_code(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// Classifies `error`.
pub(crate) fn classify(error: &sqlx::Error) -> Class {
    match error {
        sqlx::Error::Database(_) => server_code(error).map_or(Class::Other, class_of),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => Class::Connection,
        _ => Class::Other,
    }
}

/// The class of the server's error number `code`.
fn class_of(code: u16) -> Class {
    match code {
        1213 => Class::Deadlock,
        1205 | 3572 => Class::LockWait,
        1317 => Class::Interrupted,
        1969 | 3024 => Class::StatementTimeout,
        code if CONNECTION_ERRORS.contains(&code) => Class::Connection,
        _ => Class::Other,
    }
}

/// A failed statement: what was being done (a short description of the operation) and the
/// driver's error. Converted into [`LockError`] by meaning: connection failures, lock-wait
/// timeouts, deadlocks and interruptions become [`LockError::Unavailable`] (retryable);
/// everything else [`LockError::Backend`].
#[derive(Debug)]
pub(crate) struct Error {
    what: String,
    source: sqlx::Error,
}

impl Error {
    pub(crate) fn new(what: impl Into<String>, source: sqlx::Error) -> Self {
        Self {
            what: what.into(),
            source,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = &self.what;
        match classify(&self.source) {
            Class::Deadlock => write!(
                f,
                "mysql: {what}: deadlock (1213); the transaction was rolled back"
            ),
            Class::LockWait => write!(
                f,
                "mysql: {what}: the row stayed locked by another transaction past innodb_lock_wait_timeout"
            ),
            Class::Interrupted => write!(f, "mysql: {what}: the statement was interrupted"),
            Class::StatementTimeout => write!(
                f,
                "mysql: {what}: the statement ran past its time limit and was stopped"
            ),
            // Unreachable, gone, no answer in time, or no pooled connection free: the
            // driver's words tell which.
            Class::Connection => write!(
                f,
                "mysql: {what}: the server is unreachable or went away ({}); retry",
                self.source
            ),
            Class::Other => write!(f, "mysql: {what}: {}", self.source),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<Error> for LockError {
    fn from(error: Error) -> Self {
        let message = error.to_string();
        match classify(&error.source) {
            Class::Other => LockError::backend(message, error.source),
            _ => LockError::unavailable(message, error.source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_are_retryable() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&io), Class::Connection);
        let error = LockError::from(Error::new("acquire `a`", io));
        assert!(error.is_retryable(), "{error}");
        assert!(error.to_string().contains("acquire `a`"), "{error}");
        assert_eq!(classify(&sqlx::Error::PoolTimedOut), Class::Connection);
        assert!(LockError::from(Error::new("x", sqlx::Error::PoolTimedOut)).is_retryable());
    }

    #[test]
    fn a_connection_failure_says_which() {
        let pool = LockError::from(Error::new("queueing", sqlx::Error::PoolTimedOut));
        assert!(pool.to_string().contains("pool timed out"), "{pool}");
        let late = LockError::from(Error::new("queueing", crate::sql::timed_out()));
        assert!(
            late.to_string()
                .contains("no answer from the server in time"),
            "{late}"
        );
    }

    #[test]
    fn server_codes() {
        assert_eq!(
            class_of(1969),
            Class::StatementTimeout,
            "MariaDB max_statement_time"
        );
        assert_eq!(
            class_of(3024),
            Class::StatementTimeout,
            "MySQL max_execution_time"
        );
        assert_eq!(class_of(1205), Class::LockWait);
        assert_eq!(class_of(3572), Class::LockWait);
        assert_eq!(class_of(2013), Class::Connection);
        assert_eq!(class_of(1064), Class::Other);
    }

    #[test]
    fn other_errors_are_not() {
        let error = LockError::from(Error::new("inspect", sqlx::Error::RowNotFound));
        assert!(matches!(error, LockError::Backend { .. }), "{error}");
        // The driver's words, not a guess that the server refused it.
        assert!(error.to_string().contains("no rows returned"), "{error}");
        assert!(!error.is_retryable());
    }
}
