//! [`MySqlConfig`] and [`Strategy`]: where the server is, which strategy, which table, and
//! how many connections.

use std::{fmt, str::FromStr, time::Duration};

use lock_core::{
    LockError,
    backend::{StoreUrl, redact_url},
};
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlConnectOptions;

use crate::TableName;

/// How locks are kept in MySQL/MariaDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Strategy {
    /// A row per lock with the holder's token and an expiry (`DATETIME(6)` in UTC, server clock).
    /// Holds survive the connection that made them and end at their TTL; leases are portable.
    /// Waiters poll with jittered back-off.
    #[default]
    Lease,
    /// The hold is an open transaction holding `SELECT ... FOR UPDATE` on the lock's row, on a
    /// connection dedicated to the hold. Waiters queue inside InnoDB and wake on release; the
    /// hold ends on release or when the connection ends.
    RowLock,
}

impl Strategy {
    /// The label used in URLs and configs: `lease` or `row-lock`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::RowLock => "row-lock",
        }
    }

    /// The table used when the config names none: `lock_leases` or `lock_row_locks`.
    /// The strategies keep separate tables: a table records which strategy it serves.
    pub fn default_table(self) -> TableName {
        let name = match self {
            Self::Lease => "lock_leases",
            Self::RowLock => "lock_row_locks",
        };
        TableName::known(name)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lease" => Ok(Self::Lease),
            "row-lock" | "rowlock" | "row_lock" => Ok(Self::RowLock),
            other => Err(LockError::invalid_options(format!(
                "strategy is {other:?}; it must be `lease` or `row-lock`"
            ))),
        }
    }
}

/// How to reach MySQL/MariaDB and how to keep locks there.
///
/// Serde with defaults for every field but `url`, and a URL form whose query parameters carry
/// the lock settings (the rest of the URL goes to sqlx):
///
/// ```
/// use lock_mysql::{MySqlConfig, Strategy};
///
/// let config: MySqlConfig =
///     "mysql://app:secret@db.internal:3306/app?strategy=row-lock&table=job_locks&pool_size=4"
///         .parse()?;
/// assert_eq!(config.strategy, Strategy::RowLock);
/// assert_eq!(config.table_name().as_str(), "job_locks");
/// assert_eq!(config.pool_size, 4);
/// assert!(!format!("{config:?}").contains("secret"));
/// # Ok::<(), lock_core::LockError>(())
/// ```
///
/// # Connections
/// Each backend has one sqlx pool of `pool_size` connections for its short statements (one
/// per concurrent acquire try, renewal batch, release or inspect), and one connection kept
/// beside it for the statements of an uncontended lock, which sqlx would ping each time it went
/// back to the pool (see the crate's README, "Connections"). The lease strategy needs nothing
/// else. The row-lock strategy also opens one dedicated connection per held lock and
/// per lock name being waited on, outside the pool (so held locks never starve it): of one
/// client's `acquire` calls waiting for the same name, only the first waits in the server, the
/// others queue in the client, in arrival order. It keeps up to `idle_hold_connections` of
/// them open for reuse, and on MariaDB, from the moment it connects, one more, holding the
/// user lock its holds park on: the pool's first connection, taken out of the pool, which
/// also runs the fence bumps and kills (the kept connection and the pool serve only when it
/// is busy or down). A client running one lock at a time so has one connection per held lock
/// and per name waited on, those kept for reuse, and that one; plan at most
/// `pool_size + held + names waited on + idle_hold_connections + 2` connections per client
/// against the server's `max_connections`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct MySqlConfig {
    /// `mysql://user:password@host:port/database` (sqlx's URL options such as `ssl-mode`
    /// are accepted). The database must be named: the lock table lives there.
    pub url: String,
    /// The strategy (default: [`Strategy::Lease`]).
    pub strategy: Strategy,
    /// The lock table; `None` means [`Strategy::default_table`].
    pub table: Option<TableName>,
    /// Connections in the pool for short statements (default 8, at least 1).
    pub pool_size: u32,
    /// How long to wait for a connection (new or from the pool) before the store counts as
    /// unavailable (default 5 s); serialized as text such as `"5s"`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// `innodb_lock_wait_timeout` of pooled connections, in whole seconds (default 5 s): how
    /// long one short statement may wait for a row another transaction locks (the lease
    /// strategy locks a row only for the duration of one statement or batch). Serialized as text
    /// such as `"5s"`; rounded up to whole seconds.
    #[serde(with = "humantime_serde")]
    pub lock_wait_timeout: Duration,
    /// How long one call may wait for the server's answer when no wait budget bounds it
    /// (default 10 s): `release`, `renew`/`extend` (the watchdog's renewals too) and
    /// `inspect`, each including getting a connection. A call that runs out answers
    /// [`LockError::Unavailable`] (retryable) and closes its connection, so a half-open
    /// connection (a server host gone without a reset, a firewall dropping packets) costs this
    /// long, not the minutes of TCP retransmission. `acquire` is bounded by its wait budget
    /// instead. Serialized as text such as `"10s"`; at least 1 ms.
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// Create the table if it is missing (default true). When false, a missing table is an
    /// error; see [`create_table_sql`](crate::create_table_sql) for the DDL.
    pub create_table: bool,
    /// Row-lock strategy: dedicated connections kept open for reuse after a release
    /// (default 4).
    pub idle_hold_connections: usize,
}

