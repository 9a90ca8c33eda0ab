//! Push wake-ups: one pub/sub connection per client, shared by every waiting lock.
//!
//! A waiter registers for its lock's release channel *of this client* (`<stem>:<client id>`,
//! subscribing on the shared connection if no other waiter of this client already did; on a
//! cluster a shard channel, see [`crate::subscriber`]), then
//! retries when a message naming it arrives (a release's, or an acquire try's that starts its
//! turn: see `scripts::ACQUIRE`), or takes the lock a release handed over to it (a message
//! `=<token> <fence> <server ms>`, kept for that waiter: see `scripts::RELEASE`). A release
//! publishes only to the clients of the waiters it names, so its cost does not grow with the
//! number of waiting clients. Each message wakes one
//! waiter of this client, not all of them: only one can win, and the others would only queue their
//! scripts in front of the winner's. Subscribes and unsubscribes go through one queue so that a
//! late unsubscribe can never undo a newer subscribe. Every network step in that queue (connect,
//! subscribe, unsubscribe) is bounded by the response time-out; one that fails or times out drops
//! the connection, so the next subscription reconnects, except a `SUBSCRIBE` the server refuses
//! (an ACL), which leaves the connection and its other subscriptions as they are. A subscription
//! that failed (connecting, or `SUBSCRIBE`) is not tried again for [`RESUBSCRIBE_AFTER`],
//! whatever the channel: while one lock's channel is refused, the new subscriptions of other
//! locks mostly wait that out too (their waiters retry on their back-off meanwhile). A waiter waits
//! for its subscription no longer than its own wait budget. Waiters without a confirmed
//! subscription (the connection dropped, or not subscribed in time) fall back to retrying on a
//! back-off bounded by the holder's TTL, and subscribe again at their next turn.

