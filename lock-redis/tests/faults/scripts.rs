//! The server's script cache: a server that forgot the library's scripts still runs them.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{Instance, env_var, fail, unique_name},
};
use lock_core::{LockClient, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys};
use redis::AsyncCommands;

use super::raw_conn;

/// On a cluster, a release on a node that forgot the scripts (every node restarted, as in an
/// outage) does not need the other nodes: the script is sent to the lock's node alone. A
/// `SCRIPT LOAD` goes to every node and waits for all of them, so one silent node made the
/// release time out.
pub(super) async fn cluster_release_needs_only_the_locks_node() -> Outcome {
    let urls = super::cluster_urls()?;
    let mut config = RedisConfig::cluster(urls.clone()).key_prefix("faults");
    // Below the cluster's node time-out (2 s): a node silent that long is failed over.
    config.response_timeout = Duration::from_millis(500);
    let client = LockClient::new(
        RedisBackend::connect(config)
            .await
            .map_err(fail("cluster connect"))?,
    );
    let name = unique_name("cluster-flushed")?;
    let guard = client
        .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(10)))
        .await
        .map_err(fail("acquire"))?;
    let key = RedisKeys::new("faults", &name).lock;
    let mut owner = None;
    for url in &urls {
        let mut conn = raw_conn(url).await?;
        // Another node answers `MOVED`.
        if matches!(conn.exists::<_, bool>(&key).await, Ok(true)) {
            owner = Some(url.clone());
        }
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .map_err(fail("SCRIPT FLUSH"))?;
    }
    let owner = owner.ok_or_else(|| Failure(format!("no node holds `{key}`")))?;
    let other = urls
        .iter()
        .find(|url| **url != owner)
        .ok_or_else(|| Failure("a cluster of one node".into()))?;
    let port = other.rsplit(':').next().unwrap_or_default();
    let paused = Instance::named(&format!("redis-cluster/{port}"))?.pause()?;
    let started = Instant::now();
    let released = guard.release().await;
    let took = started.elapsed();
    paused.resume()?;
    released.map_err(|e| {
        Failure(format!(
            "release after SCRIPT FLUSH with another node silent failed after {took:?}: {e}"
        ))
    })?;
    ensure!(
        client
            .inspect(&name)
            .await
            .map_err(fail("inspect"))?
            .is_none(),
        "the lock is still held after its release"
    );
    // Nothing went to every node: the third node still knows no script.
    if let Some(third) = urls.iter().find(|url| **url != owner && *url != other) {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut raw_conn(third).await?)
            .await
            .map_err(fail("INFO memory"))?;
        ensure!(
            info.lines()
                .any(|line| line.trim() == "number_of_cached_scripts:0"),
            "a node that holds nothing of the lock was sent a script: {}",
            info.lines()
                .find(|line| line.starts_with("number_of_cached_scripts"))
                .unwrap_or("no number_of_cached_scripts in INFO memory")
        );
    }
    Ok(())
}

/// Batched renewals work on a server that forgot the scripts (restart, `SCRIPT FLUSH`).
pub(super) async fn batched_renewal_survives_a_flushed_script_cache() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let backend = RedisBackend::connect(RedisConfig::single(&url).key_prefix("faults"))
        .await
        .map_err(fail("connect"))?;
    let client = LockClient::new(backend.clone());
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .watchdog(false);
    let mut guards = Vec::new();
    for i in 0..3 {
        let lock = unique_name(&format!("flushed-{i}"))?;
        guards.push(
            client
                .lock_with(&lock, &options)
                .await
                .map_err(fail("acquire"))?,
        );
    }
    let mut conn = raw_conn(&url).await?;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .map_err(fail("SCRIPT FLUSH"))?;
    let leases: Vec<_> = guards.iter().map(|g| g.lease()).collect();
    for (lease, result) in leases.iter().zip(
        lock_core::LockBackend::renew_many(&backend, &leases)
            .await
            .map_err(fail("batched renewal after SCRIPT FLUSH"))?,
    ) {
        result.map_err(|e| {
            Failure(format!(
                "batched renewal of `{}` after SCRIPT FLUSH: {e}",
                lease.name()
            ))
        })?;
    }
    for guard in guards {
        guard.release().await.map_err(fail("release"))?;
    }
    Ok(())
}
