//! [`RedlockBackend`]: Redlock over N independent Redis servers.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures::future::join_all;
use lock_core::{
    Capabilities, Clock, Expiry, Failover, Fencing, Lease, LockBackend, LockError, LockInfo,
    LockName, WaitOrder, Wakeup,
    backend::{AcquireRequest, Grant, LeaseToken, async_trait},
};
use redis::Value;

use crate::{
    RedlockConfig,
    connection::Conn,
    error::timed_out,
    keys::RedisKeys as Keys,
    ops::{self, Next, Queueing, Tell, Try},
    scripts::Mark,
};

mod patience;
mod wakeups;

use patience::{Answered, Patience};
use wakeups::Wakeups;

/// Redlock: a lock is held when a majority (N/2 + 1) of N independent servers granted it
/// within its validity.
///
/// - Requests go to every server in parallel, each bounded by the client's patience (the
///   per-server time-out while a majority answers within half of it, up to four times it
///   while a majority answers later: `redlock/patience.rs`); the lock is valid for
///   `ttl - elapsed - drift` with `drift = ttl * 0.01 + 2 ms`, and the lease's local deadline
///   is computed the same way.
/// - A failed attempt releases where it was granted, where no answer came (a timed-out
///   server may have granted) and where its own token is held already (an earlier grant whose
///   answer was lost), not where another's hold refused it, then
///   retries after a random delay: `lock_core::backend::poll_until_acquired`'s jittered back-off,
///   bounded by the holder's TTL and the wait budget.
/// - Renewal must reach a majority within the validity.
/// - **Fences are best effort**. Each server proposes `max(its counter + 1, its clock in µs,
///   the client's floor)` (the acquire script of the single-server backend; the floor is the
///   client's clock in µs plus a second); the fence is the highest proposal of the granting
///   majority, and it is written back to that majority (`SET fence max(cur, F)`) before the
///   grant is returned, unless every server of the majority proposed that same fence (the
///   floor was above their counters and clocks, the usual case): each wrote it to its own
///   counter already, so an uncontended acquisition is one round of votes, not two. Any two
///   majorities share a server, so while servers keep their counters every fence is above
///   every earlier one, whichever servers granted.
///   Fences can still repeat or go back only when servers **lose their counters** (a restart
///   without persistence, an eviction, `FLUSHALL`): when every server the next majority shares
///   with the last one lost its counter, the next fence comes from the other servers' counters
///   and from clocks, and repeats if those are behind the last fence (for example when a
///   server whose clock runs ahead made it, or a client whose clock runs ahead proposed it:
///   a floor counts when it is at most 5 s ahead of the server's clock). Use persistence
///   (`appendonly yes`, `appendfsync always`) and synchronized clocks, the clients' included,
///   where fencing must hold, or a backend whose capabilities say `Strict`.
/// - **Mutual exclusion across a restart** (`Failover::Quorum`) needs what the Redlock
///   algorithm asks of operators: a server restarted without persistence has forgotten the
///   locks it granted, so it must stay down for at least the longest TTL in use before it
///   rejoins (a *delayed restart*). Otherwise a majority made of it and the servers that never
///   granted can grant a lock that is still held elsewhere.
/// - **Waiting is in line, woken by the servers** (capabilities say `Push` and
///   [`WaitOrder::Fair`]). A waiter whose first vote is refused queues on every server under
///   one ticket, its clock in µs at that moment, so every server orders the same waiters alike;
///   a lock that is free is granted only to the first in line on that server, so a majority
///   goes to the oldest waiter, and a client that releases and votes again goes behind the
///   others. The waiter subscribes to its release channel on every server (one pub/sub
///   connection per server and client: `redlock/wakeups.rs`); each server's release names
///   its first two waiters, and the first votes once a majority of servers' messages reached
///   it, or 5 ms after the first one did (a vote on the first message alone found the lock
///   still held where the release had not come yet: 16 clients holding 1 ms, three alternating
///   runs, 277, 274, 269 acquisitions/s before, 314, 304, 307 after, hand-off p99 3.7-3.8 ms
///   before, 2.0-2.3 ms after). While
///   a majority of its subscriptions is confirmed, a waiter polls only to keep its place (the
///   first two in line when the holder's time or the first waiter's turn runs out, else
///   every 187-250 ms; those further back every 0.75-1 s, and from ninth in line on every
///   2.25-3 s, the first time 1.95-2.7 s after a vote, by a lighter call than a vote); without
///   them, the first and second in line vote every `backoff.min` (jittered), the ones further
///   back more slowly, about every 250 ms at most (jittered up to 312 ms). A place lasts 3 s
///   without another vote, and the first in line has 100 ms after a release that named it
///   (400 ms after a turn a vote started) to come once the lock is free: a waiter that is
///   paused holds the lock back for at most that long (the second in line, named too, votes
///   when that turn is over; two paused at the head, up to about 1.4 s, as a waiter further
///   back that moves up unnamed votes within 1 s, or calls within 3 s from ninth on, or right
///   after a turn it found running). A waiter that died (its pub/sub connection
///   to a server closed) gets no turn there: a vote records a waiter's client only on the
///   servers where its subscription is confirmed, and a release, or a vote on the free lock,
///   first takes out of that server's line the waiters at its head whose recorded client no
///   longer listens on it (`PUBSUB NUMSUB`), and names the live ones behind them (fault case
///   `redlock_dead_waiters_ahead_cost_no_turn`: behind two dead waiters, 1.28 s before, well
///   within one turn now). A live waiter whose connection to one server only dropped gets its
///   place back there, under its ticket, with its next vote. The order is the waiters'
///   clocks' order, so clients whose clocks disagree by `d` can pass each other within `d`
///   (fair, not FIFO). A message wakes the waiter it names, not another waiter of the same
///   client on the same lock.
#[derive(Debug, Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Conn>,
    config: RedlockConfig,
    /// Release messages from every server (see [`wakeups`]).
    wakeups: Wakeups,
    /// How long each server's answer is waited for (see [`Patience`]).
    patience: Patience,
}

