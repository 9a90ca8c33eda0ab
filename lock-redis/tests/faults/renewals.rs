//! Batched renewals of many held locks: the watchdog renews every hold of a client that falls
//! due in one `renew_many`, which must keep them all, however many there are, on however many
//! nodes.

use std::time::Duration;

use conformance_tests::{
    Cases, Failure, Outcome,
    bench::{sent_between, sent_segments},
    ensure,
    faults::{fail, unique_name},
};
use futures::{StreamExt, TryStreamExt, stream};
use lock_core::{
    Fence, Lease, LockBackend, LockClient, LockError, LockName, LockOptions, backend::LeaseToken,
};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys, RedlockBackend, RedlockConfig};

use super::{raw_conn, redlock_urls};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("redlock_renews_thousands_of_leases_in_one_batch", || {
            Box::pin(redlock_renews_thousands_of_leases_in_one_batch())
        })
        .case("cluster_renews_across_nodes_in_one_batch", || {
            Box::pin(cluster_renews_across_nodes_in_one_batch())
        })
}

/// How many leases the batch renews: far more work than one server does within the
/// per-server time-out below (five servers took 185 ms to renew 10,000 leases sent as one
/// pipeline of a script call each, in the release build's renewal benchmark; this test runs
/// a debug build).
const LEASES: usize = 20_000;

/// The per-server time-out: four times the default, so a slow debug build stays well within
/// it for one request of 500 renewals (about 20 ms here).
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// Redlock renews 20,000 held leases in one batch: the per-server time-out bounds one request
/// to a server, not a batch of thousands, so every lease is renewed.
async fn redlock_renews_thousands_of_leases_in_one_batch() -> Outcome {
    let urls = redlock_urls()?;
    let backend = RedlockBackend::connect(
        RedlockConfig::new(urls.clone())
            .key_prefix("faults")
            .node_timeout(NODE_TIMEOUT),
    )
    .await
    .map_err(fail("redlock connect"))?;
    let base = unique_name("many-renewals")?;
    let ttl = Duration::from_secs(60);
    let leases: Vec<Lease> = (0..LEASES)
        .map(|i| {
            let name =
                lock_core::LockName::new(format!("{}/{i}", base.as_str())).map_err(fail("name"))?;
            Ok(Lease::new(name, LeaseToken::random(), Fence::new(1), ttl))
        })
        .collect::<Result<_, Failure>>()?;
    // Held on every server, as an acquisition leaves them (planted: acquiring 20,000 locks
    // one by one would take the test most of a minute).
    for url in &urls {
        let mut pipe = redis::pipe();
        for lease in &leases {
            pipe.set_options(
                RedisKeys::new("faults", lease.name()).lock,
                lease.token().as_str(),
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(60_000)),
            )
            .ignore();
        }
        let () = pipe
            .query_async(&mut raw_conn(url).await?)
            .await
            .map_err(fail("planting the holds"))?;
    }
    let answers = backend.renew_many(&leases).await;
    for url in &urls {
        let mut pipe = redis::pipe();
        for lease in &leases {
            pipe.del(RedisKeys::new("faults", lease.name()).lock)
                .ignore();
        }
        let () = pipe
            .query_async(&mut raw_conn(url).await?)
            .await
            .map_err(fail("cleaning up"))?;
    }
    let answers = answers.map_err(fail("the batch failed as a whole"))?;
    let failed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    if failed.is_empty() && answers.len() == LEASES {
        Ok(())
    } else {
        Err(Failure(format!(
            "{} of {LEASES} renewals failed ({} answers), the first: {:?}",
            failed.len(),
            answers.len(),
            failed.first()
        )))
    }
}

/// How many locks the cluster's batch renews: enough for every node to serve more than one
/// pipeline's worth (500).
const CLUSTER_LOCKS: usize = 2_500;

