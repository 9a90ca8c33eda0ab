//! Faults specific to Redis, against the real servers of `cargo xtask services`: Redlock with
//! servers down, a restart that forgets a held lock, foreign values, replica acknowledgements,
//! lost and shared release messages, dead waiters, hand-overs, fences, a flushed script cache.
//!
//! The cases stop and start servers, so they run one after another in this binary; a guard
//! restarts whatever a case stopped, even when it fails. This file holds the `main` and what
//! the cases share; each topic has a file of its own.

mod fences;
mod foreign;
mod grants;
mod handover;
mod outages;
mod pubsub;
mod queue;
mod queue_expiry;
mod redlock_order;
mod redlock_places;
mod renewals;
mod replicas;
mod scripts;
mod slots;
mod slow_majority;
mod turns;
mod wakeups;

use std::{
    net::{SocketAddr, ToSocketAddrs},
    process::ExitCode,
    time::Duration,
};

use conformance_tests::{
    Failure, Outcome,
    faults::{env_var, fail, poll_until},
};
use lock_core::{LockClient, LockGuard, LockName, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys, RedlockBackend, RedlockConfig};
use redis::{
    AsyncCommands, ConnectionAddr, IntoConnectionInfo,
    aio::{ConnectionLike, MultiplexedConnection},
};

fn redlock_urls() -> Result<Vec<String>, Failure> {
    Ok(env_var("LOCK_TEST_REDLOCK_URLS")?
        .split(',')
        .map(str::to_owned)
        .collect())
}

async fn redlock_client() -> Result<LockClient, Failure> {
    let backend = RedlockBackend::connect(RedlockConfig::new(redlock_urls()?).key_prefix("faults"))
        .await
        .map_err(fail("redlock connect"))?;
    Ok(LockClient::new(backend))
}

/// A new Redlock lock tagged `tag`, held for 30 s by a client of its own: its name, its keys
/// and the holder's guard.
async fn redlock_held(tag: &str) -> Result<(LockName, RedisKeys, LockGuard), Failure> {
    let name = conformance_tests::faults::unique_name(tag)?;
    let keys = RedisKeys::new("faults", &name);
    let held = redlock_client()
        .await?
        .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .map_err(fail("holder's acquire"))?;
    Ok((name, keys, held))
}

/// The `MONITOR` feed of the server at `url`: each command it runs, as a line.
async fn monitor(
    url: &str,
) -> Result<impl futures::Stream<Item = String> + Unpin + use<>, Failure> {
    Ok(redis::Client::open(url)
        .map_err(fail("client"))?
        .get_async_monitor()
        .await
        .map_err(fail("MONITOR"))?
        .into_on_message::<String>())
}

/// A plain connection to each Redlock server.
async fn redlock_raw_conns() -> Result<Vec<MultiplexedConnection>, Failure> {
    let mut raws = Vec::new();
    for url in redlock_urls()? {
        raws.push(raw_conn(&url).await?);
    }
    Ok(raws)
}

/// A plain connection to the server at `url`, for what the test does behind the library's back.
async fn raw_conn(url: &str) -> Result<MultiplexedConnection, Failure> {
    redis::Client::open(url)
        .map_err(fail("client"))?
        .get_multiplexed_async_connection()
        .await
        .map_err(fail(url))
}

/// A plain cluster connection through the seed nodes `urls`, for what the test does behind the
/// library's back.
async fn raw_cluster_conn(
    urls: &[String],
) -> Result<redis::cluster_async::ClusterConnection, Failure> {
    redis::cluster::ClusterClient::new(urls.to_vec())
        .map_err(fail("cluster client"))?
        .get_async_connection()
        .await
        .map_err(fail("cluster connect"))
}

async fn exists_on(url: &str, key: &str) -> Result<bool, Failure> {
    raw_conn(url)
        .await?
        .exists(key)
        .await
        .map_err(fail("EXISTS"))
}

/// The test cluster's seed nodes.
fn cluster_urls() -> Result<Vec<String>, Failure> {
    Ok(env_var("LOCK_TEST_REDIS_CLUSTER_URLS")?
        .split(',')
        .map(str::to_owned)
        .collect())
}

/// A lock client of the test cluster, with a backend (and connections) of its own.
async fn cluster_client(urls: &[String]) -> Result<LockClient, Failure> {
    client_of(RedisConfig::cluster(urls.to_vec()).key_prefix("faults")).await
}

/// A lock client of the single test server, with a backend (and connections) of its own.
async fn single_client(url: &str) -> Result<LockClient, Failure> {
    client_of(RedisConfig::single(url).key_prefix("faults")).await
}

