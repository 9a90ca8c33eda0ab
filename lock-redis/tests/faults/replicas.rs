//! Replica acknowledgements: a replica of the test server started for a case, and the wait
//! until it really streams.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{env_var, fail, poll_every, unique_name},
};
use lock_core::{LockClient, LockError, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys};
use redis::AsyncCommands;

use super::{exists_on, raw_conn};

/// With `replica_acks`, an acquisition is granted only once a replica acknowledged it: refused
/// (and undone) without a replica, granted with one.
pub(super) async fn replica_acknowledgements_are_required() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16379);
    let config = RedisConfig::single(&url)
        .key_prefix("faults")
        .replica_acks(1, Duration::from_millis(300));
    let client = LockClient::new(
        RedisBackend::connect(config.clone())
            .await
            .map_err(fail("connect"))?,
    );
    let caps = client.capabilities();
    ensure!(
        caps.replica_acks == 1,
        "capabilities say {} replica acks",
        caps.replica_acks
    );

    let lonely = unique_name("replica-none")?;
    let result = client
        .lock_with(&lonely, &LockOptions::new().wait(Duration::ZERO))
        .await;
    ensure!(
        matches!(&result, Err(LockError::Unavailable { message, .. }) if message.contains("replicas acknowledged")),
        "without a replica, acquire returned {result:?}"
    );
    ensure!(
        !exists_on(&url, &RedisKeys::new("faults", &lonely).lock).await?,
        "a refused acquisition left its key"
    );

    // Start a replica of the test server, just for this case.
    let replica_port = port + 11;
    let (mut replica, dir) = start_replica(port, replica_port)?;
    let outcome = async {
        let replica_url = format!("redis://127.0.0.1:{replica_port}");
        replica_streams(&url, &replica_url).await?;
        let acked = unique_name("replica-one")?;
        let guard = client
            .lock_with(&acked, &LockOptions::new().wait(Duration::ZERO))
            .await
            .map_err(fail("acquire with one replica"))?;
        ensure!(
            exists_on(&replica_url, &RedisKeys::new("faults", &acked).lock).await?,
            "the replica does not have the lock"
        );
        guard.release().await.map_err(fail("release"))
    }
    .await;
    let _ = replica.kill();
    let _ = replica.wait();
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// Starts a replica (no persistence) of the server on `port`, listening on `replica_port`,
/// with its files in a directory of its own; the caller kills it and removes the directory.
pub(super) fn start_replica(port: u16, replica_port: u16) -> Result<(Child, PathBuf), Failure> {
    let dir = std::env::temp_dir().join(format!(
        "lock-redis-replica-{}-{replica_port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(fail("replica dir"))?;
    let replica = Command::new("redis-server")
        .args([
            "--port",
            &replica_port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--replicaof", "127.0.0.1", &port.to_string()])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .map_err(fail("starting a replica"))?;
    Ok((replica, dir))
}

/// Waits until the replica at `replica_url` has linked to `primary_url` and acknowledges a write
/// made after that.
///
/// "Linked" is not enough: after a diskless full sync Redis 7.0 may put the replica online but
/// hold back the command stream until the replica's next periodic `REPLCONF ACK`, up to a second
/// later; until then `WAIT` does not count it. A probe written before the link is no proof
/// either: the snapshot already holds it. So the condition is a write made after the link,
/// acknowledged.
pub(super) async fn replica_streams(primary_url: &str, replica_url: &str) -> Outcome {
    let limit = Duration::from_secs(15);
    let start = Instant::now();
    poll_every(
        Duration::from_millis(100),
        limit,
        "the replica linking",
        async || Ok(linked(replica_url).await),
    )
    .await?;
    // One connection for the write and its WAIT: WAIT counts acknowledgements of this
    // connection's own last write.
    let mut conn = raw_conn(primary_url).await?;
    let probe = format!("faults:replica-probe:{:016x}", rand::random::<u64>());
    let mut last = String::new();
    let what = format!("the replica at {replica_url} acknowledging a write");
    // No pause between tries: each WAIT blocks up to 500 ms while the replica does not
    // acknowledge.
    let acknowledged = poll_every(
        Duration::ZERO,
        limit.saturating_sub(start.elapsed()),
        &what,
        async || {
            let _: () = conn
                .set_ex(&probe, "x", 60)
                .await
                .map_err(fail("probe SET"))?;
            let acked: Result<i64, _> = redis::cmd("WAIT")
                .arg(1)
                .arg(500)
                .query_async(&mut conn)
                .await;
            last = match acked {
                Ok(n) if n >= 1 => return Ok(true),
                Ok(n) => format!("WAIT counted {n} replicas"),
                Err(e) => format!("WAIT failed: {e}"),
            };
            Ok(false)
        },
    )
    .await;
    acknowledged.map_err(|Failure(why)| Failure(format!("{why} ({last})")))?;
    let _: i64 = conn.del(&probe).await.map_err(fail("probe DEL"))?;
    Ok(())
}

/// Whether the replica at `replica_url` reports its link to the primary up.
async fn linked(replica_url: &str) -> bool {
    let Ok(mut conn) = raw_conn(replica_url).await else {
        return false;
    };
    let info: Result<String, _> = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await;
    info.is_ok_and(|info| info.contains("master_link_status:up"))
}
