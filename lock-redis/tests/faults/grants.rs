//! Grants the backend cannot stand behind are undone, never returned nor left behind: a
//! `WAIT` for replicas that fails.

use std::time::Duration;

use conformance_tests::{Failure, ensure};
use lock_core::{Holder, LockClient, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys};
use redis::AsyncCommands;

use super::{Outcome, fail, name, raw_conn, var};

/// With `replica_acks`, a `WAIT` that fails (here refused by an ACL that allows everything
/// else) releases the acquisition before the error is returned: no lock key is left.
pub(super) async fn failed_replica_wait_releases_the_grant() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
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
            .with_key_prefix("faults")
            .with_replica_acks(1, Duration::from_millis(100));
        let client = LockClient::new(
            RedisBackend::connect(config)
                .await
                .map_err(fail("connect"))?,
        );
        let lock = name("wait-fails")?;
        let result = client
            .acquire(
                &Holder::new(),
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
