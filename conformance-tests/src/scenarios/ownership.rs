//! Contract 2, owner-only: a lease that is not current changes nothing.

use std::time::Duration;

use lock_core::{Lease, LockClient, LockError, backend::LeaseToken};

use crate::scenario::{Scenario, always, ttl_expiry};
use crate::{Ctx, Outcome, ensure};

/// The client a forged lease is sent through: another one where leases are portable; else the
/// holder's own, the only one whose session or connection could act on the lock (another
/// client would refuse without asking the store, proving nothing).
fn forger<'a>(ctx: &Ctx, holder: &'a LockClient, other: &'a LockClient) -> &'a LockClient {
    if ctx.caps().portable_lease {
        other
    } else {
        holder
    }
}

fn forged(lease: &Lease) -> Lease {
    Lease::new(
        lease.name().clone(),
        LeaseToken::random(),
        lease.fence(),
        lease.ttl(),
    )
}

/// Releasing with a lease of another token returns `NotHeld` and leaves the holder intact.
pub async fn forged_release_changes_nothing(ctx: Ctx) -> Outcome {
    let name = ctx.name("forged-release");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let guard = a.lock_with(&name, &ctx.options(Duration::ZERO)).await?;
    let lease = guard.lease();
    let result = forger(&ctx, &a, &b).release_lease(&forged(&lease)).await;
    ensure!(
        matches!(result, Err(LockError::NotHeld { .. })),
        "release with a forged lease returned {result:?}, expected NotHeld"
    );
    let info = a.inspect(&name).await?;
    ensure!(
        info.as_ref().is_some_and(|i| i.token == *lease.token()),
        "after a forged release the store shows {info:?} instead of the holder's lease"
    );
    ensure!(
        guard.is_held(),
        "the guard stopped being held after a forged release"
    );
    guard.release().await?;
    Ok(())
}

/// Renewing with a lease of another token returns `NotHeld` and changes nothing.
pub async fn forged_renew_changes_nothing(ctx: Ctx) -> Outcome {
    let name = ctx.name("forged-renew");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let guard = a.lock_with(&name, &ctx.options(Duration::ZERO)).await?;
    let lease = guard.lease();
    let result = forger(&ctx, &a, &b)
        .renew_lease(&forged(&lease), Duration::from_secs(60))
        .await;
    ensure!(
        matches!(result, Err(LockError::NotHeld { .. })),
        "renew with a forged lease returned {result:?}, expected NotHeld"
    );
    let info = a.inspect(&name).await?;
    ensure!(
        info.as_ref().is_some_and(|i| i.token == *lease.token()),
        "after a forged renew the store shows {info:?}"
    );
    if ctx.caps().expiry == lock_core::Expiry::Ttl {
        let left = info.and_then(|i| i.expires_in);
        ensure!(
            left.is_some_and(|l| l <= ctx.ttl()),
            "a forged renew extended the lease: {left:?} left of a {:?} TTL",
            ctx.ttl()
        );
    }
    guard.release().await?;
    Ok(())
}

/// A release arriving after the lease expired and another holder took over fails with `Lost`
/// and leaves the new holder intact.
pub async fn late_release_keeps_new_holder(ctx: Ctx) -> Outcome {
    let name = ctx.name("late-release");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let old = ctx.acquire_unrenewed(&a, &name).await?;
    let _ = old.lost().await;
    let new = ctx.acquire_after_expiry(&b, &name).await?;
    let late = old.release().await;
    ensure!(
        matches!(late, Err(LockError::Lost { .. })),
        "a late release returned {late:?}, expected Lost"
    );
    let info = b.inspect(&name).await?;
    ensure!(
        info.is_some_and(|i| i.token == *new.lease().token()),
        "a late release removed the new holder's lease"
    );
    ensure!(
        new.is_held(),
        "the new holder lost the lock after a late release"
    );
    new.release().await?;
    Ok(())
}

/// An extend or renew arriving after another holder took over fails and changes nothing.
pub async fn late_renew_keeps_new_holder(ctx: Ctx) -> Outcome {
    let name = ctx.name("late-renew");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let old = ctx.acquire_unrenewed(&a, &name).await?;
    let old_lease = old.lease();
    let _ = old.lost().await;
    let new = ctx.acquire_after_expiry(&b, &name).await?;
    let extended = old.extend(Duration::from_secs(60)).await;
    ensure!(
        matches!(extended, Err(LockError::Lost { .. })),
        "a late extend returned {extended:?}, expected Lost"
    );
    let renewed = a.renew_lease(&old_lease, Duration::from_secs(60)).await;
    ensure!(
        matches!(renewed, Err(LockError::NotHeld { .. })),
        "a late renew of the old lease returned {renewed:?}, expected NotHeld"
    );
    let info = b.inspect(&name).await?;
    ensure!(
        info.is_some_and(|i| i.token == *new.lease().token()),
        "a late renew changed the new holder's lease"
    );
    new.release().await?;
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "ownership/forged_release_changes_nothing",
            "2 owner-only",
            always,
            forged_release_changes_nothing
        ),
        scenario!(
            "ownership/forged_renew_changes_nothing",
            "2 owner-only",
            always,
            forged_renew_changes_nothing
        ),
        scenario!(
            "ownership/late_release_keeps_new_holder",
            "2 owner-only",
            ttl_expiry,
            late_release_keeps_new_holder
        ),
        scenario!(
            "ownership/late_renew_keeps_new_holder",
            "2 owner-only",
            ttl_expiry,
            late_renew_keeps_new_holder
        ),
    ]
}
