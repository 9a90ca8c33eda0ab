//! Leases as data: inspection, and portable leases moving between clients.

use std::time::Duration;

use lock_core::{Expiry, Lease, LockError};

use crate::scenario::{Scenario, always, portable};
use crate::{Ctx, Failure, Outcome, ensure};

/// `inspect` reports the holder's token, fence and remaining time; `None` once released.
pub async fn inspect_reports_the_holder(ctx: Ctx) -> Outcome {
    let name = ctx.name("inspect");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    ensure!(
        b.inspect(&name).await?.is_none(),
        "a fresh name shows as held"
    );
    let guard = a.lock_with(&name, &ctx.options(Duration::ZERO)).await?;
    let info = b
        .inspect(&name)
        .await?
        .ok_or_else(|| Failure("inspect shows a held lock as free".into()))?;
    ensure!(
        info.token == *guard.lease().token(),
        "inspect shows another owner token"
    );
    ensure!(
        info.fence == guard.fence(),
        "inspect shows fence {} not {}",
        info.fence,
        guard.fence()
    );
    if ctx.caps().expiry == Expiry::Ttl {
        ensure!(
            info.expires_in.is_some_and(|left| left <= ctx.ttl()),
            "inspect shows {:?} left of a {:?} TTL",
            info.expires_in,
            ctx.ttl()
        );
    }
    guard.release().await?;
    ensure!(
        b.inspect(&name).await?.is_none(),
        "inspect shows a released lock as held"
    );
    Ok(())
}

/// A lease serialized by one client is renewed and released by another; the original guard
/// then learns it lost the lock, and a second release of the lease is `NotHeld`.
pub async fn portable_lease_moves_between_clients(ctx: Ctx) -> Outcome {
    let name = ctx.name("portable");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let guard = a
        .lock_with(&name, &ctx.options(Duration::ZERO).watchdog(false))
        .await?;
    let json = serde_json::to_string(&guard.lease())
        .map_err(|e| Failure(format!("a lease does not serialize: {e}")))?;
    let moved: Lease = serde_json::from_str(&json)
        .map_err(|e| Failure(format!("a lease does not deserialize: {e}")))?;
    let renewed = b.renew_lease(&moved, ctx.ttl() * 2).await?;
    ensure!(
        renewed.fence() == guard.fence(),
        "renewal from another client changed the fence"
    );
    b.release_lease(&moved).await?;
    ensure!(
        b.inspect(&name).await?.is_none(),
        "the lock is held after a portable release"
    );
    let again = b.release_lease(&moved).await;
    ensure!(
        matches!(again, Err(LockError::NotHeld { .. })),
        "a second release returned {again:?}, expected NotHeld"
    );
    let original = guard.release().await;
    ensure!(
        matches!(original, Err(LockError::Lost { .. })),
        "the original guard's release returned {original:?}, expected Lost"
    );
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "leases/inspect_reports_the_holder",
            "inspect",
            always,
            inspect_reports_the_holder
        ),
        scenario!(
            "leases/portable_lease_moves",
            "portable leases",
            portable,
            portable_lease_moves_between_clients
        ),
    ]
}
