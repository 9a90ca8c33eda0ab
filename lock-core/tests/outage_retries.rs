//! One rule for every store during an outage: `acquire` retries a retryable failure
//! (`Unavailable`) with jittered back-off inside its wait budget, and returns the failure when
//! the budget has run out; a zero budget is one try.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use lock_core::{
    LockBackend, LockClient, LockError, LockName, LockOptions, MemoryBackend,
    backend::{AcquireRequest, Grant, async_trait},
};
use support::{Fault, Faulty};

/// Fails the first `down_for` acquisitions with `Unavailable` (or, with `hangs`, never
/// answers them), then behaves.
#[derive(Debug, Default)]
struct Outage {
    down_for: usize,
    hangs: bool,
    tries: Arc<AtomicUsize>,
}

#[async_trait]
impl Fault for Outage {
    async fn acquire(
        &self,
        store: &MemoryBackend,
        request: &AcquireRequest,
    ) -> Result<Grant, LockError> {
        if self.tries.fetch_add(1, Ordering::SeqCst) < self.down_for {
            if self.hangs {
                std::future::pending::<()>().await;
            }
            return Err(LockError::unavailable_msg("connection refused"));
        }
        store.acquire(request).await
    }
}

fn client(down_for: usize) -> (LockClient, Arc<AtomicUsize>) {
    let outage = Outage {
        down_for,
        ..Outage::default()
    };
    let tries = outage.tries.clone();
    (LockClient::new(Faulty::new(outage)), tries)
}

#[tokio::test]
async fn a_short_outage_is_ridden_out_within_the_budget() {
    let (client, tries) = client(3);
    let name = LockName::new("outage-short").unwrap();
    let options = LockOptions::new().wait(Duration::from_secs(2));
    let guard = client
        .lock_with(&name, &options)
        .await
        .expect("three refusals within a 2 s budget are retried");
    assert_eq!(tries.load(Ordering::SeqCst), 4);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_long_outage_returns_unavailable_at_the_budget_without_spinning() {
    let (client, tries) = client(usize::MAX);
    let name = LockName::new("outage-long").unwrap();
    let budget = Duration::from_millis(500);
    let start = Instant::now();
    let result = client
        .lock_with(&name, &LockOptions::new().wait(budget))
        .await;
    let took = start.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "expected Unavailable, got {result:?}"
    );
    assert!(
        took >= budget / 2,
        "gave up after {took:?} of a {budget:?} budget"
    );
    assert!(took <= budget + Duration::from_millis(100), "took {took:?}");
    let calls = tries.load(Ordering::SeqCst);
    // Back-off from 10 ms doubling to 500 ms (jittered): a handful of tries, not a spin.
    assert!((2..=20).contains(&calls), "{calls} tries in {took:?}");
}

#[tokio::test]
async fn a_zero_budget_is_one_try_during_an_outage() {
    let (client, tries) = client(usize::MAX);
    let name = LockName::new("outage-zero").unwrap();
    let result = client
        .lock_with(&name, &LockOptions::new().wait(Duration::ZERO))
        .await;
    assert!(matches!(result, Err(LockError::Unavailable { .. })));
    assert_eq!(tries.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_store_that_never_answers_is_given_up_on_a_second_after_the_budget() {
    let client = LockClient::new(Faulty::new(Outage {
        down_for: usize::MAX,
        hangs: true,
        ..Outage::default()
    }));
    let name = LockName::new("outage-hang").unwrap();
    let budget = Duration::from_millis(200);
    let start = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        client.lock_with(&name, &LockOptions::new().wait(budget)),
    )
    .await
    .expect("acquire returned within 5 s of a 200 ms budget");
    let took = start.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "expected Unavailable, got {result:?}"
    );
    assert!(
        took <= budget + Duration::from_millis(1100),
        "took {took:?}"
    );
}
