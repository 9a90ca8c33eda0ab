//! The lock operations on one Redis node (or cluster), shared by the single-server, cluster
//! and Redlock backends: each is one script, one round trip.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_core::{Fence, Lease, LockError, LockInfo, LockName, backend::LeaseToken};
use redis::{Value, aio::ConnectionLike};

use crate::{
    error::Error,
    eval::Call,
    keys::RedisKeys as Keys,
    scripts::{self, Mark},
};

/// The outcome of one acquisition try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Try {
    /// Granted with this fence, at this server time (ms since the epoch).
    Granted { fence: u64, server_ms: u64 },
    /// Held for this long (when the server said); `rank` is the caller's place in the
    /// waiters' queue (0 first), if it queues; `seen` the larger of the fence counter and the
    /// server time in µs as the try found them. `own`: held by the caller's own token, where
    /// releases do not hand locks over (Redlock: an earlier vote's grant whose answer was lost
    /// and whose undo failed; with hand-overs that is [`Try::Handed`]).
    Busy {
        pttl: Option<Duration>,
        rank: Option<u64>,
        seen: u64,
        own: bool,
    },
    /// Free, but a waiter queued earlier has its turn for this long.
    Queued {
        turn: Duration,
        rank: Option<u64>,
        seen: u64,
    },
    /// The lock holds the caller's own token already, with this fence (the counter: nothing
    /// raises it while the lock is held; `None` when the counter is gone or unreadable): a
    /// release handed it over (see [`scripts::RELEASE`]).
    Handed { fence: Option<u64> },
}

/// What a release does for the first waiter in line (see [`scripts::RELEASE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Hands the lock over to it (a single server, a cluster).
    HandOver,
    /// Starts its turn and tells it to try (a single server or a cluster whose clients do not
    /// take hand-overs).
    Turn,
    /// As [`Next::Turn`], but first takes out of the line the waiters at its head whose client
    /// no longer listens on this server (see [`scripts::ACQUIRE`]): Redlock, where one server
    /// cannot grant a majority, a turn a vote starts lasts 400 ms, and a waiter keeps one
    /// ticket for its whole wait, so one taken out of a server's line while alive gets its
    /// place back there with its next vote.
    TurnIfListening,
}

impl Next {
    fn flag(self) -> u8 {
        match self {
            Self::HandOver => 1,
            Self::Turn => 0,
            Self::TurnIfListening => 2,
        }
    }
}

/// How a try takes part in the waiters' queue (see [`scripts::ACQUIRE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queueing {
    /// When the try marks the lock as waited for.
    pub(crate) mark: Mark,
    /// How long a busy try keeps (or takes) the caller's place without another try (zero:
    /// it does not queue).
    pub(crate) place: Duration,
    /// How long the first waiter's turn lasts once the lock is free.
    pub(crate) turn: Duration,
    /// The caller's place in line, the same on every server (Redlock); 0: the server's
    /// clock when it joins.
    pub(crate) ticket: u64,
    /// The caller's client, whose release channel a release naming the caller publishes on;
    /// 0: none (the caller is not woken by push).
    pub(crate) client: u64,
    /// How a try that starts the first waiter's turn tells that waiter (see
    /// [`scripts::ACQUIRE`]); `None`: it does not.
    pub(crate) tell: Option<Tell>,
    /// Whether releases may hand the lock over to the caller ([`Next::HandOver`]): its place
    /// then records the TTL it asks for, which a release needs to hand it the lock, and a try
    /// that finds the caller's own token answers [`Try::Handed`] and leaves the queue alone.
    /// [`Next::Turn`]: no TTL is recorded, so no release hands it the lock.
    /// [`Next::TurnIfListening`]: as [`Next::Turn`], and a try that finds the lock free while
    /// others queue first takes out of the line the waiters at its head whose client no
    /// longer listens on the server.
    pub(crate) next: Next,
    /// The least fence a grant issues (0: none; see [`scripts::ACQUIRE`], which ignores one
    /// too far ahead of the server's clock): Redlock proposes its clock in µs plus a second,
    /// usually above every server's counter and clock, so that the servers of a majority
    /// issue the same fence (see `RedlockBackend`'s fences).
    pub(crate) fence_floor: u64,
}

