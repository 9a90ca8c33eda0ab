//! [`LockError`]: the one error type of the contract, and [`LossReason`].

use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

/// A boxed error from a backend's client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a lock, by meaning rather than by store.
///
/// Backends keep their own private error types and convert them into these variants; the
/// client library's error travels along as the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The wait budget ran out while another holder kept the lock.
    #[error("timed out after {waited:?} waiting for lock `{name}`; it is held by someone else")]
    Timeout {
        /// The lock waited for.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// The lease is not the lock's current lease: it expired, was released, or never existed.
    /// Nothing was changed in the store.
    #[error(
        "lock `{name}` is not held by this lease (it expired, was released, or was taken over)"
    )]
    NotHeld {
        /// The lock concerned.
        name: String,
    },
    /// The hold ended while it was still wanted; see [`LossReason`].
    #[error("lock `{name}` was lost: {reason}")]
    Lost {
        /// The lock concerned.
        name: String,
        /// Why the hold can no longer be trusted.
        reason: LossReason,
    },
    /// A lock name failed validation; nothing was sent to the store.
    #[error("invalid lock name: {reason}")]
    InvalidName {
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// Lock options (TTL, wait budget, renew interval, ...) failed validation; nothing was sent
    /// to the store.
    #[error("invalid lock options: {reason}")]
    InvalidOptions {
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A lease cannot be used here (it belongs to another store or was corrupted in transit).
    #[error("invalid lease: {reason}")]
    InvalidLease {
        /// What is wrong.
        reason: String,
    },
    /// The store found something this library did not write (a key, row or node of another
    /// format). It is never treated as a free lock nor as ours.
    #[error("lock `{name}` has a value in the store that this library did not write: {found}")]
    Foreign {
        /// The lock concerned.
        name: String,
        /// What was found and where.
        found: String,
    },
    /// The backend cannot do what was asked (for example renewing a non-portable lease from
    /// another process).
    #[error("not supported by this backend: {what}")]
    Unsupported {
        /// What was asked.
        what: String,
    },
    /// The store could not be reached or answered with a transient failure; retrying may help.
    #[error("lock store unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store answered with an error that retrying will not fix.
    #[error("lock store error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

impl LockError {
    /// Whether the same call may succeed if retried later: `Timeout` (the holder may release)
    /// and `Unavailable` (the store may come back). Everything else needs a change first.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Unavailable { .. })
    }

    /// An [`LockError::Unavailable`] with a source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`LockError::Backend`] with a source.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`LockError::NotHeld`] for `name`.
    pub fn not_held(name: impl fmt::Display) -> Self {
        Self::NotHeld {
            name: name.to_string(),
        }
    }

    /// A copy of this error, for reporting one failure once per item of a batch (a batched
    /// renewal that failed as a whole): the same variant, fields and message; a source error
    /// is kept as its text.
    pub fn duplicate(&self) -> Self {
        let source = |source: &Option<BoxError>| -> Option<BoxError> {
            source
                .as_ref()
                .map(|e| Box::new(SourceText(e.to_string())) as BoxError)
        };
        match self {
            Self::Timeout { name, waited } => Self::Timeout {
                name: name.clone(),
                waited: *waited,
            },
            Self::NotHeld { name } => Self::NotHeld { name: name.clone() },
            Self::Lost { name, reason } => Self::Lost {
                name: name.clone(),
                reason: *reason,
            },
            Self::InvalidName { reason } => Self::InvalidName {
                reason: reason.clone(),
            },
            Self::InvalidOptions { reason } => Self::InvalidOptions {
                reason: reason.clone(),
            },
            Self::InvalidLease { reason } => Self::InvalidLease {
                reason: reason.clone(),
            },
            Self::Foreign { name, found } => Self::Foreign {
                name: name.clone(),
                found: found.clone(),
            },
            Self::Unsupported { what } => Self::Unsupported { what: what.clone() },
            Self::Unavailable { message, source: s } => Self::Unavailable {
                message: message.clone(),
                source: source(s),
            },
            Self::Backend { message, source: s } => Self::Backend {
                message: message.clone(),
                source: source(s),
            },
        }
    }

    pub(crate) fn invalid_options(reason: impl Into<String>) -> Self {
        Self::InvalidOptions {
            reason: reason.into(),
        }
    }
}

/// A source error kept as its text (see [`LockError::duplicate`]).
#[derive(Debug)]
struct SourceText(String);

impl fmt::Display for SourceText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SourceText {}

/// Why a hold can no longer be trusted (the value [`LockGuard::lost`](crate::LockGuard::lost)
/// resolves to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum LossReason {
    /// The store answered that the lease is no longer current (it expired there, or someone
    /// removed or took over the lock).
    NotHeld,
    /// The local deadline (last confirmed expiry minus a drift margin, on a monotonic clock)
    /// passed without a confirmed renewal, typically because the store was unreachable.
    Expired,
    /// The session that kept the lock (session stores: ZooKeeper, a MySQL connection) ended.
    SessionEnded,
    /// The hold reached its `max_hold` and was ended by the watchdog.
    MaxHold,
    /// The hold was released normally (a `lost()` future outliving every guard resolves so).
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotHeld => "the store no longer has this lease",
            Self::Expired => "the lease expired before a renewal was confirmed",
            Self::SessionEnded => "the session holding the lock ended",
            Self::MaxHold => "the hold reached its max_hold",
            Self::Released => "the lock was released",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_keep_variant_message_and_source_text() {
        let original = LockError::backend("table dropped", SourceText("no such table".into()));
        let copy = original.duplicate();
        assert!(matches!(copy, LockError::Backend { .. }));
        assert!(!copy.is_retryable());
        assert_eq!(copy.to_string(), original.to_string());
        let source = std::error::Error::source(&copy).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("no such table"));
        assert!(
            LockError::unavailable("down", SourceText("refused".into()))
                .duplicate()
                .is_retryable()
        );
    }
}
