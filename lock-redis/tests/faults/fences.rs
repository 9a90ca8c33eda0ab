//! Fences: they grow past a lost counter, refuse counters this library did not write, and
//! (Redlock) grow across majorities that share one server.

use std::time::Duration;

use conformance_tests::{Failure, ensure};
use lock_core::{Holder, LockClient, LockError, LockName, LockOptions};
use lock_redis::RedisKeys;
use redis::AsyncCommands;

use super::{Outcome, fail, name, raw_conn, single_client, var};

/// Acquires and releases `lock` `times` times; the last fence issued.
pub(super) async fn cycle(
    client: &LockClient,
    lock: &LockName,
    times: usize,
) -> Result<u64, Failure> {
    let mut last = 0;
    for _ in 0..times {
        let guard = client
            .acquire(&Holder::new(), lock, &LockOptions::new())
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
    let url = var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let lock = name("counter-lost")?;
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
    let url = var("LOCK_TEST_REDIS_URL")?;
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
        let lock = name("planted-fence")?;
        let keys = RedisKeys::new("faults", &lock);
        let _: () = conn.set(&keys.fence, planted).await.map_err(fail("SET"))?;
        let result = client.acquire(&Holder::new(), &lock, &options).await;
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
