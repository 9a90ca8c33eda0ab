//! The peer beside ours: `distributed-lock-mysql`, the Rust crate a user would otherwise pick
//! for locks on MySQL or MariaDB. It takes the server's named locks (`GET_LOCK`, held by the
//! session that took them) on a connection of its pool, held until `RELEASE_LOCK`: no lease, no
//! fencing token, and a lock ends with its connection. It runs on both MySQL stores' reports
//! (the same server and the same peer; each report has it beside its own runs). Its server
//! statements (`Questions`) leave out the ping sqlx 0.8 sends when a pooled connection is
//! checked out (`COM_PING` is not a statement), one more round trip per turn.

use std::time::{Duration, Instant};

use conformance_tests::bench::{self, Report};
use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_mysql::{MySqlLockProvider, lock::MySqlDistributedLock};

/// The peer's name in the report.
const PEER: &str = "distributed-lock-mysql 0.2";

/// One client of the peer: its own provider (its own pool), and the lock.
struct NamedLock {
    lock: MySqlDistributedLock,
}

impl bench::Contender for NamedLock {
    async fn turn(
        &self,
        end: Instant,
        hold: Duration,
    ) -> Result<Option<(Instant, Instant)>, String> {
        // The server's own wait outlasts the turn's end by a second, so the turn's bound, not a
        // `GET_LOCK` time-out answered as an error, ends a wait that runs out.
        let wait = end.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
        let acquire = async {
            self.lock
                .acquire(Some(wait))
                .await
                .map_err(|e| e.to_string())
        };
        // A failed release fails the turn, as it does for this library's clients.
        bench::peer_turn(end, hold, acquire, |handle| async move {
            handle.release().await.map_err(|e| e.to_string())
        })
        .await
    }
}

/// The peer's run on the server at `url` beside ours (see [`bench::peer_report`]), each client
/// with a provider (a pool) of its own; `round_trip` is the raw round trip the hand-off is
/// judged against, `counters` the server's counts.
pub(crate) async fn fleet<S: bench::ServerCounters>(
    report: &mut Report,
    url: &str,
    round_trip: Duration,
    counters: &S,
    run_for: Duration,
) -> Result<(), String> {
    let url = url.to_owned();
    let connect = move |name| {
        let url = url.clone();
        async move {
            // The provider's pool connects once here, before the clock starts, as our clients
            // connect before it.
            let provider = MySqlLockProvider::new(url)
                .await
                .map_err(|e| e.to_string())?;
            Ok(NamedLock {
                lock: provider.create_lock(&format!("bench/peer/{name}")),
            })
        }
    };
    bench::peer_report(report, PEER, connect, round_trip, run_for, counters).await
}
