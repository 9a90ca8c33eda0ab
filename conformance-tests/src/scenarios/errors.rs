//! Contract 11, errors: bad input gets a clear typed error and changes nothing; a foreign value
//! in the store is an error, never a grant.

use std::time::Duration;

use lock_core::{Backoff, LockError, LockName, LockOptions};

use crate::scenario::{Scenario, always, foreign};
use crate::{Ctx, Outcome, ensure};

/// Every kind of invalid name is rejected with `InvalidName` saying why.
pub async fn invalid_names_are_rejected(_ctx: Ctx) -> Outcome {
    let long = "n".repeat(LockName::MAX_LEN + 1);
    let cases: [(&str, &str); 5] = [
        ("", "0 bytes"),
        (&long, "201 bytes"),
        ("tab\there", "control character"),
        ("nul\0", "control character"),
        ("bell\u{7}", "control character"),
    ];
    for (text, why) in cases {
        match LockName::new(text) {
            Err(LockError::InvalidName { reason }) => {
                ensure!(
                    reason.contains(why),
                    "the error for {text:?} says {reason:?}, not {why:?}"
                )
            }
            other => return Err(crate::Failure(format!("{text:?} gave {other:?}"))),
        }
    }
    ensure!(
        matches!(
            LockName::from_bytes(b"\xff\xfe"),
            Err(LockError::InvalidName { .. })
        ),
        "non-UTF-8 bytes were accepted as a name"
    );
    Ok(())
}

/// Invalid options are rejected with `InvalidOptions` before anything reaches the store, and
/// a bad `extend` leaves the hold as it was.
pub async fn invalid_options_change_nothing(ctx: Ctx) -> Outcome {
    let name = ctx.name("bad-options");
    let client = ctx.client().await?;
    let ttl = ctx.ttl();
    let bad = [
        LockOptions::new().ttl(Duration::ZERO),
        LockOptions::new().ttl(Duration::from_secs(10 * 24 * 3600)),
        LockOptions::new().ttl(ttl).renew_every(ttl),
        LockOptions::new().ttl(ttl).max_hold(ttl / 2),
        LockOptions::new()
            .ttl(ttl)
            .wait(Duration::from_secs(400 * 24 * 3600)),
        LockOptions::new()
            .ttl(ttl)
            .backoff(Backoff::new(Duration::ZERO, Duration::ZERO)),
    ];
    for options in &bad {
        let result = client.lock_with(&name, options).await;
        ensure!(
            matches!(result, Err(LockError::InvalidOptions { .. })),
            "options {options:?} gave {result:?}, expected InvalidOptions"
        );
    }
    let leftovers = ctx.store().leftovers(&name).await?;
    ensure!(
        leftovers.is_empty(),
        "rejected options left {leftovers:?} in the store"
    );
    ensure!(
        client.inspect(&name).await?.is_none(),
        "rejected options left a lock held"
    );
    let guard = client
        .lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    let before = guard.lease();
    let extended = guard.extend(Duration::ZERO).await;
    ensure!(
        matches!(extended, Err(LockError::InvalidOptions { .. })),
        "extend(0) returned {extended:?}, expected InvalidOptions"
    );
    ensure!(guard.is_held(), "a rejected extend ended the hold");
    ensure!(
        guard.lease().token() == before.token(),
        "a rejected extend changed the lease"
    );
    guard.release().await?;
    Ok(())
}

/// A batched renewal (`renew_many`, as the watchdog sends) of leases whose TTL is out of range
/// answers `InvalidOptions` for each of them and sends them nowhere: the locks stay held as
/// they were (a TTL of zero once reached a Redis server as `PEXPIRE key 0`, which deleted the
/// key, and was answered "renewed"). The good lease in the same batch is renewed.
pub async fn bad_batched_renewals_change_nothing(ctx: Ctx) -> Outcome {
    let client = ctx.client().await?;
    let options = ctx.options(Duration::ZERO).watchdog(false);
    let (bad, good) = (ctx.name("bad-renewal"), ctx.name("good-renewal"));
    let held = client.lock_with(&bad, &options).await?;
    let other = client.lock_with(&good, &options).await?;
    let lease = held.lease();
    let with_ttl = |ttl: Duration| {
        lock_core::Lease::new(
            lease.name().clone(),
            lease.token().clone(),
            lease.fence(),
            ttl,
        )
    };
    let batch = [
        with_ttl(Duration::ZERO),
        with_ttl(lock_core::MAX_TTL + Duration::from_secs(1)),
        other.lease(),
    ];
    let answers = client.backend().renew_many(&batch).await?;
    ensure!(
        answers.len() == batch.len(),
        "{} answers to 3 renewals",
        answers.len()
    );
    for (answer, what) in answers.iter().zip(["a TTL of zero", "a TTL above MAX_TTL"]) {
        ensure!(
            matches!(answer, Err(LockError::InvalidOptions { .. })),
            "renewing with {what} gave {answer:?}, expected InvalidOptions"
        );
    }
    ensure!(
        answers[2].is_ok(),
        "the good lease of the batch was not renewed: {:?}",
        answers[2]
    );
    let info = client.inspect(&bad).await?;
    ensure!(
        info.as_ref().is_some_and(|i| &i.token == lease.token()),
        "after renewals with bad TTLs the lock is no longer held as it was: {info:?}"
    );
    // Not renewed either: no longer left than the TTL it was taken with (a store that sent the
    // TTL above the maximum would show it here).
    let left = info.and_then(|i| i.expires_in);
    ensure!(
        left.is_none_or(|left| left <= lease.ttl()),
        "after renewals with bad TTLs the lock has {left:?} left, more than its TTL {:?}",
        lease.ttl()
    );
    held.release().await?;
    other.release().await?;
    Ok(())
}

