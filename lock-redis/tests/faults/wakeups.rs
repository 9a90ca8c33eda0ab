//! Release messages: a release wakes its waiters by pub/sub, and a message that is lost, or
//! reaches only one of a client's waiters, strands nobody.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{env_var, fail, unique_name},
};
use lock_core::{Backoff, LockError, LockOptions};
use lock_redis::RedisKeys;
use redis::AsyncCommands;

use super::{
    marked, queue::until_queued_everywhere, raw_conn, redlock_client, redlock_raw_conns,
    single_client, until_marked,
};

/// The release messages' cases.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("lost_release_message_strands_no_waiter", || {
            Box::pin(lost_release_message_strands_no_waiter())
        })
        .case("redlock_release_wakes_the_first_waiter", || {
            Box::pin(redlock_release_wakes_the_first_waiter())
        })
        .case("redlock_siblings_are_woken_by_name", || {
            Box::pin(redlock_siblings_are_woken_by_name())
        })
        .case("releases_publish_only_for_waiters", || {
            Box::pin(releases_publish_only_for_waiters())
        })
        .case("siblings_in_one_client_are_all_woken", || {
            Box::pin(siblings_in_one_client_are_all_woken())
        })
}

/// A release whose message is lost (here: the key deleted without a publish) strands no
/// waiter past the holder's TTL: the waiter retries when the TTL it saw runs out.
pub(super) async fn lost_release_message_strands_no_waiter() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let b = single_client(&url).await?;
    let lock = unique_name("lost-message")?;
    let ttl = Duration::from_secs(1);
    let start = Instant::now();
    let _held = a
        .lock_with(&lock, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(fail("acquire"))?;
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let options = LockOptions::new().ttl(ttl).wait(Duration::from_secs(5));
            b.lock_with(&lock, &options)
                .await
                .map(|g| (Instant::now(), g))
        }
    });
    // The stimulus: while the waiter waits (it has marked the lock), the key goes without a
    // release message.
    let keys = RedisKeys::new("faults", &lock);
    let mut conn = raw_conn(&url).await?;
    until_marked(&mut conn, &keys, "the waiter").await?;
    let _: () = conn.del(&keys.lock).await.map_err(fail("DEL"))?;
    let (acquired, guard) = waiter
        .await
        .map_err(fail("waiter task"))?
        .map_err(fail("the waiter did not get the lock"))?;
    let took = acquired - start;
    ensure!(
        took <= ttl + Duration::from_millis(300),
        "the waiter got the lock {took:?} in, past the holder's {ttl:?} TTL"
    );
    guard.release().await.map_err(fail("release"))
}

/// Release messages, as a stream.
type Messages = std::pin::Pin<Box<dyn futures::Stream<Item = redis::Msg> + Send>>;

/// A listener on every release channel of `keys`: the stem, where nothing is published but
/// the tests' markers, and every client's channel under it.
pub(super) async fn release_listener(url: &str, keys: &RedisKeys) -> Result<Messages, Failure> {
    let raw = redis::Client::open(url).map_err(fail("client"))?;
    let mut listener = raw.get_async_pubsub().await.map_err(fail("pubsub"))?;
    listener
        .psubscribe(format!("{}*", keys.channel))
        .await
        .map_err(fail("PSUBSCRIBE"))?;
    Ok(Box::pin(listener.into_on_message()))
}

/// The next message of `messages` within 5 s: its channel and its payload.
pub(super) async fn next_message(messages: &mut Messages) -> Result<(String, String), Failure> {
    use futures::StreamExt;
    let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .map_err(|_| Failure("no message on the release channels within 5 s".into()))?
        .ok_or_else(|| Failure("the release listener closed".into()))?;
    let payload = message.get_payload().map_err(fail("payload"))?;
    Ok((message.get_channel_name().to_owned(), payload))
}

