//! The lock tables: their DDL, and the check (and creation) done when a backend connects.
//!
//! Each table records the schema version and the strategy it serves in its table comment,
//! `lock-mysql schema <version>: <strategy>`, so a later version of this crate can recognise
//! and migrate an older layout, and a table of one strategy is never used by the other.

use lock_core::LockError;
use sqlx::{AssertSqlSafe, MySqlConnection, Row};

use crate::{Strategy, TableName, error::Error};

/// The layout version this crate writes and understands.
///
/// - 1: the first layout.
/// - 2: the lease strategy's waiters queue in `<table>_queue`, so none is passed over
///   indefinitely; the row-lock strategy records its holder in `<table>_holds` instead of in the row
///   waiters queue on (an update that changes a row's size while waiters queue on it costs
///   InnoDB time for each waiter: 100 waiting clients fell from about 470 to 57 hand-offs a
///   second), and `<table>` keeps only `name`. A version-1 row-lock table still serves: only
///   its `name` is used; version-1 lease tables did not change. The new tables must exist
///   (`create_table` makes them).
pub const SCHEMA_VERSION: u32 = 2;

const COMMENT_PREFIX: &str = "lock-mysql schema ";

/// Which of a strategy's tables: the lock table itself, or one of the row-lock strategy's two
/// companions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// `<table>`: the lease rows, or the rows row-lock waiters queue on.
    Locks,
    /// `<table>_fences`: the row-lock strategy's fence counters.
    Fences,
    /// `<table>_holds`: the row-lock holders' uncommitted records.
    Holds,
    /// `<table>_queue`: the lease strategy's waiters.
    Queue,
}

/// What a table holds, as written in its comment.
fn kind(strategy: Strategy, part: Part) -> &'static str {
    match (strategy, part) {
        (Strategy::Lease, Part::Queue) => "lease queue",
        (Strategy::Lease, _) => "lease",
        (Strategy::RowLock, Part::Locks) => "row-lock",
        (Strategy::RowLock, Part::Fences) => "row-lock fences",
        (Strategy::RowLock, Part::Holds | Part::Queue) => "row-lock holds",
    }
}

fn comment(strategy: Strategy, part: Part) -> String {
    format!("{COMMENT_PREFIX}{SCHEMA_VERSION}: {}", kind(strategy, part))
}

