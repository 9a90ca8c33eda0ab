//! Waiting for a condition the test cannot be told about: polled, with a deadline, never a
//! fixed sleep in its place.

use std::time::{Duration, Instant};

use crate::{Failure, Outcome};

/// How often [`poll_until`] checks.
const INTERVAL: Duration = Duration::from_millis(10);

/// Checks `check` every 10 ms until it returns `true`; fails with `<what> did not happen
/// within <limit>` once `limit` has passed. A failure of `check` itself ends the wait at once.
///
/// ```
/// # conformance_tests::runtime().unwrap().block_on(async {
/// use std::time::Duration;
///
/// let mut polls = 0;
/// conformance_tests::faults::poll_until(Duration::from_secs(1), "the third poll", async || {
///     polls += 1;
///     Ok(polls == 3)
/// })
/// .await
/// .unwrap();
/// # });
/// ```
///
/// # Errors
/// When the condition does not hold in time, or `check` fails.
pub async fn poll_until(
    limit: Duration,
    what: &str,
    check: impl AsyncFnMut() -> Result<bool, Failure>,
) -> Outcome {
    poll_every(INTERVAL, limit, what, check).await
}

/// [`poll_until`], checking every `interval`: shorter where a test samples something that
/// lasts only briefly.
///
/// # Errors
/// When the condition does not hold in time, or `check` fails.
pub async fn poll_every(
    interval: Duration,
    limit: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<bool, Failure>,
) -> Outcome {
    let start = Instant::now();
    loop {
        if check().await? {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(Failure(format!("{what} did not happen within {limit:?}")));
        }
        tokio::time::sleep(interval).await;
    }
}
