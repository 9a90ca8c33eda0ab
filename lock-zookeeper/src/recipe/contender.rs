//! The contender node's life cycle: created (with its container), found again after a lost
//! reply, owned by a [`Cleanup`] guard until granted or deleted.

use std::{sync::Arc, time::Instant};

use lock_core::LockError;
use uuid::Uuid;
use zookeeper_client::{self as zk, CreateOptions};

use super::{Stop, Tries, retry};
use crate::{
    error::{ZkError, is_transient},
    node,
    session::{CONTAINER, CONTENDER, Conn, ROOT},
};

/// A contender node we created (or found again after a lost reply).
pub(super) struct Created {
    pub(super) name: String,
    pub(super) path: String,
    pub(super) czxid: i64,
    /// The children listed right after the creation, and when that listing was sent.
    pub(super) listed: Option<(Vec<String>, Instant)>,
}

/// Creates our contender node, creating the container (and root) when missing and resolving a
/// lost reply by the node's UUID. `cleanup` (armed, finding the node by its UUID) is disarmed
/// when the server's answer proves no node of ours exists.
pub(super) async fn create(
    conn: &Conn,
    root: &str,
    lock_path: &str,
    uuid: &Uuid,
    data: &[u8],
    cleanup: &mut Cleanup,
) -> Result<Created, Stop> {
    let prefix = format!("{lock_path}/{}", node::prefix(uuid));
    let mut tries = Tries::default();
    loop {
        let sent = Instant::now();
        // Both are sent now, in this order: the listing includes the created node.
        let created = conn.create(&prefix, data, &CONTENDER);
        let listed = conn.list(lock_path);
        let (created, listed) = tokio::join!(created, listed);
        let error = match created {
            Ok((stat, sequence)) => {
                let path = format!("{prefix}{sequence}");
                let name = path.rsplit('/').next().unwrap_or_default().to_owned();
                return Ok(Created {
                    name,
                    path,
                    czxid: stat.czxid,
                    listed: listed.ok().map(|children| (children, sent)),
                });
            }
            Err(error) => error,
        };
        match &error {
            // No container (or root) yet: create it, then the node again.
            zk::Error::NoNode if tries.spend() => {
                if let Err(error) = ensure_lock_path(conn, root, lock_path).await {
                    // The server answered our create with NoNode: it made nothing.
                    cleanup.disarm();
                    return Err(error.into());
                }
            }
            zk::Error::NoChildrenForEphemerals => {
                cleanup.disarm();
                return Err(Stop::Fail(LockError::foreign(
                    lock_path.to_owned(),
                    format!("`{lock_path}` is an ephemeral node, not a lock's container node"),
                )));
            }
            e if is_transient(e) => {
                // The reply was lost, not necessarily the request: look for our node first.
                if let Some(found) = find_own(conn, lock_path, &cleanup.uuid_prefix).await? {
                    tracing::debug!(node = %found.path, "found the contender node again after a lost reply");
                    return Ok(found);
                }
                if !tries.again(e).await {
                    // Our node may yet show up: the guard keeps looking for it.
                    return Err(ZkError::new("create", &prefix, error).into());
                }
            }
            // Refused by the server (or the session ended with our nodes): nothing was made.
            _ => {
                cleanup.disarm();
                return Err(ZkError::new("create", &prefix, error).into());
            }
        }
    }
}

/// Creates the container node `lock_path` and, when missing, the persistent nodes of `root`
/// above it, one segment at a time (each create is counted and retried like any request).
async fn ensure_lock_path(conn: &Conn, root: &str, lock_path: &str) -> Result<(), ZkError> {
    match create_node(conn, lock_path, &CONTAINER).await {
        Err(ZkError {
            source: zk::Error::NoNode,
            ..
        }) => {}
        done => return done,
    }
    let mut end = 0;
    for segment in root.split('/').skip(1) {
        end += 1 + segment.len();
        create_node(conn, &root[..end], &ROOT).await?;
    }
    create_node(conn, lock_path, &CONTAINER).await
}

/// Creates the empty node `path` unless it exists.
async fn create_node(conn: &Conn, path: &str, options: &CreateOptions<'_>) -> Result<(), ZkError> {
    match retry(|| conn.create(path, &[], options)).await {
        Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(ZkError::new("create", path, e)),
    }
}

/// Makes the server catch up with the leader (`sync`) before a read that must see our own
/// committed writes.
pub(super) async fn catch_up(conn: &Conn, lock_path: &str) -> Result<(), ZkError> {
    match retry(|| conn.sync(lock_path)).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(e) => Err(ZkError::new("sync", lock_path, e)),
    }
}