/// The `CREATE TABLE IF NOT EXISTS` statements for `table` under `strategy`, for a
/// deployment that creates tables itself (see [`MySqlConfig::create_table`](crate::MySqlConfig::create_table)).
///
/// Names are stored as `VARBINARY(200)`: the UTF-8 bytes of the name, compared byte for byte
/// (no case folding, no trailing-space padding, no Unicode normalisation), so every distinct
/// lock name is a distinct row. Times are `DATETIME(6)` in UTC (every session of this crate
/// runs with `time_zone = '+00:00'`), not `TIMESTAMP(6)`, whose range ends in January 2038.
///
/// ```
/// use lock_mysql::{Strategy, TableName, create_table_sql};
///
/// let ddl = create_table_sql(&TableName::new("app_locks")?, Strategy::Lease);
/// assert_eq!(ddl.len(), 2); // the lease rows and their waiters' queue
/// assert!(ddl[0].contains("`app_locks`"));
/// assert!(ddl[0].contains("VARBINARY(200)"));
/// # Ok::<(), lock_core::LockError>(())
/// ```
pub fn create_table_sql(table: &TableName, strategy: Strategy) -> Vec<String> {
    match strategy {
        Strategy::Lease => vec![
            ddl(
                table.quoted(),
                "name VARBINARY(200) NOT NULL COMMENT 'the lock name: its UTF-8 bytes', \
                 token VARBINARY(64) NULL DEFAULT NULL COMMENT 'the holder''s owner token, 32 lowercase hex digits; NULL once released', \
                 fence BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'the fence of the latest acquisition; never decreases', \
                 expires_at DATETIME(6) NULL DEFAULT NULL COMMENT 'when the lease ends, by the server clock, in UTC; NULL once released', \
                 acquired_at DATETIME(6) NULL DEFAULT NULL COMMENT 'when the latest acquisition was granted, by the server clock, in UTC; NULL once released while nobody queued (a waiter that queues then sets it)', \
                 PRIMARY KEY (name)",
                comment(strategy, Part::Locks),
            ),
            ddl(
                table.queue().quoted(),
                "name VARBINARY(200) NOT NULL COMMENT 'the lock name: its UTF-8 bytes', \
                 token VARBINARY(64) NOT NULL COMMENT 'the waiting acquire call''s token', \
                 arrived_at DATETIME(6) NOT NULL COMMENT 'its first busy try, by the server clock, in UTC: the order of service', \
                 until_at DATETIME(6) NOT NULL COMMENT 'when the place lapses unless the waiter tries again, in UTC', \
                 turn_us BIGINT UNSIGNED NOT NULL COMMENT 'how long the waiter may take to come for a lease handed to it, in microseconds', \
                 connection_id BIGINT UNSIGNED NULL DEFAULT NULL COMMENT 'the connection its latest park ran on (for operators; a release finds the park to wake by its marker lock)', \
                 PRIMARY KEY (name, token), \
                 KEY by_arrival (name, arrived_at, token)",
                comment(strategy, Part::Queue),
            ),
        ],
        Strategy::RowLock => vec![
            ddl(
                table.quoted(),
                "name VARBINARY(200) NOT NULL COMMENT 'the lock name: its UTF-8 bytes; the hold is a transaction holding this row, and waiters queue on it', \
                 PRIMARY KEY (name)",
                comment(strategy, Part::Locks),
            ),
            ddl(
                table.fences().quoted(),
                "name VARBINARY(200) NOT NULL COMMENT 'the lock name: its UTF-8 bytes', \
                 fence BIGINT UNSIGNED NOT NULL COMMENT 'the last fence issued for the name; committed on its own so a rolled-back hold keeps it', \
                 PRIMARY KEY (name)",
                comment(strategy, Part::Fences),
            ),
            ddl(
                table.holds().quoted(),
                "name VARBINARY(200) NOT NULL COMMENT 'the lock name: its UTF-8 bytes; a row exists only inside the holder''s transaction', \
                 token VARBINARY(64) NOT NULL COMMENT 'the holder''s owner token, written inside its transaction and never committed', \
                 fence BIGINT UNSIGNED NOT NULL COMMENT 'the holder''s fence, uncommitted like token; the counter is in the _fences table', \
                 acquired_at DATETIME(6) NOT NULL COMMENT 'when the hold began, in UTC (uncommitted)', \
                 connection_id BIGINT UNSIGNED NOT NULL COMMENT 'the connection holding the lock (uncommitted)', \
                 PRIMARY KEY (name)",
                comment(strategy, Part::Holds),
            ),
        ],
    }
}

/// `CREATE TABLE IF NOT EXISTS <table> (<columns>) ENGINE=InnoDB COMMENT='<comment>'`.
fn ddl(table: String, columns: &str, comment: String) -> String {
    format!("CREATE TABLE IF NOT EXISTS {table} ({columns}) ENGINE=InnoDB COMMENT='{comment}'")
}

/// The tables `strategy` uses, with which part each is.
fn tables(table: &TableName, strategy: Strategy) -> Vec<(TableName, Part)> {
    match strategy {
        Strategy::Lease => vec![(table.clone(), Part::Locks), (table.queue(), Part::Queue)],
        Strategy::RowLock => vec![
            (table.clone(), Part::Locks),
            (table.fences(), Part::Fences),
            (table.holds(), Part::Holds),
        ],
    }
}

/// Creates the tables when `create` and they are missing, then checks that each one carries
/// this crate's schema version for `strategy`, on `conn`.
pub(crate) async fn ensure(
    conn: &mut MySqlConnection,
    table: &TableName,
    strategy: Strategy,
    create: bool,
) -> Result<(), LockError> {
    if create {
        for ddl in create_table_sql(table, strategy) {
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&mut *conn)
                .await
                .map_err(|e| {
                    LockError::from(Error::new(format!("creating the lock table `{table}`"), e))
                })?;
        }
    }
    for (name, part) in tables(table, strategy) {
        let found: Option<String> = sqlx::query(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| {
            LockError::from(Error::new(
                format!("reading the comment of table `{name}`"),
                e,
            ))
        })?
        .map(|row| row.try_get::<String, _>(0))
        .transpose()
        .map_err(|e| {
            LockError::from(Error::new(
                format!("reading the comment of table `{name}`"),
                e,
            ))
        })?;
        check(&name, strategy, part, found.as_deref())?;
    }
    Ok(())
}

