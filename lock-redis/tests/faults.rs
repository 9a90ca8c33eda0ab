//! Faults specific to Redis, against the real servers of `cargo xtask services`: Redlock with
//! servers down, a restart that forgets a held lock, foreign values, replica acknowledgements.
//!
//! The cases stop and start servers, so they run one after another in this binary; a guard
//! restarts whatever a case stopped, even when it fails.

use std::{
    path::PathBuf,
    process::{Child, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use conformance_tests::{Failure, ensure};
use lock_core::{LockClient, LockError, LockName, LockOptions, LossReason};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys, RedlockBackend, RedlockConfig};
use redis::{AsyncCommands, aio::MultiplexedConnection};

#[path = "faults/fences.rs"]
mod fences;
#[path = "faults/grants.rs"]
mod grants;
#[path = "faults/proxy.rs"]
mod proxy;
#[path = "faults/pubsub.rs"]
mod pubsub;
#[path = "faults/queue.rs"]
mod queue;

use fences::cycle;

type Outcome = Result<(), Failure>;

fn var(name: &str) -> Result<String, Failure> {
    std::env::var(name).map_err(|_| Failure(format!("{name} is not set; run `cargo xtask test`")))
}

fn fail<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Failure + '_ {
    move |e| Failure(format!("{what}: {e}"))
}

fn name(tag: &str) -> Result<LockName, Failure> {
    LockName::new(format!("faults/{tag}/{:016x}", rand::random::<u64>())).map_err(fail("lock name"))
}

/// Stops service instances and starts them again when dropped.
struct Stopped {
    dirs: Vec<PathBuf>,
}

impl Stopped {
    fn stop(instances: &[&str]) -> Result<Self, Failure> {
        let root = PathBuf::from(var("LOCK_TEST_SERVICES_DIR")?);
        let dirs: Vec<_> = instances.iter().map(|i| root.join(i)).collect();
        let mut stopped = Self { dirs: Vec::new() };
        for dir in dirs {
            run(&dir.join("stop"))?;
            stopped.dirs.push(dir);
        }
        Ok(stopped)
    }

    fn restart(mut self) -> Result<(), Failure> {
        for dir in std::mem::take(&mut self.dirs) {
            run(&dir.join("start"))?;
        }
        Ok(())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = run(&dir.join("start"));
        }
    }
}

fn run(script: &PathBuf) -> Result<(), Failure> {
    let status = Command::new(script)
        .stdout(Stdio::null())
        .status()
        .map_err(fail("running a service script"))?;
    ensure!(
        status.success(),
        "{} exited with {status}",
        script.display()
    );
    Ok(())
}

fn redlock_urls() -> Result<Vec<String>, Failure> {
    Ok(var("LOCK_TEST_REDLOCK_URLS")?
        .split(',')
        .map(str::to_owned)
        .collect())
}

async fn redlock_client() -> Result<LockClient, Failure> {
    let backend =
        RedlockBackend::connect(RedlockConfig::new(redlock_urls()?).with_key_prefix("faults"))
            .await
            .map_err(fail("redlock connect"))?;
    Ok(LockClient::new(backend))
}

/// A plain connection to the server at `url`, for what the test does behind the library's back.
async fn raw_conn(url: &str) -> Result<MultiplexedConnection, Failure> {
    redis::Client::open(url)
        .map_err(fail("client"))?
        .get_multiplexed_async_connection()
        .await
        .map_err(fail(url))
}

async fn exists_on(url: &str, key: &str) -> Result<bool, Failure> {
    raw_conn(url)
        .await?
        .exists(key)
        .await
        .map_err(fail("EXISTS"))
}

/// A lock client of the single test server, with a backend (and connections) of its own.
async fn single_client(url: &str) -> Result<LockClient, Failure> {
    let config = RedisConfig::single(url).with_key_prefix("faults");
    Ok(LockClient::new(
        RedisBackend::connect(config)
            .await
            .map_err(fail("connect"))?,
    ))
}