impl Queueing {
    /// A try that does not queue.
    pub(crate) const NONE: Self = Self {
        mark: Mark::No,
        place: Duration::ZERO,
        turn: Duration::from_millis(scripts::HANDOFF_MS),
        ticket: 0,
        client: 0,
        tell: None,
        next: Next::Turn,
        fence_floor: 0,
    };

    /// A single server's (or a cluster's) waiter of `client`: `mark`, `place`, `tell` and
    /// `next` as in the fields, the server's turn and ticket.
    pub(crate) fn single(mark: Mark, place: Duration, client: u64, tell: Tell, next: Next) -> Self {
        Self {
            mark,
            place,
            client,
            tell: Some(tell),
            next,
            ..Self::NONE
        }
    }
}

/// What a busy try saw, in a reply: the larger of the fence counter and the server time in
/// µs (see [`scripts::ACQUIRE`]); `u64::MAX` when unreadable, so that no hand-over message is
/// trusted on it (see `backend::handed_valid_from`).
fn seen_at(reply: &[Value], at: usize) -> u64 {
    reply
        .get(at)
        .and_then(text)
        .and_then(|seen| seen.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The caller's rank in a reply (`-1`: not queued).
fn rank_at(reply: &[Value], at: usize) -> Option<u64> {
    reply
        .get(at)
        .and_then(int)
        .and_then(|r| u64::try_from(r).ok())
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a lease of `ttl` requested at `sent` is still inside its local deadline (see
/// [`lock_core::backend::local_deadline`]): a grant that answers later is no grant.
pub(crate) fn within_deadline(sent: Instant, ttl: Duration) -> bool {
    Instant::now() < lock_core::backend::local_deadline(sent, ttl)
}

/// The lease granted by a try, with the expiry the server reported.
pub(crate) fn lease(
    name: &LockName,
    token: &LeaseToken,
    fence: u64,
    ttl: Duration,
    server_ms: u64,
) -> Lease {
    Lease::new(name.clone(), token.clone(), Fence::new(fence), ttl)
        .with_expires_at(UNIX_EPOCH + Duration::from_millis(server_ms) + ttl)
}

/// `lease` renewed for `ttl` at this server time (ms since the epoch).
pub(crate) fn renewed(lease: &Lease, ttl: Duration, server_ms: u64) -> Lease {
    self::lease(
        lease.name(),
        lease.token(),
        lease.fence().get(),
        ttl,
        server_ms,
    )
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn shorten(mut s: String) -> String {
    if s.len() > 64 {
        let mut end = 64;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

fn foreign(name: &LockName, found: String) -> LockError {
    LockError::foreign(name.to_string(), found)
}

fn unexpected(what: &str, reply: &[Value]) -> LockError {
    LockError::backend_msg(format!("unexpected reply to {what}: {reply:?}"))
}

/// Checks that a value found under a lock key is one of ours.
fn check_ours(name: &LockName, keys: &Keys, value: &str, pttl: i64) -> Result<(), LockError> {
    if !LeaseToken::is_random_format(value) {
        return Err(foreign(
            name,
            format!(
                "key `{}` holds {:?}, not an owner token",
                keys.lock,
                shorten(value.to_owned())
            ),
        ));
    }
    if pttl == -1 {
        return Err(foreign(name, format!("key `{}` has no expiry", keys.lock)));
    }
    Ok(())
}

/// One acquisition try, taking part in the waiters' queue as `queueing` says.
pub(crate) async fn try_acquire<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &LockName,
    keys: &Keys,
    token: &LeaseToken,
    ttl: Duration,
    queueing: Queueing,
) -> Result<Try, LockError> {
    let reply: Vec<Value> = scripts::ACQUIRE
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.waiters)
        .key(&keys.queue)
        .key(&keys.places)
        .key(&keys.clients)
        .arg(token.as_str())
        .arg(millis(ttl))
        .arg(queueing.mark as u8)
        .arg(scripts::MARK_MARGIN_MS)
        .arg(millis(queueing.place))
        .arg(millis(queueing.turn))
        .arg(queueing.ticket)
        .arg(queueing.client)
        .arg(queueing.tell.map_or("", |_| keys.channel.as_str()))
        .arg(queueing.tell.map_or("", Tell::command))
        .arg(queueing.next.flag())
        .arg(queueing.fence_floor)
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("acquire", e))?;
    match reply.first().and_then(int) {
        Some(1) => {
            let fence = reply
                .get(1)
                .and_then(int)
                .and_then(|f| u64::try_from(f).ok());
            let server_ms = reply
                .get(2)
                .and_then(int)
                .and_then(|t| u64::try_from(t).ok());
            match (fence, server_ms) {
                (Some(fence), Some(server_ms)) => Ok(Try::Granted { fence, server_ms }),
                _ => Err(unexpected("acquire", &reply)),
            }
        }
        Some(0) => {
            let pttl = reply.get(1).and_then(int).unwrap_or(-2);
            let value = reply.get(2).and_then(text).unwrap_or_default();
            check_ours(name, keys, &value, pttl)?;
            let pttl = u64::try_from(pttl).ok().map(Duration::from_millis);
            Ok(Try::Busy {
                pttl,
                rank: rank_at(&reply, 3),
                seen: seen_at(&reply, 4),
                own: value == token.as_str(),
            })
        }
        Some(2) => Err(reported(name, keys, &reply)),
        Some(3) => {
            let turn = reply
                .get(1)
                .and_then(int)
                .and_then(|ms| u64::try_from(ms).ok())
                .ok_or_else(|| unexpected("acquire", &reply))?;
            Ok(Try::Queued {
                turn: Duration::from_millis(turn),
                rank: rank_at(&reply, 2),
                seen: seen_at(&reply, 3),
            })
        }
        Some(4) => Ok(Try::Handed {
            fence: reply
                .get(1)
                .and_then(text)
                .and_then(|fence| fence.parse().ok()),
        }),
        _ => Err(unexpected("acquire", &reply)),
    }
}

/// Keeps a waiter's place for `place` more without a vote (see [`scripts::KEEP`]; `turn` is
/// the longest turn): its place in line and how long the turn it found running lasts, or
/// `None` when it should vote at once instead.
pub(crate) async fn keep_place<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &Keys,
    token: &LeaseToken,
    place: Duration,
    turn: Duration,
) -> Result<Option<(u64, Option<Duration>)>, LockError> {
    let reply: Vec<i64> = scripts::KEEP
        .key(&keys.lock)
        .key(&keys.queue)
        .key(&keys.places)
        .key(&keys.clients)
        .arg(token.as_str())
        .arg(millis(place))
        .arg(millis(turn))
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("keep a place", e))?;
    let (Some(&rank), Some(&turn)) = (reply.first(), reply.get(1)) else {
        return Err(LockError::backend_msg(format!(
            "redis answered a kept place with {reply:?}"
        )));
    };
    let turn = u64::try_from(turn).ok().map(Duration::from_millis);
    Ok(u64::try_from(rank).ok().map(|rank| (rank, turn)))
}

/// Takes a waiter that gives up out of the queue; with [`Next::HandOver`], also releases a
/// lock handed to it meanwhile, telling the next waiters as `tell` says (see
/// [`scripts::LEAVE`]).
pub(crate) async fn leave<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &Keys,
    token: &LeaseToken,
    tell: Tell,
    next: Next,
) -> Result<(), LockError> {
    let _: i64 = scripts::LEAVE
        .key(&keys.queue)
        .key(&keys.places)
        .key(&keys.clients)
        .key(&keys.lock)
        .key(&keys.waiters)
        .key(&keys.fence)
        .arg(token.as_str())
        .arg(&keys.channel)
        .arg(scripts::HANDOFF_MS)
        .arg(tell.command())
        .arg(next.flag())
        .arg(scripts::MARK_MARGIN_MS)
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("leave the queue", e))?;
    Ok(())
}