/// The URL parameters [`MySqlConfig::from_url`] hands on to sqlx (sqlx reads these and
/// ignores any other).
pub const SQLX_PARAMETERS: [&str; 12] = [
    "ssl-mode",
    "sslmode",
    "ssl-ca",
    "sslca",
    "ssl-cert",
    "sslcert",
    "ssl-key",
    "sslkey",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
];

impl Default for MySqlConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            strategy: Strategy::Lease,
            table: None,
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            lock_wait_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
            create_table: true,
            idle_hold_connections: 4,
        }
    }
}

impl MySqlConfig {
    /// The defaults with `url` (a plain sqlx URL; use [`MySqlConfig::from_url`] or `parse`
    /// for lock settings in the query string).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Parses a URL (`mysql://` or `mariadb://`) whose query parameters `strategy`, `table`,
    /// `pool_size`, `connect_timeout_ms`, `lock_wait_timeout_ms`, `statement_timeout_ms`,
    /// `create_table` and `idle_hold_connections` set the fields of the same names; sqlx's
    /// own parameters ([`SQLX_PARAMETERS`]: TLS, character set, statement cache, socket)
    /// stay in [`MySqlConfig::url`] for sqlx. Any other parameter is an error that names it
    /// (sqlx would ignore it silently); `timezone` too, as the library pins sessions to UTC.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the parameter that is wrong.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        // The common checks of every store URL first (length, characters, hosts and ports,
        // percent-encoding, keys given twice): the `url` crate drops tabs and newlines
        // silently, for one.
        let checked = StoreUrl::parse(url)?;
        let url = match checked.scheme() {
            "mysql" => url.to_owned(),
            "mariadb" => format!("mysql{}", &url["mariadb".len()..]),
            other => {
                return Err(invalid(format!(
                    "`{other}://` is not a MySQL URL; expected mysql://user:password@host:port/database \
                     (or mariadb://)"
                )));
            }
        };
        if checked.require_hosts()?.len() > 1 {
            return Err(invalid(
                "the MySQL URL names several hosts; it takes one server".into(),
            ));
        }
        let mut parsed = url::Url::parse(&url).map_err(|e| {
            invalid(format!(
                "the MySQL URL does not parse ({e}); expected mysql://user:password@host:port/database"
            ))
        })?;
        let mut config = Self::default();
        let mut rest = Vec::new();
        for (key, value) in parsed.query_pairs() {
            let (key, value) = (key.into_owned(), value.into_owned());
            match key.as_str() {
                "strategy" => config.strategy = value.parse()?,
                "table" => config.table = Some(TableName::new(value)?),
                "pool_size" => config.pool_size = number(&key, &value)?,
                "connect_timeout_ms" => {
                    config.connect_timeout = Duration::from_millis(number(&key, &value)?);
                }
                "lock_wait_timeout_ms" => {
                    config.lock_wait_timeout = Duration::from_millis(number(&key, &value)?);
                }
                "statement_timeout_ms" => {
                    config.statement_timeout = Duration::from_millis(number(&key, &value)?);
                }
                "create_table" => config.create_table = number::<u8>(&key, &value)? != 0,
                "idle_hold_connections" => {
                    config.idle_hold_connections = number(&key, &value)?;
                }
                "timezone" | "time-zone" => {
                    return Err(invalid(format!(
                        "URL parameter `{key}`: sessions of this library always read the \
                         server clock in UTC"
                    )));
                }
                sqlx if SQLX_PARAMETERS.contains(&sqlx) => rest.push((key, value)),
                other => {
                    return Err(invalid(format!(
                        "the MySQL URL has no parameter `{other}`; the library's are strategy, \
                         table, pool_size, connect_timeout_ms, lock_wait_timeout_ms, \
                         statement_timeout_ms, create_table, idle_hold_connections, and sqlx's \
                         {}",
                        SQLX_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        if rest.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(rest);
        }
        config.url = parsed.into();
        config.validate()?;
        Ok(config)
    }

    /// Sets the strategy.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets the lock table.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = Some(table);
        self
    }

    /// Sets the pool size.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the statement timeout (see [`MySqlConfig::statement_timeout`]).
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Sets whether a missing table is created.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// The lock table in force: [`MySqlConfig::table`] (the setter) or the strategy's default.
    pub fn table_name(&self) -> TableName {
        self.table
            .clone()
            .unwrap_or_else(|| self.strategy.default_table())
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the value.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.pool_size == 0 {
            return Err(invalid("pool_size is 0; it must be at least 1".into()));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid(
                "connect_timeout is 0; it must be above zero".into(),
            ));
        }
        if self.lock_wait_timeout.is_zero() || self.lock_wait_timeout > Duration::from_secs(3600) {
            return Err(invalid(format!(
                "lock_wait_timeout is {:?}; it must be above zero and at most 1 hour",
                self.lock_wait_timeout
            )));
        }
        if self.statement_timeout < Duration::from_millis(1) {
            return Err(invalid(format!(
                "statement_timeout is {:?}; it must be at least 1 ms",
                self.statement_timeout
            )));
        }
        self.connect_options().map(|_| ())
    }

    /// sqlx's connect options for [`MySqlConfig::url`], with the session time zone pinned to
    /// UTC whatever the URL says: expiries are `DATETIME(6)` values written and compared as
    /// `NOW(6)` of the session, so every session must read the server clock in the same zone,
    /// one without daylight-saving jumps.
    pub(crate) fn connect_options(&self) -> Result<MySqlConnectOptions, LockError> {
        let options = MySqlConnectOptions::from_str(&self.url).map_err(|e| {
            invalid(format!(
                "the MySQL URL {} is not usable ({e}); expected mysql://user:password@host:port/database",
                redact_url(&self.url)
            ))
        })?;
        if options.get_database().is_none_or(str::is_empty) {
            return Err(invalid(format!(
                "the MySQL URL {} names no database; the lock table needs one (mysql://.../database)",
                redact_url(&self.url)
            )));
        }
        Ok(options.timezone(Some(String::from("+00:00"))))
    }

    /// `innodb_lock_wait_timeout` for pooled connections, in whole seconds (at least 1).
    pub(crate) fn lock_wait_secs(&self) -> u64 {
        ceil_secs(self.lock_wait_timeout).max(1)
    }
}

impl FromStr for MySqlConfig {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_url(s)
    }
}

impl fmt::Debug for MySqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlConfig")
            .field("url", &redact_url(&self.url))
            .field("strategy", &self.strategy)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("lock_wait_timeout", &self.lock_wait_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("create_table", &self.create_table)
            .field("idle_hold_connections", &self.idle_hold_connections)
            .finish()
    }
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn invalid(reason: String) -> LockError {
    LockError::invalid_options(reason)
}

fn number<T: FromStr>(key: &str, value: &str) -> Result<T, LockError> {
    value
        .parse()
        .map_err(|_| invalid(format!("URL parameter {key}={value:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "mysql://lock:pw@127.0.0.1:13306/locktest";

    #[test]
    fn defaults_and_tables() {
        let config = MySqlConfig::new(URL);
        config.validate().unwrap();
        assert_eq!(config.table_name().as_str(), "lock_leases");
        let row = config.clone().strategy(Strategy::RowLock);
        assert_eq!(row.table_name().as_str(), "lock_row_locks");
        for strategy in [Strategy::Lease, Strategy::RowLock] {
            let table = strategy.default_table();
            assert_eq!(TableName::new(table.as_str()).unwrap(), table);
        }
        let named = config.table(TableName::new("mine").unwrap());
        assert_eq!(named.table_name().as_str(), "mine");
    }

    #[test]
    fn url_form_takes_lock_parameters_and_keeps_the_rest() {
        let config = MySqlConfig::from_url(&format!(
            "{URL}?strategy=row-lock&table=t1&pool_size=3&connect_timeout_ms=1500&statement_timeout_ms=700&create_table=0&ssl-mode=disabled"
        ))
        .unwrap();
        assert_eq!(config.strategy, Strategy::RowLock);
        assert_eq!(config.table_name().as_str(), "t1");
        assert_eq!(config.pool_size, 3);
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        assert_eq!(config.statement_timeout, Duration::from_millis(700));
        assert!(!config.create_table);
        assert_eq!(config.url, format!("{URL}?ssl-mode=disabled"));
        let plain = MySqlConfig::from_url(URL).unwrap();
        assert_eq!(plain.url, URL);
        let maria = MySqlConfig::from_url(&URL.replace("mysql://", "mariadb://")).unwrap();
        assert_eq!(maria.url, URL);
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (format!("{URL}?strategy=queue"), "strategy"),
            (format!("{URL}?table=a-b"), "table name"),
            (format!("{URL}?pool_size=many"), "pool_size"),
            (format!("{URL}?pool_size=0"), "pool_size"),
            ("mysql://lock:pw@127.0.0.1:13306".to_string(), "no database"),
            ("not a url".to_string(), "U+0020"),
            ("mysql:/h/db".to_string(), "scheme"),
            (format!("{URL}?pool=3"), "no parameter `pool`"),
            (format!("{URL}?timezone=%2B02:00"), "UTC"),
            ("postgres://lock:pw@h/db".to_string(), "not a MySQL URL"),
            ("mysql://lock:pw@h:1,h:2/db".to_string(), "several hosts"),
        ];
        for (url, word) in cases {
            let err = MySqlConfig::from_url(&url).unwrap_err();
            assert!(matches!(err, LockError::InvalidOptions { .. }), "{url}");
            assert!(err.to_string().contains(word), "{url}: {err}");
            assert!(!err.to_string().contains(":pw@"), "{err}");
        }
    }

    #[test]
    fn debug_and_messages_hide_the_password() {
        let config = MySqlConfig::new("mysql://lock:hunter2@host/db");
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("lock:***@"), "{shown}");
    }

    #[test]
    fn serde_round_trip_with_defaults() {
        let config: MySqlConfig =
            serde_json::from_str(&format!(r#"{{"url": "{URL}", "strategy": "row-lock"}}"#))
                .unwrap();
        assert_eq!(config.strategy, Strategy::RowLock);
        assert_eq!(config.pool_size, 8);
        let json = serde_json::to_string(&config).unwrap();
        let back: MySqlConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
