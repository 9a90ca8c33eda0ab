//! Redlock's waiting: a client that releases and takes the lock again goes behind a waiter that
//! asked before its release, and a waiter whose budget is spent votes no more.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{fail, unique_name},
};
use futures::StreamExt;
use lock_core::{Backoff, LockOptions};
use lock_redis::RedisKeys;

use super::{monitor, redlock_client, redlock_urls};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case(
            "redlock_releaser_goes_behind_a_waiter_that_asked_first",
            || Box::pin(redlock_releaser_goes_behind_a_waiter_that_asked_first()),
        )
        .case("redlock_waiter_does_not_vote_after_its_budget", || {
            Box::pin(redlock_waiter_does_not_vote_after_its_budget())
        })
}

/// A holds a Redlock lock; B asks for it (its back-off 2 s, so that its tries are far apart).
/// Once every server has run B's first vote, A releases and at once asks again: B, which asked
/// first, must hold the lock before A holds it again. Before, a call's first vote did not
/// queue: B took its place with its second vote, a back-off later, and A, finding no one in
/// line, took the lock again (a client holding 1 ms passed another about five times per
/// back-off: 929 re-takes in 1,094 acquisitions of two separate clients in a compare run).
async fn redlock_releaser_goes_behind_a_waiter_that_asked_first() -> Outcome {
    let name = unique_name("redlock-asked-first")?;
    let keys = RedisKeys::new("faults", &name);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(10));
    let a = redlock_client().await?;
    let held = a
        .lock_with(&name, &options)
        .await
        .map_err(fail("A's first acquire"))?;
    let mut monitors = Vec::new();
    for url in redlock_urls()? {
        monitors.push(monitor(&url).await?);
    }
    let b = redlock_client().await?;
    let waiting = tokio::spawn({
        let (name, options) = (
            name.clone(),
            options
                .clone()
                .backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(2))),
        );
        async move {
            let guard = b.lock_with(&name, &options).await?;
            let acquired = Instant::now();
            guard.release().await?;
            Ok::<_, lock_core::LockError>(acquired)
        }
    });
    // B's vote is an acquire script on the lock and its queue.
    for monitor in &mut monitors {
        let by = Instant::now() + Duration::from_secs(5);
        loop {
            let line = tokio::time::timeout_at(by.into(), monitor.next())
                .await
                .map_err(|_| Failure("a server did not run B's first vote within 5 s".into()))?
                .ok_or_else(|| Failure("a MONITOR ended".into()))?;
            let call = line.contains("\"EVALSHA\"") || line.contains("\"EVAL\"");
            if call
                && line.contains(&format!("\"{}\"", keys.lock))
                && line.contains(&format!("\"{}\"", keys.queue))
            {
                break;
            }
        }
    }
    drop(monitors);
    held.release().await.map_err(fail("A's release"))?;
    let again = a
        .lock_with(&name, &options)
        .await
        .map_err(fail("A's second acquire"))?;
    let a_again = Instant::now();
    again.release().await.map_err(fail("A's second release"))?;
    let b_acquired = waiting
        .await
        .map_err(fail("B's task"))?
        .map_err(fail("B's acquire"))?;
    ensure!(
        b_acquired < a_again,
        "A released and took the lock again {:?} before B, which had asked first, held it",
        b_acquired.saturating_duration_since(a_again)
    );
    Ok(())
}

/// A Redlock waiter whose budget runs out while it sleeps between votes gives up without
/// another vote: a vote sent after the budget could only be refused or come too late, and when
/// many waiters' budgets end together (1,000 clients of the compare, all stopping at the end of
/// its run), their last votes at once overloaded the five servers past the per-server time-out
/// and ended most of those waits `Unavailable` rather than timed out. Here one waiter with a
/// 1 s budget queues behind a holder; the first server's `MONITOR` shows no vote of it that
/// began at or after its deadline.
async fn redlock_waiter_does_not_vote_after_its_budget() -> Outcome {
    const WAIT: Duration = Duration::from_secs(1);
    let name = unique_name("redlock-budget-spent")?;
    let keys = RedisKeys::new("faults", &name);
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = redlock_client()
        .await?
        .lock_with(&name, &options)
        .await
        .map_err(fail("holder's acquire"))?;
    let mut first_server = monitor(&redlock_urls()?.remove(0)).await?;
    let waiter = redlock_client().await?;
    let asked = std::time::SystemTime::now();
    let answer = waiter.lock_with(&name, &options.clone().wait(WAIT)).await;
    ensure!(
        matches!(answer, Err(lock_core::LockError::Timeout { .. })),
        "the waiter's acquire answered {answer:?}, not a time-out"
    );
    let deadline = asked
        .checked_add(WAIT)
        .ok_or_else(|| Failure("a deadline past the clock's range".into()))?
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(fail("clock"))?
        .as_secs_f64();
    // Its votes: acquire scripts (six keys, the lock's first) from a token other than the
    // holder's, as the server began them (MONITOR's first field, server seconds).
    let holder_token = format!("\"{}\"", held.lease().token().as_str());
    let vote = format!("\"6\" \"{}\"", keys.lock);
    let (mut votes, mut late) = (0, Vec::new());
    let by = Instant::now() + Duration::from_millis(300);
    while let Ok(Some(line)) = tokio::time::timeout_at(by.into(), first_server.next()).await {
        if line.contains(&vote) && !line.contains(&holder_token) {
            votes += 1;
            let began: f64 = line
                .split_whitespace()
                .next()
                .and_then(|at| at.parse().ok())
                .ok_or_else(|| Failure(format!("a MONITOR line without a time: {line}")))?;
            if began >= deadline {
                late.push(began - deadline);
            }
        }
    }
    held.release().await.map_err(fail("holder's release"))?;
    ensure!(
        votes > 1,
        "the waiter voted {votes} times: the case tests nothing"
    );
    ensure!(
        late.is_empty(),
        "the waiter voted {} times after its budget ran out ({late:?} s after it)",
        late.len()
    );
    Ok(())
}
