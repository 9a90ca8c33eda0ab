//! Row lock waits: budgets below a second, a waiter dropped mid-wait, and one waiter per name
//! and client in InnoDB.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_every, unique_name},
};
use lock_core::{Holder, LockError, LockOptions};
use lock_mysql::{MySqlConfig, Strategy};

use super::{
    client, spawn_acquire,
    support::{
        self, MySqlStore,
        proxy::{Proxy, upstream},
    },
    until_no_statement, until_waiting,
};

/// Row lock: budgets below `innodb_lock_wait_timeout`'s one-second grain end on time, the
/// killed waits leave no statement behind, and the client works normally afterwards.
pub(super) async fn row_lock_sub_second_budgets() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("budgets")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    for ms in [0, 50, 120, 400, 1300] {
        let budget = Duration::from_millis(ms);
        let start = Instant::now();
        let result = b.lock_with(&name, &long.clone().wait(budget)).await;
        let took = start.elapsed();
        ensure!(
            matches!(result, Err(LockError::Timeout { .. })),
            "budget {budget:?}: {result:?}, expected Timeout"
        );
        ensure!(
            took >= budget.mul_f64(0.9),
            "budget {budget:?}: gave up after {took:?}"
        );
        ensure!(
            took <= budget + Duration::from_millis(150),
            "budget {budget:?}: Timeout only after {took:?}"
        );
        until_no_statement(&store, &name)
            .await
            .map_err(|Failure(why)| Failure(format!("budget {budget:?}: {why}")))?;
    }
    held.release().await.map_err(err)?;
    let after = b
        .try_lock_with(&name, &long)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("the lock was not free after release".into()))?;
    after.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: an `acquire` future dropped while it waits in InnoDB leaves no statement and no
/// transaction behind: once the holder releases, a third client gets the lock at once, with
/// the next fence (the dropped waiter took none).
pub(super) async fn row_lock_dropped_waiter() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b, c) = (
        client(store.config()).await?,
        client(store.config()).await?,
        client(store.config()).await?,
    );
    let name = unique_name("dropped-waiter")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    let (waiter, wait) = (Holder::new(), long.clone().wait(Duration::from_secs(10)));
    let mut waiting = Box::pin(b.acquire(&waiter, &name, &wait));
    tokio::select! {
        got = &mut waiting => return Err(Failure(format!("the waiter got a held lock: {got:?}"))),
        queued = until_waiting(&store, &name) => queued?,
    }
    // Dropped while its statement waits in InnoDB.
    drop(waiting);
    until_no_statement(&store, &name).await?;
    let held_fence = held.fence().get();
    held.release().await.map_err(err)?;
    let next = c
        .lock_with(&name, &long.clone().wait(Duration::from_secs(2)))
        .await
        .map_err(err)?;
    ensure!(
        next.fence().get() == held_fence + 1,
        "fence {} after {held_fence}: the dropped waiter took one",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: of one client's seven acquisitions of a held name, only the first waits in
/// InnoDB (the server never runs more than one statement on the name while five more wait
/// out their budgets; without the client's queue all six would wait there); the others wait
/// in the client, where their budgets hold as they do on the server, and a zero-budget try
/// answers busy at once. The first then gets the lock when the holder releases, with the
/// next fence.
pub(super) async fn row_lock_one_waiter_per_client() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("one-waiter")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    let first = spawn_acquire(&b, &name, long.clone().wait(Duration::from_secs(20)));
    until_waiting(&store, &name).await?;
    let budget = Duration::from_millis(300);
    let start = Instant::now();
    let others: Vec<_> = (0..5)
        .map(|_| spawn_acquire(&b, &name, long.clone().wait(budget)))
        .collect();
    // Watches the server while the five wait out their budgets.
    let mut most = 0;
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(10),
        "the five waiters ending",
        async || {
            let now = support::statements_on(store.admin(), &name)
                .await
                .map_err(Failure)?;
            most = most.max(now);
            Ok(others.iter().all(|other| other.is_finished()))
        },
    )
    .await?;
    ensure!(
        most == 1,
        "up to {most} statements waited on the server for one client's acquisitions; expected 1"
    );
    for (i, other) in others.into_iter().enumerate() {
        let result = other.await.map_err(err)?;
        ensure!(
            matches!(result, Err(LockError::Timeout { .. })),
            "waiter {i} behind the first: {result:?}, expected Timeout"
        );
    }
    let took = start.elapsed();
    ensure!(
        took >= budget.mul_f64(0.9) && took <= budget + Duration::from_millis(150),
        "five {budget:?} budgets in the client's queue ended after {took:?}"
    );
    let tried = Instant::now();
    let busy = b.try_lock_with(&name, &long).await;
    ensure!(
        matches!(busy, Ok(None)),
        "a zero-budget try while the first waits: {busy:?}, expected busy"
    );
    ensure!(
        tried.elapsed() <= Duration::from_millis(100),
        "the zero-budget try answered after {:?}",
        tried.elapsed()
    );
    let held_fence = held.fence().get();
    held.release().await.map_err(err)?;
    let next = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .map_err(|_| Failure("the first waiter did not get the released lock within 5 s".into()))?
        .map_err(err)?
        .map_err(|e| Failure(format!("the first waiter failed: {e}")))?;
    ensure!(
        next.fence().get() == held_fence + 1,
        "fence {} after {held_fence}",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: a waiter whose budget ends while the server does not answer its `KILL QUERY`
/// (every connection of its client goes through a proxy, blackholed while it waits in InnoDB)
/// answers [`LockError::Timeout`] when its budget ends, not after the kill's own time limit.
/// Before, it answered only once the kill was done: lock-core then cut it a second after
/// the budget as a store that did not answer ([`LockError::Unavailable`]). A thousand
/// clients whose waits ended together made the server that slow to kill: 836 turns of the
/// compare's 1,000-client row-lock run ended so. The wait left behind ends with the proxy's
/// connections, and the lock goes on to the next client.
pub(super) async fn row_lock_budget_ends_before_the_kill_answers() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let url = support::url().map_err(Failure)?;
    let proxy = Proxy::start(upstream(&url).map_err(Failure)?)
        .await
        .map_err(Failure)?;
    let mut proxied = MySqlConfig::new(&proxy.url(&url).map_err(Failure)?)
        .strategy(Strategy::RowLock)
        .connect_timeout(Duration::from_secs(5));
    proxied.table = store.config().table.clone();
    let (a, b, c) = (
        client(store.config()).await?,
        client(&proxied).await?,
        client(store.config()).await?,
    );
    let name = unique_name("kill-unanswered")?;
    let long = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &long).await.map_err(err)?;
    let budget = Duration::from_millis(1500);
    let start = Instant::now();
    let waiter = spawn_acquire(&b, &name, long.clone().wait(budget));
    until_waiting(&store, &name).await?;
    proxy.blackhole();
    let result = waiter.await.map_err(err)?;
    let took = start.elapsed();
    ensure!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?} after {took:?}, expected Timeout"
    );
    ensure!(
        took <= budget + Duration::from_millis(250),
        "Timeout only after {took:?} (budget {budget:?})"
    );
    drop(proxy);
    held.release().await.map_err(err)?;
    let next = c
        .lock_with(&name, &long.clone().wait(Duration::from_secs(5)))
        .await
        .map_err(err)?;
    next.release().await.map_err(err)?;
    Ok(())
}
