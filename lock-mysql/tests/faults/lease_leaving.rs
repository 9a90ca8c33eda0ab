//! Waiters of the lease that give up: leaving frees what was handed to them without waiting
//! for locks others hold, and answers on time even when the server is slow to take the place
//! out.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{err, poll_every, unique_name},
};
use lock_core::LockOptions;
use lock_mysql::Strategy;

use super::{
    client,
    lease_queue::ForeignLocks,
    places, spawn_acquire,
    support::{MySqlStore, hex},
    until_waiting,
};
use sqlx::AssertSqlSafe;

/// The leaving cases, added to `cases`.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("lease/a_leaving_waiter_leaves_the_lease_row_alone", || {
            Box::pin(lease_leaving_waiter_leaves_the_lease_row_alone())
        })
        .case("lease/a_slow_leaving_answers_on_time", || {
            Box::pin(lease_slow_leaving_answers_on_time())
        })
}

/// A queued waiter that gives up leaves without waiting for the lease row's lock: its leaving
/// frees a lease handed to it, and must lock the lease row only then. Here a waiter (budget
/// 1.5 s) queues and parks behind a holder of 30 s, then a foreign transaction locks the lease
/// row (as a release or renewal in flight would, for longer) until after the budget; the
/// waiter's `acquire` must answer `Timeout` soon after its budget. (Before, leaving ran an
/// `UPDATE` of the lease row by its key whether or not the lease was the waiter's, which
/// waited for the foreign lock.)
async fn lease_leaving_waiter_leaves_the_lease_row_alone() -> Outcome {
    const BUDGET: Duration = Duration::from_millis(1500);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (holder, waiter) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("leaves-row-alone")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let started = Instant::now();
    let waiting = spawn_acquire(&waiter, &name, long.clone().wait(BUDGET));
    until_waiting(&store, &name).await?;
    let foreign = ForeignLocks::lease_row(&store, &name).await?;
    let outcome = waiting.await.map_err(err)?;
    let answered = started.elapsed();
    foreign.rollback().await?;
    held.release().await.map_err(err)?;
    ensure!(
        matches!(outcome, Err(lock_core::LockError::Timeout { .. })),
        "the waiter's acquire answered {outcome:?}, expected Timeout"
    );
    let bound = BUDGET + Duration::from_millis(500);
    ensure!(
        answered <= bound,
        "a waiter with a budget of {BUDGET:?} answered after {answered:?} (bound {bound:?}): leaving waited for the lease row's lock"
    );
    Ok(())
}

/// A waiter whose budget runs out answers `Timeout`, on time, even when taking its place out
/// of the queue is slow (a thousand waiters giving up at once kept the server busy for
/// seconds): the answer does not wait for the clean-up longer than a moment, and the clean-up
/// goes on in the background. Here a waiter (budget 1 s) queues behind a holder of 30 s, then a
/// foreign transaction locks the waiter's place (as a statement of a busy server would hold it
/// up) until after the budget. (Before, the waiter waited for its `DELETE` of the place, past
/// the client's grace of a second after the budget, and the client answered `Unavailable`:
/// "the store did not answer within the wait budget"; in a run of 1,000 clients, 940 of the
/// waiters whose budgets ended together got that.) Once the foreign lock is gone, the place
/// goes.
async fn lease_slow_leaving_answers_on_time() -> Outcome {
    const BUDGET: Duration = Duration::from_secs(1);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (holder, waiter) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("slow-leaving")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let started = Instant::now();
    let waiting = spawn_acquire(&waiter, &name, long.clone().wait(BUDGET));
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
    // Until the waiter parks (its park's refresh wrote its connection into its place): the
    // foreign lock then stands in the way of its leaving, not of its queueing.
    let parked = format!(
        "SELECT COUNT(*) FROM {queue} WHERE name = X'{}' AND connection_id IS NOT NULL",
        hex(name.as_str())
    );
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(5),
        "the waiter parking",
        async || {
            let count: i64 = sqlx::query_scalar(AssertSqlSafe(parked.clone()))
                .fetch_one(store.admin())
                .await
                .map_err(err)?;
            Ok(count > 0)
        },
    )
    .await?;
    let foreign = ForeignLocks::take(
        &store,
        "the waiter's place",
        &[format!(
            "SELECT token FROM {queue} WHERE name = X'{}' FOR UPDATE",
            hex(name.as_str())
        )],
    )
    .await?;
    let outcome = waiting.await.map_err(err)?;
    let answered = started.elapsed();
    // The place is still there: the leaving was held up (else the case tests nothing).
    let left = places(&store, &name).await?;
    foreign.rollback().await?;
    ensure!(
        matches!(outcome, Err(lock_core::LockError::Timeout { .. })),
        "the waiter's acquire answered {outcome:?} after {answered:?}, expected Timeout"
    );
    ensure!(
        left == 1,
        "{left} places when the waiter answered: its leaving was not held up"
    );
    // The client's own cut (a second after the budget) answers `Unavailable`; the waiter's
    // last park and try may end up to their answer's grace (250 ms) after the budget, and
    // the clean-up is waited for as long again.
    let bound = BUDGET + Duration::from_millis(800);
    ensure!(
        answered <= bound,
        "a waiter with a budget of {BUDGET:?} answered after {answered:?} (bound {bound:?})"
    );
    poll_every(
        Duration::from_millis(20),
        Duration::from_secs(5),
        "the waiter's place taken out once the foreign lock was gone",
        async || Ok(places(&store, &name).await? == 0),
    )
    .await?;
    held.release().await.map_err(err)?;
    Ok(())
}
