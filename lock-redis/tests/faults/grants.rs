//! Grants the backend cannot stand behind are undone, never returned nor left behind: a
//! `WAIT` for replicas that fails, a grant whose reply comes after its local deadline, a
//! Redlock vote that a minority granted (undone where it may hold), and where an earlier
//! vote's grant was left behind.

use std::time::{Duration, Instant};

use futures::StreamExt;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{Paused, env_var, fail, poll_until, unique_name},
};
use lock_core::{LockClient, LockError, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys};
use redis::AsyncCommands;

use super::{
    fences::{cycle, pause_writes, script_calls, unpause},
    monitor, raw_conn, redlock_client, redlock_held, redlock_raw_conns, redlock_urls,
    replicas::{replica_streams, start_replica},
    single_client,
};

/// With `replica_acks`, a `WAIT` that fails (here refused by an ACL that allows everything
/// else) releases the acquisition before the error is returned: no lock key is left.
pub(super) async fn failed_replica_wait_releases_the_grant() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let mut admin = raw_conn(&url).await?;
    let user = format!("faults-nowait-{:08x}", rand::random::<u32>());
    let password = format!("{:016x}", rand::random::<u64>());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(format!(">{password}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-wait")
        .query_async(&mut admin)
        .await
        .map_err(fail("ACL SETUSER"))?;
    let outcome = async {
        let (_, address) = url
            .split_once("://")
            .ok_or_else(|| Failure(format!("no scheme in {url}")))?;
        let config = RedisConfig::single(format!("redis://{user}:{password}@{address}"))
            .key_prefix("faults")
            .replica_acks(1, Duration::from_millis(100));
        let client = LockClient::new(
            RedisBackend::connect(config)
                .await
                .map_err(fail("connect"))?,
        );
        let lock = unique_name("wait-fails")?;
        let result = client
            .lock_with(
                &lock,
                &LockOptions::new()
                    .ttl(Duration::from_secs(30))
                    .wait(Duration::ZERO),
            )
            .await;
        let key = RedisKeys::new("faults", &lock).lock;
        let left: bool = admin.exists(&key).await.map_err(fail("EXISTS"))?;
        let _: i64 = admin.del(&key).await.map_err(fail("DEL"))?;
        ensure!(
            result.is_err(),
            "acquire succeeded although WAIT is refused: {:?}",
            result.map(|g| g.fence())
        );
        ensure!(
            !left,
            "a failed WAIT left the lock key `{key}` behind (acquire said {:?})",
            result.map(|g| g.fence())
        );
        Ok(())
    }
    .await;
    let _: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut admin)
        .await
        .map_err(fail("ACL DELUSER"))?;
    outcome
}

/// A grant whose reply comes after its local deadline (the server held the script back for
/// longer than the TTL: `CLIENT PAUSE WRITE`) is released and reported, not returned as a
/// guard that is already lost while the store still holds the lock.
pub(super) async fn late_grant_is_released_not_returned() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let lock = unique_name("late-grant")?;
    let key = RedisKeys::new("faults", &lock).lock;
    let mut conn = raw_conn(&url).await?;
    let ttl = Duration::from_millis(100);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .map_err(fail("CLIENT PAUSE"))?;
    let start = Instant::now();
    let result = client
        .lock_with(&lock, &LockOptions::new().ttl(ttl).wait(Duration::ZERO))
        .await;
    let took = start.elapsed();
    let left: bool = conn.exists(&key).await.map_err(fail("EXISTS"))?;
    ensure!(
        took > ttl,
        "the paused server answered in {took:?}, within the {ttl:?} TTL: no late grant to judge"
    );
    match result {
        Ok(guard) => Err(Failure(format!(
            "acquire returned a guard {took:?} after it was sent, past its {ttl:?} TTL \
             (is_held() = {})",
            guard.is_held()
        ))),
        Err(LockError::Unavailable { .. }) => {
            ensure!(
                !left,
                "the late grant was reported but its key `{key}` is still there"
            );
            Ok(())
        }
        Err(other) => Err(Failure(format!("a late grant gave {other:?}"))),
    }
}

