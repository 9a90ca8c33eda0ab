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
    #[error("not supported: {what}")]
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

    /// A [`LockError::Unavailable`] without a source error (retryable).
    pub fn unavailable_msg(message: impl Into<String>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// A [`LockError::Backend`] without a source error.
    pub fn backend_msg(message: impl Into<String>) -> Self {
        Self::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// A [`LockError::Lost`] for `name`.
    pub fn lost(name: impl fmt::Display, reason: LossReason) -> Self {
        Self::Lost {
            name: name.to_string(),
            reason,
        }
    }

    /// A [`LockError::Foreign`]: the store holds, for `name`, what `found` describes.
    pub fn foreign(name: impl fmt::Display, found: impl Into<String>) -> Self {
        Self::Foreign {
            name: name.to_string(),
            found: found.into(),
        }
    }

    /// A [`LockError::InvalidOptions`]: `reason` says what is wrong and what is allowed.
    pub fn invalid_options(reason: impl Into<String>) -> Self {
        Self::InvalidOptions {
            reason: reason.into(),
        }
    }

    /// This error with the server it failed on named at the end of its message, for the
    /// errors that come from the store ([`LockError::Unavailable`], [`LockError::Backend`]);
    /// any other error is returned as it is. A backend names its server here, in one place.
    #[must_use]
    pub fn on_server(self, server: impl fmt::Display) -> Self {
        match self {
            Self::Unavailable { message, source } => Self::Unavailable {
                message: format!("{message} (server {server})"),
                source,
            },
            Self::Backend { message, source } => Self::Backend {
                message: format!("{message} (server {server})"),
                source,
            },
            other => other,
        }
    }

    /// A [`LockError::Unsupported`]: `what` names the operation that is not supported.
    pub fn unsupported(what: impl Into<String>) -> Self {
        Self::Unsupported { what: what.into() }
    }
}

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
    fn constructors_build_the_variants_they_name() {
        assert!(LockError::unavailable_msg("down").is_retryable());
        assert!(matches!(
            LockError::backend_msg("odd"),
            LockError::Backend { source: None, .. }
        ));
        let lost = LockError::lost("jobs/1", LossReason::Expired);
        assert_eq!(
            lost.to_string(),
            "lock `jobs/1` was lost: the lease expired before a renewal was confirmed"
        );
        assert!(matches!(
            LockError::foreign("jobs/1", "a string key"),
            LockError::Foreign { found, .. } if found == "a string key"
        ));
        assert!(matches!(
            LockError::invalid_options("ttl 0"),
            LockError::InvalidOptions { .. }
        ));
        assert!(matches!(
            LockError::unsupported("x"),
            LockError::Unsupported { .. }
        ));
        let named = LockError::unavailable_msg("redis: ping failed").on_server("127.0.0.1:1");
        assert_eq!(
            named.to_string(),
            "lock store unavailable: redis: ping failed (server 127.0.0.1:1)"
        );
        assert!(named.is_retryable());
        assert!(matches!(
            LockError::not_held("a").on_server("h"),
            LockError::NotHeld { name } if name == "a"
        ));
    }
}
