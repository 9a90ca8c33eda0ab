//! Contract 6, reentrancy: per holder, n acquisitions need n releases; the store sees one lease.

use std::time::Duration;

use lock_core::Holder;

use crate::scenario::{Scenario, always};
use crate::{Ctx, Outcome, ensure};

/// Depth 3 needs 3 releases; all guards share one lease and fence.
pub async fn depth_needs_as_many_releases(ctx: Ctx) -> Outcome {
    let name = ctx.name("reentry-depth");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let job = Holder::new();
    let options = ctx.options(Duration::ZERO);
    let g1 = a.acquire(&job, &name, &options).await?;
    let g2 = a.acquire(&job, &name, &options).await?;
    let g3 = a.acquire(&job, &name, &options).await?;
    ensure!(
        g3.depth() == 3,
        "depth is {} after three acquisitions",
        g3.depth()
    );
    ensure!(
        g1.lease() == g3.lease() && g2.fence() == g1.fence(),
        "reentrant acquisitions got different leases: the store saw more than one"
    );
    g1.release().await?;
    g2.release().await?;
    let stranger = b.try_lock_with(&name, &options).await?;
    ensure!(
        stranger.is_none(),
        "the lock was free after 2 of 3 reentrant releases"
    );
    ensure!(
        g3.is_held(),
        "the last guard is not held after 2 of 3 releases"
    );
    g3.release().await?;
    let after = b.try_lock_with(&name, &options).await?;
    ensure!(
        after.is_some(),
        "the lock was not free after 3 of 3 releases"
    );
    if let Some(guard) = after {
        guard.release().await?;
    }
    Ok(())
}

/// Clones of a holder share its identity (they re-enter); another holder is excluded.
pub async fn clones_share_identity_strangers_excluded(ctx: Ctx) -> Outcome {
    let name = ctx.name("reentry-clone");
    let client = ctx.client().await?;
    let job = Holder::new();
    let options = ctx.options(Duration::ZERO);
    let first = client.acquire(&job, &name, &options).await?;
    let stranger = client.try_lock_with(&name, &options).await?;
    ensure!(
        stranger.is_none(),
        "another holder of the same process got a held lock"
    );
    let clone = client.try_acquire(&job.clone(), &name, &options).await?;
    let Some(clone) = clone else {
        return Err(crate::Failure(
            "a clone of the holder did not re-enter".into(),
        ));
    };
    ensure!(
        clone.fence() == first.fence(),
        "the clone's guard has another fence"
    );
    clone.release().await?;
    first.release().await?;
    Ok(())
}

/// Two concurrent acquisitions by one holder both succeed on one lease (no self-deadlock).
pub async fn concurrent_reentry_does_not_deadlock(ctx: Ctx) -> Outcome {
    let name = ctx.name("reentry-concurrent");
    let client = ctx.client().await?;
    let job = Holder::new();
    let options = ctx.options(Duration::from_secs(3));
    let (x, y) = tokio::join!(
        client.acquire(&job, &name, &options),
        client.acquire(&job, &name, &options)
    );
    let (x, y) = (x?, y?);
    ensure!(
        x.fence() == y.fence(),
        "concurrent reentrant acquisitions got two leases"
    );
    x.release().await?;
    y.release().await?;
    let after = client
        .try_lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    ensure!(
        after.is_some(),
        "the lock was not free after both reentrant releases"
    );
    if let Some(guard) = after {
        guard.release().await?;
    }
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "reentrancy/depth_needs_as_many_releases",
            "6 reentrancy",
            always,
            depth_needs_as_many_releases
        ),
        scenario!(
            "reentrancy/clones_share_identity",
            "6 reentrancy",
            always,
            clones_share_identity_strangers_excluded
        ),
        scenario!(
            "reentrancy/concurrent_reentry",
            "6 reentrancy",
            always,
            concurrent_reentry_does_not_deadlock
        ),
    ]
}