/// With `replica_acks`, a `WAIT` that is answered after the lease's local deadline (the
/// replica is stopped for 300 ms, the TTL is 100 ms) makes no grant: the acquisition is
/// released and reported.
pub(super) async fn replica_wait_past_the_ttl_is_released() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Failure(format!("no port in {url}")))?;
    let replica_port = port + 12;
    let (mut replica, dir) = start_replica(port, replica_port)?;
    let pid = replica.id();
    let outcome = async {
        let replica_url = format!("redis://127.0.0.1:{replica_port}");
        replica_streams(&url, &replica_url).await?;
        let config = RedisConfig::single(&url)
            .key_prefix("faults")
            .replica_acks(1, Duration::from_secs(1));
        let client = LockClient::new(
            RedisBackend::connect(config)
                .await
                .map_err(fail("connect"))?,
        );
        let lock = unique_name("wait-past-ttl")?;
        let ttl = Duration::from_millis(100);
        let paused = Paused::process(pid)?;
        let resume = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            paused.resume()
        });
        let start = Instant::now();
        let result = client
            .lock_with(&lock, &LockOptions::new().ttl(ttl).wait(Duration::ZERO))
            .await;
        let took = start.elapsed();
        resume.await.map_err(fail("resume task"))??;
        ensure!(
            took > ttl,
            "the stopped replica acknowledged within {took:?}, inside the {ttl:?} TTL"
        );
        match result {
            Ok(guard) => Err(Failure(format!(
                "acquire returned a guard after a WAIT of {took:?}, past its {ttl:?} TTL \
                 (is_held() = {})",
                guard.is_held()
            ))),
            Err(LockError::Unavailable { message, .. }) if message.contains("released") => Ok(()),
            Err(other) => Err(Failure(format!(
                "a WAIT past the TTL gave {other:?} after {took:?}"
            ))),
        }
    }
    .await;
    let _ = replica.kill();
    let _ = replica.wait();
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// A Redlock vote that only a minority granted is undone on those servers, and on those that
/// did not answer (they may have granted), not on the servers that refused it: a release
/// there finds another holder's key and does nothing, and when a thousand waiters' votes time
/// out together those releases add to the load that timed them out. A holds the lock; its
/// key is deleted by hand on the last two servers, so B's try (no wait) is granted there and
/// refused on the first three. Counted on the servers, least of three tries: one script call
/// on each server that refused (the vote), two on each that granted (the vote and its
/// release), and B's grants are gone. Before, B's try released on every server: two calls
/// on each.
pub(super) async fn redlock_minority_grant_is_undone_only_where_granted() -> Outcome {
    let (lock, RedisKeys { lock: key, .. }, held) = redlock_held("redlock-minority-grant").await?;
    let (b, mut raws) = (redlock_client().await?, redlock_raw_conns().await?);
    let granting = raws.len() / 2 + 1..raws.len();
    let mut least = vec![u64::MAX; raws.len()];
    for _ in 0..3 {
        for raw in &mut raws[granting.clone()] {
            let _: () = raw.del(&key).await.map_err(fail("DEL"))?;
        }
        let before = script_calls(&mut raws).await?;
        let tried = b.try_lock(&lock).await.map_err(fail("B's try"))?;
        let after = script_calls(&mut raws).await?;
        ensure!(
            tried.is_none(),
            "B's try got the lock a majority holds for A"
        );
        for ((least, a), b) in least.iter_mut().zip(&after).zip(&before) {
            *least = (*least).min(a.saturating_sub(*b));
        }
        for (i, raw) in raws.iter_mut().enumerate() {
            let left: bool = raw.exists(&key).await.map_err(fail("EXISTS"))?;
            ensure!(
                left != granting.contains(&i),
                "server {i}: the lock key is {}after B's try",
                if left { "still there " } else { "gone " }
            );
        }
    }
    held.release().await.map_err(fail("A's release"))?;
    let expected: Vec<u64> = (0..raws.len())
        .map(|i| if granting.contains(&i) { 2 } else { 1 })
        .collect();
    ensure!(
        least == expected,
        "script calls per server for B's try (least of three): {least:?}, expected {expected:?}"
    );
    Ok(())
}

