//! [`RedisBackend`]: the lock contract on one Redis server or a Redis Cluster.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use lock_core::{
    Capabilities, Clock, Expiry, Failover, Fencing, Lease, LockBackend, LockError, LockInfo,
    LockName, WaitOrder, Wakeup,
    backend::{AcquireRequest, Grant, LeaseToken, async_trait},
};

use redis::Value;

use crate::{
    RedisConfig, cluster_renewals,
    config::redacted,
    connection::{self, Conn, TlsRoots},
    error::Error,
    keys::RedisKeys as Keys,
    ops::{self, Next, Queueing, Try},
    scripts::{self, Mark},
    subscriber::Subscriber,
    waiters::{Handed, Registration, Waiters, WakeUp},
};

/// Locks on one Redis server (optionally waiting for replica acknowledgements) or on a Redis
/// Cluster.
///
/// - Acquire is one Lua script: `SET key token PX ttl` if the key is free, with the fence
///   counter raised in the same atomic step; release is a compare-and-delete that also
///   publishes the release when a waiter marked the lock; renew is a compare-and-`PEXPIRE`.
///   Scripts run by `EVALSHA`; a server that answers `NOSCRIPT` gets the script's source by
///   `EVAL`, on the key's node (so a user's ACL must allow both).
/// - The fence is `max(counter + 1, server time in µs)`, written back to the counter (a hybrid
///   clock), so it stays above every earlier fence of the name even when the server lost the
///   counter: a restart without persistence, an eviction. Capabilities say
///   [`Fencing::Strict`] for one server without `replica_acks`, where that holds unless the
///   server's clock steps back; [`Fencing::BestEffort`] with `replica_acks` or on a cluster,
///   where a failover continues on a replica that may lack the last grant and whose clock may
///   be behind. See the crate docs, "Fences".
/// - Waiters queue and mark the lock. A release hands the lock over to the first waiter in the
///   same script (unless either client has [`RedisConfig::hand_over`] off) and tells it on one
///   pub/sub connection shared by all waiting locks of its client, so the waiter holds the lock
///   when the message arrives, without a try of its own (see `scripts::RELEASE`). Waiters retry
///   when the holder's TTL runs out in case a message is lost.
/// - The watchdog's renewals of many locks go out as calls of one script of up to 500 leases
///   each (on a cluster, which refuses a script's keys across slots, as pipelines of calls of
///   one lease each, one per node and 500 leases: see `cluster_renewals`).
/// - Keys are `<prefix>:{<name>}:lock`, `...:fence`, `...:waiters` and the channel
///   `...:released`: one hash tag, one cluster slot.
///
/// Clones share the connections.
#[derive(Debug, Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The server's (or the cluster's seed) addresses, passwords hidden, for error messages:
    /// built once, not on every busy try.
    server: String,
    conn: Conn,
    waiters: Arc<Waiters>,
    config: RedisConfig,
}

impl RedisBackend {
    /// Runs `work`, naming the server(s) in a store error (see [`LockError::on_server`]).
    pub(crate) async fn on_server<T>(
        &self,
        work: impl Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        work.await.map_err(|e| e.on_server(&self.inner.server))
    }