/// A release publishes only when someone waits: without a waiter nothing goes out (on a cluster
/// a `PUBLISH` reaches every node); with one, the release publishes, wakes it, and removes the
/// waiter mark.
pub(super) async fn releases_publish_only_for_waiters() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let b = single_client(&url).await?;
    let lock = unique_name("publish-for-waiters")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut conn = raw_conn(&url).await?;
    let mut messages = release_listener(&url, &keys).await?;

    // Nobody waits: the release publishes nothing. Our own marker, published after it, is the
    // first message on the channel (one connection delivers in the server's order).
    let guard = a
        .lock_with(&lock, &LockOptions::new())
        .await
        .map_err(fail("acquire"))?;
    guard.release().await.map_err(fail("release"))?;
    let _: i64 = conn
        .publish(&keys.channel, "marker")
        .await
        .map_err(fail("PUBLISH"))?;
    let (_, first) = next_message(&mut messages).await?;
    ensure!(
        first == "marker",
        "a release without waiters published {first:?}"
    );

    // Someone waits: the release publishes and the waiter gets the lock.
    let guard = a
        .lock_with(&lock, &LockOptions::new())
        .await
        .map_err(fail("acquire"))?;
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(30));
            b.lock_with(&lock, &options).await
        }
    });
    until_marked(&mut conn, &keys, "the waiter").await?;
    // The release hands the lock over to the waiter in line and tells its client alone:
    // `=<token> <fence> <server ms>`.
    let queued: Vec<String> = conn
        .zrange(&keys.queue, 0, -1)
        .await
        .map_err(fail("ZRANGE queue"))?;
    let released = Instant::now();
    guard.release().await.map_err(fail("release"))?;
    let (_, published) = next_message(&mut messages).await?;
    ensure!(
        queued.len() == 1 && published.starts_with(&format!("={} ", queued[0])),
        "the release with one waiter queued ({queued:?}) published {published:?}, not a hand-over \
         to that waiter"
    );
    let next = waiter
        .await
        .map_err(fail("waiter task"))?
        .map_err(fail("the waiter did not get the lock"))?;
    let took = released.elapsed();
    // Woken by the message, not by the holder's 30 s TTL running out.
    ensure!(
        took < Duration::from_secs(10),
        "the waiter got the lock {took:?} after the release"
    );
    next.release().await.map_err(fail("release"))?;
    ensure!(
        !marked(&mut conn, &keys).await?,
        "the waiter mark outlived the last release"
    );
    Ok(())
}

/// Waiters of one client share a subscription, and a release message wakes one of them: the
/// one that wins must leave the lock marked for the others, or they sleep until the TTL.
pub(super) async fn siblings_in_one_client_are_all_woken() -> Outcome {
    const SIBLINGS: usize = 3;
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let b = single_client(&url).await?;
    let lock = unique_name("siblings")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut conn = raw_conn(&url).await?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(60))
        .watchdog(false);
    let guard = a
        .lock_with(&lock, &options)
        .await
        .map_err(fail("acquire"))?;
    let mut waiters = Vec::new();
    for i in 0..SIBLINGS {
        waiters.push(tokio::spawn({
            let (b, lock, options) = (b.clone(), lock.clone(), options.clone());
            async move {
                let next = b.lock_with(&lock, &options).await?;
                let at = Instant::now();
                next.release().await?;
                Ok::<_, LockError>(at)
            }
        }));
        // Sibling i is asleep once its busy try has set the mark; clear the mark so the next
        // sibling's try shows too (the last one's stays for the release).
        until_marked(&mut conn, &keys, &format!("waiter {i}")).await?;
        if i + 1 < SIBLINGS {
            let _: i64 = conn.del(&keys.waiters).await.map_err(fail("DEL"))?;
        }
    }
    let released = Instant::now();
    guard.release().await.map_err(fail("release"))?;
    for waiter in waiters {
        let at = waiter
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("a sibling did not get the lock"))?;
        let took = at - released;
        // Each hand-off is pushed; a sibling left without a mark would sleep out the 30 s TTL.
        ensure!(
            took < Duration::from_secs(10),
            "a sibling got the lock {took:?} after the first release"
        );
    }
    ensure!(
        !marked(&mut conn, &keys).await?,
        "the waiter mark outlived the last release"
    );
    Ok(())
}

