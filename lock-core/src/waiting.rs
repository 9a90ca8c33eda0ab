//! Waiting on stores without push wake-ups: jittered back-off bounded by the holder's
//! remaining TTL and the wait budget.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use crate::{LockError, lease::Grant, request::AcquireRequest};

/// The outcome of one acquisition try on a store without push wake-ups.
#[derive(Debug)]
#[non_exhaustive]
pub enum Attempt {
    /// The lock was granted.
    Acquired(Grant),
    /// Someone else holds it; `expires_in` is the holder's remaining TTL when the store knows.
    Busy {
        /// Time left on the current holder's lease.
        expires_in: Option<Duration>,
    },
}

/// Repeats `try_once` until it acquires or `request`'s wait budget runs out, sleeping a
/// jittered, growing delay between tries that never overshoots the holder's remaining TTL nor
/// the budget. A zero budget makes exactly one try.
///
/// # Errors
/// [`LockError::Timeout`] when the budget runs out; any error of `try_once` at once.
///
/// # Cancel safety
/// Cancel safe if `try_once` is: nothing is held between tries.
pub async fn poll_until_acquired<F, Fut>(
    request: &AcquireRequest,
    mut try_once: F,
) -> Result<Grant, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt, LockError>>,
{
    let mut delays = request.backoff().delays();
    loop {
        let expires_in = match try_once().await? {
            Attempt::Acquired(grant) => return Ok(grant),
            Attempt::Busy { expires_in } => expires_in,
        };
        let now = Instant::now();
        let deadline = request.deadline();
        if now >= deadline {
            return Err(request.timeout_error());
        }
        let mut delay = delays.next().unwrap_or(request.backoff().max);
        if let Some(left) = expires_in {
            delay = delay.min(left + Duration::from_millis(1));
        }
        tokio::time::sleep_until((now + delay).min(deadline).into()).await;
    }
}
