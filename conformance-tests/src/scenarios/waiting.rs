//! Contract 5, waiting: the budget is honoured and release wakes waiters promptly.

use std::time::{Duration, Instant};

use lock_core::{Holder, LockError, LockOptions, Wakeup};

use crate::{Ctx, Failure, Outcome, ensure};

/// A waiter on a held lock gets `Timeout`, not before its budget nor long after.
pub(crate) async fn wait_budget_is_honoured(ctx: Ctx) -> Outcome {
    let name = ctx.name("budget");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let held = a
        .acquire(
            &Holder::new(),
            &name,
            &LockOptions::new().ttl(Duration::from_secs(10)),
        )
        .await?;
    let budget = Duration::from_millis(300);
    let start = Instant::now();
    let result = b.acquire(&Holder::new(), &name, &ctx.options(budget)).await;
    let took = start.elapsed();
    ensure!(
        matches!(result, Err(LockError::Timeout { .. })),
        "waiting on a held lock returned {result:?}, expected Timeout"
    );
    ensure!(
        took >= budget.mul_f64(0.9),
        "gave up after {took:?}, before the {budget:?} budget"
    );
    ensure!(
        took <= budget + ctx.margin(),
        "returned Timeout after {took:?}, well past the {budget:?} budget"
    );
    held.release().await?;
    Ok(())
}

/// A zero budget makes one try: an immediate `Timeout` (and `None` from `try_acquire`).
pub(crate) async fn zero_budget_is_one_try(ctx: Ctx) -> Outcome {
    let name = ctx.name("zero-budget");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let held = a
        .acquire(
            &Holder::new(),
            &name,
            &LockOptions::new().ttl(Duration::from_secs(10)),
        )
        .await?;
    let start = Instant::now();
    let result = b
        .acquire(&Holder::new(), &name, &ctx.options(Duration::ZERO))
        .await;
    let took = start.elapsed();
    ensure!(
        matches!(result, Err(LockError::Timeout { .. })),
        "a zero-budget acquire returned {result:?}, expected Timeout"
    );
    ensure!(took <= ctx.margin(), "a zero-budget acquire took {took:?}");
    let tried = b
        .try_acquire(&Holder::new(), &name, &ctx.options(Duration::ZERO))
        .await?;
    ensure!(tried.is_none(), "try_acquire got a held lock");
    held.release().await?;
    Ok(())
}

/// A waiter acquires promptly after the release, long before the holder's TTL: through the
/// store's notification on push stores, within one back-off step on poll stores.
pub(crate) async fn release_wakes_waiter_promptly(ctx: Ctx) -> Outcome {
    let name = ctx.name("wakeup");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let rtt = ctx.round_trip().await?;
    let holder_options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.acquire(&Holder::new(), &name, &holder_options).await?;
    let waiter_options = holder_options.clone().wait(Duration::from_secs(3));
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = b.acquire(&Holder::new(), &name, &waiter_options).await;
            (Instant::now(), guard)
        }
    });
    // The stimulus: release while the waiter is waiting (it started 200 ms earlier).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    held.release().await?;
    let (acquired, guard) = waiter
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?;
    let guard = guard?;
    ensure!(
        acquired >= released,
        "the waiter got the lock before it was released"
    );
    let latency = acquired - released;
    let mut bound = rtt * 5 + Duration::from_millis(100);
    if ctx.caps().wakeup == Wakeup::Poll {
        bound += holder_options.backoff.max;
    }
    ensure!(
        latency <= bound,
        "the waiter acquired {latency:?} after the release (bound {bound:?}, round trip {rtt:?})"
    );
    guard.release().await?;
    Ok(())
}
