//! The waiters' keys of a waiter that died: they expire when its place lapses, rather than
//! staying until someone tries the lock again (for a name nobody uses again: for ever).

use std::time::Duration;

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{env_var, fail, poll_until, unique_name},
};
use lock_core::{LockName, LockOptions};
use lock_redis::RedisKeys;
use redis::AsyncCommands;

use super::{raw_conn, single_client};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases.case("a_dead_waiters_keys_expire_with_its_place", || {
        Box::pin(a_dead_waiters_keys_expire_with_its_place())
    })
}

/// A waiter queues behind a holder (its budget 2 s, so its place lasts 3 s) and dies: its
/// process ends without taking its place out (here its runtime is shut down, which drops the
/// `acquire` without running the clean-up it spawns). Nobody tries the lock afterwards, so no
/// try sweeps the lapsed place: the queue, the places and the clients keys must expire on their
/// own once the place lapses. The fence counter stays, as it always does.
async fn a_dead_waiters_keys_expire_with_its_place() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let name = unique_name("dead-waiter-keys")?;
    let keys = RedisKeys::new("faults", &name);
    let mut raw = raw_conn(&url).await?;
    let holder = single_client(&url).await?;
    let held = holder
        .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .map_err(fail("holder's acquire"))?;
    let outcome = async {
        die_queued(&url, &name, &keys).await?;
        let left: i64 = raw.zcard(&keys.queue).await.map_err(fail("ZCARD"))?;
        ensure!(
            left == 1,
            "{left} places after the waiter died: it took its place out, the case tests nothing"
        );
        let waiters_keys = [
            keys.queue.clone(),
            keys.places.clone(),
            keys.clients.clone(),
        ];
        poll_until(
            Duration::from_secs(6),
            "the dead waiter's queue, places and clients keys expiring",
            async || {
                let left: i64 = raw
                    .exists(&waiters_keys[..])
                    .await
                    .map_err(fail("EXISTS"))?;
                Ok(left == 0)
            },
        )
        .await
    }
    .await;
    held.release().await.map_err(fail("holder's release"))?;
    let _: i64 = raw.del(&keys.fence).await.map_err(fail("DEL"))?;
    outcome
}

/// Runs a waiter on `name` in a runtime of its own on another thread, and shuts that runtime
/// down once the waiter's place is in the queue: what the server sees of a process that died
/// while it waited.
async fn die_queued(url: &str, name: &LockName, keys: &RedisKeys) -> Outcome {
    let (url, name, queue) = (url.to_owned(), name.clone(), keys.queue.clone());
    tokio::task::spawn_blocking(move || -> Outcome {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(fail("runtime"))?;
        runtime.block_on(async {
            let client = single_client(&url).await?;
            let options = LockOptions::new().wait(Duration::from_secs(2));
            let waiter = tokio::spawn(async move { client.lock_with(&name, &options).await });
            let mut raw = raw_conn(&url).await?;
            poll_until(Duration::from_secs(2), "the waiter's place", async || {
                let places: i64 = raw.zcard(&queue).await.map_err(fail("ZCARD"))?;
                Ok(places == 1)
            })
            .await?;
            ensure!(!waiter.is_finished(), "the waiter ended before it died");
            Ok(())
        })?;
        runtime.shutdown_background();
        Ok(())
    })
    .await
    .map_err(fail("the dying waiter's thread"))?
}
