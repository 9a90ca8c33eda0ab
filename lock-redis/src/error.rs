//! How Redis client errors map onto [`LockError`].

use lock_core::LockError;
use redis::{RedisError, ServerErrorKind};

/// A failed Redis request: what was being done (naming the server where the caller knows
/// it) and the client's error. Converted into [`LockError`] by meaning.
#[derive(Debug)]
pub(crate) struct Error {
    what: String,
    source: RedisError,
}

impl Error {
    pub(crate) fn new(what: impl Into<String>, source: RedisError) -> Self {
        Self {
            what: what.into(),
            source,
        }
    }

    /// Connection trouble and transient server states: the same call may succeed later.
    fn is_transient(&self) -> bool {
        let error = &self.source;
        error.is_io_error()
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
            )
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redis: {} failed", self.what)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<Error> for LockError {
    /// Connection trouble and transient server states are `Unavailable` (retryable);
    /// anything else is `Backend`.
    fn from(error: Error) -> Self {
        if error.is_transient() {
            let message = format!("{error}: {}; the server may come back, retry", error.source);
            LockError::unavailable(message, error)
        } else {
            let message = format!("{error}: {}", error.source);
            LockError::backend(message, error)
        }
    }
}

/// A request that did not answer within its time-out.
pub(crate) fn timed_out(what: &str) -> LockError {
    LockError::unavailable_msg(format!(
        "redis: {what} timed out; the server may come back, retry"
    ))
}

/// The reply of `call` (`what`, for errors), within `limit` when one is given: a call that
/// takes longer is [`timed_out`].
pub(crate) async fn within_limit<T>(
    limit: Option<std::time::Duration>,
    what: &str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, LockError> {
    let reply = match limit {
        Some(limit) => tokio::time::timeout(limit, call)
            .await
            .map_err(|_| timed_out(what))?,
        None => call.await,
    };
    reply.map_err(|e| Error::new(what, e).into())
}
