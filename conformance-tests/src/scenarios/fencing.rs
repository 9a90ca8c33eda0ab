//! Contract 3, fencing: every acquisition's fence is greater than every earlier one.

use std::time::Duration;

use crate::scenario::{Scenario, always, ttl_expiry};
use crate::{Ctx, Outcome, ensure};

/// Acquisitions by different holders and clients, one after another, get increasing fences.
pub async fn fences_increase_across_holders(ctx: Ctx) -> Outcome {
    let name = ctx.name("fences");
    let clients = [ctx.client().await?, ctx.client().await?];
    let mut last = None;
    for round in 0..6 {
        let guard = clients[round % 2]
            .lock_with(&name, &ctx.options(Duration::from_secs(5)))
            .await?;
        let fence = guard.fence();
        ensure!(
            last.is_none_or(|l| fence > l),
            "fence {fence} of acquisition {round} is not above the previous {last:?}"
        );
        last = Some(fence);
        guard.release().await?;
    }
    Ok(())
}

/// A holder that dies without releasing (its lease expires) is followed by a larger fence.
pub async fn fences_increase_across_expiry(ctx: Ctx) -> Outcome {
    let name = ctx.name("fence-expiry");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let old = ctx.acquire_unrenewed(&a, &name).await?;
    let new = ctx.acquire_after_expiry(&b, &name).await?;
    ensure!(
        new.fence() > old.fence(),
        "fence after expiry ({}) is not above the expired holder's ({})",
        new.fence(),
        old.fence()
    );
    new.release().await?;
    drop(old);
    Ok(())
}

/// A lock removed behind its holder's back is followed by a larger fence.
pub async fn fences_increase_after_revoke(ctx: Ctx) -> Outcome {
    let name = ctx.name("fence-revoke");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let old = a.lock_with(&name, &ctx.options(Duration::ZERO)).await?;
    ctx.store().revoke(&name).await?;
    let new = b.lock_with(&name, &ctx.options(ctx.margin())).await?;
    ensure!(
        new.fence() > old.fence(),
        "fence after a revoke ({}) is not above the revoked holder's ({})",
        new.fence(),
        old.fence()
    );
    new.release().await?;
    drop(old);
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "fencing/increase_across_holders",
            "3 fencing",
            always,
            fences_increase_across_holders
        ),
        scenario!(
            "fencing/increase_across_expiry",
            "3 fencing",
            ttl_expiry,
            fences_increase_across_expiry
        ),
        scenario!(
            "fencing/increase_after_revoke",
            "3 fencing",
            always,
            fences_increase_after_revoke
        ),
    ]
}