/// The answer of one server to one request.
type Vote<T> = Result<T, LockError>;

/// `call`'s answer if it comes within `each` (else a time-out error for `what`), and what it
/// teaches the client's [`Patience`].
async fn bounded<T>(
    each: Duration,
    what: &'static str,
    call: impl Future<Output = Vote<T>>,
) -> (Vote<T>, Answered) {
    let sent = Instant::now();
    match tokio::time::timeout(each, call).await {
        Ok(vote @ (Ok(_) | Err(LockError::Foreign { .. }))) => (vote, Answered::In(sent.elapsed())),
        Ok(vote) => (vote, Answered::Failed),
        Err(_) => (Err(timed_out(what)), Answered::Late),
    }
}

/// How long [`RedlockBackend::on`] waits for each server, and whether the answers teach the
/// client's [`Patience`] (when every server was asked).
#[derive(Debug, Clone, Copy)]
struct Bound {
    each: Duration,
    learn: bool,
}

/// How long the first waiter's turn lasts once the lock is free: a waiter that is paused holds
/// the line up for at most this long (one that died is taken out of the line before its
/// turn, see `scripts::drop_deaf_heads`).
const TURN: Duration = Duration::from_millis(400);

/// How long a waiter's place lasts on a server without another vote from it (a dead
/// waiter's place far back in the line goes after this; at the head its turn cuts it to
/// [`TURN`]).
const PLACE: Duration = Duration::from_secs(3);

/// About the longest a queued waiter sleeps between votes (see [`Wait::delay`]; polling
/// without push, jitter takes it up to 1.25 times this), but for subscribed waiters further
/// back than second (see [`PLACE_KEPT`]): inside [`TURN`], so a waiter that became first
/// while asleep still comes within a turn a vote started (and well inside [`PLACE`]). Without
/// push, the first two in line vote much more often.
const QUEUED_POLL_MAX: Duration = Duration::from_millis(250);

/// How often a queued waiter with push wake-ups that is neither first nor second in line
/// votes, at most (jitter takes it down to 0.75 times this): only to keep its place, a third of
/// [`PLACE`]. At [`QUEUED_POLL_MAX`], as the first two poll, every waiting client voted four
/// to five times a second on every server to keep a place it could not use yet (fault case
/// `redlock_waiters_far_back_vote_seldom`). A waiter that moves up while asleep without a
/// release naming it (those ahead gave up or died, which tells nobody) is told by each server
/// where another's vote starts its [`TURN`] (see [`scripts::ACQUIRE`]; fault case
/// `redlock_waiter_hears_the_turn_another_vote_starts`: 854, 881 and 907 ms after that vote,
/// past its turn, before the servers told it). A lost message costs it up to this long (up to
/// [`PLACE_KEPT_FAR`] from [`FAR_BACK`] on): it may then lose that turn to a waiter behind it,
/// and on its next call rejoins at the head under its ticket (so nobody starves).
const PLACE_KEPT: Duration = Duration::from_secs(1);

/// From which place in line (0 first) a queued waiter with push wake-ups only keeps its place, with
/// [`scripts::KEEP`] rather than a vote, every 0.75 to 1 times [`PLACE_KEPT_FAR`], for
/// [`PLACE_FAR`] (and by a vote when its subscriptions changed since its last vote, which records
/// its client where they are confirmed). A vote's place lasts [`PLACE`], so the first call after a
/// vote comes [`PLACE_MARGIN`] before it ends, at the latest (a call that comes after a place
/// lapsed revives it, or, if a vote swept it out meanwhile, votes and rejoins under its ticket).
/// Calling within [`PLACE_KEPT`] of a vote instead cost more than it saved: with 1,000 separate
/// clients, 536 to 964 server commands per acquisition against 377 to 581 without it (six
/// alternating runs each). When the call finds the lock free during a turn, the waiter calls again
/// (`KEEP` again, not a vote) 1 to 10 ms after that turn ends, which votes if the lock is still
/// free and the turn's waiter's place ran out (paused, as at the head of fault case
/// `redlock_waiter_behind_paused_ones_takes_a_lock_left_free`; fault case
/// `redlock_waiter_deep_in_line_follows_a_turn_it_found`). With a vote there and the first call
/// within [`PLACE_KEPT`] of a vote, the same benchmark ran 671 to 812 commands per acquisition
/// (four runs); these runs do not tell the two rules' costs apart. The waiters nearer the head go
/// on voting (the first two every [`QUEUED_POLL_MAX`], the others every [`PLACE_KEPT`]): their
/// votes start the first one's turn when the lock is free and nobody else came, keep the waiter
/// mark by which releases publish, and take dead waiters out of the line. A waiter learns its place
/// at each call; one that moved up further than it knows (the line moves on at every hand-off) is
/// named by the releases once it is among the first two. With 1,000 separate clients holding 1 ms,
/// the servers ran 637 to 1,019 commands per acquisition when every waiter further back than second
/// voted every 0.75-1 s, 331 to 431 with this (four alternating runs each; 326 to 328 with 16
/// clients either way).
const FAR_BACK: u64 = 8;

