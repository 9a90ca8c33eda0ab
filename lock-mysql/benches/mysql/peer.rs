//! The peer beside ours: `distributed-lock-mysql`, the Rust crate a user would otherwise pick
//! for locks on MySQL or MariaDB. It takes the server's named locks (`GET_LOCK`, held by the
//! session that took them) on a connection of its pool, held until `RELEASE_LOCK`: no lease, no
//! fencing token, and a lock ends with its connection. It runs through the same workloads as
//! ours on both MySQL stores' reports (the same server and the same peer; each report has it
//! beside its own runs). Its server
//! statements (`Questions`) leave out the ping sqlx 0.8 sends when a pooled connection is
//! checked out (`COM_PING` is not a statement), one more round trip per turn.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use conformance_tests::bench::{self, Report};
use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_mysql::MySqlLockProvider;
use lock_core::LockName;

/// The peer's name in the report.
pub(crate) const PEER: &str = "distributed-lock-mysql 0.2";

/// One client of the peer: its own provider (its own pool).
pub(crate) struct NamedLocks {
    provider: MySqlLockProvider,
}

impl bench::Contender for NamedLocks {
    async fn turn(&self, name: &LockName, end: Instant, hold: Duration) -> bench::Turn {
        let lock = self.provider.create_lock(&format!("bench/peer/{name}"));
        // The server's own wait outlasts the turn's end by a second, so the turn's bound, not a
        // `GET_LOCK` time-out answered as an error, ends a wait that runs out.
        let wait = end.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
        let acquire = async { lock.acquire(Some(wait)).await.map_err(|e| e.to_string()) };
        // A failed release fails the turn, as it does for this library's clients.
        bench::peer_turn(end, hold, acquire, |handle| async move {
            handle.release().await.map_err(|e| e.to_string())
        })
        .await
    }
}

/// How each client of the peer connects to the server at `url`: a provider (a pool) of its
/// own, whose pool connects once here, before the clock starts, as our clients connect before
/// it.
pub(crate) fn connect(
    url: &str,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<NamedLocks, String>>>>
+ Clone
+ Send
+ Sync
+ 'static {
    let url = url.to_owned();
    move || {
        let url = url.clone();
        Box::pin(async move {
            let provider = MySqlLockProvider::new(url)
                .await
                .map_err(|e| e.to_string())?;
            Ok(NamedLocks { provider })
        })
    }
}

/// The peer's uncontended cycle on the server at `url` against `floor` (the floor ours was
/// measured against), reported as `metric` after the peer's name; a line with the error when
/// it fails.
pub(crate) async fn uncontended<F, FF>(report: &mut Report, url: &str, (floor, metric): (F, &str))
where
    F: Fn() -> FF,
    FF: Future<Output = Result<(), String>>,
{
    let metric = format!("{PEER}: {metric}");
    let rounds = (super::ROUNDS, super::PER_ROUND);
    match bench::peer_uncontended_rounds(connect(url)(), rounds.0, rounds.1, floor).await {
        Ok(cycle) => report.round_ratio(&metric, &cycle, None),
        Err(error) => report.failed(&metric, &error),
    }
}
