//! Contract 1, mutual exclusion: at most one current lease per name.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use lock_core::{Holder, LockOptions};
use tokio::task::JoinSet;

use crate::scenario::{Scenario, always};
use crate::{Ctx, Failure, Outcome, ensure};

/// While one client holds a lock, another client's try fails; after release it succeeds.
pub async fn try_acquire_excludes(ctx: Ctx) -> Outcome {
    let name = ctx.name("exclude");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let options = ctx.options(Duration::ZERO);
    let held = a.lock_with(&name, &options).await?;
    let second = b.try_lock_with(&name, &options).await?;
    ensure!(
        second.is_none(),
        "a second client got `{name}` while the first held it"
    );
    held.release().await?;
    let after = b.try_lock_with(&name, &options).await?;
    ensure!(after.is_some(), "`{name}` was not free after its release");
    if let Some(guard) = after {
        guard.release().await?;
    }
    Ok(())
}

/// Two holders of one process (one client) exclude each other like two processes.
pub async fn holders_in_one_process_exclude(ctx: Ctx) -> Outcome {
    let name = ctx.name("same-process");
    let client = ctx.client().await?;
    let options = ctx.options(Duration::ZERO);
    let first = client.lock_with(&name, &options).await?;
    let second = client.try_lock_with(&name, &options).await?;
    ensure!(
        second.is_none(),
        "a second holder in the same process got `{name}`"
    );
    first.release().await?;
    Ok(())
}

/// Many tasks over two clients increment a non-atomic counter under the lock: no update is
/// lost and no two tasks are ever inside at once.
pub async fn contention_loses_no_update(ctx: Ctx) -> Outcome {
    const TASKS: usize = 8;
    const ROUNDS: u64 = 8;
    let name = ctx.name("contention");
    let clients = [ctx.client().await?, ctx.client().await?];
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(15));
    let mut tasks = JoinSet::new();
    for i in 0..TASKS {
        let (client, name, options) = (clients[i % 2].clone(), name.clone(), options.clone());
        let (counter, inside) = (counter.clone(), inside.clone());
        tasks.spawn(async move {
            let holder = Holder::new();
            for _ in 0..ROUNDS {
                let guard = client.acquire(&holder, &name, &options).await?;
                ensure!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two holders were inside the critical section of `{name}` at once"
                );
                let seen = counter.load(Ordering::SeqCst);
                // Widen the window in which a second holder would interleave.
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<(), Failure>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| Failure(format!("a contending task panicked: {e}")))??;
    }
    let total = counter.load(Ordering::SeqCst);
    let expected = TASKS as u64 * ROUNDS;
    ensure!(
        total == expected,
        "lost updates: counter is {total}, expected {expected}"
    );
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "exclusion/try_acquire_excludes",
            "1 mutual exclusion",
            always,
            try_acquire_excludes
        ),
        scenario!(
            "exclusion/holders_in_one_process_exclude",
            "1, 6 holders",
            always,
            holders_in_one_process_exclude
        ),
        scenario!(
            "exclusion/contention_loses_no_update",
            "1 mutual exclusion",
            always,
            contention_loses_no_update
        ),
    ]
}
