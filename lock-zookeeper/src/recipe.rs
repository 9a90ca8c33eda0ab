//! The lock recipe: ephemeral sequential contender nodes under the lock's container node, the
//! lowest sequence holds, every other contender watches only its immediate predecessor.
//!
//! An acquisition sends `create` and `getChildren` together (requests of one session are
//! applied in order, so the listing includes the new node): an uncontended lock costs one round
//! trip. A contender that is not first watches the node just before it and lists again when
//! that node goes, so a release wakes exactly one waiter. A `create` whose reply was lost is
//! resolved by finding the node again by its UUID, never by creating a second one. Until a
//! node is known to be granted or deleted, a [`Cleanup`] guard owns it: dropping the acquire
//! future deletes the node in the background.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use lock_core::{
    Fence, LockError, LockInfo, LockName,
    backend::{AcquireRequest, LeaseToken},
};
use tokio::time::{sleep, sleep_until};
use uuid::Uuid;
use zookeeper_client::{self as zk, CreateOptions, EventType, SessionId};

use crate::{
    error::{ZkError, is_session_end, is_transient},
    node,
    session::{CONTAINER, CONTENDER, Conn, ROOT, Sessions},
};

/// How often one request is sent again after transient failures before giving up.
const RETRIES: usize = 16;
/// The pause before retrying a request that failed transiently (the client queues requests
/// while it reconnects, so this only spaces out retries of throttled or timed-out requests).
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// The first pause before trying again to establish a session while acquiring (doubling up
/// to 16 times this).
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// A granted hold: our node is the lowest contender.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) path: String,
    pub(crate) token: LeaseToken,
    pub(crate) fence: Fence,
    pub(crate) session: SessionId,
    pub(crate) ttl: Duration,
    pub(crate) valid_from: Instant,
}

/// Why one attempt ended without a grant.
enum Stop {
    /// The session ended: its nodes are gone (or going); try again on a new session.
    SessionEnded,
    /// Our node disappeared while we waited (someone deleted it): try again with a new one.
    Vanished,
    /// Give up with this error.
    Fail(LockError),
}

impl From<ZkError> for Stop {
    fn from(error: ZkError) -> Self {
        if is_session_end(&error.source) {
            Self::SessionEnded
        } else {
            Self::Fail(error.into())
        }
    }
}

/// Acquires the lock at `lock_path` for `request`, on the backend's live session (a new one
/// after the current one ended, while the budget lasts).
pub(crate) async fn acquire(
    sessions: &Sessions,
    lock_path: &str,
    request: &AcquireRequest,
) -> Result<Granted, LockError> {
    let mut reconnects = 0;
    loop {
        let conn = match usable_session(sessions, request).await {
            Ok(conn) => conn,
            // No usable session now; the budget allows waiting for the ensemble to come back.
            Err(error) => {
                let pause = RECONNECT_PAUSE * (1 << reconnects.min(4));
                reconnects += 1;
                sleep_until((Instant::now() + pause).min(request.deadline()).into()).await;
                if Instant::now() >= request.deadline() {
                    return Err(error);
                }
                tracing::debug!(lock = %request.name(), %error, "no ZooKeeper session; trying again");
                continue;
            }
        };
        // Beyond the budget, only a server that does not answer keeps an attempt going: give
        // up a session timeout later (by then the session has moved or ended), or at once when
        // the connection is down (its requests wait for a reconnection). A dropped attempt
        // deletes its node in the background.
        let grace = conn.timeout().max(Duration::from_secs(1));
        let attempt = attempt(&conn, &sessions.config().root, lock_path, request);
        let outcome = tokio::select! {
            outcome = attempt => Some(outcome),
            () = down_past(request.deadline(), &conn) => {
                return Err(LockError::Unavailable {
                    message: format!(
                        "the connection to ZooKeeper at `{}` went down and the wait budget of {:?} is over while acquiring `{}`",
                        sessions.config().hosts,
                        request.wait(),
                        request.name()
                    ),
                    source: None,
                });
            }
            () = sleep_until((request.deadline() + grace).into()) => None,
        };
        let stop = match outcome {
            Some(Ok(granted)) => return Ok(granted),
            Some(Err(Stop::Fail(error))) => return Err(error),
            Some(Err(stop)) => stop,
            None => {
                return Err(LockError::Unavailable {
                    message: format!(
                        "ZooKeeper did not answer within the wait budget of {:?} plus {grace:?} while acquiring `{}`",
                        request.wait(),
                        request.name()
                    ),
                    source: None,
                });
            }
        };
        if Instant::now() >= request.deadline() {
            return Err(match stop {
                Stop::SessionEnded => LockError::Unavailable {
                    message: format!(
                        "the ZooKeeper session ended while acquiring `{}`; a new session is opened on the next try",
                        request.name()
                    ),
                    source: None,
                },
                _ => request.timeout_error(),
            });
        }
        match stop {
            Stop::SessionEnded => {
                tracing::debug!(lock = %request.name(), "session ended while acquiring; retrying on a new session")
            }
            _ => {
                tracing::debug!(lock = %request.name(), "contender node vanished while waiting; queueing again")
            }
        }
    }
}

