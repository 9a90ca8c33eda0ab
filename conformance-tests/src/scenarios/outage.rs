//! Contracts 5 and 11 during an outage: one rule for every store. `acquire` retries a
//! retryable failure with back-off inside its wait budget and reports `Unavailable` when the
//! budget has run out; a zero budget is one try; a waiter rides out an outage shorter than
//! its budget.

use std::time::{Duration, Instant};

use lock_core::{LockClient, LockError, LockName};

use crate::scenario::{Scenario, outages};
use crate::{Ctx, Failure, Outcome, ensure};

/// The budget of the acquisitions made while the store is down.
const BUDGET: Duration = Duration::from_millis(800);

/// An outage is retried inside the wait budget, reported as `Unavailable` when the budget runs
/// out, and ridden out by a waiter with budget to spare.
pub async fn outage_is_retried_within_the_budget(ctx: Ctx) -> Outcome {
    let name = ctx.name("outage");
    let client = ctx.client().await?;
    client
        .lock_with(&name, &ctx.options(Duration::ZERO))
        .await?
        .release()
        .await?;
    ctx.store().begin_outage().await?;
    let during = while_down(&ctx, &client, &name).await;
    let rider = tokio::spawn({
        let (client, name, options) = (
            client.clone(),
            name.clone(),
            ctx.options(Duration::from_secs(30)),
        );
        async move {
            let guard = client.lock_with(&name, &options).await?;
            guard.release().await
        }
    });
    let ended = ctx.store().end_outage().await;
    during?;
    ended?;
    rider
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?
        .map_err(|e| {
            Failure(format!(
                "a waiter with 30 s to spare did not ride out the outage: {e}"
            ))
        })?;
    Ok(())
}

async fn while_down(ctx: &Ctx, client: &LockClient, name: &LockName) -> Outcome {
    let start = Instant::now();
    let result = client.lock_with(name, &ctx.options(BUDGET)).await;
    let took = start.elapsed();
    ensure!(
        matches!(&result, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "with the store down, acquire with a {BUDGET:?} budget returned {result:?}, expected Unavailable"
    );
    ensure!(
        took >= BUDGET.mul_f64(0.9),
        "with the store down, acquire gave up after {took:?} of its {BUDGET:?} budget: retryable failures are retried inside the budget"
    );
    ensure!(
        took <= BUDGET + ctx.margin(),
        "with the store down, acquire returned after {took:?}, past its {BUDGET:?} budget: {result:?}"
    );
    let start = Instant::now();
    let result = client.lock_with(name, &ctx.options(Duration::ZERO)).await;
    let took = start.elapsed();
    ensure!(
        matches!(&result, Err(LockError::Unavailable { .. })),
        "with the store down, a one-try acquire returned {result:?}, expected Unavailable"
    );
    ensure!(
        took <= ctx.margin(),
        "with the store down, a one-try acquire took {took:?}"
    );
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![scenario!(
        "outage/retried_within_budget",
        "5 waiting, 11 errors: outages",
        outages,
        outage_is_retried_within_the_budget
    )]
}