/// How often a waiter at [`FAR_BACK`] or further back keeps its place, at most (jitter takes it
/// down to 0.75 times this). When every waiter nearer the head than it knows is paused, the
/// lock can stay free this long before its call finds it free and it votes (which starts the
/// first one's turn); with fewer waiters in line than [`FAR_BACK`] nobody waits this long.
const PLACE_KEPT_FAR: Duration = Duration::from_secs(3);

/// How long before a vote's [`PLACE`] ends a waiter at [`FAR_BACK`] or further back keeps it with
/// its first [`scripts::KEEP`], at least, for the sleep's and the call's own time: that call is
/// sent 1.95 to 2.7 s after the vote was ([`PLACE`] less this, less up to a quarter of
/// [`PLACE_KEPT_FAR`], as spread as the other calls; counted from the vote's sending, so the time
/// its answers and a release round after it took comes out of it), not 2.25 to 3 s as the later
/// ones. A call that came after the place ended found it gone if a vote swept the line meanwhile;
/// the waiter then rejoined under its ticket, and one that had moved up to the head without knowing
/// lost that turn. 1,000 separate clients holding 1 ms ran 357 to 727 server commands per
/// acquisition with this (eight runs with a count), 385 to 754 before (sixteen runs alternating
/// with them and with a 2.25 to 2.7 s window; unit test
/// `far_back_keeps_a_voted_place_before_it_ends`).
const PLACE_MARGIN: Duration = Duration::from_millis(300);

/// How long a place kept by [`scripts::KEEP`] lasts: three of its calls, as [`PLACE`] is
/// three votes of [`PLACE_KEPT`]. A waiter that died far back keeps its place this long; once
/// at the head it costs no turn (its client no longer listens, see
/// `scripts::drop_deaf_heads`).
const PLACE_FAR: Duration = Duration::from_secs(9);

/// The shortest wait for a majority of pub/sub subscriptions in a waiter's first round (the
/// per-server time-out is shorter than a connection takes to open).
const SUBSCRIBE_MIN: Duration = Duration::from_millis(200);

/// This waiter's place in line: the client's clock in µs when it starts to queue, the same on
/// every server (see [`crate::scripts::ACQUIRE`]).
fn ticket() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| {
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
    })
}

/// How far above the client's clock the fence floor of a vote is (see [`fence_floor`]).
const FLOOR_AHEAD: Duration = Duration::from_secs(1);

/// The fence floor a vote proposes to every server: the client's clock in µs plus
/// [`FLOOR_AHEAD`], usually above the servers' clocks when the vote reaches them (unless one
/// runs that much ahead of the client's) and, as time passes, above the counters the grants
/// before it left. Then every server of a granting majority issues this same fence and no
/// write-back round is needed. A server whose counter or clock is above it issues its own
/// (so does one that ignores it, see `scripts::ACQUIRE`), and the fence is written back as
/// before. 0 (no floor) when the clock reads before 1970 or the floor would reach 2^53.
fn fence_floor() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|now| now.checked_add(FLOOR_AHEAD))
        .and_then(|floor| u64::try_from(floor.as_micros()).ok())
        .filter(|&floor| floor < crate::scripts::MAX_FENCE)
        .unwrap_or(0)
}

/// What a vote that was not granted, or a [`scripts::KEEP`] call, heard: how long the holder
/// (or the first waiter's turn) lasts at least, and this waiter's best place in line.
#[derive(Debug, Default)]
struct Wait {
    holder_left: Option<Duration>,
    rank: Option<u64>,
    /// A server found the lock free during the first waiter's turn (`holder_left` is then at
    /// most that turn's end).
    turn: bool,
    /// When the vote that heard this was sent (its places last [`PLACE`] from about then);
    /// `None` when [`scripts::KEEP`] heard it (its places last [`PLACE_FAR`]).
    voted: Option<Instant>,
    /// Too few servers answered the vote for a majority: why, as the error a wait that ends
    /// now answers (the store may be down, so not a time-out).
    unanswered: Option<LockError>,
}

impl Wait {
    /// The answer of a wait whose budget is spent after this vote: `Unavailable` when too few
    /// servers answered it, else a time-out.
    fn spent(self, request: &AcquireRequest) -> LockError {
        self.unanswered.unwrap_or_else(|| request.timeout_error())
    }

