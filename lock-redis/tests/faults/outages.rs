//! Servers that are down, restarted or never there: Redlock keeps a majority or fails
//! cleanly, a restart that forgot a held lock fires `lost()`, a closed port is `Unavailable`.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{Instance, Stopped, env_var, fail, unique_name},
};
use lock_core::{LockClient, LockError, LockOptions, LossReason};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys, RedlockBackend, RedlockConfig};
use redis::AsyncCommands;

use super::{exists_on, fences::cycle, raw_conn, redlock_client, redlock_urls, single_client};

/// A lock on a fresh name from `label`, taken through `client` (Redlock, every server up) and
/// then gone from servers 3 and 4 (as after their restart without persistence): held on a
/// bare majority, servers 0, 1 and 2.
async fn held_by_the_first_three(
    client: &LockClient,
    label: &str,
) -> Result<(lock_core::LockName, lock_core::LockGuard), Failure> {
    let lock = unique_name(label)?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(5));
    let guard = client
        .lock_with(&lock, &options)
        .await
        .map_err(fail("acquire"))?;
    let keys = RedisKeys::new("faults", &lock);
    for url in &redlock_urls()?[3..] {
        let _: i64 = raw_conn(url)
            .await?
            .del(&keys.lock)
            .await
            .map_err(fail("DEL"))?;
    }
    Ok((lock, guard))
}

/// `inspect` on Redlock does not call a lock free that it cannot see: held on a bare majority
/// (servers 0, 1 and 2; its keys gone from 3 and 4, as after their restart without
/// persistence) while server 2 answers nothing, two servers show the holder, two show
/// nothing and one is silent. The holder still holds it; "not held" would be a lie (an admin
/// list showing nothing, a force-release finding nothing), so the answer must be the holder
/// or `Unavailable`.
pub(super) async fn redlock_inspect_does_not_free_what_it_cannot_see() -> Outcome {
    let client = redlock_client().await?;
    let (lock, guard) = held_by_the_first_three(&client, "redlock-inspect-unseen").await?;
    let silent = Instance::named("redlock-2")?.pause()?;
    let seen = client.inspect(&lock).await;
    drop(silent);
    ensure!(
        !matches!(seen, Ok(None)),
        "inspect called the lock free with 2 of its 3 holders seen and the third silent"
    );
    if let Ok(Some(info)) = &seen {
        ensure!(
            info.fence == guard.fence(),
            "inspect shows fence {}, the holder has {}",
            info.fence,
            guard.fence()
        );
    }
    guard.release().await.map_err(fail("release"))
}

/// Redlock's admin list with three of five servers silent, the three that hold a lock among
/// them (the other two lost it): the two that answer have nothing, but a majority the list
/// could not see may hold anything. The list must not answer "nothing held"; it answers that
/// the store is unavailable (it needs answers from three servers, the number every majority
/// meets). Before, the silent servers' failed scans were dropped and the list came back empty.
async fn redlock_list_does_not_hide_what_it_cannot_see() -> Outcome {
    let backend = RedlockBackend::connect(RedlockConfig::new(redlock_urls()?).key_prefix("faults"))
        .await
        .map_err(fail("redlock connect"))?;
    let client = LockClient::new(backend.clone());
    let (lock, guard) = held_by_the_first_three(&client, "redlock-list-unseen").await?;
    let prefix = lock.as_str().rsplit_once('/').map_or("", |(p, _)| p);
    let silent = [
        Instance::named("redlock-0")?.pause()?,
        Instance::named("redlock-1")?.pause()?,
        Instance::named("redlock-2")?.pause()?,
    ];
    let listed = lock_core::LockAdmin::list(&backend, prefix).await;
    drop(silent);
    guard.release().await.map_err(fail("release"))?;
    ensure!(
        matches!(&listed, Err(e) if e.is_retryable()),
        "with the three holders silent, list({prefix:?}) answered {listed:?} (expected unavailable)"
    );
    Ok(())
}

