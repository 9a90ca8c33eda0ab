//! [`ZkBackend`]: the lock contract on ZooKeeper.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use lock_core::{
    Capabilities, Clock, Expiry, Failover, Fencing, Lease, LockBackend, LockError, LockInfo,
    LockName, LossReason, WaitOrder, Wakeup,
    backend::{AcquireRequest, Grant, LeaseToken, async_trait},
};
use zookeeper_client::{self as zk, MultiReadResult, SessionId, SessionState};

use crate::{
    OpCounts, ZkConfig,
    error::{ZkError, is_session_end},
    recipe::{self, OwnWatch},
    session::{Conn, Sessions},
};

/// The lock contract on ZooKeeper: one session per backend, shared by all its locks.
///
/// Each lock is the container node `<root>/<encoded name>`; each acquisition creates an
/// EPHEMERAL_SEQUENTIAL child in Curator's protected layout `_c_<uuid>-lock-<sequence>`. The
/// lowest sequence holds the lock; every other contender watches the two nodes before it.
/// See the crate documentation for the whole recipe, what a lease means here and what
/// `extend` does.
///
/// Clones share the session. Dropping the last clone closes the session, and the server
/// deletes its nodes at once.
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: Sessions,
    /// Nodes this backend holds, by lease token: leases are bound to the session that created
    /// their node, so only this backend can renew or release them. With each, the watch its
    /// acquisition set on it while waiting, if any: kept until the node's deletion fires it, so
    /// that it ends without a `removeWatches` request.
    held: Mutex<HashMap<LeaseToken, (Held, Option<OwnWatch>)>>,
}

#[derive(Debug, Clone)]
struct Held {
    name: LockName,
    path: String,
    session: SessionId,
}