/// Judges a table's comment (`None`: the table does not exist).
fn check(
    table: &TableName,
    strategy: Strategy,
    part: Part,
    comment: Option<&str>,
) -> Result<(), LockError> {
    let expected = kind(strategy, part);
    let fail = |message: String| LockError::backend_msg(message);
    let Some(comment) = comment else {
        return Err(fail(format!(
            "the lock table `{table}` does not exist; create it with lock_mysql::create_table_sql or set create_table"
        )));
    };
    let Some((version, found_kind)) = comment
        .strip_prefix(COMMENT_PREFIX)
        .and_then(|rest| rest.split_once(": "))
    else {
        return Err(fail(format!(
            "table `{table}` exists but was not created by lock-mysql (its comment is {comment:?}); \
             configure another table name"
        )));
    };
    let Ok(version) = version.parse::<u32>() else {
        return Err(fail(format!(
            "table `{table}` has an unreadable lock-mysql schema comment {comment:?}"
        )));
    };
    if version > SCHEMA_VERSION {
        return Err(fail(format!(
            "table `{table}` has lock-mysql schema {version}, newer than the {SCHEMA_VERSION} this version understands; upgrade lock-mysql"
        )));
    }
    // Every older version is read as it is: version 1 differs only in row-lock columns this
    // version no longer reads.
    if found_kind != expected {
        return Err(fail(format!(
            "table `{table}` serves the {found_kind} strategy, not {expected}; configure another table for this strategy"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TableName {
        TableName::new(name).unwrap()
    }

    #[test]
    fn ddl_names_tables_and_versions() {
        let lease = create_table_sql(&t("a"), Strategy::Lease);
        assert!(lease[0].starts_with("CREATE TABLE IF NOT EXISTS `a` ("));
        assert!(lease[0].contains("COMMENT='lock-mysql schema 2: lease'"));
        assert!(lease[0].contains("expires_at DATETIME(6)"));
        assert!(lease[1].contains("`a_queue`"));
        assert!(lease[1].contains("COMMENT='lock-mysql schema 2: lease queue'"));
        let rows = create_table_sql(&t("b"), Strategy::RowLock);
        assert!(rows[0].contains("COMMENT='lock-mysql schema 2: row-lock'"));
        assert!(rows[1].contains("`b_fences`"));
        assert!(rows[1].contains("COMMENT='lock-mysql schema 2: row-lock fences'"));
        assert!(rows[2].contains("`b_holds`"));
        assert!(rows[2].contains("COMMENT='lock-mysql schema 2: row-lock holds'"));
    }

    #[test]
    fn comments_are_judged() {
        let a = t("a");
        check(
            &a,
            Strategy::Lease,
            Part::Locks,
            Some("lock-mysql schema 2: lease"),
        )
        .unwrap();
        check(
            &a,
            Strategy::RowLock,
            Part::Fences,
            Some("lock-mysql schema 2: row-lock fences"),
        )
        .unwrap();
        check(
            &a,
            Strategy::RowLock,
            Part::Holds,
            Some("lock-mysql schema 2: row-lock holds"),
        )
        .unwrap();
        // A version-1 table still serves.
        check(
            &a,
            Strategy::RowLock,
            Part::Locks,
            Some("lock-mysql schema 1: row-lock"),
        )
        .unwrap();
        let cases = [
            (None, "does not exist"),
            (Some(""), "not created by lock-mysql"),
            (Some("orders"), "not created by lock-mysql"),
            (Some("lock-mysql schema x: lease"), "unreadable"),
            (Some("lock-mysql schema 3: lease"), "newer"),
            (
                Some("lock-mysql schema 2: row-lock"),
                "serves the row-lock strategy",
            ),
        ];
        for (comment, why) in cases {
            let err = check(&a, Strategy::Lease, Part::Locks, comment).unwrap_err();
            assert!(err.to_string().contains(why), "{comment:?}: {err}");
        }
    }
}