use std::{
    collections::{HashMap, HashSet},
    io,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use futures::{
    FutureExt, StreamExt,
    future::{BoxFuture, Shared},
};
use redis::RedisError;
use tokio::{sync::Notify, task::AbortHandle};

use crate::subscriber::{Event, Sink, Subscriber};

/// How long after a failed subscription (a refused `SUBSCRIBE`, a connection that could not
/// be opened or stopped answering) no new one is tried: waiters retry on their own meanwhile.
/// Without it, every waiter woken by the failure subscribed again at once, over a new
/// connection each time (fault case `a_denied_subscribe_is_retried_slowly`).
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Waiters {
    /// This client's id: its waiters' release messages come on `<channel>:<id>`.
    id: u64,
    subscriber: Subscriber,
    /// The bound of each network step on the pub/sub connection.
    timeout: Duration,
    state: Mutex<State>,
    /// Serialises subscribe, unsubscribe and connect.
    ops: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    sink: Option<Sink>,
    /// The task reading the connection's messages; it owns the connection's stream.
    reader: Option<AbortHandle>,
    subscribed: HashSet<String>,
    /// Channels this client asked to unsubscribe, whose confirmation (an
    /// [`Event::Dropped`](crate::subscriber::Event::Dropped) too) has not come yet.
    unsubscribing: HashMap<String, usize>,
    /// How many subscriptions the server ended on its own on this connection: a subscription
    /// confirmed while this changed may have been one of them, and does not count.
    drops: u64,
    generation: u64,
    /// No subscription is tried before this, after one failed.
    retry_after: Option<Instant>,
}

impl State {
    /// Why no subscription is tried now (one failed less than [`RESUBSCRIBE_AFTER`] ago).
    fn resting(&self) -> Option<String> {
        let left = self.retry_after?.checked_duration_since(Instant::now())?;
        Some(format!(
            "a pub/sub subscription failed just now; the next is tried in {left:?}"
        ))
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("channels", &self.channels.len())
            .field("connected", &self.sink.is_some())
            .finish()
    }
}

/// A subscription in progress: the outcome of its task (an error as text, for the log).
type Pending = Shared<BoxFuture<'static, Result<(), String>>>;

struct Channel {
    notify: Arc<Notify>,
    /// Woken when a release names one of this client's waiters second in line: it retries
    /// when the first one's turn ends, unless woken before.
    second: Arc<Notify>,
    /// The owner tokens of this client's waiters on the channel, one per waiter (a release
    /// hands the lock to the first waiter of the queue by token, or names the first two), each
    /// with its own notifiers.
    tokens: HashMap<String, Named>,
    /// The subscription under way for this channel, shared by its waiters, so a waiter that
    /// loops while the connection does not answer does not queue one more per turn.
    pending: Option<Pending>,
}

impl Channel {
    /// The channel's notifier and each of its waiters' own (Redlock's waiters wait on those).
    fn notifiers(&self) -> Vec<Arc<Notify>> {
        let named = self.tokens.values().map(|named| named.first.clone());
        std::iter::once(self.notify.clone()).chain(named).collect()
    }
}

/// Whether `error` is the server's refusal of a command (an error reply: `NOPERM` from an ACL,
/// say), not a failure of the connection (fault case
/// `a_refused_subscribe_keeps_the_other_subscriptions`).
fn refused(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

fn timed_out(what: &str) -> RedisError {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("redis pub/sub {what} timed out"),
    )
    .into()
}

impl Waiters {
    /// Waiters whose pub/sub connection comes from `subscriber`, each of its network steps
    /// bounded by `timeout`.
    pub(crate) fn new(subscriber: Subscriber, timeout: Duration) -> Arc<Self> {
        Self::with_id(subscriber, timeout, rand::random::<u64>().max(1))
    }

    /// Like [`Self::new`], under the client id `id` (never 0): Redlock's waiters have one
    /// pub/sub connection per server and give every server the same id.
    pub(crate) fn with_id(subscriber: Subscriber, timeout: Duration, id: u64) -> Arc<Self> {
        Arc::new(Self {
            id: id.max(1),
            subscriber,
            timeout,
            state: Mutex::new(State::default()),
            ops: tokio::sync::Mutex::new(()),
        })
    }

    /// This client's id (never 0), which its waiters give the queue (see
    /// [`crate::scripts::ACQUIRE`]).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The channel on which releases of the lock whose release channels stem from `stem`
    /// (see [`crate::RedisKeys::channel`]) tell this client's waiters.
    pub(crate) fn channel(&self, stem: &str) -> String {
        format!("{stem}:{}", self.id)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the waiter whose owner token is `token` on `channel`; the registration
    /// subscribes on the shared connection.
    pub(crate) fn register(self: &Arc<Self>, channel: &str, token: &str) -> Registration {
        let (notify, second, named) = {
            let mut state = self.state();
            let entry = state
                .channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    second: Arc::new(Notify::new()),
                    tokens: HashMap::new(),
                    pending: None,
                });
            let named = entry.tokens.entry(token.to_owned()).or_default().clone();
            (entry.notify.clone(), entry.second.clone(), named)
        };
        Registration {
            waiters: self.clone(),
            channel: channel.to_owned(),
            token: token.to_owned(),
            notify,
            second,
            named,
        }
    }

    /// The subscription of `channel`: done, under way, or started now in a task of its own (so
    /// that it is neither cancelled nor left half-done by a waiter that stops waiting for it).
    fn subscription(self: &Arc<Self>, channel: &str) -> Option<Pending> {
        let mut state = self.state();
        if state.sink.is_some() && state.subscribed.contains(channel) {
            return None;
        }
        if let Some(why) = state.resting() {
            return Some(failed(why));
        }
        let Some(entry) = state.channels.get_mut(channel) else {
            // Not registered (cannot happen while a `Registration` lives): no push.
            return Some(failed(format!("`{channel}` is not registered")));
        };
        let pending = entry.pending.get_or_insert_with(|| {
            let task = tokio::spawn(self.clone().subscribe(channel.to_owned()));
            async move {
                match task.await {
                    Ok(outcome) => outcome.map_err(|e| e.to_string()),
                    Err(error) => Err(error.to_string()),
                }
            }
            .boxed()
            .shared()
        });
        Some(pending.clone())
    }

    /// Makes sure `channel` is subscribed on a live connection; an error means waiters must
    /// rely on retries for now. Each network step is bounded by the time-out; one that fails
    /// drops the connection.
    async fn subscribe(self: Arc<Self>, channel: String) -> Result<(), RedisError> {
        let outcome = self.subscribe_queued(&channel).await;
        if let Some(entry) = self.state().channels.get_mut(&channel) {
            entry.pending = None;
        }
        outcome
    }

    async fn subscribe_queued(self: &Arc<Self>, channel: &str) -> Result<(), RedisError> {
        let _ops = self.ops.lock().await;
        let existing = {
            let state = self.state();
            if !state.channels.contains_key(channel) {
                // Every waiter left while this waited for its turn.
                return Ok(());
            }
            if state.sink.is_some() && state.subscribed.contains(channel) {
                return Ok(());
            }
            // A subscription queued behind one that failed does not try again before its time.
            if let Some(why) = state.resting() {
                return Err(io::Error::other(why).into());
            }
            state
                .sink
                .clone()
                .map(|sink| (sink, state.generation, state.drops))
        };
        let (mut sink, generation, drops) = match existing {
            Some(existing) => existing,
            None => match tokio::time::timeout(self.timeout, self.connect()).await {
                Ok(Ok((sink, generation))) => (sink, generation, 0),
                Ok(Err(error)) => return Err(self.failed(None, error)),
                Err(_) => return Err(self.failed(None, timed_out("connect"))),
            },
        };
        match tokio::time::timeout(self.timeout, sink.subscribe(channel)).await {
            Ok(Ok(())) => {
                let mut state = self.state();
                // The connection ended while the server confirmed (its generation cannot have
                // changed: only this task, holding `ops`, connects): its waiters were woken
                // before this subscription counted, so this waiter would not be. Likewise
                // when the server ended a subscription on its own meanwhile (a slot moved):
                // it may have been this one, confirmed just before (the reader may see the
                // end before this task sees the confirmation, or the `redis` crate may take
                // the server's `sunsubscribe` for the answer to this `SSUBSCRIBE`). It is
                // not a failure of the connection: the next turn subscribes again.
                if state.sink.is_none() || state.drops != drops {
                    return Err(io::Error::other(
                        "the pub/sub connection ended, or the server ended a subscription, \
                         while subscribing",
                    )
                    .into());
                }
                state.subscribed.insert(channel.to_owned());
                state.retry_after = None;
                Ok(())
            }
            // The server answered, and refused (an ACL that does not allow this channel): the
            // connection and its other subscriptions are fine, and stay.
            Ok(Err(error)) if refused(&error) => Err(self.failed(None, error)),
            Ok(Err(error)) => Err(self.failed(Some(generation), error)),
            Err(_) => Err(self.failed(Some(generation), timed_out("subscribe"))),
        }
    }

    /// A subscription failed with `error`: none is tried again for [`RESUBSCRIBE_AFTER`], and
    /// the connection of `generation`, if any, is closed (its waiters woken; `None` when the
    /// connection is fine: the server refused this one subscription). Returns `error`.
    fn failed(&self, generation: Option<u64>, error: RedisError) -> RedisError {
        // Set before the waiters are woken, so none of them tries again at once.
        self.state().retry_after = Instant::now().checked_add(RESUBSCRIBE_AFTER);
        if let Some(generation) = generation {
            self.disconnect(generation);
        }
        error
    }

    /// Opens the pub/sub connection and starts its reader. Called under `ops`.
    async fn connect(self: &Arc<Self>) -> Result<(Sink, u64), RedisError> {
        let (sink, mut stream) = self.subscriber.connect().await?;
        let mut state = self.state();
        state.generation += 1;
        let generation = state.generation;
        let waiters = Arc::downgrade(self);
        let reader = tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                let Some(waiters) = waiters.upgrade() else {
                    return;
                };
                let (channel, payload) = match event {
                    Event::Message(channel, payload) => (channel, payload),
                    Event::Dropped(channel) => {
                        waiters.dropped(&channel);
                        continue;
                    }
                };
                let wake = waiters
                    .state()
                    .channels
                    .get(&channel)
                    .and_then(|c| wake_for(c, &payload));
                // One waiter per message: the first in line if it is one of ours (in the single
                // server's backend a sibling that is not passes the wake-up on, and so does a
                // woken waiter dropped before its retry answered: see `WakeUp`). The second in
                // line only learns when to step in. Each named waiter's own notifier is told
                // too (Redlock's waiters wait on theirs).
                match wake {
                    Some(Wake::Handed(named, handed)) => {
                        *named.handed.lock().unwrap_or_else(PoisonError::into_inner) = Some(handed);
                        named.granted.notify_one();
                    }
                    Some(Wake::First(notify, named)) => {
                        notify.notify_one();
                        named.first.notify_one();
                    }
                    Some(Wake::Second(second, named)) => {
                        second.notify_waiters();
                        named.second.notify_waiters();
                    }
                    None => {}
                }
            }
            tracing::debug!("redis pub/sub connection ended; waiters fall back to retries");
            if let Some(waiters) = waiters.upgrade() {
                waiters.disconnect(generation);
            }
        });
        if let Some(old) = state.reader.replace(reader.abort_handle()) {
            old.abort();
        }
        state.sink = Some(sink.clone());
        state.subscribed.clear();
        state.unsubscribing.clear();
        state.drops = 0;
        Ok((sink, generation))
    }

    /// The server ended the subscription of `channel` (a cluster's slot moved): if it still
    /// counts as subscribed, it no longer does, and its waiters are woken to try once and
    /// subscribe again (on the slot's new node). Without this they slept, marked as waiting,
    /// until the holder's expiry at each turn, while releases published on the new node
    /// (fault case `a_waiter_hears_releases_after_its_slot_moves`). The confirmation of an
    /// unsubscribe this client asked for is told apart and changes nothing.
    fn dropped(&self, channel: &str) {
        let notifies = {
            let mut state = self.state();
            if let Some(asked) = state.unsubscribing.get_mut(channel) {
                *asked -= 1;
                if *asked == 0 {
                    state.unsubscribing.remove(channel);
                }
                return;
            }
            state.drops += 1;
            if !state.subscribed.remove(channel) {
                return;
            }
            state.channels.get(channel).map(Channel::notifiers)
        };
        for notify in notifies.into_iter().flatten() {
            notify.notify_waiters();
        }
    }

    /// Forgets the connection of `generation` (if it is still the current one), closes it, and
    /// wakes every waiter to subscribe again on a new one.
    fn disconnect(&self, generation: u64) {
        let (reader, notifies) = {
            let mut state = self.state();
            if state.generation != generation || state.sink.is_none() {
                return;
            }
            state.sink = None;
            state.subscribed.clear();
            let notifies: Vec<_> = state
                .channels
                .values()
                .flat_map(Channel::notifiers)
                .collect();
            (state.reader.take(), notifies)
        };
        // The reader owns the stream: ending it closes the connection (a cluster's closes
        // when the last handle on it, `sink` and those of steps under way, is gone).
        if let Some(reader) = reader {
            reader.abort();
        }
        for notify in notifies {
            notify.notify_waiters();
        }
    }

    fn leave(self: &Arc<Self>, channel: &str, token: &str) {
        let last = {
            let mut state = self.state();
            let last = state.channels.get_mut(channel).is_some_and(|c| {
                c.tokens.remove(token);
                c.tokens.is_empty()
            });
            if last {
                state.channels.remove(channel);
            }
            last
        };
        if !last {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (waiters, channel) = (self.clone(), channel.to_owned());
        runtime.spawn(async move {
            let _ops = waiters.ops.lock().await;
            let (sink, generation) = {
                let mut state = waiters.state();
                if state.channels.contains_key(&channel) || !state.subscribed.remove(&channel) {
                    return;
                }
                if state.sink.as_ref().is_some_and(Sink::reports_drops) {
                    *state.unsubscribing.entry(channel.clone()).or_default() += 1;
                }
                (state.sink.clone(), state.generation)
            };
            if let Some(mut sink) = sink {
                let unsubscribed =
                    tokio::time::timeout(waiters.timeout, sink.unsubscribe(&channel)).await;
                if !matches!(unsubscribed, Ok(Ok(()))) {
                    waiters.disconnect(generation);
                }
            }
        });
    }
}

