//! The pub/sub connection of waiters: one per client however many locks it waits for, and a
//! connection that stops answering costs a waiter its push wake-ups, never its wait budget.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    time::{Duration, Instant},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{Relay, env_var, fail, poll_until, unique_name},
};
use lock_core::{LockError, LockOptions};
use lock_redis::RedisKeys;
use redis::{ConnectionAddr, IntoConnectionInfo, aio::MultiplexedConnection};

use super::{raw_conn, single_client};

/// Every waiting lock of one client shares one pub/sub connection.
pub(super) async fn waiters_share_one_pubsub_connection() -> Outcome {
    const LOCKS: usize = 10;
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let holder = single_client(&url).await?;
    let waiter = single_client(&url).await?;
    let mut conn = raw_conn(&url).await?;
    let before = pubsub_clients(&mut conn).await?;
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let mut channels = Vec::new();
    for i in 0..LOCKS {
        let lock = unique_name(&format!("shared-pubsub-{i}"))?;
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
    let mut subscribed = 0;
    let all_subscribed = poll_until(
        Duration::from_secs(5),
        &format!("{LOCKS} waiters subscribing"),
        async || {
            subscribed = subscribers(&mut conn, &channels).await?;
            Ok(subscribed == LOCKS)
        },
    )
    .await;
    all_subscribed
        .map_err(|Failure(why)| Failure(format!("{why}: only {subscribed} subscribed")))?;
    let added = pubsub_clients(&mut conn).await?.saturating_sub(before);
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

/// How many pub/sub connections the server has.
async fn pubsub_clients(conn: &mut MultiplexedConnection) -> Result<usize, Failure> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .map_err(fail("CLIENT LIST"))?;
    Ok(list.lines().filter(|l| !l.trim().is_empty()).count())
}

/// How many of the locks whose channel stems are `stems` have a waiter subscribed: each waiter
/// listens on its client's channel under the lock's stem.
async fn subscribers(conn: &mut MultiplexedConnection, stems: &[String]) -> Result<usize, Failure> {
    let mut subscribed = 0;
    for stem in stems {
        let active: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{stem}:*"))
            .query_async(conn)
            .await
            .map_err(fail("PUBSUB CHANNELS"))?;
        subscribed += usize::from(active.len() == 1);
    }
    Ok(subscribed)
}

/// Two waiters of a client whose pub/sub connection is half-open (accepted, never answered)
/// each return `Timeout` within their 300 ms budget: the subscription is bounded, and the
/// second waiter is not stuck behind the first.
pub(super) async fn half_open_pubsub_keeps_the_wait_budget() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    // The backend's first connection (its multiplexed one) is forwarded; the pub/sub
    // connection, opened when a waiter first subscribes, is not.
    let relay = Relay::start(tcp_address(&url)?).await?;
    relay.stall_after(1);
    let b = single_client(&format!("redis://{}", relay.addr())).await?;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let budget = Duration::from_millis(300);
    for i in 0..2 {
        let lock = unique_name(&format!("half-open-pubsub-{i}"))?;
        held.push(
            a.lock_with(&lock, &options)
                .await
                .map_err(fail("acquire"))?,
        );
        let b = b.clone();
        waiting.push(tokio::spawn(async move {
            let start = Instant::now();
            let result = tokio::time::timeout(
                Duration::from_secs(3),
                b.lock_with(&lock, &LockOptions::new().wait(budget)),
            )
            .await;
            (start.elapsed(), result.map(|r| r.map(|g| g.fence())))
        }));
    }
    let mut outcome = Ok(());
    for (i, task) in waiting.into_iter().enumerate() {
        let (took, result) = task.await.map_err(fail("waiter task"))?;
        let checked = (|| {
            ensure!(
                matches!(result, Ok(Err(LockError::Timeout { .. }))),
                "waiter {i} with a {budget:?} budget and a half-open pub/sub connection gave \
                 {result:?} after {took:?} (Err(Elapsed) = still waiting after 3 s)"
            );
            ensure!(
                took <= budget + Duration::from_millis(300),
                "waiter {i} returned Timeout after {took:?} for a {budget:?} budget"
            );
            Ok(())
        })();
        outcome = outcome.and(checked);
    }
    for guard in held {
        guard.release().await.map_err(fail("release"))?;
    }
    drop(relay);
    outcome
}

/// The TCP address of the server at `url`.
fn tcp_address(url: &str) -> Result<SocketAddr, Failure> {
    match url
        .into_connection_info()
        .map_err(fail("server URL"))?
        .addr()
    {
        ConnectionAddr::Tcp(host, port) => (host.as_str(), *port)
            .to_socket_addrs()
            .map_err(fail("server address"))?
            .next()
            .ok_or_else(|| Failure(format!("{host} has no address"))),
        other => Err(Failure(format!(
            "the relay needs a TCP server, not {other:?}"
        ))),
    }
}
