//! Turns: a waiter whose turn another waiter's try (or Redlock vote) starts hears of it at
//! once.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{env_var, fail, poll_until, unique_name},
};
use lock_core::{LockError, LockOptions};
use lock_redis::RedisKeys;
use redis::{AsyncCommands, aio::MultiplexedConnection};

use super::{
    queue::until_queued_everywhere, raw_conn, redlock_client, redlock_raw_conns, single_client,
    until_marked,
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("a_waiter_hears_the_turn_another_try_starts", || {
            Box::pin(a_waiter_hears_the_turn_another_try_starts())
        })
        .case("redlock_waiter_hears_the_turn_another_vote_starts", || {
            Box::pin(redlock_waiter_hears_the_turn_another_vote_starts())
        })
}

/// Two dead waiters planted at the head of the queue (places of a minute), and a live waiter
/// that queues behind them on the free lock (third in line: its try starts the first dead
/// one's turn). Then the two dead ones give up, which wakes nobody: the live waiter is first
/// and does not know it. A newcomer's single try on the free lock starts the live waiter's
/// turn (100 ms); the live waiter must come within it, told by that try, not at a retry of
/// its own (then its turn would be over; a retry of a waiter further back than second comes
/// later than a turn).
async fn a_waiter_hears_the_turn_another_try_starts() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let name = unique_name("told-turn")?;
    let keys = RedisKeys::new("faults", &name);
    let mut raw = raw_conn(&url).await?;
    let dead = [
        "0123456789abcdef0123456789abcde1",
        "0123456789abcdef0123456789abcde2",
    ];
    plant_dead(&mut raw, &keys, &dead).await?;
    let (waiter, newcomer) = (single_client(&url).await?, single_client(&url).await?);
    let waiting = tokio::spawn({
        let (name, options) = (
            name.clone(),
            LockOptions::new().wait(Duration::from_secs(10)),
        );
        async move {
            let guard = waiter.lock_with(&name, &options).await;
            (guard, Instant::now())
        }
    });
    until_marked(&mut raw, &keys, "the live waiter").await?;
    let line: Vec<String> = raw
        .zrange(&keys.queue, 0, -1)
        .await
        .map_err(fail("ZRANGE"))?;
    ensure!(
        line.len() == 3 && line[..2] == dead,
        "the queue is {line:?}, expected the two dead waiters and the live one"
    );
    for token in dead {
        let _: () = raw.zrem(&keys.queue, token).await.map_err(fail("ZREM"))?;
        let _: () = raw.zrem(&keys.places, token).await.map_err(fail("ZREM"))?;
    }
    let tried = Instant::now();
    let once = newcomer
        .lock_with(&name, &LockOptions::new().wait(Duration::ZERO))
        .await;
    ensure!(
        matches!(once, Err(LockError::Timeout { .. })),
        "the newcomer's single try during the live waiter's turn returned {once:?}"
    );
    let (guard, at) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .map_err(fail("the live waiter did not get the lock within 5 s"))?
        .map_err(fail("waiter task"))?;
    let guard = guard.map_err(fail("the live waiter"))?;
    let took = at.duration_since(tried);
    guard.release().await.map_err(fail("release"))?;
    let _: () = raw
        .del(&[&keys.queue, &keys.places, &keys.clients, &keys.fence])
        .await
        .map_err(fail("clean-up"))?;
    ensure!(
        took < Duration::from_millis(60),
        "the live waiter took the lock {took:?} after the try that started its turn (100 ms)"
    );
    Ok(())
}

/// Plants waiters that died at the head of `keys`' queue, in the order given, with places
/// that would last a minute.
async fn plant_dead(raw: &mut MultiplexedConnection, keys: &RedisKeys, dead: &[&str]) -> Outcome {
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
    poll_until(Duration::from_secs(1), "the planted places", async || {
        let n: i64 = raw.zcard(&keys.queue).await.map_err(fail("ZCARD"))?;
        Ok(n == i64::try_from(dead.len()).unwrap_or(0))
    })
    .await
}

/// Redlock: the same on every server. Two dead waiters planted at the head of every server's
/// queue, a live waiter queued behind them (third in line: it votes only every 0.75 to 1 s
/// to keep its place), the two dead ones gone silently, and a newcomer's single vote starts
/// the live waiter's turn (400 ms) on every server: the live waiter must vote within it,
/// told by those servers, not at its next vote to keep its place.
async fn redlock_waiter_hears_the_turn_another_vote_starts() -> Outcome {
    let name = unique_name("redlock-told-turn")?;
    let keys = RedisKeys::new("faults", &name);
    let mut raws = redlock_raw_conns().await?;
    let dead = [
        "0123456789abcdef0123456789abcde1",
        "0123456789abcdef0123456789abcde2",
    ];
    for raw in &mut raws {
        plant_dead(raw, &keys, &dead).await?;
    }
    let (waiter, newcomer) = (redlock_client().await?, redlock_client().await?);
    let waiting = tokio::spawn({
        let (name, options) = (
            name.clone(),
            LockOptions::new().wait(Duration::from_secs(10)),
        );
        async move {
            let guard = waiter.lock_with(&name, &options).await;
            (guard, Instant::now())
        }
    });
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
    for raw in &mut raws {
        for token in dead {
            let _: () = raw.zrem(&keys.queue, token).await.map_err(fail("ZREM"))?;
            let _: () = raw.zrem(&keys.places, token).await.map_err(fail("ZREM"))?;
        }
    }
    let voted = Instant::now();
    let once = newcomer
        .lock_with(&name, &LockOptions::new().wait(Duration::ZERO))
        .await;
    ensure!(
        matches!(once, Err(LockError::Timeout { .. })),
        "the newcomer's single vote during the live waiter's turn returned {once:?}"
    );
    let (guard, at) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .map_err(fail("the live waiter did not get the lock within 5 s"))?
        .map_err(fail("waiter task"))?;
    let guard = guard.map_err(fail("the live waiter"))?;
    let took = at.duration_since(voted);
    guard.release().await.map_err(fail("release"))?;
    for raw in &mut raws {
        let _: () = raw
            .del(&[&keys.queue, &keys.places, &keys.clients, &keys.fence])
            .await
            .map_err(fail("clean-up"))?;
    }
    ensure!(
        took < Duration::from_millis(300),
        "the live waiter took the lock {took:?} after the vote that started its turn (400 ms)"
    );
    Ok(())
}
