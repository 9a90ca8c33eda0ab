//! A server restart while locks are held and waited for, on both strategies.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{Instance, err, unique_name},
};
use lock_core::{LockClient, LockError, LockGuard, LockName, LockOptions, LossReason};
use lock_mysql::Strategy;
use tokio::task::JoinHandle;

use super::{client, spawn_acquire, support::MySqlStore, until_waiting};

/// One strategy's part: a holder and a waiter client (connect timeout 2 s), the name, the
/// holder's guard.
struct Part {
    holder: LockClient,
    waiter: LockClient,
    name: LockName,
    guard: LockGuard,
}

impl Part {
    async fn new(store: &MySqlStore, tag: &str, options: &LockOptions) -> Result<Self, Failure> {
        let config = store
            .config()
            .clone()
            .connect_timeout(Duration::from_secs(2));
        let (holder, waiter) = (client(&config).await?, client(&config).await?);
        let name = unique_name(tag)?;
        let guard = holder.lock_with(&name, options).await.map_err(err)?;
        Ok(Self {
            holder,
            waiter,
            name,
            guard,
        })
    }
}

/// A waiter in the background.
type Waiting = JoinHandle<Result<LockGuard, LockError>>;

/// Locks held and waited for on both strategies while MariaDB stops and starts again.
pub(super) async fn restart_with_locks() -> Outcome {
    let mariadb = Instance::named("mariadb")?;
    let lease_store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let row_store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let ttl = Duration::from_secs(3);
    let options = LockOptions::new().ttl(ttl);
    let lease = Part::new(&lease_store, "restart-lease", &options).await?;
    let row = Part::new(&row_store, "restart-row", &options).await?;
    // The rule for every store: a retryable failure is retried inside the wait budget and
    // returned when the budget runs out; so both waiters ride out the outage until their
    // budget ends, then report `Unavailable`.
    let budget = Duration::from_secs(2);
    let wait = options.clone().wait(budget);
    let lw = spawn_acquire(&lease.waiter, &lease.name, wait.clone());
    let rw = spawn_acquire(&row.waiter, &row.name, wait);
    until_waiting(&row_store, &row.name).await?;

    let stopped = mariadb.stop().await?;
    let stopped_at = Instant::now();
    let outage = async {
        waiters_report_the_outage(rw, lw, budget, stopped_at).await?;
        nothing_held_while_down(&row.guard, &lease.waiter, &options, ttl).await
    }
    .await;
    // Start the server again whatever happened above.
    let restarted = stopped.start().await;
    outage?;
    restarted?;

    let (row_holder, row_name) = (row.holder.clone(), row.name.clone());
    row_lock_recovers(row, &options).await?;
    lease_recovers(lease, &options, ttl).await?;
    ensure!(
        row_holder.inspect(&row_name).await.map_err(err)?.is_none(),
        "the row lock shows held"
    );
    Ok(())
}

/// Both waiters, the row lock's `rw` and the lease's `lw`, report `Unavailable` once their
/// `budget` since the server stopped (at `stopped`) runs out.
async fn waiters_report_the_outage(
    rw: Waiting,
    lw: Waiting,
    budget: Duration,
    stopped: Instant,
) -> Outcome {
    let waited = tokio::time::timeout(budget * 3, rw)
        .await
        .map_err(|_| Failure("the row-lock waiter hung after the server stopped".into()))?
        .map_err(err)?;
    ensure!(
        matches!(&waited, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "the row-lock waiter got {waited:?}, expected Unavailable"
    );
    let polled = tokio::time::timeout(budget * 3, lw)
        .await
        .map_err(|_| Failure("the lease waiter hung after the server stopped".into()))?
        .map_err(err)?;
    ensure!(
        matches!(&polled, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "the lease waiter got {polled:?}, expected Unavailable"
    );
    ensure!(
        stopped.elapsed() <= budget + Duration::from_secs(1),
        "the waiters reported the outage {:?} after it began, past their {budget:?} budget",
        stopped.elapsed()
    );
    Ok(())
}

/// While the server is down, the row-lock holder (`row`) learns its hold ended with its
/// session, and a one-try acquire by `client` is `Unavailable`, quickly.
async fn nothing_held_while_down(
    row: &LockGuard,
    client: &LockClient,
    options: &LockOptions,
    ttl: Duration,
) -> Outcome {
    let reason = tokio::time::timeout(ttl + Duration::from_secs(1), row.lost())
        .await
        .map_err(|_| {
            Failure("the row-lock holder's lost() did not fire while the server was down".into())
        })?;
    ensure!(
        reason == LossReason::SessionEnded,
        "row-lock lost() said {reason:?}"
    );
    let began = Instant::now();
    let fresh = client
        .lock_with(
            &unique_name("restart-down")?,
            &options.clone().wait(Duration::ZERO),
        )
        .await;
    ensure!(
        matches!(&fresh, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "a one-try acquire while the server is down gave {fresh:?}"
    );
    ensure!(
        began.elapsed() <= Duration::from_secs(4),
        "it took {:?}",
        began.elapsed()
    );
    Ok(())
}

/// Recovery with the same clients and no clean-up: the server rolled the row lock back, so
/// the waiter's client gets it with a larger fence, and the old guard's release says `Lost`.
async fn row_lock_recovers(row: Part, options: &LockOptions) -> Outcome {
    let next_row = row
        .waiter
        .lock_with(&row.name, &options.clone().wait(Duration::from_secs(5)))
        .await
        .map_err(|e| Failure(format!("the row lock after the restart: {e}")))?;
    ensure!(
        next_row.fence() > row.guard.fence(),
        "fence {} after {}",
        next_row.fence(),
        row.guard.fence()
    );
    let late = row.guard.release().await;
    ensure!(
        matches!(late, Err(LockError::Lost { .. })),
        "the old row-lock guard released: {late:?}"
    );
    next_row.release().await.map_err(err)
}

/// The lease survived in the table: its holder either renewed it after the restart (and
/// releases it now) or lost it at its local deadline (and it expires at its TTL); then the
/// waiter's client gets it with a larger fence.
async fn lease_recovers(lease: Part, options: &LockOptions, ttl: Duration) -> Outcome {
    let lease_fence = lease.guard.fence();
    match lease.guard.release().await {
        Ok(()) | Err(LockError::Lost { .. }) => {}
        Err(other) => {
            return Err(Failure(format!(
                "releasing the lease after the restart: {other}"
            )));
        }
    }
    let next_lease = lease
        .waiter
        .lock_with(
            &lease.name,
            &options.clone().wait(ttl + Duration::from_secs(2)),
        )
        .await
        .map_err(|e| Failure(format!("the lease after the restart: {e}")))?;
    ensure!(
        next_lease.fence() > lease_fence,
        "fence {} after {lease_fence}",
        next_lease.fence()
    );
    next_lease.release().await.map_err(err)
}
