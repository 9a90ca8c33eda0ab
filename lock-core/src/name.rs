//! [`LockName`]: the validated name of a lock, shared by every backend.

use std::{fmt, str::FromStr, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::LockError;

/// The name of a lock: 1 to [`LockName::MAX_LEN`] bytes of UTF-8 without control characters.
///
/// A name is validated once, here; every backend maps every valid name losslessly and
/// injectively into its own keyspace, so one name means one lock in every store. Cloning is
/// cheap (the text is shared).
///
/// ```
/// use lock_core::LockName;
///
/// let name = LockName::new("orders/42")?;
/// assert_eq!(name.as_str(), "orders/42");
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("line\nbreak").is_err());
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LockName(Arc<str>);

impl LockName {
    /// The longest name, in bytes of UTF-8.
    pub const MAX_LEN: usize = 200;

    /// Validates `name` and wraps it.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] when the name is empty, longer than [`LockName::MAX_LEN`]
    /// bytes, or contains a control character; the message says which and where.
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let name = name.into();
        validate(&name)?;
        Ok(Self(name.into()))
    }

    /// Validates raw bytes as a name (they must be UTF-8).
    ///
    /// # Errors
    /// [`LockError::InvalidName`] when the bytes are not UTF-8 or fail [`LockName::new`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, LockError> {
        let text = std::str::from_utf8(bytes).map_err(|e| LockError::InvalidName {
            reason: format!(
                "lock name is not UTF-8 (invalid byte at offset {}); names are 1 to {} bytes of UTF-8",
                e.valid_up_to(),
                Self::MAX_LEN
            ),
        })?;
        Self::new(text)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name's length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a valid name is never empty. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn validate(name: &str) -> Result<(), LockError> {
    let invalid = |reason: String| Err(LockError::InvalidName { reason });
    if name.is_empty() {
        return invalid(format!(
            "lock name is 0 bytes; names are 1 to {} bytes of UTF-8",
            LockName::MAX_LEN
        ));
    }
    if name.len() > LockName::MAX_LEN {
        return invalid(format!(
            "lock name is {} bytes; names are 1 to {} bytes of UTF-8",
            name.len(),
            LockName::MAX_LEN
        ));
    }
    if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return invalid(format!(
            "lock name contains the control character U+{:04X} at byte {at}; names may not contain control characters",
            u32::from(c)
        ));
    }
    Ok(())
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockName({:?})", &*self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockName {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

/// Anything that names a lock: a [`LockName`] (valid already) or text, validated on use.
///
/// [`LockClient`](crate::LockClient)'s methods take it, so `client.lock("jobs/1")` and
/// `client.lock(&name)` both work; text that is not a valid name is
/// [`LockError::InvalidName`] before anything is sent to the store.
pub trait IntoLockName {
    /// The validated name.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] as [`LockName::new`].
    fn into_lock_name(self) -> Result<LockName, LockError>;
}

impl IntoLockName for LockName {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        Ok(self)
    }
}

impl IntoLockName for &LockName {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        Ok(self.clone())
    }
}

impl IntoLockName for &str {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for String {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for &String {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self.as_str())
    }
}

impl From<LockName> for String {
    fn from(name: LockName) -> Self {
        name.0.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_boundaries_and_unicode() {
        assert!(LockName::new("a").is_ok());
        assert!(LockName::new("x".repeat(200)).is_ok());
        // 4-byte characters: 50 of them are exactly 200 bytes.
        assert!(LockName::new("🔒".repeat(50)).is_ok());
        assert!(LockName::new("🔒".repeat(51)).is_err());
        assert!(LockName::new("with space/and:{braces}*?").is_ok());
    }

    #[test]
    fn rejects_with_reasons() {
        let err = LockName::new("").unwrap_err().to_string();
        assert!(err.contains("0 bytes"), "{err}");
        let err = LockName::new("x".repeat(201)).unwrap_err().to_string();
        assert!(err.contains("201 bytes"), "{err}");
        let err = LockName::new("ab\u{7f}").unwrap_err().to_string();
        assert!(err.contains("U+007F at byte 2"), "{err}");
        assert!(matches!(
            LockName::from_bytes(&[0x61, 0xff]),
            Err(LockError::InvalidName { .. })
        ));
    }

    #[test]
    fn serde_validates() {
        let name: LockName = serde_json::from_str("\"jobs/1\"").unwrap();
        assert_eq!(name.as_str(), "jobs/1");
        assert!(serde_json::from_str::<LockName>("\"\"").is_err());
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"jobs/1\"");
    }
}
