//! Contract 7, the lost signal.

use std::time::{Duration, Instant};

use lock_core::{LockError, LossReason};

use crate::scenario::{Scenario, always};
use crate::{Ctx, Failure, Outcome, ensure};

/// A lock taken away behind the holder's back fires `lost()` within one renewal interval;
/// afterwards `is_held()` is false and `release` reports `Lost`.
pub async fn lost_fires_when_lock_is_taken_away(ctx: Ctx) -> Outcome {
    let name = ctx.name("lost-revoke");
    let client = ctx.client().await?;
    let guard = client
        .lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    ctx.store().revoke(&name).await?;
    let bound = ctx.ttl() + ctx.margin();
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .map_err(|_| Failure(format!("lost() did not fire within {bound:?} of a revoke")))?;
    ensure!(
        matches!(reason, LossReason::NotHeld | LossReason::SessionEnded),
        "lost() said {reason:?} after a revoke"
    );
    ensure!(!guard.is_held(), "is_held() is true after lost() fired");
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(LockError::Lost { .. })),
        "release of a lost hold returned {released:?}, expected Lost"
    );
    Ok(())
}

/// How late a timer may fire on a loaded machine.
const TIMER_SLACK: Duration = Duration::from_millis(20);

/// Without renewals, `lost()` fires at the local deadline (before the store's expiry).
pub async fn lost_fires_at_local_deadline(ctx: Ctx) -> Outcome {
    let name = ctx.name("lost-deadline");
    let client = ctx.client().await?;
    let ttl = ctx.ttl();
    let start = Instant::now();
    let guard = client
        .lock_with(&name, &ctx.options(Duration::ZERO).watchdog(false))
        .await?;
    ensure!(guard.is_held(), "a fresh guard is not held");
    let reason = tokio::time::timeout(ttl + ctx.margin(), guard.lost())
        .await
        .map_err(|_| Failure("lost() did not fire by the TTL without renewals".into()))?;
    let took = start.elapsed();
    ensure!(
        reason == LossReason::Expired,
        "lost() said {reason:?}, expected Expired"
    );
    // The deadline is the TTL less the drift allowance (7 ms at 500 ms) after the request
    // was sent; the timer behind lost() may fire a few ms late on a loaded machine (a Redlock
    // run measured 504.8 ms). A backend that dates grants from their reply (50 ms late) is
    // still caught.
    let bound = ttl + TIMER_SLACK;
    ensure!(
        took <= bound,
        "lost() fired {took:?} after acquisition, after the {ttl:?} TTL (bound {bound:?})"
    );
    ensure!(
        took >= ttl.mul_f64(0.9),
        "lost() fired {took:?} after acquisition, too early for a {ttl:?} TTL"
    );
    ensure!(
        !guard.is_held(),
        "is_held() is true past the local deadline"
    );
    drop(guard);
    Ok(())
}

/// A `lost()` future that outlives every guard resolves to `Released` at release.
pub async fn lost_future_resolves_on_release(ctx: Ctx) -> Outcome {
    let name = ctx.name("lost-release");
    let client = ctx.client().await?;
    let guard = client
        .lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    let lost = guard.lost();
    guard.release().await?;
    let reason = tokio::time::timeout(ctx.margin(), lost)
        .await
        .map_err(|_| Failure("lost() did not resolve after release".into()))?;
    ensure!(
        reason == LossReason::Released,
        "lost() said {reason:?} after release"
    );
    Ok(())
}

/// A normal release is not a loss: a watchdog renewal that reaches the store after the release
/// (and is answered "not held") while the release's own answer is still on its way does not
/// make `lost()` say `NotHeld`.
pub async fn release_is_not_reported_as_loss(ctx: Ctx) -> Outcome {
    let name = ctx.name("lost-release-race");
    let (client, delaying) = ctx.delaying_client().await?;
    let options = ctx.options(Duration::ZERO);
    let guard = client.lock_with(&name, &options).await?;
    let lost = tokio::spawn(guard.lost());
    // Two renewal intervals between the store's release and its answer: the watchdog renews
    // at least once in between if it still considers the hold its own.
    delaying.delay_release_replies(options.renew_interval() * 2);
    guard.release().await?;
    let reason = tokio::time::timeout(ctx.margin(), lost)
        .await
        .map_err(|_| Failure("lost() did not resolve after release".into()))?
        .map_err(|e| Failure(format!("the lost() task failed: {e}")))?;
    ensure!(
        reason == LossReason::Released,
        "lost() said {reason:?} for a hold that was released normally"
    );
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "lost/fires_when_taken_away",
            "7 lost signal",
            always,
            lost_fires_when_lock_is_taken_away
        ),
        scenario!(
            "lost/fires_at_local_deadline",
            "7 lost signal",
            always,
            lost_fires_at_local_deadline
        ),
        scenario!(
            "lost/resolves_on_release",
            "7 lost signal",
            always,
            lost_future_resolves_on_release
        ),
        scenario!(
            "lost/release_is_not_a_loss",
            "7 lost signal",
            always,
            release_is_not_reported_as_loss
        ),
    ]
}
