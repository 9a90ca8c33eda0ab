//! The server's script cache: a server that forgot the library's scripts still runs them.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome,
    faults::{env_var, fail, unique_name},
};
use lock_core::{LockClient, LockOptions};
use lock_redis::{RedisBackend, RedisConfig};

use super::raw_conn;

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