    fn heard(&mut self, left: Option<Duration>, rank: Option<u64>) {
        self.holder_left = match (self.holder_left, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.rank = match (self.rank, rank) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// How long to wait before the next call (a vote, or `KEEP`). A queued waiter polls at `base`
    /// when first or second in line, and `rank` times slower further back (up to
    /// [`QUEUED_POLL_MAX`]), so the one whose turn comes next notices the release soon while a long
    /// queue costs the servers little; with jitter, so waiters do not vote in step. With `push`
    /// (releases tell this waiter), a queued waiter polls only to keep its place: the first two
    /// right after the holder's time or the first waiter's turn runs out, else every 0.75 to 1
    /// times [`QUEUED_POLL_MAX`]; those further back every 0.75 to 1 times [`PLACE_KEPT`], and from
    /// [`FAR_BACK`] on every 0.75 to 1 times [`PLACE_KEPT_FAR`], the first time after a vote
    /// [`PLACE_MARGIN`] or more before that vote's place ends (a release that names one of them
    /// wakes it). A waiter that did not queue (no server took its place) backs off by `step`, up to
    /// the holder's expiry.
    fn delay(&self, step: Duration, base: Duration, push: bool) -> Duration {
        match self.rank {
            // Further back, only the place needs keeping: a release names the first two, a
            // vote that starts the first's turn names it (see `PLACE_KEPT`). But when the lock
            // was free during a turn, right after it: the first may not come (paused), and
            // nobody else may vote then.
            Some(rank) if push && rank >= 2 => {
                let every = if rank >= FAR_BACK {
                    PLACE_KEPT_FAR
                } else {
                    PLACE_KEPT
                };
                // The first `KEEP` after a vote comes before that vote's place ends; spread
                // as widely as every other call (a quarter of `every`).
                let latest = self.voted.map_or(every, |sent| {
                    let by = PLACE.saturating_sub(PLACE_MARGIN);
                    every.min(by.saturating_sub(sent.elapsed()))
                });
                let keep = rand::random_range(latest.saturating_sub(every / 4)..=latest);
                match self.holder_left {
                    // Spread over 1-10 ms, so the waiters that saw one turn do not all call at
                    // its end at once.
                    Some(left) if self.turn => {
                        keep.min(left + Duration::from_millis(rand::random_range(1..=10)))
                    }
                    _ => keep,
                }
            }
            Some(_) if push => match self.holder_left {
                // Not later than the expiry it was told: nobody tells it of that.
                Some(left) if left < QUEUED_POLL_MAX => left + Duration::from_millis(1),
                _ => QUEUED_POLL_MAX.mul_f64(rand::random_range(0.75..1.0)),
            },
            Some(rank) => {
                let slower = u32::try_from(rank.max(1)).unwrap_or(u32::MAX);
                let poll = base.saturating_mul(slower).min(QUEUED_POLL_MAX);
                poll.mul_f64(rand::random_range(0.75..1.25))
            }
            None => self
                .holder_left
                .map_or(step, |left| step.min(left + Duration::from_millis(1))),
        }
    }
}

/// A waiter's place in the queues: taken out on every server in the background when the
/// acquisition ends, whether it got the lock (the granting servers took it out already; the
/// others still have it) or not (timed out, failed, or dropped).
struct Queued<'a> {
    backend: RedlockBackend,
    keys: &'a Keys,
    token: &'a LeaseToken,
    /// A vote may have taken a place (nothing to take out otherwise).
    taken: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.taken {
            return;
        }
        let (backend, keys, token) = (self.backend.clone(), self.keys.clone(), self.token.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let keys = &keys;
                let token = &token;
                backend
                    .everywhere("leave the queue", |mut conn| async move {
                        ops::leave(&mut conn, keys, token, Tell::Publish, Next::TurnIfListening)
                            .await
                    })
                    .await;
            });
        }
    }
}