impl Drop for Waiters {
    /// Closes the pub/sub connection, which outlives every waiter (for the next one): its
    /// reader owns the connection's stream and, holding only a weak handle, would otherwise
    /// wait for a message that never comes, keeping the connection open after the client is
    /// gone (fault case `a_dropped_client_closes_its_pubsub_connection`).
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(reader) = state.reader.take() {
            reader.abort();
        }
    }
}

/// A subscription that failed before it began.
fn failed(why: String) -> Pending {
    futures::future::ready(Err(why)).boxed().shared()
}

/// What one release message asks of this client.
enum Wake {
    /// The lock was handed over to this waiter.
    Handed(Named, Handed),
    /// Wake one waiter: the first in line is ours (the channel's notifier, and the named
    /// waiter's own).
    First(Arc<Notify>, Named),
    /// Our waiter is second in line: it steps in if the first does not take its turn.
    Second(Arc<Notify>, Named),
}

/// One waiter's own notifiers, told when a release message names it first or second, and the
/// lock handed to it, if one was.
#[derive(Debug, Clone, Default)]
pub(crate) struct Named {
    first: Arc<Notify>,
    second: Arc<Notify>,
    granted: Arc<Notify>,
    handed: Arc<Mutex<Option<Handed>>>,
}

/// A lock a release handed over to a waiter (see `scripts::RELEASE`): its fence, and the
/// server's time (ms since the epoch) when it was handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handed {
    /// The fence issued to the waiter.
    pub(crate) fence: u64,
    /// The server's clock at the hand-over.
    pub(crate) server_ms: u64,
}