/// The live session, opened within the wait budget (a server that refuses connections fails
/// at once), unless its connection is down now: requests on it would wait for the connection
/// to come back, past the budget.
async fn usable_session(
    sessions: &Sessions,
    request: &AcquireRequest,
) -> Result<Arc<Conn>, LockError> {
    let unavailable = |message: String| LockError::Unavailable {
        message,
        source: None,
    };
    let conn = tokio::time::timeout_at(request.deadline().into(), sessions.live())
        .await
        .map_err(|_| {
            unavailable(format!(
                "no ZooKeeper session could be established within the wait budget of {:?}",
                request.wait()
            ))
        })??;
    if conn.state() == zk::SessionState::Disconnected {
        return Err(unavailable(format!(
            "disconnected from ZooKeeper at `{}`; the client is reconnecting",
            sessions.config().hosts
        )));
    }
    Ok(conn)
}

/// Resolves once the wait budget is over while the session's connection is down: requests on
/// it then wait for a reconnection that may come long after the budget.
async fn down_past(deadline: Instant, conn: &Conn) {
    sleep_until(deadline.into()).await;
    let mut states = conn.client().state_watcher();
    let mut state = states.state();
    while state != zk::SessionState::Disconnected {
        state = states.changed().await;
    }
}

/// One contender node from creation to grant, time-out or failure.
async fn attempt(
    conn: &Arc<Conn>,
    root: &str,
    lock_path: &str,
    request: &AcquireRequest,
) -> Result<Granted, Stop> {
    let uuid = Uuid::new_v4();
    let secret = LeaseToken::random();
    let mut cleanup = Cleanup::new(conn.clone(), lock_path, node::uuid_prefix(&uuid));
    let data = secret.as_str().as_bytes();
    let created = create(conn, root, lock_path, &uuid, data, &mut cleanup).await?;
    cleanup.node = Some(created.path.clone());
    let fence = match fence(created.czxid, &created.name) {
        Ok(fence) => fence,
        Err(error) => {
            cleanup.discard().await;
            return Err(Stop::Fail(error));
        }
    };
    let mut listed = created.listed;
    loop {
        let (children, sent) = match listed.take() {
            Some(listed) => listed,
            None => {
                let sent = Instant::now();
                match retry(|| conn.list(lock_path)).await {
                    Ok(children) => (children, sent),
                    // The container went, so our node went with it.
                    Err(zk::Error::NoNode) => {
                        cleanup.disarm();
                        return Err(Stop::Vanished);
                    }
                    Err(e) => {
                        let error = ZkError::new("list", lock_path, e);
                        if !is_session_end(&error.source) {
                            cleanup.discard().await;
                        }
                        return Err(error.into());
                    }
                }
            }
        };
        let queue = match node::contenders(&children) {
            Ok(queue) => queue,
            Err(foreign) => {
                cleanup.discard().await;
                return Err(Stop::Fail(foreign_error(
                    request.name(),
                    lock_path,
                    &foreign,
                )));
            }
        };
        let Some(at) = queue.iter().position(|c| c.name == created.name) else {
            cleanup.disarm();
            return Err(Stop::Vanished);
        };
        let Some(predecessor) = at.checked_sub(1).and_then(|i| queue.get(i)) else {
            cleanup.disarm();
            return Ok(Granted {
                path: created.path,
                token: LeaseToken::from_store(format!("{}/{}", created.name, secret.as_str())),
                fence,
                session: conn.id(),
                ttl: conn.lease_ttl(),
                // The listing proved the session alive when the server answered it, so the
                // session lasts at least its timeout from when the request was sent.
                valid_from: sent,
            });
        };
        let deadline = request.deadline();
        if Instant::now() >= deadline {
            cleanup.discard().await;
            return Err(Stop::Fail(request.timeout_error()));
        }
        let predecessor = format!("{lock_path}/{}", predecessor.name);
        let watcher = match retry(|| conn.watch(&predecessor)).await {
            Ok((_, _, watcher)) => watcher,
            // Gone already: look again.
            Err(zk::Error::NoNode) => continue,
            Err(e) => {
                let error = ZkError::new("watch", &predecessor, e);
                if !is_session_end(&error.source) {
                    cleanup.discard().await;
                }
                return Err(error.into());
            }
        };
        tokio::select! {
            event = watcher.changed() => {
                if event.event_type == EventType::Session && event.session_state.is_terminated() {
                    return Err(Stop::SessionEnded);
                }
                // Deleted (or its data changed): list again, whoever is first now.
            }
            () = tokio::time::sleep_until(deadline.into()) => {
                cleanup.discard().await;
                return Err(Stop::Fail(request.timeout_error()));
            }
        }
    }
}

