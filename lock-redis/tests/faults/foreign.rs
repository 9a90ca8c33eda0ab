//! Values this library did not write, under its keys: reported, never taken over.

use std::time::Duration;

use conformance_tests::{
    Outcome, ensure,
    faults::{env_var, fail, unique_name},
};
use lock_core::{LockClient, LockError, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys};
use redis::AsyncCommands;

use super::raw_conn;

/// Values of other types or formats under our keys are errors that name the key, and are left
/// untouched.
pub(super) async fn foreign_values_are_reported_not_taken() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let backend = RedisBackend::connect(RedisConfig::single(&url).key_prefix("faults"))
        .await
        .map_err(fail("connect"))?;
    let client = LockClient::new(backend);
    let mut conn = raw_conn(&url).await?;
    let options = LockOptions::new().wait(Duration::from_millis(100));

    let hash_lock = unique_name("foreign-hash")?;
    let keys = RedisKeys::new("faults", &hash_lock);
    let _: () = conn
        .hset(&keys.lock, "field", "value")
        .await
        .map_err(fail("HSET"))?;
    let result = client.lock_with(&hash_lock, &options).await;
    ensure!(
        matches!(&result, Err(LockError::Foreign { found, .. }) if found.contains(&keys.lock)),
        "a hash under the lock key gave {result:?}"
    );
    let kind: String = redis::cmd("TYPE")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .map_err(fail("TYPE"))?;
    ensure!(kind == "hash", "the foreign hash was changed to a {kind}");
    let _: () = conn.del(&keys.lock).await.map_err(fail("DEL"))?;

    let fence_lock = unique_name("foreign-fence")?;
    let keys = RedisKeys::new("faults", &fence_lock);
    let _: () = conn
        .set(&keys.fence, "not-a-number")
        .await
        .map_err(fail("SET"))?;
    let result = client.lock_with(&fence_lock, &options).await;
    ensure!(
        matches!(&result, Err(LockError::Foreign { found, .. }) if found.contains(&keys.fence)),
        "a non-numeric fence counter gave {result:?}"
    );
    let lock_exists: bool = conn.exists(&keys.lock).await.map_err(fail("EXISTS"))?;
    ensure!(
        !lock_exists,
        "a lock was granted over a foreign fence counter"
    );
    let _: () = conn.del(&keys.fence).await.map_err(fail("DEL"))?;
    Ok(())
}