/// A lock client of `config`, with a backend (and connections) of its own.
async fn client_of(config: RedisConfig) -> Result<LockClient, Failure> {
    let what = if config.cluster {
        "cluster connect"
    } else {
        "connect"
    };
    Ok(LockClient::new(
        RedisBackend::connect(config).await.map_err(fail(what))?,
    ))
}

/// Releases `held`, then waits for `waiting`, a task that returns when it got the lock: how
/// long after the release it got it.
async fn handed_over(
    held: lock_core::LockGuard,
    waiting: tokio::task::JoinHandle<Result<std::time::Instant, lock_core::LockError>>,
) -> Result<Duration, Failure> {
    let released = std::time::Instant::now();
    held.release().await.map_err(fail("release"))?;
    let got = waiting
        .await
        .map_err(fail("waiter task"))?
        .map_err(fail("the waiter"))?;
    Ok(got.saturating_duration_since(released))
}

/// Waits until a waiter has marked the lock (its busy try is done and it sleeps).
async fn until_marked<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    who: &str,
) -> Outcome {
    let what = format!("{who} marking the lock");
    poll_until(Duration::from_secs(10), &what, async || {
        marked(conn, keys).await
    })
    .await
}

async fn marked<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> Result<bool, Failure> {
    conn.exists(&keys.waiters).await.map_err(fail("EXISTS"))
}

/// The tokens of the waiters' queue of `keys`, first in line first.
async fn queue_line<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> Result<Vec<String>, Failure> {
    conn.zrange(&keys.queue, 0, -1)
        .await
        .map_err(fail("ZRANGE"))
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

fn main() -> ExitCode {
    if conformance_tests::holder_process::role().as_deref() == Some(fences::SKEWED_ROLE) {
        return fences::skewed_child();
    }
    let cases = renewals::cases(conformance_tests::Cases::<Failure>::new("redis faults"));
    let cases = wakeups::cases(cases);
    let cases = queue::cases(cases);
    let cases = queue_expiry::cases(cases);
    let cases = pubsub::cases(cases);
    let cases = slots::cases(cases);
    let cases = redlock_places::cases(cases);
    let cases = redlock_order::cases(cases);
    let cases = turns::cases(cases);
    let cases = handover::cases(cases);
    let cases = slow_majority::cases(cases);
    outages::list_cases(cases)
        .case("unreachable_server_is_unavailable", || {
            Box::pin(outages::unreachable_server_is_unavailable())
        })
        .case("batched_renewal_survives_a_flushed_script_cache", || {
            Box::pin(scripts::batched_renewal_survives_a_flushed_script_cache())
        })
        .case("cluster_release_needs_only_the_locks_node", || {
            Box::pin(scripts::cluster_release_needs_only_the_locks_node())
        })
        .case("redlock_survives_two_of_five_down", || {
            Box::pin(outages::redlock_survives_two_of_five_down())
        })
        .case("redlock_inspect_does_not_free_what_it_cannot_see", || {
            Box::pin(outages::redlock_inspect_does_not_free_what_it_cannot_see())
        })
        .case("redlock_fails_cleanly_with_three_of_five_down", || {
            Box::pin(outages::redlock_fails_cleanly_with_three_of_five_down())
        })
        .case("restart_while_held_fires_lost", || {
            Box::pin(outages::restart_while_held_fires_lost())
        })
        .case("store_errors_name_the_server", || {
            Box::pin(outages::store_errors_name_the_server())
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
        .case("redlock_uncontended_acquire_is_one_round", || {
            Box::pin(fences::redlock_uncontended_acquire_is_one_round())
        })
        .case("redlock_floor_far_ahead_of_the_servers_is_ignored", || {
            Box::pin(fences::redlock_floor_far_ahead_of_the_servers_is_ignored())
        })
        .case("foreign_values_are_reported_not_taken", || {
            Box::pin(foreign::foreign_values_are_reported_not_taken())
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
        .case(
            "redlock_minority_grant_is_undone_only_where_granted",
            || Box::pin(grants::redlock_minority_grant_is_undone_only_where_granted()),
        )
        .case("redlock_failed_vote_undoes_its_own_earlier_grant", || {
            Box::pin(grants::redlock_failed_vote_undoes_its_own_earlier_grant())
        })
        .case("redlock_unanswered_vote_is_undone_there", || {
            Box::pin(grants::redlock_unanswered_vote_is_undone_there())
        })
        .case("replica_acknowledgements_are_required", || {
            Box::pin(replicas::replica_acknowledgements_are_required())
        })
        .main()
}