/// A contender node we created (or found again after a lost reply).
struct Created {
    name: String,
    path: String,
    czxid: i64,
    /// The children listed right after the creation, and when that listing was sent.
    listed: Option<(Vec<String>, Instant)>,
}

/// Creates our contender node, creating the container (and root) when missing and resolving a
/// lost reply by the node's UUID. `cleanup` (armed, finding the node by its UUID) is disarmed
/// when the server's answer proves no node of ours exists.
async fn create(
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
                return Err(Stop::Fail(LockError::Foreign {
                    name: lock_path.to_owned(),
                    found: format!(
                        "`{lock_path}` is an ephemeral node, not a lock's container node"
                    ),
                }));
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
async fn catch_up(conn: &Conn, lock_path: &str) -> Result<(), ZkError> {
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

/// The tries of one request: after a transient failure (the request may or may not have been
/// applied) it is sent again after a pause, at most [`RETRIES`] times.
#[derive(Debug, Default)]
struct Tries(usize);

impl Tries {
    /// Counts one more try; false when none is left.
    fn spend(&mut self) -> bool {
        if self.0 >= RETRIES {
            return false;
        }
        self.0 += 1;
        true
    }

    /// Whether to send the request again after `error`: true, after a pause, when it failed
    /// transiently and a try is left.
    async fn again(&mut self, error: &zk::Error) -> bool {
        if !is_transient(error) || !self.spend() {
            return false;
        }
        sleep(RETRY_PAUSE).await;
        true
    }
}

/// Sends `request` until it succeeds, fails for good, or has no try left (see [`Tries`]).
async fn retry<T, F, Fut>(mut request: F) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let mut tries = Tries::default();
    loop {
        match request().await {
            Err(error) if is_transient(&error) => {
                if !tries.again(&error).await {
                    return Err(error);
                }
            }
            result => return result,
        }
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

/// Who holds the lock at `lock_path`, as the leader last committed it.
pub(crate) async fn inspect(
    conn: &Conn,
    lock_path: &str,
    name: &LockName,
) -> Result<Option<LockInfo>, LockError> {
    // A follower may lag behind the leader; `sync` makes it catch up before we read.
    catch_up(conn, lock_path).await?;
    for _ in 0..RETRIES {
        let children = match retry(|| conn.list(lock_path)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(ZkError::new("list", lock_path, e).into()),
        };
        let queue = node::contenders(&children).map_err(|f| foreign_error(name, lock_path, &f))?;
        let Some(first) = queue.first() else {
            return Ok(None);
        };
        let path = format!("{lock_path}/{}", first.name);
        match retry(|| conn.read(&path)).await {
            Ok((data, stat)) => {
                let token = token_of(first.name, &data);
                let fence = fence(stat.czxid, first.name)?;
                return Ok(Some(LockInfo::new(name.clone(), token, fence, None)));
            }
            // Released between the listing and the read: look again.
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(ZkError::new("read", &path, e).into()),
        }
    }
    Err(LockError::Unavailable {
        message: format!("`{name}` changed hands too often to be inspected; try again"),
        source: None,
    })
}

/// The owner token of a contender: its name, plus the 128-bit secret our nodes carry as data.
fn token_of(node_name: &str, data: &[u8]) -> LeaseToken {
    match std::str::from_utf8(data) {
        Ok(secret) if LeaseToken::is_random_format(secret) => {
            LeaseToken::from_store(format!("{node_name}/{secret}"))
        }
        // A Curator contender (its data is the client's address) or another writer's node.
        _ => LeaseToken::from_store(node_name),
    }
}

/// The fence of a contender node: its creation zxid.
pub(crate) fn fence(czxid: i64, node_name: &str) -> Result<Fence, LockError> {
    u64::try_from(czxid)
        .map(Fence::new)
        .map_err(|_| LockError::Backend {
            message: format!("contender `{node_name}` has a negative creation zxid {czxid}"),
            source: None,
        })
}

fn foreign_error(name: &LockName, lock_path: &str, foreign: &[&str]) -> LockError {
    LockError::Foreign {
        name: name.to_string(),
        found: format!(
            "`{lock_path}` has children that are not lock contenders in Curator's layout `_c_<uuid>-lock-<sequence>`: {}",
            foreign.join(", ")
        ),
    }
}

/// Owns a contender node until it is granted or deleted; dropped while armed (the acquire
/// future was dropped, or failed without deleting) it deletes the node in the background.
struct Cleanup {
    conn: Arc<Conn>,
    lock_path: String,
    uuid_prefix: String,
    /// The node's path once the create's reply arrived; before that it is found by UUID.
    node: Option<String>,
    armed: bool,
}

impl Cleanup {
    fn new(conn: Arc<Conn>, lock_path: &str, uuid_prefix: String) -> Self {
        Self {
            conn,
            lock_path: lock_path.to_owned(),
            uuid_prefix,
            node: None,
            armed: true,
        }
    }

    /// The node is granted or gone: nothing to clean up.
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Deletes the node now (if this future is dropped meanwhile, `Drop` takes over).
    async fn discard(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_the_secret_of_our_nodes_only() {
        let node = "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000001";
        let secret = LeaseToken::random();
        let ours = token_of(node, secret.as_str().as_bytes());
        assert_eq!(ours.as_str(), format!("{node}/{}", secret.as_str()));
        assert_eq!(token_of(node, b"10.0.0.7").as_str(), node);
        assert_eq!(token_of(node, &[0xff, 0xfe]).as_str(), node);
    }

    #[test]
    fn negative_zxids_are_errors_not_panics() {
        assert!(matches!(fence(-1, "n"), Err(LockError::Backend { .. })));
        assert!(matches!(fence(7, "n"), Ok(f) if f.get() == 7));
    }
}
