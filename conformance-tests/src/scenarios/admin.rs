//! The operator's view ([`LockAdmin`](lock_core::LockAdmin)): `list` shows a held lock as it
//! is, and `force_release` takes it away, sets a fence floor above the evicted holder's fence
//! that the next holder's fence is not below, hands the lock to the next waiter and makes the
//! evicted holder's `lost()` fire.

use std::time::Duration;

use lock_core::LossReason;

use crate::scenario::{Scenario, always};
use crate::{Ctx, Failure, Outcome, ensure};

/// A holder and a waiter of two clients; the operator lists the lock, then forces it free.
pub async fn list_and_force_release(ctx: Ctx) -> Outcome {
    let admin = ctx.store().admin().await?;
    let name = ctx.name("admin");
    let (holder, waiter) = (ctx.client().await?, ctx.client().await?);
    let held = holder
        .lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    let prefix = name.as_str().rsplit_once('/').map_or("", |(p, _)| p);
    let listed = admin.list(prefix).await?;
    ensure!(
        listed.len() == 1 && listed[0].name == name,
        "list({prefix:?}) shows {listed:?}, not just `{name}`"
    );
    ensure!(
        listed[0].fence == held.fence() && listed[0].holder == held.lease().token().fingerprint(),
        "list shows {:?}; the holder has fence {} and token fingerprint {}",
        listed[0],
        held.fence(),
        held.lease().token().fingerprint()
    );
    let others = admin.list(&format!("{name}-not")).await?;
    ensure!(others.is_empty(), "a prefix nothing has shows {others:?}");

    let budget = ctx.ttl() * 20;
    let next = {
        let (waiter, name, options) = (waiter.clone(), name.clone(), ctx.options(budget));
        tokio::spawn(async move { waiter.lock_with(&name, &options).await })
    };
    // The hand-off paths run only with a waiter in line: wait for it where the store counts
    // its waiters (where it cannot, `waiters` is `None` and the force goes on at once).
    let until = std::time::Instant::now() + budget;
    loop {
        let listed = admin.list(prefix).await?;
        if listed.first().is_none_or(|held| held.waiters != Some(0)) {
            break;
        }
        ensure!(
            std::time::Instant::now() < until,
            "the waiter did not queue within {budget:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let forced = admin
        .force_release(&name)
        .await?
        .ok_or_else(|| Failure("force_release found nothing held".into()))?;
    ensure!(
        forced.evicted.fence == held.fence() && forced.fence_floor > held.fence(),
        "force_release answered {forced:?} for a holder with fence {}",
        held.fence()
    );
    let bound = ctx.ttl() + ctx.margin();
    let reason = tokio::time::timeout(bound, held.lost())
        .await
        .map_err(|_| {
            Failure(format!(
                "the evicted holder's lost() did not fire in {bound:?}"
            ))
        })?;
    ensure!(
        matches!(reason, LossReason::NotHeld | LossReason::SessionEnded),
        "the evicted holder's lost() said {reason:?}"
    );
    let next = next
        .await
        .map_err(|e| Failure(format!("the waiter's task: {e}")))?
        .map_err(|e| Failure(format!("the waiter did not get the lock: {e}")))?;
    ensure!(
        next.fence() >= forced.fence_floor,
        "the next holder's fence {} is below the floor {}",
        next.fence(),
        forced.fence_floor
    );
    next.release().await?;
    let after = admin.list(prefix).await?;
    ensure!(after.is_empty(), "after the release, list shows {after:?}");
    let again = admin.force_release(&name).await?;
    ensure!(
        again.is_none(),
        "a free lock forced free answered {again:?}"
    );
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![scenario!(
        "admin/list_and_force_release",
        "admin (LockAdmin)",
        always,
        list_and_force_release
    )]
}
