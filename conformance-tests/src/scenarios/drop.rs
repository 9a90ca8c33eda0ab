//! Contract 10, drop: dropping a guard releases in the background.

use std::time::{Duration, Instant};

use lock_core::LockOptions;

use crate::scenario::{Scenario, always};
use crate::{Ctx, Outcome, ensure};

/// A dropped guard frees the lock long before its TTL.
pub async fn dropping_guard_releases(ctx: Ctx) -> Outcome {
    let name = ctx.name("drop");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = a.lock_with(&name, &long).await?;
    drop(guard);
    let start = Instant::now();
    let next = b
        .lock_with(&name, &long.clone().wait(ctx.margin() * 4))
        .await?;
    let took = start.elapsed();
    ensure!(
        took <= ctx.margin(),
        "the lock was free only {took:?} after the guard was dropped"
    );
    next.release().await?;
    Ok(())
}

/// A guard dropped on a thread with no Tokio runtime (while the client's runtime runs on)
/// still frees the lock in the background, long before its TTL.
pub async fn guard_dropped_on_foreign_thread_releases(ctx: Ctx) -> Outcome {
    let name = ctx.name("drop-thread");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = a.lock_with(&name, &long).await?;
    std::thread::spawn(move || drop(guard))
        .join()
        .map_err(|_| crate::Failure("dropping the guard on a plain thread panicked".into()))?;
    let next = b
        .lock_with(&name, &long.clone().wait(ctx.margin() * 4))
        .await
        .map_err(|e| {
            crate::Failure(format!(
                "a guard dropped on a plain thread kept the lock: {e}"
            ))
        })?;
    next.release().await?;
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "drop/dropping_guard_releases",
            "10 drop",
            always,
            dropping_guard_releases
        ),
        scenario!(
            "drop/guard_dropped_on_foreign_thread",
            "10 drop",
            always,
            guard_dropped_on_foreign_thread_releases
        ),
    ]
}