/// Redlock waiters are woken by the servers' release messages, not by their own polls: a
/// waiter queued behind a held lock acquires within 50 ms of the release in at least 5 of 6
/// rounds. (Polling, the first in line votes every 187-312 ms whatever its back-off, so a vote
/// lands within 50 ms of a release about one round in five.)
pub(super) async fn redlock_release_wakes_the_first_waiter() -> Outcome {
    const ROUNDS: usize = 6;
    const PROMPT: Duration = Duration::from_millis(50);
    let holder = redlock_client().await?;
    let waiter = redlock_client().await?;
    let lock = unique_name("redlock-push")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut raws = redlock_raw_conns().await?;
    // A back-off above the queued poll's cap, so no vote comes sooner than that poll.
    let step = Duration::from_millis(300);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .backoff(Backoff::new(step, step));
    let mut took = Vec::new();
    for _ in 0..ROUNDS {
        let held = holder
            .lock_with(&lock, &options)
            .await
            .map_err(fail("holder's acquire"))?;
        let waiting = tokio::spawn({
            let (waiter, lock) = (waiter.clone(), lock.clone());
            let options = options.clone().wait(Duration::from_secs(10));
            async move {
                let guard = waiter.lock_with(&lock, &options).await;
                (guard, Instant::now())
            }
        });
        until_queued_everywhere(&mut raws, &keys, 1).await?;
        let released = Instant::now();
        held.release().await.map_err(fail("holder's release"))?;
        let (guard, acquired) = waiting.await.map_err(fail("waiter task"))?;
        let guard = guard.map_err(fail("waiter's acquire"))?;
        took.push(acquired.saturating_duration_since(released));
        guard.release().await.map_err(fail("waiter's release"))?;
    }
    let prompt = took.iter().filter(|t| **t <= PROMPT).count();
    ensure!(
        prompt + 1 >= ROUNDS,
        "the waiter acquired within {PROMPT:?} of the release in {prompt} of {ROUNDS} rounds \
         (took {took:?}): it was not woken by the release"
    );
    Ok(())
}

/// One Redlock client's waiters on one lock (tasks sharing a client, as a service's handlers
/// do) are each woken when a release names them, not a sibling in their place: sixteen of
/// them, queued behind another client's hold and each releasing at once, all have had the
/// lock within 500 ms of the hold's release. (A sibling woken in the named one's place votes
/// in vain; the named one then comes at its next poll, or the second in line 105 ms later.
/// Each server's message wakes one sibling, so with five servers and a few siblings the named
/// one is mostly among them; with sixteen, mostly not.)
pub(super) async fn redlock_siblings_are_woken_by_name() -> Outcome {
    const WAITERS: usize = 16;
    const BOUND: Duration = Duration::from_millis(500);
    let holder = redlock_client().await?;
    let waiters = redlock_client().await?;
    let lock = unique_name("redlock-siblings")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut raws = redlock_raw_conns().await?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder
        .lock_with(&lock, &options)
        .await
        .map_err(fail("holder's acquire"))?;
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let (waiters, lock) = (waiters.clone(), lock.clone());
        let options = options.clone().wait(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            let guard = waiters.lock_with(&lock, &options).await?;
            guard.release().await?;
            Ok::<_, LockError>(Instant::now())
        }));
    }
    until_queued_everywhere(&mut raws, &keys, WAITERS).await?;
    let released = Instant::now();
    held.release().await.map_err(fail("holder's release"))?;
    let mut last = released;
    for task in tasks {
        let done = task
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("waiter"))?;
        last = last.max(done);
    }
    let took = last.saturating_duration_since(released);
    ensure!(
        took <= BOUND,
        "{WAITERS} waiters of one client took {took:?} to pass the lock along (bound {BOUND:?})"
    );
    Ok(())
}