/// A Redlock server that still holds a waiter's own token (a grant of an earlier vote whose
/// answer was lost and whose undo failed, as when a connection drops between the two) answers
/// its next vote "busy" with that token; a vote that fails must undo it there too, or the
/// server refuses everyone until the TTL. A holds the lock; B waits. Once the first server's
/// `MONITOR` shows B's vote (and so its token), the test sets the lock there to B's token, and
/// deletes A's on the last two servers: B's next vote is granted there, busy with its own
/// token on the first, refused on the other two, and must be undone on all three. Before,
/// the first server kept B's token (the undo went only where the vote was granted).
pub(super) async fn redlock_failed_vote_undoes_its_own_earlier_grant() -> Outcome {
    let (lock, keys, held) = redlock_held("redlock-own-grant").await?;
    let (b, mut raws) = (redlock_client().await?, redlock_raw_conns().await?);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(10));
    let first = redlock_urls()?
        .into_iter()
        .next()
        .ok_or_else(|| Failure("no Redlock server".into()))?;
    let mut watch = monitor(&first).await?;
    let waiting = tokio::spawn({
        let (lock, options) = (lock.clone(), options.clone());
        async move { b.lock_with(&lock, &options).await.map(drop) }
    });
    let by = Instant::now() + Duration::from_secs(5);
    let token = loop {
        let line = tokio::time::timeout_at(by.into(), watch.next())
            .await
            .map_err(|_| Failure("no vote of B on the first server within 5 s".into()))?
            .ok_or_else(|| Failure("the MONITOR ended".into()))?;
        // `"EVALSHA" "<sha>" "6" "<lock>" <five more keys> "<token>" ...`
        let fields: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        if fields.first() == Some(&"EVALSHA")
            && fields.get(3) == Some(&keys.lock.as_str())
            && let Some(token) = fields.get(9)
        {
            break (*token).to_owned();
        }
    };
    drop(watch);
    let _: () = raws[0]
        .set_ex(&keys.lock, &token, 30)
        .await
        .map_err(fail("SET B's token"))?;
    for raw in &mut raws[3..] {
        let _: () = raw.del(&keys.lock).await.map_err(fail("DEL"))?;
    }
    let outcome = poll_until(
        Duration::from_secs(3),
        "the first server giving up B's token (B's failing votes must undo it there)",
        async || {
            let value: Option<String> = raws[0].get(&keys.lock).await.map_err(fail("GET"))?;
            Ok(value.as_deref() != Some(token.as_str()))
        },
    )
    .await;
    waiting.abort();
    drop(waiting.await);
    held.release().await.map_err(fail("A's release"))?;
    outcome
}

/// A Redlock vote that a server did not answer in time may still have been granted there (its
/// script ran late): a failed vote is undone there too. A holds the lock; its key is deleted on the
/// last three servers and the third holds back writes for 300 ms (`CLIENT PAUSE`), so B's try is
/// granted on the last two, busy on the first two, unanswered on the third, and fails. Once the
/// pause ends, the third runs B's vote (a grant: its fence counter moves on) and then its undo: two
/// script calls at least, and no key left there. Undone only where the vote was granted, it kept
/// B's key.
pub(super) async fn redlock_unanswered_vote_is_undone_there() -> Outcome {
    let (
        lock,
        RedisKeys {
            lock: key, fence, ..
        },
        held,
    ) = redlock_held("redlock-unanswered").await?;
    let (b, mut raws, urls) = (
        redlock_client().await?,
        redlock_raw_conns().await?,
        redlock_urls()?,
    );
    // Loads the scripts on every server (a first call is two: NOSCRIPT, then the source).
    cycle(&b, &unique_name("redlock-unanswered-warm")?, 1).await?;
    for raw in &mut raws[2..] {
        let _: () = raw.del(&key).await.map_err(fail("DEL"))?;
    }
    let before = script_calls(&mut raws).await?;
    // A's fence there: only a grant of B's vote changes it (its undo leaves it).
    let fence_before: Option<u64> = raws[2].get(&fence).await.map_err(fail("GET fence"))?;
    pause_writes(&urls[2], 300).await?;
    let tried = b.try_lock(&lock).await;
    unpause(&urls[2]).await?;
    ensure!(
        matches!(tried, Ok(None)),
        "B's try gave {tried:?}; two of five granted it"
    );
    // Both calls run once the pause ends; other clients' calls could only add to the count.
    // What the last check saw is asserted below, each part with its own message.
    let (mut calls, mut granted, mut left) = (0, false, true);
    let settled = poll_until(
        Duration::from_secs(2),
        "the vote and its undo on the server that did not answer",
        async || {
            calls = script_calls(&mut raws[2..3]).await?[0].saturating_sub(before[2]);
            let now: Option<u64> = raws[2].get(&fence).await.map_err(fail("GET fence"))?;
            left = raws[2].exists(&key).await.map_err(fail("EXISTS"))?;
            granted = now != fence_before;
            Ok(calls >= 2 && granted && !left)
        },
    )
    .await;
    held.release().await.map_err(fail("A's release"))?;
    ensure!(
        granted,
        "the server that did not answer never granted B's vote (its fence is still A's): \
         nothing to undo"
    );
    ensure!(
        calls >= 2 && !left,
        "the server that did not answer ran {calls} script calls of B's try (the vote, and its \
         undo expected) and {} a key",
        if left { "keeps" } else { "has no" }
    );
    // Only a failure of a check itself is left here.
    settled
}