/// Waits until a waiter has marked the lock (its busy try is done and it sleeps).
async fn until_marked(conn: &mut MultiplexedConnection, keys: &RedisKeys, who: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marked(conn, keys).await? {
        ensure!(
            Instant::now() < deadline,
            "{who} did not mark the lock within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn marked(conn: &mut MultiplexedConnection, keys: &RedisKeys) -> Result<bool, Failure> {
    conn.exists(&keys.waiters).await.map_err(fail("EXISTS"))
}

/// Redlock keeps working with 2 of 5 servers down.
async fn redlock_survives_two_of_five_down() -> Outcome {
    let (a, b) = (redlock_client().await?, redlock_client().await?);
    let stopped = Stopped::stop(&["redlock-3", "redlock-4"])?;
    let lock = name("redlock-2-down")?;
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
    stopped.restart()
}

/// With 3 of 5 servers down, acquire fails within its budget and leaves no key behind.
async fn redlock_fails_cleanly_with_three_of_five_down() -> Outcome {
    let client = redlock_client().await?;
    let urls = redlock_urls()?;
    let stopped = Stopped::stop(&["redlock-2", "redlock-3", "redlock-4"])?;
    let lock = name("redlock-3-down")?;
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
    stopped.restart()
}

/// A restart of a server without persistence forgets the lock: `lost()` fires, and the lock is
/// free for others, with a fence above every fence issued before the restart (the server runs
/// `save ''` and `appendonly no`, so the counter is gone too).
async fn restart_while_held_fires_lost() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let lock = name("restart")?;
    let ttl = Duration::from_secs(2);
    cycle(&a, &lock, 3).await?;
    let guard = a
        .lock_with(&lock, &LockOptions::new().ttl(ttl))
        .await
        .map_err(fail("acquire"))?;
    let stopped = Stopped::stop(&["redis"])?;
    stopped.restart()?;
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

/// Values of other types or formats under our keys are errors that name the key, and are left
/// untouched.
async fn foreign_values_are_reported_not_taken() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let backend = RedisBackend::connect(RedisConfig::single(&url).with_key_prefix("faults"))
        .await
        .map_err(fail("connect"))?;
    let client = LockClient::new(backend);
    let mut conn = raw_conn(&url).await?;
    let options = LockOptions::new().wait(Duration::from_millis(100));

    let hash_lock = name("foreign-hash")?;
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

    let fence_lock = name("foreign-fence")?;
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

/// With `replica_acks`, an acquisition is granted only once a replica acknowledged it: refused
/// (and undone) without a replica, granted with one.
async fn replica_acknowledgements_are_required() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16379);
    let config = RedisConfig::single(&url)
        .with_key_prefix("faults")
        .with_replica_acks(1, Duration::from_millis(300));
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

    let lonely = name("replica-none")?;
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
        let acked = name("replica-one")?;
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
fn start_replica(port: u16, replica_port: u16) -> Result<(Child, PathBuf), Failure> {
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
async fn replica_streams(primary_url: &str, replica_url: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let linked = async {
            let mut conn = raw_conn(replica_url).await.ok()?;
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .ok()?;
            Some(info.contains("master_link_status:up"))
        }
        .await;
        if linked == Some(true) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the replica did not link within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One connection for the write and its WAIT: WAIT counts acknowledgements of this
    // connection's own last write.
    let mut conn = raw_conn(primary_url).await?;
    let probe = format!("faults:replica-probe:{:016x}", rand::random::<u64>());
    loop {
        let _: () = conn
            .set_ex(&probe, "x", 60)
            .await
            .map_err(fail("probe SET"))?;
        // Blocks up to 500 ms while the replica does not acknowledge, so the loop does not spin.
        let acked: Result<i64, _> = redis::cmd("WAIT")
            .arg(1)
            .arg(500)
            .query_async(&mut conn)
            .await;
        let last = match acked {
            Ok(n) if n >= 1 => {
                let _: i64 = conn.del(&probe).await.map_err(fail("probe DEL"))?;
                return Ok(());
            }
            Ok(n) => format!("WAIT counted {n} replicas"),
            Err(e) => format!("WAIT failed: {e}"),
        };
        ensure!(
            Instant::now() < deadline,
            "the replica at {replica_url} did not acknowledge a write within 15 s ({last})"
        );
    }
}

/// Batched renewals work on a server that forgot the scripts (restart, `SCRIPT FLUSH`).
async fn batched_renewal_survives_a_flushed_script_cache() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let backend = RedisBackend::connect(RedisConfig::single(&url).with_key_prefix("faults"))
        .await
        .map_err(fail("connect"))?;
    let client = LockClient::new(backend.clone());
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .watchdog(false);
    let mut guards = Vec::new();
    for i in 0..3 {
        let lock = name(&format!("flushed-{i}"))?;
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
    for (lease, result) in leases
        .iter()
        .zip(lock_core::LockBackend::renew_many(&backend, &leases).await)
    {
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

/// A release whose message is lost (here: the key deleted without a publish) strands no
/// waiter past the holder's TTL: the waiter retries when the TTL it saw runs out.
async fn lost_release_message_strands_no_waiter() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let b = single_client(&url).await?;
    let lock = name("lost-message")?;
    let ttl = Duration::from_secs(1);
    let start = Instant::now();
    let _held = a
        .lock_with(&lock, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(fail("acquire"))?;
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let options = LockOptions::new().ttl(ttl).wait(Duration::from_secs(5));
            b.lock_with(&lock, &options)
                .await
                .map(|g| (Instant::now(), g))
        }
    });
    // The stimulus: while the waiter waits, the key goes without a release message.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut conn = raw_conn(&url).await?;
    let _: () = conn
        .del(RedisKeys::new("faults", &lock).lock)
        .await
        .map_err(fail("DEL"))?;
    let (acquired, guard) = waiter
        .await
        .map_err(fail("waiter task"))?
        .map_err(fail("the waiter did not get the lock"))?;
    let took = acquired - start;
    ensure!(
        took <= ttl + Duration::from_millis(300),
        "the waiter got the lock {took:?} in, past the holder's {ttl:?} TTL"
    );
    guard.release().await.map_err(fail("release"))
}

/// Release messages, as a stream.
type Messages = std::pin::Pin<Box<dyn futures::Stream<Item = redis::Msg> + Send>>;

/// A listener on every release channel of `keys`: the stem, where nothing is published but
/// the tests' markers, and every client's channel under it.
async fn release_listener(url: &str, keys: &RedisKeys) -> Result<Messages, Failure> {
    let raw = redis::Client::open(url).map_err(fail("client"))?;
    let mut listener = raw.get_async_pubsub().await.map_err(fail("pubsub"))?;
    listener
        .psubscribe(format!("{}*", keys.channel))
        .await
        .map_err(fail("PSUBSCRIBE"))?;
    Ok(Box::pin(listener.into_on_message()))
}

/// The next message of `messages` within 5 s: its channel and its payload.
async fn next_message(messages: &mut Messages) -> Result<(String, String), Failure> {
    use futures::StreamExt;
    let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .map_err(|_| Failure("no message on the release channels within 5 s".into()))?
        .ok_or_else(|| Failure("the release listener closed".into()))?;
    let payload = message.get_payload().map_err(fail("payload"))?;
    Ok((message.get_channel_name().to_owned(), payload))
}

/// A release publishes only when someone waits: without a waiter nothing goes out (on a cluster
/// a `PUBLISH` reaches every node); with one, the release publishes, wakes it, and removes the
/// waiter mark.
async fn releases_publish_only_for_waiters() -> Outcome {
    let url = var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let b = single_client(&url).await?;
    let lock = name("publish-for-waiters")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut conn = raw_conn(&url).await?;
    let mut messages = release_listener(&url, &keys).await?;

    // Nobody waits: the release publishes nothing. Our own marker, published after it, is the
    // first message on the channel (one connection delivers in the server's order).
    let guard = a
        .lock_with(&lock, &LockOptions::new())
        .await
        .map_err(fail("acquire"))?;
    guard.release().await.map_err(fail("release"))?;
    let _: i64 = conn
        .publish(&keys.channel, "marker")
        .await
        .map_err(fail("PUBLISH"))?;
    let (_, first) = next_message(&mut messages).await?;
    ensure!(
        first == "marker",
        "a release without waiters published {first:?}"
    );

    // Someone waits: the release publishes and the waiter gets the lock.
    let guard = a
        .lock_with(&lock, &LockOptions::new())
        .await
        .map_err(fail("acquire"))?;
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(30));
            b.lock_with(&lock, &options).await
        }
    });
    until_marked(&mut conn, &keys, "the waiter").await?;
    // The message names the waiters in line (here the one), so only its client wakes.
    let queued: Vec<String> = conn
        .zrange(&keys.queue, 0, -1)
        .await
        .map_err(fail("ZRANGE queue"))?;
    let released = Instant::now();
    guard.release().await.map_err(fail("release"))?;
    let (_, published) = next_message(&mut messages).await?;
    ensure!(
        queued.len() == 1 && published == queued[0],
        "the release with one waiter queued ({queued:?}) published {published:?}, not that waiter's token"
    );
    let next = waiter
        .await
        .map_err(fail("waiter task"))?
        .map_err(fail("the waiter did not get the lock"))?;
    let took = released.elapsed();
    // Woken by the message, not by the holder's 30 s TTL running out.
    ensure!(
        took < Duration::from_secs(10),
        "the waiter got the lock {took:?} after the release"
    );
    next.release().await.map_err(fail("release"))?;
    ensure!(
        !marked(&mut conn, &keys).await?,
        "the waiter mark outlived the last release"
    );
    Ok(())
}

