//! Turns: a waiter whose turn another waiter's try (or Redlock vote) starts hears of it at
//! once.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{env_var, fail, poll_every, poll_until, unique_name},
};
use lock_core::{LockClient, LockError, LockGuard, LockName, LockOptions};
use lock_redis::RedisKeys;
use redis::{
    AsyncCommands,
    aio::{ConnectionLike, MultiplexedConnection},
};

use super::{
    cluster_client, cluster_urls, queue::until_queued_everywhere, queue_line, raw_cluster_conn,
    raw_conn, redlock_client, redlock_raw_conns, single_client, until_marked,
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("a_waiter_hears_the_turn_another_try_starts", || {
            Box::pin(a_waiter_hears_the_turn_another_try_starts())
        })
        .case("a_cluster_waiter_hears_the_turn_another_try_starts", || {
            Box::pin(a_cluster_waiter_hears_the_turn_another_try_starts())
        })
        .case("redlock_waiter_hears_the_turn_another_vote_starts", || {
            Box::pin(redlock_waiter_hears_the_turn_another_vote_starts())
        })
}

/// Two waiters that died, planted at the head of the queue behind a holder (places of a
/// minute), and a live waiter queued behind them: its last answer was the holder's, so it
/// sleeps until that holder's expiry (30 s) or a message. Then the two dead ones give up and
/// the holder's key goes (it ran out early, say), neither of which tells anybody: the live
/// waiter is first on a free lock and does not know it. A newcomer's single try starts its
/// turn (100 ms); the live waiter must come within it, told by that try.
async fn a_waiter_hears_the_turn_another_try_starts() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let raw = raw_conn(&url).await?;
    hears_the_turn(raw, async || single_client(&url).await, "told-turn").await
}

/// The same on the cluster, where the try's message is an `SPUBLISH` on the lock's node.
async fn a_cluster_waiter_hears_the_turn_another_try_starts() -> Outcome {
    let urls = cluster_urls()?;
    let raw = raw_cluster_conn(&urls).await?;
    hears_the_turn(
        raw,
        async || cluster_client(&urls).await,
        "cluster-told-turn",
    )
    .await
}

/// The case of [`a_waiter_hears_the_turn_another_try_starts`] over `raw` (a connection to the
/// store) and clients from `client`, on a fresh name tagged `tag`.
async fn hears_the_turn<C: ConnectionLike + Send + Sync>(
    mut raw: C,
    client: impl AsyncFn() -> Result<LockClient, Failure>,
    tag: &str,
) -> Outcome {
    let name = unique_name(tag)?;
    let keys = RedisKeys::new("faults", &name);
    let holder = client().await?;
    let held = hold(&holder, &name).await?;
    plant_dead(&mut raw, &keys, &DEAD).await?;
    let (waiter, newcomer) = (client().await?, client().await?);
    let waiting = wait_for(waiter, &name);
    // A case that fails before the waiter is done stops it, rather than leave it waiting.
    let stop = waiting.abort_handle();
    let outcome = async {
        // The live waiter's busy try marked the lock: it is subscribed, and sleeps.
        until_marked(&mut raw, &keys, "the live waiter").await?;
        let line = queue_line(&mut raw, &keys).await?;
        ensure!(
            line.len() == 3 && line[..2] == DEAD,
            "the queue is {line:?}, expected the two dead waiters and the live one"
        );
        vanish(&mut raw, &keys).await?;
        told_within(&newcomer, &name, waiting, Duration::from_millis(90)).await
    }
    .await;
    stop.abort();
    // The holder's key is gone: its release finds nothing (or the live waiter's lock).
    drop(held.release().await);
    clean_up(&mut raw, &keys).await?;
    outcome
}

/// Redlock: the same on every server. The live waiter, third in line, votes only every 0.75
/// to 1 s to keep its place; the dead ones and the holder's keys go just after one of its
/// votes, and a newcomer's single vote starts its turn (400 ms) on every server: it must
/// vote within that turn, told by those servers, not at its next vote to keep its place.
async fn redlock_waiter_hears_the_turn_another_vote_starts() -> Outcome {
    let name = unique_name("redlock-told-turn")?;
    let keys = RedisKeys::new("faults", &name);
    let mut raws = redlock_raw_conns().await?;
    let holder = redlock_client().await?;
    let held = hold(&holder, &name).await?;
    for raw in &mut raws {
        plant_dead(raw, &keys, &DEAD).await?;
    }
    let (waiter, newcomer) = (redlock_client().await?, redlock_client().await?);
    let waiting = wait_for(waiter, &name);
    // A case that fails before the waiter is done stops it, rather than leave it waiting.
    let stop = waiting.abort_handle();
    let outcome = async {
        until_queued_everywhere(&mut raws, &keys, 3).await?;
        // Its votes carry its client (it listens) on every server.
        poll_until(
            Duration::from_secs(5),
            "the live waiter listening",
            async || {
                let mut everywhere = true;
                for raw in raws.iter_mut() {
                    let clients: i64 = raw.hlen(&keys.clients).await.map_err(fail("HLEN"))?;
                    everywhere &= clients == 1;
                }
                Ok(everywhere)
            },
        )
        .await?;
        // Just after one of its votes (its place on the first server moves on).
        let first = &mut raws[0];
        let line: Vec<String> = first
            .zrange(&keys.queue, 0, -1)
            .await
            .map_err(fail("ZRANGE"))?;
        let live = line
            .get(2)
            .ok_or_else(|| Failure(format!("the queue is {line:?}")))?
            .clone();
        let place = |raw: &mut MultiplexedConnection| {
            let (places, live) = (keys.places.clone(), live.clone());
            let mut raw = raw.clone();
            async move {
                raw.zscore::<_, _, Option<u64>>(places, live)
                    .await
                    .map_err(fail("ZSCORE"))
            }
        };
        let before = place(first).await?;
        poll_every(
            Duration::from_millis(2),
            Duration::from_secs(3),
            "its next vote",
            async || Ok(place(first).await? != before),
        )
        .await?;
        for raw in &mut raws {
            vanish(raw, &keys).await?;
        }
        told_within(&newcomer, &name, waiting, Duration::from_millis(300)).await
    }
    .await;
    stop.abort();
    drop(held.release().await);
    for raw in &mut raws {
        clean_up(raw, &keys).await?;
    }
    outcome
}

