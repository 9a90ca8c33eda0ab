//! Batched renewals of many held locks: the watchdog renews every hold of a client that falls
//! due in one `renew_many`, which must keep them all, however many there are.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome,
    faults::{fail, unique_name},
};
use lock_core::{Fence, Lease, LockBackend, backend::LeaseToken};
use lock_redis::{RedisKeys, RedlockBackend, RedlockConfig};

use super::{raw_conn, redlock_urls};

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
pub(super) async fn redlock_renews_thousands_of_leases_in_one_batch() -> Outcome {
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
