//! The watches a waiting contender keeps: on its own node, on the contender just before it
//! and on the one two before it, each set once and kept until it fires (the own node's is set
//! again after a reconnection, see [`Watches::still_ours`]).
//!
//! Watching the contender two before is what takes the listing off a hand-off's path. In a
//! queue served in order, that contender goes when it releases the lock, and the one just
//! before ours takes it: the waiter lists the contenders then, while that one holds, and
//! finds it first. When its node goes, ours is the lowest (no node can come below the first,
//! sequence numbers only grow), so the waiter holds the lock as soon as the deletion reaches
//! it, if its own node is known to be still there (its watch set and not fired, the session
//! not reconnected since). A deletion wakes at most two waiters: the one just behind, which
//! takes the lock, and the one two behind, which lists.

use std::{
    future::poll_fn,
    task::Poll,
    time::{Duration, Instant},
};

use futures::{FutureExt as _, future::BoxFuture};
use zookeeper_client::{self as zk, OneshotWatcher, WatchedEvent};

use super::retry;
use crate::session::Conn;

/// A watch set and not fired yet: its event when it fires.
type Pending = BoxFuture<'static, WatchedEvent>;

/// The watch a waiter set on its own node, handed to the hold with its grant. Dropped before
/// it fires, a watch costs the client a `removeWatches` request; kept until the node's
/// deletion (whose event reaches the client before the `delete`'s answer), it costs nothing
/// more.
pub(crate) struct OwnWatch {
    /// Only ever dropped.
    _watch: Pending,
}

impl std::fmt::Debug for OwnWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnWatch")
    }
}

/// What one round of [`Watches::set`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// Every watch wanted is set (but a failed one on our own node or on the contender two
    /// before, which only costs a listing); the instant the round was sent, when one was
    /// needed and the server answered it (so the session was alive then).
    Set(Option<Instant>),
    /// The contender just before ours was gone when its watch was set; the instant the round
    /// was sent.
    BeforeGone(Instant),
    /// The contender two before ours was gone when its watch was set: list again.
    TwoBeforeGone,
    /// Our own node was gone when its watch was set: queue again.
    OwnGone,
}

/// Which watch fired.
#[derive(Debug)]
pub(super) enum Fired {
    /// The one on our own node.
    Own,
    /// The one on the contender node of this path.
    Contender(String),
}

/// The watches one attempt keeps (see the module's docs).
#[derive(Default)]
pub(super) struct Watches {
    /// The watch on our own node, once set.
    own: Option<Pending>,
    /// The session's state since the watch on our own node was set: a reconnection
    /// re-registers the session's watches and may deliver their events out of order (a
    /// deletion of ours after the one before it).
    states: Option<zk::StateWatcher>,
    /// Whether the session's state changed since then.
    reconnected: bool,
    /// The watches on contenders before ours, by path.
    contenders: Vec<(String, Pending)>,
}