/// Removes the name's keys.
async fn clean_up<C: ConnectionLike + Send + Sync>(raw: &mut C, keys: &RedisKeys) -> Outcome {
    let _: () = raw
        .del(&[
            &keys.lock,
            &keys.queue,
            &keys.places,
            &keys.clients,
            &keys.fence,
        ])
        .await
        .map_err(fail("clean-up"))?;
    Ok(())
}

/// The planted dead waiters' tokens, in line order.
const DEAD: [&str; 2] = [
    "0123456789abcdef0123456789abcde1",
    "0123456789abcdef0123456789abcde2",
];

/// `name` held by `client` for 30 s, without renewals.
async fn hold(client: &LockClient, name: &LockName) -> Result<LockGuard, Failure> {
    client
        .lock_with(
            name,
            &LockOptions::new()
                .ttl(Duration::from_secs(30))
                .watchdog(false),
        )
        .await
        .map_err(fail("holder's acquire"))
}

/// `client` waiting for `name` (10 s at most) in a task: its guard and when it came.
fn wait_for(
    client: LockClient,
    name: &LockName,
) -> tokio::task::JoinHandle<(Result<LockGuard, LockError>, Instant)> {
    let (name, options) = (
        name.clone(),
        LockOptions::new().wait(Duration::from_secs(10)),
    );
    tokio::spawn(async move {
        let guard = client.lock_with(&name, &options).await;
        (guard, Instant::now())
    })
}

/// The dead waiters leave and the holder's key goes, telling nobody.
async fn vanish<C: ConnectionLike + Send + Sync>(raw: &mut C, keys: &RedisKeys) -> Outcome {
    for token in DEAD {
        let _: () = raw.zrem(&keys.queue, token).await.map_err(fail("ZREM"))?;
        let _: () = raw.zrem(&keys.places, token).await.map_err(fail("ZREM"))?;
    }
    let _: () = raw.del(&keys.lock).await.map_err(fail("DEL"))?;
    Ok(())
}

/// A single try of `newcomer` on `name` (it starts the live waiter's turn and finds it busy);
/// the live waiter, `waiting`, must have the lock within `limit` of it.
async fn told_within(
    newcomer: &LockClient,
    name: &LockName,
    waiting: tokio::task::JoinHandle<(Result<LockGuard, LockError>, Instant)>,
    limit: Duration,
) -> Outcome {
    let tried = Instant::now();
    let once = newcomer
        .lock_with(name, &LockOptions::new().wait(Duration::ZERO))
        .await;
    ensure!(
        matches!(once, Err(LockError::Timeout { .. })),
        "the newcomer's single try during the live waiter's turn returned {once:?}"
    );
    let (guard, at) = match tokio::time::timeout(Duration::from_secs(5), waiting).await {
        Ok(done) => done.map_err(fail("waiter task"))?,
        Err(_) => {
            return Err(Failure(
                "the live waiter did not get the lock within 5 s".into(),
            ));
        }
    };
    let guard = guard.map_err(fail("the live waiter"))?;
    let took = at.checked_duration_since(tried);
    guard.release().await.map_err(fail("release"))?;
    let took = took
        .ok_or_else(|| Failure("the live waiter had the lock before the newcomer's try".into()))?;
    ensure!(
        took < limit,
        "the live waiter took the lock {took:?} after the try that started its turn"
    );
    Ok(())
}

/// Plants waiters that died at the head of `keys`' queue, in the order given, with places
/// that would last a minute.
async fn plant_dead<C: ConnectionLike + Send + Sync>(
    raw: &mut C,
    keys: &RedisKeys,
    dead: &[&str],
) -> Outcome {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(fail("clock"))?
        .as_millis();
    let until = u64::try_from(now_ms).unwrap_or(0) + 60_000;
    for (ticket, token) in (1_u64..).zip(dead) {
        let _: () = raw
            .zadd(&keys.queue, *token, ticket)
            .await
            .map_err(fail("ZADD queue"))?;
        let _: () = raw
            .zadd(&keys.places, *token, until)
            .await
            .map_err(fail("ZADD places"))?;
    }
    Ok(())
}