/// A value this library did not write under the lock's place is reported as `Foreign` by
/// acquire and inspect, never granted, and left untouched.
pub async fn foreign_value_is_an_error(ctx: Ctx) -> Outcome {
    let name = ctx.name("foreign");
    let client = ctx.client().await?;
    ctx.store().plant_foreign(&name).await?;
    let tried = client
        .lock_with(&name, &ctx.options(Duration::from_millis(200)))
        .await;
    let inspected = client.inspect(&name).await;
    let leftovers = ctx.store().leftovers(&name).await?;
    ctx.store().revoke(&name).await?;
    ensure!(
        matches!(tried, Err(LockError::Foreign { .. })),
        "acquire over a foreign value returned {tried:?}, expected Foreign"
    );
    ensure!(
        matches!(inspected, Err(LockError::Foreign { .. })),
        "inspect of a foreign value returned {inspected:?}, expected Foreign"
    );
    ensure!(
        !leftovers.is_empty(),
        "the foreign value was removed or overwritten"
    );
    Ok(())
}

/// Extreme option values never panic: each is refused with `InvalidOptions` before reaching
/// the store, or gives a working guard.
pub async fn extreme_options_never_panic(ctx: Ctx) -> Outcome {
    let client = ctx.client().await?;
    let ttl = ctx.ttl();
    let cases = [
        (
            "max_hold(Duration::MAX)",
            ctx.options(Duration::ZERO).max_hold(Duration::MAX),
        ),
        (
            "max_hold(u64::MAX s)",
            ctx.options(Duration::ZERO)
                .max_hold(Duration::from_secs(u64::MAX)),
        ),
        (
            "renew_every(1ns)",
            ctx.options(Duration::ZERO)
                .renew_every(Duration::from_nanos(1)),
        ),
        (
            "ttl(MAX_TTL) with max_hold(MAX)",
            LockOptions::new()
                .ttl(lock_core::MAX_TTL)
                .wait(Duration::ZERO)
                .max_hold(Duration::MAX),
        ),
        (
            "wait(MAX_WAIT)",
            LockOptions::new().ttl(ttl).wait(lock_core::MAX_WAIT),
        ),
        (
            "backoff(MAX, MAX)",
            ctx.options(Duration::ZERO)
                .backoff(Backoff::new(Duration::MAX, Duration::MAX)),
        ),
    ];
    for (what, options) in cases {
        let name = ctx.name("extreme");
        let client = client.clone();
        let outcome = tokio::spawn(async move {
            match client.lock_with(&name, &options).await {
                Ok(guard) => {
                    let held = guard.is_held();
                    guard.release().await.map(|()| held)
                }
                Err(error) => Err(error),
            }
        })
        .await;
        match outcome {
            Err(join) => return Err(crate::Failure(format!("{what} panicked: {join}"))),
            Ok(Ok(held)) => ensure!(held, "{what} gave a guard that is not held"),
            Ok(Err(LockError::InvalidOptions { .. })) => {}
            Ok(Err(other)) => {
                return Err(crate::Failure(format!(
                    "{what} gave {other:?}, expected InvalidOptions or a guard"
                )));
            }
        }
    }
    Ok(())
}

/// The scenarios of this group, in run order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        scenario!(
            "errors/invalid_names_rejected",
            "11 errors",
            always,
            invalid_names_are_rejected
        ),
        scenario!(
            "errors/invalid_options_change_nothing",
            "11 errors",
            always,
            invalid_options_change_nothing
        ),
        scenario!(
            "errors/bad_batched_renewals_change_nothing",
            "11 errors",
            always,
            bad_batched_renewals_change_nothing
        ),
        scenario!(
            "errors/extreme_options_never_panic",
            "11 errors",
            always,
            extreme_options_never_panic
        ),
        scenario!(
            "errors/foreign_value_is_an_error",
            "11 errors",
            foreign,
            foreign_value_is_an_error
        ),
    ]
}