impl ZkBackend {
    /// Runs `work`, naming the ensemble in a store error (see [`LockError::on_server`]).
    pub(crate) async fn on_server<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        work.await
            .map_err(|e| e.on_server(&self.inner.sessions.config().hosts))
    }

    /// Validates `config` and establishes the backend's session.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a bad configuration; [`LockError::Unavailable`] when
    /// no server answered within [`ZkConfig::connect_timeout`]; [`LockError::Unsupported`]
    /// for a server before ZooKeeper 3.6.
    ///
    /// # Cancel safety
    /// Dropping the future closes the session if one was being established; nothing is held.
    pub async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        let sessions = Sessions::connect(config).await?;
        // Batched renewals read nodes with `multiRead` (ZooKeeper 3.6): a server without it
        // answers `Unimplemented` and closes the connection, so ask once, before anything
        // else is in flight.
        let probe = match sessions.peek().read_many(&["/"]) {
            Ok(read) => read.await.map(drop),
            Err(e) => Err(e),
        };
        match probe {
            Ok(()) => {}
            Err(zk::Error::Unimplemented) => {
                return Err(LockError::unsupported(
                    "ZooKeeper before 3.6 (no multiRead, which batched renewals use)",
                ));
            }
            Err(e) => return Err(ZkError::new("multiRead", "/".to_owned(), e).into()),
        }
        Ok(Self {
            inner: Arc::new(Inner {
                sessions,
                held: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        self.inner.sessions.config()
    }

    /// The live session (waiting for one after a session ended).
    pub(crate) async fn live(&self) -> Result<Arc<crate::session::Conn>, LockError> {
        self.inner.sessions.live().await
    }

    /// The node path of `name`'s lock (see [`ZkConfig::lock_path`]).
    pub fn lock_path(&self, name: &LockName) -> String {
        self.config().lock_path(name)
    }

    /// What a backend with `config` declares (its [`LockBackend::capabilities`]): strict
    /// fences (creation zxids), session expiry, push wake-ups, FIFO; a quorum where the
    /// connect string names several servers.
    pub fn declared(config: &ZkConfig) -> Capabilities {
        let failover = config.effective_failover();
        let acks = match failover {
            // A write is acknowledged by a majority: the leader and half the others.
            Failover::Quorum => u32::try_from(config.host_count() / 2).unwrap_or(u32::MAX),
            _ => 0,
        };
        Capabilities::new(
            Fencing::Strict,
            Expiry::Session,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::None,
        )
        .with_portable_lease(false)
        .with_failover(failover)
        .with_replica_acks(acks)
    }

    /// The current session's negotiated timeout: the TTL of every lease this backend grants.
    pub fn session_timeout(&self) -> Duration {
        self.inner.sessions.peek().timeout()
    }

    /// The current session's id (it changes when an expired session is replaced).
    pub fn session_id(&self) -> i64 {
        self.inner.sessions.peek().id().0
    }

    /// The ZooKeeper requests this backend sent so far, by kind.
    pub fn operations(&self) -> OpCounts {
        self.inner.sessions.counts()
    }

    /// The ZooKeeper client of the backend's live session (a new session if the last one
    /// ended), for requests of your own on the same session. Its requests are not counted in
    /// [`ZkBackend::operations`].
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when a new session was needed and could not be established.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the backend as it was (a session being opened may still
    /// become the backend's live session).
    pub async fn zookeeper(&self) -> Result<zk::Client, LockError> {
        Ok(self.inner.sessions.live().await?.client().clone())
    }

    fn table(&self) -> MutexGuard<'_, HashMap<LeaseToken, (Held, Option<OwnWatch>)>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The node of `lease`, if this backend holds it.
    fn held(&self, lease: &Lease) -> Result<Held, LockError> {
        self.table()
            .get(lease.token())
            .map(|(held, _)| held)
            .filter(|held| held.name == *lease.name())
            .cloned()
            .ok_or_else(|| LockError::not_held(lease.name()))
    }

    fn forget(&self, lease: &Lease) {
        self.table().remove(lease.token());
    }

    /// Forgets `lease` when `answer` says its session ended: its node is gone with the session,
    /// and a lease lost so is not released (lock-core does not release a hold lost with
    /// [`LossReason::SessionEnded`]), so nothing else would take its entry out.
    fn forget_if_ended<T>(&self, lease: &Lease, answer: &Result<T, LockError>) {
        if let Err(LockError::Lost {
            reason: LossReason::SessionEnded,
            ..
        }) = answer
        {
            self.forget(lease);
        }
    }

    /// The current session, if `held`'s node belongs to it and it is still alive.
    fn session_of(&self, held: &Held) -> Result<Arc<Conn>, LockError> {
        let conn = self.inner.sessions.peek();
        if conn.id() != held.session || conn.is_ended() {
            return Err(session_ended(&held.name));
        }
        Ok(conn)
    }

    /// The session of a batch of renewals' `checks` (`(index, node)`). They share one: a
    /// lease enters the table only on the current session, and a session is replaced only
    /// once it ended. When it ended, each of them is answered lost with it (and forgotten, see
    /// [`Self::forget_if_ended`]).
    fn batch_session(
        &self,
        checks: &[(usize, Held)],
        answers: &mut [Option<Result<Grant, LockError>>],
    ) -> Option<Arc<Conn>> {
        let (_, first) = checks.first()?;
        let conn = self.session_of(first).ok();
        if conn.is_none() {
            for (i, held) in checks {
                answers[*i] = Some(Err(session_ended(&held.name)));
            }
        }
        conn
    }

    /// A renewal's answer from the check of `held`'s node (`found`), asked at `sent` after a
    /// sync: renewed when the node is there, owned by the session and of the lease's fence.
    fn judge(
        &self,
        lease: &Lease,
        held: &Held,
        conn: &Conn,
        sent: Instant,
        found: Result<Option<zookeeper_client::Stat>, zookeeper_client::Error>,
    ) -> Result<Grant, LockError> {
        match found {
            Ok(Some(stat))
                if stat.ephemeral_owner == held.session.0
                    && recipe::fence(stat.czxid, &held.path).is_ok_and(|f| f == lease.fence()) =>
            {
                let renewed = lease.clone().with_ttl(conn.lease_ttl());
                Ok(Grant::new(renewed, sent))
            }
            Ok(_) => {
                self.forget(lease);
                Err(LockError::not_held(lease.name()))
            }
            Err(e) if is_session_end(&e) => Err(session_ended(&held.name)),
            Err(e) => Err(ZkError::new("exists", held.path.clone(), e).into()),
        }
    }
}

/// The most nodes one `multiRead` of a batch of renewals reads.
const RENEW_CHUNK: usize = 500;

/// `Unavailable` while `conn` is disconnected: the session holding `held` may still be alive.
fn connected(conn: &Conn, held: &Held) -> Result<(), LockError> {
    if conn.state() == SessionState::Disconnected {
        return Err(LockError::unavailable_msg(format!(
            "disconnected from ZooKeeper; the session holding `{}` may still be alive",
            held.name
        )));
    }
    Ok(())
}

/// A renewal's sync: fine when done (or when the node it named is gone: the check answers
/// then); the session's end, or the failure, otherwise.
fn synced_or(synced: Result<(), zookeeper_client::Error>, held: &Held) -> Result<(), LockError> {
    match synced {
        Ok(()) | Err(zookeeper_client::Error::NoNode) => Ok(()),
        Err(e) if is_session_end(&e) => Err(session_ended(&held.name)),
        Err(e) => Err(ZkError::new("sync", held.path.clone(), e).into()),
    }
}

fn session_ended(name: &LockName) -> LockError {
    LockError::lost(name.to_string(), LossReason::SessionEnded)
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn capabilities(&self) -> Capabilities {
        Self::declared(self.config())
    }

    fn store(&self) -> &'static str {
        "zookeeper"
    }

    /// Queues a contender node and waits until it is the lowest (see the crate docs). The
    /// request's TTL is not used: the hold lasts as long as the session, and the lease's TTL is
    /// the session timeout less half a server tick ([`ZkConfig::lease_ttl`](crate::ZkConfig::lease_ttl)).
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.on_server(async {
            let lock_path = self.lock_path(request.name());
            let granted = recipe::acquire(&self.inner.sessions, &lock_path, request).await?;
            let lease = Lease::new(
                request.name().clone(),
                granted.token.clone(),
                granted.fence,
                granted.ttl,
            );
            self.table().insert(
                granted.token,
                (
                    Held {
                        name: request.name().clone(),
                        path: granted.path,
                        session: granted.session,
                    },
                    granted.own_watch,
                ),
            );
            Ok(Grant::new(lease, granted.valid_from))
        })
        .await
    }

    /// Checks that the lease's node still exists and belongs to the backend's live session
    /// (`sync` then `exists`, pipelined: one round trip, confirmed by the leader's state).
    /// `ttl` is not used: the lease's TTL stays the session timeout less half a server tick.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the node is gone or the lease is not this backend's;
    /// [`LockError::Lost`] with [`LossReason::SessionEnded`] when the node's session ended
    /// (the backend then forgets the lease: asked again, it answers `NotHeld`);
    /// [`LockError::Unavailable`] while disconnected (the session may still be alive).
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        // The session keeps the hold, whatever the TTL; a TTL out of range is still bad input.
        lock_core::backend::validate_ttl(ttl)?;
        let answer = self
            .on_server(async {
                let held = self.held(lease)?;
                let conn = self.session_of(&held)?;
                connected(&conn, &held)?;
                let sent = Instant::now();
                // `sync` first, pipelined with the check (one round trip): the server answers the
                // check only after catching up with the leader, so a server cut off from the quorum,
                // which would answer from its own stale state while the leader expires the session,
                // cannot confirm the hold.
                let (synced, found) =
                    futures::join!(conn.sync(&held.path), conn.exists(&held.path));
                synced_or(synced, &held)?;
                self.judge(lease, &held, &conn, sent, found)
            })
            .await;
        self.forget_if_ended(lease, &answer);
        answer
    }

    /// Renews every lease at once, in one round trip: one `sync`, then the nodes of every
    /// lease read in `multiRead` requests of up to 500 nodes each, sent together after it on
    /// the same session. A session answers in the order it was asked, so each read is
    /// answered after the sync, as [`Self::renew`]'s check is. (`multiRead` came with
    /// ZooKeeper 3.6; [`Self::connect`] refuses older servers.)
    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        self.on_server(async {
            let mut answers: Vec<Option<Result<Grant, LockError>>> =
                leases.iter().map(|_| None).collect();
            let mut checks = Vec::with_capacity(leases.len());
            for (i, lease) in leases.iter().enumerate() {
                let checked = lock_core::backend::validate_ttl(lease.ttl())
                    .and_then(|()| self.held(lease))
                    .and_then(|held| {
                        let conn = self.session_of(&held)?;
                        connected(&conn, &held)?;
                        Ok((i, held))
                    });
                match checked {
                    Ok(check) => checks.push(check),
                    Err(error) => answers[i] = Some(Err(error)),
                }
            }
            let conn = self.batch_session(&checks, &mut answers);
            if let (Some((_, first)), Some(conn)) = (checks.first(), conn) {
                let sent = Instant::now();
                // The requests go out as they are made: the sync first.
                let synced = conn.sync(&first.path);
                let reads: Vec<_> = checks
                    .chunks(RENEW_CHUNK)
                    .map(|chunk| {
                        let paths: Vec<&str> = chunk.iter().map(|(_, h)| h.path.as_str()).collect();
                        conn.read_many(&paths)
                    })
                    .collect();
                let reads = reads.into_iter().map(|read| async move { read?.await });
                let (synced, read) = futures::join!(synced, futures::future::join_all(reads));
                let mut found = Vec::with_capacity(checks.len());
                for (chunk, read) in checks.chunks(RENEW_CHUNK).zip(read) {
                    match read {
                        Ok(results) if results.len() == chunk.len() => {
                            found.extend(results.into_iter().map(|result| match result {
                                MultiReadResult::Data { stat, .. } => Ok(Some(stat)),
                                MultiReadResult::Error {
                                    err: zookeeper_client::Error::NoNode,
                                } => Ok(None),
                                MultiReadResult::Error { err } => Err(err),
                                // Only nodes' data was asked for.
                                _ => Err(zookeeper_client::Error::UnexpectedError(
                                    "a multiRead of nodes' data answered with children".into(),
                                )),
                            }));
                        }
                        Ok(results) => found.extend(chunk.iter().map(|_| {
                            Err(zookeeper_client::Error::UnexpectedError(format!(
                                "a multiRead of {} nodes answered {} results",
                                chunk.len(),
                                results.len()
                            )))
                        })),
                        Err(error) => found.extend(chunk.iter().map(|_| Err(error.clone()))),
                    }
                }
                for ((i, held), found) in checks.iter().zip(found) {
                    answers[*i] = Some(
                        synced_or(synced.clone(), held)
                            .and_then(|()| self.judge(&leases[*i], held, &conn, sent, found)),
                    );
                }
            }
            Ok(answers
                .into_iter()
                .zip(leases)
                .map(|(answer, lease)| {
                    let answer = answer.unwrap_or_else(|| Err(LockError::not_held(lease.name())));
                    self.forget_if_ended(lease, &answer);
                    answer
                })
                .collect())
        })
        .await
    }

    /// Deletes the lease's node (retried until it is gone or the session is).
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the node was already gone or the lease is not this
    /// backend's (so also once a renewal found the session ended and forgot the lease);
    /// [`LockError::Lost`] with [`LossReason::SessionEnded`] when the node's session ended
    /// (the server deletes its nodes).
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.on_server(async {
            let held = self.held(lease)?;
            let conn = match self.session_of(&held) {
                Ok(conn) => conn,
                Err(error) => {
                    self.forget(lease);
                    return Err(error);
                }
            };
            match recipe::delete(&conn, &held.path).await {
                Ok(true) => {
                    self.forget(lease);
                    Ok(())
                }
                Ok(false) => {
                    self.forget(lease);
                    Err(LockError::not_held(lease.name()))
                }
                Err(e) if is_session_end(&e) => {
                    self.forget(lease);
                    Err(session_ended(&held.name))
                }
                Err(e) => Err(ZkError::new("delete", held.path, e).into()),
            }
        })
        .await
    }

    /// The lowest contender: its token (for nodes of this library, the lease token; for
    /// Curator's, the node name), its creation zxid as the fence, no expiry. Reads after a
    /// `sync`, so a follower's lag does not show a released lock as held.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.on_server(async {
            let conn = self.inner.sessions.live().await?;
            let limit = conn.timeout().max(Duration::from_secs(1));
            let lock_path = self.lock_path(name);
            match tokio::time::timeout(limit, recipe::inspect(&conn, &lock_path, name)).await {
                Ok(info) => info,
                Err(_) => Err(LockError::unavailable_msg(format!(
                    "ZooKeeper did not answer within {limit:?} while inspecting `{name}`"
                ))),
            }
        })
        .await
    }
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let conn = self.inner.sessions.peek();
        f.debug_struct("ZkBackend")
            .field("config", self.config())
            .field("session", &conn.id())
            .field("state", &conn.state())
            .finish()
    }
}