/// Waiters of one client share a subscription, and a release message wakes one of them: the
/// one that wins must leave the lock marked for the others, or they sleep until the TTL.
async fn siblings_in_one_client_are_all_woken() -> Outcome {
    const SIBLINGS: usize = 3;
    let url = var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    let b = single_client(&url).await?;
    let lock = name("siblings")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut conn = raw_conn(&url).await?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(60))
        .watchdog(false);
    let guard = a
        .lock_with(&lock, &options)
        .await
        .map_err(fail("acquire"))?;
    let mut waiters = Vec::new();
    for i in 0..SIBLINGS {
        waiters.push(tokio::spawn({
            let (b, lock, options) = (b.clone(), lock.clone(), options.clone());
            async move {
                let next = b.lock_with(&lock, &options).await?;
                let at = Instant::now();
                next.release().await?;
                Ok::<_, LockError>(at)
            }
        }));
        // Sibling i is asleep once its busy try has set the mark; clear the mark so the next
        // sibling's try shows too (the last one's stays for the release).
        until_marked(&mut conn, &keys, &format!("waiter {i}")).await?;
        if i + 1 < SIBLINGS {
            let _: i64 = conn.del(&keys.waiters).await.map_err(fail("DEL"))?;
        }
    }
    let released = Instant::now();
    guard.release().await.map_err(fail("release"))?;
    for waiter in waiters {
        let at = waiter
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("a sibling did not get the lock"))?;
        let took = at - released;
        // Each hand-off is pushed; a sibling left without a mark would sleep out the 30 s TTL.
        ensure!(
            took < Duration::from_secs(10),
            "a sibling got the lock {took:?} after the first release"
        );
    }
    ensure!(
        !marked(&mut conn, &keys).await?,
        "the waiter mark outlived the last release"
    );
    Ok(())
}