impl RedlockBackend {
    /// Sets up connections to every server and opens those it can within the connection
    /// time-out (the per-server time-out, at least 200 ms): a server that is down does not
    /// fail it, its connection is made on first use (so a minority may be down). Opening them
    /// here keeps connecting out of the first operation's per-server time-out (50 ms by
    /// default): an admin `list` of a fresh backend once found every server's scan timed out
    /// while the machine was busy (the conformance suite, in a full test run).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a bad configuration or URL.
    ///
    /// # Cancel safety
    /// Dropping the future drops the connections made so far; nothing is held anywhere. A
    /// reconnection the client library began for a server that refused the warm-up may still
    /// finish, and close, within about twice the connection time-out.
    pub async fn connect(config: RedlockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let connecting = config.node_timeout.max(Duration::from_millis(200));
        // At least twice the longest patience: the client's own bound comes first.
        let answer = connecting.max(config.longest_wait().saturating_mul(2));
        let nodes = config
            .urls
            .iter()
            .map(|url| Conn::lazy_single(url, connecting, answer))
            .collect::<Result<Vec<_>, _>>()?;
        // A server that does not answer in time is left to connect on first use.
        join_all(nodes.iter().map(|node| {
            let mut node = node.clone();
            async move {
                let ping = redis::cmd("PING");
                drop(tokio::time::timeout(connecting, ping.query_async::<()>(&mut node)).await);
            }
        }))
        .await;
        // Each pub/sub step as long as the longest wait for an answer: a subscription to a
        // server further away than the time-out is confirmed, as a vote there is waited for.
        let wakeups = Wakeups::new(&config.urls, connecting.max(config.longest_wait()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                nodes,
                patience: Patience::new(config.node_timeout, config.longest_wait()),
                config,
                wakeups,
            }),
        })
    }

    /// What every Redlock backend declares (its [`LockBackend::capabilities`]): best-effort
    /// fences, TTL expiry judged by the clients' clocks, waiters woken by the servers and
    /// served fairly, a quorum.
    pub const DECLARED: Capabilities = Capabilities::new(
        Fencing::BestEffort,
        Expiry::Ttl,
        Wakeup::Push,
        WaitOrder::Fair,
        Clock::Client,
    )
    .with_portable_lease(true)
    .with_failover(Failover::Quorum);

    pub(crate) fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.inner.config.key_prefix, name)
    }

    /// How long each server's answer is waited for now (see [`Patience`]).
    pub(crate) fn patience(&self) -> Duration {
        self.inner.patience.get()
    }

    /// The client's current patience, learning from the answers.
    fn learning(&self) -> Bound {
        Bound {
            each: self.patience(),
            learn: true,
        }
    }

    /// The key prefix.
    pub(crate) fn key_prefix(&self) -> &str {
        &self.inner.config.key_prefix
    }

    pub(crate) fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    /// Runs `op` on every server in parallel, each within the client's [`Patience`], which
    /// learns from the answers.
    pub(crate) async fn everywhere<T, F, Fut>(&self, what: &'static str, op: F) -> Vec<Vote<T>>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        self.on(
            self.inner.nodes.iter(),
            what,
            |_, conn| op(conn),
            self.learning(),
        )
        .await
    }

    /// Like [`Self::everywhere`], for a batch: `op` sends several requests to a server, one
    /// after the other, and bounds each by the client's patience itself (a batch of
    /// thousands takes longer than one request, and as long as this process is slow).
    pub(crate) async fn everywhere_batched<T, F, Fut>(&self, op: F) -> Vec<Vote<T>>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        join_all(self.inner.nodes.iter().map(|conn| op(conn.clone()))).await
    }

    /// Runs `op` on `nodes` in parallel, each within `bound`; `op` is told each server's place
    /// among `nodes`.
    async fn on<'a, T, F, Fut>(
        &self,
        nodes: impl Iterator<Item = &'a Conn>,
        what: &'static str,
        op: F,
        bound: Bound,
    ) -> Vec<Vote<T>>
    where
        F: Fn(usize, Conn) -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        let answers = join_all(
            nodes
                .enumerate()
                .map(|(i, conn)| bounded(bound.each, what, op(i, conn.clone()))),
        )
        .await;
        if bound.learn {
            self.learn(bound.each, &answers);
        }
        answers.into_iter().map(|(vote, _)| vote).collect()
    }

    /// Teaches the client's [`Patience`] the answers of one request that waited `each` for
    /// each server, when every server was asked.
    fn learn<T>(&self, each: Duration, answers: &[(Vote<T>, Answered)]) {
        if answers.len() == self.inner.nodes.len() {
            let answered: Vec<Answered> = answers.iter().map(|(_, answered)| *answered).collect();
            self.inner.patience.observe(each, &answered, self.quorum());
        }
    }

    pub(crate) async fn release_everywhere(
        &self,
        keys: &Keys,
        token: &LeaseToken,
    ) -> Vec<Vote<bool>> {
        self.release_on(self.inner.nodes.iter(), keys, token, self.learning())
            .await
    }

    /// Releases `token`'s hold on `nodes`, each within `bound` (none: nothing is
    /// sent). A vote that is not granted is undone where it may hold the lock: the servers that
    /// granted it, those that did not answer (they may have granted: fault case
    /// `redlock_unanswered_vote_is_undone_there`), and those that answered busy with this token (an
    /// earlier vote's grant, left when its answer was lost and its undo failed: fault case
    /// `redlock_failed_vote_undoes_its_own_earlier_grant`); not one busy with another's key, where
    /// a release does nothing (fault case `redlock_minority_grant_is_undone_only_where_granted`).
    async fn release_on<'a>(
        &self,
        nodes: impl Iterator<Item = &'a Conn>,
        keys: &Keys,
        token: &LeaseToken,
        bound: Bound,
    ) -> Vec<Vote<bool>> {
        self.on(
            nodes,
            "release",
            |_, mut conn| async move {
                // Each server tells the clients of the first two waiters it names (see
                // `wakeups`).
                ops::release(&mut conn, keys, token, Tell::Publish, Next::TurnIfListening).await
            },
            bound,
        )
        .await
    }

    /// Waits in line after a first vote that was refused (`wait`), voting with `queueing`
    /// (which keeps this waiter's place) until a majority grants the lock or the budget is
    /// spent. Its subscriptions start now.
    async fn wait_in_line(
        &self,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
        queueing: Queueing,
        mut wait: Wait,
    ) -> Result<Grant, LockError> {
        // Dropped (unsubscribed) when this returns, before `acquire` takes the place out. The
        // subscriptions start now; the first vote here, right away, waits for a majority of
        // them, within the connection time-out and the budget; later votes only look whether
        // they came through since.
        let listening = self.inner.wakeups.listen(&keys.channel, token.as_str());
        listening.start();
        let mut subscribe_wait = Some(self.inner.config.node_timeout.max(SUBSCRIBE_MIN));
        let mut armed = None;
        let mut push = false;
        // Where the last vote made with push recorded this waiter's client (by which releases
        // name it): the servers where its subscription was confirmed. A place kept with `KEEP`
        // records nothing, so a waiter whose subscriptions changed since votes instead.
        let mut recorded: Option<Vec<bool>> = None;
        let mut delays = request.backoff().delays();
        loop {
            let now = Instant::now();
            let deadline = request.deadline();
            if now >= deadline {
                return Err(wait.spent(request));
            }
            let until = if subscribe_wait.is_some() {
                // The first queued vote goes right away: it waits for the subscriptions.
                now
            } else {
                let step = delays.next().unwrap_or(request.backoff().max);
                (now + wait.delay(step, request.backoff().min, push)).min(deadline)
            };
            let named = wakeups::sleep(armed.take(), until, deadline, self.quorum()).await;
            // A budget spent during the sleep ends the wait without another vote, unless a
            // release just named this waiter (fault case
            // `redlock_waiter_does_not_vote_after_its_budget`).
            if !named && Instant::now() >= deadline {
                return Err(wait.spent(request));
            }
            let far_back = wait.rank.is_some_and(|rank| rank >= FAR_BACK);
            let subscribe_by = match subscribe_wait.take() {
                Some(wait) => Instant::now()
                    .checked_add(wait)
                    .map_or(deadline, |by| by.min(deadline)),
                None => Instant::now(),
            };
            push = listening.ensure(self.quorum(), subscribe_by).await;
            armed = Some(listening.arm());
            let queueing = if push {
                Queueing {
                    mark: Mark::WhenBusy,
                    client: self.inner.wakeups.id(),
                    ..queueing
                }
            } else {
                queueing
            };
            let subscribed = push.then(|| listening.subscribed());
            if push
                && recorded == subscribed
                && far_back
                && !named
                && let Some(kept) = self.keep_place(keys, token).await
            {
                wait = kept;
                continue;
            }
            recorded.clone_from(&subscribed);
            match self
                .vote(request, keys, token, (queueing, subscribed.as_deref()))
                .await?
            {
                // The places on the servers that did not grant go with `acquire`'s `queue`.
                Ok((grant, _)) => return Ok(grant),
                Err(next) => wait = next,
            }
        }
    }

    /// Keeps this waiter's place on every server for [`PLACE_FAR`] without a vote (see
    /// [`scripts::KEEP`]): what it heard (its best place in line, the shortest turn found
    /// running), when a majority kept it and none asks for a vote (the lock free there with no
    /// turn running, or the place gone); `None` when it should vote now.
    async fn keep_place(&self, keys: &Keys, token: &LeaseToken) -> Option<Wait> {
        let answers = self
            .everywhere("keep a place", |mut conn| async move {
                ops::keep_place(&mut conn, keys, token, PLACE_FAR, TURN).await
            })
            .await;
        let mut wait = Wait::default();
        let mut kept = 0;
        for answer in answers {
            match answer {
                Ok(Some((rank, running))) => {
                    kept += 1;
                    wait.turn |= running.is_some();
                    wait.heard(running, Some(rank));
                }
                Ok(None) => return None,
                Err(_) => {}
            }
        }
        (kept >= self.quorum()).then_some(wait)
    }

    /// The validity left of a majority vote started at `start`, if any.
    fn validity(ttl: Duration, start: Instant) -> Option<Duration> {
        Some(
            lock_core::backend::local_deadline(start, ttl)
                .saturating_duration_since(Instant::now()),
        )
        .filter(|v| !v.is_zero())
    }

    /// Sends one vote to every server, each within the client's patience (no longer than the
    /// wait budget left, unless that is shorter than the time-out), and learns from the answers:
    /// the answers, server by server, and the patience they had. `listening` as in
    /// [`Self::vote`].
    async fn ballots(
        &self,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
        (queueing, listening): (Queueing, Option<&[bool]>),
    ) -> (Vec<Vote<Try>>, Duration) {
        let (name, ttl) = (request.name(), request.ttl());
        let queueing = Queueing {
            fence_floor: fence_floor(),
            ..queueing
        };
        let left = request.deadline().saturating_duration_since(Instant::now());
        let patience = self.patience().min(left.max(self.inner.patience.floor()));
        let learning = Bound {
            each: patience,
            learn: true,
        };
        let votes = self
            .on(
                self.inner.nodes.iter(),
                "acquire",
                |i, mut conn| {
                    let listens = listening.is_none_or(|l| l.get(i).copied().unwrap_or(false));
                    let queueing = Queueing {
                        client: if listens { queueing.client } else { 0 },
                        ..queueing
                    };
                    async move { ops::try_acquire(&mut conn, name, keys, token, ttl, queueing).await }
                },
                learning,
            )
            .await;
        (votes, patience)
    }

    /// One round of Redlock: asks every server, keeps the lock if a majority granted it within its
    /// validity, else undoes the round where it may hold (see [`Self::release_on`]). A refused vote
    /// that too few servers answered records why (`Wait::unanswered`): a wait whose budget is spent
    /// after it answers `Unavailable` rather than a `Timeout`, here or in the waiting loop, which
    /// votes no more once the budget is spent. `listening` says, server by server, where the
    /// waiter's subscription is confirmed: its client (`queueing.client`) is recorded only there
    /// (`None`: everywhere). A grant comes with whether every server granted (else one that did not
    /// may keep a place of this waiter).
    async fn vote(
        &self,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
        (queueing, listening): (Queueing, Option<&[bool]>),
    ) -> Result<Result<(Grant, bool), Wait>, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let start = Instant::now();
        let (votes, patience) = self
            .ballots(request, keys, token, (queueing, listening))
            .await;
        let mut granted = Vec::new();
        let mut wait = Wait {
            voted: Some(start),
            ..Wait::default()
        };
        let mut foreign = None;
        // The servers that did not answer, and those that hold this token already.
        let (mut no_answer, mut ours) = (Vec::new(), Vec::new());
        for (node, vote) in self.inner.nodes.iter().zip(votes) {
            match vote {
                Ok(Try::Granted { fence, server_ms }) => granted.push((node, fence, server_ms)),
                Ok(Try::Queued { turn, rank, .. }) => {
                    wait.turn = true;
                    wait.heard(Some(turn), rank);
                }
                Ok(Try::Busy {
                    pttl, rank, own, ..
                }) => {
                    ours.extend(own.then_some(node));
                    wait.heard(pttl, rank);
                }
                // Not asked for (Redlock never hands a lock over): counts as busy, and ours.
                Ok(Try::Handed { .. }) => ours.push(node),
                Err(error @ LockError::Foreign { .. }) => foreign = Some(error),
                Err(_) => no_answer.push(node),
            }
        }
        if foreign.is_none()
            && granted.len() >= self.quorum()
            && Self::validity(ttl, start).is_some()
        {
            let fence = granted.iter().map(|(_, f, _)| *f).max().unwrap_or_default();
            let server_ms = granted.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
            let granting: Vec<(&Conn, u64)> = granted.iter().map(|(n, f, _)| (*n, *f)).collect();
            let written = self
                .write_back(&granting, (name, keys), fence, patience, &mut foreign)
                .await;
            // Checked again after the write-back: a grant past its local deadline is no grant.
            if foreign.is_none() && written >= self.quorum() && Self::validity(ttl, start).is_some()
            {
                let everywhere = granted.len() == self.inner.nodes.len();
                return Ok(Ok((
                    Grant::new(ops::lease(name, token, fence, ttl, server_ms), start),
                    everywhere,
                )));
            }
        }
        wait.unanswered = self.unanswered(name, no_answer.len());
        // Undone where this vote may hold the lock (see `release_on`).
        ours.extend(no_answer);
        ours.extend(granted.iter().map(|(node, _, _)| *node));
        // Within the time-out, as before patience: a server that has not answered the undo
        // still runs it (it was sent), and nobody waits for its answer.
        let undo = Bound {
            each: self.inner.patience.floor(),
            learn: false,
        };
        self.release_on(ours.into_iter(), keys, token, undo).await;
        if let Some(error) = foreign {
            return Err(error);
        }
        if Instant::now() >= request.deadline() {
            return Err(wait.spent(request));
        }
        Ok(Err(wait))
    }

    /// Why a vote that `failed` servers did not answer cannot be granted, when too few
    /// answered for a majority.
    fn unanswered(&self, name: &LockName, failed: usize) -> Option<LockError> {
        let nodes = self.inner.nodes.len();
        (failed > nodes - self.quorum()).then(|| {
            LockError::unavailable_msg(format!(
                "lock `{name}`: {failed} of {nodes} servers failed to answer; a majority of {} is needed",
                self.quorum()
            ))
        })
    }

    /// Writes `fence` back to the granting majority (`granting`: each server and the fence it
    /// issued) before the grant is returned: the next majority shares a server with it, so its
    /// fence is higher. When every granting server issued this same fence (the proposed floor
    /// was above their counters and clocks), each wrote it to its own counter already: nothing
    /// is sent. Returns how many servers hold it; a counter this library did not write goes to
    /// `foreign`.
    async fn write_back(
        &self,
        granting: &[(&Conn, u64)],
        (name, keys): (&LockName, &Keys),
        fence: u64,
        each: Duration,
        foreign: &mut Option<LockError>,
    ) -> usize {
        if granting.iter().all(|(_, issued)| *issued == fence) {
            return granting.len();
        }
        let raised = self
            .on(
                granting.iter().map(|(node, _)| *node),
                "raise the fence",
                |_, mut conn| async move { ops::raise_fence(&mut conn, name, keys, fence).await },
                Bound { each, learn: false },
            )
            .await;
        let mut written = 0;
        for vote in raised {
            match vote {
                Ok(()) => written += 1,
                Err(error @ LockError::Foreign { .. }) => *foreign = Some(error),
                Err(_) => {}
            }
        }
        written
    }

    /// Judges a renewal vote: granted by a majority in time, else not held or unavailable.
    fn judge_renewal(
        &self,
        lease: &Lease,
        ttl: Duration,
        start: Instant,
        votes: Vec<Option<Option<u64>>>,
    ) -> Result<Grant, LockError> {
        let renewed: Vec<u64> = votes.iter().filter_map(|v| v.flatten()).collect();
        let refused = votes.iter().filter(|v| matches!(v, Some(None))).count();
        if renewed.len() >= self.quorum() && Self::validity(ttl, start).is_some() {
            let server_ms = renewed.iter().copied().max().unwrap_or_else(ops::now_ms);
            return Ok(Grant::new(ops::renewed(lease, ttl, server_ms), start));
        }
        if refused > self.inner.nodes.len() - self.quorum() {
            return Err(LockError::not_held(lease.name()));
        }
        Err(LockError::unavailable_msg(format!(
            "renewal of `{}` reached {} of {} servers; {} needed",
            lease.name(),
            renewed.len(),
            self.inner.nodes.len(),
            self.quorum()
        )))
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn capabilities(&self) -> Capabilities {
        Self::DECLARED
    }

    fn store(&self) -> &'static str {
        "redlock"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let keys = self.keys(request.name());
        let token = LeaseToken::random();
        // The uncontended path: one vote (on a free lock with waiters, it starts the first
        // one's turn, tells that waiter, and is refused).
        let queueing = Queueing {
            turn: TURN,
            tell: Some(Tell::Publish),
            next: Next::TurnIfListening,
            ..Queueing::NONE
        };
        // A call with a budget queues from its first vote, under one ticket on every server:
        // a busy answer is a place in line at once, so a client that releases and asks again
        // goes behind it (fault case `redlock_releaser_goes_behind_a_waiter_that_asked_first`).
        // A single try neither queues nor subscribes.
        let waits = Instant::now() < request.deadline();
        let queueing = if waits {
            Queueing {
                place: PLACE,
                ticket: ticket(),
                ..queueing
            }
        } else {
            queueing
        };
        let mut queue = Queued {
            backend: self.clone(),
            keys: &keys,
            token: &token,
            taken: false,
        };
        let wait = match self.vote(request, &keys, &token, (queueing, None)).await? {
            Ok((grant, everywhere)) => {
                // A free lock with no one in line is granted without a place; a server that
                // did not grant may have taken one.
                queue.taken = waits && !everywhere;
                return Ok(grant);
            }
            Err(wait) => wait,
        };
        queue.taken = waits;
        if Instant::now() >= request.deadline() {
            return Err(request.timeout_error());
        }
        // Dropped after the waiting (which unsubscribes), so the place is taken out last.
        self.wait_in_line(request, &keys, &token, queueing, wait)
            .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        lock_core::backend::validate_ttl(ttl)?;
        let keys = self.keys(lease.name());
        let start = Instant::now();
        let votes = self
            .everywhere("renew", |mut conn| {
                let keys = &keys;
                async move { ops::renew(&mut conn, keys, lease.token(), ttl).await }
            })
            .await;
        let votes = votes.into_iter().map(Result::ok).collect();
        self.judge_renewal(lease, ttl, start, votes)
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let Some(batch) = ops::renewal_batch(leases, |name| self.keys(name)) else {
            return lock_core::backend::renew_concurrently(self, leases).await;
        };
        let start = Instant::now();
        // Built once for the five servers.
        let renewals = &ops::Renewals::new(&batch);
        let timeout = Some(self.patience());
        let per_node: Vec<Vote<Vec<Value>>> = self
            .everywhere_batched(|mut conn| async move { renewals.send(&mut conn, timeout).await })
            .await;
        // A node that failed votes for no lease (`None`); the others, lease by lease.
        Ok(leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let votes = per_node
                    .iter()
                    .map(|node| {
                        node.as_ref()
                            .ok()
                            .map(|r| r.get(i).and_then(ops::renewed_at))
                    })
                    .collect();
                self.judge_renewal(lease, lease.ttl(), start, votes)
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let votes = self
            .release_everywhere(&self.keys(lease.name()), lease.token())
            .await;
        if votes.iter().any(|v| matches!(v, Ok(true))) {
            return Ok(());
        }
        if votes.iter().all(Result::is_ok) {
            return Err(LockError::not_held(lease.name()));
        }
        Err(LockError::unavailable_msg(format!(
            "release of `{}` could not reach every server",
            lease.name()
        )))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        let keys = self.keys(name);
        let votes = self
            .everywhere("inspect", |mut conn| {
                let keys = &keys;
                async move { ops::inspect(&mut conn, name, keys).await }
            })
            .await;
        let servers = votes.len();
        let mut infos: Vec<LockInfo> = Vec::new();
        let mut unanswered = 0;
        for vote in votes {
            match vote {
                Ok(Some(info)) => infos.push(info),
                Ok(None) => {}
                Err(error @ LockError::Foreign { .. }) => return Err(error),
                Err(_) => unanswered += 1,
            }
        }
        let count = |token: &LeaseToken| infos.iter().filter(|i| &i.token == token).count();
        if let Some(m) = infos.iter().find(|c| count(&c.token) >= self.quorum()) {
            let same: Vec<_> = infos.iter().filter(|i| i.token == m.token).collect();
            let fence = same.iter().map(|i| i.fence).max().unwrap_or(m.fence);
            let left = same.iter().filter_map(|i| i.expires_in).min();
            return Ok(Some(LockInfo::new(
                name.clone(),
                m.token.clone(),
                fence,
                left,
            )));
        }
        // Free only when no token could hold a majority with the servers that did not
        // answer: a holder on a bare majority, one of its servers silent, is still held.
        let most = infos.iter().map(|i| count(&i.token)).max().unwrap_or(0);
        if most + unanswered >= self.quorum() {
            return Err(LockError::unavailable_msg(format!(
                "redlock: inspect of `{name}`: {unanswered} of {servers} servers did not answer \
                 and the others cannot tell whether it is held; retry"
            )));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortest and the longest of 1,000 delays of `wait` (push wake-ups on).
    fn spread(wait: &Wait) -> (Duration, Duration) {
        let ms = Duration::from_millis(10);
        let delays: Vec<Duration> = (0..1000).map(|_| wait.delay(ms, ms, true)).collect();
        let shortest = delays.iter().min().copied().unwrap_or_default();
        (shortest, delays.iter().max().copied().unwrap_or_default())
    }

    /// A waiter far back keeps its place with `KEEP` after a vote. Its first call must reach
    /// the servers before the vote's place ([`PLACE`], from the vote's sending) ends, by a
    /// margin for the sleep's and the call's own time: else a vote that sweeps the line
    /// meanwhile takes the place out, and a waiter that moved up to the head without knowing
    /// loses that turn. The time since the vote was sent counts; the calls stay as spread as
    /// the others (a quarter of [`PLACE_KEPT_FAR`]); after a `KEEP` (its place lasts
    /// [`PLACE_FAR`]) and nearer the head nothing changes.
    #[test]
    fn far_back_keeps_a_voted_place_before_it_ends() {
        let by = PLACE - PLACE_MARGIN;
        let voted = |ago: Duration, rank: u64| Wait {
            rank: Some(rank),
            voted: Instant::now().checked_sub(ago),
            ..Wait::default()
        };
        let sampling = Instant::now();
        let (shortest, longest) = spread(&voted(Duration::ZERO, FAR_BACK));
        assert!(
            longest <= by,
            "first call {longest:?} after a vote; its place lasts {PLACE:?}"
        );
        // The time since the vote counts, and some passed while sampling.
        let slack = sampling.elapsed() + Duration::from_millis(1);
        assert!(
            shortest + slack >= by - PLACE_KEPT_FAR / 4,
            "first call only {shortest:?} after a vote"
        );
        let ago = Duration::from_millis(500);
        let (_, longest) = spread(&voted(ago, FAR_BACK));
        assert!(
            longest <= by - ago,
            "first call {longest:?} after a vote sent {ago:?} ago"
        );
        let kept = Wait {
            rank: Some(FAR_BACK),
            ..Wait::default()
        };
        let (shortest, longest) = spread(&kept);
        assert!(
            shortest >= PLACE_KEPT_FAR * 3 / 4 && longest > by && longest <= PLACE_KEPT_FAR,
            "after a KEEP the next call came {shortest:?} to {longest:?} later"
        );
        let (shortest, longest) = spread(&voted(Duration::ZERO, 2));
        assert!(
            shortest >= PLACE_KEPT * 3 / 4 && longest <= PLACE_KEPT,
            "third in line called {shortest:?} to {longest:?} after a vote"
        );
    }
}
