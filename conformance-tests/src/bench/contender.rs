//! One client of a lock library as the workloads of separate clients drive it (the fleets on
//! one lock, the client sweep on many names, a peer's uncontended cycle): take a named lock,
//! hold it, release it. This library's clients and the peers' (libraries a user would
//! otherwise pick) implement [`Contender`] alike, so each workload measures them the same way.

use std::{
    fmt,
    future::Future,
    time::{Duration, Instant},
};

use lock_core::{Holder, LockClient, LockError, LockName, LockOptions};

/// A turn that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnError {
    /// The store answered that it cannot serve now and the caller may retry (this library's
    /// [`LockError::Unavailable`], from the acquire or the release): the sweep counts these
    /// and goes on.
    Unavailable(String),
    /// Any other error: the fleets count it and go on, the sweep stops.
    Failed(String),
}

impl fmt::Display for TurnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(text) | Self::Failed(text) => f.write_str(text),
        }
    }
}

/// When a turn's `acquire` returned and when its release began, or `None` when the turn's
/// end came before the lock was had.
pub type Turn = Result<Option<(Instant, Instant)>, TurnError>;

/// One client of a lock library: takes the lock `name` once (waiting at most until `end`),
/// holds it for `hold`, and releases it. Implemented for this library's clients here; a
/// benchmark implements it for a peer library to compare with.
pub trait Contender {
    /// One turn on `name`: when `acquire` returned and when the release began, or `None`
    /// when `end` passed before the lock was had.
    fn turn(&self, name: &LockName, end: Instant, hold: Duration) -> impl Future<Output = Turn>;
}

/// One turn of a peer library's client, for its [`Contender`]: `acquire`, bounded by the time
/// left until `end` (`None` when that runs out first), hold `hold`, then `release` the
/// guard; when `acquire` returned and when the release began.
///
/// # Errors
/// `acquire`'s error, or `release`'s (a failed turn, as a failed release is for this library's
/// clients), as [`TurnError::Failed`].
pub async fn peer_turn<G, A, R, RF>(end: Instant, hold: Duration, acquire: A, release: R) -> Turn
where
    A: Future<Output = Result<G, String>>,
    R: FnOnce(G) -> RF,
    RF: Future<Output = Result<(), String>>,
{
    let left = end.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok(None);
    }
    let guard = match tokio::time::timeout(left, acquire).await {
        Ok(guard) => guard.map_err(TurnError::Failed)?,
        Err(_) => return Ok(None),
    };
    let acquired = Instant::now();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    let released = Instant::now();
    release(guard).await.map_err(TurnError::Failed)?;
    Ok(Some((acquired, released)))
}

/// A [`LockClient`] taking its turns as a user of this library would: `acquire` with the
/// budget that is left, hold, `release`.
pub(super) struct Ours {
    client: LockClient,
    holder: Holder,
    options: LockOptions,
}

impl Ours {
    /// `client` with a holder of its own, acquiring with `options` (its wait is each turn's
    /// budget).
    pub(super) fn new(client: LockClient, options: LockOptions) -> Self {
        Self {
            client,
            holder: Holder::new(),
            options,
        }
    }
}

impl Contender for Ours {
    async fn turn(&self, name: &LockName, end: Instant, hold: Duration) -> Turn {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let options = self.options.clone().wait(left);
        let guard = match self.client.acquire(&self.holder, name, &options).await {
            Ok(guard) => guard,
            Err(LockError::Timeout { .. }) => return Ok(None),
            Err(error @ LockError::Unavailable { .. }) => {
                return Err(TurnError::Unavailable(error.to_string()));
            }
            Err(error) => return Err(TurnError::Failed(error.to_string())),
        };
        let acquired = Instant::now();
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        let released = Instant::now();
        match guard.release().await {
            Ok(()) => Ok(Some((acquired, released))),
            // A store too slow to answer the release (its lease ends with its TTL) answers as
            // an acquire it could not answer does: counted, not the end of the run.
            Err(error @ LockError::Unavailable { .. }) => {
                Err(TurnError::Unavailable(error.to_string()))
            }
            Err(error) => Err(TurnError::Failed(error.to_string())),
        }
    }
}

/// How long one uncontended cycle of [`cycle`] may wait for its lock.
const CYCLE_WAIT: Duration = Duration::from_secs(30);

/// One uncontended cycle of `contender` on `name`: a turn holding nothing.
///
/// # Errors
/// The turn's error, or a lock not had within 30 s (nothing else holds it), as text.
pub(super) async fn cycle<T: Contender>(contender: &T, name: &LockName) -> Result<(), String> {
    match contender
        .turn(name, Instant::now() + CYCLE_WAIT, Duration::ZERO)
        .await
    {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!(
            "an uncontended lock was not had within {CYCLE_WAIT:?}"
        )),
        Err(error) => Err(error.to_string()),
    }
}
