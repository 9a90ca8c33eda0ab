//! Redlock servers that answer late: a majority slower than the per-server time-out is waited
//! for, within a bound, rather than counted as failed on every vote.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{Relay, fail, poll_until, unique_name},
};
use lock_core::{LockClient, LockName, LockOptions};
use lock_redis::{RedisKeys, RedlockBackend, RedlockConfig};

use super::{
    fences::cycle, pubsub::subscribers, raw_conn, redlock_client, redlock_raw_conns, redlock_urls,
    tcp_address,
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("redlock_waits_for_a_slow_majority", || {
            Box::pin(redlock_waits_for_a_slow_majority())
        })
        .case(
            "redlock_waits_for_a_slow_majority_past_a_long_time_out",
            || Box::pin(redlock_waits_for_a_slow_majority_past_a_long_time_out()),
        )
}

/// Three of five servers answer every request about 60 ms late (their links 30 ms slower each
/// way), above the default per-server time-out of 50 ms: a client still acquires within its
/// budget, releases, and acquires again. Before, every vote counted the three as failed, was
/// undone, and the wait ended `Unavailable` when its budget ran out.
async fn redlock_waits_for_a_slow_majority() -> Outcome {
    served_by_a_slow_majority(None, Duration::from_millis(30)).await
}

/// As [`redlock_waits_for_a_slow_majority`] with a per-server time-out of 200 ms and servers
/// about 240 ms away: the connections' own response time-out (which was the longer of the
/// time-out and 200 ms) does not cut the wait short, and a waiter subscribes on the slow
/// servers too (each pub/sub step was bounded by the same 200 ms: it subscribed on 2 of 5).
async fn redlock_waits_for_a_slow_majority_past_a_long_time_out() -> Outcome {
    served_by_a_slow_majority(Some(Duration::from_millis(200)), Duration::from_millis(120)).await
}

/// A client (with `node_timeout` when given) whose links to three of five servers are
/// `slower` each way acquires and releases twice, then waits behind another client's hold
/// (see [`waits_with_push`]).
async fn served_by_a_slow_majority(node_timeout: Option<Duration>, slower: Duration) -> Outcome {
    let urls = redlock_urls()?;
    let mut relays = Vec::with_capacity(urls.len());
    for url in &urls {
        relays.push(Relay::start(tcp_address(url)?).await?);
    }
    let mut config = RedlockConfig::new(
        relays
            .iter()
            .map(|relay| format!("redis://{}", relay.addr())),
    )
    .key_prefix("faults");
    if let Some(timeout) = node_timeout {
        config = config.node_timeout(timeout);
    }
    let node_timeout = config.node_timeout;
    let client = LockClient::new(
        RedlockBackend::connect(config)
            .await
            .map_err(fail("redlock connect"))?,
    );
    // Loads the scripts on every server while the links are fast.
    cycle(&client, &unique_name("redlock-slow-warm")?, 1).await?;
    for relay in &relays[..3] {
        relay.delay(slower);
    }
    // The premise: a round trip to a slow server takes longer than the time-out.
    let mut slow = raw_conn(&format!("redis://{}", relays[0].addr())).await?;
    let sent = Instant::now();
    let _: String = redis::cmd("PING")
        .query_async(&mut slow)
        .await
        .map_err(fail("PING"))?;
    let round_trip = sent.elapsed();
    ensure!(
        round_trip > node_timeout,
        "a round trip to a slow server took {round_trip:?}, not more than the per-server \
         time-out of {node_timeout:?}: the case tests nothing"
    );
    let lock = unique_name("redlock-slow-majority")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(3));
    for round in 1..=2 {
        let guard = client.lock_with(&lock, &options).await.map_err(|error| {
            Failure(format!(
                "acquisition {round} with three of five servers {round_trip:?} away \
                 (time-out {node_timeout:?}): {error}"
            ))
        })?;
        guard
            .release()
            .await
            .map_err(|error| Failure(format!("release {round}: {error}")))?;
    }
    waits_with_push(&client, &lock, &options).await
}

/// `client` waits for `lock`, held by a client of its own, and subscribes to its release
/// messages on every server, the slow ones too; it gets the lock once released.
async fn waits_with_push(client: &LockClient, lock: &LockName, options: &LockOptions) -> Outcome {
    let held = redlock_client()
        .await?
        .lock_with(lock, &LockOptions::new().ttl(Duration::from_secs(10)))
        .await
        .map_err(fail("the holder's acquire"))?;
    let waiting = tokio::spawn({
        let (client, lock, options) = (client.clone(), lock.clone(), options.clone());
        async move {
            client
                .lock_with(&lock, &options)
                .await
                .map(|guard| guard.fence())
        }
    });
    let stems = [RedisKeys::new("faults", lock).channel];
    let mut raws = redlock_raw_conns().await?;
    // The most servers the waiter was seen subscribed on at once (its wait ends with its
    // budget, and its subscriptions with it).
    let mut most = 0;
    let heard = poll_until(
        Duration::from_secs(3),
        "the waiter's subscription on every server",
        async || {
            let mut listening = 0;
            for raw in &mut raws {
                listening += subscribers(raw, &stems).await?;
            }
            most = most.max(listening);
            Ok(listening == raws.len())
        },
    )
    .await;
    held.release().await.map_err(fail("the holder's release"))?;
    let got = waiting.await.map_err(fail("the waiter's task"))?;
    heard.map_err(|Failure(why)| {
        Failure(format!(
            "{why}: subscribed on {most} of {} servers at most",
            raws.len()
        ))
    })?;
    ensure!(
        got.is_ok(),
        "the waiter did not get the lock once released: {got:?}"
    );
    Ok(())
}