/// Every waiting lock of one client shares one pub/sub connection.
async fn waiters_share_one_pubsub_connection() -> Outcome {
    const LOCKS: usize = 10;
    let url = var("LOCK_TEST_REDIS_URL")?;
    let holder = single_client(&url).await?;
    let waiter = single_client(&url).await?;
    let mut conn = raw_conn(&url).await?;
    let pubsub_clients = |list: String| list.lines().filter(|l| !l.trim().is_empty()).count();
    let before: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .map_err(fail("CLIENT LIST"))?;
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let mut channels = Vec::new();
    for i in 0..LOCKS {
        let lock = name(&format!("shared-pubsub-{i}"))?;
        channels.push(RedisKeys::new("faults", &lock).channel);
        held.push(
            holder
                .lock_with(&lock, &LockOptions::new())
                .await
                .map_err(fail("acquire"))?,
        );
        let waiter = waiter.clone();
        waiting.push(tokio::spawn(async move {
            let options = LockOptions::new().wait(Duration::from_secs(10));
            waiter.lock_with(&lock, &options).await
        }));
    }
    // Wait until every waiter is subscribed (condition with a deadline, not a fixed sleep).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Each waiter listens on its client's channel under the lock's channel stem.
        let mut subscribed = 0;
        for stem in &channels {
            let active: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(format!("{stem}:*"))
                .query_async(&mut conn)
                .await
                .map_err(fail("PUBSUB CHANNELS"))?;
            subscribed += usize::from(active.len() == 1);
        }
        if subscribed == LOCKS {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "only {subscribed} of {LOCKS} waiters subscribed within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let during: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .map_err(fail("CLIENT LIST"))?;
    let added = pubsub_clients(during).saturating_sub(pubsub_clients(before));
    ensure!(
        added == 1,
        "{LOCKS} waiting locks of one client opened {added} pub/sub connections"
    );
    for guard in held {
        guard.release().await.map_err(fail("release"))?;
    }
    for task in waiting {
        let guard = task
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("waiter"))?;
        guard.release().await.map_err(fail("release"))?;
    }
    Ok(())
}