/// Keys planted on every Redlock server for [`redlock_list_scans_a_large_keyspace`]: not locks,
/// but every `SCAN` walks them.
const FILLER: usize = 300_000;

/// Redlock's admin list on servers holding many other keys: a whole scan takes longer than
/// the per-server time-out (50 ms), one `SCAN` call does not, so the list answers (the held
/// lock in it). Bounding the whole scan made it `Unavailable` on every try.
async fn redlock_list_scans_a_large_keyspace() -> Outcome {
    let urls = redlock_urls()?;
    let filler = format!("faults-filler-{:016x}", rand::random::<u64>());
    // Sets (or, with `delete`, deletes) the filler keys on the server at `url`.
    let fill = |url: String, filler: String, delete: bool| async move {
        let mut conn = raw_conn(&url).await?;
        for chunk in (0..FILLER).collect::<Vec<_>>().chunks(10_000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                let key = format!("{filler}:{i}");
                if delete {
                    pipe.del(key).ignore();
                } else {
                    pipe.set_options(
                        key,
                        "x",
                        redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(120_000)),
                    )
                    .ignore();
                }
            }
            let () = pipe
                .query_async(&mut conn)
                .await
                .map_err(fail("filler keys"))?;
        }
        Ok::<_, Failure>(())
    };
    futures::future::try_join_all(urls.iter().map(|u| fill(u.clone(), filler.clone(), false)))
        .await?;
    let backend = RedlockBackend::connect(RedlockConfig::new(urls.clone()).key_prefix("faults"))
        .await
        .map_err(fail("redlock connect"))?;
    let client = LockClient::new(backend.clone());
    let (lock, guard) = held_by_the_first_three(&client, "redlock-list-large").await?;
    let prefix = lock.as_str().rsplit_once('/').map_or("", |(p, _)| p);
    let listed = lock_core::LockAdmin::list(&backend, prefix).await;
    guard.release().await.map_err(fail("release"))?;
    futures::future::try_join_all(urls.iter().map(|u| fill(u.clone(), filler.clone(), true)))
        .await?;
    let listed = listed.map_err(|e| {
        Failure(format!(
            "list over {FILLER} other keys per server failed: {e}"
        ))
    })?;
    ensure!(
        listed.len() == 1 && listed[0].name == lock,
        "list({prefix:?}) over {FILLER} other keys per server shows {listed:?}"
    );
    Ok(())
}

/// The cases of Redlock's admin list.
pub(super) fn list_cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("redlock_list_does_not_hide_what_it_cannot_see", || {
            Box::pin(redlock_list_does_not_hide_what_it_cannot_see())
        })
        .case("redlock_list_scans_a_large_keyspace", || {
            Box::pin(redlock_list_scans_a_large_keyspace())
        })
}

/// Redlock keeps working with 2 of 5 servers down.
pub(super) async fn redlock_survives_two_of_five_down() -> Outcome {
    let (a, b) = (redlock_client().await?, redlock_client().await?);
    let stopped = Stopped::instances(&["redlock-3", "redlock-4"]).await?;
    let lock = unique_name("redlock-2-down")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(2));
    let guard = a
        .lock_with(&lock, &options)
        .await
        .map_err(fail("acquire with 2 of 5 down"))?;
    let other = b
        .try_lock_with(&lock, &options)
        .await
        .map_err(fail("try"))?;
    ensure!(
        other.is_none(),
        "a second client got the lock with 2 of 5 servers down"
    );
    ensure!(guard.is_held(), "the guard is not held");
    guard
        .release()
        .await
        .map_err(fail("release with 2 of 5 down"))?;
    let free = b
        .try_lock_with(&lock, &options)
        .await
        .map_err(fail("try after release"))?;
    ensure!(
        free.is_some(),
        "the lock is not free after release with 2 of 5 down"
    );
    if let Some(g) = free {
        g.release().await.map_err(fail("release"))?;
    }
    stopped.start().await
}

