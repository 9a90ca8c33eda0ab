//! Contract 5, waiting: the budget is honoured and release wakes waiters promptly.

use std::time::{Duration, Instant};

use lock_core::{Holder, LockError, LockOptions, Wakeup};

use crate::scenario::{Scenario, always, fifo, starvation_free};
use crate::{Ctx, Failure, Outcome, ensure};

/// A waiter on a held lock gets `Timeout`, not before its budget nor long after.
pub async fn wait_budget_is_honoured(ctx: Ctx) -> Outcome {
    let name = ctx.name("budget");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let held = a
        .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(10)))
        .await?;
    let rtt = ctx.round_trip().await?;
    let budget = Duration::from_millis(300);
    let start = Instant::now();
    let result = b.lock_with(&name, &ctx.options(budget)).await;
    let took = start.elapsed();
    ensure!(
        matches!(result, Err(LockError::Timeout { .. })),
        "waiting on a held lock returned {result:?}, expected Timeout"
    );
    ensure!(
        took >= budget.mul_f64(0.9),
        "gave up after {took:?}, before the {budget:?} budget"
    );
    // The last try may start just before the budget ends: a few round trips past it.
    let bound = budget + rtt * 4 + Duration::from_millis(100);
    ensure!(
        took <= bound,
        "returned Timeout after {took:?}, past the {budget:?} budget (bound {bound:?}, round trip {rtt:?})"
    );
    held.release().await?;
    Ok(())
}

/// A zero budget makes one try: an immediate `Timeout` (and `None` from `try_acquire`).
pub async fn zero_budget_is_one_try(ctx: Ctx) -> Outcome {
    let name = ctx.name("zero-budget");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let held = a
        .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(10)))
        .await?;
    let rtt = ctx.round_trip().await?;
    let start = Instant::now();
    let result = b.lock_with(&name, &ctx.options(Duration::ZERO)).await;
    let took = start.elapsed();
    ensure!(
        matches!(result, Err(LockError::Timeout { .. })),
        "a zero-budget acquire returned {result:?}, expected Timeout"
    );
    // One try: about one acquire round trip (the cycle measured is two), never a wait.
    let bound = rtt * 4 + Duration::from_millis(50);
    ensure!(
        took <= bound,
        "a zero-budget acquire took {took:?} (bound {bound:?}, round trip {rtt:?})"
    );
    let tried = b.try_lock_with(&name, &ctx.options(Duration::ZERO)).await?;
    ensure!(tried.is_none(), "try_acquire got a held lock");
    held.release().await?;
    Ok(())
}

/// A waiter acquires promptly after the release, long before the holder's TTL: through the
/// store's notification on push stores, within one back-off step on poll stores.
pub async fn release_wakes_waiter_promptly(ctx: Ctx) -> Outcome {
    let name = ctx.name("wakeup");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let rtt = ctx.round_trip().await?;
    let holder_options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.lock_with(&name, &holder_options).await?;
    let waiter_options = holder_options.clone().wait(Duration::from_secs(3));
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = b.lock_with(&name, &waiter_options).await;
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

/// Where the store declares FIFO wait order, waiters from different clients get the lock in
/// the order they started waiting.
pub async fn fifo_order_where_declared(ctx: Ctx) -> Outcome {
    const WAITERS: usize = 4;
    let name = ctx.name("fifo");
    let holder_client = ctx.client().await?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder_client.lock_with(&name, &long).await?;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for index in 0..WAITERS {
        let client = ctx.client().await?;
        let (name, order) = (name.clone(), order.clone());
        let options = long.clone().wait(Duration::from_secs(20));
        tasks.push(tokio::spawn(async move {
            let guard = client.lock_with(&name, &options).await?;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(index);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await
        }));
        // The stimulus: waiter i starts waiting well before waiter i + 1.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    held.release().await?;
    for task in tasks {
        task.await
            .map_err(|e| Failure(format!("a waiter panicked: {e}")))??;
    }
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        order == (0..WAITERS).collect::<Vec<_>>(),
        "waiters got the lock in the order {order:?}, not the order they came in"
    );
    Ok(())
}

/// Where the store declares an order, no client starves: separate clients that release and
/// take the lock again in a loop each get at least half the mean number of turns.
pub async fn no_client_starves(ctx: Ctx) -> Outcome {
    const CLIENTS: usize = 6;
    let name = ctx.name("starve");
    let run_for = Duration::from_millis(1500);
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = ctx.client().await?;
        let name = name.clone();
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        tasks.push(tokio::spawn(async move {
            let holder = Holder::new();
            let mut turns = 0usize;
            loop {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok::<usize, LockError>(turns);
                }
                let guard = match client
                    .acquire(&holder, &name, &options.clone().wait(left))
                    .await
                {
                    Ok(guard) => guard,
                    Err(LockError::Timeout { .. }) => return Ok(turns),
                    Err(error) => return Err(error),
                };
                turns += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await?;
            }
        }));
    }
    let mut turns = Vec::with_capacity(CLIENTS);
    for task in tasks {
        turns.push(
            task.await
                .map_err(|e| Failure(format!("a client panicked: {e}")))??,
        );
    }
    let total: usize = turns.iter().sum();
    ensure!(total >= 2 * CLIENTS, "only {turns:?} turns in {run_for:?}");
    // At least half the mean: fewest * CLIENTS * 2 >= total.
    let fewest = turns.iter().copied().min().unwrap_or(0);
    ensure!(
        fewest * CLIENTS * 2 >= total,
        "a client starved: turns per client {turns:?} (mean {:.1})",
        total as f64 / CLIENTS as f64
    );
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "waiting/budget_is_honoured",
            "5 waiting",
            always,
            wait_budget_is_honoured
        ),
        scenario!(
            "waiting/zero_budget_is_one_try",
            "5 waiting",
            always,
            zero_budget_is_one_try
        ),
        scenario!(
            "waiting/release_wakes_waiter_promptly",
            "5 waiting",
            always,
            release_wakes_waiter_promptly
        ),
        scenario!(
            "waiting/fifo_order_where_declared",
            "5 waiting, WaitOrder::Fifo",
            fifo,
            fifo_order_where_declared
        ),
        scenario!(
            "waiting/no_client_starves",
            "5 waiting, WaitOrder::Fifo or Fair",
            starvation_free,
            no_client_starves
        ),
    ]
}
