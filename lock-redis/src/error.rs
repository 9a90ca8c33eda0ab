//! How Redis client errors map onto [`LockError`].

use lock_core::LockError;
use redis::{RedisError, ServerErrorKind};

/// Classifies a client error: connection trouble and transient server states are
/// `Unavailable` (retryable); anything else is `Backend`.
pub(crate) fn classify(what: &str, error: RedisError) -> LockError {
    let transient = error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_cluster_error()
        // The cluster client found no node to send to (every node down or restarting).
        || error.kind() == redis::ErrorKind::ClusterConnectionNotFound
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        );
    let message = format!("redis {what} failed");
    if transient {
        LockError::unavailable(message, error)
    } else {
        LockError::backend(message, error)
    }
}

/// A request that did not answer within its time-out.
pub(crate) fn timed_out(what: &str) -> LockError {
    LockError::unavailable_msg(format!("redis {what} timed out"))
}
