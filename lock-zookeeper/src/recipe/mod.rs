//! The lock recipe: ephemeral sequential contender nodes under the lock's container node, the
//! lowest sequence holds, every other contender watches its own node and the two before it.
//!
//! An acquisition sends `create` and `getChildren` together (requests of one session are
//! applied in order, so the listing includes the new node): an uncontended lock costs one round
//! trip. A contender that is not first watches the nodes one and two before it and lists again
//! when one of them goes, so a release wakes at most two waiters; one whose listing showed it
//! right behind the first node holds the lock as soon as that node is deleted, without listing
//! (no node can come below it), and in a queue served in order every waiter lists while the
//! one before it holds, off the hand-off's path (`watches.rs`). A `create` whose reply was lost
//! is resolved by finding the node again by its UUID, never by creating a second one. Until a node is known to be granted or deleted, a [`Cleanup`] guard
//! owns it: dropping the acquire future deletes the node in the background.
//!
//! The wait loop is in `wait.rs`, the watches it keeps in `watches.rs`, the contender node's
//! life cycle in `contender.rs`, the reads (who holds it, its fence) in `read.rs`; the retry
//! policy of single requests is here.

mod contender;
mod read;
mod wait;
mod watches;

use std::time::{Duration, Instant};

use lock_core::{Fence, LockError, backend::LeaseToken};
use tokio::time::sleep;
use zookeeper_client::{self as zk, SessionId};

pub(crate) use contender::delete;
pub(crate) use read::{fence, inspect};
pub(crate) use wait::acquire;
pub(crate) use watches::OwnWatch;

use crate::error::{ZkError, is_session_end, is_transient};

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
    /// The watch on the node set while it waited, if any (see [`OwnWatch`]).
    pub(crate) own_watch: Option<OwnWatch>,
}

/// Why one attempt ended without a grant.
pub(super) enum Stop {
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
pub(super) async fn retry<T, F, Fut>(mut request: F) -> Result<T, zk::Error>
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
