//! Contract 9, cancellation: a dropped `acquire` leaves nothing held beyond the TTL (session
//! stores: nothing at all).

use std::time::{Duration, Instant};

use futures::future::join_all;
use lock_core::{Expiry, Holder, LockOptions};

use crate::scenario::{Scenario, always};
use crate::{Ctx, Failure, Outcome, ensure};

/// A waiter whose `acquire` is dropped while it waits leaves no trace: once the holder
/// releases, a third client gets the lock at once.
pub async fn dropped_waiter_leaves_nothing(ctx: Ctx) -> Outcome {
    let name = ctx.name("cancel-waiter");
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = a.lock_with(&name, &long).await?;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        b.lock_with(&name, &long.clone().wait(Duration::from_secs(10))),
    )
    .await;
    ensure!(cancelled.is_err(), "a waiter got a held lock");
    held.release().await?;
    let start = Instant::now();
    let next = c
        .lock_with(&name, &long.clone().wait(ctx.margin() * 2))
        .await
        .map_err(|e| Failure(format!("after a dropped waiter the lock stayed taken: {e}")))?;
    let took = start.elapsed();
    ensure!(
        took <= ctx.margin(),
        "the lock was free only {took:?} after release"
    );
    next.release().await?;
    Ok(())
}

/// `acquire` futures dropped at arbitrary points leave nothing held past the TTL (session
/// stores: past the background clean-up).
pub async fn dropped_acquire_leaves_nothing_beyond_ttl(ctx: Ctx) -> Outcome {
    let rtt = ctx.round_trip().await?;
    let (b, c) = (ctx.client().await?, ctx.client().await?);
    let names: Vec<_> = (0..10).map(|_| ctx.name("cancel-any")).collect();
    let options = ctx.options(Duration::from_secs(5));
    for (i, name) in names.iter().enumerate() {
        // Cut each attempt at a different point of its round trip.
        let cut = rtt.mul_f64(i as f64 / 8.0);
        let _ = tokio::time::timeout(cut, b.lock_with(name, &options)).await;
    }
    let wait = match ctx.caps().expiry {
        Expiry::Ttl => ctx.ttl() + ctx.margin(),
        _ => ctx.margin() * 2,
    };
    let start = Instant::now();
    let (c, options) = (&c, &ctx.options(wait));
    let results = join_all(names.iter().map(|name| async move {
        let holder = Holder::new();
        c.acquire(&holder, name, options).await
    }))
    .await;
    for (name, result) in names.iter().zip(results) {
        let guard = result.map_err(|e| {
            Failure(format!(
                "`{name}` stayed taken {:?} after a dropped acquire: {e}",
                start.elapsed()
            ))
        })?;
        guard.release().await?;
    }
    Ok(())
}

/// A `release()` future dropped while the store release is in flight still ends the hold: the
/// lock is freed in the background, the watchdog stops, and `lost()` resolves.
pub async fn cancelled_release_still_releases(ctx: Ctx) -> Outcome {
    let name = ctx.name("cancel-release");
    let ((a, delaying), b) = (ctx.delaying_client().await?, ctx.client().await?);
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = a.lock_with(&name, &long).await?;
    let lost = tokio::spawn(guard.lost());
    delaying.delay_releases(Duration::from_millis(100));
    let cut = tokio::time::timeout(Duration::from_millis(10), guard.release()).await;
    ensure!(
        cut.is_err(),
        "a release delayed by 100 ms finished in 10 ms"
    );
    let bound = ctx.margin() * 4 + Duration::from_millis(100);
    let next = b
        .lock_with(&name, &long.clone().wait(bound))
        .await
        .map_err(|e| Failure(format!("a cancelled release left the lock held: {e}")))?;
    let reason = tokio::time::timeout(ctx.margin(), lost)
        .await
        .map_err(|_| Failure("lost() did not resolve after a cancelled release".into()))?
        .map_err(|e| Failure(format!("the lost() task failed: {e}")))?;
    ensure!(
        reason == lock_core::LossReason::Released,
        "lost() said {reason:?} after a cancelled release"
    );
    next.release().await?;
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "cancel/dropped_waiter_leaves_nothing",
            "9 cancellation",
            always,
            dropped_waiter_leaves_nothing
        ),
        scenario!(
            "cancel/dropped_acquire_leaves_nothing",
            "9 cancellation",
            always,
            dropped_acquire_leaves_nothing_beyond_ttl
        ),
        scenario!(
            "cancel/cancelled_release_still_releases",
            "9, 10 cancellation",
            always,
            cancelled_release_still_releases
        ),
    ]
}