/// The error for a script's `{2, which, what}`: a key holds something this library did not
/// write.
fn reported(name: &LockName, keys: &Keys, reply: &[Value]) -> LockError {
    let which = reply.get(1).and_then(text).unwrap_or_default();
    let what = reply.get(2).and_then(text).unwrap_or_default();
    let key = if which == "fence" {
        &keys.fence
    } else {
        &keys.lock
    };
    foreign(name, format!("key `{key}` holds {:?}", shorten(what)))
}

/// Raises the fence counter of `keys` to at least `fence` (see [`scripts::RAISE`]).
pub(crate) async fn raise_fence<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &LockName,
    keys: &Keys,
    fence: u64,
) -> Result<(), LockError> {
    let reply: Vec<Value> = scripts::RAISE
        .key(&keys.fence)
        .arg(fence)
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("raise the fence", e))?;
    match reply.first().and_then(int) {
        Some(1) => Ok(()),
        Some(2) => Err(reported(name, keys, &reply)),
        _ => Err(unexpected("raise the fence", &reply)),
    }
}

/// Renews if the key holds `token` ([`scripts::RENEW_MANY`] of one lease): the server time
/// in ms, or `None` when it is not ours.
pub(crate) async fn renew<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &Keys,
    token: &LeaseToken,
    ttl: Duration,
) -> Result<Option<u64>, LockError> {
    let reply: Vec<Value> = scripts::RENEW_MANY
        .key(&keys.lock)
        .arg(token.as_str())
        .arg(millis(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("renew", e))?;
    match reply.as_slice() {
        [one] => Ok(renewed_at(one)),
        _ => Err(unexpected("renew", &reply)),
    }
}

/// What a batched renewal of `leases` sends for each (its keys as `keys` makes them, its token,
/// its TTL), or `None` when a lease has a TTL the server must not see (zero would delete its
/// key): such a batch goes one renewal at a time, so each answers its own TTL's error and
/// nothing of a bad one is sent.
pub(crate) fn renewal_batch(
    leases: &[Lease],
    keys: impl Fn(&LockName) -> Keys,
) -> Option<Vec<(Keys, &LeaseToken, Duration)>> {
    if leases
        .iter()
        .any(|l| lock_core::backend::validate_ttl(l.ttl()).is_err())
    {
        return None;
    }
    Some(
        leases
            .iter()
            .map(|l| (keys(l.name()), l.token(), l.ttl()))
            .collect(),
    )
}

/// Renewals of many leases, ready to send to a server: calls of [`scripts::RENEW_MANY`] of
/// up to [`scripts::RENEW_MANY_CHUNK`] leases each. Built once, they can go to several
/// servers (Redlock's). They are sent one call after the other, each a request of its own
/// that the connection's response time-out bounds (a pipeline of all of them would be one
/// request, whose time grows with the batch): 20 round trips for 10,000 leases.
pub(crate) struct Renewals {
    /// Each call, with its number of leases.
    calls: Vec<(Call<'static>, usize)>,
}

impl Renewals {
    /// The renewals of `batch`.
    pub(crate) fn new(batch: &[(Keys, &LeaseToken, Duration)]) -> Self {
        let calls = batch
            .chunks(scripts::RENEW_MANY_CHUNK)
            .map(|chunk| {
                let call =
                    chunk
                        .iter()
                        .fold(scripts::RENEW_MANY.call(), |call, (keys, token, ttl)| {
                            call.key(&keys.lock).arg(token.as_str()).arg(millis(*ttl))
                        });
                (call, chunk.len())
            })
            .collect();
        Self { calls }
    }

    /// Sends them on `conn`, each call within `timeout` when one is given: one reply per
    /// lease, in order. A server that does not know the script yet (a fresh or restarted
    /// server) gets its source (see [`crate::eval`]).
    ///
    /// # Errors
    /// The first call that failed or timed out: the server's answers to the others are not
    /// used.
    pub(crate) async fn send<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        timeout: Option<Duration>,
    ) -> Result<Vec<Value>, LockError> {
        let mut replies = Vec::with_capacity(self.calls.iter().map(|(_, n)| n).sum());
        for (call, leases) in &self.calls {
            let reply = crate::error::within_limit(
                timeout,
                "batched renew",
                call.invoke_async::<Vec<Value>>(conn),
            )
            .await?;
            if reply.len() != *leases {
                return Err(LockError::backend_msg(format!(
                    "redis answered {leases} batched renewals with {} replies",
                    reply.len()
                )));
            }
            replies.extend(reply);
        }
        Ok(replies)
    }
}

/// How a release tells each waiter it names, on its client's own channel (see
/// [`scripts::RELEASE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tell {
    /// `PUBLISH` (one server).
    Publish,
    /// `SPUBLISH`, on a shard channel (a cluster).
    ShardPublish,
}

