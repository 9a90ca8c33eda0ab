//! Push wake-ups: one pub/sub connection per client, shared by every waiting lock.
//!
//! A waiter registers for its lock's release channel (subscribing on the shared connection if
//! no other waiter of this client already did), then retries when a release message arrives.
//! Each message wakes one waiter of this client, not all of them: only one can win, and the
//! others would only queue their scripts in front of the winner's.
//! Subscribes and unsubscribes go through one queue so that a late unsubscribe can never undo
//! a newer subscribe. If the pub/sub connection drops, waiters fall back to retrying when the
//! holder's TTL runs out, and re-subscribe on a new connection at their next turn.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use futures::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::Notify;

#[derive(Debug)]
pub(crate) struct Waiters {
    client: redis::Client,
    state: Mutex<State>,
    /// Serialises subscribe, unsubscribe and connect.
    ops: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    sink: Option<PubSubSink>,
    subscribed: HashSet<String>,
    generation: u64,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("channels", &self.channels.len())
            .field("connected", &self.sink.is_some())
            .finish()
    }
}

struct Channel {
    notify: Arc<Notify>,
    users: usize,
}

impl Waiters {
    pub(crate) fn new(client: redis::Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            state: Mutex::new(State::default()),
            ops: tokio::sync::Mutex::new(()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers interest in `channel`; the registration subscribes on the shared connection.
    pub(crate) fn register(self: &Arc<Self>, channel: &str) -> Registration {
        let notify = {
            let mut state = self.state();
            let entry = state
                .channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    users: 0,
                });
            entry.users += 1;
            entry.notify.clone()
        };
        Registration {
            waiters: self.clone(),
            channel: channel.to_owned(),
            notify,
        }
    }

    /// Makes sure `channel` is subscribed on a live connection. An error means waiters must
    /// rely on the holder's TTL for now.
    async fn ensure(self: &Arc<Self>, channel: &str) -> Result<(), redis::RedisError> {
        {
            let state = self.state();
            if state.sink.is_some() && state.subscribed.contains(channel) {
                return Ok(());
            }
        }
        let _ops = self.ops.lock().await;
        let existing = self.state().sink.clone();
        let sink = match existing {
            Some(sink) => sink,
            None => self.connect().await?,
        };
        if self.state().subscribed.contains(channel) {
            return Ok(());
        }
        let mut sink = sink;
        sink.subscribe(channel).await?;
        self.state().subscribed.insert(channel.to_owned());
        Ok(())
    }

    /// Opens the pub/sub connection and starts its reader. Called under `ops`.
    async fn connect(self: &Arc<Self>) -> Result<PubSubSink, redis::RedisError> {
        let (sink, mut stream) = self.client.get_async_pubsub().await?.split();
        let generation = {
            let mut state = self.state();
            state.generation += 1;
            state.sink = Some(sink.clone());
            state.subscribed.clear();
            state.generation
        };
        let waiters = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let Some(waiters) = waiters.upgrade() else {
                    return;
                };
                let notify = waiters
                    .state()
                    .channels
                    .get(message.get_channel_name())
                    .map(|c| c.notify.clone());
                // One waiter per release: it tries, and if another client won it waits for
                // the next release. (A woken waiter dropped before its retry answered passes
                // the wake-up on: see `WakeUp`.)
                if let Some(notify) = notify {
                    notify.notify_one();
                }
            }
            // The connection ended: forget it and wake everyone to re-subscribe.
            if let Some(waiters) = waiters.upgrade() {
                let notifies: Vec<_> = {
                    let mut state = waiters.state();
                    if state.generation == generation {
                        state.sink = None;
                        state.subscribed.clear();
                    }
                    state.channels.values().map(|c| c.notify.clone()).collect()
                };
                tracing::debug!("redis pub/sub connection ended; waiters fall back to TTL retries");
                for notify in notifies {
                    notify.notify_waiters();
                }
            }
        });
        Ok(sink)
    }

    fn leave(self: &Arc<Self>, channel: &str) {
        let last = {
            let mut state = self.state();
            let last = state.channels.get_mut(channel).is_some_and(|c| {
                c.users -= 1;
                c.users == 0
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
            let sink = {
                let mut state = waiters.state();
                if state.channels.contains_key(&channel) || !state.subscribed.remove(&channel) {
                    return;
                }
                state.sink.clone()
            };
            if let Some(mut sink) = sink {
                let _ = sink.unsubscribe(&channel).await;
            }
        });
    }
}

/// A waiter's interest in one channel; dropping it unsubscribes when it was the last.
#[derive(Debug)]
pub(crate) struct Registration {
    waiters: Arc<Waiters>,
    channel: String,
    notify: Arc<Notify>,
}

impl Registration {
    /// Subscribes if needed; false when push wake-ups are unavailable right now.
    pub(crate) async fn ensure(&self) -> bool {
        match self.waiters.ensure(&self.channel).await {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, "redis pub/sub unavailable; waiting on the holder's TTL");
                false
            }
        }
    }

    /// True when other waiters of this client wait on the same channel: a release message
    /// wakes only one of them, so whoever of them wins must mark the lock again.
    pub(crate) fn others_wait(&self) -> bool {
        self.waiters
            .state()
            .channels
            .get(&self.channel)
            .is_some_and(|c| c.users > 1)
    }

    /// Holds a wake-up this waiter took from [`notify`](Self::notify) until its retry has
    /// answered: if the waiter is dropped or fails first, the guard wakes a sibling instead.
    pub(crate) fn took_wake_up(&self) -> WakeUp<'_> {
        WakeUp {
            notify: &self.notify,
            armed: true,
        }
    }

    /// The notifier woken on every release message of the channel.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.waiters.leave(&self.channel);
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
}