/// What a message `payload` asks of `channel`'s waiters: a hand-over's (`=<token> <fence>
/// <server ms>`) gives the lock to the waiter it names; a release's without one names the first
/// two in line (see `scripts::RELEASE`), an acquire try's that starts a turn the first alone
/// (see `scripts::ACQUIRE`). A hand-over to a token no waiter here has (it left, or took the
/// lock by a try meanwhile) asks nothing: a waiter that left releases a lock handed to it as
/// it leaves (see `scripts::LEAVE`).
fn wake_for(channel: &Channel, payload: &str) -> Option<Wake> {
    if let Some(handed) = payload.strip_prefix('=') {
        let mut parts = handed.split(' ');
        let token = parts.next()?;
        let fence = parts.next()?.parse().ok()?;
        let server_ms = parts.next()?.parse().ok()?;
        let waiter = channel.tokens.get(token)?;
        return Some(Wake::Handed(waiter.clone(), Handed { fence, server_ms }));
    }
    let mut named = payload.split(' ');
    let first = named.next().unwrap_or_default();
    if let Some(waiter) = channel.tokens.get(first) {
        return Some(Wake::First(channel.notify.clone(), waiter.clone()));
    }
    named
        .next()
        .and_then(|second| channel.tokens.get(second))
        .map(|waiter| Wake::Second(channel.second.clone(), waiter.clone()))
}