impl Watches {
    /// Sets the watches wanted now: on `own` (unless set already), `before` and `two_before`;
    /// drops those on other contenders (they moved out of the two places before ours).
    ///
    /// # Errors
    /// The path and error of a failed watch on the contender just before ours (but for a node
    /// that is gone). A failure to watch our own node only leaves it unwatched (the caller then
    /// lists before taking the lock), and one on the contender two before only costs a
    /// listing when the one before goes.
    pub(super) async fn set(
        &mut self,
        conn: &Conn,
        own: &str,
        before: &str,
        two_before: Option<&str>,
    ) -> Result<Found, (String, zk::Error)> {
        self.contenders
            .retain(|(path, _)| path == before || Some(path.as_str()) == two_before);
        // Not held across the round below: the pending watches are not `Sync`.
        let (want_before, want_two_before) = {
            let has = |path: &str| self.contenders.iter().any(|(p, _)| p == path);
            (!has(before), two_before.filter(|path| !has(path)))
        };
        let want_own = self.own.is_none();
        if !want_before && want_two_before.is_none() && !want_own {
            return Ok(Found::Set(None));
        }
        if want_own {
            self.states = Some(conn.client().state_watcher());
            self.reconnected = false;
        }
        let sent = Instant::now();
        // The three go out together, answered in order: one round trip.
        let own_watch = async {
            if want_own {
                Some(conn.watch(own).await)
            } else {
                None
            }
        };
        let contender = async |path: Option<&str>| match path {
            Some(path) => Some(retry(|| conn.watch(path)).await),
            None => None,
        };
        let (own_watched, before_watched, two_before_watched) = tokio::join!(
            own_watch,
            contender(want_before.then_some(before)),
            contender(want_two_before)
        );
        // Whether the server answered any of them (a node that is gone is an answer too).
        let mut answered = false;
        match own_watched {
            Some(Ok((_, _, watcher))) => {
                answered = true;
                self.own = Some(pending(watcher));
            }
            Some(Err(zk::Error::NoNode)) => return Ok(Found::OwnGone),
            // Any other failure leaves ours unwatched: the caller lists before taking the lock.
            Some(Err(_)) | None => {}
        }
        let mut found = Found::Set(None);
        if let (Some(path), Some(watched)) = (want_two_before, two_before_watched) {
            answered |= is_answer(&watched);
            match watched {
                Ok((_, _, watcher)) => self.contenders.push((path.to_owned(), pending(watcher))),
                Err(zk::Error::NoNode) => found = Found::TwoBeforeGone,
                // Only a listing saved: the waiter still wakes when the one before it goes.
                Err(_) => {}
            }
        }
        if let Some(watched) = before_watched {
            answered |= is_answer(&watched);
            match watched {
                Ok((_, _, watcher)) => self.contenders.push((before.to_owned(), pending(watcher))),
                Err(zk::Error::NoNode) => found = Found::BeforeGone(sent),
                Err(error) => return Err((before.to_owned(), error)),
            }
        }
        Ok(match found {
            Found::Set(_) if answered => Found::Set(Some(sent)),
            found => found,
        })
    }

    /// Whether our own node is known to be still there: its watch set and not fired, and the
    /// session not reconnected since it was set. When not, the own node's watch is dropped,
    /// so that the next round sets it again (a `removeWatches` if it had not fired).
    pub(super) fn still_ours(&mut self) -> bool {
        if let Some(states) = &mut self.states
            && states.changed().now_or_never().is_some()
        {
            self.reconnected = true;
        }
        let pending = self
            .own
            .as_mut()
            .is_some_and(|own| own.as_mut().now_or_never().is_none());
        // Set again in the next round (after a reconnection too: else no later hand-off to
        // this waiter could skip its listing).
        if !pending || self.reconnected {
            self.own = None;
        }
        pending && !self.reconnected
    }

    /// The watch on our own node, when it is set and has not fired, for the hold of a grant
    /// (see [`OwnWatch`]).
    pub(super) fn take_own(&mut self) -> Option<OwnWatch> {
        self.own.take().map(|watch| OwnWatch { _watch: watch })
    }

    /// The next watch to fire, and its event (never, when none is set).
    pub(super) async fn fired(&mut self) -> (Fired, WatchedEvent) {
        poll_fn(|cx| {
            if let Some(own) = &mut self.own
                && let Poll::Ready(event) = own.as_mut().poll(cx)
            {
                self.own = None;
                return Poll::Ready((Fired::Own, event));
            }
            for at in 0..self.contenders.len() {
                if let Poll::Ready(event) = self.contenders[at].1.as_mut().poll(cx) {
                    let (path, _) = self.contenders.swap_remove(at);
                    return Poll::Ready((Fired::Contender(path), event));
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Whether the server answered a watch (a node that is gone is an answer too).
fn is_answer<T>(watched: &Result<T, zk::Error>) -> bool {
    matches!(watched, Ok(_) | Err(zk::Error::NoNode))
}

/// `watcher`'s event, as a future kept across rounds.
fn pending(watcher: OneshotWatcher) -> Pending {
    watcher.changed().boxed()
}

/// Whether a grant whose session was last proven alive at `alive` still leaves most of the
/// lease: past half of it, the caller lists (a fresh proof) rather than take a short lease.
pub(super) fn fresh(alive: Instant, lease_ttl: Duration) -> bool {
    alive.elapsed() < lease_ttl / 2
}
