//! Fences: they grow past a lost counter, refuse counters this library did not write, and
//! (Redlock) grow across majorities that share one server.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{env_var, fail, unique_name},
};
use lock_core::{LockClient, LockError, LockName, LockOptions};
use lock_redis::{RedisKeys, RedlockBackend, RedlockConfig};
use redis::AsyncCommands;

use super::{raw_conn, single_client};

/// Acquires and releases `lock` `times` times; the last fence issued.
pub(super) async fn cycle(
    client: &LockClient,
    lock: &LockName,
    times: usize,
) -> Result<u64, Failure> {
    let mut last = 0;
    for _ in 0..times {
        let guard = client
            .lock_with(lock, &LockOptions::new())
            .await
            .map_err(fail("acquire"))?;
        last = guard.fence().get();
        guard.release().await.map_err(fail("release"))?;
    }
    Ok(last)
}

/// A fence counter that disappeared (evicted under an `allkeys-*` policy, or deleted by hand)
/// does not make fences go back.
pub(super) async fn fences_grow_after_the_counter_is_lost() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let lock = unique_name("counter-lost")?;
    let before = cycle(&client, &lock, 3).await?;
    let mut conn = raw_conn(&url).await?;
    let deleted: i64 = conn
        .del(RedisKeys::new("faults", &lock).fence)
        .await
        .map_err(fail("DEL"))?;
    ensure!(deleted == 1, "there was no fence counter to delete");
    let after = cycle(&client, &lock, 1).await?;
    ensure!(
        after > before,
        "the fence after the counter was lost, {after}, is not above the fence before, {before}"
    );
    let _: i64 = conn
        .del(RedisKeys::new("faults", &lock).fence)
        .await
        .map_err(fail("DEL"))?;
    Ok(())
}

/// Fence counters this library cannot have written (negative, not canonical, or too large to
/// increase within the fence range) are refused with an error naming the counter, before
/// anything is written: no lock key, no change to the counter.
pub(super) async fn planted_fence_counters_are_refused() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let mut conn = raw_conn(&url).await?;
    let options = LockOptions::new().wait(Duration::ZERO);
    for planted in [
        "9223372036854775806",
        "9223372036854775807",
        "9007199254740993",
        "-5",
        "-1",
        "007",
        "",
    ] {
        let lock = unique_name("planted-fence")?;
        let keys = RedisKeys::new("faults", &lock);
        let _: () = conn.set(&keys.fence, planted).await.map_err(fail("SET"))?;
        let result = client.lock_with(&lock, &options).await;
        let lock_exists: bool = conn.exists(&keys.lock).await.map_err(fail("EXISTS"))?;
        let counter: String = conn.get(&keys.fence).await.map_err(fail("GET"))?;
        let _: i64 = conn
            .del(&[&keys.fence, &keys.lock])
            .await
            .map_err(fail("DEL"))?;
        ensure!(
            matches!(&result, Err(LockError::Foreign { found, .. }) if found.contains(&keys.fence)),
            "a fence counter of {planted:?} gave {:?}",
            result.map(|g| g.fence())
        );
        ensure!(
            !lock_exists,
            "a fence counter of {planted:?} was refused but the lock key was written"
        );
        ensure!(
            counter == planted,
            "a refused fence counter of {planted:?} was changed to {counter:?}"
        );
    }
    Ok(())
}

/// Sends `CLIENT PAUSE ms WRITE` to the server at `url`: its scripts queue until it ends.
async fn pause_writes(url: &str, ms: u64) -> Outcome {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query_async(&mut raw_conn(url).await?)
        .await
        .map_err(fail("CLIENT PAUSE"))?;
    Ok(())
}

/// Ends a `CLIENT PAUSE` on the server at `url`; its queued scripts then run in order.
async fn unpause(url: &str) -> Outcome {
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw_conn(url).await?)
        .await
        .map_err(fail("CLIENT UNPAUSE"))?;
    Ok(())
}

/// Acquires `lock` on `client` while the server at `paused` holds back writes (so the
/// majority of the others grants it), releases it, and ends the pause; the fence.
async fn fence_without(client: &LockClient, lock: &LockName, paused: &str) -> Result<u64, Failure> {
    pause_writes(paused, 5_000).await?;
    let outcome = async {
        let options = LockOptions::new()
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_secs(2));
        let guard = client
            .lock_with(lock, &options)
            .await
            .map_err(fail("acquire"))?;
        let fence = guard.fence().get();
        guard.release().await.map_err(fail("release"))?;
        Ok(fence)
    }
    .await;
    unpause(paused).await?;
    outcome
}

/// Redlock over three servers: two majorities share a server, so a fence must grow from one
/// to the next even when the servers' counters differ. Here n1's counter runs an hour ahead
/// (a server whose clock is ahead, or the grant-and-undo rounds of contended votes that reach
/// n1 alone); {n1, n2} grant the first acquisition, {n2, n3} the second.
pub(super) async fn redlock_fences_grow_across_majorities() -> Outcome {
    let urls: Vec<String> = env_var("LOCK_TEST_REDLOCK_URLS")?
        .split(',')
        .take(3)
        .map(str::to_owned)
        .collect();
    let [n1, _, n3] = urls.as_slice() else {
        return Err(Failure(
            "LOCK_TEST_REDLOCK_URLS lists fewer than 3 servers".into(),
        ));
    };
    let client = LockClient::new(
        RedlockBackend::connect(RedlockConfig::new(urls.clone()).key_prefix("faults"))
            .await
            .map_err(fail("redlock connect"))?,
    );
    let lock = unique_name("redlock-fences")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut first = raw_conn(n1).await?;
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut first)
        .await
        .map_err(fail("TIME"))?;
    let ahead = seconds * 1_000_000 + micros + 3_600_000_000;
    let _: () = first.set(&keys.fence, ahead).await.map_err(fail("SET"))?;
    let outcome = async {
        let f1 = fence_without(&client, &lock, n3).await?;
        let f2 = fence_without(&client, &lock, n1).await?;
        ensure!(
            f2 > f1,
            "the fence granted by {{n2, n3}}, {f2}, is not above the one granted before by \
             {{n1, n2}}, {f1}"
        );
        Ok(())
    }
    .await;
    for url in &urls {
        let _: i64 = raw_conn(url)
            .await?
            .del(&keys.fence)
            .await
            .map_err(fail("DEL"))?;
    }
    outcome
}