/// A waiter's interest in one channel; dropping it unsubscribes when it was the last.
#[derive(Debug)]
pub(crate) struct Registration {
    waiters: Arc<Waiters>,
    channel: String,
    token: String,
    notify: Arc<Notify>,
    second: Arc<Notify>,
    named: Named,
}

impl Registration {
    /// Subscribes if needed, waiting for it until `deadline` at most; false when push
    /// wake-ups are unavailable right now (the waiter then retries on its own).
    pub(crate) async fn ensure(&self, deadline: Instant) -> bool {
        let Some(pending) = self.waiters.subscription(&self.channel) else {
            return true;
        };
        match tokio::time::timeout_at(deadline.into(), pending).await {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                tracing::debug!(%error, "redis pub/sub unavailable; retrying without it");
                false
            }
            Err(_) => {
                tracing::debug!(
                    "redis pub/sub subscription not confirmed in time; retrying without it"
                );
                false
            }
        }
    }

    /// Starts the subscription if needed, without waiting for it.
    pub(crate) fn start(&self) {
        drop(self.waiters.subscription(&self.channel));
    }

    /// Whether this waiter's channel counts as subscribed on a live connection now.
    pub(crate) fn subscribed(&self) -> bool {
        let state = self.waiters.state();
        state.sink.is_some() && state.subscribed.contains(&self.channel)
    }

    /// True when other waiters of this client wait on the same channel: a release message
    /// wakes only one of them, so whoever of them wins must mark the lock again.
    pub(crate) fn others_wait(&self) -> bool {
        self.waiters
            .state()
            .channels
            .get(&self.channel)
            .is_some_and(|c| c.tokens.len() > 1)
    }

    /// Holds a wake-up this waiter took from [`notify`](Self::notify) until its retry has
    /// answered: if the waiter is dropped or fails first, the guard wakes a sibling instead.
    pub(crate) fn took_wake_up(&self) -> WakeUp<'_> {
        WakeUp {
            notify: &self.notify,
            armed: true,
        }
    }

    /// The notifier woken on a release message whose turn is one of this client's waiters.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// The notifier woken on a release message that names one of this client's waiters second
    /// in line.
    pub(crate) fn second(&self) -> &Notify {
        &self.second
    }

    /// The notifier woken (`notify_one`) on a release message that names this waiter first in
    /// line, and only then: unlike [`notify`](Self::notify), no sibling takes its wake-up.
    pub(crate) fn named_first(&self) -> &Notify {
        &self.named.first
    }

    /// The notifier woken on a release message that names this waiter second in line.
    pub(crate) fn named_second(&self) -> &Notify {
        &self.named.second
    }

    /// The notifier woken when a release hands the lock over to this waiter.
    pub(crate) fn granted(&self) -> &Notify {
        &self.named.granted
    }

    /// The lock a release handed over to this waiter since the last call, if one did.
    pub(crate) fn take_handed(&self) -> Option<Handed> {
        self.named
            .handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.waiters.leave(&self.channel, &self.token);
    }
}

