//! Redlock waiters keep their places in the servers' queues without loading the servers.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{fail, unique_name},
};
use futures::StreamExt;
use lock_core::LockOptions;
use lock_redis::RedisKeys;
use redis::AsyncCommands;

use super::{queue::until_queued_everywhere, redlock_client, redlock_raw_conns, redlock_urls};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases.case("redlock_waiters_far_back_vote_seldom", || {
        Box::pin(redlock_waiters_far_back_vote_seldom())
    })
}

/// A subscribed Redlock waiter third in line votes only to keep its place, about once a
/// second (its place lasts 3 s), not four to five times a second as the first two do: a
/// release names the first two, so its votes could only be refused. Three waiting clients
/// behind a holder; the first server's `MONITOR` counts the third one's votes for 2.5 s.
async fn redlock_waiters_far_back_vote_seldom() -> Outcome {
    const WINDOW: Duration = Duration::from_millis(2500);
    let lock = unique_name("redlock-far-back")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut raws = redlock_raw_conns().await?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = redlock_client()
        .await?
        .lock_with(&lock, &options)
        .await
        .map_err(fail("holder's acquire"))?;
    let mut waiting = Vec::new();
    for queued in 1..=3 {
        let waiter = redlock_client().await?;
        let (lock, options) = (lock.clone(), options.clone().wait(Duration::from_secs(15)));
        waiting.push(tokio::spawn(async move {
            let guard = waiter.lock_with(&lock, &options).await?;
            guard.release().await
        }));
        until_queued_everywhere(&mut raws, &keys, queued).await?;
    }
    let line: Vec<String> = raws[0]
        .zrange(&keys.queue, 0, -1)
        .await
        .map_err(fail("ZRANGE"))?;
    let third = line
        .get(2)
        .ok_or_else(|| Failure(format!("{} waiters in line", line.len())))?
        .clone();
    let first_url = redlock_urls()?.remove(0);
    let mut monitor = redis::Client::open(first_url.as_str())
        .map_err(fail("client"))?
        .get_async_monitor()
        .await
        .map_err(fail("MONITOR"))?
        .into_on_message::<String>();
    let (mut votes, mut others) = (0, 0);
    let end = Instant::now() + WINDOW;
    while let Ok(Some(line)) = tokio::time::timeout_at(end.into(), monitor.next()).await {
        let vote = line.contains("\"EVALSHA\"") || line.contains("\"EVAL\"");
        if vote && line.contains(&format!("\"{}\"", keys.lock)) {
            if line.contains(&format!("\"{third}\"")) {
                votes += 1;
            } else {
                others += 1;
            }
        }
    }
    held.release().await.map_err(fail("holder's release"))?;
    for waiter in waiting {
        waiter
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("a waiter"))?;
    }
    ensure!(
        others > 0,
        "the first two waiters did not vote either in {WINDOW:?}: the case tests nothing"
    );
    ensure!(
        (1..=5).contains(&votes),
        "the third waiter voted {votes} times in {WINDOW:?} on one server (the first two: \
         {others}); it keeps a 3 s place"
    );
    Ok(())
}