/// A cluster renews a batch of held locks spread over every node, after a `SCRIPT FLUSH` of
/// every node (each node answers the pipelined calls `NOSCRIPT`, so each pipeline goes again,
/// its first call carrying the script's source) and then once more: every lease is renewed to
/// the batch's TTL, and leases whose token is not the holder's are answered "not held". Both
/// batches go out in pipelines: this process sends the nodes at most one TCP segment per 100
/// leases, two after the flush (renewed one request each, 10,000 leases took 496 segments;
/// the first batch after the flush went so until the pipelines were sent again with the
/// source).
async fn cluster_renews_across_nodes_in_one_batch() -> Outcome {
    let urls = super::cluster_urls()?;
    let backend = RedisBackend::connect(RedisConfig::cluster(urls.clone()).key_prefix("faults"))
        .await
        .map_err(fail("cluster connect"))?;
    let client = LockClient::new(backend.clone());
    let base = unique_name("cluster-renewals")?;
    let held = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .watchdog(false);
    let names: Vec<LockName> = (0..CLUSTER_LOCKS)
        .map(|i| LockName::new(format!("{}/{i}", base.as_str())).map_err(fail("name")))
        .collect::<Result<_, Failure>>()?;
    let guards: Vec<_> = stream::iter(&names)
        .map(|name| client.lock_with(name, &held))
        .buffered(64)
        .try_collect()
        .await
        .map_err(fail("acquire"))?;
    let outcome = async {
        for url in &urls {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut raw_conn(url).await?)
                .await
                .map_err(fail("SCRIPT FLUSH"))?;
        }
        let ports: Vec<u16> = urls
            .iter()
            .filter_map(|url| url.rsplit(':').next()?.trim_end_matches('/').parse().ok())
            .collect();
        let round = |ttl| renew_round(&backend, &client, (&guards, &names), &ports, ttl);
        let after_flush = round(Duration::from_secs(60)).await?;
        let sent = round(Duration::from_secs(90)).await?;
        let most = CLUSTER_LOCKS as u64 / 100;
        // The batch after the flush sends each pipeline twice (the second time with the
        // script's source): 19-24 segments in five runs, where one request per lease sent 458.
        ensure!(
            after_flush <= 2 * most,
            "renewing {CLUSTER_LOCKS} leases on nodes that had forgotten the script sent {after_flush} TCP segments to the nodes (at most {} expected: the renewals went one by one)",
            2 * most
        );
        ensure!(
            sent <= most,
            "renewing {CLUSTER_LOCKS} leases sent {sent} TCP segments to the nodes (at most {most} expected: the renewals went one by one)"
        );
        Ok(())
    }
    .await;
    for guard in guards {
        guard.release().await.map_err(fail("release"))?;
    }
    outcome
}

/// One batch of [`cluster_renews_across_nodes_in_one_batch`]: the leases of `guards` (of the
/// locks `names`) renewed to `ttl`, with three leases of held locks under another token.
/// Answers the TCP segments this process sent to `ports` during the batch.
async fn renew_round(
    backend: &RedisBackend,
    client: &LockClient,
    (guards, names): (&[lock_core::LockGuard], &[LockName]),
    ports: &[u16],
    ttl: Duration,
) -> Result<u64, Failure> {
    let mut leases: Vec<Lease> = guards
        .iter()
        .map(|g| {
            let lease = g.lease();
            Lease::new(
                lease.name().clone(),
                lease.token().clone(),
                lease.fence(),
                ttl,
            )
        })
        .collect();
    // Three leases of held locks under a token that is not the holder's.
    for name in &names[..3] {
        leases.push(Lease::new(
            name.clone(),
            LeaseToken::random(),
            Fence::new(1),
            ttl,
        ));
    }
    let unknown = || Failure("`ss` could not tell the segments sent".into());
    let before = sent_segments(ports).ok_or_else(unknown)?;
    let answers = backend
        .renew_many(&leases)
        .await
        .map_err(fail("the batch failed as a whole"))?;
    let after = sent_segments(ports).ok_or_else(unknown)?;
    let sent = sent_between(&before, &after)
        .ok_or_else(|| Failure("a connection to the cluster closed during the batch".into()))?;
    // Nothing counted would pass any bound: the count must have seen the connections.
    ensure!(
        !before.is_empty() && sent > 0,
        "no segments counted to the nodes' ports {ports:?}: `ss` did not show this process's connections"
    );
    ensure!(
        answers.len() == leases.len(),
        "{} answers to {} renewals",
        answers.len(),
        leases.len()
    );
    let (ours, foreign) = answers.split_at(CLUSTER_LOCKS);
    let failed: Vec<_> = ours.iter().filter_map(|a| a.as_ref().err()).collect();
    ensure!(
        failed.is_empty(),
        "renewing to {ttl:?}: {} of {CLUSTER_LOCKS} renewals failed, the first: {:?}",
        failed.len(),
        failed.first()
    );
    ensure!(
        foreign
            .iter()
            .all(|a| matches!(a, Err(LockError::NotHeld { .. }))),
        "renewing to {ttl:?}: leases under another token were answered {foreign:?}"
    );
    let left: Vec<Option<Duration>> = stream::iter(names)
        .map(|name| client.inspect(name))
        .buffered(64)
        .map_ok(|info| info.and_then(|i| i.expires_in))
        .try_collect()
        .await
        .map_err(fail("inspect"))?;
    let short = left
        .iter()
        .filter(|l| l.is_none_or(|l| l + Duration::from_secs(10) < ttl))
        .count();
    ensure!(
        short == 0,
        "renewing to {ttl:?}: {short} of {CLUSTER_LOCKS} locks have less than {:?} left",
        ttl - Duration::from_secs(10)
    );
    Ok(sent)
}