/// Our node, found by its UUID prefix, if the server created it.
async fn find_own(
    conn: &Conn,
    lock_path: &str,
    uuid_prefix: &str,
) -> Result<Option<Created>, Stop> {
    let sent = Instant::now();
    // After a reconnect the server may lag behind the leader and not show our committed node
    // yet (we would create a second one): catch it up first.
    catch_up(conn, lock_path).await?;
    let children = match retry(|| conn.list(lock_path)).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(ZkError::new("list", lock_path, e).into()),
    };
    let Some(name) = children
        .iter()
        .find(|c| c.starts_with(uuid_prefix))
        .cloned()
    else {
        return Ok(None);
    };
    let path = format!("{lock_path}/{name}");
    match retry(|| conn.exists(&path)).await {
        Ok(Some(stat)) if stat.ephemeral_owner == conn.id().0 => Ok(Some(Created {
            name,
            path,
            czxid: stat.czxid,
            listed: Some((children, sent)),
        })),
        Ok(_) => Ok(None),
        Err(e) => Err(ZkError::new("exists", &path, e).into()),
    }
}

/// Deletes a node of ours (see [`retry`]). True when it is gone by our request (after a lost
/// reply, a request of ours probably deleted it), false when it was not there.
pub(crate) async fn delete(conn: &Conn, path: &str) -> Result<bool, zk::Error> {
    let mut sent = 0;
    let deleted = retry(|| {
        sent += 1;
        conn.delete(path)
    })
    .await;
    match deleted {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode) => Ok(sent > 1),
        Err(e) => Err(e),
    }
}

/// Owns a contender node until it is granted or deleted; dropped while armed (the acquire
/// future was dropped, or failed without deleting) it deletes the node in the background.
pub(super) struct Cleanup {
    conn: Arc<Conn>,
    lock_path: String,
    uuid_prefix: String,
    /// The node's path once the create's reply arrived; before that it is found by UUID.
    pub(super) node: Option<String>,
    armed: bool,
}

impl Cleanup {
    pub(super) fn new(conn: Arc<Conn>, lock_path: &str, uuid_prefix: String) -> Self {
        Self {
            conn,
            lock_path: lock_path.to_owned(),
            uuid_prefix,
            node: None,
            armed: true,
        }
    }

    /// The node is granted or gone: nothing to clean up.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Deletes the node now (if this future is dropped meanwhile, `Drop` takes over).
    pub(super) async fn discard(&mut self) {
        if self.armed {
            remove(
                &self.conn,
                &self.lock_path,
                &self.uuid_prefix,
                self.node.as_deref(),
            )
            .await;
            self.armed = false;
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (conn, lock_path, uuid_prefix, node) = (
            self.conn.clone(),
            std::mem::take(&mut self.lock_path),
            std::mem::take(&mut self.uuid_prefix),
            self.node.take(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    remove(&conn, &lock_path, &uuid_prefix, node.as_deref()).await;
                });
            }
            Err(_) => {
                // No runtime to talk to the server: the node ends with the session, at the
                // latest when the backend is dropped.
                tracing::debug!(lock = %lock_path, "acquire dropped without a runtime; the contender node ends with the session");
            }
        }
    }
}

/// Deletes our contender node: `node` if its name is known, else the child with our UUID.
async fn remove(conn: &Conn, lock_path: &str, uuid_prefix: &str, node: Option<&str>) {
    if conn.is_ended() {
        // The server deletes the ephemeral nodes of an ended session by itself.
        return;
    }
    let path = match node {
        Some(path) => path.to_owned(),
        None => {
            // Requests are applied in order: if the create was sent, this listing sees it; and
            // after a reconnect, `sync` first catches a lagging server up with the leader.
            if catch_up(conn, lock_path).await.is_err() {
                return;
            }
            let children = match retry(|| conn.list(lock_path)).await {
                Ok(children) => children,
                Err(_) => return,
            };
            match children.into_iter().find(|c| c.starts_with(uuid_prefix)) {
                Some(name) => format!("{lock_path}/{name}"),
                None => return,
            }
        }
    };
    match delete(conn, &path).await {
        Ok(_) => tracing::debug!(node = %path, "abandoned contender node deleted"),
        Err(error) => {
            tracing::debug!(node = %path, %error, "abandoned contender node not deleted; it ends with the session");
        }
    }
}
