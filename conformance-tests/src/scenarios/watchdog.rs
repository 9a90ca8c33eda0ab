//! Contract 8, the watchdog: renews in the background, batches, stops at release and max_hold.

use std::time::{Duration, Instant};

use futures::future::try_join_all;
use lock_core::{Holder, LossReason};

use crate::{Ctx, Failure, Outcome, ensure};

/// The watchdog keeps a lock held across several TTLs.
pub(crate) async fn keeps_lock_past_ttls(ctx: Ctx) -> Outcome {
    let name = ctx.name("watchdog-keeps");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let ttl = ctx.ttl();
    let guard = a
        .acquire(&Holder::new(), &name, &ctx.options(Duration::ZERO))
        .await?;
    let start = Instant::now();
    while start.elapsed() < ttl * 3 {
        ensure!(
            guard.is_held(),
            "not held {:?} into a hold with a {ttl:?} TTL",
            start.elapsed()
        );
        tokio::time::sleep(ttl / 4).await;
    }
    let other = b
        .try_acquire(&Holder::new(), &name, &ctx.options(Duration::ZERO))
        .await?;
    ensure!(
        other.is_none(),
        "another client got the lock after 3 TTLs despite the watchdog"
    );
    let info = b.inspect(&name).await?;
    ensure!(
        info.is_some_and(|i| i.token == *guard.lease().token()),
        "the store does not show the renewed lease"
    );
    guard.release().await?;
    Ok(())
}

/// After release (and after drop) the watchdog renews nothing more.
pub(crate) async fn stops_after_release_and_drop(ctx: Ctx) -> Outcome {
    let (client, counting) = ctx.counting_client().await?;
    let options = ctx.options(Duration::ZERO);
    let released = client
        .acquire(&Holder::new(), &ctx.name("watchdog-release"), &options)
        .await?;
    released.release().await?;
    let dropped = client
        .acquire(&Holder::new(), &ctx.name("watchdog-drop"), &options)
        .await?;
    drop(dropped);
    let before = counting.counts();
    tokio::time::sleep(ctx.ttl() * 2).await;
    let after = counting.counts();
    ensure!(
        before == after,
        "renewals continued after release/drop: {before:?} then {after:?}"
    );
    Ok(())
}

/// At `max_hold` the hold ends: `lost()` says `MaxHold`, and a waiter gets the lock at once.
pub(crate) async fn stops_at_max_hold(ctx: Ctx) -> Outcome {
    let name = ctx.name("max-hold");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let ttl = ctx.ttl();
    let max_hold = ttl * 2;
    let start = Instant::now();
    let guard = a
        .acquire(
            &Holder::new(),
            &name,
            &ctx.options(Duration::ZERO).max_hold(max_hold),
        )
        .await?;
    let reason = tokio::time::timeout(max_hold + ctx.margin() * 2, guard.lost())
        .await
        .map_err(|_| Failure(format!("the hold outlived its max_hold of {max_hold:?}")))?;
    let took = start.elapsed();
    ensure!(
        reason == LossReason::MaxHold,
        "lost() said {reason:?}, expected MaxHold"
    );
    ensure!(
        took >= max_hold.mul_f64(0.9),
        "the hold ended after {took:?}, before its max_hold of {max_hold:?}"
    );
    ensure!(
        took <= max_hold + ctx.margin(),
        "the hold ended {took:?} in, past max_hold {max_hold:?}"
    );
    let next = b
        .acquire(&Holder::new(), &name, &ctx.options(ctx.margin() * 2))
        .await?;
    next.release().await?;
    drop(guard);
    Ok(())
}

/// Renewals of many locks taken together are batched: far fewer store calls than locks.
pub(crate) async fn batches_renewals(ctx: Ctx) -> Outcome {
    const LOCKS: usize = 20;
    let (client, counting) = ctx.counting_client().await?;
    let options = ctx.options(Duration::ZERO);
    let names: Vec<_> = (0..LOCKS).map(|_| ctx.name("batch")).collect();
    let (client, options) = (&client, &options);
    let guards = try_join_all(names.iter().map(|name| async move {
        let holder = Holder::new();
        client.acquire(&holder, name, options).await
    }))
    .await?;
    let renewed = counting.wait_renewed(LOCKS, ctx.ttl() * 2).await;
    let counts = counting.counts();
    ensure!(
        renewed,
        "{LOCKS} locks were not all renewed within 2 TTLs: {counts:?}"
    );
    let calls = counts.renew_calls + counts.renew_many_calls;
    ensure!(
        calls <= LOCKS / 5,
        "renewing {LOCKS} locks took {calls} store calls ({counts:?}); expected batches"
    );
    for guard in guards {
        guard.release().await?;
    }
    Ok(())
}
