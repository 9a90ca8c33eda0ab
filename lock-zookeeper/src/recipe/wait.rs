//! Waiting for the lock: one attempt per session, each contender watching only the node just
//! before it.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use lock_core::{
    LockError,
    backend::{AcquireRequest, LeaseToken},
};
use tokio::time::sleep_until;
use uuid::Uuid;
use zookeeper_client::{self as zk, EventType};

use super::{
    Granted, RECONNECT_PAUSE, Stop,
    contender::{Cleanup, create},
    read::{fence, foreign_error},
    retry,
};
use crate::{
    error::{ZkError, is_session_end},
    node,
    session::{Conn, Sessions},
};

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
                return Err(LockError::unavailable_msg(format!(
                        "the connection to ZooKeeper at `{}` went down and the wait budget of {:?} is over while acquiring `{}`",
                        sessions.config().hosts,
                        request.wait(),
                        request.name()
                    )));
            }
            () = sleep_until((request.deadline() + grace).into()) => None,
        };
        let stop = match outcome {
            Some(Ok(granted)) => return Ok(granted),
            Some(Err(Stop::Fail(error))) => return Err(error),
            Some(Err(stop)) => stop,
            None => {
                return Err(LockError::unavailable_msg(format!(
                    "ZooKeeper did not answer within the wait budget of {:?} plus {grace:?} while acquiring `{}`",
                    request.wait(),
                    request.name()
                )));
            }
        };
        if Instant::now() >= request.deadline() {
            return Err(match stop {
                Stop::SessionEnded => LockError::unavailable_msg(format!(
                    "the ZooKeeper session ended while acquiring `{}`; a new session is opened on the next try",
                    request.name()
                )),
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
    let conn = tokio::time::timeout_at(request.deadline().into(), sessions.live())
        .await
        .map_err(|_| {
            LockError::unavailable_msg(format!(
                "no ZooKeeper session could be established within the wait budget of {:?}",
                request.wait()
            ))
        })??;
    if conn.state() == zk::SessionState::Disconnected {
        return Err(LockError::unavailable_msg(format!(
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
    let granted = |valid_from: Instant| Granted {
        path: created.path.clone(),
        token: LeaseToken::from_store(format!("{}/{}", created.name, secret.as_str())),
        fence,
        session: conn.id(),
        ttl: conn.lease_ttl(),
        valid_from,
    };
    loop {
        let (children, sent) = match listed.take() {
            Some(listed) => listed,
            None => list(conn, lock_path, &mut cleanup).await?,
        };
        let queue = match node::contenders(&children) {
            Ok(queue) => queue,
            Err(foreign) => {
                cleanup.discard().await;
                let error = foreign_error(request.name(), lock_path, &foreign);
                return Err(Stop::Fail(error));
            }
        };
        let Some(at) = queue.iter().position(|c| c.name == created.name) else {
            cleanup.disarm();
            return Err(Stop::Vanished);
        };
        let Some(predecessor) = at.checked_sub(1).and_then(|i| queue.get(i)) else {
            cleanup.disarm();
            // The listing proved the session alive when the server answered it, so the
            // session lasts at least its timeout from when the request was sent.
            return Ok(granted(sent));
        };
        let predecessor = format!("{lock_path}/{}", predecessor.name);
        // Right behind the first contender: ours is watched too (see below).
        let own = (at == 1).then_some(created.path.as_str());
        let gone = await_predecessor(conn, &predecessor, own, request, &mut cleanup).await?;
        // The predecessor was the first contender: once it is gone ours is the lowest, as no
        // node can come below it (sequence numbers only grow), so the listing is skipped, if
        // ours is known to be still there: its watch was set and has not fired (ZooKeeper
        // sends a session's events in order, so a deletion of ours before the predecessor's
        // was delivered first), and the session did not reconnect meanwhile. The watch's
        // answer proved the session alive as a listing's would; a watch set long ago would
        // leave a short lease, so then the caller lists.
        if let Some(watch_sent) = gone
            && watch_sent.elapsed() < conn.lease_ttl() / 2
        {
            cleanup.disarm();
            return Ok(granted(watch_sent));
        }
    }
}

/// Lists the contenders under `lock_path`: the children and when the request was sent.
async fn list(
    conn: &Conn,
    lock_path: &str,
    cleanup: &mut Cleanup,
) -> Result<(Vec<String>, Instant), Stop> {
    let sent = Instant::now();
    match retry(|| conn.list(lock_path)).await {
        Ok(children) => Ok((children, sent)),
        // The container went, so our node went with it.
        Err(zk::Error::NoNode) => {
            cleanup.disarm();
            Err(Stop::Vanished)
        }
        Err(e) => {
            let error = ZkError::new("list", lock_path, e);
            if !is_session_end(&error.source) {
                cleanup.discard().await;
            }
            Err(error.into())
        }
    }
}

/// Waits until the contender before ours goes (or changes): then the caller lists again,
/// whoever is first now. Ends the attempt when the wait budget runs out or the session ends.
/// With `own` (the caller's node), that node is watched as well; when the predecessor is
/// known to be deleted (its deletion seen, or no node when the watch was set) while `own` is
/// known to be still there (its watch set and not fired), the instant the watches were sent:
/// the server answered them, so the session lasts at least its timeout from then.
async fn await_predecessor(
    conn: &Conn,
    predecessor: &str,
    own: Option<&str>,
    request: &AcquireRequest,
    cleanup: &mut Cleanup,
) -> Result<Option<Instant>, Stop> {
    let deadline = request.deadline();
    if Instant::now() >= deadline {
        cleanup.discard().await;
        return Err(Stop::Fail(request.timeout_error()));
    }
    // A reconnection re-registers the session's watches and may deliver their events out of
    // order (a deletion of ours after the predecessor's): the short path needs none since the
    // watches were sent. The client publishes `Disconnected` before it reconnects.
    let mut states = conn.client().state_watcher();
    let sent = Instant::now();
    // Any failure to watch ours only means the caller lists as before.
    let own_watch = async {
        match own {
            Some(path) => conn.watch(path).await.ok().map(|(_, _, watcher)| watcher),
            None => None,
        }
    };
    let (own_watcher, watched) = tokio::join!(own_watch, retry(|| conn.watch(predecessor)));
    // Whether ours is still there: watched, its watch not fired, and the session not
    // reconnected meanwhile.
    let still_ours = move || {
        states.changed().now_or_never().is_none()
            && own_watcher.is_some_and(|watcher| watcher.changed().now_or_never().is_none())
    };
    let watcher = match watched {
        Ok((_, _, watcher)) => watcher,
        // Gone already.
        Err(zk::Error::NoNode) => return Ok(still_ours().then_some(sent)),
        Err(e) => {
            let error = ZkError::new("watch", predecessor, e);
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
            Ok((event.event_type == EventType::NodeDeleted && still_ours()).then_some(sent))
        }
        () = tokio::time::sleep_until(deadline.into()) => {
            cleanup.discard().await;
            Err(Stop::Fail(request.timeout_error()))
        }
    }
}