/// With 3 of 5 servers down, acquire fails within its budget and leaves no key behind.
pub(super) async fn redlock_fails_cleanly_with_three_of_five_down() -> Outcome {
    let client = redlock_client().await?;
    let urls = redlock_urls()?;
    let stopped = Stopped::instances(&["redlock-2", "redlock-3", "redlock-4"]).await?;
    let lock = unique_name("redlock-3-down")?;
    let budget = Duration::from_millis(500);
    let options = LockOptions::new().ttl(Duration::from_secs(2)).wait(budget);
    let start = Instant::now();
    let result = client.lock_with(&lock, &options).await;
    let took = start.elapsed();
    ensure!(
        matches!(
            result,
            Err(LockError::Unavailable { .. } | LockError::Timeout { .. })
        ),
        "acquire with 3 of 5 down returned {result:?}"
    );
    ensure!(
        took <= budget + Duration::from_millis(400),
        "acquire took {took:?} for a {budget:?} budget"
    );
    let key = RedisKeys::new("faults", &lock).lock;
    for url in &urls[..2] {
        ensure!(
            !exists_on(url, &key).await?,
            "a failed Redlock acquire left `{key}` on {url}"
        );
    }
    stopped.start().await
}

/// A restart of a server without persistence forgets the lock: `lost()` fires, and the lock is
/// free for others, with a fence above every fence issued before the restart (the server runs
/// `save ''` and `appendonly no`, so the counter is gone too).
pub(super) async fn restart_while_held_fires_lost() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let lock = unique_name("restart")?;
    let ttl = Duration::from_secs(2);
    cycle(&a, &lock, 3).await?;
    let guard = a
        .lock_with(&lock, &LockOptions::new().ttl(ttl))
        .await
        .map_err(fail("acquire"))?;
    let stopped = Stopped::instances(&["redis"]).await?;
    stopped.start().await?;
    let reason = tokio::time::timeout(ttl + Duration::from_secs(1), guard.lost())
        .await
        .map_err(|_| Failure("lost() did not fire after a restart forgot the lock".into()))?;
    ensure!(
        matches!(reason, LossReason::NotHeld | LossReason::Expired),
        "lost() said {reason:?}"
    );
    ensure!(!guard.is_held(), "is_held() after the loss");
    let b = single_client(&url).await?;
    let next = b
        .try_lock_with(&lock, &LockOptions::new())
        .await
        .map_err(fail("try after restart"))?;
    let Some(next) = next else {
        return Err(Failure("the lock is not free after the restart".into()));
    };
    ensure!(
        next.fence() > guard.fence(),
        "the fence after the restart, {}, is not above the fence before it, {}",
        next.fence(),
        guard.fence()
    );
    next.release().await.map_err(fail("release"))
}

/// A server that does not answer is `Unavailable` (retryable), at once.
pub(super) async fn unreachable_server_is_unavailable() -> Outcome {
    let start = Instant::now();
    let result = RedisBackend::connect(RedisConfig::single("redis://127.0.0.1:1")).await;
    ensure!(
        matches!(&result, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "connecting to a closed port gave {:?}",
        result.map(|_| ())
    );
    ensure!(
        start.elapsed() < Duration::from_secs(5),
        "connecting to a closed port took {:?}",
        start.elapsed()
    );
    Ok(())
}

/// A store error names the server it failed on: with the server stopped, an acquire of a
/// connected client fails `Unavailable` with the server's address in its message.
pub(super) async fn store_errors_name_the_server() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let lock = unique_name("errors-name-server")?;
    let server = url.trim_start_matches("redis://").to_owned();
    let stopped = Stopped::instances(&["redis"]).await?;
    let result = client.try_lock_with(&lock, &LockOptions::new()).await;
    stopped.start().await?;
    match result {
        Err(error @ LockError::Unavailable { .. }) => {
            let message = error.to_string();
            ensure!(
                message.contains(&server),
                "the error does not name the server {server}: {message}"
            );
            Ok(())
        }
        other => Err(Failure(format!(
            "acquire with the server stopped returned {other:?}, expected Unavailable"
        ))),
    }
}