    /// Connects as `config` says (one server, or a cluster when `config.cluster`).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a bad configuration or URL;
    /// [`LockError::Unavailable`] when the server does not answer.
    ///
    /// # Cancel safety
    /// Dropping the future drops the connections made so far; nothing is held anywhere.
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        let first = config.urls.first().cloned().unwrap_or_default();
        let roots = TlsRoots::load(config.tls_ca_file.as_deref())?;
        let mut conn = if config.cluster {
            Conn::cluster(&config.urls, config.response_timeout).await?
        } else {
            Conn::single(&first, &roots, config.response_timeout).await?
        };
        let _: Value = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::new(format!("PING to {}", redacted(&config.urls).join(",")), e))?;
        let subscriber = if config.cluster {
            Subscriber::Cluster(config.urls.clone(), config.response_timeout)
        } else {
            Subscriber::Single(connection::client(&first, &roots)?)
        };
        Ok(Self {
            inner: Arc::new(Inner {
                server: redacted(&config.urls).join(","),
                conn,
                waiters: Waiters::new(subscriber, config.response_timeout),
                config,
            }),
        })
    }

    /// What a backend with `config` declares (its [`LockBackend::capabilities`]).
    pub fn declared(config: &RedisConfig) -> Capabilities {
        // Fences are `max(counter + 1, server time in µs)`: on one server they survive a lost
        // counter (restart without persistence, eviction) unless that server's clock steps
        // back. A failover hands the counter to another machine, which may not have the last
        // grant (asynchronous replication) and whose clock may be behind: best effort.
        let (fencing, failover) = if config.cluster || config.replica_acks > 0 {
            (Fencing::BestEffort, Failover::AsyncReplica)
        } else {
            (Fencing::Strict, Failover::SingleServer)
        };
        Capabilities::new(
            fencing,
            Expiry::Ttl,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::Server,
        )
        .with_portable_lease(true)
        .with_failover(failover)
        .with_replica_acks(config.replica_acks)
    }

    pub(crate) fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.inner.config.key_prefix, name)
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// A handle on the shared connection.
    pub(crate) fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    /// Waits for the configured replicas to acknowledge; releases and fails when they do not,
    /// or when `WAIT` itself fails.
    async fn replicate(&self, conn: &mut Conn, lease: &Lease) -> Result<(), LockError> {
        let config = &self.inner.config;
        let acked: Result<i64, _> = redis::cmd("WAIT")
            .arg(config.replica_acks)
            .arg(ops::millis(config.replica_timeout))
            .query_async(conn)
            .await;
        if matches!(acked, Ok(n) if n >= i64::from(config.replica_acks)) {
            return Ok(());
        }
        let keys = self.keys(lease.name());
        let _ = ops::release(conn, &keys, lease.token(), self.tell(), self.next()).await;
        Err(match acked {
            Ok(acked) => LockError::unavailable_msg(format!(
                "only {acked} of {} replicas acknowledged lock `{}` within {:?}; it was released",
                config.replica_acks,
                lease.name(),
                config.replica_timeout
            )),
            Err(error) => Error::new(
                format!(
                    "WAIT for replicas of lock `{}` (the lock was released)",
                    lease.name()
                ),
                error,
            )
            .into(),
        })
    }

    /// How releases tell each named waiter's client on its own channel: a shard channel on a
    /// cluster (see [`scripts::RELEASE`]).
    pub(crate) fn tell(&self) -> ops::Tell {
        if self.inner.config.cluster {
            ops::Tell::ShardPublish
        } else {
            ops::Tell::Publish
        }
    }

    /// Whether releases hand the lock over to the first waiter, and this client's waiters take
    /// a lock handed to them (see [`RedisConfig::hand_over`]).
    pub(crate) fn next(&self) -> Next {
        if self.inner.config.hand_over {
            Next::HandOver
        } else {
            Next::Turn
        }
    }

    /// The contended path of `acquire`: a place in the waiters' queue, a subscription to the
    /// release messages, and a try each time this waiter is woken (or its fallback timer runs
    /// out), until granted or the budget is over.
    async fn wait_in_line(
        &self,
        mut conn: Conn,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
        mut holder_left: Option<Duration>,
    ) -> Result<Grant, LockError> {
        // From here on every busy try keeps this waiter's place in the queue, for the rest of
        // its budget and a grace; a waiter that gives up leaves it.
        let queue = Queued {
            conn: conn.clone(),
            keys,
            token,
            tell: self.tell(),
            next: self.next(),
            backoff: request.backoff().clone(),
            until: request
                .deadline()
                .checked_add(PLACE_GRACE.saturating_add(request.ttl()))
                .unwrap_or(request.deadline()),
            served: false,
        };
        let waiters = &self.inner.waiters;
        let registration = waiters.register(&waiters.channel(&keys.channel), token.as_str());
        let mut fallback = request.backoff().delays();
        // Declared after the registration, so dropped before it.
        let mut woken: Option<WakeUp<'_>> = None;
        // How long this turn waits for its subscription: the response time-out within the
        // budget; once a subscription failed or was late, later turns of this wait only check
        // whether it has come through since (it goes on in the background) and retry without.
        let deadline = request.deadline();
        let mut subscribe_by = Instant::now()
            .checked_add(self.inner.config.response_timeout)
            .map_or(deadline, |by| by.min(deadline));
        // The last try that found the lock taken: when it was sent, and what it saw (the
        // larger of the fence counter and the server time, see `handed_valid_from`).
        let mut last: Option<(Instant, u64)> = None;
        loop {
            if let Some(handed) = registration.take_handed()
                && let Some(grant) = self.trust(request, token, handed, last)
            {
                queue.served();
                return Ok(grant);
            }
            // Listening before the subscription is checked: a wake-up that comes while it is
            // (the connection ended, the server ended the subscription) is not missed.
            let notified = registration.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut push = registration.ensure(subscribe_by).await;
            if !push {
                subscribe_by = Instant::now();
            }
            // Try again now that we are subscribed: a release may have come in between. When
            // busy, the try also marks the lock as waited for, so its release publishes; when
            // other waiters of this client wait too, a grant marks it for them.
            let mark = match (push, registration.others_wait()) {
                (false, _) => Mark::No,
                (true, false) => Mark::WhenBusy,
                (true, true) => Mark::Always,
            };
            let place = request.deadline().saturating_duration_since(Instant::now()) + PLACE_GRACE;
            let tried = self
                .try_once(&mut conn, request, keys, token, mark, place)
                .await?;
            if let Some(wake_up) = woken.take() {
                wake_up.done();
            }
            match tried {
                Ok(grant) => {
                    queue.served();
                    return Ok(grant);
                }
                Err(busy) => {
                    last = busy.tried.or(last);
                    holder_left = busy.left.or(holder_left);
                    if busy.queued && registration.others_wait() {
                        // The turn is someone else's, maybe a sibling's that the one release
                        // message did not wake: pass the wake-up on to the next sibling (this
                        // waiter goes to the back of the line first, so it is not the one
                        // woken), which passes it on in turn until the first in the queue
                        // has it.
                        notified.set(registration.notify().notified());
                        notified.as_mut().enable();
                        registration.notify().notify_one();
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(request.timeout_error());
            }
            // The subscription ended during the try (a wake-up the passing on above may have
            // replaced): no release would reach this waiter, so it polls this turn.
            push = push && registration.subscribed();
            let step = fallback.next().unwrap_or(request.backoff().max);
            let mut until = now + holder_left.unwrap_or(step) + Duration::from_millis(1);
            if !push {
                until = until.min(now + step);
            }
            woken = sleep_turn(&registration, notified.as_mut(), until, deadline).await;
            holder_left = None;
        }
    }

    /// The grant of a lock a release handed over to this waiter (see `scripts::RELEASE`), when
    /// it can be trusted without a round trip (see [`handed_valid_from`]) and no replica
    /// acknowledgements are asked (the hand-over's writes are the releaser's connection's,
    /// which this waiter's `WAIT` does not cover). Otherwise `None`: the next try finds the
    /// lock ours, and renews it before it answers (see `confirm`).
    fn trust(
        &self,
        request: &AcquireRequest,
        token: &LeaseToken,
        handed: Handed,
        last: Option<(Instant, u64)>,
    ) -> Option<Grant> {
        if self.inner.config.replica_acks > 0 {
            return None;
        }
        let valid_from = handed_valid_from(handed.fence, last, request.ttl(), Instant::now())?;
        let lease = ops::lease(
            request.name(),
            token,
            handed.fence,
            request.ttl(),
            handed.server_ms,
        );
        Some(Grant::new(lease, valid_from))
    }

    /// One try; `place` as in [`ops::try_acquire`]. `Err(Busy)` when someone else has the
    /// lock or, with `queued`, the turn.
    async fn try_once(
        &self,
        conn: &mut Conn,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
        mark: Mark,
        place: Duration,
    ) -> Result<Result<Grant, Busy>, LockError> {
        let sent = Instant::now();
        let tried = ops::try_acquire(
            conn,
            request.name(),
            keys,
            token,
            request.ttl(),
            Queueing::single(
                mark,
                place,
                self.inner.waiters.id(),
                self.tell(),
                self.next(),
            ),
        )
        .await?;
        match tried {
            Try::Granted { fence, server_ms } => {
                let lease = ops::lease(request.name(), token, fence, request.ttl(), server_ms);
                self.settle(conn, keys, lease, sent, "granted")
                    .await
                    .map(Ok)
            }
            Try::Busy { pttl, seen, .. } => Ok(Err(Busy {
                left: pttl,
                queued: false,
                tried: Some((sent, seen)),
            })),
            Try::Queued { turn, rank, seen } => Ok(Err(Busy {
                left: Some(turn + behind_the_second(rank)),
                queued: true,
                tried: Some((sent, seen)),
            })),
            Try::Handed { fence } => self.confirm(conn, request, keys, token, fence).await,
        }
    }

    /// A try found the lock handed over to this waiter already (its message had not come, or
    /// was not trusted, see [`handed_valid_from`]): renews it for the TTL, so the grant is
    /// valid from the renewal's sending, and waits for the replicas when asked. When it is
    /// no longer ours (it expired meanwhile), the wait goes on; so it does when the fence
    /// counter was gone (evicted: the fence cannot be told), after the lock is given back.
    async fn confirm(
        &self,
        conn: &mut Conn,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
        fence: Option<u64>,
    ) -> Result<Result<Grant, Busy>, LockError> {
        // The lock is not ours after all (given back below, or gone): a hand-over message read
        // meanwhile (it comes with the `{4}` answer) must not be trusted on an older try.
        let not_ours = Busy {
            left: None,
            queued: false,
            tried: Some((Instant::now(), u64::MAX)),
        };
        let Some(fence) = fence else {
            ops::release(conn, keys, token, self.tell(), self.next()).await?;
            return Ok(Err(not_ours));
        };
        let sent = Instant::now();
        let Some(server_ms) = ops::renew(conn, keys, token, request.ttl()).await? else {
            return Ok(Err(not_ours));
        };
        let lease = ops::lease(request.name(), token, fence, request.ttl(), server_ms);
        self.settle(conn, keys, lease, sent, "confirmed")
            .await
            .map(Ok)
    }

    /// The grant of `lease` (a try's grant, or a confirmed hand-over, `how` it came), valid
    /// from `sent`, after the replicas acknowledged it when asked. A grant that comes back
    /// after its local deadline would be a guard already lost while the store still holds the
    /// lock: it is undone, and the error says so.
    async fn settle(
        &self,
        conn: &mut Conn,
        keys: &Keys,
        lease: Lease,
        sent: Instant,
        how: &str,
    ) -> Result<Grant, LockError> {
        if self.inner.config.replica_acks > 0 {
            self.replicate(conn, &lease).await?;
        }
        if !ops::within_deadline(sent, lease.ttl()) {
            let _ = ops::release(conn, keys, lease.token(), self.tell(), self.next()).await;
            return Err(LockError::unavailable_msg(format!(
                "lock `{}` was {how} {:?} after the request, past its {:?} TTL less the drift \
                 margin; it was released",
                lease.name(),
                sent.elapsed(),
                lease.ttl()
            )));
        }
        Ok(Grant::new(lease, sent))
    }
}

/// From when a lock handed over with `fence` is valid for the waiter, at `now`: from the
/// sending of `last`, the waiter's last try that found the lock taken (with what it saw: the
/// larger of the fence counter and the server time in µs), when that try was sent before the
/// hand-over, so the local deadline is never later than the server's expiry. It was when the
/// handed fence is above what that try saw: a hand-over issues a fence above the counter and
/// the server time of its own moment, and both only grow (the time unless the server's clock
/// steps back, as for fences), so a fence above them was issued after that try ran, not by a
/// hand-over before it whose lock may have expired since and gone to another (its message
/// read late), even if the counter was evicted in between.
/// And only when at least half the TTL is left from then (a long wait since that try would
/// leave a lease about to end). `None` otherwise: the grant needs a round trip of its own.
fn handed_valid_from(
    fence: u64,
    last: Option<(Instant, u64)>,
    ttl: Duration,
    now: Instant,
) -> Option<Instant> {
    let (sent, seen) = last?;
    let fresh = now
        .checked_add(ttl / 2)
        .is_some_and(|by| by < lock_core::backend::local_deadline(sent, ttl));
    (fence > seen && fresh).then_some(sent)
}

/// How much later than the end of the first waiter's turn a waiter at `rank` in the queue
/// (0 first) tries again, unless a message names it (a release, or a try that starts its
/// turn, see [`scripts::ACQUIRE`]): the second in line at
/// the turn's end (it steps in for a first that did not come), the third one to two turns
/// later, each one further back two to three turns later (spread at random). Before, every
/// waiter that tried during a turn tried again at its end, all at once, so a herd's tries
/// could delay the next first past its own turn (fault case
/// `waiters_behind_a_turn_do_not_all_retry_at_its_end`). A waiter that does not know its rank tries
/// at the turn's end.
fn behind_the_second(rank: Option<u64>) -> Duration {
    let behind = rank
        .map_or(0, |rank| rank.saturating_sub(1))
        .min(BEHIND_MAX);
    if behind == 0 {
        return Duration::ZERO;
    }
    let turn = scripts::HANDOFF_MS;
    Duration::from_millis(turn * behind + rand::random_range(0..turn))
}

/// At most this many turns after the end of the first waiter's turn a waiter further back
/// tries again (see [`behind_the_second`]): a waiter that becomes first meanwhile (those ahead
/// of it gave up, which wakes nobody) is told when another's try starts its turn (see
/// [`scripts::ACQUIRE`]), but a message can be lost (a pub/sub connection that drops), and a
/// waiter that sleeps longer would then miss that turn and lose its place.
const BEHIND_MAX: u64 = 2;

/// A busy try: how long the lock stays taken (when the server said), whether it is free but a
/// waiter queued earlier has its turn, and when the try was sent with what it saw (the larger of
/// the fence counter and the server time in µs; `u64::MAX` after a hand-over found and lost, so
/// that no message is trusted on it).
struct Busy {
    left: Option<Duration>,
    queued: bool,
    tried: Option<(Instant, u64)>,
}

/// When a waiter named second in line by a release tries, if no release reached it before:
/// once the first one's turn ([`scripts::HANDOFF_MS`]) is over.
const SECOND_STEPS_IN: Duration = Duration::from_millis(scripts::HANDOFF_MS + 5);

/// How long a waiter's place outlives its budget (a waiter that gives up takes it out at
/// once; one that dies loses it this much later, or as soon as its turn comes and it does not).
const PLACE_GRACE: Duration = Duration::from_secs(1);

/// A waiter's place in the queue: taken out in the background when the acquisition ends
/// without the lock (timed out, failed, or dropped); the grant takes it out itself. The
/// `LEAVE` is tried again on the request's back-off while it fails (the acquisition may have
/// failed for a connection that dropped), until the place and a lock handed to it meanwhile
/// would both have expired (`until`): a lock handed to a token nobody waits with any more
/// would otherwise keep everyone waiting for its TTL.
struct Queued<'a> {
    conn: Conn,
    keys: &'a Keys,
    token: &'a LeaseToken,
    tell: ops::Tell,
    next: Next,
    backoff: lock_core::Backoff,
    until: Instant,
    served: bool,
}

