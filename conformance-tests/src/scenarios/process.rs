//! Contracts 4 and 7 across processes: a holder killed with SIGKILL loses the lock within its
//! TTL (session stores: its session timeout).

use std::time::{Duration, Instant};

use crate::scenario::{Scenario, cross_process};
use crate::{Ctx, Failure, Outcome, ensure, holder_process::HeldByChild};

/// A separate process holds the lock (watchdog renewing), is killed with SIGKILL, and another
/// client gets the lock within the TTL, with a larger fence.
pub async fn killed_holder_process_loses_lock(ctx: Ctx) -> Outcome {
    let Some(process) = ctx.holder_process.clone() else {
        return Err(Failure("no holder process available".into()));
    };
    let name = ctx.name("killed");
    let HeldByChild {
        mut child,
        fence: child_fence,
    } = process.spawn(&name, ctx.ttl()).await.map_err(Failure)?;
    let client = ctx.client().await?;
    let busy = client
        .try_lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    ensure!(
        busy.is_none(),
        "the lock was free while the holder process lived"
    );
    child
        .kill()
        .await
        .map_err(|e| Failure(format!("cannot SIGKILL the holder process: {e}")))?;
    let killed = Instant::now();
    let lasts = ctx.abandoned_hold_lasts();
    let guard = client
        .lock_with(&name, &ctx.options(lasts * 3 + ctx.margin()))
        .await?;
    let took = killed.elapsed();
    ensure!(
        took <= lasts + ctx.margin(),
        "the lock was free only {took:?} after its holder was killed (the store keeps a dead holder's hold {lasts:?})"
    );
    ensure!(
        guard.fence().get() > child_fence,
        "fence {} after the killed holder's {child_fence}",
        guard.fence()
    );
    guard.release().await?;
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![scenario!(
        "process/killed_holder_loses_lock",
        "4, 7 process death",
        cross_process,
        killed_holder_process_loses_lock
    )]
}