impl Tell {
    /// The command that publishes.
    fn command(self) -> &'static str {
        match self {
            Self::Publish => "PUBLISH",
            Self::ShardPublish => "SPUBLISH",
        }
    }
}

/// Releases if the key holds `token`; true when it did. The first waiter in line is seen to
/// as `next` says, and waiters are told as `tell` says.
pub(crate) async fn release<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &Keys,
    token: &LeaseToken,
    tell: Tell,
    next: Next,
) -> Result<bool, LockError> {
    let released: i64 = scripts::RELEASE
        .key(&keys.lock)
        .key(&keys.waiters)
        .key(&keys.queue)
        .key(&keys.places)
        .key(&keys.clients)
        .key(&keys.fence)
        .arg(token.as_str())
        .arg(&keys.channel)
        .arg(scripts::HANDOFF_MS)
        .arg(tell.command())
        .arg(next.flag())
        .arg(scripts::MARK_MARGIN_MS)
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("release", e))?;
    Ok(released == 1)
}

/// Who holds the lock on this node.
pub(crate) async fn inspect<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &LockName,
    keys: &Keys,
) -> Result<Option<LockInfo>, LockError> {
    let reply: Vec<Value> = scripts::INSPECT
        .key(&keys.lock)
        .key(&keys.fence)
        .invoke_async(conn)
        .await
        .map_err(|e| Error::new("inspect", e))?;
    let kind = reply.first().and_then(text).unwrap_or_default();
    match kind.as_str() {
        "none" => return Ok(None),
        "string" => {}
        other => return Err(foreign(name, format!("key `{}` is a {other}", keys.lock))),
    }
    let value = reply.get(1).and_then(text).unwrap_or_default();
    let pttl = reply.get(2).and_then(int).unwrap_or(-2);
    if pttl == -2 {
        return Ok(None);
    }
    check_ours(name, keys, &value, pttl)?;
    let fence = reply
        .get(3)
        .and_then(int)
        .and_then(|f| u64::try_from(f).ok())
        .filter(|f| *f <= scripts::MAX_FENCE)
        .ok_or_else(|| {
            foreign(
                name,
                format!(
                    "key `{}` is held but its fence counter is not a fence of this library",
                    keys.fence
                ),
            )
        })?;
    Ok(Some(LockInfo::new(
        name.clone(),
        LeaseToken::from_store(value),
        Fence::new(fence),
        u64::try_from(pttl).ok().map(Duration::from_millis),
    )))
}

/// The parse of one lease's reply to a batched renewal.
pub(crate) fn renewed_at(reply: &Value) -> Option<u64> {
    int(reply)
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|ms| *ms > 0)
}

/// Now, as a fallback server time when none was returned.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or_default()
}
