//! Waiting for the lock: one attempt per session, each contender watching its own node and the
//! two before it (see `watches.rs`).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

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
    watches::{self, Fired, Found, OwnWatch, Watches},
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
    let granted = |valid_from: Instant, own_watch: Option<OwnWatch>| Granted {
        path: created.path.clone(),
        token: LeaseToken::from_store(format!("{}/{}", created.name, secret.as_str())),
        fence,
        session: conn.id(),
        ttl: conn.lease_ttl(),
        valid_from,
        own_watch,
    };
    let mut watches = Watches::default();
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
            return Ok(granted(sent, watches.take_own()));
        };
        let before = format!("{lock_path}/{}", predecessor.name);
        let two_before = at
            .checked_sub(2)
            .and_then(|i| queue.get(i))
            .map(|c| format!("{lock_path}/{}", c.name));
        // Right behind the first contender (as this listing saw it): once that one is gone,
        // ours is the lowest, as no node can come below it (sequence numbers only grow), so
        // the next listing is skipped if ours is known to be still there (see `watches`).
        let behind_first = at == 1;
        let round = Round {
            own: &created.path,
            before: &before,
            two_before: two_before.as_deref(),
            behind_first,
            listed: sent,
        };
        if let Some(alive) = await_change(conn, &mut watches, &round, request, &mut cleanup).await?
            && watches::fresh(alive, conn.lease_ttl())
        {
            cleanup.disarm();
            return Ok(granted(alive, watches.take_own()));
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

/// What one wait after a listing knows: our node, the contenders just before it and two
/// before it, whether the one just before was the first, and when the listing was sent.
struct Round<'a> {
    own: &'a str,
    before: &'a str,
    two_before: Option<&'a str>,
    behind_first: bool,
    listed: Instant,
}

/// Waits until a watched node changes (see [`Watches`]); then the caller lists again, unless
/// this returns when the session was last proven alive: the contender just before ours was
/// the first and is deleted, and ours is known to be still there. Ends the attempt when the
/// wait budget runs out, the session ends, or our node is found gone (queue again).
async fn await_change(
    conn: &Conn,
    watches: &mut Watches,
    round: &Round<'_>,
    request: &AcquireRequest,
    cleanup: &mut Cleanup,
) -> Result<Option<Instant>, Stop> {
    let deadline = request.deadline();
    if Instant::now() >= deadline {
        cleanup.discard().await;
        return Err(Stop::Fail(request.timeout_error()));
    }
    let set = watches
        .set(conn, round.own, round.before, round.two_before)
        .await;
    // The server answered the listing, and the watches' round when one was sent: the
    // session lasts at least its timeout from the later of the two.
    let alive = match set {
        Ok(Found::Set(sent)) => sent.map_or(round.listed, |sent| sent.max(round.listed)),
        Ok(Found::BeforeGone(sent)) => {
            let ours = round.behind_first && watches.still_ours();
            return Ok(ours.then_some(sent.max(round.listed)));
        }
        Ok(Found::TwoBeforeGone) => return Ok(None),
        Ok(Found::OwnGone) => {
            cleanup.disarm();
            return Err(Stop::Vanished);
        }
        Err((path, e)) => {
            let error = ZkError::new("watch", &path, e);
            if !is_session_end(&error.source) {
                cleanup.discard().await;
            }
            return Err(error.into());
        }
    };
    tokio::select! {
        (fired, event) = watches.fired() => {
            if event.event_type == EventType::Session && event.session_state.is_terminated() {
                return Err(Stop::SessionEnded);
            }
            let first_gone = round.behind_first
                && event.event_type == EventType::NodeDeleted
                && matches!(&fired, Fired::Contender(path) if path == round.before);
            Ok((first_gone && watches.still_ours()).then_some(alive))
        }
        () = tokio::time::sleep_until(deadline.into()) => {
            cleanup.discard().await;
            Err(Stop::Fail(request.timeout_error()))
        }
    }
}