/// A release message one waiter took: the release deleted the waiter mark, so if that waiter
/// leaves before its retry marks the lock again (or takes it), the message must go to a
/// sibling, or the siblings sleep until the holder's TTL with the lock free.
#[derive(Debug)]
pub(crate) struct WakeUp<'a> {
    notify: &'a Notify,
    armed: bool,
}

impl WakeUp<'_> {
    /// The retry answered (and marked the lock if others wait): nothing to pass on.
    pub(crate) fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for WakeUp<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{pin::pin, task::Poll};

    use futures::poll;

    use super::*;

    /// Two siblings wait and a release message wakes the first; then the first's wake-up
    /// guard ends, after its retry answered or not. Returns whether the second was woken.
    async fn second_woken(retry_answered: bool) -> bool {
        let notify = Notify::new();
        let mut first = pin!(notify.notified());
        let mut second = pin!(notify.notified());
        first.as_mut().enable();
        second.as_mut().enable();
        notify.notify_one();
        assert!(matches!(poll!(first.as_mut()), Poll::Ready(())));
        assert!(matches!(poll!(second.as_mut()), Poll::Pending));
        let wake_up = WakeUp {
            notify: &notify,
            armed: true,
        };
        if retry_answered {
            wake_up.done();
        } else {
            drop(wake_up);
        }
        matches!(poll!(second.as_mut()), Poll::Ready(()))
    }

    #[tokio::test]
    async fn a_wake_up_dropped_before_the_retry_answered_wakes_a_sibling() {
        assert!(second_woken(false).await);
    }

    #[tokio::test]
    async fn a_wake_up_whose_retry_answered_wakes_nobody() {
        assert!(!second_woken(true).await);
    }
    fn channel_of(tokens: &[&str]) -> Channel {
        Channel {
            notify: Arc::new(Notify::new()),
            second: Arc::new(Notify::new()),
            tokens: tokens
                .iter()
                .map(|token| ((*token).to_owned(), Named::default()))
                .collect(),
            pending: None,
        }
    }

    #[test]
    fn a_hand_over_message_gives_its_waiter_the_fence_and_time() {
        let channel = channel_of(&["aa", "bb"]);
        let Some(Wake::Handed(_, handed)) = wake_for(&channel, "=bb 17 1800000000000") else {
            panic!("a hand-over to a waiter of this client was not recognised");
        };
        assert_eq!(
            handed,
            Handed {
                fence: 17,
                server_ms: 1_800_000_000_000
            }
        );
    }

    #[test]
    fn a_hand_over_to_no_waiter_here_or_garbled_asks_nothing() {
        let channel = channel_of(&["aa"]);
        for payload in ["=cc 17 1800000000000", "=aa x 1", "=aa 17", "=aa"] {
            assert!(
                wake_for(&channel, payload).is_none(),
                "{payload:?} asked something"
            );
        }
        assert!(matches!(wake_for(&channel, "aa bb"), Some(Wake::First(..))));
    }
}