/// A server that does not answer is `Unavailable` (retryable), at once.
async fn unreachable_server_is_unavailable() -> Outcome {
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

fn main() -> ExitCode {
    conformance_tests::Cases::<Failure>::new("redis faults")
        .case("a_dead_waiter_stalls_the_lock_briefly", || {
            Box::pin(queue::a_dead_waiter_stalls_the_lock_briefly())
        })
        .case("a_release_to_a_dead_waiter_reaches_the_next", || {
            Box::pin(queue::a_release_to_a_dead_waiter_reaches_the_next())
        })
        .case("a_release_tells_only_the_clients_it_names", || {
            Box::pin(queue::a_release_tells_only_the_clients_it_names())
        })
        .case("redlock_dead_waiter_stalls_the_lock_briefly", || {
            Box::pin(queue::redlock_dead_waiter_stalls_the_lock_briefly())
        })
        .case("lost_release_message_strands_no_waiter", || {
            Box::pin(lost_release_message_strands_no_waiter())
        })
        .case("releases_publish_only_for_waiters", || {
            Box::pin(releases_publish_only_for_waiters())
        })
        .case("siblings_in_one_client_are_all_woken", || {
            Box::pin(siblings_in_one_client_are_all_woken())
        })
        .case("waiters_share_one_pubsub_connection", || {
            Box::pin(waiters_share_one_pubsub_connection())
        })
        .case("half_open_pubsub_keeps_the_wait_budget", || {
            Box::pin(pubsub::half_open_pubsub_keeps_the_wait_budget())
        })
        .case("unreachable_server_is_unavailable", || {
            Box::pin(unreachable_server_is_unavailable())
        })
        .case("batched_renewal_survives_a_flushed_script_cache", || {
            Box::pin(batched_renewal_survives_a_flushed_script_cache())
        })
        .case("redlock_survives_two_of_five_down", || {
            Box::pin(redlock_survives_two_of_five_down())
        })
        .case("redlock_fails_cleanly_with_three_of_five_down", || {
            Box::pin(redlock_fails_cleanly_with_three_of_five_down())
        })
        .case("restart_while_held_fires_lost", || {
            Box::pin(restart_while_held_fires_lost())
        })
        .case("fences_grow_after_the_counter_is_lost", || {
            Box::pin(fences::fences_grow_after_the_counter_is_lost())
        })
        .case("planted_fence_counters_are_refused", || {
            Box::pin(fences::planted_fence_counters_are_refused())
        })
        .case("redlock_fences_grow_across_majorities", || {
            Box::pin(fences::redlock_fences_grow_across_majorities())
        })
        .case("foreign_values_are_reported_not_taken", || {
            Box::pin(foreign_values_are_reported_not_taken())
        })
        .case("failed_replica_wait_releases_the_grant", || {
            Box::pin(grants::failed_replica_wait_releases_the_grant())
        })
        .case("late_grant_is_released_not_returned", || {
            Box::pin(grants::late_grant_is_released_not_returned())
        })
        .case("replica_wait_past_the_ttl_is_released", || {
            Box::pin(grants::replica_wait_past_the_ttl_is_released())
        })
        .case("replica_acknowledgements_are_required", || {
            Box::pin(replica_acknowledgements_are_required())
        })
        .main()
}
