//! Contract 4, expiry: a lease that is not renewed ends by itself within its TTL.

use std::time::{Duration, Instant};

use crate::scenario::{Scenario, ttl_expiry};
use crate::{Ctx, Outcome, ensure};

/// A holder that stops renewing loses the lock at its TTL; a waiter gets it with no clean-up,
/// and not before the TTL.
pub async fn expiry_frees_lock(ctx: Ctx) -> Outcome {
    let name = ctx.name("expiry");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let ttl = ctx.ttl();
    let start = Instant::now();
    let old = ctx.acquire_unrenewed(&a, &name).await?;
    let new = b
        .lock_with(&name, &ctx.options(ttl * 3 + ctx.margin()))
        .await?;
    let took = start.elapsed();
    ensure!(
        took >= ttl.mul_f64(0.95),
        "a waiter got the lock {took:?} after it was taken with a {ttl:?} TTL: before expiry"
    );
    ensure!(
        took <= ttl + ctx.margin(),
        "the lock was free only {took:?} after it was taken with a {ttl:?} TTL"
    );
    new.release().await?;
    drop(old);
    Ok(())
}

/// `extend` prolongs a lease beyond its first TTL (watchdog off).
pub async fn extend_prolongs_lease(ctx: Ctx) -> Outcome {
    let name = ctx.name("extend");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let ttl = ctx.ttl();
    let guard = ctx.acquire_unrenewed(&a, &name).await?;
    guard.extend(ttl * 4).await?;
    tokio::time::sleep(ttl + ctx.margin() / 2).await;
    ensure!(
        guard.is_held(),
        "the guard is not held after extend, one TTL later"
    );
    let other = b.try_lock_with(&name, &ctx.options(Duration::ZERO)).await?;
    ensure!(
        other.is_none(),
        "another client got the lock past the first TTL despite extend"
    );
    guard.release().await?;
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "expiry/frees_lock_without_cleanup",
            "4 expiry",
            ttl_expiry,
            expiry_frees_lock
        ),
        scenario!(
            "expiry/extend_prolongs_lease",
            "4 expiry, extend",
            ttl_expiry,
            extend_prolongs_lease
        ),
    ]
}
