//! Contract 12, no leaks; and the name mapping: one name, one lock.

use std::time::Duration;

use futures::future::try_join_all;
use lock_core::{Holder, LockName};

use crate::scenario::{Scenario, always};
use crate::{Ctx, Failure, Outcome, ensure};

/// After release (plain, reentrant, and after a timed-out waiter) nothing of the hold remains
/// in the store but the fence counter.
pub async fn nothing_left_after_release(ctx: Ctx) -> Outcome {
    let name = ctx.name("leftovers");
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let job = Holder::new();
    let outer = a.acquire(&job, &name, &ctx.options(Duration::ZERO)).await?;
    let inner = a.acquire(&job, &name, &ctx.options(Duration::ZERO)).await?;
    let waiter = b
        .lock_with(&name, &ctx.options(Duration::from_millis(100)))
        .await;
    ensure!(waiter.is_err(), "a waiter got a held lock");
    inner.release().await?;
    outer.release().await?;
    let left = ctx.store().leftovers(&name).await?;
    ensure!(
        left.is_empty(),
        "after release the store still has {left:?}"
    );
    ensure!(
        a.inspect(&name).await?.is_none(),
        "inspect shows a released lock as held"
    );
    Ok(())
}

/// Names that differ only in case, punctuation, escaping or Unicode form are different locks,
/// and the longest names work.
pub async fn names_map_to_distinct_locks(ctx: Ctx) -> Outcome {
    let base = ctx.name("names");
    let suffixes = [
        "a", "A", "a/b", "a%2Fb", "a%2fb", "a_b", "a:b", "a.b", "a..b", "{a}", "{a}b", "a b",
        "a\\b", "a*", "a?", "ü", "u\u{308}", "🔒", "_c_", "-lock-", "%", "%%",
    ];
    let mut names = Vec::new();
    for suffix in suffixes {
        names.push(LockName::new(format!("{base}/{suffix}"))?);
    }
    let room = LockName::MAX_LEN - base.len() - 1;
    names.push(LockName::new(format!("{base}/{}", "x".repeat(room)))?);
    names.push(LockName::new(format!("{base}/{}y", "x".repeat(room - 1)))?);
    let client = ctx.client().await?;
    let options = ctx.options(Duration::ZERO);
    let (client, options) = (&client, &options);
    let guards = try_join_all(names.iter().map(|name| async move {
        client.try_lock_with(name, options).await?.ok_or_else(|| {
            Failure(format!(
                "`{name}` was already taken: two names share one lock"
            ))
        })
    }))
    .await?;
    for guard in guards {
        guard.release().await?;
    }
    for name in &names {
        let left = ctx.store().leftovers(name).await?;
        ensure!(left.is_empty(), "`{name}` left {left:?} after release");
    }
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "leaks/nothing_left_after_release",
            "12 no leaks",
            always,
            nothing_left_after_release
        ),
        scenario!(
            "leaks/names_map_to_distinct_locks",
            "names",
            always,
            names_map_to_distinct_locks
        ),
    ]
}
