//! [`TableName`]: the validated name of the lock table.

use std::{fmt, str::FromStr};

use lock_core::LockError;
use serde::{Deserialize, Serialize};

/// The name of a lock table: 1 to [`TableName::MAX_LEN`] lowercase ASCII letters, digits or
/// underscores, starting with a letter or an underscore.
///
/// The name is spliced into SQL (identifiers cannot be bound as parameters), so it is
/// validated here, once, and always quoted with backticks when used. Lowercase only, so the
/// same name works whatever the server's `lower_case_table_names`; the limit leaves room for
/// the `_fences` suffix of the row-lock strategy's counter table within MySQL's 64 characters.
///
/// ```
/// use lock_mysql::TableName;
///
/// assert_eq!(TableName::new("app_locks")?.as_str(), "app_locks");
/// assert!(TableName::new("locks; DROP TABLE users").is_err());
/// assert!(TableName::new("Locks").is_err());
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TableName(String);

impl TableName {
    /// The longest table name, in characters (64, MySQL's limit, minus `_fences`).
    pub const MAX_LEN: usize = 57;

    /// Validates `name`.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] saying what is wrong and what is allowed.
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let name = name.into();
        let allowed = format!(
            "table names are 1 to {} lowercase ASCII letters, digits or underscores, starting with a letter or an underscore",
            Self::MAX_LEN
        );
        let invalid = |what: String| Err(LockError::invalid_options(format!("{what}; {allowed}")));
        if name.is_empty() {
            return invalid("the table name is empty".into());
        }
        if name.len() > Self::MAX_LEN {
            return invalid(format!(
                "the table name is {} characters long",
                name.chars().count()
            ));
        }
        if let Some((at, c)) = name
            .char_indices()
            .find(|(_, c)| !matches!(c, 'a'..='z' | '0'..='9' | '_'))
        {
            return invalid(format!(
                "the table name {name:?} contains {c:?} at byte {at}"
            ));
        }
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            return invalid(format!("the table name {name:?} starts with a digit"));
        }
        Ok(Self(name))
    }

    /// A name known to be valid (a literal of this crate, checked by a unit test).
    pub(crate) fn known(name: &'static str) -> Self {
        Self(name.to_owned())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for SQL: `` `name` ``.
    pub(crate) fn quoted(&self) -> String {
        format!("`{}`", self.0)
    }

    /// The row-lock strategy's fence counter table: `<name>_fences`.
    pub(crate) fn fences(&self) -> Self {
        Self(format!("{}_fences", self.0))
    }

    /// The lease strategy's waiters' queue: `<name>_queue`.
    pub(crate) fn queue(&self) -> Self {
        Self(format!("{}_queue", self.0))
    }

    /// The row-lock strategy's table of holders' records: `<name>_holds`.
    pub(crate) fn holds(&self) -> Self {
        Self(format!("{}_holds", self.0))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({:?})", self.0)
    }
}

impl FromStr for TableName {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for TableName {
    type Error = LockError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<TableName> for String {
    fn from(name: TableName) -> Self {
        name.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_identifiers() {
        for ok in ["locks", "_locks", "app_locks_2", &"x".repeat(57)] {
            assert_eq!(TableName::new(ok).unwrap().as_str(), ok);
        }
        assert_eq!(TableName::new("locks").unwrap().quoted(), "`locks`");
        assert_eq!(
            TableName::new("locks").unwrap().fences().as_str(),
            "locks_fences"
        );
        assert_eq!(
            TableName::new("locks").unwrap().holds().as_str(),
            "locks_holds"
        );
    }

    #[test]
    fn rejects_with_reasons() {
        let cases = [
            ("", "empty"),
            (&"x".repeat(58) as &str, "58 characters"),
            ("Locks", "'L' at byte 0"),
            ("lo`cks", "'`' at byte 2"),
            ("locks; DROP TABLE x", "';' at byte 5"),
            ("db.locks", "'.' at byte 2"),
            ("1locks", "starts with a digit"),
            ("lÖcks", "'Ö' at byte 1"),
        ];
        for (name, why) in cases {
            match TableName::new(name) {
                Err(LockError::InvalidOptions { reason }) => {
                    assert!(reason.contains(why), "{name:?}: {reason}");
                    assert!(reason.contains("lowercase ASCII"), "{reason}");
                }
                other => panic!("{name:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn serde_validates() {
        let name: TableName = serde_json::from_str("\"locks\"").unwrap();
        assert_eq!(name.as_str(), "locks");
        assert!(serde_json::from_str::<TableName>("\"bad name\"").is_err());
    }
}
