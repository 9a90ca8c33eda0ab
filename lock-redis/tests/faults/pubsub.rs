//! The pub/sub connection of waiters: a connection that stops answering costs a waiter its
//! push wake-ups, never its wait budget.

use std::time::{Duration, Instant};

use conformance_tests::ensure;
use lock_core::{LockError, LockOptions};

use super::{Outcome, fail, name, proxy::Proxy, single_client, var};

/// Two waiters of a client whose pub/sub connection is half-open (accepted, never answered)
/// each return `Timeout` within their 300 ms budget: the subscription is bounded, and the
/// second waiter is not stuck behind the first.
pub(super) async fn half_open_pubsub_keeps_the_wait_budget() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    // The backend's first connection (its multiplexed one) is forwarded; the pub/sub
    // connection, opened when a waiter first subscribes, is not.
    let proxy = Proxy::start(&url, 1).await?;
    let b = single_client(&proxy.url).await?;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let budget = Duration::from_millis(300);
    for i in 0..2 {
        let lock = name(&format!("half-open-pubsub-{i}"))?;
        held.push(
            a.lock_with(&lock, &options)
                .await
                .map_err(fail("acquire"))?,
        );
        let b = b.clone();
        waiting.push(tokio::spawn(async move {
            let start = Instant::now();
            let result = tokio::time::timeout(
                Duration::from_secs(3),
                b.lock_with(&lock, &LockOptions::new().wait(budget)),
            )
            .await;
            (start.elapsed(), result.map(|r| r.map(|g| g.fence())))
        }));
    }
    let mut outcome = Ok(());
    for (i, task) in waiting.into_iter().enumerate() {
        let (took, result) = task.await.map_err(fail("waiter task"))?;
        let checked = (|| {
            ensure!(
                matches!(result, Ok(Err(LockError::Timeout { .. }))),
                "waiter {i} with a {budget:?} budget and a half-open pub/sub connection gave \
                 {result:?} after {took:?} (Err(Elapsed) = still waiting after 3 s)"
            );
            ensure!(
                took <= budget + Duration::from_millis(300),
                "waiter {i} returned Timeout after {took:?} for a {budget:?} budget"
            );
            Ok(())
        })();
        outcome = outcome.and(checked);
    }
    for guard in held {
        guard.release().await.map_err(fail("release"))?;
    }
    drop(proxy);
    outcome
}