impl Queued<'_> {
    fn served(mut self) {
        self.served = true;
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.served {
            return;
        }
        let (mut conn, keys, token) = (self.conn.clone(), self.keys.clone(), self.token.clone());
        let (tell, next, until) = (self.tell, self.next, self.until);
        let mut delays = self.backoff.delays();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // A lock handed over to this waiter as it gave up goes on to the next.
                loop {
                    let left = ops::leave(&mut conn, &keys, &token, tell, next).await;
                    let Err(error) = left else {
                        return;
                    };
                    let retry_at = Instant::now() + delays.next().unwrap_or(Duration::from_secs(1));
                    if retry_at >= until {
                        tracing::debug!(%error, "leaving the queue failed; the place expires");
                        return;
                    }
                    tracing::debug!(%error, "leaving the queue failed; trying again");
                    tokio::time::sleep_until(retry_at.into()).await;
                }
            });
        }
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    /// Fencing is [`Fencing::Strict`] on one server without `replica_acks`: fences are
    /// `max(counter + 1, server time in µs)`, so they stay above every earlier fence through a
    /// restart without persistence or an eviction of the counter, unless the server's clock
    /// steps back. With `replica_acks` or on a cluster it is [`Fencing::BestEffort`]: a
    /// failover continues on a replica that may lack the last grant and whose clock may be
    /// behind the old primary's.
    fn capabilities(&self) -> Capabilities {
        Self::declared(&self.inner.config)
    }

    fn store(&self) -> &'static str {
        if self.inner.config.cluster {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.on_server(async {
            let keys = self.keys(request.name());
            let token = LeaseToken::random();
            let mut conn = self.inner.conn.clone();
            // The uncontended path: one round trip, no subscription.
            let holder_left = match self
                .try_once(&mut conn, request, &keys, &token, Mark::No, Duration::ZERO)
                .await?
            {
                Ok(grant) => return Ok(grant),
                Err(busy) => busy.left,
            };
            if Instant::now() >= request.deadline() {
                return Err(request.timeout_error());
            }
            self.wait_in_line(conn, request, &keys, &token, holder_left)
                .await
        })
        .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        self.on_server(async {
            lock_core::backend::validate_ttl(ttl)?;
            let mut conn = self.inner.conn.clone();
            let sent = Instant::now();
            match ops::renew(&mut conn, &self.keys(lease.name()), lease.token(), ttl).await? {
                Some(server_ms) => Ok(Grant::new(ops::renewed(lease, ttl, server_ms), sent)),
                None => Err(LockError::not_held(lease.name())),
            }
        })
        .await
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let Some(batch) = ops::renewal_batch(leases, |name| self.keys(name)) else {
            return lock_core::backend::renew_concurrently(self, leases).await;
        };
        let sent = Instant::now();
        if let Conn::Cluster(cluster) = &self.inner.conn {
            // Pipelines by node; a renewal a node did not run goes again on its own.
            let replies = cluster_renewals::renew(cluster, &batch).await;
            let answers = leases.iter().zip(replies).map(|(lease, reply)| async move {
                match reply {
                    Some(reply) => match ops::renewed_at(&reply) {
                        Some(server_ms) => Ok(Grant::new(
                            ops::renewed(lease, lease.ttl(), server_ms),
                            sent,
                        )),
                        None => Err(LockError::not_held(lease.name())),
                    },
                    None => self.renew(lease, lease.ttl()).await,
                }
            });
            return Ok(futures::future::join_all(answers).await);
        }
        let mut conn = self.inner.conn.clone();
        let replies = ops::Renewals::new(&batch).send(&mut conn, None).await?;
        if replies.len() != leases.len() {
            return Err(LockError::backend_msg(format!(
                "redis answered {} batched renewals with {} replies",
                leases.len(),
                replies.len()
            )));
        }
        Ok(leases
            .iter()
            .zip(replies)
            .map(|(lease, reply)| match ops::renewed_at(&reply) {
                Some(server_ms) => Ok(Grant::new(
                    ops::renewed(lease, lease.ttl(), server_ms),
                    sent,
                )),
                None => Err(LockError::not_held(lease.name())),
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.on_server(async {
            let mut conn = self.inner.conn.clone();
            if ops::release(
                &mut conn,
                &self.keys(lease.name()),
                lease.token(),
                self.tell(),
                self.next(),
            )
            .await?
            {
                Ok(())
            } else {
                Err(LockError::not_held(lease.name()))
            }
        })
        .await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.on_server(async {
            let mut conn = self.inner.conn.clone();
            ops::inspect(&mut conn, name, &self.keys(name)).await
        })
        .await
    }
}

/// Sleeps until this waiter is woken (its turn, or nobody queues: the wake-up is returned),
/// until `until` (or the `deadline`), or, when a release names it second in line, until
/// [`SECOND_STEPS_IN`] after that, when it steps in for a first waiter whose turn is over.
async fn sleep_turn<'r>(
    registration: &'r Registration,
    mut notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    mut until: Instant,
    deadline: Instant,
) -> Option<WakeUp<'r>> {
    loop {
        let second = registration.second().notified();
        tokio::select! {
            () = notified.as_mut() => return Some(registration.took_wake_up()),
            // The lock was handed over: the loop takes it.
            () = registration.granted().notified() => return None,
            () = tokio::time::sleep_until(until.min(deadline).into()) => return None,
            () = second => until = until.min(Instant::now() + SECOND_STEPS_IN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn a_hand_over_after_the_last_busy_try_is_valid_from_its_sending() {
        let sent = Instant::now();
        assert_eq!(handed_valid_from(8, Some((sent, 7)), TTL, sent), Some(sent));
        assert_eq!(
            handed_valid_from(8, Some((sent, 0)), TTL, sent + TTL / 3),
            Some(sent),
            "a counter the try did not find counts as 0"
        );
    }

    #[test]
    fn a_hand_over_the_last_busy_try_may_have_followed_is_not_trusted() {
        let sent = Instant::now();
        // The try saw the counter at the handed fence or above: the hand-over came before it,
        // and its lock may have gone to another since.
        assert_eq!(handed_valid_from(8, Some((sent, 8)), TTL, sent), None);
        assert_eq!(handed_valid_from(8, Some((sent, 9)), TTL, sent), None);
        // No busy try yet.
        assert_eq!(handed_valid_from(8, None, TTL, sent), None);
        // A try that found the lock handed and lost it again (`confirm`): nothing is trusted.
        assert_eq!(
            handed_valid_from(8, Some((sent, u64::MAX)), TTL, sent),
            None
        );
    }

    #[test]
    fn a_hand_over_long_after_the_last_busy_try_is_not_trusted() {
        let sent = Instant::now();
        assert_eq!(
            handed_valid_from(8, Some((sent, 7)), TTL, sent + TTL / 2),
            None,
            "less than half the TTL left from the try's sending"
        );
        assert_eq!(handed_valid_from(8, Some((sent, 7)), TTL, sent + TTL), None);
    }
}
