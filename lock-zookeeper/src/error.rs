//! [`ZkError`]: a ZooKeeper client error with what was being done, converted into
//! [`LockError`] by meaning.

use std::fmt;

use lock_core::LockError;
use zookeeper_client as zk;

/// A failed ZooKeeper request: the operation, the path, and the client's error.
#[derive(Debug)]
pub(crate) struct ZkError {
    pub(crate) op: &'static str,
    pub(crate) path: String,
    pub(crate) source: zk::Error,
}

impl ZkError {
    pub(crate) fn new(op: &'static str, path: impl Into<String>, source: zk::Error) -> Self {
        Self {
            op,
            path: path.into(),
            source,
        }
    }
}

impl fmt::Display for ZkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZooKeeper {} of `{}` failed", self.op, self.path)
    }
}

impl std::error::Error for ZkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Whether the error means the session is over (a new one is needed).
pub(crate) fn is_session_end(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::ClientClosed
            | zk::Error::AuthFailed
    )
}

/// Whether the server answered the request itself (with an error code that retrying on the
/// same state does not change).
fn is_server_answer(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::BadVersion
            | zk::Error::NoAuth
            | zk::Error::NotEmpty
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::InvalidAcl
            | zk::Error::BadArguments(_)
            | zk::Error::Unimplemented
            | zk::Error::QuotaExceeded
            | zk::Error::MarshallingError
            | zk::Error::ReconfigDisabled
            | zk::Error::NotReadOnly
            | zk::Error::NoWatcher
            | zk::Error::RuntimeInconsistent
            | zk::Error::UnexpectedErrorCode(_)
    )
}

/// Whether retrying the same request on the same session may succeed: the connection failed
/// (the client fails requests in flight with the connection's own error: `ConnectionLoss`, a
/// time-out, an I/O error) or the server was busy; the request may or may not have been
/// applied.
pub(crate) fn is_transient(error: &zk::Error) -> bool {
    !is_session_end(error) && !is_server_answer(error)
}

impl From<ZkError> for LockError {
    fn from(error: ZkError) -> Self {
        let message = match &error.source {
            e if is_transient(e) => {
                format!("{error}: {e}; the connection may come back, retry")
            }
            e if is_session_end(e) => {
                format!(
                    "{error}: the ZooKeeper session ended ({e}); a new session is opened for the next acquisition"
                )
            }
            zk::Error::NoAuth => {
                format!(
                    "{error}: not authorized; check the node's ACL and the configured credentials"
                )
            }
            e => format!("{error}: {e}"),
        };
        if is_transient(&error.source) || is_session_end(&error.source) {
            LockError::unavailable(message, error)
        } else {
            LockError::backend(message, error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classified_by_meaning() {
        let lost = LockError::from(ZkError::new(
            "create",
            "/locks/a",
            zk::Error::ConnectionLoss,
        ));
        assert!(lost.is_retryable(), "{lost}");
        assert!(lost.to_string().contains("create of `/locks/a`"), "{lost}");
        let expired = LockError::from(ZkError::new("list", "/locks/a", zk::Error::SessionExpired));
        assert!(expired.is_retryable(), "{expired}");
        let auth = LockError::from(ZkError::new("delete", "/locks/a", zk::Error::NoAuth));
        assert!(matches!(auth, LockError::Backend { .. }));
        assert!(auth.to_string().contains("ACL"), "{auth}");
        let source = std::error::Error::source(&auth).and_then(|s| s.source());
        assert!(source.is_some(), "the client's error travels along");
    }
}
